//! Directed evaluation of the bounds in f64: [`Hi`] holds an upper bound of
//! a real, [`Lo`] a lower bound, and every operation on them rounds the
//! right way.
//!
//! Each f64 result (`+ - * /` and the libm calls `exp`, `expm1`, `ln`,
//! `ln_1p`) is widened by the safety factor `1 + 4 eps_f64` plus one
//! subnormal quantum, away from the bounded real. IEEE-754 basic operations
//! err by at most 0.5 ulp `<= eps_f64 / 2` relative; glibc's libm functions
//! by at most 2 ulps (its published `libm-test-ulps` table for x86_64 lists
//! at most 1 for these four), and `4 eps_f64` covers 2 ulps with the rounding
//! of the widening itself to spare. The quantum covers results that
//! underflow. Products and quotients assume nonnegative operands (every
//! quantity of the tolerance model is a magnitude).

use std::ops::{Add, Div, Mul, Sub};

/// `4 eps_f64`: the relative widening of every operation.
pub(crate) const SAFETY: f64 = 4.0 * f64::EPSILON;
/// The smallest positive subnormal f64, `2^-1074`.
pub(crate) const QUANTUM: f64 = 5e-324;
/// Largest argument of [`Hi::exp_m1`]'s polynomial branch, `2^-16`.
pub(crate) const TAYLOR_MAX: f64 = 1.0 / 65536.0;

/// An f64 at least the result of an operation that erred by <= 2 ulps.
fn up(x: f64) -> f64 {
    x + x.abs() * SAFETY + QUANTUM
}

/// An f64 at most the result of an operation that erred by <= 2 ulps.
fn dn(x: f64) -> f64 {
    x - x.abs() * SAFETY - QUANTUM
}

/// An upper bound of a real (NaN only if an input was NaN).
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub(crate) struct Hi(pub f64);

/// A lower bound of a real.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub(crate) struct Lo(pub f64);

impl Hi {
    /// Zero, exactly.
    pub(crate) const ZERO: Hi = Hi(0.0);
    /// One, exactly.
    pub(crate) const ONE: Hi = Hi(1.0);

    /// `e^x`, rounded up (monotone).
    pub(crate) fn exp(self) -> Hi {
        Hi(up(self.0.exp()))
    }
    /// `e^x - 1`, rounded up. For `0 <= x <= 2^-16` (the shift and
    /// rounding errors the bounds feed it) without libm: `e^x - 1 <= x +
    /// x^2/2 + x^3/6 + x^4/16`, since `sum_{k>=4} x^k/k! <= (x^4/24) /
    /// (1 - x/5) <= x^4/16` for `x <= 1`, evaluated with upward operations
    /// (`1/6` rounded up); within `1e-13` relative of libm's value there.
    pub(crate) fn exp_m1(self) -> Hi {
        /// `1/6` rounded up to f64.
        const SIXTH_UP: f64 = 0.166_666_666_666_666_69;
        let x = self.0;
        if (0.0..=TAYLOR_MAX).contains(&x) {
            self + self * self * (Hi(0.5) + self * (Hi(SIXTH_UP) + self * Hi(0.0625)))
        } else {
            Hi(up(x.exp_m1()))
        }
    }
    /// `ln(1 + x)`, rounded up (monotone).
    pub(crate) fn ln_1p(self) -> Hi {
        Hi(up(self.0.ln_1p()))
    }
    /// `-ln(1 - x)` for `x < 1`, rounded up (monotone in `x`).
    pub(crate) fn neg_ln_1m(self) -> Hi {
        Hi(up(-dn((-self.0).ln_1p())))
    }
    /// The larger of two upper bounds.
    pub(crate) fn max(self, other: Hi) -> Hi {
        // NaN propagates so that a broken input never reads as a small bound.
        if self.0.is_nan() || other.0.is_nan() {
            Hi(f64::NAN)
        } else {
            Hi(self.0.max(other.0))
        }
    }
    /// `x^k` for a nonnegative `x`, rounded up (as `exp(k ln x)`).
    pub(crate) fn powi(self, k: usize) -> Hi {
        if k == 0 {
            Hi::ONE
        } else if k == 1 {
            self
        } else if self.0 >= 1.0 {
            (Hi(self.0 - 1.0).ln_1p() * Hi(k as f64)).exp()
        } else {
            // Below 1 the power only shrinks: the bound stays sound.
            self
        }
    }
}

