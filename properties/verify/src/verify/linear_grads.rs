//! The LM head's gradients of a fused linear + loss dump (issue 45,
//! TOLERANCE.md (T30)): `grad_hidden [N, H]`, `grad_lm_head_weight [V, H]`
//! and `grad_lm_head_bias [V]`, judged after the rows from each row's
//! gradient with respect to its logits (the oracle's enclosures, and the
//! grad-logits element bound of every model, [`LinearGradRow`]).
//!
//! With `g_nj` the exact gradient of row `n`'s loss with respect to the
//! logit `x_nj`: `grad_hidden[n, k] = sum_j g_nj W_jk`,
//! `grad_lm_head_weight[j, k] = sum_n g_nj h_nk`, `grad_lm_head_bias[j] =
//! sum_n g_nj`. The oracle sums in f64 with an a posteriori error bound
//! (every term's magnitude is summed beside it); the kernel's error is
//! its `g^_nj`'s (T14-T28, with (T29)'s perturbation and the rounding to
//! the dtype it keeps the logits' gradient in) carried through the sum,
//! plus the sum's own rounding in the accumulation dtype in any order
//! (one ulp per addition), plus the rounding to the candidate's dtype.

use logprobe_reference::oracle::{Exact, Interval};
use logprobe_reference::spec::Dtype;
use rayon::prelude::*;

use crate::dump::{decode_floats_into, Dump, FloatMatrix};
use crate::names::tensor;
use crate::tolerance::{ErrorBound, NoBound};

use super::acc::{output_report, OutputAcc};
use super::engine::judge4;
use super::*;

/// One row's gradient with respect to its logits, for the LM head's
/// gradients: the oracle's enclosure as midpoint and radius, and the
/// kernel's element bound `E_j` under `[chosen, tree, lanes=8,
/// sequential]` (`inf` where a model gives none), `[V_total]` each.
#[derive(Clone, Debug)]
pub(super) struct LinearGradRow {
    /// The dump's row.
    pub(super) row: usize,
    /// Midpoints of the enclosures of `g_j`.
    pub(super) mid: Vec<f64>,
    /// Radii (rounded up).
    pub(super) rad: Vec<f32>,
    /// `E_j` per model (rounded up).
    pub(super) err: Vec<[f32; 4]>,
}

impl LinearGradRow {
    /// From the oracle's enclosures `g` and each column's bounds.
    pub(super) fn new(row: usize, g: &[Exact], bounds: impl Fn(usize) -> [ErrorBound; 4]) -> Self {
        let mut mid = Vec::with_capacity(g.len());
        let mut rad = Vec::with_capacity(g.len());
        let mut err = Vec::with_capacity(g.len());
        for (j, e) in g.iter().enumerate() {
            let Interval { lo, hi } = e.enclosure;
            let m = lo / 2.0 + hi / 2.0;
            let r = (hi - m).max(m - lo) * (1.0 + 4.0 * f64::EPSILON);
            mid.push(m);
            rad.push(up_f32(r));
            err.push(bounds(j).map(|b| match b {
                ErrorBound::Abs(x) => up_f32(x),
                _ => f32::INFINITY,
            }));
        }
        LinearGradRow { row, mid, rad, err }
    }
}

/// `x` as an f32 at least as large (NaN as infinity).
fn up_f32(x: f64) -> f32 {
    let f = x as f32;
    if x.is_nan() {
        f32::INFINITY
    } else if f64::from(f) < x {
        f32::from_bits(f.to_bits() + 1)
    } else {
        f
    }
}

/// `gamma_n` at unit roundoff `u`, rounded up (`inf` when `n u >= 1/2`).
pub(super) fn gamma(n: usize, u: f64) -> f64 {
    let nu = n as f64 * u;
    if nu >= 0.5 {
        f64::INFINITY
    } else {
        nu / (1.0 - nu) * (1.0 + 8.0 * f64::EPSILON)
    }
}

/// The sums of one gradient element over its terms `g_i c_i` (`c` an
/// exact input: a weight or a hidden entry).
#[derive(Clone, Copy, Debug)]
struct Sums {
    /// `sum mid_i c_i` in f64.
    s: f64,
    /// `sum |mid_i c_i|`.
    a: f64,
    /// `sum rad_i |c_i|`.
    r: f64,
    /// `sum E_i |c_i|` per model.
    e: [f64; 4],
}

