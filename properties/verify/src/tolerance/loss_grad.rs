//! The gradient bound of the loss-side cotangents (T19,
//! `properties/TOLERANCE.md`): `grad_lse`, `grad_z_loss` and `grad_loss`
//! fold into (T14)'s row constants as two more cotangent terms (the loss's
//! target weight `-(1 - eps) ell`, an indicator at `t`, and the weight
//! `pw = a + zb lse + ell eps` of `p_j`, at no column), plus the errors of
//! those coefficients and the smoothing constant `u = -ell eps / |A|` on
//! every allowed entry, which (T14) does not see. The soft cross-entropy's
//! cotangent `c` (T28) is one more source at every entry (`-c p_j`, the
//! teacher's `p_j`: an indicator term at `j`) and adds `c sum_j p_j` to
//! the weight of `p_j`, its sum in the declared summation. `bounds.rs`
//! calls [`LossTerms::new`] and adds [`LossTerms::extra`] to each element.

use ndarray::ArrayView1;

use super::upward::{Hi, Lo};
use super::NoBound;

/// The loss-side cotangents of one row (docs/design.md, "The loss side"), exact
/// inputs; part of [`super::GradCotangents`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossGradCotangents<'c> {
    /// `a`: the row's `grad_lse` (0 without).
    pub a: f64,
    /// `zb = 2 coef b`: `z_loss_coef` (as the computation takes it) times
    /// twice the row's `grad_z_loss` (0 without). Any sign.
    pub zb: f64,
    /// An upper bound of `|ell|`, the loss's row coefficient (`g w`, or
    /// `g w / W` under `mean`; 0 on an ignored row or without `grad_loss`).
    pub ell: f64,
    /// Under `mean`: the number of rows `N` whose weights the divisor `W`
    /// sums (any order: `gamma_{N+1}`); `None` otherwise.
    pub mean_rows: Option<usize>,
    /// Label smoothing `eps` (as the computation takes it).
    pub eps: f64,
    /// `|A|`: the allowed entries of the real vocabulary.
    pub count: usize,
    /// The row's sampling mask `[>= V]` (`None`: every entry allowed).
    pub mask: Option<ArrayView1<'c, bool>>,
    /// `|c|`: the row's `grad_soft_cross_entropy` (0 without).
    pub soft: f64,
    /// An upper bound of `sum_{j < V} p_j`, the teacher's mass (0 without
    /// `soft`).
    pub soft_mass: f64,
    /// The teacher `[V]` of `soft_cross_entropy`, exact, as
    /// `soft_log_probs` says (`None` without `soft`).
    pub teacher: Option<ArrayView1<'c, f64>>,
    /// (T28l) The teacher is given as log-probabilities: a kernel computes
    /// `p^_j = exp(fl(a_j))`, within `theta p_j + eta` of `p_j`.
    pub soft_log_probs: bool,
    /// (T28l) The largest `|a_j|` of an entry whose log-probability is not
    /// an f32 value (its rounding `u |a_j|` into the accumulation dtype
    /// moves `p_j` by `e^{u |a_j|} - 1`); 0 when there is none.
    pub soft_a_inexact: f64,
    /// (T28l) The entries with teacher mass (each may carry `eta`).
    pub soft_count: usize,
}

impl LossGradCotangents<'_> {
    /// `|c| p_j`'s inputs at entry `j`: an upper bound of the teacher's
    /// `p_j` when the soft cross-entropy's cotangent is nonzero and `p_j
    /// != 0`.
    pub(crate) fn teacher_at(&self, j: usize) -> Option<Hi> {
        let x = *self.teacher.as_ref()?.get(j)?;
        match (self.soft != 0.0, self.soft_log_probs) {
            (false, _) => None,
            (true, false) => (x != 0.0).then_some(Hi(x)),
            (true, true) => (x != f64::NEG_INFINITY).then(|| Hi(x).exp()),
        }
    }
}

/// (T28l) The error of a kernel's teacher probabilities from
/// log-probabilities: `|p^_j - p_j| <= theta p_j + eta`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TeacherExpErr {
    /// `theta = (1 + eps_exp) e^{u max|a_j|} - 1` (the inexact `a_j` only).
    pub theta: Hi,
    /// `eta`: `exp`'s absolute error in the subnormal range plus a flushed result.
    pub eta: Hi,
}

