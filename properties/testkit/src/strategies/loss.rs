//! The cross-entropy `loss` recipe ([`LossRecipe`]: reduction, label
//! smoothing, `mean_all_ignored`, optional `loss_weights`) drawn beside a
//! problem recipe, and its expansion ([`LossData`]).

use ndarray::Array1;
use proptest::prelude::*;

use logprobe_reference::spec::{CrossEntropy, LossOptions, MeanAllIgnored, Reduction};
use logprobe_reference::splitmix::SplitMix64;

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
        let reduction = REDUCTIONS[rng.below(3)];
        let label_smoothing = if rng.chance(0.5) {
            LABEL_SMOOTHING_EDGES[rng.below(LABEL_SMOOTHING_EDGES.len())]
        } else {
            rng.uniform()
        };
        let mean_all_ignored = if rng.chance(0.5) {
            MeanAllIgnored::Nan
        } else {
            MeanAllIgnored::Zero
        };
        let weights = match rng.below(6) {
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
                    if rng.chance(0.25) {
                        0.0
                    } else {
                        2.0 * rng.uniform()
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

/// The reductions, plainest first.
const REDUCTIONS: [Reduction; 3] = [Reduction::None, Reduction::Sum, Reduction::Mean];

/// Loss recipes: each reduction alike; `eps` 0 at weight 2, an edge value
/// ([`LABEL_SMOOTHING_EDGES`]) at 2, uniform in `[0, 1]` at 1;
/// `mean_all_ignored` either way; no weights at weight 3, each
/// [`LossWeights`] kind at 1. Shrinks towards `none`, `eps = 0`, `nan`, no
/// weights and seed 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossSpace;

impl Recipes for LossSpace {
    type Recipe = LossRecipe;

    fn sample(&self, rng: &mut SplitMix64) -> LossRecipe {
        let seed = rng.next_u64();
        let reduction = REDUCTIONS[rng.below(3)];
        let label_smoothing = match weighted(rng, &[2, 2, 1]) {
            0 => 0.0,
            1 => LABEL_SMOOTHING_EDGES[rng.below(LABEL_SMOOTHING_EDGES.len())],
            // Uniform in [0, 1]: 1 itself is an edge value.
            _ => rng.uniform(),
        };
        let mean_all_ignored = if rng.chance(0.5) {
            MeanAllIgnored::Nan
        } else {
            MeanAllIgnored::Zero
        };
        let weights = match weighted(rng, &[3, 1, 1, 1]) {
            0 => None,
            1 => Some(LossWeights::WithZeros),
            2 => Some(LossWeights::Constant),
            _ => Some(LossWeights::AllZero),
        };
        LossRecipe {
            seed,
            reduction,
            label_smoothing,
            mean_all_ignored,
            weights,
        }
    }

    fn shrink(&self, r: &LossRecipe) -> Vec<LossRecipe> {
        let mut out: Vec<LossRecipe> = Vec::new();
        let mut push = |c: LossRecipe| {
            if c != *r && !out.contains(&c) {
                out.push(c);
            }
        };
        push(LossRecipe {
            reduction: Reduction::None,
            ..r.clone()
        });
        push(LossRecipe {
            label_smoothing: 0.0,
            ..r.clone()
        });
        push(LossRecipe {
            mean_all_ignored: MeanAllIgnored::Nan,
            ..r.clone()
        });
        push(LossRecipe {
            weights: None,
            ..r.clone()
        });
        for seed in [0, r.seed / 2] {
            push(LossRecipe { seed, ..r.clone() });
        }
        out
    }
}

/// Loss recipes ([`LossSpace`]).
pub fn loss_recipe() -> BoxedStrategy<LossRecipe> {
    Drawn(LossSpace).boxed()
}
