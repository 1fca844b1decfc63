//! The CPU kernel: one type, [`CpuKernel`], whose staging ([`Staging`]) and
//! vocabulary sharding ([`Sharding`]) are parameters. Its three presets
//! are the constructors [`CpuKernel::fused`], [`CpuKernel::chunked`] and
//! [`CpuKernel::vocab_parallel`].
//!
//! # The algorithm (every staging and sharding)
//!
//! Each row's statistics are the blocked reduction of [`crate::row`]: a
//! two-pass max, then `BLOCK`-wide blocks of `LANES` lanes summed in order
//! and tree-merged, whose order depends on `V` (and the shard widths) alone.
//! So outputs are bit-identical for every `chunk_size`, thread count and
//! row grouping, and a fused and a chunked kernel over the same sharding
//! give the same bits (they read the same values in the same order).
//!
//! - **Fused staging**: rows read straight from the logits, rows in
//!   parallel (rayon); no `[*, V]` buffer. The backward computes a row's
//!   statistics and then writes its gradient while the row is in cache
//!   ([`crate::vjp`]).
//! - **Chunked staging** (what training frameworks ship): rows in chunks of
//!   `chunk_size`; per chunk a widened `[chunk, V]` buffer of `z`
//!   (accumulation dtype) and a `[chunk, V]` log-softmax buffer
//!   (`log_softmax_j = (z_j - m) / T - ln S`, `-inf` where masked), from
//!   which log-probs and top-k log-probs are gathered; the entropy comes
//!   from the row statistics (`ln S_w + B_w / S_w`). The backward uses the
//!   same two buffers (widened `z`, gradients in the accumulation dtype).
//! - **Vocabulary sharding** (tensor parallelism): logits `[N, V_total]`
//!   seen as shards `[N, V_k]` of uneven widths, shard `k` holding columns
//!   `offset_k .. offset_k + V_k` with `offset_k = sum_{i<k} V_i`. Each
//!   shard reduces its own slice (blocks aligned to the shard's first
//!   column) to a partial `(max, s, B)`; the partials merge in shard order
//!   by a sequential fold with one rescaling exp per merge (an all-reduce
//!   with a fixed order). Padding (`vocab_size < V_total`) sits in the last
//!   shard(s): ranges are truncated to `0..vocab_size`, so an all-padding,
//!   empty (width 0) or all-masked shard contributes the empty partial
//!   `(-inf, 0, 0)`, which merges without NaN. Multi-process runs would put
//!   the merge on NCCL; here shards are in-process views of one buffer.
//!
//! # Extra memory per call (outputs excluded)
//!
//! One result record per row (`N * (max(size_of::<Result<RowForward,
//! SpecError>>(), size_of::<Result<RowStats<f64>, SpecError>>()) + 8 K)`
//! bytes) plus `BLOCK` accumulation elements of stack per worker thread;
//! chunked staging adds `2 * min(chunk_size, N) * V * size_of(acc)` bytes
//! for its two buffers (acc = f32 for f32/bf16/f16 logits, f64 for f64).

use ndarray::{Array2, ArrayView2, ArrayViewMut2};
use rayon::prelude::*;

use logprobe_reference::spec::{
    Cotangents, CrossEntropy, Dtype, Problem, ProblemMut, Reduction, Shape, SpecError,
};

use crate::gradient::{GradElement, Gradient};
use crate::kernel::{
    ceil_log2, Algorithm, Capabilities, CrossEntropyOutput, EntropyForm, ForwardOutput, Kernel,
    KernelError, Summation,
};
use crate::row::{rescaling_exps, shift, summation, Acc, Input, Source, BLOCK, LANES};
use crate::stats::{
    assemble, declared_algorithm, ids_suspect, log_prob, mask_row, pairwise_sum, row_error,
    row_forward, row_stats, shard_ranges, typed_row, CallParams, RowForward, RowStats,
    PAIRWISE_LEAF,
};
use crate::vjp;

/// How rows are staged through memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Staging {
    /// Rows read straight from the logits; no `[*, V]` buffer.
    Fused,
    /// Rows in chunks of `chunk_size` through widened `[chunk, V]` buffers
    /// (0 is [`SpecError::ZeroChunkSize`] at call time).
    Chunked {
        /// Rows per chunk.
        chunk_size: usize,
    },
}

/// How the vocabulary is split for the row reductions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// One row-wide reduction.
    Whole,
    /// Vocabulary shards of these widths `V_k`, in vocabulary order; they
    /// must sum to the logits' column count `V_total` (else
    /// [`SpecError::ShapeMismatch`] at call time).
    Vocab(Vec<usize>),
}

