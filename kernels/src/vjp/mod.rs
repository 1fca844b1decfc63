//! Backward (VJP) of log-probs, entropy and top-k log-probs for the CPU
//! kernels: per row a stats pass ([`crate::stats::row_stats`], the
//! forward's reduction), then one write pass, vectorised block by block
//! (`crate::grad_block`), while the row is still in cache (fused staging;
//! in place, every row's stats come first so that bad input leaves the
//! logits unchanged). The gradient is written as f64 holding values of the
//! requested dtype ([`backward`]) or in the element type itself
//! ([`backward_into`]: f64, f32, bf16 or f16), each value rounded once.
//!
//! # Formula (docs/design.md, "The math"; the oracle's docs)
//!
//! For upstream `g` (log-prob), `h` (entropy), `G_k` (top-k), with the
//! sources `(t, g)` and `(id_k, G_k)` (an `ignore_index` row has `g = 0`; a
//! masked or `-inf` id is a constant and its `G_k` is dropped):
//! `dx_j = ( c_j (1 - p_j) - o_j p_j - h q_j (e_j + R) ) / T`, where `c_j` is
//! the sum of the source weights at column `j` and `o_j` that of the others
//! (for a column that is no source: `-(sum of all weights) p_j`).
//! `p_j = exp((z_j - m) / T - ln S)` (0 where masked), `q_j = exp(e_j - ln S_w)`,
//! `e_j = (w_j - m_w) / T`, `R = B_w / S_w`. Cancellation-free:
//! `1 - p_j = s / (1 + s)` when `z_j` is the max (`s` excludes one argmax
//! term), else `p_j <= 1/2` and `1 - p_j` is computed directly; the entropy
//! term is 0 where `q_j = 0` (no `0 * inf`). Every element is computed in
//! the accumulation dtype and rounded once to the output dtype; zeros are
//! `+0`. Padded columns get 0. Cotangents are rounded to the accumulation
//! dtype first. With `TemperatureDtype::Input` the gradient is taken with
//! respect to `x` with `dz/dx = 1/T` (the shift uses `T = 1`, the final
//! division `T`), as the oracle takes it.

use ndarray::{Array2, ArrayView1, ArrayView2, ArrayViewMut1, ArrayViewMut2};
use rayon::prelude::*;

use logprobe_reference::spec::{
    Cotangents, Dtype, Logits, LogitsMut, Options, Output, Problem, ProblemMut, Reduction, Shape,
    SpecError,
};

use crate::cpu::Staging;
use crate::grad_block::{grad_block, BlockConsts, BlockOut, EntropyTerm};
use crate::gradient::GradElement;
use crate::row::{shift, Acc, Input, Softcap, Source, TypedRow, BLOCK};
use crate::stats::{
    ids_suspect, mask_row, pairwise_sum, row_error, row_stats, shard_ranges, typed_row, CallParams,
    LossGrad, RowStats,
};

mod cot;
mod drive;
mod io;

pub use cot::{RowCot, SoftSide};

/// One row's inputs beside its logits that the write pass reads per
/// entry: the sampling mask `[V_total]` and the teacher's probabilities
/// `[V_total]` of `soft_cross_entropy` (each `None` when absent).
#[derive(Clone, Copy, Debug, Default)]
pub struct RowInputs<'r> {
    /// The row's sampling mask.
    pub mask: Option<ArrayView1<'r, bool>>,
    /// The row's `teacher_probs`.
    pub teacher: Option<ArrayView1<'r, f64>>,
}

impl<'r> RowInputs<'r> {
    /// Row `row` of `[N, V_total]` masks and teacher probabilities.
    pub fn of(
        mask: Option<ArrayView2<'r, bool>>,
        teacher: Option<ArrayView2<'r, f64>>,
        row: usize,
    ) -> Self {
        RowInputs {
            mask: mask_row(mask, row),
            teacher: teacher.map(|t| t.index_axis_move(ndarray::Axis(0), row)),
        }
    }
}
pub(crate) use drive::{backward, backward_in_place, backward_into};
pub use io::{BlockCols, F64Rounded, GradSink, InPlace, RowIo, ToBuffer, ToSink, Typed};

/// The entropy term of the row's non-source entries. With no mask, or a
/// masked entropy, the entropy's logits are the row's own `z` and
/// [`row_stats`] takes its statistics from the same reduction (`m_w = m`,
/// `ell_w = ell` bit for bit), so `q_j = p_j` and `e_j = d_j`.
fn entropy_term<A: Acc>(
    st: &RowStats<A>,
    h: Option<A>,
    masked: bool,
    masked_entropy: bool,
) -> EntropyTerm<A> {
    match (h, st.w.as_ref()) {
        (Some(h), Some(w)) if masked && !masked_entropy => EntropyTerm::Unmasked {
            h,
            m: w.m,
            ell: w.ell,
            r: w.r,
        },
        (Some(h), Some(w)) => {
            debug_assert_eq!(w.m.to_f64().to_bits(), st.m.to_f64().to_bits());
            debug_assert_eq!(w.ell.to_f64().to_bits(), st.ell.to_f64().to_bits());
            EntropyTerm::Own { h, r: w.r }
        }
        _ => EntropyTerm::None,
    }
}

