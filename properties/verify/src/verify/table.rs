//! The human-readable table of a file report (`verify`'s default output).

use super::*;

/// Formats a float for the table: 3 significant digits, `-` for none.
/// A ratio (`err/bound`, `err/stat`, the relative rule's) for the
/// text table: an infinite ratio is the word `infinite`, a NaN one
/// `undefined`; finite ones as [`fmt_g`] with `suffix`.
pub(crate) fn fmt_ratio(x: f64, suffix: &str) -> String {
    if x.is_nan() {
        "undefined".into()
    } else if x.is_infinite() {
        "infinite".into()
    } else {
        format!("{}{suffix}", fmt_g(x))
    }
}

pub(crate) fn fmt_g(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if x == 0.0 {
        "0".into()
    } else if (1e-3..1e5).contains(&x.abs()) {
        let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
        format!("{x:.digits$}")
    } else {
        format!("{x:.2e}")
    }
}

/// Formats a candidate / exact value with enough digits to tell them apart.
fn fmt_v(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.9e}")
    } else {
        format!("{x}")
    }
}

/// The human-readable table of one file's report: a header line with the
/// verdict, one line per output (verdict, max error absolute and in ulps,
/// error / bound, tightest model, the SUSPECT tiers' ratios), the line of
/// each rule that finds an output SUSPECT, and the worst
/// elements of each output with candidate and exact values.
pub fn render_table(report: &FileReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let unchecked = report
        .outputs
        .iter()
        .map(|o| o.nothing_checked.is_some())
        .chain(
            report
                .topk_ids
                .as_ref()
                .map(|t| t.nothing_checked.is_some()),
        );
    let (some_unchecked, all_unchecked) =
        unchecked.fold((false, true), |(any, all), u| (any || u, all && u));
    let _ = writeln!(
        s,
        "{}: {}{}  [{} x {} {} logits (vocab {}), rows checked {}/{}, model {} {} accumulation, {:.2} s]",
        report.path.display(),
        report.verdict,
        match (some_unchecked, all_unchecked) {
            (true, true) => " (nothing checked)",
            (true, false) => " (an output had nothing checked)",
            _ => "",
        },
        report.rows,
        report.columns,
        report.logits_dtype,
        report.vocab_size,
        report.rows_checked,
        report.rows,
        report.model,
        report.accumulation,
        report.seconds,
    );
    if let Some(tp) = &report.tp_set {
        tp_set_lines(&mut s, tp);
    }
    let w = label_width(report);
    let _ = writeln!(
        s,
        "  {:<w$} {:>5} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>9} {:>9}",
        "output",
        "dtype",
        "elements",
        "verdict",
        "max |err|",
        "max ulps",
        "err/bound",
        "tightest",
        "err/stat",
        "err/care"
    );
    for o in &report.outputs {
        // `loss (mean)`: one element for the whole dump.
        let label = match o.reduction {
            Some(r) if r != "none" => format!("{} ({r})", o.output),
            _ => o.output.to_string(),
        };
        let _ = writeln!(
            s,
            "  {:<w$} {:>5} {:>8} {:>9} {:>10} {:>10} {:>10} {:>11} {:>9} {:>9}",
            label,
            o.dtype,
            o.count,
            if o.nothing_checked.is_some() {
                "unchecked".to_string()
            } else {
                o.verdict.to_string()
            },
            fmt_g(o.max_abs_error),
            fmt_g(o.max_ulps),
            o.max_ratio.map_or("-".into(), |r| fmt_ratio(r, "")),
            o.tightest_model.as_deref().unwrap_or("none"),
            o.statistical_max_ratio
                .map_or("-".into(), |r| fmt_ratio(r, "")),
            o.relative_rule
                .as_ref()
                .map_or("-".into(), |f| fmt_ratio(f.ratio, "")),
        );
    }
    // The line of each rule that finds an output SUSPECT (a failing
    // output's verdict needs neither).
    for o in &report.outputs {
        if matches!(o.verdict, ReportVerdict::Fail | ReportVerdict::NoBound) {
            continue;
        }
        if o.suspect_elements > 0 {
            let _ = writeln!(
                s,
                "  {}: SUSPECT (statistical tier): {} of {} elements within the sound bound but beyond the statistical threshold (c = {})",
                o.output, o.suspect_elements, o.count, report.statistical_c.map_or("-".into(), fmt_g)
            );
        }
        if let Some(f) = o.relative_rule.as_ref().filter(|f| f.fires) {
            let _ = writeln!(
                s,
                "  {}: SUSPECT (relative rule): max |err| {} is {} times careful code's {} ({} {} accumulation; floor {}), above R = {}",
                o.output,
                fmt_g(o.max_abs_error),
                fmt_ratio(f.ratio, ""),
                fmt_g(f.careful_max_abs_error),
                report.model,
                report.accumulation,
                fmt_g(f.floor),
                f.r
            );
        }
    }
    if let Some(t) = &report.topk_ids {
        let _ = writeln!(
            s,
            "  {:<15} {:>5} {:>8} {:>9}  ids as the kernel's top-{} of z'{}: {} of {} rows not a valid top-k set",
            "topk_ids",
            "-",
            t.rows_checked,
            if t.nothing_checked.is_some() {
                "unchecked".to_string()
            } else {
                t.verdict.to_string()
            },
            t.k,
            if t.sorted { ", descending" } else { "" },
            t.rows_failed,
            t.rows_checked,
        );
    }
    for o in &report.outputs {
        if let Some(why) = &o.nothing_checked {
            let _ = writeln!(s, "  {}: nothing checked: {why}", o.output);
        }
    }
    if let Some(t) = &report.topk_ids {
        if let Some(why) = &t.nothing_checked {
            let _ = writeln!(s, "  topk_ids: nothing checked: {why}");
        }
        for f in &t.failures {
            let at = match f.position {
                Some((b, tt)) => format!("(b, t) = ({b}, {tt})"),
                None => format!("row {}", f.row),
            };
            let _ = writeln!(s, "    topk_ids {at}: {}", f.message);
        }
    }
    write_worst(&mut s, report);
    write_footer(&mut s, report);
    s
}

