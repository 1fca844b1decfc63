//! Bad input: each kind of malformed problem the spec defines, planted
//! into valid data ([`BadInput::apply`]), and its strategy.

use ndarray::{Array1, Array2};
use proptest::prelude::*;
use proptest::sample::select;

use super::*;

/// One kind of bad input, planted into a valid problem by [`BadInput::apply`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BadInput {
    /// A NaN logit in the real vocabulary.
    NanLogit,
    /// A `+inf` logit in the real vocabulary.
    PosInfLogit,
    /// A token `>= V`.
    TokenOutOfRange,
    /// A negative token that is not `ignore_index`.
    NegativeToken,
    /// A token the sampling mask disallows.
    TokenMasked,
    /// A token whose logit is `-inf`.
    TokenNegInf,
    /// A row whose logits are all `-inf`.
    AllNegInf,
    /// A row the sampling mask disallows entirely.
    AllMasked,
    /// A top-k id `>= V`.
    TopkIdOutOfRange,
    /// A temperature that is not finite and positive after rounding to f32
    /// (0, -1, NaN, inf, 1e-50).
    Temperature(f64),
    /// `tokens` of length `N + 1`.
    TokensShape,
    /// `sampling_mask` of shape `[N, V_total + 1]`.
    MaskShape,
    /// `topk_ids` with `N + 1` rows.
    TopkShape,
    /// `vocab_size = V_total + 1`.
    VocabSizeTooLarge,
    /// Backward without any cotangent.
    NoCotangent,
    /// A NaN or infinite cotangent.
    NonFiniteCotangent,
    /// A log-prob cotangent of length `N + 1`.
    CotangentShape,
    /// An entropy cotangent while the entropy is not computed.
    EntropyCotangentWithoutEntropy,
}

impl BadInput {
    /// Plants the bad input into `data` / `cot` at row `row` (< N) and
    /// column choice `col` (any value; reduced modulo `V`). Tensors the
    /// corruption needs (tokens, a mask, ids, a log-prob cotangent) are
    /// added when missing.
    pub fn apply(self, data: &mut ProblemData, cot: &mut CotangentData, row: usize, col: usize) {
        let (n, v, vt) = (data.n(), data.vocab_size(), data.v_total());
        let row = row % n.max(1);
        let col = col % v.max(1);
        let set = |data: &mut ProblemData, r: usize, c: usize, x: f64| {
            let mut a = data.logits.to_f64();
            a[[r, c]] = x;
            data.logits = OwnedLogits::from_f64(data.logits.dtype(), &a);
        };
        let tokens = |data: &mut ProblemData| {
            if data.tokens.is_none() {
                data.tokens = Some(Array1::from_elem(n, data.options.ignore_index));
            }
        };
        let target = |data: &ProblemData| -> usize {
            let t = data.tokens.as_ref().map_or(-1, |t| t[row]);
            if t >= 0 && (t as usize) < v {
                t as usize
            } else {
                col
            }
        };
        match self {
            BadInput::NanLogit if n > 0 => set(data, row, col, f64::NAN),
            BadInput::PosInfLogit if n > 0 => set(data, row, col, f64::INFINITY),
            BadInput::TokenOutOfRange if n > 0 => {
                tokens(data);
                data.tokens.as_mut().unwrap()[row] = (v + col) as i64;
            }
            BadInput::NegativeToken if n > 0 => {
                tokens(data);
                let t = if data.options.ignore_index == -7 {
                    -8
                } else {
                    -7
                };
                data.tokens.as_mut().unwrap()[row] = t;
            }
            BadInput::TokenMasked if n > 0 => {
                tokens(data);
                let t = target(data);
                data.tokens.as_mut().unwrap()[row] = t as i64;
                let m = data
                    .sampling_mask
                    .get_or_insert_with(|| Array2::from_elem((n, vt), true));
                m[[row, t]] = false;
            }
            BadInput::TokenNegInf if n > 0 => {
                tokens(data);
                let t = target(data);
                data.tokens.as_mut().unwrap()[row] = t as i64;
                set(data, row, t, f64::NEG_INFINITY);
            }
            BadInput::AllNegInf if n > 0 => {
                let mut a = data.logits.to_f64();
                a.row_mut(row)
                    .slice_mut(ndarray::s![..v])
                    .fill(f64::NEG_INFINITY);
                data.logits = OwnedLogits::from_f64(data.logits.dtype(), &a);
            }
            BadInput::AllMasked if n > 0 => {
                let m = data
                    .sampling_mask
                    .get_or_insert_with(|| Array2::from_elem((n, vt), true));
                m.row_mut(row).fill(false);
            }
            BadInput::TopkIdOutOfRange if n > 0 => {
                let ids = data.topk_ids.get_or_insert_with(|| Array2::zeros((n, 1)));
                let k = col % ids.ncols().max(1);
                ids[[row, k]] = (v + col) as i64;
            }
            BadInput::Temperature(t) => data.options.temperature = t,
            BadInput::TokensShape => {
                tokens(data);
                let mut t = data.tokens.take().unwrap().to_vec();
                t.push(0);
                data.tokens = Some(Array1::from(t));
            }
            BadInput::MaskShape => data.sampling_mask = Some(Array2::from_elem((n, vt + 1), true)),
            BadInput::TopkShape => data.topk_ids = Some(Array2::zeros((n + 1, 1))),
            BadInput::VocabSizeTooLarge => data.options.vocab_size = Some(vt + 1),
            BadInput::NoCotangent => *cot = CotangentData::default(),
            BadInput::NonFiniteCotangent if n > 0 => {
                tokens(data);
                let g = cot.grad_log_probs.get_or_insert_with(|| Array1::zeros(n));
                g[row] = if col.is_multiple_of(2) {
                    f64::NAN
                } else {
                    f64::INFINITY
                };
            }
            BadInput::CotangentShape => {
                tokens(data);
                cot.grad_log_probs = Some(Array1::zeros(n + 1));
            }
            BadInput::EntropyCotangentWithoutEntropy => {
                data.options.entropy = None;
                cot.grad_entropy = Some(Array1::zeros(n));
            }
            // Row-level corruptions of an empty problem: nothing to plant.
            _ => {}
        }
    }

    /// Whether only the backward sees this bad input (it corrupts cotangents).
    pub fn backward_only(self) -> bool {
        matches!(
            self,
            BadInput::NoCotangent
                | BadInput::NonFiniteCotangent
                | BadInput::CotangentShape
                | BadInput::EntropyCotangentWithoutEntropy
        )
    }
}

/// Every kind of bad input.
pub fn bad_input() -> impl Strategy<Value = BadInput> {
    prop_oneof![
        Just(BadInput::NanLogit),
        Just(BadInput::PosInfLogit),
        Just(BadInput::TokenOutOfRange),
        Just(BadInput::NegativeToken),
        Just(BadInput::TokenMasked),
        Just(BadInput::TokenNegInf),
        Just(BadInput::AllNegInf),
        Just(BadInput::AllMasked),
        Just(BadInput::TopkIdOutOfRange),
        select(vec![0.0, -1.0, f64::NAN, f64::INFINITY, 1e-50]).prop_map(BadInput::Temperature),
        Just(BadInput::TokensShape),
        Just(BadInput::MaskShape),
        Just(BadInput::TopkShape),
        Just(BadInput::VocabSizeTooLarge),
        Just(BadInput::NoCotangent),
        Just(BadInput::NonFiniteCotangent),
        Just(BadInput::CotangentShape),
        Just(BadInput::EntropyCotangentWithoutEntropy),
    ]
}