impl Sums {
    /// The exact value's enclosure (`s` within `gamma_{n+1}(u_64) a` of
    /// `sum mid c`, itself within `r` of the exact), rounded to `out`,
    /// and each model's bound (T30) for a kernel summing `k` terms in
    /// `acc` and rounding to `out` (`c`: [`SumConsts::new`]`(n, k,
    /// acc)`, `n` the terms summed).
    fn judge_inputs(&self, c: &SumConsts, acc: Dtype, out: Dtype) -> (Exact, [ErrorBound; 4]) {
        let (enc, b) = self.raw(c, acc, out);
        let (rlo, rhi) = (out.round_f64(enc.lo), out.round_f64(enc.hi));
        let exact = Exact::new(enc, out.round_f64(self.s), rlo == rhi);
        let bounds = b.map(|b| {
            if b.is_finite() {
                ErrorBound::Abs(b)
            } else {
                ErrorBound::None {
                    reason: NoBound::NonFinite {
                        what: "the LM head gradient's bound",
                    },
                }
            }
        });
        (exact, bounds)
    }

    /// [`Sums::judge_inputs`]' numbers: the exact value's enclosure and
    /// each model's bound (maybe not finite), with no rounding to `out`
    /// and no enum: what [`OutputAcc::absorbs_raw`] takes.
    #[inline(always)]
    fn raw(&self, c: &SumConsts, acc: Dtype, out: Dtype) -> (Interval, [f64; 4]) {
        let SumConsts { up, g1, g, eta } = *c;
        let rad = (g1 * self.a * up + self.r * up) * up;
        let enc = Interval {
            lo: self.s - rad,
            hi: self.s + rad,
        };
        let mag = self.s.abs() + rad;
        let narrow = out.precision() < acc.precision();
        let mut b = [0.0; 4];
        for (b, &e) in b.iter_mut().zip(&self.e) {
            let e = e * up;
            let pre = (e + g * (self.a * up + self.r * up + e) + eta) * up;
            // The rounding to a dtype narrower than the accumulation's.
            let fin = if narrow {
                0.5 * out.ulp(mag + pre)
            } else {
                0.0
            };
            *b = (pre + fin) * up;
        }
        (enc, b)
    }
}

/// What [`Sums::judge_inputs`] takes from the counts alone: the same for
/// every element of a row of sums.
#[derive(Clone, Copy, Debug)]
struct SumConsts {
    /// `1 + gamma_{n+2}(u_64)`.
    up: f64,
    /// `gamma_{n+1}(u_64)`.
    g1: f64,
    /// `gamma_k(2 u_acc)`.
    g: f64,
    /// Products that underflow the accumulation dtype: half its smallest
    /// subnormal each, `k` of them.
    eta: f64,
}

impl SumConsts {
    fn new(n: usize, k: usize, acc: Dtype) -> Self {
        SumConsts {
            up: 1.0 + gamma(n + 2, f64::EPSILON / 2.0),
            g1: gamma(n + 1, f64::EPSILON / 2.0),
            g: gamma(k, 2.0 * acc.unit_roundoff()),
            eta: k as f64 * 0.5 * acc.ulp(0.0),
        }
    }
}

/// Adds term `t` with inputs `c` to the sums `acc[field][lane]`.
#[inline(always)]
fn term_lanes<const W: usize>(acc: &mut [[f64; W]; 7], t: &Term, c: &[f64; W]) {
    for i in 0..W {
        let p = t.mid * c[i];
        let ac = c[i].abs();
        acc[0][i] += p;
        acc[1][i] += p.abs();
        acc[2][i] += t.rad * ac;
        acc[3][i] += t.err[0] * ac;
        acc[4][i] += t.err[1] * ac;
        acc[5][i] += t.err[2] * ac;
        acc[6][i] += t.err[3] * ac;
    }
}

/// One term of [`RowSums::add_terms`]: a gradient's midpoint, radius and
/// per-model bounds (f32 values widened exactly).
#[derive(Clone, Copy, Debug)]
struct Term {
    mid: f64,
    rad: f64,
    err: [f64; 4],
}

impl Term {
    fn new(mid: f64, rad: f32, err: &[f32; 4]) -> Self {
        Term {
            mid,
            rad: f64::from(rad),
            err: err.map(f64::from),
        }
    }
}

/// A row of [`Sums`] over `len` elements as arrays (one per field), so the
/// loop over a row of exact inputs runs over lanes; the same operations,
/// in the same order, per element, as a scalar sum of `mid c` would.
struct RowSums {
    s: Vec<f64>,
    a: Vec<f64>,
    r: Vec<f64>,
    e: [Vec<f64>; 4],
    n: usize,
}

