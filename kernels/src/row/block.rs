//! One block's reduction (module docs of [`super`]: max, first argmax, the
//! exp pass with `S` and `B`), compiled for AVX-512, AVX2 and the baseline
//! and picked at run time by [`leaf`].

use ndarray::ArrayView1;

use super::{path, Acc, Partial, Path, Reduction, Source, BLOCK, LANES};

/// Block scratch: the widened values (`BLOCK` elements).
pub(super) struct Scratch<A> {
    pub(super) z: [A; BLOCK],
}

/// What one block reduction needs besides the scratch.
pub(super) struct LeafArgs<'a, 'm, A: Acc, S: Source<A> + ?Sized> {
    pub(super) src: &'a S,
    pub(super) mask: Option<ArrayView1<'m, bool>>,
    pub(super) start: usize,
    pub(super) n: usize,
    /// End of the reduced columns: the next block (prefetched during this
    /// block's exp pass) is `start + n .. end`, at most `BLOCK` of it.
    pub(super) end: usize,
    pub(super) scale: Option<A>,
    pub(super) want_b: bool,
}

/// Chunks of [`LANES`] whose exps one step of the exp pass computes side by
/// side: independent dependency chains the core overlaps (one chunk's exp is
/// a chain of ~25 dependent operations, ~60 cycles; 8 chains fill the
/// vector pipes of a Zen 5 core), then added lane by lane in column order,
/// so each lane's sum is the same as one chunk at a time.
pub const STEP_CHUNKS: usize = 8;
/// Entries per step of the exp pass.
pub(crate) const STEP: usize = STEP_CHUNKS * LANES;
/// Entries per step of the max pass (4 chunks: 4 independent max chains).
const MAX_STEP: usize = 4 * LANES;

/// A chunk of [`LANES`] values (the block's last chunk padded with `-inf`).
type Chunk<A> = [A; LANES];

/// A slice of exactly [`LANES`] values as a chunk.
#[inline(always)]
fn as_chunk<A>(x: &[A]) -> &Chunk<A> {
    x.try_into().expect("LANES values")
}

/// The 4 chunks of a max step.
#[inline(always)]
fn split4<A>(c: &[A; MAX_STEP]) -> (&Chunk<A>, &Chunk<A>, &Chunk<A>, &Chunk<A>) {
    let (c0, r) = c.split_at(LANES);
    let (c1, r) = r.split_at(LANES);
    let (c2, c3) = r.split_at(LANES);
    (as_chunk(c0), as_chunk(c1), as_chunk(c2), as_chunk(c3))
}

/// Whether any value is NaN or `+inf` (per-lane flags in the accumulation
/// dtype, so they stay in vector registers).
#[inline(always)]
fn any_bad<A: Acc>(z: &[A]) -> bool {
    let mut flag = [A::ZERO; LANES];
    let mut it = z.chunks_exact(LANES);
    for c in &mut it {
        for l in 0..LANES {
            flag[l] = if !(c[l] < A::INF) { A::ONE } else { flag[l] };
        }
    }
    it.remainder().iter().any(|&x| !(x < A::INF)) || flag.iter().any(|&f| f != A::ZERO)
}

/// The block max as the lane order defines it: per lane in column order
/// (`x > mx` keeps the first of equal values), then lanes `0 .. LANES` in
/// order. Its value is that of any max; it is only needed for the sign of
/// a zero max.
#[inline(always)]
fn ordered_max<A: Acc>(full: &[A], tail: &Chunk<A>) -> A {
    let mut mx = [A::NEG_INF; LANES];
    for c in full.chunks_exact(LANES).chain(std::iter::once(&tail[..])) {
        for l in 0..LANES {
            mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
        }
    }
    let mut m = A::NEG_INF;
    for &v in &mx {
        m = if v > m { v } else { m };
    }
    m
}

