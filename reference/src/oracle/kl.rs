//! The exact KL divergence between two rows' softmaxes,
//! `KL(p_A || p_B) = sum_j p_A,j (ln p_A,j - ln p_B,j)` with
//! `p = softmax(z')` of each side (its own logits, temperature and
//! sampling mask: docs/design.md, "The math"), as an MPFR enclosure decided to
//! f64 by Ziv's loop. `logprobe compare` reports it per row: how far a
//! rollout engine's distribution is from the trainer's.
//!
//! # Formula (cancellation-free)
//!
//! With `a_j = -d_j >= 0` and `ell = ln S` of each side (module `row`),
//! `delta_j = ln p_A,j - ln p_B,j = (a_B,j - a_A,j) + (ell_B - ell_A)`, and
//! `phi(x) = e^{-x} - 1 + x >= 0`:
//!
//! `KL = sum_{j in supp A} p_A,j phi(delta_j) + sum_{j in supp B \ supp A} p_B,j`
//!
//! since `sum_{supp A} p_A,j (e^{-delta_j} - 1) = sum_{supp A} p_B,j - 1`.
//! Every term is `>= 0`, so the sum has no cancellation (the usual
//! `sum p_A (d_A - d_B) - (lse_A - lse_B)` loses every digit when KL is
//! tiny). `phi(x)` is evaluated as `expm1(-x) + x`, monotone on each side of
//! 0; where `delta_j < -1` (B far likelier than A, where `e^{-delta}` could
//! overflow) the term is `p_B,j - p_A,j (1 - delta_j)` instead (the same
//! real, since `p_A,j e^{-delta_j} = p_B,j`). An entry of A's support that
//! B gives probability 0 (masked, or `-inf`) makes KL `+inf` exactly.
//!
//! Every `exp(d_j)` is enclosed as in module `row` (one MPFR exp per entry
//! and side, rounded down, its `next_up` above; an exp below MPFR's
//! exponent range rounds down to 0 and up to the smallest positive number:
//! still an enclosure); the sums run at `prec + 64` bits in fixed chunks of
//! [`row::CHUNK`] entries, so the enclosure does not depend on the thread
//! count. Precision doubles from the target's start (64 bits for f32, 128
//! for f64) until the enclosure rounds to one value of the target dtype or
//! the cap is reached (`decided = false`).
//!
//! # Tiers
//!
//! With [`super::Tier::Fast`] (the default) the same formula first runs in
//! f64 interval arithmetic on the oracle's f64 row statistics (one
//! CORE-MATH `exp` per entry and side, then a correctly rounded `expm1`);
//! when that enclosure rounds to one value of the target it is the result,
//! otherwise MPFR decides, as for every other output.
//! Rows with the same `z'` on both sides (equal values, temperatures and
//! supports: bitwise-equal logits) give the point 0 without a sum. Under
//! an exact softcap the statistics are (F9)'s, widened by the softcap's
//! bound, so the tier holds there too (test
//! `softcapped_rows_take_the_f64_tier`).

use rayon::prelude::*;
use rug::float::Round;
use rug::ops::{AddAssignRound, AssignRound};
use rug::{Assign, Float};

use super::row::{self, Cache, Entry, Row, ACC_EXTRA, CHUNK};
use super::{Exact, Interval, Oracle, Rounder, RowStats};
use crate::interval::{add_dn, add_up, MpfrInterval};
use crate::spec::{Dtype, Problem, SpecError};

