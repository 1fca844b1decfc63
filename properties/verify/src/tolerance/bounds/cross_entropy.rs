//! The cross-entropy family's bounds: `lse` (T15), `z_loss` (T16), the
//! row loss and its reductions (T17), and the softcap's error terms (T18)
//! the row constants take.

use super::*;

impl RowBounds<'_> {
    /// The bound of the loss family's `term` for a candidate in `out` (the
    /// family's arm of [`RowBounds::bound`]): `lse` ([`RowBounds::lse`]),
    /// `z_loss` ([`RowBounds::z_loss`]), the per-row cross-entropy
    /// ([`RowBounds::loss`]), the soft cross-entropy
    /// ([`RowBounds::soft_cross_entropy`]).
    pub(super) fn loss_family(
        &self,
        term: LossTerm,
        targets: &RowTargets,
        out: Dtype,
    ) -> ErrorBound {
        match term {
            LossTerm::Lse => self.lse(out),
            LossTerm::ZLoss => self.z_loss(targets.z_loss_coef, out),
            LossTerm::CrossEntropy => self.loss(targets, out),
            LossTerm::SoftCrossEntropy => {
                self.soft_cross_entropy(&targets.teacher_probs, targets.teacher_form, out)
            }
        }
    }
}

/// (T18) The softcap's error terms of a model: `(cap_z, cap_df)` (see
/// [`Consts`]). `x'^ = fl(c fl_tanh(fl(x / c)))` with `x / c` one
/// division or a multiply by a rounded `1 / c` (relative `gamma_2`),
/// `tanh` within `k_t` ulps, one product: with `y = x / c` exact,
/// `e_T = gamma_2 / (1 - gamma_2) SECH2_Y_MAX + 2 k_t u + k_t eta_sub`
/// bounds `|t^ - tanh(y)|` and `|x'^ - x'| <= c (e_T (1 + u) + u)`; the
/// factor `fl(1 - fl(t^ t^))` errs by at most
/// `e_T (2 + e_T) + u (1 + e_T)^2 + u (1 + e_T (2 + e_T) + u (1 + e_T)^2)`
/// (`|t| <= 1`, `f <= 1`). A materialised `x'` has `e_T = 0`.
pub(super) fn softcap_consts(model: &Model, ctx: &RowContext, u_f: f64) -> (Hi, Option<Hi>) {
    let Some(s) = ctx.softcap else {
        return (Hi::ZERO, None);
    };
    let u = Hi(u_f);
    let e_t = if s.computed {
        let g2 = gamma(2, u_f).unwrap_or(Hi(f64::INFINITY));
        let kt = Hi(model.tanh_ulps.max(0.0));
        g2 / (Lo(1.0) - g2) * Hi(SECH2_Y_MAX)
            + Hi(2.0) * kt * u
            + kt * Hi(model.accumulation.ulp(0.0))
    } else {
        Hi::ZERO
    };
    let cap_x = if s.computed {
        Hi(s.c) * (e_t * (Hi::ONE + u) + u)
    } else {
        Hi::ZERO
    };
    let cap_z = cap_x / Lo(ctx.temperature);
    let sq = (Hi::ONE + e_t) * (Hi::ONE + e_t);
    let spread = e_t * (Hi(2.0) + e_t);
    let df = spread + u * sq + u * (Hi::ONE + spread + u * sq);
    (cap_z, Some(df))
}

