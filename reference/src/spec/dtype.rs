//! Floating-point formats of logits and outputs, and exact conversions.

use half::{bf16, f16};

/// A floating-point format of logits, outputs or accumulation.
///
/// All four are IEEE-754 binary formats with subnormals: `F64` (binary64),
/// `F32` (binary32), `Bf16` (bfloat16: 8 significant bits, f32's exponent
/// range) and `F16` (binary16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// binary64: 53 significant bits.
    F64,
    /// binary32: 24 significant bits.
    F32,
    /// bfloat16: 8 significant bits, exponent range of f32.
    Bf16,
    /// binary16: 11 significant bits, largest finite 65504.
    F16,
}

impl Dtype {
    /// Every dtype, widest first.
    pub const ALL: [Dtype; 4] = [Dtype::F64, Dtype::F32, Dtype::Bf16, Dtype::F16];

    /// Significant bits `p`, the implicit bit included.
    pub const fn precision(self) -> u32 {
        match self {
            Dtype::F64 => 53,
            Dtype::F32 => 24,
            Dtype::Bf16 => 8,
            Dtype::F16 => 11,
        }
    }

    /// Exponent `e` of the smallest normal number `2^e`.
    pub const fn min_normal_exp(self) -> i32 {
        match self {
            Dtype::F64 => -1022,
            Dtype::F32 | Dtype::Bf16 => -126,
            Dtype::F16 => -14,
        }
    }

    /// Exponent `e` of the largest power of two `2^e` that is finite.
    pub const fn max_exp(self) -> i32 {
        match self {
            Dtype::F64 => 1023,
            Dtype::F32 | Dtype::Bf16 => 127,
            Dtype::F16 => 15,
        }
    }

    /// Exponent of the smallest subnormal (the quantum at the bottom of the
    /// range): `min_normal_exp - (precision - 1)`.
    pub const fn min_subnormal_exp(self) -> i32 {
        self.min_normal_exp() - (self.precision() as i32 - 1)
    }

    /// Unit roundoff `u = 2^-p` (round to nearest).
    #[inline]
    pub fn unit_roundoff(self) -> f64 {
        pow2(-(self.precision() as i32))
    }

    /// Largest finite value, as an f64 (exact).
    #[inline]
    pub fn max_finite(self) -> f64 {
        (2.0 - pow2(1 - self.precision() as i32)) * pow2(self.max_exp())
    }

