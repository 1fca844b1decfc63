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
/// "fail" | "no bound", ...}, ...}` (other keys, such as `why`, are ignored).
#[derive(Clone, Debug, Default)]
pub struct Expectations(pub std::collections::BTreeMap<String, String>);

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
            let expect = entry
                .get("expect")
                .and_then(|e| e.as_str())
                .ok_or_else(|| format!("entry `{name}` has no string `expect`"))?;
            match expect {
                "pass" | "suspect" | "unchecked" | "fail" | "no bound" => {
                    out.insert(name.clone(), expect.to_string());
                }
                other => {
                    return Err(format!(
                        "entry `{name}`: expect = {other:?}, not pass, suspect, unchecked, fail or no bound"
                    ))
                }
            }
        }
        Ok(Expectations(out))
    }

    /// Compares outcomes with the expectations, in the outcomes' order.
    pub fn compare(&self, outcomes: &[FileOutcome]) -> Vec<ExpectRow> {
        outcomes
            .iter()
            .map(|o| {
                let (name, found) = match o {
                    FileOutcome::Report(r) => (r.name.clone(), r.verdict.name().to_string()),
                    FileOutcome::BadInput { path, .. } => (stem(path), "bad input".to_string()),
                };
                let expected = self.0.get(&name).cloned();
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
