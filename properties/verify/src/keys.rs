//! The `__metadata__` keys of a dump, typed (`docs/dump-from-pytorch.md`):
//! each key is a [`Key`] whose value type ([`MetaValue`]) parses and writes
//! it, so the reader ([`crate::dump`]), the writer
//! ([`crate::dump::Metadata`]), the fuzz protocol ([`crate::protocol`]) and
//! the fuzz counterexamples spell no key twice. The name table
//! ([`crate::names::NAMES`]) lists each key with its version, whether it is
//! built, its type and its doc line; [`crate::names::check_values`] checks
//! every value present, used or not.

use std::collections::HashMap;
use std::marker::PhantomData;

use logprobe_reference::spec::{
    meta_key, EntropyLogits, MeanAllIgnored, Output, Reduction, SoftcapDtype, SpecError,
    TemperatureDtype,
};

use crate::dump::weights_generator::{Distribution, GeneratedDtype};
use crate::dump::{DumpError, LmHeadLogitsDtype};
use crate::tolerance::K3Form;

/// Why a metadata value does not parse.
#[derive(Debug)]
pub enum Reject {
    /// Not of the key's type: the key's reason ([`Key::reason`]) is reported.
    Malformed,
    /// A value the spec defines as bad ([`SpecError::UnknownReduction`],
    /// [`SpecError::UnknownMeanAllIgnored`]).
    Spec(SpecError),
}

/// A metadata value type: how it is parsed from and written to the string
/// a dump stores.
pub trait MetaValue: Sized {
    /// The type as the docs and `--help` name it.
    const TYPE: &'static str;
    /// Parses the stored text (already trimmed).
    ///
    /// # Errors
    /// [`Reject`] when the text is not a value of the type.
    fn parse_value(text: &str) -> Result<Self, Reject>;
    /// The text to store (parses back to the same value).
    fn write_value(&self) -> String;
}

