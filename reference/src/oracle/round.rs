//! Correct rounding of MPFR numbers to f64, f32, bf16 and f16, the decision
//! step of Ziv's loop, and the error of a candidate against an enclosure.
//!
//! Rounding follows IEEE 754 round-to-nearest-even with gradual underflow
//! and overflow: the value is first rounded at the dtype's precision (53,
//! 24, 8 or 11 bits) with an unbounded exponent, then re-rounded in the
//! subnormal range by MPFR's `mpfr_subnormalize` with an explicit minimum
//! normal exponent (rug's `subnormalize_round`), which uses the first
//! rounding's ternary value so there is no double rounding (MPFR manual,
//! "mpfr_subnormalize"). rug's `subnormalize_ieee` is not used: it only
//! knows the IEEE storage formats and does nothing at precision 8 (bf16).
//! Past `max_finite + ulp/2` (the tie included, as ties go to the even
//! `2^(emax+1)`) the result is `±inf`. Never through `half::*::from_f64`
//! nor through an intermediate f32.

use std::cmp::Ordering;

use rug::float::Round;
use rug::ops::AssignRound;
use rug::Float;

use super::{Exact, Interval};
use crate::interval::{add_dn, add_up, two_sum, MpfrInterval};
use crate::spec::{pow2, Dtype};

/// `x` correctly rounded (to nearest, ties to even, subnormals, overflow to
/// `±inf`) to `dtype`, returned as the exactly equal f64. NaN stays NaN,
/// zeros and infinities keep their sign.
pub fn round_to_dtype(x: &Float, dtype: Dtype) -> f64 {
    Rounder::new().round(x, dtype)
}

/// Reusable scratch for [`round_to_dtype`] (no allocation per call).
#[derive(Debug)]
pub struct Rounder {
    s: Float,
    mid: Float,
    num: Float,
    diff: Float,
}

impl Default for Rounder {
    fn default() -> Self {
        Self::new()
    }
}

impl Rounder {
    /// A fresh scratch.
    pub fn new() -> Self {
        Rounder {
            s: Float::new(53),
            mid: Float::new(64),
            num: Float::new(53),
            diff: Float::new(64),
        }
    }

    /// [`round_to_dtype`] with this scratch.
    pub fn round(&mut self, x: &Float, dtype: Dtype) -> f64 {
        if !x.is_normal() {
            // NaN, ±0, ±inf: their f64 is exact.
            return x.to_f64();
        }
        self.s.set_prec(dtype.precision());
        let ord = self.s.assign_round(x, Round::Nearest);
        finish(&mut self.s, ord, dtype)
    }

    /// The correctly rounded quotient `x / t` in `dtype` (`t > 0` finite):
    /// MPFR's division is correctly rounded at the dtype's precision, then
    /// subnormalized with its ternary value (no double rounding).
    pub fn round_quotient(&mut self, x: f64, t: f64, dtype: Dtype) -> f64 {
        if !x.is_finite() || x == 0.0 {
            return x / t;
        }
        self.s.set_prec(dtype.precision());
        rug::Assign::assign(&mut self.num, x);
        let ord = self.s.assign_round(&self.num / t, Round::Nearest);
        finish(&mut self.s, ord, dtype)
    }

    /// The decision of Ziv's loop for one enclosure: both ends rounded to
    /// `dtype`; decided when they round to the same value (as numbers:
    /// `-0 == +0`). Undecided results carry the rounding of the midpoint.
    /// The [`Exact::offset`] is taken from the MPFR ends (`b - rounded`,
    /// rounded outward), not from the f64 enclosure.
    pub fn exact(&mut self, b: &MpfrInterval, dtype: Dtype) -> Exact {
        let rl = self.round(&b.lo, dtype);
        let rh = self.round(&b.hi, dtype);
        let enclosure = b.interval();
        let (rounded, decided) = if rl == rh && rl.to_bits() == rh.to_bits() {
            (rl, true)
        } else if b.lo.is_infinite() || b.hi.is_infinite() {
            (rl, rl == rh)
        } else {
            let prec = b.lo.prec().max(b.hi.prec()) + 1;
            self.mid.set_prec(prec);
            self.mid.assign_round(&b.lo + &b.hi, Round::Nearest);
            self.mid >>= 1u32;
            (self.round(&self.mid.clone(), dtype), rl == rh)
        };
        let finite = rounded.is_finite() && b.lo.is_finite() && b.hi.is_finite();
        let offset = finite.then(|| {
            // Directed roundings at 64 bits, then to f64 in the same
            // direction: still outward.
            self.diff.assign_round(&b.lo - rounded, Round::Down);
            let lo = self.diff.to_f64_round(Round::Down);
            self.diff.assign_round(&b.hi - rounded, Round::Up);
            let hi = self.diff.to_f64_round(Round::Up);
            Interval { lo, hi }
        });
        Exact::with_offset(enclosure, rounded, decided, offset)
    }
}

