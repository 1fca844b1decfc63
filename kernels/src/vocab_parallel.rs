//! The vocab-parallel CPU kernel: logits `[N, V_total]` seen as vocabulary
//! shards `[N, V_k]` of uneven widths (tensor parallelism), shard `k`
//! holding columns `offset_k .. offset_k + V_k` with `offset_k = sum_{i<k} V_i`.
//!
//! Each shard reduces only its own slice (the blocked reduction of
//! [`crate::row`], blocks aligned to the shard's first column) to a partial
//! `(max, s, B)`; the partials are merged in shard-index order by a
//! sequential fold with one rescaling exp per merge (what an all-reduce with
//! a fixed order computes). The target and top-k logits are read from the
//! shard that owns them, at their global column. With `vocab_size` smaller
//! than `V_total` the padding sits in the last shard(s): each shard's range
//! is truncated to `0..vocab_size`, so an all-padding shard, an empty shard
//! (width 0) and an all-masked shard each contribute the empty partial
//! `(-inf, 0, 0)`, which merges without NaN. Gradients: the merged
//! statistics, then every shard writes its own columns ([`crate::vjp`]).
//!
//! Multi-process runs would put the merge on NCCL; here shards are
//! in-process views of one buffer.
//!
//! # Extra memory per call
//!
//! As [`crate::Fused`]: `N` per-row records; nothing scales with `V`.

use logprobe_reference::spec::{Cotangents, Dtype, LogitsMut, Options, Problem, Shape, SpecError};

use crate::fused::{per_row_bytes, Fused, CPU_CAPABILITIES};
use crate::kernel::{
    ceil_log2, Algorithm, Capabilities, ForwardOutput, Kernel, KernelError, Summation,
};
use crate::row::{rescaling_exps, summation, LANES};
use crate::stats::{declared_algorithm, shard_ranges};
use crate::vjp;

/// The vocab-parallel kernel (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VocabParallel {
    /// Widths `V_k` of the shards, in vocabulary order; they must sum to the
    /// logits' column count `V_total` (else [`SpecError::ShapeMismatch`]).
    pub shard_widths: Vec<usize>,
}

impl VocabParallel {
    /// A vocab-parallel kernel over shards of these widths.
    pub fn new(shard_widths: Vec<usize>) -> Self {
        VocabParallel { shard_widths }
    }

    /// `shard_widths` sum to `columns`.
    fn check(&self, columns: usize) -> Result<(), SpecError> {
        let total: usize = self.shard_widths.iter().sum();
        if total != columns || self.shard_widths.is_empty() {
            return Err(SpecError::ShapeMismatch {
                tensor: "shard_widths (sum)",
                expected: vec![columns],
                found: vec![total],
            });
        }
        Ok(())
    }
}

impl Kernel for VocabParallel {
    fn name(&self) -> String {
        format!("vocab_parallel(shards={:?})", self.shard_widths)
    }

    /// `ln S + B / S` from the row statistics ([`crate::stats::entropy_stats`]).
    fn entropy_form(&self) -> Option<crate::kernel::EntropyForm> {
        Some(crate::kernel::EntropyForm::Fused)
    }

    fn capabilities(&self) -> Capabilities {
        CPU_CAPABILITIES
    }

    /// Per shard the blocked tree of [`crate::row`]; then `K - 1`
    /// sequential merges (each with a rescaling exp) on the longest path.
    fn algorithm(&self, shape: &Shape) -> Algorithm {
        let acc = shape.dtype.accumulation();
        let ranges = shard_ranges(&self.shard_widths, shape.vocab_size);
        let widest = ranges.iter().map(|r| r.len()).max().unwrap_or(0);
        let within = summation(widest);
        let k = ranges.len().max(1);
        let mut a = declared_algorithm(acc, widest);
        a.summation = Summation {
            leaf: within.leaf,
            merges: ceil_log2(LANES)
                + ceil_log2(widest.div_ceil(crate::row::BLOCK).max(1))
                + (k - 1),
        };
        a.rescaling_exps = rescaling_exps(widest) + (k - 1);
        a
    }

    /// `N` per-row records, as [`crate::Fused`].
    fn workspace_bytes(&self, shape: &Shape) -> usize {
        shape.n * per_row_bytes(shape.k)
    }

    /// # Errors
    /// [`SpecError::ShapeMismatch`] when the widths do not sum to `V_total`;
    /// the spec's typed errors for the first bad row in row order.
    fn forward(&self, problem: &Problem<'_>, out: Dtype) -> Result<ForwardOutput, KernelError> {
        let shape = problem.validate_shapes()?;
        self.check(shape.v_total)?;
        Ok(logprobe_reference::with_logits!(problem.logits, lv =>
            Fused::forward_typed(problem, &shape, lv, out, &self.shard_widths))?)
    }

    fn backward(
        &self,
        problem: &Problem<'_>,
        cotangents: &Cotangents<'_>,
        out: Dtype,
    ) -> Result<ndarray::Array2<f64>, KernelError> {
        let shape = problem.validate_shapes()?;
        self.check(shape.v_total)?;
        Ok(vjp::backward(
            problem,
            cotangents,
            out,
            vjp::Staging::Fused,
            &self.shard_widths,
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
        self.check(logits.view().dim().1)?;
        Ok(vjp::backward_in_place(
            logits,
            tokens,
            sampling_mask,
            topk_ids,
            options,
            cotangents,
            vjp::Staging::Fused,
            &self.shard_widths,
        )?)
    }
}
