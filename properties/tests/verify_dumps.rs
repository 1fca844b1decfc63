//! Dumps as users have them (issue 11): every name of the format checked,
//! `[B, T, V]` logits, `row_mask`, summed cotangents, integer tokens of any
//! width, the kernel's own top-k ids, nothing unchecked called a pass,
//! temperatures that cannot be used, and the binary's output.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ndarray::{Array1, Array2};

use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Options, Output, Problem};
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::names::NameError;
use logprobe_verify::verify::{verify_dump, FileReport, ReportVerdict, RowSelection, VerifyConfig};

const N: usize = 4;
const V: usize = 24;

fn logits() -> Vec<f64> {
    (0..N * V)
        .map(|i| ((i * 37 + 11) % 97) as f64 / 8.0 - 6.0)
        .collect()
}

/// Exact (f64-rounded) log_probs, entropy, top-k log-probs at `ids [N, K]`,
/// and the gradient for cotangents `g`, `h` (`[N]`).
fn exact(x: &[f64], tokens: &[i64], ids: &[i64], k: usize, g: &[f64]) -> [Vec<f64>; 4] {
    let xa = Array2::from_shape_vec((N, V), x.to_vec()).unwrap();
    let t = Array1::from(tokens.to_vec());
    let ida = Array2::from_shape_vec((N, k), ids.to_vec()).unwrap();
    let p = Problem {
        logits: Logits::F64(xa.view()),
        tokens: Some(t.view()),
        sampling_mask: None,
        topk_ids: Some(ida.view()),
        policy: Default::default(),
        teacher_topk_log_probs: None,
        teacher_probs: None,
        options: Options::default(),
        loss_weights: None,
    };
    let o = Oracle::default();
    let f = o.forward(&p, Dtype::F64).unwrap();
    // `ignore_index` rows hold the defined 0.
    let rounded = |o: Output| -> Vec<f64> { f.values[o].iter().map(|e| e.rounded).collect() };
    let (lp, ent, tk) = (
        rounded(Output::LogProbs),
        rounded(Output::Entropy),
        rounded(Output::TopkLogProbs),
    );
    let ga = Array1::from(g.to_vec());
    let cot = Cotangents::default().with_column(Output::LogProbs, ga.view());
    let grad = o
        .vjp(&p, &cot, Dtype::F64)
        .unwrap()
        .iter()
        .map(|e| e.rounded)
        .collect();
    [lp, ent, tk, grad]
}

const TOKENS: [i64; N] = [5, 0, 23, 12];

/// A valid dump of f64 logits `[N, V]` with exact log_probs and entropy.
fn base() -> Vec<(&'static str, DumpTensor)> {
    let x = logits();
    let [lp, ent, _, _] = exact(&x, &TOKENS, &[0; N], 1, &[0.0; N]);
    vec![
        ("logits", DumpTensor::floats(Dtype::F64, &[N, V], &x)),
        ("tokens", DumpTensor::i64s(&[N], &TOKENS)),
        ("log_probs", DumpTensor::floats(Dtype::F64, &[N], &lp)),
        ("entropy", DumpTensor::floats(Dtype::F64, &[N], &ent)),
    ]
}

fn bytes(t: &[(&str, DumpTensor)], meta: &[(&str, &str)]) -> Vec<u8> {
    serialize_dump(t, meta).unwrap()
}

fn report(b: &[u8], rows: RowSelection) -> Result<FileReport, DumpError> {
    let d = Dump::parse(b)?;
    let cfg = VerifyConfig {
        rows,
        ..VerifyConfig::default()
    };
    verify_dump(&d, Path::new("t"), &cfg)
}

fn write(name: &str, b: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_dumps");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.safetensors"));
    std::fs::write(&p, b).unwrap();
    p
}

/// Runs `logprobe ARGS`: (exit status, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn bad_input(name: &str, b: &[u8], needles: &[&str]) -> String {
    let p = write(name, b);
    let (code, out, err) = run(&["verify", p.to_str().unwrap()]);
    let text = out + &err;
    assert_eq!(code, 2, "{name}: {text}");
    for n in needles {
        assert!(text.contains(n), "{name}: lacks {n:?}: {text}");
    }
    assert!(!text.contains("panicked"), "{text}");
    text
}

/// Rewrites the header of a safetensors file (`f` maps the JSON text),
/// keeping it 8-byte aligned.
fn patch_header(b: &[u8], f: impl Fn(&str) -> String) -> Vec<u8> {
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let mut h = f(std::str::from_utf8(&b[8..8 + n]).unwrap().trim_end());
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h.as_bytes());
    out.extend(&b[8 + n..]);
    out
}

#[test]
fn base_dump_passes() {
    assert_eq!(
        report(&bytes(&base(), &[]), RowSelection::All)
            .unwrap()
            .verdict,
        ReportVerdict::Pass
    );
}

// ---- 1. Names ----------------------------------------------------------

