//! The `logprobe` command line. Subcommands:
//!
//! - `verify FILE...`: judge dumps of another implementation's log-probs,
//!   entropy, top-k log-probs and gradients against the exact oracle
//!   (format: `docs/dump-from-pytorch.md`). Exit 0 when everything is
//!   within bound (or, with `--expect`, when every verdict is as expected),
//!   1 otherwise, 2 on bad input.
//! - `bench`: throughput and memory of the CPU kernels as ratios against the
//!   machine's read roofline, candle's composed path and the oracle
//!   ([`logprobe_cli::bench`]); `--json` for a machine-readable report.
//!   Exit 0, or 2 on a bad configuration or a kernel failure.
//! - `fuzz`: a time-budgeted search of kernels (ours, or planted mutants)
//!   over the gate's recipe space, shrinking each finding to a minimal
//!   recipe written as a verify dump ([`logprobe_fuzz`],
//!   `docs/fuzz.md`). Exit 0 clean, 1 found, 2 bad usage.
//! - `compare A B`: where a trainer-vs-rollout log-prob mismatch comes
//!   from ([`logprobe_verify::compare`], `docs/compare.md`). Exit 0 both
//!   kernels within their bounds on at least one compared row; 1 a kernel
//!   beyond its bound, a non-finite log-prob, no row compared or an
//!   unchecked side; 2 bad input.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use logprobe_cli::bench::{render as render_bench, BenchConfig};
use logprobe_cli::cli::{eprint_line, Out};
use logprobe_reference::spec::{Dtype, Shift};
use logprobe_testkit::memory::CountingAllocator;
use logprobe_verify::json::{to_document, VerifyDocument};
use logprobe_verify::tolerance::{K3Form, Order};
use logprobe_verify::verify::{
    exit_status_strict, render_expect, render_table, verify_files, Expectations, FileOutcome,
    RowSelection, VerifyConfig,
};

// Counts live heap bytes for `bench`'s peak-memory figures: a few relaxed
// atomics per allocation, nothing per logit.
#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// Exact verification of log-prob, entropy and top-k kernels and their gradients.
#[derive(Parser, Debug)]
#[command(
    name = "logprobe",
    version,
    about = "Exact verification of log-prob, entropy and top-k kernels and their gradients",
    long_about = "Exact verification of log-prob, entropy and top-k kernels and their gradients.\n\n\
`logprobe verify FILE...` judges safetensors dumps of another implementation's outputs against \
an exact (MPFR) oracle and derived error bounds; `logprobe bench` measures the CPU kernels."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Verify safetensors dumps of another implementation against the exact oracle.
    #[command(after_long_help = logprobe_cli::cli::verify_help())]
    Verify(VerifyArgs),
    /// Throughput and memory of the CPU kernels against the read roofline,
    /// candle's composed path and the oracle (one run, ratios).
    Bench(BenchArgs),
    /// Search kernels for inputs they get wrong, within a time budget; shrink
    /// each finding and write it as a dump (docs/fuzz.md).
    Fuzz(FuzzArgs),
    /// Where a log-prob mismatch between two dumps of the same rows (trainer
    /// vs rollout engine) comes from: each kernel's error against the exact
    /// oracle, the logits' effect, the exact KL (docs/compare.md).
    #[command(after_long_help = logprobe_cli::cli::compare_help())]
    Compare(logprobe_cli::cli::CompareArgs),
}

