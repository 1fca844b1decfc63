//! How a call reaches the kernel: the three transports of protocol v1
//! (one-shot, persistent, in-process; `docs/fuzz-protocol.md`) and the
//! [`Runner`] that makes one call at a time, counts calls and turns every
//! failure into a [`CommandFailure`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use logprobe_verify::protocol::{read_frame_with, write_frame, FrameError};

use super::super::grammar::num;
use super::process::{describe, signal_text, Adapter};
use super::signals;

/// A kernel called in this process (the Python package's `logprobe.fuzz`):
/// the request's safetensors bytes in, the answer's bytes out, exactly the
/// files the other transports exchange.
pub trait InProcessKernel: Send + Sync {
    /// What reports and dumps call it (`fuzz_exec`), e.g. `module.function`.
    fn name(&self) -> &str;

    /// One call.
    ///
    /// # Errors
    /// [`CommandFailure`]: an exception raised by the kernel (its traceback
    /// as the tail), an answer that is not a dict of tensors.
    fn call(&self, request: &[u8]) -> Result<Vec<u8>, CommandFailure>;

    /// Whether the user interrupted the run (Ctrl-C in the kernel's
    /// interpreter): the search and the shrink stop at the next case.
    fn interrupted(&self) -> bool {
        false
    }
}

/// How the kernel is reached.
#[derive(Clone)]
pub enum Transport {
    /// `--exec CMD`: one process per call, `{in}` / `{out}` files.
    OneShot(String),
    /// `--exec-persistent CMD`: one process, frames on stdin / stdout.
    Persistent(String),
    /// A function in this process (`logprobe.fuzz(fn)`): no timeout (a
    /// call cannot be preempted), no process to kill.
    InProcess(Arc<dyn InProcessKernel>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({:?})", self.kind(), self.command())
    }
}

impl Transport {
    /// The command line (in-process: the kernel's name).
    pub fn command(&self) -> &str {
        match self {
            Transport::OneShot(c) | Transport::Persistent(c) => c,
            Transport::InProcess(k) => k.name(),
        }
    }

    /// `exec`, `exec-persistent` or `in-process` (the `fuzz_kernel` of a dump).
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::OneShot(_) => "exec",
            Transport::Persistent(_) => "exec-persistent",
            Transport::InProcess(_) => "in-process",
        }
    }

    /// The flag that gives it, with the command quoted for a shell
    /// (in-process: the Python call).
    pub fn flag(&self) -> String {
        match self {
            Transport::InProcess(k) => format!("logprobe.fuzz({})", k.name()),
            _ => format!("--{} {}", self.kind(), shell_quote(self.command())),
        }
    }

    /// How to rerun the case of the dump at `path` on this kernel.
    pub fn rerun(&self, path: &Path) -> String {
        match self {
            Transport::InProcess(k) => format!(
                "logprobe.fuzz_replay({}, {:?})",
                k.name(),
                path.display().to_string()
            ),
            _ => format!(
                "logprobe fuzz --replay {} {}",
                super::super::files::shell_word(&path.to_string_lossy()),
                self.flag()
            ),
        }
    }
}

/// Why a call produced no answer: a finding of property `command`.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandFailure {
    /// What happened (exit status, timeout, malformed frame, an exception, ...).
    pub what: String,
    /// The last lines of the command's stderr (in-process: the traceback).
    pub stderr_tail: String,
    /// What the tail is: `stderr` or `traceback`.
    pub tail_of: &'static str,
}

impl CommandFailure {
    /// A failure with the command's stderr tail.
    pub fn new(what: String, stderr_tail: &str) -> CommandFailure {
        CommandFailure {
            what,
            stderr_tail: stderr_tail.to_string(),
            tail_of: "stderr",
        }
    }
}

impl std::fmt::Display for CommandFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)?;
        if self.stderr_tail.trim().is_empty() {
            write!(f, "\n{}: (empty)", self.tail_of)
        } else if self.tail_of == "stderr" {
            write!(f, "\nstderr (tail):\n{}", self.stderr_tail.trim_end())
        } else {
            write!(f, "\n{}:\n{}", self.tail_of, self.stderr_tail.trim_end())
        }
    }
}

