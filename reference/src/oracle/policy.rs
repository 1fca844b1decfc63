//! The policy terms' exact values and derivatives ([`crate::spec::PolicyTerm`]:
//! `kl_k1`, `kl_k2`, `kl_k3`, `kl_abs`, `ratio`; docs/design.md, "The loss side"),
//! each a function of the row's log-prob `lp` and one exact input (`ref`
//! or `old`), enclosed from the log-prob's enclosure.
//!
//! # MPFR
//!
//! `d = lp - x` at the working precision (outward); every term is monotone
//! on each side of 0 (`k3` and `kl_abs` decrease for `d < 0`, increase for
//! `d > 0`; `k1`, `ratio`, the clamps increase), so each enclosure is the
//! term at the right ends, rounded outward. `k3 = expm1(-d_c) + d_c` is
//! evaluated with `expm1` and the sum at `prec + max(0, 2 - e)` bits
//! (`2^(e-1) <= |d_c| < 2^e`): the sum is about `d_c^2 / 2`, so those
//! extra bits keep its relative error at `2^-prec` however small `d_c` is
//! (the naive `exp(-d) + d - 1` cancels to nothing at `|d| ~ 1e-8` in f64).
//! Ziv's loop (module docs of the oracle) raises the precision of `lp` and
//! of these operations together.
//!
//! # f64 tier
//!
//! The same formulas in f64 interval arithmetic on the f64 tier's log-prob
//! enclosure: CORE-MATH `exp` and `expm1` are correctly rounded, so the
//! exact value lies within one ulp of theirs; each other operation is
//! widened by one ulp outward. `k3` near 0 (`|d_c| <= 1/16`) is the Taylor
//! sum `sum_{k=2}^{13} (-d)^k / k!` with its rounding and truncation bound
//! (see [`phi_fast`]), not `expm1(-d) + d`, whose f64 cancellation would
//! leave small `k3` to MPFR. Outputs it cannot decide go to MPFR.

use rug::float::Round;
use rug::ops::{AssignRound, NegAssign};
use rug::{Assign, Float};

use super::row::{Entry, Row, Sums};
use super::Interval;
use crate::interval::MpfrInterval;
use crate::interval::{add_dn, add_up, mul_dn, mul_up};
pub(crate) use crate::spec::PolicyRow;
use crate::spec::PolicyTerm;

/// The log-prob of the row's target enclosed at `prec` from the row's sums
/// (`d_t - ln_1p(s)`, as `row::values`); `None` without a target.
pub(crate) fn log_prob_mpfr(row: &Row<'_>, sums: &Sums, prec: u32) -> Option<MpfrInterval> {
    let t = row.target?;
    let mut l = MpfrInterval::new(prec);
    l.ln_1p(&sums.s_p);
    let top = row.top(row.p.vmax, prec);
    let mut en = Entry::new(prec);
    en.shift(&top, row.v[t]);
    let mut out = MpfrInterval::new(prec);
    out.add(&en.a, &l);
    out.neg();
    Some(out)
}

/// `d = log_prob - x` enclosed at `prec` bits from the log-prob's
/// enclosure `lp`, `x` the term's input (`ref` or `old`, exact); `None`
/// when the input is absent.
fn d_mpfr(term: PolicyTerm, pr: &PolicyRow, lp: &MpfrInterval, prec: u32) -> Option<MpfrInterval> {
    let x = pr.input(term)?;
    let mut d = MpfrInterval::new(prec);
    d.sub(lp, &MpfrInterval::point(prec, x));
    Some(d)
}

