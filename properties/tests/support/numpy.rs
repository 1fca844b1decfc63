//! The interpreter the numpy example kernels run on (properties/examples/exec).

use std::process::Command;

/// `LOGPROBE_PYTHON` (default `python3`) resolved to the interpreter itself
/// when it imports numpy; `None` (the test skips, with a message) when it
/// does not, unless `LOGPROBE_REQUIRE_NUMPY=1` (set by `.ci/run`): then a
/// panic.
pub fn python_with_numpy() -> Option<String> {
    let py = std::env::var("LOGPROBE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        // The interpreter itself, not a shim (pyenv's costs ~1 s per start).
        let exe = Command::new(&py)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty());
        return Some(exe.unwrap_or(py));
    }
    let msg = format!(
        "`{py} -c 'import numpy'` fails: the numpy example kernel is not run \
         (set LOGPROBE_PYTHON, or PYTHONPATH=$(scripts/install-numpy.sh | tail -n1))"
    );
    if std::env::var("LOGPROBE_REQUIRE_NUMPY").is_ok_and(|v| v == "1") {
        panic!("LOGPROBE_REQUIRE_NUMPY=1: {msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}
