//! The row-sum pass: `s = S - 1`, `s_w`, `B = sum F_j |e_j|` and
//! `sum F_j e_j^2` enclosed at a working precision over fixed chunks of
//! [`CHUNK`] entries (the same enclosures whatever the thread count), with
//! the per-entry `exp(d_j)` kept for the gradient ([`Cache`]).

use std::ops::Range;

use rayon::prelude::*;
use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound, MulAssignRound};
use rug::{Assign, Float};

use super::{Entry, Row, ACC_EXTRA, CHUNK};
use crate::interval::MpfrInterval;

/// A chunk of a row with its slices of the `p` and `q` caches and, for a
/// sparse cache, the entries those slices hold.
struct WorkItem<'c> {
    range: Range<usize>,
    cp: Option<&'c mut [MpfrInterval]>,
    cq: Option<&'c mut [MpfrInterval]>,
    index: Option<&'c [usize]>,
}

/// Per-entry `exp(d_j)` enclosures kept between the sums and the gradient
/// (one exp per entry serves both). `p[j]`: relative to `p`'s max (in the
/// shared case also for `q`-only entries); `q[j]`: relative to `q`'s max
/// when it differs. A sparse cache ([`Cache::sparse`]) keeps only the
/// entries it lists, `p[k]` and `q[k]` those of `index[k]`: the gradient
/// of a few entries MPFR decides needs `O(k)` memory, not `O(V)`.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    pub p: Vec<MpfrInterval>,
    pub q: Vec<MpfrInterval>,
    prec: u32,
    /// The entries kept (sorted, distinct); `None`: every entry.
    index: Option<Vec<usize>>,
}

impl Cache {
    /// A cache of the entries `index` only (sorted and deduplicated here).
    pub fn sparse(mut index: Vec<usize>) -> Cache {
        index.sort_unstable();
        index.dedup();
        Cache {
            index: Some(index),
            ..Cache::default()
        }
    }

    /// Whether every entry is kept.
    pub fn is_dense(&self) -> bool {
        self.index.is_none()
    }

    /// The slot of entry `j` (`None`: a sparse cache does not keep it).
    fn slot(&self, j: usize) -> Option<usize> {
        match &self.index {
            None => Some(j),
            Some(ix) => ix.binary_search(&j).ok(),
        }
    }

    /// The cached `exp(d'_j)` of `p`'s family (`j` kept: a sparse cache's
    /// caller asks only for its entries).
    pub fn p_at(&self, j: usize) -> &MpfrInterval {
        &self.p[self.slot(j).expect("entry kept by the cache")]
    }

    fn fit(&mut self, row: &Row<'_>, prec: u32) {
        let v = self.index.as_ref().map_or(row.v.len(), Vec::len);
        let want_q = row.q.is_some() && !row.shared;
        for (vec, want) in [(&mut self.p, true), (&mut self.q, want_q)] {
            if !want {
                vec.clear();
                continue;
            }
            if self.prec != prec {
                vec.iter_mut().for_each(|b| b.set_prec(prec));
            }
            vec.truncate(v);
            while vec.len() < v {
                vec.push(MpfrInterval::new(prec));
            }
        }
        self.prec = prec;
    }

    /// The cached `exp(e_j)` of `q`'s family (`j` kept).
    pub fn q_slot(&self, row: &Row<'_>, j: usize) -> &MpfrInterval {
        if row.shared {
            self.p_at(j)
        } else {
            &self.q[self.slot(j).expect("entry kept by the cache")]
        }
    }
}

/// Row sums at one working precision (accumulators at `prec + ACC_EXTRA`).
#[derive(Debug)]
pub(crate) struct Sums {
    /// `s = S - 1 = sum_{j != argmax} exp(d'_j)`.
    pub s_p: MpfrInterval,
    /// `s_w = S_w - 1` (when `q` exists).
    pub s_q: MpfrInterval,
    /// `B = sum_j exp(e_j) |e_j|`, so `R = B / S_w`.
    pub b: MpfrInterval,
    /// `sum_j exp(e_j) e_j^2`, so `M2 = this / S_w` (only when asked).
    pub m2: MpfrInterval,
}

struct Partial {
    sums: Sums,
    skip_p: u64,
    skip_q: u64,
}

impl Sums {
    fn new(prec: u32) -> Self {
        Sums {
            s_p: MpfrInterval::new(prec),
            s_q: MpfrInterval::new(prec),
            b: MpfrInterval::new(prec),
            m2: MpfrInterval::new(prec),
        }
    }

