//! Unit tests of `compare` on dumps built in memory: the decomposition in
//! exact arithmetic, planted kernel errors and logits effects attributed
//! to the right term, bitwise-equal pairs, B without logits, bad input.

use std::path::Path;

use rug::Float;

use logprobe_reference::oracle::Interval;

use super::*;
use crate::dump::{serialize_dump, DumpTensor};
use crate::keys;
use logprobe_reference::spec::Dtype;

const N: usize = 6;
const V: usize = 40;

/// Deterministic LLM-ish logits `[N, V]` (exact in f32).
fn logits() -> Vec<f64> {
    (0..N * V)
        .map(|i| {
            let (r, j) = (i / V, i % V);
            let x = ((j * 7919 + r * 104_729) % 1000) as f32 / 250.0 - 2.0;
            (if j == (3 * r + 1) % V { x + 6.0 } else { x }) as f64
        })
        .collect()
}

fn tokens() -> Vec<i64> {
    (0..N as i64)
        .map(|r| (3 * r + 1 + (r % 2) * 5) % V as i64)
        .collect()
}

/// log_softmax(x)[t] per row in f64 (error ~1e-15: a yardstick for
/// effects of 1e-3).
fn f64_log_probs(x: &[f64], t: &[i64]) -> Vec<f64> {
    (0..N)
        .map(|r| {
            let row = &x[r * V..(r + 1) * V];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            row[t[r] as usize] - lse
        })
        .collect()
}

struct Fake {
    logits: Option<(Dtype, Vec<f64>)>,
    tokens: Vec<i64>,
    log_probs: Option<(Dtype, Vec<f64>)>,
    row_mask: Option<Vec<bool>>,
}

fn bytes(s: &Fake) -> Vec<u8> {
    let mut t: Vec<(&str, DumpTensor)> = vec![("tokens", DumpTensor::i64s(&[N], &s.tokens))];
    if let Some((d, x)) = &s.logits {
        t.push(("logits", DumpTensor::floats(*d, &[N, V], x)));
    }
    if let Some((d, x)) = &s.log_probs {
        t.push(("log_probs", DumpTensor::floats(*d, &[N], x)));
    }
    if let Some(m) = &s.row_mask {
        t.push(("row_mask", DumpTensor::bools(&[N], m)));
    }
    serialize_dump(&t, &[(keys::FORMAT_VERSION.name, "2")]).unwrap()
}

fn run(a: &Fake, b: &Fake) -> Result<CompareReport, CompareError> {
    let (ba, bb) = (bytes(a), bytes(b));
    let da = parse_side(&ba, Side::A)?;
    let db = parse_side(&bb, Side::B)?;
    compare_dumps(
        &da,
        &db,
        Path::new("a"),
        Path::new("b"),
        &CompareConfig::default(),
    )
}

/// The trainer: f32 logits, log-probs exact up to f64 rounding (f64 dtype).
fn trainer() -> Fake {
    let x = logits();
    Fake {
        log_probs: Some((Dtype::F64, f64_log_probs(&x, &tokens()))),
        logits: Some((Dtype::F32, x)),
        tokens: tokens(),
        row_mask: None,
    }
}

fn f(x: f64) -> Float {
    Float::with_val(4400, x)
}

/// `observed = kernel_error_a - kernel_error_b + logits_effect`, in exact
/// arithmetic on the reported enclosures (4400-bit floats hold every sum of
/// a few f64s exactly): the exact `lp_A - lp_B` lies in the sum of the
/// intervals, which is at most a few ulps wide.
fn assert_decomposition(r: &CompareReport) {
    for c in &r.rows {
        let obs = f(c.log_prob_a) - f(c.log_prob_b.unwrap());
        let o = c.observed.unwrap();
        assert!(f(o.lo) <= obs && obs <= f(o.hi), "row {}: observed", c.row);
        let (ka, kb, le) = (
            c.kernel_error_a,
            c.kernel_error_b.unwrap(),
            c.logits_effect.unwrap(),
        );
        let lo = f(ka.lo) - f(kb.hi) + f(le.lo);
        let hi = f(ka.hi) - f(kb.lo) + f(le.hi);
        assert!(lo <= obs && obs <= hi, "row {}: decomposition", c.row);
        let width = (hi - lo).to_f64();
        let scale = c.log_prob_a.abs().max(1.0);
        assert!(
            width <= 64.0 * f64::EPSILON * scale,
            "row {}: width {width:e}",
            c.row
        );
    }
}

