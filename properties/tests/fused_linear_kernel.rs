//! The CPU fused linear + cross-entropy kernel (`logprobe_kernels::linear`,
//! issue 45) in the gate:
//!
//! - every output (log-probs, entropy, lse, and the LM head's gradients
//!   `grad_hidden`, `grad_lm_head_weight`, `grad_lm_head_bias`) passes
//!   verify (TOLERANCE.md (T29), (T30), `sequential` model) for every row
//!   and vocabulary chunking, bf16 and f32 inputs, with and without a bias,
//!   a temperature, a softcap, the logits kept in bf16 or f32;
//! - the forward and `grad_hidden` are bit-identical across chunkings (the
//!   vocabulary is walked in order whatever the chunk), the weight and bias
//!   gradients across vocabulary chunkings;
//! - each planted fault of the LM head's gradients fails verify.
//!
//! `PROPTEST_CASES` sets the number of drawn cases (default 32).

use half::bf16;
use logprobe_kernels::linear::{FusedLinear, LinearFault, LinearLogits, LinearProblem};
use logprobe_reference::spec::Dtype;
use logprobe_verify::dump::DumpTensor;
use logprobe_verify::tensors::{verify_tensors, TensorBytes};
use logprobe_verify::tolerance::Order;
use logprobe_verify::verify::{FileReport, ReportVerdict, VerifyConfig};
use ndarray::{Array1, Array2};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// One drawn problem.
#[derive(Clone, Debug)]
struct Case {
    n: usize,
    h: usize,
    v: usize,
    bf16: bool,
    bias: bool,
    logits: LinearLogits,
    temperature: f64,
    softcap: Option<f64>,
    seed: u64,
}

struct Inputs {
    hidden: Array2<f32>,
    weight: Array2<f32>,
    bias: Array1<f32>,
    tokens: Array1<i64>,
    cot: Vec<f64>,
}

fn splitmix(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

fn inputs(c: &Case) -> Inputs {
    let mut s = c.seed;
    let r = |x: f64| {
        if c.bf16 {
            bf16::from_f32(x as f32).to_f32()
        } else {
            x as f32
        }
    };
    let scale = 5.0 / (c.h as f64).sqrt();
    let hidden = Array2::from_shape_fn((c.n, c.h), |_| r(2.0 * splitmix(&mut s)));
    let weight = Array2::from_shape_fn((c.v, c.h), |_| r(scale * splitmix(&mut s)));
    let bias = Array1::from_shape_fn(c.v, |_| r(0.5 * splitmix(&mut s)));
    let tokens = Array1::from_shape_fn(c.n, |i| {
        if i == 2 {
            -100
        } else {
            ((splitmix(&mut s) + 1.0) / 2.0 * c.v as f64).min(c.v as f64 - 1.0) as i64
        }
    });
    let cot = (0..c.n).map(|_| splitmix(&mut s)).collect();
    Inputs {
        hidden,
        weight,
        bias,
        tokens,
        cot,
    }
}

fn problem<'a>(c: &Case, x: &'a Inputs) -> LinearProblem<'a> {
    LinearProblem {
        hidden: x.hidden.view(),
        weight: x.weight.view(),
        bias: c.bias.then(|| x.bias.view()),
        dtype: if c.bf16 { Dtype::Bf16 } else { Dtype::F32 },
        tokens: x.tokens.view(),
        temperature: c.temperature,
        softcap: c.softcap,
        ignore_index: -100,
    }
}

/// The kernel's outputs on `c` as a dump in memory, verified.
fn verified(c: &Case, k: &FusedLinear) -> FileReport {
    let x = inputs(c);
    let p = problem(c, &x);
    let fwd = k.forward(&p).expect("forward");
    let g = k.backward(&p, &x.cot).expect("backward");
    let dt = p.dtype;
    let f64s = |a: &[f32]| a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    let mut tensors = vec![
        (
            "hidden",
            DumpTensor::floats(dt, &[c.n, c.h], &f64s(x.hidden.as_slice().unwrap())),
        ),
        (
            "lm_head_weight",
            DumpTensor::floats(dt, &[c.v, c.h], &f64s(x.weight.as_slice().unwrap())),
        ),
        (
            "tokens",
            DumpTensor::i64s(&[c.n], x.tokens.as_slice().unwrap()),
        ),
        (
            "log_probs",
            DumpTensor::floats(Dtype::F32, &[c.n], &f64s(&fwd.log_probs)),
        ),
        (
            "entropy",
            DumpTensor::floats(Dtype::F32, &[c.n], &f64s(&fwd.entropy)),
        ),
        (
            "lse",
            DumpTensor::floats(Dtype::F32, &[c.n], &f64s(&fwd.lse)),
        ),
        (
            "grad_log_probs",
            DumpTensor::floats(Dtype::F64, &[c.n], &x.cot),
        ),
        (
            "grad_hidden",
            DumpTensor::floats(dt, &[c.n, c.h], &f64s(g.grad_hidden.as_slice().unwrap())),
        ),
        (
            "grad_lm_head_weight",
            DumpTensor::floats(dt, &[c.v, c.h], &f64s(g.grad_weight.as_slice().unwrap())),
        ),
    ];
    if c.bias {
        tensors.push((
            "lm_head_bias",
            DumpTensor::floats(dt, &[c.v], &f64s(x.bias.as_slice().unwrap())),
        ));
        tensors.push((
            "grad_lm_head_bias",
            DumpTensor::floats(dt, &[c.v], &f64s(&g.grad_bias)),
        ));
    }
    let views: Vec<(&str, TensorBytes<'_>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                *n,
                TensorBytes {
                    dtype: t.dtype,
                    shape: &t.shape,
                    data: &t.data,
                },
            )
        })
        .collect();
    let (t, cap) = (c.temperature.to_string(), c.softcap.map(|v| v.to_string()));
    let mut meta = vec![("temperature", t.as_str())];
    if let Some(cap) = &cap {
        meta.push(("softcap", cap.as_str()));
    }
    if k.logits == LinearLogits::Accumulation {
        meta.push(("lm_head_logits_dtype", "accumulation"));
    }
    let config = VerifyConfig {
        model: Order::Sequential,
        ..VerifyConfig::default()
    };
    verify_tensors(&views, &meta, "fused_linear_kernel", &config).expect("a valid dump")
}