    fn merge(&mut self, o: &Sums) {
        for (a, b) in [
            (&mut self.s_p, &o.s_p),
            (&mut self.s_q, &o.s_q),
            (&mut self.b, &o.b),
            (&mut self.m2, &o.m2),
        ] {
            a.lo.add_assign_round(&b.lo, Round::Down);
            a.hi.add_assign_round(&b.hi, Round::Up);
        }
    }
}

/// Skip threshold exponent `K = prec + ceil(log2 V) + 2`: terms below
/// `2^-K` (relative to the max term, which is 1) are left out of the sums
/// and bounded: their total is below `V 2^-K <= 2^-(prec + 2)`.
fn skip_exponent(prec: u32, v: usize) -> u32 {
    let lv = usize::BITS - v.max(1).saturating_sub(1).leading_zeros();
    prec + lv + 2
}

/// Sums of one row at precision `prec`. With `cache`, every member's
/// `exp(d_j)` is also kept (skipped entries included: the sums still skip
/// them). `want_m2` adds `sum exp(e_j) e_j^2`.
pub(crate) fn pass(row: &Row<'_>, prec: u32, want_m2: bool, cache: Option<&mut Cache>) -> Sums {
    let v = row.v.len();
    let acc = prec + ACC_EXTRA;
    let ranges: Vec<Range<usize>> = (0..v)
        .step_by(CHUNK)
        .map(|s| s..(s + CHUNK).min(v))
        .collect();
    let mut items: Vec<WorkItem<'_>> = Vec::with_capacity(ranges.len());
    match cache {
        Some(c) => {
            c.fit(row, prec);
            let Cache { p, q, index, .. } = c;
            match index.as_deref() {
                None => {
                    let mut cp = p.chunks_mut(CHUNK);
                    let mut cq = q.chunks_mut(CHUNK);
                    for range in ranges {
                        let (cp, cq) = (cp.next(), cq.next());
                        items.push(WorkItem {
                            range,
                            cp,
                            cq,
                            index: None,
                        });
                    }
                }
                Some(mut ix) => {
                    // Each chunk takes the slots of the kept entries in it.
                    let (mut rp, mut rq) = (&mut p[..], &mut q[..]);
                    for range in ranges {
                        let k = ix.partition_point(|&j| j < range.end);
                        let (here, rest) = ix.split_at(k);
                        ix = rest;
                        let (cp, tp) = std::mem::take(&mut rp).split_at_mut(k);
                        rp = tp;
                        let cq = if rq.is_empty() {
                            None
                        } else {
                            let (cq, tq) = std::mem::take(&mut rq).split_at_mut(k);
                            rq = tq;
                            Some(cq)
                        };
                        let (cp, index) = (Some(cp), Some(here));
                        items.push(WorkItem {
                            range,
                            cp,
                            cq,
                            index,
                        });
                    }
                }
            }
        }
        None => items.extend(ranges.into_iter().map(|range| WorkItem {
            range,
            cp: None,
            cq: None,
            index: None,
        })),
    }
    let parts: Vec<Partial> = if items.len() <= 1 {
        items
            .into_iter()
            .map(|w| chunk_pass(row, prec, w, want_m2))
            .collect()
    } else {
        items
            .into_par_iter()
            .map(|w| chunk_pass(row, prec, w, want_m2))
            .collect()
    };
    let mut sums = Sums::new(acc);
    let (mut skip_p, mut skip_q) = (0u64, 0u64);
    for p in &parts {
        sums.merge(&p.sums);
        skip_p += p.skip_p;
        skip_q += p.skip_q;
    }
    // Skipped terms: each exp(-a) < 2^-K with a > K ln 2 >= 2, where a e^-a
    // and a^2 e^-a decrease, so a e^-a < K 2^-K and a^2 e^-a < K^2 2^-K.
    let k = skip_exponent(prec, v);
    let mut t = Float::new(acc);
    for (n, target, pow) in [
        (skip_p, &mut sums.s_p, 0),
        (skip_q, &mut sums.s_q, 0),
        (skip_q, &mut sums.b, 1),
        (skip_q, &mut sums.m2, 2),
    ] {
        if n > 0 {
            t.assign(n);
            for _ in 0..pow {
                t.mul_assign_round(k, Round::Up);
            }
            t >>= k;
            target.hi.add_assign_round(&t, Round::Up);
        }
    }
    sums
}