#[test]
fn unknown_names_are_bad_input_with_the_closest() {
    let b = bytes(&base(), &[("temprature_dtype", "input")]);
    assert!(matches!(
        Dump::parse(&b),
        Err(DumpError::Name(NameError::Unknown {
            suggestion: Some("temperature_dtype"),
            ..
        }))
    ));
    bad_input(
        "unknown_key",
        &b,
        &["temprature_dtype", "did you mean `temperature_dtype`?"],
    );
    let mut t = base();
    t.push(("logprobs", DumpTensor::floats(Dtype::F64, &[N], &[0.0; N])));
    bad_input(
        "unknown_tensor",
        &bytes(&t, &[]),
        &["tensor `logprobs`", "did you mean `log_probs`?"],
    );
    // Version-2 names need format_version=2; reserved ones are not built.
    let mut t = base();
    t.push(("row_mask", DumpTensor::bools(&[N], &[true; N])));
    bad_input(
        "v2_needs_version",
        &bytes(&t, &[]),
        &["row_mask", "format_version"],
    );
    bad_input(
        "v2_unbuilt",
        &bytes(
            &base(),
            &[
                (keys::FORMAT_VERSION.name, "2"),
                (keys::Z_LOSS_ROWS.name, "1"),
            ],
        ),
        &["z_loss_rows", "not supported yet"],
    );
}

#[test]
fn repeated_keys_and_tensor_names_say_duplicate() {
    let b = bytes(&base(), &[(keys::TEMPERATURE.name, "1")]);
    let b2 = patch_header(&b, |h| {
        h.replacen(
            r#""temperature":"1""#,
            r#""temperature":"1","temperature":"0.5""#,
            1,
        )
    });
    assert!(matches!(Dump::parse(&b2), Err(DumpError::Duplicate(_))));
    bad_input(
        "repeated_key",
        &b2,
        &["duplicate metadata key `temperature`"],
    );
    let b = bytes(&base(), &[]);
    let b3 = patch_header(&b, |h| {
        let i = h.find(r#""tokens":"#).unwrap();
        let j = i + h[i..].find('}').unwrap() + 1;
        format!("{},{}", &h[..j], &h[i..])
    });
    let text = bad_input("duplicate_tensor", &b3, &["duplicate tensor `tokens`"]);
    assert!(!text.contains("offset"), "{text}");
}

#[test]
fn u8_sampling_mask_values_other_than_0_1_are_bad_input() {
    let mut t = base();
    let mut m = DumpTensor::bools(&[N, V], &[true; N * V]);
    m.dtype = safetensors::Dtype::U8;
    m.data[V + 1] = 2;
    t.push(("sampling_mask", m));
    assert!(matches!(
        report(&bytes(&t, &[]), RowSelection::All),
        Err(DumpError::BadMaskValue {
            row: 1,
            col: 1,
            value: 2
        })
    ));
}

// ---- 2. Shapes users have ------------------------------------------------

#[test]
fn batch_sequence_logits_name_rows_b_t() {
    let x = logits();
    let [mut lp, ent, _, _] = exact(&x, &TOKENS, &[0; N], 1, &[0.0; N]);
    let t3 = |lp: &[f64]| {
        vec![
            ("logits", DumpTensor::floats(Dtype::F64, &[2, 2, V], &x)),
            ("tokens", DumpTensor::i64s(&[2, 2], &TOKENS)),
            ("log_probs", DumpTensor::floats(Dtype::F64, &[2, 2], lp)),
            ("entropy", DumpTensor::floats(Dtype::F64, &[2, 2], &ent)),
        ]
    };
    let r = report(&bytes(&t3(&lp), &[]), RowSelection::All).unwrap();
    assert_eq!((r.verdict, r.rows), (ReportVerdict::Pass, N));
    lp[2] += 0.5; // (b, t) = (1, 0)
    let r = report(&bytes(&t3(&lp), &[]), RowSelection::All).unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail);
    assert_eq!(r.outputs[0].worst[0].position, Some((1, 0)));
    let table = logprobe_verify::verify::render_table(&r);
    assert!(table.contains("(1, 0)"), "{table}");
    // [N] tokens with [B, T, V] logits: the shape names B and T.
    let mut t = t3(&lp);
    t[1] = ("tokens", DumpTensor::i64s(&[N], &TOKENS));
    bad_input(
        "btv_flat_tokens",
        &bytes(&t, &[]),
        &["tokens", "[B, T] = [2, 2]"],
    );
}

