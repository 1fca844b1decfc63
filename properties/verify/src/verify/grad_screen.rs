//! Which gradient elements of a row need their exact bound (T14).
//!
//! An element's bound matters to the report only through its ratios
//! `error / bound` (the chosen model's maximum, the worst elements, each
//! reference model's maximum) and its pass. [`GradScreen::lower`] gives a
//! lower bound `L_m <= E_m` under every model `m`, so
//! `fl(err / E_m) <= fl(err / L_m) =: U_m` (rounding is monotone; `U_m`
//! is kept rounded up to f32, still an upper bound). A first
//! pass over the row picks *seeds*: the elements of largest `U`. Their exact
//! bounds give the thresholds `T_m`, each the largest ratio of a seed under
//! model `m`, and `T_keep`, the `keep`-th largest chosen ratio among the
//! seeds. Seeds are always judged in full.
//!
//! Any other element with `err <= L_chosen`, `U_m <= T_m` for every `m`
//! and `U_chosen < T_keep` is *screened*: it passes (`err <= L <= E`), each
//! of its ratios is at most a seed's ratio in the same row, so no maximum
//! moves, and `keep` seeds rank strictly above it, so it is in no list of
//! the `keep` worst (nor, at an intermediate trim, can it push out an
//! element that ranks above it). It is counted, with its error and ulps,
//! exactly as if its bounds had been computed: the report is the same bits.
//!
//! An element with no error has the least worst-list key, `(0, 0)`; on a
//! tie the list keeps the element pushed first (a stable sort, the walk in
//! column order). So one with `err = 0` after the `keep`-th seed with a
//! ratio (in column order) is in no list either, even when `U_chosen =
//! T_keep = 0`: a row whose gradient is exactly 0 (an ignored row of a
//! loss) is screened whole.
//!
//! The statistical threshold (TOLERANCE.md (S6)) rides along as one more
//! lane ([`StatLane`]): from the same leaves, its own lower bound `L_s`
//! (kept rounded down to f32). The seeds above get their exact
//! thresholds, `T_s` the largest ratio among them. A screened element with
//! `err <= L_s min(1, T_s)` is within its threshold (not SUSPECT) and its
//! ratio is at most a seed's: its threshold is not computed
//! ([`RowScreen::stat_screened`]). The seeds' and every other element's
//! thresholds are, so the tier's figures are the same bits.

use ndarray::ArrayView1;

use logprobe_reference::oracle::Exact;
use logprobe_reference::spec::{pow2, Dtype};

use crate::tolerance::{self, GradCotangents, GradRow, GradScreen, RowBounds};

/// How many seeds the first pass keeps beyond `keep` (chosen model), and
/// per reference model.
const EXTRA_SEEDS: usize = 4;
const SEEDS_PER_MODEL: usize = 2;

/// One row's screen of its gradient elements, walked in column order.
pub(super) struct RowScreen<const M: usize> {
    /// `T_m`.
    t_max: [f64; M],
    /// `T_keep` (`+inf` when no worst elements are kept).
    t_keep: f64,
    /// The column of the `keep`-th seed with a ratio (`usize::MAX` when
    /// fewer): an error-free element after it is in no worst list.
    zero_after: usize,
    /// Seed columns, ascending.
    seeds: Vec<usize>,
    /// Per column `j < v`, from the first pass: `U` rounded up to f32 (4
    /// bytes a model: the row's buffer stays small), NaN when the element
    /// does not pass by `L_chosen`; `[v * M]`, from this worker's pool
    /// ([`crate::scratch`]), given back on drop.
    uppers: Vec<f32>,
    /// Per column `j < v`: the element's error as the judge measures it
    /// (`Exact::error`), measured once in the first pass (NaN where `U` is
    /// NaN; after [`RowScreen::sweep`], NaN where not screened); `[v]`,
    /// from this worker's pool.
    errors: Vec<f64>,
    /// Per column `j < v` where `errors` is not NaN: the element's
    /// [`Exact::ulp_exponent`] in the candidates' dtype, so that the sweep
    /// measures its ulps without reading `exact` again (0 elsewhere);
    /// `[v]`, from this worker's pool.
    ulp_exps: Vec<i16>,
    /// The statistical threshold's lane (`None`: every element's threshold
    /// is computed).
    stat: Option<StatLane>,
}

