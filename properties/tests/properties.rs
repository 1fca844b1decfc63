//! The property suite: the `cargo test` gate (docs/design.md, "The properties").
//! Each test runs one property on every CPU kernel; failures shrink to a
//! minimal recipe and persist in `proptest-regressions/properties.txt`.
//! `PROPTEST_CASES` replaces every default case count.

use logprobe_reference::spec::Output;
use logprobe_testkit::checks::gate;
use logprobe_testkit::suite::{self, cpu_families, cpu_kernels};

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/proptest-regressions/properties.txt"
);

#[test]
fn log_probs_agree_with_oracle_within_bound() {
    gate(&suite::agreement(), &cpu_kernels(), REGRESSIONS);
}

#[test]
fn loss_agrees_with_oracle_within_bound() {
    gate(&suite::loss(), &cpu_kernels(), REGRESSIONS);
}

#[test]
fn chunk_size_is_bit_invariant() {
    gate(&suite::chunk_invariance(), &cpu_families(), REGRESSIONS);
}

#[test]
fn gradients_match_oracle_vjp() {
    gate(&suite::gradients(), &cpu_kernels(), REGRESSIONS);
}

#[test]
fn bf16_f16_inputs_and_outputs_within_bound() {
    gate(&suite::half_precision(), &cpu_kernels(), REGRESSIONS);
}

#[test]
fn vocab_parallel_shardings_match_oracle() {
    gate(
        &suite::vocab_parallel(),
        &suite::sharded_families(),
        REGRESSIONS,
    );
}

#[test]
fn edges_give_defined_values_or_typed_errors() {
    gate(&suite::edges(), &cpu_kernels(), REGRESSIONS);
}

#[test]
fn inputs_unchanged_after_non_in_place_calls() {
    gate(&suite::inputs_unchanged(), &cpu_kernels(), REGRESSIONS);
}

/// Tightness (fixed seed, default case count): on the generators, the worst
/// f32 error / bound of fused and chunked for log-probs and entropy lies in
/// `[1/64, 1]`, so the bounds can neither be broken nor silently loosen.
#[test]
fn f32_bounds_are_tight_on_the_generators() {
    use logprobe_kernels::kernel::Kernel;
    use logprobe_kernels::CpuKernel;
    use logprobe_testkit::checks::survey;
    let kernels: Vec<Box<dyn Kernel>> = vec![
        Box::new(CpuKernel::fused()),
        Box::new(CpuKernel::chunked(64)),
    ];
    let property = suite::agreement();
    for s in survey(&property, &kernels[..], Some(property.cases), 0) {
        assert_eq!(s.failures, 0, "{}: {:?}", s.kernel, s.first_failure);
        let r = s.ratios;
        eprintln!(
            "{}: worst f32 error/bound: log_probs {:.4}, entropy {:.4}, top-k {:.4}",
            s.kernel,
            r.get(Output::LogProbs),
            r.get(Output::Entropy),
            r.get(Output::TopkLogProbs)
        );
        for what in [Output::LogProbs, Output::Entropy] {
            let q = r.get(what);
            assert!(
                (1.0 / 64.0..=1.0).contains(&q),
                "{}: worst {what} error/bound {q} outside [1/64, 1]",
                s.kernel
            );
        }
    }
}