    /// The accumulation dtype the design prescribes for this input dtype:
    /// f64 for f64, f32 otherwise.
    pub const fn accumulation(self) -> Dtype {
        match self {
            Dtype::F64 => Dtype::F64,
            _ => Dtype::F32,
        }
    }

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            Dtype::F64 => 8,
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// Lower-case name as in safetensors and PyTorch (`f64`, `f32`, `bf16`, `f16`).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F64 => "f64",
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }

    /// The ulp of this dtype at magnitude `|x|`: the spacing `2^(e - p + 1)`
    /// of the binade `[2^e, 2^(e+1))` holding `|x|`, never below the
    /// subnormal quantum. For `|x|` beyond the largest finite value the ulp
    /// of the top binade. Units: those of `x`. Exact (a power of two).
    #[inline]
    pub fn ulp(self, x: f64) -> f64 {
        pow2(self.ulp_exponent(x))
    }

    /// [`Dtype::ulp`]'s exponent: `ulp(x) == 2^ulp_exponent(x)`, in
    /// `min_subnormal_exp ..= max_exp - precision + 1` (NaN: the bottom).
    /// A power-of-two exponent, no unit; panics: none.
    ///
    /// ```
    /// use logprobe_reference::spec::Dtype;
    /// assert_eq!(Dtype::F32.ulp_exponent(1.0), -23);
    /// assert_eq!(Dtype::Bf16.ulp_exponent(0.0), -133);
    /// ```
    #[inline]
    pub fn ulp_exponent(self, x: f64) -> i32 {
        let a = x.abs();
        let q_min = self.min_subnormal_exp();
        if a == 0.0 || a.is_nan() {
            return q_min;
        }
        let e = if a.is_infinite() {
            self.max_exp()
        } else {
            exponent(a).min(self.max_exp())
        };
        (e - self.precision() as i32 + 1).max(q_min)
    }

    /// A positive parameter (a softcap, a clamp) as the computation takes it:
    /// `c` rounded to this dtype ([`Dtype::round_f64`]), `None` unless `c`
    /// and its rounded value are both finite and `> 0`.
    pub fn round_positive(self, c: f64) -> Option<f64> {
        let r = self.round_f64(c);
        (c.is_finite() && c > 0.0 && r.is_finite() && r > 0.0).then_some(r)
    }

    /// Rounds `x` to the nearest value of this dtype (ties to even, overflow
    /// to infinity, gradual underflow), returned as the exactly equal f64.
    /// NaN stays NaN. Computed on the f64 bits, never through an
    /// intermediate format, so there is no double rounding (`half`'s
    /// `from_f64` is not used for this reason).
    #[inline]
    pub fn round_f64(self, x: f64) -> f64 {
        if self == Dtype::F64 || x == 0.0 || !x.is_finite() {
            return x;
        }
        match self {
            // IEEE conversion: round to nearest even, subnormals, overflow.
            Dtype::F32 => return x as f32 as f64,
            // Normal results: round the f64 significand to `p` bits in
            // place (a carry into the exponent is the correct result).
            Dtype::Bf16 | Dtype::F16 if x.abs() >= pow2(self.min_normal_exp()) => {
                let drop = 53 - self.precision();
                let bits = x.to_bits();
                let half = (1u64 << (drop - 1)) - 1 + ((bits >> drop) & 1);
                let r = f64::from_bits((bits + half) & !((1u64 << drop) - 1));
                return if r.abs() > self.max_finite() {
                    r.signum() * f64::INFINITY
                } else {
                    r
                };
            }
            _ => {}
        }
        self.round_f64_scaled(x)
    }

    /// [`Dtype::round_f64`] by scaling (any finite nonzero `x`): the
    /// general path, and the reference its fast paths are tested against.
    fn round_f64_scaled(self, x: f64) -> f64 {
        let e = exponent(x.abs());
        let q = (e - self.precision() as i32 + 1).max(self.min_subnormal_exp());
        // x / 2^q and r * 2^q are exact: only powers of two, all within f64's range.
        let r = (x * pow2(-q)).round_ties_even() * pow2(q);
        if r.abs() > self.max_finite() {
            r.signum() * f64::INFINITY
        } else {
            r
        }
    }
}

impl Dtype {
    /// The logit `z` an implementation sees when it materialises `x / T` in
    /// the logits' own dtype (`temperature_dtype = input`, e.g. PyTorch's
    /// `bf16_logits / 0.6` or `div_(T)`): the quotient is computed in the
    /// accumulation dtype (f32 for f32/bf16/f16 logits, f64 for f64), rounded
    /// once to it, and then rounded to this dtype: two roundings,
    /// `z = round_self(round_acc(x / T))` (docs/design.md, "The math").
    ///
    /// `x` and `t` are exact values of this dtype and of the accumulation
    /// dtype (`t > 0`). The f64 quotient is one rounding of the exact one and
    /// `53 >= 2 * 24 + 2`, so rounding it again to f32 is the correctly
    /// rounded f32 quotient (Figueroa, "When is double rounding innocuous?",
    /// 1995); for f64 logits it is the IEEE division. Overflow gives `±inf`.
    ///
    /// ```
    /// use logprobe_reference::spec::Dtype;
    /// // bf16 1.2890625 / 0.6: the exact quotient 2.1484374... rounds to bf16
    /// // 2.140625, but its f32 rounding is 2.1484375, a bf16 tie, which rounds
    /// // to even: 2.15625 (what PyTorch computes).
    /// let t = 0.6f32 as f64;
    /// assert_eq!(Dtype::Bf16.scaled_input(1.2890625, t), 2.15625);
    /// ```
    pub fn scaled_input(self, x: f64, t: f64) -> f64 {
        self.round_f64(self.accumulation().round_f64(x / t))
    }
}

