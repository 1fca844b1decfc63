//! The z-loss `coef * lse^2` (docs/design.md, "The loss side") of a row:
//! on the f64 tier from its `lse` enclosure, and on the MPFR path.

use crate::interval::{Interval, MpfrInterval};
use crate::oracle::row::Row;
use crate::oracle::{fast, Exact, Rounder};
use crate::spec::{Dtype, Problem};

/// The z-loss coefficient of `problem` as the computation takes it
/// (rounded to the accumulation dtype; 0 when absent or invalid, which
/// validation has already refused).
fn z_loss_coef(problem: &Problem<'_>) -> f64 {
    problem
        .options
        .effective_z_loss_coef(problem.accumulation())
        .ok()
        .flatten()
        .unwrap_or(0.0)
}

/// `z_loss = coef * lse^2` (docs/design.md, "The loss side") from the f64 tier's
/// enclosure of `lse`: the square and the product each widened outward by
/// one f64 ulp (each is one rounded f64 operation), then decided as every
/// f64-tier value ([`fast::decide`]); `None` leaves it to MPFR. A zero
/// coefficient gives an exact `+0`.
pub(in crate::oracle) fn z_loss_fast(
    problem: &Problem<'_>,
    lse: Interval,
    target: Dtype,
) -> Option<Exact> {
    let coef = z_loss_coef(problem);
    if coef == 0.0 {
        return Some(Exact::point(0.0));
    }
    let Interval { lo, hi } = lse;
    let (sq_lo, sq_hi) = if lo >= 0.0 {
        (lo * lo, hi * hi)
    } else if hi <= 0.0 {
        (hi * hi, lo * lo)
    } else {
        (0.0, (lo * lo).max(hi * hi))
    };
    let sq_lo = if sq_lo > 0.0 {
        sq_lo.next_down().max(0.0)
    } else {
        0.0
    };
    let lo = (coef * sq_lo).next_down().max(0.0);
    let hi = (coef * sq_hi.next_up()).next_up();
    fast::decide(Interval { lo, hi }, target)
}

/// `z_loss = coef * lse^2` from the MPFR enclosure of `lse` at precision
/// `prec` (outward interval products), correctly rounded to `target`.
pub(in crate::oracle) fn z_loss_mpfr(
    problem: &Problem<'_>,
    lse: &MpfrInterval,
    prec: u32,
    rounder: &mut Rounder,
    target: Dtype,
) -> Exact {
    let coef = z_loss_coef(problem);
    if coef == 0.0 {
        return Exact::point(0.0);
    }
    let mut t = rug::Float::new(prec);
    let mut sq = MpfrInterval::new(prec);
    sq.mul(lse, lse, &mut t);
    // A square is >= 0: the mixed-sign product's negative end is clamped.
    if sq.lo.is_sign_negative() {
        sq.lo = rug::Float::with_val(prec, 0);
    }
    let mut z = MpfrInterval::new(prec);
    z.mul(&MpfrInterval::point(prec, coef), &sq, &mut t);
    rounder.exact(&z, target)
}

/// The z-loss's share `2 coef b lse` of the VJP's total coefficient `C`
/// (module `vjp`, docs/design.md, "The loss side") at `acc` bits: `lse`
/// enclosed from the row's `s_p` (`lse = z_max + ln(1 + s_p)`), `2 coef b`
/// exact at 110 bits; `t` is scratch at `acc` bits.
pub(in crate::oracle) fn z_loss_vjp_term(
    row: &Row<'_>,
    s_p: &MpfrInterval,
    coef: f64,
    b: f64,
    acc: u32,
    t: &mut rug::Float,
) -> MpfrInterval {
    let mut l = MpfrInterval::new(acc);
    l.ln_1p(s_p);
    let mut lse = MpfrInterval::new(acc);
    lse.add(&row.top(row.p.vmax, acc).z_max(acc), &l);
    // 2 coef b is exact at 110 bits.
    let two_cb = rug::Float::with_val(110, coef) * b * 2u32;
    let zb = MpfrInterval {
        lo: two_cb.clone(),
        hi: two_cb,
    };
    let mut term = MpfrInterval::new(acc);
    term.mul(&zb, &lse, t);
    term
}
