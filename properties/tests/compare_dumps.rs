//! `logprobe compare` on the worked example of docs/compare.md (PyTorch
//! dumps from scripts/torch_dumps/compare_bf16_rollout.py): a trainer's f32
//! logits with fp32 log-probs (A) against the same logits rounded to bf16
//! with PyTorch's bf16 log_softmax (B). The report must attribute both
//! parts: B's bf16 kernel error and the logits effect of the bf16 rounding,
//! each checked here against an independent computation; the decomposition
//! must add up exactly on the reported enclosures; a dump against itself is
//! bitwise equal; B without logits, and bad input through the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use rug::Float;

use logprobe_verify::compare::{compare_files, CompareConfig, CompareReport};
use logprobe_verify::dump::DumpFile;
use logprobe_verify::verify::ReportVerdict as Verdict;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/torch/compare")
        .join(format!("{name}.safetensors"))
}

fn compare(a: &str, b: &str) -> CompareReport {
    compare_files(&fixture(a), &fixture(b), &CompareConfig::default()).unwrap()
}

/// The worked example's report, computed once for the tests that read it.
fn worked_example() -> &'static CompareReport {
    static R: std::sync::OnceLock<CompareReport> = std::sync::OnceLock::new();
    R.get_or_init(|| compare("trainer_f32", "rollout_bf16"))
}

/// log_softmax of every row of a dump's logits, in f64 (error ~1e-13 at
/// V = 32000: a yardstick for effects of 1e-3), `[N][V]`.
fn f64_log_softmax(name: &str) -> Vec<Vec<f64>> {
    let file = DumpFile::open(fixture(name)).unwrap();
    let d = file.parse().unwrap();
    (0..d.n())
        .map(|r| {
            let x = d.logits.stored().expect("stored logits").row_f64(r);
            let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let l = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            x.iter().map(|v| v - l).collect()
        })
        .collect()
}

fn f(x: f64) -> Float {
    Float::with_val(4400, x)
}

/// `observed = kernel_error_a - kernel_error_b + logits_effect` in exact
/// arithmetic (4400-bit floats hold these sums of f64s exactly): the exact
/// `lp_A - lp_B` lies in the interval sum, at most a few ulps wide.
fn assert_decomposition(r: &CompareReport) {
    for c in &r.rows {
        let obs = f(c.log_prob_a) - f(c.log_prob_b.unwrap());
        let o = c.observed.unwrap();
        assert!(f(o.lo) <= obs && obs <= f(o.hi), "row {}", c.row);
        let (ka, kb, le) = (
            c.kernel_error_a,
            c.kernel_error_b.unwrap(),
            c.logits_effect.unwrap(),
        );
        let lo = f(ka.lo) - f(kb.hi) + f(le.lo);
        let hi = f(ka.hi) - f(kb.lo) + f(le.hi);
        assert!(lo <= obs && obs <= hi, "row {}: decomposition", c.row);
        let width = (hi - lo).to_f64();
        assert!(
            width <= 64.0 * f64::EPSILON * c.log_prob_a.abs().max(1.0),
            "row {}: width {width:e}",
            c.row
        );
    }
}

