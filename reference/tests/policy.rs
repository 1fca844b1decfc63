//! The policy terms (`kl_k1`, `kl_k2`, `kl_k3`, `kl_abs`, `ratio`;
//! docs/design.md, "The loss side") in the oracle, against their definitions evaluated
//! directly in 1000-bit MPFR (`lp = x_t / T - ln sum e^{x_j / T}`, `d = lp -
//! ref`, the naive `e^{-d} + d - 1` at that precision, the clamps as
//! verl's): every term correctly rounded on both tiers, `kl_k3` included
//! at `|d| ~ 1e-8` where the naive f64 form loses every digit; the VJP
//! against the definition's gradient `c k'(d) (1[j = t] - p_j) / T`; and
//! the typed errors.

use logprobe_reference::oracle::{round_to_dtype, Oracle, Tier};
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, Output, PolicyClamps, PolicyInputs, PolicyTerm, Problem, SpecError,
};
use ndarray::{array, Array1, Array2};
use rug::Float;

const P: u32 = 1000;

/// The exact log-prob of row `r`'s target at `P` bits.
fn log_prob(x: &Array2<f64>, r: usize, t: usize, temp: f64) -> Float {
    let mut s = Float::with_val(P, 0);
    for &xj in x.row(r) {
        s += (Float::with_val(P, xj) / temp).exp();
    }
    Float::with_val(P, x[[r, t]]) / temp - s.ln()
}

/// `term` by its definition at `P` bits (clamps as verl applies them).
fn term_exact(term: PolicyTerm, lp: &Float, x: f64, c: &PolicyClamps) -> Float {
    let d = Float::with_val(P, lp - x);
    let clamp = |v: Float, c: Option<f64>| match c {
        Some(c) if v > c => Float::with_val(P, c),
        Some(c) if v < -c => Float::with_val(P, -c),
        _ => v,
    };
    match term {
        PolicyTerm::K1 => d,
        PolicyTerm::K2 => Float::with_val(P, &d * &d) / 2u32,
        PolicyTerm::Abs => d.abs(),
        PolicyTerm::K3 => {
            let dc = clamp(d, c.kl_input);
            // The naive form, harmless at 1000 bits.
            let k = Float::with_val(P, (-dc.clone()).exp()) + dc - 1u32;
            match c.kl_output {
                Some(co) if k > co => Float::with_val(P, co),
                _ => k,
            }
        }
        PolicyTerm::Ratio => clamp(d, c.ratio_log).exp(),
    }
}

fn problem<'a>(
    x: &'a Array2<f64>,
    t: &'a Array1<i64>,
    r: &'a Array1<f64>,
    o: &'a Array1<f64>,
    c: PolicyClamps,
) -> Problem<'a> {
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    p.policy = PolicyInputs {
        ref_log_probs: Some(r.view()),
        old_log_probs: Some(o.view()),
    };
    p.options.entropy = None;
    p.options.policy_clamps = c;
    p
}

