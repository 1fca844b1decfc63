//! A fused linear fuzz case ([`LinearCase`]: the test kit's
//! [`LinearRecipe`] plus the kernel's row and vocabulary chunks and the
//! shard count), its text form (every key of [`LINEAR_KEYS`], the printed
//! recipe), and the search space ([`LinearSpace`]: `--options` pins over
//! the proptest strategy, whose value trees shrink every knob).

use proptest::prelude::*;
use proptest::sample::select;

use logprobe_kernels::linear::LinearLogits;
use logprobe_reference::splitmix::SplitMix64;
use logprobe_testkit::linear::LinearRecipe;
use logprobe_testkit::strategies::ShardLayout;

use crate::grammar::{num, parse_f64, Alt, GrammarError, Pairs};

/// Every key of a fused linear case, in recipe order.
pub const LINEAR_KEYS: [&str; 17] = [
    "seed",
    "dtype",
    "rows",
    "hidden",
    "vocab",
    "bias",
    "logits",
    "temperature",
    "softcap",
    "hidden_scale",
    "weight_scale",
    "bias_scale",
    "bias_offset",
    "ignore",
    "row_chunk",
    "vocab_chunk",
    "shards",
];

/// Keys whose values are integers (ranges round to them).
const INTEGER_KEYS: [&str; 7] = [
    "seed",
    "rows",
    "hidden",
    "vocab",
    "row_chunk",
    "vocab_chunk",
    "shards",
];

/// Keys that take words, not numbers.
const WORD_KEYS: [&str; 4] = ["dtype", "bias", "logits", "softcap"];

/// One fused linear fuzz case (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearCase {
    /// The problem.
    pub recipe: LinearRecipe,
    /// The kernel's rows per block (`>= 1`).
    pub row_chunk: usize,
    /// The kernel's vocabulary columns per block (`>= 1`).
    pub vocab_chunk: usize,
    /// Vocabulary shards of the TP kernel (layout from the seed, uneven
    /// widths, empty shards allowed: [`ShardLayout::generate`]).
    pub shards: usize,
}