#[test]
fn decomposition_adds_up_exactly_and_finds_a_planted_kernel_error() {
    let a = trainer();
    // B: the same logits, a kernel that adds 0.01 to every log-prob.
    let mut b = trainer();
    b.log_probs = Some((
        Dtype::F64,
        f64_log_probs(&logits(), &tokens())
            .iter()
            .map(|v| v + 0.01)
            .collect(),
    ));
    let r = run(&a, &b).unwrap();
    assert_eq!(r.rows.len(), N);
    assert_decomposition(&r);
    for c in &r.rows {
        assert!((c.kernel_error_b.unwrap().value - 0.01).abs() < 1e-12);
        assert!(c.kernel_error_a.value.abs() < 1e-13);
        assert_eq!(c.logits_effect.unwrap().value, 0.0);
        assert_eq!(c.kl.unwrap().value, 0.0);
        assert_eq!(c.logits_bitwise_equal, Some(true));
        assert_eq!(c.log_probs_bitwise_equal, Some(false));
    }
    let sb = r.summary.share_kernel_b.unwrap();
    assert!(sb > 0.999_999, "{}", r.summary.verdict);
    assert!(
        r.summary
            .verdict
            .starts_with("the mismatch is 100.0% kernel numerics"),
        "{}",
        r.summary.verdict
    );
    // 0.01 nats is far beyond any f64 kernel's bound: B's kernel is out.
    assert!(
        r.summary
            .verdict
            .contains("B's log_probs kernel is out of its bound"),
        "{}",
        r.summary.verdict
    );
    assert_eq!(r.exit_status, 1);
}

#[test]
fn a_logits_change_is_the_logits_effect_with_its_exact_kl() {
    let a = trainer();
    // B: row r's logit at column 5 moved by 0.25; an exact kernel on it.
    let mut xb = logits();
    for r in 0..N {
        xb[r * V + 5] += 0.25;
    }
    let b = Fake {
        log_probs: Some((Dtype::F64, f64_log_probs(&xb, &tokens()))),
        logits: Some((Dtype::F32, xb.clone())),
        tokens: tokens(),
        row_mask: None,
    };
    let r = run(&a, &b).unwrap();
    assert_decomposition(&r);
    let (la, lb) = (
        f64_log_probs(&logits(), &tokens()),
        f64_log_probs(&xb, &tokens()),
    );
    for c in &r.rows {
        let le = c.logits_effect.unwrap().value;
        assert!(
            (le - (la[c.row] - lb[c.row])).abs() < 1e-13,
            "row {}",
            c.row
        );
        assert!(le != 0.0);
        assert!(c.kernel_error_b.unwrap().value.abs() < 1e-13);
        // KL of a one-logit move, by the textbook sum in f64 (KL ~ 1e-4 here).
        let (ra, rb) = (&logits()[c.row * V..][..V], &xb[c.row * V..][..V]);
        let lsm = |x: &[f64]| {
            let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let l = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            x.iter().map(|v| v - l).collect::<Vec<_>>()
        };
        let (pa, pb) = (lsm(ra), lsm(rb));
        let kl: f64 = pa.iter().zip(&pb).map(|(u, w)| u.exp() * (u - w)).sum();
        let got = c.kl.unwrap();
        assert!(got.lo <= got.hi && got.lo > 0.0);
        assert!(
            (got.value - kl).abs() < 1e-12 + 1e-9 * kl,
            "row {}: {got:?} vs {kl}",
            c.row
        );
    }
    assert!(
        r.summary.share_logits.unwrap() > 0.999_999,
        "{}",
        r.summary.verdict
    );
    assert_eq!(r.summary.logits_bitwise_equal_rows, Some(0));
    assert_eq!(r.exit_status, 0, "{}", r.summary.verdict);
}

#[test]
fn a_dump_against_itself_is_bitwise_equal() {
    let r = run(&trainer(), &trainer()).unwrap();
    assert_eq!(r.summary.bitwise_equal_rows, Some(N));
    assert_eq!(r.summary.logits_bitwise_equal_rows, Some(N));
    for c in &r.rows {
        assert_eq!(c.observed.unwrap().interval(), Interval::point(0.0));
        assert_eq!(c.logits_effect.unwrap().interval(), Interval::point(0.0));
        assert_eq!(c.kl.unwrap().interval(), Interval::point(0.0));
    }
    let q = r.summary.importance_ratio.as_ref().unwrap();
    assert_eq!((q.min, q.max, q.outside_clip), (1.0, 1.0, 0));
    assert!(
        r.summary.verdict.starts_with("no mismatch"),
        "{}",
        r.summary.verdict
    );
}

