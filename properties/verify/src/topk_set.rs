//! `topk_ids_source=kernel`: the ids are the kernel's own top-k of `z'`,
//! checked as a valid top-k set. A set is valid when its ids are distinct
//! and no id outside it has a strictly larger `z'` than one inside (ties
//! at the boundary may go either way); with `topk_sorted=true` the ids are
//! also in non-increasing order of `z'` (ties in any order).
//!
//! `z'` is the logit a correct kernel compares: `z = x / T` rounded to the
//! accumulation dtype (or, under `temperature_dtype=input`, the logits'
//! dtype: [`Dtype::scaled_input`]), `-inf` where `sampling_mask` disallows.
//! Rounding is monotone, so a kernel that ranks the raw logits (exact order)
//! or the rounded `z` both pass; an id beaten by an id outside the set in
//! the rounded `z` is wrong under either. The values at wrong ids may well
//! match their log-probs: this check, not `topk_log_probs`, catches them.

use serde::Serialize;

use logprobe_reference::spec::{Dtype, Options, TemperatureDtype};

/// Why one row's ids are not a valid top-k set.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "defect", rename_all = "snake_case")]
pub enum TopkSetDefect {
    /// `ids[k]` repeats `ids[first]`.
    Duplicate {
        /// Position of the repeat.
        k: usize,
        /// Position of the first occurrence.
        first: usize,
        /// The id.
        id: usize,
    },
    /// `ids[k] = id` with `z'[id]` below `z'[outside]` of an id not in the set.
    NotTopk {
        /// Position in the set.
        k: usize,
        /// The id.
        id: usize,
        /// Its `z'`.
        z: f64,
        /// An id outside the set with larger `z'`.
        outside: usize,
        /// That id's `z'`.
        z_outside: f64,
    },
    /// `topk_sorted=true` and `z'[ids[k]] < z'[ids[k + 1]]`.
    Unsorted {
        /// Position of the smaller one.
        k: usize,
        /// `z'[ids[k]]`.
        z: f64,
        /// `z'[ids[k + 1]]`.
        z_next: f64,
    },
}

impl std::fmt::Display for TopkSetDefect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopkSetDefect::Duplicate { k, first, id } => {
                write!(f, "topk_ids[{k}] = {id} repeats topk_ids[{first}]")
            }
            TopkSetDefect::NotTopk {
                k,
                id,
                z,
                outside,
                z_outside,
            } => write!(
                f,
                "topk_ids[{k}] = {id} (z' = {z:e}) is not in the top-k: id {outside} outside the set has z' = {z_outside:e}"
            ),
            TopkSetDefect::Unsorted { k, z, z_next } => write!(
                f,
                "not in descending order (topk_sorted=true): z'[topk_ids[{k}]] = {z:e} < z'[topk_ids[{}]] = {z_next:e}",
                k + 1
            ),
        }
    }
}

/// `z'[j]` for `j < vocab_size` of one row: see the module docs.
/// `x` are the row's exact logits (`[V_total]`), `allowed(j)` the mask,
/// `t` the effective temperature (already rounded to the accumulation
/// dtype), `dtype` the logits' dtype.
pub fn z_prime(
    x: &[f64],
    vocab_size: usize,
    allowed: impl Fn(usize) -> bool,
    options: &Options,
    t: f64,
    dtype: Dtype,
) -> Vec<f64> {
    (0..vocab_size)
        .map(|j| {
            if !allowed(j) {
                f64::NEG_INFINITY
            } else if t == 1.0 {
                x[j]
            } else {
                match options.temperature_dtype {
                    TemperatureDtype::Input => dtype.scaled_input(x[j], t),
                    // f64 quotient then f32: innocuous double rounding
                    // (see `Dtype::scaled_input`).
                    TemperatureDtype::Accumulation => dtype.accumulation().round_f64(x[j] / t),
                }
            }
        })
        .collect()
}

