//! Proptest generators: small *recipes* expanded deterministically into
//! problems (logits `[N, V_total]`, tokens `[N]`, sampling masks, top-k ids,
//! options), cotangents, chunk sizes and vocabulary-shard layouts.
//!
//! A recipe holds a seed and a handful of knobs (row distribution, `V`,
//! offset, mask rate, dtype, temperature, `ignore_index` rate); proptest
//! shrinks the recipe, never a 152064-wide vector, so a failing real-vocabulary
//! row shrinks in seconds. Every logit is generated in f64 and rounded once
//! with [`Dtype::round_f64`], so it is exactly representable in the dtype
//! under test (DESIGN: "The properties", generators).
//!
//! Sizes: `N` from 0, `V` from 1; small `V` at high case counts, the real
//! vocabulary sizes [`REAL_VOCAB_SIZES`] at low ones (with `N <= 2`, since the
//! oracle costs about 1 us per vocabulary entry).

use std::ops::Range;

use half::{bf16, f16};
use ndarray::{Array1, Array2};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{RngAlgorithm, TestRng};

use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, LogitsMut, Options, Problem, TemperatureDtype,
    DEFAULT_IGNORE_INDEX,
};
use logprobe_reference::splitmix::SplitMix64;

/// Vocabulary sizes of real models: LLaMA-2 (32000), GPT-2 (50257), LLaMA-3
/// (128256), Qwen2 (151936), Qwen2.5 padded (152064), Gemma (256000).
pub const REAL_VOCAB_SIZES: [usize; 6] = [32000, 50257, 128256, 151936, 152064, 256000];

/// The shape of one row's logits before the common offset is added.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowKind {
    /// LLM-like: Zipf-shaped logits `-ln(rank)` over a random permutation of
    /// ranks plus Gaussian noise (sigma 0.25), rank 1 lifted 1 nat above the
    /// rest (the dominant token),
    /// scaled so that the softmax entropy is `entropy` nats (clamped to
    /// `0.95 ln V`). Real next-token rows have 0-5 nats.
    LlmLike {
        /// Target entropy in nats.
        entropy: f64,
    },
    /// I.i.d. Gaussian logits with standard deviation `sigma` (nats).
    WideGaussian {
        /// Standard deviation.
        sigma: f64,
    },
    /// Every logit equal (softmax uniform, entropy `ln V`).
    AllEqual,
    /// Logits drawn from `levels` values `0, -1, ...`: many exact ties, also at the max.
    Ties {
        /// Number of distinct values (>= 1).
        levels: u8,
    },
    /// One logit `gap` above Gaussian(0, 1) others: nearly one-hot.
    OneHotish {
        /// Gap in nats.
        gap: f64,
    },
    /// LLM-like (2 nats) with each entry `-inf` at rate `rate` (the argmax stays finite).
    NegInf {
        /// Fraction of `-inf` entries.
        rate: f64,
    },
    /// One finite logit, all others `-inf`.
    OneFinite,
    /// Subnormal logits of the dtype (multiples -8..=8 of its smallest
    /// subnormal); the offset is ignored.
    Subnormals,
    /// Each row draws its own kind from the kinds above (row `i` from the
    /// seed and `i`).
    Mixed,
}

/// The common offset added to every logit of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Offset {
    /// None.
    Zero,
    /// A value in nats (any sign).
    Value(f64),
    /// The extreme of the dtype: `+-1e30` for f32 and bf16, `+-1e300` for
    /// f64, `65504` (the max) or `-60000` for f16. Non-max logits round to
    /// the max or far below it (one-hot or ties).
    Extreme {
        /// Negative extreme.
        negative: bool,
    },
}

impl Offset {
    /// The offset as a value for `dtype`, rounded to it.
    pub fn value(self, dtype: Dtype) -> f64 {
        let v = match self {
            Offset::Zero => 0.0,
            Offset::Value(v) => v,
            Offset::Extreme { negative } => {
                let m = match dtype {
                    Dtype::F64 => 1e300,
                    Dtype::F32 | Dtype::Bf16 => 1e30,
                    Dtype::F16 if negative => 60000.0,
                    Dtype::F16 => 65504.0,
                };
                if negative {
                    -m
                } else {
                    m
                }
            }
        };
        dtype
            .round_f64(v)
            .clamp(-dtype.max_finite(), dtype.max_finite())
    }

    /// Whether the offset is large enough that raw-logit formulas
    /// (`lse - sum p x`, `gather - lse`) visibly lose digits: `|offset| >= 1000`.
    pub fn is_large(self, dtype: Dtype) -> bool {
        self.value(dtype).abs() >= 1000.0
    }
}

/// What fills the padded columns `[vocab_size, V_total)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PadFill {
    /// A finite value 50 above the row max (clamped to the dtype): a kernel
    /// that does not truncate the padding gets the wrong normaliser.
    Large,
    /// NaN: a kernel that reads the padding returns NaN or an error.
    Nan,
}

/// A problem recipe: everything needed to build a [`ProblemData`]
/// deterministically with [`ProblemRecipe::expand`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProblemRecipe {
    /// Seed of every random draw.
    pub seed: u64,
    /// Rows `N`.
    pub n: usize,
    /// Real vocabulary size `V`.
    pub vocab_size: usize,
    /// Padded columns past `V` (`V_total = V + padding`); `options.vocab_size`
    /// is set when `padding > 0`.
    pub padding: usize,
    /// Fill of the padded columns.
    pub pad_fill: PadFill,
    /// Dtype of the logits.
    pub dtype: Dtype,
    /// Row distribution.
    pub kind: RowKind,
    /// Common offset.
    pub offset: Offset,
    /// Sampling mask: `None` = no mask tensor; `Some(r)`: each entry
    /// disallowed with probability `r` (`r >= 1`: exactly one allowed entry
    /// per row), at least one allowed finite entry kept.
    pub mask_rate: Option<f64>,
    /// Temperature `T`.
    pub temperature: f64,
    /// How `x / T` is materialised.
    pub temperature_dtype: TemperatureDtype,
    /// Whether tokens (hence log-probs) are given.
    pub tokens: bool,
    /// Fraction of rows whose token is `ignore_index`.
    pub ignore_rate: f64,
    /// `ignore_index` (-100 or a custom value).
    pub ignore_index: i64,
    /// Top-k width `K` (0 = no `topk_ids`).
    pub topk: usize,
    /// Whether top-k ids are the row's true top-K (else random ids).
    pub topk_true: bool,
    /// Entropy option.
    pub entropy: Option<EntropyLogits>,
}

