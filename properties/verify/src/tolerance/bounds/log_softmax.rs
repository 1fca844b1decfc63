//! The log-prob / entropy family: log-prob (T7-T8), entropy (T11-T13),
//! the token's rank (T26) and the entropy sums over the row (T4 for the
//! entropy set, T11-T13).

use super::*;

impl RowBounds<'_> {
    /// The bound of the family's statistic `stat` for a candidate in
    /// `out` (the family's arm of [`RowBounds::bound`]): the log-prob
    /// ([`RowBounds::log_prob`]), the entropy ([`RowBounds::entropy`]),
    /// the token's rank ([`RowBounds::token_rank`], a count: `out` plays
    /// no part).
    pub(super) fn row_stat(&self, stat: RowStat, targets: &RowTargets, out: Dtype) -> ErrorBound {
        match stat {
            RowStat::LogProb => self.log_prob(out),
            RowStat::Entropy => self.entropy(out),
            RowStat::Rank => self.token_rank(targets.token),
        }
    }

    /// Bound (nats) on `|log_prob^ - log_prob|` for a candidate in `out`
    /// (T7-T8): `A = a |d_t| + b + delta_ell` (raw kernels:
    /// `t_T (Z + |d_t|) + err(lse)`), then the final roundings.
    pub fn log_prob(&self, out: Dtype) -> ErrorBound {
        match self.stats.d_t {
            Some(d_t) => self.shifted_log_prob(&d_t, out, "log_prob"),
            None => ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "d_t (no target)",
                },
            },
        }
    }
}

impl RowBounds<'_> {
    /// One-sided bound on `token_ranks` (T26): how many more entries a
    /// kernel may count than the exact rank. A kernel ranks the log-probs
    /// it computed in the accumulation dtype, each within `e_j` of the
    /// exact one (T7-T8 at `d_j`, rounded to the accumulation dtype), by
    /// the same monotone steps for every entry of the row, so it never
    /// counts fewer entries than the exact rank and counts an entry below
    /// the token only when their log-probs may meet: `d_t - d_j <= e_t +
    /// e_j`. The bound is the number of such entries (entries whose
    /// enclosures overlap the token's are counted too, exact ties excepted:
    /// an upper bound).
    pub fn token_rank(&self, token: Option<usize>) -> ErrorBound {
        let (Some(t), Some(d_t)) = (token, self.stats.d_t) else {
            return ErrorBound::None {
                reason: NoBound::MissingStatistic {
                    what: "d_t (no target)",
                },
            };
        };
        let e = |d: &Interval| self.shifted_log_prob(d, self.c.acc, "token_ranks");
        let e_t = match e(&d_t) {
            ErrorBound::Abs(b) => Hi(b),
            other => return other,
        };
        // (T26) `e_j` grows with `|d_j|`: the row's most negative finite
        // `d` bounds every entry's, a cheap screen before the exact `e_j`.
        let far = self
            .stats
            .d
            .iter()
            .map(|d| d.lo)
            .filter(|lo| lo.is_finite())
            .fold(d_t.lo, f64::min);
        let e_far = match e(&Interval { lo: far, hi: far }) {
            ErrorBound::Abs(b) => Hi(b),
            other => return other,
        };
        let reach = (e_t + e_far).0;
        let mut extra = 0usize;
        for (j, d) in self.stats.d.iter().enumerate() {
            // `-inf` log-probs never meet a finite one; an entry surely
            // above the token is in the exact rank already.
            if j == t || d.hi == f64::NEG_INFINITY || d.lo > d_t.hi {
                continue;
            }
            // An exact tie (both `d` exact and equal: `T = 1`, or a power
            // of two) is in the exact rank too.
            if d.lo == d.hi && d_t.lo == d_t.hi && d.lo == d_t.lo {
                continue;
            }
            // The gap `d_t - d_j` at its low end, rounded down.
            let g = d_t.lo - d.hi;
            let gap = g - g.abs() * f64::EPSILON;
            if gap > reach {
                continue;
            }
            match e(d) {
                ErrorBound::Abs(b) if gap <= (e_t + Hi(b)).0 => extra += 1,
                ErrorBound::Abs(_) => {}
                other => return other,
            }
        }
        ErrorBound::Upward(extra as f64)
    }

    pub(super) fn shifted_log_prob(
        &self,
        d: &Interval,
        out: Dtype,
        what: &'static str,
    ) -> ErrorBound {
        let set = match &self.p {
            Ok(s) => s,
            Err(e) => return ErrorBound::None { reason: e.clone() },
        };
        let d_abs = mag(d);
        let pre = self.c.lp_err_pre(set, d_abs);
        self.c.finish(pre, d_abs + Hi(set.ln_s.hi), out, what)
    }

    /// Bound (nats) on `|entropy^ - entropy|` for a candidate in `out`
    /// (T11-T13 per the model's [`EntropyForm`], then the final roundings).
    pub fn entropy(&self, out: Dtype) -> ErrorBound {
        match (&self.w, &self.entropy_pre) {
            (Ok(ws), Ok(pre)) => {
                self.c
                    .finish(*pre, Hi(ws.ln_s.hi) + Hi(self.stats.r.hi), out, "entropy")
            }
            (Err(e), _) | (_, Err(e)) => ErrorBound::None { reason: e.clone() },
        }
    }
}

