//! The fused linear + cross-entropy kernel over vocabulary shards (tensor
//! parallelism, Megatron's layout): rank `k` holds the contiguous row block
//! `W[s_k .. s_k + w_k]` of `lm_head_weight` (and of the bias), widths
//! uneven allowed. Each rank runs [`FusedLinear`]'s passes on its block;
//! between the passes the ranks all-reduce, here in rank order:
//!
//! - the row max `m = max_k m_k` (exact);
//! - `S = sum_k S_k` and `B = sum_k B_k` (f32, in rank order), each `S_k`
//!   taken with the global `m`;
//! - the target logit `z_t = sum_k [t in rank k] z_t,k` (the owning rank
//!   shifts the global id by its `s_k`; the others add 0);
//! - in the backward, `grad_hidden = sum_k g_k W_k` (f32, in rank order),
//!   while each rank keeps its own rows of `grad_lm_head_weight` and
//!   `grad_lm_head_bias`.
//!
//! The sums over ranks are a summation tree of their own, so the outputs
//! are not bit-identical to one rank's; they are judged against the oracle
//! under the same bounds, TOLERANCE.md (T29), (T30) under `sequential`.

use ndarray::{s, Array2};

use logprobe_reference::spec::SpecError;

use super::{cotangents, finish, targets, FusedLinear, LinearForward, LinearGrads, LinearProblem};
use crate::kernel::KernelError;

/// A fault planted in [`ShardedLinear`] (mutation testing only).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ShardFault {
    /// The correct kernel.
    #[default]
    None,
    /// Each rank takes the global target id as a column of its own block,
    /// without subtracting its vocabulary start `s_k` (so a rank whose
    /// block is at least `t + 1` wide claims row `t`'s target).
    TargetNotShifted,
}

/// [`FusedLinear`] over vocabulary shards (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardedLinear {
    /// Each rank's kernel (chunk sizes, where the logits are kept).
    pub inner: FusedLinear,
    /// The shards' widths `w_k` (summing to `V`).
    pub widths: Vec<usize>,
    /// A planted fault (mutation testing only).
    #[doc(hidden)]
    pub fault: ShardFault,
}

impl ShardedLinear {
    /// A correct kernel over shards of these widths.
    pub fn new(inner: FusedLinear, widths: Vec<usize>) -> Self {
        ShardedLinear {
            inner,
            widths,
            fault: ShardFault::None,
        }
    }

    /// The shards' column ranges.
    fn ranges(&self, v: usize) -> Result<Vec<std::ops::Range<usize>>, KernelError> {
        if self.widths.iter().sum::<usize>() != v || self.widths.is_empty() {
            return Err(SpecError::ShapeMismatch {
                tensor: "lm_head_weight",
                expected: vec![self.widths.iter().sum()],
                found: vec![v],
            }
            .into());
        }
        let mut start = 0;
        Ok(self
            .widths
            .iter()
            .map(|&w| {
                start += w;
                start - w..start
            })
            .collect())
    }