/// Quotes `s` for `sh` (single quotes).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The last `lines` lines (at most 4 KiB) of a file.
fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A started persistent process.
struct Persistent {
    adapter: Adapter,
    to_child: Option<mpsc::Sender<Vec<u8>>>,
    from_child: mpsc::Receiver<Result<Vec<u8>, FrameError>>,
    limit: Arc<AtomicU64>,
    stderr: PathBuf,
    // Dropped after `adapter` (declaration order): killed, then removed.
    _dir: tempfile::TempDir,
}

impl Persistent {
    fn start(cmd: &str) -> Result<Persistent, CommandFailure> {
        let dir = temp_dir()?;
        let stderr = dir.path().join("stderr");
        let err = File::create(&stderr)
            .map_err(|e| failure(format!("cannot create a stderr file: {e}"), ""))?;
        let mut adapter = Adapter::spawn(
            Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(err),
        )
        .map_err(|e| failure(format!("could not start `sh -c {cmd}`: {e}"), ""))?;
        let child = adapter.child_mut();
        let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(failure(
                "the process's standard streams are not pipes".into(),
                "",
            ));
        };
        let (to_child, rx) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for bytes in rx {
                if write_frame(&mut stdin, &bytes).is_err() {
                    break;
                }
            }
            // Dropping stdin closes it: the process sees the end.
        });
        let limit = Arc::new(AtomicU64::new(0));
        let (tx, from_child) = mpsc::channel();
        let lim = Arc::clone(&limit);
        std::thread::spawn(move || loop {
            let r = read_frame_with(&mut stdout, || lim.load(Ordering::SeqCst));
            let end = r.is_err();
            if tx.send(r).is_err() || end {
                break;
            }
        });
        Ok(Persistent {
            adapter,
            to_child: Some(to_child),
            from_child,
            limit,
            stderr,
            _dir: dir,
        })
    }
}

pub(super) fn failure(what: String, stderr_tail: &str) -> CommandFailure {
    CommandFailure::new(what, stderr_tail)
}

/// A fresh `logprobe-exec-*` directory under `TMPDIR`.
fn temp_dir() -> Result<tempfile::TempDir, CommandFailure> {
    tempfile::Builder::new()
        .prefix("logprobe-exec-")
        .tempdir()
        .map_err(|e| failure(format!("cannot create a temporary directory: {e}"), ""))
}

/// Runs the command for one request at a time (see the module docs), and
/// counts calls and their wall time. Every process a call starts is killed
/// and reaped, and its temporary directory removed, before the call returns
/// (a persistent process: when it fails, at [`Runner::close`] or on drop):
/// see [`super::process`].
pub struct Runner {
    /// The transport.
    pub transport: Transport,
    /// The time limit of one call.
    pub timeout: Duration,
    process: Mutex<Option<Persistent>>,
    calls: AtomicU64,
    nanos: AtomicU64,
    /// The wall-clock limit of the current phase (search or shrink), if any.
    deadline: Mutex<Option<Instant>>,
    /// Whether a call was refused or cut short by that limit.
    out_of_time: AtomicBool,
}

/// How often a waiting call looks at the clock and for a signal.
const POLL: Duration = Duration::from_millis(5);

impl Runner {
    /// A runner; a persistent process starts on the first call.
    pub fn new(transport: Transport, timeout: Duration) -> Runner {
        Runner {
            transport,
            timeout,
            process: Mutex::new(None),
            calls: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
            deadline: Mutex::new(None),
            out_of_time: AtomicBool::new(false),
        }
    }

