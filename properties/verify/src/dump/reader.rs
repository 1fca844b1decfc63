//! [`Dump`]: the parsed, shape-checked dump, keyed per [`Output`] for its
//! candidates and cotangents, and its reader ([`Dump::parse`]).

use std::collections::HashMap;

use ndarray::{Array1, Array2};
use safetensors::{Dtype as StDtype, SafeTensors};

use logprobe_reference::spec::{
    Columns, Dtype, EntropyLogits, LossOptions, MeanAllIgnored, MeanDivisor, Options, Output,
    PerOutput, PolicyTerm, Reduction, SoftcapDtype, SpecError, TemperatureDtype, TopkKl,
    DEFAULT_IGNORE_INDEX,
};

use super::*;

/// A parsed, shape-checked dump. `N` rows, `V_total` columns of logits.
pub struct Dump<'a> {
    /// `logits [N, V_total]`.
    pub logits: FloatMatrix<'a>,
    /// `tokens [N]` as i64.
    pub tokens: Option<Array1<i64>>,
    /// `sampling_mask [N, V_total]`.
    pub sampling_mask: Option<MaskMatrix<'a>>,
    /// `topk_ids [N, K]` as i64.
    pub topk_ids: Option<Array2<i64>>,
    /// `teacher_topk_log_probs [N, K]` as exact f64 (only with a
    /// `forward_kl` or `reverse_kl` candidate).
    pub teacher_topk_log_probs: Option<Array2<f64>>,
    /// The candidate outputs, `[N, width]` each (`log_probs [N]` and
    /// `entropy [N]` as width 1, `topk_log_probs [N, K]`, `grad_logits
    /// [N, V_total]`), left in the file and decoded row by row, each with
    /// the dtype it was dumped in (ulps are counted in it). A
    /// [reduced](Output::reduced) output (`loss` under `sum` / `mean`,
    /// stored `[]` or `[1]`) is `[1, 1]`: one value for the whole dump.
    pub candidates: PerOutput<FloatMatrix<'a>>,
    /// `loss_weights [N]` as exact f64 (only with a `loss` candidate).
    pub loss_weights: Option<Array1<f64>>,
    /// `ref_log_probs [N]`, `old_log_probs [N]` as exact f64 (the policy
    /// terms' inputs; each only with a term or cotangent that needs it).
    pub policy: [Option<Array1<f64>>; 2],
    /// The upstream cotangents (`grad_log_probs [N]`, `grad_entropy [N]`,
    /// `grad_topk_log_probs [N, K]`, `grad_lse [N]`, `grad_z_loss [N]`,
    /// `grad_loss` `[N]` under `reduction = none`) as exact f64 `[N, width]`,
    /// keyed by the output they are the cotangent of; `grad_loss` under
    /// `sum` / `mean` (stored `[]` or `[1]`) is `[1, 1]`.
    pub cotangents: PerOutput<Array2<f64>>,
    /// Options from the metadata. `entropy` is `Some` exactly when the
    /// entropy or its cotangent is in the dump.
    pub options: Options,
    /// Tensors in the file that the format does not define: always empty
    /// (an unknown name is bad input, [`crate::names`]).
    pub ignored_tensors: Vec<String>,
    /// Row dimensions: `[N]`, or `[B, T]` for `[B, T, V]` logits.
    pub row_shape: crate::shapes::RowShape,
    /// `row_mask` (`[N]` flattened): rows excluded (false) from every check.
    pub row_mask: Option<Vec<bool>>,
    /// Version-2 format options (`cotangent_reduction`, `topk_ids_source`, ...).
    pub format: crate::format::FormatOptions,
    /// The divisor `W` of a `mean` loss over every row of the dump, summed
    /// once (exact), when `grad_loss` is given under `reduction = mean`:
    /// each one-row view's gradient divides by it.
    pub loss_divisor: Option<MeanDivisor>,
}

/// The tensor names the format defines.
pub const TENSOR_NAMES: [&str; 11] = [
    "logits",
    "tokens",
    "sampling_mask",
    "log_probs",
    "entropy",
    "topk_ids",
    "topk_log_probs",
    "grad_log_probs",
    "grad_entropy",
    "grad_topk_log_probs",
    "grad_logits",
];

