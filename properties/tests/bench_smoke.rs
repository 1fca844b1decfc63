//! `logprobe bench` runs end to end on a small problem and its reports parse:
//! the JSON holds every path with finite positive figures, and the text
//! report holds the tables. No timing is asserted.

use std::process::Command;

fn logprobe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .args(args)
        .output()
        .expect("run logprobe")
}

const SMALL: [&str; 11] = [
    "bench",
    "--n",
    "3",
    "--v",
    "3000",
    "--reps",
    "1",
    "--oracle-v",
    "64",
    "--threads",
    "2",
];

#[test]
fn bench_json_report_parses_with_every_path() {
    let mut args = SMALL.to_vec();
    args.push("--json");
    let out = logprobe(&args);
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    assert_eq!(doc["config"]["n"], 3);
    assert_eq!(doc["config"]["v"], 3000);
    assert_eq!(doc["machine"]["threads"], 2);
    let paths = doc["paths"].as_array().expect("paths");
    for dtype in ["f32", "bf16"] {
        for prefix in [
            "roofline (read sum)",
            "fused forward (log_prob + entropy)",
            "fused forward (log_prob)",
            "chunked forward",
            "vocab-parallel forward",
            "roofline (read + write",
            "fused backward (",
            "fused backward (f64",
            "candle composed",
        ] {
            let p = paths
                .iter()
                .find(|p| p["dtype"] == dtype && p["path"].as_str().unwrap().starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} {dtype} path"));
            for key in ["gb_per_s", "fraction_of_roofline"] {
                let x = p[key].as_f64().expect(key);
                assert!(x.is_finite() && x > 0.0, "{prefix} {dtype} {key} = {x}");
            }
            // Logits read; the read + write paths also count what they write:
            // a copy of the logits, the gradient in the logits' dtype (the
            // reused-buffer path, found first) or in f64.
            let read = 3 * 3000 * if dtype == "f32" { 4 } else { 2 };
            let moved = match prefix {
                "roofline (read + write" | "fused backward (" => 2 * read,
                "fused backward (f64" => read + 3 * 3000 * 8,
                _ => read,
            };
            assert_eq!(p["bytes"], moved, "{prefix} {dtype}");
        }
    }
    assert_eq!(doc["candle_ratios"].as_array().unwrap().len(), 2);
    // The logprobe binary installs the counting allocator: peaks are measured.
    assert_eq!(doc["memory_counted"], true);
    for m in doc["memory"].as_array().unwrap() {
        let peak = m["peak_extra_bytes"].as_u64().expect("measured peak");
        assert!(peak <= m["budget_bytes"].as_u64().unwrap(), "{m}");
    }
    let oracle = doc["oracle"].as_array().unwrap();
    assert_eq!(oracle.len(), 4);
    for o in oracle {
        for key in ["forward_ns_per_entry", "vjp_ns_per_entry"] {
            let x = o[key].as_f64().unwrap();
            assert!(x.is_finite() && x > 0.0, "{o}");
        }
    }
    let targets = doc["targets"].as_array().unwrap();
    assert!(targets
        .iter()
        .any(|t| t["target"].as_str().unwrap().contains("read roofline")));
    assert!(targets.iter().all(|t| t["met"].is_boolean()));
}

#[test]
fn bench_text_report_has_its_tables() {
    let out = logprobe(&SMALL);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "logprobe bench: N = 3, V = 3000",
        "roofline (read sum)",
        "fused forward (log_prob + entropy)",
        "candle / fused",
        "peak extra B",
        "forward ns/entry",
        "threshold",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
}

#[test]
fn bench_rejects_a_zero_size_with_exit_2() {
    let out = logprobe(&["bench", "--n", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("n must be at least 1"));
}
