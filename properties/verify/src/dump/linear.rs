//! A dump's logits ([`DumpLogits`]): stored (`logits [N, V_total]`), or
//! made by a fused linear + loss kernel's matmul from `hidden [N, H]`
//! (or `[B, T, H]`), `lm_head_weight [V_total, H]` and an optional
//! `lm_head_bias [V_total]` (issue 45; docs/dump-from-pytorch.md, "Fused
//! linear + loss"). The oracle takes each row's logits as f64 values
//! within a certified error of the exact dot products
//! ([`logprobe_reference::oracle::linear`]); the bounds add the kernel's
//! matmul error (TOLERANCE.md (T29)).

use logprobe_reference::oracle::linear::{
    linear_logits_block, products_exact, LinearRow, LinearRowStats,
};
use logprobe_reference::spec::Dtype;

use super::parts::float_dtype;
use super::*;
use crate::keys;
use crate::names::tensor;
use crate::shapes::RowShape;

/// `lm_head_logits_dtype`: where a fused linear kernel keeps its logits
/// between the matmul and the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LmHeadLogitsDtype {
    /// Rounded to the matmul's dtype (PyTorch's `hidden @ W.T` in bf16
    /// returns bf16, as Liger's chunks do): the default, and sound for
    /// either.
    #[default]
    Input,
    /// Kept in the accumulation dtype (Cut Cross-Entropy's in-kernel dot
    /// products).
    Accumulation,
}

/// The logits of a fused linear + loss dump, computed row by row.
#[derive(Clone, Debug)]
pub struct LinearLogits<'a> {
    /// `hidden [N, H]`, left in the file.
    pub hidden: FloatMatrix<'a>,
    /// `lm_head_weight [V_total, H]`, left in the file.
    pub weight: FloatMatrix<'a>,
    /// `lm_head_bias [V_total]` as exact f64.
    pub bias: Option<Vec<f64>>,
    /// The matmul's dtype: the wider of `hidden`'s and the weight's
    /// (PyTorch's promotion).
    pub dtype: Dtype,
    /// Where the kernel keeps its logits ([`LmHeadLogitsDtype`]).
    pub logits_dtype: LmHeadLogitsDtype,
    /// The kernel's own `logits [N, V_total]`, when the dump gives them
    /// beside `hidden`: a candidate judged against the matmul's bound
    /// entry by entry (TOLERANCE.md (T29)).
    pub candidate: Option<FloatMatrix<'a>>,
}

/// Where a dump's logits come from.
#[derive(Clone, Debug)]
pub enum LogitsSource<'a> {
    /// `logits`, left in the file.
    Stored(FloatMatrix<'a>),
    /// `hidden . lm_head_weight^T (+ lm_head_bias)`.
    Linear(LinearLogits<'a>),
}

/// A dump's logits `[N, V_total]`.
#[derive(Clone, Debug)]
pub struct DumpLogits<'a> {
    /// The dtype the oracle reads them in: the stored dtype, or f64 for
    /// logits made from `hidden` (the enclosures' values).
    pub dtype: Dtype,
    /// Rows `N`.
    pub rows: usize,
    /// Columns `V_total`.
    pub cols: usize,
    /// Where they come from.
    pub source: LogitsSource<'a>,
}

