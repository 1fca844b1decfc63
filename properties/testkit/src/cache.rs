//! Oracle results cached per recipe, shared by every kernel under test.
//!
//! The oracle costs about 1 us per vocabulary entry (docs/design.md, "The oracle"),
//! far more than any kernel, so each problem is sent to it once: the forward
//! results (target f64, so one enclosure judges outputs of every dtype), the
//! row statistics and contexts the tolerance model needs, and the VJP per
//! cotangent set. Entries are keyed by a caller-chosen string (a recipe's
//! `Debug` text) and held behind `Arc`s; the cache is cleared when it holds
//! more than [`CACHE_ENTRIES`] vocabulary entries, so memory stays bounded
//! (row statistics take about 64 bytes per vocabulary entry). Each case
//! also keeps the tolerance bounds of its rows per error model
//! ([`OracleCase::row_bounds`]): kernels that declare the same algorithm
//! (CPU fused and chunked at every chunk size; the host-built CUDA fused
//! and chunked) are judged against bounds built once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ndarray::Array2;

use logprobe_reference::oracle::{Exact, Oracle, OracleForward, RowStats};
use logprobe_reference::spec::{Cotangents, Dtype, Problem, SpecError};

use crate::strategies::ProblemData;
use logprobe_verify::tolerance::{DetachedBounds, Model, RowBounds, RowContext};

/// Vocabulary entries (rows times columns, summed over cached problems)
/// past which the cache is cleared: 4 Mi entries, about 256 MiB of row
/// statistics.
pub const CACHE_ENTRIES: usize = 1 << 22;

/// The oracle's view of one problem: forward results in f64 and, for valid
/// problems, per-row statistics and tolerance contexts.
#[derive(Debug)]
pub struct OracleCase {
    /// Forward results (target f64), or the spec error the problem must give.
    pub forward: Result<OracleForward, SpecError>,
    /// Row statistics `[N]` (empty when `forward` is an error).
    pub stats: Vec<RowStats>,
    /// Tolerance contexts `[N]` (empty when `forward` is an error).
    pub contexts: Vec<RowContext>,
    /// Row bounds built so far, per model: `[N]` slots each.
    bounds: Mutex<Vec<ModelBounds>>,
}

/// One model's row bounds: `[N]` slots, filled on first use.
type ModelBounds = (Model, Vec<Option<Arc<DetachedBounds>>>);

impl OracleCase {
    /// Runs the oracle on `data`: forward in f64, then the statistics and
    /// context of every row.
    pub fn compute(data: &ProblemData) -> OracleCase {
        OracleCase::of(&data.problem())
    }

    /// As [`OracleCase::compute`] for a borrowed problem.
    pub fn of(problem: &Problem<'_>) -> OracleCase {
        let (n, _) = problem.logits.dim();
        let oracle = Oracle::default();
        let forward = oracle.forward(problem, Dtype::F64);
        let (mut stats, mut contexts) = (Vec::new(), Vec::new());
        let forward = forward.and_then(|f| {
            for row in 0..n {
                stats.push(oracle.row_stats(problem, row)?);
                contexts.push(RowContext::from_problem(problem, row)?);
            }
            Ok(f)
        });
        if forward.is_err() {
            stats.clear();
            contexts.clear();
        }
        OracleCase {
            forward,
            stats,
            contexts,
            bounds: Mutex::new(Vec::new()),
        }
    }

    /// The tolerance bounds of row `row` under `model`
    /// ([`Model::row_bounds`] over this case's statistics and context):
    /// built once per model and row (O(V)), then shared by every kernel
    /// judged under the same model; the same bounds, bit for bit, as
    /// building them again. `None` when the case has no statistics for
    /// `row` (the oracle refused the problem, or `row >= N`).
    pub fn row_bounds(&self, model: &Model, row: usize) -> Option<RowBounds<'_>> {
        let (stats, ctx) = (self.stats.get(row)?, self.contexts.get(row)?);
        let cached = {
            let b = self.bounds.lock().unwrap_or_else(|e| e.into_inner());
            b.iter()
                .find(|(m, _)| m == model)
                .and_then(|(_, rows)| rows[row].clone())
        };
        if let Some(rb) = cached.and_then(|d| d.attach(stats)) {
            return Some(rb);
        }
        // Built outside the lock; a race builds twice, and keeps one.
        let rb = model.row_bounds(stats, ctx);
        let mut b = self.bounds.lock().unwrap_or_else(|e| e.into_inner());
        let i = match b.iter().position(|(m, _)| m == model) {
            Some(i) => i,
            None => {
                b.push((*model, vec![None; self.stats.len()]));
                b.len() - 1
            }
        };
        b[i].1[row] = Some(Arc::new(rb.clone().detach()));
        Some(rb)
    }
}

/// The exact VJP of one problem and cotangent set, in f64.
pub type OracleVjp = Result<Array2<Exact>, SpecError>;

struct Store {
    forward: HashMap<String, Arc<OracleCase>>,
    vjp: HashMap<String, Arc<OracleVjp>>,
    entries: usize,
}

fn store() -> &'static Mutex<Store> {
    static STORE: OnceLock<Mutex<Store>> = OnceLock::new();
    STORE.get_or_init(|| {
        Mutex::new(Store {
            forward: HashMap::new(),
            vjp: HashMap::new(),
            entries: 0,
        })
    })
}

fn charge(s: &mut Store, entries: usize) {
    if s.entries + entries > CACHE_ENTRIES {
        s.forward.clear();
        s.vjp.clear();
        s.entries = 0;
    }
    s.entries += entries;
}

fn entries_of(data: &ProblemData) -> usize {
    data.n() * data.v_total()
}

/// The oracle's forward results for `data`, computed once per `key` (the
/// lock is not held while the oracle runs).
pub fn oracle_case(key: &str, data: &ProblemData) -> Arc<OracleCase> {
    if let Some(c) = store()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .forward
        .get(key)
    {
        return Arc::clone(c);
    }
    let c = Arc::new(OracleCase::compute(data));
    let mut s = store().lock().unwrap_or_else(|e| e.into_inner());
    charge(&mut s, entries_of(data));
    s.forward.insert(key.to_owned(), Arc::clone(&c));
    c
}

/// The oracle's VJP of `problem` for `cotangents` (target f64), computed
/// once per `key` (which must identify both the problem and the
/// cotangents).
pub fn oracle_vjp(key: &str, problem: &Problem<'_>, cotangents: &Cotangents<'_>) -> Arc<OracleVjp> {
    if let Some(c) = store()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .vjp
        .get(key)
    {
        return Arc::clone(c);
    }
    let c = Arc::new(Oracle::default().vjp(problem, cotangents, Dtype::F64));
    let (n, v_total) = problem.logits.dim();
    let mut s = store().lock().unwrap_or_else(|e| e.into_inner());
    charge(&mut s, n * v_total / 4);
    s.vjp.insert(key.to_owned(), Arc::clone(&c));
    c
}
