//! The proptest strategies: thin wrappers drawing recipes from a
//! [`RecipeSpace`] (proptest shrinks the recipe, never a vector).

use proptest::prelude::*;
use proptest::sample::select;

use logprobe_reference::spec::{
    Dtype, EntropyLogits, SoftcapDtype, TemperatureDtype, DEFAULT_IGNORE_INDEX,
};

use super::*;

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

/// Entries (`N * V_total`) up to which a case may carry a softcap: the
/// exact softcap runs on the oracle's MPFR tier (its tanh enclosures: about 40
/// us an entry in `verify`, 4 x 8192 softcapped bf16 rows in 1.3 s).
pub const SOFTCAP_MAX_ENTRIES: usize = 1 << 15;

/// The softcap of a recipe, derived from its seed so that drawing it takes
/// nothing from the strategy's random stream (every other knob draws as
/// before): 1 case in 8 where temperatures are drawn, `c` 30 or 50
/// (Gemma 2's final-logit and attention caps), materialised in the input
/// dtype 1 time in 3 (always with `TemperatureDtype::Input`: a model that
/// materialised `z` materialised `x'` too), small enough cases only
/// ([`SOFTCAP_MAX_ENTRIES`]).
pub fn softcap_of(
    seed: u64,
    entries: usize,
    temperature_dtype: TemperatureDtype,
) -> (Option<f64>, SoftcapDtype) {
    let h = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    let c = match h % 16 {
        3 => Some(30.0),
        11 => Some(50.0),
        _ => None,
    };
    let c = c.filter(|_| entries <= SOFTCAP_MAX_ENTRIES);
    let dtype = if temperature_dtype == TemperatureDtype::Input || (h >> 8) % 3 == 0 {
        SoftcapDtype::Input
    } else {
        SoftcapDtype::Accumulation
    };
    (c, dtype)
}

/// Problem recipes over `space`.
pub fn problem_recipe(space: RecipeSpace) -> BoxedStrategy<ProblemRecipe> {
    let temps = space.temperatures;
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
            move |(
                (seed, (v, n), dtype, kind, offset, mask_rate, (temperature, temperature_dtype)),
                (padding, pad_fill, tokens, ignore_rate, ignore_index, topk, topk_true, entropy),
            )| {
                let (softcap, softcap_dtype) = if temps {
                    softcap_of(seed, n * (v + padding), temperature_dtype)
                } else {
                    (None, SoftcapDtype::Accumulation)
                };
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
                    softcap,
                    softcap_dtype,
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
