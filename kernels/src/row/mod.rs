//! The row reduction every CPU kernel shares: per row, the max `m` of the
//! (masked) logits, `s = S - 1` (the sum of `exp((z_j - m) / T)` without one
//! argmax term, whose exp is exactly 1) and `B = sum_j e^{d_j} (-d_j)` for the
//! entropy, so that `ln S = ln_1p(s)` and `entropy = ln_1p(s) + B / (1 + s)`
//! (the oracle's `L + R`, docs/design.md, "The math"; the `ln S + B / S` form the
//! tolerance model analyses).
//!
//! # Order of operations (the declared summation model)
//!
//! The columns of a row are cut into blocks of [`BLOCK`] entries from the
//! row's first column. Per block (in L1): widen to the accumulation dtype,
//! block max `m_b`, then `d_j = (z_j - m_b) / T` (subtract, then scale:
//! [`crate::Shift::SubtractThenScale`]), `e_j = exp(d_j)`; term `j` goes to
//! lane `j % LANES` ([`LANES`] accumulators, each summing its terms in column
//! order), lanes merged by a pairwise tree (`log2 LANES` levels). Block
//! partials `(m, s, B)` are merged by a balanced pairwise tree over the
//! blocks (`ceil(log2 b)` levels), rescaling by one `exp((m_lo - m_hi) / T)`
//! per merge: `s = s_hi + (1 + s_lo) f`, `B = B_hi + f (B_lo + (1 + s_lo)(-delta))`,
//! all terms non-negative. The order depends on the column count alone:
//! never on row chunking, thread count or which rows run together, so every
//! kernel built on it is bit-invariant under chunking.
//!
//! No FMA is used and lane order is explicit, so the SSE2, AVX2 and AVX-512
//! builds of the block loop (chosen at run time, [`cpu_path`]) give the same
//! bits (the AVX-512 build's exps scale by `2^k` with `vscalefps`, which
//! rounds the same exact product once: [`crate::exp::exp_f32_nonpos_n_avx512`]).
//!
//! # Evaluation (speed without changing that order)
//!
//! Per block: (1) the max, read in place when the row is a contiguous slice
//! of the accumulation dtype (f32 / f64 without an input temperature; else
//! widened and masked into an L1 scratch), in 4 x `LANES` independent
//! lanes (the max is exact, so only a zero max needs the lane order, for
//! its sign); (2) the first argmax, one vector compare per chunk; (3) the
//! exp pass in steps of [`STEP_CHUNKS`] chunks whose exps are evaluated
//! operation by operation across the step (independent dependency chains
//! side by side), each lane then adding its terms in column order, while
//! the next block is prefetched. NaN and `+inf` need no pass of their own:
//! `+inf` is the max, and a NaN makes `s` NaN. Every value is the same
//! operation on the same operands as one chunk at a time (see the test
//! `every_cpu_path_gives_the_same_bits` and the golden digests).
//!
//! # Modules
//!
//! - `elem`: the accumulation dtype ([`Acc`]) and the logits element types
//!   ([`Input`]) with their exact widening;
//! - `source`: where a row's values come from ([`Source`], [`TypedRow`]) and
//!   the prefetch hints;
//! - `partial`: the shifted logit ([`shift`]), block partials and their merge
//!   ([`Partial`], [`Reduction`]);
//! - `path`: the instruction set the block loops run with ([`cpu_path`]);
//! - `block`: one block's reduction (max, argmax, exp pass), built per
//!   instruction set;
//! - here: the balanced tree over the blocks ([`reduce`]) and its summation
//!   model ([`summation`], [`rescaling_exps`]).

// `!(x < inf)` and `!(m > -inf)` are meant: they are true for NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use ndarray::ArrayView1;

use crate::kernel::{ceil_log2, Summation};

mod block;
mod elem;
mod partial;
mod path;
mod source;
#[cfg(test)]
mod tests;

pub(crate) use block::STEP;
// Named by the docs (here and `grad_block`'s).
#[allow(unused_imports)]
pub use block::STEP_CHUNKS;
use block::{leaf, LeafArgs, Scratch};
pub use elem::{Acc, Input};
pub use partial::{shift, Partial, Reduction};
pub use path::cpu_path;
pub(crate) use path::{path, Path};
pub use source::{round_input, Softcap, Source, TypedRow};

/// Entries per block (a widened block, 8 KiB in f32, stays in L1).
pub const BLOCK: usize = 2048;
/// Accumulators per block sum (summed in column order each).
pub const LANES: usize = 16;

/// Reduces columns `cols` of a row (blocks from `cols.start`, balanced
/// pairwise tree over the blocks). `mask` is the whole row's sampling mask
/// (indexed by column), `scale` the temperature (`None` for `T == 1`).
/// Stack scratch `BLOCK` elements; no heap allocation.
pub fn reduce<A: Acc, S: Source<A> + ?Sized>(
    src: &S,
    cols: std::ops::Range<usize>,
    mask: Option<ArrayView1<'_, bool>>,
    scale: Option<A>,
    want_b: bool,
) -> Reduction<A> {
    let len = cols.end.saturating_sub(cols.start);
    if len == 0 {
        return Reduction {
            partial: Partial::EMPTY,
            bad: false,
        };
    }
    let mut sc = Scratch {
        z: [A::ZERO; BLOCK],
    };
    let nblocks = len.div_ceil(BLOCK);
    let mut bad = false;
    let p = tree(
        0,
        nblocks,
        &mut |blk| {
            let start = cols.start + blk * BLOCK;
            let n = BLOCK.min(cols.end - start);
            let r = leaf(
                &LeafArgs {
                    src,
                    mask,
                    start,
                    n,
                    end: cols.end,
                    scale,
                    want_b,
                },
                &mut sc,
            );
            bad |= r.bad;
            r.partial
        },
        scale,
    );
    Reduction { partial: p, bad }
}

/// Balanced pairwise tree over leaves `lo .. hi` (split `ceil(n/2)`, `floor(n/2)`):
/// depth `ceil(log2 (hi - lo))`.
fn tree<A: Acc>(
    lo: usize,
    hi: usize,
    leaf: &mut dyn FnMut(usize) -> Partial<A>,
    scale: Option<A>,
) -> Partial<A> {
    if hi - lo == 1 {
        return leaf(lo);
    }
    let mid = lo + (hi - lo).div_ceil(2);
    let l = tree(lo, mid, leaf, scale);
    let r = tree(mid, hi, leaf, scale);
    l.merge(r, scale)
}

/// The summation model of [`reduce`] over `len` columns: leaf depth
/// `ceil(min(len, BLOCK) / LANES)`, merges `log2 LANES + ceil(log2 blocks)`.
pub fn summation(len: usize) -> Summation {
    let blocks = len.div_ceil(BLOCK).max(1);
    Summation {
        leaf: len.min(BLOCK).div_ceil(LANES).max(1),
        merges: ceil_log2(LANES) + ceil_log2(blocks),
    }
}

/// Rescaling exps along any merge path of [`reduce`] over `len` columns:
/// one per block-merge level, `ceil(log2 blocks)`.
pub fn rescaling_exps(len: usize) -> usize {
    ceil_log2(len.div_ceil(BLOCK).max(1))
}