/// `term` of a row whose log-prob is enclosed by `lp`, at `prec` bits
/// (module docs). `None` when the term's input is absent.
pub(crate) fn term_mpfr(
    term: PolicyTerm,
    pr: &PolicyRow,
    lp: &MpfrInterval,
    prec: u32,
) -> Option<MpfrInterval> {
    let mut d = d_mpfr(term, pr, lp, prec)?;
    let mut t = Float::new(prec);
    Some(match term {
        PolicyTerm::K1 => d,
        PolicyTerm::K2 => {
            let mut sq = MpfrInterval::new(prec);
            sq.mul(&d, &d, &mut t);
            if sq.lo.is_sign_negative() {
                sq.lo = Float::with_val(prec, 0);
            }
            sq.lo >>= 1u32;
            sq.hi >>= 1u32;
            sq
        }
        PolicyTerm::Abs => abs_mpfr(&d, prec),
        PolicyTerm::K3 => {
            clamp_mpfr(&mut d, pr.clamps.kl_input);
            let mut k = phi_interval_mpfr(&d, prec);
            if let Some(c) = pr.clamps.kl_output {
                min_f64(&mut k, c);
            }
            k
        }
        PolicyTerm::Ratio => {
            clamp_mpfr(&mut d, pr.clamps.ratio_log);
            let mut r = MpfrInterval::new(prec);
            r.lo.assign_round(d.lo.exp_ref(), Round::Down);
            r.hi.assign_round(d.hi.exp_ref(), Round::Up);
            r
        }
    })
}

/// `k'(d)`, the derivative of `term` with respect to the log-prob, enclosed
/// at `prec` bits from the log-prob's enclosure `lp` (module `policy` of the
/// spec: a clamp gives 0 outside it, its bounds included inside; where the
/// enclosure straddles a clamp's edge the hull of both sides). `None`
/// when the term's input is absent.
pub(crate) fn slope_mpfr(
    term: PolicyTerm,
    pr: &PolicyRow,
    lp: &MpfrInterval,
    prec: u32,
) -> Option<MpfrInterval> {
    let d = d_mpfr(term, pr, lp, prec)?;
    let point = |v: f64| MpfrInterval::point(prec, v);
    Some(match term {
        PolicyTerm::K1 => point(1.0),
        PolicyTerm::K2 => d,
        PolicyTerm::Abs => {
            if d.lo.is_zero() && d.hi.is_zero() {
                point(0.0)
            } else if d.lo.cmp0() == Some(std::cmp::Ordering::Greater) {
                point(1.0)
            } else if d.hi.cmp0() == Some(std::cmp::Ordering::Less) {
                point(-1.0)
            } else {
                MpfrInterval {
                    lo: Float::with_val(prec, -1),
                    hi: Float::with_val(prec, 1),
                }
            }
        }
        PolicyTerm::K3 => {
            let inside_in = clamp_side(&d, pr.clamps.kl_input);
            let mut dc = d.clone();
            clamp_mpfr(&mut dc, pr.clamps.kl_input);
            // -expm1(-d_c), increasing in d_c.
            let mut s = MpfrInterval::new(prec);
            let (n_lo, n_hi) = (
                Float::with_val(prec, -&dc.lo),
                Float::with_val(prec, -&dc.hi),
            );
            // lo = -(expm1(-d_lo) rounded up), hi = -(expm1(-d_hi) rounded
            // down); the negations are exact.
            s.lo.assign_round(n_lo.exp_m1_ref(), Round::Up);
            s.hi.assign_round(n_hi.exp_m1_ref(), Round::Down);
            s.lo.neg_assign();
            s.hi.neg_assign();
            let inside_out = match pr.clamps.kl_output {
                None => Side::Inside,
                Some(c) => {
                    let k = phi_interval_mpfr(&dc, prec);
                    if k.hi <= c {
                        Side::Inside
                    } else if k.lo > c {
                        Side::Outside
                    } else {
                        Side::Both
                    }
                }
            };
            gate(s, inside_in.and(inside_out), prec)
        }
        PolicyTerm::Ratio => {
            let side = clamp_side(&d, pr.clamps.ratio_log);
            let mut dc = d.clone();
            clamp_mpfr(&mut dc, pr.clamps.ratio_log);
            let mut r = MpfrInterval::new(prec);
            r.lo.assign_round(dc.lo.exp_ref(), Round::Down);
            r.hi.assign_round(dc.hi.exp_ref(), Round::Up);
            gate(r, side, prec)
        }
    })
}

/// Where an enclosure lies against a clamp.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    /// Wholly inside (bounds included): the derivative passes.
    Inside,
    /// Wholly outside: the derivative is 0.
    Outside,
    /// Across an edge: the hull of both.
    Both,
}

