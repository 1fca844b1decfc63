//! One gradient element at a working precision ([`entry`]) and the
//! `sum_{k != j} e^{d'_k}` it reads ([`sigma`]), from the row's constants
//! and the per-entry exps of the pass ([`Cache`]).

use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound};
use rug::{Assign, Float};

use super::super::cross_entropy;
use super::super::round::Rounder;
use super::super::row::{softcap_factor, Cache, Entry, Row, RowSoftcap, ACC_EXTRA};
use super::{Consts, RowCot, Specials};
use crate::interval::MpfrInterval;
use crate::oracle::Exact;
use crate::spec::Dtype;

pub(super) struct Scratch {
    en: Entry,
    y: MpfrInterval,
    m: MpfrInterval,
    tq: MpfrInterval,
    tp: MpfrInterval,
    dx: MpfrInterval,
    sigma: MpfrInterval,
    t: Float,
    /// `-c p_j`, exact (two f64s' product).
    cp: Float,
    rounder: Rounder,
}

impl Scratch {
    pub(super) fn new(prec: u32) -> Self {
        Scratch {
            en: Entry::new(prec),
            y: MpfrInterval::new(prec),
            m: MpfrInterval::new(prec),
            tq: MpfrInterval::new(prec),
            tp: MpfrInterval::new(prec),
            dx: MpfrInterval::new(prec),
            sigma: MpfrInterval::new(prec + ACC_EXTRA),
            t: Float::new(prec),
            cp: Float::new(2 * 53),
            rounder: Rounder::new(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn entry(
    row: &Row<'_>,
    cot: &RowCot,
    k: &Consts,
    specials: &Specials,
    cache: &Cache,
    sc: &mut Scratch,
    j: usize,
    target: Dtype,
) -> Exact {
    let in_p = row.in_p(j);
    let in_q = row.in_q(j) && cot.h != 0.0;
    let special = specials.get(&j);
    let mut any = false;
    sc.dx.assign_f64(0.0);
    // p part.
    if let Some((a, rest)) = special {
        any = true;
        if in_p {
            sigma(row, k, cache, j, &mut sc.en, &mut sc.sigma);
            let e = cache.p_at(j);
            // A_j sigma_j - (C - A_j) e^{d'_j}
            sc.tp.mul(a, &sc.sigma, &mut sc.t);
            sc.m.mul(rest, e, &mut sc.t);
            sc.y.sub(&sc.tp, &sc.m);
            sc.dx.div_pos(&sc.y, &k.st);
        } else {
            // p_j = 0 and 1 - p_j = 1: A_j / T.
            sc.dx.lo.assign_round(&a.lo / row.temperature, Round::Down);
            sc.dx.hi.assign_round(&a.hi / row.temperature, Round::Up);
        }
    } else if in_p && k.c_nonzero {
        any = true;
        // -C p_j / T = -K1 e^{d'_j}
        sc.dx.mul(&k.k1, cache.p_at(j), &mut sc.t);
        sc.dx.neg();
    }
    // The loss's smoothing term `u / T` on every allowed entry.
    if let (Some(u), true) = (&k.u, row.allowed(j)) {
        any = true;
        sc.tp.assign_outward(&sc.dx);
        sc.dx.add(&sc.tp, u);
    }
    // The soft cross-entropy's `-c p_j / T` (the teacher's `p_j`).
    if let Some(c) = k.soft.filter(|_| !k.form.is_zero(row.teacher_probs[j])) {
        any = true;
        let x = row.teacher_probs[j];
        cross_entropy::soft_vjp_entry(k.form, x, (c, row.temperature), &mut sc.cp, &mut sc.m);
        sc.tp.assign_outward(&sc.dx);
        sc.dx.add(&sc.tp, &sc.m);
    }
    // q part: -h q_j (e_j + R) / T = -K2 e^{e_j} (R - |e_j|).
    if in_q {
        any = true;
        sc.en.shift(&k.top_q, row.v[j]);
        sc.y.sub(&k.r, &sc.en.a);
        sc.m.mul(cache.q_slot(row, j), &sc.y, &mut sc.t);
        sc.tq.mul(&k.k2, &sc.m, &mut sc.t);
        sc.tp.assign_outward(&sc.dx);
        sc.dx.sub(&sc.tp, &sc.tq);
    }
    if !any {
        return Exact::point(0.0);
    }
    if row.softcap != RowSoftcap::None {
        // The softcap's chain rule: dx_j = dx'_j dx'_j/dx_j.
        softcap_factor(&mut sc.tq, &mut sc.y, &row.softcap, j, row.v[j]);
        sc.tp.assign_outward(&sc.dx);
        sc.dx.mul(&sc.tp, &sc.tq, &mut sc.t);
    }
    sc.rounder.exact(&sc.dx, target)
}

/// `sum_{k != j} e^{d'_k}` for a member `j` of `p`'s family.
///
/// `en`: scratch at the cache's precision, for a sparse cache's direct sum.
fn sigma(
    row: &Row<'_>,
    k: &Consts,
    cache: &Cache,
    j: usize,
    en: &mut Entry,
    out: &mut MpfrInterval,
) {
    if j == row.p.argmax {
        out.assign_outward(&k.s);
        return;
    }
    let e = cache.p_at(j);
    // No cancellation when e <= s / 2: then s - e >= s / 2.
    let mut half = k.s.lo.clone();
    half >>= 1u32;
    if e.hi <= half {
        out.lo.assign_round(&k.s.lo - &e.hi, Round::Down);
        out.hi.assign_round(&k.s.hi - &e.lo, Round::Up);
        out.lo.add_assign_round(1u32, Round::Down);
        out.hi.add_assign_round(1u32, Round::Up);
        return;
    }
    // Direct sum over the cached terms (all members, skipped ones too); a
    // sparse cache's computed again as the pass computed them (the same
    // bits: the same shift reference, precision and operations).
    out.lo.assign(0u32);
    out.hi.assign(0u32);
    let top = (!cache.is_dense()).then(|| row.top(row.p.vmax, en.ex.lo.prec()));
    for i in 0..row.v.len() {
        if i == j || !row.in_p(i) {
            continue;
        }
        let ex = match &top {
            None => &cache.p[i],
            Some(top) => {
                en.shift(top, row.v[i]);
                en.exp();
                &en.ex
            }
        };
        out.lo.add_assign_round(&ex.lo, Round::Down);
        out.hi.add_assign_round(&ex.hi, Round::Up);
    }
}
