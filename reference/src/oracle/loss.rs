//! The exact cross-entropy `loss` (DESIGN: "Loss side"; definitions in
//! [`crate::spec::CrossEntropy`]): per-row enclosures on the MPFR path, the
//! reduction over rows inside the exact value, correctly rounded by a Ziv
//! loop over the whole problem (every row redone at twice the precision
//! until the reduced value, or every `none` value, is decided).
//!
//! Per counted row, with `a_j = (v_max - v_j) / ts >= 0` (so
//! `-log p_j = a_j + ln S`) and `L = ln S = ln_1p(s)`:
//! `l = (1 - eps) (a_t + L) + eps (L + sum_{j in A} a_j / |A|)`, every
//! operation an outward MPFR interval operation; `eps = 0` leaves out the
//! smoothing term (a `-inf` logit in `A` then does not matter), `eps > 0`
//! with a `-inf` logit in `A` gives the exact `+inf`. The sum over rows and
//! the sum of weights run at `prec + 2 * ACC_EXTRA` bits with directed
//! rounding.

use rayon::prelude::*;
use rug::float::Round;
use rug::ops::AddAssignRound;
use rug::Float;

use super::mpfr_interval::MpfrInterval;
use super::row::{self, Entry, ACC_EXTRA};
use super::{first_error, Exact, Interval, Oracle, Rounder};
use crate::spec::{CrossEntropy, Dtype, Problem, Reduction, SpecError};

/// The exact cross-entropy `loss` of a problem, in a target dtype.
#[derive(Clone, Debug)]
pub struct OracleLoss {
    /// Target dtype of the rounded values.
    pub dtype: Dtype,
    /// The reduction the values follow.
    pub reduction: Reduction,
    /// `loss`: `[N]` under `none` (ignored rows an exact 0), `[1]` under
    /// `sum` / `mean` (nats).
    pub values: Vec<Exact>,
    /// Per row `[N]`: the enclosure of `w_r * l_r` (exactly 0 on ignored
    /// rows), the unreduced terms the tolerance model sizes a reduction by.
    pub row_terms: Vec<Interval>,
    /// How many rows are counted (token not `ignore_index`).
    pub counted: usize,
    /// The enclosure of the divisor of `mean`: `sum_r w_r` (or `|r|`).
    pub divisor: Interval,
    /// Working precision (bits) of the last Ziv step.
    pub precision: u32,
}

impl Oracle {
    /// The exact cross-entropy `loss` of `problem` under `ce`, correctly
    /// rounded to `target` (nats): `[N]` under `none`, one value under
    /// `sum` / `mean` (see [`crate::spec::CrossEntropy`] for the formula;
    /// a `mean` over zero rows, or of zero total weight, is
    /// `ce.mean_all_ignored`'s exact value). Always the MPFR path. Rows run
    /// in parallel.
    ///
    /// # Errors
    /// The spec's validation errors ([`Problem::validate`]),
    /// [`CrossEntropy::validate`]'s, and [`SpecError::MissingTensor`]
    /// without `tokens`.
    pub fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        target: Dtype,
    ) -> Result<OracleLoss, SpecError> {
        let shape = problem.validate()?;
        ce.validate(shape.n)?;
        if problem.tokens.is_none() {
            return Err(SpecError::MissingTensor {
                output: "loss",
                tensor: "tokens",
            });
        }
        let eps = ce.effective_label_smoothing(shape.dtype.accumulation())?;
        let rows = first_error(
            (0..shape.n)
                .into_par_iter()
                .map(|r| row::prepare(problem, &shape, r, None))
                .collect(),
        )?;
        let counted = rows.iter().filter(|r| r.target.is_some()).count();
        let mut rounder = Rounder::new();
        let mut out = None;
        for prec in self.precisions(target) {
            let terms: Vec<MpfrInterval> = rows
                .par_iter()
                .enumerate()
                .map(|(r, row)| row_term(row, eps, ce.weight(r), prec))
                .collect();
            let acc = prec + 2 * ACC_EXTRA;
            let divisor = {
                let mut d = MpfrInterval::new(acc);
                for (r, row) in rows.iter().enumerate() {
                    if row.target.is_some() {
                        d.lo.add_assign_round(ce.weight(r), Round::Down);
                        d.hi.add_assign_round(ce.weight(r), Round::Up);
                    }
                }
                d
            };
            let values: Vec<Exact> = match ce.reduction {
                Reduction::None => terms.iter().map(|t| rounder.exact(t, target)).collect(),
                Reduction::Sum => vec![rounder.exact(&sum(&terms, acc), target)],
                Reduction::Mean => {
                    if divisor.hi.is_zero() {
                        vec![Exact::point(ce.mean_all_ignored.value())]
                    } else {
                        let mut m = MpfrInterval::new(prec);
                        m.div_pos(&sum(&terms, acc), &divisor);
                        vec![rounder.exact(&m, target)]
                    }
                }
            };
            let done = values.iter().all(|e| e.decided);
            out = Some(OracleLoss {
                dtype: target,
                reduction: ce.reduction,
                values,
                row_terms: terms.iter().map(MpfrInterval::interval).collect(),
                counted,
                divisor: divisor.interval(),
                precision: prec,
            });
            if done {
                break;
            }
        }
        Ok(out.expect("at least one precision"))
    }
}