fn bad(key: &str, value: &str, reason: &str) -> GrammarError {
    GrammarError::BadValue {
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

impl LinearCase {
    /// A small plain case: bf16, `N = 4`, `H = 16`, `V = 64`, no bias, T = 1.
    pub fn plain(seed: u64) -> LinearCase {
        LinearCase {
            recipe: LinearRecipe {
                seed,
                n: 4,
                h: 16,
                v: 64,
                bf16: true,
                bias: false,
                logits: LinearLogits::Input,
                temperature: 1.0,
                softcap: None,
                hidden_scale: 2.0,
                weight_scale: 5.0,
                bias_scale: 0.5,
                bias_offset: 0.0,
                ignore: 0.0,
            },
            row_chunk: 1,
            vocab_chunk: 64,
            shards: 1,
        }
    }

    /// The shard widths of the TP kernel.
    pub fn widths(&self) -> Vec<usize> {
        ShardLayout::generate(self.recipe.seed, self.shards, self.recipe.v, false).widths
    }

    /// The case as text: every key, in [`LINEAR_KEYS`] order.
    pub fn recipe(&self) -> String {
        let r = &self.recipe;
        let on = |b: bool| if b { "on" } else { "off" };
        [
            format!("seed={}", r.seed),
            format!("dtype={}", if r.bf16 { "bf16" } else { "f32" }),
            format!("rows={}", r.n),
            format!("hidden={}", r.h),
            format!("vocab={}", r.v),
            format!("bias={}", on(r.bias)),
            format!(
                "logits={}",
                match r.logits {
                    LinearLogits::Input => "input",
                    LinearLogits::Accumulation => "accumulation",
                }
            ),
            format!("temperature={}", num(r.temperature)),
            format!("softcap={}", r.softcap.map_or("none".into(), num)),
            format!("hidden_scale={}", num(r.hidden_scale)),
            format!("weight_scale={}", num(r.weight_scale)),
            format!("bias_scale={}", num(r.bias_scale)),
            format!("bias_offset={}", num(r.bias_offset)),
            format!("ignore={}", num(r.ignore)),
            format!("row_chunk={}", self.row_chunk),
            format!("vocab_chunk={}", self.vocab_chunk),
            format!("shards={}", self.shards),
        ]
        .join(",")
    }

    /// Parses a printed recipe: each key at most once with one value; a key
    /// left out keeps [`LinearCase::plain`]'s value.
    ///
    /// # Errors
    /// [`GrammarError`] for an unknown key, a key with several values or a
    /// range, or a value the key does not take.
    pub fn parse(text: &str) -> Result<LinearCase, GrammarError> {
        let pairs = Pairs::parse(text, &LINEAR_KEYS)?;
        let mut c = LinearCase::plain(0);
        for key in pairs.0.keys() {
            if let Some(v) = pairs.pinned(key)? {
                c.set(key, v)?;
            }
        }
        Ok(c)
    }

    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// [`GrammarError::BadValue`] for a value the key does not take.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), GrammarError> {
        let r = &mut self.recipe;
        let x = parse_f64(value);
        let int = |lo: usize, hi: usize| -> Result<usize, GrammarError> {
            match value.parse::<usize>() {
                Ok(n) if (lo..=hi).contains(&n) => Ok(n),
                _ => Err(bad(key, value, &format!("an integer in {lo}..{hi}"))),
            }
        };
        let real = |lo: f64, hi: f64| -> Result<f64, GrammarError> {
            match x {
                Some(v) if v.is_finite() && lo <= v && v <= hi => Ok(v),
                _ => Err(bad(key, value, &format!("a number in {lo}..{hi}"))),
            }
        };
        let onoff = || match value {
            "on" | "true" => Ok(true),
            "off" | "false" => Ok(false),
            _ => Err(bad(key, value, "on or off")),
        };
        match key {
            "seed" => {
                r.seed = value
                    .parse()
                    .map_err(|_| bad(key, value, "an unsigned 64-bit integer"))?
            }
            "dtype" => {
                r.bf16 = match value {
                    "bf16" => true,
                    "f32" | "fp32" => false,
                    _ => return Err(bad(key, value, "bf16 or f32")),
                }
            }
            "rows" => r.n = int(1, 4096)?,
            "hidden" => r.h = int(1, 65536)?,
            "vocab" => r.v = int(1, 1 << 20)?,
            "bias" => r.bias = onoff()?,
            "logits" => {
                r.logits = match value {
                    "input" => LinearLogits::Input,
                    "accumulation" => LinearLogits::Accumulation,
                    _ => return Err(bad(key, value, "input or accumulation")),
                }
            }
            "temperature" => r.temperature = real(1e-3, 1e3)?,
            "softcap" => {
                r.softcap = match value {
                    "none" | "off" => None,
                    _ => Some(real(1e-3, 1e4)?),
                }
            }
            "hidden_scale" => r.hidden_scale = real(0.0, 1e4)?,
            "weight_scale" => r.weight_scale = real(0.0, 1e4)?,
            "bias_scale" => r.bias_scale = real(0.0, 1e4)?,
            "bias_offset" => r.bias_offset = real(-1e5, 1e5)?,
            "ignore" => r.ignore = real(0.0, 1.0)?,
            "row_chunk" => self.row_chunk = int(1, 1 << 20)?,
            "vocab_chunk" => self.vocab_chunk = int(1, 1 << 20)?,
            "shards" => self.shards = int(1, 64)?,
            _ => {
                return Err(GrammarError::UnknownKey {
                    key: key.into(),
                    known: LINEAR_KEYS.join(", "),
                })
            }
        }
        Ok(())
    }
}

/// The search space of fused linear cases: the strategy's defaults plus
/// the pins of `--options` (keys of [`LINEAR_KEYS`], `key=a|b|lo..hi`).
#[derive(Clone, Debug)]
pub struct LinearSpace {
    /// The pinned keys.
    pub pins: Pairs,
}

impl LinearSpace {
    /// The space of `options`.
    ///
    /// # Errors
    /// [`GrammarError`] for an unknown key, a value no key takes, or a
    /// range on a key that takes words.
    pub fn parse(options: &str) -> Result<LinearSpace, GrammarError> {
        let pins = Pairs::parse(options, &LINEAR_KEYS)?;
        for (key, alts) in &pins.0 {
            for a in alts {
                match a {
                    Alt::Word(w) => LinearCase::plain(0).set(key, w)?,
                    Alt::Range(..) if WORD_KEYS.contains(&key.as_str()) => {
                        return Err(bad(key, &a.to_string(), "this key takes no range"))
                    }
                    Alt::Range(lo, hi) => {
                        let mut probe = LinearCase::plain(0);
                        for x in [lo, hi] {
                            let text = if INTEGER_KEYS.contains(&key.as_str()) {
                                format!("{}", x.round())
                            } else {
                                num(*x)
                            };
                            probe.set(key, &text)?;
                        }
                    }
                }
            }
        }
        Ok(LinearSpace { pins })
    }

    /// The strategy of cases (see the module docs).
    pub fn strategy(&self) -> BoxedStrategy<LinearCase> {
        let space = self.clone();
        let shape = (
            any::<u64>(),
            1usize..=12,
            prop_oneof![4 => 1usize..=64, 1 => 65usize..=512],
            prop_oneof![4 => 1usize..=512, 1 => 513usize..=4096],
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        );
        let options = (
            select(vec![1.0, 0.7, 2.0, 0.5, 1.3]),
            prop_oneof![3 => Just(None), 1 => select(vec![5.0, 30.0]).prop_map(Some)],
            prop_oneof![3 => 0.5f64..4.0, 1 => 4.0f64..16.0],
            prop_oneof![3 => 1.0f64..8.0, 1 => 8.0f64..64.0],
            0.0f64..2.0,
            prop_oneof![3 => Just(0.0), 1 => -300.0f64..300.0],
            prop_oneof![2 => Just(0.0), 1 => 0.0f64..0.5],
        );
        let kernel = (
            1usize..=16,
            prop_oneof![2 => 1usize..=64, 1 => 65usize..=1024],
            prop_oneof![2 => Just(1usize), 1 => 2usize..=5],
        );
        (shape, options, kernel)
            .prop_map(move |(s, o, k)| {
                let (seed, n, h, v, bf16, bias, acc) = s;
                let (temperature, softcap, hs, ws, bs, bo, ignore) = o;
                let (row_chunk, vocab_chunk, shards) = k;
                space.pin(LinearCase {
                    recipe: LinearRecipe {
                        seed,
                        n,
                        h,
                        v,
                        bf16,
                        bias,
                        logits: if acc {
                            LinearLogits::Accumulation
                        } else {
                            LinearLogits::Input
                        },
                        temperature,
                        softcap,
                        hidden_scale: hs,
                        weight_scale: ws,
                        bias_scale: bs,
                        bias_offset: bo,
                        ignore,
                    },
                    row_chunk,
                    vocab_chunk,
                    shards,
                })
            })
            .boxed()
    }

    /// `c` with every pinned key set to one of its alternatives (drawn from
    /// the case's seed; a value already among them is kept).
    pub fn pin(&self, mut c: LinearCase) -> LinearCase {
        let mut rng = SplitMix64::for_stream(c.recipe.seed, 0x11_F022);
        for (key, alts) in &self.pins.0 {
            let current = c
                .recipe()
                .split(',')
                .find_map(|p| p.strip_prefix(&format!("{key}=")).map(str::to_string))
                .unwrap_or_default();
            let held = alts.iter().any(|a| match a {
                Alt::Word(w) => {
                    let mut probe = c.clone();
                    probe.set(key, w).is_ok() && probe.recipe() == c.recipe()
                }
                Alt::Range(..) => parse_f64(&current).is_some_and(|x| a.holds(x)),
            });
            if held {
                continue;
            }
            let a = &alts[rng.below(alts.len())];
            let value = match a {
                Alt::Word(w) => w.clone(),
                Alt::Range(lo, hi) => {
                    let x = lo + (hi - lo) * rng.uniform();
                    if INTEGER_KEYS.contains(&key.as_str()) {
                        format!("{}", x.round().clamp(*lo, *hi))
                    } else {
                        num(x)
                    }
                }
            };
            // Every value was checked by `LinearSpace::parse`.
            let _ = c.set(key, &value);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_recipe_parses_back_to_the_case() {
        let mut c = LinearCase::plain(7);
        c.recipe.softcap = Some(30.0);
        c.recipe.bias_offset = -12.5;
        c.shards = 3;
        assert_eq!(LinearCase::parse(&c.recipe()).unwrap(), c);
    }

    #[test]
    fn pins_hold_on_every_drawn_case() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let space = LinearSpace::parse("dtype=f32,vocab=100..200,softcap=5,shards=3").unwrap();
        let mut runner = TestRunner::deterministic();
        for _ in 0..50 {
            let c = space.strategy().new_tree(&mut runner).unwrap().current();
            assert!(!c.recipe.bf16);
            assert!((100..=200).contains(&c.recipe.v), "{}", c.recipe());
            assert_eq!(c.recipe.softcap, Some(5.0));
            assert_eq!(c.shards, 3);
        }
    }

    #[test]
    fn bad_options_are_typed_errors() {
        assert!(LinearSpace::parse("dtype=f16").is_err());
        assert!(LinearSpace::parse("bias=1..2").is_err());
        assert!(LinearSpace::parse("rows=0").is_err());
        assert!(LinearSpace::parse("weight=3").is_err());
        assert!(LinearCase::parse("rows=2|3").is_err());
    }
}
