//! The top-k family: the log-prob of a top-k id (T7-T8 with `d_id`).

use super::*;

impl RowBounds<'_> {
    /// Bound (nats) on the top-k log-prob of vocabulary id `id`: as
    /// [`RowBounds::log_prob`] with `d_id`; exactly 0 for an id with
    /// `d_id = -inf` (masked, or an allowed `-inf` logit: the value is `-inf`).
    pub fn topk(&self, id: usize, out: Dtype) -> ErrorBound {
        match self.stats.d.get(id) {
            Some(d) if d.hi == f64::NEG_INFINITY => ErrorBound::Abs(0.0),
            Some(d) => self.shifted_log_prob(d, out, "topk_log_prob"),
            None => ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "d of a top-k id (out of range)",
                },
            },
        }
    }
}
