//! The property checks: each takes a generated case and a list of kernels,
//! runs the oracle once ([`crate::cache`]) and judges every kernel against
//! it, returning one [`KernelOutcome`] per kernel. The `cargo test` gate
//! ([`gate`]) and the mutant survey ([`survey`]) run the same checks.
//!
//! The properties are 1-7 of docs/design.md, "The properties": oracle agreement within
//! the tolerance model's bound, chunk-size invariance bit for bit, gradients
//! against the oracle's VJP, bf16/f16 inputs and outputs, vocab-parallel
//! shardings against the oracle, and edges / bad input / unchanged inputs.
//! (Memory, property 5, lives in its own test binary: `tests/memory.rs`.)

use std::fmt;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, RngSeed, TestCaseError, TestRng, TestRunner,
};

use logprobe_reference::spec::{Output, PerOutput};

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

/// The failure text of a value outside its bound: where (`at`), the
/// candidate `c`, the exact enclosure `x`, the error (absolute, and in ulps
/// of `out`) and the bound with its verdict.
fn out_of_bound(
    at: impl fmt::Display,
    x: &logprobe_reference::oracle::Exact,
    c: f64,
    out: logprobe_reference::spec::Dtype,
    j: &logprobe_verify::tolerance::Judgement,
) -> String {
    format!(
        "{at}: candidate {c:e}, exact [{:e}, {:e}], error {:e} ({:.1} ulp {out}), bound {} ({})",
        x.enclosure.lo,
        x.enclosure.hi,
        j.error_abs,
        j.error_ulps,
        j.bound,
        j.verdict()
    )
}

fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut b = [0u8; 32];
    for (i, c) in b.chunks_mut(8).enumerate() {
        c.copy_from_slice(&(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
    }
    b
}

mod asked;
mod invariance;
mod judge;
mod loss;

pub use asked::*;
pub use invariance::*;
pub use judge::*;
pub use loss::*;
