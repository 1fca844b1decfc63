//! The report of `compare A B` (serialized as its JSON document,
//! [`super::SCHEMA_VERSION`]): per row the decomposition's enclosures
//! ([`CompareRow`]), over the rows their magnitudes ([`Summary`]).

use std::path::PathBuf;

use serde::Serialize;

use logprobe_reference::oracle::Interval;

use super::Side;
use crate::json::{json_f64, json_opt_f64};
use crate::verify::ReportVerdict as Verdict;

/// An enclosure `[lo, hi]` of an exact real (nats), f64 ends rounded
/// outward, with its midpoint `value` (the figure tables and summaries use).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Enclosure {
    /// Midpoint of `[lo, hi]` (`lo` when the ends are equal or infinite).
    #[serde(serialize_with = "json_f64")]
    pub value: f64,
    /// Lower end.
    #[serde(serialize_with = "json_f64")]
    pub lo: f64,
    /// Upper end.
    #[serde(serialize_with = "json_f64")]
    pub hi: f64,
}

impl Enclosure {
    /// The enclosure `i` with its midpoint.
    pub(super) fn of(i: Interval) -> Self {
        let value = if i.lo == i.hi || !(i.lo.is_finite() && i.hi.is_finite()) {
            if i.lo.is_nan() {
                i.hi
            } else {
                i.lo
            }
        } else {
            i.lo / 2.0 + i.hi / 2.0
        };
        Enclosure {
            value,
            lo: i.lo,
            hi: i.hi,
        }
    }

    /// The enclosure as the oracle's [`Interval`].
    pub fn interval(&self) -> Interval {
        Interval {
            lo: self.lo,
            hi: self.hi,
        }
    }
}

/// One compared row.
#[derive(Clone, Debug, Serialize)]
pub struct CompareRow {
    /// Flat row index (`b * T + t` for `[B, T]` rows).
    pub row: usize,
    /// `(b, t)` for `[B, T]` rows.
    pub position: Option<(usize, usize)>,
    /// The token (the same on both sides).
    pub token: i64,
    /// A's candidate log-prob (exact f64 of the stored value).
    #[serde(serialize_with = "json_f64")]
    pub log_prob_a: f64,
    /// B's candidate log-prob (`null` when B has none).
    #[serde(serialize_with = "json_opt_f64")]
    pub log_prob_b: Option<f64>,
    /// `exact(logits_A)`: the oracle's enclosure.
    pub exact_a: Enclosure,
    /// `exact(logits_B)` (`null` without B's logits).
    pub exact_b: Option<Enclosure>,
    /// `lp_A - exact(logits_A)`.
    pub kernel_error_a: Enclosure,
    /// `lp_B - exact(logits_B)`.
    pub kernel_error_b: Option<Enclosure>,
    /// `exact(logits_A) - exact(logits_B)`.
    pub logits_effect: Option<Enclosure>,
    /// `lp_A - lp_B`.
    pub observed: Option<Enclosure>,
    /// `lp_B - exact(logits_A)` (only without B's logits).
    pub b_minus_exact_a: Option<Enclosure>,
    /// `KL(softmax(z'_A) || softmax(z'_B))` (both sides' logits, `kl` on).
    pub kl: Option<Enclosure>,
    /// The two candidate log-probs are the same bits in the same dtype.
    pub log_probs_bitwise_equal: Option<bool>,
    /// The two logits rows are the same bits in the same dtype (and the
    /// same temperature and mask).
    pub logits_bitwise_equal: Option<bool>,
    /// The same decomposition of the entropy, when A has an `entropy`
    /// candidate (B's from its own candidate, when it has one).
    pub entropy: Option<EntropyRow>,
}

