//! Rewired inputs: the TP mutant's gathered targets, the reversed-order
//! rows of odd chunks, picked and broadcast cotangents.

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

use logprobe_reference::spec::{Cotangents, Logits, Options, Output, Problem, Shape};

use crate::strategies::OwnedLogits;

/// The TP bug's trigger: for each row whose target `t` lies in a shard
/// starting at `offset > 0`, `(row, t, t - offset)` (the local index read
/// as a global column). `ignore_index` rows have no target.
pub(crate) fn tp_triggers(p: &Problem<'_>, widths: &[usize]) -> Vec<(usize, usize, usize)> {
    let Some(tokens) = p.tokens else {
        return Vec::new();
    };
    (0..tokens.len())
        .filter(|&row| p.has_target(row))
        .filter_map(|row| {
            let t = tokens[row] as usize;
            let mut offset = 0;
            for &w in widths {
                if t < offset + w {
                    return (offset > 0).then_some((row, t, t - offset));
                }
                offset += w;
            }
            None
        })
        .collect()
}

/// The same logits as views of a shorter lifetime (`Logits` is invariant in
/// its lifetime), so a problem can be rebuilt with locally owned tokens.
pub(crate) fn reborrow<'b>(l: &'b Logits<'_>) -> Logits<'b> {
    match l {
        Logits::F64(a) => Logits::F64(a.view()),
        Logits::F32(a) => Logits::F32(a.view()),
        Logits::Bf16(a) => Logits::Bf16(a.view()),
        Logits::F16(a) => Logits::F16(a.view()),
    }
}

/// Whether column `j` of row `row` can be a target (allowed, finite logit).
pub(crate) fn gatherable(p: &Problem<'_>, row: usize, j: usize) -> bool {
    p.allowed(row, j) && p.logits.row_f64(row)[j].is_finite()
}

/// `tokens` with each triggered row's target moved to the shard-local
/// (wrong) column `w`, where that column can be gathered.
pub(crate) fn wrong_targets(
    p: &Problem<'_>,
    tokens: ArrayView1<'_, i64>,
    trig: &[(usize, usize, usize)],
) -> Array1<i64> {
    let mut wrong = tokens.to_owned();
    for &(row, _, w) in trig {
        if gatherable(p, row, w) {
            wrong[row] = w as i64;
        }
    }
    wrong
}

/// `p` with its tokens replaced by `tokens`.
pub(crate) fn with_tokens<'b>(p: &'b Problem<'_>, tokens: &'b Array1<i64>) -> Problem<'b> {
    Problem {
        tokens: Some(tokens.view()),
        ..p.with_logits(reborrow(&p.logits))
    }
}

/// Rows `rows` of `p` with the real vocabulary reversed (padding stays at
/// the end): tokens and ids mapped to `V - 1 - j`. Owned parts returned.
pub(crate) struct Reversed {
    logits: OwnedLogits,
    tokens: Option<Array1<i64>>,
    mask: Option<Array2<bool>>,
    ids: Option<Array2<i64>>,
}

impl Reversed {
    pub(crate) fn new(p: &Problem<'_>, shape: &Shape, rows: &[usize]) -> Reversed {
        let (v, vt) = (shape.vocab_size, shape.v_total);
        let rev = |j: usize| if j < v { v - 1 - j } else { j };
        let mut x = Array2::<f64>::zeros((rows.len(), vt));
        for (i, &r) in rows.iter().enumerate() {
            let xr = p.logits.row_f64(r);
            for j in 0..vt {
                x[[i, rev(j)]] = xr[j];
            }
        }
        let ii = p.options.ignore_index;
        let map_id = |t: i64| {
            if t == ii || t < 0 || t as usize >= v {
                t
            } else {
                (v - 1 - t as usize) as i64
            }
        };
        Reversed {
            logits: OwnedLogits::from_f64(shape.dtype, &x),
            tokens: p
                .tokens
                .map(|t| rows.iter().map(|&r| map_id(t[r])).collect()),
            mask: p
                .sampling_mask
                .map(|m| Array2::from_shape_fn((rows.len(), vt), |(i, j)| m[[rows[i], rev(j)]])),
            ids: p.topk_ids.map(|k| {
                Array2::from_shape_fn((rows.len(), shape.k), |(i, kk)| map_id(k[[rows[i], kk]]))
            }),
        }
    }

    pub(crate) fn problem<'a>(&'a self, options: Options) -> Problem<'a> {
        Problem {
            logits: self.logits.view(),
            tokens: self.tokens.as_ref().map(|t| t.view()),
            sampling_mask: self.mask.as_ref().map(|m| m.view()),
            topk_ids: self.ids.as_ref().map(|k| k.view()),
            policy: Default::default(),
            teacher_topk_log_probs: None,
            teacher_probs: None,
            options,
            loss_weights: None,
        }
    }
}

pub(crate) fn pick_rows1(a: Option<ArrayView1<'_, f64>>, rows: &[usize]) -> Option<Array1<f64>> {
    a.map(|a| rows.iter().map(|&r| a[r]).collect())
}

pub(crate) fn pick_rows2(a: Option<ArrayView2<'_, f64>>, rows: &[usize]) -> Option<Array2<f64>> {
    a.map(|a| Array2::from_shape_fn((rows.len(), a.ncols()), |(i, k)| a[[rows[i], k]]))
}

/// Cotangents with row 0's values for every row.
/// Owned cotangents `(log-probs [N], entropy [N], top-k [N, K])`.
type OwnedCotangents = (
    Option<Array1<f64>>,
    Option<Array1<f64>>,
    Option<Array2<f64>>,
);

pub(crate) fn broadcast_row0(cot: &Cotangents<'_>) -> OwnedCotangents {
    let b1 = |a: Option<ArrayView1<'_, f64>>| {
        a.map(|a| Array1::from_elem(a.len(), if a.is_empty() { 0.0 } else { a[0] }))
    };
    let b2 = cot.get(Output::TopkLogProbs).map(|a| {
        let mut o = a.to_owned();
        if a.nrows() > 0 {
            let r0 = a.row(0).to_owned();
            for mut r in o.rows_mut() {
                r.assign(&r0);
            }
        }
        o
    });
    (
        b1(cot.column(Output::LogProbs)),
        b1(cot.column(Output::Entropy)),
        b2,
    )
}
