//! The cotangents of one row of the CPU VJP, per family: the log-prob and
//! top-k sources, the entropy's `h`, the loss side (`lse`, `z_loss`,
//! `loss`), the policy terms and the top-k KL.

use super::*;

/// The cotangents of one row, in the accumulation dtype.
#[derive(Clone, Debug)]
pub struct RowCot<A> {
    /// Sources `(column, weight)`: the target first (its log-prob
    /// cotangent, then the loss's `-(1 - eps) ell`), then top-k ids in order.
    pub sources: Vec<(usize, A)>,
    /// Entropy cotangent `h` (None = absent or zero: no entropy term).
    pub h: Option<A>,
    /// The loss side (`None`: no `lse`, `z_loss` or `loss` cotangent).
    pub loss: Option<LossSide<A>>,
    /// The policy terms' cotangents (`None`: none nonzero on this row):
    /// one more source at the target, of weight `sum c k'(lp^)` from the
    /// row's own log-prob ([`crate::policy`]), added in [`grad_row`].
    pub policy: Option<crate::policy::PolicySide<A>>,
    /// The top-k KL's cotangents (`None`: none nonzero on this row): one
    /// more source at each id, of weight [`crate::topk_kl::topk_kl_slopes`]
    /// from the row's own log-probs at the ids, added in [`grad_row`].
    pub kl: Option<KlSide<A>>,
    /// The soft cross-entropy's cotangent (`None`: absent or zero on this
    /// row): every entry `j` gains `-c p_j` (the teacher's, read from
    /// `teacher_probs` in [`grad_row`]) and the total weight of `-p_j`
    /// loses `c sum_j p_j`.
    pub soft: Option<SoftSide<A>>,
}

/// One row's soft cross-entropy cotangent `c` and the teacher's mass
/// `sum_{j < V} p_j` ([`pairwise_sum`] of the `p_j` in `A`,
/// [`crate::stats::teacher_p`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftSide<A> {
    /// `c`, the row's `grad_soft_cross_entropy`.
    pub c: A,
    /// `sum_j p_j`.
    pub mass: A,
    /// How the teacher's entries hold `p_j`.
    pub form: logprobe_reference::spec::TeacherForm,
}

/// One row's top-k KL cotangents and inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct KlSide<A> {
    /// The ids `[K]` (validated: live, distinct, `< V`).
    pub ids: Vec<usize>,
    /// The teacher's log-probs `a_k [K]`, exact.
    pub teacher: Vec<f64>,
    /// The student's log-probs renormalised over the ids.
    pub renormalized: bool,
    /// `g_f`, `g_r` in `A`.
    pub gf: A,
    /// `g_r`.
    pub gr: A,
}

impl<A: Acc> KlSide<A> {
    /// Row `row`'s side (`None` without a nonzero KL cotangent).
    pub fn of(problem: &Problem<'_>, cot: &Cotangents<'_>, row: usize) -> Option<Self> {
        let (gf, gr) = problem.kl_cotangents(cot, row);
        if gf == 0.0 && gr == 0.0 {
            return None;
        }
        let (kl, ids, a) = (
            problem.options.topk_kl?,
            problem.topk_ids?,
            problem.teacher_topk_log_probs?,
        );
        Some(KlSide {
            ids: ids.row(row).iter().map(|&i| i as usize).collect(),
            teacher: a.row(row).to_vec(),
            renormalized: kl.renormalized,
            gf: A::from_f64(gf),
            gr: A::from_f64(gr),
        })
    }
}

/// The loss-side terms of one row (docs/design.md, "The loss side"), folded into the
/// write pass's row constants: the total weight of `-p_j` loses `(a +
/// zb lse) + ell eps` (the kernel's own `lse = m / T + ln S`), and every
/// allowed entry gains the constant `u`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossSide<A> {
    /// `a`, the cotangent of `lse`.
    pub a: A,
    /// `zb = (coef b) 2`, `b` the cotangent of `z_loss`.
    pub zb: A,
    /// `ell eps`: the loss's smoothing share of `p_j`'s weight.
    pub ell_eps: A,
    /// `u = -(ell eps / |A|)` (before the division by `T`).
    pub u: A,
}

impl<A: Acc> KlSide<A> {
    /// The top-k KL's sources `(id, w_k)`: the weights
    /// [`crate::topk_kl::topk_kl_slopes`] from the row's own log-probs at the
    /// ids, read from `io` (before any write).
    pub(super) fn sources<Io: RowIo<A>>(
        &self,
        io: &Io,
        st: &RowStats<A>,
        p: &CallParams<A>,
    ) -> Vec<(usize, A)> {
        let lps: Vec<A> = self
            .ids
            .iter()
            .map(|&id| crate::stats::log_prob(io.get(id), st, p.scale))
            .collect();
        let w = crate::topk_kl::topk_kl_slopes(
            &lps,
            &self.teacher,
            self.renormalized,
            self.gf,
            self.gr,
        );
        self.ids.iter().copied().zip(w).collect()
    }
}