/// Why the data section does not match the header (truncated or extended
/// file), naming the first tensor that reaches past the end. Reads only the
/// header (already checked to be valid JSON by safetensors).
pub(crate) fn describe_size_mismatch(bytes: &[u8]) -> String {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("checked by safetensors")) as usize;
    let data_len = bytes.len() - 8 - n;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap_or_default();
    let mut ends: Vec<(u64, &str)> = header
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(name, info)| {
            Some((info.get("data_offsets")?.get(1)?.as_u64()?, name.as_str()))
        })
        .collect();
    ends.sort();
    let declared = ends.last().map_or(0, |e| e.0);
    match ends.iter().find(|(end, _)| *end > data_len as u64) {
        Some((end, name)) => format!(
            "truncated file: tensor `{name}` ends at data byte {end}, the file holds {data_len} data bytes (header declares {declared})"
        ),
        None => format!("the file holds {data_len} data bytes, the header declares {declared} (trailing bytes)"),
    }
}

pub(crate) fn malformed(e: safetensors::SafeTensorError) -> DumpError {
    DumpError::Malformed {
        reason: e.to_string(),
    }
}

pub(crate) fn parse_meta<T: std::str::FromStr>(
    meta: &HashMap<String, String>,
    key: &'static str,
    reason: &'static str,
) -> Result<Option<T>, DumpError> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|_| DumpError::BadMetadata {
                key,
                value: v.clone(),
                reason,
            }),
    }
}

impl<'a> Dump<'a> {
    /// Parses `bytes` (a whole safetensors file). See [`DumpFile::parse`].
    ///
    /// # Errors
    /// See [`DumpFile::parse`].
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DumpError> {
        Self::parse_with(bytes, true)
    }

    /// Parses a file of inputs only (a golden fixture): as [`Dump::parse`]
    /// without requiring a candidate; the entropy option is then
    /// `Some(entropy_logits)`.
    ///
    /// # Errors
    /// As [`Dump::parse`] but never [`DumpError::NoCandidate`].
    pub fn parse_inputs(bytes: &'a [u8]) -> Result<Self, DumpError> {
        Self::parse_with(bytes, false)
    }