impl Side {
    fn and(self, o: Side) -> Side {
        match (self, o) {
            (Side::Outside, _) | (_, Side::Outside) => Side::Outside,
            (Side::Inside, Side::Inside) => Side::Inside,
            _ => Side::Both,
        }
    }
}

/// Where `d` lies against the clamp `[-c, c]` (always inside without one).
fn clamp_side(d: &MpfrInterval, c: Option<f64>) -> Side {
    let Some(c) = c else { return Side::Inside };
    if d.lo >= -c && d.hi <= c {
        Side::Inside
    } else if d.hi < -c || d.lo > c {
        Side::Outside
    } else {
        Side::Both
    }
}

/// `s` where the clamp passes, 0 outside, the hull across an edge.
fn gate(mut s: MpfrInterval, side: Side, prec: u32) -> MpfrInterval {
    match side {
        Side::Inside => s,
        Side::Outside => MpfrInterval::point(prec, 0.0),
        Side::Both => {
            if s.lo.cmp0() == Some(std::cmp::Ordering::Greater) {
                s.lo = Float::with_val(prec, 0);
            }
            if s.hi.cmp0() == Some(std::cmp::Ordering::Less) {
                s.hi = Float::with_val(prec, 0);
            }
            s
        }
    }
}

/// `|d|` enclosed.
fn abs_mpfr(d: &MpfrInterval, prec: u32) -> MpfrInterval {
    let mut out = MpfrInterval::new(prec);
    if d.lo.cmp0() != Some(std::cmp::Ordering::Less) {
        out.assign_outward(d);
    } else if d.hi.cmp0() != Some(std::cmp::Ordering::Greater) {
        out.lo.assign_round(-&d.hi, Round::Down);
        out.hi.assign_round(-&d.lo, Round::Up);
    } else {
        let neg_lo = Float::with_val(prec, -&d.lo);
        out.lo = Float::with_val(prec, 0);
        out.hi
            .assign_round(if neg_lo > d.hi { &neg_lo } else { &d.hi }, Round::Up);
    }
    out
}

/// `d = clamp(d, -c, c)` end by end (monotone; exact: `c` is an f64).
fn clamp_mpfr(d: &mut MpfrInterval, c: Option<f64>) {
    if let Some(c) = c {
        for e in [&mut d.lo, &mut d.hi] {
            if *e > c {
                e.assign(c);
            } else if *e < -c {
                e.assign(-c);
            }
        }
    }
}

/// `k = min(k, c)` end by end (exact).
fn min_f64(k: &mut MpfrInterval, c: f64) {
    for e in [&mut k.lo, &mut k.hi] {
        if *e > c {
            e.assign(c);
        }
    }
}

/// `phi(x) = expm1(-x) + x >= 0` rounded in direction `dir`, at `prec`
/// bits plus the bits the sum's cancellation takes (module docs).
fn phi_mpfr(x: &Float, prec: u32, dir: Round) -> Float {
    if x.is_zero() {
        return Float::with_val(prec, 0);
    }
    let e = x.get_exp().unwrap_or(0);
    let extra = (2 - e).max(0) as u32;
    let p = prec + extra;
    let neg = Float::with_val(p, -x);
    let mut m = Float::new(p);
    m.assign_round(neg.exp_m1_ref(), dir);
    let mut out = Float::new(prec);
    out.assign_round(&m + x, dir);
    if out.is_sign_negative() {
        out = Float::with_val(prec, 0);
    }
    out
}

/// `phi` over the enclosure `d` (decreasing for `d < 0`, increasing for
/// `d > 0`, 0 at 0).
fn phi_interval_mpfr(d: &MpfrInterval, prec: u32) -> MpfrInterval {
    use std::cmp::Ordering::{Greater, Less};
    let (lo, hi) = if d.lo.cmp0() != Some(Less) {
        (
            phi_mpfr(&d.lo, prec, Round::Down),
            phi_mpfr(&d.hi, prec, Round::Up),
        )
    } else if d.hi.cmp0() != Some(Greater) {
        (
            phi_mpfr(&d.hi, prec, Round::Down),
            phi_mpfr(&d.lo, prec, Round::Up),
        )
    } else {
        let a = phi_mpfr(&d.lo, prec, Round::Up);
        let b = phi_mpfr(&d.hi, prec, Round::Up);
        (Float::with_val(prec, 0), if a > b { a } else { b })
    };
    MpfrInterval { lo, hi }
}

