//! One fuzz case: the gate's problem recipe ([`ProblemRecipe`], from
//! `logprobe_testkit::strategies`) plus what the fuzzer varies around it
//! (cotangents, the chunk size, a vocabulary-shard layout, the output dtype
//! and an optional bad input), its text form in the options grammar
//! ([`FuzzCase::recipe`], [`FuzzCase::parse`]), the search space
//! ([`Space`], from `--dtype`, `--vocab`, `--options`) and the proptest
//! strategy over it ([`Space::strategy`]), whose value trees shrink the
//! recipe.

use proptest::prelude::*;
use proptest::sample::select;

use logprobe_reference::spec::{Dtype, EntropyLogits, TemperatureDtype};
use logprobe_testkit::strategies::{
    cotangent_recipe, problem_recipe, rng_for, BadInput, CotangentData, CotangentRecipe, Offset,
    PadFill, ProblemData, ProblemRecipe, RecipeSpace, RowKind, ShardLayout, REAL_VOCAB_SIZES,
};

use super::grammar::{num, parse_f64, Alt, GrammarError, Pairs};

/// Every key of the grammar, in recipe order.
pub const KEYS: [&str; 24] = [
    "seed",
    "dtype",
    "vocab",
    "rows",
    "padding",
    "pad",
    "kind",
    "offset",
    "mask",
    "temperature",
    "temperature_dtype",
    "tokens",
    "ignore",
    "ignore_index",
    "topk",
    "topk_ids",
    "entropy",
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
            },
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
        let mut cot = self.cot.expand(&data);
        if let Some((b, row, col)) = self.bad {
            b.apply(&mut data, &mut cot, row, col);
        }
        Expanded { data, cot, layout }
    }

    /// A key for the oracle cache: every field.
    pub fn key(&self) -> String {
        format!("{self:?}")
    }

    /// The case in the options grammar, one value per key (see
    /// [`FuzzCase::parse`]): `seed=..,dtype=..,...`.
    pub fn recipe(&self) -> String {
        let r = &self.recipe;
        let kind = match r.kind {
            RowKind::LlmLike { entropy } => format!("llm:{}", num(entropy)),
            RowKind::WideGaussian { sigma } => format!("gaussian:{}", num(sigma)),
            RowKind::AllEqual => "equal".into(),
            RowKind::Ties { levels } => format!("ties:{levels}"),
            RowKind::OneHotish { gap } => format!("onehot:{}", num(gap)),
            RowKind::NegInf { rate } => format!("neginf:{}", num(rate)),
            RowKind::OneFinite => "onefinite".into(),
            RowKind::Subnormals => "subnormal".into(),
            RowKind::Mixed => "mixed".into(),
        };
        let offset = match r.offset {
            Offset::Zero => "0".into(),
            Offset::Value(v) => num(v),
            Offset::Extreme { negative: false } => "max".into(),
            Offset::Extreme { negative: true } => "-max".into(),
        };
        let grad: Vec<&str> = [
            (self.cot.log_probs, "lp"),
            (self.cot.entropy, "h"),
            (self.cot.topk, "topk"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        let (bad, bad_at) = match self.bad {
            None => ("none".to_string(), None),
            Some((b, row, col)) => (bad_name(b), Some(format!("{row}:{col}"))),
        };
        let mut s = vec![
            format!("seed={}", r.seed),
            format!("dtype={}", r.dtype.name()),
            format!("vocab={}", r.vocab_size),
            format!("rows={}", r.n),
            format!("padding={}", r.padding),
            format!(
                "pad={}",
                match r.pad_fill {
                    PadFill::Large => "large",
                    PadFill::Nan => "nan",
                }
            ),
            format!("kind={kind}"),
            format!("offset={offset}"),
            format!("mask={}", r.mask_rate.map_or("none".into(), num)),
            format!("temperature={}", num(r.temperature)),
            format!(
                "temperature_dtype={}",
                match r.temperature_dtype {
                    TemperatureDtype::Accumulation => "accumulation",
                    TemperatureDtype::Input => "input",
                }
            ),
            format!("tokens={}", if r.tokens { "on" } else { "off" }),
            format!("ignore={}", num(r.ignore_rate)),
            format!("ignore_index={}", r.ignore_index),
            format!("topk={}", r.topk),
            format!("topk_ids={}", if r.topk_true { "true" } else { "random" }),
            format!("entropy={}", entropy_name(r.entropy)),
            format!("chunk={}", self.chunk),
            format!("shards={}", self.shards),
            format!("out={}", if self.out_input { "input" } else { "acc" }),
            format!(
                "grad={}",
                if grad.is_empty() {
                    "none".into()
                } else {
                    grad.join("+")
                }
            ),
            format!("grad_seed={}", self.cot.seed),
            format!("bad={bad}"),
        ];
        if let Some(at) = bad_at {
            s.push(format!("bad_at={at}"));
        }
        s.join(",")
    }

    /// Parses a recipe ([`FuzzCase::recipe`]); keys left out keep the values
    /// of [`FuzzCase::plain`]`(0, 1, 16)`.
    ///
    /// # Errors
    /// [`GrammarError`] for an unknown key, a value a key does not take, or
    /// a key given several values.
    pub fn parse(recipe: &str) -> Result<FuzzCase, GrammarError> {
        let p = Pairs::parse(recipe, &KEYS)?;
        let mut c = FuzzCase::plain(0, 1, 16);
        for key in KEYS {
            if let Some(v) = p.pinned(key)? {
                set(&mut c, key, v)?;
            }
        }
        if let (Some((b, _, _)), Some(at)) = (c.bad, p.pinned("bad_at")?) {
            let (row, col) = at
                .split_once(':')
                .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)))
                .ok_or_else(|| bad_value("bad_at", at, "ROW:COL"))?;
            c.bad = Some((b, row, col));
        }
        Ok(c)
    }
}

