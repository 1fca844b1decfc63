//! How a CUDA call covers the logits: fused (all rows, one pass), chunked
//! (rows in chunks through f32 buffers), or vocab-parallel (column shards
//! merged like an all-reduce); the declared algorithm and workspace of each.

use logprobe_reference::spec::{Dtype, Shape, SpecError};

use super::launch::{RowReduction, STATE_WORDS};
use crate::kernel::{ceil_log2, Algorithm, Shift, Summation};

/// Max error of CUDA's `expf` in ulps (CUDA C++ Programming Guide,
/// "Mathematical Functions": single precision `expf`, 2 ulp, full range;
/// the kernels never use `__expf`).
pub const EXPF_ULPS: f64 = 2.0;
/// Max error of CUDA's `log1pf` in ulps (same table: 1 ulp).
pub const LOG1PF_ULPS: f64 = 1.0;

/// The vocabulary shards of a vocab-parallel call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shards {
    /// `count` near-equal shards of the columns (the first `V_total % count`
    /// one wider), as tensor parallelism splits a padded vocabulary.
    Even(usize),
    /// Explicit widths, summing to the column count (zero widths allowed).
    Widths(Vec<usize>),
}

impl Shards {
    /// The column ranges of the shards over `v_total` columns.
    ///
    /// # Errors
    /// [`SpecError::ShapeMismatch`] (tensor `vocab_shards`) when explicit
    /// widths do not sum to `v_total` or there are no shards.
    pub fn ranges(&self, v_total: usize) -> Result<Vec<std::ops::Range<usize>>, SpecError> {
        let widths: Vec<usize> = match self {
            Shards::Even(count) => {
                let c = (*count).max(1);
                (0..c)
                    .map(|i| v_total / c + usize::from(i < v_total % c))
                    .collect()
            }
            Shards::Widths(w) => w.clone(),
        };
        let total: usize = widths.iter().sum();
        if widths.is_empty() || total != v_total || matches!(self, Shards::Even(0)) {
            return Err(SpecError::ShapeMismatch {
                tensor: "vocab_shards",
                expected: vec![v_total],
                found: vec![total],
            });
        }
        let mut start = 0;
        Ok(widths
            .into_iter()
            .map(|w| {
                let r = start..start + w;
                start += w;
                r
            })
            .collect())
    }
}

/// A CUDA call's layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// All rows at once, one streaming pass over the logits.
    Fused,
    /// Rows in chunks of `chunk_size` through `[chunk, V]` f32 buffers.
    Chunked {
        /// Rows per chunk (>= 1).
        chunk_size: usize,
    },
    /// Column shards, each reduced on its own, partials merged.
    VocabParallel(Shards),
}

/// The real columns of each shard: `[start, end)` clipped to `vocab_size`.
pub fn real_columns(range: &std::ops::Range<usize>, vocab_size: usize) -> usize {
    vocab_size.clamp(range.start, range.end) - range.start
}

impl Layout {
    /// The declared algorithm of a call with `shape` (docs/design.md, "The tolerance
    /// model"): f32 accumulation; `expf` / `log1pf`; subtract the max, then
    /// scale by `1/T`; the row reduction of [`RowReduction`] (for shards: the
    /// widest shard's, plus `ceil(log2 shards)` tree merge levels, each
    /// counted like the block merges).
    pub fn algorithm(&self, shape: &Shape) -> Algorithm {
        let (summation, rescaling_exps) = match self {
            Layout::Fused | Layout::Chunked { .. } => {
                let r = RowReduction::new(shape.vocab_size);
                (r.summation(), r.rescaling_exps())
            }
            Layout::VocabParallel(shards) => {
                let ranges = shards
                    .ranges(shape.v_total)
                    .unwrap_or_else(|_| std::iter::once(0..shape.v_total).collect());
                let levels = ceil_log2(ranges.len());
                let mut leaf = 1;
                let mut merges = 0;
                let mut rescales = 0;
                for r in &ranges {
                    let red = RowReduction::new(real_columns(r, shape.vocab_size));
                    leaf = leaf.max(red.summation().leaf);
                    merges = merges.max(red.merges);
                    rescales = rescales.max(red.rescaling_exps());
                }
                (
                    Summation {
                        leaf: leaf + levels,
                        merges: merges + levels,
                    },
                    rescales + levels,
                )
            }
        };
        Algorithm {
            accumulation: Dtype::F32,
            exp_ulps: EXPF_ULPS,
            log_ulps: LOG1PF_ULPS,
            summation,
            rescaling_exps,
            shift: Shift::SubtractThenScale,
            // No softcap (refused with `Unsupported`).
            tanh_ulps: f64::INFINITY,
        }
    }

