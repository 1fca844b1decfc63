//! The top-k KL to a teacher (`forward_kl`, `reverse_kl`, renormalised or
//! not; docs/design.md, "The loss side") in the oracle, against the definition
//! evaluated directly in 480-bit MPFR (log-softmax of `z = x / T` over the
//! allowed entries, the K-term sums), on both tiers: correctly rounded to
//! f32 and f64, including rows where the KL is tiny next to its terms (the
//! teacher is the student rounded to f32, so the terms cancel); plus the
//! edge values and the teacher's typed errors.

use logprobe_reference::oracle::{round_to_dtype, Oracle, Tier};
use logprobe_reference::spec::{Dtype, Logits, Output, Problem, SpecError, TopkKl};
use logprobe_reference::splitmix::SplitMix64;
use ndarray::{array, Array2};
use rug::Float;

const P: u32 = 480;

/// `(forward, reverse)` of row `r` by the definition.
fn definition(
    x: &Array2<f32>,
    r: usize,
    t: f64,
    ids: &[i64],
    a: &[f64],
    renorm: bool,
) -> (Float, Float) {
    let z: Vec<Float> = x
        .row(r)
        .iter()
        .map(|&v| Float::with_val(P, v) / t)
        .collect();
    let mut s = Float::with_val(P, 0);
    for zj in &z {
        s += zj.clone().exp();
    }
    let lse = s.ln();
    let mut l: Vec<Float> = ids
        .iter()
        .map(|&id| Float::with_val(P, &z[id as usize] - &lse))
        .collect();
    if renorm {
        let mut p = Float::with_val(P, 0);
        for lk in &l {
            p += lk.clone().exp();
        }
        let lnp = p.ln();
        for lk in l.iter_mut() {
            *lk -= &lnp;
        }
    }
    let (mut f, mut rv) = (Float::with_val(P, 0), Float::with_val(P, 0));
    for (lk, &ak) in l.iter().zip(a) {
        if ak != f64::NEG_INFINITY {
            f += Float::with_val(P, ak).exp() * (Float::with_val(P, ak) - lk);
        }
        rv += lk.clone().exp() * (lk.clone() - ak);
    }
    (f, rv)
}

struct Case {
    x: Array2<f32>,
    ids: Array2<i64>,
    a: Array2<f64>,
    t: f64,
}

/// A random case: `n` rows of width `v`, `k` distinct ids, a teacher that
/// is the student rounded to f32 (`tiny`) or a perturbed, sub-normalised
/// one.
fn case(seed: u64, n: usize, v: usize, k: usize, tiny: bool) -> Case {
    let mut rng = SplitMix64::new(seed);
    let t = if rng.chance(0.5) { 1.0 } else { 0.7f32 as f64 };
    let x = Array2::from_shape_fn((n, v), |_| (3.0 * rng.normal()) as f32);
    let mut ids = Array2::<i64>::zeros((n, k));
    let mut a = Array2::<f64>::zeros((n, k));
    for r in 0..n {
        let mut perm: Vec<usize> = (0..v).collect();
        for i in (1..v).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let z: Vec<f64> = x.row(r).iter().map(|&v| v as f64 / t).collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + z.iter().map(|&q| (q - m).exp()).sum::<f64>().ln();
        let mut vals = Vec::with_capacity(k);
        for c in 0..k {
            ids[[r, c]] = perm[c] as i64;
            let lp = z[perm[c]] - lse;
            vals.push(if tiny { lp } else { lp + 0.3 * rng.normal() });
        }
        // A sub-probability teacher: mass at most 0.99 before rounding.
        let mass: f64 = vals.iter().map(|&q| q.exp()).sum();
        let shift = if mass > 0.99 { (mass / 0.99).ln() } else { 0.0 };
        for c in 0..k {
            a[[r, c]] = (vals[c] - shift) as f32 as f64;
        }
    }
    Case { x, ids, a, t }
}

fn problem<'a>(c: &'a Case, renorm: bool) -> Problem<'a> {
    let mut p = Problem::new(Logits::F32(c.x.view()));
    p.options.temperature = c.t;
    p.options.entropy = None;
    p.topk_ids = Some(c.ids.view());
    p.teacher_topk_log_probs = Some(c.a.view());
    p.options.topk_kl = Some(TopkKl {
        forward: true,
        reverse: true,
        renormalized: renorm,
        teacher_dtype: Dtype::F32,
    });
    p
}

