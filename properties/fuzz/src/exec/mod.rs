//! `logprobe fuzz --exec CMD` / `--exec-persistent CMD` and the Python
//! package's `logprobe.fuzz(fn)`: the fuzz target that is an external kernel
//! speaking the fuzz protocol, version 1
//! (`docs/fuzz-protocol.md`, types in [`logprobe_verify::protocol`]).
//!
//! Each case becomes a [`Request`](logprobe_verify::protocol::Request) (inputs only; cases the spec calls bad
//! input are not sent: protocol v1 has no error channel). The command's
//! answer is checked ([`Response::parse`](logprobe_verify::protocol::Response::parse)), joined to the request and judged
//! by the verify engine ([`verify_dump`], the foreign-kernel model), so the
//! saved counterexample is the very dump `logprobe verify` reproduces. Then
//! the metamorphic properties, each by calling the command again:
//!
//! - padding invariance: other values past `vocab_size` (`-inf`, the
//!   dtype's largest finite) leave every output bit-identical;
//! - chunk-size invariance: other `chunk_size`s give bit-identical outputs;
//! - batch invariance: a row alone, the batch doubled and a suffix of the
//!   batch give each row bit-identical outputs.
//!
//! An invariance is a property the kernel has or lacks; a lack is a finding
//! only when `--require`d (padding invariance is required by default: the
//! spec says padding changes nothing). A crash, a hang past the timeout, a
//! non-zero exit, a missing or malformed answer are findings of property
//! `command`, with the tail of the command's stderr. Shrinking calls the
//! command again and keeps a step only when the same property fails.
//!
//! Files: [`transport`] (one-shot, persistent and in-process calls, the
//! [`Runner`]), [`process`] (the adapter's processes: started, killed and
//! reaped), [`signals`] (SIGINT, SIGTERM, SIGHUP in the binary), [`target`]
//! (one case: request, judgement, variants), `render` (the report), here
//! the search, the shrink and the dumps.

pub mod process;
mod render;
pub mod signals;
pub mod target;
pub mod transport;

pub use render::render;
pub use target::{loss_side_outputs, request, Dumps, ExecFinding, ExecTarget, Judged, Lack};
pub use transport::{shell_quote, CommandFailure, InProcessKernel, Runner, Transport};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use logprobe_verify::dump::Dump;
use logprobe_verify::verify::verify_dump;

use super::case::{dump_key, FuzzCase, Space};
use super::judge::{Call, Finding};
use super::{case_tree, progress, Found, TargetReport};

/// A metamorphic property of an external kernel (`--require` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariance {
    /// Values past `vocab_size` change nothing.
    Padding,
    /// `chunk_size` changes no bit.
    Chunk,
    /// A row's outputs do not depend on the rest of its batch.
    Batch,
}

impl Invariance {
    /// Every invariance, in checking order.
    pub const ALL: [Invariance; 3] = [Invariance::Padding, Invariance::Chunk, Invariance::Batch];

    /// The `--require` name.
    pub fn name(self) -> &'static str {
        match self {
            Invariance::Padding => "padding-invariant",
            Invariance::Chunk => "chunk-invariant",
            Invariance::Batch => "batch-invariant",
        }
    }

    /// The property name of a finding.
    pub fn property(self) -> &'static str {
        match self {
            Invariance::Padding => "padding invariance",
            Invariance::Chunk => "chunk-size invariance",
            Invariance::Batch => "batch invariance",
        }
    }

    /// Parses a `--require` list (comma-separated names; `none` for nothing).
    ///
    /// # Errors
    /// An unknown name, with the valid ones.
    pub fn parse_list(list: &str) -> Result<Vec<Invariance>, String> {
        let mut v = Vec::new();
        for w in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if w == "none" {
                continue;
            }
            let i = Invariance::ALL
                .into_iter()
                .find(|i| i.name() == w)
                .ok_or_else(|| {
                    format!("--require: unknown property `{w}` (padding-invariant, chunk-invariant, batch-invariant, none)")
                })?;
            if !v.contains(&i) {
                v.push(i);
            }
        }
        v.sort();
        Ok(v)
    }
}

/// The default `--require`: padding invariance (the spec's: padding is not
/// vocabulary, whatever its values).
pub const DEFAULT_REQUIRE: &str = "padding-invariant";

