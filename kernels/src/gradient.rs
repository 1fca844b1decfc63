//! Grad logits in the dtype asked: [`Gradient`] (`[N, V_total]` in f64,
//! f32, bf16 or f16) and [`GradElement`], the element types a gradient is
//! written in, each value rounded once to nearest (ties to even) from the
//! accumulation dtype.
//!
//! From f32 accumulation the rounding to bf16 is [`bf16_bits`] (vectorised)
//! and to f16 `half::f16::from_f32`; both are the correct rounding of the
//! f32 value, which the tests check against the spec's
//! [`Dtype::round_f64`] (exact for an f32 input: f32 -> f64 is exact).
//! From f64 accumulation the spec's correct rounding is used.

use half::{bf16, f16};
use ndarray::Array2;

use logprobe_reference::spec::{Dtype, Element};

use crate::row::{path, Input, Path};

/// Grad logits `[N, V_total]` in the dtype asked (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Gradient {
    /// binary64.
    F64(Array2<f64>),
    /// binary32.
    F32(Array2<f32>),
    /// bfloat16.
    Bf16(Array2<bf16>),
    /// binary16.
    F16(Array2<f16>),
}

/// Dispatches `$body` over a [`Gradient`]'s array, bound to `$g`.
macro_rules! with_gradient {
    ($grad:expr, $g:ident => $body:expr) => {
        match $grad {
            Gradient::F64($g) => $body,
            Gradient::F32($g) => $body,
            Gradient::Bf16($g) => $body,
            Gradient::F16($g) => $body,
        }
    };
}

impl Gradient {
    /// The element dtype.
    pub fn dtype(&self) -> Dtype {
        match self {
            Gradient::F64(_) => Dtype::F64,
            Gradient::F32(_) => Dtype::F32,
            Gradient::Bf16(_) => Dtype::Bf16,
            Gradient::F16(_) => Dtype::F16,
        }
    }

    /// `(N, V_total)`.
    pub fn dim(&self) -> (usize, usize) {
        with_gradient!(self, g => g.dim())
    }

    /// Bytes of the values (`N * V_total * size_of(dtype)`).
    pub fn size_bytes(&self) -> usize {
        let (n, v) = self.dim();
        n * v * self.dtype().size_bytes()
    }

    /// The values widened to f64 (exact).
    pub fn to_f64(&self) -> Array2<f64> {
        with_gradient!(self, g => g.mapv(|x| x.to_f64()))
    }

    /// `g` in `out`'s element type, each value rounded once to nearest
    /// ([`Element::from_f64`], the spec's correct rounding): exact when the
    /// values are already in `out` (as [`crate::Kernel::backward`] stores
    /// them).
    pub fn from_f64(g: &Array2<f64>, out: Dtype) -> Self {
        match out {
            Dtype::F64 => Gradient::F64(g.clone()),
            Dtype::F32 => Gradient::F32(g.mapv(f32::from_f64)),
            Dtype::Bf16 => Gradient::Bf16(g.mapv(<bf16 as Element>::from_f64)),
            Dtype::F16 => Gradient::F16(g.mapv(<f16 as Element>::from_f64)),
        }
    }
}

/// A gradient element type: f64, f32, bf16 or f16.
pub trait GradElement: Input {
    /// An f32 value rounded once to nearest (ties to even) in this type.
    fn from_f32(x: f32) -> Self;
    /// [`GradElement::from_f32`] of each of `src` into `dst` (same length).
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(x);
        }
    }
}

impl GradElement for f64 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x as f64
    }
}

impl GradElement for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl GradElement for bf16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(bf16_bits(x.to_bits()))
    }
    #[inline]
    fn from_f32_slice(src: &[f32], dst: &mut [Self]) {
        narrow_bf16(src, dst)
    }
}

/// `bf16::from_f32` bit for bit, as selects (so loops over it
/// vectorise): round to nearest, ties to even, on the top 16 bits;
/// overflow rounds to infinity; a NaN keeps its top bits and is made quiet.
#[inline(always)]
fn bf16_bits(x: u32) -> u16 {
    let nan = (x & 0x7FFF_FFFF) > 0x7F80_0000;
    let up = (x & 0x8000) != 0 && (x & 0x17FFF) != 0;
    let r = (x >> 16) + up as u32;
    (if nan { (x >> 16) | 0x40 } else { r }) as u16
}

