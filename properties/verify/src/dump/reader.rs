//! [`Dump`]: the parsed, shape-checked dump, keyed per [`Output`] for its
//! candidates and cotangents, and its reader ([`Dump::parse`]).

use std::collections::HashMap;

use ndarray::{Array1, Array2};

use logprobe_reference::spec::{
    MeanDivisor, Options, Output, PerOutput, Reduction, SpecError, TeacherForm, TopkKl,
};

use super::linear::{read_dump_logits, read_linear_grads};
use super::options::{parse_options, parse_policy_clamps, parse_z_loss_coef};
use super::parts::{check_needs, read_inputs, Tensors};
use super::*;
use crate::keys;
use crate::names::tensor;

/// A parsed, shape-checked dump. `N` rows, `V_total` columns of logits.
pub struct Dump<'a> {
    /// `logits [N, V_total]`: stored, or made from `hidden` and
    /// `lm_head_weight` ([`DumpLogits`]).
    pub logits: DumpLogits<'a>,
    /// `tokens [N]` as i64.
    pub tokens: Option<Array1<i64>>,
    /// `sampling_mask [N, V_total]`.
    pub sampling_mask: Option<MaskMatrix<'a>>,
    /// `topk_ids [N, K]` as i64.
    pub topk_ids: Option<Array2<i64>>,
    /// `teacher_topk_log_probs [N, K]` as exact f64 (only with a
    /// `forward_kl` or `reverse_kl` candidate).
    pub teacher_topk_log_probs: Option<Array2<f64>>,
    /// `teacher_probs` or `teacher_log_probs [N, V_total]`, left in the
    /// file and decoded row by row (only with a `soft_cross_entropy`
    /// candidate or cotangent; which one is `options.teacher_form`).
    pub teacher_probs: Option<FloatMatrix<'a>>,
    /// The soft cross-entropy's teacher is `teacher_topk_log_probs` at
    /// `topk_ids` (log-probabilities, no mass elsewhere): each row's view
    /// holds it densely ([`Dump::row`]).
    pub soft_topk_teacher: bool,
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
    /// The LM head's gradient candidates of a fused linear dump (empty
    /// otherwise).
    pub linear_grads: LinearGrads<'a>,
    /// The divisor `W` of a `mean` loss over every row of the dump, summed
    /// once (exact), when `grad_loss` is given under `reduction = mean`:
    /// each one-row view's gradient divides by it.
    pub loss_divisor: Option<MeanDivisor>,
}

