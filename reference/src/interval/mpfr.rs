//! Enclosures `[lo, hi]` of exact reals as pairs of MPFR numbers, and the
//! few directed-rounding operations the oracle needs (interval arithmetic:
//! the lower end of every operation is rounded toward `-inf`, the upper end
//! toward `+inf`, so the exact real stays inside; MPFR rounds each operation
//! correctly in the requested direction). Every operation writes into an
//! existing value: no allocation in the inner loops.

use std::cmp::Ordering;

use rug::float::Round;
use rug::ops::{AssignRound, NegAssign};
use rug::{Assign, Float};

use super::Interval;

/// An enclosure `lo <= x <= hi` of an exact real, ends at MPFR precision.
#[derive(Clone, Debug)]
pub struct MpfrInterval {
    /// Lower end.
    pub lo: Float,
    /// Upper end.
    pub hi: Float,
}

impl MpfrInterval {
    /// `[0, 0]` at precision `prec` bits.
    pub fn new(prec: u32) -> Self {
        MpfrInterval {
            lo: Float::new(prec),
            hi: Float::new(prec),
        }
    }

    /// The point `[x, x]`; exact when `prec >= 53` (every f64 is a 53-bit
    /// binary number).
    pub fn point(prec: u32, x: f64) -> Self {
        MpfrInterval {
            lo: Float::with_val(prec, x),
            hi: Float::with_val(prec, x),
        }
    }

    /// Sets both ends' precision (their values become meaningless).
    pub fn set_prec(&mut self, prec: u32) {
        self.lo.set_prec(prec);
        self.hi.set_prec(prec);
    }

    /// Sets `[x, x]`; exact when the precision is at least 53 bits.
    pub fn assign_f64(&mut self, x: f64) {
        self.lo.assign(x);
        self.hi.assign(x);
    }

    /// Copies `other` outward (rounds down / up if this one is narrower).
    pub fn assign_outward(&mut self, other: &MpfrInterval) {
        self.lo.assign_round(&other.lo, Round::Down);
        self.hi.assign_round(&other.hi, Round::Up);
    }

    /// Whether the enclosure is a single point (the result is exact).
    pub fn is_point(&self) -> bool {
        self.lo == self.hi
    }

    /// The enclosure rounded outward to f64.
    pub fn interval(&self) -> Interval {
        Interval {
            lo: self.lo.to_f64_round(Round::Down),
            hi: self.hi.to_f64_round(Round::Up),
        }
    }

    /// `self = a + b`.
    pub fn add(&mut self, a: &MpfrInterval, b: &MpfrInterval) {
        self.lo.assign_round(&a.lo + &b.lo, Round::Down);
        self.hi.assign_round(&a.hi + &b.hi, Round::Up);
    }

    /// `self = a - b`.
    pub fn sub(&mut self, a: &MpfrInterval, b: &MpfrInterval) {
        self.lo.assign_round(&a.lo - &b.hi, Round::Down);
        self.hi.assign_round(&a.hi - &b.lo, Round::Up);
    }

    /// `self = -self` (exact).
    pub fn neg(&mut self) {
        std::mem::swap(&mut self.lo, &mut self.hi);
        self.lo.neg_assign();
        self.hi.neg_assign();
    }

    /// `self = a * b` for any signs (the usual case split on signs: two
    /// products, four when both straddle 0). `t` is scratch.
    pub fn mul(&mut self, a: &MpfrInterval, b: &MpfrInterval, t: &mut Float) {
        let (a0, a1, b0, b1) = (&a.lo, &a.hi, &b.lo, &b.hi);
        let (lo, hi): ((&Float, &Float), (&Float, &Float)) = match (sign_class(a), sign_class(b)) {
            (Sign::NonNeg, Sign::NonNeg) => ((a0, b0), (a1, b1)),
            (Sign::NonNeg, Sign::NonPos) => ((a1, b0), (a0, b1)),
            (Sign::NonNeg, Sign::Mixed) => ((a1, b0), (a1, b1)),
            (Sign::NonPos, Sign::NonNeg) => ((a0, b1), (a1, b0)),
            (Sign::NonPos, Sign::NonPos) => ((a1, b1), (a0, b0)),
            (Sign::NonPos, Sign::Mixed) => ((a0, b1), (a0, b0)),
            (Sign::Mixed, Sign::NonNeg) => ((a0, b1), (a1, b1)),
            (Sign::Mixed, Sign::NonPos) => ((a1, b0), (a0, b0)),
            (Sign::Mixed, Sign::Mixed) => {
                self.lo.assign_round(a0 * b1, Round::Down);
                t.assign_round(a1 * b0, Round::Down);
                if *t < self.lo {
                    std::mem::swap(&mut self.lo, t);
                }
                self.hi.assign_round(a0 * b0, Round::Up);
                t.assign_round(a1 * b1, Round::Up);
                if *t > self.hi {
                    std::mem::swap(&mut self.hi, t);
                }
                return;
            }
        };
        self.lo.assign_round(lo.0 * lo.1, Round::Down);
        self.hi.assign_round(hi.0 * hi.1, Round::Up);
    }

