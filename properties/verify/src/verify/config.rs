//! What `verify` checks: the row selection and the configuration (model,
//! accumulation dtype, statistical threshold, oracle, report sizes).

use serde::Serialize;

use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::Dtype;

use crate::tolerance;

/// Which rows of each dump to check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RowSelection {
    /// Every row.
    All,
    /// Rows `start..end` (clamped to `N`).
    Range {
        /// First row.
        start: usize,
        /// One past the last row.
        end: usize,
    },
    /// `k` rows spread evenly over `[0, N)`: rows `floor(i N / k)` for
    /// `i < k` (all rows when `k >= N`). Deterministic, so a rerun checks
    /// the same rows.
    Sample(usize),
}

impl std::str::FromStr for RowSelection {
    type Err = String;
    /// Parses `all`, `a..b`, `a..` or `sample:K`.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || format!("bad --rows `{s}`: expected `a..b`, `a..` or `sample:K`");
        if s == "all" {
            return Ok(RowSelection::All);
        }
        if let Some(k) = s.strip_prefix("sample:") {
            return match k.parse() {
                Ok(0) => Err(format!("--rows `{s}` selects no row: K must be at least 1")),
                Ok(k) => Ok(RowSelection::Sample(k)),
                Err(_) => Err(bad()),
            };
        }
        let (a, b) = s.split_once("..").ok_or_else(bad)?;
        let start = if a.is_empty() {
            0
        } else {
            a.parse().map_err(|_| bad())?
        };
        let end = if b.is_empty() {
            usize::MAX
        } else {
            b.parse().map_err(|_| bad())?
        };
        if end < start {
            return Err(bad());
        }
        if end == start {
            return Err(format!("--rows `{s}` selects no row (empty range)"));
        }
        Ok(RowSelection::Range { start, end })
    }
}

impl std::fmt::Display for RowSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RowSelection::All => f.write_str("all"),
            RowSelection::Range {
                start,
                end: usize::MAX,
            } => write!(f, "{start}.."),
            RowSelection::Range { start, end } => write!(f, "{start}..{end}"),
            RowSelection::Sample(k) => write!(f, "sample:{k}"),
        }
    }
}

impl RowSelection {
    /// The selected rows of a dump of `n` rows, ascending.
    pub fn rows(&self, n: usize) -> Vec<usize> {
        match *self {
            RowSelection::All => (0..n).collect(),
            RowSelection::Range { start, end } => (start.min(n)..end.min(n)).collect(),
            RowSelection::Sample(k) if k >= n => (0..n).collect(),
            // i n / k is strictly increasing in i for k < n: distinct rows.
            RowSelection::Sample(k) => (0..k)
                .map(|i| ((i as u128 * n as u128) / k as u128) as usize)
                .collect(),
        }
    }
}

/// Settings of a verification.
#[derive(Clone, Debug)]
pub struct VerifyConfig {
    /// Summation order of the bound (default [`tolerance::Order::DEFAULT`],
    /// `lanes=8`): a foreign-kernel preset.
    pub model: tolerance::Order,
    /// How the foreign kernel forms the shifted logits (default
    /// [`Shift::Any`](logprobe_reference::spec::Shift::Any): any form
    /// correct for the output judged, TOLERANCE.md (T2a)); a declared form
    /// bounds that form alone (T2).
    pub form: logprobe_reference::spec::Shift,
    /// How the foreign kernel evaluates `kl_k3` (default
    /// [`K3Form::Any`](tolerance::K3Form::Any): also the naive
    /// `exp(-d) + d - 1`; `Expm1` declares `expm1(-d) + d`, T20).
    pub k3_form: tolerance::K3Form,
    /// Accumulation dtype of the foreign kernel; `None` = the logits'
    /// accumulation dtype (f32 for f32/bf16/f16 logits, f64 for f64).
    pub accumulation: Option<Dtype>,
    /// Rows to check.
    pub rows: RowSelection,
    /// How many worst elements to report per output.
    pub worst: usize,
    /// Show progress on stderr: a bar on a terminal, otherwise a line every
    /// `progress_interval` ([`crate::progress`]).
    pub progress: bool,
    /// Time between two progress lines when stderr is not a terminal.
    pub progress_interval: std::time::Duration,
    /// The oracle's precision policy.
    pub oracle: Oracle,
    /// The statistical threshold's `c` (`None`: no SUSPECT tier); default
    /// [`tolerance::DEFAULT_C`]. Forward outputs only.
    pub statistical_c: Option<f64>,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        VerifyConfig {
            model: tolerance::Order::DEFAULT,
            form: logprobe_reference::spec::Shift::Any,
            k3_form: tolerance::K3Form::Any,
            accumulation: None,
            rows: RowSelection::All,
            worst: 5,
            progress: false,
            progress_interval: crate::progress::ProgressMode::DEFAULT_INTERVAL,
            oracle: Oracle::default(),
            statistical_c: Some(tolerance::DEFAULT_C),
        }
    }
}

impl VerifyConfig {
    /// This configuration for one dump: what the dump declares narrows it.
    /// `k3_form=expm1` in the dump's metadata declares the `expm1` form as
    /// `--k3-form expm1` does (either declaration suffices: each is a
    /// claim about the kernel, and the narrower bound holds it to it).
    pub fn for_dump(&self, dump: &crate::dump::Dump<'_>) -> VerifyConfig {
        let mut c = self.clone();
        if dump.format.k3_expm1 {
            c.k3_form = tolerance::K3Form::Expm1;
        }
        c
    }
}
