//! The fuzz protocol, version 1 (`docs/fuzz-protocol.md`): what
//! `logprobe fuzz --exec` sends to an external kernel and what it accepts
//! back.
//!
//! - A [`Request`] is a dump of inputs only (names of [`crate::names`]):
//!   `logits [N, V_total]`, `tokens [N]`, `sampling_mask [N, V_total]`,
//!   `topk_ids [N, K]`, the cotangents `grad_log_probs [N]`,
//!   `grad_entropy [N]`, `grad_topk_log_probs [N, K]` when `grad_logits` is
//!   wanted, and every metadata key of [`RequestMeta`] (`outputs`, the
//!   options, `chunk_size`, `fuzz_protocol`).
//! - A [`Response`] is a safetensors file holding every wanted [`Output`]
//!   in a float dtype and the request's shape ([`Response::parse`]); other
//!   tensors are ignored. Anything else is a [`ResponseError`], a finding
//!   about the kernel, never a panic.
//! - The persistent transport frames both directions: a u64 little-endian
//!   byte length, then the dump's bytes ([`write_frame`], [`read_frame`]).
//!
//! [`Request::with_response`] joins the two into the dump `logprobe verify`
//! judges (inputs plus candidates): the fuzz judgement and the saved
//! counterexample are that one file.

use std::io::{Read, Write};

use safetensors::{Dtype as StDtype, SafeTensors};

use logprobe_reference::spec::{Columns, Dtype, EntropyLogits, TemperatureDtype};

use crate::dump::{write_dump, DumpError, DumpTensor, Metadata};
use crate::keys;
use crate::names::tensor;

/// The protocol version, sent as metadata `fuzz_protocol`. A change that
/// breaks an existing adapter gets a new number.
pub const PROTOCOL_VERSION: u32 = 1;

/// An output a request may ask for (metadata `outputs`, a comma list of
/// [`Output::name`]s): the spec's one output type.
pub use logprobe_reference::spec::Output;

/// The shape an answer's `output` must have for `N` rows, `K` top-k ids and
/// `V_total` columns: `[N]`, `[N, K]` or `[N, V_total]`.
pub fn output_shape(output: Output, n: usize, k: usize, v_total: usize) -> Vec<usize> {
    match output.columns() {
        Columns::One => vec![n],
        Columns::TopK => vec![n, k],
        Columns::Vocabulary => vec![n, v_total],
    }
}

/// The metadata of a request: every key is always sent (strings, as in
/// any dump).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestMeta {
    /// The outputs wanted (`outputs`).
    pub outputs: Vec<Output>,
    /// `temperature`, as text that parses back to the same f64.
    pub temperature: String,
    /// `temperature_dtype`.
    pub temperature_dtype: TemperatureDtype,
    /// `vocab_size` (`<= V_total`; always sent, `V_total` when unpadded).
    pub vocab_size: usize,
    /// `ignore_index`.
    pub ignore_index: i64,
    /// `entropy_logits` (sent as `unmasked` when the entropy is not wanted).
    pub entropy_logits: EntropyLogits,
    /// `chunk_size` (>= 1), for kernels that chunk rows.
    pub chunk_size: usize,
    /// `z_loss_coef` (text that parses back to the same f64), sent only
    /// when `z_loss` is wanted.
    pub z_loss_coef: Option<String>,
}

/// The inputs of one call, owned, values stored as f64 (each exactly
/// representable in its dtype).
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Dtype of `logits`.
    pub dtype: Dtype,
    /// Rows `N`.
    pub n: usize,
    /// Columns `V_total`.
    pub v_total: usize,
    /// `logits [N, V_total]`, row-major.
    pub logits: Vec<f64>,
    /// `tokens [N]` (i64).
    pub tokens: Option<Vec<i64>>,
    /// `sampling_mask [N, V_total]` (bool, `true` = allowed).
    pub sampling_mask: Option<Vec<bool>>,
    /// `topk_ids [N, K]` (i64) with `K`.
    pub topk_ids: Option<(usize, Vec<i64>)>,
    /// `grad_log_probs [N]` (f32), sent when `grad_logits` is wanted.
    pub grad_log_probs: Option<Vec<f64>>,
    /// `grad_entropy [N]` (f32), sent when `grad_logits` is wanted.
    pub grad_entropy: Option<Vec<f64>>,
    /// `grad_topk_log_probs [N, K]` (f32), sent when `grad_logits` is wanted.
    pub grad_topk_log_probs: Option<Vec<f64>>,
    /// The metadata.
    pub meta: RequestMeta,
}