impl<'a> DumpLogits<'a> {
    /// The stored `logits`, if the dump holds them.
    pub fn stored(&self) -> Option<&FloatMatrix<'a>> {
        match &self.source {
            LogitsSource::Stored(m) => Some(m),
            LogitsSource::Linear(_) => None,
        }
    }

    /// The fused linear kernel's inputs, if the logits come from them.
    pub fn linear(&self) -> Option<&LinearLogits<'a>> {
        match &self.source {
            LogitsSource::Linear(l) => Some(l),
            LogitsSource::Stored(_) => None,
        }
    }

    /// The accumulation dtype of the computation that made the outputs:
    /// the stored logits' ([`Dtype::accumulation`]), or the matmul's.
    pub fn accumulation(&self) -> Dtype {
        match &self.source {
            LogitsSource::Stored(m) => m.dtype.accumulation(),
            LogitsSource::Linear(l) => l.dtype.accumulation(),
        }
    }

    /// The dtype whose accumulation dtype the computation's constants
    /// are rounded to: the stored logits', or the matmul's.
    pub fn compute_dtype(&self) -> Dtype {
        match &self.source {
            LogitsSource::Stored(m) => m.dtype,
            LogitsSource::Linear(l) => l.dtype,
        }
    }

    /// What reports call the logits: `bf16`, or `bf16 hidden x bf16
    /// lm_head_weight`.
    pub fn describe(&self) -> String {
        match &self.source {
            LogitsSource::Stored(m) => m.dtype.to_string(),
            LogitsSource::Linear(l) => format!(
                "{} {} x {} {}",
                l.hidden.dtype,
                tensor::HIDDEN,
                l.weight.dtype,
                tensor::LM_HEAD_WEIGHT
            ),
        }
    }

    /// Row `r` as `[1, V_total]` logits, with the matmul's row for linear
    /// logits (its statistics over the first `vocab_size` columns, and
    /// every column's enclosure when the dump gives the kernel's logits
    /// too, [`LinearLogits::candidate`]). Panics if `r >= N`.
    ///
    /// # Errors
    /// [`DumpError::NonFiniteInput`] for a NaN or infinite `hidden`
    /// entry, [`DumpError::LinearOverflow`] for a logit that overflows f64.
    pub fn row_logits(
        &self,
        r: usize,
        vocab_size: usize,
    ) -> Result<(RowLogits, Option<LinearRow>), DumpError> {
        match &self.source {
            LogitsSource::Stored(m) => Ok((m.row_logits(r), None)),
            LogitsSource::Linear(l) => Self::linear_row_logits(l.row(r, vocab_size)?),
        }
    }

    /// [`DumpLogits::row_logits`] from a linear row computed beforehand
    /// ([`LinearLogits::rows`]).
    ///
    /// # Errors
    /// None of its own (the `Result` is the precomputed row's).
    pub fn linear_row_logits(
        mut row: LinearRow,
    ) -> Result<(RowLogits, Option<LinearRow>), DumpError> {
        let x = std::mem::take(&mut row.logits);
        let n = x.len();
        let a = ndarray::Array2::from_shape_vec((1, n), x).expect("one row");
        Ok((RowLogits::F64(a), Some(row)))
    }
}

/// Columns of the weight a task of [`LinearLogits::rows`] takes.
const COLUMN_CHUNK: usize = 1024;

