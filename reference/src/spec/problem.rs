//! The problem: input views, options, cotangents, and their validation.
//!
//! The math these inputs define is docs/design.md's "The math" section; the
//! oracle's module docs restate it with sources.

use ndarray::{ArrayView1, ArrayView2, Axis};

use super::dtype::{Dtype, Element};
use super::error::SpecError;
use super::logits::{Logits, LogitsMut};
use super::loss::{CrossEntropy, Reduction};
use super::options::{Options, SoftcapDtype, TemperatureDtype};
use super::policy::{self, PolicyInputs};
use super::topk_kl::{check_teacher_row, first_duplicate, TopkKl};
use crate::with_logits;

/// PyTorch's default `ignore_index`.
pub const DEFAULT_IGNORE_INDEX: i64 = -100;

/// One log-prob / entropy / top-k problem over `N` rows, over logits of
/// type `L`: read-only ([`Problem`]) or mutable ([`ProblemMut`], the
/// in-place backward's argument); every input but the logits is the same.
///
/// Shapes: `logits [N, V_total]`; `tokens [N]`; `sampling_mask [N, V_total]`
/// (`true` = allowed); `topk_ids [N, K]`. Log-probs are computed when
/// `tokens` is present, top-k log-probs when `topk_ids` is, the entropy when
/// `options.entropy` is `Some`.
#[derive(Clone, Copy, Debug)]
pub struct ProblemOf<'a, L> {
    /// Logits `[N, V_total]` ([`Logits`] or [`LogitsMut`]; the in-place
    /// backward writes grad logits over a [`LogitsMut`]).
    pub logits: L,
    /// Target token per row `[N]`, or `ignore_index`.
    pub tokens: Option<ArrayView1<'a, i64>>,
    /// Allowed set `[N, V_total]`; `None` = everything allowed.
    pub sampling_mask: Option<ArrayView2<'a, bool>>,
    /// Ids `[N, K]` whose log-probs to compute.
    pub topk_ids: Option<ArrayView2<'a, i64>>,
    /// The teacher's log-probs `[N, K]` at `topk_ids` (exact inputs, nats,
    /// `<= 0`); read only when `options.topk_kl` is `Some`.
    pub teacher_topk_log_probs: Option<ArrayView2<'a, f64>>,
    /// The teacher `[N, V_total]` of the soft-target cross-entropy
    /// `soft_cross_entropy`, exact inputs, padded columns ignored: its
    /// probabilities (finite, `>= 0`), or its log-probabilities (`<= 0`,
    /// `-inf` for no mass) under [`TeacherForm::LogProbs`](super::TeacherForm::LogProbs)
    /// (`options.teacher_form`). Its presence asks for that output.
    pub teacher_probs: Option<ArrayView2<'a, f64>>,
    /// Per-row weights `[N]` of the cross-entropy `loss` (finite, `>= 0`,
    /// exact f64 inputs; `None` = every weight 1). Read only when
    /// `options.loss` is `Some`.
    pub loss_weights: Option<ArrayView1<'a, f64>>,
    /// `ref_log_probs [N]`, `old_log_probs [N]` of the policy terms
    /// (exact inputs, nats; [`PolicyInputs`]). Default: none.
    pub policy: PolicyInputs<'a>,
    /// Options.
    pub options: Options,
}

/// A problem over read-only logits ([`ProblemOf`]).
pub type Problem<'a> = ProblemOf<'a, Logits<'a>>;

/// A problem whose logits are mutable: the in-place backward's one
/// argument besides the cotangents (it writes grad logits over `logits`).
/// Shapes and meanings as in [`ProblemOf`].
pub type ProblemMut<'a> = ProblemOf<'a, LogitsMut<'a>>;

impl<'a, L> ProblemOf<'a, L> {
    /// A problem over `logits` with default options and no tokens, mask or ids.
    pub fn new(logits: L) -> Self {
        ProblemOf {
            logits,
            tokens: None,
            sampling_mask: None,
            topk_ids: None,
            teacher_topk_log_probs: None,
            teacher_probs: None,
            loss_weights: None,
            policy: PolicyInputs::default(),
            options: Options::default(),
        }
    }

