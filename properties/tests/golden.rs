//! Golden fixtures: for each named input in `fixtures/golden/` (written by
//! `cargo run -p logprobe-cli --example gen_fixtures`), an insta
//! snapshot in `fixtures/snapshots/` of the oracle's correctly rounded
//! values and, for each CPU kernel and output dtype, a digest of its output
//! bits and its errors against the oracle. The host-built CUDA kernels
//! (feature `cuda-host`) have the same lines for every fixture in one more
//! snapshot, `cuda_host_bits`, with, against each earlier golden kernel,
//! whether the two declare the same algorithm and whether their bits agree;
//! two kernels that declare the same algorithm must give the same bits
//! (asserted). A change that moves one bit of a
//! kernel's output shows as a snapshot diff (`cargo insta review`); CI never
//! writes snapshots (insta's `CI` detection) and fails on a mismatch.
//!
//! The kernels' CPU path (`avx512` / `avx2` / `sse2`) is recorded in the
//! snapshot's `info` metadata, not in its body: every path gives the same
//! bits, so one snapshot serves every machine.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use ndarray::{Array1, Array2};

use logprobe_kernels::Kernel;
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Output, Problem};
use logprobe_testkit::registry;
use logprobe_verify::dump::Dump;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden")
}

/// FNV-1a, 64 bits (Fowler, Noll, Vo): a stable digest of output bits.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
    /// Hashes `v` (exactly representable in `dtype`) as `dtype`'s bits.
    fn value(&mut self, v: f64, dtype: Dtype) {
        match dtype {
            Dtype::F64 => self.bytes(&v.to_bits().to_le_bytes()),
            Dtype::F32 => self.bytes(&(v as f32).to_bits().to_le_bytes()),
            Dtype::Bf16 => self.bytes(&half::bf16::from_f32(v as f32).to_bits().to_le_bytes()),
            Dtype::F16 => self.bytes(&half::f16::from_f32(v as f32).to_bits().to_le_bytes()),
        }
    }
}

/// A fixture's logits `[N, V_total]` as exact f64 (the fixtures are small).
fn load(bytes: &[u8]) -> (Array2<f64>, Dump<'_>) {
    let dump = Dump::parse_inputs(bytes).expect("valid fixture");
    let (n, vt) = (dump.n(), dump.v_total());
    let stored = dump.logits.stored().expect("stored logits");
    let flat: Vec<f64> = (0..n).flat_map(|r| stored.row_f64(r)).collect();
    (Array2::from_shape_vec((n, vt), flat).unwrap(), dump)
}

