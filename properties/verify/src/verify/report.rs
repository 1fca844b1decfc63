//! The reports `verify` returns: the verdict vocabulary, per-element
//! judgements, per-output and per-file reports (serialised as the JSON of
//! `verify --json`).

use std::path::PathBuf;

use serde::Serialize;

use logprobe_reference::oracle::Fallback;

use crate::dump::DumpError;
use crate::json::{json_f64, json_opt_f64};

/// A verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ReportVerdict {
    /// Every element within its bound.
    Pass,
    /// Every element within its sound bound, some beyond the statistical
    /// threshold ([`tolerance::Statistical`](crate::tolerance::Statistical)):
    /// far less accurate than a correct implementation in any calibrated
    /// order. Exit 0, 1 with `--strict`.
    Suspect,
    /// An output the dump gives had no element checked (every row excluded
    /// or ignored, `K = 0`, `N = 0`) and nothing else is wrong: not a pass
    /// (exit 1). The report says why per output (`nothing_checked`).
    Unchecked,
    /// The model certifies nothing (`n u >= 1`) and nothing is definitely
    /// wrong: not a pass.
    NoBound,
    /// Some element beyond its bound.
    Fail,
}

impl ReportVerdict {
    /// `pass`, `suspect`, `unchecked`, `no bound` or `fail` (the
    /// `--expect` vocabulary).
    pub fn name(self) -> &'static str {
        match self {
            ReportVerdict::Pass => "pass",
            ReportVerdict::Suspect => "suspect",
            ReportVerdict::Unchecked => "unchecked",
            ReportVerdict::NoBound => "no bound",
            ReportVerdict::Fail => "fail",
        }
    }
}

impl std::fmt::Display for ReportVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReportVerdict::Pass => "pass",
            ReportVerdict::Suspect => "SUSPECT",
            ReportVerdict::Unchecked => "UNCHECKED",
            ReportVerdict::NoBound => "no bound",
            ReportVerdict::Fail => "FAIL",
        })
    }
}

/// One judged element.
#[derive(Clone, Debug, Serialize)]
pub struct Judged {
    /// Row of the dump.
    pub row: usize,
    /// `(b, t)` of the row for `[B, T, V]` logits.
    pub position: Option<(usize, usize)>,
    /// Column: `k` for top-k, vocabulary index for `grad_logits`.
    pub col: Option<usize>,
    /// The candidate value (exact f64 of the stored value).
    #[serde(serialize_with = "json_f64")]
    pub candidate: f64,
    /// The exact value: midpoint of the oracle's enclosure, as f64.
    #[serde(serialize_with = "json_f64")]
    pub exact: f64,
    /// The exact value correctly rounded to the candidate's dtype.
    #[serde(serialize_with = "json_f64")]
    pub exact_rounded: f64,
    /// Upper bound on `|candidate - exact|` (nats, or nats per logit for
    /// gradients).
    #[serde(serialize_with = "json_f64")]
    pub error: f64,
    /// `error` in ulps of the candidate's dtype at the exact value.
    #[serde(serialize_with = "json_f64")]
    pub ulps: f64,
    /// The bound under the chosen model; `None` = no bound.
    #[serde(serialize_with = "json_opt_f64")]
    pub bound: Option<f64>,
    /// `error / bound` (`inf` when the bound is 0 and the error is not, or
    /// without a bound).
    #[serde(serialize_with = "json_f64")]
    pub ratio: f64,
}

/// The relative rule's figure for one output (TOLERANCE.md, "The relative
/// rule"; [`tolerance::RelativeRule`](crate::tolerance::RelativeRule)).
#[derive(Clone, Debug, Serialize)]
pub struct RelativeRuleReport {
    /// `max error / max(careful code's max error, floor)`.
    #[serde(serialize_with = "json_f64")]
    pub ratio: f64,
    /// The rule's `R`: it fires when `ratio > r`.
    #[serde(serialize_with = "json_f64")]
    pub r: f64,
    /// Careful code's largest error on the same elements (nats, or the
    /// output's unit).
    #[serde(serialize_with = "json_f64")]
    pub careful_max_abs_error: f64,
    /// The floor of careful code's error: the largest over the elements of
    /// half an ulp of the output's dtype at the exact value and, for
    /// outputs computed from a log-prob, what one ulp of it implies.
    #[serde(serialize_with = "json_f64")]
    pub floor: f64,
    /// Whether the rule fires (the output is then SUSPECT).
    pub fires: bool,
}

/// The largest `error / bound` of an output under one reference model.
#[derive(Clone, Debug, Serialize)]
pub struct ModelRatio {
    /// `tree`, `lanes=8` or `sequential`.
    pub model: String,
    /// Largest ratio; `None` when the model certifies nothing for some element.
    #[serde(serialize_with = "json_opt_f64")]
    pub max_ratio: Option<f64>,
}

