//! The constructors of [`RowBounds`]: one row's bounds under one model or
//! several at once (sharing the model-independent sums), and
//! [`DetachedBounds`], a row's bounds without its borrowed statistics.

use super::*;

impl<'a> RowBounds<'a> {
    /// [`RowBounds::new`] for several models of one row at once, with the
    /// same bounds: see [`RowBounds::new_shared`] (no statistical
    /// threshold, no grouping).
    pub fn new_all<const M: usize>(
        models: &[Model; M],
        stats: &'a RowStats,
        ctx: &RowContext,
    ) -> [RowBounds<'a>; M] {
        Self::new_shared(models, None, stats, ctx, None).0
    }

    /// The bounds of several models of one row, and optionally the
    /// statistical threshold of one more ([`Statistical::row_bounds`]),
    /// sharing their per-entry work. The terms that do not depend on the
    /// summation order (`e^lw`, `e^alpha - 1`, the fused entropy sums) are
    /// evaluated once for all models, the log-softmax entropy sums (T12,
    /// T13) of every model in one walk (per model only `e^lambda - 1`
    /// remains per entry), and the log-prob set's sums are those of the
    /// entropy set when the two sets are equal (no sampling mask).
    /// `e^(lw + lambda)` is bounded as `e^lw (1 + (e^lambda - 1))`
    /// (upward), which can differ from [`RowBounds::new`] in the last bits.
    ///
    /// `keys` `[V]` (optional) name each entry's logit (e.g. the raw bits
    /// of a bf16 logit and its mask bit, `< 2^17`): entries with the same
    /// key whose `d_j` and `e_j` are equal (checked) form one group, whose
    /// terms are evaluated once and multiplied by the group's size
    /// (upward); any key `>= 2^17`, mismatch or too many groups falls back
    /// to entry by entry. Models whose shift errors differ fall back to
    /// [`RowBounds::new`] one by one. Never panics.
    pub fn new_shared<const M: usize>(
        models: &[Model; M],
        statistical: Option<&Statistical>,
        stats: &'a RowStats,
        ctx: &RowContext,
        keys: Option<&[u32]>,
    ) -> ([RowBounds<'a>; M], Option<StatisticalBounds<'a>>) {
        let n = stats.d.len().max(stats.e.len());
        let mut all: Vec<(Model, Option<StatTerms>)> = models.iter().map(|m| (*m, None)).collect();
        if let Some(s) = statistical {
            all.push((
                s.model,
                Some(StatTerms {
                    c: s.row_c(n),
                    floor: s.floor,
                    floor_h: s.floor_h,
                }),
            ));
        }
        let cs: Vec<Consts> = all
            .iter()
            .map(|(m, c)| Consts::new(m, n, ctx, *c))
            .collect();
        let rbs: Vec<RowBounds<'a>> = if cs.iter().all(|c| c.same_shift(&cs[0])) && !cs.is_empty() {
            Self::shared(&all, cs, stats, keys)
        } else {
            all.iter()
                .map(|(m, c)| RowBounds::build(m, stats, ctx, *c))
                .collect()
        };
        let mut rbs = rbs.into_iter();
        let out: [RowBounds<'a>; M] = std::array::from_fn(|_| rbs.next().expect("M bounds"));
        (out, rbs.next().map(StatisticalBounds::from_bounds))
    }

    /// The shared walk of [`RowBounds::new_shared`] (all `cs` with the
    /// same shift errors).
    pub(super) fn shared(
        all: &[(Model, Option<StatTerms>)],
        cs: Vec<Consts>,
        stats: &'a RowStats,
        keys: Option<&[u32]>,
    ) -> Vec<RowBounds<'a>> {
        let c0 = &cs[0];
        let groups = keys.and_then(|k| group_entries(k, &stats.d, &stats.e));
        let entries = match &groups {
            Some(g) => Entries::Groups(g),
            None => Entries::All(stats.e.len()),
        };
        let mut shared = entropy_shared(c0, stats, entries);
        let same_sets = stats.ln_s == stats.ln_s_w && stats.d == stats.e;
        let sp = if same_sets {
            shared.set
        } else {
            let entries = match &groups {
                Some(g) => Entries::Groups(g),
                None => Entries::All(stats.d.len()),
            };
            set_sums(c0, &stats.d, stats.ln_s, entries)
        };
        let p: Vec<Result<SetBounds, NoBound>> = cs
            .iter()
            .zip(all)
            .map(|(c, (m, _))| set_finish(c, m.shift.log_probs_raw(), sp, stats.ln_s))
            .collect();
        let w: Vec<Result<SetBounds, NoBound>> = cs
            .iter()
            .zip(all)
            .map(|(c, (m, _))| set_finish(c, m.shift == Shift::Raw, shared.set, stats.ln_s_w))
            .collect();
        // A model equal to an earlier one (verify's chosen `lanes=8` is
        // also its reference `lanes=8`) has the same sums: walked once.
        let twin = twins(&cs, |c| format!("{:?}", c));
        let uniq: Vec<usize> = (0..cs.len()).filter(|&i| twin[i] == i).collect();
        let ls_uniq = logsoftmax_sums(
            &uniq.iter().map(|&i| cs[i].clone()).collect::<Vec<_>>(),
            &uniq.iter().map(|&i| w[i].clone()).collect::<Vec<_>>(),
            stats,
            &shared,
            entries,
        );
        let ls: Vec<LsSums> = twin
            .iter()
            .map(|t| ls_uniq[uniq.iter().position(|u| u == t).expect("a unique model")])
            .collect();
        // Entry by entry over finite entries with equal sets: `ew` is each
        // entry's `p^+` (GradShared::new's exp, the same operands).
        // (The sums above were `ew`'s last reader: moved, not copied.)
        let ep =
            (matches!(entries, Entries::All(_)) && same_sets && shared.ew.len() == stats.d.len())
                .then(|| std::sync::Arc::new(std::mem::take(&mut shared.ew)));
        let mut out = Vec::with_capacity(cs.len());
        for (i, (c, p)) in cs.into_iter().zip(p).enumerate() {
            let (entropy_pre, entropy_grad) = match &w[i] {
                Ok(ws) => entropy_finish(&c, &all[i].0, stats, ws, &shared, &ls[i]),
                Err(e) => (Err(e.clone()), Err(e.clone())),
            };
            out.push(RowBounds {
                stats,
                c,
                p,
                w: w[i].clone(),
                entropy_pre,
                entropy_grad,
                ep: ep.clone(),
            });
        }
        out
    }

