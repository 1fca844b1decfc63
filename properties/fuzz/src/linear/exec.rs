//! An external fused linear kernel through fuzz protocol version 2
//! (`fuzz --exec CMD --fused-linear`, docs/fuzz-protocol.md, "Version 2"):
//! the request is a dump of `hidden`, `lm_head_weight`, `lm_head_bias`,
//! `tokens` and `grad_log_probs` with `fuzz_protocol` = `2`; the answer is a
//! safetensors file of the asked outputs; request and answer joined are
//! judged by verify (its default foreign-kernel model, the declared
//! `lm_head_logits_dtype`). The transports are version 1's ([`Runner`]).

use safetensors::{Dtype as StDtype, SafeTensors};

use logprobe_kernels::linear::LinearLogits;
use logprobe_testkit::linear::{verify_bytes, IGNORE_INDEX};
use logprobe_verify::dump::{serialize_dump, DumpTensor};
use logprobe_verify::tolerance::Order;
use logprobe_verify::verify::ReportVerdict;

use super::{failing, LinearCase};
use crate::exec::Runner;
use crate::judge::{Call, Finding};
use crate::Outcome;

/// The outputs a version-2 kernel may compute, in request order.
pub const LINEAR_OUTPUTS: [&str; 6] = [
    "log_probs",
    "entropy",
    "lse",
    "grad_hidden",
    "grad_lm_head_weight",
    "grad_lm_head_bias",
];

/// `lm_head_logits_dtype`'s values: `input` or `accumulation`.
///
/// # Errors
/// Any other text, as a message.
pub fn parse_logits(s: &str) -> Result<LinearLogits, String> {
    match s.trim() {
        "input" => Ok(LinearLogits::Input),
        "accumulation" => Ok(LinearLogits::Accumulation),
        _ => Err(format!("`{s}`: expected input or accumulation")),
    }
}

/// `--require` for a fused linear kernel: whether chunk invariance is
/// required. `padding-invariant` (the default of version 1) does not apply
/// (version 2 has no padded columns).
///
/// # Errors
/// An unknown name, or `batch-invariant` (not checked in version 2 yet).
pub fn chunk_required(require: &str) -> Result<bool, String> {
    use crate::exec::Invariance;
    let list = Invariance::parse_list(require)?;
    if list.contains(&Invariance::Batch) {
        return Err(
            "--require: batch-invariant is not checked for fused linear kernels (protocol 2) yet"
                .into(),
        );
    }
    Ok(list.contains(&Invariance::Chunk))
}

/// The protocol version of fused linear requests.
pub const PROTOCOL_V2: &str = "2";

/// An external fused linear kernel.
pub struct LinearExec {
    /// How it is called.
    pub runner: Runner,
    /// What it computes (a subset of [`LINEAR_OUTPUTS`], in that order).
    pub outputs: Vec<&'static str>,
    /// Where it keeps its logits (`lm_head_logits_dtype`: the bound's declaration).
    pub logits: LinearLogits,
    /// The summation model of the bound (verify's foreign default: `lanes=8`).
    pub model: Order,
    /// Whether a lack of row-chunk invariance is a finding (`--require
    /// chunk-invariant`): the per-row outputs (`log_probs`, `entropy`,
    /// `lse`, `grad_hidden`) for the case's `chunk_size` and for one chunk
    /// of all `N` rows must agree bit for bit.
    pub chunk_invariant: bool,
}

impl std::fmt::Debug for LinearExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LinearExec({:?}, {:?})",
            self.runner.transport, self.outputs
        )
    }
}