/// The model-independent per-entry sums over `w` (T4 for the entropy set,
/// T11), and `e^lw` of every finite entry for the log-softmax walk.
pub(super) struct EntropyShared {
    pub(super) set: SetSums,
    pub(super) e2: Hi,
    pub(super) fl2: Hi,
    pub(super) sd: Hi,
    /// `e^lw_j` (upward) of the finite entries (or groups), in order.
    pub(super) ew: Vec<Hi>,
}

pub(super) fn entropy_shared(c: &Consts, st: &RowStats, entries: Entries<'_>) -> EntropyShared {
    match entries {
        Entries::All(_) => entropy_shared_all(c, st),
        Entries::Groups(_) => entropy_shared_groups(c, st, entries),
    }
}

/// One lane's share of [`EntropyShared`]'s sums over every entry
/// ([`entropy_shared_all`]): the entries `j` with `j % 4` its lane.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntropyPart {
    pub e1: Hi,
    pub fl: Hi,
    pub e2: Hi,
    pub fl2: Hi,
    pub sd: Hi,
}

impl EntropyPart {
    pub(super) const ZERO: EntropyPart = EntropyPart {
        e1: Hi::ZERO,
        fl: Hi::ZERO,
        e2: Hi::ZERO,
        fl2: Hi::ZERO,
        sd: Hi::ZERO,
    };
}

/// [`entropy_shared`] entry by entry (no groups): `e^lw_j` of every
/// finite entry first (one libm `exp` each), then the sums in four
/// partial sums, entry `j` into part `j % 4`, added as `(p0 + p1) + (p2 +
/// p3)` (upward: any order bounds the sum from above). The parts come
/// from [`lanes::entropy4`] (four entries a vector, the same bits) when
/// the CPU has the lanes; `expm1(alpha_j)` from [`ExpM1Base::exp_m1`] at
/// the base `b` (T3's `alpha_j = a |d_j| + b >= b`).
pub(super) fn entropy_shared_all(c: &Consts, st: &RowStats) -> EntropyShared {
    entropy_all(c, &st.e, st.ln_s_w.lo)
}

/// [`entropy_shared_all`] over the shifts `es` `[V]` of a set with `ln S
/// >= ln_s_lo` (also [`set_sums`]' `E1`, `F` of any set, entry by entry).
pub(super) fn entropy_all(c: &Consts, es: &[Interval], ln_s_lo: f64) -> EntropyShared {
    let ew: Vec<Hi> = es
        .iter()
        .filter(|e| e.hi != f64::NEG_INFINITY)
        .map(|e| (Hi(e.hi) - Lo(ln_s_lo)).exp())
        .collect();
    let base = ExpM1Base::new(c.b);
    let mut parts = [EntropyPart::ZERO; 4];
    let (from, i) = lanes::entropy4(c, es, ln_s_lo, &ew, &base, &mut parts).unwrap_or((0, 0));
    entropy_parts(c, es, ln_s_lo, &ew, &base, from, i, &mut parts);
    let sum =
        |f: fn(&EntropyPart) -> Hi| (f(&parts[0]) + f(&parts[1])) + (f(&parts[2]) + f(&parts[3]));
    EntropyShared {
        set: SetSums {
            e1: sum(|p| p.e1),
            fl: sum(|p| p.fl),
            n_fin: ew.len(),
        },
        e2: sum(|p| p.e2),
        fl2: sum(|p| p.fl2),
        sd: sum(|p| p.sd),
        ew,
    }
}

