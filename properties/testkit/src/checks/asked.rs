//! Problems as a kernel sees them: what it is asked (outputs and input
//! features it cannot take left out), the error the spec expects, case
//! fingerprints.

use logprobe_kernels::kernel::{Capabilities, Feature};
use logprobe_reference::spec::meta_key;
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Output, Problem, SpecError, TemperatureDtype,
};

use crate::cache::OracleCase;
use crate::strategies::{CotangentData, OwnedLogits, ProblemData};

/// What a kernel is asked: the problem with the outputs it cannot compute
/// left out (entropy, masked entropy, top-k, token ranks, lse and z_loss, the loss, the soft cross-entropy), and the input features it
/// cannot take (mask, temperature, padding, f64), for which it must answer
/// [`KernelError::Unsupported`](logprobe_kernels::KernelError::Unsupported).
pub struct Asked<'a> {
    /// The problem given to the kernel.
    pub problem: Problem<'a>,
    /// The first input feature the kernel's capabilities exclude.
    pub unsupported: Option<&'static str>,
}

/// Adapts `problem` to `caps` (see [`Asked`]).
pub fn asked<'a>(problem: &Problem<'a>, caps: &Capabilities) -> Asked<'a> {
    let mut p = *problem;
    match p.options.entropy {
        Some(EntropyLogits::Masked) if !caps.supports(Feature::MaskedEntropy) => {
            p.options.entropy = None
        }
        Some(_) if !caps.computes(Output::Entropy) => p.options.entropy = None,
        _ => {}
    }
    if !caps.computes(Output::TopkLogProbs) {
        p.topk_ids = None;
    }
    if !caps.computes(Output::Lse) {
        p.options.lse = false;
    }
    if !caps.computes(Output::TokenRanks) {
        p.options.token_ranks = false;
    }
    if !caps.computes(Output::SoftCrossEntropy) {
        p.teacher_probs = None;
    }
    if !caps.computes(Output::ZLoss) {
        p.options.z_loss_coef = None;
    }
    if !caps.computes(Output::Loss) {
        p.options.loss = None;
        p.loss_weights = None;
    }
    if !caps.computes_policy() {
        p.policy = Default::default();
    }
    if !caps.computes_topk_kl() || p.topk_ids.is_none() {
        p.options.topk_kl = None;
        p.teacher_topk_log_probs = None;
    }
    let (_, v_total) = p.logits.dim();
    let unsupported = if p.sampling_mask.is_some() && !caps.supports(Feature::SamplingMask) {
        Some("sampling_mask")
    } else if (p.options.temperature != 1.0
        || p.options.temperature_dtype == TemperatureDtype::Input)
        && !caps.supports(Feature::Temperature)
    {
        Some(meta_key::TEMPERATURE)
    } else if p.options.softcap.is_some() && !caps.supports(Feature::Softcap) {
        Some(meta_key::SOFTCAP)
    } else if p.options.vocab_size.is_some_and(|v| v < v_total)
        && !caps.supports(Feature::PaddedVocab)
    {
        Some("padded vocabulary")
    } else if p.logits.dtype() == Dtype::F64 && !caps.supports(Feature::F64Input) {
        Some("f64 logits")
    } else {
        None
    };
    Asked {
        problem: p,
        unsupported,
    }
}

/// The cotangents a kernel is given: those of outputs its capabilities
/// dropped from the problem ([`asked`]) are left out too.
pub(crate) fn cot_for<'c>(
    data: &ProblemData,
    asked: &Problem<'_>,
    cot: &'c CotangentData,
) -> Cotangents<'c> {
    let mut cv = cot.view();
    if data.options.entropy.is_some() && asked.options.entropy.is_none() {
        cv.per_output.take(Output::Entropy);
    }
    if data.topk_ids.is_some() && asked.topk_ids.is_none() {
        cv.per_output.take(Output::TopkLogProbs);
    }
    // The loss side's, where the kernel is not asked those outputs.
    if data.options.lse && !asked.options.lse {
        cv.per_output.take(Output::Lse);
    }
    if data.options.z_loss_coef.is_some() && asked.options.z_loss_coef.is_none() {
        cv.per_output.take(Output::ZLoss);
    }
    if data.options.loss.is_some() && asked.options.loss.is_none() {
        cv.per_output.take(Output::Loss);
    }
    if asked.teacher_probs.is_none() {
        cv.per_output.take(Output::SoftCrossEntropy);
    }
    // The policy terms', where the kernel is not given their inputs.
    if asked.policy.ref_log_probs.is_none() {
        cv.per_output.take(Output::KlK1);
        cv.per_output.take(Output::KlK2);
        cv.per_output.take(Output::KlK3);
        cv.per_output.take(Output::KlAbs);
    }
    if asked.policy.old_log_probs.is_none() {
        cv.per_output.take(Output::Ratio);
    }
    // The top-k KL's, where the kernel is not asked the KL.
    if asked.options.topk_kl.is_none() || asked.teacher_topk_log_probs.is_none() {
        cv.per_output.take(Output::ForwardKl);
        cv.per_output.take(Output::ReverseKl);
    }
    cv
}

/// The error `problem` must give, if any: the spec's validation first, else
/// the oracle's own (an overflow of `round_input(x / T)`).
pub(crate) fn expected_error(problem: &Problem<'_>, oracle: &OracleCase) -> Option<SpecError> {
    match problem.validate() {
        Err(e) => Some(e),
        Ok(_) => match &oracle.forward {
            // Errors only the values reveal (`round_input(x / T)` overflowing);
            // a top-k error of ids the kernel was not given does not count.
            Err(SpecError::TopkIdOutOfRange { .. }) if problem.topk_ids.is_none() => None,
            // Nor a loss error where the kernel was not asked the loss.
            Err(
                SpecError::MissingTensor { output: "loss", .. }
                | SpecError::BadLabelSmoothing { .. }
                | SpecError::BadLossWeight { .. }
                | SpecError::ShapeMismatch {
                    tensor: "loss_weights",
                    ..
                },
            ) if problem.options.loss.is_none() => None,
            Err(e) => Some(e.clone()),
            Ok(_) => None,
        },
    }
}

/// Whether two spec errors agree (same variant and fields; NaN values match).
pub fn same_error(a: &SpecError, b: &SpecError) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// A fingerprint of every input bit (logits, tokens, mask, ids), to check
/// that a call left its inputs unchanged.
pub fn fingerprint(data: &ProblemData) -> u64 {
    let mut h = Fnv::default();
    // Each logit's own bits (no f64 copy of the buffer).
    match &data.logits {
        OwnedLogits::F64(a) => a.iter().for_each(|x| h.bytes(&x.to_bits().to_le_bytes())),
        OwnedLogits::F32(a) => a.iter().for_each(|x| h.bytes(&x.to_bits().to_le_bytes())),
        OwnedLogits::Bf16(a) => a.iter().for_each(|x| h.bytes(&x.to_bits().to_le_bytes())),
        OwnedLogits::F16(a) => a.iter().for_each(|x| h.bytes(&x.to_bits().to_le_bytes())),
    }
    if let Some(t) = &data.tokens {
        t.iter().for_each(|&x| h.add(x as u64));
    }
    if let Some(m) = &data.sampling_mask {
        m.iter().for_each(|&x| h.add(x as u64));
    }
    if let Some(k) = &data.topk_ids {
        k.iter().for_each(|&x| h.add(x as u64));
    }
    h.0
}

/// FNV-1a over 64-bit words.
pub(crate) struct Fnv(u64);
impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}
impl Fnv {
    pub(crate) fn add(&mut self, w: u64) {
        self.bytes(&w.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ x as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