fn bad_value(key: &str, value: &str, reason: impl Into<String>) -> GrammarError {
    GrammarError::BadValue {
        key: key.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn entropy_name(e: Option<EntropyLogits>) -> &'static str {
    match e {
        None => "none",
        Some(EntropyLogits::Unmasked) => "unmasked",
        Some(EntropyLogits::Masked) => "masked",
    }
}

/// Every bad input the fuzzer plants, with its name in the grammar.
pub fn bad_inputs() -> Vec<(String, BadInput)> {
    use BadInput::*;
    let mut v: Vec<(String, BadInput)> = [
        ("nan-logit", NanLogit),
        ("pos-inf-logit", PosInfLogit),
        ("token-out-of-range", TokenOutOfRange),
        ("negative-token", NegativeToken),
        ("token-masked", TokenMasked),
        ("token-neg-inf", TokenNegInf),
        ("all-neg-inf", AllNegInf),
        ("all-masked", AllMasked),
        ("topk-id-out-of-range", TopkIdOutOfRange),
        ("tokens-shape", TokensShape),
        ("mask-shape", MaskShape),
        ("topk-shape", TopkShape),
        ("vocab-size-too-large", VocabSizeTooLarge),
        ("no-cotangent", NoCotangent),
        ("non-finite-cotangent", NonFiniteCotangent),
        ("cotangent-shape", CotangentShape),
        (
            "entropy-cotangent-without-entropy",
            EntropyCotangentWithoutEntropy,
        ),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect();
    for t in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-50] {
        v.push((format!("temperature:{}", num(t)), Temperature(t)));
    }
    v
}

/// The grammar's name of a bad input.
pub fn bad_name(b: BadInput) -> String {
    if let BadInput::Temperature(t) = b {
        return format!("temperature:{}", num(t));
    }
    bad_inputs()
        .into_iter()
        .find(|(_, x)| *x == b)
        .map(|(n, _)| n)
        .unwrap_or_else(|| format!("{b:?}"))
}

fn parse_bad(v: &str) -> Option<BadInput> {
    if let Some(t) = v.strip_prefix("temperature:") {
        return parse_f64(t).map(BadInput::Temperature);
    }
    bad_inputs()
        .into_iter()
        .find(|(n, _)| n == v)
        .map(|(_, b)| b)
}

fn parse_dtype(v: &str) -> Option<Dtype> {
    Dtype::ALL.into_iter().find(|d| d.name() == v)
}

fn int<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, GrammarError> {
    v.parse()
        .map_err(|_| bad_value(key, v, "expected an integer"))
}

fn float(key: &str, v: &str) -> Result<f64, GrammarError> {
    parse_f64(v).ok_or_else(|| bad_value(key, v, "expected a number"))
}

/// The row kind of `v` (`llm:2.5`, `equal`, ...); a family without its
/// parameter takes `param` (drawn by the caller).
fn parse_kind(v: &str, param: f64) -> Option<RowKind> {
    let (name, arg) = match v.split_once(':') {
        Some((n, a)) => (n, Some(parse_f64(a)?)),
        None => (v, None),
    };
    let a = arg.unwrap_or(param);
    Some(match name {
        "llm" => RowKind::LlmLike {
            entropy: if arg.is_some() { a } else { 5.0 * a },
        },
        "gaussian" => RowKind::WideGaussian {
            sigma: if arg.is_some() { a } else { 0.5 + 59.5 * a },
        },
        "equal" => RowKind::AllEqual,
        "ties" => RowKind::Ties {
            levels: if arg.is_some() {
                a as u8
            } else {
                1 + (a * 4.0) as u8
            },
        },
        "onehot" => RowKind::OneHotish {
            gap: if arg.is_some() { a } else { 5.0 + 95.0 * a },
        },
        "neginf" => RowKind::NegInf {
            rate: if arg.is_some() { a } else { 0.05 + 0.9 * a },
        },
        "onefinite" => RowKind::OneFinite,
        "subnormal" => RowKind::Subnormals,
        "mixed" => RowKind::Mixed,
        _ => return None,
    })
}

fn kind_family(k: RowKind) -> &'static str {
    match k {
        RowKind::LlmLike { .. } => "llm",
        RowKind::WideGaussian { .. } => "gaussian",
        RowKind::AllEqual => "equal",
        RowKind::Ties { .. } => "ties",
        RowKind::OneHotish { .. } => "onehot",
        RowKind::NegInf { .. } => "neginf",
        RowKind::OneFinite => "onefinite",
        RowKind::Subnormals => "subnormal",
        RowKind::Mixed => "mixed",
    }
}

