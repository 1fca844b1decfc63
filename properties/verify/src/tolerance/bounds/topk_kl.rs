//! Bounds of the top-k KL to a teacher, `forward_kl` and `reverse_kl`
//! ((T23), renormalised (T24), `properties/TOLERANCE.md`), from the row's
//! top-k log-prob bounds (T7) and the teacher's exact log-probs.
//!
//! The computation bounded: each student log-prob `lp^_k` in the
//! accumulation dtype (error `E_k`: (T7) plus its own rounding, (T8)'s
//! first half), the teacher's `a_k` rounded to it (`rho_k = |a_k -
//! RN_acc(a_k)|`, 0 for f32/bf16/f16 teachers under f32), per term one
//! `exp`, one subtraction, one product, and the K terms summed in any order
//! (`gamma_{K-1}`, Higham (4.4)); renormalised, the student's log-probs
//! first pass through `lp^_k - m^ - ln_1p(sum_{j != arg} e^{lp^_j - m^})`.

use logprobe_reference::spec::{Dtype, KlDirection};

use super::{finite, gamma, half_ulp, mag, ErrorBound, Hi, Lo, NoBound, RowBounds};

/// What the bound of one row's top-k KL needs besides the statistics:
/// the teacher's log-probs and whether the student is renormalised.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KlTarget {
    /// `a_k [K]`, exact (nats, `<= 0` or `-inf`).
    pub teacher: Vec<f64>,
    /// The student's log-probs renormalised over the K ids.
    pub renormalized: bool,
}

/// One student log-prob as the bound sees it: its exact enclosure `[lo,
/// hi]` (or, renormalised, an upper bound of its magnitude in `mag` with
/// `lo = -mag`, `hi = 0`) and the error `e` of the kernel's value.
#[derive(Clone, Copy, Debug)]
struct Student {
    lo: f64,
    hi: f64,
    e: Hi,
}