#[test]
fn b_without_logits_reports_its_deviation_from_a_exact() {
    let a = trainer();
    let lb: Vec<f64> = f64_log_probs(&logits(), &tokens())
        .iter()
        .map(|v| v - 0.03)
        .collect();
    let b = Fake {
        logits: None,
        tokens: tokens(),
        log_probs: Some((Dtype::F32, lb.clone())),
        row_mask: None,
    };
    let r = run(&a, &b).unwrap();
    for c in &r.rows {
        assert!(c.kernel_error_b.is_none() && c.logits_effect.is_none() && c.kl.is_none());
        // observed = kernel_error_a - b_minus_exact_a, exactly on the enclosures.
        let obs = f(c.log_prob_a) - f(c.log_prob_b.unwrap());
        let (ka, bm) = (c.kernel_error_a, c.b_minus_exact_a.unwrap());
        assert!(f(ka.lo) - f(bm.hi) <= obs && obs <= f(ka.hi) - f(bm.lo));
        assert!((bm.value + 0.03).abs() < 1e-6);
    }
    assert!(
        r.summary.verdict.contains("B has no logits"),
        "{}",
        r.summary.verdict
    );
    assert_eq!(r.summary.importance_ratio.as_ref().unwrap().outside_clip, 0);
}

#[test]
fn mismatched_pairs_are_typed_bad_input() {
    let a = trainer();
    let mut b = trainer();
    b.tokens[3] = (b.tokens[3] + 1) % V as i64;
    assert!(matches!(
        run(&a, &b),
        Err(CompareError::TokenMismatch { row: 3, .. })
    ));
    let mut b = trainer();
    b.row_mask = Some((0..N).map(|r| r != 2).collect());
    let e = run(&a, &b).unwrap_err();
    assert!(
        matches!(
            e,
            CompareError::RowMaskMismatch {
                row: 2,
                a: true,
                b: false,
                ..
            }
        ),
        "{e}"
    );
    // Neither logits nor log_probs.
    let b = Fake {
        logits: None,
        tokens: tokens(),
        log_probs: None,
        row_mask: None,
    };
    assert!(matches!(run(&a, &b), Err(CompareError::NothingToCompare)));
    // A without logits.
    let lp_only = Fake {
        logits: None,
        tokens: tokens(),
        log_probs: a.log_probs.clone(),
        row_mask: None,
    };
    assert!(matches!(run(&lp_only, &a), Err(CompareError::ANeedsLogits)));
    // Row counts: B with 5 rows.
    let bb = serialize_dump(
        &[
            ("tokens", DumpTensor::i64s(&[N - 1], &tokens()[..N - 1])),
            (
                "log_probs",
                DumpTensor::floats(Dtype::F32, &[N - 1], &[0.0; N - 1]),
            ),
        ],
        &[],
    )
    .unwrap();
    let ba = bytes(&a);
    let (da, db) = (
        parse_side(&ba, Side::A).unwrap(),
        parse_side(&bb, Side::B).unwrap(),
    );
    let e = compare_dumps(
        &da,
        &db,
        Path::new("a"),
        Path::new("b"),
        &CompareConfig::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "A and B have different rows: A's tokens are [N] = [6], B's are [N] = [5]"
    );
    // A NaN logit in B: B's error, naming the row and column.
    let mut b = trainer();
    if let Some((_, x)) = &mut b.logits {
        x[4 * V + 7] = f64::NAN;
    }
    let e = run(&a, &b).unwrap_err();
    assert!(matches!(e, CompareError::Dump { side: Side::B, .. }), "{e}");
    assert!(e.to_string().contains("[4, 7]"), "{e}");
    // A logits-free dump with a tensor that needs logits.
    let bb = serialize_dump(
        &[
            ("tokens", DumpTensor::i64s(&[N], &tokens())),
            ("entropy", DumpTensor::floats(Dtype::F32, &[N], &[0.0; N])),
        ],
        &[],
    )
    .unwrap();
    assert!(matches!(
        parse_side(&bb, Side::B),
        Err(CompareError::NeedsLogits {
            tensor: "entropy",
            ..
        })
    ));
    // Different ignore_index metadata, and different vocabularies.
    let meta_b = serialize_dump(
        &[
            ("tokens", DumpTensor::i64s(&[N], &tokens())),
            ("log_probs", DumpTensor::floats(Dtype::F32, &[N], &[0.0; N])),
        ],
        &[(keys::IGNORE_INDEX.name, "-1")],
    )
    .unwrap();
    let db = parse_side(&meta_b, Side::B).unwrap();
    let e = compare_dumps(
        &da,
        &db,
        Path::new("a"),
        Path::new("b"),
        &CompareConfig::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            CompareError::MetadataMismatch { key, .. } if key == keys::IGNORE_INDEX.name
        ),
        "{e}"
    );
    let narrow = serialize_dump(
        &[
            ("tokens", DumpTensor::i64s(&[N], &tokens())),
            ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &logits())),
            ("log_probs", DumpTensor::floats(Dtype::F32, &[N], &[0.0; N])),
        ],
        &[(keys::VOCAB_SIZE.name, "39")],
    )
    .unwrap();
    let db = parse_side(&narrow, Side::B).unwrap();
    let e = compare_dumps(
        &da,
        &db,
        Path::new("a"),
        Path::new("b"),
        &CompareConfig::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, CompareError::VocabMismatch { a: 40, b: 39 }),
        "{e}"
    );
}

