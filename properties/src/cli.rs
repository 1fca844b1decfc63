//! What the `logprobe` binary prints: stdout that ends quietly when the
//! reader goes away (`| head`) and fails with exit 2 on a full disk
//! ([`Out`]), stderr that never panics ([`eprint_line`]), the long help of
//! `verify`, whose tensor and metadata names come from the format's name table
//! ([`logprobe_verify::names`]), and the `compare` subcommand (arguments,
//! run, help; the engine is [`logprobe_verify::compare`]).

use std::io::Write;

use logprobe_verify::names::{built, Kind, NAMES};

/// Why the report could not be written to stdout (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// A write or flush of stdout failed with something other than a closed
    /// pipe: a full disk (`ENOSPC`), an I/O error.
    #[error("cannot write the report to standard output: {0}")]
    Stdout(#[source] std::io::Error),
}

/// Stdout for reports. A closed pipe (`EPIPE`, `| head`) is not an error of
/// the verification: later writes are dropped and the exit status stays the
/// verdict's. Any other error (`ENOSPC`, `> /dev/full`) is kept, later
/// writes are dropped, and [`Out::finish`] turns it into exit status 2.
pub struct Out {
    closed: bool,
    error: Option<OutputError>,
}

impl Out {
    /// Stdout, open.
    pub fn new() -> Self {
        Out {
            closed: false,
            error: None,
        }
    }

    /// Writes `s` and flushes; drops it once stdout is closed or failed.
    pub fn print(&mut self, s: &str) {
        if self.closed || self.error.is_some() {
            return;
        }
        let mut lock = std::io::stdout().lock();
        match lock.write_all(s.as_bytes()).and_then(|_| lock.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => self.closed = true,
            Err(e) => self.error = Some(OutputError::Stdout(e)),
        }
    }

    /// The error that stopped the output, if any (a closed pipe is none).
    pub fn error(&self) -> Option<&OutputError> {
        self.error.as_ref()
    }

    /// The exit status: `status` (the verdict's) unless a write failed
    /// otherwise than on a closed pipe; then 2, with the error on stderr.
    pub fn finish(self, status: u8) -> u8 {
        match &self.error {
            None => status,
            Some(e) => {
                eprint_line(&format!("logprobe: {e}"));
                2
            }
        }
    }
}

impl Default for Out {
    fn default() -> Self {
        Self::new()
    }
}

/// Stderr that never panics (defined in the fuzz engine, whose progress
/// lines use it too).
pub use logprobe_fuzz::stderr::eprint_line;

