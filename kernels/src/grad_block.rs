//! The VJP's write pass over one block of entries, vectorised: the
//! gradient of every non-source entry (docs/design.md, "The math"; the formula and
//! its cancellation-free source entries are in [`crate::vjp`]),
//!
//! `dx_j = ( u - W p_j - h t_j ) / T`, `p_j = exp(d_j - ell)`,
//! `t_j = q_j (e_j + R)` (`0` where `q_j = 0`), then `+ 0` (zeros are `+0`),
//!
//! with `W` the sum of the row's source weights (less the loss side's
//! weight of `p_j`), `u` the smoothed loss's constant on allowed entries
//! (0 without one; a row constant, no branch), `d_j = (z_j - m) / T`
//! (subtract, then scale), `e_j = (w_j - m_w) / T`, `q_j = exp(e_j - ell_w)`.
//!
//! # Order of operations
//!
//! Every entry is the same sequence of operations on the same operands as
//! the scalar form (one `exp` per probability, no FMA, the division by `T`
//! last), so the result of each entry is independent of the CPU path,
//! the block it falls in and its neighbours: bit-identical to the scalar
//! loop (test `every_cpu_path_gives_the_scalar_bits`), and so invariant
//! under chunking and thread count. When the entropy's logits and
//! statistics are the row's own (no mask, or a masked entropy), `q_j` and
//! `e_j` are `p_j` and `d_j` bit for bit, and are not computed twice.
//!
//! # Evaluation
//!
//! Entries in steps of [`STEP`] (the forward's step, [`crate::row`]):
//! each line of the step is one loop over its entries, so the exps of
//! [`crate::row::STEP_CHUNKS`] chunks of [`LANES`] run as independent
//! dependency chains side by side ([`Acc::exp_nonpos_n`]). The same loop
//! is compiled for AVX-512, AVX2 and SSE2 and picked at run time
//! ([`crate::cpu_path`]; the AVX-512 build scales by `2^k` with
//! `vscalefps`, the same bits: [`crate::exp::exp_f32_nonpos_n_avx512`]).
//! `exp_nonpos` gives `exp`'s bits here: every argument is `<= 0`
//! (`d_j <= 0` and `e_j <= 0` against the maxima, `ell, ell_w >= 0`).
//! Each step writes straight into the output row when it holds the
//! accumulation dtype ([`BlockOut::direct`]), so the row's stores are
//! spread over the computation (not bunched per block, which stalled on
//! the stores' reads for ownership); otherwise steps are handed to the
//! caller to round and store in batches of 512 entries. The caller
//! prefetches the next block (read, and for write) as pieces come.
//!
//! Measured (Xeon, AVX-512, one thread, `[16, 152064]` f32 in L2/L3): the
//! write pass ~1.4 core cycles per entry, the stats pass before it ~1.8
//! (`logprobe bench` and `BENCHMARKS.md` for the whole backward).

use crate::row::{path, Acc, Path, LANES, STEP};

/// How the entropy term enters the gradient of a non-source entry.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum EntropyTerm<A> {
    /// No entropy cotangent (absent or zero): no term.
    None,
    /// The entropy's logits and statistics are the row's own: `q_j = p_j`,
    /// `e_j = d_j`. `h` the cotangent, `r` = `R`.
    Own {
        /// Entropy cotangent.
        h: A,
        /// `R = B_w / S_w`.
        r: A,
    },
    /// The entropy is over the unmasked logits `w = x` while `z` is masked:
    /// its own max `m`, `ell = ln S_w` and `R`.
    Unmasked {
        /// Entropy cotangent.
        h: A,
        /// Max of `w`.
        m: A,
        /// `ln S_w`.
        ell: A,
        /// `R`.
        r: A,
    },
}

/// The row constants of the write pass.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockConsts<A> {
    /// Max of the allowed `z`.
    pub m: A,
    /// `ln S`.
    pub ell: A,
    /// Division by `T` in the shift (`None`: no division).
    pub scale: Option<A>,
    /// Final division by `T` (`None`: none).
    pub grad_scale: Option<A>,
    /// Sum of the source weights `W` (less the loss side's weight of `p_j`).
    pub total: A,
    /// The constant every allowed entry gains (the smoothed loss's `u`,
    /// before the division by `T`; 0 without one).
    pub u: A,
    /// The entropy term.
    pub entropy: EntropyTerm<A>,
}