/// `sum_r terms_r` at `acc` bits, rounded outward.
fn sum(terms: &[MpfrInterval], acc: u32) -> MpfrInterval {
    let mut s = MpfrInterval::new(acc);
    for t in terms {
        s.lo.add_assign_round(&t.lo, Round::Down);
        s.hi.add_assign_round(&t.hi, Round::Up);
    }
    s
}

/// The enclosure of `w * l` for one row at precision `prec` (an exact 0 on
/// an ignored row or for `w = 0`; see the module docs for `l`).
fn row_term(row: &row::Row<'_>, eps: f64, w: f64, prec: u32) -> MpfrInterval {
    let Some(t) = row.target else {
        return MpfrInterval::point(prec, 0.0);
    };
    if w == 0.0 {
        return MpfrInterval::point(prec, 0.0);
    }
    let top = row.top(row.p.vmax, prec);
    // A -inf logit among the smoothed entries: -log p_j = +inf (under an
    // exact softcap it is the finite x' = -c).
    if eps > 0.0 && (0..row.v.len()).any(|j| row.allowed(j) && !row.finite(j)) {
        return MpfrInterval::point(prec, f64::INFINITY);
    }
    let sums = row::pass(row, prec, false, None);
    let mut big_l = MpfrInterval::new(prec);
    big_l.ln_1p(&sums.s_p);
    let mut en = Entry::new(prec);
    en.shift(&top, row.v[t]);
    let mut nll = MpfrInterval::new(prec);
    nll.add(&en.a, &big_l);
    let mut scratch = Float::new(prec);
    let mut l = MpfrInterval::new(prec);
    if eps == 0.0 {
        l = nll;
    } else {
        let acc = prec + ACC_EXTRA;
        let mut sa = MpfrInterval::new(acc);
        let mut count = 0u64;
        for j in 0..row.v.len() {
            if row.allowed(j) {
                en.shift(&top, row.v[j]);
                sa.lo.add_assign_round(&en.a.lo, Round::Down);
                sa.hi.add_assign_round(&en.a.hi, Round::Up);
                count += 1;
            }
        }
        let mut mean_a = MpfrInterval::new(prec);
        mean_a.div_pos(&sa, &MpfrInterval::point(prec, count as f64));
        let mut smooth = MpfrInterval::new(prec);
        smooth.add(&big_l, &mean_a);
        let mut one_minus = MpfrInterval::new(prec);
        one_minus.lo.assign_round_sub(1.0, eps, Round::Down);
        one_minus.hi.assign_round_sub(1.0, eps, Round::Up);
        let mut a = MpfrInterval::new(prec);
        a.mul(&one_minus, &nll, &mut scratch);
        let mut b = MpfrInterval::new(prec);
        b.mul(&MpfrInterval::point(prec, eps), &smooth, &mut scratch);
        l.add(&a, &b);
    }
    if w == 1.0 {
        return l;
    }
    let mut out = MpfrInterval::new(prec);
    out.mul(&MpfrInterval::point(prec, w), &l, &mut scratch);
    out
}

/// Directed subtraction of two f64s into an MPFR float.
trait AssignRoundSub {
    fn assign_round_sub(&mut self, a: f64, b: f64, round: Round);
}

impl AssignRoundSub for Float {
    fn assign_round_sub(&mut self, a: f64, b: f64, round: Round) {
        use rug::ops::AssignRound;
        let a = Float::with_val(53, a);
        self.assign_round(&a - b, round);
    }
}