#[test]
fn kl_k3_is_correctly_rounded_where_the_naive_form_cancels() {
    // Two rows: uniform over 2 (lp = -ln 2) and a skewed one.
    let x = array![[0.0, 0.0], [1.5, -0.25]];
    let t = array![0i64, 1];
    let lp: Vec<Float> = (0..2)
        .map(|r| log_prob(&x, r, t[r] as usize, 1.0))
        .collect();
    let mut naive_lost = 0;
    for delta in [1e-8f64, -1e-8, 3e-9, -7e-10, 1e-6, -2.5e-5, 0.0] {
        // ref = lp - delta rounded to f64: d = lp - ref ~ delta.
        let refs: Array1<f64> = (0..2)
            .map(|r| Float::with_val(P, &lp[r] - delta).to_f64())
            .collect();
        let olds = refs.clone();
        let p = problem(&x, &t, &refs, &olds, PolicyClamps::default());
        for tier in [Tier::Fast, Tier::Mpfr] {
            let o = Oracle {
                tier,
                ..Oracle::default()
            };
            for dtype in [Dtype::F64, Dtype::F32, Dtype::Bf16] {
                let f = o.forward(&p, dtype).unwrap();
                for r in 0..2 {
                    let exact =
                        term_exact(PolicyTerm::K3, &lp[r], refs[r], &PolicyClamps::default());
                    let want = round_to_dtype(&exact, dtype);
                    let got = f.values[Output::KlK3][[r, 0]];
                    assert!(got.decided, "{tier:?} {dtype:?} row {r} delta {delta}");
                    assert_eq!(
                        got.rounded.to_bits(),
                        want.to_bits(),
                        "{tier:?} {dtype:?} row {r} delta {delta}: {} vs {}",
                        got.rounded,
                        want
                    );
                    if dtype == Dtype::F64 && delta.abs() == 1e-8 {
                        // The naive f64 form: not one correct digit.
                        let d = Float::with_val(P, &lp[r] - refs[r]).to_f64();
                        let naive = (-d).exp() + d - 1.0;
                        if (naive - want).abs() > 0.5 * want.abs() {
                            naive_lost += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(
        naive_lost >= 4,
        "the naive form should lose every digit: {naive_lost}"
    );
}

#[test]
fn every_term_is_correctly_rounded_on_both_tiers() {
    let x = array![
        [0.3, -1.2, 2.5, 0.0, -0.7],
        [10.0, 9.5, -3.0, 1.0, 0.0],
        [-2.0, -2.0, -2.0, -2.0, -1.0],
        [0.0, 4.0, 1.0, -5.0, 2.0]
    ];
    let t = array![2i64, 1, 4, -100];
    let temp = 0.7;
    let lp: Vec<Float> = (0..4)
        .map(|r| log_prob(&x, r, t[r].max(0) as usize, temp))
        .collect();
    let offs = [(1e-9, -3e-4), (-0.3, 0.02), (25.0, -21.0), (-0.6, 0.25)];
    let refs: Array1<f64> = (0..4)
        .map(|r| Float::with_val(P, &lp[r] - offs[r].0).to_f64())
        .collect();
    let olds: Array1<f64> = (0..4)
        .map(|r| Float::with_val(P, &lp[r] - offs[r].1).to_f64())
        .collect();
    for clamps in [
        PolicyClamps::default(),
        PolicyClamps {
            kl_input: Some(20.0),
            kl_output: Some(10.0),
            ratio_log: Some(20.0),
        },
        PolicyClamps {
            kl_input: Some(0.5),
            kl_output: Some(0.05),
            ratio_log: Some(0.2),
        },
    ] {
        let mut p = problem(&x, &t, &refs, &olds, clamps);
        p.options.temperature = temp;
        for tier in [Tier::Fast, Tier::Mpfr] {
            let o = Oracle {
                tier,
                ..Oracle::default()
            };
            for dtype in [Dtype::F64, Dtype::F32, Dtype::F16] {
                let f = o.forward(&p, dtype).unwrap();
                for term in PolicyTerm::ALL {
                    for r in 0..3 {
                        let x_in = if term.uses_old() { olds[r] } else { refs[r] };
                        let want = round_to_dtype(&term_exact(term, &lp[r], x_in, &clamps), dtype);
                        let got = f.values[term.output()][[r, 0]];
                        assert!(got.decided);
                        assert_eq!(
                            got.rounded.to_bits(),
                            want.to_bits(),
                            "{term:?} {clamps:?} {tier:?} {dtype:?} row {r}: {} vs {want}",
                            got.rounded
                        );
                    }
                    // The ignore_index row: an exact 0, not judged.
                    assert_eq!(f.values[term.output()][[3, 0]].rounded, 0.0);
                    assert!(!term.output().judged(&p, 3));
                }
            }
        }
    }
}

#[test]
fn vjp_of_the_policy_terms_is_the_log_prob_vjp_times_the_slope() {
    let x = array![[0.3, -1.2, 2.5, 0.0, -0.7], [10.0, 9.5, -3.0, 1.0, 0.0]];
    let t = array![2i64, 0];
    let lp: Vec<Float> = (0..2)
        .map(|r| log_prob(&x, r, t[r] as usize, 1.0))
        .collect();
    let refs: Array1<f64> = array![
        Float::with_val(P, &lp[0] - 2e-7).to_f64(),
        Float::with_val(P, &lp[1] + 1.5).to_f64()
    ];
    let olds: Array1<f64> = array![
        Float::with_val(P, &lp[0] - 0.1).to_f64(),
        Float::with_val(P, &lp[1] - 30.0).to_f64()
    ];
    let clamps = PolicyClamps {
        kl_input: Some(20.0),
        kl_output: Some(10.0),
        ratio_log: Some(20.0),
    };
    let p = problem(&x, &t, &refs, &olds, clamps);
    let c = |v: f64| Array1::from(vec![v, -0.75 * v]);
    let (g1, g2, g3, ga, gr) = (c(0.5), c(-1.25), c(3.0), c(0.125), c(2.0));
    let cot = Cotangents::default()
        .with_column(Output::KlK1, g1.view())
        .with_column(Output::KlK2, g2.view())
        .with_column(Output::KlK3, g3.view())
        .with_column(Output::KlAbs, ga.view())
        .with_column(Output::Ratio, gr.view());
    for dtype in [Dtype::F64, Dtype::F32] {
        let grad = Oracle::default().vjp(&p, &cot, dtype).unwrap();
        for r in 0..2 {
            // The slope by its definition, each term's derivative in d.
            let d = Float::with_val(P, &lp[r] - refs[r]);
            let dr = Float::with_val(P, &lp[r] - olds[r]);
            let k3s = {
                let inside = d.clone().abs() <= 20.0;
                let k3 = term_exact(PolicyTerm::K3, &lp[r], refs[r], &clamps);
                if inside && k3 <= 10.0 {
                    Float::with_val(P, 1u32) - (-d.clone()).exp()
                } else {
                    Float::with_val(P, 0)
                }
            };
            let rs = if dr.clone().abs() <= 20.0 {
                dr.clone().exp()
            } else {
                Float::with_val(P, 0)
            };
            let sign = if d > 0 { 1.0 } else { -1.0 };
            let slope = Float::with_val(P, g1[r])
                + Float::with_val(P, g2[r]) * &d
                + Float::with_val(P, g3[r]) * k3s
                + Float::with_val(P, ga[r] * sign)
                + Float::with_val(P, gr[r]) * rs;
            let mut s = Float::with_val(P, 0);
            for &xj in x.row(r) {
                s += Float::with_val(P, xj).exp();
            }
            for j in 0..5 {
                let pj = Float::with_val(P, x[[r, j]]).exp() / &s;
                let ind = if j == t[r] as usize { 1u32 } else { 0 };
                let want = Float::with_val(P, &slope * (Float::with_val(P, ind) - pj));
                let want = round_to_dtype(&want, dtype);
                let got = grad[[r, j]];
                assert!(got.decided);
                assert_eq!(
                    got.rounded.to_bits(),
                    want.to_bits(),
                    "{dtype:?} [{r}, {j}]: {} vs {want}",
                    got.rounded
                );
            }
        }
    }
}

#[test]
fn bad_policy_inputs_are_typed_errors_naming_tensor_and_row() {
    let x = array![[0.0, 1.0], [1.0, 0.0]];
    let t = array![0i64, 1];
    let r = array![-0.5, f64::NAN];
    let o = array![-0.5, -0.5];
    let p = problem(&x, &t, &r, &o, PolicyClamps::default());
    assert!(matches!(
        Oracle::default().forward(&p, Dtype::F32),
        Err(SpecError::NonFinitePolicyInput {
            tensor: "ref_log_probs",
            row: 1,
            ..
        })
    ));
    let r = array![-0.5, -0.5];
    let o = array![f64::NEG_INFINITY, -0.5];
    let p = problem(&x, &t, &r, &o, PolicyClamps::default());
    assert!(matches!(
        p.validate(),
        Err(SpecError::NonFinitePolicyInput {
            tensor: "old_log_probs",
            row: 0,
            ..
        })
    ));
    let o = array![-0.5, -0.5];
    let xf = x.mapv(|v| v as f32);
    for (c, name) in [
        (
            PolicyClamps {
                kl_input: Some(0.0),
                ..Default::default()
            },
            "kl_input_clamp",
        ),
        (
            PolicyClamps {
                kl_output: Some(-1.0),
                ..Default::default()
            },
            "kl_output_clamp",
        ),
        (
            PolicyClamps {
                ratio_log: Some(f64::INFINITY),
                ..Default::default()
            },
            "ratio_log_clamp",
        ),
        (
            PolicyClamps {
                ratio_log: Some(1e-50),
                ..Default::default()
            },
            "ratio_log_clamp",
        ),
    ] {
        let mut p = problem(&x, &t, &r, &o, c);
        p.logits = Logits::F32(xf.view());
        assert!(
            matches!(p.validate(), Err(SpecError::BadClamp { name: n, .. }) if n == name),
            "{name}: {:?}",
            p.validate()
        );
    }
    let short = array![-0.5];
    let mut p = problem(&x, &t, &r, &o, PolicyClamps::default());
    p.policy.ref_log_probs = Some(short.view());
    assert!(matches!(
        p.validate(),
        Err(SpecError::ShapeMismatch {
            tensor: "ref_log_probs",
            ..
        })
    ));
    let mut p = problem(&x, &t, &r, &o, PolicyClamps::default());
    p.tokens = None;
    assert!(matches!(
        p.validate(),
        Err(SpecError::MissingTensor {
            tensor: "tokens",
            ..
        })
    ));
    // A policy cotangent without its input.
    let mut p = problem(&x, &t, &r, &o, PolicyClamps::default());
    p.policy.old_log_probs = None;
    let g = array![1.0, 1.0];
    let cot = Cotangents::default().with_column(Output::Ratio, g.view());
    assert!(matches!(
        Oracle::default().vjp(&p, &cot, Dtype::F32),
        Err(SpecError::MissingTensor {
            output: "grad_ratio",
            tensor: "old_log_probs"
        })
    ));
}
