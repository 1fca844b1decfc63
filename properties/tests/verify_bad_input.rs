//! Bad input to `logprobe verify`: each defect gives a typed error naming the
//! tensor (and row / column), through the library and as exit status 2 of
//! the binary, never a panic or a verdict.

use std::path::{Path, PathBuf};
use std::process::Command;

use logprobe_reference::spec::{Dtype, SpecError};
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{verify_dump, VerifyConfig};

const N: usize = 3;
const V: usize = 5;

fn logits_values() -> Vec<f64> {
    (0..N * V).map(|i| (i % 7) as f64 * 0.25 - 1.0).collect()
}

/// A valid dump: f32 logits [3, 5], tokens, log_probs and entropy.
fn valid() -> Vec<(&'static str, DumpTensor)> {
    vec![
        (
            "logits",
            DumpTensor::floats(Dtype::F32, &[N, V], &logits_values()),
        ),
        ("tokens", DumpTensor::i64s(&[N], &[0, 4, 2])),
        (
            "log_probs",
            DumpTensor::floats(Dtype::F32, &[N], &[-1.5, -1.5, -1.5]),
        ),
        (
            "entropy",
            DumpTensor::floats(Dtype::F32, &[N], &[1.5, 1.5, 1.5]),
        ),
    ]
}

fn with(
    mut t: Vec<(&'static str, DumpTensor)>,
    name: &'static str,
    tensor: Option<DumpTensor>,
) -> Vec<(&'static str, DumpTensor)> {
    t.retain(|(n, _)| *n != name);
    if let Some(x) = tensor {
        t.push((name, x));
    }
    t
}

fn bytes(t: &[(&str, DumpTensor)], meta: &[(&str, &str)]) -> Vec<u8> {
    serialize_dump(t, meta).expect("serialisable")
}

/// Parses and validates every row (the checks that precede the oracle).
fn check(b: &[u8]) -> Result<(), DumpError> {
    let dump = Dump::parse(b)?;
    for r in 0..dump.n() {
        dump.row(r)?.validate()?;
    }
    Ok(())
}

fn write(name: &str, b: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_bad_input");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{name}.safetensors"));
    std::fs::write(&p, b).unwrap();
    p
}

/// Runs the binary on one file: (exit status, stdout + stderr).
fn run(path: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .arg("verify")
        .arg(path)
        .output()
        .expect("runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().expect("exited"), text)
}

fn assert_bad_input(name: &str, b: &[u8], needles: &[&str]) {
    let (code, text) = run(&write(name, b));
    assert_eq!(code, 2, "{name}: exit status, output:\n{text}");
    for n in needles {
        assert!(text.contains(n), "{name}: message lacks {n:?}:\n{text}");
    }
    assert!(!text.contains("panicked"), "{name}: {text}");
}

#[test]
fn missing_logits_is_named() {
    let b = bytes(&with(valid(), "logits", None), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::MissingTensor {
            tensor: "logits",
            ..
        })
    ));
    assert_bad_input("missing_logits", &b, &["logits", "missing"]);
}

#[test]
fn missing_tokens_for_log_probs_is_named() {
    let b = bytes(&with(valid(), "tokens", None), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::MissingTensor {
            tensor: "tokens",
            ..
        })
    ));
    assert_bad_input("missing_tokens", &b, &["tokens", "log_probs"]);
}

#[test]
fn wrong_shapes_are_named() {
    let b = bytes(
        &with(
            valid(),
            "tokens",
            Some(DumpTensor::i64s(&[N + 1], &[0, 1, 2, 3])),
        ),
        &[],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::BadShape {
            tensor: "tokens",
            ..
        })
    ));
    assert_bad_input("tokens_shape", &b, &["tokens", "[4]", "[N] = [3]"]);

    let b = bytes(
        &with(
            valid(),
            "entropy",
            Some(DumpTensor::floats(Dtype::F32, &[N, 1], &[1.0; 3])),
        ),
        &[],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::BadShape {
            tensor: "entropy",
            ..
        })
    ));
    assert_bad_input("entropy_shape", &b, &["entropy"]);

    let flat = DumpTensor::floats(Dtype::F32, &[N * V], &logits_values());
    let b = bytes(&with(valid(), "logits", Some(flat)), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadShape {
            tensor: "logits",
            ..
        })
    ));
    assert_bad_input("logits_1d", &b, &["logits", "2-D"]);

    let mask = DumpTensor::bools(&[N, V - 1], &[true; N * (V - 1)]);
    let b = bytes(&with(valid(), "sampling_mask", Some(mask)), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadShape {
            tensor: "sampling_mask",
            ..
        })
    ));
}

