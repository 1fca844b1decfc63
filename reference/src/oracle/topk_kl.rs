//! The exact top-k KL to a teacher (`forward_kl`, `reverse_kl`; the
//! definition, its edge values and its sign are in
//! [`crate::spec::TopkKl`]'s module docs), as enclosures from the row's
//! top-k log-prob enclosures `l_k` and the teacher's exact `a_k`.
//!
//! # Formula
//! `forward_kl = sum_k t_k (a_k - l_k)` with `t_k = e^{a_k}`;
//! `reverse_kl = sum_k p_k (l_k - a_k)` with `p_k = e^{l_k}`. Renormalised:
//! `l'_k = (l_k - m) - ln sum_j e^{l_j - m}` for any real `m` (the row's
//! normaliser and `m` cancel); `m` is the upper end of the largest `l_j`'s
//! enclosure, so every exp is of a number `<= 0` near the top (no
//! underflow of the sum however far the ids sit below the row's maximum).
//!
//! Over a partial support the terms have both signs, so the sum can cancel;
//! no rewriting removes that (it is the value's own condition: e.g.
//! `sum t phi(a - l) + (sum t - sum p)` with `phi(x) = e^{-x} - 1 + x >= 0`
//! trades it for the difference of the two masses). The enclosure's width
//! is about `2^-prec sum_k t_k |l_k|`, so a tiny KL costs Ziv's loop about
//! `log2(sum_k t_k |l_k| / |KL|)` more bits and stays correctly rounded; a
//! point enclosure (one id with `a = l = 0`, or every term exactly 0) is
//! exact at once.
//!
//! # Tiers
//! The f64 tier ([`kl_fast`]) runs the same formula in f64 interval
//! arithmetic on the f64 tier's top-k enclosures (CORE-MATH's correctly
//! rounded `exp` and `log`, one f64 step outward each); what it leaves
//! undecided (a tiny KL next to its terms, a rounding midpoint) MPFR
//! decides ([`kl_mpfr`]) at the row's working precision.

use std::borrow::Cow;
use std::cmp::Ordering;

use rug::float::Round;
use rug::ops::AssignRound;
use rug::{Assign, Float};

use super::{fast, Exact, Interval};
use crate::interval::MpfrInterval;
use crate::spec::{Dtype, Problem, TopkKl};

/// Which of the two KL terms (the spec's).
pub(crate) use crate::spec::KlDirection as Direction;

/// Whether an enclosure is the point `-inf` (a student log-prob of an id
/// whose logit is `-inf`).
fn is_neg_inf(iv: &MpfrInterval) -> bool {
    iv.hi == f64::NEG_INFINITY
}

/// `out = exp(x)` outward (MPFR's correctly rounded exp in each direction).
fn exp_interval(out: &mut MpfrInterval, x: &MpfrInterval) {
    out.lo.assign_round(x.lo.exp_ref(), Round::Down);
    out.hi.assign_round(x.hi.exp_ref(), Round::Up);
}

/// The student log-probs the KL reads: `l` itself, or renormalised
/// ([`renormalize_mpfr`]) when `kl.renormalized`.
fn kl_log_probs<'a>(l: &'a [MpfrInterval], kl: &TopkKl, prec: u32) -> Cow<'a, [MpfrInterval]> {
    if kl.renormalized {
        Cow::Owned(renormalize_mpfr(l, prec))
    } else {
        Cow::Borrowed(l)
    }
}

/// The renormalised log-probs `l'_k` (module docs) from `l [K]` at
/// precision `prec`; `-inf` stays `-inf`. Needs a finite `l_j` (validated:
/// [`crate::spec::SpecError::KlNoStudentMass`]).
fn renormalize_mpfr(l: &[MpfrInterval], prec: u32) -> Vec<MpfrInterval> {
    let m = l
        .iter()
        .filter(|x| !is_neg_inf(x))
        .map(|x| x.hi.clone())
        .max_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal))
        .expect("some finite student log-prob (validated)");
    let mp = MpfrInterval {
        lo: Float::with_val(prec, &m),
        hi: Float::with_val(prec, &m),
    };
    let mut shifted = Vec::with_capacity(l.len());
    let mut sum = MpfrInterval::new(prec);
    let mut e = MpfrInterval::new(prec);
    for x in l {
        let mut s = MpfrInterval::new(prec);
        if is_neg_inf(x) {
            s.assign_f64(f64::NEG_INFINITY);
        } else {
            s.sub(x, &mp);
            exp_interval(&mut e, &s);
            let (lo, hi) = (sum.lo.clone(), sum.hi.clone());
            sum.lo.assign_round(&lo + &e.lo, Round::Down);
            sum.hi.assign_round(&hi + &e.hi, Round::Up);
        }
        shifted.push(s);
    }
    let mut ln = MpfrInterval::new(prec);
    ln.lo.assign_round(sum.lo.ln_ref(), Round::Down);
    ln.hi.assign_round(sum.hi.ln_ref(), Round::Up);
    shifted
        .into_iter()
        .map(|s| {
            if is_neg_inf(&s) {
                return s;
            }
            let mut out = MpfrInterval::new(prec);
            out.sub(&s, &ln);
            // A log-prob is <= 0.
            if out.hi > 0u32 {
                out.hi.assign(0u32);
            }
            out
        })
        .collect()
}

