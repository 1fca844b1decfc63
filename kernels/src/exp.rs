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
//!
//! [`exp_f32_nonpos_n_avx512`] (the AVX-512 block loops) replaces the two
//! power-of-two multiplies by one `vscalefps`: the same bits (proof in its
//! docs), so the error above holds for it too.

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
    let x = if x > UPPER { UPPER } else { x };
    exp_f32_nonpos(x)
}

/// [`exp_f32`] without its overflow clamp: the same bits for every `x <=
/// 89` (so for the kernels' shifted logits `d <= 0`, `-inf` and NaN), one
/// select fewer in the hot loop. Above 89 the result is unspecified.
#[inline(always)]
pub fn exp_f32_nonpos(x: f32) -> f32 {
    let x = if x < LOWER { LOWER } else { x };
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

/// [`exp_f32_nonpos`] of `N` values at once, evaluated operation by
/// operation across all of them (each line below is one loop over the `N`
/// values, one vector instruction per 16 lanes), so a core sees `N / 16`
/// independent dependency chains side by side instead of one ~60-cycle
/// chain after another. The same operations in the same order per value:
/// the same bits as [`exp_f32_nonpos`] (test `exp_f32_nonpos_n_is_exp_f32`).
#[inline(always)]
pub fn exp_f32_nonpos_n<const N: usize>(x: &[f32; N]) -> [f32; N] {
    let (p, shifted, _) = exp_f32_nonpos_n_core(x);
    let mut out = [0f32; N];
    for i in 0..N {
        let k = (shifted[i].to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
        let k1 = k >> 1;
        let k2 = k - k1;
        let s1 = f32::from_bits(((k1 + 127) as u32) << 23);
        let s2 = f32::from_bits(((k2 + 127) as u32) << 23);
        out[i] = p[i] * s1 * s2;
    }
    out
}

/// [`exp_f32_nonpos_n`] with the scaling by `2^k` done by one AVX-512
/// `vscalefps` (`p * 2^floor(kf)`, rounded once to nearest) instead of two
/// power-of-two multiplies: the same bits for every non-NaN input. Proof:
/// `p` is in `[0.70, 1.42]` and `k` in `[-160, 0]` (inputs clamped to
/// `[-110, 0]`), so `k1 = k >> 1 >= -80` and `2^k1`, `2^k2` are normal and
/// `p 2^k1 >= 0.7 * 2^-80` is normal: the first multiply is exact, and the
/// second rounds the exact `p 2^k` once, subnormal range included; `vscalefps`
/// rounds the same exact value once (MXCSR: round to nearest, no FTZ/DAZ,
/// as Rust leaves it). Test `exp_f32_nonpos_n_avx512_is_exp_f32_nonpos_n`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub unsafe fn exp_f32_nonpos_n_avx512<const N: usize>(x: &[f32; N]) -> [f32; N] {
    use std::arch::x86_64::{_mm512_loadu_ps, _mm512_scalef_ps, _mm512_storeu_ps};
    let (p, _, kf) = exp_f32_nonpos_n_core(x);
    let mut out = [0f32; N];
    let whole = N - N % 16;
    for c in (0..whole).step_by(16) {
        // SAFETY: `c + 16 <= N` for each of the three arrays of length N;
        // unaligned loads and stores.
        unsafe {
            let pv = _mm512_loadu_ps(p.as_ptr().add(c));
            let kv = _mm512_loadu_ps(kf.as_ptr().add(c));
            _mm512_storeu_ps(out.as_mut_ptr().add(c), _mm512_scalef_ps(pv, kv));
        }
    }
    if whole < N {
        let mut rest = [0f32; 16];
        rest[..N - whole].copy_from_slice(&x[whole..]);
        let r = exp_f32_nonpos_n(&rest);
        out[whole..].copy_from_slice(&r[..N - whole]);
    }
    out
}

/// The shared part of the `N`-wide exps: `p ~ e^r` in `[0.70, 1.42]`, the
/// shifter sum `x log2(e) + 1.5 * 2^23` (whose low bits hold `k`) and
/// `kf = k` as a float.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn exp_f32_nonpos_n_core<const N: usize>(x: &[f32; N]) -> ([f32; N], [f32; N], [f32; N]) {
    let mut xc = [0f32; N];
    for i in 0..N {
        xc[i] = if x[i] < LOWER { LOWER } else { x[i] };
    }
    let mut shifted = [0f32; N];
    for i in 0..N {
        shifted[i] = xc[i] * LOG2E + SHIFTER;
    }
    let mut kf = [0f32; N];
    for i in 0..N {
        kf[i] = shifted[i] - SHIFTER;
    }
    let mut r = [0f32; N];
    for i in 0..N {
        r[i] = xc[i] - kf[i] * LN2_HI;
    }
    for i in 0..N {
        r[i] -= kf[i] * LN2_LO;
    }
    let mut q = [0f32; N];
    for i in 0..N {
        q[i] = Q4 + r[i] * Q5;
    }
    for i in 0..N {
        q[i] = Q3 + r[i] * q[i];
    }
    for i in 0..N {
        q[i] = Q2 + r[i] * q[i];
    }
    for i in 0..N {
        q[i] = Q1 + r[i] * q[i];
    }
    for i in 0..N {
        q[i] = Q0 + r[i] * q[i];
    }
    let mut p = [0f32; N];
    for i in 0..N {
        p[i] = 1.0 + (r[i] + (r[i] * r[i]) * q[i]);
    }
    (p, shifted, kf)
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

    /// The kernels' exp domain: `0`, `-0`, `-inf`, the underflow edge
    /// (`-110`, `-104`), `extra`, and every `step`-th f32 bit pattern in
    /// `[-120, -0]`, padded with `-1` to a multiple of `width`.
    fn nonpos_sweep(extra: &[f32], step: u32, width: usize) -> Vec<f32> {
        let mut xs = vec![0.0f32, -0.0, f32::NEG_INFINITY, -110.0, -104.0];
        xs.extend_from_slice(extra);
        let mut b = (-0.0f32).to_bits();
        while b <= (-120.0f32).to_bits() {
            xs.push(f32::from_bits(b));
            b += step;
        }
        xs.resize(xs.len().div_ceil(width) * width, -1.0);
        xs
    }

    /// The clamp-free and the `N`-wide forms give `exp_f32`'s bits on the
    /// kernels' domain `[-inf, 0]` (and NaN stays NaN).
    #[test]
    fn exp_f32_nonpos_n_is_exp_f32() {
        let xs = nonpos_sweep(&[-1e-30, -88.0], 9973, 64);
        for c in xs.chunks_exact(64) {
            let c: &[f32; 64] = c.try_into().unwrap();
            let fast = exp_f32_nonpos_n(c);
            for (&x, &y) in c.iter().zip(&fast) {
                assert_eq!(exp_f32(x).to_bits(), exp_f32_nonpos(x).to_bits(), "{x}");
                assert_eq!(exp_f32(x).to_bits(), y.to_bits(), "{x}");
            }
        }
        assert!(exp_f32_nonpos(f32::NAN).is_nan());
        assert!(exp_f32_nonpos_n(&[f32::NAN; 16]).iter().all(|x| x.is_nan()));
    }

    /// The AVX-512 form gives the bits of the portable one on the kernels'
    /// domain (every 997th f32 in `[-120, 0]`, `-inf`, the subnormal range).
    #[test]
    fn exp_f32_nonpos_n_avx512_is_exp_f32_nonpos_n() {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::is_x86_feature_detected!("avx512f") {
                return;
            }
            let xs = nonpos_sweep(&[-103.9, -87.5], 997, 128);
            for c in xs.chunks_exact(128) {
                let c: &[f32; 128] = c.try_into().unwrap();
                let want = exp_f32_nonpos_n(c);
                // SAFETY: feature detected above.
                let got = unsafe { exp_f32_nonpos_n_avx512(c) };
                for ((&x, &w), &g) in c.iter().zip(&want).zip(&got) {
                    assert_eq!(w.to_bits(), g.to_bits(), "{x}");
                }
                let c16: &[f32; 16] = c[..16].try_into().unwrap();
                // SAFETY: as above.
                let got = unsafe { exp_f32_nonpos_n_avx512(c16) };
                assert_eq!(
                    got.map(f32::to_bits),
                    exp_f32_nonpos_n(c16).map(f32::to_bits)
                );
            }
        }
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