/// Subnormal re-rounding and overflow, after a rounding at the dtype's
/// precision with ternary `ord`.
fn finish(s: &mut Float, ord: Ordering, dtype: Dtype) -> f64 {
    // MPFR's exponent convention: x = m 2^e with 1/2 <= |m| < 1, so the
    // smallest normal 2^emin_ieee has MPFR exponent emin_ieee + 1.
    s.subnormalize_round(dtype.min_normal_exp() + 1, ord, Round::Nearest);
    let v = s.to_f64();
    if v.abs() > dtype.max_finite() {
        f64::INFINITY.copysign(v)
    } else {
        v
    }
}

/// `|a - b|` rounded up, for finite `a`, `b` (TwoSum gives the exact error
/// of the f64 difference: Knuth, TAOCP vol. 2, 4.2.2).
#[inline]
fn abs_diff_up(a: f64, b: f64) -> f64 {
    let s = a - b;
    if !s.is_finite() {
        return f64::INFINITY;
    }
    let nb = -b;
    let bb = s - a;
    let err = (a - (s - bb)) + (nb - bb);
    if err != 0.0 && (err > 0.0) == (s > 0.0) {
        next_up(s.abs())
    } else {
        s.abs()
    }
}

/// The next f64 above a finite `x >= 0`.
#[inline]
fn next_up(x: f64) -> f64 {
    debug_assert!(x >= 0.0);
    if x == 0.0 {
        f64::from_bits(1)
    } else {
        f64::from_bits(x.to_bits() + 1)
    }
}

/// [`Exact::offset`] when nothing finite is known.
pub(crate) const UNKNOWN_OFFSET: Interval = Interval {
    lo: f64::NEG_INFINITY,
    hi: f64::INFINITY,
};

impl Exact {
    /// An exact result from its f64 enclosure, its rounding to the target
    /// and whether that rounding is decided; the [`Exact::offset`] is the
    /// enclosure minus `rounded`, rounded outward (no finer than the
    /// enclosure: the MPFR path's [`Rounder::exact`] gives a finer one).
    pub fn new(enclosure: Interval, rounded: f64, decided: bool) -> Self {
        let Interval { lo, hi } = enclosure;
        let finite = rounded.is_finite() && lo.is_finite() && hi.is_finite();
        let offset = finite.then(|| Interval {
            lo: add_dn(lo, -rounded),
            hi: add_up(hi, -rounded),
        });
        Exact::with_offset(enclosure, rounded, decided, offset)
    }

    /// The one constructor of both paths ([`Exact::new`], [`Rounder::exact`]):
    /// `offset` is `enclosure - rounded` rounded outward, `None` when
    /// nothing finite is known ([`UNKNOWN_OFFSET`]).
    fn with_offset(
        enclosure: Interval,
        rounded: f64,
        decided: bool,
        offset: Option<Interval>,
    ) -> Self {
        Exact {
            enclosure,
            rounded,
            decided,
            offset: offset.unwrap_or(UNKNOWN_OFFSET),
        }
    }

    /// An exact f64 value (degenerate enclosure, decided).
    pub fn point(x: f64) -> Self {
        Exact::new(Interval { lo: x, hi: x }, x, true)
    }

    /// Upper bound on `|candidate - exact|` (rounded up), over the whole
    /// enclosure (judges use the far end): `max(|c - lo|, |c - hi|)`, or,
    /// when tighter, the same over `rounded + offset` (the MPFR path's
    /// precision: an f64 candidate is not charged the f64 enclosure's ulp).
    /// `inf` for NaN candidates, for an infinite candidate unless the
    /// enclosure is that same infinity (then 0), and for a finite candidate
    /// against an enclosure with an infinite end. Units: those of the value
    /// (nats, or gradient units).
    #[inline]
    pub fn error(&self, candidate: f64) -> f64 {
        let Interval { lo, hi } = self.enclosure;
        if candidate.is_nan() {
            return f64::INFINITY;
        }
        if candidate.is_infinite() || lo.is_infinite() || hi.is_infinite() {
            return if lo == candidate && hi == candidate {
                0.0
            } else {
                f64::INFINITY
            };
        }
        let coarse = abs_diff_up(candidate, lo).max(abs_diff_up(candidate, hi));
        let Interval { lo: olo, hi: ohi } = self.offset;
        if !(self.rounded.is_finite() && olo.is_finite() && ohi.is_finite()) {
            return coarse;
        }
        // candidate - rounded = s + e exactly; exact = rounded + t, t in
        // the offset: |candidate - exact| <= max |s - t| + |e|.
        let (s, e) = two_sum(candidate, -self.rounded);
        if !s.is_finite() {
            return coarse;
        }
        let fine = add_up(abs_diff_up(s, olo).max(abs_diff_up(s, ohi)), e.abs());
        coarse.min(fine)
    }

