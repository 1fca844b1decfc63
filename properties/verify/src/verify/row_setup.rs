//! What [`super::engine`]'s row check sets up before judging: the row's
//! inputs and bounds' context (with a fused linear kernel's matmul stage,
//! TOLERANCE.md (T29)), the forward dtypes and the bounds' grouping keys.

use logprobe_reference::spec::{Dtype, SpecError};

use crate::dump::{Dump, DumpError, RowInputs};
use crate::tolerance;
use crate::verify::VerifyConfig;
use rayon::prelude::*;

/// Row `r`'s inputs, and the kernel's own logits judged against the
/// matmul when the dump gives them beside `hidden`
/// ([`super::linear_logits`]; `acc` the kernel's accumulation dtype,
/// `keep` worst elements kept). Logits made from `hidden` are validated
/// here: their rows skip [`super::verify_dump`]'s validation pass
/// (decoding one costs `O(V H)`), and the first bad row in order is
/// reported all the same.
///
/// # Errors
/// [`Dump::row`]'s, and [`RowInputs::validate`]'s for such rows.
pub(super) fn row_inputs(
    dump: &Dump<'_>,
    r: usize,
    acc: Dtype,
    (keep, stat_c): (usize, Option<f64>),
    linear: Option<Result<logprobe_reference::oracle::linear::LinearRow, DumpError>>,
) -> Result<(RowInputs, Option<super::acc::OutputAcc>), DumpError> {
    let inputs = dump.row_with(r, linear)?;
    if dump.logits.linear().is_some() {
        inputs.validate()?;
    }
    let logits = super::linear_logits::judge_logits_row(dump, &inputs, acc, (keep, stat_c));
    Ok((inputs, logits))
}