/// The text after `logprobe verify --help`: exit codes, the names a dump may
/// hold, what the report's columns mean.
pub fn verify_help() -> String {
    let tensors: Vec<&str> = built(Kind::Tensor, NAMES).collect();
    let keys: Vec<&str> = built(Kind::Meta, NAMES).collect();
    format!(
        "\
Exit status:
  0  every output of every file within its bound (with --expect: every verdict as expected)
  1  some output beyond its bound, or \"no bound\" (the model certifies nothing)
  2  bad input (the message names the tensor / key, row and column)

Tensor names: {}
Metadata keys (strings): {}
  ([B, T, V] logits take [B, T] per-row tensors; row_mask, cotangent_reduction,
  topk_ids_source and topk_sorted need format_version=\"2\"; any other name is bad input)

Columns of the report:
  max |err|   largest upper bound on |candidate - exact| (nats; per logit for grad_logits)
  max ulps    the same in ulps of the candidate's dtype at the exact value
  err/bound   largest error / bound under --model (<= 1 passes)
  tightest    the tightest of tree, lanes=8, sequential whose bound every element meets
              (how far the candidate is from what a better summation achieves)
  err/stat    largest error / statistical threshold (SUSPECT above 1)
  err/care    the relative rule: max error / max(careful code's max error, half ulp),
              careful code in the accumulation dtype, form and summation declared
              (SUSPECT above R = {}; log-softmax outputs, lse, z_loss, per-row loss,
              soft cross-entropy, top-k KLs, policy terms; no gradient yet)
  A SUSPECT output's line names the rule that fired: statistical tier or relative rule.
  unchecked   the output had no element to check (N = 0, every row ignored, K = 0)

A huge `max ulps` can sit next to \"pass\": gradients are judged absolutely
(the bound scales with the row's largest terms), so an element whose exact value
is near 0 has a tiny ulp and a correct candidate many ulps away.",
        tensors.join(", "),
        keys.join(", "),
        logprobe_verify::tolerance::RELATIVE_R
    )
}

/// The arguments of `logprobe compare A B`.
#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// A: the dump every quantity is measured from (the trainer): logits,
    /// tokens, log_probs.
    pub a: std::path::PathBuf,
    /// B: the same rows from the other side (the rollout engine); logits optional.
    pub b: std::path::PathBuf,
    /// Print the report as JSON on stdout (schema_version 1) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// PPO clip range eps: the summary counts rows whose importance ratio
    /// exp(lp_A - lp_B) is outside [1 - eps, 1 + eps].
    #[arg(long, default_value_t = 0.2, value_parser = parse_clip)]
    pub clip: f64,
    /// Rows to compare: `a..b`, `a..` or `sample:K` (before row_mask).
    #[arg(long)]
    pub rows: Option<logprobe_verify::verify::RowSelection>,
    /// Summation model of each side's kernel bound: lanes=8 (default), lanes=K, tree or sequential.
    #[arg(long, default_value = "lanes=8")]
    pub model: logprobe_verify::tolerance::Order,
    /// Accumulation dtype of both kernels' bounds: f32, f64, bf16 or f16
    /// (default: f64 for f64 logits, f32 otherwise).
    #[arg(long, value_parser = parse_accumulation)]
    pub accumulation: Option<logprobe_reference::spec::Dtype>,
    /// Skip the exact KL per row (certified f64 tier, MPFR where it does not
    /// decide: about one more oracle pass per side).
    #[arg(long)]
    pub no_kl: bool,
    /// Rows listed in the table, largest |observed| first.
    #[arg(long, default_value_t = 5)]
    pub worst: usize,
}

fn parse_clip(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x < 1.0 => Ok(x),
        _ => Err(format!(
            "bad --clip `{s}`: expected eps in (0, 1), e.g. 0.2"
        )),
    }
}

fn parse_accumulation(s: &str) -> Result<logprobe_reference::spec::Dtype, String> {
    logprobe_reference::spec::Dtype::ALL
        .into_iter()
        .find(|d| d.name() == s.trim())
        .ok_or_else(|| format!("unknown dtype `{s}`: expected f64, f32, bf16 or f16"))
}

/// Runs `logprobe compare`: the table (or `--json`) on stdout, bad input on
/// stderr. Returns the exit status: 0 compared, every kernel within its
/// bound; 1 a kernel beyond its bound (or "no bound"); 2 bad input.
pub fn compare(args: CompareArgs) -> u8 {
    use logprobe_verify::compare::{compare_files, render_table, CompareConfig};
    let mut config = CompareConfig {
        clip: args.clip,
        kl: !args.no_kl,
        worst: args.worst,
        ..CompareConfig::default()
    };
    if let Some(r) = args.rows {
        config.rows = r;
    }
    config.verify.model = args.model;
    config.verify.accumulation = args.accumulation;
    let report = match compare_files(&args.a, &args.b, &config) {
        Ok(r) => r,
        Err(e) => {
            eprint_line(&format!(
                "logprobe: compare {} {}: bad input: {e}",
                args.a.display(),
                args.b.display()
            ));
            return 2;
        }
    };
    let mut out = Out::new();
    if args.json {
        match logprobe_verify::json::to_document(&report) {
            Ok(s) => out.print(&s),
            Err(e) => {
                eprint_line(&format!("logprobe: {e}"));
                return 2;
            }
        }
    } else {
        out.print(&render_table(&report));
    }
    out.finish(report.exit_status)
}

/// The text after `logprobe compare --help`: what is reported, exit codes.
pub fn compare_help() -> String {
    "\
Per row (nats; each an enclosure [lo, hi] of the exact real, from the oracle):
  kernel_error_a   lp_A - exact(logits_A)        what A's log-prob kernel adds
  kernel_error_b   lp_B - exact(logits_B)        what B's kernel adds (B with logits)
  logits_effect    exact(logits_A) - exact(logits_B)   the part due to the logits alone
  observed         lp_A - lp_B = kernel_error_a - kernel_error_b + logits_effect (exactly)
  kl               KL(softmax(z_A) || softmax(z_B)), exact (B with logits)
  b_minus_exact_a  lp_B - exact(logits_A) (B without logits: its kernel and logits together)
Summary: mean and max |.| of each, bitwise-equal rows, the importance ratio exp(observed)
(range, rows outside [1 - clip, 1 + clip]), Pearson r of the log-probs and of exp(lp)
(verl's rollout_actor_probs_pearson_corr), each side's kernel against its bound (as verify
judges it), and a one-line verdict: \"the mismatch is X% kernel numerics, Y% logits\".

A and B must hold the same rows: the same tokens ([N] or [B, T]), row_mask and
ignore_index. B may hold only tokens, log_probs (and row_mask): what rollout engines return.

Exit status:
  0  compared (at least one row); every kernel within its bound (SUSPECT included)
  1  some side's kernel beyond its bound, \"no bound\" or unchecked; a NaN or infinite
     candidate log-prob (a kernel fault); or no row compared (all masked or ignored)
  2  bad input (the message names the side, tensor and row)"
        .to_string()
}
