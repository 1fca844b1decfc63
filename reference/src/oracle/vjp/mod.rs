//! The exact VJP of one row: grad logits for upstream cotangents `g`
//! (log_prob), `h` (entropy), `G_k` (top-k log-probs). docs/design.md, "The math":
//!
//! `dx_j = ( g (1[j=t] - p_j) + sum_k G_k (1[j=id_k] - p_j) - h q_j (e_j + R) ) / T`
//!
//! regrouped per entry with the exact coefficient sums `A_j = g 1[j=t] +
//! sum_k G_k 1[j=id_k]` and `C = g + sum_k G_k` (masked ids excluded: their
//! log-prob is the constant `-inf`):
//!
//! `dx_j T = A_j (1 - p_j) - (C - A_j) p_j - h q_j (e_j + R)`,
//!
//! with `1 - p_j = sum_{k != j} e^{d'_k} / S` (for the argmax term that is
//! `s / S`; otherwise `1 + (s - e^{d'_j})`, or the direct sum when
//! `e^{d'_j} > s / 2` would make the subtraction cancel) and
//! `e_j + R = R - |e_j|`. Entries with no term are exactly 0.
//!
//! The loss side (docs/design.md, "The loss side") folds into the same form: `lse`'s
//! cotangent `a` and `z_loss`'s `b` add `(a + 2 coef b lse) p_j`, so `C`
//! loses `a + 2 coef b lse` (an enclosure: `lse` is not exact); the loss's
//! row coefficient `ell` (`g w`, or `g w / W` under `mean`, exact) adds
//! `ell (p_j - (1 - eps)[j = t] - eps [j in A] / |A|)`: `C` loses `ell`,
//! the target's `A_t` gains `-(1 - eps) ell`, and every allowed entry
//! (a `-inf` logit too: `p_j = 0`) gains the constant `u = -ell eps / |A|`.

mod driver;
mod entry;

use std::collections::BTreeMap;

use rayon::prelude::*;
use rug::float::Round;
use rug::ops::AssignRound;
use rug::{Assign, Float};

use super::cross_entropy;
use super::fast::LossSide;
use super::row::{one_plus, pass, Cache, Row, Sums, Top, TopId, ACC_EXTRA, CHUNK};
use super::Exact;
use crate::interval::MpfrInterval;
use crate::spec::{Dtype, TeacherForm, TopkKl};
use entry::{entry, Scratch};

/// Precision at which sums of f64 cotangents are exact (f64 values span
/// 2^-1074 .. 2^1024; the rest is carry room).
pub(crate) const EXACT_SUM_PREC: u32 = 2300;

/// The row's cotangents, read from the caller's views.
#[derive(Debug, Default)]
pub(crate) struct RowCot {
    /// `g` (0 on `ignore_index` rows or without a log-prob cotangent).
    pub g: f64,
    /// `h`.
    pub h: f64,
    /// `G_k`, `[K]`.
    pub gk: Vec<f64>,
    /// `a`, the cotangent of `lse` (`d lse / dz_j = p_j`).
    pub lse: f64,
    /// `b`, the cotangent of `z_loss`, and the effective `z_loss_coef`
    /// (`d z_loss / dz_j = 2 coef lse p_j`).
    pub z_loss: f64,
    /// The effective `z_loss_coef` (0 without one).
    pub z_loss_coef: f64,
    /// The cross-entropy loss's term of this row, if any.
    pub loss: Option<RowLoss>,
    /// The policy terms' nonzero cotangents `(term, c)` of this row
    /// ([`crate::spec::Problem::policy_cotangents`]): each adds `c k'(d)`
    /// to the log-prob's cotangent (module `policy`).
    pub policy: Vec<(crate::spec::PolicyTerm, f64)>,
    /// The top-k KL's cotangents `(g_f, g_r)` of this row and its options,
    /// when one is nonzero: each id's log-prob gains the cotangent `w_k`
    /// of module `topk_kl` ([`super::topk_kl::kl_slopes_mpfr`]).
    pub kl: Option<(f64, f64, crate::spec::TopkKl)>,
    /// `c`, the cotangent of `soft_cross_entropy` (0 without): `C` loses
    /// `c sum_j p_j` and every entry gains `-c p_j` (the teacher's).
    pub soft: f64,
}

