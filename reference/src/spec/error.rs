//! The typed errors of bad input, shared by the oracle, every kernel and the
//! verifier.

/// Bad input to a log-prob / entropy / top-k computation. Every variant names
/// the tensor and, where one exists, the row and column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// A logit is NaN or `+inf` inside the real vocabulary.
    #[error("{tensor}[{row}, {col}] is {value}: NaN and +inf logits are bad input")]
    NonFiniteLogit {
        /// Name of the tensor (`logits`).
        tensor: &'static str,
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// The offending value.
        value: f64,
    },
    /// A target token outside `[0, vocab_size)` that is not `ignore_index`.
    #[error("tokens[{row}] = {token} is outside [0, {vocab_size}) and is not ignore_index")]
    TokenOutOfRange {
        /// Row index.
        row: usize,
        /// The token.
        token: i64,
        /// The real vocabulary size.
        vocab_size: usize,
    },
    /// A target token that the sampling mask disallows.
    #[error("tokens[{row}] = {token} is masked out by sampling_mask[{row}, {token}]")]
    TokenMasked {
        /// Row index.
        row: usize,
        /// The token.
        token: i64,
    },
    /// A target token whose logit is `-inf` (probability 0, log-prob `-inf`).
    #[error("tokens[{row}] = {token} has logit -inf (log-prob -inf)")]
    TokenNegInf {
        /// Row index.
        row: usize,
        /// The token.
        token: i64,
    },
    /// A top-k id outside `[0, vocab_size)`.
    #[error("topk_ids[{row}, {k}] = {id} is outside [0, {vocab_size})")]
    TopkIdOutOfRange {
        /// Row index.
        row: usize,
        /// Position in the row's top-k list.
        k: usize,
        /// The id.
        id: i64,
        /// The real vocabulary size.
        vocab_size: usize,
    },
    /// A row in which no allowed logit is finite (all masked out or `-inf`);
    /// `entropy_over` names which logits: `masked` or `unmasked` ones.
    #[error("row {row} of {tensor} has no allowed finite logit ({which})")]
    NoFiniteLogit {
        /// Name of the tensor (`logits`).
        tensor: &'static str,
        /// Row index.
        row: usize,
        /// `"allowed by sampling_mask"` or `"unmasked, for the entropy"`.
        which: &'static str,
    },
    /// `chunk_size == 0`.
    #[error("chunk_size must be at least 1, got 0")]
    ZeroChunkSize,
    /// A temperature that is not finite and positive (after rounding to the
    /// accumulation dtype).
    #[error("temperature must be finite and > 0, got {temperature}")]
    BadTemperature {
        /// The temperature as given.
        temperature: f64,
    },
    /// `z_loss_coef` negative or non-finite (after rounding to the
    /// accumulation dtype).
    #[error("z_loss_coef must be finite and >= 0, got {z_loss_coef}")]
    BadZLossCoef {
        /// The coefficient as given.
        z_loss_coef: f64,
    },
    /// `softcap` not finite and > 0 (as given or after rounding to the
    /// accumulation dtype).
    #[error("softcap must be finite and > 0, got {softcap}")]
    BadSoftcap {
        /// The softcap `c` as given.
        softcap: f64,
    },
    /// `softcap_dtype = accumulation` with `temperature_dtype = input`: a
    /// model that materialised `z = x' / T` in the logits' dtype
    /// materialised the softcapped `x'` there too.
    #[error("temperature_dtype=input needs softcap_dtype=input (z = x'/T was materialised in the logits' dtype, so x' was too)")]
    SoftcapDtypeMismatch,
    /// A tensor of the wrong shape.
    #[error("{tensor} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Name of the tensor.
        tensor: &'static str,
        /// Expected shape (`usize::MAX` marks a free dimension).
        expected: Vec<usize>,
        /// Actual shape.
        found: Vec<usize>,
    },
    /// `vocab_size` larger than the number of columns, or zero with columns
    /// present.
    #[error("vocab_size = {vocab_size} does not fit logits with {columns} columns")]
    BadVocabSize {
        /// The declared real vocabulary size.
        vocab_size: usize,
        /// Columns of `logits`.
        columns: usize,
    },
    /// An output was asked for without the tensor it needs (log-probs
    /// without `tokens`, say).
    #[error("{output} needs tensor {tensor}, which is missing")]
    MissingTensor {
        /// The output.
        output: &'static str,
        /// The missing tensor.
        tensor: &'static str,
    },
    /// A cotangent was given for an output that is not computed, or
    /// gradients were asked for without any cotangent.
    #[error("gradient requested without a cotangent: {what}")]
    NoCotangent {
        /// What is missing.
        what: &'static str,
    },
    /// A cotangent that is NaN or infinite.
    #[error("{tensor}[{index}] is {value}: cotangents must be finite")]
    NonFiniteCotangent {
        /// Name of the cotangent tensor.
        tensor: &'static str,
        /// Flat index.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// `label_smoothing` outside `[0, 1]` (or NaN).
    #[error("label_smoothing must be in [0, 1], got {label_smoothing}")]
    BadLabelSmoothing {
        /// The value as given.
        label_smoothing: f64,
    },
    /// A `reduction` other than `none`, `sum`, `mean`.
    #[error("reduction must be none, sum or mean, got {found:?}")]
    UnknownReduction {
        /// The value as given.
        found: String,
    },
    /// A `mean_all_ignored` other than `nan`, `zero`.
    #[error("mean_all_ignored must be nan or zero, got {found:?}")]
    UnknownMeanAllIgnored {
        /// The value as given.
        found: String,
    },
    /// A `teacher_probs` entry (of the real vocabulary) that is negative or
    /// not finite, or a `teacher_log_probs` entry that is NaN or `> 0`.
    #[error("{tensor}[{row}, {col}] is {value}: a probability is finite and >= 0, a log-probability <= 0 or -inf")]
    BadTeacherProb {
        /// `teacher_probs` or `teacher_log_probs`.
        tensor: &'static str,
        /// Row index.
        row: usize,
        /// Column index.
        col: usize,
        /// The offending value.
        value: f64,
    },
    /// A `loss_weights` entry that is negative or not finite.
    #[error("loss_weights[{row}] is {value}: weights must be finite and >= 0")]
    BadLossWeight {
        /// Row index.
        row: usize,
        /// The offending value.
        value: f64,
    },
    /// The divisor of a `mean` loss (the counted rows' `loss_weights`
    /// summed) is beyond the largest f64.
    #[error("the mean loss's divisor (the counted rows' loss_weights summed over {rows} rows) overflows f64")]
    LossDivisorOverflow {
        /// Rows summed when it overflowed.
        rows: usize,
    },
    /// A `ref_log_probs` / `old_log_probs` entry that is NaN or infinite.
    #[error("{tensor}[{row}] is {value}: reference and behaviour log-probs must be finite")]
    NonFinitePolicyInput {
        /// `ref_log_probs` or `old_log_probs`.
        tensor: &'static str,
        /// Row index.
        row: usize,
        /// The offending value.
        value: f64,
    },
    /// A clamp (`kl_input_clamp`, `kl_output_clamp`, `ratio_log_clamp`)
    /// that is not finite and `> 0` (as given or rounded to the
    /// accumulation dtype).
    #[error("{name} must be finite and > 0, got {value}")]
    BadClamp {
        /// The clamp's name.
        name: &'static str,
        /// The value as given.
        value: f64,
    },
    /// A `teacher_topk_log_probs` entry that is not a log-prob: positive,
    /// NaN or `+inf` (`-inf` is a zero-probability entry).
    #[error("teacher_topk_log_probs[{row}, {k}] is {value}: a log-prob is <= 0 and not NaN")]
    BadTeacherLogProb {
        /// Row index.
        row: usize,
        /// Column (position in the row's top-k list).
        k: usize,
        /// The offending value.
        value: f64,
    },
    /// A row of `teacher_topk_log_probs` whose mass `sum_k e^{a_k}` exceeds
    /// 1 by more than the rounding to its dtype explains
    /// ([`crate::spec::check_teacher_row`]).
    #[error("teacher_topk_log_probs[{row}] has mass sum_k exp(a_k - ulp/2) >= {lower} > 1: not the rounding of log-probs")]
    TeacherMassAboveOne {
        /// Row index.
        row: usize,
        /// The lower bound of `sum_k e^{a_k - ulp(a_k)/2}` that exceeded 1.
        lower: f64,
    },
    /// A top-k id that appears twice in its row, where the top-k KL needs a
    /// set of ids.
    #[error("topk_ids[{row}, {k}] = {id} repeats an earlier id of row {row} (the top-k KL sums over a set)")]
    TopkIdDuplicate {
        /// Row index.
        row: usize,
        /// Position of the repeat.
        k: usize,
        /// The id.
        id: i64,
    },
    /// A top-k id that the sampling mask disallows, where the top-k KL
    /// needs the student's probability there.
    #[error("topk_ids[{row}, {k}] = {id} is masked out by sampling_mask[{row}, {id}] (the top-k KL needs its probability)")]
    TopkIdMasked {
        /// Row index.
        row: usize,
        /// Position in the row's top-k list.
        k: usize,
        /// The id.
        id: i64,
    },
    /// A renormalised top-k KL over a row whose K ids all have student
    /// probability 0 (no mass to renormalise).
    #[error(
        "row {row}: every topk_ids logit is -inf, so kl_renormalized has nothing to renormalise"
    )]
    KlNoStudentMass {
        /// Row index.
        row: usize,
    },
    /// A `grad_reverse_kl` cotangent on a row whose reverse KL is `+inf`
    /// (a teacher entry `-inf` where the student's probability is `> 0`):
    /// its gradient is infinite, not a number to check.
    #[error("grad_reverse_kl[{row}] = {cotangent} differentiates an infinite reverse_kl: teacher_topk_log_probs[{row}, {k}] is -inf at topk_ids[{row}, {k}] = {id}, whose student probability is > 0")]
    KlGradientInfinite {
        /// Row index.
        row: usize,
        /// Position in the row's top-k list.
        k: usize,
        /// The id.
        id: i64,
        /// The row's `grad_reverse_kl`.
        cotangent: f64,
    },
    /// A `grad_soft_cross_entropy` cotangent on a row whose soft
    /// cross-entropy is `+inf` (teacher mass where the student's
    /// probability is 0: a masked entry, or a `-inf` logit without a
    /// softcap): its gradient is infinite, not a number to check.
    #[error("grad_soft_cross_entropy[{row}] = {cotangent} differentiates an infinite soft_cross_entropy: teacher_probs[{row}, {col}] is > 0 where the student's probability is 0")]
    SoftCrossEntropyGradientInfinite {
        /// Row index.
        row: usize,
        /// The column with teacher mass and no student mass.
        col: usize,
        /// The row's `grad_soft_cross_entropy`.
        cotangent: f64,
    },
}
