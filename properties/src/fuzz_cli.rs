//! `logprobe fuzz` over the two families of kernels (docs/fuzz.md): the
//! logits kernels (`logprobe_fuzz::run`) and the fused linear ones, ours
//! (`logprobe_fuzz::linear::run_linear`) or external through fuzz protocol
//! version 2 (`--exec CMD --fused-linear`, docs/fuzz-protocol.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use logprobe_fuzz::exec::{Runner, Transport};
use logprobe_fuzz::linear::{
    self, LinearConfig, LinearExec, LinearSpace, LinearTarget, LINEAR_KEYS, LINEAR_OUTPUTS,
};
use logprobe_fuzz::{self as fuzz, case::Space, target::parse_targets, FuzzConfig};
use logprobe_kernels::linear::LinearLogits;
use logprobe_verify::verify::VerifyConfig;

use crate::cli::{eprint_line, Out};

/// The settings every search shares.
pub struct Run {
    /// Seed of the case stream (default: from the clock, printed).
    pub seed: Option<u64>,
    /// Time limit of the search.
    pub budget: Duration,
    /// Case limit.
    pub cases: Option<u64>,
    /// Time limit of each shrink.
    pub shrink_budget: Duration,
    /// Directory of the counterexample dumps.
    pub out_dir: PathBuf,
    /// Show progress.
    pub progress: bool,
}

impl Run {
    fn seed(&self) -> u64 {
        self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
    }
}

fn linear_space(options: &str) -> Result<LinearSpace, u8> {
    LinearSpace::parse(options).map_err(|e| {
        eprint_line(&format!(
            "logprobe: --options (fused linear keys: {}): {e}",
            LINEAR_KEYS.join(", ")
        ));
        2
    })
}

/// `fuzz --kernel LIST`: the logits kernels and the fused linear ones of
/// `kernels`, each family in its own space (`options` must suit both when
/// both are named), the budget split by their numbers of targets. Returns
/// the exit status (0 clean, 1 found, 2 bad usage).
pub fn run_kernels(kernels: &str, options: &str, run: &Run, out: &mut Out) -> u8 {
    let (lin, logits): (Vec<&str>, Vec<&str>) = kernels
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .partition(|n| linear::is_linear(n));
    let targets = if logits.is_empty() && !lin.is_empty() {
        Vec::new()
    } else {
        match parse_targets(&logits.join(",")) {
            Ok(t) => t,
            Err(e) => {
                eprint_line(&format!("logprobe: {e}"));
                return 2;
            }
        }
    };
    let linear_targets = match lin
        .iter()
        .map(|n| linear::parse_linear_target(n))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(t) => t,
        Err(e) => {
            eprint_line(&format!("logprobe: {e}"));
            return 2;
        }
    };
    let space = if targets.is_empty() {
        None
    } else {
        match Space::parse(options) {
            Ok(s) => Some(s),
            Err(e) => {
                eprint_line(&format!("logprobe: --options: {e}"));
                return 2;
            }
        }
    };
    let lspace = if linear_targets.is_empty() {
        None
    } else {
        match linear_space(options) {
            Ok(s) => Some(s),
            Err(code) => return code,
        }
    };
    let seed = run.seed();
    eprint_line(&format!(
        "fuzz: kernels {kernels}, seed {seed}, budget {:.0} s{}",
        run.budget.as_secs_f64(),
        run.cases
            .map_or(String::new(), |n| format!(", at most {n} cases"))
    ));
    let total = (targets.len() + linear_targets.len()) as f64;
    let share = |k: usize| run.budget.mul_f64(k as f64 / total);
    let mut status = 0;
    if let Some(space) = space {
        let config = FuzzConfig {
            budget: share(targets.len()),
            targets,
            space,
            seed,
            cases: run.cases,
            shrink_budget: run.shrink_budget,
            out_dir: run.out_dir.clone(),
            progress: run.progress,
        };
        let report = fuzz::run(&config);
        for t in &report.targets {
            if let Some(f) = &t.found {
                out.print(&fuzz::render_found(&t.name, report.seed, f));
            }
        }
        out.print(&fuzz::render_summary(&report));
        status = report.exit_status();
    }
    if let Some(space) = lspace {
        let config = LinearConfig {
            budget: share(linear_targets.len()),
            targets: linear_targets,
            space,
            seed,
            cases: run.cases,
            shrink_budget: run.shrink_budget,
            out_dir: run.out_dir.clone(),
            progress: run.progress,
        };
        status = status.max(print_linear(&linear::run_linear(&config), None, out));
    }
    status
}

/// Prints a fused linear run's findings and table; an external kernel's
/// findings say how to rerun them on it (`exec`).
fn print_linear(
    report: &fuzz::FuzzReport<linear::LinearCase>,
    exec: Option<&LinearExec>,
    out: &mut Out,
) -> u8 {
    for t in &report.targets {
        if let Some(f) = &t.found {
            let mut text = fuzz::render_found(&t.name, report.seed, f);
            if let (Some(e), Ok((path, _))) = (exec, &f.dump) {
                let generic = format!(
                    "  rerun:  logprobe fuzz --replay {}\n",
                    fuzz::files::shell_word(&path.to_string_lossy())
                );
                let own = format!(
                    "  rerun:  {} --fused-linear\n",
                    e.runner.transport.rerun(path)
                );
                text = text.replace(&generic, &own);
            }
            out.print(&text);
        }
    }
    out.print(&fuzz::render_summary(report));
    report.exit_status()
}