const ENT_NONE: u8 = 0;
const ENT_OWN: u8 = 1;
const ENT_UNMASKED: u8 = 2;

/// The gradients of `W` entries `x` (`mk`: their mask, read when `MK`)
/// into `out`. `SC`: divide in the shift; `GS`: divide the result; `ENT`:
/// which entropy term.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn step<
    A: Acc,
    const W: usize,
    const SC: bool,
    const GS: bool,
    const ENT: u8,
    const MK: bool,
    const X: bool,
>(
    c: &Consts<A>,
    x: &[A; W],
    mk: &[bool; W],
    out: &mut [A; W],
) {
    let shift = |z: A, m: A| if SC { (z - m) / c.t } else { z - m };
    let mut z = *x;
    if MK {
        for i in 0..W {
            z[i] = if mk[i] { x[i] } else { A::NEG_INF };
        }
    }
    let mut d = [A::ZERO; W];
    for i in 0..W {
        d[i] = shift(z[i], c.m);
    }
    let mut a = [A::ZERO; W];
    for i in 0..W {
        a[i] = d[i] - c.ell;
    }
    let p = exp_n::<A, W, X>(&a);
    // `u - W p_j` (a masked entry: `0 - W 0`); with `u = 0` this is
    // `-(W p_j)` but for the sign of a zero, which the final `+ 0` drops.
    let mut g = [A::ZERO; W];
    for i in 0..W {
        let u = if MK && !mk[i] { A::ZERO } else { c.u };
        g[i] = u - c.total * p[i];
    }
    if ENT == ENT_OWN {
        for i in 0..W {
            let t = if p[i] > A::ZERO {
                p[i] * (d[i] + c.r)
            } else {
                A::ZERO
            };
            g[i] = g[i] - c.h * t;
        }
    } else if ENT == ENT_UNMASKED {
        let mut e = [A::ZERO; W];
        for i in 0..W {
            e[i] = shift(x[i], c.wm);
        }
        let mut b = [A::ZERO; W];
        for i in 0..W {
            b[i] = e[i] - c.well;
        }
        let q = exp_n::<A, W, X>(&b);
        for i in 0..W {
            let t = if q[i] > A::ZERO {
                q[i] * (e[i] + c.r)
            } else {
                A::ZERO
            };
            g[i] = g[i] - c.h * t;
        }
    }
    if GS {
        for i in 0..W {
            g[i] = g[i] / c.gt;
        }
    }
    for i in 0..W {
        out[i] = g[i] + A::ZERO;
    }
}

/// [`Acc::exp_nonpos_n`], or its AVX-512 form when `X` (the same bits).
#[inline(always)]
fn exp_n<A: Acc, const W: usize, const X: bool>(x: &[A; W]) -> [A; W] {
    if X {
        // SAFETY: `X` is set only in `block_avx512`, which runs only where
        // `path()` (or a test) detected AVX-512F.
        unsafe { A::exp_nonpos_n_avx512(x) }
    } else {
        A::exp_nonpos_n(x)
    }
}

/// [`BlockConsts`] flattened (unused fields hold 1 or 0).
#[derive(Clone, Copy)]
struct Consts<A> {
    m: A,
    ell: A,
    t: A,
    gt: A,
    total: A,
    u: A,
    h: A,
    r: A,
    wm: A,
    well: A,
}

/// Where the block's gradients go: straight into `direct` (the output row
/// in the accumulation dtype, as long as the block) when given, else into
/// a step-sized scratch. Either way `emit(k, values)` is called with each
/// piece (`k` its first entry) as soon as it is computed, in entry order:
/// it stores a scratch piece, and may prefetch.
pub struct BlockOut<'a, A> {
    /// The block's output entries, when the row holds them in the
    /// accumulation dtype.
    pub direct: Option<&'a mut [A]>,
    /// Called with each finished piece.
    pub emit: &'a mut dyn FnMut(usize, &[A]),
}

