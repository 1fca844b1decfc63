//! The summary over the compared rows: magnitudes, the importance ratio,
//! Pearson correlations, the shares and the one-line verdict (module docs
//! of [`super`]).

use super::{
    CompareRow, Enclosure, EntropyRow, EntropySummary, KernelBound, Magnitude, NonFinite,
    RatioSummary, Side, Summary,
};
use crate::verify::ReportVerdict as Verdict;

fn magnitude<'r>(
    rows: &'r [CompareRow],
    f: impl Fn(&'r CompareRow) -> Option<&'r Enclosure>,
    shape: crate::shapes::RowShape,
) -> Option<Magnitude> {
    let vals: Vec<(usize, f64)> = rows
        .iter()
        .filter_map(|r| f(r).map(|e| (r.row, e.value.abs())))
        .collect();
    if vals.is_empty() && !rows.is_empty() {
        return None;
    }
    let n = vals.len();
    let sum: f64 = vals.iter().map(|v| v.1).sum();
    let max = vals
        .iter()
        .copied()
        .reduce(|a, b| if b.1 > a.1 || b.1.is_nan() { b } else { a });
    Some(Magnitude {
        rows: n,
        mean_abs: if n == 0 { 0.0 } else { sum / n as f64 },
        max_abs: max.map_or(0.0, |m| m.1),
        max_row: max.map(|m| m.0),
        max_position: max.and_then(|m| shape.position(m.0)),
    })
}

/// Pearson's r of paired values (`None` below 2 pairs, at zero variance,
/// or with a non-finite value).
fn pearson(pairs: &[(f64, f64)]) -> Option<f64> {
    let n = pairs.len();
    if n < 2 || pairs.iter().any(|(x, y)| !x.is_finite() || !y.is_finite()) {
        return None;
    }
    let mx = pairs.iter().map(|p| p.0).sum::<f64>() / n as f64;
    let my = pairs.iter().map(|p| p.1).sum::<f64>() / n as f64;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for &(x, y) in pairs {
        let (dx, dy) = (x - mx, y - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx.sqrt() * syy.sqrt()))
}

pub(super) fn summarize(
    rows: &[CompareRow],
    clip: f64,
    kernel_bounds: Vec<KernelBound>,
    shape: crate::shapes::RowShape,
) -> Summary {
    let observed = magnitude(rows, |r| r.observed.as_ref(), shape);
    let ke_a = magnitude(rows, |r| Some(&r.kernel_error_a), shape).expect("every row has one");
    let ke_b = magnitude(rows, |r| r.kernel_error_b.as_ref(), shape);
    let le = magnitude(rows, |r| r.logits_effect.as_ref(), shape);
    let bma = magnitude(rows, |r| r.b_minus_exact_a.as_ref(), shape);
    let kl = magnitude(rows, |r| r.kl.as_ref(), shape);
    let bitwise_equal_rows = rows
        .iter()
        .map(|r| r.log_probs_bitwise_equal)
        .try_fold(0usize, |n, e| e.map(|e| n + e as usize));
    let logits_bitwise_equal_rows = rows
        .iter()
        .map(|r| r.logits_bitwise_equal)
        .try_fold(0usize, |n, e| e.map(|e| n + e as usize));
    let ratios: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.observed.map(|o| o.value.exp()))
        .collect();
    let importance_ratio = (observed.is_some() && !ratios.is_empty()).then(|| {
        let outside = ratios
            .iter()
            .filter(|&&q| !(1.0 - clip..=1.0 + clip).contains(&q))
            .count();
        RatioSummary {
            min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            clip,
            outside_clip: outside,
            outside_clip_fraction: outside as f64 / ratios.len() as f64,
        }
    });
    let pairs: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.log_prob_b.map(|b| (r.log_prob_a, b)))
        .collect();
    let pearson_log_probs = pearson(&pairs);
    let probs: Vec<(f64, f64)> = pairs.iter().map(|&(a, b)| (a.exp(), b.exp())).collect();
    let pearson_probs = pearson(&probs);

    // Shares of the magnitude (module docs): A's kernel error, B's (with
    // B's logits and log-probs) and the logits effect; without B's logits
    // the last is B's kernel and logits together (`b_minus_exact_a`).
    let m_a = ke_a.mean_abs;
    let (m_b, m_l) = match (&le, &bma) {
        (Some(l), _) => (ke_b.as_ref().map(|kb| kb.mean_abs), Some(l.mean_abs)),
        (None, Some(x)) => (None, Some(x.mean_abs)),
        (None, None) => (None, None),
    };
    let (share_kernel_a, share_kernel_b, share_logits) = match m_l {
        Some(m_l) => {
            let total = m_a + m_b.unwrap_or(0.0) + m_l;
            if total > 0.0 {
                (Some(m_a / total), m_b.map(|b| b / total), Some(m_l / total))
            } else {
                (None, None, None)
            }
        }
        None => (None, None, None),
    };
    let mut s = Summary {
        rows: rows.len(),
        non_finite: non_finite(rows),
        observed,
        kernel_error_a: ke_a,
        kernel_error_b: ke_b,
        logits_effect: le,
        b_minus_exact_a: bma,
        kl,
        bitwise_equal_rows,
        logits_bitwise_equal_rows,
        importance_ratio,
        pearson_log_probs,
        pearson_probs,
        share_kernel_a,
        share_kernel_b,
        share_logits,
        kernel_bounds,
        entropy: rows.first().and_then(|r| r.entropy.as_ref()).map(|_| {
            let e = |f: fn(&EntropyRow) -> Option<&Enclosure>| {
                magnitude(rows, move |r| r.entropy.as_ref().and_then(f), shape)
            };
            EntropySummary {
                observed: e(|h| h.observed.as_ref()),
                kernel_error_a: e(|h| Some(&h.kernel_error_a)),
                kernel_error_b: e(|h| h.kernel_error_b.as_ref()),
                logits_effect: e(|h| h.logits_effect.as_ref()),
            }
        }),
        verdict: String::new(),
    };
    s.verdict = verdict_line(&s);
    s
}