/// The candle-composed baseline through the same checks as an external
/// implementation: f32 within its declared bound; bf16 and f16 at
/// V = 152064 (near-uniform rows) out of bound, their log-sum-exp some nats
/// off (candle-core 0.11.1 sums in the input dtype).
#[test]
fn candle_baseline_bf16_f16_logsumexp_out_of_bound_at_real_vocab() {
    use logprobe_kernels::candle::CandleComposed;
    use logprobe_kernels::kernel::Kernel;
    use logprobe_reference::spec::Dtype;
    use logprobe_testkit::cache::OracleCase;
    use logprobe_testkit::checks::judge_forward;
    use logprobe_testkit::strategies::{ProblemRecipe, RowKind};
    for (dtype, min_nats) in [
        (Dtype::F32, None),
        (Dtype::Bf16, Some(2.0)),
        (Dtype::F16, Some(1.0)),
    ] {
        let mut r = ProblemRecipe::plain(7, 1, 152064);
        r.dtype = dtype;
        r.kind = RowKind::WideGaussian { sigma: 1.0 };
        r.entropy = None;
        let data = r.expand();
        let oc = OracleCase::compute(&data);
        let verdict = judge_forward(&CandleComposed, &data, &oc, Dtype::F32, false);
        // Candle's composed baseline computes log-probs only (no lse /
        // z_loss, no policy terms, no token ranks).
        let mut p = data.problem();
        (p.options.lse, p.options.z_loss_coef) = (false, None);
        p.options.token_ranks = false;
        p.policy = Default::default();
        let lp = CandleComposed.forward(&p, Dtype::F32).unwrap().values[Output::LogProbs][[0, 0]];
        let exact = oc.forward.as_ref().unwrap().values[Output::LogProbs][[0, 0]];
        // log_prob = x_t - lse: the log-prob's error is the log-sum-exp's.
        let err = exact.error(lp);
        eprintln!(
            "candle {dtype} V=152064: log-sum-exp off by {err:.3} nats; verdict {:?}",
            verdict.as_ref().err()
        );
        match min_nats {
            None => assert!(verdict.is_ok(), "candle f32 out of its bound: {verdict:?}"),
            Some(m) => {
                assert!(verdict.is_err(), "candle {dtype} passed");
                assert!(err >= m, "candle {dtype} only {err} nats off");
            }
        }
    }
}

/// Every forward output (log-probs, entropy, top-k, lse, z_loss and the
/// cross-entropy loss, mean with label smoothing 0.1) on f32, bf16 and f16
/// logits at V = 152064 with Gemma 2's softcap c = 30, exact and
/// materialised in the input dtype, within each CPU kernel's bound (out in
/// f32 and in the logits' dtype). Pinned rather than drawn: the gate's
/// real-V cases are 1 in 21 and softcapped 1 in 8, so a dtype can go
/// without one in a run. Wide rows (sd 12) reach the cap's saturation.
#[test]
fn softcapped_real_vocab_rows_every_output_within_bound() {
    use logprobe_reference::spec::{Dtype, MeanAllIgnored, Reduction, SoftcapDtype};
    use logprobe_testkit::cache::oracle_case;
    use logprobe_testkit::checks::{judge_forward, judge_loss, LossOracle};
    use logprobe_testkit::strategies::{LossRecipe, ProblemRecipe, RowKind};
    let kernels = cpu_kernels();
    for (i, (dtype, mode)) in [
        (Dtype::F32, SoftcapDtype::Accumulation),
        (Dtype::Bf16, SoftcapDtype::Accumulation),
        (Dtype::Bf16, SoftcapDtype::Input),
        (Dtype::F16, SoftcapDtype::Accumulation),
        (Dtype::F16, SoftcapDtype::Input),
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = ProblemRecipe::plain(40 + i as u64, 2, 152064);
        r.dtype = dtype;
        r.kind = RowKind::WideGaussian { sigma: 12.0 };
        r.softcap = Some(30.0);
        r.softcap_dtype = mode;
        r.topk = 4;
        let mut data = r.expand();
        // Every output is asked: the soft cross-entropy against a uniform teacher.
        data.teacher_probs.get_or_insert_with(|| {
            ndarray::Array2::from_elem((2, 152064), f64::from(1.0f32 / 152064.0))
        });
        let loss = LossRecipe {
            seed: 7,
            reduction: Reduction::Mean,
            label_smoothing: 0.1,
            mean_all_ignored: MeanAllIgnored::Nan,
            weights: None,
        }
        .expand(r.n);
        loss.ask(&mut data);
        let key = format!("{r:?} pinned softcap");
        let oc = oracle_case(&key, &data);
        let oracle = LossOracle::compute(&data, &loss, oc.clone());
        let of = oc.forward.as_ref().expect("oracle forward");
        for o in Output::FORWARD {
            assert!(of.values.contains(o), "{dtype} {mode:?}: oracle lacks {o}");
        }
        for k in &kernels {
            for out in [Dtype::F32, dtype] {
                let name = k.name();
                judge_forward(k.as_ref(), &data, &oc, out, false)
                    .unwrap_or_else(|e| panic!("{name} {dtype} {mode:?} out {out}: {e}"));
                judge_loss(k.as_ref(), &data, &loss, &oracle, out)
                    .unwrap_or_else(|e| panic!("{name} {dtype} {mode:?} loss out {out}: {e}"));
            }
        }
    }
}