impl RowCot {
    /// Whether any term beyond the log-prob / entropy / top-k ones is given.
    pub(crate) fn has_loss_side(&self) -> bool {
        self.has_loss_side_besides_kl() || self.kl.is_some()
    }

    /// The loss side as the f64 tier takes it ((F10), [`LossSide`]):
    /// `Some(None)` without one, `Some(Some(_))` for `lse`, `z_loss` and the
    /// cross-entropy, `None` when the row needs the MPFR path (a policy
    /// term).
    pub(crate) fn fast_loss_side(&self) -> Option<Option<LossSide>> {
        // The policy terms ride beside it (their weight at the target).
        let others = self.lse != 0.0
            || (self.z_loss != 0.0 && self.z_loss_coef != 0.0)
            || self.loss.is_some()
            || self.soft != 0.0;
        if !others {
            return Some(None);
        }
        let divisor = match self.loss.as_ref().and_then(|l| l.den.as_ref()) {
            Some(d) => Some(f64_parts(d)?),
            None => None,
        };
        Some(Some(LossSide {
            lse: self.lse,
            z_loss: self.z_loss,
            z_loss_coef: self.z_loss_coef,
            loss: self.loss.as_ref().map(|l| (l.g, l.w)),
            divisor,
            eps: self.loss.as_ref().map_or(0.0, |l| l.eps),
            count: self.loss.as_ref().map_or(0, |l| l.count),
            soft: self.soft,
        }))
    }

    /// Whether any term beyond the log-prob / entropy / top-k / top-k KL
    /// ones is given (the f64 tier's VJP has those four).
    pub(crate) fn has_loss_side_besides_kl(&self) -> bool {
        self.lse != 0.0
            || (self.z_loss != 0.0 && self.z_loss_coef != 0.0)
            || self.loss.is_some()
            || !self.policy.is_empty()
            || self.soft != 0.0
    }
}

/// The f64 parts of an exact sum of f64s: each the nearest f64 to what is
/// left, until nothing is (at most ~40 for a sum of f64 weights); `None`
/// when they do not sum to `x` exactly within 64 parts.
fn f64_parts(x: &Float) -> Option<Vec<f64>> {
    let mut rest = x.clone();
    let mut parts = Vec::new();
    while !rest.is_zero() {
        let p = rest.to_f64();
        if p == 0.0 || !p.is_finite() || parts.len() == 64 {
            return None;
        }
        parts.push(p);
        rest -= p;
    }
    Some(parts)
}

/// The loss's cotangent of one counted row: `ell = g w` (`/ W` under
/// `mean`), exact, and the label smoothing over `count` allowed entries.
/// The row's gradient gains `ell ((1 - eps)(p_j - [j = t]) + eps (p_j -
/// [j in A] / |A|)) / T` (docs/design.md, "The loss side"); a `-inf` logit in `A`
/// (`p_j = 0`, the row's loss `+inf` when `eps > 0`) gets the finite
/// `-ell eps / (|A| T)`, autograd's value (`spec::loss`'s docs).
#[derive(Debug)]
pub(crate) struct RowLoss {
    /// The upstream cotangent `g` of the row's term.
    pub g: f64,
    /// The row's weight `w`.
    pub w: f64,
    /// The mean's divisor `W`, exact (`None` under `none` / `sum`).
    pub den: Option<std::sync::Arc<Float>>,
    /// Effective label smoothing `eps`.
    pub eps: f64,
    /// `|A|`: allowed entries of the real vocabulary.
    pub count: u64,
}

impl RowLoss {
    /// `ell` enclosed at `prec` bits (a point without a divisor).
    fn ell(&self, prec: u32) -> MpfrInterval {
        let gw = Float::with_val(EXACT_SUM_PREC, self.g) * self.w;
        match &self.den {
            None => {
                let mut out = MpfrInterval::new(prec.max(110));
                out.lo.assign(&gw);
                out.hi.assign(&gw);
                out
            }
            Some(d) => {
                let mut out = MpfrInterval::new(prec);
                out.lo.assign_round(&gw / &**d, Round::Down);
                out.hi.assign_round(&gw / &**d, Round::Up);
                out
            }
        }
    }
}