    /// Rank `k`'s view of the problem: its block of `W` and of the bias.
    fn shard<'a>(p: &LinearProblem<'a>, r: &std::ops::Range<usize>) -> LinearProblem<'a> {
        LinearProblem {
            weight: p.weight.slice_move(s![r.clone(), ..]),
            bias: p.bias.map(|b| b.slice_move(s![r.clone()])),
            ..*p
        }
    }

    /// Each row's target as a column of rank `r`'s block (`None` where
    /// another rank owns it, or the row is ignored).
    fn local(&self, target: &[Option<usize>], r: &std::ops::Range<usize>) -> Vec<Option<usize>> {
        target
            .iter()
            .map(|&t| match (t, self.fault) {
                (Some(t), ShardFault::None) => r.contains(&t).then(|| t - r.start),
                (Some(t), ShardFault::TargetNotShifted) => (t < r.len()).then_some(t),
                (None, _) => None,
            })
            .collect()
    }

    /// The rows' combined statistics (see the module docs).
    fn stats(
        &self,
        shards: &[(LinearProblem<'_>, Vec<Option<usize>>)],
        rows: std::ops::Range<usize>,
        tc: (f32, Option<f32>),
    ) -> Vec<super::RowStat> {
        let mut m = vec![f32::NEG_INFINITY; rows.len()];
        for (q, _) in shards {
            for (a, b) in m.iter_mut().zip(self.inner.max_pass(q, rows.clone(), tc)) {
                *a = a.max(b);
            }
        }
        let mut st: Vec<super::RowStat> = m
            .iter()
            .map(|&m| super::RowStat {
                m,
                s: 0.0,
                b: 0.0,
                z_t: 0.0,
            })
            .collect();
        for (q, local) in shards {
            let part = self.inner.sum_pass(q, rows.clone(), tc, &m, local);
            for (i, (a, b)) in st.iter_mut().zip(part).enumerate() {
                a.s += b.s;
                a.b += b.b;
                if local[rows.start + i].is_some() {
                    a.z_t += b.z_t;
                }
            }
        }
        st
    }

    /// Log-probs, entropy and lse (f32), as [`FusedLinear::forward`].
    ///
    /// # Errors
    /// As [`FusedLinear::forward`]; [`KernelError::Spec`] when the widths
    /// do not sum to `V`.
    pub fn forward(&self, p: &LinearProblem<'_>) -> Result<LinearForward, KernelError> {
        let tc = self.inner.check(p)?;
        let target = targets(p);
        let shards: Vec<_> = self
            .ranges(p.weight.nrows())?
            .iter()
            .map(|r| (Self::shard(p, r), self.local(&target, r)))
            .collect();
        let n = p.hidden.nrows();
        let mut out = LinearForward {
            log_probs: vec![0.0; n],
            entropy: vec![0.0; n],
            lse: vec![0.0; n],
        };
        for r0 in (0..n).step_by(self.inner.row_chunk) {
            let rows = r0..(r0 + self.inner.row_chunk).min(n);
            for (i, s) in self.stats(&shards, rows, tc).into_iter().enumerate() {
                s.write(r0 + i, target[r0 + i].is_some(), &mut out);
            }
        }
        Ok(out)
    }

    /// The LM head's gradients, as [`FusedLinear::backward`].
    ///
    /// # Errors
    /// As [`ShardedLinear::forward`].
    pub fn backward(
        &self,
        p: &LinearProblem<'_>,
        grad_log_probs: &[f64],
    ) -> Result<LinearGrads, KernelError> {
        let tc = self.inner.check(p)?;
        super::check_cotangents(p, grad_log_probs)?;
        let target = targets(p);
        let cot = cotangents(p, grad_log_probs);
        let ranges = self.ranges(p.weight.nrows())?;
        let shards: Vec<_> = ranges
            .iter()
            .map(|r| (Self::shard(p, r), self.local(&target, r)))
            .collect();
        let (n, h) = p.hidden.dim();
        let mut parts: Vec<(Array2<f32>, Array2<f32>, Vec<f32>)> = ranges
            .iter()
            .map(|r| {
                (
                    Array2::zeros((n, h)),
                    Array2::zeros((r.len(), h)),
                    vec![0.0; r.len()],
                )
            })
            .collect();
        for r0 in (0..n).step_by(self.inner.row_chunk) {
            let rows = r0..(r0 + self.inner.row_chunk).min(n);
            let lse: Vec<f32> = self
                .stats(&shards, rows.clone(), tc)
                .iter()
                .map(super::RowStat::lse)
                .collect();
            for ((q, local), (gh, gw, gb)) in shards.iter().zip(parts.iter_mut()) {
                let partial = rows.len() < self.inner.row_chunk;
                let to_weight =
                    !(self.inner.fault == super::LinearFault::DroppedRemainder && partial);
                self.inner.grad_pass(
                    q,
                    rows.clone(),
                    tc,
                    &lse,
                    (&cot, local),
                    to_weight,
                    (gh, gw, gb),
                );
            }
        }
        // The all-reduce of grad_hidden, in rank order; each rank's rows of
        // the weight and bias gradients.
        let mut gh = Array2::<f32>::zeros((n, h));
        let mut gw = Array2::<f32>::zeros((p.weight.nrows(), h));
        let mut gb = vec![0f32; p.weight.nrows()];
        for (r, (ghk, gwk, gbk)) in ranges.iter().zip(parts) {
            gh += &ghk;
            gw.slice_mut(s![r.clone(), ..]).assign(&gwk);
            gb[r.clone()].copy_from_slice(&gbk);
        }
        Ok(finish(p.dtype, gh, gw, gb))
    }
}
