//! The one grammar of `--options` (and of `--dtype`, `--vocab`, and of the
//! recipe a finding prints): comma-separated `key=alternatives` pairs
//! (`docs/fuzz.md` is its reference; the Python package reuses it).
//!
//! ```text
//! options := pair (',' pair)*
//! pair    := key '=' alts | key          (a bare key means key=on)
//! alts    := value ('|' value)*
//! value   := word | number | number '..' number    (a range, both ends inclusive)
//! ```
//!
//! A recipe is the same grammar with one value per key, so a printed recipe
//! given back as `--options` pins every knob and reproduces the case.

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

/// A bad `--options` / `--dtype` / `--vocab` string or recipe.
#[derive(Debug, Error, PartialEq)]
pub enum GrammarError {
    /// A pair without a key, or an empty value.
    #[error("`{pair}`: {reason}")]
    Malformed {
        /// The offending pair.
        pair: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A key the grammar does not define.
    #[error("unknown key `{key}` (keys: {known})")]
    UnknownKey {
        /// The key.
        key: String,
        /// The keys defined.
        known: String,
    },
    /// A value a key does not take.
    #[error("{key}={value}: {reason}")]
    BadValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What it should be.
        reason: String,
    },
    /// A recipe key given more than one value or a range.
    #[error("recipe key `{key}` needs exactly one value, got `{value}`")]
    NotPinned {
        /// The key.
        key: String,
        /// What was given.
        value: String,
    },
}

/// One alternative of a key.
#[derive(Clone, Debug, PartialEq)]
pub enum Alt {
    /// A word (`bf16`, `nan`, `llm:2.5`, `lp+h`, or a number's text).
    Word(String),
    /// An inclusive range of numbers `lo..hi`.
    Range(f64, f64),
}

impl Alt {
    /// The alternative as a number, when it is one.
    pub fn number(&self) -> Option<f64> {
        match self {
            Alt::Word(w) => parse_f64(w),
            Alt::Range(..) => None,
        }
    }

    /// Whether `x` is this alternative (a number equal to it, or inside the range).
    pub fn holds(&self, x: f64) -> bool {
        match self {
            Alt::Word(_) => self
                .number()
                .is_some_and(|v| v == x || (v.is_nan() && x.is_nan())),
            Alt::Range(lo, hi) => *lo <= x && x <= *hi,
        }
    }
}

impl fmt::Display for Alt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Alt::Word(w) => f.write_str(w),
            Alt::Range(lo, hi) => write!(f, "{}..{}", num(*lo), num(*hi)),
        }
    }
}

/// Parses a number of the grammar: decimal or exponent form, `inf`, `-inf`, `nan`.
pub fn parse_f64(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok()
}

/// A number written the shortest way that parses back to the same f64
/// (exponent form outside `[1e-4, 1e6)`).
/// (the metadata's number format, [`logprobe_verify::keys::write_f64`]).
pub fn num(x: f64) -> String {
    logprobe_verify::keys::write_f64(x)
}

/// A duration of the command line and of the Python package: `90`, `90s`,
/// `10m`, `1h`, `500ms` (a bare number is seconds).
///
/// # Errors
/// Anything else, or a negative or non-finite number.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(v) = s.strip_suffix("ms") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60.0)
    } else if let Some(v) = s.strip_suffix('h') {
        (v, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(x) if x >= 0.0 && x.is_finite() => Ok(std::time::Duration::from_secs_f64(x * scale)),
        _ => Err(format!("`{s}`: expected a duration such as 90s, 10m or 1h")),
    }
}

/// Parsed `key=alternatives` pairs, in key order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pairs(pub BTreeMap<String, Vec<Alt>>);

impl Pairs {
    /// Parses `options` (see the module docs). Keys are checked against `known`.
    ///
    /// # Errors
    /// [`GrammarError`] for a malformed pair, an unknown key or a bad range.
    pub fn parse(options: &str, known: &[&str]) -> Result<Pairs, GrammarError> {
        let mut out = Pairs::default();
        for pair in options.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, alts) = match pair.split_once('=') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => (pair, "on"),
            };
            if key.is_empty() || alts.is_empty() {
                return Err(GrammarError::Malformed {
                    pair: pair.into(),
                    reason: "expected key=value",
                });
            }
            if !known.contains(&key) {
                return Err(GrammarError::UnknownKey {
                    key: key.into(),
                    known: known.join(", "),
                });
            }
            let parsed = alts
                .split('|')
                .map(|a| parse_alt(key, a.trim()))
                .collect::<Result<Vec<_>, _>>()?;
            out.0.entry(key.to_string()).or_default().extend(parsed);
        }
        Ok(out)
    }

    /// The alternatives of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&[Alt]> {
        self.0.get(key).map(|v| v.as_slice())
    }

    /// The single pinned value of `key` (recipes), as text.
    ///
    /// # Errors
    /// [`GrammarError::NotPinned`] when several values or a range are given.
    pub fn pinned(&self, key: &str) -> Result<Option<&str>, GrammarError> {
        match self.0.get(key).map(|v| v.as_slice()) {
            None => Ok(None),
            Some([Alt::Word(w)]) => Ok(Some(w)),
            Some(v) => Err(GrammarError::NotPinned {
                key: key.into(),
                value: v
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join("|"),
            }),
        }
    }
}

fn parse_alt(key: &str, a: &str) -> Result<Alt, GrammarError> {
    if a.is_empty() {
        return Err(GrammarError::Malformed {
            pair: key.into(),
            reason: "empty alternative",
        });
    }
    // A range `lo..hi` of numbers (a word may not contain `..`).
    if let Some((lo, hi)) = a.split_once("..") {
        return match (parse_f64(lo), parse_f64(hi)) {
            (Some(lo), Some(hi)) if lo <= hi => Ok(Alt::Range(lo, hi)),
            _ => Err(GrammarError::BadValue {
                key: key.into(),
                value: a.into(),
                reason: "a range is `lo..hi` with numbers lo <= hi".into(),
            }),
        };
    }
    Ok(Alt::Word(a.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_alternatives_ranges_and_bare_keys() {
        let p = Pairs::parse(
            "dtype=bf16|f16, vocab=1..64|50257,mask",
            &["dtype", "vocab", "mask"],
        )
        .unwrap();
        assert_eq!(
            p.get("dtype").unwrap(),
            &[Alt::Word("bf16".into()), Alt::Word("f16".into())]
        );
        assert!(p.get("vocab").unwrap()[0].holds(64.0));
        assert!(p.get("vocab").unwrap()[1].holds(50257.0));
        assert_eq!(p.get("mask").unwrap(), &[Alt::Word("on".into())]);
        assert!(matches!(
            Pairs::parse("colour=red", &["dtype"]),
            Err(GrammarError::UnknownKey { .. })
        ));
        assert!(Pairs::parse("vocab=9..3", &["vocab"]).is_err());
    }

    #[test]
    fn numbers_round_trip() {
        for x in [0.7, 1e30, -1e30, 65504.0, 1e-50, 0.0, -100.0, 1.0 / 3.0] {
            assert_eq!(parse_f64(&num(x)), Some(x), "{x}");
        }
        assert!(parse_f64(&num(f64::NAN)).unwrap().is_nan());
    }
}
