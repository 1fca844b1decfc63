//! The search space of a fuzz run: the gate's recipe space plus the pins
//! of `--options` ([`Space::parse`], [`Space::pin`]) and the proptest
//! strategy of cases over it ([`Space::strategy`]).

use proptest::prelude::*;
use proptest::sample::select;

use logprobe_reference::spec::{Dtype, EntropyLogits};
use logprobe_reference::splitmix::SplitMix64;
use logprobe_testkit::strategies::{
    cotangent_recipe, problem_recipe, LossRecipe, RecipeSpace, REAL_VOCAB_SIZES,
};

use super::super::grammar::{num, parse_f64, Alt, GrammarError, Pairs};
use super::recipe_text::{
    bad_inputs, bad_value, kind_family, parse_dtype, parse_kind, parse_offset, set,
};
use super::{dump_key, FuzzCase, KEYS, MAX_MEDIUM_VOCAB};

/// The search space: the gate's [`RecipeSpace`] (dtypes from `--dtype`)
/// plus the pins of `--options` / `--vocab`, applied to every drawn case
/// ([`Space::pin`]).
#[derive(Clone, Debug)]
pub struct Space {
    /// The gate's space the recipes are drawn from.
    pub recipes: RecipeSpace,
    /// The pinned keys.
    pub pins: Pairs,
}

impl Space {
    /// The space of `options` (with `dtype=` and `vocab=` from `--dtype` /
    /// `--vocab` merged in). Default: every dtype, `V` from 1 to
    /// [`MAX_MEDIUM_VOCAB`] and the real sizes, everything on.
    ///
    /// # Errors
    /// [`GrammarError`] for an unknown key or a value no key takes.
    pub fn parse(options: &str) -> Result<Space, GrammarError> {
        let pins = Pairs::parse(options, &KEYS)?;
        // Check every word once against its key (ranges: numeric keys only).
        for (key, alts) in &pins.0 {
            for a in alts {
                match a {
                    Alt::Word(w) => {
                        let mut probe = FuzzCase::plain(0, 1, 16);
                        if key == "bad_at" {
                            continue;
                        }
                        if key == "vocab" && w == "real" {
                            continue;
                        }
                        if key == "kind" && parse_kind(w, 0.5).is_some() {
                            continue;
                        }
                        set(&mut probe, key, w)?;
                    }
                    Alt::Range(..) => {
                        if !NUMERIC.contains(&key.as_str()) {
                            return Err(bad_value(key, &a.to_string(), "this key takes no range"));
                        }
                    }
                }
            }
        }
        let mut dtypes = vec![Dtype::F32, Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F64];
        if let Some(alts) = pins.get("dtype") {
            dtypes = alts
                .iter()
                .filter_map(|a| match a {
                    Alt::Word(w) => parse_dtype(w),
                    Alt::Range(..) => None,
                })
                .collect();
        }
        Ok(Space {
            recipes: RecipeSpace {
                dtypes,
                real_vocab_weight: 1,
                max_small_vocab: MAX_MEDIUM_VOCAB,
                max_rows: 12,
                ..RecipeSpace::default()
            },
            pins,
        })
    }

    /// The strategy of cases: the gate's [`problem_recipe`] and
    /// [`cotangent_recipe`] with the fuzzer's knobs, then [`Space::pin`].
    /// Its value trees shrink every knob.
    pub fn strategy(&self) -> BoxedStrategy<FuzzCase> {
        let space = self.clone();
        (
            problem_recipe(self.recipes.clone()),
            cotangent_recipe(),
            prop_oneof![4 => 1usize..=4, 2 => 5usize..=16, 1 => 17usize..=64],
            prop_oneof![1 => Just(1usize), 4 => 2usize..=8, 1 => 9usize..=64],
            prop::bool::weighted(0.25),
            prop_oneof![
                7 => Just(None),
                1 => (select(bad_inputs().into_iter().map(|(_, b)| b).collect::<Vec<_>>()), any::<usize>(), any::<usize>()).prop_map(Some),
            ],
        )
            .prop_map(move |(recipe, cot, chunk, shards, out_input, bad)| {
                space.pin(FuzzCase {
                    // From the seed, no draw of its own (the case stream
                    // is the one before the loss was asked).
                    loss: LossRecipe::from_seed(recipe.seed),
                    recipe,
                    cot,
                    chunk,
                    shards,
                    out_input,
                    bad,
                })
            })
            .boxed()
    }