#[derive(Args, Debug)]
struct FuzzArgs {
    /// Targets: fused, chunked, vocab-parallel, candle, cuda, fused-linear, fused-linear-tp,
    /// mutant:NAME (comma-separated; default fused,chunked,vocab-parallel).
    #[arg(long, conflicts_with_all = ["exec", "exec_persistent"])]
    kernel: Option<String>,
    /// An external kernel, one process per call: CMD with {in} and {out} (fuzz protocol v1,
    /// docs/fuzz-protocol.md), run through `sh -c`.
    #[arg(long, value_name = "CMD", conflicts_with = "exec_persistent")]
    exec: Option<String>,
    /// An external kernel, one process for the run: CMD exchanges frames (u64 LE length +
    /// safetensors bytes) on stdin/stdout (fuzz protocol v1).
    #[arg(long, value_name = "CMD")]
    exec_persistent: Option<String>,
    /// The external kernel is a fused linear + cross-entropy kernel: it takes hidden,
    /// lm_head_weight, lm_head_bias (fuzz protocol v2, docs/fuzz-protocol.md).
    #[arg(long)]
    fused_linear: bool,
    /// Where the fused linear kernel keeps its logits (with --fused-linear): input (rounded
    /// to the inputs' dtype, as Liger does) or accumulation (f32, as Cut Cross-Entropy does).
    #[arg(long, default_value = "input", value_parser = logprobe_fuzz::linear::exec::parse_logits)]
    lm_head_logits_dtype: logprobe_kernels::linear::LinearLogits,
    /// Time limit of one call of the external kernel (a hang past it is a finding).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    timeout: std::time::Duration,
    /// Outputs the external kernel computes: log_probs, entropy, topk_log_probs, grad_logits
    /// (comma-separated; default those four), and lse, z_loss (asked only when named). The
    /// others are never asked for (also give it with --replay).
    #[arg(long)]
    outputs: Option<String>,
    /// Invariances of the external kernel whose lack is a failure: padding-invariant,
    /// chunk-invariant, batch-invariant (comma-separated, or none).
    #[arg(long, default_value = logprobe_fuzz::exec::DEFAULT_REQUIRE)]
    require: String,
    /// The invariances compare every bit: 0 and -0 differ (by default they
    /// are the same value).
    #[arg(long)]
    bitwise: bool,
    /// A SUSPECT verdict (within the sound bound, beyond the statistical
    /// threshold or the relative rule's R) is a finding (property
    /// `statistical`, its detail naming the rule), as under
    /// `verify --strict` (`--exec`, `--exec-persistent`; by default it is
    /// counted in the report, not a finding).
    #[arg(long)]
    strict: bool,
    /// Accumulation dtype the external kernel declares (`--exec`,
    /// `--exec-persistent`): f32, f64, bf16 or f16, used for its bound as
    /// `verify --accumulation` uses it (default: f64 for f64 logits, f32 otherwise).
    #[arg(long, value_parser = parse_dtype)]
    accumulation: Option<Dtype>,
    /// Time limit of the search, e.g. 90s, 10m, 1h (shrinking excluded).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    budget: std::time::Duration,
    /// Case limit (whichever of --budget and --cases comes first).
    #[arg(long)]
    cases: Option<u64>,
    /// Seed of the case stream (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Logit dtypes: alternatives of `dtype=` (f64, f32, bf16, f16), e.g. bf16|f16.
    #[arg(long)]
    dtype: Option<String>,
    /// Vocabulary sizes: alternatives of `vocab=` (numbers, lo..hi, real), e.g. real|1..64.
    #[arg(long)]
    vocab: Option<String>,
    /// Pins of the search space, `key=alt|alt,key=...` (docs/fuzz.md); a printed recipe pins a whole case.
    #[arg(long, default_value = "")]
    options: String,
    /// Time limit of each shrink.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    shrink_budget: std::time::Duration,
    /// Directory of the counterexample dumps.
    #[arg(long, default_value = "fuzz-findings")]
    out: PathBuf,
    /// Rerun the case of a fuzz dump on the kernel it names (other flags ignored).
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Never show progress.
    #[arg(long)]
    no_progress: bool,
    /// Print the planted mutants' names (for `--kernel mutant:NAME`), one a line, and exit.
    #[arg(long)]
    list_mutants: bool,
}

use logprobe_fuzz::grammar::parse_duration;