    /// [`Exact::error`] in ulps of `dtype` at the exact value's magnitude
    /// ([`Dtype::ulp`] at the smallest magnitude in the enclosure, so the
    /// ratio is an upper bound; at 0 when the enclosure contains 0).
    pub fn error_ulps(&self, candidate: f64, dtype: Dtype) -> f64 {
        self.ulps_of_error(self.error(candidate), dtype)
    }

    /// [`Exact::error_ulps`] of a candidate whose [`Exact::error`] is `err`
    /// (for a caller that measured it already).
    #[inline]
    pub fn ulps_of_error(&self, err: f64, dtype: Dtype) -> f64 {
        if err == 0.0 || err.is_infinite() {
            return err;
        }
        // Division by a power of two: exact unless it overflows.
        err / pow2(self.ulp_exponent(dtype))
    }

    /// The exponent of the ulp [`Exact::ulps_of_error`] divides by: `k`
    /// with `ulps_of_error(err, dtype) == err / 2^k` for every `err`
    /// (0 and infinities included), [`Dtype::ulp_exponent`] at the smallest
    /// magnitude in the enclosure (0 when it contains 0). For a caller that
    /// keeps `k` (an exponent: it fits an `i16`) instead of the value.
    /// Panics: none.
    ///
    /// ```
    /// use logprobe_reference::oracle::Exact;
    /// use logprobe_reference::spec::{pow2, Dtype};
    /// let e = Exact::point(1.5);
    /// assert_eq!(e.ulp_exponent(Dtype::F32), -23);
    /// assert_eq!(e.ulps_of_error(pow2(-24), Dtype::F32), 0.5);
    /// ```
    #[inline]
    pub fn ulp_exponent(&self, dtype: Dtype) -> i32 {
        let Interval { lo, hi } = self.enclosure;
        let at = if lo <= 0.0 && hi >= 0.0 {
            0.0
        } else {
            lo.abs().min(hi.abs())
        };
        dtype.ulp_exponent(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::pow2;

    /// xorshift64*: a deterministic stream for the random sweep.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[test]
    fn agrees_with_spec_round_f64_on_random_values() {
        let mut st = 0x9E37_79B9_7F4A_7C15u64;
        let mut r = Rounder::new();
        for i in 0..200_000 {
            let bits = rng(&mut st);
            // Half the draws uniform over all f64 bit patterns, half in
            // [2^-160, 2^140] where the 16-bit and f32 ranges live.
            let x = if i % 2 == 0 {
                f64::from_bits(bits)
            } else {
                let e = (bits % 300) as i32 - 160;
                let m = 1.0 + (bits >> 11) as f64 * pow2(-53);
                let s = if bits & 1 == 0 { 1.0 } else { -1.0 };
                s * m * pow2(e)
            };
            if x.is_nan() {
                continue;
            }
            let fx = Float::with_val(53, x);
            for d in Dtype::ALL {
                let a = r.round(&fx, d);
                let b = d.round_f64(x);
                assert_eq!(a.to_bits(), b.to_bits(), "{x:e} {d}: {a:e} vs {b:e}");
            }
        }
    }

    #[test]
    fn agrees_with_mpfr_get_d_and_get_flt() {
        // Values with more bits than f64: compare with MPFR's own conversions.
        let mut st = 0x1234_5678_9ABC_DEF1u64;
        let mut r = Rounder::new();
        for _ in 0..50_000 {
            let hi = rng(&mut st);
            let lo = rng(&mut st);
            let e = (rng(&mut st) % 2400) as i32 - 1200;
            let mut x = Float::with_val(128, hi);
            x <<= 64u32;
            x += lo;
            if e >= 0 {
                x <<= e as u32;
            } else {
                x >>= (-e) as u32;
            }
            assert_eq!(
                r.round(&x, Dtype::F64).to_bits(),
                x.to_f64().to_bits(),
                "{x}"
            );
            assert_eq!(
                r.round(&x, Dtype::F32).to_bits(),
                (x.to_f32() as f64).to_bits(),
                "{x}"
            );
        }
    }

    #[test]
    fn bf16_and_f16_edges() {
        let mut r = Rounder::new();
        let f = |x: f64| Float::with_val(200, x);
        // bf16 min subnormal 2^-133; half of it ties to 0, just above rounds up.
        assert_eq!(r.round(&f(pow2(-134)), Dtype::Bf16), 0.0);
        let just_above = Float::with_val(200, pow2(-134)) + Float::with_val(200, pow2(-190));
        assert_eq!(r.round(&just_above, Dtype::Bf16), pow2(-133));
        // 1 + 2^-8 + 2^-100: above the bf16 tie, rounds up (no double rounding).
        let x = Float::with_val(200, 1.0 + pow2(-8)) + Float::with_val(200, pow2(-100));
        assert_eq!(r.round(&x, Dtype::Bf16), 1.0 + pow2(-7));
        assert_eq!(r.round(&f(65519.999), Dtype::F16), 65504.0);
        assert_eq!(r.round(&f(65520.0), Dtype::F16), f64::INFINITY);
        assert_eq!(r.round(&f(-65520.0), Dtype::F16), f64::NEG_INFINITY);
        assert_eq!(
            r.round(&f(-pow2(-26)), Dtype::F16).to_bits(),
            (-0.0f64).to_bits()
        );
    }

    #[test]
    fn quotient_is_correctly_rounded() {
        let mut r = Rounder::new();
        // 1/3 in f16: exact quotient rounded once.
        let q = r.round_quotient(1.0, 3.0, Dtype::F16);
        let exact = Float::with_val(300, 1) / 3u32;
        assert_eq!(q, r.round(&exact, Dtype::F16));
        assert_eq!(r.round_quotient(60000.0, 0.5, Dtype::F16), f64::INFINITY);
        assert_eq!(
            r.round_quotient(-60000.0, 0.5, Dtype::F16),
            f64::NEG_INFINITY
        );
        // Subnormal quotient in bf16.
        let q = r.round_quotient(pow2(-120), 3.0 * pow2(14), Dtype::Bf16);
        let exact = Float::with_val(300, pow2(-134)) / 3u32;
        assert_eq!(q, r.round(&exact, Dtype::Bf16));
    }

    #[test]
    fn error_is_sound_and_handles_specials() {
        let e = Exact::new(
            Interval {
                lo: 1.0,
                hi: 1.0 + pow2(-52),
            },
            1.0,
            false,
        );
        assert_eq!(e.error(1.0), pow2(-52));
        assert_eq!(e.error(f64::NAN), f64::INFINITY);
        assert_eq!(e.error(f64::INFINITY), f64::INFINITY);
        // 0.1 - 1 is inexact in f64: the bound must cover the exact difference.
        let d = e.error(0.1);
        let exact = Float::with_val(200, 1.0 + pow2(-52)) - Float::with_val(200, 0.1);
        assert!(Float::with_val(200, d) >= exact);
        let inf = Exact::point(f64::NEG_INFINITY);
        assert_eq!(inf.error(f64::NEG_INFINITY), 0.0);
        assert_eq!(inf.error(-1e300), f64::INFINITY);
        assert_eq!(e.error_ulps(1.0 + pow2(-23), Dtype::F32), 1.0);
        assert_eq!(Exact::point(0.0).error_ulps(pow2(-149), Dtype::F32), 1.0);
    }

    /// An f64 candidate against an MPFR result judged in f64: the error is
    /// measured through the offset (the MPFR path's precision), not at the
    /// far end of the one-ulp f64 enclosure; still an upper bound.
    #[test]
    fn error_of_an_f64_candidate_keeps_the_mpfr_precision() {
        let mut r = Rounder::new();
        let mut state = 0x17u64;
        for _ in 0..2000 {
            let m = (rng(&mut state) >> 11) as f64 / pow2(53);
            let e = (rng(&mut state) % 40) as i32 - 20;
            // x = (1 + m) 2^e + a third of an f64 ulp: never an f64.
            let base = (1.0 + m) * pow2(e);
            let x = Float::with_val(256, base) + Float::with_val(256, base.next_up() - base) / 3u32;
            let mut b = MpfrInterval::new(256);
            b.lo.assign_round(&x, Round::Down);
            b.hi.assign_round(&x, Round::Up);
            let ex = r.exact(&b, Dtype::F64);
            assert!(ex.decided);
            let ulp = base.next_up() - base;
            assert!(
                ex.enclosure.hi > ex.enclosure.lo,
                "the f64 enclosure is one ulp wide"
            );
            for c in [
                ex.rounded,
                ex.rounded.next_up(),
                ex.rounded.next_down(),
                base + 5.0 * ulp,
            ] {
                let err = ex.error(c);
                let exact = (Float::with_val(256, c) - &x).abs();
                assert!(Float::with_val(256, err) >= exact, "sound at {c}");
                // Within 2^-60 relative of the exact error (the far end is
                // a whole ulp off).
                let slack = Float::with_val(256, err) - &exact;
                assert!(
                    slack <= Float::with_val(256, ulp * pow2(-40)),
                    "tight at {c}"
                );
            }
        }
        // Outside the offset's reach (infinite ends) the enclosure decides.
        let inf = Exact::point(f64::INFINITY);
        assert_eq!(inf.error(f64::INFINITY), 0.0);
        assert_eq!(Exact::point(2.0).error(2.0), 0.0);
    }
}
