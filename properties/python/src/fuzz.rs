//! `logprobe.fuzz(fn)`: the fuzz engine of `logprobe fuzz --exec`
//! (`logprobe_fuzz::exec`) with a Python function as its third
//! transport, in-process ([`InProcessKernel`]). Judging, the metamorphic
//! variants, shrinking and the dumps are the CLI's: this file only carries
//! bytes between the engine and the Python caller (`logprobe/_fuzz.py`,
//! which turns a request into tensors, calls `fn` and writes its answer).
//!
//! The engine runs with the GIL released; each call takes it to call `fn`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{json, Value};

use logprobe_fuzz::exec::{
    self, CommandFailure, ExecReport, ExecRun, ExecTarget, InProcessKernel, Invariance, Runner,
    Transport,
};
use logprobe_fuzz::grammar::parse_duration;

/// The Python caller as a kernel of the engine.
pub(crate) struct PyKernel {
    /// `module.qualname` of the user's function.
    name: String,
    /// `logprobe._fuzz.Caller`: request bytes -> answer bytes, or
    /// `(what, traceback)` when `fn` raised or answered something unreadable.
    caller: Py<PyAny>,
    /// Set when the caller raised (KeyboardInterrupt, SystemExit, a bug of
    /// the caller): the run stops and the error is raised again.
    interrupted: AtomicBool,
    pub(crate) error: Mutex<Option<PyErr>>,
}

impl InProcessKernel for PyKernel {
    fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, request: &[u8]) -> Result<Vec<u8>, CommandFailure> {
        Python::attach(|py| {
            let answer = py
                .check_signals()
                .and_then(|()| self.caller.call1(py, (PyBytes::new(py, request),)));
            let stop = |e: PyErr| {
                let what = format!("interrupted: {e}");
                self.interrupted.store(true, Ordering::SeqCst);
                *self.error.lock().expect("not poisoned") = Some(e);
                CommandFailure::new(what, "")
            };
            let answer = answer.map_err(stop)?;
            let answer = answer.bind(py);
            if let Ok(b) = answer.cast::<PyBytes>() {
                return Ok(b.as_bytes().to_vec());
            }
            match answer.extract::<(String, String)>() {
                Ok((what, traceback)) => Err(CommandFailure {
                    what,
                    stderr_tail: traceback,
                    tail_of: "traceback",
                }),
                Err(e) => Err(stop(e)),
            }
        })
    }

    fn interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }
}

pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Everything `logprobe.fuzz` passes, as the CLI's strings.
struct Settings {
    gradients: bool,
    loss_side: Vec<logprobe_verify::protocol::Output>,
    budget: Duration,
    cases: Option<u64>,
    shrink_budget: Duration,
    require: Vec<Invariance>,
    seed: u64,
    bitwise: bool,
    accumulation: Option<logprobe_reference::spec::Dtype>,
    strict: bool,
}

#[allow(clippy::too_many_arguments)]
fn settings(
    outputs: &[String],
    budget: &str,
    cases: Option<u64>,
    shrink_budget: &str,
    require: &str,
    seed: Option<u64>,
    bitwise: bool,
    accumulation: Option<&str>,
    strict: bool,
) -> PyResult<Settings> {
    let accumulation = accumulation
        .map(|a| {
            logprobe_reference::spec::Dtype::ALL
                .into_iter()
                .find(|d| d.name() == a.trim())
                .ok_or_else(|| {
                    value_error(format!(
                        "accumulation={a:?}: expected f64, f32, bf16 or f16"
                    ))
                })
        })
        .transpose()?;
    Ok(Settings {
        gradients: outputs.iter().any(|o| o.trim() == "grad_logits"),
        loss_side: exec::loss_side_outputs(&outputs.iter().map(String::as_str).collect::<Vec<_>>()),
        budget: parse_duration(budget)
            .map_err(|e| value_error(format!("budget={budget:?}: {e}")))?,
        cases,
        shrink_budget: parse_duration(shrink_budget)
            .map_err(|e| value_error(format!("shrink_budget={shrink_budget:?}: {e}")))?,
        require: Invariance::parse_list(require)
            .map_err(|e| value_error(e.replace("--require", "require")))?,
        seed: seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        }),
        bitwise,
        accumulation,
        strict,
    })
}

