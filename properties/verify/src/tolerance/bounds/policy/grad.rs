//! (T21) The gradient bound of the policy terms' cotangents
//! (`grad_kl_k1`, `grad_kl_k2`, `grad_kl_k3`, `grad_kl_abs`,
//! `grad_ratio`; `properties/TOLERANCE.md`). Each term depends on the
//! logits only through the row's log-prob, so its VJP is the log-prob's
//! with the cotangent `w = sum_i c_i k_i'(d_i)` (`logprobe_reference::spec`'s
//! `policy` module). A kernel forms `w^ = sum_i fl(c^_i s^_i)` from its own
//! accumulation-dtype log-prob (`s^_i` the slope at its `d^_i`, within
//! `E_d` of `d_i`: (T20)) and adds it as one more source at the target, so
//! (T14) sees one more cotangent of magnitude `|w^| <= W` (in `G`, and in
//! the indicator at `t`) and misses only the error `|w^ - w| <= delta_w`,
//! which enters element `j` times `|1[j = t] - p_j|`. `bounds.rs` calls
//! [`PolicyGradTerms::new`] once per row and model and adds
//! [`PolicyGradTerms::extra`] to each element.

use logprobe_reference::spec::{PolicyClamps, PolicyTerm};

use super::super::half_ulp;
use super::{abs_expm1_neg, d_error, phi_up, Base, DError};
use crate::tolerance::model::K3Form;
use crate::tolerance::upward::{Hi, Lo};
use crate::tolerance::walk::PolicyTarget;
use crate::tolerance::NoBound;

/// One row's policy-term cotangents for the gradient bound, part of
/// [`crate::tolerance::GradCotangents`]: the nonzero `(term, c)` pairs of the row
/// (`logprobe_reference::spec::Problem::policy_cotangents`; none on an
/// `ignore_index` row) and the row's inputs and clamps.
#[derive(Clone, Copy, Debug)]
pub struct PolicyGradCotangents<'c> {
    /// `(term, c_i)`, `c_i` exact (f64), nonzero.
    pub terms: &'c [(PolicyTerm, f64)],
    /// `ref_log_probs[row]`, `old_log_probs[row]` and the clamps as the
    /// computation takes them.
    pub inputs: PolicyTarget,
}

/// The row constants of (T21) for one model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PolicyGradTerms {
    /// `W >= |w^|`: the computed log-prob cotangent's magnitude.
    pub weight: Hi,
    /// `delta_w >= |w^ - w|`.
    pub delta: Hi,
}

/// Where a clamp leaves the range of `d` (exact and computed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// The whole range inside the clamp (bounds included) or no clamp:
    /// both slopes are the unclamped ones.
    Inside,
    /// The whole range outside: both slopes are 0.
    Outside,
    /// Either.
    Straddle,
}

fn side(lo: f64, hi: f64, c: Option<f64>) -> Side {
    match c {
        None => Side::Inside,
        Some(c) if lo >= -c && hi <= c => Side::Inside,
        Some(c) if hi < -c || lo > c => Side::Outside,
        Some(_) => Side::Straddle,
    }
}

impl PolicyGradTerms {
    /// (T21) from the row's (T20) base `b` and the accumulation dtype's
    /// unit roundoff `u`.
    ///
    /// # Errors
    /// [`NoBound::MissingStatistic`] when a term's input is absent,
    /// [`NoBound::GammaUndefined`] when `n u >= 1` for the `n` terms,
    /// [`NoBound::NonFinite`] when a magnitude overflows.
    pub(crate) fn new(
        b: &Base,
        u: Hi,
        pg: &PolicyGradCotangents<'_>,
    ) -> Result<PolicyGradTerms, NoBound> {
        let mut mags = Hi::ZERO;
        let mut delta = Hi::ZERO;
        let mut n = 0usize;
        for &(term, c) in pg.terms {
            if c == 0.0 {
                continue;
            }
            let x = if term.uses_old() {
                pg.inputs.old_lp
            } else {
                pg.inputs.ref_lp
            }
            .ok_or(NoBound::MissingStatistic {
                what: "the policy term's input",
            })?;
            let de = d_error(b, x);
            let (s_hi, s_err) = slope(b, term, &de, &pg.inputs.clamps);
            // c^ = fl(c): |c^ - c| exactly (as an upper bound).
            let c_hat = b.acc.round_f64(c);
            let e_c = if c_hat >= c {
                Hi(c_hat) - Lo(c)
            } else {
                Hi(c) - Lo(c_hat)
            };
            // c^ s^ (1 + delta) - c k'(d) = (c^ - c) s^ + c (s^ - k'(d))
            // + delta c^ s^, plus a flushed product's eta.
            let mag = Hi(c_hat.abs()) * s_hi;
            delta = delta + e_c * s_hi + Hi(c.abs()) * s_err + u * mag + b.eta;
            mags = mags + mag;
            n += 1;
        }
        // The n products' sum in any order: gamma_n over their magnitudes.
        let terms = mags * (Hi::ONE + u);
        let gn = gamma(n, u.0)?;
        delta = delta + gn * terms;
        let weight = terms * (Hi::ONE + gn);
        if !(weight.0.is_finite() && delta.0.is_finite()) {
            return Err(NoBound::NonFinite {
                what: "the policy terms' log-prob cotangent",
            });
        }
        Ok(PolicyGradTerms { weight, delta })
    }