impl<A: Acc> LossSide<A> {
    /// The weight these terms add to `p_j`: `(a + zb lse) + ell eps`, with
    /// `lse = m / T + ln S` from the row's statistics (as the forward's).
    pub(super) fn p_weight(&self, st: &RowStats<A>, p: &CallParams<A>) -> A {
        let m = match p.scale {
            Some(t) => st.m / t,
            None => st.m,
        };
        (self.a + self.zb * (m + st.ell)) + self.ell_eps
    }
}

impl<A: Acc> RowCot<A> {
    /// Row `row`'s cotangents; `p` holds the call's loss constants
    /// ([`CallParams::loss_grad`]).
    pub fn new(problem: &Problem<'_>, cot: &Cotangents<'_>, row: usize, p: &CallParams<A>) -> Self {
        let mut sources = Vec::new();
        if let (Some(g), true) = (cot.column(Output::LogProbs), problem.has_target(row)) {
            sources.push((
                problem.tokens.map_or(0, |t| t[row]) as usize,
                A::from_f64(g[row]),
            ));
        }
        // The loss's row coefficient `ell = g w` (`/ W` under `mean`).
        let mut ell_eps = A::ZERO;
        let mut u = A::ZERO;
        if let (Some((g, w)), Some(lg)) = (problem.loss_cotangent(cot, row), p.loss_grad) {
            let gw = A::from_f64(g) * A::from_f64(w);
            let ell = match lg.divisor {
                Some(d) => gw / d,
                None => gw,
            };
            let t = problem.tokens.map_or(0, |t| t[row]) as usize;
            sources.push((t, -(ell * (A::ONE - lg.eps))));
            if lg.eps != A::ZERO {
                let count = match problem.sampling_mask {
                    None => p.v,
                    Some(_) => (0..p.v).filter(|&j| problem.allowed(row, j)).count(),
                };
                ell_eps = ell * lg.eps;
                u = -(ell_eps / A::from_f64(count as f64));
            }
        }
        if let (Some(gk), Some(ids)) = (cot.get(Output::TopkLogProbs), problem.topk_ids) {
            for (k, &id) in ids.row(row).iter().enumerate() {
                let id = id as usize;
                if problem.allowed(row, id) {
                    sources.push((id, A::from_f64(gk[[row, k]])));
                }
            }
        }
        let h = cot
            .column(Output::Entropy)
            .map(|h| A::from_f64(h[row]))
            .filter(|&h| h != A::ZERO);
        let a = cot
            .column(Output::Lse)
            .map_or(A::ZERO, |a| A::from_f64(a[row]));
        let zb = match (cot.column(Output::ZLoss), p.z_loss_coef) {
            (Some(b), Some(c)) => c * A::from_f64(b[row]) * A::from_f64(2.0),
            _ => A::ZERO,
        };
        let any = cot.column(Output::Lse).is_some()
            || cot.column(Output::ZLoss).is_some()
            || cot.column(Output::Loss).is_some();
        let loss = any.then_some(LossSide { a, zb, ell_eps, u });
        RowCot {
            sources,
            h,
            loss,
            policy: crate::policy::PolicySide::of(problem, cot, row),
            kl: KlSide::of(problem, cot, row),
            soft: match (
                problem.soft_cross_entropy_cotangent(cot, row),
                problem.teacher_probs,
            ) {
                (c, Some(tp)) if c != 0.0 => {
                    let tp = tp.row(row);
                    let form = problem.options.teacher_form;
                    Some(SoftSide {
                        c: A::from_f64(c),
                        mass: pairwise_sum(0..p.v.min(tp.len()), &|j| {
                            crate::stats::teacher_p(form, tp[j])
                        }),
                        form,
                    })
                }
                _ => None,
            },
        }
    }

    /// Sum of all weights, in source order, less the loss side's weight
    /// of `p_j` (then also the constant `u`; `0` without a loss side).
    pub(super) fn total(&self, st: &RowStats<A>, p: &CallParams<A>) -> (A, A) {
        let mut s = self.sources.iter().fold(A::ZERO, |a, &(_, w)| a + w);
        if let Some(sf) = &self.soft {
            s = s - sf.c * sf.mass;
        }
        match &self.loss {
            None => (s, A::ZERO),
            Some(l) => (s - l.p_weight(st, p), l.u),
        }
    }
}
