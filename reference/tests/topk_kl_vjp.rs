//! The VJP of the top-k KL to a teacher (`grad_forward_kl`,
//! `grad_reverse_kl`, renormalised or not; docs/design.md, "The loss side") against an
//! independent derivative: central finite differences of the definition
//! evaluated in 900-bit MPFR (step `2^-160`: truncation `~2^-320`, far below
//! an f64 ulp of any element checked), correctly rounded to f32 and f64;
//! together with a top-k log-prob cotangent at the same ids; plus the
//! closed forms at `-inf` logits and teacher entries and the typed error of
//! an infinite reverse-KL gradient.

use logprobe_reference::oracle::{round_to_dtype, Exact, Oracle, Tier};
use logprobe_reference::spec::{Cotangents, Dtype, Logits, Output, Problem, SpecError, TopkKl};
use logprobe_reference::splitmix::SplitMix64;
use ndarray::{array, Array1, Array2};
use rug::Float;

const P: u32 = 900;

/// `g_f F + g_r R + sum_k G_k l_k` of one row by the definition, `x [V]`
/// the raw logits (MPFR), `T` the temperature.
#[allow(clippy::too_many_arguments)]
fn objective(
    x: &[Float],
    t: f64,
    ids: &[usize],
    a: &[f64],
    renorm: bool,
    (gf, gr): (f64, f64),
    gk: &[f64],
) -> Float {
    let z: Vec<Float> = x.iter().map(|v| Float::with_val(P, v / t)).collect();
    let mut s = Float::with_val(P, 0);
    for zj in &z {
        if zj.is_finite() {
            s += zj.clone().exp();
        }
    }
    let lse = s.ln();
    let l: Vec<Float> = ids
        .iter()
        .map(|&id| Float::with_val(P, &z[id] - &lse))
        .collect();
    let mut out = Float::with_val(P, 0);
    for (lk, &g) in l.iter().zip(gk) {
        if g != 0.0 {
            out += Float::with_val(P, lk * g);
        }
    }
    let mut lr = l.clone();
    if renorm {
        let mut m = Float::with_val(P, 0);
        for lk in &l {
            m += lk.clone().exp();
        }
        let lnm = m.ln();
        for lk in lr.iter_mut() {
            *lk -= &lnm;
        }
    }
    for (lk, &ak) in lr.iter().zip(a) {
        if ak != f64::NEG_INFINITY && lk.is_finite() {
            let tk = Float::with_val(P, ak).exp();
            out += Float::with_val(P, &tk * (Float::with_val(P, ak) - lk)) * gf;
        }
        if lk.is_finite() {
            out += Float::with_val(P, lk.clone().exp() * (lk.clone() - ak)) * gr;
        }
    }
    out
}

struct Case {
    x: Array2<f32>,
    ids: Array2<i64>,
    a: Array2<f64>,
    t: f64,
    gf: Array1<f64>,
    gr: Array1<f64>,
    gk: Option<Array2<f64>>,
}

fn case(seed: u64, n: usize, v: usize, k: usize) -> Case {
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
        let vals: Vec<f64> = (0..k).map(|_| -1.0 - 3.0 * rng.uniform()).collect();
        let mass: f64 = vals.iter().map(|&q| q.exp()).sum();
        let shift = if mass > 0.99 { (mass / 0.99).ln() } else { 0.0 };
        for c in 0..k {
            ids[[r, c]] = perm[c] as i64;
            a[[r, c]] = (vals[c] - shift) as f32 as f64;
        }
    }
    let gf = Array1::from_shape_fn(n, |_| (rng.normal() as f32) as f64);
    let gr = Array1::from_shape_fn(n, |_| (rng.normal() as f32) as f64);
    let gk = rng
        .chance(0.5)
        .then(|| Array2::from_shape_fn((n, k), |_| (rng.normal() as f32) as f64));
    Case {
        x,
        ids,
        a,
        t,
        gf,
        gr,
        gk,
    }
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

fn cotangents(c: &Case) -> Cotangents<'_> {
    Cotangents::default()
        .with_column(Output::ForwardKl, c.gf.view())
        .with_column(Output::ReverseKl, c.gr.view())
        .with(Output::TopkLogProbs, c.gk.as_ref().map(|g| g.view()))
}