pub(crate) fn kernel(name: String, caller: Py<PyAny>) -> Arc<PyKernel> {
    Arc::new(PyKernel {
        name,
        caller,
        interrupted: AtomicBool::new(false),
        error: Mutex::new(None),
    })
}

fn target(k: &Arc<PyKernel>, s: &Settings) -> ExecTarget {
    let k: Arc<dyn InProcessKernel> = k.clone();
    ExecTarget {
        // An in-process call has no timeout (it cannot be preempted).
        runner: Runner::new(Transport::InProcess(k), Duration::MAX),
        require: s.require.clone(),
        seed: s.seed,
        gradients: s.gradients,
        loss_side: s.loss_side.clone(),
        bitwise: s.bitwise,
        accumulation: s.accumulation,
        strict: s.strict,
    }
}

/// The report as JSON (the Python `FuzzReport` reads it) and its dumps.
fn report_json(r: &ExecReport, t: &ExecTarget) -> (Value, exec::Files) {
    let mut files = r.found_files.clone();
    let stem = format!("fuzz-{}-seed{}", t.runner.transport.kind(), r.seed);
    let lacks: Vec<Value> = r
        .lacks
        .iter()
        .map(|l| {
            let names: Vec<String> = l
                .dumps
                .iter()
                .map(|(suffix, bytes)| {
                    let base = format!("{stem}-lacks-{}", l.invariance.name());
                    let name = if suffix.is_empty() {
                        format!("{base}.safetensors")
                    } else {
                        format!("{base}-{suffix}.safetensors")
                    };
                    files.push((name.clone(), bytes.clone()));
                    name
                })
                .collect();
            json!({
                "property": l.invariance.name(),
                "case_index": l.case_index,
                "detail": l.detail,
                "recipe": l.case.recipe(),
                "files": names,
            })
        })
        .collect();
    let held: Vec<Value> = r
        .held
        .iter()
        .map(|(i, n)| {
            json!({
                "property": i.name(),
                "cases": n,
                "required": t.require.contains(i),
                "lacked": r.lacks.iter().any(|l| l.invariance == *i)
                    || r.found.as_ref().is_some_and(|f| f.finding.property == i.property()),
            })
        })
        .collect();
    let finding = r.found.as_ref().map(|f| {
        let (verify, dump_error) = match &f.dump {
            Ok((_, v)) => (Some(v.clone()), None),
            Err(e) => (None, Some(e.clone())),
        };
        json!({
            "property": f.finding.property,
            "detail": f.finding.detail,
            "recipe": f.case.recipe(),
            "case_index": f.case_index,
            "time_to_find": f.time_to_find,
            "shrink_steps": f.shrink_steps,
            "shrink_seconds": f.shrink_secs,
            "verify": verify,
            "dump_error": dump_error,
            "files": r.found_files.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        })
    });
    let v = json!({
        "kernel": t.runner.transport.command(),
        "seed": r.seed,
        "cases": r.cases,
        "checked": r.checked,
        "bad_input_not_sent": r.unchecked.0,
        "nothing_to_check": r.unchecked.1,
        "suspect": r.suspect,
        "seconds": r.seconds,
        "worst": r.worst,
        "calls": r.calls.0,
        "call_seconds": r.calls.1,
        "shrink_calls": r.shrink_calls,
        "held": held,
        "lacks": lacks,
        "finding": finding,
        "interrupted": r.interrupted,
    });
    (v, files)
}

/// `(report json, the CLI's table, [(dump file name, bytes)])`.
type FuzzOut = (String, String, Vec<(String, Py<PyBytes>)>);

