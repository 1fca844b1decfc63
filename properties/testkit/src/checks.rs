//! The property checks: each takes a generated case and a list of kernels,
//! runs the oracle once ([`crate::cache`]) and judges every kernel against
//! it, returning one [`KernelOutcome`] per kernel. The `cargo test` gate
//! ([`gate`]) and the mutant survey ([`survey`]) run the same checks.
//!
//! The properties are DESIGN's "The properties" 1-7: oracle agreement within
//! the tolerance model's bound, chunk-size invariance bit for bit, gradients
//! against the oracle's VJP, bf16/f16 inputs and outputs, vocab-parallel
//! shardings against the oracle, and edges / bad input / unchanged inputs.
//! (Memory, property 5, lives in its own test binary: `tests/memory.rs`.)

use std::fmt;

use ndarray::{s, Array2, Axis};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, RngSeed, TestCaseError, TestRng, TestRunner,
};

use logprobe_kernels::kernel::{Capabilities, ForwardOutput, Kernel, KernelError};
use logprobe_reference::oracle::Exact;
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Output, PerOutput, Problem, Shape, SpecError,
    TemperatureDtype,
};

use crate::cache::{oracle_vjp, OracleCase};
use crate::strategies::{CotangentData, ProblemData};
use logprobe_verify::tolerance::{self, Model, RowTargets};

/// Seed of every property's case stream (fixed so the gate is reproducible;
/// `PROPTEST_RNG_SEED` overrides it).
pub const DEFAULT_SEED: u64 = 0x10C9_90BE;

/// Why a kernel failed a property on one case.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The property.
    pub property: &'static str,
    /// The kernel's name.
    pub kernel: String,
    /// What went wrong (output, row, column, values, error and bound).
    pub detail: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed {}: {}",
            self.kernel, self.property, self.detail
        )
    }
}

/// The worst `error / bound` a kernel reached on one or more cases, per
/// output, over f32 outputs of f32 logits (the tightness figures; bf16/f16
/// outputs are dominated by their final rounding).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ratios(pub PerOutput<f64>);

impl Ratios {
    /// The worst ratio of `output`; 0 when nothing was judged.
    pub fn get(&self, output: Output) -> f64 {
        self.0.get(output).copied().unwrap_or(0.0)
    }

    /// Records one ratio of `output` (keeps the max).
    pub fn record(&mut self, output: Output, ratio: f64) {
        let r = self.0.get_or_insert_with(output, || 0.0);
        *r = r.max(ratio);
    }

    /// Elementwise max.
    pub fn merge(&mut self, o: &Ratios) {
        for (output, &q) in o.0.iter() {
            self.record(output, q);
        }
    }
}

/// One kernel's outcome on one case.
#[derive(Clone, Debug)]
pub struct KernelOutcome {
    /// The kernel's name.
    pub kernel: String,
    /// Its ratios, or why it failed.
    pub outcome: Result<Ratios, Failure>,
}

/// A property: a strategy of cases and a check of a kernel list `K` on one case.
pub struct Property<C, K: ?Sized> {
    /// Test name (the property as a sentence).
    pub name: &'static str,
    /// Default case count (`PROPTEST_CASES` replaces it).
    pub cases: u32,
    /// The generator of cases.
    pub strategy: fn() -> BoxedStrategy<C>,
    /// The check: one verdict per kernel.
    pub check: fn(&C, &K) -> Vec<KernelOutcome>,
}

/// `PROPTEST_CASES` if set, else `base`.
pub fn case_count(base: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(base)
}