impl Request {
    /// `K` (0 without `topk_ids`).
    pub fn k(&self) -> usize {
        self.topk_ids.as_ref().map_or(0, |(k, _)| *k)
    }

    /// The request restricted to `rows` (in that order; repeats allowed):
    /// every `[N, ...]` tensor takes those rows. Indices must be `< N`
    /// (others are skipped).
    pub fn select_rows(&self, rows: &[usize]) -> Request {
        let rows: Vec<usize> = rows.iter().copied().filter(|&r| r < self.n).collect();
        let take = |v: &[f64], w: usize| -> Vec<f64> {
            rows.iter()
                .flat_map(|&r| v[r * w..(r + 1) * w].iter().copied())
                .collect()
        };
        let take_i = |v: &[i64], w: usize| -> Vec<i64> {
            rows.iter()
                .flat_map(|&r| v[r * w..(r + 1) * w].iter().copied())
                .collect()
        };
        let k = self.k();
        Request {
            dtype: self.dtype,
            n: rows.len(),
            v_total: self.v_total,
            logits: take(&self.logits, self.v_total),
            tokens: self.tokens.as_ref().map(|t| take_i(t, 1)),
            sampling_mask: self.sampling_mask.as_ref().map(|m| {
                rows.iter()
                    .flat_map(|&r| m[r * self.v_total..(r + 1) * self.v_total].iter().copied())
                    .collect()
            }),
            topk_ids: self.topk_ids.as_ref().map(|(k, ids)| (*k, take_i(ids, *k))),
            grad_log_probs: self.grad_log_probs.as_ref().map(|g| take(g, 1)),
            grad_entropy: self.grad_entropy.as_ref().map(|g| take(g, 1)),
            grad_topk_log_probs: self.grad_topk_log_probs.as_ref().map(|g| take(g, k)),
            meta: self.meta.clone(),
        }
    }

    /// The request with every padded entry (columns `vocab_size..V_total`)
    /// replaced by `fill` rounded to the logits' dtype (padding is not
    /// vocabulary: any value, finite or not, must change no output).
    pub fn with_padding(&self, fill: f64) -> Request {
        let mut r = self.clone();
        let fill = self.dtype.round_f64(fill);
        for row in r.logits.chunks_mut(self.v_total.max(1)) {
            for x in row.iter_mut().skip(self.meta.vocab_size) {
                *x = fill;
            }
        }
        r
    }

    /// The tensors of the request (names of [`crate::names`]).
    pub fn tensors(&self) -> Vec<(&'static str, DumpTensor)> {
        let (n, vt, k) = (self.n, self.v_total, self.k());
        let mut t = vec![(
            tensor::LOGITS,
            DumpTensor::floats(self.dtype, &[n, vt], &self.logits),
        )];
        if let Some(tok) = &self.tokens {
            t.push((tensor::TOKENS, DumpTensor::i64s(&[n], tok)));
        }
        if let Some(m) = &self.sampling_mask {
            t.push((tensor::SAMPLING_MASK, DumpTensor::bools(&[n, vt], m)));
        }
        if let Some((_, ids)) = &self.topk_ids {
            t.push((tensor::TOPK_IDS, DumpTensor::i64s(&[n, k], ids)));
        }
        let cotangents = [
            (Output::LogProbs, &self.grad_log_probs),
            (Output::Entropy, &self.grad_entropy),
            (Output::TopkLogProbs, &self.grad_topk_log_probs),
        ];
        for (o, g) in cotangents {
            if let (Some(g), Some(name)) = (g, o.cotangent_name()) {
                let shape = output_shape(o, n, k, vt);
                t.push((name, DumpTensor::floats(Dtype::F32, &shape, g)));
            }
        }
        t
    }

