//! SIGINT, SIGTERM and SIGHUP during `fuzz --exec`: the `logprobe` binary
//! catches them ([`install`]), the run stops at the next poll (every call
//! polls while it waits), the adapter's processes are killed and the
//! temporary directories removed on the normal paths, and the binary then
//! dies by the same signal ([`reraise`]). The Python package installs
//! nothing: there Ctrl-C is the interpreter's.

use std::sync::atomic::{AtomicI32, Ordering};

/// The first signal caught (0: none).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// The signals [`install`] catches.
pub const CAUGHT_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    let _ = CAUGHT.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Catches SIGINT, SIGTERM and SIGHUP: each only records that it came (see
/// [`caught`]). A second one of the same kind takes its default action
/// (`SA_RESETHAND`): a second Ctrl-C ends logprobe at once (its adapter's
/// leader then dies of `PR_SET_PDEATHSIG`).
///
/// # Errors
/// `sigaction`'s error.
pub fn install() -> std::io::Result<()> {
    for sig in CAUGHT_SIGNALS {
        // SAFETY: a zeroed sigaction with a handler that only stores an
        // atomic; sigemptyset and sigaction write only into `act`.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The signal caught, if any (only after [`install`]).
pub fn caught() -> Option<i32> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Dies by `sig` with its default action (a shell then sees the process
/// killed by it, e.g. status 130 for SIGINT). Returns only if that action
/// does not end the process; then the caller exits `128 + sig`.
pub fn reraise(sig: i32) {
    // SAFETY: signal/raise with a valid signal number; the default action
    // ends the process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}
