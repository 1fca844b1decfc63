//! (T20) Bounds of the policy terms `kl_k1`, `kl_k2`, `kl_k3`, `kl_abs`,
//! `ratio` (TOLERANCE.md (T20); the formulas are
//! `logprobe_reference::spec::PolicyTerm`'s, the kernel's operations
//! `logprobe_kernels::policy`'s). Every term is a function of the row's
//! log-prob, computed in the accumulation dtype with the error of (T7)
//! and its rounding (T8), and one exact input (`ref` or `old`), so each
//! bound propagates that error through the term's derivative and adds the
//! term's own roundings.

use logprobe_reference::oracle::Interval;
use logprobe_reference::spec::{Dtype, PolicyTerm};

use super::{half_ulp, mag, RowBounds};

pub(crate) mod grad;
use crate::tolerance::model::K3Form;
use crate::tolerance::upward::Hi;
use crate::tolerance::walk::RowTargets;
use crate::tolerance::{ErrorBound, NoBound};

/// What (T20) takes from the row's log-prob bound and the model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Base {
    /// Enclosure of the exact log-prob `d_t - ln S` (nats).
    pub lp: Interval,
    /// `E_lp`: the error of the kernel's log-prob in the accumulation
    /// dtype (T7 and its rounding, T8).
    pub lp_err: Hi,
    /// The accumulation dtype.
    pub acc: Dtype,
    /// `eps_exp` (T1).
    pub eps_exp: Hi,
    /// A flushed or subnormal result's absolute error (T1: `eta + eta_sub`).
    pub eta: Hi,
    /// How `kl_k3` is evaluated.
    pub k3_form: K3Form,
}

/// The bound of the policy term `term` of one row for a candidate in
/// `out` (T20).
pub(crate) fn bound(
    rb: &RowBounds<'_>,
    term: PolicyTerm,
    targets: &RowTargets,
    out: Dtype,
) -> ErrorBound {
    match try_bound(rb, term, targets, out) {
        Ok(b) => b,
        Err(reason) => ErrorBound::None { reason },
    }
}

fn try_bound(
    rb: &RowBounds<'_>,
    term: PolicyTerm,
    targets: &RowTargets,
    out: Dtype,
) -> Result<ErrorBound, NoBound> {
    let pt = targets.policy.as_ref().ok_or(NoBound::MissingStatistic {
        what: "ref_log_probs / old_log_probs",
    })?;
    let x = pt.input(term).ok_or(NoBound::MissingStatistic {
        what: "the policy term's input",
    })?;
    let b = rb.policy_base()?;
    let DError {
        d,
        d_abs,
        pre_d,
        e_d,
    } = d_error(&b, x);
    let what = term.output().name();
    Ok(match term {
        // d^ (one rounding), |d^| (exact).
        PolicyTerm::K1 | PolicyTerm::Abs => rb.finish_value(pre_d, d_abs, out, what),
        // fl(fl(d^ d^) / 2): |d^2 - d^^2| / 2 <= e_d (2|d| + e_d) / 2, the
        // product's rounding halved by the finish, a subnormal halving's eta.
        PolicyTerm::K2 => {
            let pre = e_d * (Hi(2.0) * d_abs + e_d) * Hi(0.5) + b.eta;
            let big = d_abs + e_d;
            rb.finish_value(pre, big * big * Hi(0.5), out, what)
        }
        // fl(expm1(-d_c^) + d_c^): |k3'| = |expm1(-xi)| <= S3 over the
        // clamped range xi in [d.lo - e_d, d.hi + e_d] (the clamps are
        // 1-Lipschitz), expm1's half ulp at <= S3, then the sum's rounding
        // at |k3| <= max phi at the range's ends; min(., c_out) moves nothing.
        PolicyTerm::K3 => {
            let clamp = |v: f64| match pt.clamps.kl_input {
                Some(c) => v.clamp(-c, c),
                None => v,
            };
            let (a, z) = (
                clamp(d.lo - e_d.0).next_down(),
                clamp(d.hi + e_d.0).next_up(),
            );
            let s3 = abs_expm1_neg(a).max(abs_expm1_neg(z));
            let mut pre = s3 * e_d + half_ulp(b.acc, s3);
            if b.k3_form == K3Form::Any {
                // The naive fl(fl(fl(exp(-d_c^)) + d_c^) - 1): exp's error
                // eps_exp e^{-a} (plus a flushed result's eta) and two
                // rounded additions of magnitude at most e^{-a} + |d_c| + 1.
                let e_max = Hi(-a).exp();
                let dc_abs = Hi(a.abs().max(z.abs()));
                let sums = e_max + dc_abs + Hi::ONE;
                let naive = s3 * e_d + b.eps_exp * e_max + b.eta + Hi(2.0) * half_ulp(b.acc, sums);
                pre = pre.max(naive);
            }
            let mut k_abs = phi_up(a).max(phi_up(z));
            if let Some(c) = pt.clamps.kl_output {
                k_abs = Hi(k_abs.0.min(c));
            }
            rb.finish_value(pre, k_abs, out, what)
        }
        // exp^(y^), y^ = clamp(fl(lp^ - fl(old))) within e_d of y:
        // |exp^(y^) - e^y| <= e^{y_max} (expm1(e_d)(1 + eps_exp) + eps_exp)
        // + eta; exp's own rounding is its last in the accumulation dtype.
        PolicyTerm::Ratio => {
            let mut y_hi = (d.hi + e_d.0).next_up();
            if let Some(c) = pt.clamps.ratio_log {
                // The clamp is monotone: its value at the upper end.
                y_hi = y_hi.clamp(-c, c);
            }
            let r_max = Hi(y_hi).exp();
            let err = r_max * (e_d.exp_m1() * (Hi::ONE + b.eps_exp) + b.eps_exp) + b.eta;
            let mut total = err;
            if out.precision() < b.acc.precision() {
                total = total + half_ulp(out, r_max + err);
            }
            if !total.0.is_finite() {
                return Err(NoBound::NonFinite { what });
            }
            ErrorBound::Abs(total.0)
        }
    })
}

