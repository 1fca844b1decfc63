//! The cross-entropy `loss` bound (TOLERANCE.md (T17)) against our CPU
//! kernels and the exact oracle: every staging, reduction, label smoothing
//! and weighting passes for f32, bf16 and f16 logits at V = 2000, and the
//! issue's bugs (a chunked mean multiplied by the chunk count, label
//! smoothing counting ignored rows, an all-ignored mean dividing by zero)
//! fail it.

use half::{bf16, f16};
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::oracle::{Oracle, OracleLoss};
use logprobe_reference::spec::{CrossEntropy, Dtype, Logits, MeanAllIgnored, Problem, Reduction};
use logprobe_verify::tolerance::{loss_bounds, ErrorBound, LossRowBound, Model, Order, RowContext};
use ndarray::{Array1, Array2};

const N: usize = 9;
const V: usize = 2000;

fn logits() -> Array2<f32> {
    Array2::from_shape_fn((N, V), |(r, j)| {
        let x = ((r * 131 + j * 17) as f32 * 0.37).sin() * (1.0 + (r % 4) as f32 * 3.0);
        if j == (r * 7) % V {
            x + 6.0
        } else {
            x
        }
    })
}

fn tokens() -> Array1<i64> {
    Array1::from_shape_fn(N, |r| {
        if r % 3 == 2 {
            -100
        } else {
            ((r * 7) % V) as i64
        }
    })
}

/// The (T17) bounds of `ce` on `p` for a kernel of `algorithm`'s model.
fn bounds(
    p: &Problem<'_>,
    ce: &CrossEntropy<'_>,
    k: &CpuKernel,
    oracle: &OracleLoss,
) -> Vec<ErrorBound> {
    let shape = p.validate_shapes().unwrap();
    let model = Model::declared(&k.algorithm(&shape)).with_loss_order(Order::Declared(
        k.loss_summation(shape.vocab_size.max(shape.n)),
    ));
    let acc = shape.dtype.accumulation();
    let eps = ce.effective_label_smoothing(acc).unwrap();
    let o = Oracle::default();
    let rows: Vec<_> = (0..N)
        .map(|r| {
            if !p.has_target(r) {
                return Ok(LossRowBound {
                    err: 0.0,
                    mag: 0.0,
                    infinite: false,
                });
            }
            let stats = o.row_stats(p, r).unwrap();
            let ctx = RowContext::from_problem(p, r).unwrap();
            model
                .row_bounds(&stats, &ctx)
                .loss_row(eps, |j| p.allowed(r, j))
        })
        .collect();
    let counted: Vec<bool> = (0..N).map(|r| p.has_target(r)).collect();
    let w: Option<Vec<f64>> = ce.loss_weights.map(|w| w.to_vec());
    loss_bounds(
        &rows,
        &counted,
        w.as_deref(),
        ce.reduction,
        model.loss_order.summation(shape.n),
        oracle.divisor.lo,
        acc,
        shape.dtype,
    )
}

/// `(max error / bound, every value within its bound)` of `candidate`.
fn judge(oracle: &OracleLoss, candidate: &[f64], b: &[ErrorBound]) -> (f64, bool) {
    let mut worst: f64 = 0.0;
    let mut ok = true;
    for ((e, &c), b) in oracle.values.iter().zip(candidate).zip(b) {
        let ErrorBound::Abs(bound) = *b else {
            panic!("no bound: {b:?}")
        };
        let err = if e.rounded.is_nan() && c.is_nan() {
            0.0
        } else {
            e.error(c)
        };
        ok &= err <= bound;
        if bound > 0.0 {
            worst = worst.max(err / bound);
        } else if err > 0.0 {
            worst = f64::INFINITY;
        }
    }
    (worst, ok)
}