/// The candidate dtypes that need a forward call, deduplicated.
pub(super) fn forward_dtypes(dump: &Dump<'_>) -> Vec<Dtype> {
    let mut v: Vec<Dtype> = dump
        .candidates
        .iter()
        .filter(|(o, _)| o.is_forward())
        .map(|(_, c)| c.dtype)
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The bounds' context of a row ([`tolerance::RowContext::from_problem`]),
/// with the matmul stage (T29) for logits made from `hidden` and
/// `lm_head_weight` by a kernel accumulating in `acc`.
pub(super) fn row_context(
    dump: &Dump<'_>,
    inputs: &RowInputs,
    acc: Dtype,
) -> Result<tolerance::RowContext, SpecError> {
    let ctx = tolerance::RowContext::from_problem(&inputs.problem(), 0)?;
    Ok(match (inputs.linear, dump.logits.linear()) {
        (Some(stats), Some(l)) => {
            let logits_dtype = match l.logits_dtype {
                crate::dump::LmHeadLogitsDtype::Input => Some(l.dtype),
                crate::dump::LmHeadLogitsDtype::Accumulation => None,
            };
            ctx.with_linear(
                tolerance::LinearContext {
                    stats,
                    logits_dtype,
                },
                acc,
            )
        }
        _ => ctx,
    })
}

/// The grouping keys of row 0 of `p` for the bounds' per-entry sums
/// ([`tolerance::RowBounds::new_shared`]), `[V]`: a 16-bit logit's raw
/// bits and its sampling-mask bit; `None` for f32 and f64 logits (their
/// values are mostly distinct).
pub(super) fn entry_keys(p: &logprobe_reference::spec::Problem<'_>, v: usize) -> Option<Vec<u32>> {
    use logprobe_reference::spec::Logits;
    let bits: Vec<u32> = match p.logits {
        Logits::Bf16(a) => a
            .row(0)
            .iter()
            .take(v)
            .map(|x| u32::from(x.to_bits()))
            .collect(),
        Logits::F16(a) => a
            .row(0)
            .iter()
            .take(v)
            .map(|x| u32::from(x.to_bits()))
            .collect(),
        _ => return None,
    };
    Some(match p.sampling_mask {
        Some(m) => bits
            .into_iter()
            .zip(m.row(0))
            .map(|(b, &ok)| b | (u32::from(ok) << 16))
            .collect(),
        None => bits,
    })
}

/// Row `r`'s gradient with respect to its logits for the LM head's
/// gradients ([`super::linear_grads`]), when the dump has any: the
/// oracle's enclosures and each column's grad-logits bound per model, in
/// the dtype the kernel keeps that gradient in (the logits': the matmul's
/// under `lm_head_logits_dtype=input`, else `acc`). Padding columns are
/// exactly 0 with bound 0.
///
/// # Errors
/// The oracle's [`SpecError`]s.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_grad_row<const M: usize>(
    dump: &Dump<'_>,
    oracle: &mut crate::row_oracle::RowOracle,
    cot: &logprobe_reference::spec::Cotangents<'_>,
    rb: &[tolerance::RowBounds<'_>; M],
    grad_row: &tolerance::GradRow<M>,
    grad_cot: &tolerance::GradCotangents<'_>,
    r: usize,
    acc: Dtype,
) -> Result<Option<super::linear_grads::LinearGradRow>, SpecError> {
    let (Some(l), true) = (dump.logits.linear(), dump.linear_grads.any()) else {
        return Ok(None);
    };
    linear_grad_row_of(
        l,
        oracle,
        cot,
        (rb, grad_row, grad_cot),
        (r, acc, dump.vocab_size()),
    )
}

/// [`linear_grad_row`] for a dump whose logits are `l`'s.
fn linear_grad_row_of<const M: usize>(
    l: &crate::dump::LinearLogits<'_>,
    oracle: &mut crate::row_oracle::RowOracle,
    cot: &logprobe_reference::spec::Cotangents<'_>,
    (rb, grad_row, grad_cot): (
        &[tolerance::RowBounds<'_>; M],
        &tolerance::GradRow<M>,
        &tolerance::GradCotangents<'_>,
    ),
    (r, acc, v): (usize, Dtype, usize),
) -> Result<Option<super::linear_grads::LinearGradRow>, SpecError> {
    let gd = match l.logits_dtype {
        crate::dump::LmHeadLogitsDtype::Input => l.dtype,
        crate::dump::LmHeadLogitsDtype::Accumulation => acc,
    };
    let g = oracle.vjp(cot, gd)?;
    let row = g.row(0).to_vec();
    Ok(Some(super::linear_grads::LinearGradRow::new(
        r,
        &row,
        |j| {
            if j < v {
                let b = tolerance::RowBounds::grad_many_with(rb, grad_row, j, grad_cot, gd);
                std::array::from_fn(|m| {
                    b.get(m)
                        .cloned()
                        .unwrap_or(tolerance::ErrorBound::Abs(f64::INFINITY))
                })
            } else {
                std::array::from_fn(|_| tolerance::ErrorBound::Abs(0.0))
            }
        },
    )))
}

/// Each row's result, in the order of `rows` (rows in parallel; logits
/// from `hidden` a block of rows at once, the weight decoded once a
/// block).
pub(super) fn verify_rows(
    dump: &Dump<'_>,
    rows: &[usize],
    acc_dtype: Dtype,
    config: &VerifyConfig,
    progress: &crate::progress::Progress,
) -> Vec<Result<super::engine::RowResult, DumpError>> {
    let keep = config.worst;
    match dump.logits.linear() {
        None => rows
            .par_iter()
            .map(|&r| {
                let out = super::engine::verify_row(dump, r, acc_dtype, config, keep, None);
                progress.inc();
                out
            })
            .collect(),
        Some(l) => {
            let block = if l.candidate.is_some() {
                4
            } else {
                LINEAR_BLOCK
            };
            let mut out = Vec::with_capacity(rows.len());
            for b in rows.chunks(block) {
                let pre = l.rows(b, dump.vocab_size());
                let done: Vec<_> = b
                    .par_iter()
                    .zip(pre)
                    .map(|(&r, pre)| {
                        let out =
                            super::engine::verify_row(dump, r, acc_dtype, config, keep, Some(pre));
                        progress.inc();
                        out
                    })
                    .collect();
                out.extend(done);
            }
            out
        }
    }
}

/// Rows of a fused linear dump whose logits are computed together (the
/// weight decoded once for them): 16 rows of `V = 152064` f64 logits are
/// 19.5 MB; 4 when every column's enclosure is kept too.
const LINEAR_BLOCK: usize = 16;