#[test]
fn kl_vjp_is_the_correctly_rounded_derivative() {
    let h = Float::with_val(P, Float::i_exp(1, -160));
    let mut checked = 0;
    let (mut fast_total, mut fast_mpfr) = (0u64, 0u64);
    for seed in 0..10u64 {
        let (n, v, k) = (2, 20, 1 + (seed as usize % 6));
        let c = case(seed, n, v, k);
        for renorm in [false, true] {
            let p = problem(&c, renorm);
            let cot = cotangents(&c);
            for target in [Dtype::F32, Dtype::F64] {
                // MPFR alone, then the f64 tier with MPFR for what it
                // leaves undecided: both the correctly rounded derivative.
                let grads: Vec<Array2<Exact>> = [Tier::Mpfr, Tier::FastVjp]
                    .into_iter()
                    .map(|tier| {
                        let o = Oracle {
                            tier,
                            ..Oracle::default()
                        };
                        let (g, fb) = o.vjp_counted(&p, &cot, target).unwrap();
                        if tier != Tier::Mpfr {
                            fast_total += fb.outputs;
                            fast_mpfr += fb.outputs_mpfr;
                        }
                        g
                    })
                    .collect();
                for r in 0..n {
                    let ids: Vec<usize> = c.ids.row(r).iter().map(|&i| i as usize).collect();
                    let a: Vec<f64> = c.a.row(r).to_vec();
                    let gk = c.gk.as_ref().map_or(vec![0.0; k], |g| g.row(r).to_vec());
                    let gs = (c.gf[r], c.gr[r]);
                    let x: Vec<Float> = c.x.row(r).iter().map(|&q| Float::with_val(P, q)).collect();
                    for j in 0..v {
                        let (mut xp, mut xm) = (x.clone(), x.clone());
                        xp[j] += &h;
                        xm[j] -= &h;
                        let fd = (objective(&xp, c.t, &ids, &a, renorm, gs, &gk)
                            - objective(&xm, c.t, &ids, &a, renorm, gs, &gk))
                            / (Float::with_val(P, &h) * 2u32);
                        let off_support = !ids.contains(&j);
                        let plain = gk.iter().all(|&g| g == 0.0);
                        for (tier, grad) in grads.iter().enumerate() {
                            let e = grad[[r, j]];
                            let at =
                                format!("row {r} col {j} seed {seed} renorm {renorm} tier {tier}");
                            assert!(e.decided, "{at}");
                            if renorm && off_support && plain {
                                // Exactly 0 off the ids (the weights sum to 0).
                                assert_eq!(e.rounded, 0.0, "{at}");
                                assert!(
                                    fd.clone().abs() < Float::with_val(P, Float::i_exp(1, -250))
                                );
                                continue;
                            }
                            let want = round_to_dtype(&fd, target);
                            assert_eq!(
                                e.rounded.to_bits(),
                                want.to_bits(),
                                "{at} {target:?}: {} vs {}",
                                e.rounded,
                                want
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1600, "{checked}");
    // The f64 tier decides most elements itself (the KL's slopes enclosed
    // on that tier), MPFR only what it leaves undecided: here 458 of 1600
    // (tiny rows, V = 20 with up to 6 ids, half of them f64 targets).
    assert!(
        fast_mpfr * 2 < fast_total,
        "MPFR decided {fast_mpfr} of {fast_total} elements behind the f64 tier"
    );
    eprintln!("f64 tier: MPFR decided {fast_mpfr} of {fast_total} gradient elements");
}

/// One row, `T = 1`, no top-k cotangent: the closed form of the
/// derivative (docs/design.md, "The loss side") in f64 (tight enough for a
/// `-inf` column's finite value).
fn grad_of(
    x: Array2<f32>,
    ids: Array2<i64>,
    a: Array2<f64>,
    gf: f64,
    gr: f64,
    renorm: bool,
) -> Result<Vec<f64>, SpecError> {
    let c = Case {
        x,
        ids,
        a,
        t: 1.0,
        gf: array![gf],
        gr: array![gr],
        gk: None,
    };
    let p = problem(&c, renorm);
    let g = Oracle::default().vjp(&p, &cotangents(&c), Dtype::F64)?;
    Ok(g.row(0).iter().map(|e| e.rounded).collect())
}

#[test]
fn edge_gradients_of_the_kl() {
    // A student -inf at a teacher id: forward KL +inf, its gradient finite:
    // -g t_k at the id (p = 0), g S p_j elsewhere.
    let x = array![[0.0f32, f32::NEG_INFINITY, 2.0]];
    let g = grad_of(
        x,
        array![[1i64, 2]],
        array![[-3.0f64, -0.2]],
        1.0,
        0.0,
        false,
    )
    .unwrap();
    let s = (-3.0f64).exp() + (-0.2f64).exp();
    let (e0, e2) = (1.0f64, 2.0f64.exp());
    let (p0, p2) = (e0 / (e0 + e2), e2 / (e0 + e2));
    let want = [s * p0, -(-3.0f64).exp(), s * p2 - (-0.2f64).exp()];
    for (got, want) in g.iter().zip(want) {
        assert!(
            (got - want).abs() <= 1e-15 * want.abs().max(1.0),
            "{g:?} vs {want}"
        );
    }
    // The same id under the reverse KL: no term there (p ln p -> 0), and the
    // -inf column's gradient is exactly 0.
    let x = array![[0.0f32, f32::NEG_INFINITY, 2.0]];
    let g = grad_of(
        x,
        array![[1i64, 2]],
        array![[-3.0f64, -0.2]],
        0.0,
        1.0,
        false,
    )
    .unwrap();
    assert_eq!(g[1], 0.0);
    // A teacher -inf: no forward term at that id.
    let x = array![[0.0f32, 1.0, 2.0]];
    let g = grad_of(
        x,
        array![[0i64, 2]],
        array![[f64::NEG_INFINITY, -0.5]],
        2.0,
        0.0,
        false,
    )
    .unwrap();
    let sum = 0.0f64.exp() + 1.0f64.exp() + 2.0f64.exp();
    let t = (-0.5f64).exp();
    assert!((g[0] - 2.0 * t * (1.0 / sum)).abs() < 1e-15);
    // ... and an infinite reverse-KL gradient where the student has mass.
    let x = array![[0.0f32, 1.0, 2.0]];
    assert_eq!(
        grad_of(
            x,
            array![[2i64, 0]],
            array![[-0.5f64, f64::NEG_INFINITY]],
            0.0,
            1.5,
            false
        )
        .unwrap_err(),
        SpecError::KlGradientInfinite {
            row: 0,
            k: 1,
            id: 0,
            cotangent: 1.5
        }
    );
    // One live id renormalised: the KL is a constant, its gradient exactly 0.
    let x = array![[0.5f32, 1.0, 2.0]];
    let g = grad_of(x, array![[1i64]], array![[-0.25f64]], 1.0, -2.0, true).unwrap();
    assert!(g.iter().all(|&v| v == 0.0), "{g:?}");
    // One live id renormalised beside a dead one (a -inf logit) where the
    // teacher has mass: the forward KL is +inf and its gradient the limit
    // z_1 -> -inf of the finite rows' (autograd's): -g t_1 at the dead id,
    // +g t_1 at the live one, 0 elsewhere; the reverse KL adds nothing.
    // The limit checked against the definition at z_1 = -60 (900 bits: the
    // two differ by ~e^-60 relative).
    let x = array![[0.5f32, f32::NEG_INFINITY, 2.0]];
    let (gf, gr, a) = (1.5f64, -2.0f64, [-3.0f64, -0.25]);
    let g = grad_of(x, array![[1i64, 2]], array![a], gf, gr, true).unwrap();
    let t1 = a[0].exp();
    assert_eq!(g[0], 0.0, "{g:?}");
    assert!((g[1] + gf * t1).abs() <= 1e-16 * t1, "{g:?}");
    assert!((g[2] - gf * t1).abs() <= 1e-16 * t1, "{g:?}");
    let f = |z1: &Float| {
        let xs = [Float::with_val(P, 0.5), z1.clone(), Float::with_val(P, 2.0)];
        objective(&xs, 1.0, &[1, 2], &a, true, (gf, gr), &[0.0, 0.0])
    };
    let h = Float::with_val(P, Float::i_exp(1, -160));
    let z1 = Float::with_val(P, -60.0);
    let fd = Float::with_val(
        P,
        f(&Float::with_val(P, &z1 + &h)) - f(&Float::with_val(P, &z1 - &h)),
    );
    let fd = (fd / Float::with_val(P, &h * 2u32)).to_f64();
    assert!(
        (fd - g[1]).abs() <= 1e-20,
        "finite difference {fd} vs {}",
        g[1]
    );
    // A cotangent without options.topk_kl is refused.
    let x = array![[0.5f32, 1.0]];
    let ones = array![1.0f64];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.options.entropy = None;
    let cot = Cotangents::default().with_column(Output::ForwardKl, ones.view());
    assert!(matches!(
        Oracle::default().vjp(&p, &cot, Dtype::F32),
        Err(SpecError::NoCotangent { .. })
    ));
}