/// The statistical threshold's lane of a [`RowScreen`] (module docs).
struct StatLane {
    /// Per column `j < v`: `L_s` rounded down to f32, NaN where pass 1
    /// found the element not screenable; from this worker's pool.
    lowers: Vec<f32>,
    /// `min(1, T_s) (1 - 2^-52)`: an element with `err <= L_s` times it
    /// (rounded) has `err <= L_s min(1, T_s)` (NaN: none).
    t: f64,
}

/// What the statistical lane reads: the threshold's row bounds (one
/// model, [`crate::tolerance::StatisticalBounds::as_models`]) and their
/// gradient row constants.
pub(super) type StatParts<'s, 'r> = (&'s [RowBounds<'r>; 1], &'s GradRow<1>);

impl<const M: usize> Drop for RowScreen<M> {
    fn drop(&mut self) {
        if let Some(s) = self.stat.take() {
            crate::scratch::give(s.lowers);
        }
        crate::scratch::give(std::mem::take(&mut self.uppers));
        crate::scratch::give(std::mem::take(&mut self.errors));
        crate::scratch::give(std::mem::take(&mut self.ulp_exps));
    }
}

/// `x` rounded up to f32 (NaN stays NaN).
fn up_f32(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) < x {
        if f.to_bits() < f32::INFINITY.to_bits() {
            // `+0 <= f < inf`: the next f32 up is the next bit pattern.
            f32::from_bits(f.to_bits() + 1)
        } else {
            f.next_up()
        }
    } else {
        f
    }
}

/// The candidate's error as the judge measures it (`None` unless finite).
#[inline(always)]
fn error_of(exact: &Exact, candidate: f64) -> Option<f64> {
    if !candidate.is_finite() {
        return None;
    }
    let e = exact.error(candidate);
    e.is_finite().then_some(e)
}

/// `U_m` of one element, `None` unless it passes by `L_chosen`.
fn ratio_uppers<const M: usize>(err: f64, lower: &[f64; M]) -> Option<[f64; M]> {
    if !(err <= lower[0]) {
        return None;
    }
    let mut u = [0.0; M];
    for (u, &l) in u.iter_mut().zip(lower) {
        *u = if err == 0.0 {
            0.0
        } else if l > 0.0 {
            err / l
        } else {
            return None;
        };
    }
    Some(u)
}

/// `x >= 0` rounded down to f32 (branch-free: `f > x >= 0` only for a
/// positive `f`, whose next f32 down is the previous bit pattern).
#[inline(always)]
fn down_f32(x: f64) -> f32 {
    let f = x as f32;
    f32::from_bits(f.to_bits() - u32::from(f64::from(f) > x))
}

