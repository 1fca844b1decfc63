//! The recipe spaces in plain Rust: what a case may be ([`RecipeSpace`],
//! [`EdgeSpace`], [`CotangentSpace`]), how one is drawn from the
//! workspace's one RNG ([`SplitMix64`]) and its shrink steps
//! ([`Recipes`]). The proptest strategies ([`super::space`]) are a thin
//! wrapper: proptest only picks the seed of the draw.

use std::fmt;

use logprobe_reference::spec::{
    Dtype, EntropyLogits, SoftcapDtype, TemperatureDtype, DEFAULT_IGNORE_INDEX,
};
use logprobe_reference::splitmix::SplitMix64;

use super::*;

/// A space of recipes: a sampler and shrink steps, both plain Rust.
pub trait Recipes: Clone + fmt::Debug + Send + Sync + 'static {
    /// What is drawn.
    type Recipe: Clone + fmt::Debug + PartialEq + 'static;

    /// One recipe drawn from `rng`.
    fn sample(&self, rng: &mut SplitMix64) -> Self::Recipe;

    /// The recipes one step simpler than `r` (smaller or plainer in one
    /// knob), most worthwhile first; empty when `r` is as simple as the
    /// space allows. Every step is a valid recipe, never `r` itself, and
    /// never larger in `N`, `V` or any other size.
    fn shrink(&self, r: &Self::Recipe) -> Vec<Self::Recipe>;
}