/// The CPU kernel (see the module docs): f32 accumulation for f32, bf16
/// and f16 logits, f64 for f64; every capability of [`Capabilities`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CpuKernel {
    staging: Staging,
    sharding: Sharding,
}

/// Capabilities of the CPU kernel: everything.
const CPU_CAPABILITIES: Capabilities = Capabilities::ALL;

/// Per-row record bytes (forward or backward stats) with `k` top-k ids.
fn per_row_bytes(k: usize) -> usize {
    std::mem::size_of::<Result<RowForward, SpecError>>()
        .max(std::mem::size_of::<Result<RowStats<f64>, SpecError>>())
        + 8 * k
}

impl CpuKernel {
    /// A CPU kernel with this staging and sharding.
    pub const fn new(staging: Staging, sharding: Sharding) -> Self {
        CpuKernel { staging, sharding }
    }

    /// Fused staging, one row-wide reduction (reported as `fused`).
    pub const fn fused() -> Self {
        Self::new(Staging::Fused, Sharding::Whole)
    }

    /// Chunked staging with `chunk_size` rows per chunk, one row-wide
    /// reduction (reported as `chunked(chunk_size=..)`).
    pub const fn chunked(chunk_size: usize) -> Self {
        Self::new(Staging::Chunked { chunk_size }, Sharding::Whole)
    }

    /// Fused staging over vocabulary shards of these widths (reported as
    /// `vocab_parallel(shards=[..])`).
    pub fn vocab_parallel(shard_widths: Vec<usize>) -> Self {
        Self::new(Staging::Fused, Sharding::Vocab(shard_widths))
    }

    /// The staging.
    pub fn staging(&self) -> Staging {
        self.staging
    }

    /// The sharding.
    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// The shard widths; empty for [`Sharding::Whole`].
    pub fn shard_widths(&self) -> &[usize] {
        match &self.sharding {
            Sharding::Whole => &[],
            Sharding::Vocab(w) => w,
        }
    }

    /// Checks the call's parameters against `columns = V_total`.
    fn check(&self, columns: usize) -> Result<(), SpecError> {
        if self.staging == (Staging::Chunked { chunk_size: 0 }) {
            return Err(SpecError::ZeroChunkSize);
        }
        if let Sharding::Vocab(w) = &self.sharding {
            let total: usize = w.iter().sum();
            if total != columns || w.is_empty() {
                return Err(SpecError::ShapeMismatch {
                    tensor: "shard_widths (sum)",
                    expected: vec![columns],
                    found: vec![total],
                });
            }
        }
        Ok(())
    }

    /// Validated shapes and cotangents of a backward call.
    fn prepare_backward(
        &self,
        problem: &Problem<'_>,
        cot: &Cotangents<'_>,
    ) -> Result<Shape, SpecError> {
        if self.staging == (Staging::Chunked { chunk_size: 0 }) {
            return Err(SpecError::ZeroChunkSize);
        }
        let shape = problem.validate_shapes()?;
        self.check(shape.v_total)?;
        problem.validate_cotangents(&shape, cot)?;
        Ok(shape)
    }

    /// Grad logits `[N, V_total]` written into `grad`, each value computed
    /// in the accumulation dtype (the formula of [`crate::vjp`]) and
    /// rounded once to nearest (ties to even) in `G`: f64, f32, bf16 or
    /// f16. Padded columns get `+0`. Every entry of `grad` is written; on
    /// error its contents are unspecified. Bits equal [`Kernel::backward`]
    /// with `out` = `G`'s dtype.
    ///
    /// # Errors
    /// [`SpecError::ShapeMismatch`] (tensor `grad_logits`) when `grad` is not
    /// `[N, V_total]`; otherwise as [`Kernel::backward`].
    pub fn backward_into<G: GradElement>(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        grad: ArrayViewMut2<'_, G>,
    ) -> Result<(), KernelError> {
        let shape = self.prepare_backward(problem, cotangents)?;
        Ok(vjp::backward_into(
            problem,
            &shape,
            cotangents,
            self.staging,
            self.shard_widths(),
            grad,
        )?)
    }