/// The entries `j >= from` of [`entropy_all`] into `parts`, `i`
/// the index in `ew` of the first finite one.
#[allow(clippy::too_many_arguments)]
pub(super) fn entropy_parts(
    c: &Consts,
    es: &[Interval],
    ln_s_lo: f64,
    ew: &[Hi],
    base: &ExpM1Base,
    from: usize,
    mut i: usize,
    parts: &mut [EntropyPart; 4],
) {
    let ln_s_lo = Lo(ln_s_lo);
    for (j, e) in es.iter().enumerate().skip(from) {
        if e.hi == f64::NEG_INFINITY {
            continue;
        }
        let elw = ew[i];
        i += 1;
        let d_abs = mag(e);
        let lw = Hi(e.hi) - ln_s_lo;
        let alpha = c.a * d_abs + c.b;
        // w_expm1(lw, alpha), with e^lw computed once.
        let wm = if alpha.0 <= 1.0 {
            elw * base.exp_m1(alpha)
        } else {
            (lw + alpha).exp()
        };
        let p = &mut parts[j % 4];
        p.e1 = p.e1 + wm;
        p.e2 = p.e2 + d_abs * wm;
        p.sd = p.sd + d_abs;
        if (Hi(e.hi) + alpha).0 < c.ln_min_normal {
            let we = (lw + alpha).exp();
            p.fl = p.fl + we;
            p.fl2 = p.fl2 + d_abs * we;
        }
    }
}

/// [`entropy_shared`] over groups of equal entries, one term a group
/// times its size.
pub(super) fn entropy_shared_groups(
    c: &Consts,
    st: &RowStats,
    entries: Entries<'_>,
) -> EntropyShared {
    let ln_s = st.ln_s_w;
    let (mut e1, mut fl, mut e2, mut fl2, mut sd) =
        (Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO, Hi::ZERO);
    let mut ew = Vec::with_capacity(st.e.len());
    let mut n_fin = 0usize;
    for (j, k) in entries.iter() {
        let e = &st.e[j];
        if e.hi == f64::NEG_INFINITY {
            continue;
        }
        n_fin += k as usize;
        let d_abs = mag(e);
        let lw = Hi(e.hi) - Lo(ln_s.lo);
        let alpha = c.a * d_abs + c.b;
        let elw = lw.exp();
        ew.push(elw);
        // w_expm1(lw, alpha), with e^lw computed once.
        let wm = if alpha.0 <= 1.0 {
            elw * alpha.exp_m1()
        } else {
            (lw + alpha).exp()
        };
        e1 = e1 + times(k, wm);
        e2 = e2 + times(k, d_abs * wm);
        sd = sd + times(k, d_abs);
        if (Hi(e.hi) + alpha).0 < c.ln_min_normal {
            let we = (lw + alpha).exp();
            fl = fl + times(k, we);
            fl2 = fl2 + times(k, d_abs * we);
        }
    }
    EntropyShared {
        set: SetSums { e1, fl, n_fin },
        e2,
        fl2,
        sd,
        ew,
    }
}

/// The log-softmax entropy sums (T12, T13) of one model.
#[derive(Clone, Copy, Debug)]
pub(super) struct LsSums {
    pub(super) s_dem: Hi,
    pub(super) s_em: Hi,
    pub(super) s_lam: Hi,
    pub(super) fl_d: Hi,
    pub(super) fl_1: Hi,
    pub(super) sdl: Hi,
}

impl LsSums {
    pub(super) const ZERO: LsSums = LsSums {
        s_dem: Hi::ZERO,
        s_em: Hi::ZERO,
        s_lam: Hi::ZERO,
        fl_d: Hi::ZERO,
        fl_1: Hi::ZERO,
        sdl: Hi::ZERO,
    };
}

