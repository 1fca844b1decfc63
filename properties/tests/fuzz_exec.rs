//! `logprobe fuzz --exec` / `--exec-persistent` end to end (protocol v1,
//! docs/fuzz-protocol.md).
//!
//! - Always (shell commands only): a timeout, a crash with its stderr, a
//!   garbage answer, a missing output, no `{out}`, garbage on a persistent
//!   stdout and a process that exits are each a finding of kind `command`
//!   (exit 1, never a hang or a panic); bad usage exits 2.
//! - With python3 and numpy (properties/examples/exec): the correct numpy
//!   kernel passes (one-shot and persistent, every invariance required);
//!   each planted bug is found, written as dumps that `logprobe verify` and
//!   `fuzz --replay` reproduce. Without numpy these skip with a message,
//!   unless `LOGPROBE_REQUIRE_NUMPY=1` (set by `.ci/run`): then they fail.
//!   `LOGPROBE_PYTHON` picks the interpreter (default `python3`).
//!
//! No timing is asserted (time to find: scripts/fuzz-exec.sh).

use std::path::PathBuf;
use std::process::Command;

fn logprobe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_logprobe"))
        .args(args)
        .output()
        .expect("run logprobe")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The first `dump:` path a report names (the names carry the dump's hash).
fn first_dump(report: &str) -> String {
    report
        .lines()
        .find_map(|l| l.strip_prefix("  dump:   "))
        .unwrap_or_else(|| panic!("no dump line:\n{report}"))
        .to_string()
}

fn out_dir(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("logprobe-fuzz-exec-{name}-{}", std::process::id()));
    d.to_string_lossy().into_owned()
}

/// `fuzz` with `flag CMD`, seed 1, quiet.
fn fuzz(flag: &str, cmd: &str, out: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "fuzz",
        flag,
        cmd,
        "--seed",
        "1",
        "--out",
        out,
        "--no-progress",
    ];
    args.extend_from_slice(extra);
    logprobe(&args)
}

