//! Host-side preparation of the per-row slots the kernels read: the target
//! and top-k columns to gather (forward), and the deduplicated cotangent
//! slots of the VJP (backward). Plain Rust: tested on every machine.

use logprobe_reference::spec::{Cotangents, Output, Problem, Shape};

/// Gather-index marker of a top-k id the sampling mask disallows
/// (`LP_MASKED_ID`): its log-prob is `-inf`.
pub const MASKED_ID: i32 = -2;
/// Gather-index marker of an empty slot (no tokens, `ignore_index` row).
pub const NO_SLOT: i32 = -1;

/// Gather indices `[N, K + 1]` (row-major): slot 0 the target column
/// ([`NO_SLOT`] without tokens or on `ignore_index` rows), slots `1..=K` the
/// top-k ids ([`MASKED_ID`] where the sampling mask disallows them).
/// Call after [`Problem::validate`] (columns are in range).
pub fn gather_indices(problem: &Problem<'_>, shape: &Shape) -> Vec<i32> {
    let k1 = shape.k + 1;
    let mut out = vec![NO_SLOT; shape.n * k1];
    for r in 0..shape.n {
        let row = &mut out[r * k1..(r + 1) * k1];
        if problem.has_target(r) {
            row[0] = problem.tokens.map_or(NO_SLOT, |t| t[r] as i32);
        }
        if let Some(ids) = problem.topk_ids {
            for (k, &id) in ids.row(r).iter().enumerate() {
                let c = id as usize;
                row[k + 1] = if problem.allowed(r, c) {
                    id as i32
                } else {
                    MASKED_ID
                };
            }
        }
    }
    out
}

/// The backward's per-row cotangent slots, deduplicated by column.
///
/// For row `r` and slot `k < k1`: `index` the column ([`NO_SLOT`] if
/// unused), `a` the summed cotangents at that column (`g` if it is the
/// target, plus each `G_k` whose id it is), `other` the sum of the row's
/// other cotangents (`G - a`); `g_all[r] = G = g + sum_k G_k` over the slots
/// that count (not `ignore_index`, not masked ids) and `h[r]` the entropy
/// cotangent. Sums are taken in f64 and rounded once to f32.
#[derive(Clone, Debug, PartialEq)]
pub struct GradSlots {
    /// Slots per row: `K + 1`.
    pub k1: usize,
    /// Columns `[N, k1]`.
    pub index: Vec<i32>,
    /// Summed cotangents at the column `[N, k1]`.
    pub a: Vec<f32>,
    /// Sum of the row's other cotangents `[N, k1]`.
    pub other: Vec<f32>,
    /// `G` per row `[N]`.
    pub g_all: Vec<f32>,
    /// Entropy cotangent per row `[N]` (0 without one).
    pub h: Vec<f32>,
}