    /// Declared device workspace of a forward or backward call, in bytes
    /// (inputs and outputs excluded): row statistics (`STATE_WORDS` f32 per
    /// row; per shard and merged for vocab-parallel), the slot arrays
    /// (`[N, K + 1]` i32 indices with f32 gathered values, or with two f32
    /// cotangent sums, 12 bytes a slot), two f32 per row of cotangent sums;
    /// chunked adds its two `[min(chunk_size, N), V]` f32 buffers. 0 for
    /// `N == 0` (nothing is allocated).
    pub fn workspace_bytes(&self, shape: &Shape) -> usize {
        let n = shape.n;
        if n == 0 {
            return 0;
        }
        let k1 = shape.k + 1;
        let state = 4 * STATE_WORDS * n;
        let slots = 12 * n * k1 + 8 * n;
        match self {
            Layout::Fused => state + slots,
            Layout::Chunked { chunk_size } => {
                let c = (*chunk_size).clamp(1, n);
                state + slots + 2 * c * shape.vocab_size.max(1) * 4
            }
            Layout::VocabParallel(shards) => {
                let count = shards.ranges(shape.v_total).map_or(1, |r| r.len());
                state * (count + 1) + slots
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: usize, v: usize, v_total: usize, k: usize) -> Shape {
        Shape {
            n,
            vocab_size: v,
            v_total,
            k,
            dtype: Dtype::Bf16,
            accumulation: Dtype::F32,
            temperature: 1.0,
        }
    }

    #[test]
    fn even_shards_cover_the_columns_with_uneven_widths() {
        assert_eq!(Shards::Even(3).ranges(10).unwrap(), vec![0..4, 4..7, 7..10]);
        assert_eq!(
            Shards::Even(4).ranges(2).unwrap(),
            vec![0..1, 1..2, 2..2, 2..2]
        );
        assert_eq!(
            Shards::Widths(vec![0, 5, 0]).ranges(5).unwrap(),
            vec![0..0, 0..5, 5..5]
        );
        assert!(Shards::Widths(vec![2, 2]).ranges(5).is_err());
        assert!(Shards::Widths(vec![]).ranges(0).is_err());
        assert!(Shards::Even(0).ranges(4).is_err());
        assert_eq!(real_columns(&(4..8), 6), 2);
        assert_eq!(real_columns(&(7..8), 6), 0);
        assert_eq!(real_columns(&(0..4), 6), 4);
    }

    #[test]
    fn algorithm_follows_v_and_shards() {
        let s = shape(8192, 152_064, 152_064, 0);
        let a = Layout::Fused.algorithm(&s);
        assert_eq!(
            a.summation,
            Summation {
                leaf: 345,
                merges: 9
            }
        );
        assert_eq!(a.rescaling_exps, 27);
        assert_eq!(Layout::Chunked { chunk_size: 3 }.algorithm(&s), a);
        let vp = Layout::VocabParallel(Shards::Even(4)).algorithm(&s);
        let shard = RowReduction::new(38_016);
        assert_eq!(
            vp.summation,
            Summation {
                leaf: shard.summation().leaf + 2,
                merges: shard.merges + 2
            }
        );
        assert_eq!(vp.rescaling_exps, shard.rescaling_exps() + 2);
        assert_eq!(
            (a.exp_ulps, a.log_ulps, a.shift),
            (2.0, 1.0, Shift::SubtractThenScale)
        );
    }

    #[test]
    fn workspace_is_o_n_fused_and_two_chunk_buffers_chunked() {
        let s = shape(100, 1000, 1024, 2);
        assert_eq!(
            Layout::Fused.workspace_bytes(&s),
            100 * 32 + 12 * 100 * 3 + 800
        );
        assert_eq!(
            Layout::Chunked { chunk_size: 7 }.workspace_bytes(&s),
            Layout::Fused.workspace_bytes(&s) + 2 * 7 * 1000 * 4
        );
        assert_eq!(
            Layout::Chunked { chunk_size: 1000 }.workspace_bytes(&s),
            Layout::Fused.workspace_bytes(&s) + 2 * 100 * 1000 * 4
        );
        assert_eq!(Layout::Fused.workspace_bytes(&shape(0, 1000, 1000, 0)), 0);
    }
}