/// Writes the gradient of one row (columns `0..v`, padding `v..v_total`):
/// the non-source entries block by block (`crate::grad_block`, blocks
/// of [`BLOCK`] columns from column 0, the next block prefetched while one
/// is computed), then the source columns.
pub fn grad_row<A: Acc, Io: RowIo<A>>(
    io: &mut Io,
    inputs: RowInputs<'_>,
    st: &RowStats<A>,
    p: &CallParams<A>,
    rc: &RowCot<A>,
    v_total: usize,
    masked_entropy: bool,
) {
    let v = p.v;
    let mask = inputs.mask;
    // The soft cross-entropy's `-c p_j` (the teacher's `p_j`) per entry.
    let dense = rc.soft.zip(inputs.teacher);
    let (mut total, u) = rc.total(st, p);
    // The policy terms' source at the target (read before any write).
    let pol = rc.policy.as_ref().map(|ps| {
        let lp = crate::stats::log_prob(io.get(ps.target), st, p.scale);
        (ps.target, ps.weight(lp))
    });
    // The top-k KL's sources at the ids (read before any write).
    let kl: Vec<(usize, A)> = match &rc.kl {
        Some(ks) => ks.sources(io, st, p),
        None => Vec::new(),
    };
    let sources: Vec<(usize, A)> = rc
        .sources
        .iter()
        .copied()
        .chain(pol)
        .chain(kl.iter().copied())
        .collect();
    if let Some((_, w)) = pol {
        total = total + w;
    }
    for &(_, w) in &kl {
        total = total + w;
    }
    let h = rc.h;
    // Source columns: read before the block pass (it may overwrite them),
    // with their softcap factors.
    let mut spec: Vec<(usize, A, Option<A>)> = Vec::with_capacity(rc.sources.len());
    for &(j, _) in &sources {
        if !spec.iter().any(|&(c, _, _)| c == j) {
            let mut f = [A::ONE];
            let capped = io.softcap_factors(j, &mut f);
            spec.push((j, io.get(j), capped.then_some(f[0])));
        }
    }
    let allowed = |j: usize| mask.is_none_or(|m| m[j]);
    let consts = BlockConsts {
        m: st.m,
        ell: st.ell,
        scale: p.scale,
        grad_scale: p.grad_scale,
        total,
        u,
        entropy: entropy_term(st, h, mask.is_some(), masked_entropy),
    };
    let mask_slice = mask.and_then(|m| m.to_slice());
    let mut zbuf = [A::ZERO; BLOCK];
    let mut mbuf = [false; BLOCK];
    let mut fbuf = [A::ONE; BLOCK];
    let mut dbuf = [A::ZERO; BLOCK];
    let mut start = 0;
    while start < v {
        let n = BLOCK.min(v - start);
        let mk: Option<&[bool]> = match (mask, mask_slice) {
            (None, _) => None,
            (Some(_), Some(s)) => Some(&s[start..start + n]),
            (Some(m), None) => {
                for (d, &x) in mbuf[..n]
                    .iter_mut()
                    .zip(m.slice(ndarray::s![start..start + n]))
                {
                    *d = x;
                }
                Some(&mbuf[..n])
            }
        };
        let capped = io.softcap_factors(start, &mut fbuf[..n]);
        if let Some((sf, t)) = dense {
            for (i, d) in dbuf[..n].iter_mut().enumerate() {
                *d = soft_term(sf, t[start + i], p.grad_scale);
            }
        }
        if capped || dense.is_some() {
            // `(g - d_j) f_j`: the soft term `d_j`, then the softcap factor.
            let fac = capped.then_some(&fbuf[..n]);
            let dn = dense.is_some().then_some(&dbuf[..n]);
            let fix = |g: A, i: usize| {
                let g = dn.map_or(g, |d| g - d[i]);
                fac.map_or(g + A::ZERO, |f| softcapped(g, f[i]))
            };
            block_fixed(
                io,
                BlockCols { start, n, end: v },
                &mut zbuf,
                &consts,
                mk,
                fix,
            );
        } else {
            io.block(BlockCols { start, n, end: v }, &mut zbuf, &mut |z, out| {
                grad_block(&consts, z, mk, out)
            });
        }
        start += n;
    }
    io.store_zeros(v..v_total);
    // Source columns: c_j (1 - p_j) - o_j p_j - h q_j (e_j + R), cancellation-free.
    for &(j, zj, fj) in &spec {
        // A source's soft term joins its constant `u`.
        let uj = dense.map_or(u, |(sf, t)| {
            u - sf.c * crate::stats::teacher_p(sf.form, t[j])
        });
        let g = source_grad(
            (j, zj),
            &sources,
            st,
            p,
            rc,
            uj,
            allowed(j) || !masked_entropy,
        );
        let g = match p.grad_scale {
            None => g,
            Some(t) => g / t,
        };
        io.store(
            j,
            &[match fj {
                None => g + A::ZERO,
                Some(f) => softcapped(g, f),
            }],
        );
    }
}

