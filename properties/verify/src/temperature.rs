//! Temperatures a computation cannot use: one that rounds to 0 in the
//! dtype it is applied in (`1e-300` in f32), and one so small that
//! `z = logits / temperature` overflows the dtype `z` is computed in
//! (`1e-45` in f32 with logits of magnitude above ~5e-7). Both are bad
//! input, each with its own message.

use logprobe_reference::spec::{Dtype, Options, TemperatureDtype};

use crate::dump::DumpError;

/// Checks the parsed metadata value `t` (finite, > 0) of `raw` for logits
/// of `dtype`: it must stay > 0 once rounded to the accumulation dtype
/// (f32 for f32/bf16/f16 logits, f64 for f64), as the computation rounds it.
///
/// # Errors
/// [`DumpError::Temperature`].
pub fn check_value(raw: &str, t: f64, dtype: Dtype) -> Result<(), DumpError> {
    let acc = dtype.accumulation();
    if acc.round_f64(t) == 0.0 {
        return Err(DumpError::Temperature {
            value: raw.to_string(),
            reason: format!(
                "rounds to 0 in {acc} (the temperature is applied in the accumulation dtype of {dtype} logits); the smallest positive {acc} is {:e}",
                logprobe_reference::spec::pow2(acc.min_subnormal_exp())
            ),
        });
    }
    Ok(())
}

/// Checks that `z = x / T` of every finite logit `x` of one row (`[V_total]`,
/// first `vocab_size` columns) is finite in the dtype `z` is materialised in
/// (the accumulation dtype; the logits' dtype as well under
/// `temperature_dtype=input`). `t` is the effective temperature.
///
/// # Errors
/// [`DumpError::ScaledOverflow`] naming the row and column of the largest
/// logit in magnitude.
pub fn check_row(
    x: &[f64],
    vocab_size: usize,
    options: &Options,
    t: f64,
    dtype: Dtype,
    row: usize,
) -> Result<(), DumpError> {
    if t >= 1.0 {
        return Ok(());
    }
    let Some((col, &big)) = x[..vocab_size.min(x.len())]
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    else {
        return Ok(());
    };
    let (z, in_dtype) = match options.temperature_dtype {
        TemperatureDtype::Input => (dtype.scaled_input(big, t), dtype),
        TemperatureDtype::Accumulation => (
            dtype.accumulation().round_f64(big / t),
            dtype.accumulation(),
        ),
    };
    if z.is_finite() {
        return Ok(());
    }
    Err(DumpError::ScaledOverflow {
        row,
        col,
        logit: big,
        temperature: t,
        dtype: in_dtype,
    })
}