impl Oracle {
    /// Exact `KL(softmax(z'_A) || softmax(z'_B))` (nats) of row `row_a` of
    /// `a` and row `row_b` of `b`, each side with its own logits (any
    /// dtype), temperature, `temperature_dtype` and sampling mask; `z'` is
    /// `z` with disallowed entries at `-inf`, over the real vocabulary
    /// (`vocab_size` columns, which must agree). Tokens and top-k ids play
    /// no part. The result is an enclosure whose ends round to one value of
    /// `target` (`decided = false` only at the precision cap), from the f64
    /// tier when it decides, else from MPFR (the module docs); `+inf` when
    /// B gives probability 0 to a token A does not.
    ///
    /// ```
    /// use logprobe_reference::oracle::Oracle;
    /// use logprobe_reference::spec::{Dtype, Logits, Problem};
    /// use ndarray::array;
    /// let xa = array![[1.0f32, 2.0, 3.0]];
    /// let xb = array![[1.0f32, 2.0, 3.5]];
    /// let (a, b) = (Problem::new(Logits::F32(xa.view())), Problem::new(Logits::F32(xb.view())));
    /// let kl = Oracle::default().kl_row(&a, 0, &b, 0, Dtype::F32).unwrap();
    /// assert!(kl.decided && kl.rounded > 0.0 && kl.rounded < 0.05);
    /// assert_eq!(Oracle::default().kl_row(&a, 0, &a, 0, Dtype::F32).unwrap().rounded, 0.0);
    /// ```
    ///
    /// # Errors
    /// Each side's validation errors for its row ([`Problem::validate_shapes`],
    /// [`Problem::validate_row`], the `temperature_dtype = input` errors of
    /// [`Oracle::forward`]); a row past `N` or a `vocab_size` that differs
    /// between the sides is [`SpecError::ShapeMismatch`].
    pub fn kl_row(
        &self,
        a: &Problem<'_>,
        row_a: usize,
        b: &Problem<'_>,
        row_b: usize,
        target: Dtype,
    ) -> Result<Exact, SpecError> {
        let sa = a.validate_shapes()?;
        let sb = b.validate_shapes()?;
        super::check_row(&sa, row_a)?;
        super::check_row(&sb, row_b)?;
        if sa.vocab_size != sb.vocab_size {
            return Err(SpecError::ShapeMismatch {
                tensor: "logits (vocab_size of B)",
                expected: vec![sa.vocab_size],
                found: vec![sb.vocab_size],
            });
        }
        a.validate_row(&sa, row_a)?;
        b.validate_row(&sb, row_b)?;
        let ra = row::prepare(a, &sa, row_a, None)?;
        let rb = row::prepare(b, &sb, row_b, None)?;
        if (0..ra.v.len()).any(|j| ra.in_p(j) && !rb.in_p(j)) {
            return Ok(Exact::point(f64::INFINITY));
        }
        // The same z' on both sides: the same distribution, KL = 0 exactly.
        if ra.ts == rb.ts
            && ra.softcap == rb.softcap
            && (0..ra.v.len())
                .all(|j| ra.in_p(j) == rb.in_p(j) && (!ra.in_p(j) || ra.v[j] == rb.v[j]))
        {
            return Ok(Exact::point(0.0));
        }
        // The f64 tier reads the rows' statistics, whose enclosures hold
        // the exact softcapped values too (F9: widened by the softcap's
        // bound), so softcapped rows take it as well.
        if self.tier.fast().is_some() {
            let (sa, sb) = (self.row_stats(a, row_a)?, self.row_stats(b, row_b)?);
            let e = kl_fast(&ra, &rb, &sa, &sb);
            let (lo, hi) = (target.round_f64(e.lo), target.round_f64(e.hi));
            if lo == hi && e.is_finite() {
                return Ok(Exact::new(e, lo, true));
            }
        }
        let mut rounder = Rounder::new();
        let mut out = None;
        for prec in self.precisions(target) {
            let e = rounder.exact(&kl_at(&ra, &rb, prec), target);
            out = Some(e);
            if e.decided {
                break;
            }
        }
        Ok(out.expect("at least one precision"))
    }
}

