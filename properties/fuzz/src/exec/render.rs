//! The report of an `--exec` run ([`render`]): the finding, the
//! invariances had and lacked, the counts and notes.

use super::super::judge::Call;
use super::{process, ExecReport, ExecTarget, Transport};

/// The report of an `--exec` run: the finding (property, detail, recipe,
/// seed, dumps, how to rerun), the invariances had and lacked, the counts.
pub fn render(r: &ExecReport, target: &ExecTarget) -> String {
    let transport = &target.runner.transport;
    let mut s = String::new();
    if let Some(f) = &r.found {
        s.push_str(&format!(
            "FOUND {}: {} (case {} of seed {}, time to find {:.1} s; shrunk through the command in {} steps, {:.1} s)\n",
            transport.kind(),
            f.finding.property,
            f.case_index,
            r.seed,
            f.time_to_find,
            f.shrink_steps,
            f.shrink_secs
        ));
        s.push_str(&format!(
            "  detail: {}\n",
            super::super::detail_text(&f.finding.detail, 16, "\n          ")
        ));
        s.push_str(&format!("  recipe: {}\n", f.case.recipe()));
        s.push_str(&format!("  seed:   {}\n", r.seed));
        match &f.dump {
            Ok((path, verdict)) => {
                for p in &r.found_dumps {
                    s.push_str(&format!("  dump:   {}\n", p.display()));
                }
                if r.found_dumps.is_empty() {
                    let names: Vec<&str> = r.found_files.iter().map(|(n, _)| n.as_str()).collect();
                    s.push_str(&format!(
                        "  dump:   {} (in memory: report.save(path) writes it)\n",
                        names.join(", ")
                    ));
                }
                s.push_str(&format!(
                    "  logprobe verify {}{}: {verdict}",
                    target
                        .accumulation
                        .map_or(String::new(), |a| format!("--accumulation {a} ")),
                    super::super::files::shell_word(&path.to_string_lossy())
                ));
                if f.finding.call == Call::Invariance {
                    s.push_str(
                        " (verify judges one file at a time; the invariance needs --replay)",
                    );
                }
                s.push('\n');
                let mut rerun = transport.rerun(path);
                if let Some(a) = target.accumulation {
                    match transport {
                        Transport::InProcess(_) => {
                            rerun.pop();
                            rerun.push_str(&format!(", accumulation=\"{a}\")"));
                        }
                        _ => rerun.push_str(&format!(" --accumulation {a}")),
                    }
                }
                s.push_str(&format!("  rerun:  {rerun}\n"));
            }
            Err(e) => s.push_str(&format!("  dump not written: {e}\n")),
        }
    }
    s.push_str(&format!(
        "\nfuzz {}: {} cases in {:.1} s (seed {}): {} checked against the oracle (worst err/bound {:.3}), {} SUSPECT, {} bad input not sent, {} with nothing to check\n",
        transport.kind(),
        r.cases,
        r.seconds,
        r.seed,
        r.checked,
        r.worst,
        r.suspect,
        r.unchecked.0,
        r.unchecked.1
    ));
    let (calls, secs) = r.calls;
    if calls > 0 {
        s.push_str(&format!(
            "calls: {calls} in {secs:.1} s during the search ({:.1} ms per call, {:.1} calls per case){}\n",
            1e3 * secs / calls as f64,
            calls as f64 / r.cases.max(1) as f64,
            if r.shrink_calls > 0 {
                format!(", {} more while shrinking", r.shrink_calls)
            } else {
                String::new()
            }
        ));
    }
    s.push_str("\nproperty            cases held  result\n");
    for &(inv, held) in &r.held {
        let lack = r.lacks.iter().find(|l| l.invariance == inv);
        let required = target.require.contains(&inv);
        let found_here = r
            .found
            .as_ref()
            .is_some_and(|f| f.finding.property == inv.property());
        let result = if found_here {
            "LACKS (required): FOUND".to_string()
        } else if let Some(l) = lack {
            format!(
                "lacks (case {}; --require {} makes it a failure){}",
                l.case_index,
                inv.name(),
                match &l.written {
                    Ok(p) if p.is_empty() => " (dumps in memory)".to_string(),
                    Ok(p) => format!(
                        ": {}",
                        p.iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    Err(e) => format!(" (dumps not written: {e})"),
                }
            )
        } else if held == 0 {
            "not checked (no case it applies to)".to_string()
        } else if required {
            "has (required)".into()
        } else {
            "has".into()
        };
        s.push_str(&format!("{:<19} {:>10}  {result}\n", inv.name(), held));
    }
    for l in &r.lacks {
        s.push_str(&format!(
            "  {}: {}\n    recipe: {}\n",
            l.invariance.name(),
            super::super::detail_text(&l.detail, 4, "\n      "),
            l.case.recipe()
        ));
    }
    if r.found.is_none() && r.checked == 0 {
        s.push_str("UNCHECKED: no case was checked against the oracle: nothing is known of this kernel (exit 1)\n");
    }
    match r.signal {
        Some(sig) => s.push_str(&format!(
            "note: interrupted by {}: the search stopped early; the command's processes were killed\n",
            process::signal_text(sig)
        )),
        None if r.interrupted => {
            s.push_str("note: interrupted (KeyboardInterrupt): the search stopped early\n");
        }
        None => {}
    }
    if r.out_of_time {
        s.push_str("note: the budget ran out during a call: the call was cut short (its processes killed) and its case not judged\n");
    }
    if let Some(n) = &r.close_note {
        s.push_str(&format!("note: {n}\n"));
    }
    s
}