/// The row constants of (T19) for one model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LossTerms {
    /// `|s_t^|`: the computed target weight's magnitude (an indicator at `t`).
    pub t_weight: Hi,
    /// `|pw^|`: the computed `p_j` weight's magnitude.
    pub p_weight: Hi,
    /// `delta_C = delta_t + delta_pw`: the error of the computed total
    /// weight of `p_j` beyond (T14)'s roundings.
    delta_c: Hi,
    /// `delta_t`: the error of the target's weight (times `1 - p_t <= 1`).
    delta_t: Hi,
    /// `|u^|` and `|u^ - u|` (before the division by `T`).
    u_hi: Hi,
    delta_u: Hi,
    /// `gamma_3` for the roundings `u` takes part in.
    g3: Hi,
    /// (T28l) The teacher's exp error, for the soft cross-entropy's
    /// indicator at `j`.
    pub exp_err: TeacherExpErr,
}

impl LossTerms {
    /// (T19) for unit roundoff `u` of the accumulation dtype, the
    /// accumulation-dtype `lse^`'s error `e_l` and magnitude bound `big_l`
    /// (T15 with its rounding); (T28) the soft cross-entropy's teacher mass
    /// summed at depth `sum_depth` (the model's loss summation over `V`).
    ///
    /// # Errors
    /// [`NoBound::GammaUndefined`] when `(N + 1) u >= 1`.
    pub(crate) fn new(
        l: &LossGradCotangents<'_>,
        u: Hi,
        e_l: Hi,
        big_l: Hi,
        sum_depth: usize,
        exp_err: TeacherExpErr,
    ) -> Result<LossTerms, NoBound> {
        let one = Hi::ONE;
        let ou = one + u;
        // ell^ = fl(fl(g) fl(w)) [/ W^], W^ within gamma_{N+1} W.
        let theta_ell = match l.mean_rows {
            Some(n) => {
                let tw = gamma(n + 1, u.0)?;
                ou.powi(4) / (Lo(1.0) - tw) - Lo(1.0)
            }
            None => ou.powi(3) - Lo(1.0),
        };
        let ell = Hi(l.ell.abs());
        let ell_hi = ell * (one + theta_ell);
        let eps = Hi(l.eps);
        let one_m_eps = (Hi::ONE - Lo(l.eps)).max(Hi::ZERO);
        // s_t^ = -(ell^ fl(1 - eps)).
        let t_weight = one_m_eps * ell_hi * ou * ou;
        let delta_t = one_m_eps * ell * ((one + theta_ell) * ou * ou - Lo(1.0));
        // zb^ = fl(coef fl(b)) 2.
        let zb = Hi(l.zb.abs());
        let theta_z = ou * ou - Lo(1.0);
        let a = Hi(l.a.abs());
        // pw^ = fl(fl(a + fl(zb^ lse^)) + fl(ell^ eps)): four roundings.
        let m_pw = a * ou + zb * (one + theta_z) * (big_l + e_l) + eps * ell_hi;
        let g4 = gamma(4, u.0)?;
        let delta_pw =
            u * a + zb * (theta_z * (big_l + e_l) + e_l) + eps * ell * theta_ell + g4 * m_pw;
        // (T28) fl(c^ fl(sum p^_j)): the `p_j` rounded to the accumulation
        // dtype, summed at depth `D`, one product: within gamma_{D + 2}.
        let soft = Hi(l.soft) * Hi(l.soft_mass);
        let (soft_hi, delta_soft) = if l.soft != 0.0 {
            let gs = gamma(sum_depth + 2, u.0)?;
            // (T28l) The computed `p^_j` err by `theta p_j + eta` each.
            let e = if l.soft_log_probs {
                Hi(l.soft)
                    * (exp_err.theta * Hi(l.soft_mass) + exp_err.eta * Hi(l.soft_count as f64))
            } else {
                Hi::ZERO
            };
            ((soft + e) * (one + gs), soft * gs + e * (one + gs))
        } else {
            (Hi::ZERO, Hi::ZERO)
        };
        // (T19a) Autograd's form sums the dense smoothed cotangent (`u` on
        // every allowed entry, the target's weight at `t`) over `V` in the
        // declared loss order instead of forming `ell eps`: within
        // `gamma_D |ell|` more. Its rounding errors are biased (equal
        // small terms), so the statistical tier keeps this sound term.
        let delta_dense = if l.eps != 0.0 {
            gamma(sum_depth, u.0)? * ell_hi
        } else {
            Hi::ZERO
        };
        let delta_pw = delta_pw + delta_soft + delta_dense;
        let p_weight = m_pw * (one + g4) + soft_hi;
        // u^ = -(fl(ell^ eps) / fl(|A|)): three roundings.
        let count = Lo(l.count.max(1) as f64);
        let u_abs = eps * ell / count;
        let u_hi = u_abs * (one + theta_ell) * ou.powi(3);
        let delta_u = u_abs * ((one + theta_ell) * ou.powi(3) - Lo(1.0));
        Ok(LossTerms {
            t_weight,
            p_weight,
            delta_c: delta_t + delta_pw,
            delta_t,
            u_hi,
            delta_u,
            g3: gamma(3, u.0)?,
            exp_err,
        })
    }