    fn parse_with(bytes: &'a [u8], require_candidate: bool) -> Result<Self, DumpError> {
        let Header { st, meta, format } = Header::read(bytes)?;
        let get = |name: &str| st.tensor(name).ok();

        let logits_t = get("logits").ok_or(DumpError::MissingTensor {
            tensor: "logits",
            why: "",
        })?;
        let ldtype = st_float(logits_t.dtype()).ok_or_else(|| DumpError::BadDtype {
            tensor: "logits",
            found: format!("{:?}", logits_t.dtype()),
            expected: "F64, F32, BF16 or F16",
        })?;
        let (rs, v) = crate::shapes::RowShape::of_logits(logits_t.shape())?;
        let n = rs.n;
        let logits = FloatMatrix {
            dtype: ldtype,
            rows: n,
            cols: v,
            data: logits_t.data(),
        };

        let tokens = match get("tokens") {
            None => None,
            Some(t) => {
                rs.expect("tokens", t.shape(), &[])?;
                Some(Array1::from(decode_ids("tokens", t.dtype(), t.data())?))
            }
        };

        let sampling_mask = match get("sampling_mask") {
            None => None,
            Some(t) => {
                match t.dtype() {
                    StDtype::BOOL | StDtype::U8 => {}
                    other => {
                        return Err(DumpError::BadDtype {
                            tensor: "sampling_mask",
                            found: format!("{other:?}"),
                            expected: "BOOL or U8",
                        })
                    }
                };
                rs.expect("sampling_mask", t.shape(), &[('V', v)])?;
                Some(MaskMatrix {
                    cols: v,
                    data: t.data(),
                })
            }
        };

        let topk_ids = match get("topk_ids") {
            None => None,
            Some(t) => {
                let k = rs.trailing("topk_ids", t.shape())?;
                let ids = decode_ids("topk_ids", t.dtype(), t.data())?;
                Some(Array2::from_shape_vec((n, k), ids).expect("size checked by safetensors"))
            }
        };
        let k = topk_ids.as_ref().map(|a| a.ncols());

        // A float tensor `[N, width]` (a per-row one stored `[N]`).
        // `(matrix, Some(width))` for a `[]` / `[1]` cotangent broadcast
        // under `cotangent_reduction=sum` (stored as one element).
        type Read<'a> = Option<(FloatMatrix<'a>, Option<usize>)>;
        let float = |name: &'static str,
                     columns: Columns,
                     cotangent: bool|
         -> Result<Read<'a>, DumpError> {
            let Some(t) = get(name) else { return Ok(None) };
            let dtype = st_float(t.dtype()).ok_or_else(|| DumpError::BadDtype {
                tensor: name,
                found: format!("{:?}", t.dtype()),
                expected: "F64, F32, BF16 or F16",
            })?;
            let summed = match columns {
                Columns::One if cotangent => {
                    rs.cotangent(name, t.shape(), &[], format.cotangent_sum)?
                }
                Columns::One => {
                    rs.expect(name, t.shape(), &[])?;
                    false
                }
                Columns::TopK => {
                    let Some(k) = k else {
                        return Err(DumpError::MissingTensor {
                            tensor: "topk_ids",
                            why: " (needed by top-k tensors)",
                        });
                    };
                    if cotangent {
                        rs.cotangent(name, t.shape(), &[('K', k)], format.cotangent_sum)?
                    } else {
                        rs.expect(name, t.shape(), &[('K', k)])?;
                        false
                    }
                }
                Columns::Vocabulary => {
                    rs.expect(name, t.shape(), &[('V', v)])?;
                    false
                }
            };
            let cols = match columns {
                Columns::One => 1,
                Columns::TopK => k.expect("checked above"),
                Columns::Vocabulary => v,
            };
            Ok(Some((
                FloatMatrix {
                    dtype,
                    rows: if summed { 1 } else { n },
                    cols: if summed { 1 } else { cols },
                    data: t.data(),
                },
                summed.then_some(cols),
            )))
        };
        let mut candidates = PerOutput::new();
        for o in Output::ALL.into_iter().filter(|&o| o != Output::Loss) {
            if let Some((m, _)) = float(o.name(), o.columns(), false)? {
                candidates.insert(o, m);
            }
        }
        // `loss`: `[N]` under `none`, one value under `sum` / `mean`.
        let loss_options = parse_loss_options(&meta)?;
        if let Some(t) = get("loss") {
            let dtype = st_float(t.dtype()).ok_or_else(|| DumpError::BadDtype {
                tensor: "loss",
                found: format!("{:?}", t.dtype()),
                expected: "F64, F32, BF16 or F16",
            })?;
            let rows = match loss_options.reduction {
                Reduction::None => {
                    rs.expect("loss", t.shape(), &[])?;
                    n
                }
                r => {
                    r.check_shape(t.shape(), n)?;
                    1
                }
            };
            candidates.insert(
                Output::Loss,
                FloatMatrix {
                    dtype,
                    rows,
                    cols: 1,
                    data: t.data(),
                },
            );
        }
        let grad_loss = get("grad_loss").is_some();
        let loss_weights = match get("loss_weights") {
            None => None,
            Some(_) if !candidates.contains(Output::Loss) && !grad_loss => {
                return Err(DumpError::MissingTensor {
                    tensor: "loss",
                    why: " (loss_weights weigh it)",
                })
            }
            Some(t) => {
                let dtype = st_float(t.dtype()).ok_or_else(|| DumpError::BadDtype {
                    tensor: "loss_weights",
                    found: format!("{:?}", t.dtype()),
                    expected: "F64, F32, BF16 or F16",
                })?;
                rs.expect("loss_weights", t.shape(), &[])?;
                Some(Array1::from(decode_floats(dtype, t.data())))
            }
        };
        // The policy terms' inputs: each with a term (or its cotangent)
        // that needs it, and such a term needs it.
        let mut policy: [Option<Array1<f64>>; 2] = [None, None];
        for (slot, (name, old)) in [("ref_log_probs", false), ("old_log_probs", true)]
            .into_iter()
            .enumerate()
        {
            let needed_by = PolicyTerm::ALL.into_iter().find(|t| {
                t.uses_old() == old
                    && (candidates.contains(t.output())
                        || t.output()
                            .cotangent_name()
                            .is_some_and(|c| get(c).is_some()))
            });
            match (get(name), needed_by) {
                (None, None) => {}
                (None, Some(t)) => {
                    return Err(DumpError::MissingTensor {
                        tensor: name,
                        why: if old {
                            " (needed by ratio)"
                        } else {
                            match t {
                                PolicyTerm::K1 => " (needed by kl_k1)",
                                PolicyTerm::K2 => " (needed by kl_k2)",
                                PolicyTerm::K3 => " (needed by kl_k3)",
                                _ => " (needed by kl_abs)",
                            }
                        },
                    })
                }
                (Some(_), None) => {
                    return Err(DumpError::MissingTensor {
                        tensor: if old { "ratio" } else { "kl_k1" },
                        why: if old {
                            " (or grad_ratio: old_log_probs is the input of ratio)"
                        } else {
                            " (or kl_k2, kl_k3, kl_abs, a grad_kl_*: ref_log_probs is their input)"
                        },
                    })
                }
                (Some(t), Some(_)) => {
                    let dtype = st_float(t.dtype()).ok_or_else(|| DumpError::BadDtype {
                        tensor: name,
                        found: format!("{:?}", t.dtype()),
                        expected: "F64, F32, BF16 or F16",
                    })?;
                    rs.expect(name, t.shape(), &[])?;
                    policy[slot] = Some(Array1::from(decode_floats(dtype, t.data())));
                }
            }
        }
        let want_kl = candidates.contains(Output::ForwardKl)
            || candidates.contains(Output::ReverseKl)
            || get("grad_forward_kl").is_some()
            || get("grad_reverse_kl").is_some();
        let teacher = match get("teacher_topk_log_probs") {
            None if want_kl => {
                return Err(DumpError::MissingTensor {
                    tensor: "teacher_topk_log_probs",
                    why: " (needed by forward_kl, reverse_kl and their cotangents)",
                })
            }
            None => None,
            Some(_) if !want_kl => {
                return Err(DumpError::MissingTensor {
                    tensor: "forward_kl",
                    why: " (or reverse_kl, or a grad_forward_kl / grad_reverse_kl: teacher_topk_log_probs is judged through them)",
                })
            }
            Some(_) => {
                let (m, _) =
                    float("teacher_topk_log_probs", Columns::TopK, false)?.expect("present");
                Some((m.dtype, m.to_array()))
            }
        };
        let mut cotangents = PerOutput::new();
        for o in Output::ALL {
            if o == Output::Loss && loss_options.reduction != Reduction::None {
                // The cotangent of one reduced value: `[]` or `[1]`, kept `[1, 1]`.
                if let Some(t) = get("grad_loss") {
                    let m =
                        reduced_cotangent(t.shape(), t.dtype(), t.data(), loss_options.reduction)?;
                    cotangents.insert(o, m);
                }
                continue;
            }
            if let Some(name) = o.cotangent_name() {
                if let Some((m, summed)) = float(name, o.columns(), true)? {
                    let a = match summed {
                        // One value, broadcast to every element.
                        Some(cols) => Array2::from_elem(
                            (n, cols),
                            m.to_array().first().copied().unwrap_or(0.0),
                        ),
                        None => m.to_array(),
                    };
                    cotangents.insert(o, a);
                }
            }
        }

        let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
        names.sort();
        if require_candidate && !(format.topk_kernel && topk_ids.is_some()) && candidates.is_empty()
        {
            return Err(DumpError::NoCandidate { tensors: names });
        }
        let ignored_tensors = Vec::new();
        let row_mask = match get("row_mask") {
            None => None,
            Some(t) => {
                rs.expect("row_mask", t.shape(), &[])?;
                Some(crate::shapes::decode_flags(
                    "row_mask",
                    t.dtype(),
                    t.data(),
                )?)
            }
        };
        if format.topk_kernel && topk_ids.is_none() {
            return Err(DumpError::MissingTensor {
                tensor: "topk_ids",
                why: " (needed by topk_ids_source=kernel)",
            });
        }

        // Inputs each candidate needs.
        let needs_tokens = |per: &PerOutput<_>| {
            per.contains(Output::LogProbs)
                || PolicyTerm::ALL
                    .into_iter()
                    .any(|t| per.contains(t.output()))
        };
        // The loss is computed for its candidate or its cotangent.
        let loss = candidates.contains(Output::Loss) || cotangents.contains(Output::Loss);
        if (needs_tokens(&candidates)
            || loss
            || cotangents.contains(Output::LogProbs)
            || PolicyTerm::ALL
                .into_iter()
                .any(|t| cotangents.contains(t.output())))
            && tokens.is_none()
        {
            let why = if needs_tokens(&candidates) {
                " (needed by log_probs and the policy terms)"
            } else if candidates.contains(Output::Loss) {
                " (needed by loss)"
            } else if loss {
                " (needed by grad_loss)"
            } else if cotangents.contains(Output::LogProbs) {
                " (needed by grad_log_probs)"
            } else {
                " (needed by grad_kl_k1 .. grad_ratio)"
            };
            return Err(DumpError::MissingTensor {
                tensor: "tokens",
                why,
            });
        }
        if candidates.contains(Output::GradLogits) && cotangents.is_empty() {
            return Err(DumpError::Spec(SpecError::NoCotangent {
                what: "grad_logits given without grad_log_probs, grad_entropy, grad_topk_log_probs, grad_lse, grad_z_loss, grad_loss, a policy term's (grad_kl_k1 .. grad_ratio) or a top-k KL's (grad_forward_kl, grad_reverse_kl)",
            }));
        }
        // Cotangents are judged only through grad_logits: without it they
        // are inert, but still read (and validated) so mistakes surface.

        let want_entropy = candidates.contains(Output::Entropy)
            || cotangents.contains(Output::Entropy)
            || !require_candidate;
        let mut options = parse_options(&meta, want_entropy, v, ldtype)?;
        // An output is computed for its candidate or its cotangent.
        options.lse = candidates.contains(Output::Lse) || cotangents.contains(Output::Lse);
        if candidates.contains(Output::ZLoss) || cotangents.contains(Output::ZLoss) {
            options.z_loss_coef = Some(parse_z_loss_coef(&meta, ldtype)?);
        }
        // Read (and rejected when malformed) even when no output uses
        // them, as every other key is.
        parse_meta::<f64>(&meta, "z_loss_coef", "not a number")?;
        let renormalized =
            parse_meta::<bool>(&meta, "kl_renormalized", "not true or false")?.unwrap_or(false);
        options.loss = loss.then_some(loss_options);
        // A mean's gradient divides by the whole dump's `W`, summed once
        // here for every one-row view ([`Dump::row`]).
        let loss_divisor = match (cotangents.contains(Output::Loss), loss_options.reduction) {
            (true, Reduction::Mean) => {
                let ii = options.ignore_index;
                let counted = |r: usize| tokens.as_ref().is_some_and(|t| t[r] != ii);
                let w = |r: usize| loss_weights.as_ref().map_or(1.0, |w| w[r]);
                Some(MeanDivisor::new((0..n).map(|r| {
                    if counted(r) {
                        w(r)
                    } else {
                        0.0
                    }
                }))?)
            }
            _ => None,
        };
        options.policy_clamps = parse_policy_clamps(&meta)?;
        options.topk_kl = teacher.as_ref().map(|(dtype, _)| TopkKl {
            forward: candidates.contains(Output::ForwardKl),
            reverse: candidates.contains(Output::ReverseKl),
            renormalized,
            teacher_dtype: *dtype,
        });
        Ok(Dump {
            logits,
            tokens,
            sampling_mask,
            topk_ids,
            teacher_topk_log_probs: teacher.map(|t| t.1),
            candidates,
            loss_weights,
            policy,
            cotangents,
            options,
            ignored_tensors,
            row_shape: rs,
            row_mask,
            format,
            loss_divisor,
        })
    }

    /// Rows `N`.
    pub fn n(&self) -> usize {
        self.logits.rows
    }

    /// Columns of `logits`, padding included (`V_total`).
    pub fn v_total(&self) -> usize {
        self.logits.cols
    }

    /// Real vocabulary size (`vocab_size` metadata, default `V_total`).
    pub fn vocab_size(&self) -> usize {
        self.options.vocab_size.unwrap_or(self.logits.cols)
    }

    /// Row `row`'s inputs, decoded (O(V) memory). Panics if `row >= N`.
    ///
    /// # Errors
    /// [`DumpError::BadMaskValue`].
    pub fn row(&self, row: usize) -> Result<RowInputs, DumpError> {
        Ok(RowInputs {
            row,
            logits: self.logits.row_logits(row),
            tokens: self.tokens.as_ref().map(|a| Array1::from(vec![a[row]])),
            sampling_mask: self
                .sampling_mask
                .as_ref()
                .map(|m| m.row(row))
                .transpose()?,
            topk_ids: self
                .topk_ids
                .as_ref()
                .map(|a| a.row(row).to_owned().insert_axis(ndarray::Axis(0))),
            teacher_topk_log_probs: self
                .teacher_topk_log_probs
                .as_ref()
                .map(|a| a.row(row).to_owned().insert_axis(ndarray::Axis(0))),
            options: self.options,
            loss_weights: self
                .loss_weights
                .as_ref()
                .map(|w| Array1::from(vec![w[row]])),
            cotangents: self.cotangents.as_ref().map(|o, a| {
                // A reduced loss's `[1, 1]` cotangent is every row's.
                let r = if a.nrows() == 1 && o == Output::Loss {
                    0
                } else {
                    row
                };
                a.row(r).to_owned().insert_axis(ndarray::Axis(0))
            }),
            loss_divisor: self.loss_divisor.clone(),
            policy: self
                .policy
                .each_ref()
                .map(|a| a.as_ref().map(|a| Array1::from(vec![a[row]]))),
        })
    }

    /// Whether row `row` has a log-prob to check (tokens present, token not
    /// `ignore_index`).
    pub fn has_target(&self, row: usize) -> bool {
        self.tokens
            .as_ref()
            .is_some_and(|t| t[row] != self.options.ignore_index)
    }
}