fn case_strategy() -> impl Strategy<Value = (Case, usize, usize)> {
    (
        1usize..9,
        1usize..48,
        1usize..300,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(1.0), Just(0.7), Just(2.0)],
        prop_oneof![Just(None), Just(Some(5.0))],
        any::<u64>(),
        1usize..6,
        1usize..64,
    )
        .prop_map(
            |(n, h, v, bf, bias, acc, temperature, softcap, seed, rc, vc)| {
                let c = Case {
                    n,
                    h,
                    v,
                    bf16: bf,
                    bias,
                    logits: if acc {
                        LinearLogits::Accumulation
                    } else {
                        LinearLogits::Input
                    },
                    temperature,
                    softcap,
                    seed,
                };
                (c, rc, vc)
            },
        )
}

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/proptest-regressions/fused_linear_kernel.txt"
        )))),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_output_passes_verify_for_every_chunking((c, rc, vc) in case_strategy()) {
        let k = FusedLinear::new(rc, vc, c.logits);
        let r = verified(&c, &k);
        prop_assert_eq!(r.verdict, ReportVerdict::Pass, "{:?} rc {} vc {}: {:#?}", c, rc, vc, r.outputs);
        prop_assert!(r.outputs.iter().all(|o| o.count > 0 || o.output == "log_probs"));
    }

    #[test]
    fn forward_and_grad_hidden_are_bit_invariant_across_chunkings((c, rc, vc) in case_strategy()) {
        let x = inputs(&c);
        let p = problem(&c, &x);
        let a = FusedLinear::new(rc, vc, c.logits);
        let b = FusedLinear::new(c.n.max(1), c.v.max(1), c.logits);
        prop_assert_eq!(a.forward(&p).unwrap(), b.forward(&p).unwrap());
        let (ga, gb) = (a.backward(&p, &x.cot).unwrap(), b.backward(&p, &x.cot).unwrap());
        prop_assert_eq!(&ga.grad_hidden, &gb.grad_hidden);
        // The weight and bias gradients: the same rows per chunk, any vocabulary chunking.
        let d = FusedLinear::new(rc, c.v.max(1), c.logits).backward(&p, &x.cot).unwrap();
        prop_assert_eq!(&ga.grad_weight, &d.grad_weight);
        prop_assert_eq!(&ga.grad_bias, &d.grad_bias);
    }
}

#[test]
fn each_planted_lm_head_gradient_fault_fails() {
    for (fault, logits, softcap) in [
        (
            LinearFault::Bf16GradAccumulation,
            LinearLogits::Accumulation,
            None,
        ),
        (LinearFault::DroppedRemainder, LinearLogits::Input, None),
        (LinearFault::BiasForwardOnly, LinearLogits::Input, None),
        (
            LinearFault::SoftcapBackwardMissing,
            LinearLogits::Input,
            Some(5.0),
        ),
    ] {
        let c = Case {
            n: 23,
            h: 32,
            v: 300,
            bf16: true,
            bias: true,
            logits,
            temperature: 1.0,
            softcap,
            seed: 45_02,
        };
        let ok = FusedLinear::new(2, 64, logits);
        assert_eq!(
            verified(&c, &ok).verdict,
            ReportVerdict::Pass,
            "{fault:?}: the correct kernel"
        );
        let bad = FusedLinear { fault, ..ok };
        let r = verified(&c, &bad);
        assert_eq!(
            r.verdict,
            ReportVerdict::Fail,
            "{fault:?}: {:#?}",
            r.outputs
        );
    }
}

#[test]
fn bad_chunk_sizes_and_tokens_are_typed_errors() {
    let c = Case {
        n: 3,
        h: 4,
        v: 5,
        bf16: false,
        bias: false,
        logits: LinearLogits::Input,
        temperature: 1.0,
        softcap: None,
        seed: 1,
    };
    let mut x = inputs(&c);
    let p = problem(&c, &x);
    let e = FusedLinear::new(0, 4, c.logits).forward(&p).unwrap_err();
    assert!(e.to_string().contains("chunk size of 0"), "{e}");
    x.tokens[0] = 5;
    let p = problem(&c, &x);
    let e = FusedLinear::new(1, 4, c.logits).forward(&p).unwrap_err();
    assert!(e.to_string().contains('5'), "{e}");
}
