//! Chunk sizes and vocabulary-shard layouts for the invariance properties.

use std::ops::Range;

use super::*;

/// Chunk sizes to compare for `n` rows: 1, a random size in `1..=n`, a
/// non-divisor of `n` (when one exists), `n`, and sizes past `n`; sorted,
/// deduplicated, all >= 1.
pub fn chunk_sizes(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = rng_for(seed, 0xC4_0C);
    let mut c = vec![1, n.max(1), n + 1, n + 1 + rng.below(64), 2 * n + 3];
    if n >= 1 {
        c.push(int_in(&mut rng, 1, n));
    }
    if let Some(nd) = (2..n).find(|&d| !n.is_multiple_of(d)) {
        c.push(nd);
    }
    if n >= 3 {
        // A random non-divisor as well.
        let nds: Vec<usize> = (2..n).filter(|&d| !n.is_multiple_of(d)).collect();
        if !nds.is_empty() {
            c.push(nds[rng.below(nds.len())]);
        }
    }
    c.sort_unstable();
    c.dedup();
    c
}

/// A vocabulary-shard layout: shard widths summing to `V_total` (padding
/// included), uneven, with empty shards, and optionally one shard whose
/// columns are all masked out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardLayout {
    /// Width of each shard (0 allowed).
    pub widths: Vec<usize>,
    /// The shard to mask out entirely (when the problem has a mask).
    pub masked_shard: Option<usize>,
}

impl ShardLayout {
    /// Column range of shard `k`.
    pub fn range(&self, k: usize) -> Range<usize> {
        let start: usize = self.widths[..k].iter().sum();
        start..start + self.widths[k]
    }

    /// A layout of `count` shards over `v_total` columns from `seed`: random
    /// cut points (duplicates give empty shards; an extra empty shard at an
    /// end with probability 1/4), and a masked shard index when `mask`.
    pub fn generate(seed: u64, count: usize, v_total: usize, mask: bool) -> Self {
        let mut rng = rng_for(seed, 0x5BA2D);
        let count = count.max(1);
        let mut cuts: Vec<usize> = (0..count - 1)
            .map(|_| int_in(&mut rng, 0, v_total))
            .collect();
        cuts.sort_unstable();
        let mut widths = Vec::with_capacity(count + 1);
        let mut prev = 0;
        for c in cuts {
            widths.push(c - prev);
            prev = c;
        }
        widths.push(v_total - prev);
        if rng.chance(0.25) {
            if rng.chance(0.5) {
                widths.insert(0, 0);
            } else {
                widths.push(0);
            }
        }
        let masked_shard = (mask && widths.len() > 1).then(|| rng.below(widths.len()));
        ShardLayout {
            widths,
            masked_shard,
        }
    }
}

/// Even split of `v_total` columns into `count` shards (the last takes the
/// remainder), as tensor parallelism does with a padded vocabulary.
pub fn even_shards(v_total: usize, count: usize) -> Vec<usize> {
    let count = count.max(1);
    let w = v_total.div_ceil(count);
    (0..count)
        .map(|k| w.min(v_total.saturating_sub(k * w)))
        .collect()
}