/// The loss side's gradients (`grad_lse`, `grad_z_loss` and `grad_loss`
/// of a label-smoothed mean with an ignored row, beside `grad_log_probs`)
/// on f32, bf16 and f16 logits at V = 152064, within each CPU kernel's
/// bound (T14 + T19), out of place in f32 and in the logits' dtype and in
/// place. Pinned rather than drawn: the gate reaches real V in about 1 case
/// in 21, and only half its gradient cases carry the loss side.
#[test]
fn real_vocab_loss_gradients_within_bound() {
    use logprobe_reference::spec::{Dtype, MeanAllIgnored, Reduction};
    use logprobe_testkit::cache::oracle_case;
    use logprobe_testkit::checks::judge_backward;
    use logprobe_testkit::strategies::{CotangentRecipe, LossRecipe, ProblemRecipe, RowKind};
    let kernels = cpu_kernels();
    for (i, dtype) in [Dtype::F32, Dtype::Bf16, Dtype::F16]
        .into_iter()
        .enumerate()
    {
        let mut r = ProblemRecipe::plain(60 + i as u64, 3, 152064);
        r.dtype = dtype;
        r.kind = RowKind::WideGaussian { sigma: 4.0 };
        r.ignore_rate = 0.34;
        let cr = CotangentRecipe {
            seed: 11 + i as u64,
            log_probs: true,
            entropy: false,
            topk: false,
            loss: true,
            policy: false,
            kl: false,
        };
        let loss = LossRecipe {
            seed: 5,
            reduction: Reduction::Mean,
            label_smoothing: 0.1,
            mean_all_ignored: MeanAllIgnored::Nan,
            weights: None,
        }
        .expand(r.n);
        let mut data = r.expand();
        cr.ask(&mut data, &loss);
        let cot = cr.expand(&data);
        assert!(
            cot.grad_lse.is_some() && cot.grad_z_loss.is_some() && cot.grad_loss.is_some(),
            "{dtype}: the loss side's cotangents were not all drawn"
        );
        let key = format!("{r:?}{} pinned real-V loss grads", cr.ask_key());
        let oc = oracle_case(&key, &data);
        let vkey = format!("{r:?}{cr:?} pinned real-V loss grads");
        for k in &kernels {
            let name = k.name();
            for out in [Dtype::F32, dtype] {
                judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, out, false, false)
                    .unwrap_or_else(|e| panic!("{name} {dtype} out {out}: {e}"));
            }
            judge_backward(k.as_ref(), &data, &cot, &oc, &vkey, dtype, true, false)
                .unwrap_or_else(|e| panic!("{name} {dtype} in place: {e}"));
        }
    }
}

#[test]
fn zero_chunk_size_is_a_typed_error() {
    use logprobe_kernels::kernel::{Kernel, KernelError};
    use logprobe_kernels::CpuKernel;
    use logprobe_reference::spec::{Dtype, SpecError};
    use logprobe_testkit::strategies::{CotangentRecipe, ProblemRecipe};
    let data = ProblemRecipe::plain(3, 4, 10).expand();
    let cot = CotangentRecipe {
        seed: 1,
        log_probs: true,
        entropy: false,
        topk: false,
        loss: false,
        policy: false,
        kl: false,
    }
    .expand(&data);
    let k = CpuKernel::chunked(0);
    assert_eq!(
        k.forward(&data.problem(), Dtype::F32).unwrap_err(),
        KernelError::Spec(SpecError::ZeroChunkSize)
    );
    assert_eq!(
        k.backward(&data.problem(), &cot.view(), Dtype::F32)
            .unwrap_err(),
        KernelError::Spec(SpecError::ZeroChunkSize)
    );
}