/// The `W`-entry output of the piece at `k`: the direct slice's entries,
/// or the scratch.
#[inline(always)]
fn piece<'a, A, const W: usize>(
    direct: &'a mut Option<&mut [A]>,
    scratch: &'a mut [A; W],
    k: usize,
) -> &'a mut [A; W] {
    match direct {
        Some(d) => (&mut d[k..k + W]).try_into().expect("W outputs"),
        None => scratch,
    }
}

/// Entries emitted at once from the scratch (no direct output): steps
/// stored in a few batches per block, each call's cost spread over 512
/// entries, without bunching a whole block's stores.
const EMIT: usize = 4 * STEP;

/// The block loop: steps of [`STEP`], then chunks of [`LANES`], then the
/// last partial chunk padded (padding lanes computed and dropped), each
/// piece written and emitted as [`BlockOut`] says.
#[inline(always)]
fn body<A: Acc, const SC: bool, const GS: bool, const ENT: u8, const MK: bool, const X: bool>(
    c: &Consts<A>,
    z: &[A],
    mask: &[bool],
    out: BlockOut<'_, A>,
) {
    let BlockOut { mut direct, emit } = out;
    let n = z.len();
    let ns = n - n % STEP;
    let nl = n - n % LANES;
    let none = [true; STEP];
    let mut batch = [A::ZERO; EMIT];
    let mut k = 0;
    while k < ns {
        let x: &[A; STEP] = z[k..k + STEP].try_into().expect("STEP values");
        let mk: &[bool; STEP] = if MK {
            mask[k..k + STEP].try_into().expect("STEP flags")
        } else {
            &none
        };
        match &mut direct {
            Some(d) => {
                let o: &mut [A; STEP] = (&mut d[k..k + STEP]).try_into().expect("STEP outputs");
                step::<A, STEP, SC, GS, ENT, MK, X>(c, x, mk, o);
                emit(k, o);
            }
            None => {
                let at = k % EMIT;
                let o: &mut [A; STEP] = (&mut batch[at..at + STEP])
                    .try_into()
                    .expect("STEP outputs");
                step::<A, STEP, SC, GS, ENT, MK, X>(c, x, mk, o);
                if at + STEP == EMIT || k + STEP == ns {
                    emit(k - at, &batch[..at + STEP]);
                }
            }
        }
        k += STEP;
    }
    let mut scratch = [A::ZERO; LANES];
    while k < nl {
        let x: &[A; LANES] = z[k..k + LANES].try_into().expect("LANES values");
        let mk: &[bool; LANES] = if MK {
            mask[k..k + LANES].try_into().expect("LANES flags")
        } else {
            none[..LANES].try_into().expect("LANES flags")
        };
        let o = piece(&mut direct, &mut scratch, k);
        step::<A, LANES, SC, GS, ENT, MK, X>(c, x, mk, o);
        emit(k, o);
        k += LANES;
    }
    if k < n {
        let r = n - k;
        let mut x = [A::NEG_INF; LANES];
        x[..r].copy_from_slice(&z[k..]);
        let mut mk = [false; LANES];
        if MK {
            mk[..r].copy_from_slice(&mask[k..]);
        }
        step::<A, LANES, SC, GS, ENT, MK, X>(c, &x, &mk, &mut scratch);
        match direct {
            Some(d) => {
                d[k..].copy_from_slice(&scratch[..r]);
                emit(k, &d[k..]);
            }
            None => emit(k, &scratch[..r]),
        }
    }
}

