//! What [`super::engine`]'s row check sets up before judging: the row's
//! inputs and bounds' context (with a fused linear kernel's matmul stage,
//! TOLERANCE.md (T29)), the forward dtypes, our own kernel's values on the
//! same row, and the bounds' grouping keys.

use logprobe_kernels::{CpuKernel, ForwardOutput, Kernel};
use logprobe_reference::spec::{Dtype, Output, Problem, SpecError};

use crate::dump::{Dump, DumpError, RowInputs};
use crate::tolerance;

/// Row `r`'s inputs. Logits made from `hidden` are validated here: their
/// rows skip [`super::verify_dump`]'s validation pass (decoding one costs
/// `O(V H)`), and the first bad row in order is reported all the same.
///
/// # Errors
/// [`Dump::row`]'s, and [`RowInputs::validate`]'s for such rows.
pub(super) fn row_inputs(dump: &Dump<'_>, r: usize) -> Result<RowInputs, DumpError> {
    let inputs = dump.row(r)?;
    if dump.logits.linear().is_some() {
        inputs.validate()?;
    }
    Ok(inputs)
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

/// Our correct f32 kernel's forward of row 0 of `p`, per forward dtype of
/// the dump's candidates (a dtype it does not support is left out; none
/// on logits from `hidden`, which it would read as f64 inputs).
pub(super) fn fused_forwards(dump: &Dump<'_>, p: &Problem<'_>) -> Vec<(Dtype, ForwardOutput)> {
    if dump.logits.linear().is_some() {
        return Vec::new();
    }
    forward_dtypes(dump)
        .into_iter()
        .filter_map(|dtype| {
            CpuKernel::fused()
                .forward(p, dtype)
                .ok()
                .map(|f| (dtype, f))
        })
        .collect()
}

/// Our kernel's value of element `col` of a forward `output` in `dtype`
/// ([`fused_forwards`]); `None` for another output or dtype.
pub(super) fn fused_value(
    ours: &[(Dtype, ForwardOutput)],
    output: Output,
    col: usize,
    dtype: Dtype,
) -> Option<f64> {
    if !output.is_forward() {
        return None;
    }
    ours.iter()
        .find(|(d, _)| *d == dtype)
        .and_then(|(_, f)| f.values.get(output))
        .map(|a| a[[0, col]])
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