/// The first seed `s` (from 0) at which `make(s)` expands to a live top-k
/// id (non-zero cotangent) on a `-inf` logit: the feature a shrunk case
/// pinned, found again whatever the generators' stream.
fn live_neg_inf_topk(
    make: impl Fn(
        u64,
    ) -> (
        logprobe_testkit::strategies::ProblemRecipe,
        logprobe_testkit::strategies::CotangentRecipe,
    ),
) -> (
    logprobe_testkit::strategies::ProblemRecipe,
    logprobe_testkit::strategies::CotangentRecipe,
) {
    for s in 0..2000 {
        let (r, cr) = make(s);
        let data = r.expand();
        let cot = cr.expand(&data);
        let (Some(ids), Some(g)) = (&data.topk_ids, &cot.grad_topk_log_probs) else {
            continue;
        };
        let x = data.logits.to_f64();
        if ids
            .indexed_iter()
            .any(|((i, k), &j)| x[[i, j as usize]] == f64::NEG_INFINITY && g[[i, k]] != 0.0)
        {
            return (r, cr);
        }
    }
    panic!("no seed below 2000 gives a live top-k id on a -inf logit");
}

/// The shrunk counterexamples of the "live top-k id with a `-inf` logit"
/// bug in the gradient bound (TOLERANCE.md, T14) as explicit recipes (the
/// persisted seeds of `proptest-regressions/properties.txt` replayed them
/// only while the strategies stayed unchanged), each at the first seed
/// whose expansion has such an id: each passes on every CPU kernel.
#[test]
fn live_topk_ids_with_neg_inf_logits_shrunk_cases_pass() {
    use logprobe_reference::spec::{Dtype, EntropyLogits, TemperatureDtype};
    use logprobe_testkit::strategies::{CotangentRecipe, Offset, PadFill, ProblemRecipe, RowKind};
    let recipe = |seed, n, vocab_size, dtype, kind, temperature, topk| ProblemRecipe {
        seed,
        n,
        vocab_size,
        padding: 0,
        pad_fill: PadFill::Large,
        dtype,
        kind,
        offset: Offset::Zero,
        mask_rate: None,
        temperature,
        temperature_dtype: TemperatureDtype::Accumulation,
        softcap: None,
        softcap_dtype: logprobe_reference::spec::SoftcapDtype::Accumulation,
        tokens: true,
        ignore_rate: 0.0,
        ignore_index: -100,
        topk,
        topk_true: false,
        entropy: Some(EntropyLogits::Unmasked),
    };
    let cot = |seed, entropy| CotangentRecipe {
        seed,
        log_probs: false,
        entropy,
        topk: true,
        loss: false,
        policy: false,
        kl: false,
    };
    let kernels = cpu_kernels();
    let all_ok = |name: &str, verdicts: Vec<logprobe_testkit::checks::KernelOutcome>| {
        for v in verdicts {
            assert!(v.outcome.is_ok(), "{name}: {:?}", v.outcome.err());
        }
    };
    // The gradient property's two (bf16 and f32 at T = 0.7; the first was
    // persisted in properties.txt by the first checkpoint).
    let grad_cases = [
        live_neg_inf_topk(|s| {
            (
                recipe(s, 1, 2, Dtype::Bf16, RowKind::OneFinite, 1.0, 2),
                cot(s, false),
            )
        }),
        live_neg_inf_topk(|s| {
            (
                recipe(s, 1, 2, Dtype::F32, RowKind::OneFinite, 0.7, 2),
                cot(s, false),
            )
        }),
    ];
    for c in &grad_cases {
        all_ok("gradients", (suite::gradients().check)(c, &kernels[..]));
    }
    let half = live_neg_inf_topk(|s| {
        (
            recipe(s, 4, 17, Dtype::Bf16, RowKind::Mixed, 1.0, 5),
            cot(s, false),
        )
    });
    all_ok(
        "bf16/f16",
        (suite::half_precision().check)(&half, &kernels[..]),
    );
    // The edge property's (persisted in properties.txt by the first
    // checkpoint).
    let (r, cr) = live_neg_inf_topk(|s| {
        (
            recipe(s, 2, 2, Dtype::F32, RowKind::NegInf { rate: 0.5 }, 1.0, 5),
            cot(s, true),
        )
    });
    let edge = (r, cr, None, 0usize, 7721055575usize);
    all_ok("edges", (suite::edges().check)(&edge, &kernels[..]));
}