    /// The metadata of the request, plus `extra` (provenance keys of the
    /// key table, e.g. `fuzz_recipe`).
    ///
    /// # Errors
    /// [`DumpError::BadMetadata`] for a `temperature` or `z_loss_coef` text
    /// that is not a number (a request built inconsistently).
    pub fn metadata(&self, extra: &Metadata) -> Result<Metadata, DumpError> {
        let m = &self.meta;
        let mut v = Metadata::new();
        v.set(keys::FORMAT_VERSION, &keys::FormatVersion::V2)
            .set(keys::FUZZ_PROTOCOL, &PROTOCOL_VERSION)
            .set(keys::OUTPUTS, &m.outputs)
            .set_text(keys::TEMPERATURE, &m.temperature)?
            .set(keys::TEMPERATURE_DTYPE, &m.temperature_dtype)
            .set(keys::VOCAB_SIZE, &m.vocab_size)
            .set(keys::IGNORE_INDEX, &m.ignore_index)
            .set(keys::ENTROPY_LOGITS, &m.entropy_logits)
            .set(keys::CHUNK_SIZE, &(m.chunk_size as u64));
        if let Some(c) = &m.z_loss_coef {
            v.set_text(keys::Z_LOSS_COEF, c)?;
        }
        v.extend(extra);
        Ok(v)
    }

    /// The bytes of the request dump (what `{in}` or an input frame holds).
    ///
    /// # Errors
    /// [`DumpError::Malformed`] when a tensor's length does not match its
    /// shape (a request built inconsistently).
    pub fn to_bytes(&self) -> Result<Vec<u8>, DumpError> {
        self.dump_bytes(None, &Metadata::new())
    }

    /// The dump of the request with the response's outputs as candidates
    /// and `extra` metadata: what `logprobe verify` judges.
    ///
    /// # Errors
    /// As [`Request::to_bytes`] and [`Request::metadata`].
    pub fn with_response(
        &self,
        response: &Response,
        extra: &Metadata,
    ) -> Result<Vec<u8>, DumpError> {
        self.dump_bytes(Some(response), extra)
    }

    fn dump_bytes(
        &self,
        response: Option<&Response>,
        extra: &Metadata,
    ) -> Result<Vec<u8>, DumpError> {
        let mut t = self.tensors();
        if let Some(r) = response {
            for (o, tensor) in &r.outputs {
                t.push((o.name(), tensor.clone()));
            }
        }
        write_dump(&t, &self.metadata(extra)?)
    }
}

/// What is wrong with a kernel's answer (a finding of kind `command`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ResponseError {
    /// Not a safetensors file.
    #[error("the output is not a safetensors dump: {reason}")]
    Malformed {
        /// safetensors' description.
        reason: String,
    },
    /// A wanted output is absent.
    #[error("output `{output}` is missing (asked for: {wanted}; the file holds: {found})")]
    Missing {
        /// The output.
        output: &'static str,
        /// The `outputs` asked for.
        wanted: String,
        /// The tensors the answer holds.
        found: String,
    },
    /// An output that is not a float tensor.
    #[error("output `{output}` has dtype {found}, expected a float dtype (F64, F32, BF16, F16)")]
    BadDtype {
        /// The output.
        output: &'static str,
        /// Its dtype.
        found: String,
    },
    /// An output of the wrong shape.
    #[error("output `{output}` has shape {found:?}, expected {expected:?}")]
    BadShape {
        /// The output.
        output: &'static str,
        /// Its shape.
        found: Vec<usize>,
        /// The request's shape for it.
        expected: Vec<usize>,
    },
}

/// A kernel's answer: every wanted output, as stored (dtype and bytes).
#[derive(Clone, Debug)]
pub struct Response {
    /// The outputs, in the order of the request's `outputs`.
    pub outputs: Vec<(Output, DumpTensor)>,
}

