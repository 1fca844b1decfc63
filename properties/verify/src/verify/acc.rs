//! The per-output accumulators of the verify engine: judged elements,
//! the worst of them, the reference models' ratios, and an output's
//! report built from them.

use logprobe_reference::oracle::{Exact, Interval};
use logprobe_reference::spec::Dtype;

use crate::tolerance;

use super::grad_screen::Screened;
use super::*;

/// Accumulates judged elements of one output.
#[derive(Clone, Debug)]
pub(super) struct OutputAcc {
    pub(super) count: usize,
    pub(super) max_abs: f64,
    pub(super) max_ulps: f64,
    /// Largest ratio under the chosen model (finite bounds only).
    pub(super) max_ratio: Option<f64>,
    pub(super) any_no_bound: bool,
    pub(super) any_fail: bool,
    /// Per reference model: largest ratio, and whether any element had no bound.
    pub(super) reference: [(Option<f64>, bool); 3],
    /// The relative rule (log-softmax outputs of materialised logits).
    pub(super) relative: Option<tolerance::RelativeRule>,
    /// Why the chosen model gave no bound (first occurrence).
    pub(super) no_bound_reason: Option<String>,
    pub(super) worst: Vec<Judged>,
    /// Statistical tier: suspect elements, largest error / threshold.
    pub(super) suspect: usize,
    pub(super) stat_ratio: Option<f64>,
    /// The key ([`worse`]) of the last of the `keep` worst elements after
    /// the latest trim: an element strictly below it can never be among
    /// them (the key only rises), so [`OutputAcc::push`] does not keep it.
    worst_floor: Option<(f64, f64)>,
}

impl OutputAcc {
    pub(super) fn new() -> Self {
        OutputAcc {
            count: 0,
            max_abs: 0.0,
            max_ulps: 0.0,
            max_ratio: None,
            any_no_bound: false,
            any_fail: false,
            reference: [(None, false); 3],
            relative: None,
            no_bound_reason: None,
            worst: Vec::new(),
            suspect: 0,
            stat_ratio: None,
            worst_floor: None,
        }
    }

    /// Adds one element judged under the chosen model, with its
    /// `error / bound` under the reference models (`None` = no bound).
    pub(super) fn push(&mut self, j: Judged, reference: [Option<f64>; 3], keep: usize) {
        self.count += 1;
        self.max_abs = max_nan(self.max_abs, j.error);
        self.max_ulps = max_nan(self.max_ulps, j.ulps);
        // A NaN or infinite candidate where the exact value is finite is
        // wrong under any model.
        let definitely_wrong = j.error.is_nan() || j.error == f64::INFINITY;
        match j.bound {
            Some(b) => {
                self.max_ratio = Some(max_nan(self.max_ratio.unwrap_or(0.0), j.ratio));
                // NaN errors fail too.
                if j.error.partial_cmp(&b) != Some(std::cmp::Ordering::Less) && j.error != b {
                    self.any_fail = true;
                }
            }
            None => {
                self.any_no_bound = true;
                if definitely_wrong {
                    self.any_fail = true;
                }
            }
        }
        for (acc, r) in self.reference.iter_mut().zip(reference) {
            match r {
                Some(r) => acc.0 = Some(max_nan(acc.0.unwrap_or(0.0), r)),
                None => acc.1 = true,
            }
        }
        let below = self
            .worst_floor
            .is_some_and(|f| worse(&j).partial_cmp(&f) == Some(std::cmp::Ordering::Less));
        if keep > 0 && !below {
            self.worst.push(j);
            if self.worst.len() > 4 * keep {
                self.trim(keep);
            }
        }
    }

    /// Beside [`OutputAcc::absorbs`]: whether the element is within its
    /// statistical `threshold` and its ratio to it stays within the
    /// maximum so far (an upper bound of its error, rounded up), so that
    /// not observing it changes nothing of the tier.
    pub(super) fn absorbs_statistical(
        &self,
        exact: &Exact,
        candidate: f64,
        threshold: &tolerance::ErrorBound,
    ) -> bool {
        let Interval { lo, hi } = exact.enclosure;
        let (Some(max), tolerance::ErrorBound::Abs(t)) = (self.stat_ratio, threshold) else {
            return false;
        };
        let up = 1.0 + 8.0 * f64::EPSILON;
        let err = (candidate - lo).abs().max((candidate - hi).abs()) * up;
        *t > 0.0 && err <= *t && err / t * up <= max
    }

