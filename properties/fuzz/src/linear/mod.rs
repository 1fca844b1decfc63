//! `logprobe fuzz` on fused linear + cross-entropy kernels (issue 45): the
//! kernels that take `hidden [N, H]` and `lm_head_weight [V, H]` and never
//! hold the `[N, V]` logits.
//!
//! Targets ([`LINEAR_KERNELS`], [`LINEAR_MUTANTS`]): `fused-linear` (our
//! CPU kernel, `logprobe_kernels::linear::FusedLinear`), `fused-linear-tp`
//! (the same over vocabulary shards of `W`, Megatron's layout:
//! `ShardedLinear`), and the planted faults of the LM head's gradients and
//! of the shard offset as `mutant:linear-*`, each with its correct twin.
//!
//! Judging a case ([`judge_linear`]):
//! 1. the kernel's forward (log-probs, entropy, lse) and backward for
//!    `grad_log_probs` (`grad_hidden`, `grad_lm_head_weight`,
//!    `grad_lm_head_bias`) as a dump, judged by verify under `sequential`
//!    (TOLERANCE.md (T29), (T30)); a `no bound` verdict is counted, not
//!    judged;
//! 2. row chunking: with one block of all `N` rows, the forward and
//!    `grad_hidden` are bit-identical;
//! 3. vocabulary chunking: with one block of all `V` columns (per shard),
//!    every output is bit-identical;
//! 4. shard splits of `W` (the TP target, the case's `shards`): the same
//!    problem over uneven contiguous row blocks of `W` is judged by 1.
//!    Its all-reduces sum in rank order, so no bit-for-bit relation holds
//!    against one rank; the oracle is the check.
//!
//! Findings are shrunk like the logits cases' and written as verify dumps
//! with the printed recipe (`fuzz_recipe`), which `--replay` reruns.

mod case;
pub mod exec;

pub use case::{LinearCase, LinearSpace, LINEAR_KEYS};
pub use exec::{LinearExec, LINEAR_OUTPUTS};

use std::path::{Path, PathBuf};
use std::time::Duration;

use logprobe_kernels::kernel::KernelError;
use logprobe_kernels::linear::{
    FusedLinear, LinearFault, LinearForward, LinearGrads, ShardFault, ShardedLinear,
};
use logprobe_testkit::linear::{linear_dump, verify_bytes, LinearInputs};
use logprobe_verify::tolerance::Order;
use logprobe_verify::verify::{FileReport, ReportVerdict};

use crate::judge::{Call, Finding};
use crate::target::TargetError;
use crate::{search, CaseText, FuzzReport, Judge, Outcome, Search};

/// The correct fused linear kernels `--kernel` takes.
pub const LINEAR_KERNELS: [&str; 2] = ["fused-linear", "fused-linear-tp"];

/// The planted mutants (`mutant:NAME`): name, what is wrong.
pub const LINEAR_MUTANTS: [(&str, &str); 5] = [
    (
        "linear-bf16-grad-accumulation",
        "grad_lm_head_weight / grad_lm_head_bias accumulated in bf16 across row chunks",
    ),
    (
        "linear-dropped-remainder",
        "the last, partial row chunk never reaches the weight and bias gradients",
    ),
    (
        "linear-bias-forward-only",
        "the bias in the forward only: grad_lm_head_bias stays 0",
    ),
    (
        "linear-softcap-backward-missing",
        "the backward omits the softcap's factor 1 - tanh^2",
    ),
    (
        "linear-tp-target-not-shifted",
        "each vocabulary shard takes the global target id as its own column (no `- vocab_start`)",
    ),
];

impl CaseText for LinearCase {
    fn recipe_text(&self) -> String {
        self.recipe()
    }
}

/// One fused linear fuzz target.
#[derive(Clone, Debug)]
pub struct LinearTarget {
    /// The name as given to `--kernel`.
    pub name: String,
    /// Over the case's vocabulary shards (`fused-linear-tp`).
    pub sharded: bool,
    fault: LinearFault,
    shard_fault: ShardFault,
    /// The correct kernel a mutant wraps (its finding counts only where the
    /// twin passes the case).
    pub twin: Option<Box<LinearTarget>>,
    /// An external kernel (`fuzz --exec CMD --fused-linear`, fuzz protocol
    /// version 2) instead of ours.
    pub exec: Option<std::sync::Arc<LinearExec>>,
}

