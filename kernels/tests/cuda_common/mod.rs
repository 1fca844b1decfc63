//! CUDA run-time checks written once and run per back end (a GPU through
//! cudarc, feature `cuda`; the host build, feature `cuda-host`): oracle
//! agreement in f32 / bf16 / f16, chunk-size bit invariance, gradients
//! against the oracle's VJP, in-place backward, vocab-parallel shards,
//! device memory, 64-bit row offsets. Each returns `Err` with what failed,
//! so the planted mutants of the host build can be shown to fail them.
//!
//! The bound used here is a coarse one built from each kernel's declared
//! [`Algorithm`] (every rounding on the declared path counted as one unit
//! roundoff, times the magnitudes involved): a sanity check of the device
//! code. The tolerance model of `logprobe-verify` is the real judge.
#![allow(dead_code)]

use std::sync::Arc;

use half::{bf16, f16};
use ndarray::{Array1, Array2};

use logprobe_kernels::cuda::{CudaChunked, CudaFused, CudaVocabParallel, Launcher, Shards};
use logprobe_kernels::{Algorithm, Kernel};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, LogitsMut, Options, Output, Problem, Shape,
    TemperatureDtype,
};

/// Result of one check: `Err` names the kernel, the case and the value.
pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        let ok: bool = $cond;
        if !ok {
            return Err(format!($($msg)+));
        }
    };
}
#[allow(unused_imports)]
pub(crate) use ensure;

/// The back ends to run on: the GPU when the `cuda` feature is on and a
/// device is usable (else one line says why), the real host build with
/// `cuda-host` unless `LOGPROBE_CUDA_HOST=0` (`scripts/gpu-check.sh` sets it:
/// CI runs the host build already).
pub fn backends() -> Vec<Arc<dyn Launcher>> {
    #[allow(unused_mut)]
    let mut v: Vec<Arc<dyn Launcher>> = Vec::new();
    #[cfg(feature = "cuda")]
    match logprobe_kernels::cuda::CudaRuntime::shared() {
        Ok(rt) => v.push(rt),
        Err(why) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| println!("skipping the GPU back end: {why}"));
        }
    }
    #[cfg(feature = "cuda-host")]
    if std::env::var("LOGPROBE_CUDA_HOST").map_or(true, |v| v != "0") {
        v.push(logprobe_kernels::cuda::HostLauncher::shared());
    }
    v
}

/// Runs `check` on every back end, panicking with the first failure.
pub fn on_every_backend(check: impl Fn(&Arc<dyn Launcher>) -> Check) {
    for l in backends() {
        if let Err(e) = check(&l) {
            panic!("{}: {e}", l.name_prefix());
        }
    }
}

/// Reproducible test data without a rand dependency (the one splitmix64).
pub use logprobe_reference::splitmix::SplitMix64;

/// One test case: logits in f64 (exact in every dtype after rounding),
/// tokens, mask, top-k ids, options.
pub struct Case {
    pub x: Array2<f64>,
    pub tokens: Array1<i64>,
    pub mask: Option<Array2<bool>>,
    pub ids: Array2<i64>,
    pub options: Options,
}

pub fn case(seed: u64, n: usize, v_total: usize, vocab: usize, masked: bool, dtype: Dtype) -> Case {
    let mut r = SplitMix64::new(seed);
    let mut x = Array2::from_shape_fn((n, v_total), |_| {
        dtype.round_f64(6.0 * (r.uniform() - 0.5) + 4.0 * r.uniform().powi(8))
    });
    for row in 0..n {
        if vocab > 2 && r.below(3) == 0 {
            let j = r.below(vocab);
            x[[row, j]] = f64::NEG_INFINITY;
        }
        if row == 1 && vocab > 3 {
            x[[row, 0]] = x[[row, 3]]; // a tie at the max is likely after the next line
            x[[row, 3]] = 30.0;
            x[[row, 0]] = 30.0;
        }
    }
    let mask = masked.then(|| Array2::from_shape_fn((n, v_total), |(_, j)| j % 5 != 2 || j == 0));
    let allowed =
        |row: usize, j: usize| mask.as_ref().is_none_or(|m| m[[row, j]]) && x[[row, j]].is_finite();
    let tokens = Array1::from_shape_fn(n, |row| {
        if row % 4 == 3 {
            return -100;
        }
        (0..vocab)
            .map(|k| (k * 7 + row) % vocab)
            .find(|&j| allowed(row, j))
            .unwrap_or(0) as i64
    });
    let ids = Array2::from_shape_fn((n, 3.min(vocab)), |(row, k)| ((row + 5 * k) % vocab) as i64);
    let options = Options {
        vocab_size: Some(vocab),
        temperature: 0.75,
        ..Options::default()
    };
    // Rows with nothing allowed and finite would be bad input: keep column 0.
    let mut x = x;
    for row in 0..n {
        if !x[[row, 0]].is_finite() {
            x[[row, 0]] = 0.0;
        }
    }
    Case {
        x,
        tokens,
        mask,
        ids,
        options,
    }
}

