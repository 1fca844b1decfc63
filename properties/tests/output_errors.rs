//! What `logprobe` does when its output cannot be written: a stdout closed
//! early (`| head -1`, `| true`) is a quiet exit with the verdict's status;
//! a full stdout (`> /dev/full`) is exit 2 with the error on stderr; a full
//! or closed stderr never panics (exit 101 before).

#![cfg(target_os = "linux")]

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn logprobe(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_logprobe"));
    c.args(args);
    c
}

/// A pipe whose read end is already closed: the first write gets EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two fds we then own; the read end is closed at once.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0, "pipe");
        libc::close(fds[0]);
        Stdio::from(OwnedFd::from_raw_fd(fds[1]))
    }
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full (Linux)"),
    )
}

fn run(mut c: Command, stdout: Stdio, stderr: Stdio) -> Output {
    c.stdout(stdout)
        .stderr(stderr)
        .output()
        .expect("run logprobe")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A dump that verifies `pass`, one that verifies `FAIL`.
fn dumps() -> (String, String) {
    let torch = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/torch");
    let pass = torch.join("bf16_log_softmax_zero.safetensors");
    let fail = torch.join("bf16_accumulated_logsumexp.safetensors");
    (
        pass.to_string_lossy().into_owned(),
        fail.to_string_lossy().into_owned(),
    )
}

/// Never a panic's message or status.
fn no_panic(what: &str, o: &Output) {
    assert_ne!(o.status.code(), Some(101), "{what}: {}", stderr(o));
    let e = stderr(o);
    assert!(
        !e.contains("panicked") && !e.contains("failed printing"),
        "{what}: {e}"
    );
}

#[test]
fn a_closed_stdout_is_a_quiet_exit_with_the_verdicts_status() {
    let (pass, fail) = dumps();
    let exec = ["fuzz", "--exec", "exit 3 # {in} {out}", "--seed", "1"];
    let cases: Vec<(Vec<&str>, i32)> = vec![
        (vec!["fuzz", "--list-mutants"], 0),
        (
            vec![
                "fuzz",
                "--kernel",
                "fused",
                "--cases",
                "2",
                "--seed",
                "1",
                "--no-progress",
            ],
            0,
        ),
        (
            [
                &exec[..],
                &["--cases", "1", "--shrink-budget", "0s", "--no-progress"],
            ]
            .concat(),
            1,
        ),
        (vec!["verify", "--no-progress", &pass], 0),
        (vec!["verify", "--no-progress", &fail], 1),
        (vec!["verify", "--json", &fail], 1),
    ];
    let out = tempfile::tempdir().expect("tmp");
    for (args, want) in cases {
        let mut c = logprobe(&args);
        c.current_dir(out.path());
        let o = run(c, closed_pipe(), Stdio::piped());
        no_panic(&args.join(" "), &o);
        assert_eq!(o.status.code(), Some(want), "{args:?}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("Broken pipe"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn a_full_stdout_is_exit_2_with_the_error() {
    let (pass, fail) = dumps();
    let out = tempfile::tempdir().expect("tmp");
    for args in [
        vec!["fuzz", "--list-mutants"],
        vec!["verify", "--json", &pass],
        vec!["verify", "--no-progress", &fail],
        vec![
            "fuzz",
            "--exec",
            "exit 3 # {in} {out}",
            "--cases",
            "1",
            "--shrink-budget",
            "0s",
            "--no-progress",
        ],
    ] {
        let mut c = logprobe(&args);
        c.current_dir(out.path());
        let o = run(c, dev_full(), Stdio::piped());
        no_panic(&args.join(" "), &o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot write the report to standard output: No space left"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn a_full_or_closed_stderr_never_panics() {
    let out = tempfile::tempdir().expect("tmp");
    let exec = [
        "fuzz",
        "--exec",
        "exit 3 # {in} {out}",
        "--cases",
        "1",
        "--shrink-budget",
        "0s",
    ];
    for (args, want) in [
        (exec.to_vec(), 1),
        (vec!["fuzz", "--kernel", "no-such-kernel"], 2),
        (vec!["fuzz", "--kernel", "fused", "--cases", "1"], 0),
    ] {
        for (name, err) in [("full", dev_full()), ("closed", closed_pipe())] {
            let mut c = logprobe(&args);
            c.current_dir(out.path());
            let o = run(c, Stdio::piped(), err);
            assert_ne!(o.status.code(), Some(101), "{args:?} stderr {name}");
            assert_eq!(o.status.code(), Some(want), "{args:?} stderr {name}");
        }
    }
}