#[test]
fn nan_logits_name_row_and_column() {
    let mut x = logits_values();
    x[V + 3] = f64::NAN;
    let b = bytes(
        &with(
            valid(),
            "logits",
            Some(DumpTensor::floats(Dtype::F32, &[N, V], &x)),
        ),
        &[],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::Spec(SpecError::NonFiniteLogit {
            row: 1,
            col: 3,
            ..
        }))
    ));
    assert_bad_input("nan_logits", &b, &["logits[1, 3]", "NaN"]);
    // Through the library's verify entry point too (validation precedes the oracle).
    let dump = Dump::parse(&b).unwrap();
    let e = verify_dump(&dump, Path::new("nan_logits"), &VerifyConfig::default()).unwrap_err();
    assert!(
        matches!(
            e,
            DumpError::Spec(SpecError::NonFiniteLogit { row: 1, col: 3, .. })
        ),
        "{e}"
    );

    let mut x = logits_values();
    x[2 * V] = f64::INFINITY;
    let b = bytes(
        &with(
            valid(),
            "logits",
            Some(DumpTensor::floats(Dtype::F32, &[N, V], &x)),
        ),
        &[],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::Spec(SpecError::NonFiniteLogit {
            row: 2,
            col: 0,
            ..
        }))
    ));
}

#[test]
fn token_out_of_range_names_the_row() {
    let b = bytes(
        &with(
            valid(),
            "tokens",
            Some(DumpTensor::i64s(&[N], &[0, 1, V as i64])),
        ),
        &[],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::Spec(SpecError::TokenOutOfRange {
            row: 2,
            token: 5,
            ..
        }))
    ));
    assert_bad_input("token_range", &b, &["tokens[2] = 5"]);
    // ignore_index is not out of range; a custom one is honoured.
    let b = bytes(
        &with(
            valid(),
            "tokens",
            Some(DumpTensor::i64s(&[N], &[0, -100, 1])),
        ),
        &[],
    );
    assert!(check(&b).is_ok());
    let b = bytes(
        &with(valid(), "tokens", Some(DumpTensor::i64s(&[N], &[0, -1, 1]))),
        &[(keys::IGNORE_INDEX.name, "-1")],
    );
    assert!(check(&b).is_ok());
    let b = bytes(
        &with(
            valid(),
            "tokens",
            Some(DumpTensor::i64s(&[N], &[0, -100, 1])),
        ),
        &[(keys::IGNORE_INDEX.name, "-1")],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::Spec(SpecError::TokenOutOfRange { row: 1, .. }))
    ));
}

#[test]
fn truncated_file_is_malformed() {
    let b = bytes(&valid(), &[]);
    for cut in [1, 4, b.len() / 2, b.len() - 9, b.len() - 1] {
        let t = &b[..b.len() - cut];
        assert!(
            matches!(check(t), Err(DumpError::Malformed { .. })),
            "cut {cut}"
        );
    }
    assert_bad_input(
        "truncated",
        &b[..b.len() - 4],
        &["truncated file", "logits"],
    );
    assert_bad_input("empty", &[], &["safetensors"]);
}

#[test]
fn dump_without_candidate_is_bad_input() {
    let b = bytes(
        &with(with(valid(), "log_probs", None), "entropy", None),
        &[],
    );
    assert!(matches!(check(&b), Err(DumpError::NoCandidate { .. })));
    assert_bad_input("no_candidate", &b, &["no candidate", "logits", "tokens"]);
}