/// Formats one fixture's snapshot, and its section of the host-built CUDA
/// kernels' snapshot (`cuda_host_bits`).
fn snapshots(name: &str, bytes: &[u8]) -> (String, String) {
    let (logits, dump) = load(bytes);
    let dtype = dump.logits.dtype;
    // The logits in their own dtype, [N, V_total].
    let typed = match dtype {
        Dtype::F64 => TypedLogits::F64(logits.clone()),
        Dtype::F32 => TypedLogits::F32(logits.mapv(|x| x as f32)),
        Dtype::Bf16 => TypedLogits::Bf16(logits.mapv(|x| half::bf16::from_f32(x as f32))),
        Dtype::F16 => TypedLogits::F16(logits.mapv(|x| half::f16::from_f32(x as f32))),
    };
    let mask = dump.sampling_mask.map(|m| {
        let rows: Vec<bool> = (0..dump.n())
            .flat_map(|r| m.row(r).unwrap().into_iter())
            .collect();
        Array2::from_shape_vec((dump.n(), dump.v_total()), rows).unwrap()
    });
    let p = Problem {
        logits: typed.view(),
        tokens: dump.tokens.as_ref().map(|t| t.view()),
        sampling_mask: mask.as_ref().map(|m| m.view()),
        topk_ids: dump.topk_ids.as_ref().map(|t| t.view()),
        policy: Default::default(),
        teacher_topk_log_probs: dump.teacher_topk_log_probs.as_ref().map(|t| t.view()),
        teacher_probs: None,
        options: dump.options,
        loss_weights: None,
    };
    let n = dump.n();
    let k = dump.topk_ids.as_ref().map_or(0, |a| a.ncols());
    // Fixed cotangents: every output contributes to the gradient.
    let g = Array1::from_iter((0..n).map(|r| 1.0 - 0.25 * r as f64));
    let h = Array1::from_iter((0..n).map(|r| 0.5 + 0.125 * r as f64));
    let gk = Array2::from_shape_fn((n, k), |(r, j)| {
        if j == 0 {
            0.75
        } else {
            -0.125 * (r + j) as f64
        }
    });
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());

    let oracle = Oracle::default();
    let mut s = String::new();
    let (_, vt) = p.logits.dim();
    let _ = writeln!(
        s,
        "fixture {name}: {n} x {vt} {dtype} logits, vocab_size {}, options {:?}",
        dump.vocab_size(),
        dump.options
    );
    let ex = oracle.forward(&p, Dtype::F32).expect("oracle");
    let _ = writeln!(s, "oracle (f32, correctly rounded):");
    for r in 0..n {
        let lp = Output::LogProbs
            .judged(&p, r)
            .then(|| ex.values[Output::LogProbs][[r, 0]].rounded as f32);
        let ent = ex.values[Output::Entropy][[r, 0]].rounded as f32;
        let tk: Vec<f32> = ex.values[Output::TopkLogProbs]
            .row(r)
            .iter()
            .map(|e| e.rounded as f32)
            .collect();
        let _ = writeln!(
            s,
            "  row {r}: lse {:?} log_prob {lp:?} entropy {ent:?} topk {tk:?}",
            ex.lse[r].rounded as f32
        );
    }

    let mut outs = vec![Dtype::F32];
    if dtype != Dtype::F32 && dtype != Dtype::F64 {
        outs.push(dtype);
    }
    let exact: Vec<_> = outs
        .iter()
        .map(|&out| {
            (
                out,
                oracle.forward(&p, out).expect("oracle"),
                oracle.vjp(&p, &cot, out).expect("oracle vjp"),
            )
        })
        .collect();
    // The registry's golden kernels, in its order: CPU (fused, chunked at
    // 3) in this snapshot, the host-built CUDA kernels (fused, chunked at 3)
    // in `cuda_host_bits`.
    let golden: Vec<(registry::Backend, Box<dyn Kernel>)> = registry::entries()
        .iter()
        .filter_map(|e| e.golden_chunk_size.map(|c| (e.backend, e.kernel(c, &[]))))
        .collect();
    let mut host = String::new();
    let _ = writeln!(host, "fixture {name}:");
    let mut digests = Vec::new();
    for &(out, ref exf, ref exg) in &exact {
        for (backend, kernel) in &golden {
            let text = if *backend == registry::Backend::CudaHost {
                &mut host
            } else {
                &mut s
            };
            let d = kernel_line(text, kernel.as_ref(), &p, &cot, out, exf, exg);
            digests.push((kernel.name(), out, d));
        }
    }
    // Kernels that declare the same algorithm for this shape give the same
    // bits (asserted for every pair); the host-built kernels' snapshot says,
    // against each earlier golden kernel, whether they declare the same
    // algorithm and whether the bits agree.
    let shape = p.validate_shapes().expect("valid fixture");
    for (i, (bi, ki)) in golden.iter().enumerate() {
        for (bj, kj) in &golden[..i] {
            let (ai, aj) = (ki.algorithm(&shape), kj.algorithm(&shape));
            let bits = |k: &dyn Kernel| {
                digests
                    .iter()
                    .filter(|(n, _, _)| *n == k.name())
                    .map(|(_, o, d)| (*o, *d))
                    .collect::<Vec<_>>()
            };
            let same_bits = bits(ki.as_ref()) == bits(kj.as_ref());
            assert!(
                ai != aj || same_bits,
                "{name}: {} and {} declare the same algorithm but give different bits",
                ki.name(),
                kj.name()
            );
            if *bi != registry::Backend::CudaHost {
                continue;
            }
            let algorithm = if ai == aj {
                "same algorithm".to_string()
            } else {
                format!("algorithm {} vs {}", brief(&ai), brief(&aj))
            };
            let _ = writeln!(
                host,
                "  {} vs {}{}: {algorithm}; bits {}",
                ki.name(),
                kj.name(),
                if *bj == registry::Backend::CudaHost {
                    ""
                } else {
                    " (CPU)"
                },
                if same_bits { "same" } else { "differ" }
            );
        }
    }
    (s, host)
}

