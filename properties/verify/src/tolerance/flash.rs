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
use logprobe_reference::spec::{Dtype, EntropyLogits, Output, Problem};

use super::walk::RowTargets;

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
    naive_entropy_of(&naive_log_softmax(row, temperature, dtype), dtype)
}

/// [`naive_entropy`] from the naive log-softmax `lp` `[V]` of the same
/// logits ([`naive_log_softmax`]), so a caller that has it does not redo it.
pub fn naive_entropy_of(lp: &[f64], dtype: Dtype) -> f64 {
    let r = |x: f64| dtype.round_f64(x);
    let mut acc = 0.0;
    for &l in lp {
        let p = r(l.exp());
        if p != 0.0 {
            acc = r(acc - r(p * l));
        }
    }
    acc
}

/// The naive same-dtype results of one row, computed per dtype when first
/// asked: the flash rule's reference values.
#[derive(Clone, Debug)]
pub struct NaiveRow {
    /// Logits over the real vocabulary, `-inf` where the mask disallows.
    masked: Vec<f64>,
    /// The entropy's logits over the real vocabulary (masked or not);
    /// empty when they are `masked` (masked entropy, or no sampling mask).
    entropy_logits: Vec<f64>,
    /// The temperature as the options give it.
    temperature: f64,
    log_softmax: Vec<(Dtype, Vec<f64>)>,
    entropy: Vec<(Dtype, f64)>,
}

impl NaiveRow {
    /// Row `row` of a validated `problem`.
    pub fn new(problem: &Problem<'_>, row: usize) -> NaiveRow {
        let (_, v_total) = problem.logits.dim();
        let v = problem.options.vocab_size.unwrap_or(v_total);
        let masked = problem.allowed_row_f64(row);
        let entropy_logits = match problem.options.entropy {
            _ if problem.sampling_mask.is_none() => Vec::new(),
            Some(EntropyLogits::Masked) => Vec::new(),
            _ => problem.logits.row_f64(row)[..v].to_vec(),
        };
        NaiveRow {
            masked,
            entropy_logits,
            temperature: problem.options.temperature,
            log_softmax: Vec::new(),
            entropy: Vec::new(),
        }
    }

    /// The naive value of column `col` of `output` in `dtype`: the naive
    /// log-softmax at the target or top-k id, the naive entropy; `None` for
    /// grad logits and the loss side's `lse` / `z_loss` (the rule is about
    /// log-softmax outputs) or a missing target.
    pub fn value(
        &mut self,
        output: Output,
        col: usize,
        targets: &RowTargets,
        dtype: Dtype,
    ) -> Option<f64> {
        let id = match output {
            Output::LogProbs => targets.token?,
            Output::TopkLogProbs => *targets.topk_ids.get(col)?,
            Output::Entropy => return Some(self.entropy(dtype)),
            Output::GradLogits | Output::Lse | Output::ZLoss => return None,
        };
        self.log_softmax(dtype).get(id).copied()
    }

    fn log_softmax(&mut self, dtype: Dtype) -> &[f64] {
        let i = match self.log_softmax.iter().position(|(d, _)| *d == dtype) {
            Some(i) => i,
            None => {
                let lp = naive_log_softmax(&self.masked, self.temperature, dtype);
                self.log_softmax.push((dtype, lp));
                self.log_softmax.len() - 1
            }
        };
        &self.log_softmax[i].1
    }

    fn entropy(&mut self, dtype: Dtype) -> f64 {
        if let Some(&(_, h)) = self.entropy.iter().find(|(d, _)| *d == dtype) {
            return h;
        }
        let h = if self.entropy_logits.is_empty() {
            // The same logits as the log-softmax: reuse it.
            naive_entropy_of(self.log_softmax(dtype), dtype)
        } else {
            naive_entropy(&self.entropy_logits, self.temperature, dtype)
        };
        self.entropy.push((dtype, h));
        h
    }
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