/// `1/2 + 2^-18`: with it `x + x^2 C` bounds `e^x - 1` from above for
/// `0 <= x <= 2^-16` ([`Hi::exp_m1_tiny`]).
pub(crate) const TINY_C: f64 = 0.5 + 1.0 / 262_144.0;

impl Hi {
    /// `e^x - 1`, rounded up, for `0 <= x <= 2^-16` only (the caller
    /// checks the range): `x + x^2 C` in three upward operations, `C =
    /// 1/2 + 2^-18` ([`TINY_C`]). Sound: `e^x - 1 = x + x^2 (1/2 + x/6 +
    /// x^2/24 + ...)` and `x/6 + x^2/16 <= 2^-16/6 + 2^-36 <= 2^-18` there
    /// ([`Hi::exp_m1`]'s tail bound). At most `x 2^-18 <= 2^-34` relative
    /// above `e^x - 1`.
    #[inline]
    pub(crate) fn exp_m1_tiny(self) -> Hi {
        self + self * self * Hi(TINY_C)
    }
}

/// `e^x - 1` for arguments `x` just above a fixed base `b` (a row's
/// `lambda_j`, T9, are `b` plus a term proportional to `|d_j|`): from the
/// exact identity `e^(b + delta) - 1 = (e^b - 1) + e^b (e^delta - 1)`,
/// with `e^b - 1` and `e^b` rounded up once and `e^delta - 1` by
/// [`Hi::exp_m1_tiny`], no libm call an entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ExpM1Base {
    /// The base `b` (any f64; NaN disables the shift).
    pub b: f64,
    /// `e^b - 1`, rounded up.
    pub em: f64,
    /// `e^b`, rounded up.
    pub e: f64,
}

impl ExpM1Base {
    /// The base `b` with its two exps.
    pub(crate) fn new(b: Hi) -> ExpM1Base {
        ExpM1Base {
            b: b.0,
            em: b.exp_m1().0,
            e: b.exp().0,
        }
    }

    /// `e^x - 1`, rounded up: [`Hi::exp_m1_tiny`] of `x` where `0 <= x <=
    /// 2^-16`; where `2^-16 < x <= 1` and `delta = x - b` (rounded up) is
    /// in `[0, 2^-16]`, `(e^b - 1)^ + (e^b)^ (e^delta - 1)^` (upward, the
    /// tiny polynomial for `e^delta - 1`); else [`Hi::exp_m1`]. Sound for
    /// every `x`: `delta^ >= x - b` and `e^t - 1` is increasing, so the sum
    /// is at least `e^x - 1`.
    #[inline]
    pub(crate) fn exp_m1(&self, x: Hi) -> Hi {
        if (0.0..=TAYLOR_MAX).contains(&x.0) {
            return x.exp_m1_tiny();
        }
        if x.0 > TAYLOR_MAX && x.0 <= 1.0 {
            let delta = x - Lo(self.b);
            if (0.0..=TAYLOR_MAX).contains(&delta.0) {
                return Hi(self.em) + Hi(self.e) * delta.exp_m1_tiny();
            }
        }
        x.exp_m1()
    }
}

impl Lo {
    /// The lower bound as an upper bound of its negation.
    pub(crate) fn neg(self) -> Hi {
        Hi(-self.0)
    }
}

impl Add for Hi {
    type Output = Hi;
    fn add(self, o: Hi) -> Hi {
        Hi(up(self.0 + o.0))
    }
}

