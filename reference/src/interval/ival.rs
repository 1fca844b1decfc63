//! Outward f64 arithmetic on [`Interval`]s in the default rounding mode
//! (round to nearest, ties to even: Rust never changes it).
//!
//! Sums are rounded in the exact direction: Knuth's TwoSum (TAOCP vol. 2,
//! 4.2.2, Theorem B; exact in binary floating point with gradual underflow
//! whenever the sum does not overflow) gives the sign of the rounding error
//! of `fl(a + b)`, so `add_dn` / `add_up` return `RD(a + b)` / `RU(a + b)`.
//! Products and quotients are rounded outward pessimistically: the
//! correctly rounded result moved one ulp outward (`next_down` /
//! `next_up`) encloses the exact one, since `|fl(y) - y| <= ulp(fl(y)) / 2`
//! (IEEE 754-2019, 4.3.1; also in the subnormal range and on overflow,
//! where `next_down(inf) = MAX`).

use super::Interval;

/// Unit roundoff of f64, `u = 2^-53`.
pub(crate) const U: f64 = f64::EPSILON / 2.0;

/// The smallest positive subnormal, `2^-1074` (twice the absolute
/// rounding error bound `eta = 2^-1075` of the subnormal range).
pub(crate) const TINY: f64 = f64::from_bits(1);

/// TwoSum: `(s, e)` with `s = fl(a + b)` and `a + b = s + e` exactly (for
/// finite `a`, `b` and finite `s`; `e` is NaN when `s` overflows).
#[inline(always)]
pub(crate) fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bb = s - a;
    let e = (a - (s - bb)) + (b - bb);
    (s, e)
}

/// `RD(a + b)`: the largest f64 `<= a + b`.
#[inline(always)]
pub(crate) fn add_dn(a: f64, b: f64) -> f64 {
    let (s, e) = two_sum(a, b);
    if e < 0.0 {
        s.next_down()
    } else if s == f64::INFINITY && a.is_finite() && b.is_finite() {
        f64::MAX
    } else {
        s
    }
}

/// `RU(a + b)`: the smallest f64 `>= a + b`.
#[inline(always)]
pub(crate) fn add_up(a: f64, b: f64) -> f64 {
    let (s, e) = two_sum(a, b);
    if e > 0.0 {
        s.next_up()
    } else if s == f64::NEG_INFINITY && a.is_finite() && b.is_finite() {
        f64::MIN
    } else {
        s
    }
}

/// A lower bound of `a * b` (exact when a factor is 0).
#[inline(always)]
pub(crate) fn mul_dn(a: f64, b: f64) -> f64 {
    let p = a * b;
    if a == 0.0 || b == 0.0 {
        p
    } else {
        p.next_down()
    }
}

/// An upper bound of `a * b` (exact when a factor is 0).
#[inline(always)]
pub(crate) fn mul_up(a: f64, b: f64) -> f64 {
    let p = a * b;
    if a == 0.0 || b == 0.0 {
        p
    } else {
        p.next_up()
    }
}

/// A lower bound of `a / b`, `b != 0` (exact when `a` is 0).
#[inline(always)]
pub(crate) fn div_dn(a: f64, b: f64) -> f64 {
    let q = a / b;
    if a == 0.0 {
        q
    } else {
        q.next_down()
    }
}

/// An upper bound of `a / b`, `b != 0` (exact when `a` is 0).
#[inline(always)]
pub(crate) fn div_up(a: f64, b: f64) -> f64 {
    let q = a / b;
    if a == 0.0 {
        q
    } else {
        q.next_up()
    }
}

impl Interval {
    /// The point `[x, x]`.
    #[inline(always)]
    pub const fn point(x: f64) -> Interval {
        Interval { lo: x, hi: x }
    }

    /// `[0, 0]`.
    pub(crate) const ZERO: Interval = Interval::point(0.0);

    /// `self + o`, both ends rounded in their direction (`RD`, `RU`):
    /// encloses `x + y` for every `x` in `self`, `y` in `o`.
    // Named methods, not `std::ops`: each end rounds outward, which `+` does not say.
    #[allow(clippy::should_implement_trait)]
    #[inline(always)]
    pub fn add(self, o: Interval) -> Interval {
        Interval {
            lo: add_dn(self.lo, o.lo),
            hi: add_up(self.hi, o.hi),
        }
    }

    /// `self - o`, both ends rounded in their direction: encloses `x - y`
    /// for every `x` in `self`, `y` in `o`.
    #[allow(clippy::should_implement_trait)]
    #[inline(always)]
    pub fn sub(self, o: Interval) -> Interval {
        Interval {
            lo: add_dn(self.lo, -o.hi),
            hi: add_up(self.hi, -o.lo),
        }
    }

    /// `-self` (exact).
    #[inline(always)]
    pub(crate) fn neg(self) -> Interval {
        Interval {
            lo: -self.hi,
            hi: -self.lo,
        }
    }

    /// `self * o` for nonnegative `self` and `o`.
    #[inline(always)]
    pub(crate) fn mul_nonneg(self, o: Interval) -> Interval {
        Interval {
            lo: mul_dn(self.lo, o.lo).max(0.0),
            hi: mul_up(self.hi, o.hi),
        }
    }