/// Row constants at one precision.
struct Consts {
    /// The loss's uniform term `u / T = -ell eps / (|A| T)` on every
    /// allowed entry (`None`: no such term).
    u: Option<MpfrInterval>,
    /// The soft cross-entropy's cotangent `c` (every entry gains `-c p_j /
    /// T`, `p` the teacher's), when nonzero.
    soft: Option<f64>,
    /// How the row holds the teacher.
    form: TeacherForm,
    /// `s = S - 1` (accumulator precision).
    s: MpfrInterval,
    /// `S T`.
    st: MpfrInterval,
    /// `C / (S T)`.
    k1: MpfrInterval,
    /// `h / (S_w T)`.
    k2: MpfrInterval,
    /// `C != 0`.
    c_nonzero: bool,
    /// `R = B / S_w`.
    r: MpfrInterval,
    /// `q`'s shift reference (its max `max w`).
    top_q: Top,
}

/// Coefficients of the special entries (target and live top-k ids):
/// `(A_j, C - A_j)`, exact.
type Specials = BTreeMap<usize, (MpfrInterval, MpfrInterval)>;

/// Grad logits of one row, `[V]` (real vocabulary), correctly rounded to
/// `target`, with the Ziv loop over `precisions`.
pub(crate) fn vjp_row(
    row: &Row<'_>,
    cot: &RowCot,
    target: Dtype,
    precisions: &[u32],
) -> Vec<Exact> {
    let mut out = vec![Exact::point(0.0); row.v.len()];
    let mut cache = Cache::default();
    vjp_core(
        row,
        cot,
        target,
        precisions,
        None,
        &mut cache,
        &mut |j, e| {
            out[j] = e;
        },
    );
    out
}

/// [`vjp_row`]'s elements `only` (indices `< V`), as `(index, element)` in
/// increasing index order. When they are few (under `V / 8`), the row's
/// per-entry exps are kept for them alone ([`Cache::sparse`]): memory
/// `O(|only|)` beside the row, not `O(V)`; the same bits either way.
pub(crate) fn vjp_entries(
    row: &Row<'_>,
    cot: &RowCot,
    target: Dtype,
    precisions: &[u32],
    mut only: Vec<usize>,
) -> Vec<(usize, Exact)> {
    only.sort_unstable();
    only.dedup();
    let mut cache = if only.len().saturating_mul(8) < row.v.len() {
        Cache::sparse(only.clone())
    } else {
        Cache::default()
    };
    let mut res: Vec<(usize, Exact)> = only.iter().map(|&j| (j, Exact::point(0.0))).collect();
    vjp_core(
        row,
        cot,
        target,
        precisions,
        Some(only),
        &mut cache,
        &mut |j, e| {
            if let Ok(k) = res.binary_search_by_key(&j, |r| r.0) {
                res[k].1 = e;
            }
        },
    );
    res
}