impl LinearLogits<'_> {
    /// Row `r`'s logits (enclosure values) and statistics (see
    /// [`DumpLogits::row_logits`]).
    ///
    /// # Errors
    /// As [`DumpLogits::row_logits`].
    pub fn row(&self, r: usize, vocab_size: usize) -> Result<LinearRow, DumpError> {
        self.rows(&[r], vocab_size).pop().expect("one row")
    }

    /// [`LinearLogits::row`] for a block of rows at once, the weight's
    /// columns split over rayon's threads: each weight row is decoded
    /// once for the block instead of once per row, with the same bits
    /// ([`linear_logits_block`]). Memory: the block's `rows.len() x
    /// V_total` logits (and enclosures when asked for).
    pub fn rows(&self, rows: &[usize], vocab_size: usize) -> Vec<Result<LinearRow, DumpError>> {
        use rayon::prelude::*;
        let mut out: Vec<Result<LinearRow, DumpError>> = Vec::with_capacity(rows.len());
        let mut hiddens: Vec<(usize, Vec<f64>)> = Vec::with_capacity(rows.len());
        for (i, &r) in rows.iter().enumerate() {
            let h = self.hidden.row_f64(r);
            match h.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                Some((k, &value)) => out.push(Err(DumpError::NonFiniteInput {
                    tensor: tensor::HIDDEN,
                    index: vec![r, k],
                    value,
                })),
                None => {
                    // Filled below.
                    out.push(Err(DumpError::LinearOverflow {
                        row: r,
                        col: 0,
                        dtype: Dtype::F64,
                    }));
                    hiddens.push((i, h));
                }
            }
        }
        let exact = products_exact(self.hidden.dtype, self.weight.dtype);
        let hs = self.weight.cols;
        let w = &self.weight;
        let width = w.dtype.size_bytes();
        let decode = |j: usize, buf: &mut [f64]| {
            let bytes = &w.data[j * hs * width..(j + 1) * hs * width];
            decode_floats_into(w.dtype, bytes, buf);
        };
        let entries = self.candidate.is_some();
        let bias = self.bias.as_deref();
        let views: Vec<&[f64]> = hiddens.iter().map(|(_, h)| h.as_slice()).collect();
        let chunks: Vec<std::ops::Range<usize>> = (0..w.rows)
            .step_by(COLUMN_CHUNK)
            .map(|a| a..(a + COLUMN_CHUNK).min(w.rows))
            .collect();
        let parts: Vec<Vec<Result<LinearRow, usize>>> = chunks
            .into_par_iter()
            .map(|cols| {
                linear_logits_block(&views, cols, vocab_size, decode, bias, (exact, entries))
            })
            .collect();
        let mut joined: Vec<Result<LinearRow, usize>> = views
            .iter()
            .map(|h| {
                Ok(LinearRow {
                    logits: Vec::with_capacity(w.rows),
                    stats: LinearRowStats {
                        hidden_size: h.len(),
                        ..LinearRowStats::default()
                    },
                    entries: entries.then(|| Vec::with_capacity(w.rows)),
                })
            })
            .collect();
        for part in parts {
            for (slot, p) in joined.iter_mut().zip(part) {
                // The first bad column in order stays.
                match (slot.as_mut(), p) {
                    (Ok(row), Ok(p)) => row.append(p),
                    (Ok(_), Err(col)) => *slot = Err(col),
                    (Err(_), _) => {}
                }
            }
        }
        // A logit the kernel's accumulation dtype cannot hold.
        let acc = self.dtype.accumulation();
        for ((i, _), row) in hiddens.iter().zip(joined) {
            let r = rows[*i];
            out[*i] = match row {
                Err(col) => Err(DumpError::LinearOverflow {
                    row: r,
                    col,
                    dtype: Dtype::F64,
                }),
                Ok(row) => match row.logits.iter().position(|x| x.abs() > acc.max_finite()) {
                    Some(col) => Err(DumpError::LinearOverflow {
                        row: r,
                        col,
                        dtype: acc,
                    }),
                    None => Ok(row),
                },
            };
        }
        out
    }
}

