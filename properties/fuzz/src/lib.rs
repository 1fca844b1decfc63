//! `logprobe fuzz`: a time-budgeted search of kernels over the gate's
//! recipe space (`docs/fuzz.md`).
//!
//! Case `i` of a run with `--seed S` is the value tree the case strategy
//! ([`case::Space::strategy`]) draws from the RNG `(S, i)`; every target
//! still clean judges it ([`judge::judge`]: the gate's checks). The first
//! failure of a target is shrunk through the tree's `simplify` /
//! `complicate` within `--shrink-budget` ([`shrink`]); a mutant's shrink
//! steps are kept only where its correct twin passes. The shrunk case is
//! written as a verify dump ([`counterexample`]) and printed as a recipe.
//!
//! Modules: [`grammar`] (the options grammar), [`case`] (cases, space,
//! strategy), [`target`] (`--kernel` names), [`judge`](mod@judge), [`counterexample`],
//! [`files`] (finding files: atomic, never overwritten), [`progress`], [`stderr`], and
//! [`exec`] (`--exec`: an external kernel through the fuzz
//! protocol).
#![warn(missing_docs)]

pub mod case;
pub mod counterexample;
pub mod exec;
pub mod files;
pub mod grammar;
pub mod judge;
pub mod linear;
pub mod progress;
pub mod stderr;
pub mod target;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config, TestRunner};

use logprobe_testkit::strategies::runner_rng;

use case::{FuzzCase, Space};
use judge::{judge, Finding};
use target::Target;

/// Settings of a fuzz run.
pub struct FuzzConfig {
    /// The targets.
    pub targets: Vec<Target>,
    /// The search space.
    pub space: Space,
    /// Seed of the case stream.
    pub seed: u64,
    /// Time limit of the search (shrinking excluded).
    pub budget: Duration,
    /// Case limit (whichever of the two comes first).
    pub cases: Option<u64>,
    /// Time limit of each shrink.
    pub shrink_budget: Duration,
    /// Where counterexample dumps go.
    pub out_dir: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
}

/// A case that prints as a recipe: the `--options` text that pins it.
pub trait CaseText {
    /// The recipe.
    fn recipe_text(&self) -> String;
}

impl CaseText for FuzzCase {
    fn recipe_text(&self) -> String {
        self.recipe()
    }
}

/// A target's shrunk finding (`C`: the case type, [`FuzzCase`] or
/// [`linear::LinearCase`]).
#[derive(Clone, Debug)]
pub struct Found<C = FuzzCase> {
    /// The finding on the shrunk case.
    pub finding: Finding,
    /// The shrunk case.
    pub case: C,
    /// Index of the case it was found on.
    pub case_index: u64,
    /// Seconds from the start of the run to the failing case's verdict.
    pub time_to_find: f64,
    /// Accepted shrink steps, and seconds spent shrinking.
    pub shrink_steps: usize,
    /// Seconds spent shrinking.
    pub shrink_secs: f64,
    /// The dump, and what `logprobe verify` says of it.
    pub dump: Result<(PathBuf, String), String>,
    /// For a mutant: whether its correct twin passes the shrunk case.
    pub twin_passes: Option<bool>,
}

/// One target's outcome.
#[derive(Clone, Debug)]
pub struct TargetReport<C = FuzzCase> {
    /// The `--kernel` name.
    pub name: String,
    /// Cases judged.
    pub cases: u64,
    /// Worst `error / bound` over the passing cases.
    pub worst: f64,
    /// The finding, if any.
    pub found: Option<Found<C>>,
    /// Cases not judged (verify's `no bound`, or an external kernel's
    /// `unchecked`): not a pass.
    pub unbounded: u64,
}

/// A run's outcome.
#[derive(Clone, Debug)]
pub struct FuzzReport<C = FuzzCase> {
    /// The seed.
    pub seed: u64,
    /// Cases drawn.
    pub cases: u64,
    /// Seconds of search.
    pub seconds: f64,
    /// Per target.
    pub targets: Vec<TargetReport<C>>,
}

impl<C> FuzzReport<C> {
    /// 0 when no target failed, 1 otherwise.
    pub fn exit_status(&self) -> u8 {
        u8::from(self.targets.iter().any(|t| t.found.is_some()))
    }
}

/// The RNG stream base of the logits cases ([`tree_at`]).
pub const CASE_STREAM: u64 = 0xF022_0000;