    /// Whether an element (the oracle's `exact`, a `candidate` of `dtype`,
    /// its bounds under `[chosen, tree, lanes=8, sequential]`) can change
    /// nothing here but the count: an upper bound of its error (the far
    /// end of the enclosure, rounded up), and the ulps and ratios from it,
    /// stay within every maximum so far, it passes every bound, and its
    /// worst-list key is below the floor ([`OutputAcc::push`] would not
    /// keep it). The caller then adds 1 to `count` instead of judging it
    /// in full: the report is the same bits.
    pub(super) fn absorbs(
        &self,
        exact: &Exact,
        candidate: f64,
        dtype: Dtype,
        bounds: &[tolerance::ErrorBound; 4],
    ) -> bool {
        let mut b = [0.0; 4];
        for (b, bound) in b.iter_mut().zip(bounds) {
            match bound {
                tolerance::ErrorBound::Abs(x) => *b = *x,
                _ => return false,
            }
        }
        self.absorbs_raw(exact.enclosure, candidate, dtype, &b)
    }

    /// [`OutputAcc::absorbs`] on raw numbers: the enclosure and the four
    /// bounds' `Abs` values (one not positive absorbs nothing).
    #[inline]
    pub(super) fn absorbs_raw(
        &self,
        enclosure: Interval,
        candidate: f64,
        dtype: Dtype,
        bounds: &[f64; 4],
    ) -> bool {
        let Interval { lo, hi } = enclosure;
        let Some(floor) = self.worst_floor else {
            return false;
        };
        if !(candidate.is_finite() && lo.is_finite() && hi.is_finite()) {
            return false;
        }
        let up = 1.0 + 8.0 * f64::EPSILON;
        let err = (candidate - lo).abs().max((candidate - hi).abs()) * up;
        let mag = if lo <= 0.0 && 0.0 <= hi {
            0.0
        } else {
            lo.abs().min(hi.abs())
        };
        if !(err <= self.max_abs && err / dtype.ulp(mag) <= self.max_ulps) {
            return false;
        }
        let mut ratios = [0.0; 4];
        for (r, &b) in ratios.iter_mut().zip(bounds) {
            if !(b > 0.0) {
                return false;
            }
            *r = err / b * up;
        }
        let refs_within = ratios[1..]
            .iter()
            .zip(&self.reference)
            .all(|(&r, (m, _))| m.is_some_and(|m| r <= m));
        ratios[0] <= 1.0
            && self.max_ratio.is_some_and(|m| ratios[0] <= m)
            && refs_within
            && (ratios[0], err).partial_cmp(&floor) == Some(std::cmp::Ordering::Less)
    }

    /// Adds a row's gradient elements screened by [`super::grad_screen`]
    /// (at least one; their count and error maxima as the judge measures
    /// them): each passes, and each of its ratios is at most that of a seed
    /// of the same row, which is pushed in full, so only the count and the
    /// error maxima can move (the ratio maxima become `Some` as that seed
    /// makes them). Maxima do not depend on the order of the elements.
    pub(super) fn push_screened(&mut self, s: Screened) {
        self.count += s.count;
        self.max_abs = max_nan(self.max_abs, s.max_abs);
        self.max_ulps = max_nan(self.max_ulps, s.max_ulps);
        self.max_ratio = Some(self.max_ratio.unwrap_or(0.0));
        for acc in self.reference.iter_mut() {
            acc.0 = Some(acc.0.unwrap_or(0.0));
        }
    }

