//! A vectorisable `exp` for f32 (the kernels' inner loops) and the `ln_1p`
//! the kernels use once per row.
//!
//! `f32::exp` calls libm one element at a time, so a loop over it never
//! vectorises. [`exp_f32`] is branch-free integer and float arithmetic (no
//! table, no call), so LLVM turns a loop over `[f32; 16]` lanes into
//! SSE2 / AVX2 / AVX-512 code. It uses no fused multiply-add (Rust never
//! contracts `a * b + c`), so every instruction set gives the same bits.
//!
//! # Algorithm
//!
//! Cody-Waite range reduction (Cody and Waite, *Software Manual for the
//! Elementary Functions*, 1980; Muller, *Elementary Functions*, ch. 11):
//! `x = k ln 2 + r` with `k = round(x / ln 2)` (round-to-nearest by the
//! `1.5 * 2^23` shifter), `r = (x - k LN2_HI) - k LN2_LO`, where `LN2_HI` has
//! 16 significant bits so `k LN2_HI` is exact for `|k| <= 256` and the
//! subtraction is exact (Sterbenz). Then `exp(r) ~ 1 + (r + r^2 q(r))` on
//! `|r| <= ln2 / 2`, `q` a degree-5 polynomial interpolating
//! `(e^r - 1 - r) / r^2` at the 6 Chebyshev nodes of that interval
//! (coefficients fitted in exact rational arithmetic, then rounded to f32;
//! approximation error 6.9e-10 relative, 0.012 u), and the result is scaled
//! by `2^k` as two exact power-of-two factors `2^(k >> 1) * 2^(k - (k >> 1))`
//! so results in the subnormal range are rounded once.
//!
//! # Error
//!
//! Measured exhaustively over every f32 in `[-104, 0]` (the domain the
//! kernels use: shifted logits `d <= 0`, down to the underflow; below
//! `-103.98` the exact result rounds to 0 and so does this function) against
//! f64 `exp`: at most [`EXP_F32_MAX_ULPS`] ulps of f32 at the exact value
//! (`cargo run --release -p logprobe-kernels --example exp_ulps`; the test
//! `exp_f32_error_is_within_declared_ulps` re-checks a strided subset).
//! `exp_f32(0) == 1` and `exp_f32(-inf) == 0` exactly; NaN gives NaN.

/// Max error of [`exp_f32`] on `[-104, 0]` in ulps of f32 at the exact value,
/// measured exhaustively (1,120,927,745 inputs; worst 0.951453 ulps at
/// x = -5.84602), rounded up past the f64 reference's own error.
pub const EXP_F32_MAX_ULPS: f64 = 0.952;

/// Max error of [`ln_1p_f32`] in ulps of f32: it rounds f64 `ln_1p` (at most
/// 1 ulp of f64 = `2^-29` ulp of f32 in glibc's published table) once to f32.
/// Measured over every f32 in `[0, 2^20]`: 0.500000 ulps (the `exp_ulps` example).
pub const LN_1P_F32_MAX_ULPS: f64 = 0.5 + 1.0 / (1u64 << 28) as f64;

/// Max error of f64 `exp` and `ln_1p` (the platform libm, used for f64
/// input) in ulps of f64: glibc's libm-test-ulps table for x86_64 lists at
/// most 1 ulp for both.
pub const LIBM_F64_MAX_ULPS: f64 = 1.0;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` rounded to 16 significant bits: `k * LN2_HI` is exact for `|k| <= 256`.
const LN2_HI: f32 = 0.693_145_75;
/// `ln 2 - LN2_HI` rounded to f32 (remaining error 5.5e-14).
const LN2_LO: f32 = 1.428_606_8e-6;
/// `1.5 * 2^23`: adding it rounds a float of magnitude below `2^22` to an
/// integer held in the low mantissa bits.
const SHIFTER: f32 = 12_582_912.0;
/// Below this `exp` is 0 in f32 (`exp(-104) < 2^-150`); inputs are clamped
/// here so `k` stays small (also maps `-inf` to 0).
const LOWER: f32 = -110.0;
/// Above this `exp` overflows f32.
const UPPER: f32 = 89.0;

/// `q(r) ~ (e^r - 1 - r) / r^2`, coefficients of `r^0 .. r^5`.
const Q0: f32 = 0.5;
const Q1: f32 = 0.166_666_67;
const Q2: f32 = 0.041_666_467;
const Q3: f32 = 0.008_333_310_5;
const Q4: f32 = 0.001_393_364_2;
const Q5: f32 = 0.000_198_909_8;

/// `e^x` for f32, branch-free so loops over it vectorise. Error at most
/// [`EXP_F32_MAX_ULPS`] ulps on `[-104, 0]` (see the module docs); exact at
/// 0 and `-inf`; NaN in, NaN out; overflows to `+inf` above 88.73.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // Clamp with selects (not f32::max/min: those would turn NaN into a number).
    let x = if x < LOWER { LOWER } else { x };
    let x = if x > UPPER { UPPER } else { x };
    let shifted = x * LOG2E + SHIFTER;
    let kf = shifted - SHIFTER;
    let k = (shifted.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let q = Q0 + r * (Q1 + r * (Q2 + r * (Q3 + r * (Q4 + r * Q5))));
    let p = 1.0 + (r + (r * r) * q);
    let k1 = k >> 1;
    let k2 = k - k1;
    let s1 = f32::from_bits(((k1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((k2 + 127) as u32) << 23);
    p * s1 * s2
}

/// `ln(1 + s)` for f32 `s >= 0`, via f64 `ln_1p` rounded once to f32 (one
/// call per row, so its speed does not matter). Error at most
/// [`LN_1P_F32_MAX_ULPS`] ulps.
#[inline]
pub fn ln_1p_f32(s: f32) -> f32 {
    (s as f64).ln_1p() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(approx: f32, x: f32) -> f64 {
        let exact = (x as f64).exp();
        let ulp = logprobe_reference::spec::Dtype::F32.ulp(exact);
        (approx as f64 - exact).abs() / ulp
    }

    #[test]
    fn exp_f32_is_exact_at_zero_and_neg_inf() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(100.0), f32::INFINITY);
    }

    #[test]
    fn exp_f32_error_is_within_declared_ulps() {
        // Every 4099th f32 in [-104, 0] (the full sweep is the exp_ulps example).
        let lo = (-104.0f32).to_bits();
        let mut worst = 0.0f64;
        let mut b = (-0.0f32).to_bits();
        while b <= lo {
            let x = f32::from_bits(b);
            worst = worst.max(ulps(exp_f32(x), x));
            b += 4099;
        }
        assert!(worst <= EXP_F32_MAX_ULPS, "worst {worst} ulps");
        // Positive arguments stay accurate too (not used by the kernels).
        for i in 0..10_000 {
            let x = i as f32 * 0.0088;
            assert!(ulps(exp_f32(x), x) <= 2.0, "{x}");
        }
    }
}