/// An answer's outputs, in request order.
type Answer = Vec<(&'static str, DumpTensor)>;

/// A request: tensors and metadata.
pub struct LinearRequest {
    tensors: Vec<(&'static str, DumpTensor)>,
    meta: Vec<(&'static str, String)>,
    /// The outputs asked and their shapes.
    asked: Vec<(&'static str, Vec<usize>)>,
}

fn floats2(dtype: logprobe_reference::spec::Dtype, a: &ndarray::Array2<f32>) -> DumpTensor {
    let v: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    DumpTensor::floats(dtype, &[a.nrows(), a.ncols()], &v)
}

impl LinearRequest {
    /// The request's bytes, or (with an answer) the joined dump's, without
    /// the request-only `outputs` key and with `extra` metadata (a finding's
    /// provenance).
    fn bytes(
        &self,
        answer: Option<&[(&'static str, DumpTensor)]>,
        extra: &[(&str, &str)],
    ) -> Vec<u8> {
        let mut t: Vec<(&str, DumpTensor)> =
            self.tensors.iter().map(|(n, d)| (*n, d.clone())).collect();
        t.extend(answer.unwrap_or(&[]).iter().map(|(n, d)| (*n, d.clone())));
        let mut meta: Vec<(&str, &str)> = self
            .meta
            .iter()
            .filter(|(k, _)| answer.is_none() || *k != "outputs")
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        meta.extend_from_slice(extra);
        // Only float and i64 tensors of consistent sizes: serialising cannot fail.
        serialize_dump(&t, &meta).unwrap_or_default()
    }
}

impl LinearExec {
    /// The request of `case` (see the module docs).
    pub fn request(&self, case: &LinearCase) -> LinearRequest {
        let x = case.recipe.inputs();
        let (n, h, v) = (case.recipe.n, case.recipe.h, case.recipe.v);
        let has_bias = x.bias.is_some();
        let asked: Vec<(&'static str, Vec<usize>)> = self
            .outputs
            .iter()
            .filter(|o| has_bias || **o != "grad_lm_head_bias")
            .map(|&o| {
                let shape = match o {
                    "grad_hidden" => vec![n, h],
                    "grad_lm_head_weight" => vec![v, h],
                    "grad_lm_head_bias" => vec![v],
                    _ => vec![n],
                };
                (o, shape)
            })
            .collect();
        let mut tensors = vec![
            ("hidden", floats2(x.dtype, &x.hidden)),
            ("lm_head_weight", floats2(x.dtype, &x.weight)),
            (
                "tokens",
                DumpTensor::i64s(&[n], x.tokens.as_slice().unwrap_or(&[])),
            ),
        ];
        if let Some(b) = &x.bias {
            let vals: Vec<f64> = b.iter().map(|&y| f64::from(y)).collect();
            tensors.push(("lm_head_bias", DumpTensor::floats(x.dtype, &[v], &vals)));
        }
        if asked.iter().any(|(o, _)| o.starts_with("grad_")) {
            tensors.push((
                "grad_log_probs",
                DumpTensor::floats(logprobe_reference::spec::Dtype::F32, &[n], &x.cot),
            ));
        }
        let mut meta = vec![
            ("format_version", "2".to_string()),
            ("fuzz_protocol", PROTOCOL_V2.to_string()),
            (
                "outputs",
                asked.iter().map(|(o, _)| *o).collect::<Vec<_>>().join(","),
            ),
            ("temperature", crate::grammar::num(x.temperature)),
            ("ignore_index", IGNORE_INDEX.to_string()),
            ("chunk_size", case.row_chunk.to_string()),
            (
                "lm_head_logits_dtype",
                match self.logits {
                    LinearLogits::Input => "input",
                    LinearLogits::Accumulation => "accumulation",
                }
                .to_string(),
            ),
        ];
        if let Some(c) = x.softcap {
            meta.push(("softcap", crate::grammar::num(c)));
        }
        LinearRequest {
            tensors,
            meta,
            asked,
        }
    }

    /// The asked outputs read off an answer.
    ///
    /// # Errors
    /// What is wrong with the answer, as text.
    fn answer(
        &self,
        r: &LinearRequest,
        bytes: &[u8],
    ) -> Result<Vec<(&'static str, DumpTensor)>, String> {
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| format!("the output is not a safetensors dump: {e}"))?;
        let mut out = Vec::new();
        for (name, shape) in &r.asked {
            let t = st.tensor(name).map_err(|_| {
                format!(
                    "output `{name}` is missing (asked for: {}; the file holds: {})",
                    r.asked
                        .iter()
                        .map(|(o, _)| *o)
                        .collect::<Vec<_>>()
                        .join(", "),
                    st.names().join(", ")
                )
            })?;
            if !matches!(
                t.dtype(),
                StDtype::F64 | StDtype::F32 | StDtype::BF16 | StDtype::F16
            ) {
                return Err(format!(
                    "output `{name}` has dtype {:?}, expected a float dtype",
                    t.dtype()
                ));
            }
            if t.shape() != shape.as_slice() {
                return Err(format!(
                    "output `{name}` has shape {:?}, expected {shape:?}",
                    t.shape()
                ));
            }
            out.push((
                *name,
                DumpTensor {
                    dtype: t.dtype(),
                    shape: shape.clone(),
                    data: t.data().to_vec(),
                },
            ));
        }
        Ok(out)
    }

    /// Calls the kernel on `case`: the joined dump's bytes (with `extra`
    /// metadata), or a `command` finding.
    ///
    /// # Errors
    /// A [`Finding`] of property `command`.
    pub fn call(&self, case: &LinearCase, extra: &[(&str, &str)]) -> Result<Vec<u8>, Finding> {
        let (r, answer) = self.ask(case)?;
        Ok(r.bytes(Some(&answer), extra))
    }

    /// One call on `case`: the request and the answer's outputs.
    fn ask(&self, case: &LinearCase) -> Result<(LinearRequest, Answer), Finding> {
        let command = |detail: String| Finding {
            property: "command",
            call: Call::Exec,
            detail,
        };
        let r = self.request(case);
        let (n, h, v) = (case.recipe.n, case.recipe.h, case.recipe.v);
        let limit = (8 * (3 * n + n * h + v * h + v) + (1 << 20)) as u64;
        let out = self
            .runner
            .call(&r.bytes(None, &[]), limit)
            .map_err(|e| command(e.to_string()))?;
        let answer = self.answer(&r, &out).map_err(command)?;
        Ok((r, answer))
    }

    /// Row-chunk invariance: the answer for one chunk of all `N` rows
    /// against `base` (`None` where it holds or does not apply).
    fn chunk_lack(&self, case: &LinearCase, base: &Answer) -> Result<Option<String>, Finding> {
        let n = case.recipe.n.max(1);
        if !self.chunk_invariant || case.row_chunk == n {
            return Ok(None);
        }
        let whole = LinearCase {
            row_chunk: n,
            ..case.clone()
        };
        let (_, other) = self.ask(&whole)?;
        // Per-row outputs only: the weight and bias gradients sum over rows,
        // in an order the chunking may set.
        let per_row = |name: &str| !name.starts_with("grad_lm_head");
        for ((name, a), (_, b)) in base.iter().zip(&other) {
            if per_row(name) && (a.dtype != b.dtype || a.data != b.data) {
                let size = (a.dtype.bitsize() / 8).max(1);
                let at = a
                    .data
                    .chunks(size)
                    .zip(b.data.chunks(size))
                    .position(|(x, y)| x != y)
                    .unwrap_or(0);
                return Ok(Some(format!(
                    "{name}: element {at} differs between chunk_size {} and chunk_size {n} (dtypes {:?} and {:?})",
                    case.row_chunk, a.dtype, b.dtype
                )));
            }
        }
        Ok(None)
    }

    /// Judges `case`: one call, the joined dump verified.
    ///
    /// # Errors
    /// A `command` or `oracle agreement` [`Finding`].
    pub fn judge(&self, case: &LinearCase) -> Result<Outcome, Finding> {
        if self.outputs.is_empty() {
            return Ok(Outcome::NotJudged);
        }
        let (r, answer) = self.ask(case)?;
        let joined = r.bytes(Some(&answer), &[]);
        let report = verify_bytes(&joined, "exec", self.model).map_err(|e| Finding {
            property: "command",
            call: Call::Exec,
            detail: format!("the answer does not verify: {e}"),
        })?;
        match report.verdict {
            ReportVerdict::Fail => Err(Finding {
                property: "oracle agreement",
                call: Call::Exec,
                detail: failing(&report),
            }),
            ReportVerdict::NoBound | ReportVerdict::Unchecked => Ok(Outcome::NotJudged),
            ReportVerdict::Pass | ReportVerdict::Suspect => {
                if let Some(detail) = self.chunk_lack(case, &answer)? {
                    return Err(Finding {
                        property: "chunk-size invariance",
                        call: Call::Invariance,
                        detail,
                    });
                }
                Ok(Outcome::Pass(
                    report
                        .outputs
                        .iter()
                        .filter_map(|o| o.max_ratio)
                        .fold(0.0, f64::max),
                ))
            }
        }
    }
}
