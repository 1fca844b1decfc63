//! The CPU kernels (fused, chunked, vocab-parallel) against the MPFR oracle
//! on small hand-picked rows (edges: `-inf`, ties, 1e30 offsets, f16 near
//! 65504, masks, padding, temperatures, long rows through the block tree),
//! each value judged with the real bound of the kernel's declared algorithm
//! (the tolerance model, through the property checks' shared walk), plus
//! the values the bound does not see: `ignore_index` rows hold 0, entropy
//! is non-negative, an exactly zero gradient is `+0`; and bad input gives
//! its typed error with the logits unchanged.

use half::{bf16, f16};
use ndarray::{array, Array2};

use logprobe_kernels::{CpuKernel, Kernel, KernelError};
use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, Element, EntropyLogits, Logits, LogitsMut, Output, PerOutput, Problem,
    SpecError, TemperatureDtype,
};
use logprobe_reference::splitmix::SplitMix64;
use logprobe_testkit::cache::OracleCase;
use logprobe_testkit::checks::judge_values;
use logprobe_testkit::registry::{self, Backend};

/// The registry's CPU kernels at their gate chunk sizes (fused, chunked
/// at 1, 3 and 64; vocab-parallel below, over explicit layouts).
fn kernels() -> Vec<Box<dyn Kernel>> {
    registry::entries()
        .iter()
        .filter(|e| e.backend == Backend::Cpu)
        .flat_map(|e| e.gate_kernels())
        .collect()
}

/// Every forward output of every kernel against the oracle.
fn check_forward(problem: &Problem<'_>, out: Dtype) {
    check_forward_with(problem, out, &kernels());
}