/// The judgement of one output of one dump.
#[derive(Clone, Debug, Serialize)]
pub struct OutputReport {
    /// `log_probs`, `entropy`, `topk_log_probs` or `grad_logits`.
    pub output: &'static str,
    /// Dtype of the candidate tensor.
    pub dtype: String,
    /// Elements judged.
    pub count: usize,
    /// ReportVerdict under the chosen model.
    pub verdict: ReportVerdict,
    /// Largest error bound `|candidate - exact|`.
    #[serde(serialize_with = "json_f64")]
    pub max_abs_error: f64,
    /// Largest error in ulps of the candidate's dtype.
    #[serde(serialize_with = "json_f64")]
    pub max_ulps: f64,
    /// Largest `error / bound` (`null` when nothing has a bound).
    #[serde(serialize_with = "json_opt_f64")]
    pub max_ratio: Option<f64>,
    /// The tightest of `tree`, `lanes=8`, `sequential` under which every
    /// element is within bound; `None` when none is.
    pub tightest_model: Option<String>,
    /// Largest `error / bound` under each reference model, in
    /// [`tolerance::Order::REFERENCE`](crate::tolerance::Order::REFERENCE) order.
    pub reference_ratios: Vec<ModelRatio>,
    /// The relative rule, for the outputs it covers (`null` otherwise).
    pub relative_rule: Option<RelativeRuleReport>,
    /// Why the chosen model certifies nothing (first element without a bound).
    pub no_bound_reason: Option<String>,
    /// Elements within the sound bound but beyond the statistical threshold.
    pub suspect_elements: usize,
    /// Largest `error / statistical threshold` (`null` without a tier:
    /// the LM head's gradients, or `--statistical-c` off).
    #[serde(serialize_with = "json_opt_f64")]
    pub statistical_max_ratio: Option<f64>,
    /// The rules that find the output SUSPECT, in this order:
    /// `statistical`, `relative` (empty when none does).
    pub suspect_rules: Vec<&'static str>,
    /// The worst elements, worst first (by ratio, then by error).
    pub worst: Vec<Judged>,
    /// Why no element was checked (no row, every row ignored, `K = 0`);
    /// `None` when some element was. Such an output is valid but certifies
    /// nothing: the table says "unchecked".
    pub nothing_checked: Option<String>,
    /// The `loss`'s reduction (`none`, `sum`, `mean`; `None` for other
    /// outputs). Under `sum` / `mean` the output is one element for the
    /// whole dump: its `worst` entry has `row` 0 and no position.
    pub reduction: Option<&'static str>,
}

/// The judgement of one dump.
#[derive(Clone, Debug, Serialize)]
pub struct FileReport {
    /// The file.
    pub path: PathBuf,
    /// File stem (the key in `expected.json`).
    pub name: String,
    /// Overall verdict (the worst of the outputs').
    pub verdict: ReportVerdict,
    /// `N`.
    pub rows: usize,
    /// Rows checked (`--rows`).
    pub rows_checked: usize,
    /// Columns of logits (`V_total`).
    pub columns: usize,
    /// Real vocabulary size.
    pub vocab_size: usize,
    /// Dtype of the logits.
    pub logits_dtype: String,
    /// Summation model of the bound (`lanes=8`), with ` form=NAME` and
    /// ` k3_form=NAME` when declared (`--form`, `--k3-form`; the defaults,
    /// `any`, unnamed).
    pub model: String,
    /// Accumulation dtype of the bound.
    pub accumulation: String,
    /// The statistical threshold's `c` (`null`: no SUSPECT tier).
    #[serde(serialize_with = "json_opt_f64")]
    pub statistical_c: Option<f64>,
    /// Per output.
    pub outputs: Vec<OutputReport>,
    /// `topk_ids` judged as the kernel's top-k (`topk_ids_source=kernel`).
    pub topk_ids: Option<crate::topk_set::TopkSetReport>,
    /// Tensors the format does not define (not read).
    pub ignored_tensors: Vec<String>,
    /// What MPFR had to decide after the f64 tier.
    pub fallback: FallbackReport,
    /// The files of a tensor-parallel set verified as this dump (absent
    /// for a dump of its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tp_set: Option<TpSetReport>,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// A tensor-parallel set judged as one dump ([`super::verify_set`]).
#[derive(Clone, Debug, Serialize)]
pub struct TpSetReport {
    /// Every rank's file, in rank order.
    pub files: Vec<PathBuf>,
    /// The ranks whose global outputs (all-reduced: `loss`, `log_probs`,
    /// `grad_hidden`, ...) are the ones judged here: they hold the same
    /// bits. Every rank is in the list of exactly one report.
    pub ranks: Vec<u64>,
}

/// How much of a verification the MPFR path decided after the certified
/// f64 tier (`docs/fast-oracle.md`): outputs (forward values including
/// `lse`, grad elements, one statistics set per row) and rows.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FallbackReport {
    /// Oracle outputs computed.
    pub outputs: u64,
    /// Of those, decided by MPFR.
    pub outputs_mpfr: u64,
    /// Rows checked.
    pub rows: u64,
    /// Rows in which MPFR ran at all.
    pub rows_mpfr: u64,
    /// `outputs_mpfr / outputs` (0 when nothing was computed).
    #[serde(serialize_with = "json_f64")]
    pub output_rate: f64,
    /// `rows_mpfr / rows` (0 when no row was checked).
    #[serde(serialize_with = "json_f64")]
    pub row_rate: f64,
}

impl From<Fallback> for FallbackReport {
    fn from(f: Fallback) -> Self {
        FallbackReport {
            outputs: f.outputs,
            outputs_mpfr: f.outputs_mpfr,
            rows: f.rows,
            rows_mpfr: f.rows_mpfr,
            output_rate: f.output_rate(),
            row_rate: f.row_rate(),
        }
    }
}

/// The result of verifying one file: a report, or the bad input found.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per file: boxing the report buys nothing
pub enum FileOutcome {
    /// Verified.
    Report(FileReport),
    /// Bad input (exit status 2).
    BadInput {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: DumpError,
    },
}