/// The Ziv loop of [`vjp_row`] over `only` (every entry a source reaches
/// when `None`), each decided element handed to `put` (elements never
/// handed over are exactly 0), the per-entry exps kept in `cache`.
fn vjp_core(
    row: &Row<'_>,
    cot: &RowCot,
    target: Dtype,
    precisions: &[u32],
    only: Option<Vec<usize>>,
    cache: &mut Cache,
    put: &mut dyn FnMut(usize, Exact),
) {
    let v = row.v.len();
    let loss = cot.loss.as_ref().filter(|_| row.target.is_some());
    let policy = row.target.filter(|_| !cot.policy.is_empty());
    let (a_map, c) = sources(row, cot, loss.is_some(), policy);
    let loss_side = cot.has_loss_side();
    if c.is_zero() && cot.h == 0.0 && a_map.is_empty() && !loss_side {
        return;
    }
    let uniform = loss.is_some_and(|l| l.eps != 0.0);
    // The soft cross-entropy's `c sum_j p_j`: exact for probabilities (a
    // sum of f64s), enclosed per precision for log-probabilities.
    let form = row.teacher_form;
    let soft_on = cot.soft != 0.0 && !row.teacher_probs.is_empty();
    let soft = (soft_on && form == TeacherForm::Probs).then(|| soft_exact(row, cot.soft));
    let dense = |j: usize| soft_on && !form.is_zero(row.teacher_probs[j]);
    let mut pending: Vec<usize> = match only {
        Some(only) => only,
        None => (0..v)
            .filter(|&j| {
                row.in_p(j)
                    || row.in_q(j)
                    || a_map.contains_key(&j)
                    || (uniform && row.allowed(j))
                    || dense(j)
            })
            .collect(),
    };
    for &prec in precisions {
        let sums = pass(row, prec, false, Some(&mut *cache));
        let acc = prec + ACC_EXTRA;
        let mut sp = MpfrInterval::new(acc);
        one_plus(&mut sp, &sums.s_p);
        let mut st = MpfrInterval::new(prec);
        st.lo.assign_round(&sp.lo * row.temperature, Round::Down);
        st.hi.assign_round(&sp.hi * row.temperature, Round::Up);
        // `C`: the total coefficient of `-p_j`: `g + sum_k G_k - a - 2 coef
        // b lse - c sum p - ell`; the sources' `A_j` (the loss's target
        // `-(1 - eps) ell`) and `C - A_j`.
        let mut t = Float::new(acc);
        let mut tmp = MpfrInterval::new(acc);
        let soft = soft_on.then(|| match &soft {
            Some(cs) => point_interval(cs, acc),
            None => cross_entropy::soft_vjp_mass(row, cot.soft, acc),
        });
        let mut cc = c_less_p_weights(row, cot, &c, soft.as_ref(), &sums, acc, &mut t);
        let mut loss_target: Option<(usize, MpfrInterval)> = None;
        let mut u = None;
        if let Some(l) = loss {
            let ell = l.ell(acc);
            tmp.assign_outward(&cc);
            cc.sub(&tmp, &ell);
            let (at, uu) = cross_entropy::vjp_terms(
                &ell,
                l.eps,
                l.count,
                row.temperature,
                (acc, prec),
                &mut t,
            );
            loss_target = row.target.map(|tcol| (tcol, at));
            u = uu;
        }
        // The policy terms' log-prob cotangent `sum c k'(d)`, enclosed from
        // the log-prob at this precision: a source at the target (`A_t`)
        // and in `C`, as a log-prob cotangent is.
        if let Some(tcol) = policy {
            let gp = super::policy::vjp_cotangent(row, &sums, &cot.policy, acc, &mut t);
            tmp.assign_outward(&cc);
            cc.add(&tmp, &gp);
            loss_target = Some(match loss_target.take() {
                None => (tcol, gp),
                Some((_, at)) => {
                    let mut x = MpfrInterval::new(acc);
                    x.add(&at, &gp);
                    (tcol, x)
                }
            });
        }
        // The top-k KL's cotangents `w_k` at the ids, enclosed from the
        // top-k log-probs at this precision; in `C` unless they sum to 0.
        let kl_w = match &cot.kl {
            Some(kl) => kl_weights(row, &sums, kl, (acc, prec), &mut cc),
            None => BTreeMap::new(),
        };
        let specials = specials(&a_map, loss_target.as_ref(), &kl_w, &cc, acc);
        let c_nonzero = !(cc.lo.is_zero() && cc.hi.is_zero());
        let mut k1 = MpfrInterval::new(prec);
        k1.div_pos(&cc, &st);
        let mut k2 = MpfrInterval::new(prec);
        let mut r = MpfrInterval::new(prec);
        if row.q.is_some() {
            let mut sw = MpfrInterval::new(acc);
            one_plus(&mut sw, &sums.s_q);
            let mut swt = MpfrInterval::new(prec);
            swt.lo.assign_round(&sw.lo * row.temperature, Round::Down);
            swt.hi.assign_round(&sw.hi * row.temperature, Round::Up);
            k2.div_pos(&MpfrInterval::point(53, cot.h), &swt);
            r.div_pos(&sums.b, &sw);
        }
        let top_q = row.top(row.q.map_or(0.0, |q| q.vmax), prec);
        let consts = Consts {
            u,
            soft: soft.as_ref().map(|_| cot.soft),
            form,
            s: sums.s_p,
            st,
            k1,
            c_nonzero,
            k2,
            r,
            top_q,
        };
        let results: Vec<Vec<(usize, Exact)>> = pending
            .par_chunks(CHUNK)
            .map(|idx| {
                let mut sc = Scratch::new(prec);
                idx.iter()
                    .map(|&j| {
                        (
                            j,
                            entry(row, cot, &consts, &specials, cache, &mut sc, j, target),
                        )
                    })
                    .collect()
            })
            .collect();
        pending.clear();
        for (j, e) in results.into_iter().flatten() {
            if !e.decided {
                pending.push(j);
            }
            put(j, e);
        }
        if pending.is_empty() {
            break;
        }
    }
}