    /// The fused forward's rows over the shards `widths` (empty:
    /// row-wide); `eps`: also the cross-entropy row loss with that label
    /// smoothing ([`RowForward::loss`]).
    fn forward_fused<T: Input>(
        problem: &Problem<'_>,
        shape: &Shape,
        lv: ArrayView2<'_, T>,
        out: Dtype,
        widths: &[usize],
        eps: Option<f64>,
    ) -> Result<Vec<RowForward>, SpecError> {
        let mut p = CallParams::<T::Acc>::new(problem, shape);
        p.ranges = shard_ranges(widths, shape.vocab_size);
        p.label_smoothing = eps.map(<T::Acc as Acc>::from_f64);
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
        rows.into_iter().collect()
    }

    /// The chunked forward's rows (the framework's log-softmax buffer) over
    /// the shards `widths` (empty: row-wide); `eps` as in `forward_fused`
    /// (the row loss gathered from the same buffer).
    fn forward_chunked<T: Input>(
        problem: &Problem<'_>,
        shape: &Shape,
        lv: ArrayView2<'_, T>,
        out: Dtype,
        cs: usize,
        widths: &[usize],
        eps: Option<f64>,
    ) -> Result<Vec<RowForward>, SpecError> {
        let mut p = CallParams::<T::Acc>::new(problem, shape);
        p.ranges = shard_ranges(widths, shape.vocab_size);
        p.label_smoothing = eps.map(<T::Acc as Acc>::from_f64);
        let (n, v) = (shape.n, p.v);
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
        rows.into_iter().collect()
    }

    /// The rows of a forward call (see [`Kernel::forward`]), with the
    /// cross-entropy row loss when `eps` is given.
    fn forward_rows(
        &self,
        problem: &Problem<'_>,
        shape: &Shape,
        out: Dtype,
        eps: Option<f64>,
    ) -> Result<Vec<RowForward>, KernelError> {
        if self.staging == (Staging::Chunked { chunk_size: 0 }) {
            return Err(SpecError::ZeroChunkSize.into());
        }
        self.check(shape.v_total)?;
        let w = self.shard_widths();
        Ok(match self.staging {
            Staging::Fused => logprobe_reference::with_logits!(problem.logits, lv =>
                Self::forward_fused(problem, shape, lv, out, w, eps))?,
            Staging::Chunked { chunk_size } => {
                logprobe_reference::with_logits!(problem.logits, lv =>
                Self::forward_chunked(problem, shape, lv, out, chunk_size, w, eps))?
            }
        })
    }

    /// The cross-entropy `loss` of `problem` under `ce` (docs/design.md, "The
    /// loss side"; [`CrossEntropy`]), rounded to `out`: `[N]` under `none`
    /// (ignored rows 0), one value under `sum` / `mean`. Nats.
    ///
    /// Algorithm (accumulation dtype `A`: f32, f64 for f64 logits): each
    /// counted row's `l` by [`crate::stats::row_loss`] from the log-probs this staging
    /// computes (the chunked one gathers them from its log-softmax buffer),
    /// `eps` rounded to `A`; then `w_r l_r` in `A` (`w_r` rounded to `A`).
    /// The reduction runs once over all rows after the last chunk, by
    /// [`crate::stats::pairwise_sum`] in row order (never per chunk), so the result is
    /// bit-identical for every `chunk_size`; `mean` divides by the pairwise
    /// sum of the counted rows' weights (`|r|` exactly without weights),
    /// and a zero divisor gives `ce.mean_all_ignored`'s value.
    ///
    /// # Errors
    /// As [`Kernel::forward`]; [`CrossEntropy::validate`]'s errors;
    /// [`SpecError::MissingTensor`] without `tokens`.
    pub fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        out: Dtype,
    ) -> Result<CrossEntropyOutput, KernelError> {
        let shape = problem.validate_cross_entropy(ce)?;
        let acc = shape.dtype.accumulation();
        let eps = ce.effective_label_smoothing(acc)?;
        // Only the loss: no entropy, lse, z-loss or top-k work.
        let mut only = *problem;
        only.topk_ids = None;
        only.options.topk_kl = None;
        only.options.entropy = None;
        only.options.lse = false;
        only.options.z_loss_coef = None;
        let rows = self.forward_rows(&only, &shape, out, Some(eps))?;
        let counted = |r: usize| problem.has_target(r);
        let values = match acc {
            Dtype::F64 => reduce::<f64>(&rows, ce, &counted, out),
            _ => reduce::<f32>(&rows, ce, &counted, out),
        };
        Ok(CrossEntropyOutput { dtype: out, values })
    }
}