impl LinearTarget {
    /// An external kernel as a target.
    pub fn external(name: &str, e: LinearExec) -> LinearTarget {
        LinearTarget {
            name: name.into(),
            sharded: false,
            fault: LinearFault::None,
            shard_fault: ShardFault::None,
            twin: None,
            exec: Some(std::sync::Arc::new(e)),
        }
    }
}

/// Whether `name` is a fused linear target (a kernel or a mutant).
pub fn is_linear(name: &str) -> bool {
    LINEAR_KERNELS.contains(&name)
        || name
            .strip_prefix("mutant:")
            .is_some_and(|m| LINEAR_MUTANTS.iter().any(|(n, _)| *n == m))
}

/// Parses a fused linear `--kernel` name.
///
/// # Errors
/// [`TargetError::Unknown`] for any other name.
pub fn parse_linear_target(name: &str) -> Result<LinearTarget, TargetError> {
    let plain = |name: &str, sharded| LinearTarget {
        name: name.into(),
        sharded,
        fault: LinearFault::None,
        shard_fault: ShardFault::None,
        twin: None,
        exec: None,
    };
    match name {
        "fused-linear" => return Ok(plain(name, false)),
        "fused-linear-tp" => return Ok(plain(name, true)),
        _ => {}
    }
    let unknown = || {
        TargetError::Unknown(
            name.into(),
            LINEAR_MUTANTS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        )
    };
    let m = name.strip_prefix("mutant:").ok_or_else(unknown)?;
    let (fault, shard_fault) = match m {
        "linear-bf16-grad-accumulation" => (LinearFault::Bf16GradAccumulation, ShardFault::None),
        "linear-dropped-remainder" => (LinearFault::DroppedRemainder, ShardFault::None),
        "linear-bias-forward-only" => (LinearFault::BiasForwardOnly, ShardFault::None),
        "linear-softcap-backward-missing" => {
            (LinearFault::SoftcapBackwardMissing, ShardFault::None)
        }
        "linear-tp-target-not-shifted" => (LinearFault::None, ShardFault::TargetNotShifted),
        _ => return Err(unknown()),
    };
    let sharded = shard_fault != ShardFault::None;
    let twin = plain(
        if sharded {
            "fused-linear-tp"
        } else {
            "fused-linear"
        },
        sharded,
    );
    Ok(LinearTarget {
        name: name.into(),
        sharded,
        fault,
        shard_fault,
        twin: Some(Box::new(twin)),
        exec: None,
    })
}

/// The kernel's outputs on `x` with these chunk sizes.
fn outputs(
    t: &LinearTarget,
    c: &LinearCase,
    x: &LinearInputs,
    (row_chunk, vocab_chunk): (usize, usize),
) -> Result<(LinearForward, LinearGrads), KernelError> {
    let mut k = FusedLinear::new(row_chunk, vocab_chunk, c.recipe.logits);
    k.fault = t.fault;
    let p = x.problem();
    if t.sharded {
        let s = ShardedLinear {
            fault: t.shard_fault,
            ..ShardedLinear::new(k, c.widths())
        };
        Ok((s.forward(&p)?, s.backward(&p, &x.cot)?))
    } else {
        Ok((k.forward(&p)?, k.backward(&p, &x.cot)?))
    }
}

/// The first element that differs between two arrays, as text.
fn first_difference(name: &str, a: &[f32], b: &[f32]) -> Option<String> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .map(|i| format!("{name}[{i}]: {} against {}", a[i], b[i]))
}

