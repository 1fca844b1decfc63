//! The human-readable table of a [`CompareReport`]: a header (files,
//! dtypes, rows), the one-line verdict, one line per quantity (mean and
//! max `|.|`, worst row), the bitwise-equal rows, the importance ratio,
//! Pearson's r, each side's kernel against its bound, and the rows of
//! largest `|observed|`.

use std::fmt::Write;

use super::{CompareReport, CompareRow, Magnitude};

use crate::verify::fmt_g;

/// A signed value with 3 significant digits in exponent form.
fn fmt_e(x: f64) -> String {
    if x.is_finite() {
        format!("{x:+.2e}")
    } else {
        format!("{x}")
    }
}

fn at(row: usize, position: Option<(usize, usize)>) -> String {
    match position {
        Some((b, t)) => format!("({b}, {t})"),
        None => format!("[{row}]"),
    }
}

/// The table of a comparison (see the module docs).
pub fn render_table(r: &CompareReport) -> String {
    let mut s = String::new();
    let side = |name: &str, i: &super::SideInfo| {
        format!(
            "{name} {}: {} logits, {} log_probs",
            i.path.display(),
            i.logits_dtype.as_deref().unwrap_or("no"),
            i.log_probs_dtype.as_deref().unwrap_or("no"),
        )
    };
    let _ = writeln!(s, "compare  {}", side("A", &r.a));
    let _ = writeln!(s, "         {}", side("B", &r.b));
    let shape = match r.batch {
        Some((b, t)) => format!("[B, T] = [{b}, {t}]"),
        None => format!("[N] = [{}]", r.rows_total),
    };
    let _ = writeln!(
        s,
        "  rows compared {} of {} ({shape}; row_mask excludes {}, token = ignore_index in {}){}, {:.2} s",
        r.summary.rows,
        r.rows_total,
        r.rows_masked,
        r.rows_ignored,
        r.a.vocab_size
            .map_or(String::new(), |v| format!(", vocab {v}")),
        r.seconds
    );
    let sm = &r.summary;
    let _ = writeln!(s, "  verdict: {}", sm.verdict);
    let _ = writeln!(
        s,
        "  {:<40} {:>10} {:>10} {:>10}",
        "quantity (nats)", "mean |.|", "max |.|", "max at"
    );
    let line = |s: &mut String, name: &str, m: &Option<Magnitude>| {
        if let Some(m) = m {
            let _ = writeln!(
                s,
                "  {:<40} {:>10} {:>10} {:>10}",
                name,
                fmt_g(m.mean_abs),
                fmt_g(m.max_abs),
                m.max_row.map_or("-".into(), |row| at(row, m.max_position)),
            );
        }
    };
    line(&mut s, "observed = lp_A - lp_B", &sm.observed);
    line(
        &mut s,
        "kernel_error_a = lp_A - exact(logits_A)",
        &Some(sm.kernel_error_a.clone()),
    );
    line(
        &mut s,
        "kernel_error_b = lp_B - exact(logits_B)",
        &sm.kernel_error_b,
    );
    line(
        &mut s,
        "logits_effect = exact(A) - exact(B)",
        &sm.logits_effect,
    );
    line(
        &mut s,
        "b_minus_exact_a = lp_B - exact(logits_A)",
        &sm.b_minus_exact_a,
    );
    line(&mut s, "KL(softmax(z_A) || softmax(z_B))", &sm.kl);
    if let Some(h) = &sm.entropy {
        line(&mut s, "entropy: observed = H_A - H_B", &h.observed);
        line(&mut s, "entropy: kernel_error_a", &h.kernel_error_a);
        line(&mut s, "entropy: kernel_error_b", &h.kernel_error_b);
        line(&mut s, "entropy: logits_effect", &h.logits_effect);
    }
    if let Some(n) = sm.bitwise_equal_rows {
        let _ = write!(s, "  bitwise-equal rows: {n} of {} (log_probs)", sm.rows);
        if let Some(m) = sm.logits_bitwise_equal_rows {
            let _ = write!(s, ", {m} of {} (logits)", sm.rows);
        }
        s.push('\n');
    }
    if let Some(q) = &sm.importance_ratio {
        let _ = writeln!(
            s,
            "  importance ratio exp(observed): [{}, {}]; outside [{}, {}] (--clip {}): {} of {} rows ({})",
            fmt_g(q.min),
            fmt_g(q.max),
            fmt_g(1.0 - q.clip),
            fmt_g(1.0 + q.clip),
            q.clip,
            q.outside_clip,
            sm.observed.as_ref().map_or(0, |o| o.rows),
            super::summary::pct(q.outside_clip_fraction),
        );
    }
    if sm.pearson_log_probs.is_some() || sm.pearson_probs.is_some() {
        let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.6}"));
        let _ = writeln!(
            s,
            "  Pearson r: log-probs {}, probs exp(lp) {} (verl's rollout_actor_probs_pearson_corr)",
            f(sm.pearson_log_probs),
            f(sm.pearson_probs)
        );
    }
    for k in &sm.kernel_bounds {
        let _ = writeln!(
            s,
            "  kernel bound: {} {:<9} {:>5} {:>9}  err/bound {:>8}  tightest {}",
            k.side,
            k.output,
            k.dtype,
            k.verdict.to_string(),
            k.max_ratio.map_or("-".into(), fmt_g),
            k.tightest_model.as_deref().unwrap_or("none"),
        );
    }
    write_worst_rows(&mut s, r);
    s
}

/// The rows of largest `|observed|` of [`render_table`]'s report, worst
/// first, `r.worst_rows` of them.
fn write_worst_rows(s: &mut String, r: &CompareReport) {
    let mut worst: Vec<&CompareRow> = r.rows.iter().collect();
    worst.sort_by(|x, y| {
        let m = |c: &CompareRow| {
            c.observed
                .or(c.b_minus_exact_a)
                .map_or(0.0, |o| o.value.abs())
        };
        m(y).partial_cmp(&m(x)).unwrap_or(std::cmp::Ordering::Equal)
    });
    let keep = r.worst_rows.min(worst.len());
    if keep > 0 {
        let _ = writeln!(s, "  rows of largest |observed|:");
        let _ = writeln!(
            s,
            "    {:<9} {:>7} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9}",
            "row", "token", "lp_A", "lp_B", "observed", "kernel_a", "kernel_b", "logits", "KL"
        );
        for c in &worst[..keep] {
            let opt = |e: Option<super::Enclosure>| e.map_or("-".into(), |e| fmt_e(e.value));
            let _ = writeln!(
                s,
                "    {:<9} {:>7} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>9}",
                at(c.row, c.position),
                c.token,
                format!("{:.5}", c.log_prob_a),
                c.log_prob_b.map_or("-".into(), |v| format!("{v:.5}")),
                opt(c.observed),
                fmt_e(c.kernel_error_a.value),
                opt(c.kernel_error_b.or(c.b_minus_exact_a)),
                opt(c.logits_effect),
                c.kl.map_or("-".into(), |k| fmt_g(k.value)),
            );
        }
        if r.b.logits_dtype.is_none() {
            let _ = writeln!(
                s,
                "    (kernel_b column: b_minus_exact_a = lp_B - exact(logits_A); B has no logits)"
            );
        }
    }
}
