//! The oracle's cross-entropy `loss` (docs/design.md, "The loss side") against values
//! computed by hand: closed forms (`ln 4`, `ln 3`) and the textbook
//! definition evaluated directly in 256-bit MPFR (`lse = ln sum e^x`,
//! `-log p_j = lse - x_j`), not through the oracle's shifted sums; every
//! reduction, label smoothing over the allowed entries, a `-inf` logit,
//! weights, the all-ignored mean and the bad-input errors.

use logprobe_reference::oracle::{round_to_dtype, Oracle};
use logprobe_reference::spec::{
    CrossEntropy, Dtype, Logits, MeanAllIgnored, Problem, Reduction, SpecError,
};
use ndarray::{array, Array1, Array2};
use rug::Float;

const P: u32 = 256;

/// `-log p_j` of one row by the definition, allowed entries only.
fn neg_log_p(x: &[f64], allowed: &[bool], j: usize) -> Float {
    let mut s = Float::with_val(P, 0);
    for (k, &v) in x.iter().enumerate() {
        if allowed[k] && v > f64::NEG_INFINITY {
            s += Float::with_val(P, v).exp();
        }
    }
    s.ln() - Float::with_val(P, x[j])
}

/// The smoothed row loss by the definition.
fn row_loss(x: &[f64], allowed: &[bool], t: usize, eps: f64) -> Float {
    let nll = neg_log_p(x, allowed, t);
    if eps == 0.0 {
        return nll;
    }
    let idx: Vec<usize> = (0..x.len()).filter(|&j| allowed[j]).collect();
    let mut m = Float::with_val(P, 0);
    for &j in &idx {
        m += neg_log_p(x, allowed, j);
    }
    m /= idx.len() as u32;
    nll * (Float::with_val(P, 1) - eps) + m * eps
}

fn ce(reduction: Reduction, eps: f64) -> CrossEntropy<'static> {
    CrossEntropy {
        reduction,
        label_smoothing: eps,
        ..Default::default()
    }
}

#[test]
fn uniform_row_is_ln_v_with_or_without_smoothing() {
    let x = Array2::<f64>::zeros((1, 4));
    let t = array![1i64];
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    for eps in [0.0, 0.1, 1.0] {
        let l = Oracle::default()
            .cross_entropy(&p, &ce(Reduction::None, eps), Dtype::F64)
            .unwrap();
        // ln 4 = 2 ln 2 exactly; f64's LN_2 is ln 2 correctly rounded.
        assert_eq!(
            l.values[0].rounded,
            2.0 * std::f64::consts::LN_2,
            "eps {eps}"
        );
        assert!(l.values[0].decided);
    }
}

#[test]
fn every_reduction_matches_the_definition() {
    let x = array![[1.0f64, 2.0, 3.0], [0.5, -1.0, 4.0], [-2.0, 0.0, 2.0]];
    let t = array![0i64, -100, 2];
    let w = array![0.5f64, 3.0, 2.0];
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    let all = [true; 3];
    let eps = 0.25;
    let rows: Vec<Float> = [0usize, 2]
        .iter()
        .map(|&r| row_loss(x.row(r).as_slice().unwrap(), &all, t[r] as usize, eps))
        .collect();
    let o = Oracle::default();
    for dtype in [Dtype::F64, Dtype::F32, Dtype::Bf16] {
        let none = o
            .cross_entropy(&p, &ce(Reduction::None, eps), dtype)
            .unwrap();
        assert_eq!(none.values.len(), 3);
        assert_eq!(none.values[0].rounded, round_to_dtype(&rows[0], dtype));
        assert_eq!(none.values[1].rounded, 0.0, "ignored row is 0");
        assert_eq!(none.values[2].rounded, round_to_dtype(&rows[1], dtype));
        assert_eq!(none.counted, 2);
        let sum = o
            .cross_entropy(&p, &ce(Reduction::Sum, eps), dtype)
            .unwrap();
        let want_sum = Float::with_val(P, &rows[0] + &rows[1]);
        assert_eq!(sum.values.len(), 1);
        assert_eq!(sum.values[0].rounded, round_to_dtype(&want_sum, dtype));
        let mean = o
            .cross_entropy(&p, &ce(Reduction::Mean, eps), dtype)
            .unwrap();
        let want_mean = Float::with_val(P, &want_sum / 2u32);
        assert_eq!(mean.values[0].rounded, round_to_dtype(&want_mean, dtype));
        // Weighted: the ignored row's weight 3 enters neither sum nor divisor.
        let weighted = CrossEntropy {
            loss_weights: Some(w.view()),
            ..ce(Reduction::Mean, eps)
        };
        let m = o.cross_entropy(&p, &weighted, dtype).unwrap();
        let num = Float::with_val(P, &rows[0] * 0.5f64) + Float::with_val(P, &rows[1] * 2.0f64);
        let want = Float::with_val(P, num / 2.5f64);
        assert_eq!(m.values[0].rounded, round_to_dtype(&want, dtype));
        assert_eq!(m.divisor.lo, 2.5);
        assert_eq!(m.divisor.hi, 2.5);
    }
}