#[test]
fn row_mask_excludes_rows_from_every_check() {
    let mut t = base();
    if let Some((_, lp)) = t.iter_mut().find(|(n, _)| *n == "log_probs") {
        lp.data[8..16].copy_from_slice(&(-50.0f64).to_le_bytes()); // row 1 wrong
    }
    let v2 = [(keys::FORMAT_VERSION.name, "2")];
    assert_eq!(
        report(&bytes(&t, &[]), RowSelection::All).unwrap().verdict,
        ReportVerdict::Fail
    );
    let mut tm = t.clone();
    tm.push((
        "row_mask",
        DumpTensor::bools(&[N], &[true, false, true, true]),
    ));
    let r = report(&bytes(&tm, &v2), RowSelection::All).unwrap();
    assert_eq!((r.verdict, r.outputs[0].count), (ReportVerdict::Pass, 3));
    // [B, T] row_mask with [B, T, V] logits is accepted too.
    let mut t3: Vec<_> = t.clone();
    t3[0].1.shape = vec![2, 2, V];
    for (n, x) in t3.iter_mut().skip(1) {
        assert!(*n != "logits");
        x.shape = vec![2, 2];
    }
    t3.push((
        "row_mask",
        DumpTensor::bools(&[2, 2], &[true, false, true, true]),
    ));
    assert_eq!(
        report(&bytes(&t3, &v2), RowSelection::All).unwrap().verdict,
        ReportVerdict::Pass
    );
    // Every row excluded: valid, nothing checked.
    let mut t0 = t.clone();
    t0.push(("row_mask", DumpTensor::bools(&[N], &[false; N])));
    let r = report(&bytes(&t0, &v2), RowSelection::All).unwrap();
    for o in &r.outputs {
        assert!(
            o.nothing_checked.as_deref().unwrap().contains("row_mask"),
            "{o:?}"
        );
    }
    let mut tb = t;
    let mut m = DumpTensor::bools(&[N], &[true; N]);
    m.data[3] = 9;
    tb.push(("row_mask", m));
    bad_input(
        "row_mask_byte",
        &bytes(&tb, &v2),
        &["row_mask[3]", "not 0 or 1"],
    );
}

#[test]
fn scalar_cotangents_broadcast_only_under_sum() {
    let x = logits();
    let g = 0.75;
    let [lp, _, _, grad] = exact(&x, &TOKENS, &[0; N], 1, &[g; N]);
    let t = |shape: &[usize]| {
        vec![
            ("logits", DumpTensor::floats(Dtype::F64, &[N, V], &x)),
            ("tokens", DumpTensor::i64s(&[N], &TOKENS)),
            ("log_probs", DumpTensor::floats(Dtype::F64, &[N], &lp)),
            (
                "grad_log_probs",
                DumpTensor::floats(Dtype::F32, shape, &[g]),
            ),
            (
                "grad_logits",
                DumpTensor::floats(Dtype::F64, &[N, V], &grad),
            ),
        ]
    };
    let sum = [
        (keys::FORMAT_VERSION.name, "2"),
        (keys::COTANGENT_REDUCTION.name, "sum"),
    ];
    for shape in [&[][..], &[1][..]] {
        let r = report(&bytes(&t(shape), &sum), RowSelection::All).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Pass, "{shape:?}");
        assert_eq!(r.outputs[1].count, N * V);
    }
    bad_input(
        "scalar_cotangent_none",
        &bytes(&t(&[]), &[]),
        &["grad_log_probs", "cotangent_reduction"],
    );
}