/// `grad_loss` under `reduction = sum | mean`: the cotangent of one value,
/// stored `[]` or `[1]` in a float dtype, as exact f64 `[1, 1]`.
///
/// # Errors
/// [`DumpError::BadDtype`], [`DumpError::BadShape`] (naming `grad_loss`).
fn reduced_cotangent(
    shape: &[usize],
    dtype: StDtype,
    data: &[u8],
    reduction: Reduction,
) -> Result<Array2<f64>, DumpError> {
    let dtype = st_float(dtype).ok_or_else(|| DumpError::BadDtype {
        tensor: "grad_loss",
        found: format!("{dtype:?}"),
        expected: "F64, F32, BF16 or F16",
    })?;
    if !(shape.is_empty() || shape == [1]) {
        return Err(DumpError::BadShape {
            tensor: "grad_loss",
            found: shape.to_vec(),
            expected: format!(
                "[] or [1] (the cotangent of the one loss value under reduction={reduction})"
            ),
        });
    }
    let v = decode_floats(dtype, data);
    Ok(Array2::from_shape_vec((1, 1), v).expect("one element checked by safetensors"))
}

/// The loss options from the metadata (read whether or not the dump holds
/// a `loss`, so a bad value is reported either way): `reduction` (`none`
/// default, `sum`, `mean`), `label_smoothing` (a number in `[0, 1]`,
/// default 0), `mean_all_ignored` (`nan` default, `zero`).
///
/// # Errors
/// [`DumpError::Spec`] with [`SpecError::UnknownReduction`],
/// [`SpecError::BadLabelSmoothing`] or [`SpecError::UnknownMeanAllIgnored`];
/// [`DumpError::BadMetadata`] for a `label_smoothing` that is not a number.
fn parse_loss_options(meta: &HashMap<String, String>) -> Result<LossOptions, DumpError> {
    let mut o = LossOptions::default();
    if let Some(r) = meta.get("reduction") {
        o.reduction = r.trim().parse::<Reduction>()?;
    }
    if let Some(e) = parse_meta::<f64>(meta, "label_smoothing", "not a number")? {
        if !(0.0..=1.0).contains(&e) {
            return Err(SpecError::BadLabelSmoothing { label_smoothing: e }.into());
        }
        o.label_smoothing = e;
    }
    if let Some(m) = meta.get("mean_all_ignored") {
        o.mean_all_ignored = m.trim().parse::<MeanAllIgnored>()?;
    }
    Ok(o)
}