fn check_forward_with(problem: &Problem<'_>, out: Dtype, kernels: &[Box<dyn Kernel>]) {
    let oc = OracleCase::of(problem);
    let exact = oc.forward.as_ref().expect("oracle");
    let (n, _) = problem.logits.dim();
    for k in kernels {
        let f = k
            .forward(problem, out)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        assert_eq!(f.dtype, out);
        for o in Output::FORWARD {
            assert_eq!(
                f.values.contains(o),
                exact.values.contains(o),
                "{}: {o} presence",
                k.name()
            );
        }
        let none = Cotangents::default();
        judge_values(
            k.as_ref(),
            problem,
            &none,
            &oc,
            &exact.values.as_ref(),
            &f.values.as_ref(),
            out,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        if let Some(lp) = f.values.per_row(Output::LogProbs) {
            for r in (0..n).filter(|&r| !Output::LogProbs.judged(problem, r)) {
                assert_eq!(lp[r], 0.0, "{}: ignore_index rows hold 0", k.name());
            }
        }
        if let Some(h) = f.values.per_row(Output::Entropy) {
            assert!(h.iter().all(|&h| h >= 0.0), "{}: entropy {h}", k.name());
        }
    }
}

/// Every kernel's backward against the oracle's VJP, per element within
/// the declared model's bound; an exactly zero gradient must be `+0`.
fn check_backward(problem: &Problem<'_>, cot: &Cotangents<'_>, out: Dtype) {
    check_backward_with(problem, cot, out, &kernels());
}

fn check_backward_with(
    problem: &Problem<'_>,
    cot: &Cotangents<'_>,
    out: Dtype,
    kernels: &[Box<dyn Kernel>],
) {
    let oc = OracleCase::of(problem);
    let exact = Oracle::default()
        .vjp(problem, cot, Dtype::F64)
        .expect("oracle vjp");
    let want: PerOutput<&Array2<_>> = std::iter::once((Output::GradLogits, &exact)).collect();
    for k in kernels {
        let g = k
            .backward(problem, cot, out)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        let got: PerOutput<&Array2<f64>> = std::iter::once((Output::GradLogits, &g)).collect();
        judge_values(k.as_ref(), problem, cot, &oc, &want, &got, out)
            .unwrap_or_else(|e| panic!("{}: {e}", k.name()));
        for ((r, j), e) in exact.indexed_iter() {
            let point_zero = e.decided && e.enclosure.lo == 0.0 && e.enclosure.hi == 0.0;
            if point_zero {
                assert_eq!(
                    g[[r, j]].to_bits(),
                    0.0f64.to_bits(),
                    "{} grad[{r},{j}] must be +0",
                    k.name()
                );
            }
        }
    }
}

fn hand_rows() -> Array2<f64> {
    let ninf = f64::NEG_INFINITY;
    array![
        [0.0, 1.0, 2.0, 3.0, -1.5, 0.25],
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        [ninf, 2.0, ninf, -3.0, 0.5, ninf],
        [40.0, -40.0, 0.0, 39.5, 12.0, -7.25],
        [-5.0, -5.0, -4.0, -4.0, ninf, -60.0],
    ]
}

fn cast<T: Element>(x: &Array2<f64>) -> Array2<T> {
    x.mapv(T::from_f64)
}

#[test]
fn forward_matches_oracle_on_hand_picked_rows() {
    let x = hand_rows();
    let tokens = array![3i64, 0, 1, -100, 2];
    let ids = array![[3i64, 0], [5, 5], [0, 4], [0, 3], [1, 2]];
    let xf32 = cast::<f32>(&x);
    let xbf = cast::<bf16>(&x);
    let xf16 = cast::<f16>(&x);
    for logits in [
        Logits::F64(x.view()),
        Logits::F32(xf32.view()),
        Logits::Bf16(xbf.view()),
        Logits::F16(xf16.view()),
    ] {
        for out in [Dtype::F64, Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let mut p = Problem::new(logits);
            p.tokens = Some(tokens.view());
            p.topk_ids = Some(ids.view());
            check_forward(&p, out);
            p.options.temperature = 0.7;
            check_forward(&p, out);
            p.options.temperature_dtype = TemperatureDtype::Input;
            check_forward(&p, out);
        }
    }
}

#[test]
fn masks_padding_and_entropy_choices_match_oracle() {
    let x = hand_rows();
    let xf = cast::<f32>(&x);
    let mask = array![
        [true, false, true, true, false, true],
        [false, false, false, true, false, false], // one allowed token
        [true, true, false, true, true, true],
        [false, true, true, true, true, true],
        [true, true, true, false, true, true],
    ];
    let tokens = array![3i64, 3, 1, 2, -100];
    let ids = array![[1i64, 3], [0, 3], [1, 2], [0, 1], [3, 0]];
    for ent in [
        None,
        Some(EntropyLogits::Unmasked),
        Some(EntropyLogits::Masked),
    ] {
        let mut p = Problem::new(Logits::F32(xf.view()));
        p.tokens = Some(tokens.view());
        p.sampling_mask = Some(mask.view());
        p.topk_ids = Some(ids.view());
        p.options.entropy = ent;
        check_forward(&p, Dtype::F32);
        p.options.temperature = 2.5;
        check_forward(&p, Dtype::F64);
    }
    // Padded vocabulary: only the first 4 columns are real; the padding holds NaN.
    let mut xp = xf.clone();
    xp.column_mut(4).fill(f32::NAN);
    xp.column_mut(5).fill(f32::INFINITY);
    let mut p = Problem::new(Logits::F32(xp.view()));
    let tokens = array![3i64, 0, 1, 2, 0];
    p.tokens = Some(tokens.view());
    p.options.vocab_size = Some(4);
    check_forward(&p, Dtype::F32);
}

#[test]
fn extreme_offsets_stay_within_bound() {
    // f32 logits around 1e30 (spacing 7.6e22) and f16 near 65504.
    let base = 1.0e30f32;
    let row: Vec<f32> = (0..7)
        .map(|i| f32::from_bits(base.to_bits() + i * 3))
        .collect();
    let x = Array2::from_shape_vec((1, 7), row).unwrap();
    let tokens = array![2i64];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    // |d| reaches 1.4e24: the shift's own rounding (u |d|) dominates, and
    // the declared model's bound (a |d_t| + ...) accounts for it.
    check_forward(&p, Dtype::F32);
    let xh = array![[
        f16::from_f64(65504.0),
        f16::from_f64(65472.0),
        f16::from_f64(-65504.0),
        f16::from_f64(65504.0)
    ]];
    let t = array![1i64];
    let mut p = Problem::new(Logits::F16(xh.view()));
    p.tokens = Some(t.view());
    check_forward(&p, Dtype::F32);
}

#[test]
fn long_rows_use_the_tree_and_match_oracle() {
    // 3 rows x 20000 entries: 10 blocks, merges on every level.
    let mut rng = SplitMix64::new(7);
    let (n, v) = (3, 20_000);
    let x = Array2::from_shape_fn((n, v), |(r, _)| {
        (rng.normal() * (1.0 + 3.0 * r as f64)) as f32
    });
    let tokens = array![5i64, 19_999, 12_345];
    let ids = array![[0i64, 2048], [4095, 4096], [10_000, 1]];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    p.topk_ids = Some(ids.view());
    check_forward(&p, Dtype::F32);
    let xb = x.mapv(bf16::from_f32);
    p.logits = Logits::Bf16(xb.view());
    check_forward(&p, Dtype::Bf16);
}

#[test]
fn grads_match_oracle_vjp() {
    let x = hand_rows();
    let xf = cast::<f32>(&x);
    let xb = cast::<bf16>(&x);
    let tokens = array![3i64, 0, 1, -100, 2];
    let ids = array![[3i64, 0], [5, 5], [0, 4], [0, 3], [1, 2]];
    let mask = array![
        [true, false, true, true, false, true],
        [true; 6],
        [true, true, false, true, true, true],
        [false, true, true, true, true, true],
        [true, true, true, false, true, true],
    ];
    let g = array![1.0, -0.5, 2.0, 3.0, 0.75];
    let h = array![0.5, 1.0, -1.25, 0.0, 2.0];
    let gk = array![
        [0.25, -1.0],
        [0.5, 0.5],
        [1.0, 1.0],
        [-0.5, 0.125],
        [2.0, -2.0]
    ];
    let cots = [
        Cotangents::default().with_column(Output::LogProbs, g.view()),
        Cotangents::default().with_column(Output::Entropy, h.view()),
        Cotangents::default().with(Output::TopkLogProbs, gk.view()),
        Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view())
            .with(Output::TopkLogProbs, gk.view()),
    ];
    for logits in [
        Logits::F32(xf.view()),
        Logits::Bf16(xb.view()),
        Logits::F64(x.view()),
    ] {
        for cot in &cots {
            for (masked, ent, t) in [
                (false, EntropyLogits::Unmasked, 1.0),
                (true, EntropyLogits::Unmasked, 0.7),
                (true, EntropyLogits::Masked, 1.5),
            ] {
                let mut p = Problem::new(logits);
                p.tokens = Some(tokens.view());
                p.topk_ids = Some(ids.view());
                p.options.entropy = Some(ent);
                p.options.temperature = t;
                if masked {
                    p.sampling_mask = Some(mask.view());
                }
                check_backward(&p, cot, Dtype::F32);
                check_backward(&p, cot, Dtype::Bf16);
                // z = round_input(x / T) materialised by the caller; dz/dx = 1/T.
                p.options.temperature_dtype = TemperatureDtype::Input;
                check_backward(&p, cot, Dtype::F32);
            }
        }
    }
}

