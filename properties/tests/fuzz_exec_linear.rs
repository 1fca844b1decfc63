//! `logprobe fuzz --fused-linear --exec` / `--exec-persistent` end to end
//! (fuzz protocol v2, docs/fuzz-protocol.md): the numpy fused linear kernel
//! (properties/examples/exec/fused_linear_kernel.py) runs clean; each of its
//! planted bugs is found, its dump fails `logprobe verify` and replays on the
//! buggy kernel, not on the correct one; `--require chunk-invariant` holds
//! on the correct kernel and finds a chunk-dependent sum; a malformed answer
//! is a `command` finding. Needs python3 with numpy (skips otherwise, unless
//! `LOGPROBE_REQUIRE_NUMPY=1`).

use std::path::PathBuf;
use std::process::Command;

#[path = "support/numpy.rs"]
mod numpy;

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

fn kernel(py: &str, bug: &str) -> String {
    let k = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/exec/fused_linear_kernel.py");
    format!("{py} {} --persistent --bug {bug}", k.to_string_lossy())
}

fn fuzz(cmd: &str, out: &str, cases: &str) -> std::process::Output {
    logprobe(&[
        "fuzz",
        "--fused-linear",
        "--exec-persistent",
        cmd,
        "--seed",
        "1",
        "--cases",
        cases,
        "--shrink-budget",
        "2s",
        "--out",
        out,
        "--no-progress",
    ])
}

#[test]
fn the_numpy_fused_linear_kernel_is_clean_and_its_bugs_are_found() {
    let Some(py) = numpy::python_with_numpy() else {
        return;
    };
    let dir =
        std::env::temp_dir().join(format!("logprobe-fuzz-linear-exec-{}", std::process::id()));
    let out = dir.to_string_lossy().into_owned();
    let o = fuzz(&kernel(&py, "none"), &out, "60");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("exec-persistent") && t.contains("clean"), "{t}");
    for bug in [
        "bf16-grad-weight-accumulation",
        "dropped-remainder",
        "bias-forward-only",
        "softcap-backward-missing",
    ] {
        let cmd = kernel(&py, bug);
        let o = fuzz(&cmd, &out, "100");
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{bug}: {t}");
        assert!(
            t.contains("FOUND exec-persistent: oracle agreement"),
            "{bug}: {t}"
        );
        let dump = t
            .lines()
            .find_map(|l| l.strip_prefix("  dump:   "))
            .expect("a dump line")
            .to_string();
        assert!(t.contains("--fused-linear"), "{bug}: the rerun line: {t}");
        let v = logprobe(&["verify", "--no-progress", &dump]);
        assert_eq!(v.status.code(), Some(1), "{bug}: {}", text(&v));
        let replay = |cmd: &str| {
            logprobe(&[
                "fuzz",
                "--replay",
                &dump,
                "--fused-linear",
                "--exec-persistent",
                cmd,
            ])
        };
        let r = replay(&cmd);
        assert_eq!(r.status.code(), Some(1), "{bug}: {}", text(&r));
        let r = replay(&kernel(&py, "none"));
        assert_eq!(r.status.code(), Some(0), "{bug}: {}", text(&r));
    }
    // Chunk invariance, when required: the correct kernel holds it; a
    // vocabulary sum split by the chunk size lacks it (and is otherwise
    // right: clean without the requirement).
    let chunked = |bug: &str, require: &str| {
        logprobe(&[
            "fuzz",
            "--fused-linear",
            "--exec-persistent",
            &kernel(&py, bug),
            "--require",
            require,
            "--seed",
            "1",
            "--cases",
            "40",
            "--shrink-budget",
            "2s",
            "--out",
            &out,
            "--no-progress",
        ])
    };
    let o = chunked("none", "chunk-invariant");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = chunked("chunk-dependent", "none");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = chunked("chunk-dependent", "chunk-invariant");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("FOUND exec-persistent: chunk-size invariance"),
        "{t}"
    );
    let o = chunked("none", "batch-invariant");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_answers_are_command_findings() {
    let dir = std::env::temp_dir().join(format!("logprobe-fuzz-linear-bad-{}", std::process::id()));
    let out = dir.to_string_lossy().into_owned();
    for (cmd, want) in [
        ("cp {in} {out}", "output `log_probs` is missing"),
        ("exit 4 # {in} {out}", "exited with status 4"),
    ] {
        let o = logprobe(&[
            "fuzz",
            "--fused-linear",
            "--exec",
            cmd,
            "--seed",
            "1",
            "--cases",
            "3",
            "--out",
            &out,
            "--no-progress",
        ]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {t}");
        assert!(
            t.contains("FOUND exec: command") && t.contains(want),
            "{cmd}: {t}"
        );
    }
    // Usage: an output no fused linear kernel has, and --fused-linear alone.
    let o = logprobe(&[
        "fuzz",
        "--fused-linear",
        "--exec",
        "true {in} {out}",
        "--outputs",
        "topk_log_probs",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = logprobe(&["fuzz", "--fused-linear"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}