/// The f64 tier: each side's row statistics ([`Oracle::row_stats`]: f64
/// enclosures of `d'_j`, `p_j`, `ln S`) in the module's formula, in
/// outward f64 interval arithmetic (module `crate::interval`); `phi` with
/// CORE-MATH's correctly rounded `expm1` moved one ulp outward (a correctly
/// rounded value is within half an ulp).
fn kl_fast(ra: &Row<'_>, rb: &Row<'_>, sa: &RowStats, sb: &RowStats) -> Interval {
    let one = Interval::point(1.0);
    let mut sum = Interval::ZERO;
    let phi_at = |x: f64, up: bool| -> f64 {
        let m = core_math::expm1(-x);
        if up {
            add_up(m.next_up(), x)
        } else {
            add_dn(m.next_down(), x)
        }
    };
    for j in 0..ra.v.len() {
        let (in_a, in_b) = (ra.in_p(j), rb.in_p(j));
        let term = if !in_a {
            if !in_b {
                continue;
            }
            sb.p[j]
        } else {
            let delta = sa.d[j].sub(sa.ln_s).sub(sb.d[j].sub(sb.ln_s));
            if delta.lo >= -1.0 {
                let phi = if delta.lo >= 0.0 {
                    Interval {
                        lo: phi_at(delta.lo, false),
                        hi: phi_at(delta.hi, true),
                    }
                } else if delta.hi <= 0.0 {
                    Interval {
                        lo: phi_at(delta.hi, false),
                        hi: phi_at(delta.lo, true),
                    }
                } else {
                    Interval {
                        lo: 0.0,
                        hi: phi_at(delta.lo, true).max(phi_at(delta.hi, true)),
                    }
                };
                let phi = Interval {
                    lo: phi.lo.max(0.0),
                    hi: phi.hi,
                };
                sa.p[j].mul_nonneg(phi)
            } else {
                // p_B - p_A (1 - delta)
                sb.p[j].sub(sa.p[j].mul(one.sub(delta)))
            }
        };
        sum = sum.add(Interval {
            lo: term.lo.max(0.0),
            hi: term.hi,
        });
    }
    sum
}

/// One side at one precision: cached `exp(d_j)`, `S = 1 + s`, `ln S`.
struct Side {
    cache: Cache,
    s: MpfrInterval,
    ln_s: MpfrInterval,
    top: row::Top,
}

impl Side {
    fn new(r: &Row<'_>, prec: u32) -> Self {
        let mut cache = Cache::default();
        let sums = row::pass(r, prec, false, Some(&mut cache));
        let mut s = MpfrInterval::new(prec + ACC_EXTRA);
        row::one_plus(&mut s, &sums.s_p);
        let mut ln_s = MpfrInterval::new(prec + ACC_EXTRA);
        ln_s.ln_1p(&sums.s_p);
        Side {
            cache,
            s,
            ln_s,
            top: r.top(r.p.vmax, prec),
        }
    }
}

/// The enclosure of KL at working precision `prec` (the module's formula;
/// supp A within supp B checked by the caller).
fn kl_at(ra: &Row<'_>, rb: &Row<'_>, prec: u32) -> MpfrInterval {
    let acc = prec + ACC_EXTRA;
    let (a, b) = (Side::new(ra, prec), Side::new(rb, prec));
    let v = ra.v.len();
    let ranges: Vec<std::ops::Range<usize>> = (0..v)
        .step_by(CHUNK)
        .map(|s| s..(s + CHUNK).min(v))
        .collect();
    let parts: Vec<MpfrInterval> = ranges
        .into_par_iter()
        .map(|range| chunk(ra, rb, &a, &b, prec, range))
        .collect();
    let mut total = MpfrInterval::new(acc);
    for p in &parts {
        total.lo.add_assign_round(&p.lo, Round::Down);
        total.hi.add_assign_round(&p.hi, Round::Up);
    }
    total
}

