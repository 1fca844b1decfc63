//! The gradient bound of `grad_soft_cross_entropy` (TOLERANCE.md (T28))
//! against our CPU kernels and the exact oracle: teachers of mass 1 and
//! truncated (mass 0.6), one equal to the student's own softmax (the
//! cancellation `(sum p) q_j - p_j ~ 0`), zeros, a sampling mask with no
//! teacher mass on masked entries, a temperature that is not a power of
//! two, with `grad_lse` and `grad_log_probs` beside it (a source column),
//! on f32 and bf16 logits, in every
//! staging, the teacher as probabilities and as f32 log-probabilities
//! (T28l): every element passes, the bound is not vacuous, and the
//! textbook gradient `c (q_j - p_j)` (the mass taken as 1) fails on the
//! truncated teacher. A nonzero cotangent on a row of infinite `H` is a
//! typed error.

use half::bf16;
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::oracle::{Exact, Oracle};

mod common;
use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, Output, Problem, SpecError, TeacherForm,
};
use logprobe_verify::tolerance::Model;
use ndarray::{Array1, Array2};

const N: usize = 6;
const V: usize = 1500;

struct Case {
    x: Array2<f32>,
    xb: Array2<bf16>,
    mask: Array2<bool>,
    c: Array1<f64>,
    a: Array1<f64>,
    t: Array1<i64>,
    g: Array1<f64>,
}

fn case() -> Case {
    let x = Array2::from_shape_fn((N, V), |(r, j)| {
        ((r * 131 + j * 17) as f32 * 0.37).sin() * (2.0 + (r % 3) as f32 * 4.0)
    });
    Case {
        xb: x.mapv(bf16::from_f32),
        x,
        mask: Array2::from_shape_fn((N, V), |(r, j)| (r + j) % 5 != 0),
        c: Array1::from_shape_fn(N, |r| [1.5, -0.75, 2.0, 0.0, -3.0, 1.0][r]),
        a: Array1::from_shape_fn(N, |r| 0.25 - 0.125 * r as f64),
        // Allowed under the mask: `(r + t) % 5 == 1`.
        t: Array1::from_shape_fn(N, |r| ((6 - r % 5) % 5 + 10 * r) as i64),
        g: Array1::from_shape_fn(N, |r| 0.5 + 0.25 * r as f64),
    }
}

/// The teacher `[N, V]` of `kind` for logits `x` (exact f64 view of the
/// logits) under `mask`: f32 probabilities; `mass` scales each row.
fn teacher(x: &Array2<f64>, mask: Option<&Array2<bool>>, kind: usize, mass: f64) -> Array2<f64> {
    let mut p = Array2::zeros((N, V));
    for r in 0..N {
        let allowed = |j: usize| mask.is_none_or(|m| m[[r, j]]);
        // kind 0: a sharper, shifted teacher; kind 1: the student's own
        // softmax at T = 0.7 (rounded to f32); kind 2: kind 0 with zeros.
        let y = |j: usize| match kind {
            1 => x[[r, j]] / 0.7,
            _ => x[[r, j]] * 1.3 + ((j * 7 + r) as f64 * 0.11).cos(),
        };
        let m = (0..V)
            .filter(|&j| allowed(j))
            .map(y)
            .fold(f64::MIN, f64::max);
        let w: Vec<f64> = (0..V)
            .map(|j| {
                let zero = !allowed(j) || (kind == 2 && j % 3 == 0);
                if zero {
                    0.0
                } else {
                    (y(j) - m).exp()
                }
            })
            .collect();
        let s: f64 = w.iter().sum();
        for j in 0..V {
            p[[r, j]] = f64::from((w[j] / s * mass) as f32);
        }
    }
    p
}

/// Judges a gradient as verify does ([`common::judge`]); no marked columns.
fn judge(
    p: &Problem<'_>,
    cot: &Cotangents<'_>,
    model: &Model,
    grad: &Array2<f64>,
    dx: &Array2<Exact>,
    out: Dtype,
) -> common::Worst {
    common::judge(p, cot, model, grad, dx, out, |_, _| false)
}

