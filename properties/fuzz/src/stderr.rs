//! Stderr that never panics: the fuzz run's progress lines, and (re-exported
//! by the CLI) every message the `logprobe` binary writes there.

use std::io::Write;

/// Writes `s` and a newline to stderr. Errors are ignored (a closed or full
/// stderr leaves nowhere to report them; the exit status says the rest),
/// never a panic as with `eprintln!`.
pub fn eprint_line(s: &str) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(s.as_bytes()).and_then(|_| e.write_all(b"\n"));
}