impl Response {
    /// Parses `bytes` as the answer to `request`: a safetensors file holding
    /// every output of `request.meta.outputs` with a float dtype and the
    /// request's shape. Other tensors and the metadata are ignored.
    ///
    /// # Errors
    /// [`ResponseError`]: not safetensors, an output missing, not a float,
    /// or of the wrong shape.
    pub fn parse(request: &Request, bytes: &[u8]) -> Result<Response, ResponseError> {
        let st = SafeTensors::deserialize(bytes).map_err(|e| ResponseError::Malformed {
            reason: e.to_string(),
        })?;
        let wanted: Vec<&str> = request.meta.outputs.iter().map(|o| o.name()).collect();
        let mut outputs = Vec::new();
        for &o in &request.meta.outputs {
            let t = st.tensor(o.name()).map_err(|_| {
                let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
                names.sort();
                ResponseError::Missing {
                    output: o.name(),
                    wanted: wanted.join(","),
                    found: if names.is_empty() {
                        "nothing".into()
                    } else {
                        names.join(",")
                    },
                }
            })?;
            if !matches!(
                t.dtype(),
                StDtype::F64 | StDtype::F32 | StDtype::BF16 | StDtype::F16
            ) {
                return Err(ResponseError::BadDtype {
                    output: o.name(),
                    found: format!("{:?}", t.dtype()),
                });
            }
            let expected = output_shape(o, request.n, request.k(), request.v_total);
            if t.shape() != expected.as_slice() {
                return Err(ResponseError::BadShape {
                    output: o.name(),
                    found: t.shape().to_vec(),
                    expected,
                });
            }
            outputs.push((
                o,
                DumpTensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                    data: t.data().to_vec(),
                },
            ));
        }
        Ok(Response { outputs })
    }

    /// The tensor of `output`, if answered.
    pub fn get(&self, output: Output) -> Option<&DumpTensor> {
        self.outputs
            .iter()
            .find(|(o, _)| *o == output)
            .map(|(_, t)| t)
    }

    /// The bytes of row `row` of `output` (`[1]`, `[K]` or `[V_total]`
    /// elements in its dtype), for bit-for-bit comparisons.
    pub fn row_bytes(&self, output: Output, row: usize) -> Option<&[u8]> {
        let t = self.get(output)?;
        let n = *t.shape.first()?;
        if row >= n {
            return None;
        }
        let w = t.data.len() / n;
        Some(&t.data[row * w..(row + 1) * w])
    }
}