impl RowBounds<'_> {
    /// Bound (nats) on `|kl^ - kl|` of `output` (`forward_kl` or
    /// `reverse_kl`) for a candidate in `out` (T23, T24, then the final
    /// roundings T8). Exactly 0 when the exact value is `+inf` (a teacher
    /// entry of probability > 0 at a student zero, or the reverse): only
    /// `+inf` matches it.
    pub fn topk_kl(
        &self,
        dir: KlDirection,
        ids: &[usize],
        kl: Option<&KlTarget>,
        out: Dtype,
    ) -> ErrorBound {
        let Some(kl) = kl else {
            return ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "teacher_topk_log_probs",
                },
            };
        };
        match self.topk_kl_pre(dir, ids, kl) {
            Ok(None) => ErrorBound::Abs(0.0),
            Ok(Some((pre, v_abs))) => self.c.finish(pre, v_abs, out, dir.output().name()),
            Err(reason) => ErrorBound::None { reason },
        }
    }

    /// `(pre, |v|)`: the error before the final rounding and an upper
    /// bound of the value's magnitude; `None` for an exact `+inf`.
    fn topk_kl_pre(
        &self,
        dir: KlDirection,
        ids: &[usize],
        kl: &KlTarget,
    ) -> Result<Option<(Hi, Hi)>, NoBound> {
        let students = self.students(ids, kl)?;
        let acc = self.c.acc;
        let forward = match dir {
            KlDirection::Forward => true,
            KlDirection::Reverse => false,
        };
        let u = self.c.u;
        let (mut err, mut mag_sum, mut v_abs) = (Hi::ZERO, Hi::ZERO, Hi::ZERO);
        for (s, &a) in students.iter().zip(&kl.teacher) {
            let student_zero = s.hi == f64::NEG_INFINITY;
            let teacher_zero = a == f64::NEG_INFINITY;
            let (skip, infinite) = if forward {
                (teacher_zero, student_zero)
            } else {
                (student_zero, teacher_zero)
            };
            if skip {
                continue;
            }
            if infinite {
                return Ok(None);
            }
            // (T23) rho: the teacher's rounding to the accumulation dtype.
            let rho = Hi((a - acc.round_f64(a)).abs());
            let delta = Hi((a - s.lo).abs().max((a - s.hi).abs()).next_up());
            // The weight w (t_k = e^a or p_k = e^l), its argument's error
            // and the lower end of its argument (for the flush test).
            let (w, arg_err, arg_lo) = if forward {
                (Hi(a).exp(), rho, a)
            } else {
                (Hi(s.hi).exp(), s.e, s.lo - s.e.0)
            };
            let dev = self.weight_dev(w, arg_err, arg_lo);
            let inner = delta + rho + s.e;
            let d_max = inner * (Hi::ONE + u);
            let e_d = rho + s.e + u * inner;
            let w_max = w + dev;
            err = err + dev * d_max + w * e_d + u * w_max * d_max;
            mag_sum = mag_sum + w_max * d_max * (Hi::ONE + u);
            v_abs = v_abs + w * delta;
        }
        let g = self.c.acc_gamma(ids.len().saturating_sub(1))?;
        let pre = finite(err + g * mag_sum, dir.output().name())?;
        Ok(Some((pre, v_abs)))
    }

    /// The row's students at `ids` ((T7) and the value's own rounding in
    /// the accumulation dtype), renormalised (T24) when `kl` says so.
    fn students(&self, ids: &[usize], kl: &KlTarget) -> Result<Vec<Student>, NoBound> {
        let set = self.p.as_ref().map_err(Clone::clone)?;
        let ln_s = set.ln_s;
        let acc = self.c.acc;
        let mut students = Vec::with_capacity(ids.len());
        for &id in ids {
            let d = *self.stats.d.get(id).ok_or(NoBound::MissingStatistic {
                what: "d of a top-k id (out of range)",
            })?;
            if d.hi == f64::NEG_INFINITY {
                students.push(Student {
                    lo: f64::NEG_INFINITY,
                    hi: f64::NEG_INFINITY,
                    e: Hi::ZERO,
                });
                continue;
            }
            // (T7) and the value's own rounding in the accumulation dtype.
            let d_abs = mag(&d);
            let pre = self.c.lp_err_pre(set, d_abs);
            let l_abs = d_abs + Hi(ln_s.hi);
            let e = pre + half_ulp(acc, l_abs + pre);
            students.push(Student {
                lo: -l_abs.0,
                hi: (Hi(d.hi) - Lo(ln_s.lo)).0.min(0.0),
                e,
            });
        }
        if kl.renormalized {
            students = self.renormalized(&students)?;
        }
        Ok(students)
    }

    /// `|w^ - w|` for `w = e^y` computed as `exp(y^)` with `|y^ - y| <=
    /// arg_err` (T10's form): `w (expm1(arg_err) (1 + eps_exp) + eps_exp)
    /// + eta_sub`, plus `w` itself where the result may flush to zero.
    fn weight_dev(&self, w: Hi, arg_err: Hi, arg_lo: f64) -> Hi {
        let c = &self.c;
        let rel = arg_err.exp_m1() * (Hi::ONE + c.eps_exp) + c.eps_exp;
        let mut dev = w * rel + c.eta_sub;
        if arg_lo < c.ln_min_normal {
            dev = dev + w;
        }
        dev
    }

    /// (T24) The renormalised students `l'_k = l_k - ln sum_j e^{l_j}`
    /// with the kernel's errors through `y_k = lp^_k - m^` and the local
    /// normaliser: `|y_k| <= (max_j l_j - l_k) + 2 E_max`, `e_y = E_k +
    /// E_max + u (|y_k| + E_k + E_max)`, the sum's relative error `theta =
    /// (1 + max_j eps_y,j)(1 + gamma_{K-1}) - 1 + K (eta + eta_sub)
    /// (1 + gamma_{K-1})` (`S' >= 1`: the argmax's own term), `delta_ell' =
    /// -ln(1 - theta) + log_ulps ulp(ln K - ln(1 - theta))`, and `E'_k =
    /// e_y + delta_ell' + u (|y_k| + ln K + e_y + delta_ell')`;
    /// `|l'_k| <= |y_k| + ln K`, `l'_k <= l_k - max_j l_j`.
    fn renormalized(&self, s: &[Student]) -> Result<Vec<Student>, NoBound> {
        let c = &self.c;
        let u = c.u;
        let live: Vec<&Student> = s.iter().filter(|x| x.hi > f64::NEG_INFINITY).collect();
        let max_hi = live.iter().map(|x| x.hi).fold(f64::NEG_INFINITY, f64::max);
        let max_lo = live.iter().map(|x| x.lo).fold(f64::NEG_INFINITY, f64::max);
        let e_max = live.iter().map(|x| x.e).fold(Hi::ZERO, Hi::max);
        let k = Hi(s.len() as f64);
        let ln_k = Hi((s.len().max(1) as f64).ln()).max(Hi::ZERO) * (Hi::ONE + u);
        let g = self.c.acc_gamma(s.len().saturating_sub(1))?;
        let y_of = |x: &Student| Hi((max_hi - x.lo).next_up()) + Hi(2.0) * e_max;
        let ey_of = |x: &Student| {
            let y = y_of(x);
            x.e + e_max + u * (y + x.e + e_max)
        };
        let eps_y = live.iter().fold(Hi::ZERO, |m, x| {
            m.max(ey_of(x).exp_m1() * (Hi::ONE + c.eps_exp) + c.eps_exp)
        });
        let theta =
            (Hi::ONE + eps_y) * (Hi::ONE + g) - Lo(1.0) + k * (c.eta + c.eta_sub) * (Hi::ONE + g);
        if theta.0.is_nan() || theta.0 >= 1.0 {
            return Err(NoBound::SumUnbounded { theta: theta.0 });
        }
        let nl = theta.neg_ln_1m();
        let d_ell = nl + c.log_ulps * Hi(c.acc.ulp((ln_k + nl).0));
        Ok(s.iter()
            .map(|x| {
                if x.hi == f64::NEG_INFINITY {
                    return *x;
                }
                let y = y_of(x);
                let ey = ey_of(x);
                let e = ey + d_ell + u * (y + ln_k + ey + d_ell);
                Student {
                    lo: -(y + ln_k).0,
                    hi: (Hi(x.hi) - Lo(max_lo)).0.min(0.0),
                    e,
                }
            })
            .collect())
    }
}

