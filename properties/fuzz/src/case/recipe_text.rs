//! The text form of a fuzz case in the options grammar: printing
//! ([`FuzzCase::recipe`]) and parsing ([`FuzzCase::parse`]) it, the values
//! each key takes ([`set`]), and the names of the bad inputs.

use logprobe_reference::spec::{Dtype, EntropyLogits, SoftcapDtype, TemperatureDtype};
use logprobe_testkit::strategies::{BadInput, LossWeights, Offset, PadFill, RowKind};

use super::super::grammar::{num, parse_f64, GrammarError, Pairs};
use super::{dump_key, FuzzCase, KEYS};

impl FuzzCase {
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
            (self.cot.loss, "loss"),
            (self.cot.policy, "policy"),
            (self.cot.kl, "kl"),
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
            format!("{}={}", dump_key::TEMPERATURE, num(r.temperature)),
            format!(
                "{}={}",
                dump_key::TEMPERATURE_DTYPE,
                match r.temperature_dtype {
                    TemperatureDtype::Accumulation => "accumulation",
                    TemperatureDtype::Input => "input",
                }
            ),
            format!(
                "{}={}",
                dump_key::SOFTCAP,
                r.softcap.map_or("none".into(), num)
            ),
            format!(
                "{}={}",
                dump_key::SOFTCAP_DTYPE,
                match r.softcap_dtype {
                    SoftcapDtype::Accumulation => "accumulation",
                    SoftcapDtype::Input => "input",
                }
            ),
            format!("tokens={}", if r.tokens { "on" } else { "off" }),
            format!("ignore={}", num(r.ignore_rate)),
            format!("{}={}", dump_key::IGNORE_INDEX, r.ignore_index),
            format!("topk={}", r.topk),
            format!("topk_ids={}", if r.topk_true { "true" } else { "random" }),
            format!("entropy={}", entropy_name(r.entropy)),
            format!("{}={}", dump_key::REDUCTION, self.loss.reduction.name()),
            format!(
                "{}={}",
                dump_key::LABEL_SMOOTHING,
                num(self.loss.label_smoothing)
            ),
            format!(
                "{}={}",
                dump_key::MEAN_ALL_IGNORED,
                self.loss.mean_all_ignored.name()
            ),
            format!(
                "loss_weights={}",
                self.loss.weights.map_or("none", LossWeights::name)
            ),
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

pub(super) fn bad_value(key: &str, value: &str, reason: impl Into<String>) -> GrammarError {
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

pub(super) fn parse_dtype(v: &str) -> Option<Dtype> {
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
pub(super) fn parse_kind(v: &str, param: f64) -> Option<RowKind> {
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

pub(super) fn kind_family(k: RowKind) -> &'static str {
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

pub(super) fn parse_offset(v: &str) -> Option<Offset> {
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
pub(super) fn set(c: &mut FuzzCase, key: &str, v: &str) -> Result<(), GrammarError> {
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
        dump_key::TEMPERATURE => r.temperature = float(key, v)?,
        dump_key::TEMPERATURE_DTYPE => {
            r.temperature_dtype = match v {
                "accumulation" | "acc" => TemperatureDtype::Accumulation,
                "input" => TemperatureDtype::Input,
                _ => return Err(bad_value(key, v, "accumulation or input")),
            }
        }
        dump_key::SOFTCAP => {
            r.softcap = match v {
                "none" | "off" => None,
                _ => Some(float(key, v)?),
            }
        }
        dump_key::SOFTCAP_DTYPE => {
            r.softcap_dtype = match v {
                "accumulation" | "acc" => SoftcapDtype::Accumulation,
                "input" => SoftcapDtype::Input,
                _ => return Err(bad_value(key, v, "accumulation or input")),
            }
        }
        "tokens" => r.tokens = on_off(key, v)?,
        "ignore" => r.ignore_rate = float(key, v)?,
        dump_key::IGNORE_INDEX => r.ignore_index = int(key, v)?,
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
        dump_key::REDUCTION => {
            c.loss.reduction = v
                .parse()
                .map_err(|_| bad_value(key, v, "none, sum or mean"))?
        }
        // Any number: outside [0, 1] the kernel must give the typed error.
        dump_key::LABEL_SMOOTHING => c.loss.label_smoothing = float(key, v)?,
        dump_key::MEAN_ALL_IGNORED => {
            c.loss.mean_all_ignored = v.parse().map_err(|_| bad_value(key, v, "nan or zero"))?
        }
        "loss_weights" => {
            c.loss.weights = match v {
                "none" | "off" => None,
                _ => Some(
                    LossWeights::ALL
                        .into_iter()
                        .find(|w| w.name() == v)
                        .ok_or_else(|| bad_value(key, v, "none, zeros, allzero or constant"))?,
                ),
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
            const PARTS: [&str; 6] = ["lp", "h", "topk", "loss", "policy", "kl"];
            if v != "none" && parts.iter().any(|p| !PARTS.contains(p)) {
                return Err(bad_value(
                    key,
                    v,
                    "none, or lp, h, topk, loss, policy, kl joined by +",
                ));
            }
            c.cot.log_probs = parts.contains(&"lp");
            c.cot.entropy = parts.contains(&"h");
            c.cot.topk = parts.contains(&"topk");
            c.cot.loss = parts.contains(&"loss");
            c.cot.policy = parts.contains(&"policy");
            c.cot.kl = parts.contains(&"kl");
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