fn fuzz(args: FuzzArgs) -> u8 {
    use logprobe_fuzz as fuzz;
    let mut out = Out::new();
    if args.list_mutants {
        // The catalog's names (scripts/fuzz-mutants.sh reads this list).
        for e in logprobe_testkit::mutants::CATALOG {
            out.print(&format!("{}\n", e.name));
        }
        for (name, _) in fuzz::linear::LINEAR_MUTANTS {
            out.print(&format!("{name}\n"));
        }
        return out.finish(0);
    }
    if args.exec.is_some() || args.exec_persistent.is_some() {
        return fuzz_exec(args);
    }
    if args.fused_linear {
        eprint_line("logprobe: --fused-linear describes an external kernel: it goes with --exec or --exec-persistent (our fused linear kernels: --kernel fused-linear,fused-linear-tp)");
        return 2;
    }
    if args.accumulation.is_some() {
        eprint_line("logprobe: --accumulation declares an external kernel's accumulation dtype: it goes with --exec or --exec-persistent (the built-in kernels' bounds are known)");
        return 2;
    }
    if let Some(path) = &args.replay {
        if let Ok((kernel, recipe, _, _)) = fuzz::counterexample::read_meta(path) {
            if kernel.starts_with("exec") && !args.fused_linear {
                eprint_line(&format!(
                    "logprobe: {} is a finding of an external kernel: rerun it with{} --{kernel} CMD (logprobe never runs a command stored in a file)",
                    path.display(),
                    if fuzz::linear::LinearCase::parse(&recipe).is_ok() { " --fused-linear" } else { "" }
                ));
                return 2;
            }
        }
        if let Ok((kernel, recipe, _, _)) = fuzz::counterexample::read_meta(path) {
            if fuzz::linear::is_linear(&kernel) {
                let code = logprobe_cli::fuzz_cli::replay_linear(path, &kernel, &recipe, &mut out);
                return out.finish(code);
            }
        }
        return match fuzz::replay(path) {
            Err(e) => {
                eprint_line(&format!("logprobe: {e}"));
                2
            }
            Ok((kernel, case, None)) => {
                out.print(&format!(
                    "{kernel}: passes now\n  recipe: {}\n",
                    case.recipe()
                ));
                out.finish(0)
            }
            Ok((kernel, case, Some(f))) => {
                out.print(&format!(
                    "{kernel}: still fails {}: {}\n  recipe: {}\n",
                    f.property,
                    fuzz::detail_text(&f.detail, 1, ""),
                    case.recipe()
                ));
                out.finish(1)
            }
        };
    }
    let kernels = args
        .kernel
        .clone()
        .unwrap_or_else(|| fuzz::target::DEFAULT_KERNELS.to_string());
    let run = logprobe_cli::fuzz_cli::Run {
        seed: args.seed,
        budget: args.budget,
        cases: args.cases,
        shrink_budget: args.shrink_budget,
        out_dir: args.out.clone(),
        progress: !args.no_progress,
    };
    let code = logprobe_cli::fuzz_cli::run_kernels(&kernels, &fuzz_options(&args), &run, &mut out);
    out.finish(code)
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Rows N.
    #[arg(long, default_value_t = 64)]
    n: usize,
    /// Vocabulary size V (columns).
    #[arg(long, default_value_t = 152_064)]
    v: usize,
    /// Timed calls per path after one warm-up (best and median reported).
    #[arg(long, default_value_t = 10)]
    reps: usize,
    /// chunk_size of the chunked kernel.
    #[arg(long, default_value_t = 16)]
    chunk_size: usize,
    /// Vocabulary shards (uneven widths) of the vocab-parallel kernel.
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Columns of the oracle's single row (0 skips the oracle).
    #[arg(long, default_value_t = 152_064)]
    oracle_v: usize,
    /// Timed oracle calls per figure (best reported).
    #[arg(long, default_value_t = 1)]
    oracle_reps: usize,
    /// Skip candle's composed path.
    #[arg(long)]
    no_candle: bool,
    /// Print the report as JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
}

fn bench(args: BenchArgs) -> u8 {
    let config = BenchConfig {
        n: args.n,
        v: args.v,
        reps: args.reps,
        chunk_size: args.chunk_size,
        shards: args.shards,
        threads: args.threads,
        oracle_v: args.oracle_v,
        oracle_reps: args.oracle_reps,
        candle: !args.no_candle,
    };
    let report = match logprobe_cli::bench::run(&config) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "logprobe: {e}");
            return 2;
        }
    };
    let mut out = Out::new();
    if args.json {
        match to_document(&report) {
            Ok(s) => out.print(&s),
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "logprobe: {e}");
                return 2;
            }
        }
    } else {
        out.print(&render_bench(&report));
    }
    out.finish(0)
}

