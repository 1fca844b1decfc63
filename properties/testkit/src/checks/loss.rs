//! The cross-entropy `loss` checks: a kernel's loss against the oracle's
//! exact value with the (T17) bounds ([`judge_loss`]), and its chunk-size
//! invariance bit for bit ([`check_loss_chunk_sizes`]).

use std::sync::Arc;

use logprobe_kernels::kernel::{Capabilities, CrossEntropyOutput, Kernel, KernelError};
use logprobe_reference::oracle::{Oracle, OracleLoss};
use logprobe_reference::spec::{CrossEntropy, Dtype, Output, Problem, SpecError};
use logprobe_verify::tolerance::{self, loss_bounds, ErrorBound, LossRowBound, NoBound};

use crate::cache::OracleCase;
use crate::strategies::{LossData, ProblemData};

use super::*;

/// The problem a loss call is given: `data`'s logits, tokens, mask and
/// options with every other output left out (no top-k ids or top-k KL,
/// entropy, `lse`, `z_loss` or policy terms: the loss reads none of them).
pub fn loss_problem(data: &ProblemData) -> Problem<'_> {
    let mut p = data.problem();
    p.topk_ids = None;
    p.options.topk_kl = None;
    p.teacher_topk_log_probs = None;
    p.policy = Default::default();
    p.options.policy_clamps = Default::default();
    p.options.entropy = None;
    p.options.lse = false;
    p.options.z_loss_coef = None;
    p.options.topk_kl = None;
    p.teacher_topk_log_probs = None;
    p
}

/// The oracle's view of one loss case: the row statistics (the bounds'
/// inputs) and the exact loss (target f64, so one enclosure judges
/// candidates of every dtype), or the spec error the case must give.
#[derive(Debug)]
pub struct LossOracle {
    /// Forward results, statistics and contexts of the problem's rows.
    pub case: Arc<OracleCase>,
    /// The exact loss, or the error.
    pub loss: Result<OracleLoss, SpecError>,
}

impl LossOracle {
    /// Runs the oracle on [`loss_problem`]`(data)` under `loss`, with the
    /// row statistics of `case` (the oracle's view of the whole problem
    /// `data`, [`crate::cache::oracle_case`]) when it has them: the rows
    /// are the same, only outputs the loss does not read differ. Without
    /// them (the whole problem is bad input) the loss problem's own.
    pub fn compute(data: &ProblemData, loss: &LossData, case: Arc<OracleCase>) -> LossOracle {
        let p = loss_problem(data);
        let case = if case.forward.is_ok() {
            case
        } else {
            Arc::new(OracleCase::of(&p))
        };
        let loss = Oracle::default().cross_entropy(&p, &loss.ce(), Dtype::F64);
        LossOracle { case, loss }
    }
}

/// The (T17) bounds of `ce` on `p` for a kernel judged under `model`, a
/// candidate in `out`: `[N]` under `none`, one under `sum` / `mean`.
fn bounds(
    p: &Problem<'_>,
    ce: &CrossEntropy<'_>,
    oracle: &LossOracle,
    exact: &OracleLoss,
    model: &tolerance::Model,
    out: Dtype,
) -> Result<Vec<ErrorBound>, String> {
    let shape = p.validate_shapes().map_err(|e| format!("{e}"))?;
    let acc = shape.dtype.accumulation();
    let eps = ce
        .effective_label_smoothing(acc)
        .map_err(|e| format!("{e}"))?;
    let rows: Vec<Result<LossRowBound, NoBound>> = (0..shape.n)
        .map(|r| {
            if !p.has_target(r) || ce.weight(r) == 0.0 {
                return Ok(Ok(LossRowBound {
                    err: 0.0,
                    mag: 0.0,
                    infinite: false,
                }));
            }
            oracle
                .case
                .row_bounds(model, r)
                .ok_or_else(|| format!("the oracle gave no statistics for row {r}"))
                .map(|rb| rb.loss_row(eps, |j| p.allowed(r, j)))
        })
        .collect::<Result<_, String>>()?;
    let counted: Vec<bool> = (0..shape.n).map(|r| p.has_target(r)).collect();
    let w: Option<Vec<f64>> = ce.loss_weights.map(|w| w.to_vec());
    Ok(loss_bounds(
        &rows,
        &counted,
        w.as_deref(),
        ce.reduction,
        model.loss_order.summation(shape.n),
        exact.divisor.lo,
        acc,
        out,
    ))
}