/// The outputs an external kernel computes, as the pins that keep every
/// other output out of the requests (`log_probs`: `tokens`; `entropy`;
/// `topk_log_probs`: `topk`; `grad_logits`: `grad`). Every output: no pin.
///
/// # Errors
/// An unknown output name, `grad_logits` without a forward output (its
/// cotangents belong to the forward outputs), or a pin of `options` that
/// asks for an output left out.
pub fn outputs_pins(outputs: &[&str], options: &str) -> Result<String, String> {
    use logprobe_verify::protocol::Output;
    let mut want = Vec::new();
    for &o in outputs {
        // Protocol v1's outputs; `lse` and `z_loss` only when named here
        // (ExecTarget::loss_side), never by default.
        let out = [
            Output::LogProbs,
            Output::Entropy,
            Output::TopkLogProbs,
            Output::GradLogits,
            Output::Lse,
            Output::ZLoss,
        ]
        .into_iter()
        .find(|x| x.name() == o.trim())
        .ok_or_else(|| {
            format!(
                "outputs: unknown output `{o}` (protocol v1: log_probs, entropy, topk_log_probs, grad_logits, lse, z_loss)"
            )
        })?;
        want.push(out);
    }
    let grad_sources = [Output::LogProbs, Output::Entropy, Output::TopkLogProbs];
    if !want.iter().any(|o| o.is_forward())
        || (want.contains(&Output::GradLogits) && !want.iter().any(|o| grad_sources.contains(o)))
    {
        return Err("outputs: name at least one of log_probs, entropy, topk_log_probs, lse, z_loss (grad_logits is d(sum of cotangent * output) / d logits over log_probs, entropy, topk_log_probs)".into());
    }
    let pinned =
        super::grammar::Pairs::parse(options, &super::case::KEYS).map_err(|e| e.to_string())?;
    let mut pins = Vec::new();
    for (out, key, pin) in [
        (Output::LogProbs, "tokens", "tokens=off"),
        (Output::Entropy, "entropy", "entropy=none"),
        (Output::TopkLogProbs, "topk", "topk=0"),
        (Output::GradLogits, "grad", "grad=none"),
    ] {
        if want.contains(&out) {
            continue;
        }
        if pinned.get(key).is_some() {
            return Err(format!(
                "outputs leaves out {} but the options pin `{key}=`: drop one",
                out.name()
            ));
        }
        pins.push(pin);
    }
    Ok(pins.join(","))
}

/// The search space of an external kernel: `options` (`--options`' grammar,
/// `--dtype` / `--vocab` merged in as `dtype=` / `vocab=`) with bad inputs
/// excluded (protocol v1 sends valid inputs only). A printed recipe (its
/// `bad=none` included) pins its case.
///
/// # Errors
/// A malformed pin, an unknown key or value, or a `bad=` pin other than
/// `none`.
pub fn exec_space(options: &str) -> Result<Space, String> {
    let pairs = super::grammar::Pairs::parse(options, &super::case::KEYS)
        .map_err(|e| format!("options: {e}"))?;
    // `bad=none` (in every printed recipe) is allowed: it pins nothing bad.
    let bad = pairs.get("bad").unwrap_or_default();
    if bad
        .iter()
        .any(|a| !matches!(a, super::grammar::Alt::Word(w) if w == "none" || w == "off"))
    {
        return Err("options bad=...: protocol v1 sends valid inputs only (an external kernel has no typed-error channel); drop the bad= pin".into());
    }
    // Protocol v1 sends no softcap: its cases carry none.
    let softcap = pairs.get(dump_key::SOFTCAP);
    if softcap.as_ref().is_some_and(|s| {
        s.iter()
            .any(|a| !matches!(a, super::grammar::Alt::Word(w) if w == "none" || w == "off"))
    }) {
        return Err(
            "options softcap=...: protocol v1 does not send the softcap; drop the softcap pin"
                .into(),
        );
    }
    let pin_softcap = if softcap.is_none() {
        ",softcap=none"
    } else {
        ""
    };
    Space::parse(&format!("{options},bad=none{pin_softcap}")).map_err(|e| format!("options: {e}"))
}

