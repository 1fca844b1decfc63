//! The mutation gate (issue 43): a seeded, deterministic generator of
//! hostile dumps (byte flips, header lies, huge and zero shapes, special
//! values, bad metadata, dropped / renamed / retyped tensors, truncation)
//! run through the library (memory counted by the test kit's allocator) and,
//! for part of them, through the `logprobe` binary (`verify`, `compare`).
//!
//! Asserted for every case: no panic, no abort, no signal, no hang (exit 0,
//! 1 or 2 only, never 101); work bounded by the file (peak heap at most
//! [`budget`] of the file's bytes; rows times columns walked at most its
//! bytes); never exit 0 ("pass", "agree") with nothing checked.
//!
//! `LOGPROBE_MUTATION_CASES` sets the number of cases (default
//! [`DEFAULT_CASES`]), `LOGPROBE_MUTATION_SEED` the seed (default 43),
//! `LOGPROBE_MUTATION_TRACE=1` prints each case before it runs. The binary
//! runs ONE test: the allocator counts nothing else.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use logprobe_reference::spec::Dtype;
use logprobe_reference::splitmix::SplitMix64;
use logprobe_testkit::memory::{allocator_installed, measure, CountingAllocator};
use logprobe_verify::dump::{serialize_dump, DumpFile, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{verify_dump, ReportVerdict, VerifyConfig};
use safetensors::Dtype as St;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// Cases at the gate's size.
const DEFAULT_CASES: usize = 500;
/// Every this many cases also run through `logprobe verify`.
const EXEC_EVERY: usize = 3;
/// Every this many cases also run through `logprobe compare`.
const COMPARE_EVERY: usize = 6;
/// Longest a subprocess may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(60);

/// Peak heap bytes a case may use: a constant factor of the file (decoded
/// `[N]` / `[N, K]` tensors in f64 / i64, per-row scratch) plus a constant
/// for the thread pool and the oracle's working set. A header that
/// declares rows its bytes do not hold exceeds it at once.
fn budget(file_bytes: usize) -> usize {
    16 * file_bytes + (8 << 20)
}

type Tensors = Vec<(String, DumpTensor)>;
type Meta = Vec<(String, String)>;

struct Rng(SplitMix64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        (self.0.next_u64() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    fn coin(&mut self) -> bool {
        self.0.next_u64() & 1 == 1
    }
}

/// Log-softmax of one row, in f64.
fn log_softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    z.iter().map(|x| x - lse).collect()
}

fn f32s(shape: &[usize], v: &[f64]) -> DumpTensor {
    DumpTensor::floats(Dtype::F32, shape, v)
}

/// The valid dumps the mutations start from (f32 logits; candidates
/// computed in f64 and rounded to f32, so the unmutated forward dumps pass).
fn bases(rng: &mut Rng) -> Vec<(Tensors, Meta)> {
    let (n, v, k) = (3usize, 8usize, 2usize);
    let z: Vec<f64> = (0..n * v)
        .map(|_| ((rng.below(8000) as f64) / 1000.0 - 4.0) as f32 as f64)
        .collect();
    let tokens: Vec<i64> = (0..n).map(|r| ((r * 3 + 1) % v) as i64).collect();
    let lsm: Vec<Vec<f64>> = z.chunks(v).map(log_softmax).collect();
    let lp: Vec<f64> = (0..n).map(|r| lsm[r][tokens[r] as usize]).collect();
    let ent: Vec<f64> = lsm
        .iter()
        .map(|l| -l.iter().map(|x| x.exp() * x).sum::<f64>())
        .collect();
    let ids: Vec<i64> = (0..n).flat_map(|r| [r as i64, (r + 4) as i64]).collect();
    let topk: Vec<f64> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| lsm[i / k][id as usize])
        .collect();
    let g: Vec<f64> = vec![0.5, -1.0, 2.0];
    let grad: Vec<f64> = (0..n * v)
        .map(|i| {
            let (r, j) = (i / v, i % v);
            g[r] * (f64::from(j as i64 == tokens[r]) - lsm[r][j].exp())
        })
        .collect();
    let t = |name: &str, d: DumpTensor| (name.to_string(), d);
    let forward: Tensors = vec![
        t("logits", f32s(&[n, v], &z)),
        t("tokens", DumpTensor::i64s(&[n], &tokens)),
        t("log_probs", f32s(&[n], &lp)),
        t("entropy", f32s(&[n], &ent)),
    ];
    let mut topk_base: Tensors = vec![
        t("logits", f32s(&[n, v], &z)),
        t("topk_ids", DumpTensor::i64s(&[n, k], &ids)),
        t("topk_log_probs", f32s(&[n, k], &topk)),
    ];
    topk_base.push(t("tokens", DumpTensor::i64s(&[n], &tokens)));
    let grad_base: Tensors = vec![
        t("logits", f32s(&[n, v], &z)),
        t("tokens", DumpTensor::i64s(&[n], &tokens)),
        t("log_probs", f32s(&[n], &lp)),
        t("grad_log_probs", f32s(&[n], &g)),
        t("grad_logits", f32s(&[n, v], &grad)),
    ];
    let kl_base: Tensors = vec![
        t("logits", f32s(&[n, v], &z)),
        t("topk_ids", DumpTensor::i64s(&[n, k], &ids)),
        t("teacher_topk_log_probs", f32s(&[n, k], &topk)),
        t("forward_kl", f32s(&[n], &[0.0; 3])),
    ];
    // [B, T, V] = [1, 3, V] with a row_mask (format version 2).
    let batch: Tensors = vec![
        t("logits", f32s(&[1, n, v], &z)),
        t("tokens", DumpTensor::i64s(&[1, n], &tokens)),
        t("log_probs", f32s(&[1, n], &lp)),
        t("row_mask", DumpTensor::bools(&[1, n], &[true, false, true])),
    ];
    let loss: Tensors = vec![
        t("logits", f32s(&[n, v], &z)),
        t(
            "tokens",
            DumpTensor::i64s(&[n], &[tokens[0], -100, tokens[2]]),
        ),
        t("loss", f32s(&[], &[-(lp[0] + lp[2]) / 2.0])),
    ];
    let m = |kv: &[(&str, &str)]| -> Meta {
        kv.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    vec![
        (forward, m(&[])),
        (topk_base, m(&[])),
        (grad_base, m(&[])),
        (kl_base, m(&[(keys::FORMAT_VERSION.name, "2")])),
        (batch, m(&[(keys::FORMAT_VERSION.name, "2")])),
        (loss, m(&[(keys::REDUCTION.name, "mean")])),
    ]
}

fn serialize(t: &Tensors, m: &Meta) -> Vec<u8> {
    let t: Vec<(&str, DumpTensor)> = t.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    serialize_dump(&t, &m).expect("consistent tensors serialise")
}

const HUGE: [usize; 5] = [1 << 20, 1 << 26, 1 << 40, 1 << 62, usize::MAX / 2];
/// Every metadata key of the name table (built or reserved), and three
/// that are not keys.
fn meta_keys() -> Vec<&'static str> {
    let mut keys: Vec<&str> = logprobe_verify::names::NAMES
        .iter()
        .filter(|n| n.kind == logprobe_verify::names::Kind::Meta)
        .map(|n| n.name)
        .collect();
    keys.extend(["no_such_key", "temperature ", ""]);
    keys
}
const META_VALUES: [&str; 18] = [
    "abc",
    "",
    "-1",
    "0",
    "1e309",
    "nan",
    "inf",
    "yes",
    "2",
    "0.5",
    " 1 ",
    "1e-300",
    "masked",
    "sum",
    "mean",
    "kernel",
    "99999999999999999999999",
    "-0",
];
const SPECIAL: [f64; 9] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    3.4e38,
    -3.4e38,
    1e-45,
    -0.0,
    1e30,
    -1e30,
];