/// A model's `lambda_j` on set `w` (T9) as `k |d_j| + b`, for the
/// entropy walks: `lambda_j = (a_lp |d_j| + b_lp + lse_err)(1 + u) + u
/// (|d_j| + ln S)` ([`Consts::lambda`]) is affine in `|d_j|` with nonnegative coefficients, so
/// `k >= a_lp (1 + u) + u` and `b >= (b_lp + lse_err)(1 + u) + u ln S`,
/// each rounded up once a row, give an upper bound in two upward
/// operations an entry (never below [`Consts::lambda`]'s real value).
#[derive(Clone, Copy, Debug)]
pub(super) struct LambdaAffine {
    pub(super) k: Hi,
    pub(super) b: Hi,
}

impl LambdaAffine {
    pub(super) fn new(c: &Consts, w: &SetBounds) -> LambdaAffine {
        let one_u = Hi::ONE + c.u;
        LambdaAffine {
            k: c.a_lp * one_u + c.u,
            b: (c.b_lp + w.lse_err) * one_u + c.u * Hi(w.ln_s.hi),
        }
    }

    /// `lambda_j` of an entry with `|d_j| <= d_abs`, rounded up.
    #[inline]
    pub(super) fn at(&self, d_abs: Hi) -> Hi {
        self.k * d_abs + self.b
    }

    /// The base for [`ExpM1Base::exp_m1`]: `b`, which every [`Self::at`]
    /// is at least (the upward operations are monotone, `|d| >= 0`).
    pub(super) fn base(&self) -> ExpM1Base {
        ExpM1Base::new(self.b)
    }
}

/// One walk over `w` for every model's [`LsSums`] (models without a
/// bound for `w` get zeros, unused). Entry by entry (no groups): the
/// plain entries through the row's moments ([`moments`], (T12m)), the
/// others one by one, four models at a time in one vector's lanes where
/// the CPU has them ([`lanes::sums4`], the same bits).
pub(super) fn logsoftmax_sums(
    cs: &[Consts],
    ws: &[Result<SetBounds, NoBound>],
    st: &RowStats,
    sh: &EntropyShared,
    entries: Entries<'_>,
) -> Vec<LsSums> {
    let ell = Hi(st.ln_s_w.hi);
    let affs: Vec<Option<(LambdaAffine, ExpM1Base)>> = cs
        .iter()
        .zip(ws)
        .map(|(c, w)| {
            let a = LambdaAffine::new(c, w.as_ref().ok()?);
            Some((a, a.base()))
        })
        .collect();
    let Entries::All(_) = entries else {
        let mut out = vec![LsSums::ZERO; cs.len()];
        let mut i = 0usize;
        for (j, k) in entries.iter() {
            let e = &st.e[j];
            if e.hi == f64::NEG_INFINITY {
                continue;
            }
            let elw = sh.ew[i];
            i += 1;
            for ((c, o), aff) in cs.iter().zip(out.iter_mut()).zip(&affs) {
                if let Some((aff, base)) = aff {
                    entry_terms(o, c, aff, base, st, e, elw, k);
                }
            }
        }
        return out;
    };
    // Each model's cut of its own ([`moments::PlainCut::of`]), one walk of
    // the row a distinct cut: a model's sums do not depend on the models
    // it is built with (the same bits as built alone).
    let cuts: Vec<Option<moments::PlainCut>> = affs
        .iter()
        .zip(cs)
        .map(|(a, c)| a.map(|(a, b)| moments::PlainCut::of(&(a, b, c.ln_min_normal), ell.0)))
        .collect();
    // (cut, its moments, its exceptions `(j, i)`)
    type Walk = (moments::PlainCut, moments::Moments, Vec<(usize, usize)>);
    let mut walks: Vec<Walk> = Vec::new();
    for cut in cuts.iter().flatten() {
        if !walks.iter().any(|w| w.0.same(cut)) {
            let mut exc = Vec::new();
            let mo = moments::moments(st, &sh.ew, *cut, &mut exc);
            walks.push((*cut, mo, exc));
        }
    }
    let walk_of = |i: usize| {
        let cut = cuts[i].as_ref()?;
        walks.iter().find(|w| w.0.same(cut))
    };
    let per = entries_one_by_one(cs, ws, &affs, st, &sh.ew, |i| {
        walk_of(i).map_or(&[][..], |w| &w.2[..])
    });
    let mut out = vec![LsSums::ZERO; cs.len()];
    for (i, (o, x)) in out.iter_mut().zip(per).enumerate() {
        let (Some((aff, base)), Some((_, mo, exc))) = (&affs[i], walk_of(i)) else {
            continue;
        };
        *o = if mo.is_empty() {
            x
        } else if exc.is_empty() {
            mo.sums(aff, base, ell)
        } else {
            let m = mo.sums(aff, base, ell);
            // Plain entries add exactly 0 to the flush sums.
            LsSums {
                s_dem: m.s_dem + x.s_dem,
                s_em: m.s_em + x.s_em,
                s_lam: m.s_lam + x.s_lam,
                fl_d: x.fl_d,
                fl_1: x.fl_1,
                sdl: m.sdl + x.sdl,
            }
        };
    }
    out
}

