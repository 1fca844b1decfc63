//! CUDA run-time properties (feature `cuda`): oracle agreement in f32 / bf16
//! / f16, chunk-size bit invariance, gradients against the oracle's VJP,
//! in-place backward, vocab-parallel shards, device memory, and (with
//! `LOGPROBE_CUDA_BENCH=1`) the fused forward's HBM bandwidth.
//!
//! Without a CUDA driver (or device) each test prints one line,
//! "skipping CUDA run-time tests: no CUDA driver", and returns.
//!
//! The bound used here is a coarse one built from each kernel's declared
//! [`Algorithm`] (every rounding on the declared path counted as one unit
//! roundoff, times the magnitudes involved): a sanity check of the device
//! code. The tolerance model of `logprobe-properties` is the real judge.
#![cfg(feature = "cuda")]

use half::{bf16, f16};
use ndarray::{Array1, Array2};

use logprobe_kernels::cuda::{
    bench::{fused_forward_bandwidth, H200_PEAK_BYTES_PER_S},
    driver_present, unavailable_reason, CudaChunked, CudaError, CudaFused, CudaRuntime,
    CudaVocabParallel, Shards,
};
use logprobe_kernels::{Algorithm, Kernel};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, LogitsMut, Options, Problem, Shape, TemperatureDtype,
};

/// True when a device is usable; otherwise prints the skip line.
fn have_device() -> bool {
    match unavailable_reason() {
        None => true,
        Some(why) => {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| println!("skipping CUDA run-time tests: {why}"));
            false
        }
    }
}

/// splitmix64: reproducible test data without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One test case: logits in f64 (exact in every dtype after rounding),
/// tokens, mask, top-k ids, options.
struct Case {
    x: Array2<f64>,
    tokens: Array1<i64>,
    mask: Option<Array2<bool>>,
    ids: Array2<i64>,
    options: Options,
}

