//! The targets each figure is held to, and the text report.

use super::*;

pub(crate) fn targets(
    paths: &[PathResult],
    candle: &[CandleRatio],
    memory: &[MemoryResult],
    oracle: &[OracleResult],
) -> Vec<TargetResult> {
    let mut t = Vec::new();
    let at_least = |target: String, measured: f64, threshold: f64| TargetResult {
        target,
        measured,
        threshold,
        met: Some(measured >= threshold),
    };
    let at_most = |target: String, measured: f64, threshold: f64| TargetResult {
        target,
        measured,
        threshold,
        met: Some(measured <= threshold),
    };
    if let Some(p) = paths
        .iter()
        .find(|p| p.dtype == "f32" && p.path == "fused forward (log_prob + entropy)")
    {
        t.push(at_least(
            "fused f32 forward (log_prob + entropy) / read roofline".into(),
            p.fraction_of_roofline,
            0.75,
        ));
    }
    for (dtype, path) in [
        ("f32", "fused backward (f32 out, reused buffer)"),
        ("bf16", "fused backward (bf16 out, reused buffer)"),
    ] {
        if let Some(p) = paths.iter().find(|p| p.dtype == dtype && p.path == path) {
            for (what, c) in [
                ("wall", p.cycles_per_entry),
                ("on CPU", p.cycles_per_entry_on_cpu),
            ] {
                if let Some(c) = c {
                    t.push(at_most(
                        format!("backward {dtype} -> {dtype} (reused buffer) cycles/entry, {what}"),
                        c,
                        4.0,
                    ));
                }
            }
        }
    }
    if let Some(c) = candle.iter().find(|c| c.dtype == "f32") {
        t.push(at_least(
            "fused f32 forward (log_prob) speedup over candle composed f32".into(),
            c.fused_log_prob_speedup,
            5.0,
        ));
    }
    for m in memory {
        if let Some(peak) = m.peak_extra_bytes {
            t.push(at_most(
                format!(
                    "{} {} forward peak extra memory / budget",
                    m.kernel, m.dtype
                ),
                peak as f64 / m.budget_bytes as f64,
                1.0,
            ));
        }
    }
    for o in oracle {
        t.push(at_most(
            format!("oracle {} -> {} forward ns/entry", o.logits, o.target),
            o.forward_ns_per_entry,
            1500.0,
        ));
        t.push(at_most(
            format!("oracle {} -> {} VJP ns/entry", o.logits, o.target),
            o.vjp_ns_per_entry,
            1500.0,
        ));
    }
    t
}

/// The report as text tables: machine, paths, candle ratios, memory,
/// oracle, targets.
pub fn render(r: &BenchReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let c = &r.config;
    let m = &r.machine;
    let _ = writeln!(
        s,
        "logprobe bench: N = {}, V = {}, reps = {} (best / median), chunk_size = {}, shards = {}",
        c.n, c.v, c.reps, c.chunk_size, c.shards
    );
    let _ = writeln!(
        s,
        "machine: {} | threads = {} | cpu_path = {} | clock ~ {} GHz | load average (1 min) = {}",
        m.cpu_model.as_deref().unwrap_or("unknown CPU"),
        m.threads,
        m.cpu_path,
        m.clock_ghz.map_or("?".into(), |g| format!("{g:.2}")),
        m.load_average.map_or("?".into(), |l| format!("{l:.2}")),
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<40} {:>5} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>4}",
        "path",
        "dtype",
        "best ms",
        "median ms",
        "GB/s",
        "roofline",
        "cyc/entry",
        "on-CPU cyc",
        "thr"
    );
    for p in &r.paths {
        let _ = writeln!(
            s,
            "{:<40} {:>5} {:>10.3} {:>10.3} {:>9.2} {:>8.1}% {:>10} {:>10} {:>4}",
            p.path,
            p.dtype,
            p.timing.best_s * 1e3,
            p.timing.median_s * 1e3,
            p.gb_per_s,
            100.0 * p.fraction_of_roofline,
            p.cycles_per_entry.map_or("?".into(), |c| format!("{c:.3}")),
            p.cycles_per_entry_on_cpu
                .map_or("?".into(), |c| format!("{c:.3}")),
            p.threads
        );
    }
    if !r.candle_ratios.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<5} {:>28} {:>34}",
            "dtype", "candle / fused (log_prob)", "candle / fused (log_prob + entropy)"
        );
        for c in &r.candle_ratios {
            let _ = writeln!(
                s,
                "{:<5} {:>27.2}x {:>33.2}x",
                c.dtype, c.fused_log_prob_speedup, c.fused_with_entropy_speedup
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<28} {:>5} {:>14} {:>14} {:>14} {:>16}",
        "forward memory", "dtype", "peak extra B", "workspace B", "budget B", "[N, V] f32 B"
    );
    for x in &r.memory {
        let _ = writeln!(
            s,
            "{:<28} {:>5} {:>14} {:>14} {:>14} {:>16}",
            x.kernel,
            x.dtype,
            x.peak_extra_bytes
                .map_or("not counted".into(), |b| b.to_string()),
            x.workspace_bytes,
            x.budget_bytes,
            x.materialised_bytes
        );
    }
    if !r.oracle.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>18} {:>14}",
            "oracle (1 thr)", "V", "forward ns/entry", "VJP ns/entry"
        );
        for o in &r.oracle {
            let _ = writeln!(
                s,
                "{:<14} {:>8} {:>18.1} {:>14.1}",
                format!("{} -> {}", o.logits, o.target),
                o.v,
                o.forward_ns_per_entry,
                o.vjp_ns_per_entry
            );
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<66} {:>12} {:>10} {:>5}",
        "target", "measured", "threshold", "met"
    );
    for t in &r.targets {
        let _ = writeln!(
            s,
            "{:<66} {:>12.3} {:>10.3} {:>5}",
            t.target,
            t.measured,
            t.threshold,
            match t.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "n/a",
            }
        );
    }
    s
}