#[test]
fn smoothing_runs_over_allowed_entries_and_a_neg_inf_one_is_inf() {
    // V = 4; column 3 is masked out: the smoothing mean is over 3 entries.
    let x = array![[1.0f64, 2.0, 3.0, 10.0]];
    let t = array![1i64];
    let mask = array![[true, true, true, false]];
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    p.sampling_mask = Some(mask.view());
    let want = row_loss(&[1.0, 2.0, 3.0, 10.0], &[true, true, true, false], 1, 0.5);
    let l = Oracle::default()
        .cross_entropy(&p, &ce(Reduction::None, 0.5), Dtype::F64)
        .unwrap();
    assert_eq!(l.values[0].rounded, round_to_dtype(&want, Dtype::F64));
    // Padding columns are outside the real vocabulary.
    let xp = array![[1.0f64, 2.0, 3.0, 10.0]];
    let mut pp = Problem::new(Logits::F64(xp.view()));
    pp.tokens = Some(t.view());
    pp.options.vocab_size = Some(3);
    let lp = Oracle::default()
        .cross_entropy(&pp, &ce(Reduction::None, 0.5), Dtype::F64)
        .unwrap();
    let want3 = row_loss(&[1.0, 2.0, 3.0], &[true; 3], 1, 0.5);
    assert_eq!(lp.values[0].rounded, round_to_dtype(&want3, Dtype::F64));
    // A -inf logit among them: +inf with eps > 0, finite with eps = 0.
    let xi = array![[0.0f64, f64::NEG_INFINITY, 0.0]];
    let t0 = array![0i64];
    let mut pi = Problem::new(Logits::F64(xi.view()));
    pi.tokens = Some(t0.view());
    let o = Oracle::default();
    let li = o
        .cross_entropy(&pi, &ce(Reduction::Sum, 0.1), Dtype::F32)
        .unwrap();
    assert_eq!(li.values[0].rounded, f64::INFINITY);
    let l0 = o
        .cross_entropy(&pi, &ce(Reduction::Sum, 0.0), Dtype::F64)
        .unwrap();
    assert_eq!(l0.values[0].rounded, std::f64::consts::LN_2);
}

#[test]
fn all_ignored_mean_is_declared_and_sum_is_zero() {
    let x = array![[1.0f32, 2.0], [3.0, 4.0]];
    let t = array![-100i64, -100];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    let o = Oracle::default();
    let nan = o
        .cross_entropy(&p, &ce(Reduction::Mean, 0.1), Dtype::F32)
        .unwrap();
    assert!(nan.values[0].rounded.is_nan());
    let zero = CrossEntropy {
        mean_all_ignored: MeanAllIgnored::Zero,
        ..ce(Reduction::Mean, 0.1)
    };
    let z = o.cross_entropy(&p, &zero, Dtype::F32).unwrap();
    assert_eq!(z.values[0].rounded, 0.0);
    let s = o
        .cross_entropy(&p, &ce(Reduction::Sum, 0.1), Dtype::F32)
        .unwrap();
    assert_eq!(s.values[0].rounded, 0.0);
    assert_eq!(s.counted, 0);
}

