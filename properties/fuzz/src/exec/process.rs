//! The adapter's processes: started in a process group of their own,
//! tagged, and all of them killed and reaped when a call or the run ends
//! (`docs/fuzz-protocol.md`, "Process hygiene").
//!
//! - The leader (`sh -c CMD`) leads a new process group and gets
//!   `PR_SET_PDEATHSIG` = `SIGKILL` (Linux): it dies with logprobe.
//! - logprobe is the child subreaper of its descendants
//!   (`PR_SET_CHILD_SUBREAPER`, Linux): a descendant whose parent dies (a
//!   double fork, `setsid`) becomes logprobe's child, not init's, so it
//!   can be reaped.
//! - Every process started from the adapter inherits the environment entry
//!   `LOGPROBE_EXEC_TAG=<pid>-<n>`, unique per start: the processes that
//!   left the group (`setsid`) are found by it in `/proc`.
//! - [`Adapter::terminate`] kills the group and every tagged process until
//!   none is left, reaps those that became logprobe's children, then the
//!   leader. The leader is reaped last, so the group id cannot be reused
//!   while it is killed.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The environment variable that tags an adapter's processes.
pub const TAG_VAR: &str = "LOGPROBE_EXEC_TAG";

/// How long [`Adapter::terminate`] waits for the killed processes to die.
const TERMINATE_WAIT: Duration = Duration::from_secs(5);

/// A started adapter: its leader and the tag of every process it starts.
pub struct Adapter {
    child: Child,
    pid: i32,
    /// `TAG_VAR=value`, as it appears in `/proc/PID/environ`.
    entry: Vec<u8>,
    /// Set once terminated: the leader's status (`None`: waiting failed).
    ended: Option<Option<ExitStatus>>,
}

impl Adapter {
    /// Starts `cmd` as an adapter (see the module docs): its own process
    /// group, the tag in its environment, `PR_SET_PDEATHSIG` on Linux, and
    /// this process made the subreaper of its descendants.
    ///
    /// # Errors
    /// The spawn's error (no shell, no process left, the parent gone).
    pub fn spawn(cmd: &mut Command) -> io::Result<Adapter> {
        static STARTS: AtomicU64 = AtomicU64::new(0);
        become_subreaper();
        let tag = format!(
            "{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        );
        cmd.env(TAG_VAR, &tag).process_group(0);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: getpid is async-signal-safe; the closure runs in the
            // forked child before exec and calls only prctl and getppid,
            // both async-signal-safe.
            let parent = unsafe { libc::getpid() };
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The parent died before the prctl: nothing would kill us.
                    if libc::getppid() != parent {
                        return Err(io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        Ok(Adapter {
            child,
            pid,
            entry: format!("{TAG_VAR}={tag}").into_bytes(),
            ended: None,
        })
    }

    /// The leader's pipes and handle (stdin, stdout).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether the leader has exited, without reaping it (its group id
    /// stays reserved until [`Adapter::terminate`]).
    pub fn exited(&mut self) -> bool {
        if self.ended.is_some() {
            return true;
        }
        leader_exited(&mut self.child, self.pid)
    }

    /// Polls [`Adapter::exited`] for at most `wait`.
    pub fn exited_within(&mut self, wait: Duration) -> bool {
        let end = Instant::now() + wait;
        let mut nap = Duration::from_micros(100);
        loop {
            if self.exited() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(nap);
            nap = (nap * 3 / 2).min(Duration::from_millis(5));
        }
    }

    /// Kills the adapter's process group and every process carrying its tag
    /// (until none is left, at most 5 s), reaps those that became this
    /// process's children, then reaps the leader. Returns the leader's exit
    /// status (`None` only when waiting for it failed). Idempotent.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        if self.ended.is_none() {
            kill_tree(self.pid, &self.entry);
            self.ended = Some(self.child.wait().ok());
        }
        self.ended.flatten()
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// Makes this process the child subreaper of its descendants (Linux; once).
fn become_subreaper() {
    #[cfg(target_os = "linux")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: prctl with an integer argument has no memory effects.
        ONCE.call_once(|| unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
        });
    }
}

/// Whether the leader `pid` has exited, without reaping it.
#[cfg(target_os = "linux")]
fn leader_exited(_child: &mut Child, pid: i32) -> bool {
    // SAFETY: waitid writes only into `info`, zeroed first (a zero si_pid
    // after WNOHANG means no state change).
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        r != 0 || info.si_pid() != 0
    }
}

