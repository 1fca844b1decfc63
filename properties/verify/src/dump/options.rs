//! The options of a dump from its `__metadata__` strings, each key read
//! through its typed [`Key`](crate::keys::Key) (defaults per the format).

use std::collections::HashMap;

use logprobe_reference::spec::{
    Dtype, EntropyLogits, LossOptions, Options, PolicyClamps, SoftcapDtype, SpecError,
    TemperatureDtype, DEFAULT_IGNORE_INDEX,
};

use super::DumpError;
use crate::keys;

/// The stored value of `key`, trimmed (the value a choice key reports).
fn trimmed<'m>(meta: &'m HashMap<String, String>, key: &str) -> Option<&'m str> {
    meta.get(key).map(|s| s.trim())
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
pub(crate) fn parse_loss_options(meta: &HashMap<String, String>) -> Result<LossOptions, DumpError> {
    let mut o = LossOptions::default();
    if let Some(r) = keys::REDUCTION.get(meta)? {
        o.reduction = r;
    }
    if let Some(e) = keys::LABEL_SMOOTHING.get(meta)? {
        if !(0.0..=1.0).contains(&e) {
            return Err(SpecError::BadLabelSmoothing { label_smoothing: e }.into());
        }
        o.label_smoothing = e;
    }
    if let Some(m) = keys::MEAN_ALL_IGNORED.get(meta)? {
        o.mean_all_ignored = m;
    }
    Ok(o)
}

/// The policy terms' clamps (`kl_input_clamp`, `kl_output_clamp`,
/// `ratio_log_clamp`: numbers, each optional; their range is the spec's,
/// [`PolicyClamps::effective`]).
///
/// # Errors
/// [`DumpError::BadMetadata`] for a value that is not a number.
pub(crate) fn parse_policy_clamps(
    meta: &HashMap<String, String>,
) -> Result<PolicyClamps, DumpError> {
    Ok(PolicyClamps {
        kl_input: keys::KL_INPUT_CLAMP.get(meta)?,
        kl_output: keys::KL_OUTPUT_CLAMP.get(meta)?,
        ratio_log: keys::RATIO_LOG_CLAMP.get(meta)?,
    })
}

/// `z_loss_coef` (required with a `z_loss` tensor): a float `>= 0`,
/// finite once rounded to the accumulation dtype of `dtype` logits.
///
/// # Errors
/// [`DumpError::BadMetadata`]: absent, not a number, or out of range.
pub(crate) fn parse_z_loss_coef(
    meta: &HashMap<String, String>,
    dtype: Dtype,
) -> Result<f64, DumpError> {
    let k = keys::Z_LOSS_COEF;
    let stored = meta.get(k.name).map_or("", String::as_str);
    let c = k
        .get(meta)?
        .ok_or_else(|| k.bad(stored, "required by the z_loss tensor"))?;
    let r = dtype.accumulation().round_f64(c);
    if !(r.is_finite() && r >= 0.0) {
        return Err(k.bad(stored, "must be finite and >= 0"));
    }
    Ok(c)
}

/// Options from the `__metadata__` strings (defaults per the format).
///
/// # Errors
/// [`DumpError::BadMetadata`] (or [`DumpError::Temperature`]) naming the
/// first bad key.
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
    let k = keys::TEMPERATURE;
    if let Some(t) = k.get(meta)? {
        let stored = &meta[k.name];
        if !(t.is_finite() && t > 0.0) {
            return Err(k.bad(stored, "must be finite and > 0"));
        }
        crate::temperature::check_value(stored, t, dtype)?;
        o.temperature = t;
    }
    let k = keys::VOCAB_SIZE;
    if let Some(vs) = k.get(meta)? {
        if vs > v_total || (vs == 0 && v_total > 0) {
            return Err(k.bad(&meta[k.name], "must be in [1, V] (V = columns of logits)"));
        }
        o.vocab_size = Some(vs);
    }
    if let Some(ii) = keys::IGNORE_INDEX.get(meta)? {
        o.ignore_index = ii;
    }
    let k = keys::ENTROPY_LOGITS;
    let which = trimmed(meta, k.name).map(|s| k.parse(s)).transpose()?;
    o.entropy = entropy.then_some(which.unwrap_or(EntropyLogits::Unmasked));
    let k = keys::TEMPERATURE_DTYPE;
    o.temperature_dtype = trimmed(meta, k.name)
        .map(|s| k.parse(s))
        .transpose()?
        .unwrap_or(TemperatureDtype::Accumulation);
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
    let (kc, kd) = (keys::SOFTCAP, keys::SOFTCAP_DTYPE);
    let sdt = trimmed(meta, kd.name);
    let Some(c) = kc.get(meta)? else {
        if let Some(v) = sdt {
            return Err(kd.bad(v, "given without `softcap`"));
        }
        return Ok(());
    };
    let r = dtype.accumulation().round_f64(c);
    if !(c.is_finite() && c > 0.0 && r.is_finite() && r > 0.0) {
        return Err(kc.bad(
            &meta[kc.name],
            "must be finite and > 0 (also once rounded to the accumulation dtype)",
        ));
    }
    o.softcap = Some(c);
    o.softcap_dtype = sdt
        .map(|s| kd.parse(s))
        .transpose()?
        .unwrap_or(SoftcapDtype::Accumulation);
    if o.softcap_dtype == SoftcapDtype::Accumulation
        && o.temperature_dtype == TemperatureDtype::Input
    {
        return Err(kd.bad(
            sdt.unwrap_or("accumulation"),
            "must be `input` with temperature_dtype=input (z = x'/T was materialised in the logits' dtype, so x' was too)",
        ));
    }
    Ok(())
}
