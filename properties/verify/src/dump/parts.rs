//! The pieces of [`Dump::parse`](super::Dump::parse): each tensor group
//! read and shape-checked against `logits [N, V]` (and `topk_ids [N, K]`),
//! in the order the reader checks them (so the first error is stable).

use std::collections::HashMap;

use ndarray::{Array1, Array2};
use safetensors::{tensor::TensorView, Dtype as StDtype};

use logprobe_reference::spec::{
    Columns, Dtype, LossOptions, Output, PerOutput, PolicyTerm, Reduction, SpecError, TeacherForm,
};

use super::options::parse_loss_options;
use super::*;
use crate::names::tensor;
use crate::shapes::RowShape;

/// The floats a tensor may be stored in.
const FLOATS: &str = "F64, F32, BF16 or F16";

/// The dtype of a float tensor `name`.
///
/// # Errors
/// [`DumpError::BadDtype`] for any other dtype.
pub(super) fn float_dtype(name: &'static str, t: &TensorView<'_>) -> Result<Dtype, DumpError> {
    st_float(t.dtype()).ok_or_else(|| DumpError::BadDtype {
        tensor: name,
        found: format!("{:?}", t.dtype()),
        expected: FLOATS,
    })
}

/// `logits [N, V]` (or `[B, T, V]`), left in the file, with its row shape.
///
/// # Errors
/// [`DumpError::MissingTensor`], [`DumpError::BadDtype`],
/// [`DumpError::BadShape`].
pub(super) fn read_logits<'a>(st: &Source<'a>) -> Result<(FloatMatrix<'a>, RowShape), DumpError> {
    let logits_t = st.tensor(tensor::LOGITS).ok_or(DumpError::MissingTensor {
        tensor: tensor::LOGITS,
        why: "",
    })?;
    let ldtype = float_dtype(tensor::LOGITS, &logits_t)?;
    let (rs, v) = RowShape::of_logits(logits_t.shape())?;
    let logits = FloatMatrix {
        dtype: ldtype,
        rows: rs.n,
        cols: v,
        data: logits_t.data(),
        ints: None,
    };
    Ok((logits, rs))
}

/// The id and mask inputs: `tokens [N]`, `sampling_mask [N, V]`,
/// `topk_ids [N, K]`.
pub(super) struct Inputs<'a> {
    /// `tokens` as i64.
    pub tokens: Option<Array1<i64>>,
    /// `sampling_mask`, left in the file.
    pub sampling_mask: Option<MaskMatrix<'a>>,
    /// `topk_ids` as i64.
    pub topk_ids: Option<Array2<i64>>,
}

/// Reads [`Inputs`].
///
/// # Errors
/// [`DumpError::BadDtype`], [`DumpError::BadShape`],
/// [`DumpError::IdOverflow`].
pub(super) fn read_inputs<'a>(
    st: &Source<'a>,
    rs: &RowShape,
    v: usize,
) -> Result<Inputs<'a>, DumpError> {
    let get = |name: &str| st.tensor(name);
    let tokens = match get(tensor::TOKENS) {
        None => None,
        Some(t) => {
            rs.expect(tensor::TOKENS, t.shape(), &[])?;
            Some(Array1::from(decode_ids(
                tensor::TOKENS,
                t.dtype(),
                t.data(),
            )?))
        }
    };
    let sampling_mask = match get(tensor::SAMPLING_MASK) {
        None => None,
        Some(t) => {
            match t.dtype() {
                StDtype::BOOL | StDtype::U8 => {}
                other => {
                    return Err(DumpError::BadDtype {
                        tensor: tensor::SAMPLING_MASK,
                        found: format!("{other:?}"),
                        expected: "BOOL or U8",
                    })
                }
            };
            rs.expect(tensor::SAMPLING_MASK, t.shape(), &[('V', v)])?;
            Some(MaskMatrix {
                cols: v,
                data: t.data(),
            })
        }
    };
    let topk_ids = match get(tensor::TOPK_IDS) {
        None => None,
        Some(t) => {
            let k = rs.trailing(tensor::TOPK_IDS, t.shape())?;
            let ids = decode_ids(tensor::TOPK_IDS, t.dtype(), t.data())?;
            Some(Array2::from_shape_vec((rs.n, k), ids).expect("size checked by safetensors"))
        }
    };
    Ok(Inputs {
        tokens,
        sampling_mask,
        topk_ids,
    })
}