    /// Whether `W` and `delta_w` are in `[0, cap]`.
    pub(crate) fn within(&self, cap: f64) -> bool {
        [self.weight, self.delta]
            .iter()
            .all(|x| (0.0..=cap).contains(&x.0))
    }

    /// The error (T14) does not see at element `j`, before the division
    /// by `T`: `delta_w |1[j = t] - p_j|`, with `p_j <= p_hi` (exact
    /// probability's upper bound) and `|1 - p_t| <= 1`.
    pub(crate) fn extra(&self, j: usize, token: Option<usize>, p_hi: Hi) -> Hi {
        if token == Some(j) {
            self.delta
        } else {
            self.delta * p_hi
        }
    }
}

/// `(S, e_s)`: bounds of `|s^|`, the computed slope of `term`, and of
/// `|s^ - k'(d)|`, over the range `[d.lo - E_d, d.hi + E_d]` that holds
/// both the exact `d` and the kernel's `d^` (T21).
fn slope(b: &Base, term: PolicyTerm, de: &DError, clamps: &PolicyClamps) -> (Hi, Hi) {
    let lo = (de.d.lo - de.e_d.0).next_down();
    let hi = (de.d.hi + de.e_d.0).next_up();
    match term {
        // k1' = 1, exactly.
        PolicyTerm::K1 => (Hi::ONE, Hi::ZERO),
        // k2' = d: the computed d^ itself; a foreign kernel's autograd
        // may form `c d` in two roundings more (`0.5 d d`'s backward
        // `c 0.5 d + c 0.5 d`): `4 * 1/2 ulp(S) >= 2 u S` per unit `c`.
        PolicyTerm::K2 => {
            let s_hi = de.d_abs + de.e_d;
            let mut err = de.e_d;
            if b.k3_form == K3Form::Any {
                err = err + Hi(4.0) * half_ulp(b.acc, s_hi);
            }
            (s_hi, err)
        }
        // sign(d^) against sign(d): equal unless the range reaches 0.
        PolicyTerm::Abs => {
            let err = if lo <= 0.0 && hi >= 0.0 {
                Hi(2.0)
            } else {
                Hi::ZERO
            };
            (Hi::ONE, err)
        }
        PolicyTerm::K3 => k3_slope(b, lo, hi, de.e_d, clamps),
        PolicyTerm::Ratio => {
            let s = side(lo, hi, clamps.ratio_log);
            if s == Side::Outside {
                return (Hi::ZERO, Hi::ZERO);
            }
            // ratio' = ratio: (T20)'s ratio error at the clamped upper end.
            let y_hi = clamps.ratio_log.map_or(hi, |c| hi.clamp(-c, c));
            let r_max = Hi(y_hi).exp();
            let err = r_max * (de.e_d.exp_m1() * (Hi::ONE + b.eps_exp) + b.eps_exp) + b.eta;
            let s_hi = r_max + err;
            (
                s_hi,
                if s == Side::Straddle {
                    err.max(s_hi)
                } else {
                    err
                },
            )
        }
    }
}

