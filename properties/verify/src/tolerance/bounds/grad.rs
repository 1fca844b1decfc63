//! The element bound of grad logits (T14): cross-cutting, it reads every
//! family's cotangent (log-prob, entropy, top-k, loss, policy, KL).

use super::*;

/// Upstream cotangents of one row for [`RowBounds::grad`]: `g` (log-prob),
/// `h` (entropy), `G_k` (top-k, with their ids).
#[derive(Clone, Copy, Debug, Default)]
pub struct GradCotangents<'c> {
    /// Cotangent `g` of the log-prob (0 for `ignore_index` rows).
    pub g: f64,
    /// Cotangent `h` of the entropy.
    pub h: f64,
    /// Target token `t` (`None`: no log-prob term).
    pub token: Option<usize>,
    /// `(id_k, G_k)` pairs of the live top-k ids: every id *not* masked by
    /// `sampling_mask`, including one whose logit is `-inf` or whose
    /// probability underflows (its log-prob is `-inf` but, as in the oracle
    /// and PyTorch's log_softmax backward, it is still differentiated:
    /// `G_k (1 - p_id) / T` at the id, `-G_k p_j / T` elsewhere). Ids masked
    /// by `sampling_mask` are constants and should be left out (see
    /// [`GradCotangents::live_topk`]); an id left in is counted as live,
    /// which only widens the bound (sound either way). The statistics alone
    /// cannot tell the two apart: both have `d_id = -inf`.
    pub topk: &'c [(usize, f64)],
    /// The loss-side cotangents (`grad_lse`, `grad_z_loss`, `grad_loss`;
    /// T19), `None` without any.
    pub loss: Option<LossGradCotangents<'c>>,
    /// The policy terms' cotangents (`grad_kl_k1` .. `grad_ratio`; T21),
    /// `None` without a nonzero one on this row.
    pub policy: Option<PolicyGradCotangents<'c>>,
    /// The top-k KL's cotangents (`grad_forward_kl`, `grad_reverse_kl`;
    /// T25), `None` without a nonzero one on this row.
    pub kl: Option<KlGradCotangents<'c>>,
}

impl GradCotangents<'_> {
    /// The `(id_k, G_k)` pairs of one row's live top-k ids, for
    /// [`GradCotangents::topk`]: `ids` `[K]` and `grad` `[K]` zipped, the ids
    /// for which `allowed(id)` is false (masked by `sampling_mask`) dropped.
    /// A negative id (a caller's bad input) is kept, as `usize::MAX`, so it
    /// still counts in the bound's cotangent sum.
    pub fn live_topk(
        ids: impl IntoIterator<Item = i64>,
        grad: impl IntoIterator<Item = f64>,
        allowed: impl Fn(usize) -> bool,
    ) -> Vec<(usize, f64)> {
        ids.into_iter()
            .zip(grad)
            .map(|(id, g)| (usize::try_from(id).unwrap_or(usize::MAX), g))
            .filter(|&(id, _)| id == usize::MAX || allowed(id))
            .collect()
    }
}