    /// `self = a / b` for `b > 0` (`b.lo > 0`), `a` of any sign.
    pub fn div_pos(&mut self, a: &MpfrInterval, b: &MpfrInterval) {
        debug_assert!(b.lo.cmp0() == Some(Ordering::Greater));
        let dl = if a.lo.cmp0() != Some(Ordering::Less) {
            &b.hi
        } else {
            &b.lo
        };
        let dh = if a.hi.cmp0() != Some(Ordering::Less) {
            &b.lo
        } else {
            &b.hi
        };
        self.lo.assign_round(&a.lo / dl, Round::Down);
        self.hi.assign_round(&a.hi / dh, Round::Up);
    }

    /// `self = ln_1p(a)` for `a > -1` (monotone).
    pub fn ln_1p(&mut self, a: &MpfrInterval) {
        self.lo.assign_round(a.lo.ln_1p_ref(), Round::Down);
        self.hi.assign_round(a.hi.ln_1p_ref(), Round::Up);
    }
}

#[derive(Clone, Copy)]
enum Sign {
    NonNeg,
    NonPos,
    Mixed,
}

fn sign_class(a: &MpfrInterval) -> Sign {
    if a.lo.cmp0() != Some(Ordering::Less) {
        Sign::NonNeg
    } else if a.hi.cmp0() != Some(Ordering::Greater) {
        Sign::NonPos
    } else {
        Sign::Mixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(lo: f64, hi: f64) -> MpfrInterval {
        MpfrInterval {
            lo: Float::with_val(64, lo),
            hi: Float::with_val(64, hi),
        }
    }

    #[test]
    fn mul_covers_every_sign_case() {
        let vals = [
            (-3.0, -2.0),
            (-2.0, 5.0),
            (1.5, 4.0),
            (0.0, 0.0),
            (-1.0, 0.0),
            (0.0, 2.0),
        ];
        let mut out = MpfrInterval::new(64);
        let mut t = Float::new(64);
        for &(a0, a1) in &vals {
            for &(b0, b1) in &vals {
                out.mul(&b(a0, a1), &b(b0, b1), &mut t);
                let prods = [a0 * b0, a0 * b1, a1 * b0, a1 * b1];
                let lo = prods.iter().cloned().fold(f64::INFINITY, f64::min);
                let hi = prods.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                assert_eq!(
                    (out.lo.to_f64(), out.hi.to_f64()),
                    (lo, hi),
                    "[{a0},{a1}]*[{b0},{b1}]"
                );
            }
        }
    }

    #[test]
    fn div_pos_and_sub_are_outward() {
        let mut out = MpfrInterval::new(64);
        out.div_pos(&b(-1.0, 2.0), &b(2.0, 4.0));
        assert_eq!((out.lo.to_f64(), out.hi.to_f64()), (-0.5, 1.0));
        out.div_pos(&b(1.0, 1.0), &b(3.0, 3.0));
        assert!(out.lo < out.hi);
        assert!(
            Float::with_val(200, &out.lo * 3u32) < 1u32
                && Float::with_val(200, &out.hi * 3u32) > 1u32
        );
        out.sub(&b(1.0, 2.0), &b(0.5, 0.75));
        assert_eq!((out.lo.to_f64(), out.hi.to_f64()), (0.25, 1.5));
        out.neg();
        assert_eq!((out.lo.to_f64(), out.hi.to_f64()), (-1.5, -0.25));
    }
}