/// Builds the [`GradSlots`] of `cotangents`. Call after
/// [`Problem::validate`] and [`Problem::validate_cotangents`].
pub fn grad_slots(problem: &Problem<'_>, shape: &Shape, cot: &Cotangents<'_>) -> GradSlots {
    let k1 = shape.k + 1;
    let n = shape.n;
    let mut s = GradSlots {
        k1,
        index: vec![NO_SLOT; n * k1],
        a: vec![0.0; n * k1],
        other: vec![0.0; n * k1],
        g_all: vec![0.0; n],
        h: vec![0.0; n],
    };
    let mut entries: Vec<(i32, f64)> = Vec::with_capacity(k1);
    for r in 0..n {
        entries.clear();
        if let (Some(g), true) = (cot.column(Output::LogProbs), problem.has_target(r)) {
            if let Some(t) = problem.tokens {
                entries.push((t[r] as i32, g[r]));
            }
        }
        if let (Some(gk), Some(ids)) = (cot.get(Output::TopkLogProbs), problem.topk_ids) {
            for (k, &id) in ids.row(r).iter().enumerate() {
                if problem.allowed(r, id as usize) {
                    entries.push((id as i32, gk[[r, k]]));
                }
            }
        }
        let total: f64 = entries.iter().map(|e| e.1).sum();
        s.g_all[r] = total as f32;
        s.h[r] = cot.column(Output::Entropy).map_or(0.0, |h| h[r] as f32);
        let mut slot = 0;
        for (i, &(col, _)) in entries.iter().enumerate() {
            if entries[..i].iter().any(|e| e.0 == col) {
                continue;
            }
            let a: f64 = entries.iter().filter(|e| e.0 == col).map(|e| e.1).sum();
            let other: f64 = entries.iter().filter(|e| e.0 != col).map(|e| e.1).sum();
            s.index[r * k1 + slot] = col;
            s.a[r * k1 + slot] = a as f32;
            s.other[r * k1 + slot] = other as f32;
            slot += 1;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use logprobe_reference::spec::Logits;
    use ndarray::{array, Array1, Array2};

    /// A `[2, 4]` row pair: targets `[2, -100]` (the second ignored), the
    /// given top-k ids, column 3 of row 0 masked.
    struct Rows {
        x: Array2<f32>,
        t: Array1<i64>,
        ids: Array2<i64>,
        m: Array2<bool>,
    }

    impl Rows {
        fn new(ids: Array2<i64>) -> Self {
            Rows {
                x: Array2::zeros((2, 4)),
                t: array![2i64, -100],
                ids,
                m: array![[true, true, true, false], [true, true, true, true]],
            }
        }

        fn problem(&self) -> Problem<'_> {
            let mut p = Problem::new(Logits::F32(self.x.view()));
            p.tokens = Some(self.t.view());
            p.topk_ids = Some(self.ids.view());
            p.sampling_mask = Some(self.m.view());
            p
        }
    }

    #[test]
    fn gather_indices_mark_ignored_targets_and_masked_ids() {
        let rows = Rows::new(array![[0i64, 3], [1, 1]]);
        let mut p = rows.problem();
        let shape = p.validate().unwrap();
        assert_eq!(
            gather_indices(&p, &shape),
            vec![2, 0, MASKED_ID, NO_SLOT, 1, 1]
        );
        p.tokens = None;
        p.topk_ids = None;
        let shape = p.validate().unwrap();
        assert_eq!(gather_indices(&p, &shape), vec![NO_SLOT, NO_SLOT]);
    }

    #[test]
    fn grad_slots_merge_duplicate_columns_and_skip_masked_ids() {
        let rows = Rows::new(array![[2i64, 3, 0], [1, 1, 0]]);
        let p = rows.problem();
        let shape = p.validate().unwrap();
        let g = array![1.0, 5.0];
        let gk = array![[0.5, 7.0, 0.25], [2.0, 3.0, 0.125]];
        let h = array![-1.0, 0.0];
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view())
            .with(Output::TopkLogProbs, gk.view());
        let s = grad_slots(&p, &shape, &cot);
        assert_eq!(s.k1, 4);
        // Row 0: target 2 (g = 1) and id 2 (0.5) merge; id 3 is masked; id 0.
        assert_eq!(&s.index[..4], &[2, 0, NO_SLOT, NO_SLOT]);
        assert_eq!(&s.a[..2], &[1.5, 0.25]);
        assert_eq!(&s.other[..2], &[0.25, 1.5]);
        assert_eq!(s.g_all[0], 1.75);
        // Row 1: ignore_index target contributes nothing; ids 1, 1, 0.
        assert_eq!(&s.index[4..], &[1, 0, NO_SLOT, NO_SLOT]);
        assert_eq!(&s.a[4..6], &[5.0, 0.125]);
        assert_eq!(&s.other[4..6], &[0.125, 5.0]);
        assert_eq!(s.g_all[1], 5.125);
        assert_eq!(s.h, vec![-1.0, 0.0]);
    }
}
