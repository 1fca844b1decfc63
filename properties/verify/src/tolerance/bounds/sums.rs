//! The normaliser's pass-1 sums (T4) and the per-set bounds (T4-T6)
//! every family reads, with the grouping of equal entries.

use super::*;

/// The per-entry sums of pass 1 (T4): `E1 = sum e^lw (e^alpha - 1)`, the
/// flush term `F`, the number of finite terms. They depend on the model
/// only through `a`, `b` and the flush threshold ([`Consts::same_shift`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct SetSums {
    pub(super) e1: Hi,
    pub(super) fl: Hi,
    pub(super) n_fin: usize,
}

pub(super) fn set_sums(
    c: &Consts,
    ds: &[Interval],
    ln_s: Interval,
    entries: Entries<'_>,
) -> SetSums {
    if let Entries::All(_) = entries {
        // The same sums as the entropy set's (`entropy_all`), bit for bit.
        return entropy_all(c, ds, ln_s.lo).set;
    }
    let (mut e1, mut fl, mut n_fin) = (Hi::ZERO, Hi::ZERO, 0usize);
    for (j, k) in entries.iter() {
        let d = &ds[j];
        if d.hi == f64::NEG_INFINITY {
            continue; // exp(-inf) = 0 exactly: the term adds nothing.
        }
        n_fin += k as usize;
        let lw = Hi(d.hi) - Lo(ln_s.lo);
        let alpha = c.a * mag(d) + c.b;
        e1 = e1 + times(k, w_expm1(lw, alpha));
        if (Hi(d.hi) + alpha).0 < c.ln_min_normal {
            fl = fl + times(k, (lw + alpha).exp());
        }
    }
    SetSums { e1, fl, n_fin }
}

/// The entries a per-entry sum visits: all of `0..V`, one by one, or
/// groups `(representative, size)` of entries with equal statistics.
#[derive(Clone, Copy, Debug)]
pub(super) enum Entries<'g> {
    All(usize),
    Groups(&'g [(u32, u32)]),
}

impl<'g> Entries<'g> {
    /// `(j, count)`: entry `j` stands for `count` equal terms.
    pub(super) fn iter(self) -> impl Iterator<Item = (usize, u32)> + 'g {
        let (n, g) = match self {
            Entries::All(n) => (n, &[][..]),
            Entries::Groups(g) => (0, g),
        };
        (0..n)
            .map(|j| (j, 1))
            .chain(g.iter().map(|&(j, k)| (j as usize, k)))
    }
}

/// `k t` rounded up (`t` itself for `k = 1`: the entry-by-entry sums are
/// those of [`RowBounds::new`]).
pub(super) fn times(k: u32, t: Hi) -> Hi {
    if k == 1 {
        t
    } else {
        Hi(f64::from(k)) * t
    }
}

/// Per item, the index of the first item with the same `key` (its own
/// index when none before it has).
pub(super) fn twins<T, K: PartialEq>(items: &[T], key: impl Fn(&T) -> K) -> Vec<usize> {
    let keys: Vec<K> = items.iter().map(key).collect();
    (0..keys.len())
        .map(|i| (0..i).find(|&k| keys[k] == keys[i]).unwrap_or(i))
        .collect()
}

/// Keys below this are grouped (`2^17`: a 16-bit logit and a mask bit).
pub(super) const KEY_SPACE: usize = 1 << 17;

thread_local! {
    /// Per key, its group's index + 1 (0: none); reset after each use.
    static GROUP_OF: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Groups of the entries `0..V` with equal `keys[j]`, each `(first j,
/// size)`, when every member's `d_j` and `e_j` equal its first's and there
/// are at most `V / 4` groups; `None` otherwise (sum entry by entry).
pub(super) fn group_entries(
    keys: &[u32],
    d: &[Interval],
    e: &[Interval],
) -> Option<Vec<(u32, u32)>> {
    let v = d.len();
    if keys.len() != v || e.len() != v || v < 64 || u32::try_from(v).is_err() {
        return None;
    }
    GROUP_OF.with(|t| {
        let mut table = t.borrow_mut();
        table.resize(KEY_SPACE, 0);
        let mut groups: Vec<(u32, u32)> = Vec::new();
        let mut ok = true;
        for (j, &key) in keys.iter().enumerate() {
            let Some(slot) = table.get_mut(key as usize) else {
                ok = false;
                break;
            };
            if *slot == 0 {
                groups.push((j as u32, 1));
                *slot = groups.len() as u32;
                if groups.len() > v / 4 {
                    ok = false;
                    break;
                }
            } else {
                let g = &mut groups[*slot as usize - 1];
                let r = g.0 as usize;
                if d[j] != d[r] || e[j] != e[r] {
                    ok = false;
                    break;
                }
                g.1 += 1;
            }
        }
        for &(j, _) in &groups {
            table[keys[j as usize] as usize] = 0;
        }
        ok.then_some(groups)
    })
}

/// Pass 1 over one logit set (T4-T6): `theta_S`, `delta_ell`, `err(lse)`.
pub(super) fn set_bounds(
    c: &Consts,
    raw: bool,
    ds: &[Interval],
    ln_s: Interval,
) -> Result<SetBounds, NoBound> {
    set_finish(c, raw, set_sums(c, ds, ln_s, Entries::All(ds.len())), ln_s)
}

/// [`set_bounds`] from its per-entry sums. `raw`: the set's log-probs
/// subtract an unshifted `lse` (T6; [`Shift::log_probs_raw`] for the
/// log-prob set, [`Shift::Raw`] alone for the entropy set, T2a).
pub(super) fn set_finish(
    c: &Consts,
    raw: bool,
    sums: SetSums,
    ln_s: Interval,
) -> Result<SetBounds, NoBound> {
    let k_s = c.k_s.clone()?;
    let SetSums { e1, fl, n_fin } = sums;
    let n = Hi(n_fin as f64);
    // (T4) theta_S = (K_S - 1) + K_S (E1 + F) + floor_S (S >= 1: the argmax term is e^0).
    let floor_s = n * Hi((c.n_s + 2) as f64) * c.eta + n * c.eta_sub * k_s;
    let theta_s = finite((k_s - Lo(1.0)) + k_s * (e1 + fl) + floor_s, "theta_S")?;
    if theta_s.0.is_nan() || theta_s.0 >= 1.0 {
        return Err(NoBound::SumUnbounded { theta: theta_s.0 });
    }
    // (T5) delta_ell = -ln(1 - theta_S) + log_ulps ulp_acc(ln S + -ln(1 - theta_S)).
    let nl_theta = theta_s.neg_ln_1m();
    let delta_ell = nl_theta + c.log_ulps * Hi(c.acc.ulp((Hi(ln_s.hi) + nl_theta).0));
    // (T6) raw kernels subtract lse = z_max + ln S, rounded.
    let lse_err = if raw {
        let lse_abs = (Hi::ONE + c.t_div) * c.z + Hi(ln_s.hi) + delta_ell;
        c.t_div * c.z + delta_ell + half_ulp(c.acc, lse_abs)
    } else {
        delta_ell
    };
    Ok(SetBounds {
        ln_s,
        theta_s,
        nl_theta,
        delta_ell: finite(delta_ell, "delta_ell")?,
        lse_err: finite(lse_err, "lse")?,
    })
}