/// The value tree of case `index` of the run seeded `seed`.
pub fn case_tree(
    strategy: &BoxedStrategy<FuzzCase>,
    seed: u64,
    index: u64,
) -> Box<dyn ValueTree<Value = FuzzCase>> {
    tree_at(strategy, seed, CASE_STREAM, index)
}

/// Whether `case` fails on `target` (and, for a mutant, passes on its twin).
fn fails(target: &Target, case: &FuzzCase) -> Option<Finding> {
    let f = judge(target, case).err()?;
    match &target.twin {
        Some(t) if judge(t, case).is_err() => None,
        _ => Some(f),
    }
}

/// Shrinks a failing tree within `budget`: proptest's loop (`simplify`
/// after a failure, `complicate` after a pass). Returns the smallest
/// failing case, its finding and the accepted steps.
pub fn shrink(
    target: &Target,
    tree: &mut dyn ValueTree<Value = FuzzCase>,
    finding: Finding,
    budget: Duration,
) -> (FuzzCase, Finding, usize) {
    shrink_by(|c| fails(target, c), tree, finding, budget)
}

/// [`shrink`] for any case type, with `fails` saying whether a case still
/// fails (and how).
pub fn shrink_by<C: std::fmt::Debug>(
    fails: impl Fn(&C) -> Option<Finding>,
    tree: &mut dyn ValueTree<Value = C>,
    finding: Finding,
    budget: Duration,
) -> (C, Finding, usize) {
    let deadline = Instant::now() + budget;
    let mut best = (tree.current(), finding, 0usize);
    if !tree.simplify() {
        return best;
    }
    while Instant::now() < deadline {
        let c = tree.current();
        match fails(&c) {
            Some(f) => {
                best = (c, f, best.2 + 1);
                if !tree.simplify() {
                    break;
                }
            }
            None => {
                if !tree.complicate() {
                    break;
                }
            }
        }
    }
    best
}

/// What judging one case on one target gave, short of a finding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outcome {
    /// Every check passed: the worst `error / bound`.
    Pass(f64),
    /// Not judged (verify's `no bound`, nothing checked): not a pass.
    NotJudged,
}

/// The value tree of case `index` of a run seeded `seed`, drawn from the
/// RNG stream `stream + index` (each case family has its own streams).
pub fn tree_at<C: std::fmt::Debug>(
    strategy: &BoxedStrategy<C>,
    seed: u64,
    stream: u64,
    index: u64,
) -> Box<dyn ValueTree<Value = C>> {
    let mut runner = TestRunner::new_with_rng(Config::default(), runner_rng(seed, stream + index));
    // The strategies have no filters: drawing a tree cannot be rejected.
    strategy
        .new_tree(&mut runner)
        .expect("the fuzz strategies never reject")
}

/// A search's settings, whatever its case type.
pub struct Search<'a, C> {
    /// The strategy of cases.
    pub strategy: &'a BoxedStrategy<C>,
    /// The case stream's RNG stream base ([`tree_at`]).
    pub stream: u64,
    /// Seed of the case stream.
    pub seed: u64,
    /// Time limit of the search (shrinking excluded).
    pub budget: Duration,
    /// Case limit.
    pub cases: Option<u64>,
    /// Time limit of each shrink.
    pub shrink_budget: Duration,
    /// Show progress on stderr.
    pub progress: bool,
}

/// How a search judges its targets (see [`search`]).
pub trait Judge<C> {
    /// A target's `--kernel` name.
    fn name(&self) -> String;
    /// Judges one case.
    ///
    /// # Errors
    /// The first [`Finding`].
    fn judge(&self, case: &C) -> Result<Outcome, Finding>;
    /// For a mutant: whether its correct twin passes `case` (`None`: no twin).
    fn twin_passes(&self, case: &C) -> Option<bool>;
    /// Writes a finding's dump and says what `logprobe verify` makes of it.
    ///
    /// # Errors
    /// As text.
    fn write(&self, case: &C, finding: &Finding, seed: u64) -> Result<(PathBuf, String), String>;
}

