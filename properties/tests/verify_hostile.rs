//! Issue 43's findings, each pinned: shapes that declare rows their bytes
//! do not hold, FIFOs and pipes, a `compare` that must not agree when it
//! could not compare, and the smaller items (a header lie names its tensor,
//! unused malformed keys, a top-k KL over K = 0).

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use logprobe_reference::spec::Dtype;
use logprobe_verify::compare::{compare_dumps, parse_side, CompareConfig, Side};
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{verify_dump, ReportVerdict, VerifyConfig};
use safetensors::Dtype as St;

const N: usize = 3;
const V: usize = 5;

fn logits() -> Vec<f64> {
    (0..N * V).map(|i| (i % 7) as f64 * 0.25 - 1.0).collect()
}

/// Exact log-probs of `logits()` at `tokens`, rounded to f32 by the writer.
fn log_probs(tokens: &[i64]) -> Vec<f64> {
    let z = logits();
    (0..N)
        .map(|r| {
            let row = &z[r * V..(r + 1) * V];
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            row[tokens[r] as usize] - lse
        })
        .collect()
}

const TOKENS: [i64; N] = [0, 4, 2];

fn forward() -> Vec<(&'static str, DumpTensor)> {
    vec![
        ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &logits())),
        ("tokens", DumpTensor::i64s(&[N], &TOKENS)),
        (
            "log_probs",
            DumpTensor::floats(Dtype::F32, &[N], &log_probs(&TOKENS)),
        ),
    ]
}

fn bytes(t: &[(&str, DumpTensor)], meta: &[(&str, &str)]) -> Vec<u8> {
    serialize_dump(t, meta).expect("serialisable")
}

fn empty(shape: &[usize], dtype: St) -> DumpTensor {
    DumpTensor {
        dtype,
        shape: shape.to_vec(),
        data: Vec::new(),
    }
}

fn write(name: &str, b: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, b).unwrap();
    p
}

/// Runs `logprobe args...` with `stdin`: exit code (a signal fails), and
/// stdout + stderr.
fn logprobe(args: &[&str], stdin: Option<Vec<u8>>) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(b) = stdin {
        let mut w = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = w.write_all(&b);
        });
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.signal().is_none(), "signal: {:?}", out.status);
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn rows_without_bytes_are_rejected_before_any_row() {
    let h = 1usize << 62;
    let cases: Vec<Vec<(&str, DumpTensor)>> = vec![
        vec![
            ("logits", empty(&[h, 0], St::F32)),
            ("log_probs", DumpTensor::floats(Dtype::F32, &[1], &[0.0])),
        ],
        vec![
            ("logits", empty(&[h, 0], St::F32)),
            ("grad_logits", empty(&[h, 0], St::F32)),
            (
                "grad_log_probs",
                DumpTensor::floats(Dtype::F32, &[], &[1.0]),
            ),
        ],
        vec![
            ("logits", empty(&[h, 0], St::F32)),
            ("topk_ids", empty(&[h, 0], St::I64)),
            ("topk_log_probs", empty(&[h, 0], St::F32)),
        ],
        vec![
            ("logits", empty(&[65536, 65536, 0], St::BF16)),
            ("topk_ids", empty(&[65536, 65536, 0], St::I64)),
            ("topk_log_probs", empty(&[65536, 65536, 0], St::F32)),
        ],
    ];
    for t in cases {
        let b = bytes(
            &t,
            &[
                (keys::COTANGENT_REDUCTION.name, "sum"),
                (keys::FORMAT_VERSION.name, "2"),
            ],
        );
        let start = Instant::now();
        match Dump::parse(&b) {
            Err(DumpError::BadShape {
                tensor: "logits",
                expected,
                ..
            }) => assert!(expected.contains("V >= 1"), "{expected}"),
            Err(e) => panic!("{:?}: {e}", t[0].1.shape),
            Ok(_) => panic!("{:?}: parsed", t[0].1.shape),
        }
        let p = write("v0.safetensors", &b);
        let (code, text) = logprobe(&["verify", p.to_str().unwrap()], None);
        assert_eq!(code, 2, "{text}");
        assert!(text.contains("logits"), "{text}");
        assert!(start.elapsed() < Duration::from_secs(10));
    }
}

#[test]
fn a_header_shape_lie_names_its_tensor() {
    let b = bytes(&forward(), &[]);
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
    // The first `[3]` tensor -> `[4]`: its offsets hold 3 elements.
    let lie = header.replacen("\"shape\":[3]", "\"shape\":[4]", 1);
    assert_ne!(lie, header);
    let mut out = (lie.len() as u64).to_le_bytes().to_vec();
    out.extend(lie.as_bytes());
    out.extend(&b[8 + n..]);
    let e = Dump::parse(&out).err().expect("a lie is bad input");
    let text = e.to_string();
    assert!(
        matches!(e, DumpError::Malformed { .. }) && text.contains("tensor `"),
        "{text}"
    );
    assert!(
        text.contains("shape [4]") && text.contains("needs"),
        "{text}"
    );
}

#[test]
fn malformed_keys_are_rejected_even_when_unused() {
    for (key, value) in [
        (keys::Z_LOSS_COEF.name, "abc"),
        (keys::KL_RENORMALIZED.name, "yes"),
    ] {
        match Dump::parse(&bytes(
            &forward(),
            &[(key, value), (keys::FORMAT_VERSION.name, "2")],
        )) {
            Err(DumpError::BadMetadata { key: k, .. }) => assert_eq!(k, key),
            Err(e) => panic!("{key}: {e}"),
            Ok(_) => panic!("{key}={value} accepted"),
        }
    }
    // Well-formed and unused: accepted as before.
    assert!(Dump::parse(&bytes(
        &forward(),
        &[
            (keys::Z_LOSS_COEF.name, "1e-4"),
            (keys::FORMAT_VERSION.name, "2")
        ]
    ))
    .is_ok());
}