/// The exact KL of one row at precision `prec` (module docs): `topk [K]`
/// the row's top-k log-prob enclosures, `teacher [K]` the exact `a_k`.
pub(crate) fn kl_mpfr(
    topk: &[MpfrInterval],
    teacher: &[f64],
    kl: &TopkKl,
    dir: Direction,
    prec: u32,
) -> MpfrInterval {
    let acc = prec + 64;
    let l = kl_log_probs(topk, kl, acc);
    let mut sum = MpfrInterval::new(acc);
    let (mut w, mut diff, mut term) = (
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
    );
    let mut scratch = Float::new(acc);
    for (lk, &a) in l.iter().zip(teacher) {
        let a_iv = MpfrInterval::point(acc, a);
        match dir {
            Direction::Forward => {
                if a == f64::NEG_INFINITY {
                    continue;
                }
                if is_neg_inf(lk) {
                    return MpfrInterval::point(prec, f64::INFINITY);
                }
                exp_interval(&mut w, &a_iv);
                diff.sub(&a_iv, lk);
            }
            Direction::Reverse => {
                if is_neg_inf(lk) {
                    continue;
                }
                if a == f64::NEG_INFINITY {
                    return MpfrInterval::point(prec, f64::INFINITY);
                }
                exp_interval(&mut w, lk);
                diff.sub(lk, &a_iv);
            }
        }
        term.mul(&w, &diff, &mut scratch);
        let (lo, hi) = (sum.lo.clone(), sum.hi.clone());
        sum.lo.assign_round(&lo + &term.lo, Round::Down);
        sum.hi.assign_round(&hi + &term.hi, Round::Up);
    }
    sum
}

/// `exp` of an f64 enclosure, outward (CORE-MATH's correctly rounded exp,
/// one f64 step out unless the result is 0 or `inf`).
fn exp_fast(x: Interval) -> Interval {
    let lo = core_math::exp(x.lo);
    let hi = core_math::exp(x.hi);
    Interval {
        lo: if lo > 0.0 {
            lo.next_down().max(0.0)
        } else {
            0.0
        },
        hi: if hi.is_finite() { hi.next_up() } else { hi },
    }
}

/// The renormalised log-probs on the f64 tier (as [`renormalize_mpfr`]).
fn renormalize_fast(l: &[Interval]) -> Vec<Interval> {
    let m = l
        .iter()
        .filter(|x| x.hi > f64::NEG_INFINITY)
        .map(|x| x.hi)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut sum = Interval::point(0.0);
    let shifted: Vec<Interval> = l
        .iter()
        .map(|&x| {
            if x.hi == f64::NEG_INFINITY {
                return x;
            }
            let s = x.sub(Interval::point(m));
            sum = sum.add(exp_fast(s));
            s
        })
        .collect();
    let ln = Interval {
        lo: if sum.lo > 0.0 {
            core_math::log(sum.lo).next_down()
        } else {
            f64::NEG_INFINITY
        },
        hi: core_math::log(sum.hi).next_up(),
    };
    shifted
        .into_iter()
        .map(|s| {
            if s.hi == f64::NEG_INFINITY {
                return s;
            }
            let out = s.sub(ln);
            Interval {
                lo: out.lo,
                hi: out.hi.min(0.0),
            }
        })
        .collect()
}