/// [`ratio_uppers`] rounded up to f32 ([`up_f32`]), the same values;
/// four models in one AVX2 vector when `lanes`.
#[cfg(test)]
fn uppers_f32<const M: usize>(err: f64, lower: &[f64; M], lanes: bool) -> Option<[f32; M]> {
    #[cfg(target_arch = "x86_64")]
    if lanes && M == 4 {
        let l: &[f64; 4] = lower[..].try_into().ok()?;
        // SAFETY: `lanes` only where AVX2 is present (`simd::available`).
        let u = unsafe { x86::uppers4(err, logprobe_reference::simd::x86::load(l)) }?;
        return Some(std::array::from_fn(|i| u[i]));
    }
    let _ = lanes;
    ratio_uppers(err, lower).map(|u| u.map(up_f32))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::ratio_uppers`] rounded up to f32 ([`super::up_f32`]) for
    /// four models, one per lane of `l`: the same values.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn uppers4(err: f64, l: __m256d) -> Option<[f32; 4]> {
        if !(err <= _mm256_cvtsd_f64(l)) {
            return None;
        }
        if err == 0.0 {
            return Some([0.0; 4]);
        }
        let pos = _mm256_cmp_pd::<_CMP_GT_OQ>(l, _mm256_setzero_pd());
        if _mm256_movemask_pd(pos) != 0b1111 {
            return None;
        }
        let u = _mm256_div_pd(_mm256_set1_pd(err), l);
        let f = _mm256_cvtpd_ps(u);
        // Lanes that rounded down (f < u; u is positive, never NaN here:
        // f is below +inf there) take the next f32 up, the next bit pattern.
        let below = _mm256_castpd_si256(_mm256_cmp_pd::<_CMP_LT_OQ>(_mm256_cvtps_pd(f), u));
        let low = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
            below,
            _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6),
        ));
        let up = _mm_castsi128_ps(_mm_sub_epi32(_mm_castps_si128(f), low));
        let mut out = [0.0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), up);
        Some(out)
    }

    /// Whether `f64::from(u[m]) <= t[m]` for the four models (NaN: false),
    /// in one vector.
    ///
    /// # Safety
    /// The CPU has AVX2; `u` and `t` hold four items each.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn under4(u: &[f32], t: &[f64]) -> bool {
        let u = _mm256_cvtps_pd(_mm_loadu_ps(u.as_ptr()));
        let t = _mm256_loadu_pd(t.as_ptr());
        _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_LE_OQ>(u, t)) == 0b1111
    }

    /// [`super::RowScreen::sweep`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2; `M == 4`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sweep<const M: usize>(
        s: &mut super::RowScreen<M>,
        out: &mut super::Screened,
    ) {
        s.sweep_with::<true>(out);
    }

    /// [`super::pass1`] with the four-lane models, compiled for AVX2 (the
    /// whole walk, so that the lanes inline).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn pass1<const M: usize>(p: &mut super::Pass1<'_, '_, '_, M>) {
        super::pass1::<M, true>(p);
    }
}

/// What pass 1 reads and writes.
struct Pass1<'a, 'r, 'c, const M: usize> {
    screen: &'a GradScreen<M>,
    all: &'a [RowBounds<'r>; M],
    cot: &'a GradCotangents<'c>,
    exact: ArrayView1<'a, Exact>,
    candidates: ArrayView1<'a, f64>,
    v: usize,
    keep: usize,
    dtype: Dtype,
    uppers: &'a mut Vec<f32>,
    errors: &'a mut Vec<f64>,
    ulp_exps: &'a mut Vec<i16>,
    top0: Vec<(f64, usize)>,
    top: [Vec<(f64, usize)>; M],
    /// The statistical lane's screen and its `L_s` per column.
    stat: Option<(&'a GradScreen<1>, &'a mut Vec<f32>)>,
}

/// Pass 1 over columns `j < v`: each element's error and `U`, and the
/// candidates for seeds. `LANES`: the four-lane models (`M == 4`, AVX2
/// only: [`x86::pass1`]).
#[inline(always)]
fn pass1<const M: usize, const LANES: bool>(p: &mut Pass1<'_, '_, '_, M>) {
    for j in 0..p.v {
        let eu = error_of(&p.exact[j], p.candidates[j]).and_then(|err| {
            let l = p.screen.leaves(p.all, j, p.cot)?;
            let us = match &p.stat {
                Some((s, _)) => down_f32(s.lower_of(&l)[0]),
                None => f32::NAN,
            };
            #[cfg(target_arch = "x86_64")]
            if LANES && M == 4 {
                // SAFETY: `LANES` only from `x86::pass1` (AVX2), `M == 4`.
                let u = unsafe { x86::uppers4(err, p.screen.lower4(&l)) }?;
                return Some((err, std::array::from_fn(|i| u[i % 4]), us));
            }
            let u = ratio_uppers(err, &p.screen.lower_of(&l))?;
            Some((err, u.map(up_f32), us))
        });
        let Some((err, u, us)) = eu else {
            p.uppers.extend([f32::NAN; M]);
            p.errors.push(f64::NAN);
            p.ulp_exps.push(0);
            if let Some((_, su)) = p.stat.as_mut() {
                su.push(f32::NAN);
            }
            continue;
        };
        if let Some((_, su)) = p.stat.as_mut() {
            su.push(us);
        }
        p.uppers.extend(u);
        p.errors.push(err);
        // In `min_subnormal_exp ..= max_exp` of a dtype: fits an i16.
        p.ulp_exps
            .push(p.exact[j].ulp_exponent(p.dtype).clamp(-1100, 1100) as i16);
    }
    // The seeds' candidates, ranked by the f32 uppers (any ranking is
    // sound), offered in column order. An element goes to a list only if it
    // beats the list's threshold (its last value once full, `-inf` before;
    // NaN, not screenable, beats none): the lists `offer` alone would keep.
    let n0 = p.keep + EXTRA_SEEDS;
    let mut th0 = threshold(&p.top0, n0);
    let mut th = [f32::NEG_INFINITY; M];
    for (j, u) in p.uppers.chunks_exact(M).enumerate() {
        let hit = u.iter().zip(&th).fold(u[0] > th0, |h, (u, t)| h | (u > t));
        if !hit {
            continue;
        }
        if u[0] > th0 {
            offer(&mut p.top0, n0, f64::from(u[0]), j);
            th0 = threshold(&p.top0, n0);
        }
        for ((top, t), &u) in p.top.iter_mut().zip(&mut th).zip(u) {
            if u > *t {
                offer(top, SEEDS_PER_MODEL, f64::from(u), j);
                *t = threshold(top, SEEDS_PER_MODEL);
            }
        }
    }
}

impl StatLane {
    /// The lane from pass 1's `L_s` (`lowers`) and `T_s`, the largest
    /// `error / threshold` of the screen's `seeds` as
    /// `OutputAcc::observe_statistical` measures it (`errors`: pass 1's).
    /// The seeds are not screened, so each is judged in full.
    fn new(
        lowers: Vec<f32>,
        (one, row): StatParts<'_, '_>,
        cot: &GradCotangents<'_>,
        (dtype, seeds): (Dtype, &[usize]),
        errors: &[f64],
    ) -> StatLane {
        let mut t = f64::NEG_INFINITY;
        for &s in seeds {
            let err = errors.get(s).copied().unwrap_or(f64::NAN);
            let [b] = RowBounds::grad_many_with(one, row, s, cot, dtype);
            let r = match b {
                tolerance::ErrorBound::Abs(b) if b > 0.0 => err / b,
                tolerance::ErrorBound::Abs(_) if err == 0.0 => 0.0,
                _ => f64::NAN,
            };
            t = if r.is_nan() || t.is_nan() {
                f64::NAN
            } else {
                t.max(r)
            };
        }
        StatLane {
            lowers,
            t: if t.is_nan() {
                f64::NAN
            } else {
                t.min(1.0) * (1.0 - f64::EPSILON)
            },
        }
    }
}

/// The value an f32 upper must exceed to enter `top` (kept at `n`):
/// its last once full (an f32 value, exactly), `-inf` before.
fn threshold(top: &[(f64, usize)], n: usize) -> f32 {
    match top.last() {
        Some(&(v, _)) if top.len() >= n => v as f32,
        _ => f32::NEG_INFINITY,
    }
}

/// Keeps the `n` largest `(value, col)` (ties: the earlier column).
fn offer(top: &mut Vec<(f64, usize)>, n: usize, value: f64, col: usize) {
    if top.len() == n && top.last().is_some_and(|&(v, _)| !(value > v)) {
        return;
    }
    let at = top.partition_point(|&(v, _)| v >= value);
    top.insert(at, (value, col));
    top.truncate(n);
}

impl<const M: usize> RowScreen<M> {
    /// The screen of a row's gradient elements `j < v` (`exact`, `candidates`:
    /// the row's `[V_total]` values, candidates of `dtype`), with `keep`
    /// worst elements reported, and the statistical threshold's lane when
    /// `stat` gives its bounds and their screen holds on this one's leaves
    /// ([`GradScreen::admits`]); `None` when nothing can be screened.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        all: &[RowBounds<'_>; M],
        row: &GradRow<M>,
        cot: &GradCotangents<'_>,
        exact: ArrayView1<'_, Exact>,
        candidates: ArrayView1<'_, f64>,
        dtype: Dtype,
        (v, keep): (usize, usize),
        stat: Option<StatParts<'_, '_>>,
    ) -> Option<Self> {
        let screen = RowBounds::grad_screen(all, row, cot)?;
        let stat_screen = stat.and_then(|(one, row1)| {
            RowBounds::grad_screen(one, row1, cot).filter(|s| s.admits(&screen))
        });
        let mut stat_uppers: Vec<f32> = Vec::new();
        if stat_screen.is_some() {
            stat_uppers = crate::scratch::take();
            stat_uppers.reserve(v);
        }
        let v = v.min(exact.len()).min(candidates.len());
        // Pass 1: the elements of largest U, per model.
        let mut uppers = crate::scratch::take();
        uppers.reserve(v * M);
        let mut errors = crate::scratch::take();
        errors.reserve(v);
        let mut ulp_exps = crate::scratch::take();
        ulp_exps.reserve(v);
        let mut p = Pass1 {
            screen: &screen,
            all,
            cot,
            exact: exact.view(),
            candidates: candidates.view(),
            v,
            keep,
            dtype,
            uppers: &mut uppers,
            errors: &mut errors,
            ulp_exps: &mut ulp_exps,
            top0: Vec::new(),
            top: std::array::from_fn(|_| Vec::new()),
            stat: stat_screen.as_ref().map(|s| (s, &mut stat_uppers)),
        };
        #[cfg(target_arch = "x86_64")]
        let lanes = M == 4 && logprobe_reference::simd::available();
        #[cfg(not(target_arch = "x86_64"))]
        let lanes = false;
        if lanes {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 is present (`simd::available`).
            unsafe {
                x86::pass1(&mut p)
            };
        } else {
            pass1::<M, false>(&mut p);
        }
        let (top0, top) = (p.top0, p.top);
        let mut seeds: Vec<usize> = top0
            .iter()
            .chain(top.iter().flatten())
            .map(|&(_, j)| j)
            .collect();
        seeds.sort_unstable();
        seeds.dedup();
        // The seeds' exact ratios, as the judge computes them.
        let mut t_max = [f64::NEG_INFINITY; M];
        let mut chosen = Vec::with_capacity(seeds.len());
        let mut zero_after = usize::MAX;
        for &s in &seeds {
            let bounds = RowBounds::grad_many_with(all, row, s, cot, dtype);
            let j = tolerance::judge(&exact[s], candidates[s], dtype, &bounds[0]);
            for (i, (t, b)) in t_max.iter_mut().zip(&bounds).enumerate() {
                let r = if i == 0 {
                    j.ratio
                } else {
                    tolerance::ratio_pass(j.error_abs, b).0
                };
                if let Some(r) = r {
                    *t = if r.is_nan() || t.is_nan() {
                        f64::NAN
                    } else {
                        t.max(r)
                    };
                }
            }
            if let Some(r) = j.ratio {
                chosen.push(r);
                if keep > 0 && chosen.len() == keep {
                    // Seeds ascend: this is the `keep`-th in column order.
                    zero_after = s;
                }
            }
        }
        let t_keep = if keep == 0 {
            f64::INFINITY
        } else if chosen.iter().any(|r| r.is_nan()) || chosen.len() < keep {
            f64::NEG_INFINITY
        } else {
            chosen.sort_by(|a, b| b.total_cmp(a));
            chosen[keep - 1]
        };
        let stat = match (stat, stat_screen.is_some()) {
            (Some(parts), true) => Some(StatLane::new(
                stat_uppers,
                parts,
                cot,
                (dtype, &seeds),
                &errors,
            )),
            _ => {
                crate::scratch::give(stat_uppers);
                None
            }
        };
        Some(RowScreen {
            t_max,
            t_keep,
            zero_after,
            seeds,
            uppers,
            errors,
            ulp_exps,
            stat,
        })
    }

    /// Whether the statistical threshold of gradient element `j` need not
    /// be computed (module docs): it is within it and its ratio is at most
    /// a seed's (false without the lane, or where the lane did not decide).
    #[inline]
    pub(super) fn stat_screened(&self, j: usize) -> bool {
        match (&self.stat, self.screened_error(j)) {
            (Some(s), Some(err)) => s.lowers.get(j).is_some_and(|&l| err <= f64::from(l) * s.t),
            _ => false,
        }
    }

    /// Decides every element once: which are screened (then
    /// [`RowScreen::screened_error`]), and their count and error maxima, each
    /// error the judge's (`Exact::error` of the element's exact value and
    /// candidate as given to [`RowScreen::new`], kept from its first pass)
    /// and its ulps in the candidates' dtype ([`Exact::ulps_of_error`]: the
    /// error over `2^k`, `k` kept from the first pass). Call once, before
    /// asking [`RowScreen::screened_error`].
    pub(super) fn sweep(&mut self) -> Screened {
        let mut out = Screened {
            count: 0,
            max_abs: 0.0,
            max_ulps: 0.0,
        };
        #[cfg(target_arch = "x86_64")]
        if M == 4 && logprobe_reference::simd::available() {
            // SAFETY: AVX2 is present (`simd::available`), `M == 4`.
            unsafe { x86::sweep(self, &mut out) };
            return out;
        }
        self.sweep_with::<false>(&mut out);
        out
    }

    /// [`RowScreen::sweep`]'s walk; `LANES`: the four models' comparisons
    /// in one vector (`M == 4`, AVX2 only: [`x86::sweep`]), the same
    /// decisions.
    #[inline(always)]
    fn sweep_with<const LANES: bool>(&mut self, out: &mut Screened) {
        let mut seeds = self.seeds.iter().copied().peekable();
        let n = self.errors.len().min(self.ulp_exps.len());
        self.uppers.truncate(n * M);
        for j in 0..n {
            if seeds.next_if_eq(&j).is_some() {
                self.errors[j] = f64::NAN;
                continue;
            }
            let u = &self.uppers[j * M..(j + 1) * M];
            // NaN (not screenable) fails every comparison.
            let under = {
                #[cfg(target_arch = "x86_64")]
                if LANES && M == 4 {
                    // SAFETY: `LANES` only from `x86::sweep` (AVX2), four
                    // f32 at `u`.
                    unsafe { x86::under4(u, &self.t_max[..]) }
                } else {
                    u.iter().zip(&self.t_max).all(|(&u, &t)| f64::from(u) <= t)
                }
                #[cfg(not(target_arch = "x86_64"))]
                u.iter().zip(&self.t_max).all(|(&u, &t)| f64::from(u) <= t)
            };
            let ranked_out =
                f64::from(u[0]) < self.t_keep || (j > self.zero_after && self.errors[j] == 0.0);
            if !(under && ranked_out) {
                self.errors[j] = f64::NAN;
                continue;
            }
            let err = self.errors[j];
            out.count += 1;
            out.max_abs = max_nan(out.max_abs, err);
            // `Exact::ulps_of_error`: exact division by a power of two (0
            // stays 0).
            let ulps = err / pow2(i32::from(self.ulp_exps[j]));
            out.max_ulps = max_nan(out.max_ulps, ulps);
        }
        self.errors.truncate(n);
    }

    /// The error of gradient element `j` when it is screened (after
    /// [`RowScreen::sweep`]; `None` where it needs its exact bounds).
    #[inline]
    pub(super) fn screened_error(&self, j: usize) -> Option<f64> {
        self.errors.get(j).copied().filter(|e| !e.is_nan())
    }
}

/// The screened elements of a row ([`RowScreen::sweep`]): how many, their
/// largest error and largest error in ulps (0 when none).
#[derive(Clone, Copy, Debug)]
pub(super) struct Screened {
    pub count: usize,
    pub max_abs: f64,
    pub max_ulps: f64,
}

/// The larger of `a` and `b`, NaN when either is.
fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use logprobe_reference::splitmix::SplitMix64;

    /// The four-lane uppers are the scalar ones, bit for bit (errors and
    /// lower bounds over many binades, ties, zeros, non-positive bounds).
    #[test]
    fn four_lane_uppers_equal_the_scalar_uppers() {
        if !logprobe_reference::simd::available() {
            return;
        }
        let mut g = SplitMix64::new(5);
        let mag = |g: &mut SplitMix64| 10f64.powf(g.uniform_in(-320.0, 30.0));
        for i in 0..200_000 {
            let l0 = mag(&mut g);
            let err = match i % 5 {
                0 => 0.0,
                1 => l0,
                2 => l0 * 2.0,
                _ => l0 * g.uniform(),
            };
            let mut l = [l0, mag(&mut g), mag(&mut g), mag(&mut g)];
            if i % 97 == 0 {
                l[1 + i % 3] = if i % 2 == 0 { 0.0 } else { -1.0 };
            }
            let (v, s) = (uppers_f32(err, &l, true), uppers_f32(err, &l, false));
            let bits = |u: Option<[f32; 4]>| u.map(|u| u.map(f32::to_bits));
            assert_eq!(bits(v), bits(s), "err {err:e} l {l:?}");
        }
    }

    /// The sweep's four-lane comparison is the scalar one (NaN, infinities,
    /// ties, values one f32 step either side of the threshold).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn four_lane_comparison_equals_the_scalar_comparison() {
        if !logprobe_reference::simd::available() {
            return;
        }
        let mut g = SplitMix64::new(11);
        for i in 0..200_000 {
            let t: [f64; 4] = std::array::from_fn(|_| 10f64.powf(g.uniform_in(-50.0, 30.0)));
            // A third of the thresholds are f32 values (exact ties).
            let t = t.map(|t| if i % 3 == 0 { f64::from(t as f32) } else { t });
            let u: [f32; 4] = std::array::from_fn(|m| {
                let x = t[m] as f32;
                match (i + m) % 7 {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => x.next_up(),
                    3 => x.next_down(),
                    4 => 0.0,
                    _ => x,
                }
            });
            let scalar = u.iter().zip(&t).all(|(&u, &t)| f64::from(u) <= t);
            // SAFETY: AVX2 is present (checked above); four items each.
            let lanes = unsafe { x86::under4(&u, &t) };
            assert_eq!(lanes, scalar, "u {u:?} t {t:?}");
        }
    }
}