/// Logits of `dtype` built from a case's f64 values.
pub enum Owned {
    F32(Array2<f32>),
    Bf16(Array2<bf16>),
    F16(Array2<f16>),
}

impl Owned {
    pub fn new(x: &Array2<f64>, dtype: Dtype) -> Self {
        match dtype {
            Dtype::Bf16 => Owned::Bf16(x.mapv(bf16::from_f64)),
            Dtype::F16 => Owned::F16(x.mapv(f16::from_f64)),
            _ => Owned::F32(x.mapv(|v| v as f32)),
        }
    }
    pub fn view(&self) -> Logits<'_> {
        match self {
            Owned::F32(a) => Logits::F32(a.view()),
            Owned::Bf16(a) => Logits::Bf16(a.view()),
            Owned::F16(a) => Logits::F16(a.view()),
        }
    }
    pub fn view_mut(&mut self) -> LogitsMut<'_> {
        match self {
            Owned::F32(a) => LogitsMut::F32(a.view_mut()),
            Owned::Bf16(a) => LogitsMut::Bf16(a.view_mut()),
            Owned::F16(a) => LogitsMut::F16(a.view_mut()),
        }
    }
    pub fn to_f64(&self) -> Array2<f64> {
        match self {
            Owned::F32(a) => a.mapv(|v| v as f64),
            Owned::Bf16(a) => a.mapv(|v| v.to_f64()),
            Owned::F16(a) => a.mapv(|v| v.to_f64()),
        }
    }
}

pub fn problem<'a>(c: &'a Case, logits: Logits<'a>) -> Problem<'a> {
    Problem {
        logits,
        tokens: Some(c.tokens.view()),
        sampling_mask: c.mask.as_ref().map(|m| m.view()),
        topk_ids: Some(c.ids.view()),
        policy: Default::default(),
        teacher_topk_log_probs: None,
        teacher_probs: None,
        options: c.options,
        loss_weights: None,
    }
}

/// gamma(n) = n u / (1 - n u) of the declared path: every addition and
/// merge level (3 roundings each), the exps along it (one ulp = 2u) and the
/// final log, u = 2^-24.
pub fn gamma(alg: &Algorithm) -> f64 {
    let s = alg.summation;
    let n = (s.leaf + 3 * s.merges + 4) as f64
        + 2.0 * alg.exp_ulps * (1 + alg.rescaling_exps) as f64
        + 2.0 * alg.log_ulps;
    let u = alg.accumulation.unit_roundoff();
    n * u / (1.0 - n * u)
}

pub fn forward_bound(alg: &Algorithm, exact: f64, scale: f64, out: Dtype) -> f64 {
    gamma(alg) * (exact.abs() + scale) + out.ulp(exact) + Dtype::F32.ulp(exact)
}