    /// The same inputs and options over other logits `logits` (of the same
    /// shape for a valid problem), e.g. a mutable copy for the in-place
    /// backward: `problem.with_logits(copy.view_mut())`. Borrows nothing
    /// of `self`.
    pub fn with_logits<'b, M>(&self, logits: M) -> ProblemOf<'b, M>
    where
        'a: 'b,
    {
        ProblemOf {
            logits,
            tokens: self.tokens,
            sampling_mask: self.sampling_mask,
            topk_ids: self.topk_ids,
            teacher_topk_log_probs: self.teacher_topk_log_probs,
            teacher_probs: self.teacher_probs,
            loss_weights: self.loss_weights,
            policy: self.policy.shorten(),
            options: self.options,
        }
    }
}

impl<'a> ProblemMut<'a> {
    /// The same problem, read-only (logits borrowed from `self`).
    pub fn view(&self) -> Problem<'_> {
        self.with_logits(self.logits.view())
    }

    /// A shorter-lived reborrow (to hand the same problem on, e.g. to an
    /// inner kernel, and use it afterwards).
    pub fn reborrow(&mut self) -> ProblemMut<'_> {
        let inputs = self.with_logits(());
        inputs.with_logits(self.logits.reborrow())
    }
}

/// Facts established by [`Problem::validate_shapes`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Rows `N`.
    pub n: usize,
    /// Real vocabulary size `V` (<= `v_total`).
    pub vocab_size: usize,
    /// Columns of `logits`, padding included.
    pub v_total: usize,
    /// Top-k width `K` (0 without `topk_ids`).
    pub k: usize,
    /// Dtype of the logits.
    pub dtype: Dtype,
    /// The accumulation dtype ([`Problem::accumulation`]).
    pub accumulation: Dtype,
    /// Temperature rounded to the accumulation dtype.
    pub temperature: f64,
}

