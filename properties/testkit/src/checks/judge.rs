//! Judging one call against the oracle: a kernel's declared error model,
//! the shared row walk, forward and backward judgements.

use ndarray::Array2;

use logprobe_kernels::kernel::{Feature, Kernel, KernelError};
use logprobe_reference::oracle::Exact;
use logprobe_reference::spec::{Cotangents, Dtype, Output, PerOutput, Problem, Shape};

use crate::cache::{oracle_vjp, OracleCase};
use crate::strategies::{CotangentData, ProblemData};
use logprobe_verify::tolerance::{self, Model, Order, RowTargets};

use super::*;

/// A kernel's own error model for a call with this shape: its declared
/// [`Algorithm`](logprobe_reference::spec::Algorithm) and, when it declares
/// one, its entropy form (else [`EntropyForm::Any`](logprobe_reference::spec::EntropyForm::Any)).
pub fn kernel_model(kernel: &dyn Kernel, shape: &Shape) -> Model {
    Model::declared(&kernel.algorithm(shape))
        .with_entropy_form(kernel.entropy_form().unwrap_or_default())
        .with_loss_order(Order::Declared(
            kernel.loss_summation(shape.vocab_size.max(shape.n)),
        ))
}

/// Judges a kernel's values of one call against the oracle under the
/// kernel's declared model ([`kernel_model`]), row by row through the
/// shared walk ([`tolerance::walk_row`]): every value must be a value of
/// its dtype and within its bound; the first one that is not is the error.
/// Returns the worst `error / bound` per output. A row's bounds are built
/// (O(V)) only when one of its values is inexact.
///
/// `exact` and `got` hold `[N, width]` per output (`got` in dtype `out`);
/// `cotangents` are those of the call (empty for a forward call).
///
/// # Errors
/// A description naming the output, row and column, the values, the
/// error and the bound.
#[allow(clippy::too_many_arguments)]
pub fn judge_values(
    kernel: &dyn Kernel,
    problem: &Problem<'_>,
    cotangents: &Cotangents<'_>,
    oracle: &OracleCase,
    exact: &PerOutput<&Array2<Exact>>,
    got: &PerOutput<&Array2<f64>>,
    out: Dtype,
) -> Result<Ratios, String> {
    let shape = problem.validate_shapes().map_err(|e| format!("{e}"))?;
    for (o, g) in got.iter() {
        let want = (shape.n, o.width(&shape));
        if g.dim() != want {
            return Err(format!("{o} has shape {:?}, expected {want:?}", g.dim()));
        }
        if exact.get(o).is_none_or(|x| x.dim() != want) {
            return Err(format!("the oracle gave no {o} of shape {want:?}"));
        }
    }
    let model = kernel_model(kernel, &shape);
    let mut ratios = Ratios::default();
    for row in 0..shape.n {
        let targets = RowTargets::new(problem, row, cotangents);
        // The row's bounds are built once (O(V)), only when some value is inexact.
        let rb = std::cell::OnceCell::new();
        let rb = || {
            rb.get_or_init(|| {
                oracle
                    .row_bounds(&model, row)
                    .ok_or_else(|| format!("the oracle gave no statistics for row {row}"))
            })
        };
        let exact_rows = exact.as_ref().map(|_, x| x.row(row));
        let got_rows = got.as_ref().map(|_, g| (out, g.row(row)));
        tolerance::walk_row(
            &exact_rows,
            &got_rows,
            |o| o.judged(problem, row),
            |e| {
                let (c, x) = (e.candidate, e.exact);
                // Named only in a failure (formatting it per element costs).
                let at = || e.output.element(row, e.col);
                if !(c.is_nan() || e.output.is_count() || out.round_f64(c) == c) {
                    return Err(format!("{} = {c:e} is not a {out} value", at()));
                }
                if x.error(c) == 0.0 {
                    ratios.record(e.output, 0.0);
                    return Ok(());
                }
                let bound = rb()
                    .as_ref()
                    .map_err(Clone::clone)?
                    .bound(e.output, e.col, &targets, out);
                let j = tolerance::judge(x, c, out, &bound);
                if !j.pass {
                    return Err(format!(
                        "{}; row targets: token {}, {} top-k ids, cotangents g = {:e}, h = {:e}",
                        out_of_bound(at(), x, c, out, &j),
                        targets.token.map_or("none".to_string(), |t| t.to_string()),
                        targets.topk_ids.len(),
                        targets.g,
                        targets.h
                    ));
                }
                ratios.record(e.output, j.ratio.unwrap_or(0.0));
                Ok(())
            },
        )?;
    }
    Ok(ratios)
}