/// The search space of `args` (`--options`, `--dtype`, `--vocab`).
fn fuzz_options(args: &FuzzArgs) -> String {
    logprobe_fuzz::exec::merge_options(
        &args.options,
        &[
            ("dtype", args.dtype.as_deref()),
            ("vocab", args.vocab.as_deref()),
        ],
    )
}

/// `fuzz --exec CMD` / `--exec-persistent CMD` (docs/fuzz-protocol.md).
fn fuzz_exec(args: FuzzArgs) -> u8 {
    use logprobe_fuzz::exec::{self, ExecRun, ExecTarget, Invariance, Runner, Transport};
    let transport = match (&args.exec, &args.exec_persistent) {
        (Some(c), _) => Transport::OneShot(c.clone()),
        (_, Some(c)) => Transport::Persistent(c.clone()),
        _ => unreachable!("checked by the caller"),
    };
    if let Transport::OneShot(c) = &transport {
        if !(c.contains("{in}") && c.contains("{out}")) {
            eprint_line("logprobe: --exec: the command must contain {in} and {out} (the input and output dump paths); for stdin/stdout frames use --exec-persistent");
            return 2;
        }
    }
    if args.fused_linear {
        return fuzz_exec_linear(&args, transport);
    }
    let require = match Invariance::parse_list(&args.require) {
        Ok(r) => r,
        Err(e) => {
            eprint_line(&format!("logprobe: {e}"));
            return 2;
        }
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let gradients = args
        .outputs
        .as_ref()
        .is_none_or(|o| o.split(',').any(|x| x.trim() == "grad_logits"));
    let named: Vec<&str> = args
        .outputs
        .as_deref()
        .map_or(Vec::new(), |o| o.split(',').collect());
    // Caught from here on: a signal stops the run, whose processes and
    // temporary directories go on the normal paths (then re-raised below).
    if let Err(e) = exec::signals::install() {
        eprint_line(&format!(
            "logprobe: cannot catch SIGINT/SIGTERM/SIGHUP: {e}"
        ));
        return 2;
    }
    let mut out = Out::new();
    let mut target = ExecTarget {
        runner: Runner::new(transport, args.timeout),
        require,
        seed,
        gradients,
        loss_side: exec::loss_side_outputs(&named),
        bitwise: args.bitwise,
        accumulation: args.accumulation,
        strict: args.strict,
    };
    if let Some(path) = &args.replay {
        return match exec::replay(path, &mut target) {
            Err(e) => {
                eprint_line(&format!("logprobe: {e}"));
                2
            }
            Ok((case, None)) => {
                out.print(&format!(
                    "{}: passes now\n  recipe: {}\n",
                    target.runner.transport.kind(),
                    case.recipe()
                ));
                out.finish(0)
            }
            Ok((case, Some(f))) => {
                out.print(&format!(
                    "{}: still fails {}: {}\n  recipe: {}\n",
                    target.runner.transport.kind(),
                    f.property,
                    logprobe_fuzz::detail_text(&f.detail, 16, "\n    "),
                    case.recipe()
                ));
                out.finish(1)
            }
        };
    }
    let mut options = fuzz_options(&args);
    if let Some(outputs) = &args.outputs {
        let list: Vec<&str> = outputs
            .split(',')
            .filter(|o| !o.trim().is_empty())
            .collect();
        match exec::outputs_pins(&list, &options) {
            Ok(pins) => options = format!("{options},{pins}"),
            Err(e) => {
                eprint_line(&format!("logprobe: --{e}"));
                return 2;
            }
        }
    }
    let space = match exec::exec_space(&options) {
        Ok(s) => s,
        Err(e) => {
            eprint_line(&format!("logprobe: --{e}"));
            return 2;
        }
    };
    eprint_line(&format!(
        "fuzz: {}, seed {seed}, budget {:.0} s{}, timeout {:.0} s per call, required: {}",
        target.runner.transport.flag(),
        args.budget.as_secs_f64(),
        args.cases
            .map_or(String::new(), |n| format!(", at most {n} cases")),
        args.timeout.as_secs_f64(),
        if target.require.is_empty() {
            "none".to_string()
        } else {
            target
                .require
                .iter()
                .map(|i| i.name())
                .collect::<Vec<_>>()
                .join(",")
        }
    ));
    let run = ExecRun {
        target,
        space,
        budget: args.budget,
        cases: args.cases,
        shrink_budget: args.shrink_budget,
        out_dir: Some(args.out),
        progress: !args.no_progress,
    };
    let report = exec::run(&run);
    out.print(&exec::render(&report, &run.target));
    // Every process and temporary directory of the run goes first, then
    // any descendant that escaped both group and tag.
    drop(run);
    exec::process::kill_orphans();
    let status = out.finish(report.exit_status());
    if let Some(sig) = report.signal {
        exec::signals::reraise(sig);
    }
    status
}

/// `fuzz --exec CMD --fused-linear` (fuzz protocol v2, docs/fuzz-protocol.md).
fn fuzz_exec_linear(args: &FuzzArgs, transport: logprobe_fuzz::exec::Transport) -> u8 {
    use logprobe_fuzz::exec;
    if let Err(e) = exec::signals::install() {
        eprint_line(&format!(
            "logprobe: cannot catch SIGINT/SIGTERM/SIGHUP: {e}"
        ));
        return 2;
    }
    let mut out = Out::new();
    let options = fuzz_options(args);
    let run = logprobe_cli::fuzz_cli::Run {
        seed: args.seed,
        budget: args.budget,
        cases: args.cases,
        shrink_budget: args.shrink_budget,
        out_dir: args.out.clone(),
        progress: !args.no_progress,
    };
    let a = logprobe_cli::fuzz_cli::LinearExecArgs {
        transport,
        timeout: args.timeout,
        outputs: args.outputs.as_deref(),
        logits: args.lm_head_logits_dtype,
        options: &options,
        replay: args.replay.as_deref(),
        require: &args.require,
    };
    let code = logprobe_cli::fuzz_cli::run_linear_exec(a, &run, &mut out);
    let status = out.finish(code);
    if let Some(sig) = exec::signals::caught() {
        exec::signals::reraise(sig);
    }
    status
}

#[derive(Args, Debug)]
struct VerifyArgs {
    /// Dumps (.safetensors) to verify.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print the reports as JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// Summation model of the bound: lanes=8 (default), lanes=K, tree or sequential.
    #[arg(long, default_value = "lanes=8", value_parser = parse_model)]
    model: Order,
    /// How the kernel forms the shifted logits: any (default: every form
    /// correct for the output judged), subtract-then-scale
    /// ((x - x_max) / T), scale-then-subtract (x / T - x_max / T, also
    /// x * (1/T) and an upcast before it) or raw (x_t - logsumexp(x)).
    #[arg(long, default_value = "any", value_parser = parse_form)]
    form: Shift,
    /// How the kernel evaluates kl_k3: any (default: also the naive
    /// exp(-d) + d - 1, which cancels near d = 0) or expm1 (expm1(-d) + d).
    #[arg(long, default_value = "any", value_parser = parse_k3_form)]
    k3_form: K3Form,
    /// Accumulation dtype of the implementation: f32, f64, bf16 or f16
    /// (default: f64 for f64 logits, f32 otherwise).
    #[arg(long, value_parser = parse_dtype)]
    accumulation: Option<Dtype>,
    /// Rows to check: `a..b`, `a..` or `sample:K` (K rows spread evenly).
    #[arg(long, value_parser = parse_rows)]
    rows: Option<RowSelection>,
    /// Compare each file's verdict with a JSON file `{"name": {"expect":
    /// "pass"|"suspect"|"unchecked"|"fail"|"no bound", "strict": ...}}` (name =
    /// file stem; under --strict a suspect is a fail, and `strict`, when
    /// given, is the verdict expected then): exit 0 when all match, 1 otherwise.
    #[arg(long)]
    expect: Option<PathBuf>,
    /// Worst elements listed per output.
    #[arg(long, default_value_t = 3)]
    worst: usize,
    /// Never show progress (a bar on a terminal, else a line every --progress-every seconds).
    #[arg(long)]
    no_progress: bool,
    /// Exit 1 on a SUSPECT verdict (within the sound bound, beyond the
    /// statistical threshold or the relative rule's R) as on a failure.
    #[arg(long)]
    strict: bool,
    /// The statistical threshold's constant c (of c sqrt(n) u; default the
    /// calibrated value); `off` disables that tier (the relative rule
    /// stays).
    #[arg(long, value_parser = parse_stat_c)]
    statistical_c: Option<StatC>,
    /// Seconds between two progress lines when stderr is not a terminal.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    progress_every: f64,
}

/// `--statistical-c`: a constant or `off`.
#[derive(Clone, Copy, Debug)]
struct StatC(Option<f64>);

fn parse_stat_c(s: &str) -> Result<StatC, String> {
    match s.trim() {
        "off" => Ok(StatC(None)),
        v => match v.parse::<f64>() {
            Ok(c) if c >= 0.0 && c.is_finite() => Ok(StatC(Some(c))),
            _ => Err(format!("bad --statistical-c `{s}`: a number >= 0 or `off`")),
        },
    }
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x < 1e9 => Ok(x),
        _ => Err(format!("bad --progress-every `{s}`: expected seconds > 0")),
    }
}