/// Picks the monomorphised loop for the row's constants.
#[inline(always)]
fn dispatch<A: Acc, const X: bool>(
    c: &BlockConsts<A>,
    z: &[A],
    mask: Option<&[bool]>,
    out: BlockOut<'_, A>,
) {
    let (ent, h, r, wm, well) = match c.entropy {
        EntropyTerm::None => (ENT_NONE, A::ZERO, A::ZERO, A::ZERO, A::ZERO),
        EntropyTerm::Own { h, r } => (ENT_OWN, h, r, A::ZERO, A::ZERO),
        EntropyTerm::Unmasked { h, m, ell, r } => (ENT_UNMASKED, h, r, m, ell),
    };
    let k = Consts {
        m: c.m,
        ell: c.ell,
        t: c.scale.unwrap_or(A::ONE),
        gt: c.grad_scale.unwrap_or(A::ONE),
        total: c.total,
        u: c.u,
        h,
        r,
        wm,
        well,
    };
    // `entropy_term` gives `Unmasked` only under a mask.
    debug_assert!(ent != ENT_UNMASKED || mask.is_some());
    let m = mask.unwrap_or(&[]);
    macro_rules! go {
        ($sc:expr, $gs:expr) => {
            match (ent, mask.is_some()) {
                (ENT_NONE, false) => body::<A, $sc, $gs, ENT_NONE, false, X>(&k, z, m, out),
                (ENT_NONE, true) => body::<A, $sc, $gs, ENT_NONE, true, X>(&k, z, m, out),
                (ENT_OWN, false) => body::<A, $sc, $gs, ENT_OWN, false, X>(&k, z, m, out),
                (ENT_OWN, true) => body::<A, $sc, $gs, ENT_OWN, true, X>(&k, z, m, out),
                // The unmasked entropy differs from the row's own only under a mask.
                (_, _) => body::<A, $sc, $gs, ENT_UNMASKED, true, X>(&k, z, m, out),
            }
        };
    }
    match (c.scale.is_some(), c.grad_scale.is_some()) {
        (false, false) => go!(false, false),
        (false, true) => go!(false, true),
        (true, _) => go!(true, true),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
unsafe fn block_avx512<A: Acc>(
    c: &BlockConsts<A>,
    z: &[A],
    mask: Option<&[bool]>,
    out: BlockOut<'_, A>,
) {
    dispatch::<A, true>(c, z, mask, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
unsafe fn block_avx2<A: Acc>(
    c: &BlockConsts<A>,
    z: &[A],
    mask: Option<&[bool]>,
    out: BlockOut<'_, A>,
) {
    dispatch::<A, false>(c, z, mask, out)
}

fn block_baseline<A: Acc>(
    c: &BlockConsts<A>,
    z: &[A],
    mask: Option<&[bool]>,
    out: BlockOut<'_, A>,
) {
    dispatch::<A, false>(c, z, mask, out)
}

/// The gradients of the non-source entries `z` (one block, at most
/// [`crate::row::BLOCK`] entries; `mask`: their sampling-mask flags), in
/// the accumulation dtype, written piece by piece as `out` says
/// ([`BlockOut`]; a direct slice must be as long as `z`). Source entries get the non-source value here;
/// the caller overwrites them. A masked-out entry (`p_j = 0`) gets `+0` or
/// its entropy term. No heap allocation.
///
/// # Panics
/// Never for a mask as long as `z` (callers guarantee it).
pub(crate) fn grad_block<A: Acc>(
    c: &BlockConsts<A>,
    z: &[A],
    mask: Option<&[bool]>,
    out: BlockOut<'_, A>,
) {
    debug_assert!(mask.is_none_or(|m| m.len() == z.len()));
    debug_assert!(out.direct.as_ref().is_none_or(|d| d.len() == z.len()));
    match path() {
        // SAFETY: the features were detected at run time by `path()`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { block_avx512(c, z, mask, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { block_avx2(c, z, mask, out) },
        _ => block_baseline(c, z, mask, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scalar form of one non-source entry (the write pass as it was
    /// written element by element, `exp` with its overflow clamp).
    fn scalar(c: &BlockConsts<f32>, x: f32, allowed: bool) -> f32 {
        let sh = |z: f32, m: f32| match c.scale {
            None => z - m,
            Some(t) => (z - m) / t,
        };
        let z = if allowed { x } else { f32::NEG_INFINITY };
        let pj = (sh(z, c.m) - c.ell).exp_like();
        let u = if allowed { c.u } else { 0.0 };
        let mut g = u - c.total * pj;
        let (h, e, q, r) = match c.entropy {
            EntropyTerm::None => (None, 0.0, 0.0, 0.0),
            EntropyTerm::Own { h, r } => {
                let e = sh(z, c.m);
                (Some(h), e, (e - c.ell).exp_like(), r)
            }
            EntropyTerm::Unmasked { h, m, ell, r } => {
                let e = sh(x, m);
                (Some(h), e, (e - ell).exp_like(), r)
            }
        };
        if let Some(h) = h {
            let t = if q > 0.0 { q * (e + r) } else { 0.0 };
            g -= h * t;
        }
        let g = match c.grad_scale {
            None => g,
            Some(t) => g / t,
        };
        g + 0.0
    }

    trait ExpLike {
        fn exp_like(self) -> Self;
    }
    impl ExpLike for f32 {
        fn exp_like(self) -> f32 {
            crate::exp::exp_f32(self)
        }
    }

    /// Every CPU path gives, entry by entry, the bits of the scalar form:
    /// ragged lengths, masks, both temperature modes, each entropy term.
    #[test]
    fn every_cpu_path_gives_the_scalar_bits() {
        let mut rng = logprobe_reference::splitmix::SplitMix64::new(7);
        let mut next = move || rng.uniform() as f32;
        for &n in &[1usize, 15, 16, 17, 127, 128, 129, 300, 2047, 2048] {
            let mut z: Vec<f32> = (0..n).map(|_| -(next() * 40.0)).collect();
            z[0] = 0.0;
            if n > 3 {
                z[3] = f32::NEG_INFINITY;
                z[2] = -1e-30;
            }
            let mask: Vec<bool> = (0..n).map(|_| next() < 0.7).collect();
            let ents = [
                EntropyTerm::None,
                EntropyTerm::Own { h: 0.3, r: 1.7 },
                EntropyTerm::Own { h: -2.5, r: 0.0 },
                EntropyTerm::Unmasked {
                    h: 0.75,
                    m: 0.5,
                    ell: 2.25,
                    r: 3.5,
                },
            ];
            for (scale, grad_scale) in [
                (None, None),
                (None, Some(0.7f32)),
                (Some(0.7f32), Some(0.7f32)),
                (Some(1e-30), Some(1e-30)),
            ] {
                for entropy in ents {
                    for (masked, u) in [(false, 0.0), (true, 0.0), (false, 0.03125), (true, -0.1)] {
                        if matches!(entropy, EntropyTerm::Unmasked { .. }) && !masked {
                            continue;
                        }
                        let c = BlockConsts {
                            m: 0.0,
                            ell: 1.25,
                            scale,
                            grad_scale,
                            total: -0.875,
                            u,
                            entropy,
                        };
                        let mk = masked.then_some(&mask[..]);
                        let want: Vec<u32> = (0..n)
                            .map(|j| scalar(&c, z[j], !masked || mask[j]).to_bits())
                            .collect();
                        let what = format!("n {n} scale {scale:?} {entropy:?} mask {masked} u {u}");
                        // Each build, emitting pieces and writing a direct slice.
                        let collect = |f: &dyn Fn(BlockOut<'_, f32>)| {
                            let mut got = Vec::new();
                            f(BlockOut {
                                direct: None,
                                emit: &mut |k, vals| {
                                    assert_eq!(k, got.len(), "pieces in entry order");
                                    got.extend(vals.iter().map(|x| x.to_bits()));
                                },
                            });
                            let mut direct = vec![f32::NAN; n];
                            let mut seen = 0;
                            f(BlockOut {
                                direct: Some(&mut direct),
                                emit: &mut |k, vals| {
                                    assert_eq!(k, seen, "pieces in entry order");
                                    seen += vals.len();
                                },
                            });
                            assert_eq!(seen, n);
                            let d: Vec<u32> = direct.iter().map(|x| x.to_bits()).collect();
                            assert_eq!(d, got, "direct and emitted outputs");
                            got
                        };
                        let got = collect(&|e| block_baseline(&c, &z, mk, e));
                        assert_eq!(got, want, "baseline {what}");
                        #[cfg(target_arch = "x86_64")]
                        {
                            if std::is_x86_feature_detected!("avx2") {
                                // SAFETY: feature detected above.
                                let got = collect(&|e| unsafe { block_avx2(&c, &z, mk, e) });
                                assert_eq!(got, want, "avx2 {what}");
                            }
                            if std::is_x86_feature_detected!("avx512f")
                                && std::is_x86_feature_detected!("avx512bw")
                            {
                                // SAFETY: feature detected above.
                                let got = collect(&|e| unsafe { block_avx512(&c, &z, mk, e) });
                                assert_eq!(got, want, "avx512 {what}");
                            }
                        }
                    }
                }
            }
        }
    }
}