/// The KL of one row on the f64 tier: an enclosure from the f64 top-k
/// enclosures `topk [K]` and the exact `teacher [K]`; `None` where an
/// enclosure is not finite (left to MPFR). `+inf` exactly as
/// [`kl_mpfr`].
pub(crate) fn kl_fast(
    topk: &[Interval],
    teacher: &[f64],
    kl: &TopkKl,
    dir: Direction,
) -> Option<Interval> {
    let renorm;
    let l: &[Interval] = if kl.renormalized {
        if topk.iter().all(|x| x.hi == f64::NEG_INFINITY) {
            return None;
        }
        renorm = renormalize_fast(topk);
        &renorm
    } else {
        topk
    };
    let mut sum = Interval::point(0.0);
    for (&lk, &a) in l.iter().zip(teacher) {
        let a_iv = Interval::point(a);
        let neg_inf = lk.hi == f64::NEG_INFINITY;
        let term = match dir {
            Direction::Forward => {
                if a == f64::NEG_INFINITY {
                    continue;
                }
                if neg_inf {
                    return Some(Interval::point(f64::INFINITY));
                }
                exp_fast(a_iv).mul(a_iv.sub(lk))
            }
            Direction::Reverse => {
                if neg_inf {
                    continue;
                }
                if a == f64::NEG_INFINITY {
                    return Some(Interval::point(f64::INFINITY));
                }
                exp_fast(lk).mul(lk.sub(a_iv))
            }
        };
        sum = sum.add(term);
    }
    sum.is_finite().then_some(sum)
}

/// [`kl_slopes_mpfr`] on the f64 tier: the slopes `w [K]` enclosed from
/// the f64 top-k enclosures `topk [K]` ([`super::fast::FastRow::topk`])
/// and the exact `teacher [K]`, each operation rounded outward, and
/// whether their sum is exactly 0 (renormalised). `None` where an
/// enclosure is not finite, or under renormalisation with no live id:
/// the caller leaves the row to MPFR.
pub(crate) fn kl_slopes_fast(
    topk: &[Interval],
    teacher: &[f64],
    kl: &TopkKl,
    (gf, gr): (f64, f64),
) -> Option<(Vec<Interval>, bool)> {
    let dead = |x: &Interval| x.hi == f64::NEG_INFINITY;
    let mut w = vec![Interval::point(0.0); topk.len()];
    let live = topk.iter().filter(|x| !dead(x)).count();
    let (gf_iv, gr_iv) = (Interval::point(gf), Interval::point(gr));
    if kl.renormalized && live <= 1 {
        // As kl_slopes_mpfr: the dead ids' limit slopes, minus their sum
        // at the live id; no live id: left to MPFR.
        let lk = topk.iter().position(|x| !dead(x))?;
        if gf != 0.0 {
            let mut sum = Interval::point(0.0);
            for (k, &a) in teacher.iter().enumerate() {
                if k == lk || a == f64::NEG_INFINITY {
                    continue;
                }
                let t = exp_fast(Interval::point(a));
                sum = sum.add(t);
                w[k] = gf_iv.mul(t).neg();
            }
            w[lk] = gf_iv.mul(sum);
        }
        return w.iter().all(|x| x.is_finite()).then_some((w, true));
    }
    let renorm;
    let l: &[Interval] = if kl.renormalized {
        renorm = renormalize_fast(topk);
        &renorm
    } else {
        topk
    };
    // The teacher's mass `S` (renormalised forward only).
    let mut s = Interval::point(0.0);
    if gf != 0.0 && kl.renormalized {
        for &a in teacher {
            if a != f64::NEG_INFINITY {
                s = s.add(exp_fast(Interval::point(a)));
            }
        }
    }
    // `R'` (renormalised reverse only).
    let r = (gr != 0.0 && kl.renormalized).then(|| {
        let mut r = Interval::point(0.0);
        for (&lk, &a) in l.iter().zip(teacher) {
            if !dead(&lk) {
                r = r.add(exp_fast(lk).mul(lk.sub(Interval::point(a))));
            }
        }
        r
    });
    for (k, (&lk, &a)) in l.iter().zip(teacher).enumerate() {
        let a_iv = Interval::point(a);
        if gf != 0.0 && a != f64::NEG_INFINITY {
            // -g_f t_k, or g_f (S q_k - t_k).
            let t = exp_fast(a_iv);
            let x = if kl.renormalized {
                s.mul(exp_fast(lk)).sub(t)
            } else {
                t.neg()
            };
            w[k] = w[k].add(gf_iv.mul(x));
        } else if gf != 0.0 && kl.renormalized {
            // t_k = 0: g_f S q_k.
            w[k] = w[k].add(gf_iv.mul(s.mul(exp_fast(lk))));
        }
        if gr != 0.0 && !dead(&lk) && a != f64::NEG_INFINITY {
            // g_r p_k (l_k - a_k + 1), or g_r q_k (l'_k - a_k - R').
            let diff = lk.sub(a_iv);
            let y = match r {
                Some(r) => diff.sub(r),
                None => diff.add(Interval::point(1.0)),
            };
            w[k] = w[k].add(gr_iv.mul(exp_fast(lk).mul(y)));
        }
    }
    w.iter()
        .all(|x| x.is_finite())
        .then_some((w, kl.renormalized))
}

