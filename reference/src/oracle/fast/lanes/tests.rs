//! Tests of [`super`]: the four lanes against the scalar code, bit for bit.
use super::super::grad::{FastVjp, PointForm};
use super::super::{decide, FastOptions, FastRow, Mutant, RowCotangents};
use super::*;
use crate::oracle::Exact;
use crate::spec::{pow2, EntropyLogits, Logits, Problem};
use ndarray::{Array1, Array2};

const TARGETS: [Dtype; 4] = [Dtype::F64, Dtype::F32, Dtype::Bf16, Dtype::F16];

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A value `m 2^e`, `e` in `[lo, hi]`, of either sign when `signed`;
    /// sometimes 0, a subnormal or a power of two (rounding ties).
    fn value(&mut self, lo: i32, hi: i32, signed: bool) -> f64 {
        let e = lo + self.below((hi - lo + 1) as u64) as i32;
        let m = 1.0 + (self.next() >> 11) as f64 * pow2(-53);
        let s = if signed && self.next() & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        match self.below(23) {
            0 => 0.0,
            1 => s * f64::from_bits(self.below(1 << 52)),
            2 => s * pow2(e.clamp(-1074, 1023)),
            _ => s * m * pow2(e.clamp(-1022, 1023)),
        }
    }
}

fn same_f64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Every field of two `Exact`s the same bits.
fn same_exact(a: &Exact, b: &Exact) -> bool {
    a.decided == b.decided
        && [
            (a.enclosure.lo, b.enclosure.lo),
            (a.enclosure.hi, b.enclosure.hi),
            (a.rounded, b.rounded),
            (a.offset.lo, b.offset.lo),
            (a.offset.hi, b.offset.hi),
        ]
        .iter()
        .all(|&(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn four_lanes_equal_the_scalar_element_and_decision() {
    if !available() {
        eprintln!("no AVX2: the lanes are never used here");
        return;
    }
    let mut rng = Rng(0x1A4E_5EED_0F7E_0001);
    for case in 0..4000 {
        // Row constants over wide ranges (tiny ones put the results
        // below bf16 / f16's normal range: the scalar fallback lanes).
        let scale = [(-8, 4), (-150, -100), (-30, 30), (-1074, -1000)][case % 4];
        let pt = PointForm {
            k1: rng.value(scale.0, scale.1, true),
            dk1: rng.value(scale.0 - 50, scale.1 - 40, false),
            k2: rng.value(scale.0, scale.1, true),
            dk2: rng.value(scale.0 - 50, scale.1 - 40, false),
            rho: rng.value(-4, 6, false),
            dr: rng.value(-60, -40, false),
            abs: 64.0 * f64::from_bits(1) * pow2(11) * rng.value(0, 20, false),
            exp_w: case % 7 != 0,
            shift_w: case % 5 != 0,
        };
        let with_q = case % 3 != 0;
        let mut a = [0.0; 4];
        let mut r = [0.0; 4];
        let mut exact = [false; 4];
        for l in 0..4 {
            (a[l], r[l], exact[l]) = match rng.below(9) {
                // A non-member's cache slot; the argmax.
                0 => (f64::INFINITY, 0.0, true),
                1 => (0.0, 1.0, true),
                _ => {
                    let a = rng.value(-60, 9, false);
                    (a, (-a).exp(), rng.next() & 1 == 1)
                }
            };
        }
        for target in TARGETS {
            let b = plain4(&pt, &a, &r, &exact, with_q, target).expect("AVX2");
            for l in 0..4 {
                let iv = FastVjp::element_point(&pt, a[l], r[l], exact[l], with_q);
                let ctx = format!(
                    "case {case} lane {l} {target:?} {pt:?} a {} r {} exact {}",
                    a[l], r[l], exact[l]
                );
                assert!(
                    same_f64(b.lo[l], iv.lo) && same_f64(b.hi[l], iv.hi),
                    "{ctx}"
                );
                let d = decide(iv, target);
                assert_eq!(b.decided & (1 << l) != 0, d.is_some(), "{ctx}");
                if let Some(d) = d {
                    let fin = b.finite & (1 << l) != 0;
                    let lanes = Exact {
                        enclosure: b.enclosure(l),
                        rounded: b.rounded[l],
                        decided: true,
                        offset: if fin {
                            Interval {
                                lo: b.olo[l],
                                hi: b.ohi[l],
                            }
                        } else {
                            crate::oracle::round::UNKNOWN_OFFSET
                        },
                    };
                    assert!(same_exact(&lanes, &d), "{ctx}: {lanes:?} vs {d:?}");
                }
            }
        }
    }
}

#[test]
fn four_lane_roundings_and_directed_sums_equal_the_scalar_ones() {
    use super::super::decide::round_to;
    use crate::interval::{add_dn, add_up};
    if !available() {
        eprintln!("no AVX2: the lanes are never used here");
        return;
    }
    let mut rng = Rng(0x0DD5_7E57_0F7E_0003);
    // Ties of bf16 / f16 (midpoints of neighbours, both parities),
    // overflow edges, the subnormal range, zeros, infinities, NaN.
    let mut special = vec![
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MAX,
        f64::MIN,
    ];
    for d in [Dtype::Bf16, Dtype::F16] {
        let m = d.max_finite();
        let half_ulp = d.ulp(m) / 2.0;
        special.extend([
            m,
            m + half_ulp,
            m + half_ulp / 2.0,
            pow2(d.min_normal_exp()),
        ]);
    }
    special.extend([
        f32::MAX as f64,
        f32::MAX as f64 * (1.0 + f32::EPSILON as f64 / 2.0),
    ]);
    let tie = |rng: &mut Rng, d: Dtype| {
        let e = d.min_normal_exp() + rng.below(40) as i32;
        let b = d.round_f64(rng.value(e, e, true));
        b + b.signum() * d.ulp(b.abs()) / 2.0
    };
    for case in 0..20_000 {
        let mut x = [0.0; 4];
        let mut y = [0.0; 4];
        for l in 0..4 {
            x[l] = match rng.below(6) {
                0 => special[rng.below(special.len() as u64) as usize],
                1 => tie(&mut rng, Dtype::Bf16),
                2 => tie(&mut rng, Dtype::F16),
                3 => rng.value(-1074, -1000, true),
                _ => rng.value(-200, 200, true),
            };
            y[l] = match rng.below(4) {
                0 => special[rng.below(special.len() as u64) as usize],
                1 => -x[l] * (1.0 + rng.value(-60, -40, true)),
                _ => rng.value(-200, 200, true),
            };
        }
        for target in TARGETS {
            // SAFETY: AVX2 is present (checked above).
            let [r, dn, up, nu, nd] = unsafe { x86::primitives4(&x, &y, target) };
            for l in 0..4 {
                let ctx = format!("case {case} {target:?} x {:e} y {:e}", x[l], y[l]);
                assert!(
                    same_f64(r[l], round_to(x[l], target)),
                    "round {ctx}: {}",
                    r[l]
                );
                assert!(same_f64(dn[l], add_dn(x[l], y[l])), "add_dn {ctx}");
                assert!(same_f64(up[l], add_up(x[l], y[l])), "add_up {ctx}");
                assert!(same_f64(nu[l], x[l].next_up()), "next_up {ctx}");
                assert!(same_f64(nd[l], x[l].next_down()), "next_down {ctx}");
            }
        }
    }
}

/// A row: Gaussian logits with `-inf` entries and a few spread ones.
fn row(rng: &mut Rng, v: usize, spread: f64) -> Vec<f32> {
    (0..v)
        .map(|_| match rng.below(40) {
            0 => f32::NEG_INFINITY,
            1 => (spread * (rng.next() >> 11) as f64 * pow2(-53)) as f32,
            _ => ((rng.next() >> 11) as f64 * pow2(-53) * 12.0 - 6.0) as f32,
        })
        .collect()
}

#[test]
fn four_lanes_equal_the_scalar_decide_slice() {
    if !available() {
        eprintln!("no AVX2: the lanes are never used here");
        return;
    }
    let mut rng = Rng(0x5EED_0F7E_1A4E_0002);
    let v = 1031; // not a multiple of 4: the scalar tail runs too
    let (mut n_pending, mut n_decided) = (0, 0);
    for case in 0..48 {
        let spread = [10.0, 200.0, 900.0, 1e30][case % 4];
        let mut x = Array2::from_shape_vec((1, v), row(&mut rng, v, spread)).unwrap();
        let mut mask = Array2::from_shape_fn((1, v), |_| rng.below(9) != 0);
        let tok = Array1::from_elem(1, rng.below(v as u64) as i64);
        let ids = Array2::from_shape_fn((1, 3), |(_, k)| (k * 4 + rng.below(4) as usize) as i64);
        // The target and the top-k ids: allowed, finite.
        for &j in ids.iter().chain(tok.iter()) {
            mask[[0, j as usize]] = true;
            x[[0, j as usize]] = 1.5;
        }
        let mut p = Problem::new(Logits::F32(x.view()));
        p.tokens = Some(tok.view());
        p.topk_ids = Some(ids.view());
        if case % 3 == 0 {
            p.sampling_mask = Some(mask.view());
        }
        p.options.temperature = [1.0, 0.5, 0.7][case % 3 / 2 + case % 2];
        let mutant = match case % 8 {
            5 => Some(Mutant::ExpNotWidened),
            6 => Some(Mutant::ShiftNotWidened),
            _ => None,
        };
        let opts = FastOptions {
            entropy: Some(EntropyLogits::Masked),
            per_entry: true,
            mutant,
            ..Default::default()
        };
        let fr = FastRow::new(&p, 0, opts).unwrap();
        let gk = [0.5, 0.0, -0.25];
        let (g, h) = [(-1.0, 0.25), (0.0, 0.5), (1.5, 0.0), (-0.75, -2.0)][case % 4];
        let cot = RowCotangents {
            g,
            h,
            topk: if case % 2 == 0 { &gk } else { &[] },
            ..Default::default()
        };
        let fv = fr.vjp(&cot);
        assert!(fv.pt.is_some(), "case {case}: the plain form applies");
        for target in TARGETS {
            let (mut o1, mut o2) = (vec![Exact::point(1.0); v], vec![Exact::point(2.0); v]);
            let (mut p1, mut p2) = (Vec::new(), Vec::new());
            fv.decide_slice(target, &mut o1, &mut p1);
            scalar(|| fv.decide_slice(target, &mut o2, &mut p2));
            assert_eq!(p1, p2, "case {case} {target:?}");
            n_pending += p1.len();
            n_decided += o1
                .iter()
                .filter(|e| e.enclosure.lo != e.enclosure.hi)
                .count();
            for j in 0..v {
                assert!(
                    same_exact(&o1[j], &o2[j]),
                    "case {case} {target:?} j {j}: {:?} vs {:?}",
                    o1[j],
                    o2[j]
                );
            }
        }
    }
    // Both outcomes occur (f64 targets leave almost every element to MPFR).
    assert!(
        n_pending > 1000 && n_decided > 1000,
        "{n_pending} {n_decided}"
    );
}