#[inline(always)]
fn narrow_bf16_body(src: &[f32], dst: &mut [bf16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(bf16_bits(x.to_bits()));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
unsafe fn narrow_bf16_avx512(src: &[f32], dst: &mut [bf16]) {
    narrow_bf16_body(src, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn narrow_bf16_avx2(src: &[f32], dst: &mut [bf16]) {
    narrow_bf16_body(src, dst)
}

/// [`bf16_bits`] by `vcvtneps2bf16` (AVX512-BF16), 16 values at a time:
/// the instruction rounds to nearest even, turns a NaN into
/// `(x >> 16) | 0x40` and overflows to infinity as [`bf16_bits`] does,
/// but flushes subnormal inputs to zero (Intel SDM, VCVTNEPS2BF16), so a
/// group of 16 holding a subnormal (`vfpclassps`, one compare) takes
/// [`bf16_bits`] instead. One conversion per 16 values against ~10 integer
/// operations: the bf16 gradient's rounding on the write pass's two FP
/// ports (docs/benchmarks-history.md, issue 16).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512DQ and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bf16,avx512bw,avx512vl,avx2,avx")]
unsafe fn narrow_bf16_avx512bf16(src: &[f32], dst: &mut [bf16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let mut k = 0;
    while k + 16 <= n {
        // SAFETY: `k + 16 <= n` values lie in `src` and `dst`.
        unsafe {
            let v = _mm512_loadu_ps(src.as_ptr().add(k));
            // Class 0x20: subnormal.
            if _mm512_fpclass_ps_mask::<0x20>(v) == 0 {
                let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
                _mm256_storeu_si256(dst.as_mut_ptr().add(k) as *mut __m256i, b);
            } else {
                narrow_bf16_body(&src[k..k + 16], &mut dst[k..k + 16]);
            }
        }
        k += 16;
    }
    narrow_bf16_body(&src[k..n], &mut dst[k..n]);
}

/// Whether this CPU has what [`narrow_bf16_avx512bf16`] needs (detected once).
#[cfg(target_arch = "x86_64")]
fn has_avx512bf16() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        path() == Path::Avx512
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512bf16")
    })
}

/// f32 values rounded to bf16 ([`bf16_bits`]), vectorised for this CPU.
fn narrow_bf16(src: &[f32], dst: &mut [bf16]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512bf16() {
        // SAFETY: the features were detected at run time.
        return unsafe { narrow_bf16_avx512bf16(src, dst) };
    }
    match path() {
        // SAFETY: the features were detected at run time by `path()`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { narrow_bf16_avx512(src, dst) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { narrow_bf16_avx2(src, dst) },
        _ => narrow_bf16_body(src, dst),
    }
}

impl GradElement for f16 {
    /// `half`'s f32 -> f16 conversion: correctly rounded for every f32,
    /// subnormal results included (tested against [`Dtype::round_f64`]).
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised bf16 rounding is `bf16::from_f32` bit for bit:
    /// a sweep over every 257th f32 bit pattern (both signs, subnormals,
    /// infinities, NaNs, ties), on every CPU path this machine has.
    #[test]
    fn narrow_bf16_is_half_from_f32() {
        let mut xs: Vec<f32> = (0..=u32::MAX / 257)
            .map(|i| f32::from_bits(i.wrapping_mul(257)))
            .collect();
        xs.extend([
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
            f32::from_bits(0x3f80_8000), // a tie, rounds to even (down)
            f32::from_bits(0x3f81_8000), // a tie, rounds to even (up)
            f32::from_bits(0x7f7f_8000), // rounds up to infinity
        ]);
        let want: Vec<u16> = xs.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let check = |f: &dyn Fn(&[f32], &mut [bf16]), what: &str| {
            let mut got = vec![bf16::ZERO; xs.len()];
            f(&xs, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), *w, "{what}: {:#010x}", xs[i].to_bits());
            }
        };
        check(&narrow_bf16_body, "baseline");
        check(&narrow_bf16, "dispatched");
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: feature detected above.
                check(&|s, d| unsafe { narrow_bf16_avx2(s, d) }, "avx2");
            }
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
            {
                // SAFETY: feature detected above.
                check(&|s, d| unsafe { narrow_bf16_avx512(s, d) }, "avx512");
            }
            if has_avx512bf16() {
                // SAFETY: features detected by `has_avx512bf16`.
                check(
                    &|s, d| unsafe { narrow_bf16_avx512bf16(s, d) },
                    "avx512bf16",
                );
                // Subnormals beside normals in one group of 16, and alone.
                let mut xs: Vec<f32> = (0..4096u32)
                    .map(|i| f32::from_bits(i.wrapping_mul(0x9E37_79B9) >> (i % 9)))
                    .collect();
                xs.extend((1..=64u32).map(|i| f32::from_bits(i * 0x1_0001)));
                let mut got = vec![bf16::ZERO; xs.len()];
                // SAFETY: as above.
                unsafe { narrow_bf16_avx512bf16(&xs, &mut got) };
                for (x, g) in xs.iter().zip(&got) {
                    assert_eq!(
                        g.to_bits(),
                        bf16::from_f32(*x).to_bits(),
                        "{:#010x}",
                        x.to_bits()
                    );
                }
            }
        }
    }

    /// f32 inputs near every rounding decision of a 16-bit dtype: for each
    /// of its 65536 values `y` (both signs, subnormals, the largest finite)
    /// the midpoint to the next value up and its two f32 neighbours, plus
    /// every 257th f32 bit pattern.
    fn decision_points(d: Dtype) -> Vec<f32> {
        let mut xs: Vec<f32> = (0..=u32::MAX / 257)
            .map(|i| f32::from_bits(i.wrapping_mul(257)))
            .collect();
        for bits in 0..=u16::MAX {
            let y = match d {
                Dtype::Bf16 => bf16::from_bits(bits).to_f64(),
                _ => f16::from_bits(bits).to_f64(),
            };
            if !y.is_finite() {
                continue;
            }
            // The next value up in magnitude (past the largest finite: the
            // overflow threshold's midpoint, at the next binade's spacing).
            let up = y.abs() + d.ulp(y.abs().max(f64::MIN_POSITIVE));
            let mid = (y.abs() + up) / 2.0 * y.signum();
            // Exact in f32: at most p + 1 <= 12 significant bits.
            let m = mid as f32;
            assert_eq!(m as f64, mid);
            let b = m.to_bits();
            xs.extend([m, f32::from_bits(b + 1), f32::from_bits(b.wrapping_sub(1))]);
        }
        xs
    }

    /// The f32 -> bf16 and f32 -> f16 roundings the gradient uses
    /// ([`GradElement::from_f32`], the vectorised bf16 slice) are correct:
    /// equal, sign of zero included, to the spec's rounding of the exactly
    /// equal f64 ([`Dtype::round_f64`]) at every decision point; NaN stays
    /// NaN.
    #[test]
    fn f32_to_bf16_and_f16_round_once_to_nearest() {
        fn check<G: GradElement>(d: Dtype) {
            let xs = decision_points(d);
            let mut sliced = vec![G::from_f32(0.0); xs.len()];
            G::from_f32_slice(&xs, &mut sliced);
            for (&x, &s) in xs.iter().zip(&sliced) {
                let want = d.round_f64(x as f64);
                for (got, how) in [(G::from_f32(x).to_f64(), "scalar"), (s.to_f64(), "slice")] {
                    let ok = if want.is_nan() {
                        got.is_nan()
                    } else {
                        got.to_bits() == want.to_bits()
                    };
                    assert!(
                        ok,
                        "{d} {how}: {:#010x} -> {got:e}, want {want:e}",
                        x.to_bits()
                    );
                }
            }
        }
        check::<bf16>(Dtype::Bf16);
        check::<f16>(Dtype::F16);
    }
}