/// `options` with `key=alternatives` pins appended (`--dtype` and `--vocab`:
/// there a comma separates alternatives too, here a `|`).
pub fn merge_options(options: &str, extra: &[(&str, Option<&str>)]) -> String {
    let mut s = options.to_string();
    for (key, v) in extra {
        if let Some(v) = v {
            s.push_str(&format!(",{key}={}", v.replace(',', "|")));
        }
    }
    s
}

/// Settings of an `--exec` run.
pub struct ExecRun {
    /// The external kernel.
    pub target: ExecTarget,
    /// The search space (bad inputs excluded).
    pub space: Space,
    /// Wall-clock limit of the search (shrinking excluded): no call starts
    /// after it and one under way is cut at it (its case is not judged).
    pub budget: Duration,
    /// Case limit.
    pub cases: Option<u64>,
    /// Wall-clock limit of each shrink (as `budget`).
    pub shrink_budget: Duration,
    /// Where dumps go (`None`: kept in memory only, in
    /// [`ExecReport::found_files`] and [`Lack::dumps`]).
    pub out_dir: Option<PathBuf>,
    /// Show progress.
    pub progress: bool,
}

/// The outcome of an `--exec` run.
#[derive(Debug)]
pub struct ExecReport {
    /// The seed.
    pub seed: u64,
    /// Cases drawn.
    pub cases: u64,
    /// Cases checked against the oracle.
    pub checked: u64,
    /// Cases not checked, by reason class: (bad input not sent, no output
    /// asked or no bound).
    pub unchecked: (u64, u64),
    /// Cases SUSPECT under the statistical tier.
    pub suspect: u64,
    /// Seconds of search.
    pub seconds: f64,
    /// Worst `error / bound` over the passing cases.
    pub worst: f64,
    /// Calls to the command during the search (shrinking excluded) and their seconds.
    pub calls: (u64, f64),
    /// Calls made while shrinking.
    pub shrink_calls: u64,
    /// Per invariance: cases where it was checked and held.
    pub held: Vec<(Invariance, u64)>,
    /// Invariances lacked (first case of each).
    pub lacks: Vec<Lack>,
    /// The finding, shrunk.
    pub found: Option<Found>,
    /// Paths of the finding's dumps (empty when kept in memory).
    pub found_dumps: Vec<PathBuf>,
    /// The finding's dumps: file names (`fuzz-<kind>-seed<S>[-variant].safetensors`)
    /// and bytes; the first is the case joined with the kernel's answer
    /// (inputs only for a `command` finding).
    pub found_files: Files,
    /// Whether the run was interrupted (in-process: Ctrl-C; the binary: a
    /// caught signal).
    pub interrupted: bool,
    /// The signal that interrupted the run (the binary: SIGINT, SIGTERM,
    /// SIGHUP; see [`signals`]).
    pub signal: Option<i32>,
    /// A note on the persistent process's exit, if not clean.
    pub close_note: Option<String>,
    /// Whether the search's budget cut a call short (its case not judged)
    /// or kept one from starting.
    pub out_of_time: bool,
}