#[test]
fn integer_tokens_of_any_width() {
    use safetensors::Dtype as D;
    for (dtype, width) in [
        (D::I8, 1),
        (D::U8, 1),
        (D::I16, 2),
        (D::U16, 2),
        (D::I32, 4),
        (D::U32, 4),
        (D::U64, 8),
    ] {
        let mut t = base();
        t[1].1 = DumpTensor {
            dtype,
            shape: vec![N],
            data: TOKENS
                .iter()
                .flat_map(|&v| (v as u64).to_le_bytes()[..width].to_vec())
                .collect(),
        };
        assert_eq!(
            report(&bytes(&t, &[]), RowSelection::All).unwrap().verdict,
            ReportVerdict::Pass,
            "{dtype:?}"
        );
    }
    let mut t = base();
    t[1].1 = DumpTensor {
        dtype: D::U64,
        shape: vec![N],
        data: [5u64, u64::MAX, 1, 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
    };
    assert!(matches!(
        Dump::parse(&bytes(&t, &[])),
        Err(DumpError::IdOverflow { index: 1, .. })
    ));
}

// ---- 3. Top-k ids from the kernel ----------------------------------------

/// The true top-2 of each row (descending), ties to the lower id.
fn top2(x: &[f64]) -> Vec<i64> {
    let mut out = Vec::new();
    for r in 0..N {
        let mut idx: Vec<usize> = (0..V).collect();
        idx.sort_by(|&a, &b| x[r * V + b].total_cmp(&x[r * V + a]).then(a.cmp(&b)));
        out.extend([idx[0] as i64, idx[1] as i64]);
    }
    out
}

fn topk_dump(x: &[f64], ids: &[i64], meta: &[(&str, &str)]) -> Vec<u8> {
    let [_, _, tk, _] = exact(x, &TOKENS, ids, 2, &[0.0; N]);
    let t = vec![
        ("logits", DumpTensor::floats(Dtype::F64, &[N, V], x)),
        ("topk_ids", DumpTensor::i64s(&[N, 2], ids)),
        (
            "topk_log_probs",
            DumpTensor::floats(Dtype::F64, &[N, 2], &tk),
        ),
    ];
    let mut m = vec![
        (keys::FORMAT_VERSION.name, "2"),
        (keys::TOPK_IDS_SOURCE.name, "kernel"),
    ];
    m.extend_from_slice(meta);
    bytes(&t, &m)
}

#[test]
fn kernel_topk_ids_are_checked_as_a_top_k_set() {
    let x = logits();
    let ids = top2(&x);
    let r = report(
        &topk_dump(&x, &ids, &[(keys::TOPK_SORTED.name, "true")]),
        RowSelection::All,
    )
    .unwrap();
    assert_eq!(r.verdict, ReportVerdict::Pass);
    assert_eq!(r.topk_ids.as_ref().unwrap().rows_checked, N);
    // Wrong ids whose values are their exact log-probs: top-k log-probs
    // pass, the ids fail.
    let mut wrong = ids.clone();
    wrong[5] = (0..V as i64).find(|j| !ids[4..6].contains(j)).unwrap();
    let r = report(&topk_dump(&x, &wrong, &[]), RowSelection::All).unwrap();
    assert_eq!(r.outputs[0].verdict, ReportVerdict::Pass);
    let tk = r.topk_ids.as_ref().unwrap();
    assert_eq!(
        (r.verdict, tk.rows_failed, tk.failures[0].row),
        (ReportVerdict::Fail, 1, 2)
    );
    // Order: checked only under topk_sorted=true.
    let mut swapped = ids.clone();
    swapped.swap(0, 1);
    assert_eq!(
        report(&topk_dump(&x, &swapped, &[]), RowSelection::All)
            .unwrap()
            .verdict,
        ReportVerdict::Pass
    );
    let r = report(
        &topk_dump(&x, &swapped, &[(keys::TOPK_SORTED.name, "true")]),
        RowSelection::All,
    )
    .unwrap();
    assert_eq!(r.verdict, ReportVerdict::Fail);
    // Ties at the boundary: either tied id is a valid top-1 / top-2.
    let mut xt = x.clone();
    let (a, b) = (ids[0] as usize, ids[1] as usize);
    let third = (0..V).find(|&j| j != a && j != b).unwrap();
    xt[third] = xt[b];
    for pick in [b, third] {
        let ids2: Vec<i64> = [vec![a as i64, pick as i64], top2(&xt)[2..].to_vec()].concat();
        let r = report(
            &topk_dump(&xt, &ids2, &[(keys::TOPK_SORTED.name, "true")]),
            RowSelection::All,
        )
        .unwrap();
        assert_eq!(r.verdict, ReportVerdict::Pass, "tie pick {pick}");
    }
    // Duplicates fail.
    let mut dup = ids;
    dup[1] = dup[0];
    assert_eq!(
        report(&topk_dump(&x, &dup, &[]), RowSelection::All)
            .unwrap()
            .verdict,
        ReportVerdict::Fail
    );
}

// ---- 4. Nothing unchecked is a pass --------------------------------------

#[test]
fn empty_row_selections_are_bad_input() {
    let p = write("rows", &bytes(&base(), &[]));
    for sel in ["5..", "4..", "0..0", "sample:0", "2..2"] {
        let (code, out, err) = run(&["verify", "--rows", sel, p.to_str().unwrap()]);
        assert_eq!(code, 2, "--rows {sel}: {out}{err}");
        assert!(err.contains("selects no row"), "--rows {sel}: {err}");
    }
    assert!(matches!(
        report(
            &bytes(&base(), &[]),
            RowSelection::Range {
                start: 5,
                end: usize::MAX
            }
        ),
        Err(DumpError::EmptySelection { rows: 4, .. })
    ));
}

#[test]
fn nothing_checked_is_said_per_output() {
    // Every token ignored.
    let mut t = base();
    t[1].1 = DumpTensor::i64s(&[N], &[-100; N]);
    let r = report(&bytes(&t, &[]), RowSelection::All).unwrap();
    assert!(r.outputs[0]
        .nothing_checked
        .as_deref()
        .unwrap()
        .contains("ignore_index"));
    assert!(r.outputs[1].nothing_checked.is_none(), "entropy is checked");
    assert_eq!(r.outputs[0].verdict, ReportVerdict::Unchecked);
    assert_eq!(r.outputs[1].verdict, ReportVerdict::Pass);
    assert_eq!(
        r.verdict,
        ReportVerdict::Unchecked,
        "one output unchecked: not a pass"
    );
    let table = logprobe_verify::verify::render_table(&r);
    assert!(
        table.contains("unchecked") && table.contains("log_probs: nothing checked"),
        "{table}"
    );
    // K = 0.
    let x = logits();
    let t = vec![
        ("logits", DumpTensor::floats(Dtype::F64, &[N, V], &x)),
        ("topk_ids", DumpTensor::i64s(&[N, 0], &[])),
        (
            "topk_log_probs",
            DumpTensor::floats(Dtype::F64, &[N, 0], &[]),
        ),
    ];
    let r = report(&bytes(&t, &[]), RowSelection::All).unwrap();
    assert!(r.outputs[0]
        .nothing_checked
        .as_deref()
        .unwrap()
        .contains("K = 0"));
    // N = 0, through the binary's JSON (with its schema version).
    let t = vec![
        ("logits", DumpTensor::floats(Dtype::F32, &[0, V], &[])),
        ("tokens", DumpTensor::i64s(&[0], &[])),
        ("log_probs", DumpTensor::floats(Dtype::F32, &[0], &[])),
    ];
    let p = write("n0", &bytes(&t, &[]));
    let (code, out, _) = run(&["verify", "--json", p.to_str().unwrap()]);
    // Nothing checked is not a pass: exit 1, verdict `unchecked`.
    assert_eq!(code, 1);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["schema_version"], 2);
    assert_eq!(
        j["files"][0]["outputs"][0]["nothing_checked"],
        "no rows (N = 0)"
    );
    assert_eq!(j["files"][0]["verdict"], "unchecked");
    assert_eq!(j["files"][0]["outputs"][0]["verdict"], "unchecked");
    let (_, out, _) = run(&["verify", p.to_str().unwrap()]);
    assert!(out.contains("nothing checked"), "{out}");
}