/// The entropy's decomposition of one row (nats; enclosures as for the
/// log-probs): `observed = kernel_error_a - kernel_error_b + logits_effect`
/// with `kernel_error = H - exact_entropy(logits)`.
#[derive(Clone, Debug, Serialize)]
pub struct EntropyRow {
    /// A's candidate entropy.
    #[serde(serialize_with = "json_f64")]
    pub entropy_a: f64,
    /// B's candidate entropy (`null` when B has none).
    #[serde(serialize_with = "json_opt_f64")]
    pub entropy_b: Option<f64>,
    /// The exact entropy of A's logits.
    pub exact_a: Enclosure,
    /// The exact entropy of B's logits (`null` without them).
    pub exact_b: Option<Enclosure>,
    /// `H_A - exact(logits_A)`.
    pub kernel_error_a: Enclosure,
    /// `H_B - exact(logits_B)`.
    pub kernel_error_b: Option<Enclosure>,
    /// `exact(logits_A) - exact(logits_B)`.
    pub logits_effect: Option<Enclosure>,
    /// `H_A - H_B`.
    pub observed: Option<Enclosure>,
}

/// Mean and max `|x|` of a quantity over the compared rows (midpoints).
#[derive(Clone, Debug, Serialize)]
pub struct Magnitude {
    /// Rows with a value.
    pub rows: usize,
    /// `mean |x|`.
    #[serde(serialize_with = "json_f64")]
    pub mean_abs: f64,
    /// `max |x|`.
    #[serde(serialize_with = "json_f64")]
    pub max_abs: f64,
    /// The flat row of the max.
    pub max_row: Option<usize>,
    /// Its `(b, t)`.
    pub max_position: Option<(usize, usize)>,
}

/// The importance ratio `exp(observed) = exp(lp_A - lp_B)` (A the trainer,
/// B the behaviour policy, as PPO / GRPO take it).
#[derive(Clone, Debug, Serialize)]
pub struct RatioSummary {
    /// Smallest ratio.
    #[serde(serialize_with = "json_f64")]
    pub min: f64,
    /// Largest ratio.
    #[serde(serialize_with = "json_f64")]
    pub max: f64,
    /// The clip range's `eps` (`--clip`).
    pub clip: f64,
    /// Rows whose ratio is outside `[1 - eps, 1 + eps]`.
    pub outside_clip: usize,
    /// `outside_clip / rows`.
    #[serde(serialize_with = "json_f64")]
    pub outside_clip_fraction: f64,
}

/// One side's kernel against its derived bound: `verify`'s judgement of
/// one output of that side's dump, on the same rows.
#[derive(Clone, Debug, Serialize)]
pub struct KernelBound {
    /// `A` or `B`.
    pub side: Side,
    /// `log_probs` or `entropy`.
    pub output: &'static str,
    /// Dtype of the candidate.
    pub dtype: String,
    /// Verdict under the model.
    pub verdict: Verdict,
    /// Largest `error / bound` (`null`: no bound).
    #[serde(serialize_with = "json_opt_f64")]
    pub max_ratio: Option<f64>,
    /// The tightest of tree, lanes=8, sequential that the output meets.
    pub tightest_model: Option<String>,
}

/// One side's candidate log-probs that are NaN or infinite on compared
/// rows: a kernel fault (a compared row's exact log-prob is finite).
#[derive(Clone, Debug, Serialize)]
pub struct NonFinite {
    /// `A` or `B`.
    pub side: Side,
    /// Compared rows whose candidate log-prob is NaN or `±inf`.
    pub rows: usize,
    /// The first such row (flat index).
    pub first_row: usize,
    /// Its value: `NaN`, `inf` or `-inf`.
    pub first_value: String,
}