/// Checks one row's `ids` (`[K]`, each in `[0, vocab_size)`: the spec has
/// validated the range) against `z` (`[vocab_size]`, from [`z_prime`]).
///
/// # Errors
/// The first [`TopkSetDefect`] (duplicates, then membership, then order).
pub fn check_row(ids: &[usize], z: &[f64], sorted: bool) -> Result<(), TopkSetDefect> {
    let mut pos: Vec<Option<usize>> = vec![None; z.len()];
    for (k, &id) in ids.iter().enumerate() {
        if let Some(first) = pos[id] {
            return Err(TopkSetDefect::Duplicate { k, first, id });
        }
        pos[id] = Some(k);
    }
    if let Some((outside, &z_outside)) = z
        .iter()
        .enumerate()
        .filter(|(j, _)| pos[*j].is_none())
        .max_by(|a, b| a.1.total_cmp(b.1))
    {
        // The smallest member, first position on ties.
        if let Some((k, &id)) = ids
            .iter()
            .enumerate()
            .min_by(|a, b| z[*a.1].total_cmp(&z[*b.1]).then(a.0.cmp(&b.0)))
        {
            if z[id] < z_outside {
                return Err(TopkSetDefect::NotTopk {
                    k,
                    id,
                    z: z[id],
                    outside,
                    z_outside,
                });
            }
        }
    }
    if sorted {
        for k in 0..ids.len().saturating_sub(1) {
            let (a, b) = (z[ids[k]], z[ids[k + 1]]);
            if a < b {
                return Err(TopkSetDefect::Unsorted { k, z: a, z_next: b });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_pass_and_wrong_ids_fail() {
        let z = [3.0, 1.0, 3.0, 2.0, f64::NEG_INFINITY];
        assert!(check_row(&[0, 2], &z, true).is_ok());
        assert!(check_row(&[2, 0], &z, true).is_ok());
        assert!(check_row(&[2, 0, 3], &z, true).is_ok());
        // A tie at the boundary: either id of value 3.0 may be chosen.
        assert!(check_row(&[0], &z, true).is_ok());
        assert!(check_row(&[2], &z, true).is_ok());
        assert!(matches!(
            check_row(&[0, 3], &z, false),
            Err(TopkSetDefect::NotTopk {
                id: 3,
                outside: 2,
                ..
            })
        ));
        assert!(matches!(
            check_row(&[0, 0], &z, false),
            Err(TopkSetDefect::Duplicate {
                k: 1,
                first: 0,
                id: 0
            })
        ));
        assert!(matches!(
            check_row(&[3, 0, 2], &z, true),
            Err(TopkSetDefect::Unsorted { k: 0, .. })
        ));
        assert!(check_row(&[3, 0, 2], &z, false).is_ok());
        // K = V: every id, any order unsorted; -inf ids allowed once all
        // finite ones are in.
        assert!(check_row(&[4, 3, 2, 1, 0], &z, false).is_ok());
        assert!(check_row(&[], &z, true).is_ok());
    }

    #[test]
    fn input_temperature_ties_are_ties() {
        // bf16 logits 1.2890625 and 1.296875 (adjacent) at T = 0.6: f32
        // quotients 2.1484375 (a bf16 tie, to even: 2.15625) and 2.1614583..
        // (to bf16 2.15625): equal z, so either is a valid top-1.
        let t = 0.6f32 as f64;
        let x = [1.2890625, 1.296875];
        let o = Options {
            temperature_dtype: TemperatureDtype::Input,
            ..Options::default()
        };
        let z = z_prime(&x, 2, |_| true, &o, t, Dtype::Bf16);
        assert_eq!(z[0], z[1]);
        assert!(check_row(&[0], &z, true).is_ok());
        let o = Options::default();
        let z = z_prime(&x, 2, |_| true, &o, t, Dtype::Bf16);
        assert!(check_row(&[0], &z, true).is_err());
    }
}

/// One row whose ids are not a valid top-k set.
#[derive(Clone, Debug, Serialize)]
pub struct TopkSetRow {
    /// Row of the dump (flat).
    pub row: usize,
    /// `(b, t)` for `[B, T, V]` logits.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub defect: TopkSetDefect,
    /// The defect in words.
    pub message: String,
}

/// The judgement of `topk_ids` as the kernel's top-k (`topk_ids_source=kernel`).
#[derive(Clone, Debug, Serialize)]
pub struct TopkSetReport {
    /// `pass` when every checked row's ids are a valid top-k set, else `fail`.
    pub verdict: crate::verify::ReportVerdict,
    /// Whether order was checked too (`topk_sorted=true`).
    pub sorted: bool,
    /// Rows checked.
    pub rows_checked: usize,
    /// `K`.
    pub k: usize,
    /// Rows whose ids are not a valid top-k set.
    pub rows_failed: usize,
    /// Why nothing was checked (no row, or `K = 0`); `None` when something was.
    pub nothing_checked: Option<String>,
    /// The first failing rows (at most `worst`).
    pub failures: Vec<TopkSetRow>,
}

/// Checks `topk_ids` of the selected `rows` of `dump` as the kernel's top-k
/// of `z'` (rows in parallel, O(V) memory per thread).
///
/// # Errors
/// [`crate::dump::DumpError`] from decoding a row (the rows were validated
/// before).
pub fn check_dump(
    dump: &crate::dump::Dump<'_>,
    rows: &[usize],
    worst: usize,
) -> Result<TopkSetReport, crate::dump::DumpError> {
    use rayon::prelude::*;
    let sorted = dump.format.topk_sorted;
    let k = dump.topk_ids.as_ref().map_or(0, |a| a.ncols());
    let dtype = dump.logits.dtype;
    let vocab = dump.vocab_size();
    let t = dump.options.effective_temperature(dtype.accumulation())?;
    let results: Vec<Option<TopkSetRow>> = rows
        .par_iter()
        .map(|&r| -> Result<Option<TopkSetRow>, crate::dump::DumpError> {
            let inputs = dump.row(r)?;
            let p = inputs.problem();
            let x = p.logits.row_f64(0);
            let z = z_prime(&x, vocab, |j| p.allowed(0, j), &dump.options, t, dtype);
            let ids: Vec<usize> = dump
                .topk_ids
                .as_ref()
                .map(|a| a.row(r).iter().map(|&i| i as usize).collect())
                .unwrap_or_default();
            Ok(check_row(&ids, &z, sorted).err().map(|defect| TopkSetRow {
                row: r,
                position: dump.row_shape.position(r),
                message: defect.to_string(),
                defect,
            }))
        })
        .collect::<Result<_, _>>()?;
    let failures: Vec<TopkSetRow> = results.into_iter().flatten().collect();
    let nothing_checked = if rows.is_empty() {
        Some(crate::verify::no_rows_reason(dump))
    } else if k == 0 {
        Some("K = 0: topk_ids has no column".to_string())
    } else {
        None
    };
    Ok(TopkSetReport {
        verdict: if !failures.is_empty() {
            crate::verify::ReportVerdict::Fail
        } else if nothing_checked.is_some() {
            crate::verify::ReportVerdict::Unchecked
        } else {
            crate::verify::ReportVerdict::Pass
        },
        sorted,
        rows_checked: rows.len(),
        k,
        rows_failed: failures.len(),
        nothing_checked,
        failures: failures.into_iter().take(worst).collect(),
    })
}
