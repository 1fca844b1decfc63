//! The softcap `x' = c tanh(x / c)` of one entry at a working precision:
//! its enclosure and its gradient factor (docs/design.md, "The loss side").

use std::cmp::Ordering;

use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound, DivAssignRound, MulAssignRound, NegAssign};
use rug::{Assign, Float};

use super::RowSoftcap;
use crate::interval::MpfrInterval;

/// `out` = an enclosure of `x' = c tanh(x / c)` at `out`'s precision
/// (`c > 0`): `y = x / c` rounded down (exact when MPFR's ternary says so,
/// else `y_hi = next_up(y)`), `tanh` rounded down at `y` and up at `y`
/// plus `y_hi - y` (`tanh' <= 1`), clamped to `[-1, 1]`, times `c` outward.
/// `x = -inf` gives exactly `-c`. `y` and `d` are scratch (at least 53 bits).
pub(crate) fn softcap_enclosure(
    out: &mut MpfrInterval,
    y: &mut Float,
    d: &mut Float,
    x: f64,
    c: f64,
) {
    if x == f64::NEG_INFINITY {
        out.lo.assign(c);
        out.lo.neg_assign();
        out.hi.assign(&out.lo);
        return;
    }
    d.assign(x);
    let exact_y = y.assign_round(&*d / c, Round::Down) == Ordering::Equal;
    out.lo.assign(&*y);
    let exact_t = out.lo.tanh_round(Round::Down) == Ordering::Equal;
    out.hi.assign(&*y);
    out.hi.tanh_round(Round::Up);
    if !exact_y {
        // tanh(y_hi) <= tanh(y) + (y_hi - y); next_up(y) - y is exact.
        d.assign(&*y);
        d.next_up();
        *d -= &*y;
        out.hi.add_assign_round(&*d, Round::Up);
        if out.hi > 1u32 {
            out.hi.assign(1u32);
        }
    } else if exact_t {
        out.hi.assign(&out.lo);
    }
    out.lo.mul_assign_round(c, Round::Down);
    out.hi.mul_assign_round(c, Round::Up);
}

/// Enclosure of the softcap's gradient factor `dx'/dx` of entry `j` (value
/// `x`): `sech^2(x / c)` (exact softcap; decreasing in `|x / c|`, so its
/// ends come from the ends of `x / c`'s enclosure; 0 at `x = -inf`),
/// `1 - t^2 = (1 - t)(1 + t)` for a materialised `t` (input softcap), 1
/// without a softcap. `y` is scratch.
pub(crate) fn softcap_factor(
    out: &mut MpfrInterval,
    y: &mut MpfrInterval,
    sc: &RowSoftcap,
    j: usize,
    x: f64,
) {
    match sc {
        RowSoftcap::None => out.assign_f64(1.0),
        RowSoftcap::Exact(c) => {
            if x == f64::NEG_INFINITY {
                out.assign_f64(0.0);
                return;
            }
            y.lo.assign(x);
            y.hi.assign(x);
            y.lo.div_assign_round(*c, Round::Down);
            y.hi.div_assign_round(*c, Round::Up);
            y.lo.abs_mut();
            y.hi.abs_mut();
            // |y| at its smallest and largest (x / c keeps x's sign in
            // both directed roundings, so the enclosure never straddles 0).
            let (near, far) = if y.lo <= y.hi {
                (&y.lo, &y.hi)
            } else {
                (&y.hi, &y.lo)
            };
            out.hi.assign(near);
            out.hi.sech_round(Round::Up);
            out.hi.square_round(Round::Up);
            if out.hi > 1u32 {
                out.hi.assign(1u32);
            }
            out.lo.assign(far);
            out.lo.sech_round(Round::Down);
            out.lo.square_round(Round::Down);
        }
        RowSoftcap::Input(t) => {
            let t = t[j];
            // (1 - t)(1 + t), each factor >= 0 and rounded outward.
            y.lo.assign(1u32);
            y.lo.add_assign_round(-t, Round::Down);
            y.hi.assign(1u32);
            y.hi.add_assign_round(-t, Round::Up);
            out.lo.assign(1u32);
            out.lo.add_assign_round(t, Round::Down);
            out.hi.assign(1u32);
            out.hi.add_assign_round(t, Round::Up);
            out.lo.mul_assign_round(&y.lo, Round::Down);
            out.hi.mul_assign_round(&y.hi, Round::Up);
        }
    }
}