/// A number written the shortest way that parses back to the same f64
/// (exponent form outside `[1e-4, 1e6)`, `nan` for NaN).
pub fn write_f64(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x == 0.0 || !x.is_finite() || (1e-4..1e6).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

impl MetaValue for f64 {
    const TYPE: &'static str = "float";
    fn parse_value(text: &str) -> Result<Self, Reject> {
        text.parse().map_err(|_| Reject::Malformed)
    }
    fn write_value(&self) -> String {
        write_f64(*self)
    }
}

/// Integers and booleans, written by `Display`, parsed by `FromStr`.
macro_rules! display_value {
    ($($t:ty => $name:literal),*) => {$(
        impl MetaValue for $t {
            const TYPE: &'static str = $name;
            fn parse_value(text: &str) -> Result<Self, Reject> {
                text.parse().map_err(|_| Reject::Malformed)
            }
            fn write_value(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
display_value!(
    usize => "integer >= 0",
    u64 => "integer >= 0",
    u32 => "integer >= 0",
    i64 => "integer",
    bool => "`true` or `false`",
    String => "string"
);

/// Enums stored as one of their names.
macro_rules! choice_value {
    ($t:ty: $($v:path => $text:literal),*) => {
        impl MetaValue for $t {
            const TYPE: &'static str = concat!("one of" $(, " `", $text, "`")*);
            fn parse_value(text: &str) -> Result<Self, Reject> {
                match text {
                    $($text => Ok($v),)*
                    _ => Err(Reject::Malformed),
                }
            }
            fn write_value(&self) -> String {
                match self {
                    $($v => $text.into(),)*
                }
            }
        }
    };
}
choice_value!(TemperatureDtype: TemperatureDtype::Accumulation => "accumulation", TemperatureDtype::Input => "input");
choice_value!(SoftcapDtype: SoftcapDtype::Accumulation => "accumulation", SoftcapDtype::Input => "input");
choice_value!(EntropyLogits: EntropyLogits::Unmasked => "unmasked", EntropyLogits::Masked => "masked");
choice_value!(FormatVersion: FormatVersion::V1 => "1", FormatVersion::V2 => "2");
choice_value!(CotangentReduction: CotangentReduction::None => "none", CotangentReduction::Sum => "sum");
choice_value!(TopkIdsSource: TopkIdsSource::Given => "given", TopkIdsSource::Kernel => "kernel");
choice_value!(MaskedLogProbs: MaskedLogProbs::NegInf => "neg_inf", MaskedLogProbs::FinfoMin => "finfo_min");
choice_value!(K3Form: K3Form::Expm1 => "expm1", K3Form::Any => "any");
choice_value!(LmHeadLogitsDtype: LmHeadLogitsDtype::Input => "input", LmHeadLogitsDtype::Accumulation => "accumulation");
choice_value!(Distribution: Distribution::Normal => "splitmix64-normal-v1", Distribution::Uniform => "splitmix64-uniform-v1");
choice_value!(GeneratedDtype: GeneratedDtype::Bf16 => "bf16", GeneratedDtype::F16 => "f16", GeneratedDtype::F32 => "f32");

impl MetaValue for Reduction {
    const TYPE: &'static str = "one of `none` `sum` `mean`";
    fn parse_value(text: &str) -> Result<Self, Reject> {
        text.parse().map_err(Reject::Spec)
    }
    fn write_value(&self) -> String {
        self.name().into()
    }
}

impl MetaValue for MeanAllIgnored {
    const TYPE: &'static str = "one of `nan` `zero`";
    fn parse_value(text: &str) -> Result<Self, Reject> {
        text.parse().map_err(Reject::Spec)
    }
    fn write_value(&self) -> String {
        self.name().into()
    }
}

/// `outputs`: a comma list of [`Output::name`]s.
impl MetaValue for Vec<Output> {
    const TYPE: &'static str = "comma list of output names";
    fn parse_value(text: &str) -> Result<Self, Reject> {
        text.split(',')
            .map(|s| {
                Output::ALL
                    .into_iter()
                    .find(|o| o.name() == s.trim())
                    .ok_or(Reject::Malformed)
            })
            .collect()
    }
    fn write_value(&self) -> String {
        let names: Vec<&str> = self.iter().map(|o| o.name()).collect();
        names.join(",")
    }
}

/// `format_version`: 1 (default) or 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatVersion {
    /// Version 1.
    V1,
    /// Version 2.
    V2,
}

/// `cotangent_reduction`: `none` (default) or `sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CotangentReduction {
    /// A cotangent has its output's shape.
    None,
    /// A `[]` / `[1]` cotangent is broadcast to every row.
    Sum,
}

/// `topk_ids_source`: `given` (default) or `kernel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopkIdsSource {
    /// `topk_ids` are inputs.
    Given,
    /// `topk_ids` are the kernel's own top-k, checked as a top-k set.
    Kernel,
}

/// `masked_log_probs`: how a masked id's top-k log-prob (exactly `-inf`)
/// is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskedLogProbs {
    /// `-inf` (default; PyTorch's `log_softmax` of a `-inf` logit).
    NegInf,
    /// `-finfo(dtype).max`, the most negative finite value of the output's
    /// dtype (SGLang clamps on purpose): that value is judged as `-inf`.
    FinfoMin,
}

/// A typed metadata key: its name and the reason a malformed value is
/// rejected with ([`DumpError::BadMetadata`]).
pub struct Key<T> {
    /// The key as stored.
    pub name: &'static str,
    /// What is wrong with a value that does not parse.
    pub reason: &'static str,
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Key<T> {}

impl<T: MetaValue> Key<T> {
    const fn new(name: &'static str, reason: &'static str) -> Self {
        Key {
            name,
            reason,
            value: PhantomData,
        }
    }

    /// The value in `meta`, parsed (trimmed first); `None` when absent.
    ///
    /// # Errors
    /// [`DumpError::BadMetadata`] naming the key, the stored value and
    /// [`Key::reason`]; [`DumpError::Spec`] for a [`Reject::Spec`].
    pub fn get(&self, meta: &HashMap<String, String>) -> Result<Option<T>, DumpError> {
        meta.get(self.name).map(|v| self.parse(v)).transpose()
    }

    /// Parses one stored value of this key.
    ///
    /// # Errors
    /// As [`Key::get`].
    pub fn parse(&self, stored: &str) -> Result<T, DumpError> {
        T::parse_value(stored.trim()).map_err(|r| match r {
            Reject::Malformed => self.bad(stored, self.reason),
            Reject::Spec(e) => DumpError::Spec(e),
        })
    }

    /// [`DumpError::BadMetadata`] for `stored` with `reason`.
    pub fn bad(&self, stored: &str, reason: &'static str) -> DumpError {
        DumpError::BadMetadata {
            key: self.name,
            value: stored.to_string(),
            reason,
        }
    }

    /// The `(key, text)` pair that stores `value`.
    pub fn pair(&self, value: &T) -> (&'static str, String) {
        (self.name, value.write_value())
    }
}

/// Checks one stored value against its type: the table's check of
/// [`crate::names::check_values`].
pub(crate) fn check<T: MetaValue>(
    key: &'static str,
    reason: &'static str,
    stored: &str,
) -> Result<(), DumpError> {
    Key::<T>::new(key, reason).parse(stored).map(drop)
}

/// Declares the key constants (name, value type, reason).
macro_rules! keys {
    ($($(#[$doc:meta])* $c:ident: $t:ty = $name:expr, $reason:literal;)*) => {$(
        $(#[$doc])*
        pub const $c: Key<$t> = Key::new($name, $reason);
    )*};
}

keys! {
    /// `temperature` (default 1): `z = logits / T`.
    TEMPERATURE: f64 = meta_key::TEMPERATURE, "not a number";
    /// `vocab_size` (default `V_total`): the real columns.
    VOCAB_SIZE: usize = meta_key::VOCAB_SIZE, "not a non-negative integer";
    /// `entropy_logits` (default `unmasked`).
    ENTROPY_LOGITS: EntropyLogits = meta_key::ENTROPY_LOGITS, "expected `unmasked` or `masked`";
    /// `ignore_index` (default -100).
    IGNORE_INDEX: i64 = meta_key::IGNORE_INDEX, "not an integer";
    /// `temperature_dtype` (default `accumulation`).
    TEMPERATURE_DTYPE: TemperatureDtype = meta_key::TEMPERATURE_DTYPE, "expected `accumulation` or `input`";
    /// `format_version` (default 1).
    FORMAT_VERSION: FormatVersion = meta_key::FORMAT_VERSION, "expected `1` or `2`";
    /// `cotangent_reduction` (default `none`).
    COTANGENT_REDUCTION: CotangentReduction = meta_key::COTANGENT_REDUCTION, "expected `none` or `sum`";
    /// `topk_ids_source` (default `given`).
    TOPK_IDS_SOURCE: TopkIdsSource = meta_key::TOPK_IDS_SOURCE, "expected `given` or `kernel`";
    /// `topk_sorted` (default false; only with `topk_ids_source=kernel`).
    TOPK_SORTED: bool = meta_key::TOPK_SORTED, "expected `false` or `true`";
    /// `chunk_size` (informational, >= 1).
    CHUNK_SIZE: u64 = meta_key::CHUNK_SIZE, "expected an integer >= 1";
    /// `fuzz_recipe`: a fuzz finding's recipe.
    FUZZ_RECIPE: String = meta_key::FUZZ_RECIPE, "not a string";
    /// `fuzz_kernel`: a fuzz finding's `--kernel`.
    FUZZ_KERNEL: String = meta_key::FUZZ_KERNEL, "not a string";
    /// `fuzz_property`: the property a fuzz finding fails.
    FUZZ_PROPERTY: String = meta_key::FUZZ_PROPERTY, "not a string";
    /// `fuzz_seed`: the fuzz run's `--seed`.
    FUZZ_SEED: String = meta_key::FUZZ_SEED, "not a string";
    /// `outputs`: a fuzz protocol request's outputs wanted.
    OUTPUTS: Vec<Output> = meta_key::OUTPUTS, "expected a comma list of output names";
    /// `fuzz_protocol`: the fuzz protocol version.
    FUZZ_PROTOCOL: u32 = meta_key::FUZZ_PROTOCOL, "not a non-negative integer";
    /// `fuzz_exec`: the command of an `--exec` finding.
    FUZZ_EXEC: String = meta_key::FUZZ_EXEC, "not a string";
    /// `z_loss_coef` (required with `z_loss`).
    Z_LOSS_COEF: f64 = meta_key::Z_LOSS_COEF, "not a number";
    /// `reduction` of `loss` (default `none`).
    REDUCTION: Reduction = meta_key::REDUCTION, "expected `none`, `sum` or `mean`";
    /// `label_smoothing` (default 0).
    LABEL_SMOOTHING: f64 = meta_key::LABEL_SMOOTHING, "not a number";
    /// `mean_all_ignored` (default `nan`).
    MEAN_ALL_IGNORED: MeanAllIgnored = meta_key::MEAN_ALL_IGNORED, "expected `nan` or `zero`";
    /// `softcap` (a float > 0).
    SOFTCAP: f64 = meta_key::SOFTCAP, "not a number";
    /// `softcap_dtype` (default `accumulation`; only with `softcap`).
    SOFTCAP_DTYPE: SoftcapDtype = meta_key::SOFTCAP_DTYPE, "expected `accumulation` or `input`";
    /// `kl_input_clamp` of `kl_k3`.
    KL_INPUT_CLAMP: f64 = meta_key::KL_INPUT_CLAMP, "not a number";
    /// `kl_output_clamp` of `kl_k3`.
    KL_OUTPUT_CLAMP: f64 = meta_key::KL_OUTPUT_CLAMP, "not a number";
    /// `ratio_log_clamp` of `ratio`.
    RATIO_LOG_CLAMP: f64 = meta_key::RATIO_LOG_CLAMP, "not a number";
    /// `z_loss_rows`: reserved, not built.
    Z_LOSS_ROWS: String = meta_key::Z_LOSS_ROWS, "not a string";
    /// `loss_normalizer`: reserved, not built.
    LOSS_NORMALIZER: String = meta_key::LOSS_NORMALIZER, "not a string";
    /// `kl_renormalized` (default false).
    KL_RENORMALIZED: bool = meta_key::KL_RENORMALIZED, "not true or false";
    /// `masked_log_probs` (default `neg_inf`).
    MASKED_LOG_PROBS: MaskedLogProbs = meta_key::MASKED_LOG_PROBS, "expected `neg_inf` or `finfo_min`";
    /// `k3_form` (default `any`).
    K3_FORM: K3Form = meta_key::K3_FORM, "expected `expm1` or `any`";
    /// `lm_head_logits_dtype` (default `input`; only with `hidden`).
    LM_HEAD_LOGITS_DTYPE: LmHeadLogitsDtype = meta_key::LM_HEAD_LOGITS_DTYPE, "expected `input` or `accumulation`";
    /// `tp_rank`: this dump's rank in its tensor-parallel set.
    TP_RANK: u64 = meta_key::TP_RANK, "not a non-negative integer";
    /// `tp_size`: the ranks of the set (>= 1).
    TP_SIZE: u64 = meta_key::TP_SIZE, "not a non-negative integer";
    /// `tp_vocab_start`: the first global column of this rank's shard.
    TP_VOCAB_START: u64 = meta_key::TP_VOCAB_START, "not a non-negative integer";
    /// `lm_head_weight_file`: the file holding the LM head.
    LM_HEAD_WEIGHT_FILE: String = meta_key::LM_HEAD_WEIGHT_FILE, "not a string";
    /// `lm_head_weight_sha256`: the SHA-256 of its bytes.
    LM_HEAD_WEIGHT_SHA256: String = meta_key::LM_HEAD_WEIGHT_SHA256, "not a string";
    /// `lm_head_weight_generator`: the LM head is generated.
    LM_HEAD_WEIGHT_GENERATOR: Distribution = meta_key::LM_HEAD_WEIGHT_GENERATOR, "expected `splitmix64-normal-v1` or `splitmix64-uniform-v1`";
    /// `lm_head_weight_seed`: the generator's seed.
    LM_HEAD_WEIGHT_SEED: u64 = meta_key::LM_HEAD_WEIGHT_SEED, "not an integer in [0, 2^64)";
    /// `lm_head_weight_scale`: standard deviation or half-width.
    LM_HEAD_WEIGHT_SCALE: f64 = meta_key::LM_HEAD_WEIGHT_SCALE, "not a number";
    /// `lm_head_weight_shape`: `V,H`.
    LM_HEAD_WEIGHT_SHAPE: String = meta_key::LM_HEAD_WEIGHT_SHAPE, "not a string";
    /// `lm_head_weight_dtype`: `bf16`, `f16` or `f32`.
    LM_HEAD_WEIGHT_DTYPE: GeneratedDtype = meta_key::LM_HEAD_WEIGHT_DTYPE, "expected `bf16`, `f16` or `f32`";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_malformed_ones_name_the_key() {
        for x in [0.7, 1e-7, 2.5e6, -3.0, f64::INFINITY, 0.0] {
            assert_eq!(TEMPERATURE.parse(&write_f64(x)).unwrap(), x);
        }
        assert!(TEMPERATURE.parse(&write_f64(f64::NAN)).unwrap().is_nan());
        let outs = vec![Output::LogProbs, Output::GradLogits];
        let (k, v) = OUTPUTS.pair(&outs);
        assert_eq!((k, v.as_str()), ("outputs", "log_probs,grad_logits"));
        assert_eq!(OUTPUTS.parse(&v).unwrap(), outs);
        assert_eq!(
            OUTPUTS.parse("log_probs,nope").unwrap_err().to_string(),
            "metadata `outputs` = \"log_probs,nope\": expected a comma list of output names"
        );
        assert_eq!(SOFTCAP_DTYPE.parse(" input ").unwrap(), SoftcapDtype::Input);
        assert!(matches!(
            REDUCTION.parse("avg"),
            Err(DumpError::Spec(SpecError::UnknownReduction { .. }))
        ));
    }
}
