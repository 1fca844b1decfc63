//! Shared by the gradient-bound tests (`kl_grad_bound.rs`,
//! `policy_grad_bound.rs`, `soft_ce_grad_bound.rs`): a gradient judged against the oracle's VJP
//! under a model's per-element bound, the bound built from each row's
//! [`RowTargets`] as verify builds it.

use logprobe_reference::oracle::{Exact, Oracle};
use logprobe_reference::spec::{Cotangents, Dtype, Output, Problem};
use logprobe_verify::tolerance::{ErrorBound, Model, RowContext, RowTargets};
use ndarray::Array2;

/// The worst of a judged gradient.
#[derive(Default, Debug, Clone, Copy)]
pub struct Worst {
    /// Worst `error / bound` over the elements.
    pub ratio: f64,
    /// The same over the marked columns only (the test's `marked`).
    pub marked: f64,
    /// Elements over their bound.
    pub fails: usize,
}

/// Judges `grad [N, V]` against the exact `dx [N, V]` under `model` for
/// output dtype `out`; `marked(targets, j)` picks the columns of
/// [`Worst::marked`]. Panics (a test) where the model gives no bound.
pub fn judge(
    p: &Problem<'_>,
    cot: &Cotangents<'_>,
    model: &Model,
    grad: &Array2<f64>,
    dx: &Array2<Exact>,
    out: Dtype,
    marked: impl Fn(&RowTargets, usize) -> bool,
) -> Worst {
    let o = Oracle::default();
    let (n, v) = p.logits.dim();
    let mut w = Worst::default();
    for r in 0..n {
        let stats = o.row_stats(p, r).unwrap();
        let ctx = RowContext::from_problem(p, r).unwrap();
        let rb = model.row_bounds(&stats, &ctx);
        let targets = RowTargets::new(p, r, cot);
        for j in 0..v {
            let ErrorBound::Abs(bound) = rb.bound(Output::GradLogits, j, &targets, out) else {
                panic!("no bound at [{r}, {j}]")
            };
            let err = dx[[r, j]].error(grad[[r, j]]);
            if err > bound {
                w.fails += 1;
            }
            let ratio = if bound > 0.0 {
                err / bound
            } else if err > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            w.ratio = w.ratio.max(ratio);
            if marked(&targets, j) {
                w.marked = w.marked.max(ratio);
            }
        }
    }
    w
}