impl Dtype {
    /// The logit `x'` an implementation sees when it materialises the
    /// softcap `c tanh(x / c)` in the logits' own dtype (`softcap_dtype =
    /// input`, Gemma 2 in bf16: `(logits / c).tanh() * c`): each of the
    /// three operations computed in the accumulation dtype, rounded to it,
    /// then rounded to this dtype (PyTorch's two roundings, as
    /// [`Dtype::scaled_input`]):
    /// `y = r(x / c)`, `t = r(tanh(y))`, `x' = r(c t)` with
    /// `r = round_self . round_acc`.
    ///
    /// `x` is an exact value of this dtype (`-inf` allowed: `tanh(-inf) = -1`,
    /// so `x' = r(-c)`), `c > 0` one of the accumulation dtype. Each step is
    /// correctly rounded: the quotient as in [`Dtype::scaled_input`]; `tanh`
    /// by CORE-MATH's `cr_tanhf` (f32 accumulation; `y` is an f32 value) or
    /// `cr_tanh` (f64), proven correctly rounded; `c t` is exact in f64 for
    /// f32 operands, one IEEE rounding for f64. A model whose f32 `tanh` is
    /// not correctly rounded can differ by one ulp of `t` where that ulp
    /// straddles a rounding point of this dtype. Overflow gives `±inf`
    /// (f16 with `c > 65504`).
    ///
    /// ```
    /// use logprobe_reference::spec::Dtype;
    /// // bf16: 100 / 30 -> 3.328125, tanh -> 0.99609375, * 30 -> 29.8828125 -> 29.875.
    /// assert_eq!(Dtype::Bf16.softcapped_input(100.0, 30.0), 29.875);
    /// assert_eq!(Dtype::Bf16.softcapped_input(f64::NEG_INFINITY, 30.0), -30.0);
    /// ```
    pub fn softcapped_input(self, x: f64, c: f64) -> f64 {
        let acc = self.accumulation();
        self.round_f64(acc.round_f64(c * self.softcap_tanh_input(x, c)))
    }