/// The summary of a comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Rows compared (0: nothing compared, exit 1).
    pub rows: usize,
    /// Per side, its NaN / infinite candidate log-probs (empty when all
    /// are finite): a kernel fault, exit 1.
    pub non_finite: Vec<NonFinite>,
    /// `|lp_A - lp_B|` (`null` without B's log-probs).
    pub observed: Option<Magnitude>,
    /// `|kernel_error_a|`.
    pub kernel_error_a: Magnitude,
    /// `|kernel_error_b|` (`null` without B's logits or log-probs).
    pub kernel_error_b: Option<Magnitude>,
    /// `|logits_effect|` (`null` without B's logits).
    pub logits_effect: Option<Magnitude>,
    /// `|lp_B - exact(logits_A)|` (only without B's logits).
    pub b_minus_exact_a: Option<Magnitude>,
    /// `KL(A || B)`: mean and max.
    pub kl: Option<Magnitude>,
    /// Rows whose candidate log-probs are bitwise equal.
    pub bitwise_equal_rows: Option<usize>,
    /// Rows whose logits are bitwise equal (both sides' logits).
    pub logits_bitwise_equal_rows: Option<usize>,
    /// `exp(observed)`.
    pub importance_ratio: Option<RatioSummary>,
    /// Pearson correlation of `lp_A` and `lp_B` (`null` below 2 rows or at
    /// zero variance).
    #[serde(serialize_with = "json_opt_f64")]
    pub pearson_log_probs: Option<f64>,
    /// Pearson correlation of `exp(lp_A)` and `exp(lp_B)`: verl's
    /// `training/rollout_actor_probs_pearson_corr`.
    #[serde(serialize_with = "json_opt_f64")]
    pub pearson_probs: Option<f64>,
    /// Share of kernel numerics in the mismatch's magnitude (module docs):
    /// A's part.
    #[serde(serialize_with = "json_opt_f64")]
    pub share_kernel_a: Option<f64>,
    /// B's kernel part (`null` without B's logits).
    #[serde(serialize_with = "json_opt_f64")]
    pub share_kernel_b: Option<f64>,
    /// The logits' part (without B's logits: B's kernel and logits together).
    #[serde(serialize_with = "json_opt_f64")]
    pub share_logits: Option<f64>,
    /// Each side's kernel against its bound (sides with logits).
    pub kernel_bounds: Vec<KernelBound>,
    /// The entropy's magnitudes, when A has an entropy candidate.
    pub entropy: Option<EntropySummary>,
    /// The one-line verdict.
    pub verdict: String,
}

/// Mean and max `|.|` of the entropy's decomposition (nats).
#[derive(Clone, Debug, Serialize)]
pub struct EntropySummary {
    /// `|H_A - H_B|` (`null` without B's entropy).
    pub observed: Option<Magnitude>,
    /// `|H_A - exact(logits_A)|`.
    pub kernel_error_a: Option<Magnitude>,
    /// `|H_B - exact(logits_B)|`.
    pub kernel_error_b: Option<Magnitude>,
    /// `|exact(logits_A) - exact(logits_B)|`.
    pub logits_effect: Option<Magnitude>,
}

/// Facts of one side for the report's header.
#[derive(Clone, Debug, Serialize)]
pub struct SideInfo {
    /// The file.
    pub path: PathBuf,
    /// Dtype of the logits (`null`: no logits).
    pub logits_dtype: Option<String>,
    /// Dtype of the candidate log-probs (`null`: none).
    pub log_probs_dtype: Option<String>,
    /// Real vocabulary size (`null`: no logits).
    pub vocab_size: Option<usize>,
}

/// The report of `compare A B`.
#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    /// Version of this document's layout ([`super::SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// A.
    pub a: SideInfo,
    /// B.
    pub b: SideInfo,
    /// Rows of each dump (`N`).
    pub rows_total: usize,
    /// `(B, T)` for `[B, T]` rows.
    pub batch: Option<(usize, usize)>,
    /// Rows `row_mask` excludes (among the selected).
    pub rows_masked: usize,
    /// Rows whose token is `ignore_index` (among the selected, kept ones).
    pub rows_ignored: usize,
    /// The summary.
    pub summary: Summary,
    /// Every compared row, in row order.
    pub rows: Vec<CompareRow>,
    /// Exit status: 0 compared (at least one row) and every kernel within
    /// its bound; 1 a kernel beyond its bound, "no bound" or unchecked, a
    /// NaN / infinite candidate log-prob, or no row compared.
    pub exit_status: u8,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Rows the table lists ([`super::CompareConfig::worst`]; not in the JSON).
    #[serde(skip)]
    pub worst_rows: usize,
}