/// k3' = -expm1(-d_c) (0 outside the clamps): `|k3''| = e^{-xi} <=
/// e^{-a}` over the clamped range `[a, z]` (mean value theorem), plus the
/// slope's own rounding: `expm1`'s half ulp at `<= S3` (`K3Form::Expm1`),
/// or for `K3Form::Any` also `1 - e^{-d}` (autograd of `e^{-d} + d - 1`):
/// `exp`'s error and two roundings at `<= |c| (e^{-a} + 1)`. A straddled clamp
/// (input, or output at `k3 = c_out`) makes one slope 0: at most `S`.
fn k3_slope(b: &Base, lo: f64, hi: f64, e_d: Hi, clamps: &PolicyClamps) -> (Hi, Hi) {
    let s_in = side(lo, hi, clamps.kl_input);
    if s_in == Side::Outside {
        return (Hi::ZERO, Hi::ZERO);
    }
    let clamp = |v: f64| clamps.kl_input.map_or(v, |c| v.clamp(-c, c));
    let (a, z) = (clamp(lo).next_down(), clamp(hi).next_up());
    let s3 = abs_expm1_neg(a).max(abs_expm1_neg(z));
    let e_a = Hi(-a).exp();
    let mut round = half_ulp(b.acc, s3);
    if b.k3_form == K3Form::Any {
        // fl(fl(c fl(e^{-d})) - c) per unit c: exp's error, then two
        // roundings at magnitudes <= |c| (e^{-a} + 1), each <= u |c| y <=
        // |c| 2 * 1/2 ulp(y); the fifth half ulp covers second-order terms.
        round = round.max(b.eps_exp * e_a + b.eta + Hi(5.0) * half_ulp(b.acc, e_a + Hi::ONE));
    }
    let err = e_a * e_d + round;
    let s_hi = s3 + round;
    let mut s = s_in;
    if let Some(c_out) = clamps.kl_output {
        // k3 at any point of [a, z] (exact, or computed at d^): within
        // [phi_lo, k_abs] before its own rounding, (T20)'s.
        let k_abs = phi_up(a).max(phi_up(z));
        let mut k_round = half_ulp(b.acc, s3) + half_ulp(b.acc, k_abs + s3);
        if b.k3_form == K3Form::Any {
            let dc = Hi(a.abs().max(z.abs()));
            k_round = k_round
                .max(b.eps_exp * e_a + b.eta + Hi(2.0) * half_ulp(b.acc, e_a + dc + Hi::ONE));
        }
        let k_hi = k_abs + k_round;
        if k_hi.0 > c_out {
            let k_lo = phi_down(a, z) - k_round;
            s = if k_lo.0 > c_out {
                Side::Outside
            } else {
                Side::Straddle
            };
        }
    }
    match s {
        Side::Inside => (s_hi, err),
        Side::Outside => (Hi::ZERO, Hi::ZERO),
        Side::Straddle => (s_hi, err.max(s_hi)),
    }
}

/// A lower bound of `min phi` over `[a, z]` (`phi(xi) = e^{-xi} - 1 + xi
/// >= 0`, convex, 0 at 0): 0 when the range holds 0; at `a > 0`,
/// `max(a - 1, a^2/2 - a^3/6)` (`e^{-a} > 0`; the alternating series);
/// at `z < 0`, `z^2 / 2` (every term of `e^{|z|} - 1 - |z|` is positive).
fn phi_down(a: f64, z: f64) -> Lo {
    let v = if a > 0.0 {
        (a - 1.0).max(a * a * (0.5 - a / 6.0))
    } else if z < 0.0 {
        z * z * 0.5
    } else {
        0.0
    };
    // A few f64 roundings, taken off with room.
    Lo(v - v.abs() * 1e-14 - f64::MIN_POSITIVE)
}

/// `gamma_n = n u / (1 - n u)` upward.
fn gamma(n: usize, u: f64) -> Result<Hi, NoBound> {
    let nu = n as f64 * u;
    if nu.is_nan() || nu >= 1.0 {
        return Err(NoBound::GammaUndefined { n, u });
    }
    Ok(Hi(nu) / (Lo(1.0) - Hi(nu)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phi_down_is_below_phi() {
        let phi = |x: f64| (-x).exp_m1() + x;
        for &x in &[
            -30.0, -3.0, -1.0, -0.3, -1e-5, 1e-5, 0.2, 1.0, 2.5, 7.0, 40.0,
        ] {
            let lo = phi_down(x, x).0;
            assert!(lo <= phi(x), "{x}: {lo} > {}", phi(x));
            assert!(
                lo >= 0.5 * phi(x) - 1e-300 || x.abs() > 2.0,
                "{x}: {lo} loose"
            );
        }
        assert!(phi_down(-1.0, 2.0).0 <= 0.0);
    }
}