fn chunk_pass(row: &Row<'_>, prec: u32, w: WorkItem<'_>, want_m2: bool) -> Partial {
    let WorkItem {
        range,
        mut cp,
        mut cq,
        index,
    } = w;
    let acc = prec + ACC_EXTRA;
    let mut part = Partial {
        sums: Sums::new(acc),
        skip_p: 0,
        skip_q: 0,
    };
    let sums = &mut part.sums;
    let mut en = Entry::new(prec);
    let mut t = Float::new(acc);
    let mut t2 = Float::new(acc);
    let k = skip_exponent(prec, row.v.len());
    // Pre-filter in f64: a_f = fl(fl(vmax - v) / ts) is within a factor
    // (1 + 2^-53)^2 of a (or overflows, when a is larger still), so
    // a_f > K ln2 (1 + 2^-40) proves exp(-a) < 2^-K.
    let thr = k as f64 * std::f64::consts::LN_2 * (1.0 + 2f64.powi(-40));
    let top_p = row.top(row.p.vmax, prec);
    let top_q = row.top(row.q.map_or(0.0, |q| q.vmax), prec);
    let capped = row.cap().is_some();
    let start = range.start;
    for j in range {
        let x = row.v[j];
        if !row.finite(j) {
            continue;
        }
        let in_p = row.allowed(j);
        let in_q = row.in_q(j);
        // (family max, membership in p, in q, cache slot)
        let mut jobs: [(bool, bool, bool); 2] = [(false, false, false); 2];
        if row.shared {
            jobs[0] = (in_p || in_q, in_p, in_q);
        } else {
            jobs[0] = (in_p, true, false);
            jobs[1] = (in_q, false, true);
        }
        for (slot, &(active, to_p, to_q)) in jobs.iter().enumerate() {
            if !active {
                continue;
            }
            let (vmax, top) = if slot == 0 {
                (row.p.vmax, &top_p)
            } else {
                (row.q.map_or(0.0, |q| q.vmax), &top_q)
            };
            // Under an exact softcap the raw gap says nothing: the skip test
            // reads the enclosure of `a` itself (one tanh, no exp).
            let skip = if capped {
                en.shift(top, x);
                en.a.lo > thr
            } else {
                (vmax - x) / row.ts > thr
            };
            let at = match index {
                None => Some(j - start),
                Some(ix) => ix.binary_search(&j).ok(),
            };
            let store = if slot == 0 {
                cp.as_deref_mut()
            } else {
                cq.as_deref_mut()
            }
            .zip(at)
            .map(|(c, k)| &mut c[k]);
            if skip && store.is_none() {
                part.skip_p += to_p as u64;
                part.skip_q += to_q as u64;
                continue;
            }
            if !capped {
                en.shift(top, x);
            }
            en.exp();
            if let Some(b) = store {
                b.lo.assign(&en.ex.lo);
                b.hi.assign(&en.ex.hi);
            }
            if skip {
                part.skip_p += to_p as u64;
                part.skip_q += to_q as u64;
                continue;
            }
            if to_p && j != row.p.argmax {
                sums.s_p.lo.add_assign_round(&en.ex.lo, Round::Down);
                sums.s_p.hi.add_assign_round(&en.ex.hi, Round::Up);
            }
            if to_q {
                let qa = row.q.map_or(usize::MAX, |q| q.argmax);
                if j != qa {
                    sums.s_q.lo.add_assign_round(&en.ex.lo, Round::Down);
                    sums.s_q.hi.add_assign_round(&en.ex.hi, Round::Up);
                    t.assign_round(&en.ex.lo * &en.a.lo, Round::Down);
                    sums.b.lo.add_assign_round(&t, Round::Down);
                    t.assign_round(&en.ex.hi * &en.a.hi, Round::Up);
                    sums.b.hi.add_assign_round(&t, Round::Up);
                    if want_m2 {
                        t2.assign_round(&en.a.lo * &en.a.lo, Round::Down);
                        t.assign_round(&t2 * &en.ex.lo, Round::Down);
                        sums.m2.lo.add_assign_round(&t, Round::Down);
                        t2.assign_round(&en.a.hi * &en.a.hi, Round::Up);
                        t.assign_round(&t2 * &en.ex.hi, Round::Up);
                        sums.m2.hi.add_assign_round(&t, Round::Up);
                    }
                }
            }
        }
    }
    part
}