pub fn check_forward(kernel: &dyn Kernel, c: &Case, dtype: Dtype, out: Dtype) -> Check {
    let owned = Owned::new(&c.x, dtype);
    let p = problem(c, owned.view());
    let shape: Shape = p.validate().map_err(|e| e.to_string())?;
    let alg = kernel.algorithm(&shape);
    let name = kernel.name();
    let got = kernel
        .forward(&p, out)
        .map_err(|e| format!("{name}: {e}"))?;
    let exact = Oracle::default()
        .forward(&p, out)
        .map_err(|e| e.to_string())?;
    let scale = 2.0 + (shape.vocab_size as f64).ln() + 40.0 / shape.temperature;
    let lp = got.values.per_row(Output::LogProbs).ok_or("no log-probs")?;
    let exact_lp = exact
        .values
        .per_row(Output::LogProbs)
        .ok_or("no exact log-probs")?;
    for (r, e) in exact_lp.iter().enumerate() {
        if Output::LogProbs.judged(&p, r) {
            ensure!(
                e.error(lp[r]) <= forward_bound(&alg, e.rounded, scale, out),
                "{name} {dtype}->{out} log_prob row {r}: {} vs {}",
                lp[r],
                e.rounded
            );
        }
    }
    let ent = got.values.per_row(Output::Entropy).ok_or("no entropy")?;
    let exact_ent = exact
        .values
        .per_row(Output::Entropy)
        .ok_or("no exact entropy")?;
    for (r, e) in exact_ent.iter().enumerate() {
        ensure!(ent[r].is_finite(), "{name} entropy row {r} is {}", ent[r]);
        ensure!(
            e.error(ent[r]) <= forward_bound(&alg, e.rounded, scale, out),
            "{name} {dtype}->{out} entropy row {r}: {} vs {}",
            ent[r],
            e.rounded
        );
    }
    let topk = got.values.get(Output::TopkLogProbs).ok_or("no top-k")?;
    for ((idx, e), &g) in exact
        .values
        .get(Output::TopkLogProbs)
        .ok_or("no exact top-k")?
        .indexed_iter()
        .zip(topk.iter())
    {
        if e.rounded == f64::NEG_INFINITY {
            ensure!(g == f64::NEG_INFINITY, "{name} topk {idx:?}: {g} vs -inf");
        } else {
            ensure!(
                e.error(g) <= forward_bound(&alg, e.rounded, scale, out),
                "{name} topk {idx:?}: {g} vs {}",
                e.rounded
            );
        }
    }
    Ok(())
}

fn chunked(l: &Arc<dyn Launcher>, c: usize) -> CudaChunked {
    CudaChunked::on(l.clone(), c).expect("chunk sizes here are >= 1")
}

/// Fused and chunked forwards agree with the oracle in f32, bf16 and f16,
/// with and without masks, temperature in either dtype, padded vocabularies.
pub fn oracle_agreement(l: &Arc<dyn Launcher>) -> Check {
    let fused = CudaFused::on(l.clone());
    let chunked = chunked(l, 3);
    let kernels: [&dyn Kernel; 2] = [&fused, &chunked];
    for (i, &(n, vt, v, masked)) in [
        (5, 1, 1, false),
        (6, 9, 7, true),
        (7, 300, 300, false),
        (4, 2053, 2048, true),
        (3, 5000, 4999, false),
    ]
    .iter()
    .enumerate()
    {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let mut c = case(17 + i as u64, n, vt, v, masked, dtype);
            for k in kernels {
                check_forward(k, &c, dtype, Dtype::F32)?;
                check_forward(k, &c, dtype, dtype)?;
            }
            c.options.temperature_dtype = TemperatureDtype::Input;
            c.options.entropy = Some(EntropyLogits::Masked);
            for k in kernels {
                check_forward(k, &c, dtype, Dtype::F32)?;
            }
        }
    }
    Ok(())
}

/// Vocab-parallel shards (uneven, empty, all-padding) agree with the oracle.
pub fn vocab_parallel_agreement(l: &Arc<dyn Launcher>) -> Check {
    let c = case(99, 5, 1030, 1000, true, Dtype::Bf16);
    for shards in [
        Shards::Even(1),
        Shards::Even(3),
        Shards::Widths(vec![0, 17, 983, 0, 30]),
        Shards::Even(7),
    ] {
        let k = CudaVocabParallel::on(l.clone(), shards);
        check_forward(&k, &c, Dtype::Bf16, Dtype::F32)?;
    }
    Ok(())
}

pub fn cotangents(n: usize, k: usize) -> (Array1<f64>, Array1<f64>, Array2<f64>) {
    let g = Array1::from_shape_fn(n, |r| 1.0 - 0.25 * r as f64);
    let h = Array1::from_shape_fn(n, |r| 0.5 + 0.125 * r as f64);
    let gk = Array2::from_shape_fn((n, k), |(r, j)| 0.25 * (j as f64 + 1.0) - 0.125 * r as f64);
    (g, h, gk)
}

pub fn bits2(a: &Array2<f64>) -> Vec<u64> {
    a.iter().map(|v| v.to_bits()).collect()
}