impl ExecReport {
    /// 1 a finding; `128 + K` interrupted by signal K; 1 when no case was
    /// checked against the oracle (unchecked is not clean); 0 clean.
    pub fn exit_status(&self) -> u8 {
        match (&self.found, self.signal) {
            (Some(_), _) => 1,
            (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(1),
            (None, None) => u8::from(self.checked == 0),
        }
    }
}

/// Shrinks the failing `tree` through the command: a step is kept when
/// the same property still fails. `budget` is a wall-clock limit: no call
/// starts after it, and one under way is cut at it
/// ([`Runner::set_deadline`]); a cut call keeps no step.
fn shrink(
    target: &ExecTarget,
    tree: &mut dyn proptest::strategy::ValueTree<Value = FuzzCase>,
    first: ExecFinding,
    budget: Duration,
) -> (FuzzCase, ExecFinding, usize) {
    let property = first.finding.property;
    let runner = &target.runner;
    let fails = |c: &FuzzCase| match target.judge(c) {
        Err(f)
            if f.finding.property == property && !runner.interrupted() && !runner.out_of_time() =>
        {
            Some(f)
        }
        _ => None,
    };
    let deadline = Instant::now() + budget;
    let mut best = (tree.current(), first, 0usize);
    if !tree.simplify() {
        return best;
    }
    runner.set_deadline(Some(deadline));
    while Instant::now() < deadline && !runner.interrupted() && !runner.out_of_time() {
        let c = tree.current();
        match fails(&c) {
            Some(f) => {
                debug_assert_eq!(f.finding.property, property);
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

/// Dump files: names (`fuzz-<kind>-seed<S>[-<suffix>].safetensors`) and bytes.
pub type Files = Vec<(String, Vec<u8>)>;

/// A finding's dumps, named `<stem>[-<suffix>].safetensors` (a command
/// finding: the inputs only), with what `logprobe verify` says of the first.
///
/// # Errors
/// A request that cannot be serialised (a bug), as text.
fn finding_files(
    stem: &str,
    target: &ExecTarget,
    case: &FuzzCase,
    f: &ExecFinding,
) -> Result<(Files, String), String> {
    let mut dumps = f.dumps.clone();
    let inputs_only = dumps.is_empty();
    if inputs_only {
        let r = target.request(case);
        let bytes = r
            .metadata(&target.extra(case, f.finding.property))
            .and_then(|meta| logprobe_verify::dump::write_dump(&r.tensors(), &meta))
            .map_err(|e| e.to_string())?;
        dumps.push(("", bytes));
    }
    let files: Files = dumps
        .into_iter()
        .map(|(suffix, bytes)| (file_name(stem, suffix), bytes))
        .collect();
    let verdict = if inputs_only {
        "inputs only (the kernel gave no valid answer on them)".to_string()
    } else {
        match Dump::parse(&files[0].1) {
            Ok(d) => match verify_dump(&d, Path::new(&files[0].0), &target.verify_config()) {
                Ok(r) => r.verdict.to_string(),
                Err(e) => format!("bad input: {e}"),
            },
            Err(e) => format!("bad input: {e}"),
        }
    };
    Ok((files, verdict))
}

fn file_name(stem: &str, suffix: &str) -> String {
    if suffix.is_empty() {
        format!("{stem}.safetensors")
    } else {
        format!("{stem}-{suffix}.safetensors")
    }
}

/// Writes named dumps into `dir` (created), atomically and never over an
/// earlier finding ([`super::files::write_new`]: the names get the dump's
/// hash); returns their paths.
///
/// # Errors
/// The directory or a file cannot be written, as text.
pub fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>, String> {
    super::files::write_new(dir, files).map_err(|e| e.to_string())
}

/// Counts a judged case into the report (checked or why not, SUSPECT,
/// worst ratio, invariances held).
fn tally(rep: &mut ExecReport, j: &Judged) {
    match &j.unchecked {
        Some(why) if why.starts_with("bad input") => rep.unchecked.0 += 1,
        Some(_) => rep.unchecked.1 += 1,
        None => rep.checked += 1,
    }
    rep.suspect += u64::from(j.suspect);
    rep.worst = rep.worst.max(j.worst);
    for h in &j.held {
        if let Some(e) = rep.held.iter_mut().find(|(i, _)| i == h) {
            e.1 += 1;
        }
    }
}

/// Runs the search on the external kernel (see the module docs).
pub fn run(config: &ExecRun) -> ExecReport {
    let start = Instant::now();
    let t = &config.target;
    let strategy = config.space.strategy();
    let seed = t.seed;
    let mut rep = ExecReport {
        seed,
        cases: 0,
        checked: 0,
        unchecked: (0, 0),
        suspect: 0,
        seconds: 0.0,
        worst: 0.0,
        calls: (0, 0.0),
        shrink_calls: 0,
        held: Invariance::ALL.iter().map(|&i| (i, 0)).collect(),
        lacks: Vec::new(),
        found: None,
        found_dumps: Vec::new(),
        found_files: Vec::new(),
        interrupted: false,
        signal: None,
        close_note: None,
        out_of_time: false,
    };
    let name = format!(
        "{} {}",
        t.runner.transport.kind(),
        t.runner.transport.command()
    );
    let mut shown = [TargetReport {
        name: name.clone(),
        cases: 0,
        worst: 0.0,
        found: None,
        unbounded: 0,
    }];
    let mut progress = progress::Progress::new(config.progress, config.cases);
    let stem = format!("fuzz-{}-seed{seed}", t.runner.transport.kind());
    let mut index = 0u64;
    let mut shrink_secs_calls = 0.0;
    t.runner.set_deadline(Some(start + config.budget));
    while start.elapsed() < config.budget
        && config.cases.is_none_or(|n| index < n)
        && rep.found.is_none()
        && !t.runner.interrupted()
        && !t.runner.out_of_time()
    {
        let case = case_tree(&strategy, seed, index).current();
        match t.judge(&case) {
            Ok(j) => {
                tally(&mut rep, &j);
                for (inv, detail, dumps) in j.lacked {
                    if rep.lacks.iter().any(|l| l.invariance == inv) {
                        continue;
                    }
                    let f = ExecFinding {
                        finding: Finding {
                            property: inv.property(),
                            call: Call::Invariance,
                            detail: detail.clone(),
                        },
                        dumps: dumps.clone(),
                    };
                    let written =
                        finding_files(&format!("{stem}-lacks-{}", inv.name()), t, &case, &f)
                            .and_then(|(files, _)| match &config.out_dir {
                                Some(dir) => write_files(dir, &files),
                                None => Ok(Vec::new()),
                            });
                    progress.println(&format!(
                        "{name}: lacks {} (case {index}): {}",
                        inv.name(),
                        super::detail_text(&detail, 4, "\n  ")
                    ));
                    rep.lacks.push(Lack {
                        invariance: inv,
                        case: case.clone(),
                        case_index: index,
                        detail,
                        dumps,
                        written,
                    });
                }
            }
            Err(_) if t.runner.interrupted() => {}
            // A call the budget cut or refused: the case is not judged.
            Err(_) if t.runner.out_of_time() => {
                rep.out_of_time = true;
                break;
            }
            Err(f) => {
                let time_to_find = start.elapsed().as_secs_f64();
                progress.println(&format!(
                    "{name}: {} failed on case {index} after {time_to_find:.1} s; shrinking through the command (at most {} s)",
                    f.finding.property,
                    config.shrink_budget.as_secs()
                ));
                let s0 = Instant::now();
                let before = t.runner.stats();
                let mut tree = case_tree(&strategy, seed, index);
                let (case, f, steps) = shrink(t, tree.as_mut(), f, config.shrink_budget);
                t.runner.set_deadline(None);
                let after = t.runner.stats();
                rep.shrink_calls = after.0 - before.0;
                shrink_secs_calls = after.1 - before.1;
                let shrink_secs = s0.elapsed().as_secs_f64();
                let dump = finding_files(&stem, t, &case, &f).and_then(|(files, verdict)| {
                    let first = match &config.out_dir {
                        Some(dir) => {
                            rep.found_dumps = write_files(dir, &files)?;
                            rep.found_dumps[0].clone()
                        }
                        None => PathBuf::from(&files[0].0),
                    };
                    rep.found_files = files;
                    Ok((first, verdict))
                });
                rep.found = Some(Found {
                    finding: f.finding,
                    case,
                    case_index: index,
                    time_to_find,
                    shrink_steps: steps,
                    shrink_secs,
                    dump,
                    twin_passes: None,
                });
            }
        }
        index += 1;
        shown[0].cases = index;
        shown[0].worst = rep.worst;
        shown[0].found = rep.found.clone();
        progress.update(index, &shown, start.elapsed());
    }
    progress.finish();
    rep.interrupted = t.runner.interrupted();
    rep.signal = signals::caught();
    rep.close_note = t.runner.close();
    rep.cases = index;
    rep.seconds = start.elapsed().as_secs_f64();
    let (calls, secs) = t.runner.stats();
    rep.calls = (calls - rep.shrink_calls, secs - shrink_secs_calls);
    rep
}

/// Reruns the case of a fuzz dump on the external kernel, with the dump's
/// property required when it is an invariance: `Ok(None)` when it passes
/// now, `Ok(Some(finding))` when it still fails.
///
/// # Errors
/// A file that is not a fuzz dump, or a bad recipe.
pub fn replay(path: &Path, target: &mut ExecTarget) -> Result<(FuzzCase, Option<Finding>), String> {
    let (_, recipe, property, _) = super::counterexample::read_meta(path)?;
    let case = FuzzCase::parse(&recipe).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(inv) = Invariance::ALL
        .into_iter()
        .find(|i| i.property() == property)
    {
        if !target.require.contains(&inv) {
            target.require.push(inv);
        }
    }
    let f = target.judge(&case).err().map(|f| f.finding);
    target.runner.close();
    Ok((case, f))
}