    /// `self * o` for any signs (the four end products).
    #[inline]
    pub(crate) fn mul(self, o: Interval) -> Interval {
        if self.lo >= 0.0 && o.lo >= 0.0 {
            return self.mul_nonneg(o);
        }
        let (a, b, c, d) = (self.lo, self.hi, o.lo, o.hi);
        Interval {
            lo: mul_dn(a, c)
                .min(mul_dn(a, d))
                .min(mul_dn(b, c))
                .min(mul_dn(b, d)),
            hi: mul_up(a, c)
                .max(mul_up(a, d))
                .max(mul_up(b, c))
                .max(mul_up(b, d)),
        }
    }

    /// `self / o` for `o.lo > 0`, `self` of any sign.
    #[inline(always)]
    pub(crate) fn div_pos(self, o: Interval) -> Interval {
        debug_assert!(o.lo > 0.0);
        // Dividing by the larger end shrinks the magnitude.
        self.by_nonneg(o.hi, o.lo, div_dn, div_up)
    }

    /// `self * e` for `e.lo >= 0`, `self` of any sign.
    #[inline(always)]
    pub(crate) fn mul_by_nonneg(self, e: Interval) -> Interval {
        self.by_nonneg(e.lo, e.hi, mul_dn, mul_up)
    }

    /// `self op y` over `y` in a nonnegative range, for an `op` increasing
    /// in the magnitude of `y` (`*`) or decreasing (`/`, with the ends
    /// swapped): `shrink` is the end of that range that gives the smaller
    /// magnitude, `grow` the larger. The lower end of the result comes from
    /// `self.lo` (a nonnegative `self.lo` with `shrink`, a negative one with
    /// `grow`) rounded down, the upper end likewise from `self.hi` rounded up.
    #[inline(always)]
    fn by_nonneg(
        self,
        shrink: f64,
        grow: f64,
        op_dn: impl Fn(f64, f64) -> f64,
        op_up: impl Fn(f64, f64) -> f64,
    ) -> Interval {
        Interval {
            lo: op_dn(self.lo, if self.lo >= 0.0 { shrink } else { grow }),
            hi: op_up(self.hi, if self.hi >= 0.0 { grow } else { shrink }),
        }
    }

    /// `self / o` for nonnegative `self` and `o.lo > 0` (lower end kept `>= 0`).
    #[inline(always)]
    pub(crate) fn div_nonneg(self, o: Interval) -> Interval {
        Interval {
            lo: div_dn(self.lo, o.hi).max(0.0),
            hi: div_up(self.hi, o.lo),
        }
    }

    /// Both ends finite and ordered.
    #[inline(always)]
    pub(crate) fn is_finite(self) -> bool {
        self.lo.is_finite() && self.hi.is_finite() && self.lo <= self.hi
    }

    /// Whether `self` holds `x`.
    #[inline(always)]
    pub fn contains(self, x: f64) -> bool {
        self.lo <= x && x <= self.hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rug::Float;

    fn rng(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn draw(st: &mut u64) -> f64 {
        let b = rng(st);
        let e = (b % 200) as i32 - 100;
        let m = 1.0 + (rng(st) >> 11) as f64 / (1u64 << 53) as f64;
        let s = if b & (1 << 40) == 0 { 1.0 } else { -1.0 };
        match b % 17 {
            0 => 0.0,
            1 => s * f64::from_bits(rng(st) % (1 << 52)),
            _ => s * m * 2f64.powi(e),
        }
    }

    #[test]
    fn directed_sums_are_the_exact_directed_roundings() {
        let mut st = 0x1234_5678_9ABC_DEF1u64;
        for _ in 0..100_000 {
            let (a, b) = (draw(&mut st), draw(&mut st));
            let exact = Float::with_val(2200, a) + Float::with_val(2200, b);
            let (lo, hi) = (add_dn(a, b), add_up(a, b));
            assert_eq!(
                lo,
                exact.to_f64_round(rug::float::Round::Down),
                "{a:e}+{b:e}"
            );
            assert_eq!(hi, exact.to_f64_round(rug::float::Round::Up), "{a:e}+{b:e}");
        }
        assert_eq!(add_dn(f64::MAX, f64::MAX), f64::MAX);
        assert_eq!(add_up(f64::MAX, f64::MAX), f64::INFINITY);
    }

    #[test]
    fn products_and_quotients_enclose() {
        let mut st = 0x0BAD_CAFE_1234_5678u64;
        for _ in 0..50_000 {
            let (a, b) = (draw(&mut st), draw(&mut st));
            let p = Float::with_val(2200, a) * Float::with_val(2200, b);
            assert!(p >= mul_dn(a, b) && p <= mul_up(a, b), "{a:e}*{b:e}");
            if b != 0.0 {
                let q = Float::with_val(2200, a) / Float::with_val(2200, b);
                assert!(q >= div_dn(a, b) && q <= div_up(a, b), "{a:e}/{b:e}");
            }
        }
        let x = Interval { lo: -2.0, hi: 3.0 };
        let y = Interval { lo: -5.0, hi: 1.0 };
        let m = x.mul(y);
        assert!(m.lo <= -15.0 && m.hi >= 10.0 && m.lo > -15.0001 && m.hi < 10.0001);
    }
}