/// Runs `f(problem, live, dtype)` per logits dtype; `live` is `problem`
/// with every ignored row given token 0 (a live target).
fn each_dtype(mut f: impl FnMut(&Problem<'_>, &Problem<'_>, Dtype)) {
    let x = logits();
    let t = tokens();
    let t_live = t.mapv(|v| if v == -100 { 0 } else { v });
    let mask = Array2::from_shape_fn((N, V), |(r, j)| {
        r % 4 != 3 || j % 5 != 1 || j == (r * 7) % V
    });
    let xb = x.mapv(bf16::from_f32);
    let xh = x.mapv(f16::from_f32);
    for (logits, dtype) in [
        (Logits::F32(x.view()), Dtype::F32),
        (Logits::Bf16(xb.view()), Dtype::Bf16),
        (Logits::F16(xh.view()), Dtype::F16),
    ] {
        let mut p = Problem::new(logits);
        p.tokens = Some(t.view());
        p.sampling_mask = Some(mask.view());
        let mut live = p;
        live.tokens = Some(t_live.view());
        f(&p, &live, dtype);
    }
}

#[test]
fn correct_kernels_pass_every_reduction() {
    let w = Array1::from_shape_fn(N, |r| 0.5 + 0.25 * (r % 4) as f64);
    let o = Oracle::default();
    let mut worst_all = 0.0f64;
    each_dtype(|p, _live, dtype| {
        for k in [
            CpuKernel::fused(),
            CpuKernel::chunked(1),
            CpuKernel::chunked(4),
        ] {
            for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
                for eps in [0.0, 0.1] {
                    for weights in [None, Some(w.view())] {
                        let ce = CrossEntropy {
                            reduction,
                            label_smoothing: eps,
                            loss_weights: weights,
                            ..Default::default()
                        };
                        let exact = o.cross_entropy(p, &ce, dtype).unwrap();
                        let got = k.cross_entropy(p, &ce, dtype).unwrap();
                        let b = bounds(p, &ce, &k, &exact);
                        let (worst, ok) = judge(&exact, &got.values, &b);
                        worst_all = worst_all.max(worst);
                        assert!(
                            ok,
                            "{dtype:?} {} {reduction} eps {eps} weights {}: error/bound {worst}",
                            k.name(),
                            weights.is_some()
                        );
                    }
                }
            }
        }
    });
    eprintln!("largest error / bound: {worst_all:.3e}");
}

#[test]
fn the_issue_bugs_fail_the_bound() {
    let o = Oracle::default();
    each_dtype(|p, live, dtype| {
        let k = CpuKernel::chunked(4);
        let chunks = N.div_ceil(4) as f64;
        let mean = CrossEntropy {
            reduction: Reduction::Mean,
            label_smoothing: 0.1,
            ..Default::default()
        };
        let exact = o.cross_entropy(p, &mean, dtype).unwrap();
        let b = bounds(p, &mean, &k, &exact);
        let good = k.cross_entropy(p, &mean, dtype).unwrap().values;
        // NeMo Automodel #3803: the chunked mean times the chunk count.
        let times_chunks: Vec<f64> = good.iter().map(|v| dtype.round_f64(v * chunks)).collect();
        assert!(
            !judge(&exact, &times_chunks, &b).1,
            "{dtype:?}: x chunk count passed"
        );
        // PyTorch #73205, the count: the mean over all N rows, ignored ones counted.
        let sum = CrossEntropy {
            reduction: Reduction::Sum,
            ..mean
        };
        let s = k.cross_entropy(p, &sum, dtype).unwrap().values[0];
        let over_all = vec![dtype.round_f64(s / N as f64)];
        assert!(
            !judge(&exact, &over_all, &b).1,
            "{dtype:?}: mean over N passed"
        );
        // PyTorch #73205, the term: ignored rows' smoothing term
        // `eps mean_j(-log p_j)` left in the sum (their own row losses at
        // eps = 1, with any live token, `none`).
        let every = CrossEntropy {
            reduction: Reduction::None,
            label_smoothing: 1.0,
            ..Default::default()
        };
        let per_row = k.cross_entropy(live, &every, dtype).unwrap().values;
        let eps = mean
            .effective_label_smoothing(dtype.accumulation())
            .unwrap();
        let leaked: f64 = (0..N)
            .filter(|&r| !p.has_target(r))
            .map(|r| eps * per_row[r])
            .sum();
        let counted = (0..N).filter(|&r| p.has_target(r)).count() as f64;
        let with_leak = vec![dtype.round_f64(good[0] + leaked / counted)];
        assert!(
            !judge(&exact, &with_leak, &b).1,
            "{dtype:?}: leaked smoothing passed"
        );
    });
}

