//! The problem's options ([`Options`]) and the modes they name (how the
//! temperature and the softcap are materialised, which logits the entropy
//! runs over). The math is docs/design.md's "The math" and "The loss side".

use super::dtype::Dtype;
use super::error::SpecError;
use super::loss::LossOptions;
use super::meta_key;
use super::policy::PolicyClamps;
use super::problem::DEFAULT_IGNORE_INDEX;
use super::topk_kl::TopkKl;

/// How the temperature division is materialised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TemperatureDtype {
    /// `z_j = x_j / T` taken exactly (the division happens in the accumulation).
    #[default]
    Accumulation,
    /// `z_j = round_input(x_j / T)`: the caller materialised z in the input
    /// dtype (PyTorch's `bf16_logits.div_(T)`), so that rounded z is the input.
    Input,
}

/// How the softcap `x' = c tanh(x / c)` is materialised (docs/design.md, "The
/// loss side"; Gemma 2's final-logit softcapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SoftcapDtype {
    /// `x'_j = c tanh(x_j / c)` taken exactly (the softcap happens in the
    /// accumulation dtype; each kernel declares its error,
    /// [`crate::spec::Algorithm::tanh_ulps`]).
    #[default]
    Accumulation,
    /// The caller materialised `x'` in the logits' dtype, each of `x / c`,
    /// `tanh` and `* c` computed in the accumulation dtype and rounded to
    /// the logits' dtype ([`Dtype::softcapped_input`]): that rounded `x'`
    /// is the exact input, as `z` is with [`TemperatureDtype::Input`].
    Input,
}

/// How [`Problem::teacher_probs`](super::Problem::teacher_probs) holds
/// the soft cross-entropy's teacher (docs/design.md, "The loss side").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TeacherForm {
    /// Probabilities `p_j` (finite, `>= 0`): the dump's `teacher_probs`.
    #[default]
    Probs,
    /// Log-probabilities `a_j` (`<= 0`, `-inf` for no mass), `p_j =
    /// exp(a_j)` exactly: the dump's `teacher_log_probs` (a kernel that
    /// takes the teacher's log-probs computes `exp` itself).
    LogProbs,
}

impl TeacherForm {
    /// Whether an entry holding `x` carries no teacher mass (`p_j = 0`).
    pub fn is_zero(self, x: f64) -> bool {
        match self {
            TeacherForm::Probs => x == 0.0,
            TeacherForm::LogProbs => x == f64::NEG_INFINITY,
        }
    }

    /// Whether `x` is a valid entry: finite and `>= 0` (probabilities),
    /// `<= 0` or `-inf` (log-probabilities).
    pub fn valid(self, x: f64) -> bool {
        match self {
            TeacherForm::Probs => x.is_finite() && x >= 0.0,
            TeacherForm::LogProbs => x <= 0.0,
        }
    }

    /// `p_j` of an entry holding `x`, rounded to f64 (`exp` within an ulp
    /// for log-probabilities): for generators and test kernels, never
    /// for the oracle, which takes `exp(a_j)` exactly.
    pub fn prob_f64(self, x: f64) -> f64 {
        match self {
            TeacherForm::Probs => x,
            TeacherForm::LogProbs => x.exp(),
        }
    }

    /// The dump's name of the tensor: `teacher_probs` or `teacher_log_probs`.
    pub const fn tensor(self) -> &'static str {
        match self {
            TeacherForm::Probs => "teacher_probs",
            TeacherForm::LogProbs => "teacher_log_probs",
        }
    }
}

/// Which logits the entropy is taken over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum EntropyLogits {
    /// Entropy of softmax(z), the sampling mask ignored (on-policy RL code).
    #[default]
    Unmasked,
    /// Entropy of softmax(z'), disallowed entries at `-inf`.
    Masked,
}