/// Each model's (with a bound for `w`) [`LsSums`] over the finite
/// entries `at(model)` (`(j, i)`: column `j`, `ew[i]` its `e^lw`), entry by
/// entry: four models a vector where the CPU has the lanes and the models
/// of a chunk share their list ([`lanes::sums4`], the same bits as one by
/// one). Zeros for the other models.
pub(super) fn entries_one_by_one<'x>(
    cs: &[Consts],
    ws: &[Result<SetBounds, NoBound>],
    affs: &[Option<(LambdaAffine, ExpM1Base)>],
    st: &RowStats,
    ew: &[Hi],
    at: impl Fn(usize) -> &'x [(usize, usize)],
) -> Vec<LsSums> {
    let mut per = vec![LsSums::ZERO; cs.len()];
    let idx: Vec<usize> = (0..cs.len())
        .filter(|&i| affs[i].is_some() && !at(i).is_empty())
        .collect();
    // Chunks of up to four models with the same list.
    let mut chunks: Vec<Vec<usize>> = Vec::new();
    for &i in &idx {
        match chunks
            .iter_mut()
            .find(|c| c.len() < 4 && std::ptr::eq(at(c[0]), at(i)))
        {
            Some(c) => c.push(i),
            None => chunks.push(vec![i]),
        }
    }
    for chunk in chunks {
        let list = at(chunk[0]);
        let c4: Vec<&Consts> = chunk.iter().map(|&i| &cs[i]).collect();
        let w4: Vec<SetBounds> = chunk
            .iter()
            .filter_map(|&i| ws[i].as_ref().ok().copied())
            .collect();
        if let Some(l) = lanes::sums4(&c4, &w4, st, ew, list) {
            for (&i, s) in chunk.iter().zip(l) {
                per[i] = s;
            }
            continue;
        }
        for &(j, i) in list {
            for &m in &chunk {
                if let Some((aff, base)) = &affs[m] {
                    entry_terms(&mut per[m], &cs[m], aff, base, st, &st.e[j], ew[i], 1);
                }
            }
        }
    }
    per
}

/// Adds entry `e`'s terms (it stands for `k` equal ones; `elw` its
/// `e^lw`) to one model's [`LsSums`] `o`: the entry-by-entry walk of
/// (T12), (T13).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) fn entry_terms(
    o: &mut LsSums,
    c: &Consts,
    aff: &LambdaAffine,
    base: &ExpM1Base,
    st: &RowStats,
    e: &Interval,
    elw: Hi,
    k: u32,
) {
    let ell = Hi(st.ln_s_w.hi);
    let d_abs = mag(e);
    let lw = Hi(e.hi) - Lo(st.ln_s_w.lo);
    let dl = d_abs + ell;
    let lam = aff.at(d_abs);
    let (wl, wel) = if lam.0 <= 1.0 {
        let em = base.exp_m1(lam);
        (elw * em, elw * (Hi::ONE + em))
    } else {
        ((lw + lam).exp(), (lw + lam).exp())
    };
    o.s_dem = o.s_dem + times(k, dl * wl);
    o.s_em = o.s_em + times(k, wl);
    o.s_lam = o.s_lam + times(k, wel * lam);
    o.sdl = if k == 1 {
        o.sdl + (dl + lam)
    } else {
        o.sdl + times(k, dl + lam)
    };
    if (lw + lam).0 < c.ln_min_normal {
        o.fl_d = o.fl_d + times(k, dl * wel);
        o.fl_1 = o.fl_1 + times(k, wel);
    }
}