/// `c sum_j p_j` of a teacher given as probabilities, exact.
fn soft_exact(row: &Row<'_>, c: f64) -> Float {
    let mut sum = Float::new(EXACT_SUM_PREC);
    row.teacher_probs.iter().for_each(|&p| sum += p);
    sum * c
}

/// `x` enclosed at `acc` bits.
fn point_interval(x: &Float, acc: u32) -> MpfrInterval {
    let mut iv = MpfrInterval::new(acc);
    iv.lo.assign_round(x, Round::Down);
    iv.hi.assign_round(x, Round::Up);
    iv
}

/// `C` before the loss's and later terms: the sources' exact sum `c` less
/// `lse`'s `a`, `z_loss`'s `2 coef b lse` and the soft cross-entropy's
/// `c sum p` (`soft`, enclosed), enclosed at `acc` bits.
fn c_less_p_weights(
    row: &Row<'_>,
    cot: &RowCot,
    c: &Float,
    soft: Option<&MpfrInterval>,
    sums: &Sums,
    acc: u32,
    t: &mut Float,
) -> MpfrInterval {
    let mut cc = MpfrInterval::new(acc);
    cc.lo.assign_round(c, Round::Down);
    cc.hi.assign_round(c, Round::Up);
    let mut tmp = MpfrInterval::new(acc);
    if cot.lse != 0.0 {
        tmp.assign_outward(&cc);
        cc.sub(&tmp, &MpfrInterval::point(acc.max(53), cot.lse));
    }
    if cot.z_loss != 0.0 && cot.z_loss_coef != 0.0 {
        let term =
            cross_entropy::z_loss_vjp_term(row, &sums.s_p, cot.z_loss_coef, cot.z_loss, acc, t);
        tmp.assign_outward(&cc);
        cc.sub(&tmp, &term);
    }
    if let Some(x) = soft {
        tmp.assign_outward(&cc);
        cc.sub(&tmp, x);
    }
    cc
}

/// The exact coefficient sums of one row's sources: `A_j` per source
/// column and their total `c` (the log-prob target's and the live top-k
/// ids' cotangents); the loss's target (`loss`), the policy terms' target
/// (`policy`) and the top-k KL's live ids enter with 0, their
/// coefficients being set per precision.
fn sources(
    row: &Row<'_>,
    cot: &RowCot,
    loss: bool,
    policy: Option<usize>,
) -> (BTreeMap<usize, Float>, Float) {
    // Exact coefficient sums of the log-prob and top-k sources.
    let mut a_map: BTreeMap<usize, Float> = BTreeMap::new();
    let mut c = Float::new(EXACT_SUM_PREC);
    if let (Some(t), true) = (row.target, cot.g != 0.0) {
        *a_map.entry(t).or_insert_with(|| Float::new(EXACT_SUM_PREC)) += cot.g;
        c += cot.g;
    }
    for (id, &gk) in row.topk.iter().zip(&cot.gk) {
        if let (TopId::Live(j), true) = (id, gk != 0.0) {
            *a_map
                .entry(*j)
                .or_insert_with(|| Float::new(EXACT_SUM_PREC)) += gk;
            c += gk;
        }
    }
    // The loss's target is a source too (its coefficient is set per precision).
    if let (Some(t), true) = (row.target, loss) {
        a_map.entry(t).or_insert_with(|| Float::new(EXACT_SUM_PREC));
    }
    // So are the policy terms (their log-prob cotangent is set per precision).
    if let Some(t) = policy {
        a_map.entry(t).or_insert_with(|| Float::new(EXACT_SUM_PREC));
    }
    // So are the top-k KL's ids (their cotangents `w_k` are set per precision).
    let kl_ids: Vec<usize> = match cot.kl {
        Some(_) => row
            .topk
            .iter()
            .filter_map(|id| match id {
                TopId::Live(j) => Some(*j),
                TopId::Masked => None,
            })
            .collect(),
        None => Vec::new(),
    };
    for &j in &kl_ids {
        a_map.entry(j).or_insert_with(|| Float::new(EXACT_SUM_PREC));
    }
    (a_map, c)
}

