//! One case on the external kernel: its request, the oracle judgement of
//! the answer and the metamorphic variants ([`ExecTarget::judge`]).

use std::path::{Path, PathBuf};

use logprobe_reference::spec::Dtype;
use logprobe_testkit::strategies::{chunk_sizes, Z_LOSS_COEF};
use logprobe_verify::dump::{Dump, Metadata};
use logprobe_verify::keys;
use logprobe_verify::protocol::{Output, Request, RequestMeta, Response};
use logprobe_verify::verify::{verify_dump, FileReport, ReportVerdict as Verdict, VerifyConfig};

use super::super::case::FuzzCase;
use super::super::grammar::num;
use super::super::judge::{Call, Finding};
use super::transport::{failure, CommandFailure, Runner};
use super::Invariance;

/// The request of a case: its inputs, the outputs it supports (log-probs
/// with tokens, entropy when asked, top-k with ids, `grad_logits` with
/// cotangents), its options and `chunk_size`.
pub fn request(case: &FuzzCase) -> Request {
    let e = case.expand();
    let d = &e.data;
    let (n, vt) = d.logits.view().dim();
    let mut outputs = Vec::new();
    if d.tokens.is_some() {
        outputs.push(Output::LogProbs);
    }
    if d.options.entropy.is_some() {
        outputs.push(Output::Entropy);
    }
    if d.topk_ids.is_some() {
        outputs.push(Output::TopkLogProbs);
    }
    let c = &e.cot;
    // `grad_logits` only with a cotangent the protocol sends (version 1:
    // log-probs, entropy, top-k); a case whose only cotangents are the
    // loss side's (`grad_lse`, `grad_z_loss`, `grad_loss`, not sent) asks
    // for no gradient.
    if c.grad_log_probs.is_some() || c.grad_entropy.is_some() || c.grad_topk_log_probs.is_some() {
        outputs.push(Output::GradLogits);
    }
    Request {
        dtype: d.logits.dtype(),
        n,
        v_total: vt,
        logits: d.logits.to_f64().into_raw_vec_and_offset().0,
        tokens: d.tokens.as_ref().map(|t| t.to_vec()),
        sampling_mask: d
            .sampling_mask
            .as_ref()
            .map(|m| m.iter().copied().collect()),
        topk_ids: d
            .topk_ids
            .as_ref()
            .map(|ids| (ids.dim().1, ids.iter().copied().collect())),
        grad_log_probs: c.grad_log_probs.as_ref().map(|g| g.to_vec()),
        grad_entropy: c.grad_entropy.as_ref().map(|g| g.to_vec()),
        grad_topk_log_probs: c
            .grad_topk_log_probs
            .as_ref()
            .map(|g| g.iter().copied().collect()),
        meta: RequestMeta {
            outputs,
            temperature: num(d.options.temperature),
            temperature_dtype: d.options.temperature_dtype,
            vocab_size: d.options.vocab_size.unwrap_or(vt),
            ignore_index: d.options.ignore_index,
            entropy_logits: d.options.entropy.unwrap_or_default(),
            chunk_size: case.chunk,
            z_loss_coef: None,
        },
    }
}

/// Whether the spec calls the request bad input (`logprobe verify`'s own
/// checks: shapes, options, every row): such cases are not sent.
fn bad_input(bytes: &[u8]) -> Option<String> {
    let d = match Dump::parse_inputs(bytes) {
        Ok(d) => d,
        Err(e) => return Some(e.to_string()),
    };
    if d.n() == 0 {
        return d
            .options
            .effective_temperature(d.logits.dtype.accumulation())
            .err()
            .map(|e| e.to_string());
    }
    if let Err(e) = d
        .row(0)
        .and_then(|r| r.problem().validate_shapes().map_err(Into::into))
    {
        return Some(e.to_string());
    }
    (0..d.n())
        .find_map(|r| d.row(r).and_then(|i| i.validate()).err())
        .map(|e| e.to_string())
}

