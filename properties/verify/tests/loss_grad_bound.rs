//! The gradient bound of the loss-side cotangents (TOLERANCE.md (T19))
//! against our CPU kernels and the exact oracle: `grad_lse`, `grad_z_loss`
//! and `grad_loss` (none, sum, mean with weights, label smoothing, a mask,
//! a temperature that is not a power of two, `ignore_index` rows) on f32,
//! bf16 and f16 logits pass in every staging, the bound is not vacuous,
//! and three real bug kinds fail it: the z-loss gradient without its
//! factor 2, the mean's gradient divided by `N` instead of the counted
//! weight, and the smoothing constant missing.

use half::{bf16, f16};
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::oracle::{Exact, Oracle};
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LossOptions, MeanAllIgnored, Output, Problem, Reduction,
};
use logprobe_verify::tolerance::{
    ErrorBound, GradCotangents, LossGradCotangents, Model, RowContext,
};
use ndarray::{Array1, Array2};

const N: usize = 6;
const V: usize = 1500;
const COEF: f64 = 1e-3;

struct Case {
    x: Array2<f32>,
    xb: Array2<bf16>,
    xh: Array2<f16>,
    t: Array1<i64>,
    mask: Array2<bool>,
    w: Array1<f64>,
    a: Array1<f64>,
    b: Array1<f64>,
    g_rows: Array1<f64>,
    g_one: Array1<f64>,
}

fn case() -> Case {
    let x = Array2::from_shape_fn((N, V), |(r, j)| {
        ((r * 131 + j * 17) as f32 * 0.37).sin() * (2.0 + (r % 3) as f32 * 4.0)
    });
    let t = Array1::from_shape_fn(N, |r| if r == 2 { -100 } else { ((r * 7) % V) as i64 });
    Case {
        xb: x.mapv(bf16::from_f32),
        xh: x.mapv(f16::from_f32),
        x,
        mask: Array2::from_shape_fn((N, V), |(r, j)| (r + j) % 5 != 0 || j == (r * 7) % V),
        w: Array1::from_shape_fn(N, |r| 0.5 + 0.25 * r as f64),
        a: Array1::from_shape_fn(N, |r| 0.75 - 0.25 * r as f64),
        b: Array1::from_shape_fn(N, |r| 1.0 + r as f64),
        g_rows: Array1::from_shape_fn(N, |r| 2.0 - 0.5 * r as f64),
        g_one: Array1::from(vec![3.0]),
        t,
    }
}

fn problem<'a>(c: &'a Case, l: Logits<'a>, red: Reduction, eps: f64, masked: bool) -> Problem<'a> {
    let mut p = Problem::new(l);
    p.tokens = Some(c.t.view());
    p.options.entropy = None;
    p.options.temperature = 0.7;
    p.options.lse = true;
    p.options.z_loss_coef = Some(COEF);
    p.options.loss = Some(LossOptions {
        reduction: red,
        label_smoothing: eps,
        mean_all_ignored: MeanAllIgnored::Nan,
    });
    p.loss_weights = Some(c.w.view());
    if masked {
        p.sampling_mask = Some(c.mask.view());
    }
    p
}

fn cot<'a>(c: &'a Case, red: Reduction) -> Cotangents<'a> {
    Cotangents::default()
        .with_column(Output::Lse, c.a.view())
        .with_column(Output::ZLoss, c.b.view())
        .with_column(
            Output::Loss,
            match red {
                Reduction::None => c.g_rows.view(),
                _ => c.g_one.view(),
            },
        )
}

/// The bound's loss-side cotangents of row `r` (what verify builds).
fn loss_cot<'a>(p: &Problem<'a>, cot: &Cotangents<'_>, r: usize) -> LossGradCotangents<'a> {
    let acc = Dtype::F32;
    let ce = p.cross_entropy().unwrap();
    let w_sum: f64 = p.loss_divisor_terms().map_or(0.0, |t| t.sum());
    let ell = match p.loss_cotangent(cot, r) {
        None => 0.0,
        Some((g, w)) => {
            let gw = (g * w).abs();
            match ce.reduction {
                // Upward enough for a test: one ulp up of the f64 quotient.
                Reduction::Mean => (gw / w_sum).next_up(),
                _ => gw,
            }
        }
    };
    let v = p.logits.dim().1;
    LossGradCotangents {
        a: cot.column(Output::Lse).map_or(0.0, |a| a[r]),
        zb: 2.0 * COEF * cot.column(Output::ZLoss).map_or(0.0, |b| b[r]),
        ell,
        mean_rows: (ce.reduction == Reduction::Mean).then_some(N),
        eps: ce.effective_label_smoothing(acc).unwrap(),
        count: (0..v).filter(|&j| p.allowed(r, j)).count(),
        mask: p
            .sampling_mask
            .map(|m| m.index_axis_move(ndarray::Axis(0), r)),
        ..Default::default()
    }
}