fn chunk(
    ra: &Row<'_>,
    rb: &Row<'_>,
    a: &Side,
    b: &Side,
    prec: u32,
    range: std::ops::Range<usize>,
) -> MpfrInterval {
    let acc = prec + ACC_EXTRA;
    let mut sum = MpfrInterval::new(acc);
    let (mut ea, mut eb) = (Entry::new(acc), Entry::new(acc));
    let (mut delta, mut dl, mut pa, mut pb, mut term, mut c) = (
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
        MpfrInterval::new(acc),
    );
    let mut t = Float::new(acc);
    let one = MpfrInterval::point(acc, 1.0);
    // ell_B - ell_A, shared by every entry.
    dl.sub(&b.ln_s, &a.ln_s);
    for j in range {
        let (in_a, in_b) = (ra.in_p(j), rb.in_p(j));
        if !in_a {
            if in_b {
                // p_B,j where A has probability 0.
                pb.div_pos(&b.cache.p[j], &b.s);
                add_nonneg(&mut sum, &pb);
            }
            continue;
        }
        ea.shift(&a.top, ra.v[j]);
        eb.shift(&b.top, rb.v[j]);
        // delta = (a_B - a_A) + (ell_B - ell_A)
        term.sub(&eb.a, &ea.a);
        delta.add(&term, &dl);
        pa.div_pos(&a.cache.p[j], &a.s);
        if delta.lo >= -1 {
            phi(&mut c, &delta, &mut t);
            term.mul(&pa, &c, &mut t);
        } else {
            // p_B - p_A (1 - delta)
            pb.div_pos(&b.cache.p[j], &b.s);
            c.sub(&one, &delta);
            term.mul(&pa, &c, &mut t);
            let pa_c = term.clone();
            term.sub(&pb, &pa_c);
        }
        add_nonneg(&mut sum, &term);
    }
    sum
}

/// `sum += term` for a term known to be `>= 0` (its lower end clamped at 0).
fn add_nonneg(sum: &mut MpfrInterval, term: &MpfrInterval) {
    if term.lo.cmp0() == Some(std::cmp::Ordering::Greater) {
        sum.lo.add_assign_round(&term.lo, Round::Down);
    }
    sum.hi.add_assign_round(&term.hi, Round::Up);
}