#[test]
fn bad_input_gives_typed_errors_and_leaves_logits_unchanged() {
    let mut x = cast::<f32>(&hand_rows());
    x[[3, 2]] = f32::NAN;
    let tokens = array![3i64, 0, 1, 2, 2];
    let g = array![1.0, 1.0, 1.0, 1.0, 1.0];
    let cot = Cotangents::default().with_column(Output::LogProbs, g.view());
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    let want = p.validate().unwrap_err();
    assert!(matches!(
        want,
        SpecError::NonFiniteLogit { row: 3, col: 2, .. }
    ));
    for k in kernels() {
        // NaN != NaN: compare the errors' debug forms.
        let same =
            |e: KernelError| format!("{e:?}") == format!("{:?}", KernelError::Spec(want.clone()));
        assert!(same(k.forward(&p, Dtype::F32).unwrap_err()), "{}", k.name());
        assert!(
            same(k.backward(&p, &cot, Dtype::F32).unwrap_err()),
            "{}",
            k.name()
        );
        let mut y = x.clone();
        let err = k
            .backward_in_place(
                logprobe_reference::spec::ProblemMut {
                    logits: LogitsMut::F32(y.view_mut()),
                    tokens: p.tokens,
                    sampling_mask: None,
                    topk_ids: None,
                    policy: p.policy.shorten(),
                    teacher_topk_log_probs: None,
                    teacher_probs: None,
                    options: p.options,
                    loss_weights: p.loss_weights,
                },
                &cot,
            )
            .unwrap_err();
        assert!(same(err), "{}", k.name());
        assert!(
            y.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()),
            "logits changed on error"
        );
    }
    // Target with -inf logit, out of range, masked; no finite logit; chunk 0; bad T.
    let x = cast::<f32>(&hand_rows());
    let mut p = Problem::new(Logits::F32(x.view()));
    let bad_t = array![3i64, 0, 0, 2, 2];
    p.tokens = Some(bad_t.view());
    for k in kernels() {
        assert_eq!(
            k.forward(&p, Dtype::F32).unwrap_err(),
            KernelError::Spec(SpecError::TokenNegInf { row: 2, token: 0 })
        );
    }
    let oor = array![3i64, 6, 0, 2, 2];
    p.tokens = Some(oor.view());
    assert!(matches!(
        CpuKernel::fused().forward(&p, Dtype::F32),
        Err(KernelError::Spec(SpecError::TokenOutOfRange { row: 1, .. }))
    ));
    p.tokens = None;
    let none = Array2::from_elem((5, 6), false);
    p.sampling_mask = Some(none.view());
    for k in kernels() {
        assert!(matches!(
            k.forward(&p, Dtype::F32),
            Err(KernelError::Spec(SpecError::NoFiniteLogit { row: 0, .. }))
        ));
    }
    p.sampling_mask = None;
    assert_eq!(
        CpuKernel::chunked(0).forward(&p, Dtype::F32).unwrap_err(),
        KernelError::Spec(SpecError::ZeroChunkSize)
    );
    p.options.temperature = -1.0;
    assert!(matches!(
        CpuKernel::fused().forward(&p, Dtype::F32),
        Err(KernelError::Spec(SpecError::BadTemperature { .. }))
    ));
    // Input-dtype temperature overflowing f16 is the oracle's NonFiniteLogit.
    let xh = array![[f16::from_f64(60000.0), f16::from_f64(1.0)]];
    let mut p = Problem::new(Logits::F16(xh.view()));
    p.options.temperature = 0.5;
    p.options.temperature_dtype = TemperatureDtype::Input;
    let want = Oracle::default().forward(&p, Dtype::F32).unwrap_err();
    for k in kernels() {
        assert_eq!(
            k.forward(&p, Dtype::F32).unwrap_err(),
            KernelError::Spec(want.clone())
        );
    }
}

