//! The softcap `x' = c tanh(x / c)` before the temperature (docs/design.md, "The
//! loss side"; Gemma 2) in the oracle, against the textbook definition evaluated
//! directly in 320-bit MPFR (`z_j = c tanh(x_j / c) / T`, `lse = ln sum
//! e^z`, `log_prob = z_t - lse`, entropy `= lse - sum p z`, the gradient
//! `(1[j=t] - p_j) sech^2(x_j / c) / T`), not through the oracle's
//! shifted enclosures; the materialised softcap (`softcap_dtype = input`)
//! against the same problem on the materialised logits; the typed errors.

use half::bf16;
use logprobe_reference::oracle::{round_to_dtype, Oracle, Tier};
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, Output, Problem, SoftcapDtype, SpecError, TemperatureDtype,
};
use ndarray::{array, Array1, Array2};
use rug::Float;

const P: u32 = 320;

/// `z_j = c tanh(x_j / c) / T` by the definition (`-inf` gives `-c / T`).
fn z_def(x: f64, c: f64, t: f64) -> Float {
    let th = if x == f64::NEG_INFINITY {
        Float::with_val(P, -1)
    } else {
        (Float::with_val(P, x) / c).tanh()
    };
    th * c / t
}

/// `(lse, log_prob_t, entropy, grad_j for g = 1 at t)` of one row by the definition.
fn row_def(x: &[f64], c: f64, t: f64, tgt: usize) -> (Float, Float, Float, Vec<Float>) {
    let z: Vec<Float> = x.iter().map(|&v| z_def(v, c, t)).collect();
    let mut s = Float::with_val(P, 0);
    for zj in &z {
        s += zj.clone().exp();
    }
    let lse = s.clone().ln();
    let lp = Float::with_val(P, &z[tgt] - &lse);
    let mut ez = Float::with_val(P, 0);
    let mut grad = Vec::new();
    for (j, zj) in z.iter().enumerate() {
        let p = Float::with_val(P, zj - &lse).exp();
        ez += Float::with_val(P, &p * zj);
        let ind = if j == tgt { 1 } else { 0 };
        let sech2 = if x[j] == f64::NEG_INFINITY {
            Float::with_val(P, 0)
        } else {
            (Float::with_val(P, x[j]) / c).sech().square()
        };
        grad.push((Float::with_val(P, ind) - p) * sech2 / t);
    }
    let h = Float::with_val(P, &lse - &ez);
    (lse, lp, h, grad)
}

fn both_tiers() -> [Oracle; 2] {
    [
        Oracle::default(),
        Oracle {
            tier: Tier::Mpfr,
            ..Oracle::default()
        },
    ]
}

