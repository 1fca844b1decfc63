//! The problem recipe: a seed and a handful of knobs ([`ProblemRecipe`],
//! [`RowKind`], [`Offset`], [`PadFill`]) and its deterministic expansion
//! into a problem ([`ProblemRecipe::expand`]).

use std::ops::Range;

use ndarray::{Array1, Array2};

use logprobe_reference::spec::{
    Dtype, EntropyLogits, Options, SoftcapDtype, TemperatureDtype, DEFAULT_IGNORE_INDEX,
};
use logprobe_reference::splitmix::SplitMix64;

use super::*;

/// Vocabulary sizes of real models: LLaMA-2 (32000), GPT-2 (50257), LLaMA-3
/// (128256), Qwen2 (151936), Qwen2.5 padded (152064), Gemma (256000).
pub const REAL_VOCAB_SIZES: [usize; 6] = [32000, 50257, 128256, 151936, 152064, 256000];

/// The z-loss coefficient of every generated case (PaLM's and Liger's
/// usual `1e-4`; not a power of two, so its rounding to the accumulation
/// dtype is exercised).
pub const Z_LOSS_COEF: f64 = 1e-4;

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
    /// Softcap `c` (`x' = c tanh(x / c)` before the temperature), if any.
    pub softcap: Option<f64>,
    /// How the softcap is materialised.
    pub softcap_dtype: SoftcapDtype,
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
            softcap: None,
            softcap_dtype: SoftcapDtype::Accumulation,
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
                        mrow[j] = !rng.chance(rate);
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
                    mrow[pool[rng.below(pool.len())]] = true;
                }
            }
            let allowed: Vec<usize> = finite
                .iter()
                .copied()
                .filter(|&j| mask.as_ref().is_none_or(|m| m[[i, j]]))
                .collect();
            // Target.
            let ignore = rng.chance(self.ignore_rate);
            tokens[i] = if ignore {
                self.ignore_index
            } else {
                match rng.below(3) {
                    0 => *allowed
                        .iter()
                        .max_by(|&&a, &&b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
                        .unwrap() as i64,
                    1 => sample_softmax(&mut rng, &row, &allowed) as i64,
                    _ => allowed[rng.below(allowed.len())] as i64,
                }
            };
            // Top-k ids.
            if self.topk > 0 {
                let chosen: Vec<usize> = if self.topk_true {
                    let mut order: Vec<usize> = (0..v).collect();
                    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                    (0..self.topk).map(|k| order[k % v]).collect()
                } else {
                    (0..self.topk).map(|_| rng.below(v)).collect()
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
        self.assemble(x, mask, tokens, ids, v, dtype)
    }

    /// The options, the drawn inputs that ride on the rows (policy
    /// terms, the teachers) and the [`ProblemData`] of
    /// [`ProblemRecipe::expand_with_masked_cols`], from its rows.
    fn assemble(
        &self,
        x: Array2<f64>,
        mask: Option<Array2<bool>>,
        tokens: Array1<i64>,
        ids: Array2<i64>,
        v: usize,
        dtype: Dtype,
    ) -> ProblemData {
        let options = Options {
            temperature: self.temperature,
            temperature_dtype: self.temperature_dtype,
            vocab_size: (self.padding > 0).then_some(v),
            ignore_index: self.ignore_index,
            entropy: self.entropy,
            // vLLM's token ranks ride on every case with tokens (issue 47),
            // judged wherever a kernel computes them.
            token_ranks: self.tokens,
            // The loss side rides on every case: lse and z_loss are judged
            // wherever a kernel supports them (`lse`, `z_loss` in Capabilities::outputs).
            lse: true,
            z_loss_coef: Some(Z_LOSS_COEF),
            softcap: self.softcap,
            softcap_dtype: self.softcap_dtype,
            // The cross-entropy loss is not drawn yet.
            loss: None,
            policy_clamps: Default::default(),
            topk_kl: None,
            teacher_form: Default::default(),
            accumulation: None,
        };
        // The policy terms ride on every case with tokens (issue 18).
        let (policy, policy_clamps) = if self.tokens {
            super::policy::draw(self.seed, &x, v, mask.as_ref(), &tokens, &options, dtype)
        } else {
            Default::default()
        };
        // The top-k KL rides on every case whose ids can carry it (distinct,
        // allowed): its teacher from a stream of its own (`teacher.rs`).
        let teacher = (self.topk > 0)
            .then(|| {
                let xr = x.slice(ndarray::s![.., ..v]).to_owned();
                let allowed = |i: usize, j: usize| mask.as_ref().is_none_or(|m| m[[i, j]]);
                draw_teacher(self.seed, &xr, allowed, &ids, dtype)
            })
            .flatten();
        let (teacher, topk_kl) = match teacher {
            Some((a, kl)) => (Some(a), Some(kl)),
            None => (None, None),
        };
        // The soft-target cross-entropy rides on one case in four, its
        // teacher from a stream of its own (`teacher.rs`).
        let drawn = draw_teacher_probs(self.seed, &x, v, |i, j| {
            mask.as_ref().is_none_or(|m| m[[i, j]])
        });
        let teacher_form = drawn.as_ref().map_or(Default::default(), |d| d.1);
        let teacher_probs = drawn.map(|d| d.0);
        ProblemData {
            logits: OwnedLogits::from_f64(dtype, &x),
            tokens: self.tokens.then_some(tokens),
            sampling_mask: mask,
            topk_ids: (self.topk > 0).then_some(ids),
            teacher_topk_log_probs: teacher,
            teacher_probs,
            loss_weights: None,
            policy,
            options: Options {
                policy_clamps,
                topk_kl,
                teacher_form,
                ..options
            },
        }
    }

    /// Oracle work of this recipe in vocabulary entries (`N * V_total`).
    pub fn entries(&self) -> usize {
        self.n * (self.vocab_size + self.padding)
    }
}

/// Draws an index from `allowed` with probability proportional to
/// `exp(row[j] - max)` (f64; generator only).
pub(crate) fn sample_softmax(rng: &mut SplitMix64, row: &[f64], allowed: &[usize]) -> usize {
    let m = allowed
        .iter()
        .map(|&j| row[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let total: f64 = allowed.iter().map(|&j| (row[j] - m).exp()).sum();
    let mut u = rng.uniform() * total;
    for &j in allowed {
        u -= (row[j] - m).exp();
        if u <= 0.0 {
            return j;
        }
    }
    allowed[allowed.len() - 1]
}