/// Judges one forward call of `kernel` on `data` with output dtype `out`;
/// `record` adds the ratios (only for f32 outputs of f32 logits).
pub fn judge_forward(
    kernel: &dyn Kernel,
    data: &ProblemData,
    oracle: &OracleCase,
    out: Dtype,
    record: bool,
) -> Result<Ratios, String> {
    let full = data.problem();
    let caps = kernel.capabilities();
    let a = asked(&full, &caps);
    let before = fingerprint(data);
    let result = kernel.forward(&a.problem, out);
    if fingerprint(data) != before {
        return Err("forward changed its inputs".into());
    }
    let expected = expected_error(&a.problem, oracle);
    let fo = match (result, expected, a.unsupported) {
        (Err(KernelError::Unsupported { .. }), _, Some(_)) => return Ok(Ratios::default()),
        (Err(KernelError::Spec(e)), Some(x), _) if same_error(&e, &x) => {
            return Ok(Ratios::default())
        }
        (Err(e), Some(x), _) => {
            return Err(format!(
                "returned the error \"{e}\", expected the error \"{x}\""
            ))
        }
        (Ok(_), Some(x), _) => {
            return Err(format!(
                "returned values for bad input, expected the error \"{x}\""
            ))
        }
        (Err(e), None, _) => {
            return Err(format!(
                "returned the error \"{e}\" on valid, supported input"
            ))
        }
        (Ok(fo), None, _) => fo,
    };
    let Ok(of) = &oracle.forward else {
        // The oracle refused a part the kernel was not asked (top-k ids):
        // nothing to judge the values against.
        return Ok(Ratios::default());
    };
    if fo.dtype != out {
        return Err(format!("output dtype {} instead of {out}", fo.dtype));
    }
    for o in Output::FORWARD {
        if o.requested(&a.problem) && !fo.values.contains(o) {
            return Err(format!("{o} missing"));
        }
    }
    // Only what the kernel was asked is judged.
    let got: PerOutput<&Array2<f64>> = fo
        .values
        .iter()
        .filter(|(o, _)| o.requested(&a.problem))
        .collect();
    let r = judge_values(
        kernel,
        &a.problem,
        &Cotangents::default(),
        oracle,
        &of.values.as_ref(),
        &got,
        out,
    )?;
    Ok(if record { r } else { Ratios::default() })
}

/// Judges one backward call (or, with `in_place`, the in-place backward on
/// a copy of the logits, output in the logits' dtype) against the oracle's
/// VJP with the per-element bound.
#[allow(clippy::too_many_arguments)]
pub fn judge_backward(
    kernel: &dyn Kernel,
    data: &ProblemData,
    cot: &CotangentData,
    oracle: &OracleCase,
    vjp_key: &str,
    out: Dtype,
    in_place: bool,
    record: bool,
) -> Result<Ratios, String> {
    let caps = kernel.capabilities();
    if !(if in_place {
        caps.supports(Feature::InPlaceBackward)
    } else {
        caps.computes(Output::GradLogits)
    }) {
        return Ok(Ratios::default());
    }
    let full = data.problem();
    let a = asked(&full, &caps);
    let cv = cot_for(data, &a.problem, cot);
    let out = if in_place { data.logits.dtype() } else { out };
    let before = fingerprint(data);
    let result = if in_place {
        let mut copy = data.logits.clone();
        let p = a.problem;
        let r = kernel.backward_in_place(p.with_logits(copy.view_mut()), &cv);
        match r {
            Ok(()) => Ok(copy.to_f64()),
            Err(e) => {
                if !copy.bits_eq(&data.logits) {
                    return Err(format!(
                        "in-place backward returned the error \"{e}\" and changed the logits"
                    ));
                }
                Err(e)
            }
        }
    } else {
        kernel.backward(&a.problem, &cv, out)
    };
    if fingerprint(data) != before {
        return Err("backward changed its inputs".into());
    }
    // The oracle's VJP order (`Oracle::vjp_counted`, every kernel's too):
    // shapes, then cotangents, then the problem's rows and values.
    let expected = match a.problem.validate_shapes() {
        Err(e) => Some(e),
        Ok(shape) => a
            .problem
            .validate_cotangents(&shape, &cv)
            .err()
            .or_else(|| expected_error(&a.problem, oracle)),
    };
    let grad = match (result, expected, a.unsupported) {
        (Err(KernelError::Unsupported { .. }), _, Some(_)) => return Ok(Ratios::default()),
        (Err(KernelError::Spec(e)), Some(x), _) if same_error(&e, &x) => {
            return Ok(Ratios::default())
        }
        (Err(e), Some(x), _) => {
            return Err(format!(
                "returned the error \"{e}\", expected the error \"{x}\""
            ))
        }
        (Ok(_), Some(x), _) => {
            return Err(format!(
                "returned a gradient for bad input, expected the error \"{x}\""
            ))
        }
        (Err(e), None, _) => {
            return Err(format!(
                "returned the error \"{e}\" on valid, supported input"
            ))
        }
        (Ok(g), None, _) => g,
    };
    let key = format!(
        "{vjp_key} asked={:?}/{:?} loss-side={}/{}/{}/{} policy={:?} kl={}/{}",
        a.problem.options.entropy,
        a.problem.topk_ids.is_some(),
        cv.column(Output::Lse).is_some(),
        cv.column(Output::ZLoss).is_some(),
        cv.column(Output::Loss).is_some(),
        cv.column(Output::SoftCrossEntropy).is_some(),
        logprobe_reference::spec::PolicyTerm::ALL.map(|t| cv.policy(t).is_some()),
        cv.column(Output::ForwardKl).is_some(),
        cv.column(Output::ReverseKl).is_some(),
    );
    // The problem and cotangents the kernel was given (options and top-k
    // ids as asked).
    let vjp = oracle_vjp(&key, &a.problem, &cv);
    let exact = match vjp.as_ref() {
        Ok(x) => x,
        Err(e) => {
            return Err(format!(
                "oracle VJP refused a problem the kernel accepted: {e}"
            ))
        }
    };
    let ratios = judge_values(
        kernel,
        &a.problem,
        &cv,
        oracle,
        &std::iter::once((Output::GradLogits, exact)).collect(),
        &std::iter::once((Output::GradLogits, &grad)).collect(),
        out,
    )?;
    Ok(if record { ratios } else { Ratios::default() })
}