fn case(seed: u64, n: usize, v_total: usize, vocab: usize, masked: bool, dtype: Dtype) -> Case {
    let mut r = Rng(seed);
    let mut x = Array2::from_shape_fn((n, v_total), |_| {
        dtype.round_f64(6.0 * (r.unit() - 0.5) + 4.0 * r.unit().powi(8))
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
enum Owned {
    F32(Array2<f32>),
    Bf16(Array2<bf16>),
    F16(Array2<f16>),
}

impl Owned {
    fn new(x: &Array2<f64>, dtype: Dtype) -> Self {
        match dtype {
            Dtype::Bf16 => Owned::Bf16(x.mapv(bf16::from_f64)),
            Dtype::F16 => Owned::F16(x.mapv(f16::from_f64)),
            _ => Owned::F32(x.mapv(|v| v as f32)),
        }
    }
    fn view(&self) -> Logits<'_> {
        match self {
            Owned::F32(a) => Logits::F32(a.view()),
            Owned::Bf16(a) => Logits::Bf16(a.view()),
            Owned::F16(a) => Logits::F16(a.view()),
        }
    }
    fn view_mut(&mut self) -> LogitsMut<'_> {
        match self {
            Owned::F32(a) => LogitsMut::F32(a.view_mut()),
            Owned::Bf16(a) => LogitsMut::Bf16(a.view_mut()),
            Owned::F16(a) => LogitsMut::F16(a.view_mut()),
        }
    }
    fn to_f64(&self) -> Array2<f64> {
        match self {
            Owned::F32(a) => a.mapv(|v| v as f64),
            Owned::Bf16(a) => a.mapv(|v| v.to_f64()),
            Owned::F16(a) => a.mapv(|v| v.to_f64()),
        }
    }
}

fn problem<'a>(c: &'a Case, logits: Logits<'a>) -> Problem<'a> {
    Problem {
        logits,
        tokens: Some(c.tokens.view()),
        sampling_mask: c.mask.as_ref().map(|m| m.view()),
        topk_ids: Some(c.ids.view()),
        options: c.options,
    }
}

/// gamma(n) = n u / (1 - n u) of the declared path: every addition and
/// merge level (3 roundings each), the exps along it (one ulp = 2u) and the
/// final log, u = 2^-24.
fn gamma(alg: &Algorithm) -> f64 {
    let s = alg.summation;
    let n = (s.leaf + 3 * s.merges + 4) as f64
        + 2.0 * alg.exp_ulps * (1 + alg.rescaling_exps) as f64
        + 2.0 * alg.log_ulps;
    let u = alg.accumulation.unit_roundoff();
    n * u / (1.0 - n * u)
}

fn forward_bound(alg: &Algorithm, exact: f64, scale: f64, out: Dtype) -> f64 {
    gamma(alg) * (exact.abs() + scale) + out.ulp(exact) + Dtype::F32.ulp(exact)
}

fn check_forward(kernel: &dyn Kernel, c: &Case, dtype: Dtype, out: Dtype) {
    let owned = Owned::new(&c.x, dtype);
    let p = problem(c, owned.view());
    let shape: Shape = p.validate().unwrap();
    let alg = kernel.algorithm(&shape);
    let got = kernel
        .forward(&p, out)
        .unwrap_or_else(|e| panic!("{}: {e}", kernel.name()));
    let exact = Oracle::default().forward(&p, out).unwrap();
    let scale = 2.0 + (shape.vocab_size as f64).ln() + 40.0 / shape.temperature;
    let lp = got.log_probs.unwrap();
    for (r, e) in exact.log_probs.unwrap().iter().enumerate() {
        if let Some(e) = e {
            let err = e.error(lp[r]);
            assert!(
                err <= forward_bound(&alg, e.rounded, scale, out),
                "{} {dtype}->{out} log_prob row {r}: {} vs {}",
                kernel.name(),
                lp[r],
                e.rounded
            );
        }
    }
    let ent = got.entropy.unwrap();
    for (r, e) in exact.entropy.unwrap().iter().enumerate() {
        assert!(ent[r].is_finite(), "entropy row {r} is {}", ent[r]);
        let err = e.error(ent[r]);
        assert!(
            err <= forward_bound(&alg, e.rounded, scale, out),
            "{} {dtype}->{out} entropy row {r}: {} vs {}",
            kernel.name(),
            ent[r],
            e.rounded
        );
    }
    let topk = got.topk_log_probs.unwrap();
    for ((idx, e), &g) in exact
        .topk_log_probs
        .unwrap()
        .indexed_iter()
        .zip(topk.iter())
    {
        if e.rounded == f64::NEG_INFINITY {
            assert_eq!(g, f64::NEG_INFINITY, "{} topk {idx:?}", kernel.name());
        } else {
            assert!(
                e.error(g) <= forward_bound(&alg, e.rounded, scale, out),
                "{} topk {idx:?}: {g} vs {}",
                kernel.name(),
                e.rounded
            );
        }
    }
}

#[test]
fn constructing_without_a_driver_is_a_typed_error() {
    if driver_present() {
        return;
    }
    assert_eq!(CudaFused::new().unwrap_err(), CudaError::NoDriver);
    assert!(CudaChunked::new(4).is_err());
    assert!(CudaVocabParallel::new(Shards::Even(2)).is_err());
    assert_eq!(CudaRuntime::shared().unwrap_err(), CudaError::NoDriver);
}

#[test]
fn cuda_kernels_agree_with_the_oracle_in_f32_bf16_f16() {
    if !have_device() {
        return;
    }
    let fused = CudaFused::new().unwrap();
    let chunked = CudaChunked::new(3).unwrap();
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
                check_forward(k, &c, dtype, Dtype::F32);
                check_forward(k, &c, dtype, dtype);
            }
            c.options.temperature_dtype = TemperatureDtype::Input;
            c.options.entropy = Some(EntropyLogits::Masked);
            for k in kernels {
                check_forward(k, &c, dtype, Dtype::F32);
            }
        }
    }
}

#[test]
fn vocab_parallel_shards_agree_with_the_oracle() {
    if !have_device() {
        return;
    }
    let c = case(99, 5, 1030, 1000, true, Dtype::Bf16);
    for shards in [
        Shards::Even(1),
        Shards::Even(3),
        Shards::Widths(vec![0, 17, 983, 0, 30]),
        Shards::Even(7),
    ] {
        let k = CudaVocabParallel::new(shards).unwrap();
        check_forward(&k, &c, Dtype::Bf16, Dtype::F32);
    }
}

fn cotangents(n: usize, k: usize) -> (Array1<f64>, Array1<f64>, Array2<f64>) {
    let g = Array1::from_shape_fn(n, |r| 1.0 - 0.25 * r as f64);
    let h = Array1::from_shape_fn(n, |r| 0.5 + 0.125 * r as f64);
    let gk = Array2::from_shape_fn((n, k), |(r, j)| 0.25 * (j as f64 + 1.0) - 0.125 * r as f64);
    (g, h, gk)
}