/// The policy terms' clamps (`kl_input_clamp`, `kl_output_clamp`,
/// `ratio_log_clamp`: numbers, each optional; their range is the spec's,
/// [`logprobe_reference::spec::PolicyClamps::effective`]).
///
/// # Errors
/// [`DumpError::BadMetadata`] for a value that is not a number.
fn parse_policy_clamps(
    meta: &HashMap<String, String>,
) -> Result<logprobe_reference::spec::PolicyClamps, DumpError> {
    let one = |key: &'static str| parse_meta::<f64>(meta, key, "not a number");
    Ok(logprobe_reference::spec::PolicyClamps {
        kl_input: one("kl_input_clamp")?,
        kl_output: one("kl_output_clamp")?,
        ratio_log: one("ratio_log_clamp")?,
    })
}

/// `z_loss_coef` (required with a `z_loss` tensor): a float `>= 0`,
/// finite once rounded to the accumulation dtype of `dtype` logits.
fn parse_z_loss_coef(meta: &HashMap<String, String>, dtype: Dtype) -> Result<f64, DumpError> {
    let bad = |reason| DumpError::BadMetadata {
        key: "z_loss_coef",
        value: meta.get("z_loss_coef").cloned().unwrap_or_default(),
        reason,
    };
    let c = parse_meta::<f64>(meta, "z_loss_coef", "not a number")?
        .ok_or_else(|| bad("required by the z_loss tensor"))?;
    let r = dtype.accumulation().round_f64(c);
    if !(r.is_finite() && r >= 0.0) {
        return Err(bad("must be finite and >= 0"));
    }
    Ok(c)
}

