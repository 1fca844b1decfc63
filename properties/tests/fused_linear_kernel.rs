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
//! - each planted fault of the LM head's gradients fails verify;
//! - the TP kernel (`ShardedLinear`, uneven vocabulary shards of `W`)
//!   passes verify too, and its planted shard-offset fault fails.
//!
//! `PROPTEST_CASES` sets the number of drawn cases (default 32).

use logprobe_kernels::linear::{FusedLinear, LinearFault, LinearLogits, ShardFault, ShardedLinear};
use logprobe_testkit::linear::{verify_linear, LinearInputs, LinearRecipe};
use logprobe_verify::tolerance::Order;
use logprobe_verify::verify::{FileReport, ReportVerdict};
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

fn inputs(c: &Case) -> LinearInputs {
    let mut x = LinearRecipe {
        seed: c.seed,
        n: c.n,
        h: c.h,
        v: c.v,
        bf16: c.bf16,
        bias: c.bias,
        logits: c.logits,
        temperature: c.temperature,
        softcap: c.softcap,
        hidden_scale: 2.0,
        weight_scale: 5.0,
        bias_scale: 0.5,
        bias_offset: 0.0,
        ignore: 0.15,
    }
    .inputs();
    // At least one row with a target, so that log-probs are judged.
    if x.tokens.iter().all(|&t| t < 0) {
        x.tokens[0] = 0;
    }
    x
}

/// The kernel's outputs on `c`, verified under `sequential`.
fn verified(c: &Case, k: &FusedLinear) -> FileReport {
    let x = inputs(c);
    let p = x.problem();
    let fwd = k.forward(&p).expect("forward");
    let g = k.backward(&p, &x.cot).expect("backward");
    verify_linear(&x, &fwd, Some(&g), Order::Sequential).expect("a valid dump")
}

/// The TP kernel's outputs on `c` over shards of `widths`, verified.
fn verified_sharded(c: &Case, k: &ShardedLinear) -> FileReport {
    let x = inputs(c);
    let p = x.problem();
    let fwd = k.forward(&p).expect("forward");
    let g = k.backward(&p, &x.cot).expect("backward");
    verify_linear(&x, &fwd, Some(&g), Order::Sequential).expect("a valid dump")
}