/// Each side's NaN / infinite candidate log-probs over `rows`.
fn non_finite(rows: &[CompareRow]) -> Vec<NonFinite> {
    let mut out = Vec::new();
    for side in [Side::A, Side::B] {
        let lp = |r: &CompareRow| match side {
            Side::A => Some(r.log_prob_a),
            Side::B => r.log_prob_b,
        };
        let bad: Vec<(usize, f64)> = rows
            .iter()
            .filter_map(|r| lp(r).filter(|x| !x.is_finite()).map(|x| (r.row, x)))
            .collect();
        if let Some(&(first_row, x)) = bad.first() {
            out.push(NonFinite {
                side,
                rows: bad.len(),
                first_row,
                first_value: format!("{x}"),
            });
        }
    }
    out
}

/// `x` as a percentage with one decimal.
pub(super) fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// "the mismatch is X% kernel numerics (A a%, B b%), Y% logits; ...".
fn verdict_line(s: &Summary) -> String {
    if s.rows == 0 {
        return "no row compared: nothing was checked (every selected row is masked or ignored, or N = 0)".into();
    }
    if !s.non_finite.is_empty() {
        let faults: Vec<String> = s
            .non_finite
            .iter()
            .map(|f| {
                format!(
                    "{}'s log_probs are NaN or infinite on {} of {} rows (first: row {} = {})",
                    f.side, f.rows, s.rows, f.first_row, f.first_value
                )
            })
            .collect();
        return format!(
            "kernel fault: {} (a compared row's exact log-prob is finite); no decomposition",
            faults.join("; ")
        );
    }
    let out_of_bound: Vec<String> = s
        .kernel_bounds
        .iter()
        .filter(|k| {
            matches!(
                k.verdict,
                Verdict::Fail | Verdict::NoBound | Verdict::Unchecked
            )
        })
        .map(|k| {
            let why = match (k.verdict, k.max_ratio) {
                (Verdict::Unchecked, _) => {
                    return format!("{}'s {} kernel is unchecked", k.side, k.output)
                }
                (Verdict::NoBound, _) => "no bound".to_string(),
                (_, Some(r)) => format!("err/bound {}", crate::verify::fmt_g(r)),
                _ => "beyond its bound".to_string(),
            };
            format!(
                "{}'s {} kernel is out of its bound ({why})",
                k.side, k.output
            )
        })
        .collect();
    let suspect: Vec<String> = s
        .kernel_bounds
        .iter()
        .filter(|k| k.verdict == Verdict::Suspect)
        .map(|k| {
            format!(
                "{}'s {} kernel is within its bound but SUSPECT (beyond the statistical threshold)",
                k.side, k.output
            )
        })
        .collect();
    let within: Vec<String> = s
        .kernel_bounds
        .iter()
        .filter(|k| k.output == "log_probs" && k.verdict == Verdict::Pass)
        .map(|k| k.side.to_string())
        .collect();
    let mut notes = out_of_bound;
    match within.len() {
        0 => {}
        1 => notes.push(format!(
            "{}'s log_probs kernel is within its bound",
            within[0]
        )),
        _ => notes.push("both log_probs kernels are within their bounds".into()),
    }
    notes.extend(suspect);
    let bounds = if notes.is_empty() {
        String::new()
    } else {
        format!("; {}", notes.join("; "))
    };
    if s.bitwise_equal_rows == Some(s.rows) {
        let logits = match s.logits_bitwise_equal_rows {
            Some(n) if n == s.rows => " and the logits",
            _ => "",
        };
        return format!(
            "no mismatch: the log-probs{logits} of A and B are bitwise equal on all {} rows{bounds}",
            s.rows
        );
    }
    match (s.share_kernel_a, s.share_kernel_b, s.share_logits) {
        (Some(a), Some(b), Some(l)) => format!(
            "the mismatch is {} kernel numerics (A {}, B {}), {} logits{bounds}",
            pct(a + b),
            pct(a),
            pct(b),
            pct(l)
        ),
        (Some(a), None, Some(l)) if s.b_minus_exact_a.is_some() => format!(
            "the mismatch is {} A's kernel numerics, {} B's logits and kernel together (B has no logits to separate them){bounds}",
            pct(a),
            pct(l)
        ),
        (Some(a), None, Some(l)) => format!(
            "the difference of exact log-probs is {} of the magnitude, A's kernel error {} (B has no log_probs){bounds}",
            pct(l),
            pct(a)
        ),
        _ => format!("the exact log-probs of A and B agree and neither kernel errs{bounds}"),
    }
}
