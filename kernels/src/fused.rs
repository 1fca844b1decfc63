//! The fused CPU kernel: one streaming pass per row (blocked online max,
//! rescaled sums, tree merge: [`crate::row`]), rows in parallel with rayon,
//! no `[*, V]` buffer.
//!
//! # Extra memory per call (outputs excluded)
//!
//! Forward: one result record per row (`N * (size_of::<Result<RowForward,
//! SpecError>>() + 8 K)` bytes) plus `BLOCK` accumulation elements of
//! stack per worker thread (16 KiB for f64). Backward: one [`RowStats`] per
//! row (`N * size_of::<Result<RowStats, SpecError>>()` bytes) plus the same
//! stack; the output `[N, V_total]` is the result. Nothing scales with `V`.

use rayon::prelude::*;

use logprobe_reference::spec::{Cotangents, Dtype, LogitsMut, Options, Problem, Shape, SpecError};

use crate::kernel::{Algorithm, Capabilities, ForwardOutput, Kernel, KernelError};
use crate::row::{Input, Source};
use crate::stats::{
    assemble, declared_algorithm, ids_suspect, log_prob, mask_row, row_error, row_forward,
    row_stats, typed_row, CallParams, RowForward, RowStats,
};
use crate::vjp;

/// The fused kernel (see the module docs). Stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fused;

/// Capabilities of the CPU kernels of this crate: everything.
pub(crate) const CPU_CAPABILITIES: Capabilities = Capabilities {
    entropy: true,
    masked_entropy: true,
    topk: true,
    backward: true,
    in_place_backward: true,
    sampling_mask: true,
    temperature: true,
    padded_vocab: true,
    f64_input: true,
    lse: true,
};

/// Per-row record bytes of the fused kernel (forward or backward stats).
pub(crate) fn per_row_bytes(k: usize) -> usize {
    std::mem::size_of::<Result<RowForward, SpecError>>()
        .max(std::mem::size_of::<Result<RowStats<f64>, SpecError>>())
        + 8 * k
}

impl Fused {
    /// The fused forward; `widths` as in [`vjp::backward`] (empty: row-wide).
    pub(crate) fn forward_typed<T: Input>(
        problem: &Problem<'_>,
        shape: &Shape,
        lv: ndarray::ArrayView2<'_, T>,
        out: Dtype,
        widths: &[usize],
    ) -> Result<ForwardOutput, SpecError> {
        let mut p = CallParams::<T::Acc>::new(problem, shape);
        p.ranges = crate::stats::shard_ranges(widths, shape.vocab_size);
        let rows: Vec<Result<RowForward, SpecError>> = (0..shape.n)
            .into_par_iter()
            .map(|r| {
                let src = typed_row(&lv, r, &p);
                let mask = mask_row(problem.sampling_mask, r);
                if ids_suspect(problem, &src, r, p.v) {
                    return Err(row_error(problem, shape, r));
                }
                let st = row_stats(&src, mask, &p).map_err(|_| row_error(problem, shape, r))?;
                Ok(row_forward(
                    problem,
                    r,
                    &st,
                    &p,
                    |j| log_prob(src.get(j), &st, p.scale),
                    out,
                ))
            })
            .collect();
        assemble(problem, shape, rows, out)
    }
}

impl Kernel for Fused {
    fn name(&self) -> String {
        "fused".into()
    }

    /// `ln S + B / S` from the row statistics ([`crate::stats::entropy_stats`]).
    fn entropy_form(&self) -> Option<crate::kernel::EntropyForm> {
        Some(crate::kernel::EntropyForm::Fused)
    }

    fn capabilities(&self) -> Capabilities {
        CPU_CAPABILITIES
    }

    /// Accumulation f32 (f64 for f64 logits); blocks of [`crate::row::BLOCK`]
    /// in [`crate::row::LANES`] lanes, tree-merged: see [`crate::row`].
    fn algorithm(&self, shape: &Shape) -> Algorithm {
        declared_algorithm(shape.dtype.accumulation(), shape.vocab_size)
    }

    /// `N * per-row record + 8 K` bytes (see the module docs).
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        shape.n * per_row_bytes(shape.k)
    }

    /// # Errors
    /// The spec's typed errors, for the first bad row in row order.
    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        let shape = problem.validate_shapes()?;
        Ok(
            logprobe_reference::with_logits!(problem.logits, lv => Self::forward_typed(problem, &shape, lv, out, &[]))?,
        )
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<ndarray::Array2<f64>, KernelError> {
        Ok(vjp::backward(
            problem,
            cotangents,
            out,
            vjp::Staging::Fused,
            &[],
        )?)
    }

    fn backward_in_place(
        &self,
        logits: LogitsMut<'_>,
        tokens: Option<ndarray::ArrayView1<'_, i64>>,
        sampling_mask: Option<ndarray::ArrayView2<'_, bool>>,
        topk_ids: Option<ndarray::ArrayView2<'_, i64>>,
        options: &Options,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        Ok(vjp::backward_in_place(
            logits,
            tokens,
            sampling_mask,
            topk_ids,
            options,
            cotangents,
            vjp::Staging::Fused,
            &[],
        )?)
    }
}