#[test]
fn exact_softcap_matches_the_definition_in_every_dtype() {
    // Gemma 2's final-logit softcap 30, a temperature that is not a power
    // of two, logits inside and far outside the cap, a -inf logit (x' = -c).
    let x = [
        12.5f64,
        -3.0,
        40.0,
        0.0,
        95.5,
        f64::NEG_INFINITY,
        29.0,
        -61.0,
    ];
    let xs = Array2::from_shape_vec((1, x.len()), x.to_vec()).unwrap();
    let t = array![4i64];
    for (c, temp) in [(30.0f64, 0.7f64), (50.0, 1.0), (2.5, 2.0)] {
        let mut p = Problem::new(Logits::F64(xs.view()));
        p.tokens = Some(t.view());
        p.options.softcap = Some(c);
        p.options.temperature = temp;
        p.options.lse = true;
        for target in [Dtype::F64, Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let (lse, lp, h, _) = row_def(&x, c, temp, 4);
            for o in both_tiers() {
                let f = o.forward(&p, target).unwrap();
                let got = |out: Output| f.values[out][[0, 0]];
                for (out, want) in [
                    (Output::LogProbs, &lp),
                    (Output::Entropy, &h),
                    (Output::Lse, &lse),
                ] {
                    let e = got(out);
                    assert!(e.decided, "{out:?} c={c} {target:?}");
                    assert_eq!(
                        e.rounded,
                        round_to_dtype(want, target),
                        "{out:?} c={c} T={temp} {target:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn exact_softcap_on_f32_bf16_f16_logits_takes_c_in_f32() {
    // c = 0.3 is not an f32 value: the computation takes c rounded to f32
    // (the accumulation dtype), as it takes T.
    let c32 = 0.3f32 as f64;
    let x = [0.25f64, -0.5, 1.0, 0.125];
    let t = array![0i64];
    let want = row_def(&x, c32, 1.0, 0).1;
    let x32 = Array2::from_shape_vec((1, 4), x.iter().map(|&v| v as f32).collect()).unwrap();
    let xb =
        Array2::from_shape_vec((1, 4), x.iter().map(|&v| bf16::from_f64(v)).collect()).unwrap();
    for logits in [Logits::F32(x32.view()), Logits::Bf16(xb.view())] {
        let mut p = Problem::new(logits);
        p.tokens = Some(t.view());
        p.options.softcap = Some(0.3);
        let f = Oracle::default().forward(&p, Dtype::F32).unwrap();
        assert_eq!(
            f.values[Output::LogProbs][[0, 0]].rounded,
            round_to_dtype(&want, Dtype::F32)
        );
    }
}

#[test]
fn exact_softcap_gradient_is_the_chain_rule() {
    let x = [
        12.5f64,
        -3.0,
        40.0,
        0.0,
        95.5,
        f64::NEG_INFINITY,
        29.0,
        -61.0,
    ];
    let xs = Array2::from_shape_vec((1, x.len()), x.to_vec()).unwrap();
    let t = array![2i64];
    let g = Array1::from_elem(1, 1.0f64);
    for (c, temp) in [(30.0f64, 0.7f64), (5.0, 1.0)] {
        let mut p = Problem::new(Logits::F64(xs.view()));
        p.tokens = Some(t.view());
        p.options.softcap = Some(c);
        p.options.temperature = temp;
        p.options.entropy = None;
        let cot = Cotangents::default().with_column(Output::LogProbs, g.view());
        let (_, _, _, grad) = row_def(&x, c, temp, 2);
        for target in [Dtype::F64, Dtype::F32, Dtype::Bf16] {
            for o in both_tiers() {
                let dx = o.vjp(&p, &cot, target).unwrap();
                for j in 0..x.len() {
                    let e = dx[[0, j]];
                    assert!(e.decided, "j={j}");
                    assert_eq!(
                        e.rounded,
                        round_to_dtype(&grad[j], target),
                        "j={j} c={c} {target:?}"
                    );
                }
                // x = -inf: sech^2 = 0, exactly 0.
                assert_eq!(dx[[0, 5]].rounded, 0.0);
            }
        }
    }
}

#[test]
fn softcap_of_all_neg_inf_row_is_uniform() {
    // Every x' = -c: a uniform row, log_prob = -ln V, entropy = ln V.
    let x = Array2::from_elem((1, 4), f32::NEG_INFINITY);
    let t = array![1i64];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    p.options.softcap = Some(30.0);
    let f = Oracle::default().forward(&p, Dtype::F64).unwrap();
    let ln4 = 2.0 * std::f64::consts::LN_2;
    assert_eq!(f.values[Output::LogProbs][[0, 0]].rounded, -ln4);
    assert_eq!(f.values[Output::Entropy][[0, 0]].rounded, ln4);
}

#[test]
fn materialised_softcap_is_the_problem_on_materialised_logits() {
    // bf16 logits, Gemma 2 in bf16: x' = r(r(tanh(r(x / 30))) * 30).
    let raw: Vec<f32> = vec![12.5, -3.0, 40.0, 0.0, 95.5, 29.0, -61.0, 7.25, 1.0e4, -0.5];
    let v = raw.len();
    let xb = Array2::from_shape_vec((2, v / 2), raw.iter().map(|&x| bf16::from_f32(x)).collect())
        .unwrap();
    let c = 30.0;
    let (xm, tm): (Vec<bf16>, Vec<f64>) = xb
        .iter()
        .map(|x| {
            let x = x.to_f64();
            (
                bf16::from_f64(Dtype::Bf16.softcapped_input(x, c)),
                Dtype::Bf16.softcap_tanh_input(x, c),
            )
        })
        .unzip();
    let xm = Array2::from_shape_vec((2, v / 2), xm).unwrap();
    let t = array![1i64, 4];
    let g = array![1.0f64, -0.5];
    let h = array![0.25f64, 1.0];
    let cot = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view());
    for temp in [1.0, 0.6] {
        for tdt in [TemperatureDtype::Accumulation, TemperatureDtype::Input] {
            let mut p = Problem::new(Logits::Bf16(xb.view()));
            p.tokens = Some(t.view());
            p.options.softcap = Some(c);
            p.options.softcap_dtype = SoftcapDtype::Input;
            p.options.temperature = temp;
            p.options.temperature_dtype = tdt;
            p.options.lse = true;
            let mut q = p;
            q.logits = Logits::Bf16(xm.view());
            q.options.softcap = None;
            for o in both_tiers() {
                for target in [Dtype::F32, Dtype::Bf16] {
                    let a = o.forward(&p, target).unwrap();
                    let b = o.forward(&q, target).unwrap();
                    for out in [Output::LogProbs, Output::Entropy, Output::Lse] {
                        for r in 0..2 {
                            assert_eq!(
                                a.values[out][[r, 0]].rounded,
                                b.values[out][[r, 0]].rounded,
                                "{out:?} row {r} T={temp} {tdt:?}"
                            );
                        }
                    }
                }
                // The gradient: the materialised problem's, times 1 - t^2
                // (autograd's tanh backward on its saved output), in f64
                // exactly where both are exact enough to compare.
                let a = o.vjp(&p, &cot, Dtype::F64).unwrap();
                let b = o.vjp(&q, &cot, Dtype::F64).unwrap();
                for r in 0..2 {
                    for j in 0..v / 2 {
                        let tj = tm[r * (v / 2) + j];
                        let f = Float::with_val(P, 1) - Float::with_val(P, tj).square();
                        let lo = Float::with_val(P, b[[r, j]].enclosure.lo) * &f;
                        let hi = Float::with_val(P, b[[r, j]].enclosure.hi) * &f;
                        let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                        let e = a[[r, j]].enclosure;
                        assert!(
                            Float::with_val(P, e.hi) >= lo && Float::with_val(P, e.lo) <= hi,
                            "row {r} col {j}: {e:?} vs [{lo}, {hi}]"
                        );
                        assert!(a[[r, j]].decided);
                    }
                }
            }
        }
    }
}

#[test]
fn bad_softcaps_are_typed_errors() {
    let x = array![[0.0f32, 1.0]];
    let mut p = Problem::new(Logits::F32(x.view()));
    for c in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-50, 1e300] {
        p.options.softcap = Some(c);
        assert!(
            matches!(p.validate(), Err(SpecError::BadSoftcap { .. })),
            "c = {c}"
        );
        assert!(Oracle::default().forward(&p, Dtype::F32).is_err());
    }
    // f64 logits take c in f64: 1e300 and 1e-50 are fine there.
    let x64 = array![[0.0f64, 1.0]];
    let mut q = Problem::new(Logits::F64(x64.view()));
    for c in [1e300, 1e-50] {
        q.options.softcap = Some(c);
        assert!(q.validate().is_ok(), "c = {c}");
    }
    p.options.softcap = Some(30.0);
    p.options.temperature_dtype = TemperatureDtype::Input;
    assert_eq!(
        p.validate_shapes().err(),
        Some(SpecError::SoftcapDtypeMismatch)
    );
    p.options.softcap_dtype = SoftcapDtype::Input;
    assert!(p.validate_shapes().is_ok());
}

#[test]
fn materialised_softcap_overflowing_f16_is_a_typed_error() {
    // |x'| <= |x|, so only x = -inf can overflow: x' = r(-c) = -inf in f16
    // for c = 1e5 > 65504. A target there, or no finite entry left, is a
    // typed error on the materialised tensor.
    let f = half::f16::from_f32;
    let x = array![
        [f(f32::NEG_INFINITY), f(3.0)],
        [f(f32::NEG_INFINITY), f(f32::NEG_INFINITY)]
    ];
    let t = array![0i64, -100];
    let mut p = Problem::new(Logits::F16(x.view()));
    p.options.softcap = Some(1e5);
    p.options.softcap_dtype = SoftcapDtype::Input;
    p.tokens = Some(t.view());
    assert_eq!(
        Oracle::default().forward(&p, Dtype::F32).err(),
        Some(SpecError::TokenNegInf { row: 0, token: 0 })
    );
    let t = array![1i64, -100];
    p.tokens = Some(t.view());
    match Oracle::default().forward(&p, Dtype::F32) {
        Err(SpecError::NoFiniteLogit { tensor, row: 1, .. }) => {
            assert_eq!(tensor, "softcap(logits)")
        }
        other => panic!("{other:?}"),
    }
    // The exact softcap has no such overflow: x' = -c is finite in f32.
    p.options.softcap_dtype = SoftcapDtype::Accumulation;
    let t = array![0i64, -100];
    p.tokens = Some(t.view());
    assert!(Oracle::default().forward(&p, Dtype::F32).is_ok());
}

/// Hand values from mpmath at 60 digits (independent of MPFR): row
/// `[12.5, -3, 40, 0, 95.5, -inf, 29, -61]` (f64), `c = 30`, `T = 0.7`
/// (the f64 nearest 0.7), `z = c tanh(x / c) / T` (`-inf` gives `-c / T`),
/// by the definitions `lse = ln sum e^z`, `log p_j = z_j - lse`,
/// `H = lse - sum p z`, `dx_j = (1[j=2] - p_j) sech^2(x_j / c) / T`:
///
/// ```text
/// from mpmath import mp, mpf, tanh, exp, log, sech; mp.dps = 60
/// ```
#[test]
fn exact_softcap_matches_mpmath_hand_values() {
    let x = array![[
        12.5f64,
        -3.0,
        40.0,
        0.0,
        95.5,
        f64::NEG_INFINITY,
        29.0,
        -61.0
    ]];
    let t = array![4i64];
    let ids = array![[5i64]];
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    p.topk_ids = Some(ids.view());
    p.options.softcap = Some(30.0);
    p.options.temperature = 0.7;
    p.options.lse = true;
    let want = |s: &str| Float::with_val(P, Float::parse(s).unwrap());
    let f = Oracle::default().forward(&p, Dtype::F64).unwrap();
    for (out, col, s) in [
        (
            Output::Lse,
            0,
            "42.714581116970882163313528653760526886446147573614",
        ),
        (
            Output::LogProbs,
            0,
            "-0.0044322520039335373335973435213862810482960040055347",
        ),
        (
            Output::TopkLogProbs,
            0,
            "-85.571723974113742025084201205164471843934464693667",
        ),
        (
            Output::Entropy,
            0,
            "0.028529669555812054825018411034471395633922949475756",
        ),
    ] {
        let e = f.values[out][[0, col]];
        let w = want(s);
        assert!(
            w >= e.enclosure.lo && w <= e.enclosure.hi,
            "{out:?}: {e:?} vs {s}"
        );
        assert_eq!(e.rounded, round_to_dtype(&w, Dtype::F64), "{out:?}");
    }
    let t = array![2i64];
    p.tokens = Some(t.view());
    p.topk_ids = None;
    p.options.entropy = None;
    let g = array![1.0f64];
    let cot = Cotangents::default().with_column(Output::LogProbs, g.view());
    let dx = Oracle::default().vjp(&p, &cot, Dtype::F64).unwrap();
    for (j, s) in [
        (
            0,
            "-0.0000000000073529537796574630030217554791103790921939183287978",
        ),
        (2, "0.34560516484141852433046927232650051692771566727684"),
        (4, "-0.0097395299934879782543537870692457514702451369060887"),
        (
            7,
            "-2.7531795644369781807162962916460074898194496415363e-38",
        ),
    ] {
        let e = dx[[0, j]];
        let w = want(s);
        assert!(
            w >= e.enclosure.lo && w <= e.enclosure.hi,
            "grad {j}: {e:?} vs {s}"
        );
        assert_eq!(e.rounded, round_to_dtype(&w, Dtype::F64), "grad {j}");
    }
}

#[test]
fn cross_entropy_sees_the_softcapped_logits() {
    use logprobe_reference::spec::{CrossEntropy, Reduction};
    // Unsmoothed, unreduced: the row loss is -log_prob of the same z.
    let x = array![
        [12.5f64, -3.0, 40.0, 0.0, 95.5],
        [1.0, 2.0, 3.0, 200.0, -7.0]
    ];
    let t = array![4i64, 3];
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    p.options.softcap = Some(30.0);
    p.options.entropy = None;
    let ce = CrossEntropy {
        reduction: Reduction::None,
        ..Default::default()
    };
    let o = Oracle::default();
    let l = o.cross_entropy(&p, &ce, Dtype::F64).unwrap();
    let f = o.forward(&p, Dtype::F64).unwrap();
    for r in 0..2 {
        assert_eq!(
            l.values[r].rounded,
            -f.values[Output::LogProbs][[r, 0]].rounded,
            "row {r}"
        );
        let want = row_def(x.row(r).as_slice().unwrap(), 30.0, 1.0, t[r] as usize).1;
        assert_eq!(l.values[r].rounded, round_to_dtype(&(-want), Dtype::F64));
    }
}
