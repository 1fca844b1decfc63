//! The one JSON writer of `verify --json` and `compare --json`: the
//! number format (`json_f64`: non-finite values as strings), the document
//! envelope of `verify` ([`VerifyDocument`]; `compare`'s is
//! [`CompareReport`](crate::compare::CompareReport)) and the text written
//! ([`to_document`]: pretty-printed, one trailing newline).

use std::path::Path;

use serde::Serialize;

use crate::verify::{ExpectRow, FileOutcome, FileReport};

/// Serialises an f64 as a JSON number, or as the string `"inf"`, `"-inf"`
/// or `"NaN"` (JSON has no non-finite numbers).
pub(crate) fn json_f64<S: serde::Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        s.serialize_f64(*x)
    } else if x.is_nan() {
        s.serialize_str("NaN")
    } else if *x > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

/// [`json_f64`] for an optional value (`null` when absent).
pub(crate) fn json_opt_f64<S: serde::Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match x {
        Some(v) => json_f64(v, s),
        None => s.serialize_none(),
    }
}

/// A report that cannot be written as JSON (a bug: every report
/// serialises).
#[derive(Debug, thiserror::Error)]
#[error("cannot serialise the report: {0}")]
pub struct JsonError(#[from] serde_json::Error);

/// The text of a `--json` document: `doc` pretty-printed, then a newline.
///
/// # Errors
/// [`JsonError`] when `doc` does not serialise.
pub fn to_document<T: Serialize + ?Sized>(doc: &T) -> Result<String, JsonError> {
    Ok(serde_json::to_string_pretty(doc)? + "\n")
}

/// `schema_version` of the `verify --json` document: 2 since the relative
/// rule replaced the flash rule and our fused kernel's comparison (per
/// output `relative_rule` and `suspect_rules`; `flash_rule`, `vs_fused` and
/// `fused_max_abs_error` are gone; docs/verify.md, "JSON").
pub const VERIFY_SCHEMA_VERSION: u32 = 2;

/// The JSON document of `verify --json`.
#[derive(Serialize)]
pub struct VerifyDocument<'a> {
    /// Version of this document's layout ([`VERIFY_SCHEMA_VERSION`]).
    schema_version: u32,
    /// One entry per file, in the order given.
    files: Vec<JsonFile<'a>>,
    /// The `--expect` rows, when given.
    expect: Option<&'a [ExpectRow]>,
    /// The command's exit status.
    exit_status: u8,
}

/// One file of [`VerifyDocument`]: its report, or why it is bad input.
#[derive(Serialize)]
#[serde(untagged)]
enum JsonFile<'a> {
    Report(&'a FileReport),
    BadInput {
        path: &'a Path,
        verdict: &'static str,
        error: String,
    },
}

impl<'a> VerifyDocument<'a> {
    /// The document of `outcomes` (bad input as `verdict: "bad input"` with
    /// its error), the `--expect` rows and the exit status.
    pub fn new(
        outcomes: &'a [FileOutcome],
        expect: Option<&'a [ExpectRow]>,
        exit_status: u8,
    ) -> Self {
        let files = outcomes
            .iter()
            .map(|o| match o {
                FileOutcome::Report(r) => JsonFile::Report(r),
                FileOutcome::BadInput { path, error } => JsonFile::BadInput {
                    path,
                    verdict: "bad input",
                    error: error.to_string(),
                },
            })
            .collect();
        VerifyDocument {
            schema_version: VERIFY_SCHEMA_VERSION,
            files,
            expect,
            exit_status,
        }
    }
}