/// An algorithm in brief: summation leaf depth `h` and merge levels `L`,
/// rescaling exps `r`, `exp` / `ln` ulps.
fn brief(a: &logprobe_reference::spec::Algorithm) -> String {
    format!(
        "(h={} L={} r={} exp {} ulp, ln {:.3} ulp)",
        a.summation.leaf, a.summation.merges, a.rescaling_exps, a.exp_ulps, a.log_ulps
    )
}

/// Forward and backward bit digests of one kernel call pair (`None`: error).
type Digests = (Option<u64>, Option<u64>);

/// Writes one kernel's line for output dtype `out`: digests of its forward
/// and backward bits and their errors against the oracle (`exf`, `exg`).
fn kernel_line(
    s: &mut String,
    kernel: &dyn Kernel,
    p: &Problem<'_>,
    cot: &Cotangents<'_>,
    out: Dtype,
    exf: &logprobe_reference::oracle::OracleForward,
    exg: &Array2<logprobe_reference::oracle::Exact>,
) -> Digests {
    let mut d = (None, None);
    let _ = write!(s, "{} -> {out}:", kernel.name());
    match kernel.forward(p, out) {
        Err(e) => {
            let _ = writeln!(s, " forward error: {e}");
        }
        Ok(f) => {
            let mut h = Fnv::new();
            let mut ulps = [0.0f64; 3];
            for (i, o) in Output::FORWARD.into_iter().enumerate() {
                let (Some(got), Some(e)) = (f.values.get(o), exf.values.get(o)) else {
                    continue;
                };
                for ((r, c), v) in got.indexed_iter() {
                    h.value(*v, out);
                    if o.judged(p, r) {
                        ulps[i] = ulps[i].max(e[[r, c]].error_ulps(*v, out));
                    }
                }
            }
            d.0 = Some(h.0);
            let _ = write!(
                s,
                " forward {:016x}, max ulps: log_prob {:.3} entropy {:.3} topk {:.3};",
                h.0, ulps[0], ulps[1], ulps[2]
            );
        }
    }
    match kernel.backward(p, cot, out) {
        Err(e) => {
            let _ = writeln!(s, " backward error: {e}");
        }
        Ok(gr) => {
            let mut h = Fnv::new();
            let mut max_abs = 0.0f64;
            for (v, e) in gr.iter().zip(exg.iter()) {
                h.value(*v, out);
                max_abs = max_abs.max(e.error(*v));
            }
            d.1 = Some(h.0);
            let _ = writeln!(s, " backward {:016x}, max |err| {max_abs:.3e}", h.0);
        }
    }
    d
}

/// Logits `[N, V_total]` owned in their dtype.
enum TypedLogits {
    F64(Array2<f64>),
    F32(Array2<f32>),
    Bf16(Array2<half::bf16>),
    F16(Array2<half::f16>),
}

impl TypedLogits {
    fn view(&self) -> Logits<'_> {
        match self {
            TypedLogits::F64(a) => Logits::F64(a.view()),
            TypedLogits::F32(a) => Logits::F32(a.view()),
            TypedLogits::Bf16(a) => Logits::Bf16(a.view()),
            TypedLogits::F16(a) => Logits::F16(a.view()),
        }
    }
}

#[test]
fn golden_fixtures_match_their_snapshots() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("fixtures/golden exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 11, "{paths:?}");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.set_info(&format!("cpu_path: {}", logprobe_kernels::cpu_path()));
    settings.bind(|| {
        let mut host = String::new();
        // Each fixture's own snapshot; its host-built section is collected.
        let mut snapshot = |name: &str, bytes: &[u8]| {
            let (cpu, host_part) = snapshots(name, bytes);
            host.push_str(&host_part);
            cpu
        };
        for path in &paths {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(path).unwrap();
            insta::assert_snapshot!(name.clone(), snapshot(&name, &bytes));
        }
        // The host-built CUDA kernels (feature `cuda-host`, on in this
        // test kit by default): their bits on every fixture, in one snapshot.
        if registry::entries()
            .iter()
            .any(|e| e.backend == registry::Backend::CudaHost)
        {
            insta::assert_snapshot!("cuda_host_bits", host);
        }
    });
}