// ---------------------------------------------------------------- f64 tier

/// `term` on the f64 tier from the log-prob's f64 enclosure `lp` (module
/// docs); `None` when the input is absent or the enclosure is not finite.
pub(crate) fn term_fast(term: PolicyTerm, pr: &PolicyRow, lp: Interval) -> Option<Interval> {
    let x = pr.input(term)?;
    if !(lp.lo.is_finite() && lp.hi.is_finite()) {
        return None;
    }
    let d = Interval {
        lo: add_dn(lp.lo, -x),
        hi: add_up(lp.hi, -x),
    };
    Some(match term {
        PolicyTerm::K1 => d,
        PolicyTerm::K2 => {
            let (a, b) = abs_ends(d);
            Interval {
                lo: mul_dn(mul_dn(a, a), 0.5).max(0.0),
                hi: mul_up(mul_up(b, b), 0.5),
            }
        }
        PolicyTerm::Abs => {
            let (a, b) = abs_ends(d);
            Interval { lo: a, hi: b }
        }
        PolicyTerm::K3 => {
            let d = clamp_fast(d, pr.clamps.kl_input);
            let mut k = if d.lo >= 0.0 {
                Interval {
                    lo: phi_fast(d.lo).lo,
                    hi: phi_fast(d.hi).hi,
                }
            } else if d.hi <= 0.0 {
                Interval {
                    lo: phi_fast(d.hi).lo,
                    hi: phi_fast(d.lo).hi,
                }
            } else {
                Interval {
                    lo: 0.0,
                    hi: phi_fast(d.lo).hi.max(phi_fast(d.hi).hi),
                }
            };
            if let Some(c) = pr.clamps.kl_output {
                k = Interval {
                    lo: k.lo.min(c),
                    hi: k.hi.min(c),
                };
            }
            k
        }
        PolicyTerm::Ratio => {
            let d = clamp_fast(d, pr.clamps.ratio_log);
            Interval {
                lo: core_math::exp(d.lo).next_down().max(0.0),
                hi: up(core_math::exp(d.hi)),
            }
        }
    })
}

/// The f64 tier's decision of `term`'s enclosure `iv` in `target`: a
/// point 0 is the exact `+0`; `kl_k2`, `kl_k3`, `kl_abs` and `ratio` are
/// `>= 0`, so an end at 0 stands for a value next to it
/// ([`super::fast::decide_signed`]); `kl_k1` has either sign.
pub(crate) fn decide_term(
    term: PolicyTerm,
    iv: Interval,
    target: crate::spec::Dtype,
) -> Option<super::Exact> {
    if iv.lo == 0.0 && iv.hi == 0.0 {
        return Some(super::Exact::point(0.0));
    }
    match term {
        PolicyTerm::K1 => super::fast::decide(iv, target),
        _ => super::fast::decide_signed(iv, target, false),
    }
}

/// `x` one ulp up (`+inf` stays).
fn up(x: f64) -> f64 {
    if x == f64::INFINITY {
        x
    } else {
        x.next_up()
    }
}

/// `(min |d|, max |d|)` over the enclosure.
fn abs_ends(d: Interval) -> (f64, f64) {
    if d.lo >= 0.0 {
        (d.lo, d.hi)
    } else if d.hi <= 0.0 {
        (-d.hi, -d.lo)
    } else {
        (0.0, (-d.lo).max(d.hi))
    }
}

fn clamp_fast(d: Interval, c: Option<f64>) -> Interval {
    match c {
        None => d,
        Some(c) => Interval {
            lo: d.lo.clamp(-c, c),
            hi: d.hi.clamp(-c, c),
        },
    }
}

/// Below this `|x|`, [`phi_fast`] sums the Taylor series.
const SERIES_MAX: f64 = 1.0 / 16.0;
/// Terms `k = 2 ..= SERIES_LAST` of the series.
const SERIES_LAST: u32 = 13;