/// `d = lp - x` as (T20) sees it: its enclosure and the error of the
/// kernel's `d^ = fl(lp^ - fl(x))` before and after the subtraction's
/// rounding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DError {
    /// Enclosure of the exact `d` (nats).
    pub d: Interval,
    /// `max |d|` over the enclosure.
    pub d_abs: Hi,
    /// `pre_d = E_lp + e_x`: the error before the subtraction's rounding.
    pub pre_d: Hi,
    /// `E_d = pre_d + 1/2 ulp_acc(D + pre_d)`: the error of `d^`.
    pub e_d: Hi,
}

/// (T20) `d = lp - x` for the exact input `x` (`ref` or `old`).
pub(crate) fn d_error(b: &Base, x: f64) -> DError {
    let d = Interval {
        lo: (b.lp.lo - x).next_down(),
        hi: (b.lp.hi - x).next_up(),
    };
    let d_abs = Hi(d.lo.abs().max(d.hi.abs()));
    let x_err = Hi((b.acc.round_f64(x) - x).abs());
    let pre_d = b.lp_err + x_err;
    let e_d = pre_d + half_ulp(b.acc, d_abs + pre_d);
    DError {
        d,
        d_abs,
        pre_d,
        e_d,
    }
}

/// An upper bound of `|expm1(-xi)|`: `expm1(|xi|)` for `xi <= 0`,
/// `1 - e^{-xi} <= min(xi, 1)` for `xi > 0`.
pub(crate) fn abs_expm1_neg(xi: f64) -> Hi {
    if xi <= 0.0 {
        Hi(-xi).exp_m1()
    } else {
        Hi(xi.min(1.0))
    }
}

/// An upper bound of `phi(xi) = e^{-xi} - 1 + xi >= 0`: `xi^2 / 2` for
/// `xi >= 0` (alternating series); `xi^2 / 2 e^{|xi|}` for `-1 <= xi < 0`
/// (every term of the series is at most `xi^2 / 2` times one of
/// `e^{|xi|}`'s); `expm1(|xi|)` below.
pub(crate) fn phi_up(xi: f64) -> Hi {
    let a = Hi(xi.abs());
    if xi >= 0.0 {
        a * a * Hi(0.5)
    } else if xi >= -1.0 {
        a * a * Hi(0.5) * a.exp()
    } else {
        a.exp_m1()
    }
}

impl RowBounds<'_> {
    /// (T20) The log-prob as the policy terms see it: its exact enclosure
    /// `d_t - ln S` and the error of the kernel's accumulation-dtype value
    /// (T7 with the accumulation rounding of T8), with the model's
    /// constants.
    pub(super) fn policy_base(&self) -> Result<Base, NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let d_t = self.stats.d_t.ok_or(NoBound::MissingStatistic {
            what: "d_t (no target)",
        })?;
        let d_abs = mag(&d_t);
        let pre = self.c.lp_err_pre(set, d_abs);
        let v_abs = d_abs + Hi(set.ln_s.hi);
        Ok(Base {
            lp: Interval {
                lo: (d_t.lo - set.ln_s.hi).next_down(),
                hi: (d_t.hi - set.ln_s.lo).next_up(),
            },
            lp_err: pre + half_ulp(self.c.acc, v_abs + pre),
            acc: self.c.acc,
            eps_exp: self.c.eps_exp,
            eta: self.c.eta + self.c.eta_sub,
            k3_form: self.c.k3_form,
        })
    }
}