#[test]
fn label_smoothing_is_rounded_like_the_temperature() {
    // f32 logits: eps = 0.1 is used as 0.1f32.
    let x = array![[0.0f32, 1.0, 2.0]];
    let t = array![0i64];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    let want = row_loss(&[0.0, 1.0, 2.0], &[true; 3], 0, 0.1f32 as f64);
    let l = Oracle::default()
        .cross_entropy(&p, &ce(Reduction::None, 0.1), Dtype::F64)
        .unwrap();
    assert_eq!(l.values[0].rounded, round_to_dtype(&want, Dtype::F64));
}

#[test]
fn bad_input_is_typed() {
    let x = array![[1.0f32, 2.0]];
    let t = array![0i64];
    let mut p = Problem::new(Logits::F32(x.view()));
    let o = Oracle::default();
    assert_eq!(
        o.cross_entropy(&p, &ce(Reduction::Sum, 0.0), Dtype::F32)
            .unwrap_err(),
        SpecError::MissingTensor {
            output: "loss",
            tensor: "tokens"
        }
    );
    p.tokens = Some(t.view());
    assert_eq!(
        o.cross_entropy(&p, &ce(Reduction::Sum, 1.5), Dtype::F32)
            .unwrap_err(),
        SpecError::BadLabelSmoothing {
            label_smoothing: 1.5
        }
    );
    let w = Array1::from(vec![f64::NAN]);
    let bad_w = CrossEntropy {
        loss_weights: Some(w.view()),
        ..ce(Reduction::Mean, 0.0)
    };
    assert!(matches!(
        o.cross_entropy(&p, &bad_w, Dtype::F32).unwrap_err(),
        SpecError::BadLossWeight { row: 0, .. }
    ));
}

/// `Output::Loss` through `Oracle::forward` (the seam): its per-row values
/// are the terms `w_r l_r` of `cross_entropy` (the `none` output itself),
/// on both tiers, with weights, a mask, smoothing and an ignored row; the
/// per-row facts follow the reduction.
#[test]
fn forward_gives_the_loss_terms_per_row() {
    use logprobe_reference::oracle::Tier;
    use logprobe_reference::spec::{LossOptions, Output};
    let x = array![
        [0.5f32, -1.25, 3.0, 0.0, 2.5],
        [1.0, 1.0, -2.0, 0.25, 7.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [-3.0, 4.0, 0.5, 1.5, -0.75]
    ];
    let t = array![2i64, -100, 4, 1];
    let w = array![0.5, 2.0, 0.0, 1.5];
    let m = Array2::from_shape_fn((4, 5), |(r, j)| !(r == 3 && j == 0));
    for (eps, weights) in [(0.0, false), (0.1, true), (1.0, true)] {
        for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            let mut p = Problem::new(Logits::F32(x.view()));
            p.tokens = Some(t.view());
            p.sampling_mask = Some(m.view());
            p.loss_weights = weights.then(|| w.view());
            p.options.loss = Some(LossOptions {
                reduction,
                label_smoothing: eps,
                ..Default::default()
            });
            let ce = p.cross_entropy().unwrap();
            let want = Oracle::default()
                .cross_entropy(&p, &ce, Dtype::F32)
                .unwrap();
            for tier in [Tier::Fast, Tier::Mpfr] {
                let o = Oracle {
                    tier,
                    ..Oracle::default()
                };
                let f = o.forward(&p, Dtype::F32).unwrap();
                let got = &f.values[Output::Loss];
                assert_eq!(got.dim(), (4, 1));
                for r in 0..4 {
                    let e = got[[r, 0]];
                    let term = want.row_terms[r];
                    assert!(
                        e.enclosure.lo <= term.hi && term.lo <= e.enclosure.hi,
                        "{reduction} eps {eps} row {r}: {e:?} vs {term:?}"
                    );
                    if tier == Tier::Fast {
                        // The f64 tier's enclosure holds the exact term.
                        assert!(
                            e.enclosure.lo <= term.lo && term.hi <= e.enclosure.hi,
                            "{reduction} eps {eps} row {r}: {e:?} vs {term:?}"
                        );
                    }
                    if reduction == Reduction::None {
                        assert_eq!(e.rounded.to_bits(), want.values[r].rounded.to_bits());
                    }
                    assert_eq!(Output::Loss.judged(&p, r), reduction == Reduction::None);
                }
                assert_eq!(got[[1, 0]].rounded, 0.0, "ignored row");
                if tier == Tier::Fast {
                    assert_eq!(f.fallback.rows_mpfr, 0, "decided on the f64 tier");
                }
                assert_eq!(Output::Loss.reduced(&p), reduction != Reduction::None);
            }
        }
    }
    // Without tokens the loss is not requested, and validation says why.
    let mut p = Problem::new(Logits::F32(x.view()));
    p.options.loss = Some(LossOptions::default());
    assert!(!Output::Loss.requested(&p));
    assert!(matches!(
        p.validate(),
        Err(SpecError::MissingTensor { output: "loss", .. })
    ));
    // A bad weight is the row's typed error.
    let bad = array![1.0, f64::NAN, 1.0, 1.0];
    p.tokens = Some(t.view());
    p.loss_weights = Some(bad.view());
    assert!(matches!(
        p.validate(),
        Err(SpecError::BadLossWeight { row: 1, value }) if value.is_nan()
    ));
}