/// Entropy errors (T11-T13): the one the model's form needs before the
/// final rounding, and the one a gradient may see. One model's case of
/// the shared walks ([`entropy_shared`], [`logsoftmax_sums`]): the same
/// bits as that model's bounds built together with others.
pub(super) fn entropy_errors(
    c: &Consts,
    model: &Model,
    st: &RowStats,
    ws: &SetBounds,
) -> (Result<Hi, NoBound>, Result<Hi, NoBound>) {
    let entries = Entries::All(st.e.len());
    let sh = entropy_shared(c, st, entries);
    let ls = logsoftmax_sums(std::slice::from_ref(c), &[Ok(*ws)], st, &sh, entries);
    entropy_finish(c, model, st, ws, &sh, &ls[0])
}

/// [`entropy_errors`] from the shared and per-model sums.
pub(super) fn entropy_finish(
    c: &Consts,
    model: &Model,
    st: &RowStats,
    ws: &SetBounds,
    sh: &EntropyShared,
    ls: &LsSums,
) -> (Result<Hi, NoBound>, Result<Hi, NoBound>) {
    let r_hi = Hi(st.r.hi);
    let ell = Hi(ws.ln_s.hi);
    let h_hi = r_hi + ell;
    let SetSums { e1, fl, n_fin } = sh.set;
    let (e2, fl2, sd) = (sh.e2, sh.fl2, sh.sd);
    let LsSums {
        s_dem,
        s_em,
        s_lam,
        fl_d,
        fl_1,
        sdl,
    } = *ls;
    let n = Hi(n_fin as f64);
    // (T11) fused: Delta R_B, then E_R = [R (2u + u^2 + theta) + Delta R_B (1+u)^2] / (1 - theta).
    let fused = c.k_b.clone().and_then(|k_b| {
        let kb1 = k_b * (Hi::ONE + c.a);
        let floor_b =
            n * Hi((c.n_b + 3) as f64) * c.eta + c.eta_sub * k_b * ((Hi::ONE + c.a) * sd + n * c.b);
        let dr_b =
            kb1 * (e2 + fl2) + (kb1 - Lo(1.0)) * r_hi + k_b * c.b * (Hi::ONE + e1 + fl) + floor_b;
        let u2 = (Hi::ONE + c.u) * (Hi::ONE + c.u);
        let e_r = (r_hi * ((u2 - Lo(1.0)) + ws.theta_s) + dr_b * u2) / (Lo(1.0) - ws.theta_s);
        let pre = match c.shift {
            Shift::Raw => {
                let omega = c.omega.clone()?;
                let mu_abs = c.z * (Hi::ONE + omega) + r_hi + e_r;
                ws.lse_err + c.z * omega + e_r + half_ulp(c.acc, mu_abs)
            }
            _ => ws.delta_ell + e_r,
        };
        finite(pre, "entropy (fused form)")
    });
    // (T12) log-softmax form, and (T13) its `lp + 1` variant for gradients.
    let logsoftmax = c.k_p.clone().and_then(|(k_p, k_p1)| {
        let floor = |k: usize, extra: Hi| {
            n * Hi((c.n_p + k) as f64) * c.eta + c.eta_sub * k_p1 * (sdl + extra)
        };
        let dh = k_p * (s_dem + fl_d) + (k_p - Lo(1.0)) * h_hi + k_p * s_lam + floor(3, Hi::ZERO);
        let dh1 = k_p1 * (s_dem + s_em + fl_d + fl_1)
            + (k_p1 - Lo(1.0)) * (h_hi + Hi::ONE)
            + k_p1 * s_lam
            + floor(4, n);
        Ok((
            finite(dh, "entropy (log-softmax form)")?,
            finite(dh1, "entropy (autograd form)")?,
        ))
    });
    let pre = match model.entropy_form {
        EntropyForm::Fused => fused.clone(),
        EntropyForm::LogSoftmax => logsoftmax.clone().map(|(dh, _)| dh),
        EntropyForm::Any => fused.clone().and_then(|f| Ok(f.max(logsoftmax.clone()?.0))),
    };
    let any = fused.and_then(|f| {
        let (dh, dh1) = logsoftmax?;
        let a = f.max(dh);
        Ok((a + half_ulp(c.acc, h_hi + a)).max(dh1))
    });
    (pre, any)
}
