//! The property suite: the `cargo test` gate (DESIGN: "The properties").
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
        // Candle's composed baseline computes log-probs only (no lse / z_loss).
        let mut p = data.problem();
        (p.options.lse, p.options.z_loss_coef) = (false, None);
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

/// The shrunk counterexamples of the "live top-k id with a `-inf` logit"
/// bug in the gradient bound (TOLERANCE.md, T14), as explicit recipes (the
/// persisted seeds in `proptest-regressions/properties.txt` replay them only
/// while the strategies stay unchanged): each passes on every CPU kernel.
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
    };
    let kernels = cpu_kernels();
    let all_ok = |name: &str, verdicts: Vec<logprobe_testkit::checks::KernelOutcome>| {
        for v in verdicts {
            assert!(v.outcome.is_ok(), "{name}: {:?}", v.outcome.err());
        }
    };
    let grad_cases = [
        (
            recipe(
                38857229943635,
                1,
                2,
                Dtype::Bf16,
                RowKind::OneFinite,
                1.0,
                2,
            ),
            cot(685717487198060864, false),
        ),
        (
            recipe(38857229943635, 1, 2, Dtype::F32, RowKind::OneFinite, 0.7, 2),
            cot(541941830411870395, false),
        ),
    ];
    for c in &grad_cases {
        all_ok("gradients", (suite::gradients().check)(c, &kernels[..]));
    }
    let half = (
        recipe(
            15006590291666681833,
            4,
            17,
            Dtype::Bf16,
            RowKind::Mixed,
            1.0,
            5,
        ),
        cot(0, false),
    );
    all_ok(
        "bf16/f16",
        (suite::half_precision().check)(&half, &kernels[..]),
    );
    let edge = (
        recipe(
            9566175644258986413,
            2,
            2,
            Dtype::F32,
            RowKind::NegInf { rate: 0.5 },
            1.0,
            5,
        ),
        cot(4195840910578084705, true),
        None,
        0usize,
        7721055575usize,
    );
    all_ok("edges", (suite::edges().check)(&edge, &kernels[..]));
}
