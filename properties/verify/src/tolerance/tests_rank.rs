//! (T26) Token ranks: an f32 kernel that ranks its own log-probs (`x_j -
//! lse` in f32, `>=`) lies in `[r, r + r_+]` on rows with near-ties a few
//! f32 ulps apart; undercounting, a fraction or an overcount beyond it
//! fail.

use super::*;
use crate::tolerance::{judge, ErrorBound};
use logprobe_reference::oracle::Exact;

/// `#{j : x_j >= x_t}`: the exact rank of `t` in a row without a mask.
fn exact_rank(x: &[f64], t: usize) -> f64 {
    x.iter().filter(|&&v| v >= x[t]).count() as f64
}

/// An f32 kernel's rank: `lp_j = fl(x_j - lse)` with `lse` rounded to f32.
fn f32_rank(x: &[f64], t: usize) -> f64 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
    let lse = (m + s.ln()) as f32;
    let lp = |j: usize| x[j] as f32 - lse;
    (0..x.len()).filter(|&j| lp(j) >= lp(t)).count() as f64
}

#[test]
fn f32_ranks_lie_in_the_one_sided_bound_and_undercounts_fail() {
    let mut rng = SplitMix64::new(26);
    let mut widened = 0;
    for case in 0..200 {
        // A body of values, with entries 1-3 f32 ulps (at 20) from the token.
        let mut x: Vec<f64> = (0..512).map(|_| 20.0 * rng.uniform()).collect();
        let t = 7;
        let ulp = Dtype::F32.ulp(20.0);
        for k in 0..6 {
            x[100 + k] = (x[t] - (1 + k % 3) as f64 * ulp) as f32 as f64;
        }
        x[200] = x[t];
        let st = stats_f64(&x, 1.0, None, Some(t));
        let rb = Model::lanes(8).row_bounds(&st, &ctx1());
        let b = rb.token_rank(Some(t));
        let ErrorBound::Upward(w) = b else {
            panic!("case {case}: {b:?}")
        };
        let r = exact_rank(&x, t);
        let exact = Exact::point(r);
        let c = f32_rank(&x, t);
        assert!(
            c >= r && c <= r + w,
            "case {case}: {c} not in [{r}, {r} + {w}]"
        );
        assert!(judge(&exact, c, Dtype::F32, &b).pass);
        // `>` instead of `>=`: the exact tie at column 200 is lost.
        assert!(!judge(&exact, r - 1.0, Dtype::F32, &b).pass);
        assert!(!judge(&exact, r + 0.5, Dtype::F32, &b).pass);
        assert!(!judge(&exact, r + w + 1.0, Dtype::F32, &b).pass);
        // The near-ties below may be slack (and the exact tie, here, where
        // this helper's `d` are not point enclosures), nothing else.
        assert!(w <= 7.0, "case {case}: r_+ = {w}");
        widened += usize::from(c > r);
    }
    // The near-ties do meet the token's log-prob in f32 now and then.
    assert!(widened > 0);
}