impl<'a> Problem<'a> {
    /// Rows `rows` of every per-row input (logits, tokens, mask, ids, the
    /// teachers, weights, policy inputs), the options unchanged: the
    /// problem a chunk of rows is. Panics if `rows` is out of range.
    pub fn slice_rows(&self, rows: std::ops::Range<usize>) -> Problem<'a> {
        let r2 = || ndarray::s![rows.clone(), ..];
        Problem {
            logits: self.logits.slice_rows(rows.clone()),
            tokens: self.tokens.map(|t| t.slice_move(ndarray::s![rows.clone()])),
            sampling_mask: self.sampling_mask.map(|m| m.slice_move(r2())),
            topk_ids: self.topk_ids.map(|k| k.slice_move(r2())),
            teacher_topk_log_probs: self.teacher_topk_log_probs.map(|a| a.slice_move(r2())),
            teacher_probs: self.teacher_probs.map(|p| p.slice_move(r2())),
            loss_weights: self
                .loss_weights
                .map(|w| w.slice_move(ndarray::s![rows.clone()])),
            policy: self.policy.slice_rows(rows.clone()),
            options: self.options,
        }
    }

    /// The checks of an explicit cross-entropy call (`Oracle::cross_entropy`,
    /// `CpuKernel::cross_entropy`), in the order both report them: shapes
    /// ([`Problem::validate_shapes`]), `ce`'s options for `N` rows
    /// ([`CrossEntropy::validate`]), then `tokens` present. Rows are not
    /// checked here. O(1) in N and V.
    ///
    /// # Errors
    /// Those of [`Problem::validate_shapes`] and [`CrossEntropy::validate`];
    /// [`SpecError::MissingTensor`] (output `loss`, tensor `tokens`).
    pub fn validate_cross_entropy(&self, ce: &super::CrossEntropy<'_>) -> Result<Shape, SpecError> {
        let shape = self.validate_shapes()?;
        ce.validate(shape.n)?;
        if self.tokens.is_none() {
            return Err(SpecError::MissingTensor {
                output: "loss",
                tensor: "tokens",
            });
        }
        Ok(shape)
    }

    /// Checks shapes, `vocab_size`, temperature, the z-loss coefficient and
    /// the loss options (label smoothing, `loss_weights [N]`); O(1) in N and
    /// V (each row's weight is checked by [`Problem::validate_row`]).
    ///
    /// # Errors
    /// [`SpecError::ShapeMismatch`], [`SpecError::BadVocabSize`],
    /// [`SpecError::BadTemperature`], [`SpecError::BadZLossCoef`],
    /// [`SpecError::BadLabelSmoothing`], [`SpecError::MissingTensor`]
    /// (`loss` without `tokens`), [`SpecError::BadSoftcap`],
    /// [`SpecError::SoftcapDtypeMismatch`], [`SpecError::BadClamp`];
    /// `ref_log_probs` / `old_log_probs` not `[N]` or without `tokens`.
    pub fn validate_shapes(&self) -> Result<Shape, SpecError> {
        let (n, v_total) = self.logits.dim();
        let dtype = self.logits.dtype();
        let acc = self.accumulation();
        let temperature = self.options.effective_temperature(acc)?;
        self.options.effective_z_loss_coef(acc)?;
        if self.options.effective_softcap(acc)?.is_some()
            && self.options.softcap_dtype == SoftcapDtype::Accumulation
            && self.options.temperature_dtype == TemperatureDtype::Input
        {
            return Err(SpecError::SoftcapDtypeMismatch);
        }
        self.options.policy_clamps.effective(acc)?;
        policy::validate_shapes(&self.policy, n, self.tokens.is_some())?;
        if let Some(ce) = self.cross_entropy() {
            ce.effective_label_smoothing(acc)?;
            if self.tokens.is_none() {
                return Err(SpecError::MissingTensor {
                    output: "loss",
                    tensor: "tokens",
                });
            }
            if let Some(w) = ce.loss_weights {
                if w.len() != n {
                    return Err(shape_err("loss_weights", vec![n], w.shape()));
                }
            }
        }
        let vocab_size = self.options.vocab_size.unwrap_or(v_total);
        if vocab_size > v_total {
            return Err(SpecError::BadVocabSize {
                vocab_size,
                columns: v_total,
            });
        }
        if let Some(t) = self.tokens {
            if t.len() != n {
                return Err(shape_err("tokens", vec![n], t.shape()));
            }
        }
        if let Some(m) = self.sampling_mask {
            if m.dim() != (n, v_total) {
                return Err(shape_err("sampling_mask", vec![n, v_total], m.shape()));
            }
        }
        if let Some(p) = self.teacher_probs {
            if p.dim() != (n, v_total) {
                return Err(shape_err("teacher_probs", vec![n, v_total], p.shape()));
            }
        }
        let mut k = 0;
        if let Some(ids) = self.topk_ids {
            if ids.nrows() != n {
                return Err(shape_err("topk_ids", vec![n, usize::MAX], ids.shape()));
            }
            k = ids.ncols();
        }
        if let Some(kl) = self.options.topk_kl {
            let output = if kl.forward {
                "forward_kl"
            } else {
                "reverse_kl"
            };
            let Some(ids) = self.topk_ids else {
                return Err(SpecError::MissingTensor {
                    output,
                    tensor: "topk_ids",
                });
            };
            let Some(a) = self.teacher_topk_log_probs else {
                return Err(SpecError::MissingTensor {
                    output,
                    tensor: "teacher_topk_log_probs",
                });
            };
            if a.dim() != ids.dim() {
                return Err(shape_err("teacher_topk_log_probs", vec![n, k], a.shape()));
            }
        }
        Ok(Shape {
            n,
            vocab_size,
            v_total,
            k,
            dtype,
            accumulation: acc,
            temperature,
        })
    }

    /// The accumulation dtype: `options.accumulation`, else the logits
    /// dtype's ([`Dtype::accumulation`]: f32 for f32/bf16/f16, f64 for
    /// f64).
    pub fn accumulation(&self) -> Dtype {
        self.options
            .accumulation
            .unwrap_or(self.logits.dtype().accumulation())
    }

    /// The weights of the rows a `mean` loss divides by, `[N]` order: `w_r`
    /// (1 without `loss_weights`) for each row whose token is not
    /// `ignore_index`, 0 elsewhere; their exact sum is the mean's divisor
    /// `W` (each consumer sums them at its own precision). `None` unless
    /// the loss is computed with `reduction = mean`.
    pub fn loss_divisor_terms(&self) -> Option<impl Iterator<Item = f64> + use<'_, 'a>> {
        let loss = self.options.loss?;
        (loss.reduction == Reduction::Mean && self.tokens.is_some()).then(|| {
            (0..self.logits.dim().0).map(move |r| {
                if self.has_target(r) {
                    self.loss_weights.map_or(1.0, |w| w[r])
                } else {
                    0.0
                }
            })
        })
    }

    /// Checks the values of row `row`: no NaN or `+inf` logit in the real
    /// vocabulary, at least one allowed finite logit, a valid target, valid
    /// top-k ids. O(V). Call after [`Problem::validate_shapes`].
    ///
    /// Note: with `TemperatureDtype::Input`, `round_input(x / T)` may
    /// overflow or underflow: [`Problem::validate_input_row`] checks that.
    ///
    /// # Errors
    /// [`SpecError::NonFiniteLogit`], [`SpecError::NoFiniteLogit`],
    /// [`SpecError::TokenOutOfRange`], [`SpecError::TokenMasked`],
    /// [`SpecError::TokenNegInf`], [`SpecError::TopkIdOutOfRange`],
    /// [`SpecError::BadLossWeight`] (the row's `loss_weights` entry, when
    /// the loss is computed), [`SpecError::NonFinitePolicyInput`].
    pub fn validate_row(&self, shape: &Shape, row: usize) -> Result<(), SpecError> {
        let v = shape.vocab_size;
        policy::validate_row(&self.policy, row)?;
        if let Some(p) = self.teacher_probs {
            let bad = p
                .row(row)
                .iter()
                .take(v)
                .position(|&x| !self.options.teacher_form.valid(x));
            if let Some(col) = bad {
                let value = p[[row, col]];
                let tensor = self.options.teacher_form.tensor();
                return Err(SpecError::BadTeacherProb {
                    tensor,
                    row,
                    col,
                    value,
                });
            }
        }
        if let (Some(_), Some(w)) = (self.options.loss, self.loss_weights) {
            let value = w[row];
            if !(value.is_finite() && value >= 0.0) {
                return Err(SpecError::BadLossWeight { row, value });
            }
        }
        let mask = self.sampling_mask.map(|m| m.index_axis_move(Axis(0), row));
        // Under a softcap a `-inf` logit is `x' = -c`, finite.
        let capped = self.options.softcap.is_some();
        let any_allowed_finite = with_logits!(self.logits, lv => {
            let r = lv.row(row);
            // One branch-free sweep; only a bad row is walked again for
            // its first bad column.
            let (mut bad, mut any) = (false, false);
            match (mask, r.as_slice()) {
                // A contiguous row as a slice: the sweep vectorises.
                (None, Some(xs)) => {
                    for x in &xs[..v.min(xs.len())] {
                        let x = x.to_f64();
                        bad |= x.is_nan() | (x == f64::INFINITY);
                        any |= capped | x.is_finite();
                    }
                }
                (None, None) => {
                    for x in r.iter().take(v) {
                        let x = x.to_f64();
                        bad |= x.is_nan() | (x == f64::INFINITY);
                        any |= capped | x.is_finite();
                    }
                }
                (Some(m), _) => {
                    for (x, &allowed) in r.iter().take(v).zip(m.iter()) {
                        let x = x.to_f64();
                        bad |= x.is_nan() | (x == f64::INFINITY);
                        any |= (capped | x.is_finite()) & allowed;
                    }
                }
            }
            if bad {
                for (j, x) in r.iter().take(v).enumerate() {
                    let x = x.to_f64();
                    if x.is_nan() || x == f64::INFINITY {
                        return Err(SpecError::NonFiniteLogit { tensor: "logits", row, col: j, value: x });
                    }
                }
            }
            any
        });
        if !any_allowed_finite {
            let which = if self.sampling_mask.is_some() {
                "allowed by sampling_mask"
            } else {
                "any"
            };
            return Err(SpecError::NoFiniteLogit {
                tensor: "logits",
                row,
                which,
            });
        }
        if let Some(tokens) = self.tokens {
            let t = tokens[row];
            if t != self.options.ignore_index {
                if t < 0 || t as u64 >= v as u64 {
                    return Err(SpecError::TokenOutOfRange {
                        row,
                        token: t,
                        vocab_size: v,
                    });
                }
                let tu = t as usize;
                if mask.is_some_and(|m| !m[tu]) {
                    return Err(SpecError::TokenMasked { row, token: t });
                }
                if !capped && self.logits.get_f64(row, tu) == f64::NEG_INFINITY {
                    return Err(SpecError::TokenNegInf { row, token: t });
                }
            }
        }
        if let Some(ids) = self.topk_ids {
            for (k, &id) in ids.row(row).iter().enumerate() {
                if id < 0 || id as u64 >= v as u64 {
                    return Err(SpecError::TopkIdOutOfRange {
                        row,
                        k,
                        id,
                        vocab_size: v,
                    });
                }
            }
        }
        if let Some(kl) = self.options.topk_kl {
            self.validate_topk_kl_row(&kl, row)?;
        }
        Ok(())
    }

    /// The top-k KL's checks of row `row` (after the ids' range, which it
    /// assumes; O(K log K)): every id
    /// allowed by the sampling mask and distinct, the teacher's row a
    /// log-prob row ([`check_teacher_row`]), and under `renormalized` some
    /// id of finite logit.
    ///
    /// # Errors
    /// [`SpecError::TopkIdMasked`], [`SpecError::TopkIdDuplicate`],
    /// [`SpecError::BadTeacherLogProb`], [`SpecError::TeacherMassAboveOne`],
    /// [`SpecError::KlNoStudentMass`].
    pub fn validate_topk_kl_row(&self, kl: &TopkKl, row: usize) -> Result<(), SpecError> {
        let (Some(ids), Some(a)) = (self.topk_ids, self.teacher_topk_log_probs) else {
            return Ok(());
        };
        let ids = ids.row(row);
        for (k, &id) in ids.iter().enumerate() {
            if !self.allowed(row, id as usize) {
                return Err(SpecError::TopkIdMasked { row, k, id });
            }
        }
        if let Some((k, id)) = first_duplicate(ids.iter().copied()) {
            return Err(SpecError::TopkIdDuplicate { row, k, id });
        }
        let a: Vec<f64> = a.row(row).to_vec();
        check_teacher_row(row, &a, kl.teacher_dtype)?;
        // Under a softcap every logit is finite (x' = -c at -inf).
        if kl.renormalized
            && self.options.softcap.is_none()
            && ids
                .iter()
                .all(|&id| self.logits.get_f64(row, id as usize) == f64::NEG_INFINITY)
        {
            return Err(SpecError::KlNoStudentMass { row });
        }
        Ok(())
    }

    /// The errors of row `row` that only the materialised input reveals
    /// when `options.temperature_dtype` is [`TemperatureDtype::Input`]
    /// (`z = round_input(round_acc(x / T))`, [`Dtype::scaled_input`],
    /// PyTorch's `logits / T`), in the order
    /// the spec defines them: a `z` that overflows to `+inf`
    /// ([`SpecError::NonFiniteLogit`] on tensor `logits / temperature`, the
    /// first such column), no allowed finite `z`
    /// ([`SpecError::NoFiniteLogit`]), a target whose `z` is `-inf`
    /// ([`SpecError::TokenNegInf`]). The one definition the oracle and every
    /// kernel share; each computes `z` (the oracle and the CPU kernels with
    /// [`Dtype::scaled_input`], the CUDA kernel in its arithmetic) and
    /// passes the row's real vocabulary `z [V]` here. Call after [`Problem::validate_row`].
    ///
    /// # Errors
    /// The three above.
    ///
    /// # Panics
    /// Never for `z.len() = V` and a row that passed [`Problem::validate_row`].
    pub fn validate_input_row(&self, row: usize, z: &[f64]) -> Result<(), SpecError> {
        self.validate_materialised_row("logits / temperature", row, z)
    }

    /// The errors of row `row` that only the materialised softcap reveals
    /// when `options.softcap_dtype` is [`SoftcapDtype::Input`]
    /// (`x' = `[`Dtype::softcapped_input`]`(x, c)`, which overflows where
    /// `c` exceeds the logits' dtype's range, e.g. f16 above 65504), on
    /// tensor `softcap(logits)`, in [`Problem::validate_input_row`]'s order
    /// over the row's real vocabulary `x' [V]`. Call after
    /// [`Problem::validate_row`], before the temperature's check.
    ///
    /// # Errors
    /// [`SpecError::NonFiniteLogit`], [`SpecError::NoFiniteLogit`],
    /// [`SpecError::TokenNegInf`].
    pub fn validate_softcapped_row(&self, row: usize, xs: &[f64]) -> Result<(), SpecError> {
        self.validate_materialised_row("softcap(logits)", row, xs)
    }

    /// The checks of a materialised row `z [V]` named `tensor`.
    fn validate_materialised_row(
        &self,
        tensor: &'static str,
        row: usize,
        z: &[f64],
    ) -> Result<(), SpecError> {
        if let Some(col) = z.iter().position(|&x| x == f64::INFINITY) {
            return Err(SpecError::NonFiniteLogit {
                tensor,
                row,
                col,
                value: f64::INFINITY,
            });
        }
        if !(0..z.len()).any(|j| z[j] > f64::NEG_INFINITY && self.allowed(row, j)) {
            let which = if self.sampling_mask.is_some() {
                "allowed by sampling_mask"
            } else {
                "any"
            };
            return Err(SpecError::NoFiniteLogit { tensor, row, which });
        }
        if let (Some(tokens), true) = (self.tokens, self.has_target(row)) {
            if z[tokens[row] as usize] == f64::NEG_INFINITY {
                return Err(SpecError::TokenNegInf {
                    row,
                    token: tokens[row],
                });
            }
        }
        Ok(())
    }

    /// [`Problem::validate_shapes`] then [`Problem::validate_row`] on every
    /// row, in row order (the first bad row is reported).
    ///
    /// # Errors
    /// Those of the two functions.
    pub fn validate(&self) -> Result<Shape, SpecError> {
        let shape = self.validate_shapes()?;
        for r in 0..shape.n {
            self.validate_row(&shape, r)?;
        }
        Ok(shape)
    }

    /// The cross-entropy `loss` this problem asks for (`options.loss` with
    /// [`Problem::loss_weights`]); `None` when it asks for none.
    pub fn cross_entropy(&self) -> Option<CrossEntropy<'a>> {
        self.options.loss.map(|l| l.with_weights(self.loss_weights))
    }

    /// The weight of row `row` in the loss (1 without `loss_weights`).
    pub fn loss_weight(&self, row: usize) -> f64 {
        self.loss_weights.map_or(1.0, |w| w[row])
    }

    /// Whether row `row`'s log-prob is wanted (tokens present and the token
    /// is not `ignore_index`).
    pub fn has_target(&self, row: usize) -> bool {
        self.tokens
            .is_some_and(|t| t[row] != self.options.ignore_index)
    }

    /// Row `row` over the real vocabulary (`[V]`, `V = options.vocab_size`
    /// or every column) as exact f64 values, `-inf` where the sampling mask
    /// disallows an entry: the logits `x'` the masked outputs are over.
    pub fn allowed_row_f64(&self, row: usize) -> Vec<f64> {
        let (_, v_total) = self.logits.dim();
        let v = self.options.vocab_size.unwrap_or(v_total).min(v_total);
        let mut x = self.logits.row_f64(row);
        x.truncate(v);
        for (j, xj) in x.iter_mut().enumerate() {
            if !self.allowed(row, j) {
                *xj = f64::NEG_INFINITY;
            }
        }
        x
    }

    /// Whether column `col` of row `row` is allowed by the sampling mask.
    pub fn allowed(&self, row: usize, col: usize) -> bool {
        self.sampling_mask.is_none_or(|m| m[[row, col]])
    }
}