fn config(cases: u32, regressions: Option<&'static str>) -> Config {
    let mut c = Config {
        cases: case_count(cases),
        max_shrink_iters: 256,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    if c.rng_seed == RngSeed::Random {
        c.rng_seed = RngSeed::Fixed(DEFAULT_SEED);
    }
    c.failure_persistence =
        regressions.map(|r| Box::new(FileFailurePersistence::Direct(r)) as Box<_>);
    c
}

/// Runs `property` as a proptest over `kernels`: the first case on which any
/// kernel fails is shrunk (the recipe shrinks), persisted to `regressions`
/// (a `proptest-regressions/*.txt` path) and reported by a panic.
///
/// # Panics
/// When a kernel fails the property.
pub fn gate<C: Clone + fmt::Debug + 'static, K: ?Sized>(
    property: &Property<C, K>,
    kernels: &K,
    regressions: &'static str,
) {
    let mut runner = TestRunner::new(config(property.cases, Some(regressions)));
    let result = runner.run(&(property.strategy)(), |case| {
        for v in (property.check)(&case, kernels) {
            if let Err(f) = v.outcome {
                return Err(TestCaseError::fail(f.to_string()));
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{}: {e}", property.name);
    }
}

/// One kernel's outcome over a survey.
#[derive(Clone, Debug)]
pub struct KernelSummary {
    /// The kernel's name.
    pub kernel: String,
    /// Cases it failed.
    pub failures: usize,
    /// The first failure.
    pub first_failure: Option<Failure>,
    /// Worst ratios over the cases it passed.
    pub ratios: Ratios,
}

/// Runs `property`'s check on `cases` cases (its default count when `None`,
/// replaced by `PROPTEST_CASES`) from the fixed seed, without stopping or
/// shrinking, and summarises each kernel: the mutant kill table and the
/// tightness figures.
///
/// The first `references` kernels are the correct ones: a later kernel's
/// failure counts only on cases all references pass (a kill must be a
/// difference from the correct kernel, not a fault of the judge).
pub fn survey<C: fmt::Debug, K: ?Sized>(
    property: &Property<C, K>,
    kernels: &K,
    cases: Option<u32>,
    references: usize,
) -> Vec<KernelSummary> {
    let cases = cases.unwrap_or_else(|| case_count(property.cases));
    let cfg = config(cases, None);
    let seed = match cfg.rng_seed {
        RngSeed::Fixed(s) => s,
        RngSeed::Random => DEFAULT_SEED,
    };
    let mut runner = TestRunner::new_with_rng(
        cfg,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed)),
    );
    let strategy = (property.strategy)();
    let mut out: Vec<KernelSummary> = Vec::new();
    for _ in 0..cases {
        let case = match strategy.new_tree(&mut runner) {
            Ok(t) => t.current(),
            Err(_) => continue,
        };
        let verdicts = (property.check)(&case, kernels);
        let refs_ok = verdicts.iter().take(references).all(|v| v.outcome.is_ok());
        for (i, v) in verdicts.into_iter().enumerate() {
            if out.len() <= i {
                out.push(KernelSummary {
                    kernel: v.kernel.clone(),
                    failures: 0,
                    first_failure: None,
                    ratios: Ratios::default(),
                });
            }
            match v.outcome {
                Ok(r) => out[i].ratios.merge(&r),
                Err(_) if i >= references && !refs_ok => {}
                Err(f) => {
                    out[i].failures += 1;
                    if out[i].first_failure.is_none() {
                        out[i].first_failure = Some(f);
                    }
                }
            }
        }
    }
    out
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, c) in b.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
    }
    b
}

// ---------------------------------------------------------------------------
// Problems as a kernel sees them.

/// What a kernel is asked: the problem with the outputs it cannot compute
/// left out (entropy, masked entropy, top-k), and the input features it
/// cannot take (mask, temperature, padding, f64), for which it must answer
/// [`KernelError::Unsupported`].
pub struct Asked<'a> {
    /// The problem given to the kernel.
    pub problem: Problem<'a>,
    /// The first input feature the kernel's capabilities exclude.
    pub unsupported: Option<&'static str>,
}