/// `out = phi(x) = expm1(-x) + x` over the enclosure `x` (`x.lo >= -1`):
/// `phi` decreases on `x <= 0` and increases on `x >= 0`, `phi(0) = 0`.
fn phi(out: &mut MpfrInterval, x: &MpfrInterval, t: &mut Float) {
    let at = |v: &Float, round: Round, t: &mut Float| -> Float {
        t.assign_round(-v, round);
        t.exp_m1_round(round);
        let mut r = Float::new(t.prec());
        r.assign_round(&*t + v, round);
        r
    };
    let (lo_pos, hi_neg) = (
        x.lo.cmp0() != Some(std::cmp::Ordering::Less),
        x.hi.cmp0() != Some(std::cmp::Ordering::Greater),
    );
    if lo_pos {
        out.lo = at(&x.lo, Round::Down, t);
        out.hi = at(&x.hi, Round::Up, t);
    } else if hi_neg {
        out.lo = at(&x.hi, Round::Down, t);
        out.hi = at(&x.lo, Round::Up, t);
    } else {
        out.lo.assign(0u32);
        let h1 = at(&x.lo, Round::Up, t);
        let h2 = at(&x.hi, Round::Up, t);
        out.hi = if h1 > h2 { h1 } else { h2 };
    }
    if out.lo.cmp0() == Some(std::cmp::Ordering::Less) {
        out.lo.assign(0u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Logits;
    use ndarray::array;

    /// The textbook sum at 2000 bits in f64-exact inputs: a reference for
    /// rows whose KL is not tiny.
    fn naive(xa: &[f64], xb: &[f64]) -> f64 {
        let p = 2000;
        let lse = |x: &[f64]| {
            let mut s = Float::with_val(p, 0);
            for &v in x {
                s += Float::with_val(p, v).exp();
            }
            s.ln()
        };
        let (la, lb) = (lse(xa), lse(xb));
        let mut kl = Float::with_val(p, 0);
        for (&u, &w) in xa.iter().zip(xb) {
            let lpa = Float::with_val(p, u) - &la;
            let lpb = Float::with_val(p, w) - &lb;
            kl += lpa.clone().exp() * (lpa - lpb);
        }
        kl.to_f64()
    }

    #[test]
    fn kl_matches_the_textbook_sum_and_is_zero_on_equal_rows() {
        let xa = array![[0.5f64, -1.25, 3.0, 2.0, -7.5]];
        let xb = array![[0.75f64, -1.0, 2.5, 2.0, -30.0]];
        let a = Problem::new(Logits::F64(xa.view()));
        let b = Problem::new(Logits::F64(xb.view()));
        let o = Oracle::default();
        let kl = o.kl_row(&a, 0, &b, 0, Dtype::F64).unwrap();
        let want = naive(xa.row(0).as_slice().unwrap(), xb.row(0).as_slice().unwrap());
        assert!(kl.decided);
        assert!(
            kl.enclosure.lo <= want && want <= kl.enclosure.hi,
            "{kl:?} vs {want}"
        );
        // B far likelier than A at column 4 in the reverse direction (delta < -1).
        let rev = o.kl_row(&b, 0, &a, 0, Dtype::F64).unwrap();
        let want_rev = naive(xb.row(0).as_slice().unwrap(), xa.row(0).as_slice().unwrap());
        assert!(rev.enclosure.lo <= want_rev && want_rev <= rev.enclosure.hi);
        assert_eq!(
            o.kl_row(&a, 0, &a, 0, Dtype::F64).unwrap(),
            Exact::point(0.0)
        );
    }

    #[test]
    fn tiny_kl_keeps_its_digits() {
        // One logit moved by one f32 ulp over a 4096-entry row: KL ~ 1e-18,
        // where the textbook form in f64 is all rounding noise.
        let v = 4096;
        let xa: Vec<f32> = (0..v).map(|j| ((j * 37 % 101) as f32) / 13.0).collect();
        let mut xb = xa.clone();
        xb[17] = f32::from_bits(xb[17].to_bits() + 1);
        let (xa, xb) = (
            ndarray::Array2::from_shape_vec((1, v), xa).unwrap(),
            ndarray::Array2::from_shape_vec((1, v), xb).unwrap(),
        );
        let a = Problem::new(Logits::F32(xa.view()));
        let b = Problem::new(Logits::F32(xb.view()));
        let kl = Oracle::default().kl_row(&a, 0, &b, 0, Dtype::F64).unwrap();
        let to64 = |x: &ndarray::Array2<f32>| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
        let want = naive(&to64(&xa), &to64(&xb));
        assert!(kl.decided && kl.rounded > 0.0);
        assert!(
            ((kl.rounded - want) / want).abs() < 1e-12,
            "{kl:?} vs {want}"
        );
    }

    #[test]
    fn support_mismatch_is_infinite_one_way_only() {
        let xa = array![[1.0f32, 2.0, f32::NEG_INFINITY]];
        let xb = array![[1.0f32, 2.0, 0.5]];
        let a = Problem::new(Logits::F32(xa.view()));
        let b = Problem::new(Logits::F32(xb.view()));
        let o = Oracle::default();
        // A puts 0 where B does not: finite, the p_B mass term counts.
        let ab = o.kl_row(&a, 0, &b, 0, Dtype::F64).unwrap();
        let want = naive(&[1.0, 2.0, -1e300], &[1.0, 2.0, 0.5]);
        assert!(ab.enclosure.lo <= want * (1.0 + 1e-15) && want <= ab.enclosure.hi * (1.0 + 1e-15));
        assert_eq!(
            o.kl_row(&b, 0, &a, 0, Dtype::F64).unwrap().rounded,
            f64::INFINITY
        );
        let xc = array![[1.0f32, 2.0]];
        let c = Problem::new(Logits::F32(xc.view()));
        assert!(matches!(
            o.kl_row(&a, 0, &c, 0, Dtype::F64),
            Err(SpecError::ShapeMismatch { .. })
        ));
    }

    #[test]
    fn the_f64_tier_agrees_with_mpfr() {
        use crate::oracle::Tier;
        let v = 3000;
        let xa: Vec<f32> = (0..v)
            .map(|j| ((j * 53 % 211) as f32) / 19.0 - 4.0)
            .collect();
        // B: xa rounded to bf16 (the worked example's logits effect), and a
        // row where B is far likelier than A at one entry (delta < -1).
        let xb: Vec<f32> = xa
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        let mut xc = xa.clone();
        xc[7] += 9.0;
        let arr = |x: Vec<f32>| ndarray::Array2::from_shape_vec((1, v), x).unwrap();
        let (xa, xb, xc) = (arr(xa), arr(xb), arr(xc));
        let a = Problem::new(Logits::F32(xa.view()));
        for x in [&xb, &xc] {
            let b = Problem::new(Logits::F32(x.view()));
            let fast = Oracle::default().kl_row(&a, 0, &b, 0, Dtype::F32).unwrap();
            let mpfr = Oracle {
                tier: Tier::Mpfr,
                ..Oracle::default()
            }
            .kl_row(&a, 0, &b, 0, Dtype::F32)
            .unwrap();
            assert!(fast.decided && mpfr.decided);
            assert_eq!(fast.rounded, mpfr.rounded);
            let (f, m) = (fast.enclosure, mpfr.enclosure);
            assert!(f.lo <= m.hi && m.lo <= f.hi, "{f:?} vs {m:?}");
            assert!(f.lo > 0.0 && (f.hi - f.lo) < 1e-9 * f.hi, "{f:?}");
        }
    }

    /// (F9) Softcapped rows (either side, both `softcap_dtype`s' exact
    /// form) take the f64 tier: the same rounded value as MPFR, an
    /// enclosure meeting MPFR's and wider than it (the tier's, not MPFR's).
    #[test]
    fn softcapped_rows_take_the_f64_tier() {
        use crate::oracle::Tier;
        let v = 3000;
        let xa: Vec<f32> = (0..v)
            .map(|j| ((j * 53 % 211) as f32) / 7.0 - 10.0)
            .collect();
        let mut xb = xa.clone();
        xb[11] += 3.0;
        // A `-inf` logit is `-c` under a softcap (finite: KL stays finite);
        // uncapped it would make KL infinite, so that side gets `-40`.
        let mut xc = xb.clone();
        xb[12] = f32::NEG_INFINITY;
        xc[12] = -40.0;
        let arr = |x: Vec<f32>| ndarray::Array2::from_shape_vec((1, v), x).unwrap();
        let (xa, xb, xc) = (arr(xa), arr(xb), arr(xc));
        for (cap_a, cap_b) in [
            (Some(30.0), Some(30.0)),
            (Some(30.0), None),
            (None, Some(20.0)),
        ] {
            let mut a = Problem::new(Logits::F32(xa.view()));
            a.options.softcap = cap_a;
            let x_b = if cap_b.is_some() { &xb } else { &xc };
            let mut b = Problem::new(Logits::F32(x_b.view()));
            b.options.softcap = cap_b;
            b.options.temperature = 0.7;
            let fast = Oracle::default().kl_row(&a, 0, &b, 0, Dtype::F32).unwrap();
            let mpfr = Oracle {
                tier: Tier::Mpfr,
                ..Oracle::default()
            }
            .kl_row(&a, 0, &b, 0, Dtype::F32)
            .unwrap();
            let (f, m) = (fast.enclosure, mpfr.enclosure);
            assert!(fast.decided && mpfr.decided, "{cap_a:?} {cap_b:?}");
            assert_eq!(fast.rounded, mpfr.rounded, "{cap_a:?} {cap_b:?}");
            assert!(f.lo <= m.hi && m.lo <= f.hi, "{f:?} vs {m:?}");
            assert!(
                f.hi - f.lo > m.hi - m.lo,
                "not the f64 tier: {f:?} vs {m:?}"
            );
        }
    }
}