/// Reads the logits: `logits`, or `hidden` and `lm_head_weight` (and
/// `lm_head_bias`), with `logits` then the kernel's candidate.
///
/// # Errors
/// [`DumpError::MissingTensor`] (neither form),
/// [`DumpError::BadDtype`], [`DumpError::BadShape`],
/// [`DumpError::NonFiniteInput`] for a NaN or infinite weight or bias.
pub(super) fn read_dump_logits<'a>(
    st: &Source<'a>,
    meta: &std::collections::HashMap<String, String>,
) -> Result<(DumpLogits<'a>, RowShape), DumpError> {
    let logits_dtype = keys::LM_HEAD_LOGITS_DTYPE.get(meta)?;
    let hidden = st.tensor(tensor::HIDDEN);
    if hidden.is_none() {
        for name in [tensor::LM_HEAD_WEIGHT, tensor::LM_HEAD_BIAS] {
            if st.tensor(name).is_some() {
                return Err(DumpError::MissingTensor {
                    tensor: tensor::HIDDEN,
                    why: " (lm_head_weight and lm_head_bias go with it)",
                });
            }
        }
        if logits_dtype.is_some() {
            return Err(keys::LM_HEAD_LOGITS_DTYPE.bad(
                meta[keys::LM_HEAD_LOGITS_DTYPE.name].as_str(),
                "only with hidden and lm_head_weight",
            ));
        }
        let (m, rs) = super::parts::read_logits(st)?;
        return Ok((
            DumpLogits {
                dtype: m.dtype,
                rows: m.rows,
                cols: m.cols,
                source: LogitsSource::Stored(m),
            },
            rs,
        ));
    }
    let ht = hidden.expect("checked above");
    let hdtype = float_dtype(tensor::HIDDEN, &ht)?;
    let (rs, hs) = RowShape::of_rows(tensor::HIDDEN, "H", ht.shape())?;
    let wt = st
        .tensor(tensor::LM_HEAD_WEIGHT)
        .ok_or(DumpError::MissingTensor {
            tensor: tensor::LM_HEAD_WEIGHT,
            why: " (needed with hidden)",
        })?;
    let wdtype = float_dtype(tensor::LM_HEAD_WEIGHT, &wt)?;
    let v = match *wt.shape() {
        [v, h] if h == hs && v >= 1 => v,
        _ => {
            return Err(DumpError::BadShape {
                tensor: tensor::LM_HEAD_WEIGHT,
                found: wt.shape().to_vec(),
                expected: format!("[V_total, {hs}] with V_total >= 1 (H from hidden)"),
            })
        }
    };
    let weight = FloatMatrix {
        dtype: wdtype,
        rows: v,
        cols: hs,
        data: wt.data(),
        ints: None,
    };
    check_finite(tensor::LM_HEAD_WEIGHT, &weight)?;
    let bias = match st.tensor(tensor::LM_HEAD_BIAS) {
        None => None,
        Some(bt) => {
            let bdtype = float_dtype(tensor::LM_HEAD_BIAS, &bt)?;
            if bt.shape() != [v] {
                return Err(DumpError::BadShape {
                    tensor: tensor::LM_HEAD_BIAS,
                    found: bt.shape().to_vec(),
                    expected: format!("[{v}] (V_total from lm_head_weight)"),
                });
            }
            let m = FloatMatrix {
                dtype: bdtype,
                rows: 1,
                cols: v,
                data: bt.data(),
                ints: None,
            };
            check_finite(tensor::LM_HEAD_BIAS, &m)?;
            Some(m.row_f64(0))
        }
    };
    let dtype = if hdtype.precision() >= wdtype.precision() {
        hdtype
    } else {
        wdtype
    };
    let hidden = FloatMatrix {
        dtype: hdtype,
        rows: rs.n,
        cols: hs,
        data: ht.data(),
        ints: None,
    };
    // The kernel's own logits beside them: a candidate.
    let candidate = match st.tensor(tensor::LOGITS) {
        None => None,
        Some(t) => {
            let dtype = float_dtype(tensor::LOGITS, &t)?;
            rs.expect(tensor::LOGITS, t.shape(), &[('V', v)])?;
            Some(FloatMatrix {
                dtype,
                rows: rs.n,
                cols: v,
                data: t.data(),
                ints: None,
            })
        }
    };
    Ok((
        DumpLogits {
            dtype: Dtype::F64,
            rows: rs.n,
            cols: v,
            source: LogitsSource::Linear(LinearLogits {
                hidden,
                weight,
                bias,
                dtype,
                logits_dtype: logits_dtype.unwrap_or_default(),
                candidate,
            }),
        },
        rs,
    ))
}

/// [`DumpError::NonFiniteInput`] at the first NaN or infinite entry of
/// `m` (row by row: O(cols) memory).
fn check_finite(name: &'static str, m: &FloatMatrix<'_>) -> Result<(), DumpError> {
    for r in 0..m.rows {
        if let Some((c, &value)) = m
            .row_f64(r)
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite())
        {
            let index = if m.rows == 1 && name == tensor::LM_HEAD_BIAS {
                vec![c]
            } else {
                vec![r, c]
            };
            return Err(DumpError::NonFiniteInput {
                tensor: name,
                index,
                value,
            });
        }
    }
    Ok(())
}

/// Rejects what a fused linear dump cannot be judged on: outputs and
/// options that need the kernel's logits to the bit (a count output,
/// [`Output::is_count`](logprobe_reference::spec::Output::is_count); a
/// kernel's own top-k ids) or that materialise them (`temperature_dtype`
/// or `softcap_dtype` `input`).
///
/// # Errors
/// [`DumpError::LinearUnsupported`] naming the first.
pub(super) fn check_linear_options(
    options: &logprobe_reference::spec::Options,
    candidates: &logprobe_reference::spec::PerOutput<FloatMatrix<'_>>,
    topk_kernel: bool,
) -> Result<(), DumpError> {
    use logprobe_reference::spec::{Output, SoftcapDtype, TemperatureDtype};
    let count = Output::ALL
        .into_iter()
        .find(|&o| o.is_count() && candidates.contains(o));
    let what = if let Some(o) = count {
        Some(o.name())
    } else if topk_kernel {
        Some("topk_ids_source=kernel")
    } else if options.temperature_dtype == TemperatureDtype::Input {
        Some("temperature_dtype=input")
    } else if options.softcap.is_some() && options.softcap_dtype == SoftcapDtype::Input {
        Some("softcap_dtype=input")
    } else {
        None
    };
    match what {
        Some(what) => Err(DumpError::LinearUnsupported { what }),
        None => Ok(()),
    }
}