/// Fuzzes the in-process kernel `caller` (see `logprobe.fuzz`). `options`
/// is `--options`' grammar with `dtype=`, `vocab=` and the outputs' pins
/// already merged in by the caller; `require` is `--require`'s.
/// Returns `(json, table, [(file name, bytes)])`.
///
/// # Errors
/// `ValueError` for a bad budget, option or require; the exception `fn`'s
/// caller raised past its own handling (KeyboardInterrupt, SystemExit).
#[pyfunction]
#[pyo3(signature = (caller, *, name, budget, cases, shrink_budget, options, outputs, require, seed, progress, bitwise = false, accumulation = None, strict = false))]
#[allow(clippy::too_many_arguments)]
fn fuzz(
    py: Python<'_>,
    caller: Py<PyAny>,
    name: String,
    budget: &str,
    cases: Option<u64>,
    shrink_budget: &str,
    options: &str,
    outputs: Vec<String>,
    require: &str,
    seed: Option<u64>,
    progress: bool,
    bitwise: bool,
    accumulation: Option<&str>,
    strict: bool,
) -> PyResult<FuzzOut> {
    let s = settings(
        &outputs,
        budget,
        cases,
        shrink_budget,
        require,
        seed,
        bitwise,
        accumulation,
        strict,
    )?;
    let outputs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let pins = exec::outputs_pins(&outputs, options).map_err(value_error)?;
    let space = exec::exec_space(&format!("{options},{pins}")).map_err(value_error)?;
    let k = kernel(name, caller);
    let run = ExecRun {
        target: target(&k, &s),
        space,
        budget: s.budget,
        cases: s.cases,
        shrink_budget: s.shrink_budget,
        out_dir: None,
        progress,
    };
    let report = py.detach(|| exec::run(&run));
    if let Some(e) = k.error.lock().expect("not poisoned").take() {
        return Err(e);
    }
    let table = exec::render(&report, &run.target);
    let (v, files) = report_json(&report, &run.target);
    let files = files
        .into_iter()
        .map(|(n, b)| (n, PyBytes::new(py, &b).unbind()))
        .collect();
    Ok((v.to_string(), table, files))
}

/// Reruns the case of a fuzz dump on `caller` (as `logprobe fuzz --replay
/// FILE`), with the dump's property required when it is an invariance.
/// Returns `None` when it passes now, else `(property, detail, recipe)`.
///
/// # Errors
/// `ValueError` for a file that is not a fuzz dump or a bad `require`; the
/// exception the caller raised past its own handling.
#[pyfunction]
#[pyo3(signature = (caller, path, *, name, outputs, require, bitwise = false, accumulation = None, strict = false))]
#[allow(clippy::too_many_arguments)]
fn fuzz_replay(
    py: Python<'_>,
    caller: Py<PyAny>,
    path: std::path::PathBuf,
    name: String,
    outputs: Vec<String>,
    require: &str,
    bitwise: bool,
    accumulation: Option<&str>,
    strict: bool,
) -> PyResult<Option<(String, String, String)>> {
    let s = settings(
        &outputs,
        "0s",
        None,
        "0s",
        require,
        Some(0),
        bitwise,
        accumulation,
        strict,
    )?;
    let k = kernel(name, caller);
    let mut t = target(&k, &s);
    let r = py.detach(|| exec::replay(&path, &mut t));
    if let Some(e) = k.error.lock().expect("not poisoned").take() {
        return Err(e);
    }
    let (case, finding) = r.map_err(value_error)?;
    Ok(finding.map(|f| (f.property.to_string(), f.detail, case.recipe())))
}

/// Adds `fuzz` and `fuzz_replay` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fuzz, m)?)?;
    m.add_function(wrap_pyfunction!(fuzz_replay, m)?)?;
    m.add("DEFAULT_REQUIRE", exec::DEFAULT_REQUIRE)?;
    crate::fuzz_linear::register(m)?;
    Ok(())
}