pub use crate::names::TENSOR_NAMES;

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

    /// Tensors held in memory (`(name, dtype, shape, bytes)`, as a dump
    /// holds them; nothing is copied: `[N, V]` tensors stay in the caller's
    /// memory and are decoded row by row) and `__metadata__` strings, parsed
    /// as [`Dump::parse`] parses a file.
    ///
    /// # Errors
    /// As [`Dump::parse`]; a name given twice is [`DumpError::Duplicate`], a
    /// byte length that does not match shape and dtype
    /// [`DumpError::Malformed`].
    pub fn from_memory(
        tensors: &[(&str, safetensors::Dtype, &[usize], &'a [u8])],
        meta: HashMap<String, String>,
    ) -> Result<Self, DumpError> {
        Self::from_header(Header::of_memory(tensors, meta)?, true)
    }

    fn parse_with(bytes: &'a [u8], require_candidate: bool) -> Result<Self, DumpError> {
        Self::from_header(Header::read(bytes)?, require_candidate)
    }

    pub(crate) fn from_header(
        header: Header<'a>,
        require_candidate: bool,
    ) -> Result<Self, DumpError> {
        let Header { st, meta, format } = header;
        super::tp_set::refuse_rank(&meta)?;
        super::weights_file::refuse_unresolved(&meta)?;
        let (logits, rs) = read_dump_logits(&st, &meta)?;
        let (n, v) = (rs.n, logits.cols);
        let inputs = read_inputs(&st, &rs, v)?;
        let r = Tensors {
            st: &st,
            rs: &rs,
            v,
            k: inputs.topk_ids.as_ref().map(|a| a.ncols()),
            cotangent_sum: format.cotangent_sum,
        };
        let (candidates, loss_options) = r.candidates(&meta)?;
        let loss_weights = r.loss_weights(&candidates)?;
        let policy = r.policy(&candidates)?;
        let cotangents = r.cotangents(loss_options.reduction)?;
        let linear_grads = read_linear_grads(&st, &logits, &rs)?;
        if linear_grads.any() && cotangents.is_empty() {
            return Err(DumpError::MissingTensor {
                tensor: "grad_loss",
                why: " (or another cotangent, grad_log_probs, grad_entropy, ...: the LM head's gradients differentiate the outputs the cotangents weight)",
            });
        }
        let teacher_probs = r.teacher_probs(&candidates, &cotangents)?;
        // The soft cross-entropy's teacher is the top-k one when no dense
        // teacher is given (`Dump::soft_topk_teacher`).
        let soft_topk_teacher = teacher_probs.is_none()
            && (candidates.contains(Output::SoftCrossEntropy)
                || cotangents.contains(Output::SoftCrossEntropy));
        let want_kl = r.wants_kl(&candidates);
        let teacher = r.teacher(&candidates, soft_topk_teacher)?;

        let names: Vec<String> = st.names().into_iter().map(String::from).collect();
        if require_candidate
            && !(format.topk_kernel && inputs.topk_ids.is_some())
            && candidates.is_empty()
            && !linear_grads.any()
        {
            return Err(DumpError::NoCandidate { tensors: names });
        }
        let row_mask = match st.tensor(tensor::ROW_MASK) {
            None => None,
            Some(t) => {
                rs.expect(tensor::ROW_MASK, t.shape(), &[])?;
                Some(crate::shapes::decode_flags(
                    tensor::ROW_MASK,
                    t.dtype(),
                    t.data(),
                )?)
            }
        };
        if format.topk_kernel && inputs.topk_ids.is_none() {
            return Err(DumpError::MissingTensor {
                tensor: tensor::TOPK_IDS,
                why: " (needed by topk_ids_source=kernel)",
            });
        }
        check_needs(&candidates, &cotangents, inputs.tokens.is_some())?;

        let want_entropy = candidates.contains(Output::Entropy)
            || cotangents.contains(Output::Entropy)
            || !require_candidate;
        // The constants are rounded as the computation rounds them.
        let compute = logits.compute_dtype();
        let mut options = parse_options(&meta, want_entropy, v, compute)?;
        if logits.linear().is_some() {
            options.accumulation = Some(compute.accumulation());
        }
        // An output is computed for its candidate or its cotangent.
        for o in Output::ALL {
            if candidates.contains(o) || cotangents.contains(o) {
                o.request(&mut options);
            }
        }
        if candidates.contains(Output::ZLoss) || cotangents.contains(Output::ZLoss) {
            options.z_loss_coef = Some(parse_z_loss_coef(&meta, compute)?);
        }
        // Read (and rejected when malformed) even when no output uses
        // them, as every other key is.
        keys::Z_LOSS_COEF.get(&meta)?;
        let renormalized = keys::KL_RENORMALIZED.get(&meta)?.unwrap_or(false);
        // The loss is computed for its candidate or its cotangent.
        let loss = candidates.contains(Output::Loss) || cotangents.contains(Output::Loss);
        options.loss = loss.then_some(loss_options);
        // A mean's gradient divides by the whole dump's `W`, summed once
        // here for every one-row view ([`Dump::row`]).
        let loss_divisor = match (cotangents.contains(Output::Loss), loss_options.reduction) {
            (true, Reduction::Mean) => {
                let ii = options.ignore_index;
                let counted = |r: usize| inputs.tokens.as_ref().is_some_and(|t| t[r] != ii);
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
        if let Some((_, form)) = &teacher_probs {
            options.teacher_form = *form;
        }
        if soft_topk_teacher {
            options.teacher_form = TeacherForm::LogProbs;
        }
        let teacher_probs = teacher_probs.map(|(m, _)| m);
        options.topk_kl = teacher
            .as_ref()
            .filter(|_| want_kl)
            .map(|(dtype, _)| TopkKl {
                forward: candidates.contains(Output::ForwardKl),
                reverse: candidates.contains(Output::ReverseKl),
                renormalized,
                teacher_dtype: *dtype,
            });
        // Every other key's value (`outputs`, `fuzz_*`, ...): checked
        // through the table, used or not.
        crate::names::check_values(&meta, crate::names::NAMES)?;
        if logits.linear().is_some() {
            super::linear::check_linear_options(&options, &candidates, format.topk_kernel)?;
        }
        Ok(Dump {
            logits,
            tokens: inputs.tokens,
            sampling_mask: inputs.sampling_mask,
            topk_ids: inputs.topk_ids,
            teacher_topk_log_probs: teacher.map(|t| t.1),
            teacher_probs,
            soft_topk_teacher,
            candidates,
            loss_weights,
            policy,
            cotangents,
            options,
            ignored_tensors: Vec::new(),
            row_shape: rs,
            row_mask,
            format,
            linear_grads,
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

    /// Row `row`'s soft cross-entropy teacher from the top-k one
    /// ([`Dump::soft_topk_teacher`]): `[1, V_total]` log-probabilities,
    /// `teacher_topk_log_probs[row, k]` at `topk_ids[row, k]`, `-inf`
    /// elsewhere.
    ///
    /// # Errors
    /// [`SpecError::TopkIdOutOfRange`], [`SpecError::TopkIdDuplicate`]
    /// (a duplicate id would count its mass twice).
    fn dense_topk_teacher(&self, row: usize) -> Result<Option<Array2<f64>>, DumpError> {
        let (Some(ids), Some(a)) = (&self.topk_ids, &self.teacher_topk_log_probs) else {
            return Ok(None);
        };
        let vt = self.v_total();
        let mut dense = Array2::from_elem((1, vt), f64::NEG_INFINITY);
        for (k, (&id, &ak)) in ids.row(row).iter().zip(a.row(row)).enumerate() {
            let col = match usize::try_from(id) {
                Ok(c) if c < self.vocab_size() => c,
                _ => {
                    return Err(DumpError::Spec(SpecError::TopkIdOutOfRange {
                        row,
                        k,
                        id,
                        vocab_size: self.vocab_size(),
                    }))
                }
            };
            if dense[[0, col]] != f64::NEG_INFINITY || ids.row(row).iter().take(k).any(|&i| i == id)
            {
                return Err(DumpError::Spec(SpecError::TopkIdDuplicate { row, k, id }));
            }
            dense[[0, col]] = ak;
        }
        Ok(Some(dense))
    }

    /// Row `row`'s inputs, decoded (O(V) memory; O(V H) work for logits
    /// made from `hidden`). Panics if `row >= N`.
    ///
    /// # Errors
    /// [`DumpError::BadMaskValue`]; [`DumpLogits::row_logits`]'s; with a top-k soft teacher, the spec's
    /// [`SpecError::TopkIdOutOfRange`] and [`SpecError::TopkIdDuplicate`].
    pub fn row(&self, row: usize) -> Result<RowInputs, DumpError> {
        self.row_with(row, None)
    }

    /// [`Dump::row`] with the row's linear logits computed beforehand
    /// (`Some`: [`LinearLogits::rows`] over a block of rows, the weight
    /// decoded once for the block).
    ///
    /// # Errors
    /// As [`Dump::row`]; a precomputed row's own error.
    pub fn row_with(
        &self,
        row: usize,
        linear: Option<Result<logprobe_reference::oracle::linear::LinearRow, DumpError>>,
    ) -> Result<RowInputs, DumpError> {
        let (logits, linear) = match linear {
            Some(l) => DumpLogits::linear_row_logits(l?)?,
            None => self.logits.row_logits(row, self.vocab_size())?,
        };
        let (linear, linear_entries) = match linear {
            Some(l) => (Some(l.stats), l.entries),
            None => (None, None),
        };
        Ok(RowInputs {
            row,
            logits,
            linear,
            linear_entries,
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
            teacher_probs: match &self.teacher_probs {
                Some(m) => Some(Array1::from(m.row_f64(row)).insert_axis(ndarray::Axis(0))),
                None if self.soft_topk_teacher => self.dense_topk_teacher(row)?,
                None => None,
            },
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