/// A reduction taken row by row (`LossSum` over the f64 tier's term
/// enclosures, `MpfrLossSum` over `Oracle::loss_term`) gives the whole
/// problem's `cross_entropy` value, the all-ignored mean included.
#[test]
fn row_by_row_reduction_matches_the_whole_problem() {
    use logprobe_reference::oracle::{LossSum, MpfrLossSum, Rounder};
    use logprobe_reference::spec::{LossOptions, Output};
    let x = array![
        [0.5f32, -1.25, 3.0, 0.0, 2.5],
        [1.0, 1.0, -2.0, 0.25, 7.0],
        [0.0, 0.0, 0.0, 0.0, 0.0],
        [-3.0, 4.0, 0.5, 1.5, -0.75]
    ];
    let w = array![0.5, 2.0, 0.25, 1.5];
    for tokens in [array![2i64, -100, 4, 1], array![-100i64, -100, -100, -100]] {
        for (eps, weights) in [(0.0, false), (0.25, true)] {
            for reduction in [Reduction::Sum, Reduction::Mean] {
                for mai in [MeanAllIgnored::Nan, MeanAllIgnored::Zero] {
                    let mut p = Problem::new(Logits::F32(x.view()));
                    p.tokens = Some(tokens.view());
                    p.loss_weights = weights.then(|| w.view());
                    p.options.loss = Some(LossOptions {
                        reduction,
                        label_smoothing: eps,
                        mean_all_ignored: mai,
                    });
                    let ce = p.cross_entropy().unwrap();
                    let o = Oracle::default();
                    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F64] {
                        let want = o.cross_entropy(&p, &ce, dtype).unwrap().values[0];
                        let f = o.forward(&p, dtype).unwrap();
                        let mut fast = LossSum::default();
                        for r in 0..4 {
                            let e = f.values[Output::Loss][[r, 0]];
                            fast.add(e.enclosure, p.has_target(r), p.loss_weight(r));
                        }
                        let same = |a: f64, b: f64| {
                            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
                        };
                        if let Some(e) = fast.decide(reduction, mai, dtype) {
                            assert!(same(e.rounded, want.rounded), "{e:?} vs {want:?}");
                        } else {
                            assert_eq!(dtype, Dtype::F64, "f32 / bf16 decided on the f64 tier");
                        }
                        let prec = o.precisions(dtype)[1];
                        let mut m = MpfrLossSum::new(prec);
                        for r in 0..4 {
                            let t = o.loss_term(&p, r, prec).unwrap();
                            m.add(&t, p.has_target(r), p.loss_weight(r));
                        }
                        let e = m.exact(reduction, mai, &mut Rounder::new(), dtype);
                        assert!(e.decided);
                        assert!(same(e.rounded, want.rounded), "{e:?} vs {want:?}");
                    }
                }
            }
        }
    }
}