/// Which parts of the recipe space a strategy draws from.
#[derive(Clone, Debug, PartialEq)]
pub struct RecipeSpace {
    /// Logit dtypes, drawn uniformly (shrinks towards the first).
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

/// An index drawn with probability proportional to `weights[i]` (at least
/// one weight non-zero).
pub(crate) fn weighted(rng: &mut SplitMix64, weights: &[u32]) -> usize {
    let total: u64 = weights.iter().map(|&w| w as u64).sum();
    let mut u = rng.next_u64() % total.max(1);
    for (i, &w) in weights.iter().enumerate() {
        if u < w as u64 {
            return i;
        }
        u -= w as u64;
    }
    weights.len() - 1
}

/// One of `xs`, uniformly.
fn one_of<T: Copy>(rng: &mut SplitMix64, xs: &[T]) -> T {
    xs[rng.below(xs.len())]
}

/// Row kinds, weighted towards LLM-like and mixed rows.
pub fn sample_row_kind(rng: &mut SplitMix64) -> RowKind {
    match weighted(rng, &[4, 3, 2, 1, 1, 1, 1, 1, 1]) {
        0 => RowKind::LlmLike {
            entropy: rng.uniform_in(0.0, 5.0),
        },
        1 => RowKind::Mixed,
        2 => RowKind::WideGaussian {
            sigma: rng.uniform_in(0.5, 60.0),
        },
        3 => RowKind::AllEqual,
        4 => RowKind::Ties {
            levels: int_in(rng, 1, 4) as u8,
        },
        5 => RowKind::OneHotish {
            gap: rng.uniform_in(5.0, 100.0),
        },
        6 => RowKind::NegInf {
            rate: rng.uniform_in(0.05, 0.95),
        },
        7 => RowKind::OneFinite,
        _ => RowKind::Subnormals,
    }
}

/// Offsets: mostly none or moderate, sometimes (when `large`) large
/// (`1e3..1e6`, either sign) or the dtype's extreme.
pub fn sample_offset(rng: &mut SplitMix64, large: bool) -> Offset {
    let weights: &[u32] = if large { &[6, 3, 2, 1] } else { &[3, 1] };
    match weighted(rng, weights) {
        0 => Offset::Zero,
        1 => Offset::Value(rng.uniform_in(-60.0, 60.0)),
        2 => {
            let sign = if rng.chance(0.5) { -1.0 } else { 1.0 };
            Offset::Value(sign * 10f64.powf(rng.uniform_in(3.0, 6.0)))
        }
        _ => Offset::Extreme {
            negative: rng.chance(0.5),
        },
    }
}

impl RecipeSpace {
    /// `(V, N)`: small `V` (1-16) and medium `V` (up to `max_small_vocab`)
    /// with `N` up to `max_rows` (8 for medium), or a real vocabulary size
    /// with `N` in 1..=2.
    pub fn sample_vocab_and_rows(&self, rng: &mut SplitMix64) -> (usize, usize) {
        let rows = self.max_rows;
        let mid = self.max_small_vocab.max(17);
        match weighted(rng, &[12, 8, self.real_vocab_weight]) {
            0 => (int_in(rng, 1, 16), int_in(rng, 0, rows)),
            1 => (int_in(rng, 17, mid), int_in(rng, 0, rows.min(8))),
            _ => (one_of(rng, &REAL_VOCAB_SIZES), int_in(rng, 1, 2)),
        }
    }
}

/// Masked entropy only means something with a mask.
fn settle(r: &mut ProblemRecipe) {
    if r.entropy == Some(EntropyLogits::Masked) && r.mask_rate.is_none() {
        r.entropy = Some(EntropyLogits::Unmasked);
    }
}

/// `x` halfway towards `low`, when that is still a step worth taking
/// (more than 1% of `scale` away).
fn halfway(x: f64, low: f64, scale: f64) -> Option<f64> {
    ((x - low).abs() > 0.01 * scale).then_some(low + 0.5 * (x - low))
}

/// Smaller sizes: `low`, `x / 2`, `x - 1` (those in `low..x`).
fn smaller(x: usize, low: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for c in [low, x / 2, x.saturating_sub(1)] {
        if c >= low && c < x && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Smaller seeds: 0, then half.
fn smaller_seed(s: u64) -> Vec<u64> {
    match s {
        0 => vec![],
        1 => vec![0],
        _ => vec![0, s / 2],
    }
}

/// Plainer row kinds: the kind's parameter towards its low end, then
/// LLM-like at 0 nats.
fn plainer_kind(kind: RowKind) -> Vec<RowKind> {
    let mut out = Vec::new();
    match kind {
        RowKind::LlmLike { entropy } => {
            if entropy != 0.0 {
                out.push(RowKind::LlmLike { entropy: 0.0 });
            }
            if let Some(e) = halfway(entropy, 0.0, 5.0) {
                out.push(RowKind::LlmLike { entropy: e });
            }
            return out;
        }
        RowKind::WideGaussian { sigma } => {
            out.push(RowKind::WideGaussian { sigma: 0.5 });
            if let Some(s) = halfway(sigma, 0.5, 60.0) {
                out.push(RowKind::WideGaussian { sigma: s });
            }
        }
        RowKind::Ties { levels } if levels > 1 => out.push(RowKind::Ties { levels: 1 }),
        RowKind::OneHotish { gap } => {
            out.push(RowKind::OneHotish { gap: 5.0 });
            if let Some(g) = halfway(gap, 5.0, 100.0) {
                out.push(RowKind::OneHotish { gap: g });
            }
        }
        RowKind::NegInf { rate } => {
            out.push(RowKind::NegInf { rate: 0.05 });
            if let Some(r) = halfway(rate, 0.05, 1.0) {
                out.push(RowKind::NegInf { rate: r });
            }
        }
        _ => {}
    }
    out.retain(|&k| k != kind);
    out.insert(0, RowKind::LlmLike { entropy: 0.0 });
    out
}

/// Plainer offsets: none, then half the value.
fn plainer_offset(offset: Offset) -> Vec<Offset> {
    match offset {
        Offset::Zero => vec![],
        Offset::Value(v) => {
            let mut out = vec![Offset::Zero];
            if v.abs() > 1.0 {
                out.push(Offset::Value(v / 2.0));
            }
            out
        }
        Offset::Extreme { .. } => vec![Offset::Zero],
    }
}

/// The shrink steps of `r` with the dtype shrinking towards `first_dtype`
/// and the kinds from `kinds` (see [`Recipes::shrink`]): sizes first (rows,
/// vocabulary, padding, top-k width), then each knob towards its plainest
/// value, the seeds last.
fn shrink_recipe(
    r: &ProblemRecipe,
    first_dtype: Dtype,
    kinds: impl Fn(RowKind) -> Vec<RowKind>,
) -> Vec<ProblemRecipe> {
    let mut out: Vec<ProblemRecipe> = Vec::new();
    let mut push = |f: &dyn Fn(&mut ProblemRecipe)| {
        let mut c = r.clone();
        f(&mut c);
        settle(&mut c);
        if c != *r && !out.contains(&c) {
            out.push(c);
        }
    };
    for n in smaller(r.n, 0) {
        push(&|c| c.n = n);
    }
    for v in smaller(r.vocab_size, 1) {
        push(&|c| c.vocab_size = v);
    }
    for p in smaller(r.padding, 0) {
        push(&|c| c.padding = p);
    }
    for k in smaller(r.topk, 0) {
        push(&|c| c.topk = k);
    }
    for kind in kinds(r.kind) {
        push(&|c| c.kind = kind);
    }
    for o in plainer_offset(r.offset) {
        push(&|c| c.offset = o);
    }
    if r.mask_rate.is_some() {
        push(&|c| c.mask_rate = None);
        push(&|c| c.mask_rate = Some(0.0));
    }
    push(&|c| c.dtype = first_dtype);
    push(&|c| c.temperature = 1.0);
    push(&|c| c.temperature_dtype = TemperatureDtype::Accumulation);
    push(&|c| c.pad_fill = PadFill::Large);
    push(&|c| c.tokens = true);
    push(&|c| c.ignore_rate = 0.0);
    push(&|c| c.ignore_index = DEFAULT_IGNORE_INDEX);
    push(&|c| c.topk_true = false);
    push(&|c| c.entropy = Some(EntropyLogits::Unmasked));
    push(&|c| c.softcap = None);
    // A softcap in the accumulation dtype needs the temperature there too.
    if r.temperature_dtype == TemperatureDtype::Accumulation {
        push(&|c| c.softcap_dtype = SoftcapDtype::Accumulation);
    }
    for s in smaller_seed(r.seed) {
        push(&|c| c.seed = s);
    }
    out
}

/// The softcap of a recipe, derived from its seed so that drawing it takes
/// nothing from the strategy's random stream (every other knob draws as
/// before): 1 case in 8 where temperatures are drawn, `c` 30 or 50
/// (Gemma 2's final-logit and attention caps), materialised in the input
/// dtype 1 time in 3 (always with `TemperatureDtype::Input`: a model that
/// materialised `z` materialised `x'` too), at every size, real
/// vocabularies included (the oracle's f64 tier encloses the exact softcap,
/// `oracle::fast` (F9); its VJP stays on MPFR).
pub fn softcap_of(seed: u64, temperature_dtype: TemperatureDtype) -> (Option<f64>, SoftcapDtype) {
    let h = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    let c = match h % 16 {
        3 => Some(30.0),
        11 => Some(50.0),
        _ => None,
    };
    let dtype = if temperature_dtype == TemperatureDtype::Input || (h >> 8).is_multiple_of(3) {
        SoftcapDtype::Input
    } else {
        SoftcapDtype::Accumulation
    };
    (c, dtype)
}

impl Recipes for RecipeSpace {
    type Recipe = ProblemRecipe;

    /// A recipe over the space: every knob drawn with the gate's weights
    /// (see the fields' docs).
    fn sample(&self, rng: &mut SplitMix64) -> ProblemRecipe {
        let seed = rng.next_u64();
        let (vocab_size, n) = self.sample_vocab_and_rows(rng);
        let dtype = one_of(rng, &self.dtypes);
        let kind = sample_row_kind(rng);
        let offset = sample_offset(rng, self.offsets);
        let mask_rate = (self.masks && weighted(rng, &[3, 1]) == 1)
            .then(|| one_of(rng, &[0.0, 0.1, 0.5, 0.9, 1.0]));
        let (temperature, temperature_dtype) = if self.temperatures {
            let t = if weighted(rng, &[4, 1]) == 0 {
                1.0
            } else {
                one_of(rng, &[0.5, 2.0, 0.7, 1.3, 0.6])
            };
            let td = if weighted(rng, &[3, 1]) == 0 {
                TemperatureDtype::Accumulation
            } else {
                TemperatureDtype::Input
            };
            (t, td)
        } else {
            (1.0, TemperatureDtype::Accumulation)
        };
        let padding = if self.padding && weighted(rng, &[3, 1]) == 1 {
            int_in(rng, 1, 70)
        } else {
            0
        };
        let pad_fill = if weighted(rng, &[3, 1]) == 0 {
            PadFill::Large
        } else {
            PadFill::Nan
        };
        let tokens = weighted(rng, &[6, 1]) == 0;
        let ignore_rate = if weighted(rng, &[3, 1]) == 0 {
            0.0
        } else {
            one_of(rng, &[0.25, 1.0])
        };
        let ignore_index = if weighted(rng, &[3, 1]) == 0 {
            DEFAULT_IGNORE_INDEX
        } else {
            -1
        };
        let topk = if self.topk && weighted(rng, &[2, 1]) == 1 {
            int_in(rng, 1, 5)
        } else {
            0
        };
        let topk_true = rng.chance(0.5);
        let entropy = match weighted(rng, &[4, 1, 1]) {
            0 => Some(EntropyLogits::Unmasked),
            1 => Some(EntropyLogits::Masked),
            _ => None,
        };
        let mut r = ProblemRecipe {
            seed,
            n,
            vocab_size,
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
            entropy,
            softcap: None,
            softcap_dtype: SoftcapDtype::Accumulation,
        };
        settle(&mut r);
        if self.temperatures {
            (r.softcap, r.softcap_dtype) = softcap_of(r.seed, r.temperature_dtype);
        }
        r
    }

    fn shrink(&self, r: &ProblemRecipe) -> Vec<ProblemRecipe> {
        shrink_recipe(
            r,
            self.dtypes.first().copied().unwrap_or(r.dtype),
            plainer_kind,
        )
    }
}

/// The row kinds of the edge space, plainest first.
const EDGE_KINDS: [RowKind; 9] = [
    RowKind::AllEqual,
    RowKind::Ties { levels: 1 },
    RowKind::Ties { levels: 2 },
    RowKind::OneFinite,
    RowKind::NegInf { rate: 0.5 },
    RowKind::NegInf { rate: 0.95 },
    RowKind::OneHotish { gap: 200.0 },
    RowKind::Subnormals,
    RowKind::Mixed,
];

/// Edge rows: all-equal rows, ties, one finite logit, `-inf` entries,
/// near-one-hot rows and subnormals, at zero, large and extreme offsets,
/// `N` from 0 (with `V` up to 256000: nothing V-sized may be built) and
/// `V` from 1; f32, bf16 and f16.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeSpace {
    /// The space of the other knobs.
    pub base: RecipeSpace,
}

impl Default for EdgeSpace {
    fn default() -> Self {
        EdgeSpace {
            base: RecipeSpace {
                dtypes: vec![Dtype::F32, Dtype::Bf16, Dtype::F16],
                real_vocab_weight: 0,
                max_small_vocab: 64,
                max_rows: 5,
                ..RecipeSpace::default()
            },
        }
    }
}

impl Recipes for EdgeSpace {
    type Recipe = ProblemRecipe;

    /// A recipe of the base space with an edge kind and offset; `N = 0`
    /// with `V` in {1, 7, 256000} at weight 1/7, else `V <= 16`.
    fn sample(&self, rng: &mut SplitMix64) -> ProblemRecipe {
        let mut r = self.base.sample(rng);
        r.kind = one_of(rng, &EDGE_KINDS);
        r.offset = match weighted(rng, &[2, 2, 1]) {
            0 => Offset::Zero,
            1 => Offset::Extreme {
                negative: rng.chance(0.5),
            },
            _ => Offset::Value(1.0e4),
        };
        let v_small = int_in(rng, 1, 3);
        if weighted(rng, &[6, 1]) == 1 {
            r.n = 0;
            r.vocab_size = one_of(rng, &[1, 7, 256000]);
        } else if r.vocab_size > 16 {
            r.vocab_size = v_small;
        }
        r
    }

    /// As [`RecipeSpace`]'s, with kinds shrinking towards the edge kinds
    /// listed before them (an edge case stays an edge case).
    fn shrink(&self, r: &ProblemRecipe) -> Vec<ProblemRecipe> {
        let first = self.base.dtypes.first().copied().unwrap_or(r.dtype);
        shrink_recipe(r, first, |kind| {
            let at = EDGE_KINDS
                .iter()
                .position(|&k| k == kind)
                .unwrap_or(EDGE_KINDS.len());
            EDGE_KINDS[..at].to_vec()
        })
    }
}

/// Cotangent recipes: each output's cotangent present with probability 3/4,
/// the loss side's ([`CotangentRecipe::loss`]) and the policy terms'
/// ([`CotangentRecipe::policy`]) and the top-k KL's
/// ([`CotangentRecipe::kl`]) each with probability 1/2.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CotangentSpace;

impl Recipes for CotangentSpace {
    type Recipe = CotangentRecipe;

    fn sample(&self, rng: &mut SplitMix64) -> CotangentRecipe {
        CotangentRecipe {
            seed: rng.next_u64(),
            log_probs: rng.chance(0.75),
            entropy: rng.chance(0.75),
            topk: rng.chance(0.75),
            // Drawn last: the other fields' draws are unchanged.
            loss: rng.chance(0.5),
            policy: rng.chance(0.5),
            kl: rng.chance(0.5),
        }
    }

    /// Each cotangent switched off (the expansion still gives the first
    /// available one), then the seed towards 0.
    fn shrink(&self, r: &CotangentRecipe) -> Vec<CotangentRecipe> {
        let mut out = Vec::new();
        for c in [
            CotangentRecipe {
                log_probs: false,
                ..*r
            },
            CotangentRecipe {
                entropy: false,
                ..*r
            },
            CotangentRecipe { topk: false, ..*r },
            CotangentRecipe { loss: false, ..*r },
            CotangentRecipe {
                policy: false,
                ..*r
            },
            CotangentRecipe { kl: false, ..*r },
        ] {
            if c != *r {
                out.push(c);
            }
        }
        for s in smaller_seed(r.seed) {
            out.push(CotangentRecipe { seed: s, ..*r });
        }
        out
    }
}