impl RowBounds<'_> {
    /// Bound (nats) on `|loss^ - loss|` of this row's cross-entropy term
    /// `w l` under `reduction = none` for a candidate in `out` (T17:
    /// [`RowBounds::loss_row`] through [`loss_bounds`] for one row): 0 on
    /// a row not counted or of weight 0 (exactly 0) and for an exact
    /// `+inf`.
    pub fn loss(&self, targets: &RowTargets, out: Dtype) -> ErrorBound {
        let Some(l) = &targets.loss else {
            return ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "loss options",
                },
            };
        };
        loss_bounds(
            &[self.loss_row_of(l)],
            &[l.counted],
            Some(&[l.weight]),
            logprobe_reference::spec::Reduction::None,
            logprobe_reference::spec::Summation::sequential(1),
            1.0,
            self.c.acc,
            out,
        )
        .pop()
        .expect("one row, one bound")
    }

    /// [`RowBounds::loss_row`] for the row `l` describes: a zero bound
    /// (exactly 0) on a row not counted or of weight 0.
    ///
    /// # Errors
    /// Those of [`RowBounds::loss_row`].
    pub fn loss_row_of(&self, l: &crate::tolerance::LossTarget) -> Result<LossRowBound, NoBound> {
        if !(l.counted && l.weight != 0.0) {
            return Ok(LossRowBound {
                err: 0.0,
                mag: 0.0,
                infinite: false,
            });
        }
        match &l.sums {
            Some(s) => self.loss_row_with(l.label_smoothing, s),
            None => self.loss_row(l.label_smoothing, |j| {
                l.allowed.as_ref().is_none_or(|a| a[j])
            }),
        }
    }

    /// Error (nats) of `lse = m / T + ell` in the accumulation dtype,
    /// before its own rounding (T15): `t_T Z + delta_ell`, and the
    /// magnitude bound `Z + ln S` of the value.
    pub(super) fn lse_pre(&self) -> Result<(Hi, Hi), NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let mut pre = self.c.t_div * self.c.z + set.delta_ell;
        if self.c.cap_z.0 > 0.0 {
            // (T18) the computed x'_max is off by T cap_z, scaled by 1/T.
            pre = pre + (Hi::ONE + self.c.t_div) * self.c.cap_z;
        }
        Ok((pre, self.c.z + Hi(set.ln_s.hi)))
    }

    /// Bound (nats) on `|lse^ - lse|` for a candidate in `out` (T15, then
    /// the final roundings T8).
    pub fn lse(&self, out: Dtype) -> ErrorBound {
        match self.lse_pre() {
            Ok((pre, v_abs)) => self.c.finish(pre, v_abs, out, "lse"),
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// Bound on `|z_loss^ - z_loss|` for `z_loss = coef * lse^2` (`coef`
    /// as the computation takes it) and a candidate in `out` (T16): from
    /// the accumulation-dtype `lse^` with error `E_L` (T15 and its rounding),
    /// `coef (E_L (2 L + E_L) + gamma_2 (L + E_L)^2)` with `L = Z + ln S`,
    /// then half an ulp of `out` when it is narrower than the accumulation.
    pub fn z_loss(&self, coef: f64, out: Dtype) -> ErrorBound {
        let (pre, l) = match self.lse_pre() {
            Ok(v) => v,
            Err(reason) => return ErrorBound::None { reason },
        };
        let g2 = match gamma(2, self.c.u.0) {
            Ok(g) => g,
            Err(reason) => return ErrorBound::None { reason },
        };
        let e_l = pre + half_ulp(self.c.acc, l + pre);
        let c = Hi(coef.abs());
        let big = l + e_l;
        let a = c * (e_l * (Hi(2.0) * l + e_l) + g2 * big * big);
        let mut total = a;
        if out.precision() < self.c.acc.precision() {
            total = total + half_ulp(out, c * big * big + a);
        }
        // Past f64's range (f64 logits near 1e154 and beyond: `c lse^2`
        // overflows) the bound saturates at the largest f64: no tighter
        // than needed for the correct infinity (error 0, Exact::error) and
        // never looser than the derivation, so no value it would fail passes.
        if total.0 == f64::INFINITY {
            return ErrorBound::Abs(f64::MAX);
        }
        match finite(total, "z_loss") {
            Ok(t) => ErrorBound::Abs(t.0),
            Err(reason) => ErrorBound::None { reason },
        }
    }
}

impl RowBounds<'_> {
    /// Bound (nats) on `|H^ - H|` of the soft-target cross-entropy
    /// `H = -sum_j p_j lp_j` for a candidate in `out` (TOLERANCE.md (T27)):
    /// the teacher's `p_j` rounded to the accumulation dtype, each product
    /// `p_j lp_j` of a rounded log-softmax entry (error `lambda_j`, T9)
    /// rounded, summed in the model's
    /// [`Model::loss_order`](crate::tolerance::Model::loss_order) (depth
    /// `D_V`), then the final roundings (T8). `p [V]`: the row's teacher
    /// as `form` holds it (probabilities, or log-probabilities whose `exp`
    /// the kernel takes: (T27l)). Teacher mass on a `-inf` log-prob makes
    /// `H = +inf`: bound 0, only `+inf` is right.
    pub fn soft_cross_entropy(&self, p: &[f64], form: TeacherForm, out: Dtype) -> ErrorBound {
        let set = match &self.p {
            Ok(s) => s,
            Err(e) => return ErrorBound::None { reason: e.clone() },
        };
        let (mut p0, mut p1) = (Hi::ZERO, Hi::ZERO);
        // (T27l) The largest relative error `theta_j` of a computed `p^_j`,
        // the entries' count and `sum |d_j|` (for the absolute part).
        let (mut theta, mut n, mut q1) = (Hi::ZERO, 0usize, Hi::ZERO);
        for (j, &x) in p.iter().enumerate() {
            if form.is_zero(x) {
                continue;
            }
            let Some(d) = self.stats.d.get(j) else {
                return ErrorBound::None {
                    reason: NoBound::MissingStatistic {
                        what: "d of a teacher entry (out of range)",
                    },
                };
            };
            if d.hi == f64::NEG_INFINITY {
                return ErrorBound::Abs(0.0);
            }
            let pj = match form {
                TeacherForm::Probs => Hi(x),
                TeacherForm::LogProbs => {
                    theta = theta.max(self.c.teacher_theta(x));
                    n += 1;
                    q1 = q1 + mag(d);
                    Hi(x).exp()
                }
            };
            p0 = p0 + pj;
            p1 = p1 + pj * mag(d);
        }
        let u = self.c.u;
        let g_sum = match self.c.acc_gamma(self.c.loss_sum_depth) {
            Ok(g) => g,
            Err(reason) => return ErrorBound::None { reason },
        };
        // (T27) sum p_j lambda_j: lambda is affine in |d| (T9).
        let e_pl = self.c.lambda_sum(set, p1, p0);
        let pl_abs = p1 + p0 * Hi(set.ln_s.hi);
        let one_u = Hi::ONE + u;
        let big = pl_abs + e_pl;
        let pre = match form {
            TeacherForm::Probs => e_pl + (Hi(2.0) * u + u * u) * big + g_sum * one_u * one_u * big,
            TeacherForm::LogProbs => {
                // `|p^_j - p_j| <= theta p_j + eta_abs`, then the product's
                // rounding; the sum over the terms' computed magnitudes.
                let rel = (Hi::ONE + theta) * one_u - Lo(1.0);
                let n = Hi(n as f64);
                let abs_terms = q1 + n * Hi(set.ln_s.hi) + self.c.lambda_sum(set, q1, n);
                let eta = (self.c.eta_sub + self.c.eta) * one_u * abs_terms;
                let big_hat = (Hi::ONE + theta) * big + eta;
                e_pl + rel * big + eta + g_sum * one_u * one_u * big_hat
            }
        };
        self.c.finish(pre, pl_abs, out, "soft_cross_entropy")
    }
}