/// The reduction of [`CpuKernel::cross_entropy`] in `A`.
fn reduce<A: Acc>(
    rows: &[RowForward],
    ce: &CrossEntropy<'_>,
    counted: &impl Fn(usize) -> bool,
    out: Dtype,
) -> Vec<f64> {
    let term = |r: usize| -> A {
        if !counted(r) {
            return A::ZERO;
        }
        let w = ce.weight(r);
        if w == 0.0 {
            return A::ZERO;
        }
        let l = A::from_f64(rows[r].loss);
        if w == 1.0 {
            l
        } else {
            A::from_f64(w) * l
        }
    };
    let n = rows.len();
    match ce.reduction {
        Reduction::None => (0..n).map(|r| out.round_f64(term(r).to_f64())).collect(),
        Reduction::Sum => vec![out.round_f64(pairwise_sum(0..n, &term).to_f64())],
        Reduction::Mean => {
            let d = match ce.loss_weights {
                Some(_) => pairwise_sum(0..n, &|r| {
                    if counted(r) {
                        A::from_f64(ce.weight(r))
                    } else {
                        A::ZERO
                    }
                }),
                None => A::from_f64((0..n).filter(|&r| counted(r)).count() as f64),
            };
            if d == A::ZERO {
                vec![ce.mean_all_ignored.value()]
            } else {
                vec![out.round_f64((pairwise_sum(0..n, &term) / d).to_f64())]
            }
        }
    }
}

impl Kernel for CpuKernel {
    /// `fused`, `chunked(chunk_size=C)`, `vocab_parallel(shards=[..])`, and
    /// `vocab_parallel(shards=[..], chunk_size=C)` for the combination.
    fn name(&self) -> String {
        match (&self.staging, &self.sharding) {
            (Staging::Fused, Sharding::Whole) => "fused".into(),
            (Staging::Chunked { chunk_size }, Sharding::Whole) => {
                format!("chunked(chunk_size={chunk_size})")
            }
            (Staging::Fused, Sharding::Vocab(w)) => format!("vocab_parallel(shards={w:?})"),
            (Staging::Chunked { chunk_size }, Sharding::Vocab(w)) => {
                format!("vocab_parallel(shards={w:?}, chunk_size={chunk_size})")
            }
        }
    }

    /// `ln S + B / S` from the row statistics ([`crate::stats::entropy_stats`]).
    fn entropy_form(&self) -> Option<EntropyForm> {
        Some(EntropyForm::Fused)
    }

    fn capabilities(&self) -> Capabilities {
        CPU_CAPABILITIES
    }

    /// Accumulation f32 (f64 for f64 logits); blocks of [`BLOCK`] in
    /// [`LANES`] lanes, tree-merged ([`crate::row`]). Sharded: per shard
    /// that tree over the widest shard, then `K - 1` sequential merges
    /// (each with a rescaling exp) on the longest path. Staging changes
    /// nothing.
    fn algorithm(&self, shape: &Shape) -> Algorithm {
        let acc = shape.dtype.accumulation();
        match &self.sharding {
            Sharding::Whole => declared_algorithm(acc, shape.vocab_size),
            Sharding::Vocab(w) => {
                let ranges = shard_ranges(w, shape.vocab_size);
                let widest = ranges.iter().map(|r| r.len()).max().unwrap_or(0);
                let within = summation(widest);
                let k = ranges.len().max(1);
                let mut a = declared_algorithm(acc, widest);
                a.summation = Summation {
                    leaf: within.leaf,
                    merges: ceil_log2(LANES) + ceil_log2(widest.div_ceil(BLOCK).max(1)) + (k - 1),
                };
                a.rescaling_exps = rescaling_exps(widest) + (k - 1);
                a
            }
        }
    }