impl RowSums {
    fn new(len: usize) -> Self {
        let z = || vec![0.0; len];
        RowSums {
            s: z(),
            a: z(),
            r: z(),
            e: [z(), z(), z(), z()],
            n: 0,
        }
    }

    /// Adds, for every element `k`, the terms `t` of `terms` with exact
    /// inputs `cols[t][k]`, in term order: the same operations, in the
    /// same order, as a scalar sum per element, so the same bits. Runs over
    /// AVX-512 or AVX2 lanes where the CPU has them, eight elements at a
    /// time with the seven sums in registers across the terms.
    fn add_terms(&mut self, terms: &[Term], cols: &[&[f64]]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { x86::add_terms_avx512(self, terms, cols) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                return unsafe { x86::add_terms_avx2(self, terms, cols) };
            }
        }
        self.add_terms_lanes(terms, cols);
    }

    /// [`RowSums::add_terms`]'s loops, inlined into each compiled variant.
    #[inline(always)]
    fn add_terms_lanes(&mut self, terms: &[Term], cols: &[&[f64]]) {
        const L: usize = 8;
        let len = self.s.len();
        let mut k0 = 0;
        while k0 < len {
            let w = L.min(len - k0);
            let mut acc = [[0.0f64; L]; 7];
            for (i, a) in acc.iter_mut().enumerate() {
                let src = match i {
                    0 => &self.s,
                    1 => &self.a,
                    2 => &self.r,
                    _ => &self.e[i - 3],
                };
                a[..w].copy_from_slice(&src[k0..k0 + w]);
            }
            if w == L {
                // A whole group: a constant width, so the sums stay in registers.
                for (t, c) in terms.iter().zip(cols) {
                    let c: &[f64; L] = c[k0..k0 + L].try_into().expect("L entries");
                    term_lanes::<L>(&mut acc, t, c);
                }
            } else {
                // The last, partial group: lane by lane.
                for i in 0..w {
                    let mut one = [[0.0f64; 1]; 7];
                    for (o, a) in one.iter_mut().zip(&acc) {
                        o[0] = a[i];
                    }
                    for (t, c) in terms.iter().zip(cols) {
                        term_lanes::<1>(&mut one, t, &[c[k0 + i]]);
                    }
                    for (o, a) in one.iter().zip(acc.iter_mut()) {
                        a[i] = o[0];
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                let dst = match i {
                    0 => &mut self.s,
                    1 => &mut self.a,
                    2 => &mut self.r,
                    _ => &mut self.e[i - 3],
                };
                dst[k0..k0 + w].copy_from_slice(&a[..w]);
            }
            k0 += w;
        }
        self.n += terms.len();
    }

    /// Adds one term per element: `mid_k c_k` with radius `rad_k` and
    /// bounds `err_k` (the bias: every column's own gradient).
    fn add_columns(&mut self, mid: &[f64], rad: &[f32], err: &[[f32; 4]], c: &[f64]) {
        for k in 0..self.s.len() {
            let p = mid[k] * c[k];
            let ac = c[k].abs();
            self.s[k] += p;
            self.a[k] += p.abs();
            self.r[k] += f64::from(rad[k]) * ac;
            for (i, v) in self.e.iter_mut().enumerate() {
                v[k] += f64::from(err[k][i]) * ac;
            }
        }
        self.n += 1;
    }

    /// Element `k` as [`Sums`].
    fn get(&self, k: usize) -> Sums {
        Sums {
            s: self.s[k],
            a: self.a[k],
            r: self.r[k],
            e: [self.e[0][k], self.e[1][k], self.e[2][k], self.e[3][k]],
        }
    }
}

/// Judges `sums[k]` against candidate row `cand` (`[width]`), element by
/// element, into `acc`.
#[allow(clippy::too_many_arguments)]
fn judge_row(
    acc: &mut OutputAcc,
    row: usize,
    sums: &RowSums,
    cand: &[f64],
    terms: usize,
    acc_dtype: Dtype,
    out: Dtype,
    keep: usize,
) {
    let consts = SumConsts::new(sums.n, terms, acc_dtype);
    for (k, &c) in cand.iter().enumerate().take(sums.s.len()) {
        let sum = sums.get(k);
        // Most elements change nothing but the count: told from the raw
        // numbers, before the enclosure's roundings and the bounds' enums.
        let (enc, b) = sum.raw(&consts, acc_dtype, out);
        if b.iter().all(|x| x.is_finite()) && acc.absorbs_raw(enc, c, out, &b) {
            acc.count += 1;
            continue;
        }
        let (exact, bounds) = sum.judge_inputs(&consts, acc_dtype, out);
        if let (ErrorBound::None { reason }, None) = (&bounds[0], &acc.no_bound_reason) {
            acc.no_bound_reason = Some(reason.to_string());
        }
        let col = (cand.len() > 1 || k > 0).then_some(k);
        let (judged, _, refs) = judge4(row, col, c, &exact, out, &bounds);
        acc.push(judged, refs, keep);
    }
}

/// What the LM head's gradients need besides the rows.
pub(super) struct LinearGradInputs<'d, 'a> {
    /// The dump.
    pub(super) dump: &'d Dump<'a>,
    /// Every row's [`LinearGradRow`], in row order.
    pub(super) rows: &'d [LinearGradRow],
    /// Whether `rows` is every row of the dump (the weight and bias
    /// gradients sum over all of them).
    pub(super) all_rows: bool,
    /// The accumulation dtype of the kernel's sums.
    pub(super) acc: Dtype,
    /// Worst elements kept.
    pub(super) keep: usize,
}

/// The reports of the LM head's gradient candidates (T30), in the order
/// `grad_hidden`, `grad_lm_head_weight`, `grad_lm_head_bias`.
pub(super) fn judge_linear_grads(x: &LinearGradInputs<'_, '_>) -> Vec<OutputReport> {
    let (Some(lin), grads) = (x.dump.logits.linear(), &x.dump.linear_grads) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(c) = &grads.hidden {
        let mut acc = grad_hidden(x, &lin.weight, c);
        acc.trim(x.keep);
        out.push(output_report(tensor::GRAD_HIDDEN, c.dtype, acc));
    }
    for (name, cand) in [
        (tensor::GRAD_LM_HEAD_WEIGHT, &grads.weight),
        (tensor::GRAD_LM_HEAD_BIAS, &grads.bias),
    ] {
        let Some(c) = cand else { continue };
        let mut r = if x.all_rows {
            let mut acc = if name == tensor::GRAD_LM_HEAD_BIAS {
                grad_bias(x, c)
            } else {
                grad_weight(x, &lin.hidden, c)
            };
            acc.trim(x.keep);
            output_report(name, c.dtype, acc)
        } else {
            output_report(name, c.dtype, OutputAcc::new())
        };
        if !x.all_rows {
            r.nothing_checked = Some(format!(
                "{name} sums every row of the dump: checked only when every row is (no --rows, no row_mask)"
            ));
            r.verdict = ReportVerdict::Unchecked;
        }
        out.push(r);
    }
    out
}

/// `grad_hidden[n, k] = sum_j g_nj W_jk` (T30), row by row.
fn grad_hidden(
    x: &LinearGradInputs<'_, '_>,
    w: &FloatMatrix<'_>,
    cand: &FloatMatrix<'_>,
) -> OutputAcc {
    let (vt, h) = (w.rows, w.cols);
    let width = w.dtype.size_bytes();
    x.rows
        .par_iter()
        .map(|gr| {
            let mut sums = RowSums::new(h);
            // Blocks of up to BLOCK weight rows, decoded once per block.
            const BLOCK: usize = 64;
            let mut wbuf = vec![0.0; BLOCK * h];
            let mut terms = Vec::with_capacity(BLOCK);
            let mut j0 = 0;
            while j0 < vt {
                let j1 = (j0 + BLOCK).min(vt);
                terms.clear();
                for j in j0..j1 {
                    let (m, r, e) = (gr.mid[j], gr.rad[j], &gr.err[j]);
                    if m == 0.0 && r == 0.0 && e.iter().all(|&v| v == 0.0) {
                        // An exactly-zero gradient with no error: no term
                        // (a kernel adds 0 or skips it; the count below is V).
                        continue;
                    }
                    let t = terms.len();
                    decode_floats_into(
                        w.dtype,
                        &w.data[j * h * width..(j + 1) * h * width],
                        &mut wbuf[t * h..(t + 1) * h],
                    );
                    terms.push(Term::new(m, r, e));
                }
                let cols: Vec<&[f64]> = wbuf.chunks(h).take(terms.len()).collect();
                sums.add_terms(&terms, &cols);
                j0 = j1;
            }
            let mut acc = OutputAcc::new();
            let c = cand.row_f64(gr.row);
            judge_row(
                &mut acc,
                gr.row,
                &sums,
                &c,
                vt + 1,
                x.acc,
                cand.dtype,
                x.keep,
            );
            acc
        })
        .reduce(OutputAcc::new, |a, b| merged(a, b, x.keep))
}

/// `grad_lm_head_weight[j, k] = sum_n g_nj h_nk` (T30), column by column
/// of the rows' gradients.
fn grad_weight(
    x: &LinearGradInputs<'_, '_>,
    hidden: &FloatMatrix<'_>,
    cand: &FloatMatrix<'_>,
) -> OutputAcc {
    let h: Vec<Vec<f64>> = x.rows.iter().map(|gr| hidden.row_f64(gr.row)).collect();
    let cols: Vec<&[f64]> = h.iter().map(Vec::as_slice).collect();
    let n = x.rows.len();
    (0..cand.rows)
        .into_par_iter()
        .map(|j| {
            let mut sums = RowSums::new(hidden.cols);
            let terms: Vec<Term> = x
                .rows
                .iter()
                .map(|gr| Term::new(gr.mid[j], gr.rad[j], &gr.err[j]))
                .collect();
            sums.add_terms(&terms, &cols);
            let mut acc = OutputAcc::new();
            judge_row(
                &mut acc,
                j,
                &sums,
                &cand.row_f64(j),
                n + 1,
                x.acc,
                cand.dtype,
                x.keep,
            );
            acc
        })
        .reduce(OutputAcc::new, |a, b| merged(a, b, x.keep))
}

/// `grad_lm_head_bias[j] = sum_n g_nj` (T30).
fn grad_bias(x: &LinearGradInputs<'_, '_>, cand: &FloatMatrix<'_>) -> OutputAcc {
    let c = cand.row_f64(0);
    let n = x.rows.len();
    let mut sums = RowSums::new(cand.cols);
    let ones = vec![1.0; cand.cols];
    for gr in x.rows {
        // Row `n`'s terms over every column at once, `c = 1`.
        sums.add_columns(
            &gr.mid[..cand.cols],
            &gr.rad[..cand.cols],
            &gr.err[..cand.cols],
            &ones,
        );
    }
    let mut acc = OutputAcc::new();
    judge_row(&mut acc, 0, &sums, &c, n + 1, x.acc, cand.dtype, x.keep);
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{RowSums, Term};

    /// [`RowSums::add_terms`] compiled for AVX-512F.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn add_terms_avx512(s: &mut RowSums, terms: &[Term], cols: &[&[f64]]) {
        s.add_terms_lanes(terms, cols);
    }

    /// [`RowSums::add_terms`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn add_terms_avx2(s: &mut RowSums, terms: &[Term], cols: &[&[f64]]) {
        s.add_terms_lanes(terms, cols);
    }
}