/// The search loop shared by every case family: case `i` is the value tree
/// of `(seed, stream + i)`, judged on every target still clean; a target's
/// first failure is shrunk ([`shrink_by`], a mutant's steps kept only where
/// its twin passes) and written as a dump.
pub fn search<C: Clone + std::fmt::Debug, T: Judge<C>>(
    s: &Search<'_, C>,
    targets: &[T],
) -> FuzzReport<C> {
    let start = Instant::now();
    let mut reports: Vec<TargetReport<C>> = targets
        .iter()
        .map(|t| TargetReport {
            name: t.name(),
            cases: 0,
            worst: 0.0,
            found: None,
            unbounded: 0,
        })
        .collect();
    let mut progress = progress::Progress::new(s.progress, s.cases);
    let mut index = 0u64;
    while start.elapsed() < s.budget
        && s.cases.is_none_or(|n| index < n)
        && reports.iter().any(|r| r.found.is_none())
    {
        let case = tree_at(s.strategy, s.seed, s.stream, index).current();
        for (t, rep) in targets.iter().zip(reports.iter_mut()) {
            if rep.found.is_some() {
                continue;
            }
            rep.cases += 1;
            match t.judge(&case) {
                Ok(Outcome::Pass(w)) => rep.worst = rep.worst.max(w),
                Ok(Outcome::NotJudged) => rep.unbounded += 1,
                Err(f) => {
                    let time_to_find = start.elapsed().as_secs_f64();
                    progress.println(&format!(
                        "{}: {} failed on case {index} after {time_to_find:.1} s; shrinking (at most {} s)",
                        rep.name,
                        f.property,
                        s.shrink_budget.as_secs()
                    ));
                    let s0 = Instant::now();
                    let mut tree = tree_at(s.strategy, s.seed, s.stream, index);
                    let fails = |c: &C| {
                        let f = t.judge(c).err()?;
                        (t.twin_passes(c) != Some(false)).then_some(f)
                    };
                    let (case, finding, steps) =
                        shrink_by(fails, tree.as_mut(), f, s.shrink_budget);
                    let shrink_secs = s0.elapsed().as_secs_f64();
                    let twin_passes = t.twin_passes(&case);
                    let dump = t.write(&case, &finding, s.seed);
                    rep.found = Some(Found {
                        finding,
                        case,
                        case_index: index,
                        time_to_find,
                        shrink_steps: steps,
                        shrink_secs,
                        dump,
                        twin_passes,
                    });
                }
            }
        }
        index += 1;
        progress.update(index, &reports, start.elapsed());
    }
    progress.finish();
    FuzzReport {
        seed: s.seed,
        cases: index,
        seconds: start.elapsed().as_secs_f64(),
        targets: reports,
    }
}

/// A logits target of [`run`], with the dumps' directory.
struct LogitsJudge<'a> {
    target: &'a Target,
    out_dir: &'a Path,
}

impl Judge<FuzzCase> for LogitsJudge<'_> {
    fn name(&self) -> String {
        self.target.name.clone()
    }

    fn judge(&self, case: &FuzzCase) -> Result<Outcome, Finding> {
        judge(self.target, case).map(Outcome::Pass)
    }

    fn twin_passes(&self, case: &FuzzCase) -> Option<bool> {
        self.target.twin.as_ref().map(|t| judge(t, case).is_ok())
    }

    fn write(
        &self,
        case: &FuzzCase,
        finding: &Finding,
        seed: u64,
    ) -> Result<(PathBuf, String), String> {
        counterexample::write(self.out_dir, self.target, case, finding, seed)
    }
}

/// Runs the search (see the module docs).
pub fn run(config: &FuzzConfig) -> FuzzReport {
    let strategy = config.space.strategy();
    let judges: Vec<LogitsJudge<'_>> = config
        .targets
        .iter()
        .map(|target| LogitsJudge {
            target,
            out_dir: &config.out_dir,
        })
        .collect();
    search(
        &Search {
            strategy: &strategy,
            stream: CASE_STREAM,
            seed: config.seed,
            budget: config.budget,
            cases: config.cases,
            shrink_budget: config.shrink_budget,
            progress: config.progress,
        },
        &judges,
    )
}

/// The longest line of a finding's detail in a report, in characters.
pub const DETAIL_LINE_CAP: usize = 200;

/// The first `max_lines` lines of a finding's `detail`, each cut at
/// [`DETAIL_LINE_CAP`] characters with an explicit `…(N more chars)`,
/// joined by `sep` (a newline and the report's indent).
pub fn detail_text(detail: &str, max_lines: usize, sep: &str) -> String {
    detail
        .lines()
        .take(max_lines)
        .map(|l| {
            let n = l.chars().count();
            if n <= DETAIL_LINE_CAP {
                l.to_string()
            } else {
                let keep: String = l.chars().take(DETAIL_LINE_CAP).collect();
                format!("{keep}…({} more chars)", n - DETAIL_LINE_CAP)
            }
        })
        .collect::<Vec<_>>()
        .join(sep)
}