/// Judges one `loss` call of `kernel` on `data` under `loss` (output dtype
/// `out`) against the oracle under the kernel's declared model
/// ([`kernel_model`]): a kernel without `loss` in [`Capabilities::outputs`], or asked
/// an input feature it cannot take, must refuse
/// ([`KernelError::Unsupported`]); bad input must give the oracle's typed
/// error; otherwise every value must be a value of `out` within its
/// (T17) bound ([`loss_bounds`], judged by [`tolerance::judge`]), and a
/// declared-NaN mean (every row ignored, `mean_all_ignored = nan`) must be
/// NaN. The inputs must be unchanged. Returns the worst `error / bound`.
///
/// # Errors
/// A description naming the element (`loss[r]` or `loss`), the values,
/// the error and the bound.
pub fn judge_loss(
    kernel: &dyn Kernel,
    data: &ProblemData,
    loss: &LossData,
    oracle: &LossOracle,
    out: Dtype,
) -> Result<f64, String> {
    let caps: Capabilities = kernel.capabilities();
    let full = loss_problem(data);
    let a = asked(&full, &caps);
    let ce = loss.ce();
    let before = fingerprint(data);
    let result = kernel.cross_entropy(&a.problem, &ce, out);
    if fingerprint(data) != before {
        return Err("cross_entropy changed its inputs".into());
    }
    // The oracle's error (shapes, loss options, tokens, rows, in that order).
    let expected = oracle.loss.as_ref().err().cloned();
    let got: CrossEntropyOutput = match (result, expected) {
        (Err(KernelError::Unsupported { .. }), _)
            if !caps.computes(Output::Loss) || a.unsupported.is_some() =>
        {
            return Ok(0.0)
        }
        (Ok(_), _) if !caps.computes(Output::Loss) => {
            return Err(
                "returned a loss without declaring the loss output in Capabilities::outputs".into(),
            )
        }
        (Err(KernelError::Spec(e)), Some(x)) if same_error(&e, &x) => return Ok(0.0),
        (Err(e), Some(x)) => {
            return Err(format!(
                "returned the error \"{e}\", expected the error \"{x}\""
            ))
        }
        (Ok(_), Some(x)) => {
            return Err(format!(
                "returned a loss for bad input, expected the error \"{x}\""
            ))
        }
        (Err(e), None) => {
            return Err(format!(
                "returned the error \"{e}\" on valid, supported input"
            ))
        }
        (Ok(g), None) => g,
    };
    let exact = oracle
        .loss
        .as_ref()
        .map_err(|e| format!("the oracle refused a valid loss case: {e}"))?;
    if got.dtype != out {
        return Err(format!("output dtype {} instead of {out}", got.dtype));
    }
    let n = data.n();
    let want = ce.reduction.len(n);
    if got.values.len() != want || exact.values.len() != want {
        return Err(format!(
            "loss has {} values, expected {want} ({} reduction)",
            got.values.len(),
            ce.reduction
        ));
    }
    let shape = a.problem.validate_shapes().map_err(|e| format!("{e}"))?;
    let model = kernel_model(kernel, &shape);
    let at = |i: usize| {
        if want == n && ce.reduction == logprobe_reference::spec::Reduction::None {
            format!("loss[{i}]")
        } else {
            format!("loss ({})", ce.reduction)
        }
    };
    let mut b: Option<Vec<ErrorBound>> = None;
    let mut worst: f64 = 0.0;
    for (i, (&c, x)) in got.values.iter().zip(&exact.values).enumerate() {
        if !(c.is_nan() || out.round_f64(c) == c) {
            return Err(format!("{} = {c:e} is not a {out} value", at(i)));
        }
        if x.rounded.is_nan() || c.is_nan() {
            // The declared-NaN mean: NaN, and only NaN, is right.
            if x.rounded.is_nan() && c.is_nan() {
                continue;
            }
            return Err(format!(
                "{}: candidate {c:e}, exact {:e} (declared {})",
                at(i),
                x.rounded,
                ce.mean_all_ignored.name()
            ));
        }
        if x.error(c) == 0.0 {
            continue;
        }
        if b.is_none() {
            b = Some(bounds(&a.problem, &ce, oracle, exact, &model, out)?);
        }
        let bound = &b.as_ref().expect("bounds built")[i];
        let j = tolerance::judge(x, c, out, bound);
        if !j.pass {
            return Err(out_of_bound(at(i), x, c, out, &j));
        }
        worst = worst.max(j.ratio.unwrap_or(0.0));
    }
    Ok(worst)
}

/// Chunk-size invariance of the `loss`: the kernels `make(c)` for every
/// `c` in `chunk_sizes` give the same loss bit for bit (or the same
/// error) as `make(chunk_sizes[0])`, on [`loss_problem`]`(data)` in f32
/// (f64 for f64 logits). Kernels without `loss` in [`Capabilities::outputs`] are
/// skipped.
///
/// # Errors
/// The first chunk size whose loss differs, and where.
pub fn check_loss_chunk_sizes(
    make: &dyn Fn(usize) -> Box<dyn Kernel>,
    data: &ProblemData,
    loss: &LossData,
    chunk_sizes: &[usize],
) -> Result<(), String> {
    let Some(&c0) = chunk_sizes.first() else {
        return Ok(());
    };
    let k0 = make(c0);
    if !k0.capabilities().computes(Output::Loss) {
        return Ok(());
    }
    let p = loss_problem(data);
    let ce = loss.ce();
    let out = if p.logits.dtype() == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    };
    let base = k0.cross_entropy(&p, &ce, out);
    let bits = |o: &CrossEntropyOutput| o.values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for &c in &chunk_sizes[1..] {
        let got = make(c).cross_entropy(&p, &ce, out);
        if !result_eq(&base, &got, |a, b| a.dtype == b.dtype && bits(a) == bits(b)) {
            // The first element that differs (or the error), not the arrays.
            let what = match (&got, &base) {
                (Ok(a), Ok(b)) if a.values.len() == b.values.len() => {
                    let i = (0..a.values.len())
                        .find(|&i| a.values[i].to_bits() != b.values[i].to_bits())
                        .unwrap_or(0);
                    format!(
                        "element {i} of {}: {:e} ({}) vs {:e} ({})",
                        a.values.len(),
                        a.values.get(i).copied().unwrap_or(f64::NAN),
                        a.dtype,
                        b.values.get(i).copied().unwrap_or(f64::NAN),
                        b.dtype
                    )
                }
                (Ok(a), Ok(b)) => format!("{} values vs {}", a.values.len(), b.values.len()),
                (Ok(_), Err(e)) => format!("values vs the error \"{e}\""),
                (Err(e), Ok(_)) => format!("the error \"{e}\" vs values"),
                (Err(e), Err(f)) => format!("the error \"{e}\" vs the error \"{f}\""),
            };
            return Err(format!(
                "loss ({}) at chunk_size {c} vs chunk_size {c0}: {what}",
                ce.reduction
            ));
        }
    }
    Ok(())
}