/// Uneven widths summing to `v` from `seed` (empty shards allowed).
fn widths(v: usize, shards: usize, seed: u64) -> Vec<usize> {
    logprobe_testkit::strategies::ShardLayout::generate(seed, shards, v, false).widths
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
    fn the_tp_kernel_passes_verify_over_uneven_shards((c, rc, vc) in case_strategy(), shards in 1usize..6) {
        let k = ShardedLinear::new(FusedLinear::new(rc, vc, c.logits), widths(c.v, shards, c.seed));
        let r = verified_sharded(&c, &k);
        prop_assert_eq!(r.verdict, ReportVerdict::Pass, "{:?} rc {} vc {} widths {:?}: {:#?}", c, rc, vc, k.widths, r.outputs);
    }

    #[test]
    fn forward_and_grad_hidden_are_bit_invariant_across_chunkings((c, rc, vc) in case_strategy()) {
        let x = inputs(&c);
        let p = x.problem();
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
fn a_shard_that_does_not_shift_the_target_fails() {
    let c = Case {
        n: 23,
        h: 32,
        v: 300,
        bf16: true,
        bias: true,
        logits: LinearLogits::Input,
        temperature: 1.0,
        softcap: None,
        seed: 45_03,
    };
    let ok = ShardedLinear::new(FusedLinear::new(4, 64, c.logits), vec![100, 0, 120, 80]);
    assert_eq!(verified_sharded(&c, &ok).verdict, ReportVerdict::Pass);
    let bad = ShardedLinear {
        fault: ShardFault::TargetNotShifted,
        ..ok
    };
    assert_eq!(verified_sharded(&c, &bad).verdict, ReportVerdict::Fail);
}

#[test]
fn bad_chunk_sizes_tokens_and_widths_are_typed_errors() {
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
    let e = FusedLinear::new(0, 4, c.logits)
        .forward(&x.problem())
        .unwrap_err();
    assert!(e.to_string().contains("chunk size of 0"), "{e}");
    let e = ShardedLinear::new(FusedLinear::new(1, 4, c.logits), vec![2, 2])
        .forward(&x.problem())
        .unwrap_err();
    assert!(e.to_string().contains("lm_head_weight"), "{e}");
    let e = FusedLinear::new(1, 4, c.logits)
        .backward(&x.problem(), &[0.5])
        .unwrap_err();
    assert!(e.to_string().contains("grad_log_probs"), "{e}");
    x.tokens[0] = 5;
    let e = FusedLinear::new(1, 4, c.logits)
        .forward(&x.problem())
        .unwrap_err();
    assert!(e.to_string().contains('5'), "{e}");
}

/// A dump whose LM head is generated (`lm_head_weight_generator`,
/// `dump::weights_generator`) is judged exactly as the dump holding the
/// generated tensor, and each way its keys can be wrong is a typed error.
mod generated_weights {
    use super::*;
    use logprobe_verify::dump::weights_generator::{
        Distribution, GeneratedDtype, WeightsGenerator,
    };
    use logprobe_verify::tensors::{to_dump_bytes, TensorBytes};
    use logprobe_verify::verify::{verify_file, VerifyConfig};
    use safetensors::SafeTensors;

    fn comparable(r: &FileReport) -> serde_json::Value {
        let mut v = serde_json::to_value(r).expect("serialisable");
        for k in ["seconds", "path", "name"] {
            v.as_object_mut().expect("an object").remove(k);
        }
        v
    }

    /// The dump's tensors but `lm_head_weight`, and its metadata plus `meta`.
    fn without_weight(full: &[u8], meta: &[(&str, String)], keep_weight: bool) -> Vec<u8> {
        let st = SafeTensors::deserialize(full).expect("valid");
        let (_, header) = SafeTensors::read_metadata(full).expect("header");
        let mut m: Vec<(String, String)> = header
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        m.extend(meta.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let m: Vec<(&str, &str)> = m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let kept: Vec<_> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| keep_weight || n != "lm_head_weight")
            .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
            .collect();
        let views: Vec<(&str, TensorBytes<'_>)> = kept
            .iter()
            .map(|(n, d, s, b)| {
                let t = TensorBytes {
                    dtype: *d,
                    shape: s,
                    data: b,
                };
                (n.as_str(), t)
            })
            .collect();
        to_dump_bytes(&views, &m).expect("writable")
    }

    #[test]
    fn a_generated_lm_head_is_judged_as_the_tensor_it_generates() {
        let c = Case {
            n: 6,
            h: 48,
            v: 300,
            bf16: true,
            bias: true,
            logits: LinearLogits::Input,
            temperature: 1.0,
            softcap: None,
            seed: 3,
        };
        let mut x = inputs(&c);
        for (dist, dtype) in [
            (Distribution::Normal, GeneratedDtype::Bf16),
            (Distribution::Uniform, GeneratedDtype::Bf16),
        ] {
            let gen = WeightsGenerator {
                distribution: dist,
                seed: 0xC0FFEE,
                scale: 0.3,
                shape: [c.v, c.h],
                dtype,
            };
            let bytes = gen.generate().expect("small");
            x.weight = ndarray::Array2::from_shape_fn((c.v, c.h), |(r, k)| {
                gen.value((r * c.h + k) as u64) as f32
            });
            let k = FusedLinear::new(4, 64, c.logits);
            let p = x.problem();
            let (fwd, g) = (k.forward(&p).unwrap(), k.backward(&p, &x.cot).unwrap());
            let full = logprobe_testkit::linear::linear_dump(&x, &fwd, Some(&g), &[]).unwrap();
            // The generated bytes are the tensor the dump holds.
            let st = SafeTensors::deserialize(&full).unwrap();
            assert_eq!(
                st.tensor("lm_head_weight").unwrap().data(),
                bytes.as_slice()
            );

            let dir = std::env::temp_dir().join(format!("logprobe-gen-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let write = |name: &str, b: &[u8]| {
                let path = dir.join(name);
                std::fs::write(&path, b).unwrap();
                path
            };
            let cfg = VerifyConfig::default();
            let whole = verify_file(&write("whole.safetensors", &full), &cfg).unwrap();
            let meta = gen.metadata(&bytes);
            let named = verify_file(
                &write("gen.safetensors", &without_weight(&full, &meta, false)),
                &cfg,
            )
            .unwrap();
            assert_eq!(whole.verdict, ReportVerdict::Pass, "{:#?}", whole.outputs);
            assert_eq!(comparable(&whole), comparable(&named));

            // Each wrong key is a typed error naming it.
            let with = |key: &str, value: &str| -> Vec<(&'static str, String)> {
                meta.iter()
                    .map(|(k, v)| {
                        (
                            *k,
                            if *k == key {
                                value.to_string()
                            } else {
                                v.clone()
                            },
                        )
                    })
                    .collect()
            };
            let err = |m: &[(&str, String)], keep: bool| {
                let path = write("bad.safetensors", &without_weight(&full, m, keep));
                verify_file(&path, &cfg).unwrap_err().to_string()
            };
            let e = err(&with("lm_head_weight_seed", "12"), false);
            assert!(e.contains("not the weights the dump was made with"), "{e}");
            let e = err(&with("lm_head_weight_scale", "-1"), false);
            assert!(e.contains("lm_head_weight_scale"), "{e}");
            let e = err(&with("lm_head_weight_shape", "300;48"), false);
            assert!(e.contains("lm_head_weight_shape"), "{e}");
            let e = err(
                &with("lm_head_weight_shape", "4000000000,4000000000"),
                false,
            );
            assert!(e.contains("exceed this machine's memory"), "{e}");
            let e = err(&with("lm_head_weight_generator", "mt19937"), false);
            assert!(e.contains("lm_head_weight_generator"), "{e}");
            let e = err(&meta, true);
            assert!(e.contains("give the LM head once"), "{e}");
            let no_hash: Vec<_> = meta
                .iter()
                .filter(|(k, _)| *k != "lm_head_weight_sha256")
                .cloned()
                .collect();
            let e = err(&no_hash, false);
            assert!(e.contains("needs `lm_head_weight_sha256`"), "{e}");
            let no_seed: Vec<_> = meta
                .iter()
                .filter(|(k, _)| *k != "lm_head_weight_seed")
                .cloned()
                .collect();
            let e = err(&no_seed, false);
            assert!(e.contains("needs `lm_head_weight_seed`"), "{e}");
            let stray = vec![("lm_head_weight_seed", "3".to_string())];
            let e = err(&stray, true);
            assert!(e.contains("without `lm_head_weight_generator`"), "{e}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// The generated values are distributed as declared: the sample mean and
    /// variance of 2^20 draws within 6 standard errors, and the uniform
    /// inside `[-scale, scale)`.
    #[test]
    fn generated_values_follow_their_distribution() {
        let n = 1u64 << 20;
        for dist in [Distribution::Normal, Distribution::Uniform] {
            let gen = WeightsGenerator {
                distribution: dist,
                seed: 42,
                scale: 2.0,
                shape: [1, n as usize],
                dtype: GeneratedDtype::F32,
            };
            let (mut s1, mut s2) = (0.0f64, 0.0f64);
            for i in 0..n {
                let x = gen.value_f64(i);
                if dist == Distribution::Uniform {
                    assert!((-2.0..2.0).contains(&x), "{x}");
                }
                s1 += x;
                s2 += x * x;
            }
            let mean = s1 / n as f64;
            let var = s2 / n as f64 - mean * mean;
            let want = if dist == Distribution::Normal {
                4.0
            } else {
                4.0 / 3.0
            };
            let se_mean = (want / n as f64).sqrt();
            assert!(mean.abs() < 6.0 * se_mean, "{dist:?} mean {mean}");
            // Var of x^2: 2 sigma^4 (normal), 4 scale^4 / 45 (uniform).
            let var4 = if dist == Distribution::Normal {
                32.0
            } else {
                64.0 / 45.0
            };
            assert!(
                (var - want).abs() < 6.0 * (var4 / n as f64).sqrt(),
                "{dist:?} var {var}"
            );
        }
    }
}