    /// `N` per-row records, plus `2 * min(chunk_size, N) * V * size_of(acc)`
    /// with chunked staging (see the module docs).
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        let rows = shape.n * per_row_bytes(shape.k);
        match self.staging {
            Staging::Fused => rows,
            Staging::Chunked { chunk_size } => {
                let acc = shape.dtype.accumulation().size_bytes();
                2 * chunk_size.min(shape.n) * shape.vocab_size * acc + rows
            }
        }
    }

    /// # Errors
    /// [`SpecError::ZeroChunkSize`]; [`SpecError::ShapeMismatch`] when the
    /// shard widths do not sum to `V_total`; the spec's typed errors for the
    /// first bad row in row order.
    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        if self.staging == (Staging::Chunked { chunk_size: 0 }) {
            return Err(SpecError::ZeroChunkSize.into());
        }
        let shape = problem.validate_shapes()?;
        // `loss` asked (Output::Loss): each row's term `w l`, as
        // `cross_entropy` forms it before its reduction.
        let eps = problem
            .cross_entropy()
            .map(|ce| ce.effective_label_smoothing(shape.dtype.accumulation()))
            .transpose()?;
        let rows = self.forward_rows(problem, &shape, out, eps)?;
        Ok(assemble(
            problem,
            &shape,
            rows.into_iter().map(Ok).collect(),
            out,
        )?)
    }

    /// Grad logits as f64 holding values of `out` ([`Self::backward_into`]
    /// into an f64 buffer, each value rounded once to `out`).
    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Array2<f64>, KernelError> {
        let shape = self.prepare_backward(problem, cotangents)?;
        Ok(vjp::backward(
            problem,
            &shape,
            cotangents,
            out,
            self.staging,
            self.shard_widths(),
        )?)
    }

    /// Written straight in `out`'s element type ([`Self::backward_into`]):
    /// for bf16 logits and a bf16 gradient, 2 bytes per entry.
    fn backward_gradient(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<Gradient, KernelError> {
        let shape = self.prepare_backward(problem, cotangents)?;
        let dim = (shape.n, shape.v_total);
        macro_rules! go {
            ($t:ty, $wrap:path) => {{
                let mut g = Array2::<$t>::from_elem(dim, <$t as GradElement>::from_f32(0.0));
                self.backward_into(problem, cotangents, g.view_mut())?;
                $wrap(g)
            }};
        }
        Ok(match out {
            Dtype::F64 => go!(f64, Gradient::F64),
            Dtype::F32 => go!(f32, Gradient::F32),
            Dtype::Bf16 => go!(half::bf16, Gradient::Bf16),
            Dtype::F16 => go!(half::f16, Gradient::F16),
        })
    }

    /// Every row is validated (a stats pass over all rows) before anything
    /// is written: on error the logits are unchanged.
    fn backward_in_place(
        &self,
        problem: ProblemMut<'_>,
        cotangents: &Cotangents<'_>,
    ) -> Result<(), KernelError> {
        self.check(problem.logits.view().dim().1)?;
        Ok(vjp::backward_in_place(
            problem,
            cotangents,
            self.staging,
            self.shard_widths(),
        )?)
    }

    /// Every loss sum is a [`pairwise_sum`]: leaves of at most
    /// [`PAIRWISE_LEAF`] terms in order, halves merged (`Summation::tree`
    /// with that block bounds its depth).
    fn loss_summation(&self, n: usize) -> Summation {
        Summation::tree(n, PAIRWISE_LEAF)
    }

    /// [`CpuKernel::cross_entropy`].
    fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        out: Dtype,
    ) -> Result<CrossEntropyOutput, KernelError> {
        CpuKernel::cross_entropy(self, problem, ce, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use logprobe_reference::spec::{Logits, LogitsMut, Output};
    use ndarray::{Array1, Array2};

    /// A deterministic `[n, v]` row set with ties, a `-inf`, a masked-out
    /// max and wide ranges (no RNG: a fixed formula).
    fn logits(n: usize, v: usize) -> Array2<f32> {
        Array2::from_shape_fn((n, v), |(r, j)| {
            let x = ((r * 131 + j * 17) as f32 * 0.37).sin() * (1.0 + (r % 5) as f32 * 4.0);
            // (-inf never at a target: `tokens` below.)
            match (r + j) % 97 {
                50 => f32::NEG_INFINITY,
                1 => 9.5,
                _ => x,
            }
        })
    }

    struct Case {
        x: Array2<f32>,
        tokens: Array1<i64>,
        ids: Array2<i64>,
        mask: Array2<bool>,
        g: Array1<f64>,
        h: Array1<f64>,
        gk: Array2<f64>,
    }

    fn case(n: usize, v: usize) -> Case {
        Case {
            x: logits(n, v),
            tokens: Array1::from_shape_fn(n, |r| if r == 2 { -100 } else { (r * 7 % v) as i64 }),
            ids: Array2::from_shape_fn((n, 3), |(r, k)| ((r * 5 + k * 11) % v) as i64),
            mask: Array2::from_shape_fn((n, v), |(r, j)| r % 3 != 1 || j % 4 != 2),
            g: Array1::from_shape_fn(n, |r| 1.0 - 0.25 * r as f64),
            h: Array1::from_shape_fn(n, |r| 0.5 + 0.125 * r as f64),
            gk: Array2::from_shape_fn((n, 3), |(r, k)| 0.5 - 0.25 * ((r + k) % 4) as f64),
        }
    }

    fn kernels(v_total: usize) -> Vec<CpuKernel> {
        let w = vec![v_total / 3, 0, v_total - v_total / 3 - 5, 5];
        vec![
            CpuKernel::fused(),
            CpuKernel::chunked(1),
            CpuKernel::chunked(3),
            CpuKernel::chunked(64),
            CpuKernel::vocab_parallel(w.clone()),
            CpuKernel::new(Staging::Chunked { chunk_size: 2 }, Sharding::Vocab(w)),
        ]
    }

    fn bits(g: &Array2<f64>) -> Vec<u64> {
        g.iter().map(|x| x.to_bits()).collect()
    }

    /// Runs `f` for f32, bf16, f16 and f64 logits of `c` (padded: V = V_total
    /// - 3), entropy on, with and without a mask and temperature.
    fn each_problem(c: &Case, mut f: impl FnMut(&Problem<'_>, &str)) {
        let (xb, xh, xd) = (
            c.x.mapv(bf16::from_f32),
            c.x.mapv(f16::from_f32),
            c.x.mapv(f64::from),
        );
        let v_total = c.x.dim().1;
        for (logits, dt) in [
            (Logits::F32(c.x.view()), "f32"),
            (Logits::Bf16(xb.view()), "bf16"),
            (Logits::F16(xh.view()), "f16"),
            (Logits::F64(xd.view()), "f64"),
        ] {
            for (masked, t) in [(false, 1.0), (true, 0.7)] {
                let mut p = Problem::new(logits);
                p.tokens = Some(c.tokens.view());
                p.topk_ids = Some(c.ids.view());
                p.sampling_mask = masked.then(|| c.mask.view());
                p.options.temperature = t;
                p.options.vocab_size = Some(v_total - 3);
                p.options.entropy = Some(logprobe_reference::spec::EntropyLogits::Unmasked);
                f(&p, &format!("{dt} masked={masked} T={t}"));
            }
        }
    }

    /// The gradient in each dtype asked is [`Kernel::backward`]'s values
    /// (rounded once to that dtype) bit for bit, for every staging and
    /// sharding and every logits dtype; the fused and chunked stagings
    /// agree bit for bit over the same sharding, forward and backward; and
    /// one thread and three give the same bits.
    #[test]
    fn typed_gradients_equal_the_f64_path_and_stagings_agree() {
        let c = case(7, 300);
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, c.g.view())
            .with_column(Output::Entropy, c.h.view())
            .with(Output::TopkLogProbs, c.gk.view());
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let three = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        each_problem(&c, |p, what| {
            let ks = kernels(300);
            for k in &ks {
                for out in Dtype::ALL {
                    let want = k.backward(p, &cot, out).unwrap();
                    let got = k.backward_gradient(p, &cot, out).unwrap();
                    assert_eq!(got.dtype(), out);
                    assert_eq!(
                        bits(&got.to_f64()),
                        bits(&want),
                        "{what} {} -> {out}",
                        k.name()
                    );
                    let t1 = one.install(|| k.backward_gradient(p, &cot, out).unwrap());
                    let t3 = three.install(|| k.backward_gradient(p, &cot, out).unwrap());
                    assert_eq!(t1, got, "{what} {} -> {out}: 1 thread", k.name());
                    assert_eq!(t3, got, "{what} {} -> {out}: 3 threads", k.name());
                }
            }
            // Staging changes no bit: fused vs chunked over each sharding.
            for (a, b) in [(0, 1), (0, 2), (0, 3), (4, 5)] {
                let (ka, kb) = (&ks[a], &ks[b]);
                let (fa, fb) = (
                    ka.forward(p, Dtype::F32).unwrap(),
                    kb.forward(p, Dtype::F32).unwrap(),
                );
                assert_eq!(format!("{fa:?}"), format!("{fb:?}"), "{what} {}", kb.name());
                let (ga, gb) = (
                    ka.backward(p, &cot, Dtype::F32).unwrap(),
                    kb.backward(p, &cot, Dtype::F32).unwrap(),
                );
                assert_eq!(bits(&ga), bits(&gb), "{what} {}", kb.name());
            }
        });
    }

    fn set<'a>(pm: &mut ProblemMut<'a>, c: &'a Case) {
        pm.tokens = Some(c.tokens.view());
        pm.topk_ids = Some(c.ids.view());
        pm.options.entropy = Some(logprobe_reference::spec::EntropyLogits::Unmasked);
    }

    /// In place through the one mutable view: the logits' dtype's gradient
    /// bit for bit; a bad call leaves the logits unchanged.
    #[test]
    fn in_place_through_the_mutable_view() {
        let c = case(5, 130);
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, c.g.view())
            .with_column(Output::Entropy, c.h.view())
            .with(Output::TopkLogProbs, c.gk.view());
        for k in kernels(130) {
            let mut xb = c.x.mapv(bf16::from_f32);
            let mut pm = ProblemMut::new(LogitsMut::Bf16(xb.view_mut()));
            set(&mut pm, &c);
            let want = k.backward_gradient(&pm.view(), &cot, Dtype::Bf16).unwrap();
            k.backward_in_place(pm, &cot).unwrap();
            assert_eq!(Gradient::Bf16(xb.clone()), want, "{}", k.name());
            // A bad row (NaN) at the end: nothing written.
            let mut bad = c.x.clone();
            bad[[4, 7]] = f32::NAN;
            let before = bad.clone();
            let mut pm = ProblemMut::new(LogitsMut::F32(bad.view_mut()));
            set(&mut pm, &c);
            assert!(
                matches!(
                    k.backward_in_place(pm, &cot),
                    Err(KernelError::Spec(SpecError::NonFiniteLogit { row: 4, .. }))
                ),
                "{}",
                k.name()
            );
            assert_eq!(
                bad.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                before.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    /// Bad parameters are typed errors on every entry point.
    #[test]
    fn bad_parameters_are_typed_errors() {
        let c = case(2, 10);
        let p = Problem::new(Logits::F32(c.x.view()));
        let cot = Cotangents::default();
        let zero = CpuKernel::chunked(0);
        let zc = KernelError::Spec(SpecError::ZeroChunkSize);
        assert_eq!(zero.forward(&p, Dtype::F32).unwrap_err(), zc);
        assert_eq!(zero.backward(&p, &cot, Dtype::F32).unwrap_err(), zc);
        assert_eq!(
            zero.backward_gradient(&p, &cot, Dtype::Bf16).unwrap_err(),
            zc
        );
        for w in [vec![3, 3], vec![]] {
            let k = CpuKernel::vocab_parallel(w);
            assert!(matches!(
                k.forward(&p, Dtype::F32),
                Err(KernelError::Spec(SpecError::ShapeMismatch { .. }))
            ));
            assert!(matches!(
                k.backward_gradient(&p, &cot, Dtype::F32),
                Err(KernelError::Spec(SpecError::ShapeMismatch { .. }))
            ));
        }
        let mut g = Array2::<f32>::zeros((2, 9));
        let mut p = p;
        p.tokens = Some(c.tokens.view());
        let gl = Array1::from_elem(2, 1.0);
        let cot = cot.with_column(Output::LogProbs, gl.view());
        assert!(matches!(
            CpuKernel::fused().backward_into(&p, &cot, g.view_mut()),
            Err(KernelError::Spec(SpecError::ShapeMismatch {
                tensor: "grad_logits",
                ..
            }))
        ));
    }

    /// Cross-entropy `loss`: every staging and sharding gives the same
    /// bits for every reduction (the reduction runs once after the last
    /// chunk: a chunked mean is not multiplied by the chunk count), a
    /// uniform row is `ln V` with or without smoothing, ignored rows enter
    /// neither sum nor divisor, the all-ignored mean is declared, a `-inf`
    /// logit under smoothing is `+inf`, and bad options are typed errors.
    #[test]
    fn cross_entropy_stagings_agree_and_edges_hold() {
        use logprobe_reference::spec::{CrossEntropy, Logits, MeanAllIgnored, Reduction};
        let (n, v) = (13, 300);
        // No -inf here (a -inf logit makes a smoothed row +inf; tested below).
        let x = logits(n, v).mapv(|e| if e == f32::NEG_INFINITY { -3.0 } else { e });
        let t: ndarray::Array1<i64> = (0..n as i64)
            .map(|r| {
                if r % 4 == 1 {
                    -100
                } else {
                    (r * 37) % v as i64
                }
            })
            .collect();
        let w: ndarray::Array1<f64> = (0..n).map(|r| 0.25 * (r % 5) as f64 + 0.5).collect();
        let mut p = Problem::new(Logits::F32(x.view()));
        p.tokens = Some(t.view());
        let mut ks = vec![
            CpuKernel::fused(),
            CpuKernel::vocab_parallel(vec![100, 150, 50]),
        ];
        ks.extend([1, 2, 3, 5, 13, 64].map(CpuKernel::chunked));
        for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
            for weights in [None, Some(w.view())] {
                let ce = CrossEntropy {
                    reduction,
                    label_smoothing: 0.1,
                    loss_weights: weights,
                    ..Default::default()
                };
                let base = ks[0].cross_entropy(&p, &ce, Dtype::F32).unwrap();
                assert_eq!(base.values.len(), reduction.len(n));
                for k in &ks[1..] {
                    let got = k.cross_entropy(&p, &ce, Dtype::F32).unwrap();
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got.values),
                        bits(&base.values),
                        "{} {reduction}",
                        k.name()
                    );
                }
                if reduction == Reduction::None {
                    assert_eq!(base.values[1], 0.0, "ignored row");
                }
            }
        }
        // The mean is the sum over the counted rows divided by their count.
        let sum = ks[3]
            .cross_entropy(
                &p,
                &CrossEntropy {
                    reduction: Reduction::Sum,
                    ..Default::default()
                },
                Dtype::F64,
            )
            .unwrap()
            .values[0];
        let mean = ks[3]
            .cross_entropy(
                &p,
                &CrossEntropy {
                    reduction: Reduction::Mean,
                    ..Default::default()
                },
                Dtype::F64,
            )
            .unwrap()
            .values[0];
        let counted = (0..n).filter(|&r| p.has_target(r)).count() as f64;
        assert!(
            ((sum / counted) - mean).abs() <= 1e-6 * mean.abs(),
            "{sum} / {counted} vs {mean}"
        );
        // A uniform row: ln V, smoothed or not.
        let u = Array2::<f32>::zeros((1, 8));
        let t0 = ndarray::array![3i64];
        let mut pu = Problem::new(Logits::F32(u.view()));
        pu.tokens = Some(t0.view());
        for eps in [0.0, 0.3, 1.0] {
            let ce = CrossEntropy {
                label_smoothing: eps,
                ..Default::default()
            };
            let l = CpuKernel::chunked(1)
                .cross_entropy(&pu, &ce, Dtype::F32)
                .unwrap()
                .values[0];
            assert!(
                (l - 8f64.ln()).abs() <= 4.0 * f32::EPSILON as f64,
                "eps {eps}: {l}"
            );
        }
        // Every row ignored.
        let all = ndarray::Array1::from_elem(13, -100i64);
        let mut pa = p;
        pa.tokens = Some(all.view());
        for (mai, want_nan) in [(MeanAllIgnored::Nan, true), (MeanAllIgnored::Zero, false)] {
            let ce = CrossEntropy {
                reduction: Reduction::Mean,
                mean_all_ignored: mai,
                ..Default::default()
            };
            let l = CpuKernel::chunked(4)
                .cross_entropy(&pa, &ce, Dtype::F32)
                .unwrap()
                .values[0];
            assert_eq!(l.is_nan(), want_nan);
            if !want_nan {
                assert_eq!(l, 0.0);
            }
        }
        // A -inf logit among the smoothed entries.
        let xi = ndarray::array![[0.0f32, f32::NEG_INFINITY, 1.0]];
        let mut pi = Problem::new(Logits::F32(xi.view()));
        let ti = ndarray::array![0i64];
        pi.tokens = Some(ti.view());
        let smooth = CrossEntropy {
            label_smoothing: 0.1,
            ..Default::default()
        };
        let li = CpuKernel::fused()
            .cross_entropy(&pi, &smooth, Dtype::F32)
            .unwrap()
            .values[0];
        assert_eq!(li, f64::INFINITY);
        let plain = CpuKernel::fused()
            .cross_entropy(&pi, &CrossEntropy::default(), Dtype::F32)
            .unwrap()
            .values[0];
        assert!(plain.is_finite());
        // Bad options are typed.
        let bad = CrossEntropy {
            label_smoothing: 2.0,
            ..Default::default()
        };
        assert!(matches!(
            CpuKernel::fused().cross_entropy(&p, &bad, Dtype::F32),
            Err(KernelError::Spec(SpecError::BadLabelSmoothing { .. }))
        ));
        let mut pn = p;
        pn.tokens = None;
        assert!(matches!(
            CpuKernel::fused().cross_entropy(&pn, &CrossEntropy::default(), Dtype::F32),
            Err(KernelError::Spec(SpecError::MissingTensor {
                output: "loss",
                ..
            }))
        ));
    }
}