/// Chunked forward and backward give the fused kernel's bits for every
/// chunk size; a row's outputs do not depend on the other rows of the call.
pub fn chunk_invariance(l: &Arc<dyn Launcher>) -> Check {
    let c = case(5, 11, 777, 770, true, Dtype::Bf16);
    let owned = Owned::new(&c.x, Dtype::Bf16);
    let p = problem(&c, owned.view());
    let (g, h, gk) = cotangents(11, c.ids.ncols());
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    let err = |e: logprobe_kernels::KernelError| e.to_string();
    let fused = CudaFused::on(l.clone());
    let f_ref = fused.forward(&p, Dtype::F32).map_err(err)?;
    let b_ref = fused.backward(&p, &cot, Dtype::F32).map_err(err)?;
    for chunk in [1, 2, 4, 7, 11, 64] {
        let k = chunked(l, chunk);
        let f = k.forward(&p, Dtype::F32).map_err(err)?;
        let b = k.backward(&p, &cot, Dtype::F32).map_err(err)?;
        // Same reduction order as fused, on exactly widened values.
        for o in Output::FORWARD {
            ensure!(
                f.values.get(o).map(bits2) == f_ref.values.get(o).map(bits2),
                "chunk {chunk}: {o} differs from fused"
            );
        }
        ensure!(
            bits2(&b) == bits2(&b_ref),
            "chunk {chunk}: grads differ from fused"
        );
    }
    // Rows do not depend on which other rows are in the call.
    let sub = Problem {
        logits: p.logits.slice_rows(4..9),
        tokens: Some(c.tokens.slice(ndarray::s![4..9])),
        sampling_mask: c.mask.as_ref().map(|m| m.slice(ndarray::s![4..9, ..])),
        topk_ids: Some(c.ids.slice(ndarray::s![4..9, ..])),
        policy: Default::default(),
        teacher_topk_log_probs: None,
        teacher_probs: None,
        options: c.options,
        loss_weights: None,
    };
    let f_sub = fused.forward(&sub, Dtype::F32).map_err(err)?;
    let ent = f_ref.values.get(Output::Entropy).ok_or("no entropy")?;
    ensure!(
        f_sub.values.get(Output::Entropy).map(bits2)
            == Some(bits2(&ent.slice(ndarray::s![4..9, ..]).to_owned())),
        "rows 4..9 alone differ from the same rows in the whole call"
    );
    Ok(())
}

/// Fused and vocab-parallel gradients agree with the oracle's VJP (f16 with
/// the temperature applied in the input dtype).
pub fn gradients_vs_oracle(l: &Arc<dyn Launcher>) -> Check {
    for (i, dtype) in [Dtype::F32, Dtype::Bf16, Dtype::F16]
        .into_iter()
        .enumerate()
    {
        let mut c = case(31 + i as u64, 6, 517, 512, i == 1, dtype);
        if i == 2 {
            // The gradient with respect to x when z = round(x / T): still / T.
            c.options.temperature_dtype = TemperatureDtype::Input;
        }
        let owned = Owned::new(&c.x, dtype);
        let p = problem(&c, owned.view());
        let shape = p.validate().map_err(|e| e.to_string())?;
        let (g, h, gk) = cotangents(6, c.ids.ncols());
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view())
            .with(Output::TopkLogProbs, gk.view());
        let exact = Oracle::default()
            .vjp(&p, &cot, Dtype::F32)
            .map_err(|e| e.to_string())?;
        let scale = (g.iter().chain(gk.iter()).map(|v| v.abs()).sum::<f64>()
            + h.iter().map(|v| v.abs()).sum::<f64>() * (4.0 + 40.0 / shape.temperature))
            / shape.temperature;
        let fused = CudaFused::on(l.clone());
        let vp = CudaVocabParallel::on(l.clone(), Shards::Even(3));
        for k in [&fused as &dyn Kernel, &vp] {
            let got = k
                .backward(&p, &cot, Dtype::F32)
                .map_err(|e| e.to_string())?;
            let gam = gamma(&k.algorithm(&shape));
            for ((idx, e), &v) in exact.indexed_iter().zip(got.iter()) {
                if idx.1 >= 512 {
                    ensure!(v == 0.0, "{}: padding gets gradient {v}", k.name());
                    continue;
                }
                let bound = gam * scale + Dtype::F32.ulp(e.rounded) + 1e-37;
                ensure!(
                    e.error(v) <= bound,
                    "{} {dtype} grad {idx:?}: {v} vs {} (bound {bound})",
                    k.name(),
                    e.rounded
                );
            }
        }
    }
    Ok(())
}