#[test]
fn chunk_size_is_bit_invariant_on_the_device() {
    if !have_device() {
        return;
    }
    let c = case(5, 11, 777, 770, true, Dtype::Bf16);
    let owned = Owned::new(&c.x, Dtype::Bf16);
    let p = problem(&c, owned.view());
    let (g, h, gk) = cotangents(11, c.ids.ncols());
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: Some(gk.view()),
    };
    let fused = CudaFused::new().unwrap();
    let f_ref = fused.forward(&p, Dtype::F32).unwrap();
    let b_ref = fused.backward(&p, &cot, Dtype::F32).unwrap();
    for chunk in [1, 2, 4, 7, 11, 64] {
        let k = CudaChunked::new(chunk).unwrap();
        let f = k.forward(&p, Dtype::F32).unwrap();
        let b = k.backward(&p, &cot, Dtype::F32).unwrap();
        // Same reduction order as fused, on exactly widened values.
        assert_eq!(
            bits1(&f.log_probs.unwrap()),
            bits1(f_ref.log_probs.as_ref().unwrap()),
            "chunk {chunk}"
        );
        assert_eq!(
            bits1(&f.entropy.unwrap()),
            bits1(f_ref.entropy.as_ref().unwrap()),
            "chunk {chunk}"
        );
        assert_eq!(
            bits2(&f.topk_log_probs.unwrap()),
            bits2(f_ref.topk_log_probs.as_ref().unwrap()),
            "chunk {chunk}"
        );
        assert_eq!(bits2(&b), bits2(&b_ref), "chunk {chunk} grads");
    }
    // Rows do not depend on which other rows are in the call.
    let sub = Problem {
        logits: p.logits.slice_rows(4..9),
        tokens: Some(c.tokens.slice(ndarray::s![4..9])),
        sampling_mask: c.mask.as_ref().map(|m| m.slice(ndarray::s![4..9, ..])),
        topk_ids: Some(c.ids.slice(ndarray::s![4..9, ..])),
        options: c.options,
    };
    let f_sub = fused.forward(&sub, Dtype::F32).unwrap();
    assert_eq!(
        bits1(&f_sub.entropy.unwrap()),
        bits1(&f_ref.entropy.unwrap().slice(ndarray::s![4..9]).to_owned())
    );
}

fn bits1(a: &Array1<f64>) -> Vec<u64> {
    a.iter().map(|v| v.to_bits()).collect()
}
fn bits2(a: &Array2<f64>) -> Vec<u64> {
    a.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn gradients_agree_with_the_oracle_vjp() {
    if !have_device() {
        return;
    }
    for (i, dtype) in [Dtype::F32, Dtype::Bf16, Dtype::F16]
        .into_iter()
        .enumerate()
    {
        let c = case(31 + i as u64, 6, 517, 512, i == 1, dtype);
        let owned = Owned::new(&c.x, dtype);
        let p = problem(&c, owned.view());
        let shape = p.validate().unwrap();
        let (g, h, gk) = cotangents(6, c.ids.ncols());
        let cot = Cotangents {
            grad_log_probs: Some(g.view()),
            grad_entropy: Some(h.view()),
            grad_topk_log_probs: Some(gk.view()),
        };
        let exact = Oracle::default().vjp(&p, &cot, Dtype::F32).unwrap();
        let scale = (g.iter().chain(gk.iter()).map(|v| v.abs()).sum::<f64>()
            + h.iter().map(|v| v.abs()).sum::<f64>() * (4.0 + 40.0 / shape.temperature))
            / shape.temperature;
        let fused = CudaFused::new().unwrap();
        let vp = CudaVocabParallel::new(Shards::Even(3)).unwrap();
        for k in [&fused as &dyn Kernel, &vp] {
            let got = k.backward(&p, &cot, Dtype::F32).unwrap();
            let gam = gamma(&k.algorithm(&shape));
            for ((idx, e), &v) in exact.indexed_iter().zip(got.iter()) {
                if idx.1 >= 512 {
                    assert_eq!(v, 0.0, "padding gets gradient 0");
                    continue;
                }
                let bound = gam * scale + Dtype::F32.ulp(e.rounded) + 1e-37;
                assert!(
                    e.error(v) <= bound,
                    "{} {dtype} grad {idx:?}: {v} vs {} (bound {bound})",
                    k.name(),
                    e.rounded
                );
            }
        }
    }
}

#[test]
fn in_place_backward_equals_backward_rounded_to_the_logits_dtype() {
    if !have_device() {
        return;
    }
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let c = case(77, 5, 260, 250, true, dtype);
        let (g, h, gk) = cotangents(5, c.ids.ncols());
        let cot = Cotangents {
            grad_log_probs: Some(g.view()),
            grad_entropy: Some(h.view()),
            grad_topk_log_probs: Some(gk.view()),
        };
        let owned = Owned::new(&c.x, dtype);
        let p = problem(&c, owned.view());
        for k in [
            &CudaFused::new().unwrap() as &dyn Kernel,
            &CudaChunked::new(2).unwrap(),
        ] {
            let expect = k.backward(&p, &cot, dtype).unwrap();
            let mut inplace = Owned::new(&c.x, dtype);
            k.backward_in_place(
                inplace.view_mut(),
                Some(c.tokens.view()),
                c.mask.as_ref().map(|m| m.view()),
                Some(c.ids.view()),
                &c.options,
                &cot,
            )
            .unwrap();
            assert_eq!(
                bits2(&inplace.to_f64()),
                bits2(&expect),
                "{} {dtype}",
                k.name()
            );
        }
    }
}