/// Options from the `__metadata__` strings (defaults per the format).
pub(crate) fn parse_options(
    meta: &HashMap<String, String>,
    entropy: bool,
    v_total: usize,
    dtype: Dtype,
) -> Result<Options, DumpError> {
    let mut o = Options {
        ignore_index: DEFAULT_IGNORE_INDEX,
        ..Options::default()
    };
    if let Some(t) = parse_meta::<f64>(meta, "temperature", "not a number")? {
        if !(t.is_finite() && t > 0.0) {
            return Err(DumpError::BadMetadata {
                key: "temperature",
                value: meta["temperature"].clone(),
                reason: "must be finite and > 0",
            });
        }
        crate::temperature::check_value(&meta["temperature"], t, dtype)?;
        o.temperature = t;
    }
    if let Some(vs) = parse_meta::<usize>(meta, "vocab_size", "not a non-negative integer")? {
        if vs > v_total || (vs == 0 && v_total > 0) {
            return Err(DumpError::BadMetadata {
                key: "vocab_size",
                value: meta["vocab_size"].clone(),
                reason: "must be in [1, V] (V = columns of logits)",
            });
        }
        o.vocab_size = Some(vs);
    }
    if let Some(ii) = parse_meta::<i64>(meta, "ignore_index", "not an integer")? {
        o.ignore_index = ii;
    }
    let which = match meta.get("entropy_logits").map(|s| s.trim()) {
        None | Some("unmasked") => EntropyLogits::Unmasked,
        Some("masked") => EntropyLogits::Masked,
        Some(other) => {
            return Err(DumpError::BadMetadata {
                key: "entropy_logits",
                value: other.to_string(),
                reason: "expected `unmasked` or `masked`",
            })
        }
    };
    o.entropy = entropy.then_some(which);
    o.temperature_dtype = match meta.get("temperature_dtype").map(|s| s.trim()) {
        None | Some("accumulation") => TemperatureDtype::Accumulation,
        Some("input") => TemperatureDtype::Input,
        Some(other) => {
            return Err(DumpError::BadMetadata {
                key: "temperature_dtype",
                value: other.to_string(),
                reason: "expected `accumulation` or `input`",
            })
        }
    };
    parse_softcap(meta, dtype, &mut o)?;
    Ok(o)
}