/// Folds a chunk into per-lane maxima (`x > mx`: the first of equal values
/// stays; NaN is skipped), by value so they stay in vector registers.
#[inline(always)]
fn max_fold<A: Acc>(mut mx: Chunk<A>, c: &Chunk<A>) -> Chunk<A> {
    for l in 0..LANES {
        mx[l] = if c[l] > mx[l] { c[l] } else { mx[l] };
    }
    mx
}

/// Whether a value of the chunk equals `m` (one vector compare and an OR
/// of its lanes).
#[inline(always)]
fn any_eq<A: Acc>(c: &Chunk<A>, m: A) -> bool {
    let mut hit = [false; LANES];
    for l in 0..LANES {
        hit[l] = c[l] == m;
    }
    hit.iter().fold(false, |a, &b| a | b)
}

/// The first column of `z` holding `m` (`x == m`; NaN never), found by
/// vector compares over max steps, then chunks, then lanes. Plain loops:
/// an iterator chain here was left out of line by the optimiser (a call
/// and SSE compares per chunk, ~0.3 cycles per entry).
#[inline(always)]
fn first_index_of<A: Acc>(z: &[A], m: A) -> Option<usize> {
    let mut k = 0;
    while k + MAX_STEP <= z.len() {
        let c: &[A; MAX_STEP] = z[k..k + MAX_STEP].try_into().expect("MAX_STEP values");
        let (c0, c1, c2, c3) = split4(c);
        if any_eq(c0, m) | any_eq(c1, m) | any_eq(c2, m) | any_eq(c3, m) {
            break;
        }
        k += MAX_STEP;
    }
    while k + LANES <= z.len() && !any_eq(as_chunk(&z[k..k + LANES]), m) {
        k += LANES;
    }
    while k < z.len() {
        if z[k] == m {
            return Some(k);
        }
        k += 1;
    }
    None
}

/// The exp pass over `W` entries from column `base` of the block: `e_j =
/// exp(d(z_j))`, `s` lanes add `e_j` (`+0` for the argmax), `b` lanes add
/// `e_j (-d_j)` (`+0` where `e_j = 0`); lane `j % LANES`, column order.
#[inline(always)]
fn exp_step<A: Acc, const W: usize, const B: bool, const X: bool>(
    c: &[A; W],
    base: usize,
    argmax: usize,
    d: impl Fn(A) -> A,
    sl: &mut [A; LANES],
    bl: &mut [A; LANES],
) {
    // The argmax term (exactly 1) stays out of s: it adds +0 (a no-op, as
    // every lane holds a sum >= +0). Only the step holding it compares
    // column indices.
    let k = argmax.wrapping_sub(base);
    if k < W {
        exp_step_inner::<A, W, B, true, X>(c, k, d, sl, bl)
    } else {
        exp_step_inner::<A, W, B, false, X>(c, k, d, sl, bl)
    }
}

#[inline(always)]
fn exp_step_inner<A: Acc, const W: usize, const B: bool, const SEL: bool, const X: bool>(
    c: &[A; W],
    k: usize,
    d: impl Fn(A) -> A,
    sl: &mut [A; LANES],
    bl: &mut [A; LANES],
) {
    let mut dv = [A::ZERO; W];
    for i in 0..W {
        dv[i] = d(c[i]);
    }
    let mut ex = if X {
        // SAFETY: `X` is set only in the AVX-512 build of the block loop,
        // which runs only where `path()` (or a test) detected AVX-512F.
        unsafe { A::exp_nonpos_n_avx512(&dv) }
    } else {
        A::exp_nonpos_n(&dv)
    };
    let mut t = [A::ZERO; W];
    if B {
        for i in 0..W {
            t[i] = if ex[i] > A::ZERO {
                ex[i] * (-dv[i])
            } else {
                A::ZERO
            };
        }
    }
    if SEL {
        for (i, e) in ex.iter_mut().enumerate() {
            *e = if i == k { A::ZERO } else { *e };
        }
    }
    for q in 0..W / LANES {
        for l in 0..LANES {
            sl[l] = sl[l] + ex[q * LANES + l];
            if B {
                bl[l] = bl[l] + t[q * LANES + l];
            }
        }
    }
}

