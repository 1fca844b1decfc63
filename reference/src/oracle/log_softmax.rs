//! The log-prob family's exact values that need no sums: the token's rank
//! among the row's log-probs (`token_ranks`, TOLERANCE.md (T26)).
//!
//! `log_prob_j = z'_j - lse` differs from `z'_j` by one constant per row,
//! and `z'_j` is a strictly increasing function of the exact input `v_j`
//! (division by `T > 0`, the softcap `c tanh(x / c)`), so the ranks of the
//! exact log-probs are the ranks of `v` and are exact integers: no
//! precision, no enclosure.

use super::row::Row;
use super::Exact;
use crate::spec::RowStat;

/// The family's statistic `stat` of `row` beyond what the row's pass
/// computes (the seam of [`Oracle::forward`](super::Oracle::forward) for
/// both tiers: an exact value, the same on the f64 tier and MPFR): the
/// token's rank ([`token_rank`]); `None` for the log-prob and the entropy,
/// which come from the pass.
pub(crate) fn row_stat(stat: RowStat, row: &Row<'_>) -> Option<Exact> {
    match stat {
        RowStat::Rank => Some(token_rank(row)),
        RowStat::LogProb | RowStat::Entropy => None,
    }
}

/// Where entry `j`'s exact log-prob sits, in the order of its log-prob:
/// `-inf` (masked, or an uncapped `-inf` logit) below every finite one,
/// the finite ones in `v` order (under an exact softcap a `-inf` logit is
/// the finite `x' = -c`, below every other finite `x'`).
fn key(row: &Row<'_>, j: usize) -> (bool, f64) {
    (row.in_p(j), row.v[j])
}

/// `token_ranks` of `row`: `#{j < V : log_prob_j >= log_prob_t}` (ties
/// counted against the token, vLLM's `(logprobs >= logprobs[t]).sum(-1)`),
/// an exact integer in `1..=V`; the exact 0 of an `ignore_index` row (no
/// value, not judged), as the log-prob's. The spec rejects a masked or
/// `-inf` token, so the token's log-prob is finite.
pub(crate) fn token_rank(row: &Row<'_>) -> Exact {
    let Some(t) = row.target else {
        return Exact::point(0.0);
    };
    let kt = key(row, t);
    let rank = (0..row.v.len()).filter(|&j| key(row, j) >= kt).count();
    Exact::point(rank as f64)
}

#[cfg(test)]
mod tests {
    use ndarray::{arr1, arr2, Array2};

    use crate::oracle::{Oracle, Tier};
    use crate::spec::{Dtype, Logits, Output, Problem};

    fn ranks(x: &Array2<f32>, tokens: &[i64], mask: Option<&Array2<bool>>) -> Vec<f64> {
        let t = arr1(tokens);
        let mut p = Problem::new(Logits::F32(x.view()));
        p.tokens = Some(t.view());
        p.sampling_mask = mask.map(|m| m.view());
        p.options.token_ranks = true;
        let run = |tier| {
            let o = Oracle {
                tier,
                ..Oracle::default()
            };
            let f = o.forward(&p, Dtype::F32).unwrap();
            f.values[Output::TokenRanks]
                .iter()
                .map(|e| e.rounded)
                .collect::<Vec<_>>()
        };
        let fast = run(Tier::Fast);
        assert_eq!(fast, run(Tier::Mpfr));
        fast
    }

    #[test]
    fn ties_count_against_the_token_and_masked_entries_sit_at_the_bottom() {
        let x = arr2(&[
            [1.0f32, 3.0, 3.0, -1.0, f32::NEG_INFINITY],
            [1.0, 3.0, 3.0, -1.0, f32::NEG_INFINITY],
            [1.0, 3.0, 3.0, -1.0, f32::NEG_INFINITY],
            [1.0, 3.0, 3.0, -1.0, f32::NEG_INFINITY],
        ]);
        // Argmax tie: rank 2 for either; the -inf logit ranks below all.
        assert_eq!(ranks(&x, &[1, 2, 3, 0], None), vec![2.0, 2.0, 4.0, 3.0]);
        // Masking column 1 drops it below everything finite.
        let mut m = ndarray::Array2::from_elem((4, 5), true);
        m.column_mut(1).fill(false);
        assert_eq!(ranks(&x, &[2, 0, 3, 2], Some(&m)), vec![1.0, 2.0, 3.0, 1.0]);
    }
}