fn parse_offset(v: &str) -> Option<Offset> {
    match v {
        "max" => Some(Offset::Extreme { negative: false }),
        "-max" => Some(Offset::Extreme { negative: true }),
        _ => parse_f64(v).map(|x| {
            if x == 0.0 {
                Offset::Zero
            } else {
                Offset::Value(x)
            }
        }),
    }
}

/// Sets one key of `c` from a single value (recipes; `--options` pins go
/// through [`Space`]).
fn set(c: &mut FuzzCase, key: &str, v: &str) -> Result<(), GrammarError> {
    let r = &mut c.recipe;
    match key {
        "seed" => r.seed = int(key, v)?,
        "dtype" => {
            r.dtype = parse_dtype(v).ok_or_else(|| bad_value(key, v, "f64, f32, bf16 or f16"))?
        }
        "vocab" => {
            r.vocab_size = int(key, v)?;
            if r.vocab_size == 0 {
                return Err(bad_value(key, v, "V >= 1"));
            }
        }
        "rows" => r.n = int(key, v)?,
        "padding" => r.padding = int(key, v)?,
        "pad" => {
            r.pad_fill = match v {
                "large" => PadFill::Large,
                "nan" => PadFill::Nan,
                _ => return Err(bad_value(key, v, "large or nan")),
            }
        }
        "kind" => {
            r.kind = parse_kind(v, 0.5).ok_or_else(|| {
                bad_value(
                    key,
                    v,
                    "llm[:H], gaussian[:SIGMA], equal, ties[:LEVELS], onehot[:GAP], neginf[:RATE], onefinite, subnormal or mixed",
                )
            })?
        }
        "offset" => {
            r.offset =
                parse_offset(v).ok_or_else(|| bad_value(key, v, "a number, max or -max"))?
        }
        "mask" => {
            r.mask_rate = match v {
                "none" | "off" => None,
                _ => Some(float(key, v)?),
            }
        }
        "temperature" => r.temperature = float(key, v)?,
        "temperature_dtype" => {
            r.temperature_dtype = match v {
                "accumulation" | "acc" => TemperatureDtype::Accumulation,
                "input" => TemperatureDtype::Input,
                _ => return Err(bad_value(key, v, "accumulation or input")),
            }
        }
        "tokens" => r.tokens = on_off(key, v)?,
        "ignore" => r.ignore_rate = float(key, v)?,
        "ignore_index" => r.ignore_index = int(key, v)?,
        "topk" => r.topk = int(key, v)?,
        "topk_ids" => {
            r.topk_true = match v {
                "true" => true,
                "random" => false,
                _ => return Err(bad_value(key, v, "true or random")),
            }
        }
        "entropy" => {
            r.entropy = match v {
                "none" | "off" => None,
                "unmasked" | "on" => Some(EntropyLogits::Unmasked),
                "masked" => Some(EntropyLogits::Masked),
                _ => return Err(bad_value(key, v, "unmasked, masked or none")),
            }
        }
        "chunk" => {
            c.chunk = int(key, v)?;
            if c.chunk == 0 {
                return Err(bad_value(key, v, "chunk_size >= 1"));
            }
        }
        "shards" => c.shards = int::<usize>(key, v)?.max(1),
        "out" => {
            c.out_input = match v {
                "acc" => false,
                "input" => true,
                _ => return Err(bad_value(key, v, "acc or input")),
            }
        }
        "grad" => {
            let parts: Vec<&str> = v.split('+').collect();
            if v != "none" && parts.iter().any(|p| !["lp", "h", "topk"].contains(p)) {
                return Err(bad_value(key, v, "none, or lp, h, topk joined by +"));
            }
            c.cot.log_probs = parts.contains(&"lp");
            c.cot.entropy = parts.contains(&"h");
            c.cot.topk = parts.contains(&"topk");
        }
        "grad_seed" => c.cot.seed = int(key, v)?,
        "bad" => {
            c.bad = match v {
                "none" | "off" => None,
                _ => {
                    // The position is kept (`bad_at` sets it).
                    let (row, col) = c.bad.map_or((0, 0), |(_, r, c)| (r, c));
                    let b = parse_bad(v).ok_or_else(|| {
                        bad_value(key, v, "none or a bad-input name (docs/fuzz.md)")
                    })?;
                    Some((b, row, col))
                }
            }
        }
        "bad_at" => {}
        _ => unreachable!("keys come from KEYS"),
    }
    Ok(())
}

