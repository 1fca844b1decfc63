//! The exact cross-entropy `loss` (docs/design.md, "The loss side"; definitions in
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
use rug::ops::{AddAssignRound, AssignRound};
use rug::Float;

use super::row::{self, Entry, ACC_EXTRA};
use super::{first_error, Exact, Interval, Oracle, Rounder};
use crate::interval::MpfrInterval;
use crate::spec::{CrossEntropy, Dtype, LossTerm, MeanAllIgnored, Problem, Reduction, SpecError};

mod soft;
mod z_loss;

/// The family's value of `term` on `row` of `problem` on the MPFR path at
/// precision `prec` (its arm of `Oracle::forward_mpfr`), from the row's
/// pass (`vals`, `sums`) and its `lse` as rounded: `lse`, `z_loss`, the
/// per-row cross-entropy term `w l` and the soft cross-entropy, each
/// rounded to `target` by `rounder`. One value (`[1]`).
pub(super) fn row_values_mpfr(
    term: LossTerm,
    (problem, row): (&Problem<'_>, &row::Row<'_>),
    (vals, sums, lse): (&row::RowValues, &row::Sums, Exact),
    (prec, target): (u32, Dtype),
    rounder: &mut Rounder,
) -> Vec<Exact> {
    match term {
        LossTerm::Lse => vec![lse],
        LossTerm::ZLoss => vec![z_loss_mpfr(problem, &vals.lse, prec, rounder, target)],
        LossTerm::SoftCrossEntropy => {
            let h = soft_term(row, prec, Some(&sums.s_p));
            vec![rounder.exact(&h, target)]
        }
        LossTerm::CrossEntropy => {
            let eps = label_smoothing(problem);
            let t = row_term(row, eps, row.weight, prec, Some(&sums.s_p));
            vec![rounder.exact(&t, target)]
        }
    }
}

/// [`row_values_mpfr`] on the f64 tier, from `fast` and its `lse`
/// (`None`: left undecided for MPFR).
pub(super) fn row_values_fast(
    term: LossTerm,
    problem: &Problem<'_>,
    fast: &super::fast::FastRow<'_>,
    lse: Option<Exact>,
    target: Dtype,
) -> Vec<Option<Exact>> {
    match term {
        LossTerm::Lse => vec![lse],
        LossTerm::ZLoss => vec![lse.and_then(|l| z_loss_fast(problem, l.enclosure, target))],
        LossTerm::CrossEntropy => vec![fast
            .loss_term(label_smoothing(problem))
            .and_then(|l| decide_term(l, target))],
        LossTerm::SoftCrossEntropy => vec![fast
            .soft_cross_entropy()
            .and_then(|h| decide_term(h, target))],
    }
}

pub(super) use soft::soft_term;
pub(crate) use soft::{infinite as soft_infinite, soft_vjp_entry, soft_vjp_mass};
pub(super) use z_loss::{z_loss_fast, z_loss_mpfr, z_loss_vjp_term};

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
    /// In this order (the kernels'): shape errors
    /// ([`Problem::validate_shapes`]), [`CrossEntropy::validate`]'s,
    /// [`SpecError::MissingTensor`] without `tokens`, then the rows' errors
    /// ([`Problem::validate`]).
    pub fn cross_entropy(
        &self,
        problem: &Problem<'_>,
        ce: &CrossEntropy<'_>,
        target: Dtype,
    ) -> Result<OracleLoss, SpecError> {
        // The kernels' order: shapes, the loss options, tokens, then rows.
        problem.validate_cross_entropy(ce)?;
        let shape = problem.validate()?;
        let eps = ce.effective_label_smoothing(shape.accumulation)?;
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
                .map(|(r, row)| row_term(row, eps, ce.weight(r), prec, None))
                .collect();
            let mut reduced = MpfrLossSum::new(prec);
            for (r, (row, t)) in rows.iter().zip(&terms).enumerate() {
                reduced.add(t, row.target.is_some(), ce.weight(r));
            }
            let divisor = reduced.divisor.interval();
            let values: Vec<Exact> = match ce.reduction {
                Reduction::None => terms.iter().map(|t| rounder.exact(t, target)).collect(),
                Reduction::Sum | Reduction::Mean => {
                    vec![reduced.exact(ce.reduction, ce.mean_all_ignored, &mut rounder, target)]
                }
            };
            let done = values.iter().all(|e| e.decided);
            out = Some(OracleLoss {
                dtype: target,
                reduction: ce.reduction,
                values,
                row_terms: terms.iter().map(MpfrInterval::interval).collect(),
                counted,
                divisor,
                precision: prec,
            });
            if done {
                break;
            }
        }
        Ok(out.expect("at least one precision"))
    }
}