impl RowBounds<'_> {
    /// Bound on `|dx^_j - dx_j|` for element `j < V` of grad logits (T14),
    /// in the gradient's units, for the cotangents `cot`, rounded to `out`.
    /// Padded columns (`j >= V`) are exactly 0 and are not covered here.
    pub fn grad(&self, j: usize, cot: &GradCotangents<'_>, out: Dtype) -> ErrorBound {
        let cc = CotConsts::new(cot);
        let mg = self.grad_consts(cot, &cc);
        match self.grad_elem(j, cot, out, &GradShared::new(self.stats, j, cot), &mg, &cc) {
            Ok(b) => b,
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// [`RowBounds::grad`] of element `j` under every bound in `all` (one
    /// row's bounds, e.g. [`RowBounds::new_shared`]'s), sharing the
    /// model-independent work: the probabilities' `e^lw` and the
    /// cotangents' sums are evaluated once. Equal to `grad` bit for bit;
    /// bounds built on other statistics are computed one by one. For many
    /// elements of one row, [`RowBounds::grad_row`] once and
    /// [`RowBounds::grad_many_with`] per element do the row's part once.
    pub fn grad_many<const M: usize>(
        all: &[RowBounds<'_>; M],
        j: usize,
        cot: &GradCotangents<'_>,
        out: Dtype,
    ) -> [ErrorBound; M] {
        Self::grad_many_with(all, &Self::grad_row(all, cot), j, cot, out)
    }

    /// The row constants of the gradient bound (T14) under every bound in
    /// `all` for the row's cotangents `cot`: the cotangent sum `G`, the
    /// terms' count, the cotangents' rounding test, `1/T`, `gamma_m` and
    /// the floor, for [`RowBounds::grad_many_with`].
    pub fn grad_row<const M: usize>(
        all: &[RowBounds<'_>; M],
        cot: &GradCotangents<'_>,
    ) -> GradRow<M> {
        let cot_consts = CotConsts::new(cot);
        let models = all.each_ref().map(|rb| rb.grad_consts(cot, &cot_consts));
        let keys: Vec<(String, *const RowStats)> = all
            .iter()
            .zip(&models)
            .map(|(rb, mg)| (rb.twin_key(mg), rb.stats as *const RowStats))
            .collect();
        let t = twins(&keys, |k| k.clone());
        GradRow {
            models,
            cot: cot_consts,
            twin: std::array::from_fn(|i| t[i]),
        }
    }

    /// What an element's gradient bound (T14) reads of `self` and its row
    /// constants `mg`, as text: two bounds on the same statistics with the
    /// same key give every element the same bound, bit for bit (`f64`'s
    /// `Debug` form is its shortest round-trip decimal, sign of zero
    /// included, so equal keys mean equal values).
    pub(super) fn twin_key(&self, mg: &ModelGrad) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?}",
            self.c, self.p, self.w, self.entropy_pre, self.entropy_grad, mg
        )
    }

    /// [`RowBounds::grad_many`] with the row constants `row` of
    /// [`RowBounds::grad_row`] for the same `all` and `cot` (bit for bit
    /// the same bounds).
    pub fn grad_many_with<const M: usize>(
        all: &[RowBounds<'_>; M],
        row: &GradRow<M>,
        j: usize,
        cot: &GradCotangents<'_>,
        out: Dtype,
    ) -> [ErrorBound; M] {
        let Some(first) = all.first() else {
            return std::array::from_fn(|_| unreachable!("M = 0"));
        };
        let sh = GradShared::new(first.stats, j, cot);
        let mut bounds: [ErrorBound; M] = std::array::from_fn(|_| ErrorBound::Abs(0.0));
        for i in 0..M {
            // A twin of an earlier bound ([`RowBounds::grad_row`]) gives the same bits.
            let t = row.twin[i];
            if t < i {
                bounds[i] = bounds[t].clone();
                continue;
            }
            let rb = &all[i];
            let r = if std::ptr::eq(rb.stats, first.stats) {
                rb.grad_elem(j, cot, out, &sh, &row.models[i], &row.cot)
            } else {
                let sh = GradShared::new(rb.stats, j, cot);
                rb.grad_elem(j, cot, out, &sh, &row.models[i], &row.cot)
            };
            bounds[i] = match r {
                Ok(b) => b,
                Err(reason) => ErrorBound::None { reason },
            };
        }
        bounds
    }

    /// This model's row constants of (T14) for `cot`.
    pub(super) fn grad_consts(&self, cot: &GradCotangents<'_>, cc: &CotConsts) -> ModelGrad {
        let c = &self.c;
        // A cotangent not representable in the accumulation dtype is rounded
        // into it first (our kernels do): one more rounding on every path.
        let widened = std::iter::once(cot.g)
            .chain(std::iter::once(cot.h))
            .chain(cot.topk.iter().map(|&(_, gk)| gk))
            .any(|x| c.acc.round_f64(x) != x);
        let base = cc.n0 + 2 + c.t_count + widened as usize;
        let inv_t = Hi::ONE / Lo(c.temperature);
        let floor_of = |m: usize| Hi((m + 2) as f64) * c.eta * Hi::ONE.max(inv_t);
        ModelGrad {
            base,
            inv_t,
            gm: std::array::from_fn(|i| gamma(base + i, c.u.0)),
            floor: std::array::from_fn(|i| floor_of(base + i)),
            dense: if cot.h != 0.0 {
                gamma(c.loss_sum_depth, c.u.0)
            } else {
                Ok(Hi::ZERO)
            },
            h_hi: self
                .w
                .as_ref()
                .map(|set| Hi(set.ln_s.hi) + Hi(self.stats.r.hi))
                .unwrap_or(Hi::ZERO),
            pw_same: matches!((&self.p, &self.w), (Ok(p), Ok(w)) if p.same_bits(w)),
            policy: cot.policy.as_ref().map(|pg| {
                self.policy_base()
                    .and_then(|b| PolicyGradTerms::new(&b, c.u, pg))
            }),
            kl: cot.kl.as_ref().map(|kg| self.kl_grad_terms(kg)),
            loss: cot.loss.as_ref().map(|l| self.loss_terms(l)),
        }
    }

    /// (T19) The loss side's row constants for this model: from the
    /// accumulation-dtype `lse^` (T15 with its rounding) and, for the soft
    /// cross-entropy, the teacher's exp error (T28l).
    fn loss_terms(&self, l: &LossGradCotangents<'_>) -> Result<LossTerms, NoBound> {
        let c = &self.c;
        let (pre, big_l) = self.lse_pre()?;
        let e_l = pre + half_ulp(c.acc, big_l + pre);
        let exp_err = TeacherExpErr {
            theta: (Hi::ONE + c.eps_exp) * (c.u * Hi(l.soft_a_inexact)).exp() - Lo(1.0),
            eta: c.eta_sub + c.eta,
        };
        LossTerms::new(l, c.u, e_l, big_l, c.loss_sum_depth, exp_err)
    }

    /// The bound of element `j` (T14) from the row constants `mg`, `cc`
    /// and the element's model-independent terms `sh`.
    pub(super) fn grad_elem(
        &self,
        j: usize,
        cot: &GradCotangents<'_>,
        out: Dtype,
        sh: &GradShared,
        mg: &ModelGrad,
        cc: &CotConsts,
    ) -> Result<ErrorBound, NoBound> {
        let c = &self.c;
        let st = self.stats;
        let (Some(dj), Some(ej)) = (st.d.get(j), st.e.get(j)) else {
            return Err(NoBound::MissingStatistic {
                what: "d_j / e_j (column out of range)",
            });
        };
        let h = Hi(cot.h.abs());
        let Sources {
            g_sum,
            ind,
            mut n_extra,
            extra,
            loss,
            policy,
            kl,
        } = self.grad_sources(j, cot, sh, mg, cc)?;
        // p-terms: |g^| p_j rho_j (T10).
        let (mut p_hi, mut p_dev) = (Hi::ZERO, Hi::ZERO);
        // `(lambda_j, p_dev)` of the p-term, for the h-term when its set
        // and entry are the same bits (no sampling mask): same results.
        let mut p_terms: Option<(Hi, Hi)> = None;
        if (g_sum.0 > 0.0 || policy.is_some() || kl.is_some()) && dj.hi > f64::NEG_INFINITY {
            let set = self.p.as_ref().map_err(Clone::clone)?;
            let (lw, arg, lam) = self.prob_arg(set, dj);
            p_hi = sh.ep;
            p_dev = c.prob_dev_with(lw, sh.ep, arg);
            p_terms = Some((lam, p_dev));
        }
        // h-terms: |h| (q_dev (|c| + dc) + q dc) with c_j = e_j + R.
        let (mut q_hi, mut q_dev, mut c_abs, mut dc, mut lpw_abs) =
            (Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO);
        let mut h_hi = Hi::ZERO;
        if h.0 > 0.0 && ej.hi > f64::NEG_INFINITY {
            let set = self.w.as_ref().map_err(Clone::clone)?;
            let dh = *self.entropy_grad.as_ref().map_err(Clone::clone)?;
            let same =
                mg.pw_same && bits(dj.lo, ej.lo) && bits(dj.hi, ej.hi) && bits(sh.ep.0, sh.eq.0);
            let lam = match p_terms {
                Some((lam, dev)) if same => {
                    q_dev = dev;
                    lam
                }
                _ => {
                    let (lw, arg, lam) = self.prob_arg(set, ej);
                    q_dev = c.prob_dev_with(lw, sh.eq, arg);
                    lam
                }
            };
            q_hi = sh.eq;
            let c_hi = Hi(ej.hi) + Hi(st.r.hi);
            let c_lo = Lo(ej.lo) + Lo(st.r.lo);
            c_abs = c_hi.max(c_lo.neg());
            dc = lam + dh;
            lpw_abs = mag(ej) + Hi(set.ln_s.hi);
            h_hi = mg.h_hi;
            n_extra += 2;
        }
        // (T19b) Autograd's log_softmax backward sums the entropy's dense
        // cotangent with the sources' weights over `V`: `p_j`'s weight
        // moves by `gamma_{D_V} G` more, biased, so sound in the statistical
        // tier too.
        let mut main = g_sum * p_dev + h * (q_dev * (c_abs + dc) + q_hi * dc);
        if h.0 > 0.0 && g_sum.0 > 0.0 {
            main = main + mg.dense.clone()? * g_sum * p_hi;
        }
        // Rounding of the combination: gamma_m over the elementary terms'
        // magnitudes, m = n0 + n_extra + 2 + (0 or 2 for /T) + widened.
        let (gm, floor) = match (mg.gm.get(n_extra), mg.floor.get(n_extra)) {
            (Some(gm), Some(&floor)) => (gm.clone()?, floor),
            _ => {
                let m = mg.base + n_extra;
                let gm = gamma(m, c.u.0)?;
                (gm, Hi((m + 2) as f64) * c.eta * Hi::ONE.max(mg.inv_t))
            }
        };
        let mags =
            ind + g_sum * (p_hi + p_dev) + h * (q_hi + q_dev) * (lpw_abs + h_hi + Hi(2.0) + dc);
        let inv_t = mg.inv_t;
        let pre = (main + gm * mags + extra) * inv_t + floor;
        let mut pre = finite(pre, "grad_logits")?;
        // |dx'_j| (the gradient with respect to x'), bounding |dx_j| too.
        let mut v_abs = (ind + g_sum * p_hi + h * q_hi * c_abs) * inv_t;
        if let Some((l, lt)) = &loss {
            let (e, u_hi) = lt.extra(l, j, cot.token, p_hi + p_dev, g_sum);
            pre = finite(pre + e * inv_t, "grad_logits")?;
            v_abs = v_abs + u_hi * inv_t;
        }
        if let Some(pt) = &policy {
            // |w^ - w| |1[j = t] - p_j|, p_j <= p_hi (T21).
            pre = finite(pre + pt.extra(j, cot.token, p_hi) * inv_t, "grad_logits")?;
        }
        if let Some(kt) = &kl {
            // sum_k |w^_k - w_k| |1[j = id_k] - p_j| (T25).
            pre = finite(pre + kt.extra(j, p_hi) * inv_t, "grad_logits")?;
        }
        if let Some(df) = c.cap_df {
            // (T18) dx^ = fl(dx'^ f^) with f = 1 - t^2 <= 1:
            // E' (1 + df) + |dx'| df + u (|dx'| + E') (1 + df).
            let f_hi = Hi::ONE + df;
            pre = finite(
                pre * f_hi + v_abs * df + c.u * (v_abs + pre) * f_hi,
                "grad_logits",
            )?;
        }
        let mut total = pre;
        if out.precision() < c.acc.precision() {
            total = total + half_ulp(out, v_abs + pre);
        }
        Ok(ErrorBound::Abs(finite(total, "grad_logits")?.0))
    }

    /// The sources of element `j` beyond the row's `n0` (T14): `G`, the
    /// indicator terms at `j` and their count, with the loss side (T19,
    /// T28), the policy terms (T21) and the top-k KL (T25) folded in.
    fn grad_sources<'c, 'm>(
        &self,
        j: usize,
        cot: &GradCotangents<'c>,
        sh: &GradShared,
        mg: &'m ModelGrad,
        cc: &CotConsts,
    ) -> Result<Sources<'c, 'm>, NoBound> {
        // Top-k terms of every id the caller passes: live ids, including
        // those with `d_id = -inf` (T14: `G_k (1 - 0) / T` at the id).
        let mut g_sum = cc.g_sum;
        let mut ind = sh.ind;
        // Terms beyond the row's `n0`: the indicators at `j`, the h-terms.
        let mut n_extra = sh.n_extra;
        // An error at `j` beyond the sources' roundings (T28l).
        let mut extra = Hi::ZERO;
        // (T19): the loss side's two weights join G (and the target's the
        // indicator at t), two more terms (three at t).
        let loss = match (&cot.loss, &mg.loss) {
            (Some(l), Some(lt)) => {
                let lt = lt.clone()?;
                let exp_err = lt.exp_err;
                g_sum = g_sum + lt.t_weight + lt.p_weight;
                n_extra += 2;
                if cot.token == Some(j) {
                    ind = ind + lt.t_weight;
                    n_extra += 1;
                }
                // (T28): the soft cross-entropy's weight of `p_j` is one more
                // term of the total; its source `-c p_j` at `j` an indicator
                // (`c` and `p_j` rounded, their product, the division by `T`
                // and the subtraction: four more roundings).
                if l.soft != 0.0 {
                    n_extra += 1;
                }
                if let Some(pj) = l.teacher_at(j) {
                    ind = ind + Hi(l.soft) * pj;
                    n_extra += 4;
                    // (T28l) `|c| |p^_j - p_j|`, beyond (T14)'s roundings.
                    if l.soft_log_probs {
                        extra = Hi(l.soft) * (exp_err.theta * pj + exp_err.eta);
                    }
                }
                Some((*l, lt))
            }
            _ => None,
        };
        // (T21): the policy terms' log-prob cotangent `w^`, one more source
        // at the target: in G, and in the indicator at t.
        let policy = match &mg.policy {
            Some(pt) => {
                let pt = pt.clone()?;
                g_sum = g_sum + pt.weight;
                n_extra += 1;
                if cot.token == Some(j) {
                    ind = ind + pt.weight;
                    n_extra += 1;
                }
                Some(pt)
            }
            None => None,
        };
        // (T25): the top-k KL's cotangents `w^_k`, one more source at each
        // id: in G (K terms), and in the indicator at an id.
        let kl = match &mg.kl {
            Some(kt) => {
                let kt = kt.as_ref().map_err(Clone::clone)?;
                g_sum = g_sum + kt.weight;
                n_extra += kt.per_id.len();
                for &(id, w, _) in &kt.per_id {
                    if id == j {
                        ind = ind + w;
                        n_extra += 1;
                    }
                }
                Some(kt)
            }
            None => None,
        };
        Ok(Sources {
            g_sum,
            ind,
            n_extra,
            extra,
            loss,
            policy,
            kl,
        })
    }

    /// `(ln p_j upper, arg_j, lambda_j)`: the exponent of the relative
    /// error of a computed probability, the larger of its two evaluation
    /// forms (T10): `exp(lp^_j)` (`lambda_j`, T9) and `e^_j / S^`
    /// (`alpha_j - ln(1 - theta_S) + 2u`).
    pub(super) fn prob_arg(&self, set: &SetBounds, d: &Interval) -> (Hi, Hi, Hi) {
        let c = &self.c;
        let d_abs = mag(d);
        let lw = Hi(d.hi) - Lo(set.ln_s.lo);
        let alpha = c.a * d_abs + c.b;
        let via_div = alpha + set.nl_theta + Hi(2.0) * c.u;
        let lam = c.lambda(set, d_abs);
        (lw, lam.max(via_div), lam)
    }
}

/// [`RowBounds::grad_sources`]: element `j`'s sources beyond the row's `n0`.
struct Sources<'c, 'm> {
    g_sum: Hi,
    ind: Hi,
    n_extra: usize,
    /// An error at `j` beyond the roundings `n_extra` counts, before `/T`.
    extra: Hi,
    loss: Option<(LossGradCotangents<'c>, LossTerms)>,
    policy: Option<PolicyGradTerms>,
    /// Borrowed: the per-id list is the row's.
    kl: Option<&'m KlGradTerms>,
}

/// `gamma_m` and floors precomputed per model: `m = base + n_extra` for
/// `n_extra < GRAD_M` (others computed when met).
pub(super) const GRAD_M: usize = 8;

/// The row constants of the gradient bound (T14) of `M` models for one
/// row's cotangents ([`RowBounds::grad_row`]).
#[derive(Clone, Debug)]
pub struct GradRow<const M: usize> {
    pub(super) cot: CotConsts,
    pub(super) models: [ModelGrad; M],
    /// Per bound: the first bound of the row that gives every element the
    /// same gradient bound ([`RowBounds::twin_key`]; itself when none
    /// before it does).
    pub(super) twin: [usize; M],
}

/// The model-independent row constants of (T14): `G = |g| + sum |G_k|`
/// (in the cotangents' order, upward) and `n0`, the terms counted on every
/// element (`g` when nonzero, each nonzero `G_k`).
#[derive(Clone, Copy, Debug)]
pub(super) struct CotConsts {
    pub(super) g_sum: Hi,
    pub(super) n0: usize,
}

impl CotConsts {
    pub(super) fn new(cot: &GradCotangents<'_>) -> CotConsts {
        let mut g_sum = Hi(cot.g.abs());
        let mut n0 = usize::from(cot.g != 0.0);
        for &(_, gk) in cot.topk {
            if gk == 0.0 {
                continue;
            }
            g_sum = g_sum + Hi(gk.abs());
            n0 += 1;
        }
        CotConsts { g_sum, n0 }
    }
}

/// One model's row constants of (T14).
#[derive(Clone, Debug)]
pub(super) struct ModelGrad {
    /// `m` of an element with no indicator term and no h-term.
    pub(super) base: usize,
    /// `1 / T`, upward.
    pub(super) inv_t: Hi,
    /// `gamma_{base + i}`.
    pub(super) gm: [Result<Hi, NoBound>; GRAD_M],
    /// `(base + i + 2) eta max(1, 1/T)`.
    pub(super) floor: [Hi; GRAD_M],
    /// (T19b) `gamma_{D_V}` when the entropy's dense cotangent is summed
    /// with the sources' weights (`h != 0`), else 0.
    pub(super) dense: Result<Hi, NoBound>,
    /// `ln S_w + R` (upper; 0 without an entropy set bound).
    pub(super) h_hi: Hi,
    /// The two sets' bounds are the same bits (no sampling mask).
    pub(super) pw_same: bool,
    /// (T21) The policy terms' log-prob cotangent: its magnitude and error
    /// (`None` without policy cotangents).
    pub(super) policy: Option<Result<PolicyGradTerms, NoBound>>,
    /// (T25) The top-k KL's cotangents at the ids: magnitudes and errors
    /// (`None` without KL cotangents).
    pub(super) kl: Option<Result<KlGradTerms, NoBound>>,
    /// (T19) The loss side's row constants (`None` without loss-side
    /// cotangents).
    pub(super) loss: Option<Result<LossTerms, NoBound>>,
}

/// What the gradient bound of element `j` shares across the models of
/// one row: `e^lw` of `p_j` and `q_j` (`lw = d_j - ln S` at the far ends
/// of the enclosures: the same under every model), each evaluated only
/// when a cotangent needs it, and the indicator terms at `j`.
pub(super) struct GradShared {
    /// `e^(d_j.hi - ln S.lo)` (upward; 0 when unused).
    pub(super) ep: Hi,
    /// `e^(e_j.hi - ln S_w.lo)` (upward; 0 when unused).
    pub(super) eq: Hi,
    /// `|g| 1[j = t] + sum_k |G_k| 1[j = id_k]` (upward, in that order).
    pub(super) ind: Hi,
    /// The indicator terms at `j` (each counted once more in `m`).
    pub(super) n_extra: usize,
}

/// The part of [`GradShared`] that is the row's, not the element's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GradSharedRow {
    /// A cotangent other than `h` reads `p_j`.
    pub(super) g_used: bool,
    /// `h != 0`: the entropy's cotangent reads `q_j`.
    pub(super) h_used: bool,
    /// `ln S.lo` and `ln S_w.lo` are the same bits.
    pub(super) same_ln: bool,
}

impl GradSharedRow {
    pub(super) fn new(st: &RowStats, cot: &GradCotangents<'_>) -> GradSharedRow {
        GradSharedRow {
            g_used: cot.g != 0.0
                || cot.topk.iter().any(|&(_, gk)| gk != 0.0)
                || cot.loss.is_some()
                || cot.policy.is_some()
                || cot.kl.is_some(),
            h_used: cot.h != 0.0,
            same_ln: bits(st.ln_s.lo, st.ln_s_w.lo),
        }
    }
}

impl GradShared {
    pub(super) fn new(st: &RowStats, j: usize, cot: &GradCotangents<'_>) -> GradShared {
        Self::with_row(st, j, cot, None, &GradSharedRow::new(st, cot))
    }

    /// [`GradShared::new`] with the row's part computed once (`row`:
    /// [`GradSharedRow::new`] of the same `st` and `cot`), `p_j`'s exp read
    /// from `ep` ([`RowBounds`]'s, the same bits) when given.
    #[inline(always)]
    pub(super) fn with_row(
        st: &RowStats,
        j: usize,
        cot: &GradCotangents<'_>,
        ep: Option<&[Hi]>,
        row: &GradSharedRow,
    ) -> GradShared {
        let e = |used: bool, x: Option<&Interval>, ln_s: Interval| match x {
            Some(x) if used && x.hi > f64::NEG_INFINITY => (Hi(x.hi) - Lo(ln_s.lo)).exp(),
            _ => Hi::ZERO,
        };
        let GradSharedRow {
            g_used,
            h_used,
            same_ln,
        } = *row;
        let ind_t = cot.token == Some(j) && cot.g != 0.0;
        let mut ind_k = Hi::ZERO;
        let mut n_extra = usize::from(ind_t);
        for &(id, gk) in cot.topk {
            if gk != 0.0 && id == j {
                ind_k = ind_k + Hi(gk.abs());
                n_extra += 1;
            }
        }
        let ep = match ep.and_then(|ep| ep.get(j)) {
            Some(&ep) if g_used && st.d.get(j).is_some_and(|d| d.hi > f64::NEG_INFINITY) => ep,
            _ => e(g_used, st.d.get(j), st.ln_s),
        };
        // Without a sampling mask `q_j`'s exponent is `p_j`'s, bit for bit:
        // one exp.
        let same = g_used
            && matches!((st.d.get(j), st.e.get(j)), (Some(d), Some(e)) if bits(d.hi, e.hi))
            && same_ln;
        let eq = if same && h_used {
            ep
        } else {
            e(h_used, st.e.get(j), st.ln_s_w)
        };
        GradShared {
            ep,
            eq,
            ind: if ind_t {
                Hi(cot.g.abs()) + ind_k
            } else {
                ind_k
            },
            n_extra,
        }
    }
}