/// Verify's failing outputs, each with its worst element.
fn failing(r: &FileReport) -> String {
    r.outputs
        .iter()
        .filter(|o| o.verdict == ReportVerdict::Fail)
        .map(|o| {
            let at = o.worst.first().map_or(String::new(), |j| {
                format!(
                    " at row {}{}: {} against exact {:e} (error {:.3e}, bound {})",
                    j.row,
                    j.col.map_or(String::new(), |c| format!(" col {c}")),
                    j.candidate,
                    j.exact,
                    j.error,
                    j.bound.map_or("none".into(), |b| format!("{b:.3e}"))
                )
            });
            format!(
                "{}: error / bound {}{at}",
                o.output,
                o.max_ratio.map_or("-".into(), |x| format!("{x:.3}"))
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Judges `case` on `t` (see the module docs).
///
/// # Errors
/// The first [`Finding`].
pub fn judge_linear(t: &LinearTarget, case: &LinearCase) -> Result<Outcome, Finding> {
    if let Some(e) = &t.exec {
        return e.judge(case);
    }
    let x = case.recipe.inputs();
    let fail = |property, call, detail: String| Finding {
        property,
        call,
        detail,
    };
    let chunks = (case.row_chunk, case.vocab_chunk);
    let (fwd, g) = outputs(t, case, &x, chunks)
        .map_err(|e| fail("kernel error", Call::Linear, e.to_string()))?;
    let bytes = linear_dump(&x, &fwd, Some(&g), &[])
        .map_err(|e| fail("oracle agreement", Call::Linear, e.to_string()))?;
    let r = verify_bytes(&bytes, "fused_linear", Order::Sequential)
        .map_err(|e| fail("oracle agreement", Call::Linear, format!("bad dump: {e}")))?;
    let worst = r
        .outputs
        .iter()
        .filter_map(|o| o.max_ratio)
        .fold(0.0, f64::max);
    match r.verdict {
        ReportVerdict::Fail => {
            return Err(fail("oracle agreement", Call::Linear, failing(&r)));
        }
        ReportVerdict::NoBound => return Ok(Outcome::NotJudged),
        ReportVerdict::Pass | ReportVerdict::Suspect | ReportVerdict::Unchecked => {}
    }
    let n = case.recipe.n.max(1);
    let v = case.recipe.v.max(1);
    for (what, other, all) in [
        ("row chunking", (n, case.vocab_chunk), false),
        ("vocabulary chunking", (case.row_chunk, v), true),
    ] {
        let (f2, g2) = outputs(t, case, &x, other)
            .map_err(|e| fail("kernel error", Call::Linear, e.to_string()))?;
        let mut pairs = vec![
            ("log_probs", &fwd.log_probs[..], &f2.log_probs[..]),
            ("entropy", &fwd.entropy[..], &f2.entropy[..]),
            ("lse", &fwd.lse[..], &f2.lse[..]),
            (
                "grad_hidden",
                g.grad_hidden.as_slice().unwrap_or(&[]),
                g2.grad_hidden.as_slice().unwrap_or(&[]),
            ),
        ];
        if all {
            pairs.push((
                "grad_lm_head_weight",
                g.grad_weight.as_slice().unwrap_or(&[]),
                g2.grad_weight.as_slice().unwrap_or(&[]),
            ));
            pairs.push(("grad_lm_head_bias", &g.grad_bias[..], &g2.grad_bias[..]));
        }
        for (name, a, b) in pairs {
            if let Some(d) = first_difference(name, a, b) {
                let detail = format!(
                    "{what}: chunks (rows {}, vocabulary {}) against ({}, {}): {d}",
                    chunks.0, chunks.1, other.0, other.1
                );
                return Err(fail("chunk-size invariance", Call::Invariance, detail));
            }
        }
    }
    Ok(Outcome::Pass(worst))
}

/// Settings of a fused linear fuzz run (as [`crate::FuzzConfig`]).
pub struct LinearConfig {
    /// The targets.
    pub targets: Vec<LinearTarget>,
    /// The search space.
    pub space: LinearSpace,
    /// Seed of the case stream.
    pub seed: u64,
    /// Time limit of the search (shrinking excluded).
    pub budget: Duration,
    /// Case limit.
    pub cases: Option<u64>,
    /// Time limit of each shrink.
    pub shrink_budget: Duration,
    /// Where counterexample dumps go.
    pub out_dir: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
}

/// The RNG stream base of the fused linear cases ([`crate::tree_at`]).
pub const LINEAR_STREAM: u64 = 0x11F0_0000;

/// A fused linear target of [`run_linear`], with the dumps' directory.
struct LinearJudge<'a> {
    target: &'a LinearTarget,
    out_dir: &'a Path,
}

impl Judge<LinearCase> for LinearJudge<'_> {
    fn name(&self) -> String {
        self.target.name.clone()
    }

    fn judge(&self, case: &LinearCase) -> Result<Outcome, Finding> {
        judge_linear(self.target, case)
    }

    fn twin_passes(&self, case: &LinearCase) -> Option<bool> {
        self.target
            .twin
            .as_ref()
            .map(|t| judge_linear(t, case).is_ok())
    }

    fn write(
        &self,
        case: &LinearCase,
        finding: &Finding,
        seed: u64,
    ) -> Result<(PathBuf, String), String> {
        write_linear(self.out_dir, self.target, case, finding, seed)
    }
}

/// Runs the search ([`crate::search`] over the fused linear space): case
/// `i` is drawn from the RNG `(seed, LINEAR_STREAM + i)`, judged on every
/// target still clean; a target's first finding is shrunk and written as a
/// dump.
pub fn run_linear(config: &LinearConfig) -> FuzzReport<LinearCase> {
    let strategy = config.space.strategy();
    let judges: Vec<LinearJudge<'_>> = config
        .targets
        .iter()
        .map(|target| LinearJudge {
            target,
            out_dir: &config.out_dir,
        })
        .collect();
    search(
        &Search {
            strategy: &strategy,
            stream: LINEAR_STREAM,
            seed: config.seed,
            budget: config.budget,
            cases: config.cases,
            shrink_budget: config.shrink_budget,
            progress: config.progress,
        },
        &judges,
    )
}

/// Writes the finding's dump into `dir` (the kernel's outputs on the case,
/// with `fuzz_recipe`, `fuzz_kernel`, `fuzz_property`, `fuzz_seed`) and
/// returns its path with what `logprobe verify` says of it.
///
/// # Errors
/// The kernel failing on the case, or an I/O or serialisation error, as text.
pub fn write_linear(
    dir: &Path,
    t: &LinearTarget,
    case: &LinearCase,
    finding: &Finding,
    seed: u64,
) -> Result<(PathBuf, String), String> {
    let (recipe, seed) = (case.recipe(), seed.to_string());
    let mut extra = vec![
        ("fuzz_recipe", recipe.as_str()),
        ("fuzz_kernel", t.name.as_str()),
        ("fuzz_property", finding.property),
        ("fuzz_seed", seed.as_str()),
    ];
    let (bytes, model) = match &t.exec {
        Some(e) => {
            extra.push(("fuzz_exec", e.runner.transport.command()));
            (e.call(case, &extra).map_err(|f| f.detail)?, e.model)
        }
        None => {
            let x = case.recipe.inputs();
            let (fwd, g) = outputs(t, case, &x, (case.row_chunk, case.vocab_chunk))
                .map_err(|e| e.to_string())?;
            let bytes = linear_dump(&x, &fwd, Some(&g), &extra).map_err(|e| e.to_string())?;
            (bytes, Order::Sequential)
        }
    };
    let verdict = match verify_bytes(&bytes, "finding", model) {
        Ok(r) => r.verdict.to_string(),
        Err(e) => format!("bad input: {e}"),
    };
    let stem = crate::files::name_stem(&t.name);
    let files = [(format!("fuzz-{stem}-seed{seed}.safetensors"), bytes)];
    let path = crate::files::write_new(dir, &files)
        .map_err(|e| e.to_string())?
        .remove(0);
    Ok((path, verdict))
}

/// Reruns a fused linear fuzz dump's case on the kernel it names:
/// `Ok(None)` when it passes now.
///
/// # Errors
/// An unknown kernel or a bad recipe.
pub fn replay_linear(kernel: &str, recipe: &str) -> Result<(LinearCase, Option<Finding>), String> {
    let t = parse_linear_target(kernel).map_err(|e| e.to_string())?;
    let case = LinearCase::parse(recipe).map_err(|e| e.to_string())?;
    Ok((case.clone(), judge_linear(&t, &case).err()))
}

#[cfg(test)]
mod tests;
