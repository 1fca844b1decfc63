//! The flash-attention rule, reported alongside the bound (never required):
//! a candidate's error is at most twice the error of the naive computation
//! in the candidate's own dtype, max over the tensor, with a floor of half
//! an ulp (Dao et al., FlashAttention-2 / FlashAttention-3 test suites
//! compare a kernel's error with that of a same-precision reference).
//!
//! The naive computation rounds to the dtype after every operation: each
//! operand is widened to f64, the operation done in f64, the result rounded
//! with [`Dtype::round_f64`] (`exp` / `ln` in f64 are within 1 ulp of f64,
//! so the rounded result is within a hair of correctly rounded).

use logprobe_reference::oracle::Exact;
use logprobe_reference::spec::Dtype;

/// The naive log_softmax of one row in `dtype`, `[V]` (nats).
///
/// `row` holds the logits (`-inf` for disallowed entries); `temperature`
/// is rounded to `dtype` first. Steps, each rounded to `dtype`:
/// `z_j = x_j / T`, `d_j = z_j - max z`, `e_j = exp(d_j)`, `S` summed in
/// index order, `l = ln S`, `lp_j = d_j - l`. NaN/inf propagate as they
/// would in the naive code (an empty or all `-inf` row gives NaN).
pub fn naive_log_softmax(row: &[f64], temperature: f64, dtype: Dtype) -> Vec<f64> {
    let r = |x: f64| dtype.round_f64(x);
    let t = r(temperature);
    let z: Vec<f64> = row
        .iter()
        .map(|&x| if t == 1.0 { r(x) } else { r(x / t) })
        .collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let d: Vec<f64> = z.iter().map(|&zj| r(zj - m)).collect();
    let s = d.iter().fold(0.0, |s, &dj| r(s + r(dj.exp())));
    let l = r(s.ln());
    d.iter().map(|&dj| r(dj - l)).collect()
}

/// The naive entropy of one row in `dtype` (nats): `-sum_j p_j lp_j` with
/// `lp` from [`naive_log_softmax`], `p_j = exp(lp_j)`, every product and
/// partial sum rounded to `dtype`, summed in index order; entries with
/// `p_j = 0` add nothing (the defined semantics of `-inf` logits).
pub fn naive_entropy(row: &[f64], temperature: f64, dtype: Dtype) -> f64 {
    let r = |x: f64| dtype.round_f64(x);
    let lp = naive_log_softmax(row, temperature, dtype);
    let mut acc = 0.0;
    for &l in &lp {
        let p = r(l.exp());
        if p != 0.0 {
            acc = r(acc - r(p * l));
        }
    }
    acc
}

/// Accumulates the flash-attention rule over a tensor of one output.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlashRule {
    /// Max candidate error seen (far end of the enclosure).
    pub candidate_error: f64,
    /// Max naive error seen.
    pub naive_error: f64,
    /// Max half ulp of the dtype at the exact values seen.
    pub floor: f64,
}

impl FlashRule {
    /// An empty accumulator.
    pub fn new() -> FlashRule {
        FlashRule::default()
    }

    /// Records one element: its exact value, the candidate and the naive
    /// value, both in `dtype`.
    pub fn observe(&mut self, exact: &Exact, candidate: f64, naive: f64, dtype: Dtype) {
        let err = |v: f64| {
            if v.is_infinite() && v == exact.rounded {
                0.0
            } else {
                exact.error(v)
            }
        };
        let mid = 0.5 * (exact.enclosure.lo + exact.enclosure.hi);
        self.candidate_error = self.candidate_error.max(err(candidate));
        self.naive_error = self.naive_error.max(err(naive));
        self.floor = self.floor.max(0.5 * dtype.ulp(mid));
    }

    /// `max candidate error / max(max naive error, max half ulp)`: the rule
    /// holds when this is at most 2. 0 for an empty tensor.
    pub fn ratio(&self) -> f64 {
        let reference = self.naive_error.max(self.floor);
        if self.candidate_error == 0.0 {
            0.0
        } else if reference > 0.0 {
            self.candidate_error / reference
        } else {
            f64::INFINITY
        }
    }

    /// Whether the rule holds (`ratio <= 2`).
    pub fn holds(&self) -> bool {
        self.ratio() <= 2.0
    }
}
