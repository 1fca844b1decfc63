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
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    /// `sum mid_i c_i` in f64.
    s: f64,
    /// `sum |mid_i c_i|`.
    a: f64,
    /// `sum rad_i |c_i|`.
    r: f64,
    /// `sum E_i |c_i|` per model.
    e: [f64; 4],
    /// Terms.
    n: usize,
}

impl Sums {
    #[inline]
    fn add(&mut self, mid: f64, rad: f32, err: &[f32; 4], c: f64) {
        let p = mid * c;
        let ac = c.abs();
        self.s += p;
        self.a += p.abs();
        self.r += f64::from(rad) * ac;
        for (e, &x) in self.e.iter_mut().zip(err) {
            *e += f64::from(x) * ac;
        }
        self.n += 1;
    }

    /// The exact value's enclosure (`s` within `gamma_{n+1}(u_64) a` of
    /// `sum mid c`, itself within `r` of the exact), rounded to `out`,
    /// and each model's bound (T30) for a kernel summing `k` terms in
    /// `acc` and rounding to `out`.
    fn judge_inputs(&self, k: usize, acc: Dtype, out: Dtype) -> (Exact, [ErrorBound; 4]) {
        let up = 1.0 + gamma(self.n + 2, f64::EPSILON / 2.0);
        let rad = (gamma(self.n + 1, f64::EPSILON / 2.0) * self.a * up + self.r * up) * up;
        let enc = Interval {
            lo: self.s - rad,
            hi: self.s + rad,
        };
        let (rlo, rhi) = (out.round_f64(enc.lo), out.round_f64(enc.hi));
        let exact = Exact::new(enc, out.round_f64(self.s), rlo == rhi);
        let g = gamma(k, 2.0 * acc.unit_roundoff());
        let mag = self.s.abs() + rad;
        let bounds = self.e.map(|e| {
            let e = e * up;
            // Products that underflow the accumulation dtype: half its
            // smallest subnormal each.
            let eta = k as f64 * 0.5 * acc.ulp(0.0);
            let pre = (e + g * (self.a * up + self.r * up + e) + eta) * up;
            // The rounding to a dtype narrower than the accumulation's.
            let fin = if out.precision() < acc.precision() {
                0.5 * out.ulp(mag + pre)
            } else {
                0.0
            };
            let b = (pre + fin) * up;
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
}

/// Judges `sums[k]` against candidate row `cand` (`[width]`), element by
/// element, into `acc`.
#[allow(clippy::too_many_arguments)]
fn judge_row(
    acc: &mut OutputAcc,
    row: usize,
    sums: &[Sums],
    cand: &[f64],
    terms: usize,
    acc_dtype: Dtype,
    out: Dtype,
    keep: usize,
) {
    for (k, (s, &c)) in sums.iter().zip(cand).enumerate() {
        let (exact, bounds) = s.judge_inputs(terms, acc_dtype, out);
        if acc.absorbs(&exact, c, out, &bounds) {
            acc.count += 1;
            continue;
        }
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
            let mut sums = vec![Sums::default(); h];
            let mut wj = vec![0.0; h];
            for j in 0..vt {
                let (m, r, e) = (gr.mid[j], gr.rad[j], &gr.err[j]);
                if m == 0.0 && r == 0.0 && e.iter().all(|&v| v == 0.0) {
                    // An exactly-zero gradient with no error: no term (a
                    // kernel adds 0 or skips it; the count below is V).
                    continue;
                }
                decode_floats_into(
                    w.dtype,
                    &w.data[j * h * width..(j + 1) * h * width],
                    &mut wj,
                );
                for (s, &c) in sums.iter_mut().zip(&wj) {
                    s.add(m, r, e, c);
                }
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
    let n = x.rows.len();
    (0..cand.rows)
        .into_par_iter()
        .map(|j| {
            let mut sums = vec![Sums::default(); hidden.cols];
            for (gr, hn) in x.rows.iter().zip(&h) {
                let (m, r, e) = (gr.mid[j], gr.rad[j], &gr.err[j]);
                for (s, &c) in sums.iter_mut().zip(hn) {
                    s.add(m, r, e, c);
                }
            }
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
    let sums: Vec<Sums> = (0..cand.cols)
        .map(|j| {
            let mut s = Sums::default();
            for gr in x.rows {
                s.add(gr.mid[j], gr.rad[j], &gr.err[j], 1.0);
            }
            s
        })
        .collect();
    let mut acc = OutputAcc::new();
    judge_row(&mut acc, 0, &sums, &c, n + 1, x.acc, cand.dtype, x.keep);
    acc
}

/// `a` and `b` merged, `keep` worst elements kept.
fn merged(mut a: OutputAcc, b: OutputAcc, keep: usize) -> OutputAcc {
    a.merge(b, keep);
    a
}
