//! The kernel's own logits beside `hidden` and `lm_head_weight` (issue
//! 45): a candidate judged entry by entry against the matmul's bound,
//! TOLERANCE.md (T29) with each entry's own magnitudes.

use logprobe_reference::oracle::{Exact, Interval};
use logprobe_reference::spec::Dtype;

use crate::dump::{Dump, LmHeadLogitsDtype, RowInputs};
use crate::tolerance::{ErrorBound, NoBound};

use super::acc::{output_report, OutputAcc};
use super::engine::judge4;
use super::linear_grads::gamma;
use super::OutputReport;

/// Row `r`'s candidate logits judged (every column), when the dump gives
/// them beside `hidden`: `x^_j` within `M_j + r(X_j + B_j + M_j) + r(X_j +
/// M_j + r(X_j + B_j + M_j))` of `x_j` (`M_j = gamma_{H+1}(2u) A_j + (H +
/// 2) eta`, `r(y)` half an ulp of the kept dtype at `y`, `X_j`, `B_j` this
/// entry's `|x_j|`, `|b_j|`; the roundings as the declared
/// `lm_head_logits_dtype` has them: TOLERANCE.md (T29)), plus half an ulp of the
/// candidate's dtype when it is narrower than that. Every model gets the
/// same bound (the matmul's order is unknown to all of them). With the
/// statistical tier (`stat_c`), the threshold is the same bound with
/// `gamma_{H+1}(2u)` replaced by `min(gamma, c sqrt(H + 1) 2u)`
/// (TOLERANCE.md (S7)).
pub(super) fn judge_logits_row(
    dump: &Dump<'_>,
    inputs: &RowInputs,
    acc: Dtype,
    (keep, stat_c): (usize, Option<f64>),
) -> Option<OutputAcc> {
    let l = dump.logits.linear()?;
    let cand = l.candidate.as_ref()?;
    let entries = inputs.linear_entries.as_ref()?;
    let h = l.weight.cols;
    let g = gamma(h + 1, 2.0 * acc.unit_roundoff());
    // (S7) The threshold's accumulation term (`None`: no tier).
    let g_stat =
        stat_c.map(|c| g.min(c.max(0.0) * ((h + 1) as f64).sqrt() * 2.0 * acc.unit_roundoff()));
    let kept = match l.logits_dtype {
        LmHeadLogitsDtype::Input => l.dtype,
        LmHeadLogitsDtype::Accumulation => acc,
    };
    // Half an ulp of the kept dtype at `y` (0 when it is the accumulation's).
    let rounds = kept.precision() < acc.precision();
    let r = |y: f64| if rounds { 0.5 * kept.ulp(y) } else { 0.0 };
    let eta = (h + 2) as f64 * 0.5 * acc.ulp(0.0);
    let up = 1.0 + 16.0 * f64::EPSILON;
    let row = cand.row_f64(inputs.row);
    let mut out = OutputAcc::new();
    for (j, (d, &c)) in entries.iter().zip(&row).enumerate() {
        let b = l.bias.as_ref().map_or(0.0, |b| b[j].abs());
        let x = d.value.abs() + d.err;
        // The bound of the entry for the dot product's term `g`.
        let bound_of = |g: f64| {
            let m = (g * d.abs_sum + eta) * up;
            let first = r((x + b + m) * up);
            let second = if l.bias.is_some() {
                r((x + m + first) * up)
            } else {
                0.0
            };
            let mut bound = (m + first + second) * up;
            if cand.dtype.precision() < kept.precision() {
                bound += 0.5 * cand.dtype.ulp(x + bound);
            }
            if bound.is_finite() {
                ErrorBound::Abs(bound * up)
            } else {
                ErrorBound::None {
                    reason: NoBound::NonFinite {
                        what: "the logits' matmul bound",
                    },
                }
            }
        };
        let bound = bound_of(g);
        let threshold = g_stat.map(bound_of);
        let enc = Interval {
            lo: d.value - d.err,
            hi: d.value + d.err,
        };
        let t = cand.dtype;
        let exact = Exact::new(
            enc,
            t.round_f64(d.value),
            t.round_f64(enc.lo) == t.round_f64(enc.hi),
        );
        let bounds = [bound.clone(), bound.clone(), bound.clone(), bound];
        if out.absorbs(&exact, c, t, &bounds)
            && threshold
                .as_ref()
                .is_none_or(|s| out.absorbs_statistical(&exact, c, s))
        {
            out.count += 1;
            continue;
        }
        let (judged, pass, refs) = judge4(inputs.row, Some(j), c, &exact, t, &bounds);
        if let Some(s) = &threshold {
            out.observe_statistical(judged.error, pass, s);
        }
        out.push(judged, refs, keep);
    }
    Some(out)
}

/// `a` and `b` merged (`keep` worst elements kept), either when the other
/// is absent.
pub(super) fn merge_logits(
    a: Option<OutputAcc>,
    b: Option<OutputAcc>,
    keep: usize,
) -> Option<OutputAcc> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.merge(b, keep);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

/// The report of the kernel's own logits (`logits` beside `hidden`) from
/// the rows' accumulator, when the dump has them.
pub(super) fn logits_report(
    dump: &Dump<'_>,
    acc: Option<OutputAcc>,
    keep: usize,
) -> Option<OutputReport> {
    let c = dump.logits.linear()?.candidate.as_ref()?;
    let mut acc = acc?;
    acc.trim(keep);
    Some(output_report(crate::names::tensor::LOGITS, c.dtype, acc))
}