    pub(super) fn trim(&mut self, keep: usize) {
        self.worst.sort_by(|a, b| {
            worse(b)
                .partial_cmp(&worse(a))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        self.worst.truncate(keep);
        self.worst_floor =
            (keep > 0 && self.worst.len() == keep).then(|| worse(&self.worst[keep - 1]));
    }

    pub(super) fn merge(&mut self, other: OutputAcc, keep: usize) {
        self.count += other.count;
        self.max_abs = max_nan(self.max_abs, other.max_abs);
        self.max_ulps = max_nan(self.max_ulps, other.max_ulps);
        self.max_ratio = match (self.max_ratio, other.max_ratio) {
            (Some(a), Some(b)) => Some(max_nan(a, b)),
            (a, b) => a.or(b),
        };
        self.any_no_bound |= other.any_no_bound;
        self.any_fail |= other.any_fail;
        if self.no_bound_reason.is_none() {
            self.no_bound_reason = other.no_bound_reason;
        }
        for (a, b) in self.reference.iter_mut().zip(other.reference) {
            a.0 = match (a.0, b.0) {
                (Some(x), Some(y)) => Some(max_nan(x, y)),
                (x, y) => x.or(y),
            };
            a.1 |= b.1;
        }
        self.relative = match (self.relative, other.relative) {
            (Some(a), Some(b)) => Some(a.merge(b)),
            (a, b) => a.or(b),
        };
        self.worst.extend(other.worst);
        self.trim(keep);
        self.suspect += other.suspect;
        self.stat_ratio = opt_max(self.stat_ratio, other.stat_ratio);
    }

    /// Records the statistical threshold of an element judged within its
    /// sound bound (`error`): suspect when beyond it.
    pub(super) fn observe_statistical(
        &mut self,
        error: f64,
        sound_pass: bool,
        threshold: &tolerance::ErrorBound,
    ) {
        if let tolerance::ErrorBound::Abs(t) = threshold {
            let r = if *t > 0.0 {
                error / t
            } else if error == 0.0 {
                0.0
            } else {
                f64::INFINITY
            };
            self.stat_ratio = opt_max(self.stat_ratio, Some(r));
            if sound_pass && !(error <= *t) {
                self.suspect += 1;
            }
        }
    }

    pub(super) fn verdict(&self) -> ReportVerdict {
        if self.any_fail {
            ReportVerdict::Fail
        } else if self.any_no_bound {
            ReportVerdict::NoBound
        } else if !self.suspect_rules().is_empty() {
            ReportVerdict::Suspect
        } else {
            ReportVerdict::Pass
        }
    }
}

impl OutputAcc {
    /// The rules that find the output SUSPECT: `statistical` (some element
    /// beyond its threshold), `relative` (the relative rule fires).
    pub(super) fn suspect_rules(&self) -> Vec<&'static str> {
        let mut rules = Vec::new();
        if self.suspect > 0 {
            rules.push("statistical");
        }
        if self.relative.is_some_and(|r| r.fires()) {
            rules.push("relative");
        }
        rules
    }
}

/// Sort key of the worst elements: ratio under the chosen model, errors
/// of unbounded elements after every bounded one (by error).
pub(super) fn worse(j: &Judged) -> (f64, f64) {
    let r = if j.ratio.is_nan() {
        f64::INFINITY
    } else {
        j.ratio
    };
    let e = if j.error.is_nan() {
        f64::INFINITY
    } else {
        j.error
    };
    (r, e)
}

pub(super) fn opt_max(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(max_nan(x, y)),
        (x, y) => x.or(y),
    }
}

pub(super) fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

pub(super) fn output_report(name: &'static str, dtype: Dtype, acc: OutputAcc) -> OutputReport {
    let verdict = acc.verdict();
    let suspect_rules = acc.suspect_rules();
    let reference_ratios: Vec<ModelRatio> = tolerance::Order::REFERENCE
        .iter()
        .zip(acc.reference)
        .map(|(m, (r, no_bound))| ModelRatio {
            model: m.to_string(),
            max_ratio: if no_bound {
                None
            } else {
                Some(r.unwrap_or(0.0))
            },
        })
        .collect();
    let tightest_model = tolerance::Order::REFERENCE
        .iter()
        .zip(acc.reference)
        .find(|(_, (r, no_bound))| !no_bound && r.unwrap_or(0.0) <= 1.0)
        .map(|(m, _)| m.to_string());
    OutputReport {
        output: name,
        dtype: dtype.to_string(),
        count: acc.count,
        verdict,
        max_abs_error: acc.max_abs,
        max_ulps: acc.max_ulps,
        max_ratio: acc.max_ratio,
        tightest_model,
        reference_ratios,
        relative_rule: acc.relative.map(|f| RelativeRuleReport {
            ratio: f.ratio(),
            r: tolerance::RELATIVE_R,
            careful_max_abs_error: f.careful_error,
            floor: f.floor,
            fires: f.fires(),
        }),
        no_bound_reason: acc.no_bound_reason,
        suspect_elements: acc.suspect,
        statistical_max_ratio: acc.stat_ratio,
        suspect_rules,
        worst: acc.worst,
        nothing_checked: None,
        reduction: None,
    }
}