#[test]
fn worked_example_attributes_the_bf16_kernel_error_and_the_logits_effect() {
    let r = worked_example();
    assert_eq!(
        (r.rows_total, r.batch, r.rows_masked),
        (24, Some((2, 12)), 8)
    );
    assert_eq!(r.rows.len(), 16);
    assert_decomposition(r);
    let (la, lb) = (
        f64_log_softmax("trainer_f32"),
        f64_log_softmax("rollout_bf16"),
    );
    for c in &r.rows {
        let t = c.token as usize;
        // The logits effect: the exact log-probs of the two logits rows.
        let le = c.logits_effect.unwrap().value;
        let want = la[c.row][t] - lb[c.row][t];
        assert!((le - want).abs() < 1e-9, "row {}: {le} vs {want}", c.row);
        // Each kernel error against the f64 log-softmax of its own logits;
        // B's is its bf16 output's rounding (within a bf16 ulp at |lp_B|:
        // PyTorch's is not always the nearest bf16), A's fp32 only.
        let lp_b = c.log_prob_b.unwrap();
        let kb = c.kernel_error_b.unwrap().value;
        assert!((kb - (lp_b - lb[c.row][t])).abs() < 1e-9, "row {}", c.row);
        let ka = c.kernel_error_a.value;
        assert!(
            (ka - (c.log_prob_a - la[c.row][t])).abs() < 1e-9,
            "row {}",
            c.row
        );
        let ulp = 2f64.powi(lp_b.abs().log2().floor() as i32 - 7);
        assert!(kb.abs() <= ulp, "row {}: {kb} vs {ulp}", c.row);
        assert!(ka.abs() < 1e-5, "row {}", c.row);
        // The exact KL against the textbook sum in f64 (KL ~ 1e-5 here).
        let kl: f64 = la[c.row]
            .iter()
            .zip(&lb[c.row])
            .map(|(u, w)| u.exp() * (u - w))
            .sum();
        let got = c.kl.unwrap().value;
        assert!(
            got > 0.0 && (got - kl).abs() < 1e-12 + 1e-6 * kl,
            "row {}: {got} vs {kl}",
            c.row
        );
        assert_eq!(c.logits_bitwise_equal, Some(false));
    }
    let s = &r.summary;
    // Both parts are real and of the size their causes give.
    let (kb, le) = (
        s.kernel_error_b.as_ref().unwrap().mean_abs,
        s.logits_effect.as_ref().unwrap().mean_abs,
    );
    assert!(kb > 1e-3 && le > 1e-3, "{kb} {le}");
    assert!(s.kernel_error_a.mean_abs < 1e-5);
    assert!(s.share_kernel_a.unwrap() < 1e-3);
    let shares = s.share_kernel_a.unwrap() + s.share_kernel_b.unwrap() + s.share_logits.unwrap();
    assert!((shares - 1.0).abs() < 1e-12);
    assert!(s.verdict.starts_with("the mismatch is "), "{}", s.verdict);
    assert!(
        s.verdict.contains("kernel numerics (A 0.0%, B "),
        "{}",
        s.verdict
    );
    // Both kernels are within their sound bounds (PyTorch's bf16
    // log_softmax is SUSPECT: one output 0.536 bf16 ulps off, beyond the
    // statistical threshold; it passes the sound bound at 0.955).
    assert_eq!(s.kernel_bounds.len(), 2);
    let (ka, kb) = (&s.kernel_bounds[0], &s.kernel_bounds[1]);
    assert_eq!((ka.output, ka.verdict), ("log_probs", Verdict::Pass));
    assert_eq!(kb.output, "log_probs");
    assert!(
        matches!(kb.verdict, Verdict::Pass | Verdict::Suspect),
        "{kb:?}"
    );
    assert!(kb.max_ratio.unwrap() <= 1.0);
    assert_eq!(r.exit_status, 0);
    let q = s.importance_ratio.as_ref().unwrap();
    assert!(q.min < 1.0 && q.max > 1.0 && q.outside_clip == 0);
    assert!(s.pearson_log_probs.unwrap() > 0.999);
}

#[test]
fn a_dump_against_itself_is_bitwise_equal() {
    let r = compare("trainer_f32", "trainer_f32");
    let s = &r.summary;
    assert_eq!(s.bitwise_equal_rows, Some(16));
    assert_eq!(s.logits_bitwise_equal_rows, Some(16));
    assert_eq!(s.observed.as_ref().unwrap().max_abs, 0.0);
    assert_eq!(s.logits_effect.as_ref().unwrap().max_abs, 0.0);
    assert_eq!(s.kl.as_ref().unwrap().max_abs, 0.0);
    assert!(s.verdict.starts_with("no mismatch"), "{}", s.verdict);
    assert_eq!(r.exit_status, 0);
}

#[test]
fn b_without_logits_gives_its_deviation_from_a_exact() {
    let full = worked_example();
    let r = compare("trainer_f32", "rollout_bf16_log_probs_only");
    assert_eq!(r.rows.len(), full.rows.len());
    for (c, g) in r.rows.iter().zip(&full.rows) {
        assert_eq!(c.observed, g.observed);
        assert_eq!(c.kernel_error_a, g.kernel_error_a);
        // lp_B - exact(A) = kernel_error_b - logits_effect, on enclosures.
        let bm = c.b_minus_exact_a.unwrap();
        let (kb, le) = (g.kernel_error_b.unwrap(), g.logits_effect.unwrap());
        let (lo, hi) = (f(kb.lo) - f(le.hi), f(kb.hi) - f(le.lo));
        assert!(f(bm.hi) >= lo && f(bm.lo) <= hi, "row {}", c.row);
        assert!(c.kl.is_none() && c.kernel_error_b.is_none());
    }
    assert!(
        r.summary.verdict.contains("B has no logits"),
        "{}",
        r.summary.verdict
    );
}

fn run(args: &[&Path], extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .arg("compare")
        .args(extra)
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_prints_a_versioned_json_report_and_exits_2_on_bad_input() {
    let (a, b) = (fixture("trainer_f32"), fixture("rollout_bf16"));
    let (code, out, err) = run(&[&a, &b], &["--json", "--no-kl"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["rows"].as_array().unwrap().len(), 16);
    for key in [
        "kernel_error_a",
        "kernel_error_b",
        "logits_effect",
        "observed",
    ] {
        assert!(v["rows"][0][key]["lo"].is_number(), "{key}");
    }
    assert!(v["rows"][0]["kl"].is_null());
    assert!(v["summary"]["verdict"]
        .as_str()
        .unwrap()
        .contains("kernel numerics"));
    let (code, out, _) = run(&[&a, &b], &["--no-kl"]);
    assert_eq!(code, 0);
    assert!(out.contains("logits_effect = exact(A) - exact(B)"), "{out}");
    let lp_only = fixture("rollout_bf16_log_probs_only");
    let (code, _, err) = run(&[&lp_only, &a], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("A has no `logits`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