impl Oracle {
    /// The MPFR enclosure at `prec` bits of row `row`'s loss term `w l`
    /// (nats; an exact 0 on an `ignore_index` row or for `w = 0`) of a
    /// `problem` that asks for a loss ([`Problem::cross_entropy`]): one
    /// step of the Ziv loop of a reduction taken row by row
    /// ([`MpfrLossSum`]), without holding the other rows.
    ///
    /// # Errors
    /// The spec's validation errors for that row ([`Problem::validate_shapes`],
    /// [`Problem::validate_row`], the `Input`-temperature errors); a row
    /// index past `N` is [`SpecError::ShapeMismatch`] on tensor `row`.
    pub fn loss_term(
        &self,
        problem: &Problem<'_>,
        row: usize,
        prec: u32,
    ) -> Result<MpfrInterval, SpecError> {
        let shape = problem.validate_shapes()?;
        super::check_row(&shape, row)?;
        problem.validate_row(&shape, row)?;
        let prepared = row::prepare(problem, &shape, row, None)?;
        Ok(row_term(
            &prepared,
            label_smoothing(problem),
            prepared.weight,
            prec.max(super::MIN_PREC),
            None,
        ))
    }
}

/// A `sum` / `mean` loss accumulated over row terms in row order at
/// precision `prec` (sums at `prec + 2 ACC_EXTRA` bits, directed rounding):
/// the MPFR side of a reduction that never holds the rows (`verify` adds
/// each row's [`Oracle::loss_term`] as it comes).
#[derive(Clone, Debug)]
pub struct MpfrLossSum {
    /// `sum_r w_r l_r` over every row (an ignored row's term is 0).
    pub sum: MpfrInterval,
    /// `sum_r w_r` over the counted rows (`|r|` without weights).
    pub divisor: MpfrInterval,
    prec: u32,
}

impl MpfrLossSum {
    /// Nothing summed yet, for terms at `prec` bits.
    pub fn new(prec: u32) -> Self {
        MpfrLossSum {
            sum: MpfrInterval::new(prec + 2 * ACC_EXTRA),
            divisor: MpfrInterval::new(prec + 2 * ACC_EXTRA),
            prec,
        }
    }

    /// Adds one row: its term `w l` (nats), whether it is counted (token
    /// not `ignore_index`) and its weight `w` (1 without weights).
    pub fn add(&mut self, term: &MpfrInterval, counted: bool, weight: f64) {
        self.sum.lo.add_assign_round(&term.lo, Round::Down);
        self.sum.hi.add_assign_round(&term.hi, Round::Up);
        if counted {
            self.divisor.lo.add_assign_round(weight, Round::Down);
            self.divisor.hi.add_assign_round(weight, Round::Up);
        }
    }

    /// The reduced value correctly rounded to `target` (decided or not,
    /// [`Exact::decided`]): the sum under `sum`, the sum over the divisor
    /// under `mean` (a zero divisor gives `mean_all_ignored`'s exact value),
    /// the sum as well under `none` (not a value of the output then).
    pub fn exact(
        &self,
        reduction: Reduction,
        mean_all_ignored: MeanAllIgnored,
        rounder: &mut Rounder,
        target: Dtype,
    ) -> Exact {
        if reduction != Reduction::Mean {
            return rounder.exact(&self.sum, target);
        }
        if self.divisor.hi.is_zero() {
            return Exact::point(mean_all_ignored.value());
        }
        let mut m = MpfrInterval::new(self.prec);
        m.div_pos(&self.sum, &self.divisor);
        rounder.exact(&m, target)
    }
}

/// A `sum` / `mean` loss accumulated over row terms on the f64 tier: the
/// terms' enclosures and the weights added in row order, each end rounded
/// in its direction ([`Interval::add`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossSum {
    /// Enclosure of `sum_r w_r l_r` (nats).
    pub sum: Interval,
    /// Enclosure of `sum_r w_r` over the counted rows.
    pub divisor: Interval,
    /// How many rows are counted.
    pub counted: usize,
}

impl Default for LossSum {
    fn default() -> Self {
        LossSum {
            sum: Interval::point(0.0),
            divisor: Interval::point(0.0),
            counted: 0,
        }
    }
}

impl LossSum {
    /// Adds one row (as [`MpfrLossSum::add`]; `term` an enclosure `>= 0`).
    pub fn add(&mut self, term: Interval, counted: bool, weight: f64) {
        self.sum = self.sum.add(term);
        if counted {
            self.divisor = self.divisor.add(Interval::point(weight));
            self.counted += 1;
        }
    }

