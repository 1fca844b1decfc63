//! `fuzz --exec` / `--exec-persistent` leave nothing behind
//! (docs/fuzz-protocol.md, "Process hygiene"): hostile adapters (a
//! backgrounded sleeper, a double fork, a `setsid` grandchild, an abort, a
//! hang) run through the real binary with a private `TMPDIR`; every process
//! they started writes its pid to a file, and after the run each pid must
//! be dead (gone, or a zombie) and no `logprobe-exec-*` directory left.
//! Then SIGINT, SIGTERM and SIGHUP during a call: logprobe dies by the
//! signal within seconds, with the same guarantees. Linux only (`/proc`).

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A private directory: the adapters' scripts and pid files, `tmp/` the
/// binary's TMPDIR, `out/` its findings.
struct Scene {
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let dir = tempfile::Builder::new()
            .prefix("logprobe-hygiene-")
            .tempdir()
            .expect("a temp dir");
        std::fs::create_dir(dir.path().join("tmp")).expect("tmp");
        Scene { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the script `name` (run by `sh`); `PIDS` in it is the pid file.
    fn script(&self, name: &str, body: &str) -> String {
        let body = body.replace("PIDS", &self.path("pids").to_string_lossy());
        std::fs::write(self.path(name), format!("#!/bin/sh\n{body}\n")).expect("script");
        format!("sh {}", self.path(name).display())
    }

    fn command(&self, flag: &str, cmd: &str, extra: &[&str]) -> Command {
        self.command_to(flag, cmd, extra, &self.path("out"))
    }

    /// [`Scene::command`] with the findings in `out`.
    fn command_to(&self, flag: &str, cmd: &str, extra: &[&str], out: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_logprobe"));
        c.args(["fuzz", flag, cmd, "--seed", "1", "--no-progress", "--out"])
            .arg(out)
            .args(["--options", "tokens=on,vocab=1..64"])
            .args(extra)
            .env("TMPDIR", self.path("tmp"));
        c
    }

    fn run(&self, flag: &str, cmd: &str, extra: &[&str]) -> Output {
        self.command(flag, cmd, extra)
            .output()
            .expect("run logprobe")
    }

    /// The pids the adapters wrote.
    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Pids still running (not gone, not a zombie), after a grace of 2 s
    /// for SIGKILLs in flight.
    fn survivors(&self) -> Vec<i32> {
        let end = Instant::now() + Duration::from_secs(2);
        loop {
            let alive: Vec<i32> = self.pids().into_iter().filter(|&p| running(p)).collect();
            if alive.is_empty() || Instant::now() >= end {
                return alive;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `logprobe-exec-*` entries left in the private TMPDIR.
    fn temp_left(&self) -> Vec<String> {
        std::fs::read_dir(self.path("tmp"))
            .expect("tmp")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("logprobe-exec-"))
            .collect()
    }

    /// Kills what survived (so a failing test leaves nothing either).
    fn cleanup(&self) {
        for p in self.pids() {
            if running(p) {
                // SAFETY: kill(2) of a pid our adapter wrote.
                unsafe {
                    libc::kill(p, libc::SIGKILL);
                }
            }
        }
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Whether `pid` runs (exists and is not a zombie).
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_ascii_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Background sleeper, double fork and `setsid` grandchild, each pid
/// written; the `setsid` one is waited for, so its pid is on file before
/// the adapter goes on.
const SPAWN_ALL: &str = r#"
echo $$ >> PIDS
sleep 300 &
echo $! >> PIDS
( sleep 300 & echo $! >> PIDS )
f=$(mktemp "PIDS.gc.XXXXXX")
setsid sh -c 'echo $$ > "$1"; exec sleep 300' sh "$f" &
while [ ! -s "$f" ]; do sleep 0.01; done
cat "$f" >> PIDS
"#;

#[test]
fn hostile_one_shot_adapters_leave_no_process_and_no_temp_dir() {
    // (body after SPAWN_ALL, --timeout, what the finding says)
    let cases = [
        ("exit 0", "1s", "exited 0 but wrote no {out} file"),
        ("exit 3", "1s", "exited with status 3"),
        ("kill -ABRT $$", "1s", "was killed by signal 6 (SIGABRT)"),
        (
            "sh -c 'kill -ABRT $$'; exit $?",
            "1s",
            "exited with status 134: a command it ran was killed by signal 6 (SIGABRT)",
        ),
        ("sleep 60", "1s", "timed out: no exit within 1 s"),
    ];
    for (tail, timeout, want) in cases {
        let s = Scene::new();
        let cmd = format!(
            "{} # {{in}} {{out}}",
            s.script("adapter.sh", &format!("{SPAWN_ALL}\n{tail}"))
        );
        let o = s.run(
            "--exec",
            &cmd,
            &[
                "--cases",
                "2",
                "--timeout",
                timeout,
                "--shrink-budget",
                "3s",
            ],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{tail}:\n{t}");
        assert!(t.contains(want), "{tail}: want `{want}`:\n{t}");
        let pids = s.pids();
        // The leader and three descendants per call, at least one call.
        assert!(pids.len() >= 4, "{tail}: pids {pids:?}\n{t}");
        assert_eq!(s.survivors(), Vec::<i32>::new(), "{tail}: survivors\n{t}");
        assert_eq!(
            s.temp_left(),
            Vec::<String>::new(),
            "{tail}: temp dirs\n{t}"
        );
    }
}

#[test]
fn hostile_persistent_adapters_leave_no_process_and_no_temp_dir() {
    // `cat` echoes the request frame: an answer without outputs (a finding;
    // the process is killed, a fresh one serves each shrink step).
    let cases = [
        ("cat", "output `log_probs` is missing"),
        // Its sleepers hold its stdout open: the exit is seen, not an EOF.
        (
            "head -c 8 >/dev/null; exit 4",
            "exited with status 4 without answering",
        ),
        ("kill -ABRT $$", "killed by signal 6 (SIGABRT)"),
        ("sleep 60", "no answer frame within 1 s"),
    ];
    for (tail, want) in cases {
        let s = Scene::new();
        let cmd = s.script("adapter.sh", &format!("{SPAWN_ALL}\n{tail}"));
        let o = s.run(
            "--exec-persistent",
            &cmd,
            &["--cases", "2", "--timeout", "1s", "--shrink-budget", "3s"],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{tail}:\n{t}");
        assert!(t.contains(want), "{tail}: want `{want}`:\n{t}");
        assert!(s.pids().len() >= 4, "{tail}: pids {:?}\n{t}", s.pids());
        assert_eq!(s.survivors(), Vec::<i32>::new(), "{tail}: survivors\n{t}");
        assert_eq!(
            s.temp_left(),
            Vec::<String>::new(),
            "{tail}: temp dirs\n{t}"
        );
    }
}

#[test]
fn a_process_that_escapes_group_and_tag_dies_when_the_run_ends() {
    // `setsid env -i`: a new session and no environment, so neither the
    // group kill nor the tag finds it; once its parent is gone it is
    // logprobe's child (the subreaper), killed when the search ends.
    let s = Scene::new();
    let body = r#"
f=$(mktemp "PIDS.gc.XXXXXX")
setsid env -i /bin/sh -c 'echo $$ > "$1"; exec sleep 300' sh "$f" &
while [ ! -s "$f" ]; do sleep 0.01; done
cat "$f" >> PIDS
exit 3"#;
    let cmd = format!("{} # {{in}} {{out}}", s.script("adapter.sh", body));
    let o = s.run("--exec", &cmd, &["--cases", "1", "--shrink-budget", "1s"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(!s.pids().is_empty(), "{t}");
    assert_eq!(s.survivors(), Vec::<i32>::new(), "survivors\n{t}");
    assert_eq!(s.temp_left(), Vec::<String>::new(), "temp dirs\n{t}");
}

/// Waits for `child` at most `limit`.
fn wait_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the pid file holds `n` pids.
fn wait_for_pids(s: &Scene, n: usize, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if s.pids().len() >= n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_signal_during_a_call_ends_logprobe_and_everything_it_started() {
    use std::os::unix::process::ExitStatusExt;
    for (flag, sig) in [
        ("--exec", libc::SIGINT),
        ("--exec", libc::SIGTERM),
        ("--exec", libc::SIGHUP),
        ("--exec-persistent", libc::SIGINT),
        ("--exec-persistent", libc::SIGTERM),
    ] {
        let s = Scene::new();
        // Hangs within its first call (the timeout is far away).
        let mut cmd = s.script("adapter.sh", &format!("{SPAWN_ALL}\nsleep 300"));
        if flag == "--exec" {
            cmd.push_str(" # {in} {out}");
        }
        let mut child = s
            .command(flag, &cmd, &["--cases", "5", "--timeout", "120s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn logprobe");
        assert!(
            wait_for_pids(&s, 4, Duration::from_secs(30)),
            "{flag}: the adapter did not start: {:?}",
            s.pids()
        );
        assert!(
            !s.temp_left().is_empty(),
            "{flag}: no temp dir during the call"
        );
        // SAFETY: kill(2) of our own child.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
        let status = wait_within(&mut child, Duration::from_secs(20));
        let o = child.wait_with_output().expect("output");
        let t = text(&o);
        let status = status.unwrap_or_else(|| panic!("{flag} {sig}: no exit within 20 s:\n{t}"));
        assert_eq!(status.signal(), Some(sig), "{flag} {sig}: {status:?}\n{t}");
        assert!(
            t.contains("note: interrupted by signal"),
            "{flag} {sig}:\n{t}"
        );
        assert_eq!(
            s.survivors(),
            Vec::<i32>::new(),
            "{flag} {sig}: survivors\n{t}"
        );
        assert_eq!(
            s.temp_left(),
            Vec::<String>::new(),
            "{flag} {sig}: temp dirs\n{t}"
        );
    }
}

#[test]
fn zero_cases_checked_is_not_clean() {
    let s = Scene::new();
    let o = s.run("--exec", "true {in} {out}", &["--cases", "0"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("UNCHECKED: no case was checked"), "{t}");
}

/// The `dump:` paths a report names.
fn dumps(report: &str) -> Vec<PathBuf> {
    report
        .lines()
        .filter_map(|l| l.strip_prefix("  dump:   "))
        .map(PathBuf::from)
        .collect()
}

#[test]
fn findings_are_never_overwritten_and_reruns_are_quoted() {
    let s = Scene::new();
    // An output directory a shell would split; two runs of the same kernel
    // and seed whose findings differ (the exit status).
    let out = s.path("my findings");
    let run = |code: u8| {
        s.command_to(
            "--exec",
            &format!("echo boom >&2; exit {code} # {{in}} {{out}}"),
            &["--cases", "1", "--shrink-budget", "0s"],
            &out,
        )
        .output()
        .expect("run logprobe")
    };
    let (a, b) = (run(3), run(4));
    let (ta, tb) = (text(&a), text(&b));
    let (da, db) = (dumps(&ta), dumps(&tb));
    assert_eq!((da.len(), db.len()), (1, 1), "{ta}\n{tb}");
    assert_ne!(da[0], db[0], "the second finding took the first one's name");
    assert!(da[0].exists() && db[0].exists(), "{da:?} {db:?}");
    let quoted = format!("--replay '{}'", da[0].display());
    assert!(ta.contains(&quoted), "want `{quoted}`:\n{ta}");
    // The quoted rerun line works as a shell command.
    let line = ta
        .lines()
        .find_map(|l| l.strip_prefix("  rerun:  logprobe "))
        .expect("a rerun line");
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("\"$LOGPROBE\" {line}"))
        .env("LOGPROBE", env!("CARGO_BIN_EXE_logprobe"))
        .env("TMPDIR", s.path("tmp"))
        .output()
        .expect("sh");
    assert!(text(&o).contains("still fails command"), "{}", text(&o));
    // No temporary file of the atomic writes is left.
    let left: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".safetensors"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