/// One row's top-k KL cotangents for the gradient bound (T25), part of
/// [`super::GradCotangents`]: `g_f`, `g_r` (exact, f64; not both 0), the
/// ids `[K]` (validated: distinct, live, `< V`) and the teacher.
#[derive(Clone, Copy, Debug)]
pub struct KlGradCotangents<'c> {
    /// `grad_forward_kl[row]`.
    pub gf: f64,
    /// `grad_reverse_kl[row]`.
    pub gr: f64,
    /// `topk_ids[row]`, `[K]`.
    pub ids: &'c [usize],
    /// The teacher and the renormalisation.
    pub kl: &'c KlTarget,
}

/// The row constants of (T25) for one model: per id `(id_k, W_k,
/// delta_k)` with `W_k >= |w^_k|` (the kernel's top-k cotangent at the
/// id) and `delta_k >= |w^_k - w_k|`, and their sums.
#[derive(Clone, Debug)]
pub(crate) struct KlGradTerms {
    pub per_id: Vec<(usize, Hi, Hi)>,
    /// `sum_k W_k`.
    pub weight: Hi,
    /// `sum_k delta_k`.
    pub delta: Hi,
}

impl KlGradTerms {
    /// The error (T14) does not see at element `j`, before the division
    /// by `T`: `sum_k (w^_k - w_k)(1[j = id_k] - p_j)`, at most `delta_k`
    /// at `id_k` plus `p_j sum_k delta_k` (`p_j <= p_hi`).
    pub(crate) fn extra(&self, j: usize, p_hi: Hi) -> Hi {
        let at = self
            .per_id
            .iter()
            .filter(|&&(id, _, _)| id == j)
            .fold(Hi::ZERO, |s, &(_, _, d)| s + d);
        at + self.delta * p_hi
    }
}

/// `|fl(x) - x|` upward (exact inputs).
fn rounding_of(acc: Dtype, x: f64) -> Hi {
    let r = acc.round_f64(x);
    if r >= x {
        Hi(r) - Lo(x)
    } else {
        Hi(x) - Lo(r)
    }
}