#[test]
fn correct_kernels_pass_and_the_unit_mass_gradient_fails() {
    let c = case();
    let x64 = c.x.mapv(f64::from);
    let mut worst = 0.0f64;
    let mut caught = 0usize;
    for dtype in [Dtype::F32, Dtype::Bf16] {
        for (kind, mass, masked, with_lse, form) in [
            (0, 1.0, false, false, TeacherForm::Probs),
            (0, 0.6, true, true, TeacherForm::Probs),
            (1, 1.0, false, false, TeacherForm::Probs),
            (2, 0.6, false, true, TeacherForm::Probs),
            (0, 0.6, true, true, TeacherForm::LogProbs),
            (2, 1.0, false, false, TeacherForm::LogProbs),
        ] {
            let mask = masked.then_some(&c.mask);
            let mut tp = teacher(&x64, mask, kind, mass);
            if form == TeacherForm::LogProbs {
                // The teacher's log-probs in f32 (`-inf` for no mass).
                tp.mapv_inplace(|p| f64::from(p.ln() as f32));
            }
            // ndarray's views are invariant in their lifetime: the logits'
            // view is made here, as long-lived as the teacher's.
            let l = match dtype {
                Dtype::F32 => Logits::F32(c.x.view()),
                _ => Logits::Bf16(c.xb.view()),
            };
            let mut p = Problem::new(l);
            p.options.entropy = None;
            p.options.temperature = 0.7;
            p.options.lse = with_lse;
            p.teacher_probs = Some(tp.view());
            p.options.teacher_form = form;
            p.sampling_mask = mask.map(|m| m.view());
            p.tokens = Some(c.t.view());
            let mut cot = Cotangents::default().with_column(Output::SoftCrossEntropy, c.c.view());
            if with_lse {
                cot = cot
                    .with_column(Output::Lse, c.a.view())
                    .with_column(Output::LogProbs, c.g.view());
            }
            let shape = p.validate_shapes().unwrap();
            let outs = if dtype == Dtype::F32 {
                vec![Dtype::F32]
            } else {
                vec![Dtype::F32, dtype]
            };
            for out in outs {
                let dx = Oracle::default().vjp(&p, &cot, out).unwrap();
                for k in [
                    CpuKernel::fused(),
                    CpuKernel::chunked(4),
                    CpuKernel::vocab_parallel(vec![700, 800]),
                ] {
                    let model = Model::declared(&k.algorithm(&shape));
                    let grad = k.backward(&p, &cot, out).unwrap();
                    let w = judge(&p, &cot, &model, &grad, &dx, out);
                    let what = format!(
                        "{} {dtype:?}->{out:?} teacher {kind} mass {mass} {form:?}",
                        k.name()
                    );
                    assert_eq!(w.fails, 0, "{what}: {w:?}");
                    if out == Dtype::F32 {
                        worst = worst.max(w.ratio);
                    }
                }
                // In place over f32 logits: the same values.
                if dtype == Dtype::F32 {
                    let mut xs = c.x.clone();
                    let k = CpuKernel::fused();
                    k.backward_in_place(p.with_logits(ndarray_mut(&mut xs)), &cot)
                        .unwrap();
                    let model = Model::declared(&k.algorithm(&shape));
                    let w = judge(&p, &cot, &model, &xs.mapv(f64::from), &dx, Dtype::F32);
                    assert_eq!(w.fails, 0, "in place, teacher {kind} mass {mass}: {w:?}");
                }
                if out != Dtype::F32 {
                    continue;
                }
                // The textbook gradient `c (q_j - p_j)`: one more `lse`
                // cotangent `c (1 - sum p)`.
                let k = CpuKernel::fused();
                let model = Model::declared(&k.algorithm(&shape));
                let extra = Array1::from_shape_fn(N, |r| {
                    let m: f64 = tp.row(r).iter().map(|&x| form.prob_f64(x)).sum();
                    cot.column(Output::Lse).map_or(0.0, |a| a[r]) + c.c[r] * (1.0 - m)
                });
                let mut q = p;
                q.options.lse = true;
                let bug = cot.with_column(Output::Lse, extra.view());
                let g = k.backward(&q, &bug, out).unwrap();
                let fails = judge(&p, &cot, &model, &g, &dx, out).fails;
                if mass != 1.0 {
                    caught += fails;
                }
            }
        }
    }
    println!("worst f32 err/bound {worst:.3}, unit-mass bug caught at {caught} elements");
    assert!(worst > 1.0 / 256.0, "the bound is vacuous: {worst}");
    assert!(caught > 0, "the unit-mass gradient passed");
}

fn ndarray_mut(x: &mut Array2<f32>) -> logprobe_reference::spec::LogitsMut<'_> {
    logprobe_reference::spec::LogitsMut::F32(x.view_mut())
}

#[test]
fn a_cotangent_on_an_infinite_row_is_refused() {
    let c = case();
    let x64 = c.x.mapv(f64::from);
    let mut tp = teacher(&x64, Some(&c.mask), 0, 1.0);
    // Row 1: teacher mass on a masked entry (`H = +inf`).
    tp[[1, 4]] = 0.01;
    let mut p = Problem::new(Logits::F32(c.x.view()));
    p.options.entropy = None;
    p.teacher_probs = Some(tp.view());
    p.sampling_mask = Some(c.mask.view());
    let cot = Cotangents::default().with_column(Output::SoftCrossEntropy, c.c.view());
    let want = SpecError::SoftCrossEntropyGradientInfinite {
        row: 1,
        col: 4,
        cotangent: -0.75,
    };
    assert_eq!(
        Oracle::default().vjp(&p, &cot, Dtype::F32).unwrap_err(),
        want
    );
    let e = CpuKernel::fused()
        .backward(&p, &cot, Dtype::F32)
        .unwrap_err();
    assert!(e.to_string().contains("grad_soft_cross_entropy[1]"), "{e}");
    // A zero cotangent on that row is fine.
    let mut zero = c.c.clone();
    zero[1] = 0.0;
    let ok = Cotangents::default().with_column(Output::SoftCrossEntropy, zero.view());
    assert!(Oracle::default().vjp(&p, &ok, Dtype::F32).is_ok());
}
