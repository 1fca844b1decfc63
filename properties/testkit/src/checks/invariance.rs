//! Chunk-size and row-slicing invariance (bit for bit, no oracle).

use ndarray::{Array2, Axis};

use logprobe_kernels::kernel::{ForwardOutput, Kernel, KernelError};
use logprobe_reference::spec::{Dtype, MeanDivisor, Output, Reduction};

use crate::strategies::{CotangentData, ProblemData};

use super::*;

/// Bitwise equality of two forward results (NaN payloads compared as bits).
pub fn forward_bits_eq(a: &ForwardOutput, b: &ForwardOutput) -> bool {
    a.dtype == b.dtype
        && Output::ALL
            .iter()
            .all(|&o| match (a.values.get(o), b.values.get(o)) {
                (None, None) => true,
                (Some(x), Some(y)) => grad_bits_eq(x, y),
                _ => false,
            })
}

/// Bitwise equality of two gradients.
pub fn grad_bits_eq(a: &Array2<f64>, b: &Array2<f64>) -> bool {
    a.dim() == b.dim() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

pub(crate) fn result_eq<T>(
    a: &Result<T, KernelError>,
    b: &Result<T, KernelError>,
    eq: impl Fn(&T, &T) -> bool,
) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => eq(x, y),
        (Err(KernelError::Spec(x)), Err(KernelError::Spec(y))) => same_error(x, y),
        // The same refusal, whatever the kernel's name (it holds the chunk size).
        (
            Err(KernelError::Unsupported { what: x, .. }),
            Err(KernelError::Unsupported { what: y, .. }),
        ) => x == y,
        (Err(x), Err(y)) => x == y,
        _ => false,
    }
}

/// First differing position of two forward results, for reports.
pub(crate) fn first_forward_diff(a: &ForwardOutput, b: &ForwardOutput) -> String {
    for (o, x) in a.values.iter() {
        let Some(y) = b.values.get(o) else {
            return format!("{o} present in one result only");
        };
        if x.dim() != y.dim() {
            return format!("{o}: shapes {:?} vs {:?}", x.dim(), y.dim());
        }
        for ((row, col), p) in x.indexed_iter() {
            let q = y[[row, col]];
            if p.to_bits() != q.to_bits() {
                return format!("{}: {p:e} vs {q:e}", o.element(row, col));
            }
        }
    }
    "outputs or dtypes differ".into()
}

/// Row-slicing invariance: the forward (and backward, when supported) of
/// rows `[0, cut)` and `[cut, N)` computed separately equal the rows of one
/// call bit for bit (each row's reduction order depends on `V` alone).
pub fn check_row_slicing(
    kernel: &dyn Kernel,
    data: &ProblemData,
    cot: &CotangentData,
    cut: usize,
) -> Result<(), String> {
    let caps = kernel.capabilities();
    let a = asked(&data.problem(), &caps);
    let p = a.problem;
    let n = data.n();
    let cut = cut.min(n);
    let whole = kernel.forward(&p, Dtype::F32);
    let part = |r: std::ops::Range<usize>| p.slice_rows(r);
    let (top, bottom) = (part(0..cut), part(cut..n));
    if let Ok(w) = &whole {
        let (t, b) = (
            kernel.forward(&top, Dtype::F32),
            kernel.forward(&bottom, Dtype::F32),
        );
        let (Ok(t), Ok(b)) = (t, b) else {
            return Err("a row slice of a valid problem failed".into());
        };
        let joined = ForwardOutput {
            dtype: w.dtype,
            values: t
                .values
                .iter()
                .filter_map(|(o, x)| {
                    let y = b.values.get(o)?;
                    let cat = ndarray::concatenate(Axis(0), &[x.view(), y.view()]).ok()?;
                    Some((o, cat))
                })
                .collect(),
        };
        if !forward_bits_eq(w, &joined) {
            return Err(format!(
                "rows [0, {cut}) and [{cut}, {n}) computed apart differ: {}",
                first_forward_diff(w, &joined)
            ));
        }
    }
    if caps.computes(Output::GradLogits) && !cot.is_empty() {
        let mut cv = cot_for(data, &p, cot);
        // A mean's slices divide by the whole problem's `W`: given to every
        // call (the whole one too, so that all sum the same parts).
        let divisor = p
            .loss_divisor_terms()
            .and_then(|t| MeanDivisor::new(t).ok());
        cv.loss_divisor = divisor.as_ref();
        if let Ok(w) = kernel.backward(&p, &cv, Dtype::F32) {
            let reduction = p.options.loss.map_or(Reduction::None, |l| l.reduction);
            let cpart = |r: std::ops::Range<usize>| cv.slice_rows(r, reduction);
            let (t, b) = (
                kernel.backward(&top, &cpart(0..cut), Dtype::F32),
                kernel.backward(&bottom, &cpart(cut..n), Dtype::F32),
            );
            let (Ok(t), Ok(b)) = (t, b) else {
                return Err("the backward of a row slice of a valid problem failed".into());
            };
            let joined = ndarray::concatenate(Axis(0), &[t.view(), b.view()]).expect("2-d concat");
            if !grad_bits_eq(&w, &joined) {
                return Err(format!(
                    "backward rows [0, {cut}) and [{cut}, {n}) computed apart differ"
                ));
            }
        }
    }
    Ok(())
}

/// Chunk-size invariance of one kernel family: the kernels `make(c)` for
/// every `c` in `chunk_sizes` give bit-identical forward and backward
/// results (or the same error) as `make(chunk_sizes[0])`.
pub fn check_chunk_sizes(
    make: &dyn Fn(usize) -> Box<dyn Kernel>,
    data: &ProblemData,
    cot: &CotangentData,
    chunk_sizes: &[usize],
) -> Result<(), String> {
    let base = make(chunk_sizes[0]);
    let caps = base.capabilities();
    let a = asked(&data.problem(), &caps);
    let p = a.problem;
    let cv = cot_for(data, &p, cot);
    let f0 = base.forward(&p, Dtype::F32);
    let b0 = caps
        .computes(Output::GradLogits)
        .then(|| base.backward(&p, &cv, Dtype::F32));
    for &c in &chunk_sizes[1..] {
        let k = make(c);
        let f = k.forward(&p, Dtype::F32);
        if !result_eq(&f0, &f, forward_bits_eq) {
            let what = match (&f0, &f) {
                (Ok(x), Ok(y)) => first_forward_diff(x, y),
                _ => format!(
                    "{} vs {}",
                    outcome(f0.as_ref().err()),
                    outcome(f.as_ref().err())
                ),
            };
            return Err(format!(
                "forward with chunk_size {} and {c} differ: {what}",
                chunk_sizes[0]
            ));
        }
        if let Some(b0) = &b0 {
            let b = k.backward(&p, &cv, Dtype::F32);
            if !result_eq(b0, &b, grad_bits_eq) {
                return Err(format!(
                    "backward with chunk_size {} and {c} differ",
                    chunk_sizes[0]
                ));
            }
        }
    }
    Ok(())
}

/// A call's outcome in words: `values` or `the error "..."`.
fn outcome(e: Option<&KernelError>) -> String {
    e.map_or("values".into(), |e| format!("the error \"{e}\""))
}
