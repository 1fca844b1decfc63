//! The cross-entropy `loss` recipe ([`LossRecipe`]: reduction, label
//! smoothing, `mean_all_ignored`, optional `loss_weights`) drawn beside a
//! problem recipe, and its expansion ([`LossData`]).

use ndarray::Array1;
use proptest::prelude::*;
use proptest::sample::select;

use logprobe_reference::spec::{CrossEntropy, LossOptions, MeanAllIgnored, Reduction};

use super::*;

/// Label smoothing values at the edges: 0 and 1, the smallest normal f32
/// above 0 (`2^-126`, it rounds to itself), `1 - 2^-24` (the f32 below 1),
/// a value that f32 does not hold (0.1) and PyTorch's usual 0.1 / 0.2.
pub const LABEL_SMOOTHING_EDGES: [f64; 6] = [
    0.0,
    1.0,
    1.1754943508222875e-38,
    0.999_999_940_395_355_2,
    0.1,
    0.2,
];

/// How the per-row `loss_weights` are drawn (names in the fuzz grammar:
/// [`LossWeights::name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossWeights {
    /// Uniform in `[0, 2)`, each exactly 0 with probability 1/4.
    WithZeros,
    /// Every weight 0 (the `mean` divisor is 0: the declared value).
    AllZero,
    /// Every weight the same value `0.3` (not a power of two).
    Constant,
}

impl LossWeights {
    /// Every kind.
    pub const ALL: [LossWeights; 3] = [
        LossWeights::WithZeros,
        LossWeights::AllZero,
        LossWeights::Constant,
    ];

    /// The name: `zeros`, `allzero`, `constant`.
    pub fn name(self) -> &'static str {
        match self {
            LossWeights::WithZeros => "zeros",
            LossWeights::AllZero => "allzero",
            LossWeights::Constant => "constant",
        }
    }
}

/// A cross-entropy `loss` recipe (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct LossRecipe {
    /// Seed of the weights.
    pub seed: u64,
    /// The reduction.
    pub reduction: Reduction,
    /// Label smoothing `eps` in `[0, 1]`.
    pub label_smoothing: f64,
    /// The `mean` of zero rows.
    pub mean_all_ignored: MeanAllIgnored,
    /// Per-row weights (`None`: no `loss_weights`, every weight 1).
    pub weights: Option<LossWeights>,
}

/// A loss recipe built for `N` rows: its options and owned weights `[N]`.
#[derive(Clone, Debug, PartialEq)]
pub struct LossData {
    /// The reduction.
    pub reduction: Reduction,
    /// Label smoothing `eps`.
    pub label_smoothing: f64,
    /// The `mean` of zero rows.
    pub mean_all_ignored: MeanAllIgnored,
    /// `loss_weights [N]` (finite, `>= 0`), or none.
    pub loss_weights: Option<Array1<f64>>,
}

impl LossData {
    /// The options as [`Options::loss`](logprobe_reference::spec::Options::loss) holds them.
    pub fn options(&self) -> LossOptions {
        LossOptions {
            reduction: self.reduction,
            label_smoothing: self.label_smoothing,
            mean_all_ignored: self.mean_all_ignored,
        }
    }

    /// `data` with the loss asked of its forward calls (`options.loss` and
    /// `loss_weights` set).
    pub fn ask(&self, data: &mut ProblemData) {
        data.options.loss = Some(self.options());
        data.loss_weights = self.loss_weights.clone();
    }

    /// The borrowed [`CrossEntropy`].
    pub fn ce(&self) -> CrossEntropy<'_> {
        CrossEntropy {
            reduction: self.reduction,
            label_smoothing: self.label_smoothing,
            mean_all_ignored: self.mean_all_ignored,
            loss_weights: self.loss_weights.as_ref().map(|w| w.view()),
        }
    }
}

impl LossRecipe {
    /// The plain loss: `none`, no label smoothing, `mean_all_ignored = nan`,
    /// no weights.
    pub fn plain(seed: u64) -> LossRecipe {
        LossRecipe {
            seed,
            reduction: Reduction::None,
            label_smoothing: 0.0,
            mean_all_ignored: MeanAllIgnored::Nan,
            weights: None,
        }
    }

    /// A loss recipe derived from `seed` alone (no proptest draw: the
    /// chunk-invariance property judges the loss on its existing cases
    /// without changing their stream): every reduction, `eps` from
    /// [`LABEL_SMOOTHING_EDGES`] or uniform, weights half the time.
    pub fn from_seed(seed: u64) -> LossRecipe {
        let mut rng = rng_for(seed, 0x1055);
        let reduction = [Reduction::None, Reduction::Sum, Reduction::Mean][rng.random_range(0..3)];
        let label_smoothing = if rng.random_bool(0.5) {
            LABEL_SMOOTHING_EDGES[rng.random_range(0..LABEL_SMOOTHING_EDGES.len())]
        } else {
            rng.random::<f64>()
        };
        let mean_all_ignored = if rng.random_bool(0.5) {
            MeanAllIgnored::Nan
        } else {
            MeanAllIgnored::Zero
        };
        let weights = match rng.random_range(0..6u32) {
            0 => Some(LossWeights::WithZeros),
            1 => Some(LossWeights::Constant),
            2 => Some(LossWeights::AllZero),
            _ => None,
        };
        LossRecipe {
            seed,
            reduction,
            label_smoothing,
            mean_all_ignored,
            weights,
        }
    }

    /// Builds the options and weights for `n` rows (deterministic).
    pub fn expand(&self, n: usize) -> LossData {
        let loss_weights = self.weights.map(|kind| {
            let mut rng = rng_for(self.seed, 0x3e16);
            Array1::from_shape_fn(n, |_| match kind {
                LossWeights::AllZero => 0.0,
                LossWeights::Constant => 0.3,
                LossWeights::WithZeros => {
                    if rng.random_bool(0.25) {
                        0.0
                    } else {
                        2.0 * rng.random::<f64>()
                    }
                }
            })
        });
        LossData {
            reduction: self.reduction,
            label_smoothing: self.label_smoothing,
            mean_all_ignored: self.mean_all_ignored,
            loss_weights,
        }
    }
}

/// Loss recipes: each reduction alike; `eps` 0 at weight 2, an edge value
/// ([`LABEL_SMOOTHING_EDGES`]) at 2, uniform in `[0, 1]` at 1;
/// `mean_all_ignored` either way; no weights at weight 3, each
/// [`LossWeights`] kind at 1.
pub fn loss_recipe() -> impl Strategy<Value = LossRecipe> {
    (
        any::<u64>(),
        select(vec![Reduction::None, Reduction::Sum, Reduction::Mean]),
        prop_oneof![
            2 => Just(0.0),
            2 => select(LABEL_SMOOTHING_EDGES.to_vec()),
            1 => 0.0..=1.0f64,
        ],
        prop_oneof![Just(MeanAllIgnored::Nan), Just(MeanAllIgnored::Zero)],
        prop_oneof![
            3 => Just(None),
            1 => Just(Some(LossWeights::WithZeros)),
            1 => Just(Some(LossWeights::Constant)),
            1 => Just(Some(LossWeights::AllZero)),
        ],
    )
        .prop_map(
            |(seed, reduction, label_smoothing, mean_all_ignored, weights)| LossRecipe {
                seed,
                reduction,
                label_smoothing,
                mean_all_ignored,
                weights,
            },
        )
}