/// An f64 enclosure of `phi(x) = e^{-x} - 1 + x` (`x` finite).
///
/// For `|x| <= 1/16`: `sum_{k=2}^{13} t_k`, `t_k = t_{k-1} (-x) / k`,
/// `t_2 = x^2 / 2`. Each computed `t_k` carries at most `2k - 2` roundings
/// (relative `(1 + u)^{2k} - 1 <= 2.01 k u`), the sum of 12 terms at most
/// `gamma_11` of `sum |t_k|`, and `sum |t_k| <= e^{|x|} x^2 / 2 <= 0.54
/// x^2`; so the error is at most `(2.01 * 13 + 11.01) u 0.54 x^2 < 21 u
/// x^2`, plus a subnormal quantum per operation (`40 * 2^-1074`), plus the
/// truncation `|x|^14 / 14! e^{|x|}` (`< 1e-26 x^2` here). Widened by `24
/// u x^2 + 64 * 2^-1074`. Otherwise `expm1(-x) + x` with CORE-MATH's
/// correctly rounded `expm1` (within one ulp) and the sum widened by one ulp.
pub(crate) fn phi_fast(x: f64) -> Interval {
    if x == 0.0 {
        return Interval::point(0.0);
    }
    if x.abs() <= SERIES_MAX {
        let mut t = x * x * 0.5;
        let mut s = t;
        for k in 3..=SERIES_LAST {
            t = t * (-x) / f64::from(k);
            s += t;
        }
        let w = 24.0 * (f64::EPSILON / 2.0) * (x * x) + 64.0 * f64::from_bits(1);
        return Interval {
            lo: (s - w).next_down().max(0.0),
            hi: (s + w).next_up(),
        };
    }
    let m = core_math::expm1(-x);
    if m == f64::INFINITY {
        return Interval {
            lo: f64::MAX,
            hi: f64::INFINITY,
        };
    }
    let (m_lo, m_hi) = (m.next_down(), m.next_up());
    Interval {
        lo: add_dn(m_lo, x).max(0.0),
        hi: add_up(m_hi, x),
    }
}

/// (F10) `k'(d)` on the f64 tier, as [`slope_mpfr`] from an f64
/// enclosure `lp` of the row's log-prob: `exp` and `expm1` from CORE-MATH
/// (correctly rounded) moved one ulp outward, `phi` by [`phi_fast`], the
/// clamps' sides as the MPFR path takes them. `None` when the term's input
/// is absent.
pub(crate) fn slope_fast(term: PolicyTerm, pr: &PolicyRow, lp: Interval) -> Option<Interval> {
    let x = pr.input(term)?;
    let d = Interval {
        lo: add_dn(lp.lo, -x),
        hi: add_up(lp.hi, -x),
    };
    let side = |d: Interval, c: Option<f64>| match c {
        None => Side::Inside,
        Some(c) if d.lo >= -c && d.hi <= c => Side::Inside,
        Some(c) if d.hi < -c || d.lo > c => Side::Outside,
        Some(_) => Side::Both,
    };
    let gate = |s: Interval, side: Side| match side {
        Side::Inside => s,
        Side::Outside => Interval::ZERO,
        Side::Both => Interval {
            lo: s.lo.min(0.0),
            hi: s.hi.max(0.0),
        },
    };
    Some(match term {
        PolicyTerm::K1 => Interval::point(1.0),
        PolicyTerm::K2 => d,
        PolicyTerm::Abs => {
            if d.lo == 0.0 && d.hi == 0.0 {
                Interval::ZERO
            } else if d.lo > 0.0 {
                Interval::point(1.0)
            } else if d.hi < 0.0 {
                Interval::point(-1.0)
            } else {
                Interval { lo: -1.0, hi: 1.0 }
            }
        }
        PolicyTerm::K3 => {
            let inside_in = side(d, pr.clamps.kl_input);
            let dc = clamp_fast(d, pr.clamps.kl_input);
            // -expm1(-d_c), increasing in d_c.
            let s = Interval {
                lo: -core_math::expm1(-dc.lo).next_up(),
                hi: -core_math::expm1(-dc.hi).next_down(),
            };
            let inside_out = match pr.clamps.kl_output {
                None => Side::Inside,
                Some(c) => {
                    let (a, b) = (phi_fast(dc.lo), phi_fast(dc.hi));
                    let k = if dc.lo >= 0.0 {
                        Interval { lo: a.lo, hi: b.hi }
                    } else if dc.hi <= 0.0 {
                        Interval { lo: b.lo, hi: a.hi }
                    } else {
                        Interval {
                            lo: 0.0,
                            hi: a.hi.max(b.hi),
                        }
                    };
                    if k.hi <= c {
                        Side::Inside
                    } else if k.lo > c {
                        Side::Outside
                    } else {
                        Side::Both
                    }
                }
            };
            gate(s, inside_in.and(inside_out))
        }
        PolicyTerm::Ratio => {
            let sd = side(d, pr.clamps.ratio_log);
            let dc = clamp_fast(d, pr.clamps.ratio_log);
            let r = Interval {
                lo: core_math::exp(dc.lo).next_down().max(0.0),
                hi: core_math::exp(dc.hi).next_up(),
            };
            gate(r, sd)
        }
    })
}