pub(super) fn shape_err(tensor: &'static str, expected: Vec<usize>, found: &[usize]) -> SpecError {
    SpecError::ShapeMismatch {
        tensor,
        expected,
        found: found.to_vec(),
    }
}

pub(super) fn check_finite<'b>(
    tensor: &'static str,
    it: impl Iterator<Item = &'b f64>,
) -> Result<(), SpecError> {
    for (index, &value) in it.enumerate() {
        if !value.is_finite() {
            return Err(SpecError::NonFiniteCotangent {
                tensor,
                index,
                value,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, Array2};

    #[test]
    fn every_bad_row_gives_its_typed_error() {
        let x = array![[0.0f32, 1.0, f32::NEG_INFINITY], [0.0, f32::NAN, 1.0]];
        let mut p = Problem::new(Logits::F32(x.view()));
        assert!(matches!(
            p.validate(),
            Err(SpecError::NonFiniteLogit { row: 1, col: 1, .. })
        ));
        p.options.vocab_size = Some(1);
        assert!(p.validate().is_ok());
        p.options.vocab_size = Some(4);
        assert!(matches!(p.validate(), Err(SpecError::BadVocabSize { .. })));
        p.options.vocab_size = Some(3);
        let x = array![[0.0f32, 1.0, f32::NEG_INFINITY]];
        p.logits = Logits::F32(x.view());
        let t = array![2i64];
        p.tokens = Some(t.view());
        assert_eq!(
            p.validate(),
            Err(SpecError::TokenNegInf { row: 0, token: 2 })
        );
        let t = array![3i64];
        p.tokens = Some(t.view());
        assert!(matches!(
            p.validate(),
            Err(SpecError::TokenOutOfRange {
                row: 0,
                token: 3,
                ..
            })
        ));
        let t = array![-100i64];
        p.tokens = Some(t.view());
        assert!(p.validate().is_ok());
        let t = array![1i64];
        p.tokens = Some(t.view());
        let m = array![[true, false, true]];
        p.sampling_mask = Some(m.view());
        assert_eq!(
            p.validate(),
            Err(SpecError::TokenMasked { row: 0, token: 1 })
        );
        let m = array![[false, false, true]];
        p.tokens = None;
        p.sampling_mask = Some(m.view());
        assert!(matches!(
            p.validate(),
            Err(SpecError::NoFiniteLogit { row: 0, .. })
        ));
        p.sampling_mask = None;
        p.options.temperature = 0.0;
        assert!(matches!(
            p.validate(),
            Err(SpecError::BadTemperature { .. })
        ));
        p.options.temperature = 1e-50; // rounds to 0 in f32
        assert!(matches!(
            p.validate(),
            Err(SpecError::BadTemperature { .. })
        ));
    }

    #[test]
    fn empty_problem_is_valid() {
        let x = Array2::<f32>::zeros((0, 1 << 20));
        let p = Problem::new(Logits::F32(x.view()));
        assert_eq!(p.validate().unwrap().n, 0);
    }
}