/// The report of one finding: property, detail, recipe, seed and dump.
pub fn render_found<C: CaseText>(name: &str, seed: u64, f: &Found<C>) -> String {
    let mut s = format!(
        "FOUND {name}: {} (case {} of seed {seed}, time to find {:.1} s; shrunk in {} steps, {:.1} s)\n",
        f.finding.property, f.case_index, f.time_to_find, f.shrink_steps, f.shrink_secs
    );
    s.push_str(&format!(
        "  detail: {}\n",
        detail_text(&f.finding.detail, 4, "\n          ")
    ));
    s.push_str(&format!("  recipe: {}\n", f.case.recipe_text()));
    s.push_str(&format!("  seed:   {seed}\n"));
    if let Some(tp) = f.twin_passes {
        s.push_str(&format!(
            "  correct twin on this case: {}\n",
            if tp {
                "passes"
            } else {
                "FAILS too (a fault of the kernel or the judge)"
            }
        ));
    }
    match &f.dump {
        Ok((path, verdict)) => {
            let quoted = files::shell_word(&path.to_string_lossy());
            s.push_str(&format!("  dump:   {}\n", path.display()));
            s.push_str(&format!("  logprobe verify {quoted}: {verdict}"));
            if matches!(
                f.finding.call,
                judge::Call::Invariance | judge::Call::Memory
            ) {
                s.push_str(
                    " (verify judges outputs one file at a time; this property needs --replay)",
                );
            }
            s.push('\n');
            s.push_str(&format!("  rerun:  logprobe fuzz --replay {quoted}\n"));
        }
        Err(e) => s.push_str(&format!("  dump not written: {e}\n")),
    }
    s
}

/// The summary table of a run.
pub fn render_summary<C>(r: &FuzzReport<C>) -> String {
    let mut s = format!(
        "\nfuzz: {} cases in {:.1} s (seed {})\n\n{:<34} {:>7} {:>10} {:>10}  {}\n",
        r.cases, r.seconds, r.seed, "kernel", "cases", "worst r", "found at", "result"
    );
    for t in &r.targets {
        let (at, mut result) = match &t.found {
            None => ("-".to_string(), "clean".to_string()),
            Some(f) => (
                format!("{:.1} s", f.time_to_find),
                format!("FOUND {}", f.finding.property),
            ),
        };
        if t.unbounded > 0 {
            result.push_str(&format!(
                " ({} cases not judged: no bound or nothing checked)",
                t.unbounded
            ));
        }
        s.push_str(&format!(
            "{:<34} {:>7} {:>10.3} {:>10}  {}\n",
            t.name, t.cases, t.worst, at, result
        ));
    }
    s
}

/// Reruns the case of a fuzz dump on the kernel it names: `Ok(None)` when
/// it passes now, `Ok(Some(finding))` when it still fails.
///
/// # Errors
/// A file that is not a fuzz dump, an unknown kernel, a bad recipe.
pub fn replay(path: &Path) -> Result<(String, FuzzCase, Option<Finding>), String> {
    let (kernel, recipe, _, _) = counterexample::read_meta(path)?;
    let t = target::parse_target(&kernel).map_err(|e| e.to_string())?;
    let case = FuzzCase::parse(&recipe).map_err(|e| format!("{}: {e}", path.display()))?;
    let f = judge(&t, &case).err();
    Ok((kernel, case, f))
}

#[cfg(test)]
mod tests {
    use super::{detail_text, DETAIL_LINE_CAP};

    #[test]
    fn detail_lines_are_capped_with_an_explicit_marker() {
        let long = "x".repeat(DETAIL_LINE_CAP + 736);
        let d = format!("short line\n{long}\nthird\nfourth");
        let t = detail_text(&d, 3, "\n  ");
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "short line");
        assert_eq!(
            lines[1],
            format!("  {}…(736 more chars)", "x".repeat(DETAIL_LINE_CAP))
        );
        assert_eq!(lines[2], "  third");
        // Characters, not bytes: a multi-byte line at the cap is kept whole.
        let wide = "é".repeat(DETAIL_LINE_CAP);
        assert_eq!(detail_text(&wide, 1, ""), wide);
    }
}
