//! `logprobe.fuzz_linear(fn)`: the fused linear search of `logprobe fuzz
//! --fused-linear --exec` (`logprobe_fuzz::linear`, fuzz protocol v2) with
//! a Python function as its in-process transport (`logprobe/_fuzz.py`
//! turns a request into tensors, calls `fn`, takes the gradients by
//! autograd and writes the answer).

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::json;

use logprobe_fuzz::exec::{InProcessKernel, Runner, Transport};
use logprobe_fuzz::grammar::parse_duration;
use logprobe_fuzz::linear::{
    self, exec::parse_logits, LinearConfig, LinearExec, LinearSpace, LinearTarget, LINEAR_OUTPUTS,
};
use logprobe_verify::verify::VerifyConfig;

use crate::fuzz::{kernel, value_error};

/// `(report json, table, [(file name, bytes)])`.
type FuzzOut = (String, String, Vec<(String, Py<PyBytes>)>);

fn external(
    caller: Py<PyAny>,
    name: &str,
    outputs: &[String],
    logits: &str,
) -> PyResult<(Arc<crate::fuzz::PyKernel>, LinearTarget)> {
    let mut asked = Vec::new();
    for o in outputs {
        match LINEAR_OUTPUTS.iter().find(|x| **x == o.trim()) {
            Some(x) => asked.push(*x),
            None => {
                return Err(value_error(format!(
                    "outputs: {o:?} is not an output of a fused linear kernel ({})",
                    LINEAR_OUTPUTS.join(", ")
                )))
            }
        }
    }
    let k = kernel(name.to_string(), caller);
    let dynk: Arc<dyn InProcessKernel> = k.clone();
    let e = LinearExec {
        // An in-process call has no timeout (it cannot be preempted).
        runner: Runner::new(Transport::InProcess(dynk), Duration::MAX),
        outputs: LINEAR_OUTPUTS
            .into_iter()
            .filter(|x| asked.contains(x))
            .collect(),
        logits: parse_logits(logits)
            .map_err(|e| value_error(format!("lm_head_logits_dtype={e}")))?,
        model: VerifyConfig::default().model,
        // `fn` takes no chunk size: nothing to vary.
        chunk_invariant: false,
    };
    Ok((k, LinearTarget::external("in-process", e)))
}

/// Runs the fused linear search on `caller` (see the module docs).
///
/// # Errors
/// `ValueError` for a bad budget, option, output or `lm_head_logits_dtype`;
/// the exception `fn`'s caller raised past its own handling.
#[pyfunction]
#[pyo3(signature = (caller, *, name, budget, cases, shrink_budget, options, outputs, lm_head_logits_dtype, seed, progress))]
#[allow(clippy::too_many_arguments)]
fn fuzz_linear(
    py: Python<'_>,
    caller: Py<PyAny>,
    name: String,
    budget: &str,
    cases: Option<u64>,
    shrink_budget: &str,
    options: &str,
    outputs: Vec<String>,
    lm_head_logits_dtype: &str,
    seed: Option<u64>,
    progress: bool,
) -> PyResult<FuzzOut> {
    let (k, target) = external(caller, &name, &outputs, lm_head_logits_dtype)?;
    let space = LinearSpace::parse(options).map_err(value_error)?;
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let out_dir = std::env::temp_dir().join(format!(
        "logprobe-fuzz-linear-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let config = LinearConfig {
        targets: vec![target],
        space,
        seed,
        budget: parse_duration(budget).map_err(value_error)?,
        cases,
        shrink_budget: parse_duration(shrink_budget).map_err(value_error)?,
        out_dir: out_dir.clone(),
        progress,
    };
    let report = py.detach(|| linear::run_linear(&config));
    if let Some(e) = k.error.lock().expect("not poisoned").take() {
        let _ = std::fs::remove_dir_all(&out_dir);
        return Err(e);
    }
    let t = &report.targets[0];
    let mut files = Vec::new();
    let finding = t.found.as_ref().map(|f| {
        let (verify, dump_error, names) = match &f.dump {
            Ok((path, v)) => {
                let file = path
                    .file_name()
                    .map_or(String::new(), |n| n.to_string_lossy().into_owned());
                if let Ok(bytes) = std::fs::read(path) {
                    files.push((file.clone(), PyBytes::new(py, &bytes).unbind()));
                }
                (Some(v.clone()), None, vec![file])
            }
            Err(e) => (None, Some(e.clone()), Vec::new()),
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
            "files": names,
        })
    });
    let _ = std::fs::remove_dir_all(&out_dir);
    let table = format!(
        "{}{}",
        t.found.as_ref().map_or(String::new(), |f| {
            logprobe_fuzz::render_found(&name, report.seed, f)
        }),
        logprobe_fuzz::render_summary(&report)
    );
    let calls = config.targets[0]
        .exec
        .as_ref()
        .map_or((0, 0.0), |e| e.runner.stats());
    // The keys of `logprobe.fuzz`'s report (FuzzReport), those without
    // meaning here at their empty values.
    let v = json!({
        "kernel": name,
        "seed": report.seed,
        "cases": t.cases,
        "checked": t.cases - t.unbounded - u64::from(t.found.is_some()),
        "suspect": 0,
        "bad_input_not_sent": 0,
        "nothing_to_check": t.unbounded,
        "seconds": report.seconds,
        "worst": t.worst,
        "calls": calls.0,
        "shrink_calls": 0,
        "held": [],
        "lacks": [],
        "finding": finding,
    });
    Ok((v.to_string(), table, files))
}

/// Adds `fuzz_linear` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fuzz_linear, m)?)?;
    Ok(())
}