/// One structural mutation of the tensors and metadata (before they are
/// serialised); returns its description.
fn mutate_structure(rng: &mut Rng, t: &mut Tensors, m: &mut Meta) -> String {
    let n_of = |t: &Tensors| t.iter().find(|(n, _)| n == "logits").map(|l| l.1.shape[0]);
    match rng.below(12) {
        0 => {
            // V = 0 (and K = 0) with any number of rows: the `[N, *]`
            // tensors empty, the per-row `[N]` ones (which would need
            // bytes) dropped, a scalar cotangent broadcast to every row
            // (issue 43's ~300-byte crash).
            let h = *rng.pick(&HUGE);
            let lead = if rng.coin() {
                vec![65536, h.min(1 << 40)]
            } else {
                vec![h]
            };
            t.retain(|(_, d)| d.shape.len() >= 2);
            for (_, d) in t.iter_mut() {
                d.shape = lead.iter().copied().chain([0]).collect();
                d.data.clear();
            }
            if t.iter().any(|(n, _)| n == "grad_logits") {
                t.push(("grad_entropy".into(), f32s(&[], &[1.0])));
                m.retain(|(k, _)| k != "format_version");
                m.push(("cotangent_reduction".into(), "sum".into()));
                m.push(("format_version".into(), "2".into()));
            }
            format!("zero vocabulary, rows {lead:?}")
        }
        1 => {
            // Fewer rows (0 included) in every row-indexed tensor.
            let Some(n) = n_of(t) else {
                return "rows: no logits".into();
            };
            let to = rng.below(n);
            for (_, d) in t.iter_mut() {
                if d.shape.first() == Some(&n) && !d.shape.is_empty() {
                    let per = d.data.len() / n.max(1);
                    d.shape[0] = to;
                    d.data.truncate(per * to);
                }
            }
            format!("rows {n} -> {to}")
        }
        2 => {
            // K = 0.
            for (name, d) in t.iter_mut() {
                if name.contains("topk") {
                    let n = d.shape[0];
                    d.shape = vec![n, 0];
                    d.data.clear();
                }
            }
            "K = 0".into()
        }
        3 => {
            // Every row masked or ignored.
            let Some(n) = n_of(t).filter(|&n| n <= 1 << 16) else {
                return "mask: no logits, or rows without bytes".into();
            };
            if rng.coin() {
                t.retain(|(x, _)| x != "row_mask");
                t.push(("row_mask".into(), DumpTensor::bools(&[n], &vec![false; n])));
                m.retain(|(k, _)| k != "format_version");
                m.push(("format_version".into(), "2".into()));
                "every row masked".into()
            } else {
                if let Some((_, d)) = t.iter_mut().find(|(x, _)| x == "tokens") {
                    let elems = d.shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
                    let elems = elems.filter(|&e| e <= 1 << 16).unwrap_or(0);
                    *d = DumpTensor::i64s(&[elems], &vec![-100; elems]);
                }
                "every token ignored".into()
            }
        }
        4 => {
            // A special value in a float tensor.
            let floats: Vec<usize> = (0..t.len())
                .filter(|&i| matches!(t[i].1.dtype, St::F32) && !t[i].1.data.is_empty())
                .collect();
            if floats.is_empty() {
                return "special: no float tensor".into();
            }
            let i = *rng.pick(&floats);
            let x = *rng.pick(&SPECIAL) as f32;
            let at = rng.below(t[i].1.data.len() / 4);
            let all = rng.below(4) == 0;
            let d = &mut t[i].1;
            for e in 0..d.data.len() / 4 {
                if all || e == at {
                    d.data[4 * e..4 * e + 4].copy_from_slice(&x.to_le_bytes());
                }
            }
            format!(
                "{}[{}] = {x}",
                t[i].0,
                if all { "*".into() } else { at.to_string() }
            )
        }
        5 => {
            // A token or top-k id out of range.
            let ids: Vec<usize> = (0..t.len())
                .filter(|&i| t[i].1.dtype == St::I64 && !t[i].1.data.is_empty())
                .collect();
            if ids.is_empty() {
                return "id: none".into();
            }
            let i = *rng.pick(&ids);
            let v = *rng.pick(&[-1i64, -100, 8, 9, i64::MAX, i64::MIN, 1 << 40]);
            let at = rng.below(t[i].1.data.len() / 8);
            t[i].1.data[8 * at..8 * at + 8].copy_from_slice(&v.to_le_bytes());
            format!("{}[{at}] = {v}", t[i].0)
        }
        6 | 7 => {
            let k = *rng.pick(&meta_keys());
            let v = *rng.pick(&META_VALUES);
            m.retain(|(x, _)| x != k);
            m.push((k.into(), v.into()));
            format!("metadata {k:?} = {v:?}")
        }
        8 => {
            let i = rng.below(t.len());
            let name = t.remove(i).0;
            format!("drop {name}")
        }
        9 => {
            let i = rng.below(t.len());
            let to = *rng.pick(&["logit", "grad_logit", "lse", "loss_weights", "kl_k1", "x"]);
            let from = std::mem::replace(&mut t[i].0, to.to_string());
            if t.iter().filter(|(n, _)| n == to).count() > 1 {
                t.remove(i);
            }
            format!("rename {from} -> {to}")
        }
        10 => {
            // Another dtype, bytes resized to match.
            let i = rng.below(t.len());
            let to = *rng.pick(&[
                St::F64,
                St::F16,
                St::BF16,
                St::I32,
                St::U8,
                St::BOOL,
                St::I64,
            ]);
            let d = &mut t[i].1;
            let elems: usize = d.shape.iter().product();
            d.dtype = to;
            d.data.resize(elems * to.bitsize() / 8, 0x3c);
            format!("{} as {to:?}", t[i].0)
        }
        _ => {
            // Another shape of the same bytes.
            let i = rng.below(t.len());
            let d = &mut t[i].1;
            let elems: usize = d.shape.iter().product();
            d.shape = match rng.below(3) {
                0 => vec![elems],
                1 => d.shape.iter().rev().copied().collect(),
                _ => vec![1, elems],
            };
            let shape = d.shape.clone();
            format!("reshape {} to {shape:?}", t[i].0)
        }
    }
}