    /// The enclosure of the reduced value (as [`MpfrLossSum::exact`]; a
    /// zero divisor under `mean` gives `mean_all_ignored`'s point), `None`
    /// under `mean` when the divisor's enclosure touches 0 without being 0.
    pub fn value(
        &self,
        reduction: Reduction,
        mean_all_ignored: MeanAllIgnored,
    ) -> Option<Interval> {
        let s = self.sum;
        if reduction != Reduction::Mean {
            return Some(s);
        }
        let d = self.divisor;
        if d.hi == 0.0 {
            return Some(Interval::point(mean_all_ignored.value()));
        }
        if !(d.lo > 0.0) {
            return None;
        }
        if s.lo == f64::INFINITY {
            return Some(s);
        }
        Some(Interval {
            lo: (s.lo / d.hi).next_down().max(0.0),
            hi: if s.hi == f64::INFINITY {
                f64::INFINITY
            } else {
                (s.hi / d.lo).next_up()
            },
        })
    }

    /// The reduced value decided in `target` on the f64 tier, `None` when
    /// its enclosure does not round to one value there (MPFR decides:
    /// [`MpfrLossSum`]). The declared NaN of an all-ignored mean is an
    /// exact NaN.
    pub fn decide(
        &self,
        reduction: Reduction,
        mean_all_ignored: MeanAllIgnored,
        target: Dtype,
    ) -> Option<Exact> {
        let v = self.value(reduction, mean_all_ignored)?;
        if v.lo.is_nan() {
            return Some(Exact::point(f64::NAN));
        }
        decide_term(v, target)
    }
}

/// The enclosure of `w * l` for one row at precision `prec` (an exact 0 on
/// an ignored row or for `w = 0`; see the module docs for `l`). `s_p`: the
/// row's `s = S - 1` at `prec` when already summed (else one pass here).
pub(super) fn row_term(
    row: &row::Row<'_>,
    eps: f64,
    w: f64,
    prec: u32,
    s_p: Option<&MpfrInterval>,
) -> MpfrInterval {
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
    let mut big_l = MpfrInterval::new(prec);
    match s_p {
        Some(s) => big_l.ln_1p(s),
        None => big_l.ln_1p(&row::pass(row, prec, false, None).s_p),
    }
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

/// The label smoothing of `problem`'s loss as the computation takes it
/// (rounded to the accumulation dtype; 0 without a loss or when invalid,
/// which validation has already refused).
pub(super) fn label_smoothing(problem: &Problem<'_>) -> f64 {
    problem
        .cross_entropy()
        .and_then(|ce| ce.effective_label_smoothing(problem.accumulation()).ok())
        .unwrap_or(0.0)
}

/// The decision (F8) of an f64 enclosure of a loss term or reduced loss
/// (`>= 0`, possibly `+inf`): an exact `[0, 0]` is `+0`, an exact `+inf`
/// is `+inf`, otherwise [`super::fast::decide`] (an enclosure touching 0
/// is left to MPFR).
pub(crate) fn decide_term(l: Interval, target: Dtype) -> Option<Exact> {
    if l.lo == l.hi && (l.lo == 0.0 || l.lo == f64::INFINITY) {
        return Some(Exact::point(l.lo));
    }
    super::fast::decide(l, target)
}

/// The cross-entropy loss's VJP pieces (module `vjp`, docs/design.md, "The
/// loss side") from the row's exact `ell`: the target's coefficient
/// `A_t = -(1 - eps) ell` at `acc` bits and, when `eps != 0`, the uniform
/// term `u / T = -ell eps / (count T)` at `prec` bits; `t` is scratch at
/// `acc` bits.
pub(super) fn vjp_terms(
    ell: &MpfrInterval,
    eps: f64,
    count: u64,
    temperature: f64,
    (acc, prec): (u32, u32),
    t: &mut Float,
) -> (MpfrInterval, Option<MpfrInterval>) {
    let mut one_minus = MpfrInterval::new(acc);
    one_minus
        .lo
        .assign_round(1.0 - Float::with_val(53, eps), Round::Down);
    one_minus
        .hi
        .assign_round(1.0 - Float::with_val(53, eps), Round::Up);
    let mut at = MpfrInterval::new(acc);
    at.mul(&one_minus, ell, t);
    at.neg();
    let mut u = None;
    if eps != 0.0 {
        let mut ue = MpfrInterval::new(acc);
        ue.mul(ell, &MpfrInterval::point(53, eps), t);
        let mut ut = MpfrInterval::new(acc);
        let count = Float::with_val(64, count);
        ut.lo.assign_round(&count * temperature, Round::Down);
        ut.hi.assign_round(&count * temperature, Round::Up);
        let mut uu = MpfrInterval::new(prec);
        uu.div_pos(&ue, &ut);
        uu.neg();
        u = Some(uu);
    }
    (at, u)
}