/// The LM head's gradient candidates of a fused linear dump (TOLERANCE.md
/// (T30)), left in the file: `grad_hidden [N, H]`,
/// `grad_lm_head_weight [V_total, H]`, `grad_lm_head_bias [V_total]`.
#[derive(Clone, Debug, Default)]
pub struct LinearGrads<'a> {
    /// `grad_hidden`.
    pub hidden: Option<FloatMatrix<'a>>,
    /// `grad_lm_head_weight`.
    pub weight: Option<FloatMatrix<'a>>,
    /// `grad_lm_head_bias` (`[1, V_total]`).
    pub bias: Option<FloatMatrix<'a>>,
}

impl LinearGrads<'_> {
    /// Whether the dump holds any of them.
    pub fn any(&self) -> bool {
        self.hidden.is_some() || self.weight.is_some() || self.bias.is_some()
    }
}

/// Reads the LM head's gradient candidates.
///
/// # Errors
/// [`DumpError::MissingTensor`]: one without `hidden` (or
/// `grad_lm_head_bias` without `lm_head_bias`); [`DumpError::BadDtype`],
/// [`DumpError::BadShape`].
pub(super) fn read_linear_grads<'a>(
    st: &Source<'a>,
    logits: &DumpLogits<'a>,
    rs: &RowShape,
) -> Result<LinearGrads<'a>, DumpError> {
    let names = [
        tensor::GRAD_HIDDEN,
        tensor::GRAD_LM_HEAD_WEIGHT,
        tensor::GRAD_LM_HEAD_BIAS,
    ];
    let Some(lin) = logits.linear() else {
        return match names.into_iter().find(|n| st.tensor(n).is_some()) {
            Some(_) => Err(DumpError::MissingTensor {
                tensor: tensor::HIDDEN,
                why: " (grad_hidden, grad_lm_head_weight and grad_lm_head_bias are the LM head's gradients)",
            }),
            None => Ok(LinearGrads::default()),
        };
    };
    let (v, h) = (lin.weight.rows, lin.weight.cols);
    let read = |name: &'static str,
                rows: usize,
                cols: usize,
                check: &dyn Fn(&[usize]) -> Result<(), DumpError>| {
        st.tensor(name)
            .map(|t| -> Result<FloatMatrix<'a>, DumpError> {
                let dtype = float_dtype(name, &t)?;
                check(t.shape())?;
                Ok(FloatMatrix {
                    dtype,
                    rows,
                    cols,
                    data: t.data(),
                    ints: None,
                })
            })
            .transpose()
    };
    let exact = |name: &'static str, want: Vec<usize>| {
        move |found: &[usize]| {
            if found == want.as_slice() {
                Ok(())
            } else {
                Err(DumpError::BadShape {
                    tensor: name,
                    found: found.to_vec(),
                    expected: format!("{want:?} (from lm_head_weight)"),
                })
            }
        }
    };
    let grads = LinearGrads {
        hidden: read(tensor::GRAD_HIDDEN, rs.n, h, &|s| {
            rs.expect(tensor::GRAD_HIDDEN, s, &[('H', h)])
        })?,
        weight: read(
            tensor::GRAD_LM_HEAD_WEIGHT,
            v,
            h,
            &exact(tensor::GRAD_LM_HEAD_WEIGHT, vec![v, h]),
        )?,
        bias: read(
            tensor::GRAD_LM_HEAD_BIAS,
            1,
            v,
            &exact(tensor::GRAD_LM_HEAD_BIAS, vec![v]),
        )?,
    };
    if grads.bias.is_some() && lin.bias.is_none() {
        return Err(DumpError::MissingTensor {
            tensor: tensor::LM_HEAD_BIAS,
            why: " (needed by grad_lm_head_bias)",
        });
    }
    Ok(grads)
}