impl Mul for Hi {
    type Output = Hi;
    fn mul(self, o: Hi) -> Hi {
        // 0 * inf stays NaN (a broken bound, never a small one).
        Hi(up(self.0 * o.0))
    }
}

impl Div<Lo> for Hi {
    type Output = Hi;
    fn div(self, o: Lo) -> Hi {
        Hi(up(self.0 / o.0))
    }
}

impl Sub<Lo> for Hi {
    type Output = Hi;
    fn sub(self, o: Lo) -> Hi {
        Hi(up(self.0 - o.0))
    }
}

impl Sub<Hi> for Lo {
    type Output = Lo;
    fn sub(self, o: Hi) -> Lo {
        Lo(dn(self.0 - o.0))
    }
}

impl Add for Lo {
    type Output = Lo;
    fn add(self, o: Lo) -> Lo {
        Lo(dn(self.0 + o.0))
    }
}

/// For lower bounds of nonnegative reals: a result at most their product
/// (a negative lower bound times a nonnegative one stays `<= 0`).
impl Mul for Lo {
    type Output = Lo;
    fn mul(self, o: Lo) -> Lo {
        Lo(dn(self.0 * o.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upward_operations_bound_the_exact_results() {
        // 1/3 + 1/3 + 1/3 rounded up is >= 1; rounded down <= 1.
        let third_hi = Hi::ONE / Lo(3.0);
        assert!((third_hi + third_hi + third_hi).0 >= 1.0);
        assert!((Lo(1.0) - Hi(1.0 / 3.0) - Hi(1.0 / 3.0)).0 <= 1.0 / 3.0);
        assert!(Hi(1e-300).exp_m1().0 >= 1e-300);
        // The polynomial branch bounds expm1 from above, within 1e-13.
        let mut x = TAYLOR_MAX;
        while x > 1e-310 {
            let (poly, libm) = (Hi(x).exp_m1().0, x.exp_m1());
            assert!(poly >= libm * (1.0 + 2.0 * f64::EPSILON), "{x}");
            assert!(poly <= libm * (1.0 + 1e-13) + 1e-320, "{x}");
            x *= 0.37;
        }
        assert!((0.0..1e-320).contains(&Hi(0.0).exp_m1().0));
        assert!(Hi(0.5).neg_ln_1m().0 >= std::f64::consts::LN_2);
        assert!(Hi(1.0 + 1e-9).powi(1000).0 >= 1.0 + 1e-6);
        assert!(Hi(f64::NAN).max(Hi::ONE).0.is_nan());
        // The tiny polynomial: above libm's expm1, within 2^-34 relative.
        let mut x = TAYLOR_MAX;
        while x > 1e-300 {
            let (tiny, libm) = (Hi(x).exp_m1_tiny().0, x.exp_m1());
            assert!(tiny >= libm * (1.0 + 2.0 * f64::EPSILON), "{x}");
            assert!(tiny <= libm * (1.0 + 2f64.powi(-34)), "{x}");
            x *= 0.37;
        }
        // Near a base: an upper bound of libm's expm1, within 2^-34 (the
        // tiny polynomial's excess, of x or of delta <= x).
        for b in [1e-5, 1e-3, 0.009, 0.3, 0.99] {
            let base = ExpM1Base::new(Hi(b));
            for k in 0..40 {
                let x = b + f64::from(k) * 4e-7;
                let (near, libm) = (base.exp_m1(Hi(x)).0, x.exp_m1());
                assert!(near >= libm * (1.0 + 2.0 * f64::EPSILON), "{b} {x}");
                assert!(near <= libm * (1.0 + 2f64.powi(-34)), "{b} {x}");
            }
        }
        assert!(ExpM1Base::new(Hi(f64::NAN)).exp_m1(Hi(0.5)).0 >= 0.5_f64.exp_m1());
    }
}