/// The exp pass over a block: `full` (a multiple of [`LANES`] long) in
/// steps of [`STEP`], then its last chunks one by one, then the padded tail.
/// `prefetch(k)` is called before the step at offset `k` (a cache hint for
/// the next block: no effect on values).
#[inline(always)]
fn exp_pass<A: Acc, const B: bool, const X: bool>(
    full: &[A],
    tail: Option<&Chunk<A>>,
    argmax: usize,
    d: impl Fn(A) -> A + Copy,
    prefetch: impl Fn(usize),
) -> ([A; LANES], [A; LANES]) {
    let mut sl = [A::ZERO; LANES];
    let mut bl = [A::ZERO; LANES];
    let mut steps = full.chunks_exact(STEP);
    for (si, c) in (&mut steps).enumerate() {
        let c: &[A; STEP] = c.try_into().expect("chunks_exact(STEP)");
        prefetch(si * STEP);
        exp_step::<A, STEP, B, X>(c, si * STEP, argmax, d, &mut sl, &mut bl);
    }
    let done = full.len() - steps.remainder().len();
    for (ci, c) in steps.remainder().chunks_exact(LANES).enumerate() {
        let c: &Chunk<A> = c.try_into().expect("chunks_exact(LANES)");
        exp_step::<A, LANES, B, X>(c, done + ci * LANES, argmax, d, &mut sl, &mut bl);
    }
    if let Some(tc) = tail {
        exp_step::<A, LANES, B, X>(tc, full.len(), argmax, d, &mut sl, &mut bl);
    }
    (sl, bl)
}

