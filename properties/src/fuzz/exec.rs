//! `logprobe fuzz --exec CMD` / `--exec-persistent CMD`: the fuzz target
//! that is an external process speaking the fuzz protocol, version 1
//! (`docs/fuzz-protocol.md`, types in [`logprobe_verify::protocol`]).
//!
//! Each case becomes a [`Request`] (inputs only; cases the spec calls bad
//! input are not sent: protocol v1 has no error channel). The command's
//! answer is checked ([`Response::parse`]), joined to the request and judged
//! by the verify engine ([`verify_dump`], the foreign-kernel model), so the
//! saved counterexample is the very dump `logprobe verify` reproduces. Then
//! the metamorphic properties, each by calling the command again:
//!
//! - padding invariance: other values past `vocab_size` (`-inf`, the
//!   dtype's largest finite) leave every output bit-identical;
//! - chunk-size invariance: other `chunk_size`s give bit-identical outputs;
//! - batch invariance: a row alone, the batch doubled and a suffix of the
//!   batch give each row bit-identical outputs.
//!
//! An invariance is a property the kernel has or lacks; a lack is a finding
//! only when `--require`d (padding invariance is required by default: the
//! spec says padding changes nothing). A crash, a hang past the timeout, a
//! non-zero exit, a missing or malformed answer are findings of property
//! `command`, with the tail of the command's stderr. Shrinking calls the
//! command again and keeps a step only when the same property fails.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use logprobe_reference::spec::Dtype;
use logprobe_testkit::strategies::chunk_sizes;
use logprobe_verify::dump::Dump;
use logprobe_verify::protocol::{
    read_frame_with, write_frame, FrameError, Output, Request, RequestMeta, Response,
};
use logprobe_verify::verify::{verify_dump, FileReport, ReportVerdict as Verdict, VerifyConfig};

use super::case::{FuzzCase, Space};
use super::grammar::num;
use super::judge::{Call, Finding};
use super::{case_tree, progress, Found, TargetReport};

/// How the command is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `--exec CMD`: one process per call, `{in}` / `{out}` files.
    OneShot(String),
    /// `--exec-persistent CMD`: one process, frames on stdin / stdout.
    Persistent(String),
}

impl Transport {
    /// The command line.
    pub fn command(&self) -> &str {
        match self {
            Transport::OneShot(c) | Transport::Persistent(c) => c,
        }
    }

    /// `exec` or `exec-persistent` (the `fuzz_kernel` of a dump).
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::OneShot(_) => "exec",
            Transport::Persistent(_) => "exec-persistent",
        }
    }

    /// The flag that gives it, with the command quoted for a shell.
    pub fn flag(&self) -> String {
        format!("--{} {}", self.kind(), shell_quote(self.command()))
    }
}

/// A metamorphic property of an external kernel (`--require` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariance {
    /// Values past `vocab_size` change nothing.
    Padding,
    /// `chunk_size` changes no bit.
    Chunk,
    /// A row's outputs do not depend on the rest of its batch.
    Batch,
}

impl Invariance {
    /// Every invariance, in checking order.
    pub const ALL: [Invariance; 3] = [Invariance::Padding, Invariance::Chunk, Invariance::Batch];

    /// The `--require` name.
    pub fn name(self) -> &'static str {
        match self {
            Invariance::Padding => "padding-invariant",
            Invariance::Chunk => "chunk-invariant",
            Invariance::Batch => "batch-invariant",
        }
    }

    /// The property name of a finding.
    pub fn property(self) -> &'static str {
        match self {
            Invariance::Padding => "padding invariance",
            Invariance::Chunk => "chunk-size invariance",
            Invariance::Batch => "batch invariance",
        }
    }

    /// Parses a `--require` list (comma-separated names; `none` for nothing).
    ///
    /// # Errors
    /// An unknown name, with the valid ones.
    pub fn parse_list(list: &str) -> Result<Vec<Invariance>, String> {
        let mut v = Vec::new();
        for w in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if w == "none" {
                continue;
            }
            let i = Invariance::ALL
                .into_iter()
                .find(|i| i.name() == w)
                .ok_or_else(|| {
                    format!("--require: unknown property `{w}` (padding-invariant, chunk-invariant, batch-invariant, none)")
                })?;
            if !v.contains(&i) {
                v.push(i);
            }
        }
        v.sort();
        Ok(v)
    }
}