/// Whether the leader has exited (elsewhere: reaped by `try_wait`).
#[cfg(not(target_os = "linux"))]
fn leader_exited(child: &mut Child, _pid: i32) -> bool {
    !matches!(child.try_wait(), Ok(None))
}

/// Kills the group `pgid` and every process whose environment holds
/// `entry`, until none is alive; reaps the zombies that are this process's
/// children (never `pgid` itself, the caller's to reap).
fn kill_tree(pgid: i32, entry: &[u8]) {
    let me = std::process::id() as i32;
    let deadline = Instant::now() + TERMINATE_WAIT;
    let mut nap = Duration::from_micros(200);
    let mut killed = std::collections::HashSet::new();
    loop {
        // SAFETY: kill(2) has no memory effects; the leader is unreaped, so
        // `-pgid` still names the adapter's group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let mut alive = false;
        for p in processes() {
            if p.pid == me || p.pid == pgid {
                continue;
            }
            let ours = p.pgrp == pgid
                || if p.zombie {
                    killed.contains(&p.pid)
                } else {
                    tagged(p.pid, entry)
                };
            if !ours {
                continue;
            }
            if p.zombie {
                if p.ppid == me {
                    // SAFETY: waitpid on our own zombie child.
                    unsafe {
                        libc::waitpid(p.pid, std::ptr::null_mut(), libc::WNOHANG);
                    }
                }
            } else {
                alive = true;
                killed.insert(p.pid);
                // SAFETY: as above; `p.pid` is alive and tagged or in the group.
                unsafe {
                    libc::kill(p.pid, libc::SIGKILL);
                }
            }
        }
        if !alive || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(10));
    }
    // The last ones to die may have left zombies reparented to us.
    for p in processes() {
        let ours = p.pgrp == pgid || killed.contains(&p.pid);
        if p.zombie && p.ppid == me && p.pid != pgid && ours {
            // SAFETY: as above.
            unsafe {
                libc::waitpid(p.pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
    }
}

/// Kills and reaps every child of this process (Linux: those `/proc`
/// shows; elsewhere nothing): with the subreaper, what is left of the
/// adapters' descendants that escaped both the group and the tag (`setsid
/// env -i ...`) once their parents died. Only for a process none of whose
/// other parts has children (the `logprobe` binary after its run): it would
/// reap theirs too. Returns how many kills it sent (at most 5 s).
pub fn kill_orphans() -> usize {
    let me = std::process::id() as i32;
    let deadline = Instant::now() + TERMINATE_WAIT;
    let mut killed = 0;
    loop {
        let children: Vec<Proc> = processes().into_iter().filter(|p| p.ppid == me).collect();
        if children.is_empty() || Instant::now() >= deadline {
            return killed;
        }
        for p in children {
            killed += usize::from(!p.zombie);
            // SAFETY: kill(2) and waitpid(2) of our own child (unreaped, so
            // its pid is ours).
            unsafe {
                if !p.zombie {
                    libc::kill(p.pid, libc::SIGKILL);
                }
                libc::waitpid(p.pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A process as `/proc/PID/stat` shows it.
struct Proc {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    zombie: bool,
}

/// Every process of `/proc` (Linux; elsewhere none: the group kill alone).
fn processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        let mut f = rest.split_ascii_whitespace();
        let state = f.next()?;
        let ppid = f.next()?.parse().ok()?;
        let pgrp = f.next()?.parse().ok()?;
        Some(Proc {
            pid,
            ppid,
            pgrp,
            zombie: state == "Z" || state == "X",
        })
    })
    .collect()
}

/// Whether the environment of `pid` holds the entry `entry`.
fn tagged(pid: i32, entry: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry))
}

/// The name of signal `sig` (`SIGABRT`), or `None` for one without a
/// standard name.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// `signal 6 (SIGABRT)`.
pub fn signal_text(sig: i32) -> String {
    match signal_name(sig) {
        Some(n) => format!("signal {sig} ({n})"),
        None => format!("signal {sig}"),
    }
}

/// How the adapter ended, for a report: `exited with status 3`, `was killed
/// by signal 6 (SIGABRT)`; a shell's status `128 + K` names signal K too
/// (the shell reports a command killed by K so).
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) if (129..=128 + 64).contains(&c) && signal_name(c - 128).is_some() => {
            format!(
                "exited with status {c}: a command it ran was killed by {}",
                signal_text(c - 128)
            )
        }
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by {}", signal_text(s)),
        _ => format!("ended: {status}"),
    }
}