/// The header's JSON and where the data starts.
fn split(bytes: &[u8]) -> Option<(serde_json::Value, usize)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let h = serde_json::from_slice(bytes.get(8..8usize.checked_add(n)?)?).ok()?;
    Some((h, 8 + n))
}

fn join(h: &serde_json::Value, data: &[u8]) -> Vec<u8> {
    let s = serde_json::to_vec(h).expect("json");
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend(s);
    out.extend_from_slice(data);
    out
}

/// One mutation of the serialised bytes; returns its description.
fn mutate_bytes(rng: &mut Rng, b: &mut Vec<u8>) -> String {
    if b.len() < 8 {
        b.extend((0..rng.below(16)).map(|_| rng.below(256) as u8));
        return format!("short file of {} bytes", b.len());
    }
    match rng.below(6) {
        0 => {
            let k = 1 + rng.below(8);
            for _ in 0..k {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            format!("{k} bit flips")
        }
        1 => {
            let to = rng.below(b.len());
            b.truncate(to);
            format!("truncated to {to}")
        }
        2 => {
            let k = 1 + rng.below(64);
            b.extend((0..k).map(|_| rng.below(256) as u8));
            format!("{k} trailing bytes")
        }
        3 => {
            let v = *rng.pick(&[0u64, 1, 7, 1 << 40, u64::MAX]);
            let n = u64::from_le_bytes(b[..8].try_into().unwrap());
            let lie = if rng.coin() { v } else { n.wrapping_add(v) };
            b[..8].copy_from_slice(&lie.to_le_bytes());
            format!("header length {n} -> {lie}")
        }
        _ => {
            // A lie in the header: a shape dimension, an offset or a dtype.
            let Some((mut h, start)) = split(b) else {
                return "header lie: unreadable".into();
            };
            let data = b[start..].to_vec();
            let Some(obj) = h.as_object() else {
                return "header lie: not an object".into();
            };
            let names: Vec<String> = obj
                .keys()
                .filter(|k| *k != "__metadata__")
                .cloned()
                .collect();
            if names.is_empty() {
                return "header lie: no tensor".into();
            }
            let name = rng.pick(&names).clone();
            let Some(info) = h.get_mut(&name).and_then(|i| i.as_object_mut()) else {
                return "header lie: entry not an object".into();
            };
            let what = match rng.below(3) {
                0 => {
                    let Some(shape) = info.get_mut("shape").and_then(|x| x.as_array_mut()) else {
                        return "header lie: no shape".into();
                    };
                    let d = *rng.pick(&[0u64, 1, 2, 3, 9, 1 << 31, 1 << 62, u64::MAX]);
                    if shape.is_empty() || rng.below(4) == 0 {
                        shape.push(d.into());
                    } else {
                        let i = rng.below(shape.len());
                        shape[i] = d.into();
                    }
                    format!("shape {shape:?}")
                }
                1 => {
                    let Some(o) = info
                        .get_mut("data_offsets")
                        .and_then(|x| x.as_array_mut())
                        .filter(|o| o.len() == 2)
                    else {
                        return "header lie: no offsets".into();
                    };
                    let i = rng.below(2);
                    let d = *rng.pick(&[1u64, 4, 1 << 40]);
                    let x = o[i].as_u64().unwrap_or(0);
                    o[i] = if rng.coin() {
                        x + d
                    } else {
                        x.saturating_sub(d)
                    }
                    .into();
                    format!("offsets {o:?}")
                }
                _ => {
                    let d = *rng.pick(&["F64", "F16", "U8", "BOOL", "I8", "U64", "F8_E4M3", "Q4"]);
                    info.insert("dtype".into(), d.into());
                    format!("dtype {d}")
                }
            };
            *b = join(&h, &data);
            format!("header lie: {name} {what}")
        }
    }
}

/// Exit class of a library outcome: 0 pass / suspect, 1 a finding or
/// nothing checked, 2 bad input.
fn class(r: &Result<logprobe_verify::verify::FileReport, String>) -> i32 {
    match r {
        Err(_) => 2,
        Ok(r) if matches!(r.verdict, ReportVerdict::Pass | ReportVerdict::Suspect) => 0,
        Ok(_) => 1,
    }
}

/// Runs the binary with `args`; its exit code, or a failure for a signal,
/// a panic (101) or a hang.
fn run(args: &[&std::ffi::OsStr], what: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawns");
    let start = Instant::now();
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("waits") {
            break s;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: hangs (killed after {HANG:?})");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    out.push_str(&reader.join().unwrap());
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(
        status.signal().is_none(),
        "{what}: killed by signal {:?}: {err}",
        status.signal()
    );
    let code = status.code().expect("exited");
    assert!(matches!(code, 0..=2), "{what}: exit {code}: {err}");
    (code, out)
}

/// `verify --json`'s document at exit 0: every file checked something.
fn assert_checked(json: &str, what: &str) {
    let doc: serde_json::Value = serde_json::from_str(json).expect("verify --json");
    for f in doc["files"].as_array().unwrap() {
        assert!(
            f["rows_checked"].as_u64().unwrap() > 0,
            "{what}: exit 0, no row checked"
        );
        for o in f["outputs"].as_array().unwrap() {
            assert!(
                o["count"].as_u64().unwrap() > 0 && o["nothing_checked"].is_null(),
                "{what}: exit 0 with output {} unchecked",
                o["output"]
            );
        }
    }
}

fn dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("verify_mutation");
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn mutated_dumps_never_crash_never_overspend_never_pass_unchecked() {
    assert!(allocator_installed(), "the counting allocator is installed");
    let cases: usize = std::env::var("LOGPROBE_MUTATION_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let seed: u64 = std::env::var("LOGPROBE_MUTATION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(43);
    // LOGPROBE_MUTATION_TRACE=1 names each case before it runs (to find
    // one that aborts the test binary).
    let trace = std::env::var_os("LOGPROBE_MUTATION_TRACE").is_some();
    let config = VerifyConfig::default();
    let mut rng = Rng(SplitMix64::new(seed));
    let bases = bases(&mut rng);
    let dir = dir();

    // The bases: valid, the forward one passes (so exit 0 is reachable).
    let base_files: Vec<PathBuf> = bases
        .iter()
        .enumerate()
        .map(|(i, (t, m))| {
            let p = dir.join(format!("base{i}.safetensors"));
            std::fs::write(&p, serialize(t, m)).unwrap();
            p
        })
        .collect();
    let (code, json) = run(
        &[
            "verify".as_ref(),
            "--json".as_ref(),
            base_files[0].as_os_str(),
        ],
        "base 0",
    );
    assert_eq!(code, 0, "the forward base passes: {json}");
    assert_checked(&json, "base 0");
    // Warm up the thread pool and the oracle outside the measurements.
    let warm = serialize(&bases[0].0, &bases[0].1);
    let d = DumpFile::from_bytes(warm);
    verify_dump(&d.parse().unwrap(), Path::new("warm"), &config).unwrap();

    let (mut lib, mut exe, mut cmp) = ([0usize; 3], [0usize; 3], [0usize; 3]);
    let (mut worst_peak, mut worst_ratio) = (0usize, 0.0f64);
    let start = Instant::now();
    for case in 0..cases {
        let mut rng = Rng(SplitMix64::for_stream(seed, case as u64));
        let b = rng.below(bases.len());
        let (mut t, mut m) = bases[b].clone();
        let mut what = vec![format!("case {case} (seed {seed}), base {b}")];
        if trace {
            eprintln!("{} ...", what[0]);
        }
        let ops = 1 + rng.below(3);
        let mut bytes = None;
        for _ in 0..ops {
            if bytes.is_none() && rng.below(3) != 0 {
                what.push(mutate_structure(&mut rng, &mut t, &mut m));
            } else {
                let mut by = bytes.take().unwrap_or_else(|| serialize(&t, &m));
                what.push(mutate_bytes(&mut rng, &mut by));
                bytes = Some(by);
            }
        }
        let bytes = bytes.unwrap_or_else(|| serialize(&t, &m));
        let what = what.join("; ");
        let len = bytes.len();
        if trace {
            eprintln!("{what}");
        }

        // The library, memory counted.
        let (outcome, peak) = measure(|| {
            catch_unwind(AssertUnwindSafe(|| {
                let file = DumpFile::from_bytes(bytes.clone());
                let dump = file.parse().map_err(|e| e.to_string())?;
                // Rows walked: every row holds V >= 1 logits of >= 2 bytes.
                assert!(
                    dump.n().saturating_mul(dump.v_total()).saturating_mul(2) <= len,
                    "N = {} x V = {} logits in {len} bytes",
                    dump.n(),
                    dump.v_total()
                );
                verify_dump(&dump, Path::new("m"), &config).map_err(|e| e.to_string())
            }))
        });
        let outcome = outcome.unwrap_or_else(|_| panic!("{what}: panicked"));
        assert!(
            peak <= budget(len),
            "{what}: peak heap {peak} B > budget {} B for a {len}-byte file",
            budget(len)
        );
        worst_peak = worst_peak.max(peak);
        worst_ratio = worst_ratio.max(peak as f64 / len.max(1) as f64);
        let c = class(&outcome);
        lib[c as usize] += 1;
        if let Ok(r) = &outcome {
            if c == 0 {
                assert!(r.rows_checked > 0, "{what}: pass with no row checked");
                for o in &r.outputs {
                    assert!(
                        o.count > 0 && o.nothing_checked.is_none(),
                        "{what}: pass with {} unchecked",
                        o.output
                    );
                }
            }
        }

        // The binary, on a file.
        if case % EXEC_EVERY == 0 || case % COMPARE_EVERY == 0 {
            let p = dir.join(format!("case{}.safetensors", case % 64));
            std::fs::write(&p, &bytes).unwrap();
            if case % EXEC_EVERY == 0 {
                let (code, json) = run(
                    &["verify".as_ref(), "--json".as_ref(), p.as_os_str()],
                    &what,
                );
                assert_eq!(
                    code, c,
                    "{what}: the binary and the library disagree: {outcome:?}"
                );
                if code == 0 {
                    assert_checked(&json, &what);
                }
                exe[code as usize] += 1;
            }
            if case % COMPARE_EVERY == 0 {
                // The unmutated base against the mutant: exit 0 only with
                // rows compared and finite log-probs.
                let (code, json) = run(
                    &[
                        "compare".as_ref(),
                        "--json".as_ref(),
                        base_files[b].as_os_str(),
                        p.as_os_str(),
                    ],
                    &format!("compare: {what}"),
                );
                if code == 0 {
                    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
                    let s = &doc["summary"];
                    assert!(
                        s["rows"].as_u64().unwrap() > 0,
                        "compare {what}: agree on no row"
                    );
                    assert!(
                        s["non_finite"].as_array().unwrap().is_empty(),
                        "compare {what}: agree with non-finite log-probs"
                    );
                }
                cmp[code as usize] += 1;
            }
        }
    }
    println!(
        "mutation gate: {cases} cases (seed {seed}) in {:.1} s; library exits 0/1/2 = {lib:?}; \
         `logprobe verify` {exe:?}; `logprobe compare` {cmp:?}; worst peak heap {worst_peak} B, \
         {worst_ratio:.0} x the file",
        start.elapsed().as_secs_f64()
    );
    // The generator reaches every exit class (a generator that produced only
    // bad input would check nothing).
    assert!(lib.iter().all(|&k| k > 0), "exit classes {lib:?}");
}