    /// Whether every row constant is in `[0, cap]` (then so is every
    /// element's (T19) term, for a moderate `cap`).
    pub(crate) fn within(&self, cap: f64) -> bool {
        [
            self.t_weight,
            self.p_weight,
            self.delta_c,
            self.delta_t,
            self.u_hi,
            self.delta_u,
            self.g3,
            self.exp_err.theta,
            self.exp_err.eta,
        ]
        .iter()
        .all(|x| (0.0..=cap).contains(&x.0))
    }

    /// Lower bounds of what [`LossTerms::extra`] adds at an entry `j`
    /// other than the target, for `p_comp >= p^+_j` and the element's
    /// total weight `g_sum`: at least `p p^+_j`, and on an entry that gets
    /// the smoothing constant ([`LossTerms::allowed`]) `smooth_p p^+_j +
    /// smooth` more.
    pub(crate) fn lower_parts(&self, l: &LossGradCotangents<'_>, g_sum: Hi) -> LowerParts {
        let lo = |x: Hi| Lo(x.0);
        LowerParts {
            p: lo(self.delta_c),
            smooth_p: if l.eps != 0.0 {
                lo(self.g3) * lo(g_sum)
            } else {
                Lo(0.0)
            },
            smooth: if l.eps != 0.0 {
                lo(self.delta_u) + lo(self.g3) * lo(self.u_hi)
            } else {
                Lo(0.0)
            },
        }
    }

    /// Whether entry `j` gets the smoothing constant `u`.
    pub(crate) fn allowed(l: &LossGradCotangents<'_>, j: usize) -> bool {
        l.eps != 0.0 && l.mask.is_none_or(|m| m.get(j).copied().unwrap_or(false))
    }

    /// `(extra, |u^|)` at entry `j` before the division by `T`: the
    /// coefficient errors times the computed `p^_j <= p_hi + p_dev`, the
    /// target's `delta_t`, and on allowed entries `delta_u` plus the
    /// roundings `u` takes part in (`gamma_3 (|u^| + W_hi p^_j)`, `W_hi`
    /// the row's total weight bound `g_sum`); `|u^|` (0 elsewhere) joins
    /// the element's magnitude.
    pub(crate) fn extra(
        &self,
        l: &LossGradCotangents<'_>,
        j: usize,
        token: Option<usize>,
        p_comp: Hi,
        g_sum: Hi,
    ) -> (Hi, Hi) {
        let mut e = self.delta_c * p_comp;
        if token == Some(j) {
            e = e + self.delta_t;
        }
        if Self::allowed(l, j) {
            e = e + self.delta_u + self.g3 * (self.u_hi + g_sum * p_comp);
            (e, self.u_hi)
        } else {
            (e, Hi::ZERO)
        }
    }
}

/// [`LossTerms::lower_parts`]: lower bounds of the coefficients of (T19)'s
/// extra error at a non-target entry, before the division by `T`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LowerParts {
    /// Of `p^+_j`, on every entry (`delta_C`).
    pub p: Lo,
    /// Of `p^+_j`, on an entry with the smoothing constant (`gamma_3 G`).
    pub smooth_p: Lo,
    /// The constant there (`delta_u + gamma_3 |u^|`).
    pub smooth: Lo,
}

/// `gamma_n = n u / (1 - n u)` upward.
fn gamma(n: usize, u: f64) -> Result<Hi, NoBound> {
    let nu = n as f64 * u;
    if nu.is_nan() || nu >= 1.0 {
        return Err(NoBound::GammaUndefined { n, u });
    }
    Ok(Hi(nu) / (Lo(1.0) - Hi(nu)))
}