/// `a` and `b` merged, `keep` worst elements kept.
fn merged(mut a: OutputAcc, b: OutputAcc, keep: usize) -> OutputAcc {
    a.merge(b, keep);
    a
}

#[cfg(test)]
mod tests {
    use super::{RowSums, Term};

    /// The lanes give the bits of a scalar sum per element, in term order,
    /// for widths that fill whole groups of eight and widths that do not.
    #[test]
    fn the_lanes_sum_as_a_scalar_loop_does() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        for len in [1usize, 7, 8, 9, 24, 37] {
            let terms: Vec<Term> = (0..13)
                .map(|_| {
                    let e = [next().abs() as f32, next().abs() as f32, 0.0, f32::INFINITY];
                    Term::new(next() * 1e3, next().abs() as f32 * 1e-6, &e)
                })
                .collect();
            let cols: Vec<Vec<f64>> = (0..13)
                .map(|_| (0..len).map(|_| next()).collect())
                .collect();
            let views: Vec<&[f64]> = cols.iter().map(Vec::as_slice).collect();
            let mut lanes = RowSums::new(len);
            lanes.add_terms(&terms[..5], &views[..5]);
            lanes.add_terms(&terms[5..], &views[5..]);
            assert_eq!(lanes.n, 13);
            for k in 0..len {
                let mut want = [0.0f64; 7];
                for (t, c) in terms.iter().zip(&cols) {
                    let p = t.mid * c[k];
                    let ac = c[k].abs();
                    want[0] += p;
                    want[1] += p.abs();
                    want[2] += t.rad * ac;
                    for m in 0..4 {
                        want[3 + m] += t.err[m] * ac;
                    }
                }
                let got = lanes.get(k);
                let got = [got.s, got.a, got.r, got.e[0], got.e[1], got.e[2], got.e[3]];
                for (g, w) in got.iter().zip(want) {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "len {len} element {k}: {got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}
