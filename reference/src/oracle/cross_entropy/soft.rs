//! The soft-target cross-entropy `soft_cross_entropy` (docs/design.md,
//! "The loss side"): `H(p, q) = -sum_{j < V} p_j log q_j` against the
//! teacher's probabilities `p` (exact inputs; given as log-probabilities
//! `a_j`, `p_j = exp(a_j)` enclosed at the working precision),
//! `q = softmax(z')`. With
//! `a_j = (v_max - v_j) / ts >= 0` and `L = ln S`, `-log q_j = a_j + L`, so
//!
//! `H = (sum_j p_j) L + sum_j p_j a_j`,
//!
//! two sums of nonnegative terms (no cancellation) over the entries with
//! `p_j > 0`; teacher mass on an entry whose log-prob is `-inf` (masked,
//! or an uncapped `-inf` logit) makes `H = +inf` exactly, and `p_j = 0`
//! entries contribute nothing whatever their log-prob.

use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound};
use rug::{Assign, Float};

use crate::spec::TeacherForm;

use super::super::row::{self, Entry, ACC_EXTRA};
use crate::interval::MpfrInterval;

/// Whether the teacher puts mass on an entry whose log-prob is `-inf`
/// (then `H = +inf`).
pub(crate) fn infinite(row: &row::Row<'_>) -> bool {
    row.teacher_probs
        .iter()
        .enumerate()
        .any(|(j, &p)| !row.teacher_form.is_zero(p) && !row.in_p(j))
}

/// `[lo, hi]` enclosing the teacher's `p_j` of an entry holding `x`:
/// `x` itself (probabilities, exact at any precision `>= 53`), or
/// `exp(x)` rounded down and up (log-probabilities).
pub(crate) fn teacher_p(form: TeacherForm, x: f64, lo: &mut Float, hi: &mut Float) {
    match form {
        TeacherForm::Probs => {
            lo.assign(x);
            hi.assign(x);
        }
        TeacherForm::LogProbs => {
            lo.assign(x);
            lo.exp_round(Round::Down);
            hi.assign(x);
            hi.exp_round(Round::Up);
        }
    }
}

/// The MPFR enclosure at `prec` bits of the row's `H(p, q)` (module docs);
/// `s_p`: the row's `s = S - 1` at `prec` when already summed.
pub(crate) fn soft_term(row: &row::Row<'_>, prec: u32, s_p: Option<&MpfrInterval>) -> MpfrInterval {
    if infinite(row) {
        return MpfrInterval::point(prec, f64::INFINITY);
    }
    let mut big_l = MpfrInterval::new(prec);
    match s_p {
        Some(s) => big_l.ln_1p(s),
        None => big_l.ln_1p(&row::pass(row, prec, false, None).s_p),
    }
    let top = row.top(row.p.vmax, prec);
    let mut en = Entry::new(prec);
    let acc = prec + ACC_EXTRA;
    let (mut pa, mut mass) = (MpfrInterval::new(acc), MpfrInterval::new(acc));
    let mut t = Float::new(acc);
    let (mut pl, mut ph) = (Float::new(acc), Float::new(acc));
    let form = row.teacher_form;
    for (j, &x) in row.teacher_probs.iter().enumerate() {
        if form.is_zero(x) {
            continue;
        }
        teacher_p(form, x, &mut pl, &mut ph);
        en.shift(&top, row.v[j]);
        // `a_j >= 0`, `p_j >= 0`: the lower ends multiply down, the upper up.
        t.assign_round(&en.a.lo * &pl, Round::Down);
        pa.lo.add_assign_round(&t, Round::Down);
        t.assign_round(&en.a.hi * &ph, Round::Up);
        pa.hi.add_assign_round(&t, Round::Up);
        mass.lo.add_assign_round(&pl, Round::Down);
        mass.hi.add_assign_round(&ph, Round::Up);
    }
    let mut scratch = Float::new(prec);
    let mut ml = MpfrInterval::new(prec);
    ml.mul(&mass, &big_l, &mut scratch);
    let mut h = MpfrInterval::new(prec);
    h.add(&ml, &pa);
    h
}