#[test]
fn vocab_parallel_with_empty_padding_and_masked_shards_matches_oracle() {
    let x = hand_rows();
    let xf = cast::<f32>(&x);
    let tokens = array![3i64, 0, 1, -100, 2];
    let ids = array![[3i64, 0], [5, 5], [0, 4], [0, 3], [1, 2]];
    // Column 2 (a whole shard in some layouts) is masked out in every row but row 0.
    let mask = Array2::from_shape_fn((5, 6), |(r, j)| j != 2 || r == 0);
    let tokens_m = array![3i64, 0, 1, -100, 3];
    let g = array![1.0, -0.5, 2.0, 3.0, 0.75];
    let h = array![0.5, 1.0, -1.25, 0.0, 2.0];
    let gk = array![
        [0.25, -1.0],
        [0.5, 0.5],
        [1.0, 1.0],
        [-0.5, 0.125],
        [2.0, -2.0]
    ];
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    let layouts: Vec<Box<dyn Kernel>> = vec![
        Box::new(CpuKernel::vocab_parallel(vec![6])),
        Box::new(CpuKernel::vocab_parallel(vec![2, 1, 0, 3])),
        Box::new(CpuKernel::vocab_parallel(vec![1, 1, 1, 1, 1, 1])),
        Box::new(CpuKernel::vocab_parallel(vec![0, 5, 1, 0])),
    ];
    for masked in [false, true] {
        let mut p = Problem::new(Logits::F32(xf.view()));
        p.topk_ids = Some(ids.view());
        p.tokens = Some(tokens.view());
        if masked {
            p.sampling_mask = Some(mask.view());
            p.tokens = Some(tokens_m.view());
        }
        check_forward_with(&p, Dtype::F32, &layouts);
        check_backward_with(&p, &cot, Dtype::F32, &layouts);
        p.options.temperature = 0.8;
        p.options.entropy = Some(EntropyLogits::Masked);
        check_forward_with(&p, Dtype::F32, &layouts);
        check_backward_with(&p, &cot, Dtype::F32, &layouts);
    }
    // Padded vocabulary: 8 columns, vocab_size 5; the last shard is all
    // padding (NaN, which must be ignored), the middle one half padding.
    let mut xp = Array2::<f32>::from_elem((5, 8), f32::NAN);
    xp.slice_mut(ndarray::s![.., ..5])
        .assign(&xf.slice(ndarray::s![.., ..5]));
    let tokens_p = array![3i64, 0, 1, -100, 2];
    let ids_p = array![[3i64, 0], [4, 4], [0, 4], [0, 3], [1, 2]];
    let mut p = Problem::new(Logits::F32(xp.view()));
    p.tokens = Some(tokens_p.view());
    p.topk_ids = Some(ids_p.view());
    p.options.vocab_size = Some(5);
    let padded: Vec<Box<dyn Kernel>> = vec![
        Box::new(CpuKernel::vocab_parallel(vec![3, 3, 2])),
        Box::new(CpuKernel::vocab_parallel(vec![4, 1, 3, 0])),
        Box::new(CpuKernel::fused()),
        Box::new(CpuKernel::chunked(2)),
    ];
    check_forward_with(&p, Dtype::F32, &padded);
    check_backward_with(&p, &cot, Dtype::F32, &padded);
}

#[test]
fn vocab_parallel_long_rows_match_oracle() {
    let mut rng = SplitMix64::new(5);
    let (n, v) = (2, 9000);
    let x = Array2::from_shape_fn((n, v), |_| (rng.normal() * 2.0) as f32);
    let tokens = array![8999i64, 0];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(tokens.view());
    let k: Vec<Box<dyn Kernel>> = vec![Box::new(CpuKernel::vocab_parallel(vec![
        4500, 0, 2047, 2453,
    ]))];
    check_forward_with(&p, Dtype::F32, &k);
}