/// Adapts `problem` to `caps` (see [`Asked`]).
pub fn asked<'a>(problem: &Problem<'a>, caps: &Capabilities) -> Asked<'a> {
    let mut p = *problem;
    match p.options.entropy {
        Some(EntropyLogits::Masked) if !caps.masked_entropy => p.options.entropy = None,
        Some(_) if !caps.entropy => p.options.entropy = None,
        _ => {}
    }
    if !caps.topk {
        p.topk_ids = None;
    }
    let (_, v_total) = p.logits.dim();
    let unsupported = if p.sampling_mask.is_some() && !caps.sampling_mask {
        Some("sampling_mask")
    } else if (p.options.temperature != 1.0
        || p.options.temperature_dtype == TemperatureDtype::Input)
        && !caps.temperature
    {
        Some("temperature")
    } else if p.options.vocab_size.is_some_and(|v| v < v_total) && !caps.padded_vocab {
        Some("padded vocabulary")
    } else if p.logits.dtype() == Dtype::F64 && !caps.f64_input {
        Some("f64 logits")
    } else {
        None
    };
    Asked {
        problem: p,
        unsupported,
    }
}

/// The cotangents a kernel is given: those of outputs its capabilities
/// dropped from the problem ([`asked`]) are left out too.
fn cot_for<'c>(data: &ProblemData, asked: &Problem<'_>, cot: &'c CotangentData) -> Cotangents<'c> {
    let mut cv = cot.view();
    if data.options.entropy.is_some() && asked.options.entropy.is_none() {
        cv.grad_entropy = None;
    }
    if data.topk_ids.is_some() && asked.topk_ids.is_none() {
        cv.grad_topk_log_probs = None;
    }
    cv
}

/// The error `problem` must give, if any: the spec's validation first, else
/// the oracle's own (an overflow of `round_input(x / T)`).
fn expected_error(problem: &Problem<'_>, oracle: &OracleCase) -> Option<SpecError> {
    match problem.validate() {
        Err(e) => Some(e),
        Ok(_) => match &oracle.forward {
            // Errors only the values reveal (`round_input(x / T)` overflowing);
            // a top-k error of ids the kernel was not given does not count.
            Err(SpecError::TopkIdOutOfRange { .. }) if problem.topk_ids.is_none() => None,
            Err(e) => Some(e.clone()),
            Ok(_) => None,
        },
    }
}

/// Whether two spec errors agree (same variant and fields; NaN values match).
pub fn same_error(a: &SpecError, b: &SpecError) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// A fingerprint of every input bit (logits, tokens, mask, ids), to check
/// that a call left its inputs unchanged.
pub fn fingerprint(data: &ProblemData) -> u64 {
    let mut h = Fnv::default();
    for x in data.logits.to_f64().iter() {
        h.add(x.to_bits());
    }
    if let Some(t) = &data.tokens {
        t.iter().for_each(|&x| h.add(x as u64));
    }
    if let Some(m) = &data.sampling_mask {
        m.iter().for_each(|&x| h.add(x as u64));
    }
    if let Some(k) = &data.topk_ids {
        k.iter().for_each(|&x| h.add(x as u64));
    }
    h.0
}