#[test]
fn grad_logits_without_cotangent_is_bad_input() {
    let g = DumpTensor::floats(Dtype::F32, &[N, V], &[0.0; N * V]);
    let b = bytes(&with(valid(), "grad_logits", Some(g)), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::Spec(SpecError::NoCotangent { .. }))
    ));
    assert_bad_input("grad_no_cotangent", &b, &["grad_logits"]);
}

#[test]
fn bad_metadata_and_dtypes_are_named() {
    let b = bytes(&valid(), &[(keys::TEMPERATURE.name, "zero")]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadMetadata {
            key: "temperature",
            ..
        })
    ));
    let b = bytes(&valid(), &[(keys::TEMPERATURE.name, "-1")]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadMetadata {
            key: "temperature",
            ..
        })
    ));
    let b = bytes(&valid(), &[(keys::VOCAB_SIZE.name, "6")]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadMetadata {
            key: "vocab_size",
            ..
        })
    ));
    let b = bytes(&valid(), &[(keys::ENTROPY_LOGITS.name, "both")]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadMetadata {
            key: "entropy_logits",
            ..
        })
    ));
    let b = bytes(&valid(), &[(keys::TEMPERATURE_DTYPE.name, "f32")]);
    assert_bad_input("bad_meta", &b, &["temperature_dtype"]);

    let t = DumpTensor::floats(Dtype::F32, &[N], &[0.0, 1.0, 2.0]);
    let b = bytes(&with(valid(), "tokens", Some(t)), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadDtype {
            tensor: "tokens",
            ..
        })
    ));
    let ids = DumpTensor::i64s(&[N, V], &[1; N * V]);
    let b = bytes(&with(valid(), "logits", Some(ids)), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadDtype {
            tensor: "logits",
            ..
        })
    ));
}

#[test]
fn bool_mask_bytes_other_than_0_1_are_named() {
    let mut m = DumpTensor::bools(&[N, V], &[true; N * V]);
    m.data[V + 2] = 7;
    let b = bytes(&with(valid(), "sampling_mask", Some(m)), &[]);
    assert!(matches!(
        check(&b),
        Err(DumpError::BadMaskValue {
            row: 1,
            col: 2,
            value: 7
        })
    ));
}

#[test]
fn masked_target_is_bad_input() {
    let mut allowed = vec![true; N * V];
    allowed[V + 4] = false; // row 1's target, token 4
    let b = bytes(
        &with(
            valid(),
            "sampling_mask",
            Some(DumpTensor::bools(&[N, V], &allowed)),
        ),
        &[],
    );
    assert!(matches!(
        check(&b),
        Err(DumpError::Spec(SpecError::TokenMasked { row: 1, token: 4 }))
    ));
}

#[test]
fn zero_rows_with_a_huge_vocabulary_verify_as_unchecked() {
    // A header declaring N = 0, V = 2^40: nothing V-sized is allocated, and
    // nothing checked is not a pass.
    let huge = 1usize << 40;
    let t = vec![
        (
            "logits",
            DumpTensor {
                dtype: safetensors::Dtype::BF16,
                shape: vec![0, huge],
                data: vec![],
            },
        ),
        ("tokens", DumpTensor::i64s(&[0], &[])),
        ("log_probs", DumpTensor::floats(Dtype::F32, &[0], &[])),
    ];
    let b = bytes(&t, &[]);
    let dump = Dump::parse(&b).unwrap();
    assert_eq!((dump.n(), dump.v_total()), (0, huge));
    let report = verify_dump(&dump, Path::new("empty"), &VerifyConfig::default()).unwrap();
    assert_eq!(report.rows_checked, 0);
    assert_eq!(
        report.verdict,
        logprobe_verify::verify::ReportVerdict::Unchecked
    );
}

#[test]
fn unreadable_file_is_bad_input() {
    let (code, text) = run(Path::new("/nonexistent/dir/x.safetensors"));
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("cannot read"), "{text}");
}