/// The per-entry sums the smoothed row-loss bound (T17) needs, the same
/// for every summation model: one O(V) pass per row
/// ([`LossSums::of`]), then each model's bound is O(1)
/// ([`RowBounds::loss_row_with`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSums {
    /// `|A|`: the allowed entries `j < V`.
    pub count: usize,
    /// Upper bound (nats) of `sum_{j in A} |d_j|`.
    pub sum_abs_d: f64,
    /// An allowed entry is `-inf` (the smoothed loss is `+inf`).
    pub infinite: bool,
}

impl LossSums {
    /// The sums over the allowed entries (`allowed(j)`, `j < V`) of a
    /// row's statistics `d [V]`.
    pub fn of(stats: &RowStats, allowed: impl Fn(usize) -> bool) -> LossSums {
        let mut out = LossSums::default();
        let mut sum = Hi::ZERO;
        for (j, d) in stats.d.iter().enumerate() {
            if !allowed(j) {
                continue;
            }
            if d.hi == f64::NEG_INFINITY {
                out.infinite = true;
                return out;
            }
            sum = sum + mag(d);
            out.count += 1;
        }
        out.sum_abs_d = sum.0;
        out
    }
}

/// One row's cross-entropy loss in the accumulation dtype, as the
/// reduction bound ([`loss_bounds`]) takes it (T17).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossRowBound {
    /// Bound (nats) on `|l^ - l|` of the accumulation-dtype row loss
    /// (every rounding included, the last one too).
    pub err: f64,
    /// Upper bound (nats) on `|l|`.
    pub mag: f64,
    /// The exact row loss is `+inf` (a `-inf` logit among the smoothed
    /// entries with `eps > 0`): only `+inf` is right.
    pub infinite: bool,
}