/// One block of [`grad_row`] whose values get a per-entry fix before
/// they are stored (`fix(g, i)`, `i` the entry's index in the block: the
/// soft term and the softcap factor), in the direct and the emitted
/// output alike.
fn block_fixed<A: Acc, Io: RowIo<A>>(
    io: &mut Io,
    cols: BlockCols,
    zbuf: &mut [A; BLOCK],
    consts: &BlockConsts<A>,
    mk: Option<&[bool]>,
    fix: impl Fn(A, usize) -> A,
) {
    io.block(cols, zbuf, &mut |z, out| {
        let BlockOut { direct, emit } = out;
        match direct {
            Some(d) => {
                grad_block(
                    consts,
                    z,
                    mk,
                    BlockOut {
                        direct: Some(&mut *d),
                        emit: &mut *emit,
                    },
                );
                for (i, g) in d.iter_mut().enumerate() {
                    *g = fix(*g, i);
                }
            }
            None => {
                let mut tmp = [A::ZERO; BLOCK];
                grad_block(
                    consts,
                    z,
                    mk,
                    BlockOut {
                        direct: None,
                        emit: &mut |k, vals| {
                            let t = &mut tmp[..vals.len()];
                            for (i, (o, &g)) in t.iter_mut().zip(vals).enumerate() {
                                *o = fix(g, k + i);
                            }
                            emit(k, t)
                        },
                    },
                );
            }
        }
    });
}

/// One source column `j` (logit `zj`) of [`grad_row`], before the
/// temperature and softcap factors: `c_j (1 - p_j) - o_j p_j - h q_j (e_j +
/// R)`, cancellation-free, `c_j` and `o_j` summed over `sources`; the
/// entropy term takes `zj` as is when `entropy_live`, else `-inf`.
#[inline]
fn source_grad<A: Acc>(
    (j, zj): (usize, A),
    sources: &[(usize, A)],
    st: &RowStats<A>,
    p: &CallParams<A>,
    rc: &RowCot<A>,
    u: A,
    entropy_live: bool,
) -> A {
    let (mut c, mut o) = (A::ZERO, A::ZERO);
    for &(i, w) in sources {
        if i == j {
            c = c + w;
        } else {
            o = o + w;
        }
    }
    let d = shift(zj, st.m, p.scale);
    let pj = (d - st.ell).exp();
    let one_minus_p = if d == A::ZERO {
        st.s / (A::ONE + st.s)
    } else {
        A::ONE - pj
    };
    // The others' weight of `p_j` less the soft term's and the loss
    // side's (`total - c`);
    // `u` is every allowed entry's (a source is allowed).
    let o = match &rc.soft {
        None => o,
        Some(sf) => o - sf.c * sf.mass,
    };
    let o = match &rc.loss {
        None => o,
        Some(l) => o - l.p_weight(st, p),
    };
    let mut g = c * one_minus_p - o * pj + u;
    if let (Some(h), Some(w)) = (rc.h, st.w.as_ref()) {
        let zw = if entropy_live { zj } else { A::NEG_INF };
        let e = shift(zw, w.m, p.scale);
        let q = (e - w.ell).exp();
        let t = if q > A::ZERO { q * (e + w.r) } else { A::ZERO };
        g = g - h * t;
    }
    g
}

/// The soft cross-entropy's term of entry `j` (holding `x`) as the write
/// pass subtracts it: `c p_j` (`p_j` the teacher's in `A`), divided by `T` when
/// the gradient is (`grad_scale`).
#[inline(always)]
fn soft_term<A: Acc>(sf: SoftSide<A>, x: f64, grad_scale: Option<A>) -> A {
    let d = sf.c * crate::stats::teacher_p(sf.form, x);
    grad_scale.map_or(d, |t| d / t)
}

/// A gradient `g` with respect to `x'` times the softcap factor `f =
/// dx'/dx`, one rounding, zeros `+0` (the same operation in every staging).
#[inline(always)]
fn softcapped<A: Acc>(g: A, f: A) -> A {
    g * f + A::ZERO
}

/// The softcap factors applied to a row's gradients `g [V]` computed from
/// a buffer of `x'` (chunked staging): `g_j <- g_j f_j` with `f_j` from the
/// raw logits `raw` ([`Softcap::grad_factor`]), as the fused write pass
/// does per block. No-op without a softcap.
pub fn apply_softcap_factors<T: Input>(
    softcap: Option<Softcap>,
    raw: ArrayView1<'_, T>,
    g: &mut [T::Acc],
) {
    if let Some(sc) = softcap {
        for (j, gj) in g.iter_mut().enumerate() {
            *gj = softcapped(*gj, sc.grad_factor(raw[j]));
        }
    }
}
