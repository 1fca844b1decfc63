//! `--expect`: the expected verdicts of a set of dumps, the comparison,
//! and the exit status.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::*;

/// One line of an `--expect` comparison.
#[derive(Clone, Debug, Serialize)]
pub struct ExpectRow {
    /// File stem.
    pub name: String,
    /// The expected verdict (`pass`, `suspect`, `unchecked`, `fail`, `no bound`), `None` when the
    /// file is not listed.
    pub expected: Option<String>,
    /// The verdict found (`pass`, `fail`, `no bound`, `bad input`).
    pub found: String,
    /// Whether they agree.
    pub matches: bool,
}

/// Errors of an `--expect` file.
#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    /// Unreadable file.
    #[error("cannot read expectations {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not `{"name": {"expect": "pass" | "suspect" | "unchecked" | "fail" | "no bound"}, ...}`.
    #[error("bad expectations {path}: {reason}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Expected verdicts by file stem, from JSON `{"name": {"expect": "pass" |
/// "suspect" | "unchecked" | "fail" | "no bound", "strict": ..., ...}, ...}`
/// (other keys, such as `why`, are ignored; docs/verify.md, "Expected
/// verdicts").
#[derive(Clone, Debug, Default)]
pub struct Expectations(pub std::collections::BTreeMap<String, Expected>);

/// One file's expected verdicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The verdict without `--strict` (`expect`).
    pub default: String,
    /// The verdict under `--strict` (`strict`); when absent, `default`
    /// with `suspect` read as `fail` (what `--strict` makes of it).
    pub strict: Option<String>,
}

impl Expected {
    /// The verdict expected in this mode.
    pub fn in_mode(&self, strict: bool) -> &str {
        match (&self.strict, strict) {
            (Some(s), true) => s,
            (None, true) => strict_verdict(&self.default),
            (_, false) => &self.default,
        }
    }
}

/// What `--strict` makes of a verdict: `suspect` fails, the rest stay.
fn strict_verdict(v: &str) -> &str {
    if v == "suspect" {
        "fail"
    } else {
        v
    }
}

const VERDICTS: [&str; 5] = ["pass", "suspect", "unchecked", "fail", "no bound"];

impl Expectations {
    /// Reads and checks an expectations file.
    ///
    /// # Errors
    /// [`ExpectError`].
    pub fn load(path: &Path) -> Result<Self, ExpectError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExpectError::Io {
            path: path.into(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| ExpectError::Format {
            path: path.into(),
            reason,
        })
    }

    /// Parses the JSON text; the error is a description.
    ///
    /// # Errors
    /// A message naming the entry at fault.
    pub fn parse(text: &str) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let obj = value.as_object().ok_or("top level is not an object")?;
        let mut out = std::collections::BTreeMap::new();
        for (name, entry) in obj {
            let verdict = |key: &str| -> Result<Option<String>, String> {
                match entry.get(key) {
                    None => Ok(None),
                    Some(v) => match v.as_str() {
                        Some(v) if VERDICTS.contains(&v) => Ok(Some(v.to_string())),
                        _ => Err(format!(
                            "entry `{name}`: {key} = {v}, not pass, suspect, unchecked, fail or no bound"
                        )),
                    },
                }
            };
            let default = verdict("expect")?
                .ok_or_else(|| format!("entry `{name}` has no string `expect`"))?;
            let strict = verdict("strict")?;
            if strict.as_deref() == Some("suspect") {
                return Err(format!(
                    "entry `{name}`: strict = \"suspect\", but --strict fails every suspect verdict"
                ));
            }
            out.insert(name.clone(), Expected { default, strict });
        }
        Ok(Expectations(out))
    }

    /// Compares outcomes with the expectations, in the outcomes' order,
    /// without `--strict` ([`Expectations::compare_mode`]).
    pub fn compare(&self, outcomes: &[FileOutcome]) -> Vec<ExpectRow> {
        self.compare_mode(outcomes, false)
    }

    /// Compares outcomes with the expectations of a mode: under `strict` a
    /// `suspect` verdict found is `fail`, and so is one expected unless
    /// the entry gives its `strict` verdict.
    pub fn compare_mode(&self, outcomes: &[FileOutcome], strict: bool) -> Vec<ExpectRow> {
        outcomes
            .iter()
            .map(|o| {
                let (name, found) = match o {
                    FileOutcome::Report(r) => {
                        let v = r.verdict.name();
                        let v = if strict { strict_verdict(v) } else { v };
                        (r.name.clone(), v.to_string())
                    }
                    FileOutcome::BadInput { path, .. } => (stem(path), "bad input".to_string()),
                };
                let expected = self.0.get(&name).map(|e| e.in_mode(strict).to_string());
                let matches = expected.as_deref() == Some(found.as_str());
                ExpectRow {
                    name,
                    expected,
                    found,
                    matches,
                }
            })
            .collect()
    }
}

fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The `--expect` comparison as text.
pub fn render_expect(rows: &[ExpectRow]) -> String {
    use std::fmt::Write;
    let mut s = String::from("expected verdicts:\n");
    for r in rows {
        let _ = writeln!(
            s,
            "  {:<36} expected {:<9} found {:<9} {}",
            r.name,
            r.expected.as_deref().unwrap_or("(unlisted)"),
            r.found,
            if r.matches { "ok" } else { "MISMATCH" }
        );
    }
    let bad = rows.iter().filter(|r| !r.matches).count();
    let _ = writeln!(s, "{} of {} as expected", rows.len() - bad, rows.len());
    s
}

/// The exit status of `logprobe verify`: 2 when any file is bad input;
/// otherwise, with expectations, 0 when every verdict matches and 1 when
/// one does not; without, 0 when every file passes and 1 when any fails
/// or has no bound.
pub fn exit_status(outcomes: &[FileOutcome], expect: Option<&[ExpectRow]>) -> u8 {
    exit_status_strict(outcomes, expect, false)
}

/// [`exit_status`], where without expectations a `suspect` verdict passes
/// (exit 0) unless `strict` (exit 1).
pub fn exit_status_strict(
    outcomes: &[FileOutcome],
    expect: Option<&[ExpectRow]>,
    strict: bool,
) -> u8 {
    if outcomes
        .iter()
        .any(|o| matches!(o, FileOutcome::BadInput { .. }))
    {
        return 2;
    }
    match expect {
        Some(rows) => u8::from(!rows.iter().all(|r| r.matches)),
        None => u8::from(!outcomes.iter().all(|o| {
            matches!(o, FileOutcome::Report(r) if r.verdict == ReportVerdict::Pass
                    || (!strict && r.verdict == ReportVerdict::Suspect))
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_reads_suspect_as_fail_unless_the_entry_says_otherwise() {
        let e = Expectations::parse(
            r#"{"a": {"expect": "suspect"}, "b": {"expect": "suspect", "strict": "pass"},
                "c": {"expect": "pass", "why": "x"}}"#,
        )
        .unwrap();
        assert_eq!(e.0["a"].in_mode(false), "suspect");
        assert_eq!(e.0["a"].in_mode(true), "fail");
        assert_eq!(e.0["b"].in_mode(true), "pass");
        assert_eq!(e.0["c"].in_mode(true), "pass");
        assert_eq!(strict_verdict("suspect"), "fail");
        assert_eq!(strict_verdict("no bound"), "no bound");
    }

    #[test]
    fn bad_entries_are_named() {
        for (text, what) in [
            (r#"{"a": {"expect": "ok"}}"#, "entry `a`: expect"),
            (r#"{"a": {"why": "x"}}"#, "entry `a` has no string `expect`"),
            (
                r#"{"a": {"expect": "pass", "strict": 1}}"#,
                "entry `a`: strict",
            ),
            (
                r#"{"a": {"expect": "pass", "strict": "suspect"}}"#,
                "--strict fails every",
            ),
        ] {
            let err = Expectations::parse(text).unwrap_err();
            assert!(err.contains(what), "{text}: {err}");
        }
    }
}
