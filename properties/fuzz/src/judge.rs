//! Judging one fuzz case on one target with the gate's checks
//! (`logprobe_testkit::checks`: the oracle judgement of forward and
//! backward calls, chunk-size and row-slicing invariance; and
//! `logprobe_testkit::memory`): every property that applies, in order, the
//! first failure reported.

use std::panic::{catch_unwind, AssertUnwindSafe};

use logprobe_reference::spec::{Dtype, Output};
use logprobe_testkit::cache::oracle_case;
use logprobe_testkit::checks::{
    check_chunk_sizes, check_loss_chunk_sizes, check_row_slicing, judge_backward, judge_forward,
    judge_loss, LossOracle, Ratios,
};
use logprobe_testkit::memory::check_memory;
use logprobe_testkit::strategies::chunk_sizes;

use super::case::FuzzCase;
use super::target::Target;

/// The call a finding was made on (what a counterexample dump holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Forward into this output dtype.
    Forward(Dtype),
    /// The cross-entropy `loss` into this output dtype.
    Loss(Dtype),
    /// Backward into a new buffer of this dtype.
    Backward(Dtype),
    /// In-place backward (output in the logits' dtype).
    InPlace,
    /// Chunk-size or row-slicing invariance (several calls).
    Invariance,
    /// Peak extra memory of a forward and a backward.
    Memory,
    /// One call of an external kernel (`fuzz --exec`): every output at once.
    Exec,
    /// A fused linear kernel's forward and backward (`fused-linear`
    /// targets): every output at once.
    Linear,
}

/// A property a kernel failed on one case.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The property (`oracle agreement`, `loss`, `gradient`, `in-place
    /// gradient`, `chunk-size invariance`, `memory`).
    pub property: &'static str,
    /// The call.
    pub call: Call,
    /// What went wrong (output, row, column, values, error and bound).
    pub detail: String,
}

/// The worst `error / bound` over every judged output of `r`.
pub fn worst(r: &Ratios) -> f64 {
    Output::ALL
        .into_iter()
        .map(|o| r.get(o))
        .fold(0.0, f64::max)
}

/// Runs `f`, turning a panic into an error (a panicking kernel is a finding).
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(e) => Err(format!(
            "panicked: {}",
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// Judges `case` on `target`: forward against the oracle (output dtype
/// [`FuzzCase::out`]), the cross-entropy `loss` (same dtype, the case's
/// [`FuzzCase::loss`]), backward into a new buffer (the accumulation dtype)
/// and in place, against the oracle's VJP; then chunk-size invariance
/// (`chunk` against `chunk_sizes(N, seed)`) and row-slicing invariance
/// where the target has them; then memory where it has a model (valid
/// input, logits other than f64). Returns the worst `error / bound`, or the first finding.
///
/// # Errors
/// The first [`Finding`].
pub fn judge(target: &Target, case: &FuzzCase) -> Result<f64, Finding> {
    let e = case.expand();
    let (data, cot) = (&e.data, &e.cot);
    let kernel = target.kernel(case.chunk, &e.layout.widths);
    let k = kernel.as_ref();
    let key = case.key();
    let oc = oracle_case(&key, data);
    let fail = |property, call, detail: String| Finding {
        property,
        call,
        detail,
    };
    let out = case.out();
    let mut r = guarded(|| judge_forward(k, data, &oc, out, true))
        .map_err(|d| fail("oracle agreement", Call::Forward(out), d))?;
    let lo = LossOracle::compute(data, &e.loss, oc.clone());
    guarded(|| judge_loss(k, data, &e.loss, &lo, out))
        .map_err(|d| fail("loss", Call::Loss(out), d))?;
    if !cot.is_empty() || case.bad.is_some() {
        let acc = case.recipe.dtype.accumulation();
        let q = guarded(|| judge_backward(k, data, cot, &oc, &key, acc, false, true))
            .map_err(|d| fail("gradient", Call::Backward(acc), d))?;
        r.merge(&q);
        guarded(|| judge_backward(k, data, cot, &oc, &key, acc, true, false))
            .map_err(|d| fail("in-place gradient", Call::InPlace, d))?;
    }
    if target.invariance {
        let mut sizes = chunk_sizes(case.recipe.n, case.recipe.seed);
        sizes.retain(|&c| c != case.chunk);
        sizes.insert(0, case.chunk);
        let widths = e.layout.widths.clone();
        let make = |c: usize| target.kernel(c, &widths);
        let cut = (case.recipe.seed as usize) % (case.recipe.n + 1);
        guarded(|| {
            check_chunk_sizes(&make, data, cot, &sizes)?;
            check_loss_chunk_sizes(&make, data, &e.loss, &sizes)?;
            check_row_slicing(k, data, cot, cut)
        })
        .map_err(|d| fail("chunk-size invariance", Call::Invariance, d))?;
    }
    // The memory budget counts 4-byte work buffers: f64 logits are outside it.
    if target.memory
        && case.bad.is_none()
        && case.recipe.dtype != Dtype::F64
        && oc.forward.is_ok()
        && data.n() > 0
    {
        let p = data.problem();
        if p.validate().is_ok() {
            let cv = cot.view();
            let c = (!cot.is_empty()).then_some(&cv);
            let chunk = target.chunk_budget.then_some(case.chunk);
            guarded(|| check_memory(k, &p, c, Dtype::F32, chunk).map(|_| ()))
                .map_err(|d| fail("memory", Call::Memory, d))?;
        }
    }
    Ok(worst(&r))
}