/// (F10) The policy terms' log-prob cotangent `sum c k'(d)` of one row on
/// the f64 tier, from an f64 enclosure `lp` of its log-prob ([`slope_fast`]
/// per term, products and sum outward).
pub(crate) fn vjp_cotangent_fast(
    pr: &PolicyRow,
    terms: &[(PolicyTerm, f64)],
    lp: Interval,
) -> Interval {
    let mut w = Interval::ZERO;
    for &(term, c) in terms {
        if let Some(k) = slope_fast(term, pr, lp) {
            w = w.add(Interval::point(c).mul(k));
        }
    }
    w
}

/// The policy terms' log-prob cotangent `sum c k'(d)` of one row (module
/// `vjp`) for the nonzero cotangents `terms` `(term, c)`, enclosed at `acc`
/// bits from the row's log-prob at the sums' precision (the row has a
/// target); `t` is scratch at `acc` bits.
pub(super) fn vjp_cotangent(
    row: &Row<'_>,
    sums: &Sums,
    terms: &[(PolicyTerm, f64)],
    acc: u32,
    t: &mut Float,
) -> MpfrInterval {
    let lp = log_prob_mpfr(row, sums, acc).expect("a target");
    let mut gp = MpfrInterval::point(acc, 0.0);
    let mut tmp = MpfrInterval::new(acc);
    for &(term, c) in terms {
        if let Some(k) = slope_mpfr(term, &row.policy, &lp, acc) {
            let mut ck = MpfrInterval::new(acc);
            ck.mul(&MpfrInterval::point(acc, c), &k, t);
            tmp.assign_outward(&gp);
            gp.add(&tmp, &ck);
        }
    }
    gp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `phi(x)` at 400 bits, rounded to nearest f64.
    fn phi_exact(x: f64) -> f64 {
        phi_mpfr(&Float::with_val(64, x), 400, Round::Nearest).to_f64()
    }

    #[test]
    fn phi_fast_encloses_phi_across_scales() {
        let mut xs = vec![
            0.0f64,
            1e-300,
            -1e-300,
            1e-160,
            1e-8,
            -1e-8,
            1.0 / 16.0,
            -1.0 / 16.0,
        ];
        for e in -40..=9 {
            for m in [1.0, 1.37, 1.99] {
                let x = m * 2f64.powi(e);
                xs.push(x);
                xs.push(-x);
            }
        }
        for x in xs {
            let iv = phi_fast(x);
            let ex = phi_exact(x);
            assert!(iv.lo <= ex && ex <= iv.hi, "phi({x}) = {ex} not in {iv:?}");
            if x != 0.0 && ex.is_finite() && ex > 1e-290 {
                // Tight: a few ulps wide.
                assert!(
                    (iv.hi - iv.lo) <= 256.0 * f64::EPSILON * ex,
                    "phi({x}) {iv:?} too wide"
                );
            }
        }
    }
}
