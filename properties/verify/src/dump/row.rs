//! [`RowInputs`]: one row of a dump as owned arrays (a one-row problem),
//! and [`at_row`], which names the dump's row in a one-row problem's errors.

use ndarray::{Array1, Array2};

use logprobe_reference::spec::{Cotangents, MeanDivisor, Options, PerOutput, Problem, SpecError};

use super::*;

/// One row of a dump as owned arrays; [`RowInputs::problem`] borrows them
/// as a one-row [`Problem`].
#[derive(Clone, Debug)]
pub struct RowInputs {
    /// The dump's row index.
    pub row: usize,
    /// Logits `[1, V_total]`.
    pub logits: RowLogits,
    /// The matmul's statistics when the logits come from `hidden` and
    /// `lm_head_weight` (TOLERANCE.md (T29)).
    pub linear: Option<logprobe_reference::oracle::linear::LinearRowStats>,
    /// Every column's enclosure of the matmul, when the dump gives the
    /// kernel's logits beside `hidden` (judged entry by entry).
    pub linear_entries: Option<Vec<logprobe_reference::oracle::linear::DotEnclosure>>,
    /// Token `[1]`.
    pub tokens: Option<Array1<i64>>,
    /// Mask `[1, V_total]`.
    pub sampling_mask: Option<Array2<bool>>,
    /// Ids `[1, K]`.
    pub topk_ids: Option<Array2<i64>>,
    /// The teacher's log-probs `[1, K]` (top-k KL).
    pub teacher_topk_log_probs: Option<Array2<f64>>,
    /// The teacher's probabilities `[1, V_total]` (soft cross-entropy).
    pub teacher_probs: Option<Array2<f64>>,
    /// Options of the dump.
    pub options: Options,
    /// The row's `loss_weights` entry `[1]`.
    pub loss_weights: Option<Array1<f64>>,
    /// The row's `ref_log_probs`, `old_log_probs` entries `[1]`.
    pub policy: [Option<Array1<f64>>; 2],
    /// The row's cotangents `[1, width]`, keyed by their output.
    pub cotangents: PerOutput<Array2<f64>>,
    /// The whole dump's `mean` divisor ([`Dump::loss_divisor`]).
    pub loss_divisor: Option<MeanDivisor>,
}

impl RowInputs {
    /// The one-row problem.
    pub fn problem(&self) -> Problem<'_> {
        Problem {
            logits: self.logits.view(),
            tokens: self.tokens.as_ref().map(|t| t.view()),
            sampling_mask: self.sampling_mask.as_ref().map(|m| m.view()),
            topk_ids: self.topk_ids.as_ref().map(|m| m.view()),
            policy: logprobe_reference::spec::PolicyInputs {
                ref_log_probs: self.policy[0].as_ref().map(|a| a.view()),
                old_log_probs: self.policy[1].as_ref().map(|a| a.view()),
            },
            teacher_topk_log_probs: self.teacher_topk_log_probs.as_ref().map(|m| m.view()),
            teacher_probs: self.teacher_probs.as_ref().map(|m| m.view()),
            options: self.options,
            loss_weights: self.loss_weights.as_ref().map(|w| w.view()),
        }
    }

    /// The one-row cotangents, a `mean`'s divisor the whole dump's.
    pub fn cotangents(&self) -> Cotangents<'_> {
        Cotangents {
            loss_divisor: self.loss_divisor.as_ref(),
            ..Cotangents::from_outputs(&self.cotangents)
        }
    }

    /// Validates the row's values with the spec (NaN / `+inf` logits,
    /// token, ids, finite cotangents), errors naming the dump's row.
    ///
    /// # Errors
    /// [`DumpError::Spec`].
    pub fn validate(&self) -> Result<(), DumpError> {
        let p = self.problem();
        let shape = p.validate_shapes().map_err(|e| at_row(e, self.row))?;
        p.validate_row(&shape, 0).map_err(|e| at_row(e, self.row))?;
        // Only a temperature below 1 can overflow (no copy of the row else).
        if shape.temperature < 1.0 || shape.temperature.is_nan() {
            crate::temperature::check_row(
                &p.logits.row_f64(0),
                shape.vocab_size,
                &self.options,
                shape.temperature,
                shape.dtype,
                self.row,
            )?;
        }
        if !self.cotangents.is_empty() {
            let c = self.cotangents();
            p.validate_cotangents(&shape, &c)
                .map_err(|e| at_row(e, self.row))?;
        }
        Ok(())
    }
}

/// Rewrites the row of an error from a one-row problem to the dump's row
/// `row` (the flat index of a cotangent becomes the row too).
pub fn at_row(e: SpecError, row: usize) -> SpecError {
    use SpecError::*;
    match e {
        NonFiniteLogit {
            tensor, col, value, ..
        } => NonFiniteLogit {
            tensor,
            row,
            col,
            value,
        },
        TokenOutOfRange {
            token, vocab_size, ..
        } => TokenOutOfRange {
            row,
            token,
            vocab_size,
        },
        TokenMasked { token, .. } => TokenMasked { row, token },
        TokenNegInf { token, .. } => TokenNegInf { row, token },
        TopkIdOutOfRange {
            k, id, vocab_size, ..
        } => TopkIdOutOfRange {
            row,
            k,
            id,
            vocab_size,
        },
        NoFiniteLogit { tensor, which, .. } => NoFiniteLogit { tensor, row, which },
        BadLossWeight { value, .. } => BadLossWeight { row, value },
        BadTeacherLogProb { k, value, .. } => BadTeacherLogProb { row, k, value },
        TeacherMassAboveOne { lower, .. } => TeacherMassAboveOne { row, lower },
        TopkIdDuplicate { k, id, .. } => TopkIdDuplicate { row, k, id },
        TopkIdMasked { k, id, .. } => TopkIdMasked { row, k, id },
        KlNoStudentMass { .. } => KlNoStudentMass { row },
        KlGradientInfinite {
            k, id, cotangent, ..
        } => KlGradientInfinite {
            row,
            k,
            id,
            cotangent,
        },
        SoftCrossEntropyGradientInfinite { col, cotangent, .. } => {
            SoftCrossEntropyGradientInfinite {
                row,
                col,
                cotangent,
            }
        }
        NonFinitePolicyInput { tensor, value, .. } => NonFinitePolicyInput { tensor, row, value },
        NonFiniteCotangent {
            tensor,
            index,
            value,
        } => {
            // `[1]` cotangents: index 0 is the row; `[1, K]`: index is k.
            let index = if tensor == "grad_topk_log_probs" {
                index
            } else {
                row
            };
            NonFiniteCotangent {
                tensor,
                index,
                value,
            }
        }
        other => other,
    }
}