    /// The materialised `t = r(tanh(r(x / c)))` of [`Dtype::softcapped_input`]
    /// (an exact value of this dtype in `[-1, 1]`): the softcap's gradient
    /// factor as autograd takes it is `1 - t^2` (PyTorch's tanh backward
    /// uses its saved, rounded output).
    pub fn softcap_tanh_input(self, x: f64, c: f64) -> f64 {
        let acc = self.accumulation();
        let r = |v: f64| self.round_f64(acc.round_f64(v));
        let y = r(x / c);
        r(match acc {
            Dtype::F64 => core_math::tanh(y),
            _ => core_math::tanhf(y as f32) as f64,
        })
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `2^e` as an f64 for `-1074 <= e <= 1023`, exact.
#[inline]
pub fn pow2(e: i32) -> f64 {
    if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

/// `floor(log2 a)` for finite `a > 0`, subnormals included.
#[inline]
fn exponent(a: f64) -> i32 {
    let bits = a.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    if biased == 0 {
        let mant = bits & ((1u64 << 52) - 1);
        -1074 + (63 - mant.leading_zeros() as i32)
    } else {
        biased - 1023
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f64 {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type of logits or outputs: `f64`, `f32`, `bf16` or `f16`.
/// Sealed: these four are the problem's dtypes.
pub trait Element: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The dtype tag of this type.
    const DTYPE: Dtype;
    /// The exactly equal f64 (every value of every dtype is an f64).
    fn to_f64(self) -> f64;
    /// Widened to f32: exact for f32, bf16 and f16; rounds to nearest for f64.
    fn to_f32(self) -> f32;
    /// Rounds an f64 to this type, correctly (see [`Dtype::round_f64`]).
    fn from_f64(x: f64) -> Self;
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
    fn to_f64(self) -> f64 {
        self
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f64(x: f64) -> Self {
        x
    }
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f64(self) -> f64 {
        self.to_f32() as f64
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f64(x: f64) -> Self {
        // The rounded value is exact in bf16, so the narrowing below is exact.
        bf16::from_f32(Dtype::Bf16.round_f64(x) as f32)
    }
}

impl Element for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f64(x: f64) -> Self {
        f16::from_f64(Dtype::F16.round_f64(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scaled_input` is PyTorch's `x / T` on a 16-bit tensor: the IEEE f32
    /// quotient, then the 16-bit rounding of that f32 (half's conversion
    /// from f32 is correctly rounded), on every finite 16-bit value and
    /// temperatures whose quotients hit double-rounding ties.
    #[test]
    fn scaled_input_rounds_twice_like_pytorch_on_every_16_bit_value() {
        let mut differs_from_one_rounding = 0;
        for t in [0.6f32, 0.7, 1.3, 0.05, 3.0] {
            for bits in 0..=u16::MAX {
                let (b, h) = (half::bf16::from_bits(bits), half::f16::from_bits(bits));
                for (dtype, x, want) in [
                    (
                        Dtype::Bf16,
                        b.to_f64(),
                        half::bf16::from_f32(b.to_f32() / t).to_f64(),
                    ),
                    (
                        Dtype::F16,
                        h.to_f64(),
                        half::f16::from_f32(h.to_f32() / t).to_f64(),
                    ),
                ] {
                    if !x.is_finite() {
                        continue;
                    }
                    let got = dtype.scaled_input(x, t as f64);
                    assert_eq!(got.to_bits(), want.to_bits(), "{dtype} {x} / {t}");
                    if got != dtype.round_f64(x / t as f64) {
                        differs_from_one_rounding += 1;
                    }
                }
            }
        }
        // The double-rounding entries exist (the case that made verify fail
        // correct PyTorch output) and are covered above.
        assert!(
            differs_from_one_rounding > 100,
            "{differs_from_one_rounding}"
        );
        // f32 and f64 logits: one rounding, the IEEE division.
        assert_eq!(
            Dtype::F32.scaled_input(1.0, 0.6f32 as f64),
            (1.0f32 / 0.6f32) as f64
        );
        assert_eq!(Dtype::F64.scaled_input(1.0, 0.6), 1.0 / 0.6);
    }

    #[test]
    fn round_f64_fast_paths_match_scaling() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for d in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            // Random bit patterns over the whole range, near the normal and
            // overflow thresholds, and exact ties.
            let edges = [
                pow2(d.min_normal_exp()),
                d.max_finite(),
                d.max_finite() + 0.5 * d.ulp(d.max_finite()),
                1.0 + d.unit_roundoff(),
                1.0 + 3.0 * d.unit_roundoff(),
            ];
            for i in 0..200_000 {
                let r = next();
                let x = match i % 4 {
                    0 => f64::from_bits(r),
                    1 => f64::from_bits(
                        (r & 0x800f_ffff_ffff_ffff) | ((1023 + (r >> 52) % 40) << 52),
                    ),
                    2 => edges[(r % 5) as usize] * (1.0 + (r >> 40) as f64 * 1e-16),
                    _ => {
                        let e = edges[(r % 5) as usize];
                        if r & 1 == 0 {
                            -e
                        } else {
                            e
                        }
                    }
                };
                if x == 0.0 || !x.is_finite() {
                    continue;
                }
                let (fast, slow) = (d.round_f64(x), d.round_f64_scaled(x));
                assert!(
                    fast == slow || (fast.is_nan() && slow.is_nan()),
                    "{d} {x:e}: {fast:e} vs {slow:e}"
                );
            }
        }
    }

    #[test]
    fn round_f64_matches_half_on_f32_values() {
        // From f32, half's conversion is correctly rounded: compare on a sweep.
        let mut x = 1.0e-9f32;
        while x < 7.0e4 {
            for s in [1.0f32, -1.0] {
                let v = s * x;
                assert_eq!(
                    Dtype::Bf16.round_f64(v as f64),
                    bf16::from_f32(v).to_f64(),
                    "{v}"
                );
                assert_eq!(
                    Dtype::F16.round_f64(v as f64),
                    f16::from_f32(v).to_f64(),
                    "{v}"
                );
            }
            x *= 1.000_37;
        }
    }

    #[test]
    fn round_f64_has_no_double_rounding() {
        // 1 + 2^-8 + 2^-30 rounds up in bf16; via f32 it would tie to even (1).
        let x = 1.0 + pow2(-8) + pow2(-30);
        assert_eq!(Dtype::Bf16.round_f64(x), 1.0 + pow2(-7));
        assert_eq!(Dtype::F16.round_f64(65520.0), f64::INFINITY);
        assert_eq!(Dtype::F16.round_f64(65519.0), 65504.0);
        assert_eq!(Dtype::F16.round_f64(pow2(-25)), 0.0);
        assert_eq!(Dtype::F16.round_f64(pow2(-25) * 1.5), pow2(-24));
    }

    #[test]
    fn ulp_of_each_dtype() {
        assert_eq!(Dtype::F32.ulp(1.0), pow2(-23));
        assert_eq!(Dtype::F32.ulp(1.5), pow2(-23));
        assert_eq!(Dtype::Bf16.ulp(-3.0), pow2(-6));
        assert_eq!(Dtype::F16.ulp(0.0), pow2(-24));
        assert_eq!(Dtype::F16.ulp(65504.0), 32.0);
        assert_eq!(Dtype::F64.ulp(pow2(-1074)), pow2(-1074));
        assert_eq!(Dtype::F16.max_finite(), 65504.0);
        assert_eq!(Dtype::Bf16.max_finite(), bf16::MAX.to_f64());
    }
}