/// Logits owned in their dtype, `[N, V_total]`.
#[derive(Clone, Debug, PartialEq)]
pub enum OwnedLogits {
    /// binary64.
    F64(Array2<f64>),
    /// binary32.
    F32(Array2<f32>),
    /// bfloat16.
    Bf16(Array2<bf16>),
    /// binary16.
    F16(Array2<f16>),
}

impl OwnedLogits {
    /// Converts f64 values that are exactly representable in `dtype` (NaN and
    /// infinities included) into `dtype`; exact.
    pub fn from_f64(dtype: Dtype, x: &Array2<f64>) -> Self {
        match dtype {
            Dtype::F64 => OwnedLogits::F64(x.clone()),
            Dtype::F32 => OwnedLogits::F32(x.mapv(|v| v as f32)),
            Dtype::Bf16 => OwnedLogits::Bf16(x.mapv(|v| bf16::from_f32(v as f32))),
            Dtype::F16 => OwnedLogits::F16(x.mapv(f16::from_f64)),
        }
    }

    /// A borrowed view.
    pub fn view(&self) -> Logits<'_> {
        match self {
            OwnedLogits::F64(a) => Logits::F64(a.view()),
            OwnedLogits::F32(a) => Logits::F32(a.view()),
            OwnedLogits::Bf16(a) => Logits::Bf16(a.view()),
            OwnedLogits::F16(a) => Logits::F16(a.view()),
        }
    }

    /// A mutable view (for the in-place backward).
    pub fn view_mut(&mut self) -> LogitsMut<'_> {
        match self {
            OwnedLogits::F64(a) => LogitsMut::F64(a.view_mut()),
            OwnedLogits::F32(a) => LogitsMut::F32(a.view_mut()),
            OwnedLogits::Bf16(a) => LogitsMut::Bf16(a.view_mut()),
            OwnedLogits::F16(a) => LogitsMut::F16(a.view_mut()),
        }
    }

    /// The values as exact f64, `[N, V_total]`.
    pub fn to_f64(&self) -> Array2<f64> {
        match self {
            OwnedLogits::F64(a) => a.clone(),
            OwnedLogits::F32(a) => a.mapv(|v| v as f64),
            OwnedLogits::Bf16(a) => a.mapv(|v| v.to_f64()),
            OwnedLogits::F16(a) => a.mapv(|v| v.to_f64()),
        }
    }

    /// The dtype.
    pub fn dtype(&self) -> Dtype {
        self.view().dtype()
    }

    /// Whether both hold the same bits (NaN payloads included).
    pub fn bits_eq(&self, other: &OwnedLogits) -> bool {
        match (self, other) {
            (OwnedLogits::F64(a), OwnedLogits::F64(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedLogits::F32(a), OwnedLogits::F32(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedLogits::Bf16(a), OwnedLogits::Bf16(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedLogits::F16(a), OwnedLogits::F16(b)) => {
                a.shape() == b.shape() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            _ => false,
        }
    }

    /// Size of the buffer in bytes.
    pub fn size_bytes(&self) -> usize {
        let (n, v) = self.view().dim();
        n * v * self.dtype().size_bytes()
    }
}

/// An owned problem, built from a [`ProblemRecipe`]; [`ProblemData::problem`]
/// borrows it as the spec's [`Problem`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProblemData {
    /// Logits `[N, V_total]`.
    pub logits: OwnedLogits,
    /// Tokens `[N]`.
    pub tokens: Option<Array1<i64>>,
    /// Sampling mask `[N, V_total]` (`true` = allowed).
    pub sampling_mask: Option<Array2<bool>>,
    /// Top-k ids `[N, K]`.
    pub topk_ids: Option<Array2<i64>>,
    /// Options.
    pub options: Options,
}

impl ProblemData {
    /// The borrowed problem.
    pub fn problem(&self) -> Problem<'_> {
        Problem {
            logits: self.logits.view(),
            tokens: self.tokens.as_ref().map(|t| t.view()),
            sampling_mask: self.sampling_mask.as_ref().map(|m| m.view()),
            topk_ids: self.topk_ids.as_ref().map(|k| k.view()),
            options: self.options,
        }
    }

    /// Rows `N`.
    pub fn n(&self) -> usize {
        self.logits.view().dim().0
    }

    /// Real vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.options
            .vocab_size
            .unwrap_or(self.logits.view().dim().1)
    }

    /// Columns `V_total`.
    pub fn v_total(&self) -> usize {
        self.logits.view().dim().1
    }
}

/// Owned cotangents (see the spec's [`Cotangents`]); values exactly
/// representable in f32 (every kernel may read them in f32).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CotangentData {
    /// Cotangent of log-probs `[N]`.
    pub grad_log_probs: Option<Array1<f64>>,
    /// Cotangent of entropy `[N]`.
    pub grad_entropy: Option<Array1<f64>>,
    /// Cotangent of top-k log-probs `[N, K]`.
    pub grad_topk_log_probs: Option<Array2<f64>>,
}

impl CotangentData {
    /// The borrowed cotangents.
    pub fn view(&self) -> Cotangents<'_> {
        Cotangents {
            grad_log_probs: self.grad_log_probs.as_ref().map(|g| g.view()),
            grad_entropy: self.grad_entropy.as_ref().map(|g| g.view()),
            grad_topk_log_probs: self.grad_topk_log_probs.as_ref().map(|g| g.view()),
        }
    }

    /// Whether no cotangent is present.
    pub fn is_empty(&self) -> bool {
        self.grad_log_probs.is_none()
            && self.grad_entropy.is_none()
            && self.grad_topk_log_probs.is_none()
    }
}