impl RowBounds<'_> {
    /// Bound of the cross-entropy row loss
    /// `l = (1 - eps)(-lp_t) + eps mean_{j in A}(-lp_j)` in the accumulation
    /// dtype (TOLERANCE.md (T17)): each `lp_j` a rounded log-softmax entry
    /// with error `lambda_j` (T9), their sum over the row in the model's
    /// [`Model::loss_order`](crate::tolerance::Model::loss_order) (depth
    /// `D_V` over `V` terms), one division by `|A|`, then `1 - eps`, two products and an addition
    /// (`gamma_4`). `eps` as the computation takes it (rounded to the
    /// accumulation dtype); `allowed(j)`: entry `j < V` allowed by the
    /// sampling mask.
    ///
    /// # Errors
    /// [`NoBound`] when the model certifies nothing for this row or it has
    /// no target.
    pub fn loss_row(
        &self,
        eps: f64,
        allowed: impl Fn(usize) -> bool,
    ) -> Result<LossRowBound, NoBound> {
        let sums = if eps == 0.0 {
            LossSums::default()
        } else {
            LossSums::of(self.stats, allowed)
        };
        self.loss_row_with(eps, &sums)
    }

    /// [`RowBounds::loss_row`] from the row's [`LossSums`] (computed once
    /// for every model; unused when `eps = 0`).
    ///
    /// # Errors
    /// As [`RowBounds::loss_row`].
    pub fn loss_row_with(&self, eps: f64, sums: &LossSums) -> Result<LossRowBound, NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let d_t = self.stats.d_t.ok_or(NoBound::MissingStatistic {
            what: "d_t (no target)",
        })?;
        let ln_s = Hi(set.ln_s.hi);
        let lam = |d: &Interval| self.c.lambda(set, mag(d));
        let nll_err = lam(&d_t);
        let nll_abs = mag(&d_t) + ln_s;
        if eps == 0.0 {
            return Ok(LossRowBound {
                err: finite(nll_err, "loss")?.0,
                mag: nll_abs.0,
                infinite: false,
            });
        }
        if sums.infinite {
            return Ok(LossRowBound {
                err: 0.0,
                mag: f64::INFINITY,
                infinite: true,
            });
        }
        let count = sums.count;
        let (sum_d, n_a) = (Hi(sums.sum_abs_d), Hi(count as f64));
        let s_err = self.c.lambda_sum(set, sum_d, n_a);
        let s_abs = sum_d + n_a * ln_s;
        let u = self.c.u;
        let g_sum = gamma(self.c.loss_sum_depth, u.0)?;
        let e_s = s_err + g_sum * (s_abs + s_err);
        let n = Lo(count.max(1) as f64);
        let mean_abs = s_abs / n;
        let e_m = (e_s / n) * (Hi::ONE + u) + u * (mean_abs + e_s / n);
        let g4 = gamma(4, u.0)?;
        let one_minus = Hi(1.0 - eps) + Hi(f64::EPSILON);
        let err = one_minus * nll_err + Hi(eps) * e_m + g4 * (nll_abs + nll_err + mean_abs + e_m);
        Ok(LossRowBound {
            err: finite(err, "loss")?.0,
            mag: (nll_abs + mean_abs).0,
            infinite: false,
        })
    }
}

