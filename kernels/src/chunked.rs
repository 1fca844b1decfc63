//! The chunked CPU kernel: the algorithm training frameworks ship. Rows in
//! chunks of `chunk_size`; per chunk a widened `[chunk, V]` buffer of `z`
//! (accumulation dtype) and a `[chunk, V]` log-softmax buffer
//! (`log_softmax_j = (z_j - m) / T - ln S`, `-inf` where masked), then
//! log-probs and top-k log-probs gathered from it and the entropy from the
//! row statistics (`ln S_w + B_w / S_w`, the same form as [`crate::Fused`]).
//!
//! Each row's reduction is [`crate::row::reduce`] over the widened row, whose
//! order depends on `V` alone: outputs are bit-identical for every
//! `chunk_size`, thread count and row grouping (and equal to
//! [`crate::Fused`]'s, which reads the same values in the same order).
//!
//! # Extra memory per call (outputs excluded)
//!
//! `2 * min(chunk_size, N) * V * size_of(acc)` bytes for the two buffers
//! (acc = f32 for f32/bf16/f16 logits: the `2 * chunk_size * V * 4` bound;
//! f64 for f64 logits) plus `N` per-row records, as in [`crate::Fused`].
//! The backward uses the same two buffers (widened `z`, gradients).

use rayon::prelude::*;

use logprobe_reference::spec::{Cotangents, Dtype, LogitsMut, Options, Problem, Shape, SpecError};

use crate::fused::{per_row_bytes, CPU_CAPABILITIES};
use crate::kernel::{Algorithm, Capabilities, ForwardOutput, Kernel, KernelError};
use crate::row::{shift, Acc, Input, Source};
use crate::stats::{
    assemble, declared_algorithm, ids_suspect, mask_row, row_error, row_forward, row_stats,
    typed_row, CallParams, RowForward,
};
use crate::vjp;

/// The chunked kernel (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunked {
    /// Rows per chunk (>= 1; 0 is [`SpecError::ZeroChunkSize`]).
    pub chunk_size: usize,
}

impl Chunked {
    /// A chunked kernel with `chunk_size` rows per chunk.
    pub fn new(chunk_size: usize) -> Self {
        Chunked { chunk_size }
    }

    fn forward_typed<T: Input>(
        &self,
        problem: &Problem<'_>,
        shape: &Shape,
        lv: ndarray::ArrayView2<'_, T>,
        out: Dtype,
    ) -> Result<ForwardOutput, SpecError> {
        let p = CallParams::<T::Acc>::new(problem, shape);
        let (n, v, cs) = (shape.n, p.v, self.chunk_size);
        if n > 0 && v == 0 {
            return Err(row_error(problem, shape, 0));
        }
        let c = cs.min(n);
        let mut zbuf = vec![<T::Acc as Acc>::ZERO; c * v];
        let mut lsm = vec![<T::Acc as Acc>::ZERO; c * v];
        let mut rows: Vec<Result<RowForward, SpecError>> = Vec::with_capacity(n);
        let mut r0 = 0;
        while r0 < n {
            let m = cs.min(n - r0);
            let (z, l) = (&mut zbuf[..m * v], &mut lsm[..m * v]);
            z.par_chunks_mut(v)
                .enumerate()
                .for_each(|(i, zr)| typed_row(&lv, r0 + i, &p).load(0, zr));
            let chunk: Vec<Result<RowForward, SpecError>> = z
                .par_chunks(v)
                .zip(l.par_chunks_mut(v))
                .enumerate()
                .map(|(i, (zr, lr))| {
                    let r = r0 + i;
                    if ids_suspect(problem, zr, r, v) {
                        return Err(row_error(problem, shape, r));
                    }
                    let mask = mask_row(problem.sampling_mask, r);
                    let st = row_stats(zr, mask, &p).map_err(|_| row_error(problem, shape, r))?;
                    // The framework's log_softmax buffer.
                    for (j, (o, &x)) in lr.iter_mut().zip(zr).enumerate() {
                        let allowed = mask.is_none_or(|mk| mk[j]);
                        *o = if allowed {
                            shift(x, st.m, p.scale) - st.ell
                        } else {
                            <T::Acc as Acc>::NEG_INF
                        };
                    }
                    Ok(row_forward(problem, r, &st, &p, |j| lr[j], out))
                })
                .collect();
            let failed = chunk.iter().any(|c| c.is_err());
            rows.extend(chunk);
            if failed {
                break;
            }
            r0 += m;
        }
        let got = rows.len();
        if got < n {
            // Stopped at a bad chunk: the first error in row order is in `rows`.
            let e = rows.into_iter().find_map(|r| r.err());
            return Err(e.unwrap_or_else(|| row_error(problem, shape, got)));
        }
        assemble(problem, shape, rows, out)
    }
}

impl Kernel for Chunked {
    fn name(&self) -> String {
        format!("chunked(chunk_size={})", self.chunk_size)
    }

    /// `ln S + B / S` from the row statistics ([`crate::stats::entropy_stats`]).
    fn entropy_form(&self) -> Option<crate::kernel::EntropyForm> {
        Some(crate::kernel::EntropyForm::Fused)
    }

    fn capabilities(&self) -> Capabilities {
        CPU_CAPABILITIES
    }

    /// As [`crate::Fused`]: the same row reduction (see [`crate::row`]).
    fn algorithm(&self, shape: &Shape) -> Algorithm {
        declared_algorithm(shape.dtype.accumulation(), shape.vocab_size)
    }

    /// `2 * min(chunk_size, N) * V * size_of(acc)` plus `N` per-row records.
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        let acc = shape.dtype.accumulation().size_bytes();
        2 * self.chunk_size.min(shape.n) * shape.vocab_size * acc + shape.n * per_row_bytes(shape.k)
    }

    /// # Errors
    /// [`SpecError::ZeroChunkSize`]; the spec's typed errors for the first
    /// bad row in row order.
    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        if self.chunk_size == 0 {
            return Err(SpecError::ZeroChunkSize.into());
        }
        let shape = problem.validate_shapes()?;
        Ok(
            logprobe_reference::with_logits!(problem.logits, lv => self.forward_typed(problem, &shape, lv, out))?,
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
            vjp::Staging::Chunked(self.chunk_size),
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
            vjp::Staging::Chunked(self.chunk_size),
            &[],
        )?)
    }
}
