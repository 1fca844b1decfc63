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

pub use cot::RowCot;
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
    mask: Option<ArrayView1<'_, bool>>,
    st: &RowStats<A>,
    p: &CallParams<A>,
    rc: &RowCot<A>,
    v_total: usize,
    masked_entropy: bool,
) {
    let v = p.v;
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
        if io.softcap_factors(start, &mut fbuf[..n]) {
            let fac = &fbuf[..n];
            io.block(BlockCols { start, n, end: v }, &mut zbuf, &mut |z, out| {
                let BlockOut { direct, emit } = out;
                match direct {
                    Some(d) => {
                        grad_block(
                            &consts,
                            z,
                            mk,
                            BlockOut {
                                direct: Some(&mut *d),
                                emit: &mut *emit,
                            },
                        );
                        for (g, &f) in d.iter_mut().zip(fac) {
                            *g = softcapped(*g, f);
                        }
                    }
                    None => {
                        let mut tmp = [A::ZERO; BLOCK];
                        grad_block(
                            &consts,
                            z,
                            mk,
                            BlockOut {
                                direct: None,
                                emit: &mut |k, vals| {
                                    let t = &mut tmp[..vals.len()];
                                    for ((o, &g), &f) in t.iter_mut().zip(vals).zip(&fac[k..]) {
                                        *o = softcapped(g, f);
                                    }
                                    emit(k, t)
                                },
                            },
                        );
                    }
                }
            });
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
        let g = source_grad(
            (j, zj),
            &sources,
            st,
            p,
            rc,
            u,
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
    // The others' weight of `p_j` less the loss side's (`total - c`);
    // `u` is every allowed entry's (a source is allowed).
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