impl RowBounds<'_> {
    /// (T25) The top-k KL's cotangents on the ids' log-probs as a kernel
    /// forms them (module `logprobe_kernels::topk_kl::topk_kl_slopes`'s
    /// operations, in any association): per id the gathered cotangent
    /// `c_k = -(g_f t_k) + g_r p_k (D_k + 1)` (`D_k = l_k - a_k`), then,
    /// renormalised, `w_k = c_k - q_k sum_i c_i`.
    ///
    /// # Errors
    /// [`NoBound::NonFinite`] for a reverse cotangent at an infinite
    /// reverse KL (refused before by the spec) or an overflow;
    /// [`NoBound::GammaUndefined`] when `K u >= 1`; the statistics' errors.
    pub(crate) fn kl_grad_terms(&self, kg: &KlGradCotangents<'_>) -> Result<KlGradTerms, NoBound> {
        let students = self.students(kg.ids, kg.kl)?;
        let c = &self.c;
        let (u, acc, eta) = (c.u, c.acc, c.eta + c.eta_sub);
        let gamma3 = gamma(3, u.0)?;
        let (gf_hat, gr_hat) = (
            Hi(acc.round_f64(kg.gf).abs()),
            Hi(acc.round_f64(kg.gr).abs()),
        );
        let (e_gf, e_gr) = (rounding_of(acc, kg.gf), rounding_of(acc, kg.gr));
        // (M_k, dc_k): |c^_k| and |c^_k - c_k|.
        let mut gathered = Vec::with_capacity(students.len());
        for (s, &a) in students.iter().zip(&kg.kl.teacher) {
            let (mut m, mut dc) = (Hi::ZERO, Hi::ZERO);
            let rho = rounding_of(acc, a);
            if kg.gf != 0.0 && a != f64::NEG_INFINITY {
                // fl(g^ exp(a^)): t's error (T23's dev), the product's rounding.
                let t = Hi(a).exp();
                let dev = self.weight_dev(t, rho, a);
                let tm = t + dev;
                m = m + gf_hat * tm * (Hi::ONE + u);
                dc = dc + e_gf * tm + Hi(kg.gf.abs()) * dev + u * gf_hat * tm + eta;
            }
            if kg.gr != 0.0 && s.hi > f64::NEG_INFINITY {
                if a == f64::NEG_INFINITY {
                    return Err(NoBound::NonFinite {
                        what: "grad_reverse_kl at an infinite reverse_kl",
                    });
                }
                // g^ p^ (D^ + 1) in three roundings: p^ = exp(lp^) (T23's
                // dev at exponent error E_k), D^ = fl(lp^ - a^) within e_D.
                let delta = Hi((a - s.lo).abs().max((a - s.hi).abs()).next_up());
                let e_d = rho + s.e + u * (delta + rho + s.e);
                let f = delta + e_d + Hi::ONE;
                let p = Hi(s.hi).exp();
                let dev = self.weight_dev(p, s.e, s.lo - s.e.0);
                let pm = p + dev;
                let mag = gr_hat * pm * f;
                dc = dc
                    + e_gr * pm * f
                    + Hi(kg.gr.abs()) * (dev * f + p * e_d)
                    + gamma3 * mag
                    + Hi(2.0) * eta;
                m = m + mag * (Hi::ONE + gamma3);
            }
            // The two terms' sum: one rounding more.
            dc = dc + u * m;
            m = m * (Hi::ONE + u);
            gathered.push((m, dc));
        }
        let mut per_id = Vec::with_capacity(students.len());
        if kg.kl.renormalized {
            // w^_k = fl(c^_k - fl(q^_k C^)), C^ any-order sum of the c^.
            let g = self.c.acc_gamma(students.len().saturating_sub(1))?;
            let (m_sum, dc_sum) = gathered
                .iter()
                .fold((Hi::ZERO, Hi::ZERO), |(a, b), &(m, d)| (a + m, b + d));
            let big_c = m_sum * (Hi::ONE + g);
            let d_c = dc_sum + g * m_sum;
            for ((s, &(m, dc)), &id) in students.iter().zip(&gathered).zip(kg.ids) {
                if s.hi == f64::NEG_INFINITY {
                    // q = 0 exactly, for the kernel too.
                    per_id.push((id, m, dc));
                    continue;
                }
                let q = Hi(s.hi).exp();
                let dev = self.weight_dev(q, s.e, s.lo - s.e.0);
                let qm = q + dev;
                let prod = qm * big_c * (Hi::ONE + u);
                let delta = dc + q * d_c + dev * big_c + u * qm * big_c + u * (m + prod) + eta;
                per_id.push((id, (m + prod) * (Hi::ONE + u), delta));
            }
        } else {
            for (&(m, dc), &id) in gathered.iter().zip(kg.ids) {
                per_id.push((id, m, dc));
            }
        }
        let weight = per_id.iter().fold(Hi::ZERO, |s, &(_, w, _)| s + w);
        let delta = per_id.iter().fold(Hi::ZERO, |s, &(_, _, d)| s + d);
        if !(weight.0.is_finite() && delta.0.is_finite()) {
            return Err(NoBound::NonFinite {
                what: "the top-k KL's cotangents",
            });
        }
        Ok(KlGradTerms {
            per_id,
            weight,
            delta,
        })
    }
}