#[inline(always)]
fn leaf_body<A: Acc, S: Source<A> + ?Sized, const X: bool>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    let n = a.n;
    // The block's values: read in place when the source is a contiguous
    // slice of the accumulation dtype and no mask applies, else widened
    // (and masked) into the scratch. NaN / +inf anywhere in the row is an
    // error, masked or not: checked before the mask.
    let mut bad = false;
    let z: &[A] = match (a.mask, a.src.contiguous(a.start, n)) {
        (None, Some(z)) => z,
        (mask, _) => {
            let z = &mut sc.z[..n];
            a.src.load(a.start, z);
            if let Some(mask) = mask {
                bad = any_bad(z);
                let mask = mask.slice(ndarray::s![a.start..a.start + n]);
                match mask.as_slice() {
                    Some(ms) => {
                        for (x, &k) in z.iter_mut().zip(ms) {
                            *x = if k { *x } else { A::NEG_INF };
                        }
                    }
                    None => {
                        for (x, &k) in z.iter_mut().zip(mask.iter()) {
                            *x = if k { *x } else { A::NEG_INF };
                        }
                    }
                }
            }
            z
        }
    };
    // Full chunks, and the last partial chunk padded with -inf (adds +0).
    let nf = n - n % LANES;
    let full = &z[..nf];
    let mut tail = [A::NEG_INF; LANES];
    tail[..n - nf].copy_from_slice(&z[nf..]);
    let tail_chunk = (n > nf).then_some(&tail);

    // Max (with the NaN / +inf check) in STEP lanes: the max is exact, so
    // any grouping gives its value; only a zero max needs the lane order
    // for its sign (then `ordered_max`).
    let (mut m0, mut m1, mut m2, mut m3) = (
        [A::NEG_INF; LANES],
        [A::NEG_INF; LANES],
        [A::NEG_INF; LANES],
        [A::NEG_INF; LANES],
    );
    let mut steps = full.chunks_exact(MAX_STEP);
    for c in &mut steps {
        let c: &[A; MAX_STEP] = c.try_into().expect("chunks_exact(MAX_STEP)");
        let (c0, c1, c2, c3) = split4(c);
        m0 = max_fold(m0, c0);
        m1 = max_fold(m1, c1);
        m2 = max_fold(m2, c2);
        m3 = max_fold(m3, c3);
    }
    // Opaque to the optimiser: the lane reduction below must not reshape the
    // loop's vectors (LLVM's SLP pass otherwise permutes lanes every step).
    let (m0, m1, m2, m3) = std::hint::black_box((m0, m1, m2, m3));
    let mut mm = max_fold(max_fold(m0, &m1), &max_fold(m2, &m3));
    for c in steps.remainder().chunks_exact(LANES) {
        mm = max_fold(mm, as_chunk(c));
    }
    mm = max_fold(mm, &tail);
    let mut m = A::NEG_INF;
    for &v in &mm {
        m = if v > m { v } else { m };
    }
    // NaN / +inf without a separate check: +inf is the max; with a finite
    // max a NaN turns s into NaN (below); with none, look for a NaN.
    bad |= m == A::INF || (!(m > A::NEG_INF) && any_bad(z));
    if !(m > A::NEG_INF) || bad {
        return Reduction {
            partial: Partial::EMPTY,
            bad,
        };
    }
    if m == A::ZERO {
        m = ordered_max(full, &tail);
    }
    // First argmax (its exp is exactly 1 and stays out of s).
    let argmax = first_index_of(z, m).unwrap_or(0);
    // One pass: exp, S (without the argmax term) and B.
    // While the exps run, bring the next block into cache: the hardware
    // prefetchers idle during this compute-bound pass.
    let next = a.start + n;
    let pf = |k: usize| {
        if next + k < a.end {
            a.src.prefetch(next + k, STEP.min(a.end - next - k));
        }
    };
    let (sl, bl) = match (a.scale, a.want_b) {
        (None, false) => exp_pass::<A, false, X>(full, tail_chunk, argmax, |x: A| x - m, pf),
        (None, true) => exp_pass::<A, true, X>(full, tail_chunk, argmax, |x: A| x - m, pf),
        (Some(t), false) => {
            exp_pass::<A, false, X>(full, tail_chunk, argmax, |x: A| (x - m) / t, pf)
        }
        (Some(t), true) => exp_pass::<A, true, X>(full, tail_chunk, argmax, |x: A| (x - m) / t, pf),
    };
    let (s, b) = (lane_tree(sl), lane_tree(bl));
    // Every e_j is in [0, 1] and every t_j finite unless a z_j is NaN (d_j
    // NaN, e_j NaN; never the argmax): s is NaN (`!(s >= 0)`) exactly when
    // the block holds one.
    if !(s >= A::ZERO) {
        return Reduction {
            partial: Partial::EMPTY,
            bad: true,
        };
    }
    Reduction {
        partial: Partial { m, s, b },
        bad,
    }
}

/// Pairwise tree over the lanes: `(l, l + half)` pairs, `log2 LANES` levels.
#[inline(always)]
pub(super) fn lane_tree<A: Acc>(mut v: [A; LANES]) -> A {
    let mut half = LANES / 2;
    while half > 0 {
        for l in 0..half {
            v[l] = v[l] + v[l + half];
        }
        half /= 2;
    }
    v[0]
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,avx")]
pub(super) unsafe fn leaf_avx512<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body::<A, S, true>(a, sc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx")]
pub(super) unsafe fn leaf_avx2<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body::<A, S, false>(a, sc)
}

pub(super) fn leaf_baseline<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    leaf_body::<A, S, false>(a, sc)
}

pub(super) fn leaf<A: Acc, S: Source<A> + ?Sized>(
    a: &LeafArgs<'_, '_, A, S>,
    sc: &mut Scratch<A>,
) -> Reduction<A> {
    match path() {
        // SAFETY: the features were detected at run time by `path()`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { leaf_avx512(a, sc) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { leaf_avx2(a, sc) },
        _ => leaf_baseline(a, sc),
    }
}