/// The in-place backward leaves the out-of-place backward's values rounded
/// to the logits' dtype.
pub fn in_place_backward(l: &Arc<dyn Launcher>) -> Check {
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let c = case(77, 5, 260, 250, true, dtype);
        let (g, h, gk) = cotangents(5, c.ids.ncols());
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view())
            .with(Output::TopkLogProbs, gk.view());
        let owned = Owned::new(&c.x, dtype);
        let p = problem(&c, owned.view());
        for k in [&CudaFused::on(l.clone()) as &dyn Kernel, &chunked(l, 2)] {
            let expect = k.backward(&p, &cot, dtype).map_err(|e| e.to_string())?;
            let mut inplace = Owned::new(&c.x, dtype);
            k.backward_in_place(p.with_logits(inplace.view_mut()), &cot)
                .map_err(|e| e.to_string())?;
            ensure!(
                bits2(&inplace.to_f64()) == bits2(&expect),
                "{} {dtype}: in place differs from backward",
                k.name()
            );
        }
    }
    Ok(())
}

/// Rows of `-inf` logits give finite entropy; `N = 0` allocates nothing.
pub fn neg_inf_rows_and_empty_problems(l: &Arc<dyn Launcher>) -> Check {
    let mut x = Array2::<f32>::from_elem((3, 40), f32::NEG_INFINITY);
    x[[0, 5]] = 1.0;
    x[[1, 0]] = -3.0;
    x[[1, 39]] = -3.0;
    x[[2, 17]] = 1e30;
    let p = Problem::new(Logits::F32(x.view()));
    let fused = CudaFused::on(l.clone());
    let out = fused.forward(&p, Dtype::F32).map_err(|e| e.to_string())?;
    let ent = out.values.per_row(Output::Entropy).ok_or("no entropy")?;
    ensure!(ent[0] == 0.0, "entropy of a one-hot row: {}", ent[0]);
    ensure!(
        (ent[1] - std::f64::consts::LN_2).abs() < 1e-6,
        "entropy of a two-hot row: {}",
        ent[1]
    );
    ensure!(ent[2] == 0.0, "entropy of a 1e30 one-hot row: {}", ent[2]);
    let empty = Array2::<f32>::zeros((0, 1 << 20));
    fused.reset_memory_peak();
    let out = fused
        .forward(&Problem::new(Logits::F32(empty.view())), Dtype::F32)
        .map_err(|e| e.to_string())?;
    ensure!(
        out.values.get(Output::Entropy).map(|e| e.len()) == Some(0),
        "N = 0 entropy"
    );
    ensure!(fused.memory().allocations == 0, "N = 0 allocated");
    Ok(())
}

/// Peak device workspace stays within the declared bound; chunk buffers are
/// `2 * chunk * V * 4` bytes; fused workspace is O(N).
pub fn workspace_within_declared_bound(l: &Arc<dyn Launcher>) -> Check {
    let c = case(3, 40, 1024, 1000, true, Dtype::Bf16);
    let owned = Owned::new(&c.x, Dtype::Bf16);
    let p = problem(&c, owned.view());
    let shape = p.validate().map_err(|e| e.to_string())?;
    let (g, h, gk) = cotangents(40, c.ids.ncols());
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    for chunk in [1, 8, 40] {
        let k = chunked(l, chunk);
        k.reset_memory_peak();
        k.forward(&p, Dtype::F32).map_err(|e| e.to_string())?;
        let fwd = k.memory();
        k.reset_memory_peak();
        k.backward(&p, &cot, Dtype::F32)
            .map_err(|e| e.to_string())?;
        let bwd = k.memory();
        let declared = k.workspace_bytes(&shape);
        let o_n = 4 * 8 * 40 + 12 * 40 * (shape.k + 1) + 8 * 40;
        for m in [fwd, bwd] {
            ensure!(
                m.peak.workspace <= declared,
                "chunk {chunk}: {} > {declared}",
                m.peak.workspace
            );
            ensure!(
                m.peak.workspace <= 2 * chunk * 1000 * 4 + o_n,
                "chunk {chunk}: chunk buffers exceed 2 * chunk * V * 4"
            );
            ensure!(
                m.current.total() == 0,
                "chunk {chunk}: not everything freed"
            );
        }
    }
    let f = CudaFused::on(l.clone());
    f.reset_memory_peak();
    f.forward(&p, Dtype::F32).map_err(|e| e.to_string())?;
    ensure!(
        f.memory().peak.workspace <= f.workspace_bytes(&shape),
        "fused workspace above its declared bound"
    );
    ensure!(
        f.memory().peak.workspace < 40 * 1000,
        "fused workspace is O(N), not O(N V)"
    );
    Ok(())
}