/// Bounds (nats) of the cross-entropy `loss` for a candidate in `out`
/// (TOLERANCE.md (T17)): `[N]` under `none`, one under `sum` / `mean`.
/// `rows[r]` is row `r`'s [`LossRowBound`] (ignored for rows
/// not `counted`), `weights` the `loss_weights` (1 without), `divisor_lo` a
/// lower bound of the exact `mean` divisor (the oracle's
/// [`logprobe_reference::oracle::OracleLoss::divisor`]), `acc` the
/// accumulation dtype, `rows_summation` the summation of the reduction
/// over the `N` row terms (the model's
/// [`Model::loss_order`](crate::tolerance::Model::loss_order) over `N`).
/// A row of weight `w != 1` adds `gamma_2` (its weight
/// rounded to `acc`, the product); the reduction sums the `N` rows
/// (`gamma_D`, `D = rows_summation.depth()`), the `mean`'s weighted
/// divisor is another such sum, then one division; the final roundings as (T8). An
/// exact `+inf` (or the all-ignored mean's declared value) has bound 0:
/// only that value is right.
#[allow(clippy::too_many_arguments)] // (T17)'s inputs, each documented above
pub fn loss_bounds(
    rows: &[Result<LossRowBound, NoBound>],
    counted: &[bool],
    weights: Option<&[f64]>,
    reduction: logprobe_reference::spec::Reduction,
    rows_summation: logprobe_reference::spec::Summation,
    divisor_lo: f64,
    acc: Dtype,
    out: Dtype,
) -> Vec<ErrorBound> {
    let u = acc.unit_roundoff();
    let g_rows = |_: usize| gamma(rows_summation.depth(), u);
    reduce_bounds(
        rows,
        counted,
        weights,
        reduction,
        divisor_lo,
        (acc, out),
        &g_rows,
    )
}

/// The statistical threshold (TOLERANCE.md (S4)) of a reduced loss: as
/// [`loss_bounds`] over the rows' statistical (T17) bounds, with the
/// reduction's `gamma_D` over the `n` counted rows replaced by `min(gamma_D,
/// c sqrt(n) u)` (`4 c` for a sequential order, as (S2)).
#[allow(clippy::too_many_arguments)] // (T17)'s inputs, each documented above
pub fn loss_statistical_bounds(
    rows: &[Result<LossRowBound, NoBound>],
    counted: &[bool],
    weights: Option<&[f64]>,
    reduction: logprobe_reference::spec::Reduction,
    rows_summation: logprobe_reference::spec::Summation,
    divisor_lo: f64,
    (acc, out): (Dtype, Dtype),
    c: f64,
) -> Vec<ErrorBound> {
    let u = acc.unit_roundoff();
    let g_rows = |n: usize| {
        let g = gamma(rows_summation.depth(), u)?;
        let c = if rows_summation.merges == 0 && n > 1 {
            c * crate::tolerance::statistical::SEQUENTIAL_FACTOR
        } else {
            c
        };
        Ok(Hi(g
            .0
            .min((Hi(c) * Hi((n as f64).sqrt().next_up()) * Hi(u)).0)))
    };
    reduce_bounds(
        rows,
        counted,
        weights,
        reduction,
        divisor_lo,
        (acc, out),
        &g_rows,
    )
}