#[test]
fn neg_inf_logits_give_finite_entropy_and_empty_problems_allocate_nothing() {
    if !have_device() {
        return;
    }
    let mut x = Array2::<f32>::from_elem((3, 40), f32::NEG_INFINITY);
    x[[0, 5]] = 1.0;
    x[[1, 0]] = -3.0;
    x[[1, 39]] = -3.0;
    x[[2, 17]] = 1e30;
    let p = Problem::new(Logits::F32(x.view()));
    let fused = CudaFused::new().unwrap();
    let out = fused.forward(&p, Dtype::F32).unwrap();
    let ent = out.entropy.unwrap();
    assert_eq!(ent[0], 0.0);
    assert!((ent[1] - std::f64::consts::LN_2).abs() < 1e-6, "{}", ent[1]);
    assert_eq!(ent[2], 0.0);
    let empty = Array2::<f32>::zeros((0, 1 << 20));
    fused.reset_memory_peak();
    let out = fused
        .forward(&Problem::new(Logits::F32(empty.view())), Dtype::F32)
        .unwrap();
    assert_eq!(out.entropy.unwrap().len(), 0);
    assert_eq!(fused.memory().allocations, 0);
}

#[test]
fn device_workspace_stays_within_the_declared_bound() {
    if !have_device() {
        return;
    }
    let c = case(3, 40, 1024, 1000, true, Dtype::Bf16);
    let owned = Owned::new(&c.x, Dtype::Bf16);
    let p = problem(&c, owned.view());
    let shape = p.validate().unwrap();
    let (g, h, gk) = cotangents(40, c.ids.ncols());
    let cot = Cotangents {
        grad_log_probs: Some(g.view()),
        grad_entropy: Some(h.view()),
        grad_topk_log_probs: Some(gk.view()),
    };
    for chunk in [1, 8, 40] {
        let k = CudaChunked::new(chunk).unwrap();
        k.reset_memory_peak();
        k.forward(&p, Dtype::F32).unwrap();
        let fwd = k.memory();
        k.reset_memory_peak();
        k.backward(&p, &cot, Dtype::F32).unwrap();
        let bwd = k.memory();
        let declared = k.workspace_bytes(&shape);
        let o_n = 4 * 8 * 40 + 12 * 40 * (shape.k + 1) + 8 * 40;
        for m in [fwd, bwd] {
            assert!(
                m.peak.workspace <= declared,
                "chunk {chunk}: {} > {declared}",
                m.peak.workspace
            );
            assert!(
                m.peak.workspace <= 2 * chunk * 1000 * 4 + o_n,
                "chunk {chunk}: chunk buffers exceed 2 * chunk * V * 4"
            );
            assert_eq!(m.current.total(), 0, "everything freed");
        }
    }
    let f = CudaFused::new().unwrap();
    f.reset_memory_peak();
    f.forward(&p, Dtype::F32).unwrap();
    assert!(f.memory().peak.workspace <= f.workspace_bytes(&shape));
    assert!(
        f.memory().peak.workspace < 40 * 1000,
        "fused workspace is O(N), not O(N V)"
    );
}

/// The benchmark of issue 6 (N = 8192, V = 152064, bf16 and f32), only with
/// `LOGPROBE_CUDA_BENCH=1`; `LOGPROBE_CUDA_BENCH_MIN=<fraction>` also
/// asserts the fraction of 4.8 TB/s.
#[test]
fn fused_forward_bandwidth_on_the_device() {
    if std::env::var("LOGPROBE_CUDA_BENCH").map_or(true, |v| v != "1") || !have_device() {
        return;
    }
    let rt = CudaRuntime::shared().unwrap();
    println!(
        "device: {} ({})",
        rt.device_name().unwrap_or_default(),
        rt.arch()
    );
    let min: Option<f64> = std::env::var("LOGPROBE_CUDA_BENCH_MIN")
        .ok()
        .and_then(|v| v.parse().ok());
    for dtype in [Dtype::Bf16, Dtype::F32] {
        let r =
            fused_forward_bandwidth(&rt, 8192, 152_064, dtype, 20, H200_PEAK_BYTES_PER_S).unwrap();
        println!("BENCH {r}");
        if let Some(m) = min {
            assert!(r.fraction_of_peak >= m, "{r}");
        }
    }
}
