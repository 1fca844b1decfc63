//! One compared row: both sides' exact values from the oracle and the
//! decomposition of the log-prob (and entropy) mismatch (module docs of
//! [`super`]).

use logprobe_reference::oracle::{Exact, Interval, Oracle};
use logprobe_reference::spec::{Dtype, EntropyLogits, Output, SpecError};

use super::{CompareError, CompareRow, Enclosure, EntropyRow, LogProbs, Side};
use crate::dump::{at_row, DumpError};

/// The oracle's exact log-prob of row `r` of `d` (enclosure), and its
/// exact entropy over `entropy`'s logits when `entropy` is `Some`, in the
/// candidate's dtype `dtype` (the enclosures do not depend on it; the dtype
/// only decides when the oracle stops refining).
fn exact_row(
    d: &crate::dump::Dump<'_>,
    r: usize,
    dtype: Dtype,
    entropy: Option<EntropyLogits>,
    oracle: &Oracle,
) -> Result<(Exact, Option<Exact>, crate::dump::RowInputs), DumpError> {
    let mut inputs = d.row(r)?;
    inputs.options.entropy = entropy;
    let f = oracle
        .forward_row_of(&inputs.problem(), 0, dtype)
        .map_err(|e: SpecError| DumpError::Spec(at_row(e, r)))?;
    let first = |o: Output| f.values.get(o).and_then(|v| v.first().copied());
    let e = first(Output::LogProbs).expect("a compared row has a target");
    Ok((e, first(Output::Entropy), inputs))
}

/// The decomposition of one quantity of one row (module docs): candidates
/// `ca`, `cb`, exact enclosures `ia`, `ib`; `same_logits` makes the logits
/// effect the exact 0 (one real, so no width).
pub(super) fn decompose(
    ca: f64,
    cb: Option<f64>,
    ia: Interval,
    ib: Option<Interval>,
    same_logits: bool,
) -> [Option<Enclosure>; 5] {
    let (enc, point) = (Enclosure::of, Interval::point);
    [
        Some(enc(point(ca).sub(ia))),
        cb.zip(ib).map(|(cb, ib)| enc(point(cb).sub(ib))),
        ib.map(|ib| {
            enc(if same_logits {
                Interval::point(0.0)
            } else {
                ia.sub(ib)
            })
        }),
        cb.map(|cb| enc(point(ca).sub(point(cb)))),
        match (cb, ib) {
            (Some(cb), None) => Some(enc(point(cb).sub(ia))),
            _ => None,
        },
    ]
}

#[allow(clippy::too_many_arguments)]
pub(super) fn compare_row(
    da: &crate::dump::Dump<'_>,
    db: Option<&crate::dump::Dump<'_>>,
    lp_a: &LogProbs,
    lp_b: Option<&LogProbs>,
    r: usize,
    shape: crate::shapes::RowShape,
    oracle: &Oracle,
    want_kl: bool,
) -> Result<CompareRow, CompareError> {
    let side_err = |side| {
        move |e: DumpError| CompareError::Dump {
            side,
            source: crate::shapes::at_position(e, shape.position(r)),
        }
    };
    let la = lp_a.values[r];
    // The entropy is decomposed when A has an entropy candidate.
    let ent_a = da.candidates.get(Output::Entropy);
    let want_entropy = ent_a.map(|_| da.options.entropy.unwrap_or(EntropyLogits::Unmasked));
    let (ea, eh_a, in_a) =
        exact_row(da, r, lp_a.dtype, want_entropy, oracle).map_err(side_err(Side::A))?;
    let ia = ea.enclosure;
    let lb = lp_b.map(|c| c.values[r]);
    let b_exact = match db {
        Some(db) => {
            let dtype = lp_b.map_or(lp_a.dtype, |c| c.dtype);
            let ent = want_entropy.map(|w| db.options.entropy.unwrap_or(w));
            Some(exact_row(db, r, dtype, ent, oracle).map_err(side_err(Side::B))?)
        }
        None => None,
    };
    let logits_bitwise_equal = b_exact.as_ref().map(|(_, _, in_b)| {
        let (pa, pb) = (in_a.problem(), in_b.problem());
        pa.logits.dtype() == pb.logits.dtype()
            && pa.options.temperature.to_bits() == pb.options.temperature.to_bits()
            && pa.options.temperature_dtype == pb.options.temperature_dtype
            && pa.options.vocab_size == pb.options.vocab_size
            && in_a.sampling_mask == in_b.sampling_mask
            && bits_equal(&pa.logits.row_f64(0), &pb.logits.row_f64(0))
    });
    // The same logits (and options): the same exact value, one enclosure,
    // so the logits effect is exactly 0 (two enclosures of one real would
    // leave a few ulps of width in their difference).
    let ib = match logits_bitwise_equal {
        Some(true) => Some(ia),
        _ => b_exact.as_ref().map(|(e, _, _)| e.enclosure),
    };
    let kl = match (&b_exact, want_kl) {
        (Some((_, _, in_b)), true) => Some(
            oracle
                .kl_row(&in_a.problem(), 0, &in_b.problem(), 0, Dtype::F32)
                .map_err(|e| side_err(Side::B)(DumpError::Spec(at_row(e, r))))?,
        ),
        _ => None,
    };
    let log_probs_bitwise_equal =
        lp_b.map(|c| c.dtype == lp_a.dtype && c.values[r].to_bits() == la.to_bits());
    let enc = Enclosure::of;
    let same = logits_bitwise_equal == Some(true);
    let [kernel_error_a, kernel_error_b, logits_effect, observed, b_minus_exact_a] =
        decompose(la, lb, ia, ib, same);
    let entropy = match (ent_a, eh_a) {
        (Some(m), Some(eh_a)) => {
            let ha = m.row_f64(r)[0];
            let hb = db
                .and_then(|d| d.candidates.get(Output::Entropy))
                .map(|m| m.row_f64(r)[0]);
            let ih_a = eh_a.enclosure;
            let ih_b = match (same, &b_exact) {
                (true, _) => Some(ih_a),
                (false, Some((_, eh, _))) => eh.map(|e| e.enclosure),
                _ => None,
            };
            // A logits-free B holds no entropy: no b_minus_exact_a here.
            let [kernel_error_a, kernel_error_b, logits_effect, observed, _] =
                decompose(ha, hb, ih_a, ih_b, same);
            Some(EntropyRow {
                entropy_a: ha,
                entropy_b: hb,
                exact_a: enc(ih_a),
                exact_b: ih_b.map(enc),
                kernel_error_a: kernel_error_a.expect("always"),
                kernel_error_b,
                logits_effect,
                observed,
            })
        }
        _ => None,
    };
    Ok(CompareRow {
        row: r,
        position: shape.position(r),
        token: da.tokens.as_ref().expect("checked")[r],
        log_prob_a: la,
        log_prob_b: lb,
        exact_a: enc(ia),
        exact_b: ib.map(enc),
        kernel_error_a: kernel_error_a.expect("always"),
        kernel_error_b,
        logits_effect,
        observed,
        b_minus_exact_a,
        kl: kl.map(|k| enc(k.enclosure)),
        log_probs_bitwise_equal,
        logits_bitwise_equal,
        entropy,
    })
}

fn bits_equal(x: &[f64], y: &[f64]) -> bool {
    x.len() == y.len() && x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits())
}