/// `softcap` (a float `> 0`, finite and `> 0` once rounded to the
/// accumulation dtype of `dtype` logits) and `softcap_dtype`
/// (`accumulation` or `input`; only with `softcap`, and `input` whenever
/// `temperature_dtype` is: a model that materialised `z = x' / T` in the
/// logits' dtype materialised `x'` there too).
fn parse_softcap(
    meta: &HashMap<String, String>,
    dtype: Dtype,
    o: &mut Options,
) -> Result<(), DumpError> {
    let sdt = meta.get("softcap_dtype").map(|s| s.trim().to_string());
    let Some(c) = parse_meta::<f64>(meta, "softcap", "not a number")? else {
        if let Some(v) = sdt {
            return Err(DumpError::BadMetadata {
                key: "softcap_dtype",
                value: v,
                reason: "given without `softcap`",
            });
        }
        return Ok(());
    };
    let r = dtype.accumulation().round_f64(c);
    if !(c.is_finite() && c > 0.0 && r.is_finite() && r > 0.0) {
        return Err(DumpError::BadMetadata {
            key: "softcap",
            value: meta["softcap"].clone(),
            reason: "must be finite and > 0 (also once rounded to the accumulation dtype)",
        });
    }
    o.softcap = Some(c);
    o.softcap_dtype = match sdt.as_deref() {
        None | Some("accumulation") => SoftcapDtype::Accumulation,
        Some("input") => SoftcapDtype::Input,
        Some(other) => {
            return Err(DumpError::BadMetadata {
                key: "softcap_dtype",
                value: other.to_string(),
                reason: "expected `accumulation` or `input`",
            })
        }
    };
    if o.softcap_dtype == SoftcapDtype::Accumulation
        && o.temperature_dtype == TemperatureDtype::Input
    {
        return Err(DumpError::BadMetadata {
            key: "softcap_dtype",
            value: sdt.unwrap_or_else(|| "accumulation".into()),
            reason: "must be `input` with temperature_dtype=input (z = x'/T was materialised in the logits' dtype, so x' was too)",
        });
    }
    Ok(())
}