#[derive(Default, Debug)]
struct Worst {
    ratio: f64,
    fails: usize,
}

fn judge<'a>(
    p: &Problem<'a>,
    cot: &Cotangents<'_>,
    model: &Model,
    grad: &Array2<f64>,
    dx: &Array2<Exact>,
    out: Dtype,
) -> Worst {
    let o = Oracle::default();
    let mut w = Worst::default();
    for r in 0..N {
        let stats = o.row_stats(p, r).unwrap();
        let ctx = RowContext::from_problem(p, r).unwrap();
        let rb = model.row_bounds(&stats, &ctx);
        let gc = GradCotangents {
            g: 0.0,
            h: 0.0,
            token: p.has_target(r).then(|| p.tokens.unwrap()[r] as usize),
            topk: &[],
            loss: Some(loss_cot(p, cot, r)),
            policy: None,
            kl: None,
        };
        for j in 0..V {
            let ErrorBound::Abs(bound) = rb.grad(j, &gc, out) else {
                panic!("no bound at [{r}, {j}]")
            };
            let err = dx[[r, j]].error(grad[[r, j]]);
            if err > bound {
                w.fails += 1;
            }
            w.ratio = w.ratio.max(if bound > 0.0 {
                err / bound
            } else if err > 0.0 {
                f64::INFINITY
            } else {
                0.0
            });
        }
    }
    w
}

#[test]
fn correct_kernels_pass_and_bugs_fail() {
    let c = case();
    let mut worst = 0.0f64;
    let mut caught = [0usize; 3];
    for (l, dtype) in [
        (Logits::F32(c.x.view()), Dtype::F32),
        (Logits::Bf16(c.xb.view()), Dtype::Bf16),
        (Logits::F16(c.xh.view()), Dtype::F16),
    ] {
        for red in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            for (eps, masked) in [(0.0, false), (0.1, true)] {
                let p = problem(&c, l, red, eps, masked);
                let cot = cot(&c, red);
                let shape = p.validate_shapes().unwrap();
                let outs = if dtype == Dtype::F32 {
                    vec![Dtype::F32]
                } else {
                    vec![Dtype::F32, dtype]
                };
                for out in outs {
                    let dx = Oracle::default().vjp(&p, &cot, out).unwrap();
                    for k in [CpuKernel::fused(), CpuKernel::chunked(4)] {
                        let model = Model::declared(&k.algorithm(&shape));
                        let grad = k.backward(&p, &cot, out).unwrap();
                        let w = judge(&p, &cot, &model, &grad, &dx, out);
                        assert_eq!(
                            w.fails,
                            0,
                            "{} {dtype:?}->{out:?} {red} eps {eps} masked {masked}: {w:?}",
                            k.name()
                        );
                        if out == Dtype::F32 {
                            worst = worst.max(w.ratio);
                        }
                    }
                    if out != Dtype::F32 {
                        continue;
                    }
                    let k = CpuKernel::fused();
                    let model = Model::declared(&k.algorithm(&shape));
                    // Bug 1: the z-loss gradient without its factor 2.
                    let half_b = c.b.mapv(|b| b / 2.0);
                    let bug1 = cot.with_column(Output::ZLoss, half_b.view());
                    let g1 = k.backward(&p, &bug1, out).unwrap();
                    caught[0] += judge(&p, &cot, &model, &g1, &dx, out).fails;
                    // Bug 2: the mean divided by N, not by the counted weight.
                    if red == Reduction::Mean {
                        let w_sum: f64 = p.loss_divisor_terms().unwrap().sum();
                        let scaled = Array1::from(vec![c.g_one[0] * w_sum / N as f64]);
                        let bug2 = cot.with_column(Output::Loss, scaled.view());
                        let g2 = k.backward(&p, &bug2, out).unwrap();
                        caught[1] += judge(&p, &cot, &model, &g2, &dx, out).fails;
                    }
                    // Bug 3: label smoothing dropped from the gradient.
                    if eps > 0.0 {
                        let mut q = problem(&c, l, red, 0.0, masked);
                        q.options.loss.as_mut().unwrap().label_smoothing = 0.0;
                        let g3 = k.backward(&q, &cot, out).unwrap();
                        caught[2] += judge(&p, &cot, &model, &g3, &dx, out).fails;
                    }
                }
            }
        }
    }
    println!("worst f32 err/bound {worst:.3}, bugs caught (elements) {caught:?}");
    assert!(worst > 1.0 / 256.0, "the bound is vacuous: {worst}");
    assert!(caught.iter().all(|&n| n > 0), "a bug passed: {caught:?}");
}