    /// Bounds of the row described by `stats` (the oracle's
    /// [`logprobe_reference::oracle::Oracle::row_stats`]) under `model`.
    ///
    /// `V` for the summation presets is `stats.d.len()` (`p` and `q` are
    /// not read: they may be empty). Never panics: a
    /// model that certifies nothing (`n u >= 1`, `theta_S >= 1`, non-finite
    /// statistics) yields [`ErrorBound::None`] from the queries.
    pub fn new(model: &Model, stats: &'a RowStats, ctx: &RowContext) -> RowBounds<'a> {
        Self::build(model, stats, ctx, None)
    }

    /// What [`RowBounds::new`] computed (the O(V) part: `S`, `ln S`,
    /// entropy and gradient terms), without the borrow of the row's
    /// statistics, so a cache can keep it next to them and hand it to
    /// every kernel judged under the same model ([`DetachedBounds::attach`]).
    pub fn detach(self) -> DetachedBounds {
        DetachedBounds {
            stats: self.stats as *const RowStats as usize,
            fingerprint: stats_fingerprint(self.stats),
            c: self.c,
            p: self.p,
            w: self.w,
            entropy_pre: self.entropy_pre,
            entropy_grad: self.entropy_grad,
        }
    }
}

/// A row's [`RowBounds`] without its borrowed statistics
/// ([`RowBounds::detach`]): the same bounds, bit for bit, once attached
/// again to the very [`RowStats`] they were built from.
#[derive(Clone, Debug)]
pub struct DetachedBounds {
    /// Address of the statistics they were built from (identity only).
    pub(super) stats: usize,
    /// Their shape and normalisers' bits ([`stats_fingerprint`]): an
    /// address reused by another row's statistics does not attach.
    pub(super) fingerprint: [u64; 6],
    pub(super) c: Consts,
    pub(super) p: Result<SetBounds, NoBound>,
    pub(super) w: Result<SetBounds, NoBound>,
    pub(super) entropy_pre: Result<Hi, NoBound>,
    pub(super) entropy_grad: Result<Hi, NoBound>,
}

/// `[V]` lengths of `d` and `e` and the bits of `ln_s` and `ln_s_w`: what
/// tells two rows' statistics apart in [`DetachedBounds::attach`].
pub(super) fn stats_fingerprint(stats: &RowStats) -> [u64; 6] {
    [
        stats.d.len() as u64,
        stats.e.len() as u64,
        stats.ln_s.lo.to_bits(),
        stats.ln_s.hi.to_bits(),
        stats.ln_s_w.lo.to_bits(),
        stats.ln_s_w.hi.to_bits(),
    ]
}

impl DetachedBounds {
    /// The bounds again, over `stats`; `None` unless `stats` is the same
    /// object (same address, same shape and normalisers) they were built
    /// from, so they cannot be attached to another row.
    pub fn attach<'a>(&self, stats: &'a RowStats) -> Option<RowBounds<'a>> {
        let same = stats as *const RowStats as usize == self.stats
            && stats_fingerprint(stats) == self.fingerprint;
        same.then(|| RowBounds {
            stats,
            c: self.c.clone(),
            p: self.p.clone(),
            w: self.w.clone(),
            entropy_pre: self.entropy_pre.clone(),
            entropy_grad: self.entropy_grad.clone(),
            ep: None,
        })
    }
}

impl<'a> RowBounds<'a> {
    /// [`RowBounds::new`] with the accumulation terms' `gamma_n` replaced
    /// by `min(gamma_n, c sqrt(n) u)`: the statistical threshold of
    /// [`super::Statistical`], which exposes only the forward outputs (no
    /// statistical tier for gradients: (T14) reads the entropy's terms).
    pub(crate) fn build(
        model: &Model,
        stats: &'a RowStats,
        ctx: &RowContext,
        stat: Option<StatTerms>,
    ) -> RowBounds<'a> {
        let c = Consts::new(model, stats.d.len().max(stats.e.len()), ctx, stat);
        let p = set_bounds(&c, model.shift.log_probs_raw(), &stats.d, stats.ln_s);
        let w = set_bounds(&c, model.shift == Shift::Raw, &stats.e, stats.ln_s_w);
        let (entropy_pre, entropy_grad) = match &w {
            Ok(ws) => entropy_errors(&c, model, stats, ws),
            Err(e) => (Err(e.clone()), Err(e.clone())),
        };
        RowBounds {
            stats,
            c,
            p,
            w,
            entropy_pre,
            entropy_grad,
            ep: None,
        }
    }
}