/// The special entries' `(A_j, C - A_j)` at `acc` bits: each source's
/// exact `A_j` plus, at the loss's (or policy terms') target, its
/// coefficient `at` and, at a top-k KL id, its `w_k`.
fn specials(
    a_map: &BTreeMap<usize, Float>,
    loss_target: Option<&(usize, MpfrInterval)>,
    kl_w: &BTreeMap<usize, MpfrInterval>,
    cc: &MpfrInterval,
    acc: u32,
) -> Specials {
    a_map
        .iter()
        .map(|(&j, a)| {
            let mut aj = MpfrInterval::new(acc);
            aj.lo.assign_round(a, Round::Down);
            aj.hi.assign_round(a, Round::Up);
            if let Some((tcol, at)) = loss_target {
                if *tcol == j {
                    let mut x = MpfrInterval::new(acc);
                    x.add(&aj, at);
                    aj = x;
                }
            }
            if let Some(wk) = kl_w.get(&j) {
                let mut x = MpfrInterval::new(acc);
                x.add(&aj, wk);
                aj = x;
            }
            let mut rest = MpfrInterval::new(acc);
            rest.sub(cc, &aj);
            (j, (aj, rest))
        })
        .collect()
}

/// The top-k KL's cotangents `w_k` at the live ids (`kl` = `(g_f, g_r,
/// options)`), enclosed from the top-k log-probs at `acc` bits
/// ([`super::topk_kl::kl_slopes_mpfr`] at `prec`), each added to `cc` (`C`)
/// unless they sum to 0.
fn kl_weights(
    row: &Row<'_>,
    sums: &Sums,
    (gf, gr, kl): &(f64, f64, TopkKl),
    (acc, prec): (u32, u32),
    cc: &mut MpfrInterval,
) -> BTreeMap<usize, MpfrInterval> {
    let mut kl_w: BTreeMap<usize, MpfrInterval> = BTreeMap::new();
    let mut tmp = MpfrInterval::new(acc);
    let vals = super::row::values(row, sums, acc);
    let (w, sums_to_zero) =
        super::topk_kl::kl_slopes_mpfr(&vals.topk, &row.teacher, kl, (*gf, *gr), prec);
    for (id, wk) in row.topk.iter().zip(w) {
        if let TopId::Live(j) = id {
            if !sums_to_zero {
                tmp.assign_outward(cc);
                cc.add(&tmp, &wk);
            }
            kl_w.insert(*j, wk);
        }
    }
    kl_w
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::oracle::Oracle;
    use crate::spec::{EntropyLogits, Logits, Problem};

    /// `vjp_entries` (a sparse cache: `sigma`'s direct sum computes its
    /// terms again) gives the bits of `vjp_row` (the dense cache) at every
    /// entry asked for, on a row whose runner-up, the target, holds most
    /// of `s` (so its `sigma` is the direct sum), plain and softcapped.
    #[test]
    fn a_sparse_cache_gives_the_dense_caches_bits() {
        let v = 4096;
        let x = Array2::from_shape_fn((1, v), |(_, j)| match j {
            7 => 6.0f32,
            9 => 5.75,
            _ => ((j * 2_654_435_761) % 1000) as f32 / 400.0 - 20.0,
        });
        let only = vec![9, 7, 0, 1, 2048, v - 1];
        for softcap in [None, Some(3.0)] {
            let mut p = Problem::new(Logits::F32(x.view()));
            p.options.softcap = softcap;
            let shape = p.validate_shapes().unwrap();
            let row =
                crate::oracle::row::prepare(&p, &shape, 0, Some(EntropyLogits::Unmasked)).unwrap();
            let cot = RowCot {
                g: -1.25,
                h: 0.5,
                gk: Vec::new(),
                lse: 0.0,
                z_loss: 0.0,
                z_loss_coef: 0.0,
                loss: None,
                policy: Vec::new(),
                kl: None,
                soft: 0.0,
            };
            let mut row = row;
            // The runner-up is the target: its `sigma` is the direct sum.
            row.target = Some(9);
            let precs = Oracle::default().precisions(Dtype::F32);
            let dense = vjp_row(&row, &cot, Dtype::F32, &precs);
            let sparse = vjp_entries(&row, &cot, Dtype::F32, &precs, only.clone());
            assert_eq!(sparse.len(), only.len());
            for (j, e) in sparse {
                let d = &dense[j];
                assert_eq!(
                    (
                        e.rounded.to_bits(),
                        e.enclosure.lo.to_bits(),
                        e.enclosure.hi.to_bits()
                    ),
                    (
                        d.rounded.to_bits(),
                        d.enclosure.lo.to_bits(),
                        d.enclosure.hi.to_bits()
                    ),
                    "entry {j}, softcap {softcap:?}"
                );
            }
        }
    }
}