/// A checked safetensors file: its tensors, its `__metadata__` and the
/// format options, every name checked against the name table
/// ([`crate::names`]). Shared by [`Dump::parse`] and the logits-less side of
/// `compare` ([`crate::compare`]).
pub(crate) struct Header<'a> {
    /// The tensors (offsets and sizes checked).
    pub st: SafeTensors<'a>,
    /// `__metadata__`.
    pub meta: HashMap<String, String>,
    /// `format_version` and the version-2 options.
    pub format: crate::format::FormatOptions,
}

impl<'a> Header<'a> {
    /// Deserializes `bytes` (a whole safetensors file) and checks its header
    /// and names.
    ///
    /// # Errors
    /// [`DumpError::Malformed`], [`DumpError::Duplicate`],
    /// [`DumpError::BadMetadata`] (format options), [`DumpError::Name`].
    pub(crate) fn read(bytes: &'a [u8]) -> Result<Self, DumpError> {
        // Checks offsets, sizes (with overflow checks) and that the data
        // covers the file exactly: nothing below reads out of bounds.
        let st = SafeTensors::deserialize(bytes).map_err(|e| match e {
                _ if crate::header::first_repeated(bytes).is_some() => {
                    DumpError::Duplicate(crate::header::first_repeated(bytes).expect("just found"))
                }
                safetensors::SafeTensorError::MetadataIncompleteBuffer => DumpError::Malformed {
                    reason: describe_size_mismatch(bytes),
                },
                safetensors::SafeTensorError::InvalidHeaderLength => DumpError::Malformed {
                    reason: format!(
                        "truncated header: its length field declares {} bytes, the file holds {} after it",
                        u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes read by safetensors")),
                        bytes.len() - 8
                    ),
                },
                safetensors::SafeTensorError::TensorInvalidInfo
                | safetensors::SafeTensorError::ValidationOverflow
                | safetensors::SafeTensorError::MisalignedSlice => DumpError::Malformed {
                    reason: crate::header::describe_bad_size(bytes)
                        .unwrap_or_else(|| e.to_string()),
                },
                other => malformed(other),
            })?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(malformed)?;
        let meta = header.metadata().clone().unwrap_or_default();
        if let Some(r) = crate::header::first_repeated(bytes) {
            return Err(DumpError::Duplicate(r));
        }
        let format = crate::format::FormatOptions::parse(&meta)?;
        crate::names::check_names(
            st.names(),
            meta.keys().map(String::as_str),
            format.version,
            crate::names::NAMES,
        )?;
        Ok(Header { st, meta, format })
    }
}