/// The worst elements of each output of [`render_table`]'s report, with
/// candidate and exact values.
fn write_worst(s: &mut String, report: &FileReport) {
    use std::fmt::Write;
    for o in &report.outputs {
        if o.worst.is_empty() {
            continue;
        }
        let _ = writeln!(s, "  worst {}:", o.output);
        let whole = o.reduction.filter(|r| *r != "none");
        for j in &o.worst {
            let at = match (j.position, j.col) {
                // One element for the whole dump.
                _ if whole.is_some() => format!("({})", whole.unwrap_or_default()),
                (Some((b, t)), Some(c)) => format!("({b}, {t}), {c}"),
                (Some((b, t)), None) => format!("({b}, {t})"),
                (None, Some(c)) => format!("[{}, {}]", j.row, c),
                (None, None) => format!("[{}]", j.row),
            };
            let _ = writeln!(
                s,
                "    {:<14} candidate {:>16}  exact {:>16}  |err| {:>9}  ulps {:>8}  bound {:>9}  err/bound {:>8}",
                at,
                fmt_v(j.candidate),
                fmt_v(j.exact),
                fmt_g(j.error),
                fmt_g(j.ulps),
                j.bound.map_or("none".into(), fmt_g),
                if j.bound.is_some() { fmt_ratio(j.ratio, "") } else { "-".into() },
            );
        }
    }
}

/// [`render_table`]'s last lines: the MPFR fallback rates and the tensors
/// the format ignores.
fn write_footer(s: &mut String, report: &FileReport) {
    use std::fmt::Write;
    let fb = &report.fallback;
    if fb.rows > 0 {
        let _ = writeln!(
            s,
            "  fallback to MPFR: {} of {} oracle outputs ({:.2e}), {} of {} rows ({:.2e})",
            fb.outputs_mpfr, fb.outputs, fb.output_rate, fb.rows_mpfr, fb.rows, fb.row_rate
        );
    }
    if !report.ignored_tensors.is_empty() {
        let _ = writeln!(
            s,
            "  ignored tensors (not in the format): {}",
            report.ignored_tensors.join(", ")
        );
    }
}

/// The label column's width: 15, or the longest label
/// (`grad_lm_head_weight`, `loss (mean)`).
fn label_width(report: &FileReport) -> usize {
    report
        .outputs
        .iter()
        .map(|o| o.output.len() + o.reduction.as_ref().map_or(0, |r| r.len() + 3))
        .max()
        .unwrap_or(0)
        .max(15)
}

/// The lines naming a tensor-parallel set's files, and whose copy of the
/// all-reduced outputs the report judges when the ranks' differ.
fn tp_set_lines(s: &mut String, tp: &super::TpSetReport) {
    use std::fmt::Write as _;
    let files: Vec<String> = tp.files.iter().map(|p| p.display().to_string()).collect();
    let _ = writeln!(
        s,
        "  tensor-parallel set of {} ranks, columns concatenated in rank order: {}",
        tp.files.len(),
        files.join(", ")
    );
    if tp.ranks.len() < tp.files.len() {
        let _ = writeln!(
            s,
            "  global outputs as ranks {:?} hold them (other ranks hold other bits: see their reports)",
            tp.ranks
        );
    }
}