// ---- 5. Temperature ------------------------------------------------------

#[test]
fn unusable_temperatures_are_bad_input() {
    // f32 logits: 1e-45 rounds to the f32 1.4e-45 > 0, but z = 6 / 1.4e-45
    // overflows f32.
    let mut t = base();
    let x32: Vec<f64> = logits();
    t[0].1 = DumpTensor::floats(Dtype::F32, &[N, V], &x32);
    let b = bytes(&t, &[(keys::TEMPERATURE.name, "1e-45")]);
    assert!(matches!(
        report(&b, RowSelection::All),
        Err(DumpError::ScaledOverflow {
            dtype: Dtype::F32,
            ..
        })
    ));
    bad_input("t_1e-45", &b, &["overflows f32", "temperature"]);
    // In f64 the same temperature is usable.
    let b = bytes(&base(), &[(keys::TEMPERATURE.name, "1e-45")]);
    assert!(report(&b, RowSelection::All).is_ok());
    let b = bytes(&t, &[(keys::TEMPERATURE.name, "1e-300")]);
    let text = bad_input("t_1e-300", &b, &["rounds to 0 in f32"]);
    assert!(!text.contains("> 0"), "{text}");
}

// ---- 6. Output -----------------------------------------------------------

#[test]
fn each_message_is_printed_once() {
    let text = bad_input(
        "once",
        &bytes(&base(), &[("temprature", "1")]),
        &["temprature"],
    );
    assert_eq!(text.matches("did you mean").count(), 1, "{text}");
}

#[test]
fn a_closed_stdout_ends_quietly_with_the_verdicts_status() {
    let good = write("pipe_good", &bytes(&base(), &[]));
    let mut t = base();
    t[2].1.data[..8].copy_from_slice(&(-50.0f64).to_le_bytes());
    let bad = write("pipe_bad", &bytes(&t, &[]));
    for (files, want) in [(vec![&good, &good, &good], 0), (vec![&good, &bad], 1)] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_logprobe"))
            .arg("verify")
            .args(files.iter().map(|p| p.as_os_str()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader goes away before any output
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(want), "{err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{err}"
        );
    }
}

#[test]
fn progress_prints_lines_when_stderr_is_not_a_terminal() {
    const NB: usize = 8;
    const VB: usize = 60_000;
    let x: Vec<f64> = (0..NB * VB)
        .map(|i| ((i * 37 + 11) % 97) as f64 / 8.0 - 6.0)
        .collect();
    let t = vec![
        ("logits", DumpTensor::floats(Dtype::F32, &[NB, VB], &x)),
        ("entropy", DumpTensor::floats(Dtype::F32, &[NB], &[4.0; NB])),
    ];
    let p = write("progress", &bytes(&t, &[]));
    let (_, _, err) = run(&["verify", "--progress-every", "0.001", p.to_str().unwrap()]);
    assert!(
        err.contains("progress.safetensors: ") && err.contains(" rows, "),
        "{err}"
    );
    let (_, _, err) = run(&["verify", "--no-progress", p.to_str().unwrap()]);
    assert!(!err.contains(" rows, "), "{err}");
}

#[test]
fn a_directory_says_so() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_dumps");
    std::fs::create_dir_all(&dir).unwrap();
    let (code, _, err) = run(&["verify", dir.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("is a directory"), "{err}");
}

#[test]
fn help_describes_the_binary_and_verify() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("Exact verification of log-prob"), "{out}");
    assert!(!out.contains("cargo test gate"), "{out}");
    let (code, out, _) = run(&["verify", "--help"]);
    assert_eq!(code, 0);
    for needle in [
        "Exit status",
        "2  bad input",
        "grad_topk_log_probs",
        "row_mask",
        "temperature_dtype",
        "tightest",
        "err/care",
        "relative rule",
        "judged absolutely",
    ] {
        assert!(
            out.contains(needle),
            "verify --help lacks {needle:?}:\n{out}"
        );
    }
}

// ---- The top-k KL's gradients (issue 18) --------------------------------