/// Which cotangents to give; expanded against a problem by
/// [`CotangentRecipe::expand`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CotangentRecipe {
    /// Seed of the values.
    pub seed: u64,
    /// Give a log-prob cotangent (when tokens exist).
    pub log_probs: bool,
    /// Give an entropy cotangent (when the entropy is computed).
    pub entropy: bool,
    /// Give a top-k cotangent (when ids exist).
    pub topk: bool,
}

impl CotangentRecipe {
    /// Cotangents for `data`: values in `[-2, 2]` rounded to f32, with exact
    /// zeros and ones mixed in, different per row. Cotangents the problem
    /// has no output for are left out; if that leaves none, the first
    /// available one (log-probs, entropy, top-k) is given, and none only
    /// when the problem computes nothing.
    pub fn expand(&self, data: &ProblemData) -> CotangentData {
        let n = data.n();
        let has_lp = data.tokens.is_some();
        let has_h = data.options.entropy.is_some();
        let has_k = data.topk_ids.is_some();
        let (mut lp, mut h, mut k) = (
            self.log_probs && has_lp,
            self.entropy && has_h,
            self.topk && has_k,
        );
        if !(lp || h || k) {
            if has_lp {
                lp = true;
            } else if has_h {
                h = true;
            } else if has_k {
                k = true;
            }
        }
        let mut rng = rng_for(self.seed, 0xC07A);
        let mut draw = move || -> f64 {
            let u: f64 = rng.random();
            if u < 0.1 {
                0.0
            } else if u < 0.2 {
                1.0
            } else {
                Dtype::F32.round_f64(rng.random_range(-2.0..2.0))
            }
        };
        let grad_log_probs = lp.then(|| Array1::from_shape_fn(n, |_| draw()));
        let grad_entropy = h.then(|| Array1::from_shape_fn(n, |_| draw()));
        let kk = data.topk_ids.as_ref().map_or(0, |ids| ids.ncols());
        let grad_topk_log_probs = k.then(|| Array2::from_shape_fn((n, kk), |_| draw()));
        CotangentData {
            grad_log_probs,
            grad_entropy,
            grad_topk_log_probs,
        }
    }
}