/// The most bytes an answer to `r` can need (every output in f64, plus a
/// header), with room to spare.
fn answer_limit(r: &Request) -> u64 {
    let elems = r.n as u64 * (2 + r.k() as u64 + r.v_total as u64);
    elems * 8 * 2 + (1 << 20)
}

/// Named dump bytes: `("", base)` and `("variant", ..)` (file suffixes).
pub type Dumps = Vec<(&'static str, Vec<u8>)>;

/// A finding on an external kernel, with the dumps that show it.
#[derive(Clone, Debug)]
pub struct ExecFinding {
    /// The finding (property `command`, `oracle agreement`, `gradient`,
    /// `statistical`, or an invariance's).
    pub finding: Finding,
    /// The dumps: `("", base)` and, for an invariance, `("variant", ..)`.
    pub dumps: Dumps,
}

/// A lacked invariance (not required): the case, what differed, dumps.
#[derive(Clone, Debug)]
pub struct Lack {
    /// The invariance.
    pub invariance: Invariance,
    /// The case.
    pub case: FuzzCase,
    /// Case index.
    pub case_index: u64,
    /// What differed.
    pub detail: String,
    /// The dumps.
    pub dumps: Dumps,
    /// Where they were written (or why not).
    pub written: Result<Vec<PathBuf>, String>,
}

/// How a case went on the external kernel.
#[derive(Clone, Debug, Default)]
pub struct Judged {
    /// Worst `error / bound` over the checked outputs (0 when none).
    pub worst: f64,
    /// Why nothing was checked against the oracle (bad input not sent, no
    /// output asked, `no bound`), if so.
    pub unchecked: Option<String>,
    /// Whether verify's statistical tier said SUSPECT (within the sound
    /// bound: not a finding).
    pub suspect: bool,
    /// Invariances checked and held.
    pub held: Vec<Invariance>,
    /// Invariances lacked (not required), with what differed and dumps.
    pub lacked: Vec<(Invariance, String, Dumps)>,
}

/// The external kernel under test.
pub struct ExecTarget {
    /// The command.
    pub runner: Runner,
    /// Invariances whose lack is a finding.
    pub require: Vec<Invariance>,
    /// The run's seed (dump provenance).
    pub seed: u64,
    /// Whether the kernel computes `grad_logits` (`--outputs` / `outputs=`
    /// without it: no cotangents are sent; the recipe's `grad=none` alone
    /// still gives one, as the gate's backward checks want).
    pub gradients: bool,
    /// The loss-side outputs the kernel computes, asked only when named in
    /// `--outputs` ([`loss_side_outputs`]): `lse`, `z_loss` (with its
    /// `z_loss_coef`, the case's).
    pub loss_side: Vec<Output>,
    /// Whether the invariances compare bits (`--bitwise`): by default `0`
    /// and `-0` are the same value (a sum that starts from `-0`, or a
    /// masked gradient written as `-p * 0`, is not a defect); with it every
    /// bit counts. NaNs compare by bits either way.
    pub bitwise: bool,
    /// The accumulation dtype the kernel declares (`--accumulation`,
    /// `accumulation=`), used for its bound as `logprobe verify
    /// --accumulation` uses it; `None`: f64 for f64 logits, f32 otherwise.
    pub accumulation: Option<Dtype>,
    /// Whether a SUSPECT verdict (within the sound bound, beyond the
    /// statistical threshold) is a finding, property `statistical`
    /// (`--strict`, `strict=True`), as `logprobe verify --strict` fails it;
    /// by default it is counted, not a finding.
    pub strict: bool,
}

/// The loss-side outputs named in an `--outputs` list (`lse`, `z_loss`;
/// never asked by default, so protocol version 1 holds).
pub fn loss_side_outputs(outputs: &[&str]) -> Vec<Output> {
    [Output::Lse, Output::ZLoss]
        .into_iter()
        .filter(|o| outputs.iter().any(|x| x.trim() == o.name()))
        .collect()
}

/// Whether an invariance held: `Err` with what differed and the dumps.
type Held = Result<(), (String, Dumps)>;

/// A variant of a request: what changed, the request, and the pairs
/// `(variant row, base row)` to compare.
type Variant = (String, Request, Vec<(usize, usize)>);

/// One answered call.
struct Answer {
    request: Request,
    response: Response,
}

impl ExecTarget {
    /// The request of `case` for this kernel: [`request`], without
    /// cotangents and `grad_logits` when the kernel computes no gradient,
    /// with the loss-side outputs it computes ([`ExecTarget::loss_side`]).
    pub fn request(&self, case: &FuzzCase) -> Request {
        let mut r = request(case);
        // Every expanded case has `lse` and `z_loss` (coefficient Z_LOSS_COEF).
        if self.loss_side.contains(&Output::Lse) {
            r.meta.outputs.push(Output::Lse);
        }
        if self.loss_side.contains(&Output::ZLoss) {
            r.meta.outputs.push(Output::ZLoss);
            r.meta.z_loss_coef = Some(num(Z_LOSS_COEF));
        }
        if !self.gradients {
            r.grad_log_probs = None;
            r.grad_entropy = None;
            r.grad_topk_log_probs = None;
            r.meta.outputs.retain(|&o| o != Output::GradLogits);
        }
        r
    }

    /// The verify settings the answers are judged with: the default, with
    /// the declared [`ExecTarget::accumulation`].
    pub fn verify_config(&self) -> VerifyConfig {
        VerifyConfig {
            accumulation: self.accumulation,
            ..VerifyConfig::default()
        }
    }

    pub(super) fn extra(&self, case: &FuzzCase, property: &str) -> Metadata {
        let mut m = Metadata::new();
        m.set(keys::FUZZ_RECIPE, &case.recipe())
            .set(keys::FUZZ_KERNEL, &self.runner.transport.kind().to_string())
            .set(keys::FUZZ_PROPERTY, &property.to_string())
            .set(keys::FUZZ_SEED, &self.seed.to_string())
            .set(
                keys::FUZZ_EXEC,
                &self.runner.transport.command().to_string(),
            );
        m
    }

    fn ask(&self, request: Request) -> Result<Answer, CommandFailure> {
        let bytes = request
            .to_bytes()
            .map_err(|e| failure(format!("logprobe could not write the request: {e}"), ""))?;
        let out = self.runner.call(&bytes, answer_limit(&request))?;
        let response =
            Response::parse(&request, &out).map_err(|e| CommandFailure::new(e.to_string(), ""))?;
        Ok(Answer { request, response })
    }

    /// Judges `case` (see the module docs).
    ///
    /// # Errors
    /// The first [`ExecFinding`].
    pub fn judge(&self, case: &FuzzCase) -> Result<Judged, ExecFinding> {
        let request = self.request(case);
        let mut j = Judged::default();
        if request.meta.outputs.is_empty() {
            j.unchecked =
                Some("the case asks for no output (no tokens, entropy, top-k ids)".into());
            return Ok(j);
        }
        let bytes = request
            .to_bytes()
            .map_err(|e| self.command(case, &request, e.to_string()))?;
        if let Some(why) = bad_input(&bytes) {
            j.unchecked = Some(format!(
                "bad input, not sent (protocol v1 sends valid inputs only): {why}"
            ));
            return Ok(j);
        }
        let base = self
            .ask(request.clone())
            .map_err(|f| self.command(case, &request, f.to_string()))?;
        let property_of = |r: &FileReport| {
            let fails: Vec<&str> = r
                .outputs
                .iter()
                .filter(|o| o.verdict == Verdict::Fail)
                .map(|o| o.output)
                .collect();
            if fails.iter().all(|o| *o == "grad_logits") {
                "gradient"
            } else {
                "oracle agreement"
            }
        };
        let joined = base
            .request
            .with_response(&base.response, &Metadata::new())
            .map_err(|e| self.command(case, &request, e.to_string()))?;
        let report = Dump::parse(&joined)
            .and_then(|d| verify_dump(&d, Path::new("exec"), &self.verify_config()))
            .map_err(|e| {
                self.command(case, &request, format!("the answer does not verify: {e}"))
            })?;
        match report.verdict {
            Verdict::Fail => {
                let property = property_of(&report);
                return Err(ExecFinding {
                    finding: Finding {
                        property,
                        call: Call::Exec,
                        detail: fail_detail(&report),
                    },
                    dumps: vec![("", self.joined(case, &base, property))],
                });
            }
            Verdict::NoBound => {
                j.unchecked = Some("the foreign-kernel model gives no bound (n u >= 1)".into())
            }
            Verdict::Unchecked => {
                j.unchecked = Some(
                    report
                        .outputs
                        .iter()
                        .filter_map(|o| {
                            o.nothing_checked
                                .as_ref()
                                .map(|why| format!("{}: {why}", o.output))
                        })
                        .chain(
                            report
                                .topk_ids
                                .as_ref()
                                .and_then(|t| t.nothing_checked.as_ref())
                                .map(|why| format!("topk_ids: {why}")),
                        )
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            }
            Verdict::Suspect if self.strict => {
                return Err(ExecFinding {
                    finding: Finding {
                        property: "statistical",
                        call: Call::Exec,
                        detail: suspect_detail(&report),
                    },
                    dumps: vec![("", self.joined(case, &base, "statistical"))],
                });
            }
            Verdict::Suspect => j.suspect = true,
            Verdict::Pass => {}
        }
        j.worst = report
            .outputs
            .iter()
            .filter_map(|o| o.max_ratio)
            .fold(0.0, f64::max);
        for inv in Invariance::ALL {
            match self.invariance(case, inv, &base)? {
                None => {}
                Some(Ok(())) => j.held.push(inv),
                Some(Err((detail, dumps))) => {
                    if self.require.contains(&inv) {
                        return Err(ExecFinding {
                            finding: Finding {
                                property: inv.property(),
                                call: Call::Invariance,
                                detail,
                            },
                            dumps,
                        });
                    }
                    j.lacked.push((inv, detail, dumps));
                }
            }
        }
        Ok(j)
    }

    fn command(&self, _case: &FuzzCase, _request: &Request, detail: String) -> ExecFinding {
        ExecFinding {
            finding: Finding {
                property: "command",
                call: Call::Exec,
                detail,
            },
            dumps: Vec::new(),
        }
    }

    fn joined(&self, case: &FuzzCase, a: &Answer, property: &str) -> Vec<u8> {
        a.request
            .with_response(&a.response, &self.extra(case, property))
            .unwrap_or_default()
    }

    /// Checks one invariance against the base answer: `None` when it does
    /// not apply to the case, `Some(Err)` with what differed.
    fn invariance(
        &self,
        case: &FuzzCase,
        inv: Invariance,
        base: &Answer,
    ) -> Result<Option<Held>, ExecFinding> {
        let r = &base.request;
        let n = r.n;
        // (variant request, rows of the variant compared with rows of the base)
        let mut variants: Vec<Variant> = Vec::new();
        let same: Vec<(usize, usize)> = (0..n).map(|i| (i, i)).collect();
        match inv {
            Invariance::Padding => {
                if r.meta.vocab_size >= r.v_total || n == 0 {
                    return Ok(None);
                }
                let big = match r.dtype {
                    Dtype::F16 => 65504.0,
                    Dtype::Bf16 => 3.3895313892515355e38,
                    Dtype::F32 => f32::MAX as f64,
                    Dtype::F64 => f64::MAX,
                };
                for fill in [f64::NEG_INFINITY, big] {
                    variants.push((
                        format!(
                            "padding (columns {}..{}) set to {}",
                            r.meta.vocab_size,
                            r.v_total,
                            num(fill)
                        ),
                        r.with_padding(fill),
                        same.clone(),
                    ));
                }
            }
            Invariance::Chunk => {
                if n < 2 {
                    return Ok(None);
                }
                let mut sizes = chunk_sizes(n, case.recipe.seed);
                sizes.retain(|&c| c != case.chunk);
                // The smallest other size and the largest (whole batch).
                let picks: Vec<usize> = match (sizes.first(), sizes.last()) {
                    (Some(&a), Some(&b)) if a != b => vec![a, b],
                    (Some(&a), _) => vec![a],
                    _ => vec![],
                };
                for c in picks {
                    let mut v = r.clone();
                    v.meta.chunk_size = c;
                    variants.push((
                        format!("chunk_size {c} instead of {}", case.chunk),
                        v,
                        same.clone(),
                    ));
                }
            }
            Invariance::Batch => {
                if n == 0 {
                    return Ok(None);
                }
                let row = (case.recipe.seed as usize) % n;
                variants.push((
                    format!("row {row} alone (N = 1)"),
                    r.select_rows(&[row]),
                    vec![(0, row)],
                ));
                let twice: Vec<usize> = (0..n).chain(0..n).collect();
                variants.push((
                    format!("the batch twice (N = {})", 2 * n),
                    r.select_rows(&twice),
                    (0..2 * n).map(|i| (i, i % n)).collect(),
                ));
                if n >= 2 {
                    let cut = 1 + (case.recipe.seed as usize) % (n - 1);
                    let rows: Vec<usize> = (cut..n).collect();
                    variants.push((
                        format!("rows {cut}..{n} alone (N = {})", n - cut),
                        r.select_rows(&rows),
                        (0..n - cut).map(|i| (i, cut + i)).collect(),
                    ));
                }
            }
        }
        for (what, v, pairs) in variants {
            let a = self.ask(v).map_err(|f| {
                self.command(
                    case,
                    r,
                    format!("on the {} variant ({what}): {f}", inv.property()),
                )
            })?;
            if let Some(diff) = first_difference(base, &a, &pairs, self.bitwise) {
                let property = inv.property();
                let dumps = vec![
                    ("", self.joined(case, base, property)),
                    ("variant", self.joined(case, &a, property)),
                ];
                return Ok(Some(Err((format!("{what}: {diff}"), dumps))));
            }
        }
        Ok(Some(Ok(())))
    }
}

/// The first output element that differs between `a`'s row `ra` and `b`'s
/// row `rb` for each pair `(rb, ra)`: in bits, except that `0` and `-0` are
/// equal unless `bitwise` ([`same_element`]). Log-probs of rows whose token
/// is `ignore_index` are not compared: any value is allowed there.
fn first_difference(
    a: &Answer,
    b: &Answer,
    pairs: &[(usize, usize)],
    bitwise: bool,
) -> Option<String> {
    let tokens = a.request.tokens.as_ref();
    let ii = a.request.meta.ignore_index;
    for &o in &a.request.meta.outputs {
        let (ta, tb) = (a.response.get(o)?, b.response.get(o)?);
        if ta.dtype != tb.dtype {
            return Some(format!(
                "{} comes back as {:?} instead of {:?}",
                o.name(),
                tb.dtype,
                ta.dtype
            ));
        }
        for &(rb, ra) in pairs {
            if o == Output::LogProbs && tokens.is_some_and(|t| t[ra] == ii) {
                continue;
            }
            let (xa, xb) = (a.response.row_bytes(o, ra)?, b.response.row_bytes(o, rb)?);
            if xa != xb {
                let es = (ta.dtype.bitsize() / 8).max(1);
                let Some(col) = (0..xa.len() / es).find(|&c| {
                    let (p, q) = (&xa[c * es..(c + 1) * es], &xb[c * es..(c + 1) * es]);
                    !same_element(ta.dtype, p, q, bitwise)
                }) else {
                    continue;
                };
                let val = |x: &[u8]| value(ta.dtype, &x[col * es..(col + 1) * es]);
                let at = if o == Output::LogProbs || o == Output::Entropy {
                    format!("row {ra}")
                } else {
                    format!("row {ra}, column {col}")
                };
                return Some(format!(
                    "{} at {at}: {} vs {} (not bit-identical)",
                    o.name(),
                    val(xa),
                    val(xb)
                ));
            }
        }
    }
    None
}

/// Whether two little-endian elements of `dtype` are the same: the same
/// bits, or (unless `bitwise`) two zeros of either sign.
fn same_element(dtype: safetensors::Dtype, p: &[u8], q: &[u8], bitwise: bool) -> bool {
    p == q || (!bitwise && element(dtype, p) == 0.0 && element(dtype, q) == 0.0)
}

/// A little-endian float element of `dtype` as f64 (NaN for anything else).
fn element(dtype: safetensors::Dtype, b: &[u8]) -> f64 {
    use safetensors::Dtype as D;
    match (dtype, b.len()) {
        (D::F64, 8) => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        (D::F32, 4) => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
        (D::BF16, 2) => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        (D::F16, 2) => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        _ => f64::NAN,
    }
}

fn value(dtype: safetensors::Dtype, b: &[u8]) -> String {
    format!("{:e}", element(dtype, b))
}

/// The worst element of each failing output, one line each.
/// The SUSPECT outputs of a report, each with the rules that fired: the
/// statistical tier (elements beyond its threshold, largest `err/stat`)
/// and the relative rule (`err/care` against R); within the sound bound.
fn suspect_detail(r: &FileReport) -> String {
    r.outputs
        .iter()
        .filter(|o| o.verdict == Verdict::Suspect)
        .map(|o| {
            let mut why = Vec::new();
            if o.suspect_rules.contains(&"statistical") {
                why.push(format!(
                    "{} of {} elements beyond the statistical threshold (err/stat {:.3})",
                    o.suspect_elements,
                    o.count,
                    o.statistical_max_ratio.unwrap_or(f64::NAN),
                ));
            }
            if let Some(f) = o.relative_rule.as_ref().filter(|f| f.fires) {
                why.push(format!(
                    "the relative rule: {:.3} times careful code's error, above R = {}",
                    f.ratio, f.r
                ));
            }
            format!(
                "{} ({}): SUSPECT, {}, within the sound bound (err/bound {:.3})",
                o.output,
                o.dtype,
                why.join("; "),
                o.max_ratio.unwrap_or(f64::NAN),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn fail_detail(r: &FileReport) -> String {
    let mut lines = Vec::new();
    for o in r.outputs.iter().filter(|o| o.verdict == Verdict::Fail) {
        match o.worst.first() {
            Some(w) => lines.push(format!(
                "{} ({}) row {}{}: got {:e}, exact {:e}, error {:.3e}{}",
                o.output,
                o.dtype,
                w.row,
                w.col.map_or(String::new(), |c| format!(", column {c}")),
                w.candidate,
                w.exact,
                w.error,
                w.bound.map_or(String::new(), |b| {
                    let r = w.error / b;
                    if r.is_finite() {
                        format!(" > bound {b:.3e} ({r:.3}x)")
                    } else {
                        format!(" > bound {b:.3e} (an infinite ratio)")
                    }
                }),
            )),
            None => lines.push(format!("{}: FAIL", o.output)),
        }
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::same_element;
    use safetensors::Dtype as D;

    #[test]
    fn signed_zeros_are_one_value_unless_bitwise() {
        let (z, nz) = (0.0f32.to_le_bytes(), (-0.0f32).to_le_bytes());
        assert!(same_element(D::F32, &z, &nz, false));
        assert!(!same_element(D::F32, &z, &nz, true));
        let (bz, bnz) = (
            half::bf16::from_f32(0.0).to_le_bytes(),
            half::bf16::from_f32(-0.0).to_le_bytes(),
        );
        assert!(same_element(D::BF16, &bz, &bnz, false));
        assert!(!same_element(D::BF16, &bz, &bnz, true));
        // Anything else compares by bits: a zero against the smallest
        // subnormal, and NaNs of different payloads, differ.
        let tiny = f32::from_bits(1).to_le_bytes();
        assert!(!same_element(D::F32, &z, &tiny, false));
        let (n1, n2) = (f32::from_bits(0x7fc0_0000), f32::from_bits(0x7fc0_0001));
        assert!(!same_element(
            D::F32,
            &n1.to_le_bytes(),
            &n2.to_le_bytes(),
            false
        ));
        assert!(same_element(
            D::F32,
            &n1.to_le_bytes(),
            &n1.to_le_bytes(),
            false
        ));
        assert!(same_element(
            D::F64,
            &1.5f64.to_le_bytes(),
            &1.5f64.to_le_bytes(),
            true
        ));
    }
}