/// A dump of f32 logits with a teacher's top-3, both KL cotangents and
/// grad_logits from `grad` (the CPU kernel's backward, or a planted one).
fn kl_grad_dump(
    renormalized: bool,
    grad: impl Fn(&Problem<'_>, &Cotangents<'_>) -> Array2<f64>,
) -> Vec<u8> {
    use logprobe_reference::spec::TopkKl;
    let x: Vec<f32> = logits().iter().map(|&v| v as f32).collect();
    let xa = Array2::from_shape_vec((N, V), x.clone()).unwrap();
    let ids: Vec<i64> = (0..N)
        .flat_map(|r| [(r * 5) as i64, (r * 5 + 7) as i64, 23])
        .collect();
    let ida = Array2::from_shape_vec((N, 3), ids.clone()).unwrap();
    let a: Vec<f64> = (0..N * 3).map(|i| -1.5 - (i % 5) as f64 * 0.375).collect();
    let aa = Array2::from_shape_vec((N, 3), a.clone()).unwrap();
    let gf = [1.0, -0.5, 0.25, 2.0];
    let gr = [0.75, 1.5, -1.0, 0.125];
    let (gfa, gra) = (Array1::from(gf.to_vec()), Array1::from(gr.to_vec()));
    let mut p = Problem::new(Logits::F32(xa.view()));
    p.options.entropy = None;
    p.topk_ids = Some(ida.view());
    p.teacher_topk_log_probs = Some(aa.view());
    p.options.topk_kl = Some(TopkKl {
        forward: false,
        reverse: false,
        renormalized,
        teacher_dtype: Dtype::F32,
    });
    let cot = Cotangents::default()
        .with_column(Output::ForwardKl, gfa.view())
        .with_column(Output::ReverseKl, gra.view());
    let g: Vec<f64> = grad(&p, &cot).iter().copied().collect();
    let xf: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let renorm = if renormalized { "true" } else { "false" };
    bytes(
        &[
            ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &xf)),
            ("topk_ids", DumpTensor::i64s(&[N, 3], &ids)),
            (
                "teacher_topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[N, 3], &a),
            ),
            ("grad_forward_kl", DumpTensor::floats(Dtype::F32, &[N], &gf)),
            ("grad_reverse_kl", DumpTensor::floats(Dtype::F32, &[N], &gr)),
            ("grad_logits", DumpTensor::floats(Dtype::F32, &[N, V], &g)),
        ],
        &[
            (keys::FORMAT_VERSION.name, "2"),
            (keys::KL_RENORMALIZED.name, renorm),
        ],
    )
}

#[test]
fn kl_gradients_are_judged_through_grad_logits() {
    use logprobe_kernels::{topk_kl_slopes, CpuKernel, Kernel};
    for renorm in [false, true] {
        let ok = kl_grad_dump(renorm, |p, cot| {
            CpuKernel::fused().backward(p, cot, Dtype::F32).unwrap()
        });
        let r = report(&ok, RowSelection::All).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Pass, "renorm {renorm}: {r:?}");
        // The reverse KL's slope without `+ p_k` (and the forward's right).
        let bug = kl_grad_dump(renorm, |p, cot| {
            let k = CpuKernel::fused();
            let lps = k.forward(p, Dtype::F32).unwrap().values[Output::TopkLogProbs].clone();
            let a = p.teacher_topk_log_probs.unwrap();
            let (gf, gr) = (
                cot.column(Output::ForwardKl).unwrap(),
                cot.column(Output::ReverseKl).unwrap(),
            );
            let w = Array2::from_shape_fn((N, 3), |(r, c)| {
                let l: Vec<f32> = lps.row(r).iter().map(|&x| x as f32).collect();
                let f = topk_kl_slopes(&l, &a.row(r).to_vec(), renorm, gf[r] as f32, 0.0)[c];
                let (lk, ak) = (l[c], a[[r, c]] as f32);
                (f + gr[r] as f32 * lk.exp() * (lk - ak)) as f64
            });
            let topk = Cotangents::default().with(Output::TopkLogProbs, w.view());
            k.backward(p, &topk, Dtype::F32).unwrap()
        });
        let r = report(&bug, RowSelection::All).unwrap();
        assert_eq!(r.verdict, ReportVerdict::Fail, "renorm {renorm}: {r:?}");
    }
    // A reverse cotangent at an infinite reverse KL is bad input, named.
    let x: Vec<f64> = logits().iter().map(|&v| v as f32 as f64).collect();
    let ids: Vec<i64> = (0..N as i64).flat_map(|r| [r, r + 4]).collect();
    let mut a = vec![-2.0; N * 2];
    a[3] = f64::NEG_INFINITY;
    let b = bytes(
        &[
            ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &x)),
            ("topk_ids", DumpTensor::i64s(&[N, 2], &ids)),
            (
                "teacher_topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[N, 2], &a),
            ),
            (
                "grad_reverse_kl",
                DumpTensor::floats(Dtype::F32, &[N], &[1.0; N]),
            ),
            (
                "grad_logits",
                DumpTensor::floats(Dtype::F32, &[N, V], &vec![0.0; N * V]),
            ),
        ],
        &[(keys::FORMAT_VERSION.name, "2")],
    );
    bad_input(
        "kl_grad_infinite",
        &b,
        &["grad_reverse_kl[1]", "teacher_topk_log_probs[1, 1]"],
    );
}