    /// Sets the wall-clock limit of the calls to come (`None`: only the
    /// per-call timeout), and clears [`Runner::out_of_time`]. From then on a
    /// call is not started once `deadline` has passed, and one under way is
    /// given what is left of it as its timeout: the budget holds whatever
    /// the kernel's speed (an in-process call cannot be preempted: it is
    /// only not started).
    pub fn set_deadline(&self, deadline: Option<Instant>) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = deadline;
        self.out_of_time.store(false, Ordering::SeqCst);
    }

    /// Whether a call since [`Runner::set_deadline`] was not started or was
    /// cut short (its processes killed) because the deadline came: its
    /// failure says nothing of the kernel, and the phase is over.
    pub fn out_of_time(&self) -> bool {
        self.out_of_time.load(Ordering::SeqCst)
    }

    /// When the call starting now must end, and whether that is the phase's
    /// deadline rather than the per-call timeout.
    fn call_deadline(&self) -> (Instant, bool) {
        let now = Instant::now();
        // `Duration::MAX` (in-process: no timeout) is past any instant.
        let own = now
            .checked_add(self.timeout)
            .unwrap_or_else(|| now + Duration::from_secs(1 << 30));
        match *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(d) if d < own => (d, true),
            _ => (own, false),
        }
    }

    /// The failure of a call cut short by the phase's deadline.
    fn out_of_time_failure(&self, stderr_tail: &str) -> CommandFailure {
        self.out_of_time.store(true, Ordering::SeqCst);
        failure(
            "out of time: the budget ran out during the call; killed (not a finding)".into(),
            stderr_tail,
        )
    }

    /// Whether the run was interrupted: the user interrupted an in-process
    /// run ([`InProcessKernel::interrupted`]), or the binary caught SIGINT,
    /// SIGTERM or SIGHUP ([`signals::caught`]).
    pub fn interrupted(&self) -> bool {
        signals::caught().is_some()
            || matches!(&self.transport, Transport::InProcess(k) if k.interrupted())
    }

    /// Calls made, and their total wall time in seconds.
    pub fn stats(&self) -> (u64, f64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        )
    }

    /// One call: the request's bytes in, the answer's bytes out. The answer
    /// may be at most `limit` bytes.
    ///
    /// # Errors
    /// [`CommandFailure`] (never a panic, never a hang past the timeout);
    /// `interrupted by SIGINT` (and the like) once a signal was caught.
    pub fn call(&self, request: &[u8], limit: u64) -> Result<Vec<u8>, CommandFailure> {
        if self.call_deadline().0 <= Instant::now() {
            // Not started: it could not finish within the budget.
            self.out_of_time.store(true, Ordering::SeqCst);
            return Err(failure(
                "out of time: the budget ran out; the call was not started".into(),
                "",
            ));
        }
        let t0 = Instant::now();
        let r = match &self.transport {
            _ if signals::caught().is_some() => Err(interrupted_failure()),
            Transport::OneShot(cmd) => self.one_shot(cmd, request, limit),
            Transport::Persistent(cmd) => self.persistent(cmd, request, limit),
            Transport::InProcess(k) => k.call(request).and_then(|out| {
                if out.len() as u64 > limit {
                    Err(failure(
                        format!(
                            "the answer holds {} bytes, more than any answer needs ({limit})",
                            out.len()
                        ),
                        "",
                    ))
                } else {
                    Ok(out)
                }
            }),
        };
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.nanos
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    fn one_shot(&self, cmd: &str, request: &[u8], limit: u64) -> Result<Vec<u8>, CommandFailure> {
        let dir = temp_dir()?;
        let (inp, out, errp) = (
            dir.path().join("in.safetensors"),
            dir.path().join("out.safetensors"),
            dir.path().join("stderr"),
        );
        std::fs::write(&inp, request)
            .map_err(|e| failure(format!("cannot write {}: {e}", inp.display()), ""))?;
        let line = cmd
            .replace("{in}", &shell_quote(&inp.to_string_lossy()))
            .replace("{out}", &shell_quote(&out.to_string_lossy()));
        let err = File::create(&errp)
            .map_err(|e| failure(format!("cannot create a stderr file: {e}"), ""))?;
        let err2 = err
            .try_clone()
            .map_err(|e| failure(format!("cannot create a stderr file: {e}"), ""))?;
        // Declared after `dir`, so dropped (killed) before it is removed.
        let mut adapter = Adapter::spawn(
            Command::new("sh")
                .arg("-c")
                .arg(&line)
                .stdin(Stdio::null())
                .stdout(err2)
                .stderr(err),
        )
        .map_err(|e| failure(format!("could not start `sh -c {line}`: {e}"), ""))?;
        let (deadline, by_budget) = self.call_deadline();
        loop {
            if adapter.exited_within(POLL) {
                break;
            }
            if signals::caught().is_some() {
                adapter.terminate();
                return Err(interrupted_failure());
            }
            if Instant::now() >= deadline {
                adapter.terminate();
                if by_budget {
                    return Err(self.out_of_time_failure(&tail(&errp, 12)));
                }
                return Err(failure(
                    format!(
                        "timed out: no exit within {} (--timeout); killed",
                        secs(self.timeout)
                    ),
                    &tail(&errp, 12),
                ));
            }
        }
        // The leader exited: what it left running dies with it.
        let Some(status) = adapter.terminate() else {
            return Err(failure("waiting for the command failed".into(), ""));
        };
        if !status.success() {
            return Err(failure(
                format!("the command {}", describe(status)),
                &tail(&errp, 12),
            ));
        }
        let len = std::fs::metadata(&out).map(|m| m.len()).map_err(|_| {
            failure(
                "the command exited 0 but wrote no {out} file".into(),
                &tail(&errp, 12),
            )
        })?;
        if len > limit {
            return Err(failure(
                format!("{{out}} holds {len} bytes, more than any answer needs ({limit})"),
                &tail(&errp, 12),
            ));
        }
        std::fs::read(&out).map_err(|e| failure(format!("cannot read {{out}}: {e}"), ""))
    }

    fn persistent(&self, cmd: &str, request: &[u8], limit: u64) -> Result<Vec<u8>, CommandFailure> {
        let mut slot = self.process.lock().unwrap_or_else(|e| e.into_inner());
        let p = match &mut *slot {
            Some(p) => p,
            empty => empty.insert(Persistent::start(cmd)?),
        };
        p.limit.store(limit, Ordering::SeqCst);
        let sent = p
            .to_child
            .as_ref()
            .is_some_and(|tx| tx.send(request.to_vec()).is_ok());
        let (deadline, by_budget) = self.call_deadline();
        let r = loop {
            if !sent {
                break Waited::Gone;
            }
            match p.from_child.recv_timeout(POLL) {
                Ok(r) => break Waited::Got(r),
                Err(mpsc::RecvTimeoutError::Disconnected) => break Waited::Gone,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if signals::caught().is_some() {
                break Waited::Interrupted;
            }
            if p.adapter.exited() {
                // Its frame or the end of its stdout may still be on the
                // way; a process it started may hold its stdout open.
                break match p.from_child.recv_timeout(Duration::from_millis(200)) {
                    Ok(r) => Waited::Got(r),
                    Err(_) => Waited::Exited,
                };
            }
            if Instant::now() >= deadline {
                break Waited::TimedOut;
            }
        };
        let what = match r {
            Waited::Got(Ok(frame)) => return Ok(frame),
            Waited::Got(Err(FrameError::Eof(at))) => {
                let status = if p.adapter.exited_within(Duration::from_millis(500)) {
                    p.adapter.terminate()
                } else {
                    None
                };
                format!(
                    "the process closed its standard output {at}{}",
                    status.map_or(String::new(), |s| format!("; it {}", describe(s)))
                )
            }
            Waited::Got(Err(e)) => format!("bad frame: {e}"),
            Waited::Exited => match p.adapter.terminate() {
                Some(s) => format!(
                    "the process {} without answering (a process it started held its standard output open)",
                    describe(s)
                ),
                None => "the process ended without answering".into(),
            },
            Waited::Interrupted => interrupted_failure().what,
            Waited::TimedOut if by_budget => {
                p.adapter.terminate();
                let stderr = tail(&p.stderr, 12);
                *slot = None;
                return Err(self.out_of_time_failure(&stderr));
            }
            Waited::TimedOut => format!(
                "timed out: no answer frame within {} (--timeout); killed",
                secs(self.timeout)
            ),
            Waited::Gone => "the process is gone (its standard streams closed)".into(),
        };
        p.adapter.terminate();
        let stderr = tail(&p.stderr, 12);
        // The stream is out of step: the next call starts afresh (dropping
        // it removes its directory).
        *slot = None;
        Err(failure(what, &stderr))
    }

    /// Ends a persistent process: closes its stdin and waits (5 s) for it
    /// to exit, then kills what is left of its processes and removes its
    /// directory. Returns a note when it did not exit 0. Once the run was
    /// interrupted, kills it at once.
    pub fn close(&self) -> Option<String> {
        let mut slot = self.process.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = slot.take()?;
        p.to_child = None;
        if self.interrupted() {
            p.adapter.terminate();
            return Some("the persistent process was killed (interrupted)".into());
        }
        let exited = p.adapter.exited_within(Duration::from_secs(5));
        let status = p.adapter.terminate();
        match (exited, status) {
            (true, Some(s)) if s.success() => None,
            (true, Some(s)) => Some(format!(
                "the persistent process {} after its stdin closed",
                describe(s)
            )),
            (true, None) => Some("waiting for the persistent process failed".into()),
            (false, _) => Some(
                "the persistent process did not exit within 5 s of its stdin closing; killed"
                    .into(),
            ),
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // Dropping the process kills its processes, then removes its directory.
        let mut slot = self.process.lock().unwrap_or_else(|e| e.into_inner());
        slot.take();
    }
}

/// How waiting for a persistent process's answer ended.
enum Waited {
    /// A frame, or why none could be read.
    Got(Result<Vec<u8>, FrameError>),
    /// The process exited and no frame came.
    Exited,
    /// A signal was caught.
    Interrupted,
    /// The call's time limit passed.
    TimedOut,
    /// The request could not be sent, or the reader is gone.
    Gone,
}

/// The failure of a call cut short by a caught signal.
fn interrupted_failure() -> CommandFailure {
    let what = match signals::caught() {
        Some(s) => format!("interrupted by {}", signal_text(s)),
        None => "interrupted".into(),
    };
    failure(what, "")
}

fn secs(d: Duration) -> String {
    format!("{} s", num(d.as_secs_f64()))
}

#[cfg(test)]
mod tests {
    use super::{Runner, Transport};
    use std::time::{Duration, Instant};

    /// The budget is a wall-clock limit on the calls: a call under way when
    /// the deadline comes is cut at it (not at its own, longer timeout) and
    /// is no finding; no call starts after it. Checked by what the calls
    /// did (how many processes started, what the failures say), not by a
    /// timed assertion.
    #[test]
    fn no_call_runs_past_the_deadline() {
        let dir = tempfile::tempdir().expect("temp dir");
        let starts = dir.path().join("starts");
        let log = starts.to_string_lossy();
        for transport in [
            Transport::OneShot(format!("echo start >> '{log}'; sleep 60 # {{in}} {{out}}")),
            Transport::Persistent(format!("echo start >> '{log}'; exec sleep 60")),
        ] {
            let _ = std::fs::remove_file(&starts);
            let r = Runner::new(transport, Duration::from_secs(120));
            r.set_deadline(Some(Instant::now() + Duration::from_millis(300)));
            let f = r.call(&[1; 16], 1 << 20).expect_err("cut");
            assert!(f.what.starts_with("out of time"), "{}", f.what);
            assert!(r.out_of_time());
            // After the deadline: refused, nothing started.
            let f = r.call(&[1; 16], 1 << 20).expect_err("refused");
            assert!(f.what.contains("not started"), "{}", f.what);
            let n = std::fs::read_to_string(&starts).map_or(0, |s| s.lines().count());
            assert_eq!(n, 1);
            assert_eq!(r.stats().0, 1);
            // A new phase clears the flag; its own timeout is the limit again.
            r.set_deadline(None);
            assert!(!r.out_of_time());
            assert!(r.close().is_none_or(|n| !n.is_empty()));
        }
    }

    /// The persistent process serves call after call; only a failed call
    /// (here: the process exits) makes the next one start a fresh process.
    #[test]
    fn a_persistent_process_is_restarted_only_after_a_failed_call() {
        let dir = tempfile::tempdir().expect("temp dir");
        let starts = dir.path().join("starts");
        // `cat` answers each request frame with itself.
        let cmd = format!("echo start >> '{}'; exec cat", starts.to_string_lossy());
        let r = Runner::new(Transport::Persistent(cmd), Duration::from_secs(30));
        let count = || {
            std::fs::read_to_string(&starts)
                .unwrap_or_default()
                .lines()
                .count()
        };
        for i in 0..5u8 {
            assert_eq!(r.call(&[i; 16], 1 << 20), Ok(vec![i; 16]));
        }
        assert_eq!(count(), 1);
        // An answer over the limit is a failed call (a bad frame): restart.
        assert!(r.call(&[7; 64], 8).is_err());
        assert_eq!(r.call(&[9; 16], 1 << 20), Ok(vec![9; 16]));
        assert_eq!(count(), 2);
        assert_eq!(r.close(), None);
        assert_eq!(r.stats().0, 7);
    }
}