/// (T28) `c sum_j p_j` enclosed at `acc` bits for the VJP, the teacher's
/// `p_j` from its log-probabilities (`exp` rounded outward).
pub(crate) fn soft_vjp_mass(row: &row::Row<'_>, c: f64, acc: u32) -> MpfrInterval {
    let mut mass = MpfrInterval::new(acc);
    let (mut pl, mut ph) = (Float::new(acc), Float::new(acc));
    for &x in &row.teacher_probs {
        if !row.teacher_form.is_zero(x) {
            teacher_p(row.teacher_form, x, &mut pl, &mut ph);
            mass.lo.add_assign_round(&pl, Round::Down);
            mass.hi.add_assign_round(&ph, Round::Up);
        }
    }
    let mut out = MpfrInterval::new(acc);
    let mut t = Float::new(acc);
    out.mul(&mass, &MpfrInterval::point(53, c), &mut t);
    out
}

/// (T28) `out = -c p_j / T` enclosed for the VJP's entry holding `x`
/// (`(c, T)`): `-c x` exact in `cp` (at least 106 bits) then one rounding
/// each way for a probability; from `exp(x)`'s outward enclosure for a
/// log-probability.
pub(crate) fn soft_vjp_entry(
    form: TeacherForm,
    x: f64,
    (c, temperature): (f64, f64),
    cp: &mut Float,
    out: &mut MpfrInterval,
) {
    match form {
        TeacherForm::Probs => {
            cp.assign(x);
            *cp *= -c;
            out.lo.assign_round(&*cp / temperature, Round::Down);
            out.hi.assign_round(&*cp / temperature, Round::Up);
        }
        TeacherForm::LogProbs => {
            let prec = out.lo.prec();
            let (mut pl, mut ph) = (Float::new(prec), Float::new(prec));
            teacher_p(form, x, &mut pl, &mut ph);
            // `-c p_j`: the ends swap when `-c < 0`.
            let (lo, hi) = if c > 0.0 { (&ph, &pl) } else { (&pl, &ph) };
            cp.assign_round(lo * -c, Round::Down);
            out.lo.assign_round(&*cp / temperature, Round::Down);
            cp.assign_round(hi * -c, Round::Up);
            out.hi.assign_round(&*cp / temperature, Round::Up);
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{arr2, Array2};

    use crate::oracle::{Oracle, Tier};
    use crate::spec::{Dtype, Logits, Output, Problem};

    fn soft(x: &Array2<f32>, p: &Array2<f64>, mask: Option<&Array2<bool>>, tier: Tier) -> Vec<f64> {
        let mut q = Problem::new(Logits::F32(x.view()));
        q.teacher_probs = Some(p.view());
        q.sampling_mask = mask.map(|m| m.view());
        let o = Oracle {
            tier,
            ..Oracle::default()
        };
        let f = o.forward(&q, Dtype::F64).unwrap();
        f.values[Output::SoftCrossEntropy]
            .iter()
            .map(|e| e.rounded)
            .collect()
    }

    #[test]
    fn both_tiers_give_the_cross_entropy_and_its_edges() {
        let x = arr2(&[[1.0f32, 2.0, 3.0, f32::NEG_INFINITY]; 3]);
        let p = arr2(&[
            [0.25, 0.25, 0.5, 0.0],
            [0.0, 0.0, 1.0, 0.0],
            [0.5, 0.0, 0.0, 0.5],
        ]);
        let fast = soft(&x, &p, None, Tier::Fast);
        assert_eq!(fast, soft(&x, &p, None, Tier::Mpfr));
        let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        let want = [
            0.25 * (lse - 1.0) + 0.25 * (lse - 2.0) + 0.5 * (lse - 3.0),
            lse - 3.0,
            f64::INFINITY, // teacher mass on the -inf logit
        ];
        for (g, w) in fast.iter().zip(want) {
            assert!(
                (g - w).abs() <= 4.0 * f64::EPSILON * w.abs() || *g == w,
                "{g} vs {w}"
            );
        }
        // Masking an entry the teacher does not use changes only the normaliser.
        let m = arr2(&[
            [true, true, true, false],
            [false, true, true, true],
            [true; 4],
        ]);
        let masked = soft(&x, &p, Some(&m), Tier::Fast);
        assert_eq!(masked, soft(&x, &p, Some(&m), Tier::Mpfr));
        let lse2 = (2f64.exp() + 3f64.exp()).ln();
        assert!((masked[1] - (lse2 - 3.0)).abs() <= 4.0 * f64::EPSILON);
    }
}