/// Errors of the frame transport.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended before a whole frame (the process exited or closed
    /// its standard output).
    #[error("the stream ended {0}")]
    Eof(&'static str),
    /// A length beyond what the answer can need (garbage on stdout).
    #[error("frame length {len} bytes exceeds the limit of {limit} bytes (is the kernel printing to stdout? log to stderr)")]
    TooLong {
        /// The length read.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// An I/O error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Writes one frame: `bytes.len()` as a u64 little-endian, then `bytes`.
///
/// # Errors
/// The writer's error (a closed pipe: the process exited).
pub fn write_frame(w: &mut impl Write, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)?;
    w.flush()
}

/// Reads one frame of at most `limit` bytes.
///
/// # Errors
/// [`FrameError::Eof`] when the stream ends first, [`FrameError::TooLong`]
/// for a length above `limit`, [`FrameError::Io`].
pub fn read_frame(r: &mut impl Read, limit: u64) -> Result<Vec<u8>, FrameError> {
    read_frame_with(r, || limit)
}

/// As [`read_frame`], with the limit taken once the length has arrived
/// (a reader waiting for the answer to a request not yet sent).
///
/// # Errors
/// As [`read_frame`].
pub fn read_frame_with(
    r: &mut impl Read,
    limit: impl FnOnce() -> u64,
) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 8];
    read_exact(r, &mut len, "before a frame's length")?;
    let len = u64::from_le_bytes(len);
    let limit = limit();
    if len > limit {
        return Err(FrameError::TooLong { len, limit });
    }
    let mut buf = vec![0u8; len as usize];
    read_exact(r, &mut buf, "inside a frame")?;
    Ok(buf)
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], at: &'static str) -> Result<(), FrameError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameError::Eof(at),
        _ => FrameError::Io(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::serialize_dump;

    fn request() -> Request {
        Request {
            dtype: Dtype::Bf16,
            n: 2,
            v_total: 3,
            logits: vec![1.0, 2.0, -1.0, 0.5, 0.25, 7.0],
            tokens: Some(vec![0, 1]),
            sampling_mask: None,
            topk_ids: Some((1, vec![1, 0])),
            grad_log_probs: None,
            grad_entropy: None,
            grad_topk_log_probs: None,
            meta: RequestMeta {
                outputs: vec![Output::LogProbs, Output::TopkLogProbs],
                temperature: "0.7".into(),
                temperature_dtype: TemperatureDtype::Input,
                vocab_size: 2,
                ignore_index: -100,
                entropy_logits: EntropyLogits::Unmasked,
                chunk_size: 3,
                z_loss_coef: None,
            },
        }
    }

    fn answer(tensors: &[(&str, DumpTensor)]) -> Vec<u8> {
        serialize_dump(tensors, &[]).unwrap()
    }

    #[test]
    fn a_request_is_a_dump_of_inputs_and_joins_its_response() {
        let r = request();
        let bytes = r.to_bytes().unwrap();
        let d = crate::dump::Dump::parse_inputs(&bytes).unwrap();
        assert_eq!((d.n(), d.v_total(), d.vocab_size()), (2, 3, 2));
        let ok = answer(&[
            (
                "log_probs",
                DumpTensor::floats(Dtype::F32, &[2], &[-0.5, -0.25]),
            ),
            (
                "topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[2, 1], &[-0.5, -0.25]),
            ),
            ("extra", DumpTensor::i64s(&[1], &[3])),
        ]);
        let resp = Response::parse(&r, &ok).unwrap();
        assert_eq!(
            resp.row_bytes(Output::LogProbs, 1),
            Some(&(-0.25f32).to_le_bytes()[..])
        );
        let joined = r.with_response(&resp, &Metadata::new()).unwrap();
        let d = crate::dump::Dump::parse(&joined).unwrap();
        assert!(d.candidates.get(Output::LogProbs).is_some());
        assert!(d.candidates.get(Output::TopkLogProbs).is_some());
        // Rows select every [N, ...] tensor.
        let one = r.select_rows(&[1, 1]);
        assert_eq!(one.n, 2);
        assert_eq!(one.logits, vec![0.5, 0.25, 7.0, 0.5, 0.25, 7.0]);
        assert_eq!(one.topk_ids, Some((1, vec![0, 0])));
        assert_eq!(
            r.with_padding(f64::NEG_INFINITY).logits[5],
            f64::NEG_INFINITY
        );
    }

    #[test]
    fn bad_answers_are_typed() {
        let r = request();
        assert!(matches!(
            Response::parse(&r, b"garbage, not a dump"),
            Err(ResponseError::Malformed { .. })
        ));
        let missing = answer(&[(
            "log_probs",
            DumpTensor::floats(Dtype::F32, &[2], &[0.0, 0.0]),
        )]);
        let e = Response::parse(&r, &missing).unwrap_err();
        assert_eq!(
            e.to_string(),
            "output `topk_log_probs` is missing (asked for: log_probs,topk_log_probs; the file holds: log_probs)"
        );
        let ints = answer(&[
            ("log_probs", DumpTensor::i64s(&[2], &[0, 0])),
            (
                "topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[2, 1], &[0.0, 0.0]),
            ),
        ]);
        assert!(matches!(
            Response::parse(&r, &ints),
            Err(ResponseError::BadDtype {
                output: "log_probs",
                ..
            })
        ));
        let shape = answer(&[
            (
                "log_probs",
                DumpTensor::floats(Dtype::F32, &[1, 2], &[0.0, 0.0]),
            ),
            (
                "topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[2, 1], &[0.0, 0.0]),
            ),
        ]);
        assert!(matches!(
            Response::parse(&r, &shape),
            Err(ResponseError::BadShape {
                output: "log_probs",
                ..
            })
        ));
    }

    #[test]
    fn frames_round_trip_and_bound_their_length() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"abc").unwrap();
        write_frame(&mut buf, b"").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r, 10).unwrap(), b"abc");
        assert_eq!(read_frame(&mut r, 10).unwrap(), b"");
        assert!(matches!(read_frame(&mut r, 10), Err(FrameError::Eof(_))));
        let mut huge = &u64::MAX.to_le_bytes()[..];
        assert!(matches!(
            read_frame(&mut huge, 1 << 20),
            Err(FrameError::TooLong { .. })
        ));
        let mut cut = &[5u8, 0, 0, 0, 0, 0, 0, 0, b'x'][..];
        assert!(matches!(read_frame(&mut cut, 10), Err(FrameError::Eof(_))));
    }
}