/// The default `--require`: padding invariance (the spec's: padding is not
/// vocabulary, whatever its values).
pub const DEFAULT_REQUIRE: &str = "padding-invariant";

/// Why a call produced no answer: a finding of property `command`.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandFailure {
    /// What happened (exit status, timeout, malformed frame, ...).
    pub what: String,
    /// The last lines of the command's stderr.
    pub stderr_tail: String,
}

impl std::fmt::Display for CommandFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)?;
        if self.stderr_tail.trim().is_empty() {
            f.write_str("\nstderr: (empty)")
        } else {
            write!(f, "\nstderr (tail):\n{}", self.stderr_tail.trim_end())
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

fn failure(what: String, stderr_tail: &str) -> CommandFailure {
    CommandFailure {
        what,
        stderr_tail: stderr_tail.to_string(),
    }
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

/// The request of a case: its inputs, the outputs it supports (log-probs
/// with tokens, entropy when asked, top-k with ids, `grad_logits` with
/// cotangents), its options and `chunk_size`.
pub fn request(case: &FuzzCase) -> Request {
    let e = case.expand();
    let d = &e.data;
    let (n, vt) = d.logits.view().dim();
    let mut outputs = Vec::new();
    if d.tokens.is_some() {
        outputs.push(Output::LogProbs);
    }
    if d.options.entropy.is_some() {
        outputs.push(Output::Entropy);
    }
    if d.topk_ids.is_some() {
        outputs.push(Output::TopkLogProbs);
    }
    let c = &e.cot;
    if !c.is_empty() {
        outputs.push(Output::GradLogits);
    }
    Request {
        dtype: d.logits.dtype(),
        n,
        v_total: vt,
        logits: d.logits.to_f64().into_raw_vec_and_offset().0,
        tokens: d.tokens.as_ref().map(|t| t.to_vec()),
        sampling_mask: d
            .sampling_mask
            .as_ref()
            .map(|m| m.iter().copied().collect()),
        topk_ids: d
            .topk_ids
            .as_ref()
            .map(|ids| (ids.dim().1, ids.iter().copied().collect())),
        grad_log_probs: c.grad_log_probs.as_ref().map(|g| g.to_vec()),
        grad_entropy: c.grad_entropy.as_ref().map(|g| g.to_vec()),
        grad_topk_log_probs: c
            .grad_topk_log_probs
            .as_ref()
            .map(|g| g.iter().copied().collect()),
        meta: RequestMeta {
            outputs,
            temperature: num(d.options.temperature),
            temperature_dtype: d.options.temperature_dtype,
            vocab_size: d.options.vocab_size.unwrap_or(vt),
            ignore_index: d.options.ignore_index,
            entropy_logits: d.options.entropy.unwrap_or_default(),
            chunk_size: case.chunk,
        },
    }
}

/// Whether the spec calls the request bad input (`logprobe verify`'s own
/// checks: shapes, options, every row): such cases are not sent.
fn bad_input(bytes: &[u8]) -> Option<String> {
    let d = match Dump::parse_inputs(bytes) {
        Ok(d) => d,
        Err(e) => return Some(e.to_string()),
    };
    if d.n() == 0 {
        return d
            .options
            .effective_temperature(d.logits.dtype.accumulation())
            .err()
            .map(|e| e.to_string());
    }
    if let Err(e) = d
        .row(0)
        .and_then(|r| r.problem().validate_shapes().map_err(Into::into))
    {
        return Some(e.to_string());
    }
    (0..d.n())
        .find_map(|r| d.row(r).and_then(|i| i.validate()).err())
        .map(|e| e.to_string())
}

/// The most bytes an answer to `r` can need (every output in f64, plus a
/// header), with room to spare.
fn answer_limit(r: &Request) -> u64 {
    let elems = r.n as u64 * (2 + r.k() as u64 + r.v_total as u64);
    elems * 8 * 2 + (1 << 20)
}

/// Named dump bytes: `("", base)` and `("variant", ..)` (file suffixes).
pub type Dumps = Vec<(&'static str, Vec<u8>)>;

/// A finding on an external kernel, with the dumps that show it.
#[derive(Clone, Debug)]
pub struct ExecFinding {
    /// The finding (property `command`, `oracle agreement`, `gradient`,
    /// `statistical`, or an invariance's).
    pub finding: Finding,
    /// The dumps: `("", base)` and, for an invariance, `("variant", ..)`.
    pub dumps: Dumps,
}

/// A lacked invariance (not required): the case, what differed, dumps.
#[derive(Clone, Debug)]
pub struct Lack {
    /// The invariance.
    pub invariance: Invariance,
    /// The case.
    pub case: FuzzCase,
    /// Case index.
    pub case_index: u64,
    /// What differed.
    pub detail: String,
    /// The dumps.
    pub dumps: Dumps,
    /// Where they were written (or why not).
    pub written: Result<Vec<PathBuf>, String>,
}

/// How a case went on the external kernel.
#[derive(Clone, Debug, Default)]
pub struct Judged {
    /// Worst `error / bound` over the checked outputs (0 when none).
    pub worst: f64,
    /// Why nothing was checked against the oracle (bad input not sent, no
    /// output asked, `no bound`), if so.
    pub unchecked: Option<String>,
    /// Whether verify's statistical tier said SUSPECT (within the sound
    /// bound: not a finding).
    pub suspect: bool,
    /// Invariances checked and held.
    pub held: Vec<Invariance>,
    /// Invariances lacked (not required), with what differed and dumps.
    pub lacked: Vec<(Invariance, String, Dumps)>,
}

/// The external kernel under test.
pub struct ExecTarget {
    /// The command.
    pub runner: Runner,
    /// Invariances whose lack is a finding.
    pub require: Vec<Invariance>,
    /// The run's seed (dump provenance).
    pub seed: u64,
}

/// Whether an invariance held: `Err` with what differed and the dumps.
type Held = Result<(), (String, Dumps)>;

/// A variant of a request: what changed, the request, and the pairs
/// `(variant row, base row)` to compare.
type Variant = (String, Request, Vec<(usize, usize)>);

/// One answered call.
struct Answer {
    request: Request,
    response: Response,
}

impl ExecTarget {
    fn extra(&self, case: &FuzzCase, property: &str) -> Vec<(&'static str, String)> {
        vec![
            ("fuzz_recipe", case.recipe()),
            ("fuzz_kernel", self.runner.transport.kind().to_string()),
            ("fuzz_property", property.to_string()),
            ("fuzz_seed", self.seed.to_string()),
            ("fuzz_exec", self.runner.transport.command().to_string()),
        ]
    }

    fn ask(&self, request: Request) -> Result<Answer, CommandFailure> {
        let bytes = request
            .to_bytes()
            .map_err(|e| failure(format!("logprobe could not write the request: {e}"), ""))?;
        let out = self.runner.call(&bytes, answer_limit(&request))?;
        let response = Response::parse(&request, &out).map_err(|e| CommandFailure {
            what: e.to_string(),
            stderr_tail: String::new(),
        })?;
        Ok(Answer { request, response })
    }

    /// Judges `case` (see the module docs).
    ///
    /// # Errors
    /// The first [`ExecFinding`].
    pub fn judge(&self, case: &FuzzCase) -> Result<Judged, ExecFinding> {
        let request = request(case);
        let mut j = Judged::default();
        if request.meta.outputs.is_empty() {
            j.unchecked =
                Some("the case asks for no output (no tokens, entropy, top-k ids)".into());
            return Ok(j);
        }
        let bytes = request
            .to_bytes()
            .map_err(|e| self.command(case, &request, e.to_string()))?;
        if let Some(why) = bad_input(&bytes) {
            j.unchecked = Some(format!(
                "bad input, not sent (protocol v1 sends valid inputs only): {why}"
            ));
            return Ok(j);
        }
        let base = self
            .ask(request.clone())
            .map_err(|f| self.command(case, &request, f.to_string()))?;
        let property_of = |r: &FileReport| {
            let fails: Vec<&str> = r
                .outputs
                .iter()
                .filter(|o| o.verdict == Verdict::Fail)
                .map(|o| o.output)
                .collect();
            if fails.iter().all(|o| *o == "grad_logits") {
                "gradient"
            } else {
                "oracle agreement"
            }
        };
        let joined = base
            .request
            .with_response(&base.response, &[])
            .map_err(|e| self.command(case, &request, e.to_string()))?;
        let report = Dump::parse(&joined)
            .and_then(|d| verify_dump(&d, Path::new("exec"), &VerifyConfig::default()))
            .map_err(|e| {
                self.command(case, &request, format!("the answer does not verify: {e}"))
            })?;
        match report.verdict {
            Verdict::Fail => {
                let property = property_of(&report);
                return Err(ExecFinding {
                    finding: Finding {
                        property,
                        call: Call::Exec,
                        detail: fail_detail(&report),
                    },
                    dumps: vec![("", self.joined(case, &base, property))],
                });
            }
            Verdict::NoBound => {
                j.unchecked = Some("the foreign-kernel model gives no bound (n u >= 1)".into())
            }
            Verdict::Unchecked => {
                j.unchecked = Some(
                    report
                        .outputs
                        .iter()
                        .filter_map(|o| {
                            o.nothing_checked
                                .as_ref()
                                .map(|why| format!("{}: {why}", o.output))
                        })
                        .chain(
                            report
                                .topk_ids
                                .as_ref()
                                .and_then(|t| t.nothing_checked.as_ref())
                                .map(|why| format!("topk_ids: {why}")),
                        )
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            }
            Verdict::Suspect => j.suspect = true,
            Verdict::Pass => {}
        }
        j.worst = report
            .outputs
            .iter()
            .filter_map(|o| o.max_ratio)
            .fold(0.0, f64::max);
        for inv in Invariance::ALL {
            match self.invariance(case, inv, &base)? {
                None => {}
                Some(Ok(())) => j.held.push(inv),
                Some(Err((detail, dumps))) => {
                    if self.require.contains(&inv) {
                        return Err(ExecFinding {
                            finding: Finding {
                                property: inv.property(),
                                call: Call::Invariance,
                                detail,
                            },
                            dumps,
                        });
                    }
                    j.lacked.push((inv, detail, dumps));
                }
            }
        }
        Ok(j)
    }

    fn command(&self, _case: &FuzzCase, _request: &Request, detail: String) -> ExecFinding {
        ExecFinding {
            finding: Finding {
                property: "command",
                call: Call::Exec,
                detail,
            },
            dumps: Vec::new(),
        }
    }

    fn joined(&self, case: &FuzzCase, a: &Answer, property: &str) -> Vec<u8> {
        a.request
            .with_response(&a.response, &self.extra(case, property))
            .unwrap_or_default()
    }

    /// Checks one invariance against the base answer: `None` when it does
    /// not apply to the case, `Some(Err)` with what differed.
    fn invariance(
        &self,
        case: &FuzzCase,
        inv: Invariance,
        base: &Answer,
    ) -> Result<Option<Held>, ExecFinding> {
        let r = &base.request;
        let n = r.n;
        // (variant request, rows of the variant compared with rows of the base)
        let mut variants: Vec<Variant> = Vec::new();
        let same: Vec<(usize, usize)> = (0..n).map(|i| (i, i)).collect();
        match inv {
            Invariance::Padding => {
                if r.meta.vocab_size >= r.v_total || n == 0 {
                    return Ok(None);
                }
                let big = match r.dtype {
                    Dtype::F16 => 65504.0,
                    Dtype::Bf16 => 3.3895313892515355e38,
                    Dtype::F32 => f32::MAX as f64,
                    Dtype::F64 => f64::MAX,
                };
                for fill in [f64::NEG_INFINITY, big] {
                    variants.push((
                        format!(
                            "padding (columns {}..{}) set to {}",
                            r.meta.vocab_size,
                            r.v_total,
                            num(fill)
                        ),
                        r.with_padding(fill),
                        same.clone(),
                    ));
                }
            }
            Invariance::Chunk => {
                if n < 2 {
                    return Ok(None);
                }
                let mut sizes = chunk_sizes(n, case.recipe.seed);
                sizes.retain(|&c| c != case.chunk);
                // The smallest other size and the largest (whole batch).
                let picks: Vec<usize> = match (sizes.first(), sizes.last()) {
                    (Some(&a), Some(&b)) if a != b => vec![a, b],
                    (Some(&a), _) => vec![a],
                    _ => vec![],
                };
                for c in picks {
                    let mut v = r.clone();
                    v.meta.chunk_size = c;
                    variants.push((
                        format!("chunk_size {c} instead of {}", case.chunk),
                        v,
                        same.clone(),
                    ));
                }
            }
            Invariance::Batch => {
                if n == 0 {
                    return Ok(None);
                }
                let row = (case.recipe.seed as usize) % n;
                variants.push((
                    format!("row {row} alone (N = 1)"),
                    r.select_rows(&[row]),
                    vec![(0, row)],
                ));
                let twice: Vec<usize> = (0..n).chain(0..n).collect();
                variants.push((
                    format!("the batch twice (N = {})", 2 * n),
                    r.select_rows(&twice),
                    (0..2 * n).map(|i| (i, i % n)).collect(),
                ));
                if n >= 2 {
                    let cut = 1 + (case.recipe.seed as usize) % (n - 1);
                    let rows: Vec<usize> = (cut..n).collect();
                    variants.push((
                        format!("rows {cut}..{n} alone (N = {})", n - cut),
                        r.select_rows(&rows),
                        (0..n - cut).map(|i| (i, cut + i)).collect(),
                    ));
                }
            }
        }
        for (what, v, pairs) in variants {
            let a = self.ask(v).map_err(|f| {
                self.command(
                    case,
                    r,
                    format!("on the {} variant ({what}): {f}", inv.property()),
                )
            })?;
            if let Some(diff) = first_difference(base, &a, &pairs) {
                let property = inv.property();
                let dumps = vec![
                    ("", self.joined(case, base, property)),
                    ("variant", self.joined(case, &a, property)),
                ];
                return Ok(Some(Err((format!("{what}: {diff}"), dumps))));
            }
        }
        Ok(Some(Ok(())))
    }
}

/// The first output element that differs in bits between `a`'s row `ra`
/// and `b`'s row `rb` for each pair `(rb, ra)` (log-probs of rows whose
/// token is `ignore_index` are not compared: any value is allowed there).
fn first_difference(a: &Answer, b: &Answer, pairs: &[(usize, usize)]) -> Option<String> {
    let tokens = a.request.tokens.as_ref();
    let ii = a.request.meta.ignore_index;
    for &o in &a.request.meta.outputs {
        let (ta, tb) = (a.response.get(o)?, b.response.get(o)?);
        if ta.dtype != tb.dtype {
            return Some(format!(
                "{} comes back as {:?} instead of {:?}",
                o.name(),
                tb.dtype,
                ta.dtype
            ));
        }
        for &(rb, ra) in pairs {
            if o == Output::LogProbs && tokens.is_some_and(|t| t[ra] == ii) {
                continue;
            }
            let (xa, xb) = (a.response.row_bytes(o, ra)?, b.response.row_bytes(o, rb)?);
            if xa != xb {
                let es = (ta.dtype.bitsize() / 8).max(1);
                let col = (0..xa.len() / es)
                    .find(|&c| xa[c * es..(c + 1) * es] != xb[c * es..(c + 1) * es])
                    .unwrap_or(0);
                let val = |x: &[u8]| value(ta.dtype, &x[col * es..(col + 1) * es]);
                let at = if o == Output::LogProbs || o == Output::Entropy {
                    format!("row {ra}")
                } else {
                    format!("row {ra}, column {col}")
                };
                return Some(format!(
                    "{} at {at}: {} vs {} (not bit-identical)",
                    o.name(),
                    val(xa),
                    val(xb)
                ));
            }
        }
    }
    None
}

fn value(dtype: safetensors::Dtype, b: &[u8]) -> String {
    use safetensors::Dtype as D;
    let v = match (dtype, b.len()) {
        (D::F64, 8) => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        (D::F32, 4) => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
        (D::BF16, 2) => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        (D::F16, 2) => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => f64::NAN,
    };
    format!("{v:e}")
}

/// The worst element of each failing output, one line each.
fn fail_detail(r: &FileReport) -> String {
    let mut lines = Vec::new();
    for o in r.outputs.iter().filter(|o| o.verdict == Verdict::Fail) {
        match o.worst.first() {
            Some(w) => lines.push(format!(
                "{} ({}) row {}{}: got {:e}, exact {:e}, error {:.3e}{}",
                o.output,
                o.dtype,
                w.row,
                w.col.map_or(String::new(), |c| format!(", column {c}")),
                w.candidate,
                w.exact,
                w.error,
                w.bound.map_or(String::new(), |b| format!(
                    " > bound {b:.3e} ({:.3}x)",
                    w.error / b
                )),
            )),
            None => lines.push(format!("{}: FAIL", o.output)),
        }
    }
    lines.join("\n")
}

/// Settings of an `--exec` run.
pub struct ExecRun {
    /// The external kernel.
    pub target: ExecTarget,
    /// The search space (bad inputs excluded).
    pub space: Space,
    /// Time limit of the search (shrinking excluded).
    pub budget: Duration,
    /// Case limit.
    pub cases: Option<u64>,
    /// Time limit of each shrink.
    pub shrink_budget: Duration,
    /// Where dumps go.
    pub out_dir: PathBuf,
    /// Show progress.
    pub progress: bool,
}

/// The outcome of an `--exec` run.
#[derive(Debug)]
pub struct ExecReport {
    /// The seed.
    pub seed: u64,
    /// Cases drawn.
    pub cases: u64,
    /// Cases checked against the oracle.
    pub checked: u64,
    /// Cases not checked, by reason class: (bad input not sent, no output
    /// asked or no bound).
    pub unchecked: (u64, u64),
    /// Cases SUSPECT under the statistical tier.
    pub suspect: u64,
    /// Seconds of search.
    pub seconds: f64,
    /// Worst `error / bound` over the passing cases.
    pub worst: f64,
    /// Calls to the command during the search (shrinking excluded) and their seconds.
    pub calls: (u64, f64),
    /// Calls made while shrinking.
    pub shrink_calls: u64,
    /// Per invariance: cases where it was checked and held.
    pub held: Vec<(Invariance, u64)>,
    /// Invariances lacked (first case of each).
    pub lacks: Vec<Lack>,
    /// The finding, shrunk.
    pub found: Option<Found>,
    /// Paths of the finding's extra dumps (an invariance's variant).
    pub found_dumps: Vec<PathBuf>,
    /// A note on the persistent process's exit, if not clean.
    pub close_note: Option<String>,
}

impl ExecReport {
    /// 0 clean, 1 a finding.
    pub fn exit_status(&self) -> u8 {
        u8::from(self.found.is_some())
    }
}

/// Shrinks the failing `tree` through the command: a step is kept when
/// the same property still fails.
fn shrink(
    target: &ExecTarget,
    tree: &mut dyn proptest::strategy::ValueTree<Value = FuzzCase>,
    first: ExecFinding,
    budget: Duration,
) -> (FuzzCase, ExecFinding, usize) {
    let property = first.finding.property;
    let fails = |c: &FuzzCase| match target.judge(c) {
        Err(f) if f.finding.property == property => Some(f),
        _ => None,
    };
    let mut best = (tree.current(), first, 0usize);
    if !tree.simplify() {
        return best;
    }
    let deadline = Instant::now() + budget;
    while Instant::now() < deadline {
        let c = tree.current();
        match fails(&c) {
            Some(f) => {
                debug_assert_eq!(f.finding.property, property);
                best = (c, f, best.2 + 1);
                if !tree.simplify() {
                    break;
                }
            }
            None => {
                if !tree.complicate() {
                    break;
                }
            }
        }
    }
    best
}

/// Writes a finding's dumps as `fuzz-<kind>-seed<S>[-<suffix>].safetensors`
/// (a command finding: the inputs only) and returns the paths with what
/// `logprobe verify` says of the first.
fn write_dumps(
    dir: &Path,
    stem: &str,
    target: &ExecTarget,
    case: &FuzzCase,
    f: &ExecFinding,
) -> Result<(Vec<PathBuf>, String), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut dumps = f.dumps.clone();
    let inputs_only = dumps.is_empty();
    if inputs_only {
        let r = request(case);
        let meta = r.metadata(&target.extra(case, f.finding.property));
        let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let bytes = logprobe_verify::dump::serialize_dump(&r.tensors(), &meta)
            .map_err(|e| e.to_string())?;
        dumps.push(("", bytes));
    }
    let mut paths = Vec::new();
    for (suffix, bytes) in &dumps {
        let name = if suffix.is_empty() {
            format!("{stem}.safetensors")
        } else {
            format!("{stem}-{suffix}.safetensors")
        };
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        paths.push(path);
    }
    let verdict = if inputs_only {
        "inputs only (the command gave no valid answer on them)".to_string()
    } else {
        match Dump::parse(&dumps[0].1) {
            Ok(d) => match verify_dump(&d, &paths[0], &VerifyConfig::default()) {
                Ok(r) => r.verdict.to_string(),
                Err(e) => format!("bad input: {e}"),
            },
            Err(e) => format!("bad input: {e}"),
        }
    };
    Ok((paths, verdict))
}

/// Runs the search on the external kernel (see the module docs).
pub fn run(config: &ExecRun) -> ExecReport {
    let start = Instant::now();
    let t = &config.target;
    let strategy = config.space.strategy();
    let seed = t.seed;
    let mut rep = ExecReport {
        seed,
        cases: 0,
        checked: 0,
        unchecked: (0, 0),
        suspect: 0,
        seconds: 0.0,
        worst: 0.0,
        calls: (0, 0.0),
        shrink_calls: 0,
        held: Invariance::ALL.iter().map(|&i| (i, 0)).collect(),
        lacks: Vec::new(),
        found: None,
        found_dumps: Vec::new(),
        close_note: None,
    };
    let name = format!(
        "{} {}",
        t.runner.transport.kind(),
        t.runner.transport.command()
    );
    let mut shown = [TargetReport {
        name: name.clone(),
        cases: 0,
        worst: 0.0,
        found: None,
    }];
    let mut progress = progress::Progress::new(config.progress, config.cases);
    let stem = format!("fuzz-{}-seed{seed}", t.runner.transport.kind());
    let mut index = 0u64;
    let mut shrink_secs_calls = 0.0;
    while start.elapsed() < config.budget
        && config.cases.is_none_or(|n| index < n)
        && rep.found.is_none()
    {
        let case = case_tree(&strategy, seed, index).current();
        match t.judge(&case) {
            Ok(j) => {
                match &j.unchecked {
                    Some(why) if why.starts_with("bad input") => rep.unchecked.0 += 1,
                    Some(_) => rep.unchecked.1 += 1,
                    None => rep.checked += 1,
                }
                rep.suspect += u64::from(j.suspect);
                rep.worst = rep.worst.max(j.worst);
                for h in &j.held {
                    if let Some(e) = rep.held.iter_mut().find(|(i, _)| i == h) {
                        e.1 += 1;
                    }
                }
                for (inv, detail, dumps) in j.lacked {
                    if rep.lacks.iter().any(|l| l.invariance == inv) {
                        continue;
                    }
                    let f = ExecFinding {
                        finding: Finding {
                            property: inv.property(),
                            call: Call::Invariance,
                            detail: detail.clone(),
                        },
                        dumps: dumps.clone(),
                    };
                    let written = write_dumps(
                        &config.out_dir,
                        &format!("{stem}-lacks-{}", inv.name()),
                        t,
                        &case,
                        &f,
                    )
                    .map(|(p, _)| p);
                    progress.println(&format!(
                        "{name}: lacks {} (case {index}): {detail}",
                        inv.name()
                    ));
                    rep.lacks.push(Lack {
                        invariance: inv,
                        case: case.clone(),
                        case_index: index,
                        detail,
                        dumps,
                        written,
                    });
                }
            }
            Err(f) => {
                let time_to_find = start.elapsed().as_secs_f64();
                progress.println(&format!(
                    "{name}: {} failed on case {index} after {time_to_find:.1} s; shrinking through the command (at most {} s)",
                    f.finding.property,
                    config.shrink_budget.as_secs()
                ));
                let s0 = Instant::now();
                let before = t.runner.stats();
                let mut tree = case_tree(&strategy, seed, index);
                let (case, f, steps) = shrink(t, tree.as_mut(), f, config.shrink_budget);
                let after = t.runner.stats();
                rep.shrink_calls = after.0 - before.0;
                shrink_secs_calls = after.1 - before.1;
                let shrink_secs = s0.elapsed().as_secs_f64();
                let written = write_dumps(&config.out_dir, &stem, t, &case, &f);
                let dump = written
                    .as_ref()
                    .map(|(p, v)| (p[0].clone(), v.clone()))
                    .map_err(Clone::clone);
                rep.found_dumps = written.map(|(p, _)| p).unwrap_or_default();
                rep.found = Some(Found {
                    finding: f.finding,
                    case,
                    case_index: index,
                    time_to_find,
                    shrink_steps: steps,
                    shrink_secs,
                    dump,
                    twin_passes: None,
                });
            }
        }
        index += 1;
        shown[0].cases = index;
        shown[0].worst = rep.worst;
        shown[0].found = rep.found.clone();
        progress.update(index, &shown, start.elapsed());
    }
    progress.finish();
    rep.close_note = t.runner.close();
    rep.cases = index;
    rep.seconds = start.elapsed().as_secs_f64();
    let (calls, secs) = t.runner.stats();
    rep.calls = (calls - rep.shrink_calls, secs - shrink_secs_calls);
    rep
}

/// The report of an `--exec` run: the finding (property, detail, recipe,
/// seed, dumps, how to rerun), the invariances had and lacked, the counts.
pub fn render(r: &ExecReport, target: &ExecTarget) -> String {
    let flag = target.runner.transport.flag();
    let mut s = String::new();
    if let Some(f) = &r.found {
        s.push_str(&format!(
            "FOUND {}: {} (case {} of seed {}, time to find {:.1} s; shrunk through the command in {} steps, {:.1} s)\n",
            target.runner.transport.kind(),
            f.finding.property,
            f.case_index,
            r.seed,
            f.time_to_find,
            f.shrink_steps,
            f.shrink_secs
        ));
        let detail: Vec<&str> = f.finding.detail.lines().take(16).collect();
        s.push_str(&format!("  detail: {}\n", detail.join("\n          ")));
        s.push_str(&format!("  recipe: {}\n", f.case.recipe()));
        s.push_str(&format!("  seed:   {}\n", r.seed));
        match &f.dump {
            Ok((path, verdict)) => {
                for p in &r.found_dumps {
                    s.push_str(&format!("  dump:   {}\n", p.display()));
                }
                s.push_str(&format!("  logprobe verify {}: {verdict}", path.display()));
                if f.finding.call == Call::Invariance {
                    s.push_str(
                        " (verify judges one file at a time; the invariance needs --replay)",
                    );
                }
                s.push('\n');
                s.push_str(&format!(
                    "  rerun:  logprobe fuzz --replay {} {flag}\n",
                    path.display()
                ));
            }
            Err(e) => s.push_str(&format!("  dump not written: {e}\n")),
        }
    }
    s.push_str(&format!(
        "\nfuzz {}: {} cases in {:.1} s (seed {}): {} checked against the oracle (worst err/bound {:.3}), {} SUSPECT, {} bad input not sent, {} with nothing to check\n",
        target.runner.transport.kind(),
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
            l.detail,
            l.case.recipe()
        ));
    }
    if let Some(n) = &r.close_note {
        s.push_str(&format!("note: {n}\n"));
    }
    s
}

/// Reruns the case of a fuzz dump on the external kernel, with the dump's
/// property required when it is an invariance: `Ok(None)` when it passes
/// now, `Ok(Some(finding))` when it still fails.
///
/// # Errors
/// A file that is not a fuzz dump, or a bad recipe.
pub fn replay(path: &Path, target: &mut ExecTarget) -> Result<(FuzzCase, Option<Finding>), String> {
    let (_, recipe, property, _) = super::counterexample::read_meta(path)?;
    let case = FuzzCase::parse(&recipe).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(inv) = Invariance::ALL
        .into_iter()
        .find(|i| i.property() == property)
    {
        if !target.require.contains(&inv) {
            target.require.push(inv);
        }
    }
    let f = target.judge(&case).err().map(|f| f.finding);
    target.runner.close();
    Ok((case, f))
}
