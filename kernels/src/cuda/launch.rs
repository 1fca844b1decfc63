//! Launch configuration, chunk planning and the summation model they imply.
//!
//! One block per row; the block size is a function of the row's real column
//! count alone, so each row's reduction order (and so its bits) depends on
//! `V` and nothing else: not on `N`, the chunk size or other rows.

use crate::kernel::{ceil_log2, Summation};

/// Largest block (threads): `LP_MAX_BLOCK` in `cuda/common.cuh`.
pub const MAX_BLOCK: u32 = 512;
/// Smallest block: one warp.
pub const MIN_BLOCK: u32 = 32;
/// Consecutive columns per tile (`LP_TILE`).
pub const TILE: usize = 4;
/// Tiles per rescaling group (`LP_GROUP`).
pub const GROUP: usize = 4;
/// Threads per block of the one-thread-per-row and element-wise kernels.
pub const ELEMENTWISE_BLOCK: u32 = 256;
/// Words of one row's statistics (`LP_STATE_WORDS`).
pub const STATE_WORDS: usize = 8;
/// Largest grid of a one-block-per-row launch (CUDA's `gridDim.x` limit).
pub const MAX_ROWS_PER_LAUNCH: usize = i32::MAX as usize;

/// Threads per block of the row kernels for rows of `cols` real columns:
/// the power of two covering one tile per thread, within
/// [`MIN_BLOCK`, `MAX_BLOCK`].
pub fn block_size(cols: usize) -> u32 {
    let tiles = cols.div_ceil(TILE).max(1);
    (tiles.next_power_of_two().min(MAX_BLOCK as usize) as u32).max(MIN_BLOCK)
}

/// The reduction a row of `cols` real columns goes through (see
/// `cuda/common.cuh`): per thread, `tiles` tiles of [`TILE`] terms added in
/// order, the running max raised at most once per group of [`GROUP`] tiles,
/// then `log2(block)` tree merge levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowReduction {
    /// Threads per block.
    pub block: u32,
    /// Tiles per thread (the busiest thread).
    pub tiles: usize,
    /// Rescalings inside one thread's leaf: one per group after the first.
    pub leaf_rescales: usize,
    /// Merge levels of the block tree: `log2(block)`.
    pub merges: usize,
}

impl RowReduction {
    /// The reduction of a row of `cols` real columns.
    pub fn new(cols: usize) -> Self {
        let block = block_size(cols);
        let tiles = cols.div_ceil(TILE).div_ceil(block as usize).max(1);
        RowReduction {
            block,
            tiles,
            leaf_rescales: tiles.div_ceil(GROUP) - 1,
            merges: ceil_log2(block as usize),
        }
    }

    /// Summation model (docs/design.md, "The tolerance model"): every rounding on a
    /// term's path counted as one addition level.
    /// - leaf: `TILE * tiles` additions, plus per in-leaf rescaling the `+ 1`
    ///   of the old argmax term and the multiplication by the factor (2
    ///   each), plus one per merge level for the `+ 1` of the merged side
    ///   (a merge is `a.s + (b.s + 1) f`: three roundings, of which the model
    ///   counts two per merge level).
    /// - merges: `log2(block)` (a balanced tree over the threads).
    pub fn summation(&self) -> Summation {
        Summation {
            leaf: TILE * self.tiles + 2 * self.leaf_rescales + self.merges,
            merges: self.merges,
        }
    }

    /// Rescaling exps on the longest path from a term to the row's total:
    /// one per in-leaf rescaling and one per merge level.
    pub fn rescaling_exps(&self) -> usize {
        self.leaf_rescales + self.merges
    }
}

/// The chunks `[start, end)` of `n` rows for `chunk_size` (the last one may
/// be shorter; none when `n == 0`). `chunk_size` must be at least 1.
pub fn chunks(n: usize, chunk_size: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let c = chunk_size.max(1);
    (0..n.div_ceil(c)).map(move |i| i * c..((i + 1) * c).min(n))
}

/// Blocks of [`ELEMENTWISE_BLOCK`] threads covering `items` items (at least 1).
pub fn elementwise_grid(items: usize) -> u32 {
    items
        .div_ceil(ELEMENTWISE_BLOCK as usize)
        .clamp(1, u32::MAX as usize) as u32
}

/// Blocks of a grid-stride element-wise kernel over `items` items: enough to
/// fill the device (capped at 65535 blocks), at least 1.
pub fn grid_stride_blocks(items: usize) -> u32 {
    items.div_ceil(ELEMENTWISE_BLOCK as usize).clamp(1, 65_535) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_is_a_power_of_two_from_v_alone() {
        assert_eq!(block_size(0), 32);
        assert_eq!(block_size(1), 32);
        assert_eq!(block_size(128), 32);
        assert_eq!(block_size(129), 64);
        assert_eq!(block_size(2048), 512);
        assert_eq!(block_size(152_064), 512);
        for v in [1usize, 7, 100, 1000, 32_000, 50_257, 152_064, 256_000] {
            let b = block_size(v);
            assert!(
                b.is_power_of_two() && (MIN_BLOCK..=MAX_BLOCK).contains(&b),
                "{v}"
            );
        }
    }

    #[test]
    fn row_reduction_covers_every_column() {
        for v in [1usize, 5, 64, 127, 129, 2047, 2049, 32_000, 152_064] {
            let r = RowReduction::new(v);
            assert!(r.tiles * TILE * r.block as usize >= v, "{v}");
            assert!(
                (r.tiles - 1) * TILE * (r.block as usize) < v.max(1),
                "{v}: no thread idle for a whole tile round"
            );
        }
        let r = RowReduction::new(152_064);
        assert_eq!(
            (r.block, r.tiles, r.leaf_rescales, r.merges),
            (512, 75, 18, 9)
        );
        assert_eq!(
            r.summation(),
            Summation {
                leaf: 300 + 36 + 9,
                merges: 9
            }
        );
        assert_eq!(r.rescaling_exps(), 27);
        let one = RowReduction::new(1);
        assert_eq!((one.tiles, one.leaf_rescales, one.merges), (1, 0, 5));
    }

    #[test]
    fn chunks_cover_rows_once_in_order() {
        for n in [0usize, 1, 5, 16, 17] {
            for c in [1usize, 2, 3, 16, 17, 100] {
                let all: Vec<usize> = chunks(n, c).flat_map(|r| r.collect::<Vec<_>>()).collect();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "n={n} c={c}");
                assert!(chunks(n, c).all(|r| !r.is_empty() && r.len() <= c));
            }
        }
        assert_eq!(chunks(10, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
    }

    #[test]
    fn grids_cover_items() {
        assert_eq!(elementwise_grid(0), 1);
        assert_eq!(elementwise_grid(256), 1);
        assert_eq!(elementwise_grid(257), 2);
        assert_eq!(grid_stride_blocks(usize::MAX / 2), 65_535);
    }
}