#[test]
fn a_top_k_kl_over_no_teacher_entry_is_unchecked() {
    let t = vec![
        ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &logits())),
        ("topk_ids", DumpTensor::i64s(&[N, 0], &[])),
        (
            "teacher_topk_log_probs",
            DumpTensor::floats(Dtype::F32, &[N, 0], &[]),
        ),
        (
            "forward_kl",
            DumpTensor::floats(Dtype::F32, &[N], &[0.0; N]),
        ),
    ];
    let b = bytes(&t, &[(keys::FORMAT_VERSION.name, "2")]);
    let d = Dump::parse(&b).unwrap();
    let r = verify_dump(&d, Path::new("kl"), &VerifyConfig::default()).unwrap();
    let kl = r.outputs.iter().find(|o| o.output == "forward_kl").unwrap();
    assert_eq!(kl.verdict, ReportVerdict::Unchecked);
    assert!(kl.nothing_checked.as_deref().unwrap().contains("K = 0"));
    assert_eq!(r.verdict, ReportVerdict::Unchecked);
}

/// `compare A B` with B holding tokens and `lp_b` only.
fn compare(lp_b: &[f64], row_mask: Option<&[bool]>) -> logprobe_verify::compare::CompareReport {
    let mut a = forward();
    let mut b = vec![
        ("tokens", DumpTensor::i64s(&[N], &TOKENS)),
        ("log_probs", DumpTensor::floats(Dtype::F32, &[N], lp_b)),
    ];
    let mut meta = vec![];
    if let Some(m) = row_mask {
        a.push(("row_mask", DumpTensor::bools(&[N], m)));
        b.push(("row_mask", DumpTensor::bools(&[N], m)));
        meta.push((keys::FORMAT_VERSION.name, "2"));
    }
    let (ba, bb) = (bytes(&a, &meta), bytes(&b, &meta));
    let (da, db) = (
        parse_side(&ba, Side::A).unwrap(),
        parse_side(&bb, Side::B).unwrap(),
    );
    compare_dumps(
        &da,
        &db,
        Path::new("a"),
        Path::new("b"),
        &CompareConfig::default(),
    )
    .unwrap()
}

#[test]
fn compare_never_agrees_by_default() {
    let lp = log_probs(&TOKENS);
    // The control: the same log-probs agree (exit 0).
    let r = compare(&lp, None);
    assert_eq!(
        (r.exit_status, r.summary.rows),
        (0, N),
        "{}",
        r.summary.verdict
    );
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let r = compare(&[lp[0], bad, lp[2]], None);
        assert_eq!(r.exit_status, 1, "{bad}: {}", r.summary.verdict);
        assert!(
            r.summary.verdict.contains("kernel fault"),
            "{}",
            r.summary.verdict
        );
        assert!(
            !r.summary.verdict.contains("agree"),
            "{}",
            r.summary.verdict
        );
        let nf = &r.summary.non_finite;
        assert_eq!(
            (nf.len(), nf[0].side, nf[0].rows, nf[0].first_row),
            (1, Side::B, 1, 1)
        );
    }
    let r = compare(&[f64::NAN; N], None);
    assert_eq!(r.exit_status, 1, "{}", r.summary.verdict);
    // Every row masked: nothing compared.
    let r = compare(&lp, Some(&[false; N]));
    assert_eq!(
        (r.exit_status, r.summary.rows),
        (1, 0),
        "{}",
        r.summary.verdict
    );
    assert!(r.summary.verdict.contains("nothing was checked"));
}

#[test]
fn pipes_are_read_as_streams() {
    let b = bytes(&forward(), &[]);
    let file = write("forward.safetensors", &b);
    let (code, text) = logprobe(&["verify", file.to_str().unwrap()], None);
    assert_eq!(code, 0, "{text}");
    // The same dump through a pipe (as `verify <(cat d)` or `/dev/stdin`).
    let (code, text) = logprobe(&["verify", "/dev/stdin"], Some(b.clone()));
    assert_eq!(code, 0, "{text}");
    // A stream cut short: bad input, not a crash.
    let (code, text) = logprobe(&["verify", "/dev/stdin"], Some(b[..b.len() - 7].to_vec()));
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("truncated"), "{text}");
    // A stream longer than its header declares.
    let mut long = b.clone();
    long.extend([0u8; 9]);
    let (code, text) = logprobe(&["verify", "/dev/stdin"], Some(long));
    assert_eq!(code, 2, "{text}");
}

fn mkfifo(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_hostile");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    p
}

#[test]
fn fifos_are_read_or_rejected_never_waited_on_forever() {
    // No writer: an error after the stream timeout, not a block.
    let p = mkfifo("nobody.fifo");
    let start = Instant::now();
    let (code, text) = logprobe(&["verify", p.to_str().unwrap()], None);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("no process is writing"), "{text}");
    assert!(start.elapsed() < Duration::from_secs(30));
    // A writer that opens it a little later: read as a stream.
    let p = mkfifo("later.fifo");
    let b = bytes(&forward(), &[]);
    let q = p.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&q)
            .unwrap()
            .write_all(&b)
            .unwrap();
    });
    let (code, text) = logprobe(&["verify", p.to_str().unwrap()], None);
    writer.join().unwrap();
    assert_eq!(code, 0, "{text}");
}