fn on_off(key: &str, v: &str) -> Result<bool, GrammarError> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(bad_value(key, v, "on or off")),
    }
}

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
        let mut rng = rng_for(c.recipe.seed, 0xF022);
        for (key, alts) in &self.pins.0 {
            if key == "bad_at" {
                continue;
            }
            if self.holds(&c, key, alts) {
                continue;
            }
            let a = &alts[rng.random_range(0..alts.len())];
            let u: f64 = rng.random();
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
                    REAL_VOCAB_SIZES[rng.random_range(0..REAL_VOCAB_SIZES.len())].to_string()
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
            "temperature" => Some(r.temperature),
            "ignore" => Some(r.ignore_rate),
            "ignore_index" => Some(r.ignore_index as f64),
            "topk" => Some(r.topk as f64),
            "chunk" => Some(c.chunk as f64),
            "shards" => Some(c.shards as f64),
            "grad_seed" => Some(c.cot.seed as f64),
            _ => None,
        };
        if let Some(x) = x {
            // Integers compare exactly as text (a u64 seed is not an f64).
            let exact = match key {
                "seed" => Some(r.seed.to_string()),
                "grad_seed" => Some(c.cot.seed.to_string()),
                "ignore_index" => Some(r.ignore_index.to_string()),
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
const NUMERIC: [&str; 13] = [
    "seed",
    "vocab",
    "rows",
    "padding",
    "offset",
    "mask",
    "temperature",
    "ignore",
    "ignore_index",
    "topk",
    "chunk",
    "shards",
    "grad_seed",
];

/// Numeric keys whose values are integers.
const NUMERIC_INT: [&str; 9] = [
    "seed",
    "vocab",
    "rows",
    "padding",
    "ignore_index",
    "topk",
    "chunk",
    "shards",
    "grad_seed",
];

#[cfg(test)]
mod tests;