/// `--budget` and `--shrink-budget` are wall-clock limits on the calls: a
/// call under way when one runs out is cut (its processes killed) and is
/// no finding, and no call starts after it. Checked by what the run
/// reports, not by its time (docs/fuzz.md: "Budgets").
#[test]
fn budgets_cut_the_call_under_way() {
    let out = out_dir("budgets");
    // The search: every call would take 60 s; the 1 s budget cuts the first.
    for (flag, cmd) in [
        ("--exec", "sleep 60; false {in} {out}"),
        ("--exec-persistent", "exec sleep 60"),
    ] {
        let o = fuzz(flag, cmd, &out, &["--budget", "1s", "--timeout", "120s"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{t}");
        assert!(!t.contains("FOUND"), "{t}");
        assert!(t.contains("note: the budget ran out during a call"), "{t}");
        assert!(t.contains("UNCHECKED"), "{t}");
    }
    // The shrink: the first call fails at once, every later one would take
    // 60 s (and then fail the same way): the 1 s shrink budget cuts the
    // first shrink call, which keeps no step.
    let mark = std::env::temp_dir().join(format!("logprobe-budget-mark-{}", std::process::id()));
    let _ = std::fs::remove_file(&mark);
    let m = mark.to_string_lossy();
    let cmd = format!("if [ -e '{m}' ]; then sleep 60; fi; touch '{m}'; exit 3 # {{in}} {{out}}");
    let o = fuzz(
        "--exec",
        &cmd,
        &out,
        &[
            "--budget",
            "60s",
            "--shrink-budget",
            "1s",
            "--timeout",
            "120s",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("FOUND exec: command"), "{t}");
    assert!(t.contains("exited with status 3"), "{t}");
    assert!(t.contains("shrunk through the command in 0 steps"), "{t}");
    let _ = std::fs::remove_file(&mark);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn command_failures_are_findings_of_kind_command() {
    let out = out_dir("failures");
    let cases: [(&str, &str, &str); 9] = [
        (
            "--exec",
            "sleep 30 # {in} {out}",
            "timed out: no exit within 1 s",
        ),
        (
            "--exec",
            "echo kernel exploded >&2; exit 3 # {in} {out}",
            "exited with status 3",
        ),
        (
            "--exec",
            "kill -SEGV $$ # {in} {out}",
            "was killed by signal 11 (SIGSEGV)",
        ),
        (
            "--exec",
            "head -c 100 /dev/urandom > {out} # {in}",
            "the output is not a safetensors dump",
        ),
        ("--exec", "cp {in} {out}", "output `log_probs` is missing"),
        (
            "--exec",
            "true {in} {out}",
            "exited 0 but wrote no {out} file",
        ),
        (
            "--exec-persistent",
            "sleep 30",
            "no answer frame within 1 s",
        ),
        (
            "--exec-persistent",
            "head -c 16 /dev/urandom; sleep 30",
            "bad frame: frame length",
        ),
        (
            "--exec-persistent",
            "head -c 8 >/dev/null; exit 4",
            "closed its standard output",
        ),
    ];
    for (flag, cmd, want) in cases {
        let o = fuzz(
            flag,
            cmd,
            &out,
            &[
                "--cases",
                "2",
                "--timeout",
                "1s",
                "--shrink-budget",
                "0s",
                "--options",
                "tokens=on,vocab=1..64",
            ],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{flag} {cmd}:\n{t}");
        assert!(t.contains(": command (case 0"), "{flag} {cmd}:\n{t}");
        assert!(t.contains(want), "{flag} {cmd}: want `{want}`:\n{t}");
        assert!(t.contains("  rerun:  logprobe fuzz --replay"), "{t}");
    }
    // The stderr tail comes with the finding.
    let o = fuzz(
        "--exec",
        "echo kernel exploded >&2; exit 3 # {in} {out}",
        &out,
        &[
            "--cases",
            "1",
            "--shrink-budget",
            "0s",
            "--options",
            "tokens=on,vocab=1..64",
        ],
    );
    assert!(
        text(&o).contains("stderr (tail):\n          kernel exploded"),
        "{}",
        text(&o)
    );
    // A command finding's dump holds the inputs; replay needs the command
    // (never runs one stored in a file).
    let dump = first_dump(&text(&o));
    let o = logprobe(&["fuzz", "--replay", &dump]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("rerun it with --exec CMD"),
        "{}",
        text(&o)
    );
    let o = logprobe(&["fuzz", "--replay", &dump, "--exec", "exit 3 # {in} {out}"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("still fails command"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_usage_exits_2() {
    for (args, want) in [
        (
            vec!["fuzz", "--exec", "python3 k.py"],
            "must contain {in} and {out}",
        ),
        (
            vec![
                "fuzz",
                "--exec",
                "x {in} {out}",
                "--require",
                "batch-invarient",
            ],
            "unknown property `batch-invarient`",
        ),
        (
            vec![
                "fuzz",
                "--exec",
                "x {in} {out}",
                "--options",
                "bad=nan-logit",
            ],
            "valid inputs only",
        ),
        (
            vec!["fuzz", "--exec", "x {in} {out}", "--kernel", "fused"],
            "cannot be used with",
        ),
        (
            vec!["fuzz", "--exec", "x {in} {out}", "--accumulation", "f8"],
            "unknown dtype `f8`",
        ),
        (
            vec!["fuzz", "--kernel", "fused", "--accumulation", "bf16"],
            "goes with --exec or --exec-persistent",
        ),
    ] {
        let o = logprobe(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(want), "{args:?}: {}", text(&o));
    }
}

/// The interpreter with numpy, or `None` (skip) unless CI requires it.
#[path = "support/numpy.rs"]
mod numpy;
use numpy::python_with_numpy;

fn adapter() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/exec/adapter.py")
}

fn kernel_cmd(py: &str, persistent: bool, bug: &str) -> String {
    let a = adapter();
    let a = a.to_string_lossy();
    if persistent {
        format!("{py} {a} --persistent --bug {bug}")
    } else {
        format!("{py} {a} --bug {bug} --in {{in}} --out {{out}}")
    }
}

#[test]
fn the_correct_numpy_kernel_passes_with_every_invariance_required_even_strict() {
    let Some(py) = python_with_numpy() else {
        return;
    };
    let out = out_dir("numpy-correct");
    let all = "padding-invariant,chunk-invariant,batch-invariant";
    let o = fuzz(
        "--exec-persistent",
        &kernel_cmd(&py, true, "none"),
        &out,
        &[
            "--cases",
            "25",
            "--vocab",
            "1..64",
            "--require",
            all,
            "--strict",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(!t.contains("FOUND"), "{t}");
    // Something was checked, and every invariance applied somewhere.
    let checked: u64 = t
        .split("cases in")
        .nth(1)
        .and_then(|s| s.split(": ").nth(1))
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(checked >= 15, "{t}");
    // Correct code is never SUSPECT: --strict finds nothing either.
    assert!(t.contains(" 0 SUSPECT"), "{t}");
    for inv in ["padding-invariant", "chunk-invariant", "batch-invariant"] {
        let line = t.lines().find(|l| l.starts_with(inv)).unwrap_or_default();
        assert!(line.contains("has (required)"), "{inv}: {t}");
    }
    // One-shot: the same contract through files.
    let o = fuzz(
        "--exec",
        &kernel_cmd(&py, false, "none"),
        &out,
        &["--cases", "3", "--vocab", "1..64"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn planted_bugs_are_found_and_their_dumps_reproduce() {
    let Some(py) = python_with_numpy() else {
        return;
    };
    let out = out_dir("numpy-bugs");
    // (bug, --require, --options, the property found)
    let bugs = [
        (
            "entropy-no-max-shift",
            "none",
            "entropy=unmasked,offset=1e3|-1e4,vocab=1..64",
            "oracle agreement",
        ),
        (
            "padded-vocab-not-truncated",
            "none",
            "padding=1..8,vocab=1..64",
            "oracle agreement",
        ),
        (
            "dropped-chunk-remainder",
            "none",
            "rows=3..8,chunk=2,vocab=1..64",
            "oracle agreement",
        ),
        (
            "batch-dependent",
            "batch-invariant",
            "rows=2..6,vocab=200..400",
            "batch invariance",
        ),
    ];
    for (bug, require, options, property) in bugs {
        let o = fuzz(
            "--exec-persistent",
            &kernel_cmd(&py, true, bug),
            &out,
            &[
                "--budget",
                "60s",
                "--shrink-budget",
                "3s",
                "--require",
                require,
                "--options",
                options,
            ],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{bug}: {t}");
        assert!(
            t.contains(&format!("FOUND exec-persistent: {property}")),
            "{bug}: {t}"
        );
        let dump = first_dump(&t);
        let cmd = kernel_cmd(&py, true, bug);
        // verify reproduces an oracle finding; replay reruns any.
        let v = logprobe(&["verify", &dump]);
        if property == "oracle agreement" {
            assert_eq!(v.status.code(), Some(1), "{bug}: {}", text(&v));
            assert!(text(&v).contains("FAIL"), "{bug}: {}", text(&v));
        } else {
            assert_eq!(v.status.code(), Some(0), "{bug}: {}", text(&v));
        }
        let r = logprobe(&["fuzz", "--replay", &dump, "--exec-persistent", &cmd]);
        assert_eq!(r.status.code(), Some(1), "{bug}: {}", text(&r));
        assert!(
            text(&r).contains(&format!("still fails {property}")),
            "{bug}: {}",
            text(&r)
        );
        // The correct kernel passes the same case.
        let fixed = kernel_cmd(&py, true, "none");
        let r = logprobe(&["fuzz", "--replay", &dump, "--exec-persistent", &fixed]);
        assert_eq!(r.status.code(), Some(0), "{bug}: {}", text(&r));
    }
    // Without --require, a lack is reported, not a failure.
    let o = fuzz(
        "--exec-persistent",
        &kernel_cmd(&py, true, "batch-dependent"),
        &out,
        &["--cases", "12", "--options", "rows=2..6,vocab=200..400"],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(
        t.contains("batch-invariant") && t.contains("lacks (case"),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// A numerical failure is a verdict on the answer, not on the process: the
/// persistent process that gave it keeps serving the shrink (one start for
/// the whole run, however many failing calls the shrink makes).
#[test]
fn a_numerical_failure_keeps_the_persistent_process() {
    let Some(py) = python_with_numpy() else {
        return;
    };
    let out = out_dir("numpy-keeps");
    let starts = std::env::temp_dir().join(format!("logprobe-starts-{}", std::process::id()));
    let _ = std::fs::remove_file(&starts);
    let cmd = format!(
        "echo start >> {}; exec {}",
        starts.display(),
        kernel_cmd(&py, true, "entropy-no-max-shift")
    );
    let o = fuzz(
        "--exec-persistent",
        &cmd,
        &out,
        &[
            "--budget",
            "60s",
            "--shrink-budget",
            "5s",
            "--require",
            "none",
            "--options",
            "entropy=unmasked,offset=1e3|-1e4,vocab=1..64",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("FOUND exec-persistent: oracle agreement"), "{t}");
    // The shrink called the kernel, and some of those calls failed.
    let more: u64 = t
        .split(" more while shrinking")
        .next()
        .filter(|head| head.len() < t.len())
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    assert!(more > 0, "no call while shrinking: {t}");
    // Each kept shrink step is a call that failed the same property.
    let steps: u64 = t
        .split("shrunk through the command in ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0);
    assert!(steps > 0, "not shrunk: {t}");
    let n = std::fs::read_to_string(&starts)
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(n, 1, "the persistent process started {n} times: {t}");
    let _ = std::fs::remove_file(&starts);
    let _ = std::fs::remove_dir_all(&out);
}

/// The wrapper of the Python package (`python -m logprobe.persist`, here
/// run as a file: it needs only the standard library) runs the unchanged
/// one-shot numpy adapter persistently: one process for the whole run, the
/// correct kernel passes, a planted bug is found and shrunk.
#[test]
fn a_one_shot_adapter_runs_persistently_through_logprobe_persist() {
    let Some(py) = python_with_numpy() else {
        return;
    };
    let persist =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/python/logprobe/persist.py");
    let out = out_dir("numpy-persist");
    let starts =
        std::env::temp_dir().join(format!("logprobe-persist-starts-{}", std::process::id()));
    let cmd = |bug: &str| {
        format!(
            "echo start >> {}; exec {py} {} {} --bug {bug} --in {{in}} --out {{out}}",
            starts.display(),
            persist.display(),
            adapter().display()
        )
    };
    let starts_n = || std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count());
    let _ = std::fs::remove_file(&starts);
    let o = fuzz(
        "--exec-persistent",
        &cmd("none"),
        &out,
        &[
            "--cases",
            "12",
            "--vocab",
            "1..64",
            "--require",
            "padding-invariant,batch-invariant",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("has (required)"), "{t}");
    assert_eq!(starts_n(), 1, "{t}");
    let _ = std::fs::remove_file(&starts);
    let o = fuzz(
        "--exec-persistent",
        &cmd("entropy-no-max-shift"),
        &out,
        &[
            "--budget",
            "60s",
            "--shrink-budget",
            "5s",
            "--require",
            "none",
            "--options",
            "entropy=unmasked,offset=1e3|-1e4,vocab=1..64",
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("FOUND exec-persistent: oracle agreement"), "{t}");
    assert_eq!(starts_n(), 1, "{t}");
    let _ = std::fs::remove_file(&starts);
    let _ = std::fs::remove_dir_all(&out);
}

/// `--accumulation` is the dtype of the kernel's bound: the same cases
/// (seed, case count) judged with a bf16 accumulation have a smaller worst
/// `error / bound` than with the default f32 (the bf16 bound is wider).
#[test]
fn the_declared_accumulation_dtype_sets_the_bound() {
    let Some(py) = python_with_numpy() else {
        return;
    };
    let out = out_dir("numpy-accumulation");
    let worst = |extra: &[&str]| {
        let mut args = vec!["--cases", "12", "--dtype", "f32", "--vocab", "1..64"];
        args.extend_from_slice(extra);
        let o = fuzz(
            "--exec-persistent",
            &kernel_cmd(&py, true, "none"),
            &out,
            &args,
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(0), "{t}");
        t.split("worst err/bound ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .and_then(|w| w.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no worst err/bound: {t}"))
    };
    let (f32_acc, bf16_acc) = (worst(&[]), worst(&["--accumulation", "bf16"]));
    assert!(f32_acc > 0.0, "nothing judged: {f32_acc}");
    assert!(bf16_acc < f32_acc, "bf16 {bf16_acc} vs f32 {f32_acc}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--outputs` naming `lse` and `z_loss` asks for them (with `z_loss_coef`;
/// protocol v1 never asks them by default): the correct numpy kernel
/// passes; one whose lse leaves out the max it shifted by is found, its
/// dump fails `logprobe verify` and its replay still fails.
#[test]
fn lse_and_z_loss_are_judged_when_named() {
    let Some(py) = python_with_numpy() else {
        return;
    };
    let out = out_dir("numpy-lse");
    let outputs = "log_probs,lse,z_loss";
    let o = fuzz(
        "--exec-persistent",
        &kernel_cmd(&py, true, "none"),
        &out,
        &["--cases", "20", "--vocab", "1..64", "--outputs", outputs],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(!t.contains("FOUND"), "{t}");
    let cmd = kernel_cmd(&py, true, "lse-missing-max");
    let o = fuzz(
        "--exec-persistent",
        &cmd,
        &out,
        &[
            "--budget",
            "60s",
            "--shrink-budget",
            "3s",
            "--vocab",
            "1..64",
            "--outputs",
            outputs,
        ],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("FOUND exec-persistent: oracle agreement"), "{t}");
    let dump = first_dump(&t);
    let v = logprobe(&["verify", &dump]);
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(text(&v).contains("lse"), "{}", text(&v));
    let r = logprobe(&[
        "fuzz",
        "--replay",
        &dump,
        "--exec-persistent",
        &cmd,
        "--outputs",
        outputs,
    ]);
    assert_eq!(r.status.code(), Some(1), "{}", text(&r));
    let _ = std::fs::remove_dir_all(&out);
}