/// The soft cross-entropy against a top-k teacher (issue 47's third form):
/// with `topk_ids` and `teacher_topk_log_probs` and no dense teacher, the
/// teacher is `exp(a_k)` at the ids and nothing elsewhere. Our kernel's
/// value over that teacher passes; one that renormalises the student over
/// the ids fails; a repeated id (whose mass would count twice) is bad
/// input naming the row.
#[test]
fn soft_cross_entropy_against_a_top_k_teacher() {
    const N: usize = 3;
    const V: usize = 40;
    let x = Array2::from_shape_fn((N, V), |(r, j)| ((r * 7 + j * 3) as f32 * 0.41).sin() * 3.0);
    let ids = Array2::from_shape_fn((N, 4), |(r, k)| ((r + 5 * k) % V) as i64);
    let a = Array2::from_shape_fn((N, 4), |(_, k)| {
        f64::from(((k as f32) * -0.7 - 0.5).min(0.0))
    });
    // The kernel's value: `-sum_k e^{a_k} lp(id_k)` (f64 log_softmax, rounded to f32).
    let h: Vec<f64> = (0..N)
        .map(|r| {
            let m = (0..V)
                .map(|j| f64::from(x[[r, j]]))
                .fold(f64::MIN, f64::max);
            let lse = m
                + (0..V)
                    .map(|j| (f64::from(x[[r, j]]) - m).exp())
                    .sum::<f64>()
                    .ln();
            let s: f64 = (0..4)
                .map(|k| a[[r, k]].exp() * (f64::from(x[[r, ids[[r, k]] as usize]]) - lse))
                .sum();
            f64::from(-s as f32)
        })
        .collect();
    let dump = |h: &[f64], ids: &Array2<i64>| {
        let t = vec![
            (
                "logits",
                DumpTensor::floats(
                    Dtype::F32,
                    &[N, V],
                    &x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
                ),
            ),
            (
                "topk_ids",
                DumpTensor::i64s(&[N, 4], &ids.iter().copied().collect::<Vec<_>>()),
            ),
            (
                "teacher_topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[N, 4], &a.iter().copied().collect::<Vec<_>>()),
            ),
            (
                "soft_cross_entropy",
                DumpTensor::floats(Dtype::F32, &[N], h),
            ),
        ];
        serialize_dump(&t, &[("format_version", "2")]).unwrap()
    };
    let verdict = |bytes: &[u8]| {
        let d = Dump::parse(bytes).unwrap();
        let r = verify_dump(&d, Path::new("topk_soft"), &VerifyConfig::default()).unwrap();
        r.outputs
            .iter()
            .find(|o| o.output == "soft_cross_entropy")
            .unwrap()
            .verdict
    };
    assert_eq!(verdict(&dump(&h, &ids)), ReportVerdict::Pass);
    let off: Vec<f64> = h.iter().map(|v| v - 0.25).collect();
    assert_eq!(verdict(&dump(&off, &ids)), ReportVerdict::Fail);
    let mut dup = ids.clone();
    dup[[1, 2]] = dup[[1, 0]];
    let bytes = dump(&h, &dup);
    let d = Dump::parse(&bytes).unwrap();
    let e = verify_dump(&d, Path::new("dup"), &VerifyConfig::default()).unwrap_err();
    assert!(
        e.to_string().contains("row 1") || e.to_string().contains("[1"),
        "{e}"
    );
}

// ---- The relative rule (issue 42) ------------------------------------------

/// Exact f64 log-probs at `tokens` of f32 logits `x [rows, v]`.
fn exact_lp_f32(x: &[f64], rows: usize, v: usize, tokens: &[i64]) -> Vec<f64> {
    let xf: Vec<f32> = x.iter().map(|&a| a as f32).collect();
    let xa = Array2::from_shape_vec((rows, v), xf).unwrap();
    let t = Array1::from(tokens.to_vec());
    let mut p = Problem::new(Logits::F32(xa.view()));
    p.tokens = Some(t.view());
    let f = Oracle::default().forward(&p, Dtype::F64).unwrap();
    f.values[Output::LogProbs]
        .iter()
        .map(|e| e.rounded)
        .collect()
}