    /// `c` with every pinned key that it misses set to one of its
    /// alternatives (drawn from the recipe's seed), then kept affordable:
    /// `N <= 2` above [`MAX_MEDIUM_VOCAB`] unless `rows` is pinned.
    pub fn pin(&self, mut c: FuzzCase) -> FuzzCase {
        let mut rng = SplitMix64::for_stream(c.recipe.seed, 0xF022);
        for (key, alts) in &self.pins.0 {
            if key == "bad_at" {
                continue;
            }
            if self.holds(&c, key, alts) {
                continue;
            }
            let a = &alts[rng.below(alts.len())];
            let u = rng.uniform();
            let value = match a {
                Alt::Range(lo, hi) => {
                    let x = lo + (hi - lo) * u;
                    if NUMERIC_INT.contains(&key.as_str()) {
                        x.round().clamp(*lo, *hi).to_string()
                    } else {
                        num(x)
                    }
                }
                Alt::Word(w) if key == "vocab" && w == "real" => {
                    REAL_VOCAB_SIZES[rng.below(REAL_VOCAB_SIZES.len())].to_string()
                }
                Alt::Word(w) if key == "kind" => {
                    c.recipe.kind = parse_kind(w, u).unwrap_or(c.recipe.kind);
                    continue;
                }
                Alt::Word(w) => w.clone(),
            };
            // Every value was checked by `Space::parse`.
            let _ = set(&mut c, key, &value);
        }
        if let (Some((b, _, _)), Ok(Some(at))) = (c.bad, self.pins.pinned("bad_at")) {
            if let Some((row, col)) = at
                .split_once(':')
                .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)))
            {
                c.bad = Some((b, row, col));
            }
        }
        if c.recipe.vocab_size + c.recipe.padding > MAX_MEDIUM_VOCAB
            && self.pins.get("rows").is_none()
        {
            c.recipe.n = c.recipe.n.clamp(1, 2);
        }
        if c.recipe.entropy == Some(EntropyLogits::Masked) && c.recipe.mask_rate.is_none() {
            c.recipe.entropy = Some(EntropyLogits::Unmasked);
        }
        c
    }

    /// Whether `c` already satisfies the pin `key=alts`.
    fn holds(&self, c: &FuzzCase, key: &str, alts: &[Alt]) -> bool {
        let r = &c.recipe;
        let x: Option<f64> = match key {
            "seed" => Some(r.seed as f64),
            "vocab" => Some(r.vocab_size as f64),
            "rows" => Some(r.n as f64),
            "padding" => Some(r.padding as f64),
            dump_key::TEMPERATURE => Some(r.temperature),
            "ignore" => Some(r.ignore_rate),
            dump_key::IGNORE_INDEX => Some(r.ignore_index as f64),
            "topk" => Some(r.topk as f64),
            "chunk" => Some(c.chunk as f64),
            "shards" => Some(c.shards as f64),
            "grad_seed" => Some(c.cot.seed as f64),
            dump_key::LABEL_SMOOTHING => Some(c.loss.label_smoothing),
            _ => None,
        };
        if let Some(x) = x {
            // Integers compare exactly as text (a u64 seed is not an f64).
            let exact = match key {
                "seed" => Some(r.seed.to_string()),
                "grad_seed" => Some(c.cot.seed.to_string()),
                dump_key::IGNORE_INDEX => Some(r.ignore_index.to_string()),
                _ => None,
            };
            return alts.iter().any(|a| match a {
                Alt::Word(w) if key == "vocab" && w == "real" => {
                    REAL_VOCAB_SIZES.contains(&r.vocab_size)
                }
                Alt::Word(w) if exact.is_some() => exact.as_deref() == Some(w.as_str()),
                a => a.holds(x),
            });
        }
        let text = c.recipe();
        let current = text
            .split(',')
            .find_map(|p| p.strip_prefix(&format!("{key}=")))
            .unwrap_or("none");
        alts.iter().any(|a| match a {
            Alt::Word(w) if key == "kind" => {
                w == current || (!w.contains(':') && w == kind_family(r.kind))
            }
            Alt::Word(w) if key == "offset" => parse_offset(w) == Some(r.offset),
            Alt::Word(w) if key == "mask" => {
                let want = if w == "none" || w == "off" {
                    None
                } else {
                    parse_f64(w)
                };
                want == r.mask_rate
            }
            Alt::Range(lo, hi) if key == "mask" => {
                r.mask_rate.is_some_and(|m| *lo <= m && m <= *hi)
            }
            Alt::Word(w) => {
                let mut probe = c.clone();
                set(&mut probe, key, w).is_ok() && probe.recipe() == text
            }
            Alt::Range(..) => false,
        })
    }
}

/// Keys that take numbers (and so ranges).
const NUMERIC: [&str; 14] = [
    "seed",
    "vocab",
    "rows",
    "padding",
    "offset",
    "mask",
    dump_key::TEMPERATURE,
    "ignore",
    dump_key::IGNORE_INDEX,
    "topk",
    "chunk",
    "shards",
    "grad_seed",
    dump_key::LABEL_SMOOTHING,
];

/// Numeric keys whose values are integers.
const NUMERIC_INT: [&str; 9] = [
    "seed",
    "vocab",
    "rows",
    "padding",
    dump_key::IGNORE_INDEX,
    "topk",
    "chunk",
    "shards",
    "grad_seed",
];