#[test]
fn oracle_kl_is_correctly_rounded_on_both_tiers() {
    let mut tiny_seen = 0;
    for seed in 0..24u64 {
        let tiny = seed % 3 == 0;
        let c = case(seed, 3, 40, 1 + (seed as usize % 7), tiny);
        for renorm in [false, true] {
            // A teacher taken from the unrenormalised student may exceed
            // mass 1 after renormalisation: fine, the check is on a_k.
            let p = problem(&c, renorm);
            for tier in [Tier::Fast, Tier::Mpfr] {
                let o = Oracle {
                    tier,
                    ..Oracle::default()
                };
                for target in [Dtype::F32, Dtype::F64] {
                    let f = o.forward(&p, target).unwrap();
                    for r in 0..3 {
                        let ids: Vec<i64> = c.ids.row(r).to_vec();
                        let a: Vec<f64> = c.a.row(r).to_vec();
                        let (fd, rd) = definition(&c.x, r, c.t, &ids, &a, renorm);
                        for (out, d) in [(Output::ForwardKl, &fd), (Output::ReverseKl, &rd)] {
                            let e = f.values[out][[r, 0]];
                            assert!(e.decided, "{out} row {r} seed {seed}");
                            let want = round_to_dtype(d, target);
                            assert_eq!(
                                e.rounded.to_bits(),
                                want.to_bits(),
                                "{out} row {r} seed {seed} renorm {renorm} {tier:?} {target:?}: {} vs {}",
                                e.rounded,
                                want
                            );
                            let dv = d.to_f64();
                            if tiny && !renorm && dv.abs() < 1e-9 && dv != 0.0 {
                                tiny_seen += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(tiny_seen > 0, "no tiny KL was exercised");
}

#[test]
fn edge_values_of_the_kl() {
    // Teacher -inf: no forward term; reverse +inf where the student has mass.
    let x = array![[0.0f32, 1.0, 2.0]];
    let ids = array![[2i64, 0]];
    let a = array![[-0.5f64, f64::NEG_INFINITY]];
    let c = Case {
        x: x.clone(),
        ids: ids.clone(),
        a: a.clone(),
        t: 1.0,
    };
    let f = Oracle::default()
        .forward(&problem(&c, false), Dtype::F32)
        .unwrap();
    assert_eq!(f.values[Output::ReverseKl][[0, 0]].rounded, f64::INFINITY);
    let fk = f.values[Output::ForwardKl][[0, 0]].rounded;
    let (want, _) = definition(&x, 0, 1.0, &[2, 0], &[-0.5, f64::NEG_INFINITY], false);
    assert_eq!(fk, round_to_dtype(&want, Dtype::F32));
    // Student -inf at an id: forward +inf, reverse term 0.
    let x = array![[0.0f32, f32::NEG_INFINITY, 2.0]];
    let c = Case {
        x,
        ids: array![[1i64, 2]],
        a: array![[-3.0f64, -0.2]],
        t: 1.0,
    };
    let f = Oracle::default()
        .forward(&problem(&c, false), Dtype::F32)
        .unwrap();
    assert_eq!(f.values[Output::ForwardKl][[0, 0]].rounded, f64::INFINITY);
    assert!(f.values[Output::ReverseKl][[0, 0]].rounded.is_finite());
    // One id, a = l = 0 (a one-hot row): exactly 0, decided at once.
    let x = array![[f32::NEG_INFINITY, 5.0]];
    let c = Case {
        x,
        ids: array![[1i64]],
        a: array![[0.0f64]],
        t: 1.0,
    };
    for tier in [Tier::Fast, Tier::Mpfr] {
        let o = Oracle {
            tier,
            ..Oracle::default()
        };
        let f = o.forward(&problem(&c, false), Dtype::F32).unwrap();
        for out in [Output::ForwardKl, Output::ReverseKl] {
            let e = f.values[out][[0, 0]];
            assert!(e.decided && e.rounded == 0.0, "{out}: {e:?}");
        }
    }
    // Over a partial support the KL can be negative.
    let x = array![[0.0f32, 3.0]];
    let c = Case {
        x,
        ids: array![[1i64]],
        a: array![[-(2f64.ln())]],
        t: 1.0,
    };
    let f = Oracle::default()
        .forward(&problem(&c, false), Dtype::F32)
        .unwrap();
    assert!(f.values[Output::ForwardKl][[0, 0]].rounded < 0.0);
}

#[test]
fn teacher_and_ids_that_cannot_carry_a_kl_are_typed_errors() {
    let x = array![[0.0f32, 1.0, 2.0, f32::NEG_INFINITY], [1.0, 0.0, 0.5, 0.25]];
    let base = Case {
        x,
        ids: array![[0i64, 1], [2, 3]],
        a: array![[-1.5f64, -2.0], [-1.0, -3.0]],
        t: 1.0,
    };
    let o = Oracle::default();
    assert!(o.forward(&problem(&base, true), Dtype::F32).is_ok());
    let with = |ids: Array2<i64>, a: Array2<f64>| Case {
        x: base.x.clone(),
        ids,
        a,
        t: 1.0,
    };
    let c = with(base.ids.clone(), array![[-1.5, 0.25], [-1.0, -3.0]]);
    assert_eq!(
        o.forward(&problem(&c, false), Dtype::F32).unwrap_err(),
        SpecError::BadTeacherLogProb {
            row: 0,
            k: 1,
            value: 0.25
        }
    );
    let c = with(base.ids.clone(), array![[-1.5, -2.0], [f64::NAN, -3.0]]);
    assert!(matches!(
        o.forward(&problem(&c, false), Dtype::F32),
        Err(SpecError::BadTeacherLogProb { row: 1, k: 0, .. })
    ));
    let c = with(base.ids.clone(), array![[-1.5, -2.0], [-0.1, -0.2]]);
    assert!(matches!(
        o.forward(&problem(&c, false), Dtype::F32),
        Err(SpecError::TeacherMassAboveOne { row: 1, .. })
    ));
    let c = with(array![[0, 1], [2, 2]], base.a.clone());
    assert_eq!(
        o.forward(&problem(&c, false), Dtype::F32).unwrap_err(),
        SpecError::TopkIdDuplicate {
            row: 1,
            k: 1,
            id: 2
        }
    );
    let mask = array![[true, false, true, true], [true, true, true, true]];
    let mut p = problem(&base, false);
    p.sampling_mask = Some(mask.view());
    assert_eq!(
        o.forward(&p, Dtype::F32).unwrap_err(),
        SpecError::TopkIdMasked {
            row: 0,
            k: 1,
            id: 1
        }
    );
    // Renormalised over ids whose logits are all -inf.
    let c = with(array![[0, 1], [3, 3]], base.a.clone());
    assert!(o.forward(&problem(&c, true), Dtype::F32).is_err());
    let c = with(array![[3, 0], [0, 1]], base.a.clone());
    let x1 = array![
        [f32::NEG_INFINITY, 0.0, 1.0, f32::NEG_INFINITY],
        [0.0, 1.0, 0.0, 0.0]
    ];
    let c = Case { x: x1, ..c };
    let c = Case {
        ids: array![[0i64, 3], [0, 1]],
        ..c
    };
    assert_eq!(
        o.forward(&problem(&c, true), Dtype::F32).unwrap_err(),
        SpecError::KlNoStudentMass { row: 0 }
    );
    // The teacher without ids, or of the wrong shape.
    let mut p = problem(&base, false);
    p.topk_ids = None;
    assert!(matches!(
        o.forward(&p, Dtype::F32),
        Err(SpecError::MissingTensor {
            tensor: "topk_ids",
            ..
        })
    ));
    let short = array![[-1.0f64], [-1.0]];
    let mut p = problem(&base, false);
    p.teacher_topk_log_probs = Some(short.view());
    assert!(matches!(
        o.forward(&p, Dtype::F32),
        Err(SpecError::ShapeMismatch {
            tensor: "teacher_topk_log_probs",
            ..
        })
    ));
}