/// f32 code that careful code would not write is SUSPECT by the relative
/// rule (TOLERANCE.md (R2)), and the report says so: an entropy without
/// the shift (`lse - sum p x`) on logits near 100, and `kl_k3` as
/// `exp(-d) + d - 1` at `d` near 1e-10 (a negative KL); the same rows
/// in careful code's forms pass.
#[test]
fn the_relative_rule_marks_what_careful_code_would_not_do() {
    use logprobe_reference::splitmix::SplitMix64;
    let (rows, v) = (4, 4096);
    let mut rng = SplitMix64::new(42);
    // LLM-like rows at +100: a body of spread ~2.5 and four dominant tokens.
    let x: Vec<f64> = (0..rows * v)
        .map(|i| {
            let body = 2.5 * (0..4).map(|_| rng.uniform() - 0.5).sum::<f64>() * 1.7;
            let top = if i % 1021 == 7 { 12.0 } else { 0.0 };
            f64::from((100.0 + body + top) as f32)
        })
        .collect();
    // Unshifted entropy in f32: lse (correctly rounded, as torch's
    // logsumexp nearly is) minus sum p x, the sum pairwise in f32.
    fn pairwise(t: &[f32]) -> f32 {
        if t.len() <= 8 {
            return t.iter().sum();
        }
        let (a, b) = t.split_at(t.len() / 2);
        pairwise(a) + pairwise(b)
    }
    let mut unshifted = Vec::new();
    let mut shifted = Vec::new();
    for r in 0..rows {
        let row = &x[r * v..(r + 1) * v];
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|&a| (a - m).exp()).sum();
        let lse = m + s.ln();
        let p: Vec<f32> = row.iter().map(|&a| (a - lse).exp() as f32).collect();
        let px: Vec<f32> = p.iter().zip(row).map(|(&p, &a)| p * a as f32).collect();
        unshifted.push(f64::from(lse as f32 - pairwise(&px)));
        let plp: Vec<f32> = p
            .iter()
            .zip(row)
            .map(|(&p, &a)| -p * (a - lse) as f32)
            .collect();
        shifted.push(f64::from(pairwise(&plp)));
    }
    let dump = |entropy: &[f64]| {
        bytes(
            &[
                ("logits", DumpTensor::floats(Dtype::F32, &[rows, v], &x)),
                ("entropy", DumpTensor::floats(Dtype::F32, &[rows], entropy)),
            ],
            &[],
        )
    };
    let out = |b: &[u8]| {
        let r = report(b, RowSelection::All).unwrap();
        r.outputs
            .into_iter()
            .find(|o| o.output == "entropy")
            .unwrap()
    };
    let bad = out(&dump(&unshifted));
    let rel = bad.relative_rule.as_ref().unwrap();
    assert_eq!(bad.verdict, ReportVerdict::Suspect, "{rel:?}");
    assert!(
        bad.suspect_rules.contains(&"relative") && rel.fires,
        "{rel:?}"
    );
    assert!(rel.ratio > 2.0 * rel.r, "{rel:?}");
    let good = out(&dump(&shifted));
    assert_eq!(
        good.verdict,
        ReportVerdict::Pass,
        "{:?}",
        good.relative_rule
    );
    assert!(good.suspect_rules.is_empty());

    // kl_k3 at an exact d ~ 1e-10: a kernel whose f32 log-prob is one ulp
    // off (as correct f32 code's may be) computes d = -2^-24, where
    // `(exp(-d) - 1) + d` gives 2^-24 = 6e-8 against an exact 5e-21.
    // The tokens' log-probs near -0.7 (one ulp: 2^-24).
    let (rows, v) = (N, V);
    let mut x = vec![0.0; rows * v];
    for (r, &t) in TOKENS.iter().enumerate() {
        x[r * v + t as usize] = 3.1 + 0.05 * r as f64;
    }
    let lp = exact_lp_f32(&x, rows, v, &TOKENS);
    let ref32: Vec<f32> = lp.iter().map(|&a| (a - 1e-10) as f32).collect();
    let lp32: Vec<f32> = ref32
        .iter()
        .map(|&a| f32::from_bits(a.to_bits() + 1))
        .collect();
    let k3 = |expm1: bool| -> Vec<f64> {
        lp32.iter()
            .zip(&ref32)
            .map(|(&l, &q)| {
                let d = l - q;
                f64::from(if expm1 {
                    (-d).exp_m1() + d
                } else {
                    ((-d).exp() - 1.0) + d
                })
            })
            .collect()
    };
    let dump = |k: &[f64]| {
        let r: Vec<f64> = ref32.iter().map(|&a| f64::from(a)).collect();
        bytes(
            &[
                ("logits", DumpTensor::floats(Dtype::F32, &[rows, v], &x)),
                ("tokens", DumpTensor::i64s(&[rows], &TOKENS)),
                ("ref_log_probs", DumpTensor::floats(Dtype::F32, &[rows], &r)),
                ("kl_k3", DumpTensor::floats(Dtype::F32, &[rows], k)),
            ],
            &[("format_version", "2")],
        )
    };
    let out = |b: &[u8]| {
        let r = report(b, RowSelection::All).unwrap();
        r.outputs.into_iter().find(|o| o.output == "kl_k3").unwrap()
    };
    let naive = out(&dump(&k3(false)));
    assert_eq!(
        naive.verdict,
        ReportVerdict::Suspect,
        "{:?}",
        naive.relative_rule
    );
    assert!(naive.suspect_rules.contains(&"relative"));
    let careful = out(&dump(&k3(true)));
    assert_eq!(
        careful.verdict,
        ReportVerdict::Pass,
        "{:?}",
        careful.relative_rule
    );
    // The table names the rule that fired.
    let p = write("k3_exp_minus_one", &dump(&k3(false)));
    let (code, text, _) = run(&["verify", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("kl_k3: SUSPECT (relative rule)"), "{text}");
    let (code, _, _) = run(&["verify", "--strict", p.to_str().unwrap()]);
    assert_eq!(code, 1);
}
