//! How a call reaches the kernel: the three transports of protocol v1
//! (one-shot, persistent, in-process; `docs/fuzz-protocol.md`) and the
//! [`Runner`] that makes one call at a time, counts calls and turns every
//! failure into a [`CommandFailure`].

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use logprobe_verify::protocol::{read_frame_with, write_frame, FrameError};

use super::super::grammar::num;

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
            _ => format!("logprobe fuzz --replay {} {}", path.display(), self.flag()),
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

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        _ => format!("ended: {status}"),
    }
}

/// Kills the process group `pid` leads (the shell and what it started).
fn kill_group(pid: u32) {
    // SAFETY: kill(2) has no memory effects; a negative pid names the group
    // the child leads (spawned with `process_group(0)`).
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
}

/// A started persistent process.
struct Persistent {
    pid: u32,
    child: Arc<Mutex<Child>>,
    to_child: Option<mpsc::Sender<Vec<u8>>>,
    from_child: mpsc::Receiver<Result<Vec<u8>, FrameError>>,
    limit: Arc<AtomicU64>,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Persistent {
    fn start(cmd: &str) -> Result<Persistent, CommandFailure> {
        let dir = temp_dir()?;
        let stderr = dir.path().join("stderr");
        let err = File::create(&stderr)
            .map_err(|e| failure(format!("cannot create a stderr file: {e}"), ""))?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| failure(format!("could not start `sh -c {cmd}`: {e}"), ""))?;
        let pid = child.id();
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
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
            pid,
            child: Arc::new(Mutex::new(child)),
            to_child: Some(to_child),
            from_child,
            limit,
            stderr,
            _dir: dir,
        })
    }

    /// The exit status, waiting at most `wait` for it.
    fn status_within(&self, wait: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + wait;
        loop {
            if let Ok(Some(s)) = self.child.lock().expect("not poisoned").try_wait() {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the process group while its leader is unreaped (so the group
    /// id cannot have been reused), then reaps it.
    fn kill(&self) {
        let mut child = self.child.lock().expect("not poisoned");
        if matches!(child.try_wait(), Ok(None)) {
            kill_group(self.pid);
        }
        let _ = child.wait();
    }
}

pub(super) fn failure(what: String, stderr_tail: &str) -> CommandFailure {
    CommandFailure::new(what, stderr_tail)
}

fn temp_dir() -> Result<tempfile::TempDir, CommandFailure> {
    tempfile::Builder::new()
        .prefix("logprobe-exec-")
        .tempdir()
        .map_err(|e| failure(format!("cannot create a temporary directory: {e}"), ""))
}

/// Runs the command for one request at a time (see the module docs), and
/// counts calls and their wall time.
pub struct Runner {
    /// The transport.
    pub transport: Transport,
    /// The time limit of one call.
    pub timeout: Duration,
    process: Mutex<Option<Persistent>>,
    calls: AtomicU64,
    nanos: AtomicU64,
}

impl Runner {
    /// A runner; a persistent process starts on the first call.
    pub fn new(transport: Transport, timeout: Duration) -> Runner {
        Runner {
            transport,
            timeout,
            process: Mutex::new(None),
            calls: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }

    /// Whether the user interrupted an in-process run (see
    /// [`InProcessKernel::interrupted`]).
    pub fn interrupted(&self) -> bool {
        matches!(&self.transport, Transport::InProcess(k) if k.interrupted())
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
    /// [`CommandFailure`] (never a panic, never a hang past the timeout).
    pub fn call(&self, request: &[u8], limit: u64) -> Result<Vec<u8>, CommandFailure> {
        let t0 = Instant::now();
        let r = match &self.transport {
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
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&line)
            .stdin(Stdio::null())
            .stdout(err2)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| failure(format!("could not start `sh -c {line}`: {e}"), ""))?;
        // Poll (no waiting thread): the group is killed only while its
        // leader is unreaped, so its id cannot have been reused.
        let deadline = Instant::now() + self.timeout;
        let mut nap = Duration::from_micros(100);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() >= deadline => {
                    kill_group(child.id());
                    let _ = child.wait();
                    return Err(failure(
                        format!(
                            "timed out: no exit within {} (--timeout); killed",
                            secs(self.timeout)
                        ),
                        &tail(&errp, 12),
                    ));
                }
                Ok(None) => {
                    std::thread::sleep(nap);
                    nap = (nap * 3 / 2).min(Duration::from_millis(5));
                }
                Err(e) => return Err(failure(format!("waiting for the command: {e}"), "")),
            }
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
        let mut slot = self.process.lock().expect("not poisoned");
        if slot.is_none() {
            *slot = Some(Persistent::start(cmd)?);
        }
        let p = slot.as_ref().expect("just set");
        p.limit.store(limit, Ordering::SeqCst);
        let sent = p
            .to_child
            .as_ref()
            .is_some_and(|tx| tx.send(request.to_vec()).is_ok());
        let r = if sent {
            p.from_child.recv_timeout(self.timeout)
        } else {
            Err(mpsc::RecvTimeoutError::Disconnected)
        };
        match r {
            Ok(Ok(frame)) => Ok(frame),
            other => {
                let what = match other {
                    Ok(Err(FrameError::Eof(at))) => {
                        let status = p.status_within(Duration::from_millis(500));
                        format!(
                            "the process closed its standard output {at}{}",
                            status.map_or(String::new(), |s| format!("; it {}", describe(s)))
                        )
                    }
                    Ok(Err(e)) => format!("bad frame: {e}"),
                    Err(mpsc::RecvTimeoutError::Timeout) => format!(
                        "timed out: no answer frame within {} (--timeout); killed",
                        secs(self.timeout)
                    ),
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        "the process is gone (its standard streams closed)".into()
                    }
                    Ok(Ok(_)) => unreachable!("matched above"),
                };
                p.kill();
                let stderr = tail(&p.stderr, 12);
                // The stream is out of step: the next call starts afresh.
                *slot = None;
                Err(failure(what, &stderr))
            }
        }
    }

    /// Ends a persistent process: closes its stdin and waits (5 s) for it
    /// to exit. Returns a note when it did not exit 0.
    pub fn close(&self) -> Option<String> {
        let mut slot = self.process.lock().expect("not poisoned");
        let mut p = slot.take()?;
        p.to_child = None;
        let note = match p.status_within(Duration::from_secs(5)) {
            Some(s) if s.success() => None,
            Some(s) => Some(format!(
                "the persistent process {} after its stdin closed",
                describe(s)
            )),
            None => Some(
                "the persistent process did not exit within 5 s of its stdin closing; killed"
                    .into(),
            ),
        };
        p.kill();
        note
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Ok(mut slot) = self.process.lock() {
            if let Some(p) = slot.take() {
                p.kill();
            }
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", num(d.as_secs_f64()))
}