/// The other shrunk cases once persisted in
/// `proptest-regressions/properties.txt` (their seeds replay other cases
/// since the recipes draw from SplitMix64), as explicit recipes. Each has
/// `V = 1` or `N = 0`, so its expansion draws nothing that matters: the
/// very problem that failed. Each passes on every CPU kernel (family).
#[test]
fn once_persisted_shrunk_cases_pass() {
    use logprobe_reference::spec::{Dtype, EntropyLogits, TemperatureDtype};
    use logprobe_testkit::strategies::{
        BadInput, CotangentRecipe, LossRecipe, Offset, PadFill, ProblemRecipe, RowKind,
    };
    let recipe = |n, dtype, kind, offset, temperature, temperature_dtype| ProblemRecipe {
        seed: 0,
        n,
        vocab_size: 1,
        padding: 0,
        pad_fill: PadFill::Large,
        dtype,
        kind,
        offset,
        mask_rate: None,
        temperature,
        temperature_dtype,
        tokens: true,
        ignore_rate: 0.0,
        ignore_index: -100,
        topk: 0,
        topk_true: false,
        entropy: Some(EntropyLogits::Unmasked),
        softcap: None,
        softcap_dtype: logprobe_reference::spec::SoftcapDtype::Accumulation,
    };
    let no_cot = CotangentRecipe {
        seed: 0,
        log_probs: false,
        entropy: false,
        topk: false,
        loss: false,
        policy: false,
        kl: false,
    };
    let acc = TemperatureDtype::Accumulation;
    let llm0 = RowKind::LlmLike { entropy: 0.0 };
    let top = Offset::Extreme { negative: false };
    let all_ok = |name: &str, verdicts: Vec<logprobe_testkit::checks::KernelOutcome>| {
        assert!(!verdicts.is_empty(), "{name}: no kernel");
        for v in verdicts {
            assert!(v.outcome.is_ok(), "{name}: {:?}", v.outcome.err());
        }
    };
    let kernels = cpu_kernels();
    // z_loss = 1e-4 * lse^2 past the dtype's range (lse = 1e30 in f32,
    // 1e300 in f64): the kernel's infinity is the correctly rounded value
    // (the judge's infinity rule; T16 saturating at f64::MAX).
    for dtype in [Dtype::F32, Dtype::F64] {
        let r = recipe(1, dtype, llm0, top, 1.0, acc);
        let data = r.expand();
        let x = data.logits.to_f64()[[0, 0]];
        assert!(x >= 1e30 && data.tokens.as_ref().unwrap()[0] == 0, "{r:?}");
        all_ok("agreement", (suite::agreement().check)(&r, &kernels[..]));
    }
    // f64 logits, N = 0: every chunked family (the host-built CUDA ones
    // refuse f64 with an error holding the chunk size, which must compare
    // equal across chunk sizes).
    let r = recipe(0, Dtype::F64, llm0, Offset::Zero, 1.0, acc);
    all_ok(
        "chunk invariance",
        (suite::chunk_invariance().check)(&(r, no_cot, 0), &cpu_families()[..]),
    );
    // f16 65504 at T = 0.7 in the input dtype: `logits / temperature`
    // overflows f16, a typed error naming that tensor on every kernel.
    let r = recipe(
        1,
        Dtype::F16,
        RowKind::AllEqual,
        top,
        0.7,
        TemperatureDtype::Input,
    );
    assert_eq!(r.expand().logits.to_f64()[[0, 0]], 65504.0);
    all_ok(
        "edges",
        (suite::edges().check)(&(r.clone(), no_cot, None, 0, 52662319592), &kernels[..]),
    );
    // The same overflowing row with no cotangent at all (found by the
    // SplitMix64 stream, persisted): the backward's error is the
    // cotangents' (the oracle's VJP and every kernel check shapes, then
    // cotangents, then the rows' values), not the forward's.
    all_ok(
        "edges",
        (suite::edges().check)(
            &(r, no_cot, Some(BadInput::NoCotangent), 0, 0),
            &kernels[..],
        ),
    );
    // The loss property, N = 0 without tokens: a kernel that does not
    // compute the loss is not asked for it, so the loss's own error (no
    // tokens) is not expected of it.
    let mut r = recipe(0, Dtype::F32, llm0, Offset::Zero, 1.0, acc);
    r.tokens = false;
    all_ok(
        "loss",
        (suite::loss().check)(&(r, LossRecipe::plain(0)), &kernels[..]),
    );
}