/// [`loss_bounds`] with the reduction's accumulation term `g_rows(n)` for
/// `n` counted rows.
fn reduce_bounds(
    rows: &[Result<LossRowBound, NoBound>],
    counted: &[bool],
    weights: Option<&[f64]>,
    reduction: logprobe_reference::spec::Reduction,
    divisor_lo: f64,
    (acc, out): (Dtype, Dtype),
    g_rows: &dyn Fn(usize) -> Result<Hi, NoBound>,
) -> Vec<ErrorBound> {
    use logprobe_reference::spec::Reduction;
    let u = acc.unit_roundoff();
    let none = |reason: NoBound| ErrorBound::None { reason };
    let finish = |pre: Hi, m: Hi| -> ErrorBound {
        let y1 = pre + m;
        let r1 = half_ulp(acc, y1);
        let mut total = pre + r1;
        if out.precision() < acc.precision() {
            total = total + half_ulp(out, y1 + r1);
        }
        match finite(total, "loss") {
            Ok(t) => ErrorBound::Abs(t.0),
            Err(reason) => none(reason),
        }
    };
    let g2 = gamma(2, u);
    // Per row: Ok(Some((err, mag))) finite, Ok(None) exactly +inf.
    let terms: Vec<Result<Option<(Hi, Hi)>, NoBound>> = (0..rows.len())
        .map(|r| {
            let w = weights.map_or(1.0, |w| w[r]);
            if !counted[r] || w == 0.0 {
                return Ok(Some((Hi::ZERO, Hi::ZERO)));
            }
            let b = rows[r].clone()?;
            if b.infinite {
                return Ok(None);
            }
            let (e, m) = (Hi(b.err), Hi(b.mag));
            if w == 1.0 {
                Ok(Some((e, m)))
            } else {
                let g2 = g2.clone()?;
                let w = Hi(w);
                Ok(Some((w * (e + g2 * (m + e)), w * m)))
            }
        })
        .collect();
    match reduction {
        Reduction::None => terms
            .into_iter()
            .map(|t| match t {
                Ok(Some((e, m))) if e.0 == 0.0 && m.0 == 0.0 => ErrorBound::Abs(0.0),
                Ok(Some((e, m))) => finish(e, m),
                Ok(None) => ErrorBound::Abs(0.0),
                Err(reason) => none(reason),
            })
            .collect(),
        Reduction::Sum | Reduction::Mean => {
            let (mut e_sum, mut m_sum, mut inf) = (Hi::ZERO, Hi::ZERO, false);
            for t in terms {
                match t {
                    Ok(Some((e, m))) => {
                        e_sum = e_sum + e;
                        m_sum = m_sum + m;
                    }
                    Ok(None) => inf = true,
                    Err(reason) => return vec![none(reason)],
                }
            }
            let n_counted = counted.iter().filter(|&&c| c).count();
            let all_ignored =
                reduction == Reduction::Mean && (divisor_lo.is_nan() || divisor_lo <= 0.0);
            if inf || all_ignored {
                return vec![ErrorBound::Abs(0.0)];
            }
            if n_counted == 0 {
                return vec![ErrorBound::Abs(0.0)];
            }
            let g_rows = match g_rows(n_counted) {
                Ok(g) => g,
                Err(reason) => return vec![none(reason)],
            };
            let e_s = e_sum + g_rows * (m_sum + e_sum);
            if reduction == Reduction::Sum {
                return vec![finish(e_s, m_sum)];
            }
            // S^ / D^ with D^ = D (1 + theta), |theta| <= delta_D:
            // |S^/D^ - S/D| <= (E_S + |S| delta_D) / (D (1 - delta_D)).
            let delta_d = if weights.is_some() { g_rows } else { Hi::ZERO };
            if delta_d.0 >= 1.0 {
                return vec![none(NoBound::NonFinite {
                    what: "loss divisor",
                })];
            }
            let e_q = (e_s + m_sum * delta_d) / Lo(divisor_lo) / (Lo(1.0) - delta_d);
            vec![finish(e_q, m_sum / Lo(divisor_lo))]
        }
    }
}