/// The top-k KL terms' cotangents on the student's log-probs at the K ids,
/// for the VJP (docs/design.md, "The loss side"; the spec's `topk_kl` module docs):
/// with `g_f`, `g_r` the upstream cotangents of `forward_kl`, `reverse_kl`,
/// `d (g_f F + g_r R) / d z_j = sum_k w_k (1[j = id_k] - p_j)`, the form of
/// a top-k log-prob cotangent, with
///
/// - `F`: `w_k = -g_f t_k` (`t_k = e^{a_k}`);
/// - `R`: `w_k = g_r p_k (l_k - a_k + 1)` (`p_k = e^{l_k}`; 0 where
///   `p_k = 0`, the limit of `p ln p`);
/// - renormalised (`q_k = e^{l'_k}`, `S = sum_k t_k`, `R'` the renormalised
///   reverse KL): `w_k = g_f (S q_k - t_k)` and `w_k = g_r q_k (l'_k - a_k -
///   R')`. Both sum to exactly 0 over the ids (the renormalisation's
///   backward `c_k - q_k sum_i c_i`), so they add nothing to the row's
///   `p_j` coefficient and the gradient is 0 off the ids.
///
/// `topk [K]`: the row's top-k log-prob enclosures at `prec` bits (all
/// ids live: validated); `teacher [K]` the exact `a_k`. Returns `w [K]` and
/// whether their sum is exactly 0 (renormalised). A reverse-KL cotangent
/// where `a_k = -inf` meets `p_k > 0` has an infinite gradient: the caller
/// refuses it first ([`crate::spec::SpecError::KlGradientInfinite`]).
pub(crate) fn kl_slopes_mpfr(
    topk: &[MpfrInterval],
    teacher: &[f64],
    kl: &TopkKl,
    (gf, gr): (f64, f64),
    prec: u32,
) -> (Vec<MpfrInterval>, bool) {
    let acc = prec + 64;
    let mut scratch = Float::new(acc);
    let mut w: Vec<MpfrInterval> = (0..topk.len())
        .map(|_| MpfrInterval::point(acc, 0.0))
        .collect();
    let live = topk.iter().filter(|x| !is_neg_inf(x)).count();
    let mut e = MpfrInterval::new(acc);
    let mut tmp = MpfrInterval::new(acc);
    let mut term = MpfrInterval::new(acc);
    let add = |out: &mut MpfrInterval, x: &MpfrInterval, tmp: &mut MpfrInterval| {
        tmp.assign_outward(out);
        out.add(tmp, x);
    };
    // At most one live id under renormalisation: there `l' = 0` and `q = 1`
    // exactly, whatever the logits, so the reverse KL is constant (slopes
    // 0). A dead id (`p = 0`) where the teacher has mass (`t_k > 0`: an
    // infinite forward KL) keeps the forward slope `-g_f t_k` of the limit
    // `z_{id_k} -> -inf` (autograd's, and the unrenormalised case's), and
    // the live id takes minus their sum (the renormalisation's backward
    // `c_k - q_k sum_i c_i`); no live id: every slope 0.
    if kl.renormalized && live <= 1 {
        let live_k = topk.iter().position(|x| !is_neg_inf(x));
        if let (Some(lk), true) = (live_k, gf != 0.0) {
            let mut dead = MpfrInterval::point(acc, 0.0);
            for (k, (x, &a)) in topk.iter().zip(teacher).enumerate() {
                if k == lk || a == f64::NEG_INFINITY {
                    continue;
                }
                debug_assert!(is_neg_inf(x));
                exp_interval(&mut e, &MpfrInterval::point(acc, a));
                add(&mut dead, &e, &mut tmp);
                let mut minus = MpfrInterval::new(acc);
                minus.assign_outward(&e);
                minus.neg();
                term.mul(&MpfrInterval::point(acc, gf), &minus, &mut scratch);
                add(&mut w[k], &term, &mut tmp);
            }
            term.mul(&MpfrInterval::point(acc, gf), &dead, &mut scratch);
            add(&mut w[lk], &term, &mut tmp);
        }
        return (w, true);
    }
    let l = kl_log_probs(topk, kl, acc);
    // The teacher's mass `S` (renormalised forward only).
    let mut s = MpfrInterval::point(acc, 0.0);
    if gf != 0.0 && kl.renormalized {
        for &a in teacher {
            if a != f64::NEG_INFINITY {
                exp_interval(&mut e, &MpfrInterval::point(acc, a));
                add(&mut s, &e, &mut tmp);
            }
        }
    }
    // `R'` (renormalised reverse only): the same sum as `kl_mpfr`'s.
    let r = (gr != 0.0 && kl.renormalized).then(|| {
        let mut r = MpfrInterval::point(acc, 0.0);
        for (lk, &a) in l.iter().zip(teacher) {
            if is_neg_inf(lk) {
                continue;
            }
            exp_interval(&mut e, lk);
            let mut diff = MpfrInterval::new(acc);
            diff.sub(lk, &MpfrInterval::point(acc, a));
            term.mul(&e, &diff, &mut scratch);
            add(&mut r, &term, &mut tmp);
        }
        r
    });
    for (k, (lk, &a)) in l.iter().zip(teacher).enumerate() {
        let a_iv = MpfrInterval::point(acc, a);
        if gf != 0.0 && a != f64::NEG_INFINITY {
            // -g_f t_k, or g_f (S q_k - t_k).
            exp_interval(&mut e, &a_iv);
            let mut x = MpfrInterval::new(acc);
            if kl.renormalized {
                let mut q = MpfrInterval::new(acc);
                exp_interval(&mut q, lk);
                let mut sq = MpfrInterval::new(acc);
                sq.mul(&s, &q, &mut scratch);
                x.sub(&sq, &e);
            } else {
                x.assign_outward(&e);
                x.neg();
            }
            term.mul(&MpfrInterval::point(acc, gf), &x, &mut scratch);
            add(&mut w[k], &term, &mut tmp);
        } else if gf != 0.0 && kl.renormalized {
            // t_k = 0: g_f S q_k.
            let mut q = MpfrInterval::new(acc);
            exp_interval(&mut q, lk);
            let mut sq = MpfrInterval::new(acc);
            sq.mul(&s, &q, &mut scratch);
            term.mul(&MpfrInterval::point(acc, gf), &sq, &mut scratch);
            add(&mut w[k], &term, &mut tmp);
        }
        if gr != 0.0 && !is_neg_inf(lk) && a != f64::NEG_INFINITY {
            // g_r p_k (l_k - a_k + 1), or g_r q_k (l'_k - a_k - R').
            exp_interval(&mut e, lk);
            let mut diff = MpfrInterval::new(acc);
            diff.sub(lk, &a_iv);
            let mut y = MpfrInterval::new(acc);
            match &r {
                Some(r) => y.sub(&diff, r),
                None => y.add(&diff, &MpfrInterval::point(acc, 1.0)),
            }
            let mut x = MpfrInterval::new(acc);
            x.mul(&e, &y, &mut scratch);
            term.mul(&MpfrInterval::point(acc, gr), &x, &mut scratch);
            add(&mut w[k], &term, &mut tmp);
        }
    }
    (w, kl.renormalized)
}

/// `forward_kl` / `reverse_kl` of a row on the f64 tier
/// ([`kl_fast`]) decided in `target`; `None` leaves it to MPFR
/// (also when the row is not [`fast::FastRow::applicable`]).
pub(super) fn decide_fast(
    problem: &Problem<'_>,
    fast: &fast::FastRow<'_>,
    dir: Direction,
    target: Dtype,
) -> Option<Exact> {
    let kl = problem.options.topk_kl?;
    if !fast.applicable() {
        return None;
    }
    let e = kl_fast(&fast.topk(), &fast.prepared().teacher, &kl, dir)?;
    if e.lo == f64::INFINITY {
        return Some(Exact::point(f64::INFINITY));
    }
    if e.lo == 0.0 && e.hi == 0.0 {
        return Some(Exact::point(0.0));
    }
    fast::decide(e, target)
}