/// Options of the computation (docs/design.md, "The math"). `Debug` prints the
/// loss side's fields only when set (reports and golden headers of
/// log-prob problems read as before they existed).
#[derive(Clone, Copy, PartialEq)]
pub struct Options {
    /// Temperature `T > 0`; rounded to the accumulation dtype (f32 for
    /// f32/bf16/f16 logits, f64 for f64) before use, as PyTorch does with a
    /// Python float. Default 1.
    pub temperature: f64,
    /// How `z = x / T` is materialised. Default [`TemperatureDtype::Accumulation`].
    pub temperature_dtype: TemperatureDtype,
    /// Real vocabulary size; columns at or past it are padding (ignored,
    /// gradient 0). `None` = all columns.
    pub vocab_size: Option<usize>,
    /// Rows whose token equals this have no log-prob to check and a zero
    /// log-prob cotangent. Default -100.
    pub ignore_index: i64,
    /// Whether to compute the entropy, and over which logits. Default
    /// `Some(Unmasked)`.
    pub entropy: Option<EntropyLogits>,
    /// Whether to compute `token_ranks [N]` (needs `tokens`): the token's
    /// rank among the row's log-probs, ties counted against it. Default false.
    pub token_ranks: bool,
    /// Whether to compute `lse [N]`, the logsumexp of `z'` per row (nats).
    /// Default false.
    pub lse: bool,
    /// `Some(coef)`: compute `z_loss [N] = coef * lse^2` per row (nats^2
    /// times `coef`; docs/design.md, "The loss side"). `coef >= 0` and finite, rounded
    /// to the accumulation dtype as the temperature is. Default `None`.
    pub z_loss_coef: Option<f64>,
    /// `Some(c)`: softcap the raw logits, `x'_j = c tanh(x_j / c)`, before
    /// the temperature (Gemma 2), so every output sees `z = x' / T`. `c > 0`
    /// and finite, rounded to the accumulation dtype as the temperature is.
    /// A `-inf` logit becomes `-c` (`tanh(-inf) = -1`, PyTorch's value).
    /// Default `None`.
    pub softcap: Option<f64>,
    /// How `x'` is materialised. Default [`SoftcapDtype::Accumulation`].
    pub softcap_dtype: SoftcapDtype,
    /// `Some`: compute the cross-entropy `loss` (needs `tokens`;
    /// docs/design.md, "The loss side") with this reduction, label smoothing and all-ignored
    /// mean; its per-row weights are [`Problem::loss_weights`](super::Problem::loss_weights). Default
    /// `None`.
    pub loss: Option<LossOptions>,
    /// The clamps of the policy terms (`kl_k3`, `ratio`;
    /// [`crate::spec::PolicyTerm`]). Default: none.
    pub policy_clamps: PolicyClamps,
    /// `Some`: compute the top-k KL to a teacher (`forward_kl`,
    /// `reverse_kl`; docs/design.md, "The loss side"), over `topk_ids` with the
    /// teacher's log-probs [`Problem::teacher_topk_log_probs`](super::Problem::teacher_topk_log_probs). Default
    /// `None`.
    pub topk_kl: Option<TopkKl>,
    /// How `teacher_probs` holds the soft cross-entropy's teacher. Default
    /// [`TeacherForm::Probs`].
    pub teacher_form: TeacherForm,
    /// The accumulation dtype the computation's constants (temperature,
    /// softcap, z-loss coefficient, label smoothing, clamps) are rounded
    /// to; `None` (default) = the logits dtype's
    /// ([`Dtype::accumulation`]). Set where the logits are wider than the
    /// computation that made them: a fused linear + loss kernel's logits
    /// are exact dot products of `hidden` and `lm_head_weight`, held as
    /// f64, while it computes in f32 (TOLERANCE.md (T29)).
    pub accumulation: Option<Dtype>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Options");
        d.field(meta_key::TEMPERATURE, &self.temperature)
            .field(meta_key::TEMPERATURE_DTYPE, &self.temperature_dtype)
            .field(meta_key::VOCAB_SIZE, &self.vocab_size)
            .field(meta_key::IGNORE_INDEX, &self.ignore_index)
            .field("entropy", &self.entropy);
        if self.token_ranks {
            d.field("token_ranks", &true);
        }
        if self.lse {
            d.field("lse", &self.lse);
        }
        if let Some(c) = self.z_loss_coef {
            d.field(meta_key::Z_LOSS_COEF, &c);
        }
        if let Some(c) = self.softcap {
            d.field(meta_key::SOFTCAP, &c)
                .field(meta_key::SOFTCAP_DTYPE, &self.softcap_dtype);
        }
        if let Some(l) = &self.loss {
            d.field("loss", l);
        }
        if !self.policy_clamps.is_empty() {
            d.field("policy_clamps", &self.policy_clamps);
        }
        if let Some(k) = &self.topk_kl {
            d.field("topk_kl", k);
        }
        if self.teacher_form != TeacherForm::Probs {
            d.field("teacher_form", &self.teacher_form);
        }
        if let Some(a) = self.accumulation {
            d.field("accumulation", &a);
        }
        d.finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            temperature: 1.0,
            temperature_dtype: TemperatureDtype::Accumulation,
            vocab_size: None,
            ignore_index: DEFAULT_IGNORE_INDEX,
            entropy: Some(EntropyLogits::Unmasked),
            token_ranks: false,
            lse: false,
            z_loss_coef: None,
            softcap: None,
            softcap_dtype: SoftcapDtype::Accumulation,
            loss: None,
            policy_clamps: PolicyClamps::default(),
            topk_kl: None,
            teacher_form: TeacherForm::Probs,
            accumulation: None,
        }
    }
}

impl Options {
    /// The temperature as the computation uses it: rounded to `acc` (f32 or
    /// f64), as an exact f64.
    ///
    /// # Errors
    /// [`SpecError::BadTemperature`] unless the rounded value is finite and > 0.
    pub fn effective_temperature(&self, acc: Dtype) -> Result<f64, SpecError> {
        let t = acc.round_f64(self.temperature);
        if t.is_finite() && t > 0.0 {
            Ok(t)
        } else {
            Err(SpecError::BadTemperature {
                temperature: self.temperature,
            })
        }
    }

    /// The z-loss coefficient as the computation uses it: rounded to `acc`
    /// (f32 or f64), as an exact f64 (`None` without `z_loss_coef`).
    ///
    /// # Errors
    /// [`SpecError::BadZLossCoef`] unless the rounded value is finite and >= 0.
    pub fn effective_z_loss_coef(&self, acc: Dtype) -> Result<Option<f64>, SpecError> {
        match self.z_loss_coef {
            None => Ok(None),
            Some(c) => {
                let r = acc.round_f64(c);
                if r.is_finite() && r >= 0.0 {
                    Ok(Some(r))
                } else {
                    Err(SpecError::BadZLossCoef { z_loss_coef: c })
                }
            }
        }
    }
}

impl Options {
    /// The softcap `c` as the computation uses it: rounded to `acc` (f32 or
    /// f64), as an exact f64 (`None` without `softcap`).
    ///
    /// # Errors
    /// [`SpecError::BadSoftcap`] unless `c` and its rounded value are finite
    /// and > 0.
    pub fn effective_softcap(&self, acc: Dtype) -> Result<Option<f64>, SpecError> {
        self.softcap
            .map(|c| {
                acc.round_positive(c)
                    .ok_or(SpecError::BadSoftcap { softcap: c })
            })
            .transpose()
    }
}