/// A deterministic RNG for `(seed, stream)`: ChaCha seeded by SplitMix64.
pub fn rng_for(seed: u64, stream: u64) -> TestRng {
    let mut s = SplitMix64::new(seed ^ stream.wrapping_mul(SplitMix64::GAMMA));
    let mut bytes = [0u8; 32];
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&s.next_u64().to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// A standard normal draw (Box-Muller).
fn gaussian(rng: &mut TestRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Softmax entropy (nats) of `beta * b`, in f64 (for the generator's
/// calibration only; not an oracle).
fn entropy_f64(b: &[f64], beta: f64) -> f64 {
    let m = b.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(beta * x));
    let (mut s, mut sx) = (0.0, 0.0);
    for &x in b {
        let d = beta * x - m;
        let e = d.exp();
        s += e;
        sx += e * d;
    }
    s.ln() - sx / s
}

/// LLM-like shifted logits (`<= 0`, max 0) of width `v` with entropy about
/// `entropy` nats: Zipf ranks over a random permutation plus noise, scaled
/// by bisection on the scale.
fn llm_like_shape(rng: &mut TestRng, v: usize, entropy: f64) -> Vec<f64> {
    let mut ranks: Vec<usize> = (1..=v).collect();
    for i in (1..v).rev() {
        let j = rng.random_range(0..=i);
        ranks.swap(i, j);
    }
    let mut b: Vec<f64> = ranks
        .iter()
        .map(|&r| -(r as f64).ln() + 0.25 * gaussian(rng))
        .collect();
    // The dominant token (rank 1) stays 1 nat (times the scale) above the rest.
    if let Some(top) = ranks.iter().position(|&r| r == 1) {
        let rest = (0..v)
            .filter(|&j| j != top)
            .map(|j| b[j])
            .fold(f64::NEG_INFINITY, f64::max);
        if rest.is_finite() {
            b[top] = rest + 1.0;
        }
    }
    let target = entropy.clamp(0.0, 0.95 * (v as f64).ln());
    // Entropy decreases in beta from ln V (beta = 0) towards 0.
    let (mut lo, mut hi) = (0.0f64, 256.0f64);
    for _ in 0..30 {
        let mid = 0.5 * (lo + hi);
        if entropy_f64(&b, mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let beta = 0.5 * (lo + hi);
    let m = b.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
    b.iter().map(|&x| beta * (x - m)).collect()
}

/// The concrete kinds [`RowKind::Mixed`] draws from.
fn mixed_kind(rng: &mut TestRng) -> RowKind {
    match rng.random_range(0..8u32) {
        0 | 1 => RowKind::LlmLike {
            entropy: rng.random_range(0.0..5.0),
        },
        2 => RowKind::WideGaussian {
            sigma: rng.random_range(0.5..30.0),
        },
        3 => RowKind::AllEqual,
        4 => RowKind::Ties {
            levels: rng.random_range(1..4u8),
        },
        5 => RowKind::OneHotish {
            gap: rng.random_range(5.0..60.0),
        },
        6 => RowKind::NegInf {
            rate: rng.random_range(0.1..0.9),
        },
        _ => RowKind::OneFinite,
    }
}

/// One row of logits (`[v]`, exact in `dtype`), the shape of `kind` plus
/// `offset`, rounded to `dtype` and clamped to its finite range (`-inf`
/// entries stay `-inf`).
pub fn row_values(
    rng: &mut TestRng,
    v: usize,
    dtype: Dtype,
    kind: RowKind,
    offset: Offset,
) -> Vec<f64> {
    let kind = if kind == RowKind::Mixed {
        mixed_kind(rng)
    } else {
        kind
    };
    let mut d: Vec<f64> = match kind {
        RowKind::LlmLike { entropy } => llm_like_shape(rng, v, entropy),
        RowKind::WideGaussian { sigma } => (0..v).map(|_| sigma * gaussian(rng)).collect(),
        RowKind::AllEqual => vec![0.0; v],
        RowKind::Ties { levels } => (0..v)
            .map(|_| -(rng.random_range(0..levels.max(1) as u32) as f64))
            .collect(),
        RowKind::OneHotish { gap } => {
            let hot = rng.random_range(0..v);
            (0..v)
                .map(|j| if j == hot { gap } else { gaussian(rng) })
                .collect()
        }
        RowKind::NegInf { rate } => {
            let mut d = llm_like_shape(rng, v, 2.0);
            for x in d.iter_mut() {
                // The argmax (0) stays finite.
                if *x < 0.0 && rng.random_bool(rate.clamp(0.0, 1.0)) {
                    *x = f64::NEG_INFINITY;
                }
            }
            d
        }
        RowKind::OneFinite => {
            let hot = rng.random_range(0..v);
            (0..v)
                .map(|j| if j == hot { 0.0 } else { f64::NEG_INFINITY })
                .collect()
        }
        RowKind::Subnormals => {
            let q = logprobe_reference::spec::pow2(dtype.min_subnormal_exp());
            return (0..v)
                .map(|_| rng.random_range(-8..=8i32) as f64 * q)
                .collect();
        }
        RowKind::Mixed => unreachable!("resolved above"),
    };
    // Shift so the finite max is 0, then add the offset and round once.
    let m = d
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f64::NEG_INFINITY, f64::max);
    let off = offset.value(dtype);
    let lim = dtype.max_finite();
    for x in d.iter_mut() {
        if x.is_finite() {
            *x = dtype.round_f64(off + (*x - m)).clamp(-lim, lim);
        }
    }
    d
}

/// An LLM-like row (Zipf-shaped, a dominant token, entropy drawn from 0-5
/// nats by `seed`) of width `v`, exact in `dtype`, as f64 values. For
/// benches and fixtures.
pub fn llm_like_row(seed: u64, v: usize, dtype: Dtype) -> Vec<f64> {
    let mut rng = rng_for(seed, 0x11A);
    let entropy = rng.random_range(0.0..5.0);
    row_values(
        &mut rng,
        v,
        dtype,
        RowKind::LlmLike { entropy },
        Offset::Zero,
    )
}

/// `n` LLM-like rows (see [`llm_like_row`]) as logits `[n, v]` in `dtype`.
pub fn llm_like_logits(seed: u64, n: usize, v: usize, dtype: Dtype) -> OwnedLogits {
    let mut x = Array2::<f64>::zeros((n, v));
    for (i, mut row) in x.rows_mut().into_iter().enumerate() {
        let r = llm_like_row(seed.wrapping_add(i as u64), v, dtype);
        row.iter_mut().zip(r).for_each(|(a, b)| *a = b);
    }
    OwnedLogits::from_f64(dtype, &x)
}

impl ProblemRecipe {
    /// A plain recipe: f32, LLM-like rows, no offset, mask, padding, top-k,
    /// temperature 1, tokens on, unmasked entropy on.
    pub fn plain(seed: u64, n: usize, vocab_size: usize) -> Self {
        ProblemRecipe {
            seed,
            n,
            vocab_size,
            padding: 0,
            pad_fill: PadFill::Large,
            dtype: Dtype::F32,
            kind: RowKind::LlmLike { entropy: 2.0 },
            offset: Offset::Zero,
            mask_rate: None,
            temperature: 1.0,
            temperature_dtype: TemperatureDtype::Accumulation,
            tokens: true,
            ignore_rate: 0.0,
            ignore_index: DEFAULT_IGNORE_INDEX,
            topk: 0,
            topk_true: true,
            entropy: Some(EntropyLogits::Unmasked),
        }
    }

    /// Builds the problem (see [`ProblemRecipe::expand_with_masked_cols`]).
    pub fn expand(&self) -> ProblemData {
        self.expand_with_masked_cols(None)
    }

    /// Builds the problem deterministically. `masked_cols`, when given and a
    /// mask exists, disallows that column range in every row (an all-masked
    /// vocabulary shard) as long as an allowed finite entry remains outside it.
    ///
    /// Tokens: allowed finite entries only; per row the argmax, a token
    /// sampled from the softmax, or a uniform one; `ignore_index` at
    /// `ignore_rate`.
    pub fn expand_with_masked_cols(&self, masked_cols: Option<Range<usize>>) -> ProblemData {
        let (n, v) = (self.n, self.vocab_size.max(1));
        let vt = v + self.padding;
        let dtype = self.dtype;
        let mut x = Array2::<f64>::zeros((n, vt));
        let mut mask = self
            .mask_rate
            .map(|_| Array2::<bool>::from_elem((n, vt), true));
        let mut tokens = Array1::<i64>::zeros(n);
        let mut ids = Array2::<i64>::zeros((n, self.topk));
        for i in 0..n {
            let mut rng = rng_for(self.seed, 1 + i as u64);
            let row = row_values(&mut rng, v, dtype, self.kind, self.offset);
            let finite: Vec<usize> = (0..v).filter(|&j| row[j].is_finite()).collect();
            // Mask: disallow at `rate`, then keep one allowed finite entry.
            if let (Some(rate), Some(m)) = (self.mask_rate, mask.as_mut()) {
                let mut mrow = m.row_mut(i);
                if rate >= 1.0 {
                    mrow.fill(false);
                } else {
                    for j in 0..vt {
                        mrow[j] = !rng.random_bool(rate.max(0.0));
                    }
                }
                if let Some(r) = &masked_cols {
                    if finite.iter().any(|&j| !r.contains(&j)) {
                        for j in r.clone() {
                            mrow[j] = false;
                        }
                    }
                }
                if !finite.iter().any(|&j| mrow[j]) {
                    let outside: Vec<usize> = finite
                        .iter()
                        .copied()
                        .filter(|&j| masked_cols.as_ref().is_none_or(|r| !r.contains(&j)))
                        .collect();
                    let pool = if outside.is_empty() {
                        &finite
                    } else {
                        &outside
                    };
                    mrow[pool[rng.random_range(0..pool.len())]] = true;
                }
            }
            let allowed: Vec<usize> = finite
                .iter()
                .copied()
                .filter(|&j| mask.as_ref().is_none_or(|m| m[[i, j]]))
                .collect();
            // Target.
            let ignore = rng.random_bool(self.ignore_rate.clamp(0.0, 1.0));
            tokens[i] = if ignore {
                self.ignore_index
            } else {
                match rng.random_range(0..3u32) {
                    0 => *allowed
                        .iter()
                        .max_by(|&&a, &&b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                        .unwrap() as i64,
                    1 => sample_softmax(&mut rng, &row, &allowed) as i64,
                    _ => allowed[rng.random_range(0..allowed.len())] as i64,
                }
            };
            // Top-k ids.
            if self.topk > 0 {
                let chosen: Vec<usize> = if self.topk_true {
                    let mut order: Vec<usize> = (0..v).collect();
                    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                    (0..self.topk).map(|k| order[k % v]).collect()
                } else {
                    (0..self.topk).map(|_| rng.random_range(0..v)).collect()
                };
                for (k, &c) in chosen.iter().enumerate() {
                    ids[[i, k]] = c as i64;
                }
            }
            // Padding.
            let rmax = row
                .iter()
                .copied()
                .filter(|x| x.is_finite())
                .fold(f64::NEG_INFINITY, f64::max);
            let mut xr = x.row_mut(i);
            for j in 0..v {
                xr[j] = row[j];
            }
            for j in v..vt {
                xr[j] = match self.pad_fill {
                    PadFill::Large => dtype.round_f64(rmax + 50.0).min(dtype.max_finite()),
                    PadFill::Nan => f64::NAN,
                };
            }
        }
        let options = Options {
            temperature: self.temperature,
            temperature_dtype: self.temperature_dtype,
            vocab_size: (self.padding > 0).then_some(v),
            ignore_index: self.ignore_index,
            entropy: self.entropy,
        };
        ProblemData {
            logits: OwnedLogits::from_f64(dtype, &x),
            tokens: self.tokens.then_some(tokens),
            sampling_mask: mask,
            topk_ids: (self.topk > 0).then_some(ids),
            options,
        }
    }

    /// Oracle work of this recipe in vocabulary entries (`N * V_total`).
    pub fn entries(&self) -> usize {
        self.n * (self.vocab_size + self.padding)
    }
}

/// Draws an index from `allowed` with probability proportional to
/// `exp(row[j] - max)` (f64; generator only).
fn sample_softmax(rng: &mut TestRng, row: &[f64], allowed: &[usize]) -> usize {
    let m = allowed
        .iter()
        .map(|&j| row[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = allowed.iter().map(|&j| (row[j] - m).exp()).sum();
    let mut u = rng.random::<f64>() * total;
    for &j in allowed {
        u -= (row[j] - m).exp();
        if u <= 0.0 {
            return j;
        }
    }
    allowed[allowed.len() - 1]
}

/// Which parts of the recipe space a strategy draws from.
#[derive(Clone, Debug, PartialEq)]
pub struct RecipeSpace {
    /// Logit dtypes, drawn uniformly.
    pub dtypes: Vec<Dtype>,
    /// Weight of the real vocabulary sizes (with `N <= 2`) against 20 for
    /// small and medium `V` (0 = never).
    pub real_vocab_weight: u32,
    /// Largest `V` of the small/medium band (at least 16).
    pub max_small_vocab: usize,
    /// Largest `N` for small `V`.
    pub max_rows: usize,
    /// Draw sampling masks.
    pub masks: bool,
    /// Draw temperatures other than 1 and `TemperatureDtype::Input`.
    pub temperatures: bool,
    /// Draw padded vocabularies.
    pub padding: bool,
    /// Draw top-k ids.
    pub topk: bool,
    /// Draw large and extreme offsets.
    pub offsets: bool,
}

impl Default for RecipeSpace {
    /// Everything on, f32 logits, real vocabularies at weight 1.
    fn default() -> Self {
        RecipeSpace {
            dtypes: vec![Dtype::F32],
            real_vocab_weight: 1,
            max_small_vocab: 4096,
            max_rows: 12,
            masks: true,
            temperatures: true,
            padding: true,
            topk: true,
            offsets: true,
        }
    }
}

/// Row kinds, weighted towards LLM-like and mixed rows.
pub fn row_kind() -> impl Strategy<Value = RowKind> {
    prop_oneof![
        4 => (0.0..5.0f64).prop_map(|entropy| RowKind::LlmLike { entropy }),
        3 => Just(RowKind::Mixed),
        2 => (0.5..60.0f64).prop_map(|sigma| RowKind::WideGaussian { sigma }),
        1 => Just(RowKind::AllEqual),
        1 => (1..5u8).prop_map(|levels| RowKind::Ties { levels }),
        1 => (5.0..100.0f64).prop_map(|gap| RowKind::OneHotish { gap }),
        1 => (0.05..0.95f64).prop_map(|rate| RowKind::NegInf { rate }),
        1 => Just(RowKind::OneFinite),
        1 => Just(RowKind::Subnormals),
    ]
}

/// Offsets: mostly none or moderate, sometimes large (`1e3..1e6`, either
/// sign) or the dtype's extreme.
pub fn offset(large: bool) -> BoxedStrategy<Offset> {
    if large {
        prop_oneof![
            6 => Just(Offset::Zero),
            3 => (-60.0..60.0f64).prop_map(Offset::Value),
            2 => (3.0..6.0f64, any::<bool>()).prop_map(|(e, neg)| Offset::Value(if neg { -1.0 } else { 1.0 } * 10f64.powf(e))),
            1 => any::<bool>().prop_map(|negative| Offset::Extreme { negative }),
        ]
        .boxed()
    } else {
        prop_oneof![3 => Just(Offset::Zero), 1 => (-60.0..60.0f64).prop_map(Offset::Value)].boxed()
    }
}

/// `(V, N)`: small `V` (1-16) and medium `V` (up to `max_small_vocab`) with
/// `N` up to `max_rows`, or a real vocabulary size with `N` in 1..=2.
pub fn vocab_and_rows(space: &RecipeSpace) -> BoxedStrategy<(usize, usize)> {
    let rows = space.max_rows;
    let mid = space.max_small_vocab.max(17);
    let small = (1usize..=16, 0..=rows).boxed();
    let medium = (17usize..=mid, 0..=rows.min(8)).boxed();
    if space.real_vocab_weight == 0 {
        prop_oneof![12 => small, 8 => medium].boxed()
    } else {
        prop_oneof![
            12 => small,
            8 => medium,
            space.real_vocab_weight => (select(REAL_VOCAB_SIZES.to_vec()), 1usize..=2),
        ]
        .boxed()
    }
}

/// Temperatures: 1 mostly; 0.5, 2 (powers of two), 0.7, 1.3 (not).
pub fn temperature() -> impl Strategy<Value = f64> {
    prop_oneof![4 => Just(1.0), 1 => select(vec![0.5, 2.0, 0.7, 1.3, 0.6])]
}

/// Problem recipes over `space`.
pub fn problem_recipe(space: RecipeSpace) -> BoxedStrategy<ProblemRecipe> {
    let knobs = (
        any::<u64>(),
        vocab_and_rows(&space),
        select(space.dtypes.clone()),
        row_kind(),
        offset(space.offsets),
        if space.masks {
            prop_oneof![3 => Just(None), 1 => select(vec![0.0, 0.1, 0.5, 0.9, 1.0]).prop_map(Some)]
                .boxed()
        } else {
            Just(None).boxed()
        },
        if space.temperatures {
            (temperature(), prop_oneof![3 => Just(TemperatureDtype::Accumulation), 1 => Just(TemperatureDtype::Input)]).boxed()
        } else {
            Just((1.0, TemperatureDtype::Accumulation)).boxed()
        },
    );
    let more = (
        if space.padding {
            prop_oneof![3 => Just(0usize), 1 => 1usize..=70].boxed()
        } else {
            Just(0usize).boxed()
        },
        prop_oneof![3 => Just(PadFill::Large), 1 => Just(PadFill::Nan)],
        prop_oneof![6 => Just(true), 1 => Just(false)],
        prop_oneof![3 => Just(0.0), 1 => select(vec![0.25, 1.0])],
        prop_oneof![3 => Just(DEFAULT_IGNORE_INDEX), 1 => Just(-1i64)],
        if space.topk {
            prop_oneof![2 => Just(0usize), 1 => 1usize..=5].boxed()
        } else {
            Just(0usize).boxed()
        },
        any::<bool>(),
        prop_oneof![4 => Just(Some(EntropyLogits::Unmasked)), 1 => Just(Some(EntropyLogits::Masked)), 1 => Just(None)],
    );
    (knobs, more)
        .prop_map(
            |(
                (seed, (v, n), dtype, kind, offset, mask_rate, (temperature, temperature_dtype)),
                (padding, pad_fill, tokens, ignore_rate, ignore_index, topk, topk_true, entropy),
            )| {
                ProblemRecipe {
                    seed,
                    n,
                    vocab_size: v,
                    padding,
                    pad_fill,
                    dtype,
                    kind,
                    offset,
                    mask_rate,
                    temperature,
                    temperature_dtype,
                    tokens,
                    ignore_rate,
                    ignore_index,
                    topk,
                    topk_true,
                    // Masked entropy only means something with a mask.
                    entropy: if entropy == Some(EntropyLogits::Masked) && mask_rate.is_none() {
                        Some(EntropyLogits::Unmasked)
                    } else {
                        entropy
                    },
                }
            },
        )
        .boxed()
}

/// Cotangent recipes (each output's cotangent present with probability 3/4).
pub fn cotangent_recipe() -> impl Strategy<Value = CotangentRecipe> {
    (
        any::<u64>(),
        prop::bool::weighted(0.75),
        prop::bool::weighted(0.75),
        prop::bool::weighted(0.75),
    )
        .prop_map(|(seed, log_probs, entropy, topk)| CotangentRecipe {
            seed,
            log_probs,
            entropy,
            topk,
        })
}

/// Chunk sizes to compare for `n` rows: 1, a random size in `1..=n`, a
/// non-divisor of `n` (when one exists), `n`, and sizes past `n`; sorted,
/// deduplicated, all >= 1.
pub fn chunk_sizes(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = rng_for(seed, 0xC4_0C);
    let mut c = vec![
        1,
        n.max(1),
        n + 1,
        n + 1 + rng.random_range(0..64usize),
        2 * n + 3,
    ];
    if n >= 1 {
        c.push(rng.random_range(1..=n));
    }
    if let Some(nd) = (2..n).find(|&d| !n.is_multiple_of(d)) {
        c.push(nd);
    }
    if n >= 3 {
        // A random non-divisor as well.
        let nds: Vec<usize> = (2..n).filter(|&d| !n.is_multiple_of(d)).collect();
        if !nds.is_empty() {
            c.push(nds[rng.random_range(0..nds.len())]);
        }
    }
    c.sort_unstable();
    c.dedup();
    c
}

/// A vocabulary-shard layout: shard widths summing to `V_total` (padding
/// included), uneven, with empty shards, and optionally one shard whose
/// columns are all masked out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardLayout {
    /// Width of each shard (0 allowed).
    pub widths: Vec<usize>,
    /// The shard to mask out entirely (when the problem has a mask).
    pub masked_shard: Option<usize>,
}

impl ShardLayout {
    /// Column range of shard `k`.
    pub fn range(&self, k: usize) -> Range<usize> {
        let start: usize = self.widths[..k].iter().sum();
        start..start + self.widths[k]
    }

    /// A layout of `count` shards over `v_total` columns from `seed`: random
    /// cut points (duplicates give empty shards; an extra empty shard at an
    /// end with probability 1/4), and a masked shard index when `mask`.
    pub fn generate(seed: u64, count: usize, v_total: usize, mask: bool) -> Self {
        let mut rng = rng_for(seed, 0x5BA2D);
        let count = count.max(1);
        let mut cuts: Vec<usize> = (0..count - 1)
            .map(|_| rng.random_range(0..=v_total))
            .collect();
        cuts.sort_unstable();
        let mut widths = Vec::with_capacity(count + 1);
        let mut prev = 0;
        for c in cuts {
            widths.push(c - prev);
            prev = c;
        }
        widths.push(v_total - prev);
        if rng.random_bool(0.25) {
            if rng.random_bool(0.5) {
                widths.insert(0, 0);
            } else {
                widths.push(0);
            }
        }
        let masked_shard = (mask && widths.len() > 1).then(|| rng.random_range(0..widths.len()));
        ShardLayout {
            widths,
            masked_shard,
        }
    }
}

/// Even split of `v_total` columns into `count` shards (the last takes the
/// remainder), as tensor parallelism does with a padded vocabulary.
pub fn even_shards(v_total: usize, count: usize) -> Vec<usize> {
    let count = count.max(1);
    let w = v_total.div_ceil(count);
    (0..count)
        .map(|k| w.min(v_total.saturating_sub(k * w)))
        .collect()
}

/// One kind of bad input, planted into a valid problem by [`BadInput::apply`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BadInput {
    /// A NaN logit in the real vocabulary.
    NanLogit,
    /// A `+inf` logit in the real vocabulary.
    PosInfLogit,
    /// A token `>= V`.
    TokenOutOfRange,
    /// A negative token that is not `ignore_index`.
    NegativeToken,
    /// A token the sampling mask disallows.
    TokenMasked,
    /// A token whose logit is `-inf`.
    TokenNegInf,
    /// A row whose logits are all `-inf`.
    AllNegInf,
    /// A row the sampling mask disallows entirely.
    AllMasked,
    /// A top-k id `>= V`.
    TopkIdOutOfRange,
    /// A temperature that is not finite and positive after rounding to f32
    /// (0, -1, NaN, inf, 1e-50).
    Temperature(f64),
    /// `tokens` of length `N + 1`.
    TokensShape,
    /// `sampling_mask` of shape `[N, V_total + 1]`.
    MaskShape,
    /// `topk_ids` with `N + 1` rows.
    TopkShape,
    /// `vocab_size = V_total + 1`.
    VocabSizeTooLarge,
    /// Backward without any cotangent.
    NoCotangent,
    /// A NaN or infinite cotangent.
    NonFiniteCotangent,
    /// A log-prob cotangent of length `N + 1`.
    CotangentShape,
    /// An entropy cotangent while the entropy is not computed.
    EntropyCotangentWithoutEntropy,
}

impl BadInput {
    /// Plants the bad input into `data` / `cot` at row `row` (< N) and
    /// column choice `col` (any value; reduced modulo `V`). Tensors the
    /// corruption needs (tokens, a mask, ids, a log-prob cotangent) are
    /// added when missing.
    pub fn apply(self, data: &mut ProblemData, cot: &mut CotangentData, row: usize, col: usize) {
        let (n, v, vt) = (data.n(), data.vocab_size(), data.v_total());
        let row = row % n.max(1);
        let col = col % v.max(1);
        let set = |data: &mut ProblemData, r: usize, c: usize, x: f64| {
            let mut a = data.logits.to_f64();
            a[[r, c]] = x;
            data.logits = OwnedLogits::from_f64(data.logits.dtype(), &a);
        };
        let tokens = |data: &mut ProblemData| {
            if data.tokens.is_none() {
                data.tokens = Some(Array1::from_elem(n, data.options.ignore_index));
            }
        };
        let target = |data: &ProblemData| -> usize {
            let t = data.tokens.as_ref().map_or(-1, |t| t[row]);
            if t >= 0 && (t as usize) < v {
                t as usize
            } else {
                col
            }
        };
        match self {
            BadInput::NanLogit if n > 0 => set(data, row, col, f64::NAN),
            BadInput::PosInfLogit if n > 0 => set(data, row, col, f64::INFINITY),
            BadInput::TokenOutOfRange if n > 0 => {
                tokens(data);
                data.tokens.as_mut().unwrap()[row] = (v + col) as i64;
            }
            BadInput::NegativeToken if n > 0 => {
                tokens(data);
                let t = if data.options.ignore_index == -7 {
                    -8
                } else {
                    -7
                };
                data.tokens.as_mut().unwrap()[row] = t;
            }
            BadInput::TokenMasked if n > 0 => {
                tokens(data);
                let t = target(data);
                data.tokens.as_mut().unwrap()[row] = t as i64;
                let m = data
                    .sampling_mask
                    .get_or_insert_with(|| Array2::from_elem((n, vt), true));
                m[[row, t]] = false;
            }
            BadInput::TokenNegInf if n > 0 => {
                tokens(data);
                let t = target(data);
                data.tokens.as_mut().unwrap()[row] = t as i64;
                set(data, row, t, f64::NEG_INFINITY);
            }
            BadInput::AllNegInf if n > 0 => {
                let mut a = data.logits.to_f64();
                a.row_mut(row)
                    .slice_mut(ndarray::s![..v])
                    .fill(f64::NEG_INFINITY);
                data.logits = OwnedLogits::from_f64(data.logits.dtype(), &a);
            }
            BadInput::AllMasked if n > 0 => {
                let m = data
                    .sampling_mask
                    .get_or_insert_with(|| Array2::from_elem((n, vt), true));
                m.row_mut(row).fill(false);
            }
            BadInput::TopkIdOutOfRange if n > 0 => {
                let ids = data.topk_ids.get_or_insert_with(|| Array2::zeros((n, 1)));
                let k = col % ids.ncols().max(1);
                ids[[row, k]] = (v + col) as i64;
            }
            BadInput::Temperature(t) => data.options.temperature = t,
            BadInput::TokensShape => {
                tokens(data);
                let mut t = data.tokens.take().unwrap().to_vec();
                t.push(0);
                data.tokens = Some(Array1::from(t));
            }
            BadInput::MaskShape => data.sampling_mask = Some(Array2::from_elem((n, vt + 1), true)),
            BadInput::TopkShape => data.topk_ids = Some(Array2::zeros((n + 1, 1))),
            BadInput::VocabSizeTooLarge => data.options.vocab_size = Some(vt + 1),
            BadInput::NoCotangent => *cot = CotangentData::default(),
            BadInput::NonFiniteCotangent if n > 0 => {
                tokens(data);
                let g = cot.grad_log_probs.get_or_insert_with(|| Array1::zeros(n));
                g[row] = if col.is_multiple_of(2) {
                    f64::NAN
                } else {
                    f64::INFINITY
                };
            }
            BadInput::CotangentShape => {
                tokens(data);
                cot.grad_log_probs = Some(Array1::zeros(n + 1));
            }
            BadInput::EntropyCotangentWithoutEntropy => {
                data.options.entropy = None;
                cot.grad_entropy = Some(Array1::zeros(n));
            }
            // Row-level corruptions of an empty problem: nothing to plant.
            _ => {}
        }
    }

    /// Whether only the backward sees this bad input (it corrupts cotangents).
    pub fn backward_only(self) -> bool {
        matches!(
            self,
            BadInput::NoCotangent
                | BadInput::NonFiniteCotangent
                | BadInput::CotangentShape
                | BadInput::EntropyCotangentWithoutEntropy
        )
    }
}

/// Every kind of bad input.
pub fn bad_input() -> impl Strategy<Value = BadInput> {
    prop_oneof![
        Just(BadInput::NanLogit),
        Just(BadInput::PosInfLogit),
        Just(BadInput::TokenOutOfRange),
        Just(BadInput::NegativeToken),
        Just(BadInput::TokenMasked),
        Just(BadInput::TokenNegInf),
        Just(BadInput::AllNegInf),
        Just(BadInput::AllMasked),
        Just(BadInput::TopkIdOutOfRange),
        select(vec![0.0, -1.0, f64::NAN, f64::INFINITY, 1e-50]).prop_map(BadInput::Temperature),
        Just(BadInput::TokensShape),
        Just(BadInput::MaskShape),
        Just(BadInput::TopkShape),
        Just(BadInput::VocabSizeTooLarge),
        Just(BadInput::NoCotangent),
        Just(BadInput::NonFiniteCotangent),
        Just(BadInput::CotangentShape),
        Just(BadInput::EntropyCotangentWithoutEntropy),
    ]
}

/// Recipes of edge rows: all-equal rows, ties, one finite logit, `-inf`
/// entries, near-one-hot rows and subnormals, at zero, large and extreme
/// offsets, `N` from 0 (with `V` up to 256000: nothing V-sized may be
/// built) and `V` from 1.
pub fn edge_recipe() -> BoxedStrategy<ProblemRecipe> {
    let space = RecipeSpace {
        dtypes: vec![Dtype::F32, Dtype::Bf16, Dtype::F16],
        real_vocab_weight: 0,
        max_small_vocab: 64,
        max_rows: 5,
        ..RecipeSpace::default()
    };
    let kinds = select(vec![
        RowKind::AllEqual,
        RowKind::Ties { levels: 1 },
        RowKind::Ties { levels: 2 },
        RowKind::OneFinite,
        RowKind::NegInf { rate: 0.5 },
        RowKind::NegInf { rate: 0.95 },
        RowKind::OneHotish { gap: 200.0 },
        RowKind::Subnormals,
        RowKind::Mixed,
    ]);
    let offsets = prop_oneof![
        2 => Just(Offset::Zero),
        2 => any::<bool>().prop_map(|negative| Offset::Extreme { negative }),
        1 => Just(Offset::Value(1.0e4)),
    ];
    let empty = prop_oneof![6 => Just(None), 1 => select(vec![1usize, 7, 256000]).prop_map(Some)];
    (problem_recipe(space), kinds, offsets, empty, 1usize..=3)
        .prop_map(|(mut r, kind, offset, empty, v_small)| {
            r.kind = kind;
            r.offset = offset;
            match empty {
                Some(v) => {
                    r.n = 0;
                    r.vocab_size = v;
                }
                None if r.vocab_size > 16 => r.vocab_size = v_small,
                None => {}
            }
            r
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_exact_in_their_dtype() {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for (k, kind) in [
                RowKind::LlmLike { entropy: 3.0 },
                RowKind::WideGaussian { sigma: 20.0 },
                RowKind::Subnormals,
                RowKind::Mixed,
            ]
            .into_iter()
            .enumerate()
            {
                for off in [
                    Offset::Zero,
                    Offset::Value(1234.5),
                    Offset::Extreme { negative: false },
                    Offset::Extreme { negative: true },
                ] {
                    let mut rng = rng_for(k as u64, 7);
                    let row = row_values(&mut rng, 300, dtype, kind, off);
                    for &x in &row {
                        assert!(
                            x == f64::NEG_INFINITY || (x.is_finite() && dtype.round_f64(x) == x),
                            "{dtype} {kind:?} {off:?} {x}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn llm_like_rows_hit_their_entropy() {
        for target in [0.1, 1.0, 2.5, 4.9] {
            let mut rng = rng_for(3, 3);
            let d = llm_like_shape(&mut rng, 32000, target);
            let h = entropy_f64(&d, 1.0);
            assert!((h - target).abs() < 1e-3, "{target} {h}");
        }
    }

    #[test]
    fn expansion_is_deterministic_and_valid() {
        let mut r = ProblemRecipe::plain(9, 7, 50);
        r.mask_rate = Some(0.9);
        r.padding = 3;
        r.topk = 2;
        r.ignore_rate = 0.25;
        r.kind = RowKind::Mixed;
        let a = r.expand();
        let b = r.expand();
        assert!(a.logits.bits_eq(&b.logits));
        assert_eq!(a.tokens, b.tokens);
        a.problem().validate().unwrap();
    }

    #[test]
    fn chunk_sizes_cover_the_cases() {
        let c = chunk_sizes(10, 1);
        assert!(c.contains(&1) && c.contains(&10) && c.iter().any(|&x| x > 10) && c.contains(&3));
        assert_eq!(chunk_sizes(0, 1)[0], 1);
    }

    #[test]
    fn shard_layouts_sum_to_v_total() {
        for s in 0..50 {
            let l = ShardLayout::generate(s, 1 + (s as usize % 6), 37, true);
            assert_eq!(l.widths.iter().sum::<usize>(), 37);
        }
        assert_eq!(even_shards(10, 4), vec![3, 3, 3, 1]);
    }
}