#[test]
fn an_all_ignored_mean_is_the_declared_value() {
    // Liger-Kernel #177: every row ignored, 0 / 0 where 0 is declared.
    let o = Oracle::default();
    let x = logits();
    let none = Array1::from_elem(N, -100i64);
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(none.view());
    let k = CpuKernel::chunked(4);
    for (mai, bad) in [(MeanAllIgnored::Zero, f64::NAN), (MeanAllIgnored::Nan, 0.0)] {
        let ce = CrossEntropy {
            reduction: Reduction::Mean,
            label_smoothing: 0.1,
            mean_all_ignored: mai,
            ..Default::default()
        };
        let exact = o.cross_entropy(&p, &ce, Dtype::F32).unwrap();
        let b = bounds(&p, &ce, &k, &exact);
        let got = k.cross_entropy(&p, &ce, Dtype::F32).unwrap().values;
        assert!(judge(&exact, &got, &b).1, "{mai:?}: {got:?}");
        assert!(!judge(&exact, &[bad], &b).1, "{mai:?}: {bad} passed");
    }
}

/// (S4) The reduced loss's statistical threshold: the reduction term
/// `min(gamma_D, c sqrt(n) u)` makes it no larger than the sound bound and
/// no smaller than the `c = 0` part, and under `sum` over many rows
/// (65536: `c sqrt(n)` well below the depth `D`) it is well below the
/// sound bound.
#[test]
fn reduced_loss_threshold_is_between_its_parts() {
    use logprobe_reference::spec::{Dtype, Reduction};
    use logprobe_verify::tolerance::loss_statistical_bounds;
    let n = 65536;
    let rows: Vec<Result<LossRowBound, _>> = (0..n)
        .map(|r| {
            Ok(LossRowBound {
                err: 1e-7,
                mag: 2.0 + (r % 7) as f64,
                infinite: false,
            })
        })
        .collect();
    let counted = vec![true; n];
    for (model, seq) in [(Model::lanes(8), false), (Model::sequential(), true)] {
        let s = model.loss_order.summation(n);
        let bound = |c: Option<f64>| {
            let b = match c {
                None => loss_bounds(
                    &rows,
                    &counted,
                    None,
                    Reduction::Sum,
                    s,
                    1.0,
                    Dtype::F32,
                    Dtype::F32,
                ),
                Some(c) => loss_statistical_bounds(
                    &rows,
                    &counted,
                    None,
                    Reduction::Sum,
                    s,
                    1.0,
                    (Dtype::F32, Dtype::F32),
                    c,
                ),
            };
            match b[..] {
                [ErrorBound::Abs(x)] => x,
                _ => panic!("{b:?}"),
            }
        };
        let (sound, stat, floor) = (bound(None), bound(Some(8.0)), bound(Some(0.0)));
        assert!(floor <= stat && stat <= sound, "{floor} {stat} {sound}");
        assert!(stat < sound / 2.0, "{model:?}: {stat} vs {sound}");
        // c sqrt(n) u sum|l| (4 c for one accumulator) on top of the rows' errors.
        let sum: f64 = (0..n).map(|r| 2.0 + (r % 7) as f64).sum();
        let c = if seq { 32.0 } else { 8.0 };
        let want = c * (n as f64).sqrt() * 2f64.powi(-24) * sum;
        assert!(
            (stat - floor) <= 1.01 * want + 1e-9,
            "{stat} - {floor} vs {want}"
        );
    }
}
