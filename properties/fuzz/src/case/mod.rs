//! One fuzz case: the gate's problem recipe ([`ProblemRecipe`], from
//! `logprobe_testkit::strategies`) plus what the fuzzer varies around it
//! (cotangents, the chunk size, a vocabulary-shard layout, the output dtype
//! and an optional bad input), its text form in the options grammar
//! ([`FuzzCase::recipe`], [`FuzzCase::parse`]), the search space
//! ([`Space`], from `--dtype`, `--vocab`, `--options`) and the proptest
//! strategy over it ([`Space::strategy`]), whose value trees shrink the
//! recipe.
//!
//! Files: here the case and its expansion; `recipe_text` (the text form:
//! [`FuzzCase::recipe`], [`FuzzCase::parse`], the values of each key, the
//! bad-input names); `space` (the search space, its pins and strategy).

mod recipe_text;
mod space;

pub use recipe_text::{bad_inputs, bad_name};
pub use space::Space;

use logprobe_reference::spec::Dtype;
use logprobe_testkit::strategies::{
    BadInput, CotangentData, CotangentRecipe, LossData, LossRecipe, ProblemData, ProblemRecipe,
    ShardLayout,
};

/// The grammar keys spelt as the dump's metadata keys: one spelling, the
/// spec's ([`logprobe_reference::spec::meta_key`]), which the key table
/// ([`logprobe_verify::keys`]) is built from.
pub mod dump_key {
    use logprobe_reference::spec::meta_key as keys;

    /// `temperature`.
    pub const TEMPERATURE: &str = keys::TEMPERATURE;
    /// `temperature_dtype`.
    pub const TEMPERATURE_DTYPE: &str = keys::TEMPERATURE_DTYPE;
    /// `softcap`.
    pub const SOFTCAP: &str = keys::SOFTCAP;
    /// `softcap_dtype`.
    pub const SOFTCAP_DTYPE: &str = keys::SOFTCAP_DTYPE;
    /// `ignore_index`.
    pub const IGNORE_INDEX: &str = keys::IGNORE_INDEX;
    /// `reduction`.
    pub const REDUCTION: &str = keys::REDUCTION;
    /// `label_smoothing`.
    pub const LABEL_SMOOTHING: &str = keys::LABEL_SMOOTHING;
    /// `mean_all_ignored`.
    pub const MEAN_ALL_IGNORED: &str = keys::MEAN_ALL_IGNORED;
}

/// Every key of the grammar, in recipe order.
pub const KEYS: [&str; 30] = [
    "seed",
    "dtype",
    "vocab",
    "rows",
    "padding",
    "pad",
    "kind",
    "offset",
    "mask",
    dump_key::TEMPERATURE,
    dump_key::TEMPERATURE_DTYPE,
    dump_key::SOFTCAP,
    dump_key::SOFTCAP_DTYPE,
    "tokens",
    "ignore",
    dump_key::IGNORE_INDEX,
    "topk",
    "topk_ids",
    "entropy",
    dump_key::REDUCTION,
    dump_key::LABEL_SMOOTHING,
    dump_key::MEAN_ALL_IGNORED,
    "loss_weights",
    "chunk",
    "shards",
    "out",
    "grad",
    "grad_seed",
    "bad",
    "bad_at",
];

/// Largest `V` of the small/medium band the fuzzer draws (above it: the real
/// vocabulary sizes with `N <= 2`).
pub const MAX_MEDIUM_VOCAB: usize = 8192;

/// A fuzz case (see the module docs). Expanded deterministically.
#[derive(Clone, Debug, PartialEq)]
pub struct FuzzCase {
    /// The problem: logits `[N, V + padding]`, tokens, mask, ids, options.
    pub recipe: ProblemRecipe,
    /// The cotangents of the backward calls.
    pub cot: CotangentRecipe,
    /// The cross-entropy `loss` asked of the kernel (its weights drawn from
    /// the recipe's seed, whatever `loss.seed` holds).
    pub loss: LossRecipe,
    /// `chunk_size` of chunked kernels (>= 1); chunk-size invariance compares
    /// it with `chunk_sizes(N, seed)`.
    pub chunk: usize,
    /// Vocabulary shards of vocab-parallel kernels (layout from the seed).
    pub shards: usize,
    /// Forward output dtype: the accumulation dtype (`false`) or the logits' dtype.
    pub out_input: bool,
    /// A bad input planted at `(row, col)` (reduced modulo `N` and `V`).
    pub bad: Option<(BadInput, usize, usize)>,
}

/// A fuzz case built: problem, cotangents and the shard layout.
pub struct Expanded {
    /// The problem (bad input planted).
    pub data: ProblemData,
    /// The cotangents (bad input planted).
    pub cot: CotangentData,
    /// The shard layout of vocab-parallel kernels.
    pub layout: ShardLayout,
    /// The loss options and weights `[N]`.
    pub loss: LossData,
}

impl FuzzCase {
    /// A plain case around [`ProblemRecipe::plain`]: chunk 1, one shard, no bad input.
    pub fn plain(seed: u64, n: usize, vocab_size: usize) -> FuzzCase {
        FuzzCase {
            recipe: ProblemRecipe::plain(seed, n, vocab_size),
            cot: CotangentRecipe {
                seed,
                log_probs: true,
                entropy: true,
                topk: true,
                loss: false,
                policy: false,
                kl: false,
            },
            loss: LossRecipe::plain(seed),
            chunk: 1,
            shards: 1,
            out_input: false,
            bad: None,
        }
    }

    /// The forward output dtype.
    pub fn out(&self) -> Dtype {
        let d = self.recipe.dtype;
        if self.out_input || d == Dtype::F64 {
            d
        } else {
            Dtype::F32
        }
    }

    /// Builds the case: the shard layout (its all-masked shard applied to
    /// the mask), the problem, the cotangents, then the bad input.
    pub fn expand(&self) -> Expanded {
        let r = &self.recipe;
        let v_total = r.vocab_size.max(1) + r.padding;
        let layout = ShardLayout::generate(r.seed, self.shards, v_total, r.mask_rate.is_some());
        let masked = layout.masked_shard.map(|k| layout.range(k));
        let mut data = r.expand_with_masked_cols(masked);
        let loss = LossRecipe {
            seed: r.seed,
            ..self.loss.clone()
        }
        .expand(r.n);
        // The loss side's cotangents (`grad=...+loss`) differentiate this loss.
        self.cot.ask(&mut data, &loss);
        let mut cot = self.cot.expand(&data);
        if let Some((b, row, col)) = self.bad {
            b.apply(&mut data, &mut cot, row, col);
        }
        Expanded {
            data,
            cot,
            layout,
            loss,
        }
    }

    /// A key for the oracle cache: every field.
    pub fn key(&self) -> String {
        format!("{self:?}")
    }
}

#[cfg(test)]
mod tests;