fn parse_model(s: &str) -> Result<Order, String> {
    s.parse()
}

fn parse_rows(s: &str) -> Result<RowSelection, String> {
    s.parse()
}

fn parse_k3_form(s: &str) -> Result<K3Form, String> {
    s.parse()
}

fn parse_form(s: &str) -> Result<Shift, String> {
    s.parse()
}

fn parse_dtype(s: &str) -> Result<Dtype, String> {
    Dtype::ALL
        .into_iter()
        .find(|d| d.name() == s.trim())
        .ok_or_else(|| format!("unknown dtype `{s}`: expected f64, f32, bf16 or f16"))
}

fn verify(args: VerifyArgs) -> u8 {
    let config = VerifyConfig {
        model: args.model,
        form: args.form,
        k3_form: args.k3_form,
        accumulation: args.accumulation,
        rows: args.rows.unwrap_or(RowSelection::All),
        worst: args.worst,
        progress: !args.no_progress && !args.json,
        statistical_c: args
            .statistical_c
            .map_or(Some(logprobe_verify::tolerance::DEFAULT_C), |c| c.0),
        progress_interval: std::time::Duration::from_secs_f64(args.progress_every),
        ..VerifyConfig::default()
    };
    let expectations = match args.expect.as_deref().map(Expectations::load).transpose() {
        Ok(e) => e,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "logprobe: {e}");
            return 2;
        }
    };
    let outcomes = verify_files(&args.files, &config);
    let mut out = Out::new();
    let expect_rows = expectations
        .as_ref()
        .map(|e| e.compare_mode(&outcomes, args.strict));
    let status = exit_status_strict(&outcomes, expect_rows.as_deref(), args.strict);
    if args.json {
        let doc = VerifyDocument::new(&outcomes, expect_rows.as_deref(), status);
        match to_document(&doc) {
            Ok(s) => out.print(&s),
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "logprobe: {e}");
                return 2;
            }
        }
    } else {
        for o in &outcomes {
            match o {
                FileOutcome::Report(r) => out.print(&format!("{}\n", render_table(r))),
                // Once, on stderr (stdout carries the reports).
                FileOutcome::BadInput { path, error } => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "logprobe: {}: bad input: {error}",
                        path.display()
                    );
                }
            }
        }
        if let Some(rows) = &expect_rows {
            out.print(&render_expect(rows));
        }
    }
    out.finish(status)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let status = match cli.command {
        Command::Verify(args) => verify(args),
        Command::Bench(args) => bench(args),
        Command::Fuzz(args) => fuzz(args),
        Command::Compare(args) => logprobe_cli::cli::compare(args),
    };
    ExitCode::from(status)
}