/// FNV-1a over 64-bit words.
struct Fnv(u64);
impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}
impl Fnv {
    fn add(&mut self, w: u64) {
        for b in w.to_le_bytes() {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

// ---------------------------------------------------------------------------
// Judging one call against the oracle.

/// A kernel's own error model for a call with this shape: its declared
/// [`Algorithm`](logprobe_reference::spec::Algorithm) and, when it declares
/// one, its entropy form (else [`EntropyForm::Any`](logprobe_reference::spec::EntropyForm::Any)).
pub fn kernel_model(kernel: &dyn Kernel, shape: &Shape) -> Model {
    Model::declared(&kernel.algorithm(shape))
        .with_entropy_form(kernel.entropy_form().unwrap_or_default())
}

/// Judges a kernel's values of one call against the oracle under the
/// kernel's declared model ([`kernel_model`]), row by row through the
/// shared walk ([`tolerance::walk_row`]): every value must be a value of
/// its dtype and within its bound; the first one that is not is the error.
/// Returns the worst `error / bound` per output. A row's bounds are built
/// (O(V)) only when one of its values is inexact.
///
/// `exact` and `got` hold `[N, width]` per output (`got` in dtype `out`);
/// `cotangents` are those of the call (empty for a forward call).
///
/// # Errors
/// A description naming the output, row and column, the values, the
/// error and the bound.
#[allow(clippy::too_many_arguments)]
pub fn judge_values(
    kernel: &dyn Kernel,
    problem: &Problem<'_>,
    cotangents: &Cotangents<'_>,
    oracle: &OracleCase,
    exact: &PerOutput<&Array2<Exact>>,
    got: &PerOutput<&Array2<f64>>,
    out: Dtype,
) -> Result<Ratios, String> {
    let shape = problem.validate_shapes().map_err(|e| format!("{e}"))?;
    for (o, g) in got.iter() {
        let want = (shape.n, o.width(&shape));
        if g.dim() != want {
            return Err(format!("{o} has shape {:?}, expected {want:?}", g.dim()));
        }
        if exact.get(o).is_none_or(|x| x.dim() != want) {
            return Err(format!("the oracle gave no {o} of shape {want:?}"));
        }
    }
    let model = kernel_model(kernel, &shape);
    let mut ratios = Ratios::default();
    for row in 0..shape.n {
        let targets = RowTargets::new(problem, row, cotangents);
        // The row's bounds are built once (O(V)), only when some value is inexact.
        let rb = std::cell::OnceCell::new();
        let rb = || rb.get_or_init(|| model.row_bounds(&oracle.stats[row], &oracle.contexts[row]));
        let exact_rows = exact.as_ref().map(|_, x| x.row(row));
        let got_rows = got.as_ref().map(|_, g| (out, g.row(row)));
        tolerance::walk_row(
            &exact_rows,
            &got_rows,
            |o| o.judged(problem, row),
            |e| {
                let (c, x) = (e.candidate, e.exact);
                let at = e.output.element(row, e.col);
                if !(c.is_nan() || out.round_f64(c) == c) {
                    return Err(format!("{at} = {c:e} is not a {out} value"));
                }
                if x.error(c) == 0.0 {
                    ratios.record(e.output, 0.0);
                    return Ok(());
                }
                let bound = rb().bound(e.output, e.col, &targets, out);
                let j = tolerance::judge(x, c, out, &bound);
                if !j.pass {
                    return Err(format!(
                        "{at}: candidate {c:e}, exact [{:e}, {:e}], error {:e} ({:.1} ulp {out}), bound {} ({}); targets {targets:?}",
                        x.enclosure.lo,
                        x.enclosure.hi,
                        j.error_abs,
                        j.error_ulps,
                        j.bound,
                        j.verdict()
                    ));
                }
                ratios.record(e.output, j.ratio.unwrap_or(0.0));
                Ok(())
            },
        )?;
    }
    Ok(ratios)
}

/// Judges one forward call of `kernel` on `data` with output dtype `out`;
/// `record` adds the ratios (only for f32 outputs of f32 logits).
pub fn judge_forward(
    kernel: &dyn Kernel,
    data: &ProblemData,
    oracle: &OracleCase,
    out: Dtype,
    record: bool,
) -> Result<Ratios, String> {
    let full = data.problem();
    let caps = kernel.capabilities();
    let a = asked(&full, &caps);
    let before = fingerprint(data);
    let result = kernel.forward(&a.problem, out);
    if fingerprint(data) != before {
        return Err("forward changed its inputs".into());
    }
    let expected = expected_error(&a.problem, oracle);
    let fo = match (result, expected, a.unsupported) {
        (Err(KernelError::Unsupported { .. }), _, Some(_)) => return Ok(Ratios::default()),
        (Err(KernelError::Spec(e)), Some(x), _) if same_error(&e, &x) => {
            return Ok(Ratios::default())
        }
        (Err(e), Some(x), _) => return Err(format!("returned {e:?}, expected {x:?}")),
        (Ok(_), Some(x), _) => {
            return Err(format!("returned values for bad input, expected {x:?}"))
        }
        (Err(e), None, _) => return Err(format!("returned {e:?} on valid, supported input")),
        (Ok(fo), None, _) => fo,
    };
    let Ok(of) = &oracle.forward else {
        // The oracle refused a part the kernel was not asked (top-k ids):
        // nothing to judge the values against.
        return Ok(Ratios::default());
    };
    if fo.dtype != out {
        return Err(format!("output dtype {} instead of {out}", fo.dtype));
    }
    for o in Output::FORWARD {
        if o.requested(&a.problem) && !fo.values.contains(o) {
            return Err(format!("{o} missing"));
        }
    }
    // Only what the kernel was asked is judged.
    let got: PerOutput<&Array2<f64>> = fo
        .values
        .iter()
        .filter(|(o, _)| o.requested(&a.problem))
        .collect();
    let r = judge_values(
        kernel,
        &a.problem,
        &Cotangents::default(),
        oracle,
        &of.values.as_ref(),
        &got,
        out,
    )?;
    Ok(if record { r } else { Ratios::default() })
}

/// Judges one backward call (or, with `in_place`, the in-place backward on
/// a copy of the logits, output in the logits' dtype) against the oracle's
/// VJP with the per-element bound.
#[allow(clippy::too_many_arguments)]
pub fn judge_backward(
    kernel: &dyn Kernel,
    data: &ProblemData,
    cot: &CotangentData,
    oracle: &OracleCase,
    vjp_key: &str,
    out: Dtype,
    in_place: bool,
    record: bool,
) -> Result<Ratios, String> {
    let caps = kernel.capabilities();
    if !(if in_place {
        caps.in_place_backward
    } else {
        caps.backward
    }) {
        return Ok(Ratios::default());
    }
    let full = data.problem();
    let a = asked(&full, &caps);
    let cv = cot_for(data, &a.problem, cot);
    let out = if in_place { data.logits.dtype() } else { out };
    let before = fingerprint(data);
    let result = if in_place {
        let mut copy = data.logits.clone();
        let p = a.problem;
        let r = kernel.backward_in_place(
            logprobe_reference::spec::ProblemMut {
                logits: copy.view_mut(),
                tokens: p.tokens,
                sampling_mask: p.sampling_mask,
                topk_ids: p.topk_ids,
                options: p.options,
            },
            &cv,
        );
        match r {
            Ok(()) => Ok(copy.to_f64()),
            Err(e) => {
                if !copy.bits_eq(&data.logits) {
                    return Err(format!(
                        "in-place backward returned {e:?} and changed the logits"
                    ));
                }
                Err(e)
            }
        }
    } else {
        kernel.backward(&a.problem, &cv, out)
    };
    if fingerprint(data) != before {
        return Err("backward changed its inputs".into());
    }
    let expected = expected_error(&a.problem, oracle).or_else(|| {
        a.problem
            .validate_shapes()
            .ok()
            .and_then(|shape| a.problem.validate_cotangents(&shape, &cv).err())
    });
    let grad = match (result, expected, a.unsupported) {
        (Err(KernelError::Unsupported { .. }), _, Some(_)) => return Ok(Ratios::default()),
        (Err(KernelError::Spec(e)), Some(x), _) if same_error(&e, &x) => {
            return Ok(Ratios::default())
        }
        (Err(e), Some(x), _) => return Err(format!("returned {e:?}, expected {x:?}")),
        (Ok(_), Some(x), _) => {
            return Err(format!("returned a gradient for bad input, expected {x:?}"))
        }
        (Err(e), None, _) => return Err(format!("returned {e:?} on valid, supported input")),
        (Ok(g), None, _) => g,
    };
    let cot_used = CotangentData {
        grad_log_probs: cv.grad_log_probs.map(|g| g.to_owned()),
        grad_entropy: cv.grad_entropy.map(|g| g.to_owned()),
        grad_topk_log_probs: cv.grad_topk_log_probs.map(|g| g.to_owned()),
    };
    let key = format!(
        "{vjp_key} asked={:?}/{:?}",
        a.problem.options.entropy,
        a.problem.topk_ids.is_some()
    );
    let mut asked_data = data.clone();
    asked_data.options = a.problem.options;
    asked_data.topk_ids = a.problem.topk_ids.map(|k| k.to_owned());
    let vjp = oracle_vjp(&key, &asked_data, &cot_used);
    let exact = match vjp.as_ref() {
        Ok(x) => x,
        Err(e) => {
            return Err(format!(
                "oracle VJP refused a problem the kernel accepted: {e}"
            ))
        }
    };
    let ratios = judge_values(
        kernel,
        &a.problem,
        &cv,
        oracle,
        &std::iter::once((Output::GradLogits, exact)).collect(),
        &std::iter::once((Output::GradLogits, &grad)).collect(),
        out,
    )?;
    Ok(if record { ratios } else { Ratios::default() })
}

// ---------------------------------------------------------------------------
// Chunk-size and row-slicing invariance (bit for bit, no oracle).

/// Bitwise equality of two forward results (NaN payloads compared as bits).
pub fn forward_bits_eq(a: &ForwardOutput, b: &ForwardOutput) -> bool {
    a.dtype == b.dtype
        && Output::ALL
            .iter()
            .all(|&o| match (a.values.get(o), b.values.get(o)) {
                (None, None) => true,
                (Some(x), Some(y)) => grad_bits_eq(x, y),
                _ => false,
            })
}

/// Bitwise equality of two gradients.
pub fn grad_bits_eq(a: &Array2<f64>, b: &Array2<f64>) -> bool {
    a.dim() == b.dim() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn result_eq<T>(
    a: &Result<T, KernelError>,
    b: &Result<T, KernelError>,
    eq: impl Fn(&T, &T) -> bool,
) -> bool {
    match (a, b) {
        (Ok(x), Ok(y)) => eq(x, y),
        (Err(KernelError::Spec(x)), Err(KernelError::Spec(y))) => same_error(x, y),
        (Err(x), Err(y)) => x == y,
        _ => false,
    }
}

/// First differing position of two forward results, for reports.
fn first_forward_diff(a: &ForwardOutput, b: &ForwardOutput) -> String {
    for (o, x) in a.values.iter() {
        let Some(y) = b.values.get(o) else {
            return format!("{o} present in one result only");
        };
        if x.dim() != y.dim() {
            return format!("{o}: shapes {:?} vs {:?}", x.dim(), y.dim());
        }
        for ((row, col), p) in x.indexed_iter() {
            let q = y[[row, col]];
            if p.to_bits() != q.to_bits() {
                return format!("{}: {p:e} vs {q:e}", o.element(row, col));
            }
        }
    }
    "outputs or dtypes differ".into()
}

/// Row-slicing invariance: the forward (and backward, when supported) of
/// rows `[0, cut)` and `[cut, N)` computed separately equal the rows of one
/// call bit for bit (each row's reduction order depends on `V` alone).
pub fn check_row_slicing(
    kernel: &dyn Kernel,
    data: &ProblemData,
    cot: &CotangentData,
    cut: usize,
) -> Result<(), String> {
    let caps = kernel.capabilities();
    let a = asked(&data.problem(), &caps);
    let p = a.problem;
    let n = data.n();
    let cut = cut.min(n);
    let whole = kernel.forward(&p, Dtype::F32);
    let part = |r: std::ops::Range<usize>| {
        let mut q = p;
        q.logits = p.logits.slice_rows(r.clone());
        q.tokens = p.tokens.map(|t| t.slice_move(s![r.clone()]));
        q.sampling_mask = p.sampling_mask.map(|m| m.slice_move(s![r.clone(), ..]));
        q.topk_ids = p.topk_ids.map(|k| k.slice_move(s![r.clone(), ..]));
        q
    };
    let (top, bottom) = (part(0..cut), part(cut..n));
    if let Ok(w) = &whole {
        let (t, b) = (
            kernel.forward(&top, Dtype::F32),
            kernel.forward(&bottom, Dtype::F32),
        );
        let (Ok(t), Ok(b)) = (t, b) else {
            return Err("a row slice of a valid problem failed".into());
        };
        let joined = ForwardOutput {
            dtype: w.dtype,
            values: t
                .values
                .iter()
                .filter_map(|(o, x)| {
                    let y = b.values.get(o)?;
                    let cat = ndarray::concatenate(Axis(0), &[x.view(), y.view()]).ok()?;
                    Some((o, cat))
                })
                .collect(),
        };
        if !forward_bits_eq(w, &joined) {
            return Err(format!(
                "rows [0, {cut}) and [{cut}, {n}) computed apart differ: {}",
                first_forward_diff(w, &joined)
            ));
        }
    }
    if caps.backward && !cot.is_empty() {
        let cv = cot_for(data, &p, cot);
        if let Ok(w) = kernel.backward(&p, &cv, Dtype::F32) {
            let cpart = |r: std::ops::Range<usize>| Cotangents {
                grad_log_probs: cv.grad_log_probs.map(|g| g.slice_move(s![r.clone()])),
                grad_entropy: cv.grad_entropy.map(|g| g.slice_move(s![r.clone()])),
                grad_topk_log_probs: cv
                    .grad_topk_log_probs
                    .map(|g| g.slice_move(s![r.clone(), ..])),
            };
            let (t, b) = (
                kernel.backward(&top, &cpart(0..cut), Dtype::F32),
                kernel.backward(&bottom, &cpart(cut..n), Dtype::F32),
            );
            let (Ok(t), Ok(b)) = (t, b) else {
                return Err("the backward of a row slice of a valid problem failed".into());
            };
            let joined = ndarray::concatenate(Axis(0), &[t.view(), b.view()]).expect("2-d concat");
            if !grad_bits_eq(&w, &joined) {
                return Err(format!(
                    "backward rows [0, {cut}) and [{cut}, {n}) computed apart differ"
                ));
            }
        }
    }
    Ok(())
}

/// Chunk-size invariance of one kernel family: the kernels `make(c)` for
/// every `c` in `chunk_sizes` give bit-identical forward and backward
/// results (or the same error) as `make(chunk_sizes[0])`.
pub fn check_chunk_sizes(
    make: &dyn Fn(usize) -> Box<dyn Kernel>,
    data: &ProblemData,
    cot: &CotangentData,
    chunk_sizes: &[usize],
) -> Result<(), String> {
    let base = make(chunk_sizes[0]);
    let caps = base.capabilities();
    let a = asked(&data.problem(), &caps);
    let p = a.problem;
    let cv = cot_for(data, &p, cot);
    let f0 = base.forward(&p, Dtype::F32);
    let b0 = caps.backward.then(|| base.backward(&p, &cv, Dtype::F32));
    for &c in &chunk_sizes[1..] {
        let k = make(c);
        let f = k.forward(&p, Dtype::F32);
        if !result_eq(&f0, &f, forward_bits_eq) {
            let what = match (&f0, &f) {
                (Ok(x), Ok(y)) => first_forward_diff(x, y),
                _ => format!("{:?} vs {:?}", f0.as_ref().err(), f.as_ref().err()),
            };
            return Err(format!(
                "forward with chunk_size {} and {c} differ: {what}",
                chunk_sizes[0]
            ));
        }
        if let Some(b0) = &b0 {
            let b = k.backward(&p, &cv, Dtype::F32);
            if !result_eq(b0, &b, grad_bits_eq) {
                return Err(format!(
                    "backward with chunk_size {} and {c} differ",
                    chunk_sizes[0]
                ));
            }
        }
    }
    Ok(())
}