/// A float tensor `[N, width]` (a per-row one stored `[N]`), with
/// `Some(width)` for a `[]` / `[1]` cotangent broadcast under
/// `cotangent_reduction=sum` (stored as one element).
type Read<'a> = Option<(FloatMatrix<'a>, Option<usize>)>;

/// The float tensors of a dump, read against `logits` (`N`, `V`) and
/// `topk_ids` (`K`).
pub(super) struct Tensors<'a, 'h> {
    /// The file's tensors.
    pub st: &'h Source<'a>,
    /// `N` (or `[B, T]`).
    pub rs: &'h RowShape,
    /// `V_total`.
    pub v: usize,
    /// `K`, with `topk_ids`.
    pub k: Option<usize>,
    /// `cotangent_reduction=sum`.
    pub cotangent_sum: bool,
}

impl<'a> Tensors<'a, '_> {
    fn get(&self, name: &str) -> Option<TensorView<'a>> {
        self.st.tensor(name)
    }

    /// The float tensor `name` of `columns`, a cotangent or not.
    fn float(
        &self,
        name: &'static str,
        columns: Columns,
        cotangent: bool,
    ) -> Result<Read<'a>, DumpError> {
        let (rs, k, v) = (self.rs, self.k, self.v);
        let Some(t) = self.get(name) else {
            return Ok(None);
        };
        let dtype = float_dtype(name, &t)?;
        let summed = match columns {
            Columns::One if cotangent => rs.cotangent(name, t.shape(), &[], self.cotangent_sum)?,
            Columns::One => {
                rs.expect(name, t.shape(), &[])?;
                false
            }
            Columns::TopK => {
                let Some(k) = k else {
                    return Err(DumpError::MissingTensor {
                        tensor: tensor::TOPK_IDS,
                        why: " (needed by top-k tensors)",
                    });
                };
                if cotangent {
                    rs.cotangent(name, t.shape(), &[('K', k)], self.cotangent_sum)?
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
                rows: if summed { 1 } else { rs.n },
                cols: if summed { 1 } else { cols },
                data: t.data(),
                ints: None,
            },
            summed.then_some(cols),
        )))
    }

    /// The candidate outputs, and the loss options (read between the
    /// others and `loss`, whose shape they fix).
    ///
    /// # Errors
    /// [`DumpError`] for a bad dtype or shape, or bad loss options.
    pub(super) fn candidates(
        &self,
        meta: &HashMap<String, String>,
    ) -> Result<(PerOutput<FloatMatrix<'a>>, LossOptions), DumpError> {
        let mut candidates = PerOutput::new();
        for o in Output::ALL.into_iter().filter(|&o| o != Output::Loss) {
            let m = if o.is_count() {
                self.counts(o)?
            } else {
                self.float(o.name(), o.columns(), false)?.map(|(m, _)| m)
            };
            if let Some(m) = m {
                candidates.insert(o, m);
            }
        }
        // `loss`: `[N]` under `none`, one value under `sum` / `mean`.
        let loss_options = parse_loss_options(meta)?;
        let name = Output::Loss.name();
        if let Some(t) = self.get(name) {
            let dtype = float_dtype(name, &t)?;
            let rows = match loss_options.reduction {
                Reduction::None => {
                    self.rs.expect(name, t.shape(), &[])?;
                    self.rs.n
                }
                r => {
                    r.check_shape(t.shape(), self.rs.n)?;
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
                    ints: None,
                },
            );
        }
        Ok((candidates, loss_options))
    }

    /// A count output `o` ([`Output::is_count`]; `[N]`, one column):
    /// int64 / int32 (as vLLM stores ranks), decoded exactly and judged as
    /// f32 (f64 for `V > 2^24`, where a count in `0..=V` may not be an f32),
    /// or any float dtype.
    ///
    /// # Errors
    /// [`DumpError`] for a bad dtype or shape.
    fn counts(&self, o: Output) -> Result<Option<FloatMatrix<'a>>, DumpError> {
        let name = o.name();
        match self.get(name) {
            Some(t) if matches!(t.dtype(), StDtype::I64 | StDtype::I32) => {
                self.rs.expect(name, t.shape(), &[])?;
                Ok(Some(FloatMatrix {
                    dtype: if self.v > 1 << 24 {
                        Dtype::F64
                    } else {
                        Dtype::F32
                    },
                    rows: self.rs.n,
                    cols: 1,
                    data: t.data(),
                    ints: Some(t.dtype()),
                }))
            }
            _ => Ok(self.float(name, o.columns(), false)?.map(|(m, _)| m)),
        }
    }

    /// `loss_weights [N]` as exact f64 (only with `loss` or `grad_loss`).
    ///
    /// # Errors
    /// [`DumpError`]: without `loss`, a bad dtype or shape.
    pub(super) fn loss_weights(
        &self,
        candidates: &PerOutput<FloatMatrix<'a>>,
    ) -> Result<Option<Array1<f64>>, DumpError> {
        let grad_loss = Output::Loss
            .cotangent_name()
            .is_some_and(|c| self.get(c).is_some());
        let name = tensor::LOSS_WEIGHTS;
        match self.get(name) {
            None => Ok(None),
            Some(_) if !candidates.contains(Output::Loss) && !grad_loss => {
                Err(DumpError::MissingTensor {
                    tensor: Output::Loss.name(),
                    why: " (loss_weights weigh it)",
                })
            }
            Some(t) => {
                let dtype = float_dtype(name, &t)?;
                self.rs.expect(name, t.shape(), &[])?;
                Ok(Some(Array1::from(decode_floats(dtype, t.data()))))
            }
        }
    }

    /// The policy terms' inputs (`ref_log_probs`, `old_log_probs`): each
    /// with a term (or its cotangent) that needs it, and such a term needs it.
    ///
    /// # Errors
    /// [`DumpError::MissingTensor`] either way round; a bad dtype or shape.
    pub(super) fn policy(
        &self,
        candidates: &PerOutput<FloatMatrix<'a>>,
    ) -> Result<[Option<Array1<f64>>; 2], DumpError> {
        let mut policy: [Option<Array1<f64>>; 2] = [None, None];
        for (slot, (name, old)) in [
            (tensor::REF_LOG_PROBS, false),
            (tensor::OLD_LOG_PROBS, true),
        ]
        .into_iter()
        .enumerate()
        {
            let needed_by = PolicyTerm::ALL.into_iter().find(|t| {
                t.uses_old() == old
                    && (candidates.contains(t.output())
                        || t.output()
                            .cotangent_name()
                            .is_some_and(|c| self.get(c).is_some()))
            });
            match (self.get(name), needed_by) {
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
                        tensor: if old {
                            Output::Ratio.name()
                        } else {
                            Output::KlK1.name()
                        },
                        why: if old {
                            " (or grad_ratio: old_log_probs is the input of ratio)"
                        } else {
                            " (or kl_k2, kl_k3, kl_abs, a grad_kl_*: ref_log_probs is their input)"
                        },
                    })
                }
                (Some(t), Some(_)) => {
                    let dtype = float_dtype(name, &t)?;
                    self.rs.expect(name, t.shape(), &[])?;
                    policy[slot] = Some(Array1::from(decode_floats(dtype, t.data())));
                }
            }
        }
        Ok(policy)
    }

    /// Whether the dump has a top-k KL candidate or cotangent.
    pub(super) fn wants_kl(&self, candidates: &PerOutput<FloatMatrix<'a>>) -> bool {
        let kl = [Output::ForwardKl, Output::ReverseKl];
        kl.iter().any(|&o| candidates.contains(o))
            || kl
                .iter()
                .any(|o| o.cotangent_name().is_some_and(|c| self.get(c).is_some()))
    }

    /// `teacher_topk_log_probs [N, K]` as exact f64 with its dtype: with a
    /// top-k KL candidate or cotangent, or as the soft cross-entropy's
    /// teacher (`soft_topk`: its candidate or cotangent without a dense
    /// teacher), and only then.
    ///
    /// # Errors
    /// [`DumpError::MissingTensor`] either way round; a bad dtype or shape.
    pub(super) fn teacher(
        &self,
        candidates: &PerOutput<FloatMatrix<'a>>,
        soft_topk: bool,
    ) -> Result<Option<(Dtype, Array2<f64>)>, DumpError> {
        let want_kl = self.wants_kl(candidates) || soft_topk;
        let name = tensor::TEACHER_TOPK_LOG_PROBS;
        match self.get(name) {
            None if want_kl => Err(DumpError::MissingTensor {
                tensor: name,
                why: " (needed by forward_kl, reverse_kl and their cotangents)",
            }),
            None => Ok(None),
            Some(_) if !want_kl => Err(DumpError::MissingTensor {
                tensor: Output::ForwardKl.name(),
                why: " (or reverse_kl, soft_cross_entropy, or a cotangent of one: teacher_topk_log_probs is judged through them)",
            }),
            Some(_) => {
                let (m, _) = self.float(name, Columns::TopK, false)?.expect("present");
                Ok(Some((m.dtype, m.to_array())))
            }
        }
    }

    /// `teacher_probs` or `teacher_log_probs [N, V_total]` and which
    /// ([`TeacherForm`]), left in the file (only with a
    /// `soft_cross_entropy` candidate or `grad_soft_cross_entropy`, which
    /// it is judged through).
    ///
    /// # Errors
    /// [`DumpError`]: one without the other, both forms, a bad dtype or shape.
    pub(super) fn teacher_probs(
        &self,
        candidates: &PerOutput<FloatMatrix<'a>>,
        cotangents: &PerOutput<Array2<f64>>,
    ) -> Result<Option<(FloatMatrix<'a>, TeacherForm)>, DumpError> {
        let want = candidates.contains(Output::SoftCrossEntropy)
            || cotangents.contains(Output::SoftCrossEntropy);
        let (probs, logs) = (tensor::TEACHER_PROBS, tensor::TEACHER_LOG_PROBS);
        let (name, form) = match (self.get(probs), self.get(logs)) {
            (Some(_), Some(_)) => {
                return Err(DumpError::TwoForms {
                    first: probs,
                    second: logs,
                })
            }
            (None, Some(_)) => (logs, TeacherForm::LogProbs),
            _ => (probs, TeacherForm::Probs),
        };
        match self.get(name) {
            // The top-k teacher (`teacher_topk_log_probs` at `topk_ids`)
            // is the soft cross-entropy's when no dense one is given.
            None if want && self.get(tensor::TEACHER_TOPK_LOG_PROBS).is_some() => Ok(None),
            None if want => Err(DumpError::MissingTensor {
                tensor: name,
                why: " (or teacher_log_probs, or teacher_topk_log_probs at topk_ids: needed by soft_cross_entropy and its cotangent)",
            }),
            None => Ok(None),
            Some(_) if !want => Err(DumpError::MissingTensor {
                tensor: Output::SoftCrossEntropy.name(),
                why: " (the teacher is judged through it or grad_soft_cross_entropy)",
            }),
            Some(_) => Ok(self
                .float(name, Columns::Vocabulary, false)?
                .map(|(m, _)| (m, form))),
        }
    }

    /// The upstream cotangents as exact f64 `[N, width]` (a reduced loss's
    /// `[1, 1]`), keyed by their output.
    ///
    /// # Errors
    /// [`DumpError`] for a bad dtype or shape.
    pub(super) fn cotangents(
        &self,
        reduction: Reduction,
    ) -> Result<PerOutput<Array2<f64>>, DumpError> {
        let n = self.rs.n;
        let mut cotangents = PerOutput::new();
        for o in Output::ALL {
            if o == Output::Loss && reduction != Reduction::None {
                // The cotangent of one reduced value: `[]` or `[1]`, kept `[1, 1]`.
                let named = o.cotangent_name().and_then(|c| Some((c, self.get(c)?)));
                if let Some((name, t)) = named {
                    let m = reduced_cotangent(name, t.shape(), t.dtype(), t.data(), reduction)?;
                    cotangents.insert(o, m);
                }
                continue;
            }
            if let Some(name) = o.cotangent_name() {
                if let Some((m, summed)) = self.float(name, o.columns(), true)? {
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
        Ok(cotangents)
    }
}

/// The inputs each candidate and cotangent needs: `tokens` (log-probs,
/// policy terms, the loss), a cotangent for `grad_logits`.
///
/// # Errors
/// [`DumpError::MissingTensor`] naming `tokens`; [`SpecError::NoCotangent`].
pub(super) fn check_needs(
    candidates: &PerOutput<FloatMatrix<'_>>,
    cotangents: &PerOutput<Array2<f64>>,
    tokens: bool,
) -> Result<(), DumpError> {
    let needs_tokens = |per: &PerOutput<_>| {
        per.contains(Output::LogProbs)
            || PolicyTerm::ALL
                .into_iter()
                .any(|t| per.contains(t.output()))
    };
    // The loss is computed for its candidate or its cotangent.
    let loss = candidates.contains(Output::Loss) || cotangents.contains(Output::Loss);
    if (needs_tokens(candidates)
        || loss
        || cotangents.contains(Output::LogProbs)
        || PolicyTerm::ALL
            .into_iter()
            .any(|t| cotangents.contains(t.output())))
        && !tokens
    {
        let why = if needs_tokens(candidates) {
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
            tensor: tensor::TOKENS,
            why,
        });
    }
    if candidates.contains(Output::GradLogits) && cotangents.is_empty() {
        return Err(DumpError::Spec(SpecError::NoCotangent {
            what: "grad_logits given without grad_log_probs, grad_entropy, grad_topk_log_probs, grad_lse, grad_z_loss, grad_loss, grad_soft_cross_entropy, a policy term's (grad_kl_k1 .. grad_ratio) or a top-k KL's (grad_forward_kl, grad_reverse_kl)",
        }));
    }
    // Cotangents are judged only through grad_logits: without it they
    // are inert, but still read (and validated) so mistakes surface.
    Ok(())
}

/// `grad_loss` under `reduction = sum | mean`: the cotangent of one value,
/// stored `[]` or `[1]` in a float dtype, as exact f64 `[1, 1]`.
///
/// # Errors
/// [`DumpError::BadDtype`], [`DumpError::BadShape`] (naming `grad_loss`).
fn reduced_cotangent(
    name: &'static str,
    shape: &[usize],
    dtype: StDtype,
    data: &[u8],
    reduction: Reduction,
) -> Result<Array2<f64>, DumpError> {
    let dtype = st_float(dtype).ok_or_else(|| DumpError::BadDtype {
        tensor: name,
        found: format!("{dtype:?}"),
        expected: FLOATS,
    })?;
    if !(shape.is_empty() || shape == [1]) {
        return Err(DumpError::BadShape {
            tensor: name,
            found: shape.to_vec(),
            expected: format!(
                "[] or [1] (the cotangent of the one loss value under reduction={reduction})"
            ),
        });
    }
    let v = decode_floats(dtype, data);
    Ok(Array2::from_shape_vec((1, 1), v).expect("one element checked by safetensors"))
}
