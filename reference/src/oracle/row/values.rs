//! A row's forward values (`lse`, log-prob, top-k log-probs, entropy) and
//! its statistics ([`RowStats`]) from the row sums.

use rug::float::Round;
use rug::ops::AssignRound;

use super::{pass, Cache, Entry, Row, Sums, TopId, ACC_EXTRA};
use crate::interval::MpfrInterval;
use crate::oracle::{Interval, RowStats};

/// Forward enclosures of one row at precision `prec`.
#[derive(Debug)]
pub(crate) struct RowValues {
    pub lse: MpfrInterval,
    pub log_prob: Option<MpfrInterval>,
    pub entropy: Option<MpfrInterval>,
    pub topk: Vec<MpfrInterval>,
}

/// `lse = v_max/ts + ln_1p(s)`, `log_prob = d_t - ln_1p(s)`,
/// `topk_k = d_{id_k} - ln_1p(s)` (`-inf` for masked or `-inf` ids),
/// `entropy = ln_1p(s_w) + B / (1 + s_w)`.
pub(crate) fn values(row: &Row<'_>, sums: &Sums, prec: u32) -> RowValues {
    let mut en = Entry::new(prec);
    let top = row.top(row.p.vmax, prec);
    let mut l = MpfrInterval::new(prec);
    l.ln_1p(&sums.s_p);
    let m = top.z_max(prec);
    let mut lse = MpfrInterval::new(prec);
    lse.add(&m, &l);
    let mut minus_a_minus_l = |col: Option<usize>| -> MpfrInterval {
        match col {
            Some(c) if row.finite(c) => {
                en.shift(&top, row.v[c]);
                let mut out = MpfrInterval::new(prec);
                out.add(&en.a, &l);
                out.neg();
                out
            }
            _ => MpfrInterval::point(prec, f64::NEG_INFINITY),
        }
    };
    let log_prob = row.target.map(|t| minus_a_minus_l(Some(t)));
    let topk = row
        .topk
        .iter()
        .map(|id| match id {
            TopId::Masked => minus_a_minus_l(None),
            TopId::Live(c) => minus_a_minus_l(Some(*c)),
        })
        .collect();
    let entropy = row.q.map(|_| {
        let mut lw = MpfrInterval::new(prec);
        lw.ln_1p(&sums.s_q);
        let mut sw = MpfrInterval::new(prec);
        one_plus(&mut sw, &sums.s_q);
        let mut r = MpfrInterval::new(prec);
        r.div_pos(&sums.b, &sw);
        let mut h = MpfrInterval::new(prec);
        h.add(&lw, &r);
        h
    });
    RowValues {
        lse,
        log_prob,
        entropy,
        topk,
    }
}

/// `out = 1 + s`.
pub(crate) fn one_plus(out: &mut MpfrInterval, s: &MpfrInterval) {
    out.lo.assign_round(&s.lo + 1u32, Round::Down);
    out.hi.assign_round(&s.hi + 1u32, Round::Up);
}

/// `-a` as an f64 interval (`-inf` for `-inf` entries).
fn neg_interval(a: &MpfrInterval) -> Interval {
    Interval {
        lo: -a.hi.to_f64_round(Round::Up),
        hi: -a.lo.to_f64_round(Round::Down),
    }
}

const NEG_INF: Interval = Interval {
    lo: f64::NEG_INFINITY,
    hi: f64::NEG_INFINITY,
};
const ZERO: Interval = Interval { lo: 0.0, hi: 0.0 };

/// Row statistics at precision `prec` (see [`RowStats`]).
pub(crate) fn stats(row: &Row<'_>, prec: u32) -> RowStats {
    let mut cache = Cache::default();
    let sums = pass(row, prec, true, Some(&mut cache));
    let q = row.q.expect("stats rows have an entropy family");
    let mut sp = MpfrInterval::new(prec + ACC_EXTRA);
    one_plus(&mut sp, &sums.s_p);
    let mut sw = MpfrInterval::new(prec + ACC_EXTRA);
    one_plus(&mut sw, &sums.s_q);
    let mut ln_s = MpfrInterval::new(prec);
    ln_s.ln_1p(&sums.s_p);
    let mut ln_s_w = MpfrInterval::new(prec);
    ln_s_w.ln_1p(&sums.s_q);
    let mut r = MpfrInterval::new(prec);
    r.div_pos(&sums.b, &sw);
    let mut m2 = MpfrInterval::new(prec);
    m2.div_pos(&sums.m2, &sw);
    let top_p = row.top(row.p.vmax, prec);
    let top_q = row.top(q.vmax, prec);
    let mut en = Entry::new(prec);
    let d_t = row.target.map(|t| {
        en.shift(&top_p, row.v[t]);
        neg_interval(&en.a)
    });
    let v = row.v.len();
    let (mut pv, mut qv, mut ev, mut dv) = (
        Vec::with_capacity(v),
        Vec::with_capacity(v),
        Vec::with_capacity(v),
        Vec::with_capacity(v),
    );
    let mut ratio = MpfrInterval::new(prec);
    for j in 0..v {
        if row.in_p(j) {
            en.shift(&top_p, row.v[j]);
            dv.push(neg_interval(&en.a));
            ratio.div_pos(&cache.p[j], &sp);
            pv.push(ratio.interval());
        } else {
            dv.push(NEG_INF);
            pv.push(ZERO);
        }
        if row.in_q(j) {
            en.shift(&top_q, row.v[j]);
            ev.push(neg_interval(&en.a));
            ratio.div_pos(cache.q_slot(row, j), &sw);
            qv.push(ratio.interval());
        } else {
            ev.push(NEG_INF);
            qv.push(ZERO);
        }
    }
    RowStats {
        d_t,
        s: sp.interval(),
        ln_s: ln_s.interval(),
        s_w: sw.interval(),
        ln_s_w: ln_s_w.interval(),
        r: r.interval(),
        m2: m2.interval(),
        p: pv,
        q: qv,
        e: ev,
        d: dv,
    }
}