fn replay_target(path: &Path, t: &LinearTarget, recipe: &str, out: &mut Out) -> u8 {
    let case = match linear::LinearCase::parse(recipe) {
        Ok(c) => c,
        Err(e) => {
            eprint_line(&format!("logprobe: {}: {e}", path.display()));
            return 2;
        }
    };
    match linear::judge_linear(t, &case) {
        Ok(_) => {
            out.print(&format!(
                "{}: passes now\n  recipe: {}\n",
                t.name,
                case.recipe()
            ));
            0
        }
        Err(f) => {
            out.print(&format!(
                "{}: still fails {}: {}\n  recipe: {}\n",
                t.name,
                f.property,
                fuzz::detail_text(&f.detail, 4, "\n    "),
                case.recipe()
            ));
            1
        }
    }
}

/// `fuzz --replay FILE` of a fused linear finding on the kernel it names.
pub fn replay_linear(path: &Path, kernel: &str, recipe: &str, out: &mut Out) -> u8 {
    match linear::parse_linear_target(kernel) {
        Ok(t) => replay_target(path, &t, recipe, out),
        Err(e) => {
            eprint_line(&format!("logprobe: {}: {e}", path.display()));
            2
        }
    }
}

/// An external fused linear kernel (`--exec CMD --fused-linear`).
pub struct LinearExecArgs<'a> {
    /// How it is called.
    pub transport: Transport,
    /// The time limit of one call.
    pub timeout: Duration,
    /// `--outputs`: what it computes (default: all of [`LINEAR_OUTPUTS`]).
    pub outputs: Option<&'a str>,
    /// `--lm-head-logits-dtype`: where it keeps its logits.
    pub logits: LinearLogits,
    /// `--options` (with `--dtype`, `--vocab`).
    pub options: &'a str,
    /// `--replay FILE`.
    pub replay: Option<&'a Path>,
    /// `--require`: `chunk-invariant` is checked (`padding-invariant` does
    /// not apply).
    pub require: &'a str,
}

/// `fuzz --exec CMD --fused-linear` (fuzz protocol version 2). Returns the
/// exit status.
pub fn run_linear_exec(a: LinearExecArgs<'_>, run: &Run, out: &mut Out) -> u8 {
    let outputs: Vec<&'static str> = match a.outputs {
        None => LINEAR_OUTPUTS.to_vec(),
        Some(list) => {
            let mut o = Vec::new();
            for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                match LINEAR_OUTPUTS.iter().find(|x| **x == name) {
                    Some(x) => o.push(*x),
                    None => {
                        eprint_line(&format!(
                            "logprobe: --outputs: `{name}` is not an output of a fused linear kernel ({})",
                            LINEAR_OUTPUTS.join(", ")
                        ));
                        return 2;
                    }
                }
            }
            LINEAR_OUTPUTS
                .into_iter()
                .filter(|x| o.contains(x))
                .collect()
        }
    };
    let chunk_invariant = match linear::exec::chunk_required(a.require) {
        Ok(c) => c,
        Err(e) => {
            eprint_line(&format!("logprobe: {e}"));
            return 2;
        }
    };
    let name = a.transport.kind().to_string();
    let exec = LinearExec {
        chunk_invariant,
        runner: Runner::new(a.transport, a.timeout),
        outputs,
        logits: a.logits,
        model: VerifyConfig::default().model,
    };
    let target = LinearTarget::external(&name, exec);
    if let Some(path) = a.replay {
        return match fuzz::counterexample::read_meta(path) {
            Ok((_, recipe, _, _)) => replay_target(path, &target, &recipe, out),
            Err(e) => {
                eprint_line(&format!("logprobe: {e}"));
                2
            }
        };
    }
    let space = match linear_space(a.options) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let seed = run.seed();
    eprint_line(&format!(
        "fuzz: {} (fused linear, protocol 2), seed {seed}, budget {:.0} s{}, timeout {:.0} s per call",
        target
            .exec
            .as_ref()
            .map_or(String::new(), |e| e.runner.transport.flag()),
        run.budget.as_secs_f64(),
        run.cases
            .map_or(String::new(), |n| format!(", at most {n} cases")),
        a.timeout.as_secs_f64()
    ));
    let config = LinearConfig {
        targets: vec![target],
        space,
        seed,
        budget: run.budget,
        cases: run.cases,
        shrink_budget: run.shrink_budget,
        out_dir: run.out_dir.clone(),
        progress: run.progress,
    };
    let report = linear::run_linear(&config);
    let status = print_linear(&report, config.targets[0].exec.as_deref(), out);
    // Every process the runs started goes with the targets.
    drop(config);
    fuzz::exec::process::kill_orphans();
    status
}