/// Entropy per row in f64 (error ~1e-15).
fn f64_entropy(x: &[f64]) -> Vec<f64> {
    (0..N)
        .map(|r| {
            let row = &x[r * V..(r + 1) * V];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let l = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            row.iter().map(|v| -(v - l).exp() * (v - l)).sum()
        })
        .collect()
}

#[test]
fn the_entropy_decomposes_too() {
    let (xa, t) = (logits(), tokens());
    let mut xb = xa.clone();
    for r in 0..N {
        xb[r * V + 9] -= 0.5;
    }
    let side = |x: &[f64], h: Vec<f64>| {
        serialize_dump(
            &[
                ("tokens", DumpTensor::i64s(&[N], &t)),
                ("logits", DumpTensor::floats(Dtype::F32, &[N, V], x)),
                (
                    "log_probs",
                    DumpTensor::floats(Dtype::F64, &[N], &f64_log_probs(x, &t)),
                ),
                ("entropy", DumpTensor::floats(Dtype::F64, &[N], &h)),
            ],
            &[],
        )
        .unwrap()
    };
    let ba = side(&xa, f64_entropy(&xa));
    // B's entropy kernel adds 0.02 nats.
    let bb = side(&xb, f64_entropy(&xb).iter().map(|h| h + 0.02).collect());
    let (da, db) = (
        parse_side(&ba, Side::A).unwrap(),
        parse_side(&bb, Side::B).unwrap(),
    );
    let r = compare_dumps(
        &da,
        &db,
        Path::new("a"),
        Path::new("b"),
        &CompareConfig::default(),
    )
    .unwrap();
    let (ha, hb) = (f64_entropy(&xa), f64_entropy(&xb));
    for c in &r.rows {
        let h = c.entropy.as_ref().unwrap();
        let obs = f(h.entropy_a) - f(h.entropy_b.unwrap());
        let (ka, kb, le) = (
            h.kernel_error_a,
            h.kernel_error_b.unwrap(),
            h.logits_effect.unwrap(),
        );
        let lo = f(ka.lo) - f(kb.hi) + f(le.lo);
        let hi = f(ka.hi) - f(kb.lo) + f(le.hi);
        assert!(lo <= obs && obs <= hi, "row {}", c.row);
        assert!((kb.value - 0.02).abs() < 1e-12, "row {}: {kb:?}", c.row);
        assert!(ka.value.abs() < 1e-13);
        assert!(
            (le.value - (ha[c.row] - hb[c.row])).abs() < 1e-12,
            "row {}",
            c.row
        );
    }
    let s = r.summary.entropy.as_ref().unwrap();
    assert!((s.kernel_error_b.as_ref().unwrap().mean_abs - 0.02).abs() < 1e-12);
    assert!(s.logits_effect.as_ref().unwrap().mean_abs > 1e-3);
}

#[test]
fn tensors_in_memory_compare_as_files_do() {
    use crate::tensors::TensorBytes;
    let (a, b) = (trainer(), trainer());
    let dump_tensors = |s: &Fake| {
        let mut v = vec![("tokens", DumpTensor::i64s(&[N], &s.tokens))];
        if let Some((d, x)) = &s.logits {
            v.push(("logits", DumpTensor::floats(*d, &[N, V], x)));
        }
        if let Some((d, x)) = &s.log_probs {
            v.push(("log_probs", DumpTensor::floats(*d, &[N], x)));
        }
        v
    };
    let (ta, tb) = (dump_tensors(&a), dump_tensors(&b));
    fn view<'a>(t: &'a [(&'static str, DumpTensor)]) -> Vec<(&'static str, TensorBytes<'a>)> {
        t.iter()
            .map(|(n, d)| {
                (
                    *n,
                    TensorBytes {
                        dtype: d.dtype,
                        shape: &d.shape,
                        data: &d.data,
                    },
                )
            })
            .collect()
    }
    let (va, vb) = (view(&ta), view(&tb));
    let r = compare_tensors((&va, &[]), (&vb, &[]), "a", "b", &CompareConfig::default()).unwrap();
    let want = run(&a, &b).unwrap();
    assert_eq!(r.summary.verdict, want.summary.verdict);
    assert_eq!(r.rows.len(), N);
    assert!(r
        .rows
        .iter()
        .zip(&want.rows)
        .all(|(x, y)| x.observed == y.observed && x.kernel_error_a == y.kernel_error_a));
    // A name given twice on B's side is B's bad input.
    let dup = [vb[0], vb[0]];
    assert!(matches!(
        compare_tensors((&va, &[]), (&dup, &[]), "a", "b", &CompareConfig::default()),
        Err(CompareError::Dump {
            side: Side::B,
            source: DumpError::Duplicate(_)
        })
    ));
}
