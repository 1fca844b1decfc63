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
        met: measured_at_all(measured).then_some(measured >= threshold),
    };
    let at_most = |target: String, measured: f64, threshold: f64| TargetResult {
        target,
        measured,
        threshold,
        met: measured_at_all(measured).then_some(measured <= threshold),
    };
    // A memory figure of 0 is a measurement (nothing allocated).
    let at_most_bytes = |target: String, measured: f64, threshold: f64| TargetResult {
        target,
        measured,
        threshold,
        met: (measured >= 0.0).then_some(measured <= threshold),
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
            t.push(at_most_bytes(
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
        // Issue 10's targets for the f64 tier (V = 152064, one thread),
        // docs/design.md's 1.5 us for the MPFR path; held on CPU time where the
        // platform gives it (a loaded machine inflates wall time).
        let (fwd, vjp) = if o.tier == "f64" {
            (25.0, 50.0)
        } else {
            (1500.0, 1500.0)
        };
        let clock = if o.forward_cpu_ns_per_entry.is_some() {
            "CPU"
        } else {
            "wall"
        };
        t.push(at_most(
            format!(
                "oracle {} tier {} -> {} forward {clock} ns/entry",
                o.tier, o.logits, o.target
            ),
            o.forward_cpu_ns_per_entry.unwrap_or(o.forward_ns_per_entry),
            fwd,
        ));
        t.push(at_most(
            format!(
                "oracle {} tier {} -> {} VJP {clock} ns/entry",
                o.tier, o.logits, o.target
            ),
            o.vjp_cpu_ns_per_entry.unwrap_or(o.vjp_ns_per_entry),
            vjp,
        ));
    }
    t
}

/// Whether a time-derived figure is a measurement: positive and finite. A
/// time, ratio or fraction of 0 (a clock that did not advance, nothing timed) or NaN
/// meets no target: its `met` is `None` ("n/a"), never "yes".
pub(crate) fn measured_at_all(measured: f64) -> bool {
    measured.is_finite() && measured > 0.0
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
            "{:<22} {:>8} {:>14} {:>10} {:>14} {:>10} {:>9} {:>9}",
            "oracle (1 thr)",
            "V",
            "fwd ns (wall)",
            "fwd CPU",
            "VJP ns (wall)",
            "VJP CPU",
            "fwd MPFR",
            "VJP MPFR"
        );
        let cpu = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}"));
        for o in &r.oracle {
            let _ = writeln!(
                s,
                "{:<22} {:>8} {:>14.1} {:>10} {:>14.1} {:>10} {:>9.4} {:>9.4}",
                format!("{} {} -> {}", o.tier, o.logits, o.target),
                o.v,
                o.forward_ns_per_entry,
                cpu(o.forward_cpu_ns_per_entry),
                o.vjp_ns_per_entry,
                cpu(o.vjp_cpu_ns_per_entry),
                o.forward_fallback,
                o.vjp_fallback
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
