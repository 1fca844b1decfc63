//! Self-checks of the exact oracle (docs/design.md, "The oracle"): uniform and
//! one-hot rows, shift invariance at extreme offsets, probabilities summing
//! to 1, the VJP against a 256-bit central difference, two working
//! precisions agreeing, a rounding midpoint, and every error path.

use half::{bf16, f16};
use logprobe_reference::oracle::{
    round_to_dtype, Exact, Oracle, OracleForward, Tier, FAST_PRECISION,
};
use logprobe_reference::spec::{
    pow2, Cotangents, Dtype, EntropyLogits, Logits, Output, Problem, SpecError, TemperatureDtype,
};
use ndarray::{array, Array1, Array2};
use rug::float::Round;
use rug::ops::AddAssignRound;
use rug::Float;

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * pow2(-53)
    }
}

/// `ln v` rounded to `dtype`, from a 1000-bit evaluation.
fn ln_rounded(v: u32, dtype: Dtype) -> f64 {
    round_to_dtype(&Float::with_val(1000, v).ln(), dtype)
}

#[test]
fn uniform_rows_give_ln_v() {
    for v in [1usize, 2, 3, 7, 1000, 32000, 152064] {
        for c in [0.0f32, -3.25, 17.0] {
            let x = Array2::from_elem((1, v), c);
            let t = array![(v / 2) as i64];
            let mut p = Problem::new(Logits::F32(x.view()));
            p.tokens = Some(t.view());
            for target in [Dtype::F64, Dtype::F32, Dtype::Bf16] {
                let f = Oracle::default().forward(&p, target).unwrap();
                let lp = f.values[Output::LogProbs][[0, 0]];
                let h = f.values[Output::Entropy][[0, 0]];
                assert!(lp.decided && h.decided);
                assert_eq!(lp.rounded, -ln_rounded(v as u32, target), "V={v} {target}");
                assert_eq!(h.rounded, ln_rounded(v as u32, target), "V={v} {target}");
                let lse = round_to_dtype(&(Float::with_val(1000, v).ln() + c), target);
                assert_eq!(f.lse[0].rounded, lse);
            }
        }
    }
}

#[test]
fn one_hot_limits_are_exact_and_end_the_loop_at_once() {
    let ninf = f64::NEG_INFINITY;
    let x = array![[ninf, 2.5, ninf, ninf]];
    let t = array![1i64];
    let ids = array![[1i64, 0]];
    let mut p = Problem::new(Logits::F64(x.view()));
    p.tokens = Some(t.view());
    p.topk_ids = Some(ids.view());
    let o = Oracle::default();
    let mpfr = Oracle {
        tier: Tier::Mpfr,
        ..Oracle::default()
    };
    let r = mpfr.forward_row_of(&p, 0, Dtype::F64).unwrap();
    assert_eq!(
        r.precision,
        o.precisions(Dtype::F64)[0],
        "exact results end Ziv's loop at once"
    );
    // The f64 tier decides these exact results without MPFR.
    let fast = o.forward_row_of(&p, 0, Dtype::F64).unwrap();
    assert_eq!(fast.precision, FAST_PRECISION);
    for o in [Output::LogProbs, Output::Entropy] {
        assert_eq!(fast.values[o], r.values[o], "{o}");
    }
    assert_eq!(fast.lse, r.lse);
    let v = &r.values;
    for e in [
        v[Output::LogProbs][0],
        v[Output::Entropy][0],
        v[Output::TopkLogProbs][0],
    ] {
        assert_eq!(e, Exact::point(0.0));
    }
    assert_eq!(v[Output::TopkLogProbs][1].rounded, ninf);
    assert_eq!(r.lse, Exact::point(2.5));
    // Finite but far-away others: log-prob and entropy are tiny, round to 0.
    let x = array![[-1e4f32, 2.5, -3e4, -1e4]];
    p.logits = Logits::F32(x.view());
    let f = o.forward(&p, Dtype::F32).unwrap();
    let lp = f.values[Output::LogProbs][[0, 0]];
    assert!(lp.decided && lp.rounded == 0.0 && lp.enclosure.lo < 0.0 && lp.enclosure.hi <= 0.0);
    let h = f.values[Output::Entropy][[0, 0]];
    assert!(h.decided && h.rounded == 0.0 && h.enclosure.hi > 0.0);
    // The VJP of a one-hot row: the hot entry's (1 - p) and the others' p
    // are below every subnormal; -inf entries are exactly 0.
    let x = array![[ninf, 2.5, ninf, ninf]];
    p.logits = Logits::F64(x.view());
    let g = array![3.0];
    let h = array![1.0];
    let gk = array![[0.5, 0.25]];
    let c = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    let grad = o.vjp(&p, &c, Dtype::F64).unwrap();
    // Column 0 is a live top-k id with a -inf logit: G / T from the formula;
    // its cotangent also gives -G p_j elsewhere.
    let expect = [0.25, -0.25, 0.0, 0.0]; // sums to 0: -G p_1 with p_1 = 1
    for (j, e) in grad.row(0).iter().enumerate() {
        assert!(
            e.decided && e.rounded == expect[j] && !e.rounded.is_nan(),
            "{j}: {e:?}"
        );
    }
    assert_eq!(grad[[0, 2]], Exact::point(0.0));
}

/// Forward and VJP outputs of a row, with everything but lse compared.
fn all_outputs(p: &Problem<'_>, target: Dtype) -> (OracleForward, Array2<Exact>) {
    let n = p.logits.dim().0;
    let g = Array1::from_elem(n, -1.0);
    let h = Array1::from_elem(n, 0.75);
    let k = p.topk_ids.map_or(0, |i| i.ncols());
    let gk = Array2::from_elem((n, k), 0.5);
    let c = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view())
        .with(Output::TopkLogProbs, gk.view());
    (
        Oracle::default().forward(p, target).unwrap(),
        Oracle::default().vjp(p, &c, target).unwrap(),
    )
}

fn assert_same_but_lse(
    a: &(OracleForward, Array2<Exact>),
    b: &(OracleForward, Array2<Exact>),
    what: &str,
) {
    let r = |e: &Exact| (e.rounded, e.decided);
    // lse and z_loss move with the shift; they are not requested here.
    for o in [Output::LogProbs, Output::Entropy, Output::TopkLogProbs] {
        let vals = |f: &OracleForward| f.values[o].iter().map(r).collect::<Vec<_>>();
        assert_eq!(vals(&a.0), vals(&b.0), "{what}: {o}");
    }
    let gr = |g: &Array2<Exact>| g.iter().map(r).collect::<Vec<_>>();
    assert_eq!(gr(&a.1), gr(&b.1), "{what}: grad");
}

#[test]
fn shift_invariance_including_extreme_offsets() {
    let mut rng = Rng(42);
    // (dtype, quantum of the row's values, offset): the offset plus
    // m * quantum is exact in the dtype for the m drawn below.
    let cases: [(Dtype, f64, f64); 6] = [
        (Dtype::F32, pow2(-2), pow2(20)),
        (Dtype::F32, pow2(76), 1.5 * pow2(99)), // ~1e30: gaps of 7.6e22
        (Dtype::F64, pow2(47), 1.5 * pow2(99)), // ~1e30 in f64
        (Dtype::F64, pow2(-30), 1e6),
        (Dtype::F16, 32.0, 65504.0 - 32.0 * 60.0), // near 65504
        (Dtype::Bf16, pow2(-1), 32.0),
    ];
    for (dtype, quantum, offset) in cases {
        let v = 40;
        let m: Vec<f64> = (0..v).map(|_| rng.int(0, 60) as f64).collect();
        let base: Vec<f64> = m.iter().map(|&k| -k * quantum).collect();
        let shifted: Vec<f64> = m
            .iter()
            .map(|&k| offset + 60.0 * quantum - k * quantum)
            .collect();
        let base_shift: Vec<f64> = base.iter().map(|&b| b + 60.0 * quantum).collect();
        for (a, b) in shifted.iter().zip(&base_shift) {
            assert_eq!(dtype.round_f64(*a), *a, "shifted value exact in {dtype}");
            assert_eq!(dtype.round_f64(*b), *b);
        }
        let t = array![3i64];
        let ids = array![[0i64, 5, 7]];
        let mut outs = Vec::new();
        for row in [&base_shift, &shifted] {
            let x64 = Array2::from_shape_vec((1, v), row.clone()).unwrap();
            let (x32, xb, xh) = (
                x64.mapv(|y| y as f32),
                x64.mapv(|y| bf16::from_f32(y as f32)),
                x64.mapv(|y| f16::from_f32(y as f32)),
            );
            let logits = match dtype {
                Dtype::F64 => Logits::F64(x64.view()),
                Dtype::F32 => Logits::F32(x32.view()),
                Dtype::Bf16 => Logits::Bf16(xb.view()),
                Dtype::F16 => Logits::F16(xh.view()),
            };
            let mut p = Problem::new(logits);
            p.tokens = Some(t.view());
            p.topk_ids = Some(ids.view());
            outs.push([all_outputs(&p, Dtype::F32), all_outputs(&p, Dtype::F64)]);
        }
        for (a, b) in outs[0].iter().zip(&outs[1]) {
            assert_same_but_lse(a, b, &format!("{dtype} offset {offset:e}"));
            assert!(b.0.lse[0].decided);
        }
    }
}

/// LLM-like logits: Gaussian bulk, a Zipf head, one dominant token.
fn llm_row(rng: &mut Rng, v: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..v)
        .map(|_| {
            let u = rng.unit().max(1e-300);
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * rng.unit()).cos() * 2.5 - 2.0) as f32
        })
        .collect();
    for r in 1..=16usize {
        let j = (rng.next() % v as u64) as usize;
        x[j] = (16.0 - 3.0 * (r as f64).ln()) as f32;
    }
    x
}

#[test]
fn probabilities_sum_to_one_within_the_enclosure() {
    let mut rng = Rng(7);
    let v = 5000;
    let x = Array2::from_shape_vec((1, v), llm_row(&mut rng, v)).unwrap();
    let mask = Array2::from_shape_fn((1, v), |(_, j)| j % 3 != 0);
    let mut p = Problem::new(Logits::F32(x.view()));
    p.options.temperature = 0.7;
    for masked in [false, true] {
        p.sampling_mask = if masked { Some(mask.view()) } else { None };
        let st = Oracle::default().row_stats(&p, 0).unwrap();
        for probs in [&st.p, &st.q] {
            let (mut lo, mut hi) = (Float::new(200), Float::new(200));
            for iv in probs.iter() {
                assert!(0.0 <= iv.lo && iv.lo <= iv.hi && iv.hi <= 1.0);
                lo.add_assign_round(iv.lo, Round::Down);
                hi.add_assign_round(iv.hi, Round::Up);
            }
            assert!(lo <= 1 && hi >= 1, "sum in [{lo}, {hi}]");
            assert!(Float::with_val(200, &hi - &lo) < 1e-12, "tight");
        }
        // Row statistics are consistent with each other.
        assert!(
            st.s.lo >= 1.0
                && st.ln_s.lo <= st.s.hi.ln()
                && st.s.lo.ln() <= st.ln_s.hi * (1.0 + 1e-15)
        );
        assert!(st.r.lo >= 0.0 && st.m2.lo >= 0.0 && st.d_t.is_none());
        assert_eq!(st.p.len(), v);
        if masked {
            assert!(
                st.p.iter().step_by(3).all(|iv| iv.hi == 0.0) && st.d[0].hi == f64::NEG_INFINITY
            );
        }
    }
}

/// `L(x) = g log_prob_t + h H + sum_k G_k topk_k` from the definitions at
/// 256 bits (no cancellation-free forms).
#[allow(clippy::too_many_arguments)]
fn loss(
    x: &[Float],
    t_inv: &Float,
    mask: &[bool],
    t: usize,
    ids: &[usize],
    g: f64,
    h: f64,
    gk: &[f64],
    masked_entropy: bool,
) -> Float {
    let prec = 256;
    let z: Vec<Option<Float>> = x
        .iter()
        .map(|xi| {
            if xi.is_infinite() {
                None
            } else {
                Some(Float::with_val(prec, xi * t_inv))
            }
        })
        .collect();
    let lse = |member: &dyn Fn(usize) -> bool| -> Float {
        let mut s = Float::new(prec);
        for (j, zj) in z.iter().enumerate() {
            if let (Some(zj), true) = (zj, member(j)) {
                s += Float::with_val(prec, zj.exp_ref());
            }
        }
        s.ln()
    };
    let lse_p = lse(&|j| mask[j]);
    let mut out = Float::with_val(prec, z[t].as_ref().unwrap() - &lse_p) * g;
    for (&id, &gki) in ids.iter().zip(gk) {
        if mask[id] {
            out += Float::with_val(prec, z[id].as_ref().unwrap() - &lse_p) * gki;
        }
    }
    let wm = |j: usize| !masked_entropy || mask[j];
    let lse_w = lse(&wm);
    let mut ent = lse_w.clone();
    for (j, zj) in z.iter().enumerate() {
        if let (Some(zj), true) = (zj, wm(j)) {
            let q = Float::with_val(prec, zj - &lse_w).exp();
            ent -= q * zj;
        }
    }
    out + ent * h
}

#[test]
fn vjp_agrees_with_a_256_bit_central_difference() {
    let ninf = f64::NEG_INFINITY;
    let x = [0.5, 3.25, -1.0, 2.0, ninf, 3.0, -7.5, 2.875, 0.0];
    let mask = [true, false, true, true, true, true, true, false, true];
    let (t, ids) = (3usize, [3usize, 1, 8, 5]);
    let (g, h, gk) = (-1.25, 0.75, [0.5, 2.0, -0.375, 1.0]);
    let step = Float::with_val(256, pow2(-60));
    for (temp, masked_entropy) in [(0.7, false), (1.0, true), (2.0, false)] {
        let xa = Array2::from_shape_vec((1, x.len()), x.to_vec()).unwrap();
        let ma = Array2::from_shape_vec((1, x.len()), mask.to_vec()).unwrap();
        let ta = array![t as i64];
        let ia = Array2::from_shape_vec((1, ids.len()), ids.iter().map(|&i| i as i64).collect())
            .unwrap();
        let mut p = Problem::new(Logits::F64(xa.view()));
        p.tokens = Some(ta.view());
        p.topk_ids = Some(ia.view());
        p.sampling_mask = Some(ma.view());
        p.options.temperature = temp;
        p.options.entropy = Some(if masked_entropy {
            EntropyLogits::Masked
        } else {
            EntropyLogits::Unmasked
        });
        let (ga, ha, gka) = (
            array![g],
            array![h],
            Array2::from_shape_vec((1, 4), gk.to_vec()).unwrap(),
        );
        let c = Cotangents::default()
            .with_column(Output::LogProbs, ga.view())
            .with_column(Output::Entropy, ha.view())
            .with(Output::TopkLogProbs, gka.view());
        let grad = Oracle::default().vjp(&p, &c, Dtype::F64).unwrap();
        let t_inv = Float::with_val(256, 1) / Float::with_val(256, temp);
        let xf: Vec<Float> = x.iter().map(|&v| Float::with_val(256, v)).collect();
        for j in 0..x.len() {
            let e = grad[[0, j]];
            assert!(e.decided);
            if x[j] == ninf {
                assert_eq!(e.rounded, 0.0, "-inf entries get exactly 0");
                continue;
            }
            let (mut xp, mut xm) = (xf.clone(), xf.clone());
            xp[j] += &step;
            xm[j] -= &step;
            let lp = loss(&xp, &t_inv, &mask, t, &ids, g, h, &gk, masked_entropy);
            let lm = loss(&xm, &t_inv, &mask, t, &ids, g, h, &gk, masked_entropy);
            let fd = Float::with_val(256, lp - lm) / Float::with_val(256, &step * 2u32);
            let diff = Float::with_val(256, &fd - e.rounded).abs();
            let tol = Float::with_val(256, fd.abs_ref()) * pow2(-50) + pow2(-200);
            assert!(
                diff <= tol,
                "T={temp} j={j}: oracle {} vs central difference {fd}",
                e.rounded
            );
            // The enclosure holds the derivative too (up to the difference's own error).
            assert!(
                e.enclosure.lo - pow2(-90) <= fd && fd <= e.enclosure.hi + pow2(-90),
                "j={j}"
            );
        }
    }
}

#[test]
fn two_working_precisions_agree() {
    let mut rng = Rng(99);
    let (n, v) = (3, 3000);
    let data: Vec<f32> = (0..n).flat_map(|_| llm_row(&mut rng, v)).collect();
    let x = Array2::from_shape_vec((n, v), data).unwrap();
    let t = array![5i64, 17, -100];
    let ids = array![[1i64, 2], [3, 4], [5, 6]];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    p.topk_ids = Some(ids.view());
    p.options.temperature = 0.6;
    let g = Array1::from_elem(n, 1.0);
    let h = Array1::from_elem(n, -0.5);
    let c = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, h.view());
    let low = Oracle {
        start_precision: 64,
        max_precision: 4096,
        ..Oracle::default()
    };
    let high = Oracle {
        start_precision: 512,
        max_precision: 4096,
        ..Oracle::default()
    };
    for target in [Dtype::F32, Dtype::F64] {
        let (a, b) = (
            low.forward(&p, target).unwrap(),
            high.forward(&p, target).unwrap(),
        );
        let pairs = a.lse.iter().zip(&b.lse).chain(
            a.values[Output::Entropy]
                .iter()
                .zip(&b.values[Output::Entropy]),
        );
        for (x, y) in pairs.chain(
            a.values[Output::TopkLogProbs]
                .iter()
                .zip(&b.values[Output::TopkLogProbs]),
        ) {
            assert!(x.decided && y.decided);
            assert_eq!(x.rounded, y.rounded);
            assert!(x.enclosure.lo <= y.enclosure.hi && y.enclosure.lo <= x.enclosure.hi);
        }
        // An ignore_index row: log-prob defined as 0, not judged.
        assert!(!Output::LogProbs.judged(&p, 2));
        assert_eq!(a.values[Output::LogProbs][[2, 0]], Exact::point(0.0));
        let (ga, gb) = (
            low.vjp(&p, &c, target).unwrap(),
            high.vjp(&p, &c, target).unwrap(),
        );
        for (x, y) in ga.iter().zip(gb.iter()) {
            assert!(x.decided && y.decided);
            assert_eq!(
                x.rounded.to_bits() & !(1 << 63),
                y.rounded.to_bits() & !(1 << 63)
            );
        }
    }
}

#[test]
fn a_value_within_2_pow_minus_30_ulp_of_a_midpoint_rounds_correctly() {
    // lse([a, a]) = a + ln 2 with a = m - fl64(ln 2), m a midpoint of the
    // target: the exact value is m + (ln 2 - fl64(ln 2)), ~2^-32 ulp from m.
    let ln2 = Float::with_val(2000, rug::float::Constant::Log2);
    let ln2_64 = ln2.to_f64();
    for target in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let m = 1.5 + pow2(-(target.precision() as i32)); // between 1.5 and 1.5 + ulp
        let a = m - ln2_64;
        assert_eq!(a + ln2_64, m);
        let exact = Float::with_val(2000, a) + &ln2;
        let dist = Float::with_val(2000, &exact - m).abs() / target.ulp(m);
        assert!(dist < pow2(-30) && dist > 0, "construction: {dist}");
        let x = array![[a, a]];
        let o = Oracle::default()
            .forward(&Problem::new(Logits::F64(x.view())), target)
            .unwrap();
        let expect = if exact > m {
            m + target.ulp(m) / 2.0
        } else {
            m - target.ulp(m) / 2.0
        };
        assert!(o.lse[0].decided);
        assert_eq!(o.lse[0].rounded, expect, "{target}");
        assert_eq!(o.lse[0].rounded, round_to_dtype(&exact, target));
    }
}

#[test]
fn ziv_loop_raises_precision_and_the_cap_returns_undecided() {
    // lse([a, a]) = a + ln 2 with a = fl64(m - ln 2) ~ 2^-25 (quantum
    // 2^-77), m the f32 midpoint nearest ln 2: the exact value is ~2^-54
    // ulp from m, so 64 bits cannot decide it.
    let ln2 = Float::with_val(2000, rug::float::Constant::Log2);
    let m = ((ln2.to_f64() * pow2(24)).floor() + 0.5) * pow2(-24);
    let a = Float::with_val(2000, m - &ln2).to_f64();
    let exact = Float::with_val(2000, a) + &ln2;
    let dist = Float::with_val(2000, &exact - m).abs() / Dtype::F32.ulp(m);
    assert!(dist < pow2(-50) && dist > 0, "construction: {dist}");
    let x = array![[a, a]];
    let p = Problem::new(Logits::F64(x.view()));
    let r = Oracle::default().forward_row_of(&p, 0, Dtype::F32).unwrap();
    assert!(r.lse.decided && r.precision >= 128, "{r:?}");
    assert_eq!(r.lse.rounded, round_to_dtype(&exact, Dtype::F32));
    let capped = Oracle {
        start_precision: 64,
        max_precision: 64,
        ..Oracle::default()
    };
    let r = capped.forward_row_of(&p, 0, Dtype::F32).unwrap();
    assert!(!r.lse.decided && r.precision == 64);
    assert!(r.lse.enclosure.lo <= exact && exact <= r.lse.enclosure.hi);
    assert!(r.lse.rounded == m - pow2(-25) || r.lse.rounded == m + pow2(-25));
}

#[test]
fn temperature_in_the_input_dtype_rounds_z_twice_as_pytorch_does() {
    // bf16 logits, T = 0.6 (f32): PyTorch's `x / 0.6` on a bf16 tensor is
    // z = round_bf16(round_f32(x / T)). 1.2890625 / 0.6 is a double-rounding
    // entry: its f32 quotient 2.1484375 is a bf16 tie (-> 2.15625), while the
    // exact quotient rounds once to 2.140625.
    let xs = [1.2890625f32, 20.0, 19.5, 3.0, -1.0];
    let x =
        Array2::from_shape_vec((1, 5), xs.iter().map(|&v| bf16::from_f32(v)).collect()).unwrap();
    let t = array![0i64];
    let mut p = Problem::new(Logits::Bf16(x.view()));
    p.tokens = Some(t.view());
    p.options.temperature = 0.6;
    p.options.temperature_dtype = TemperatureDtype::Input;
    let f = Oracle::default().forward(&p, Dtype::F64).unwrap();
    let t32 = 0.6f32;
    let lp_of = |z: Vec<f64>| {
        let z: Vec<Float> = z.into_iter().map(|v| Float::with_val(300, v)).collect();
        let mut s = Float::new(300);
        for zj in &z {
            s += Float::with_val(300, zj.exp_ref());
        }
        Float::with_val(300, &z[0] - s.ln()).to_f64()
    };
    // Independent of the spec: IEEE f32 division, then half's f32 -> bf16.
    let pytorch: Vec<f64> = xs
        .iter()
        .map(|&v| bf16::from_f32(v / t32).to_f64())
        .collect();
    assert_eq!(pytorch[0], 2.15625);
    let lp = lp_of(pytorch);
    assert_eq!(f.values[Output::LogProbs][[0, 0]].rounded, lp);
    // One rounding of the exact quotient is a different input.
    let once: Vec<f64> = xs
        .iter()
        .map(|&v| round_to_dtype(&(Float::with_val(300, v) / t32), Dtype::Bf16))
        .collect();
    assert_eq!(once[0], 2.140625);
    assert_ne!(lp_of(once), lp);
    // Accumulation mode differs (z unrounded).
    p.options.temperature_dtype = TemperatureDtype::Accumulation;
    let g = Oracle::default().forward(&p, Dtype::F64).unwrap();
    assert_ne!(g.values[Output::LogProbs][[0, 0]].rounded, lp);
}

#[test]
fn padded_columns_get_exactly_zero_and_n_zero_is_empty() {
    let x = array![[1.0f32, 2.0, 3.0, 100.0, f32::NAN]];
    let t = array![0i64];
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    p.options.vocab_size = Some(3);
    let g = array![1.0];
    let c = Cotangents::default().with_column(Output::LogProbs, g.view());
    let grad = Oracle::default().vjp(&p, &c, Dtype::F32).unwrap();
    assert_eq!(grad.dim(), (1, 5));
    assert_eq!(grad[[0, 3]], Exact::point(0.0));
    assert_eq!(grad[[0, 4]], Exact::point(0.0));
    let f = Oracle::default().forward(&p, Dtype::F32).unwrap();
    let three = Float::with_val(300, 1).exp()
        + Float::with_val(300, 2).exp()
        + Float::with_val(300, 3).exp();
    assert_eq!(
        f.values[Output::LogProbs][[0, 0]].rounded,
        round_to_dtype(&(1 - three.ln()), Dtype::F32)
    );
    // N = 0.
    let x = Array2::<f32>::zeros((0, 152064));
    let t = Array1::<i64>::zeros(0);
    let mut p = Problem::new(Logits::F32(x.view()));
    p.tokens = Some(t.view());
    let f = Oracle::default().forward(&p, Dtype::F32).unwrap();
    assert!(
        f.lse.is_empty()
            && f.values[Output::LogProbs].is_empty()
            && f.values[Output::Entropy].is_empty()
    );
    let g = Array1::<f64>::zeros(0);
    let c = Cotangents::default().with_column(Output::LogProbs, g.view());
    assert_eq!(
        Oracle::default().vjp(&p, &c, Dtype::F32).unwrap().dim(),
        (0, 152064)
    );
}

#[test]
fn every_error_path_returns_its_typed_error() {
    let o = Oracle::default();
    let ninf = f32::NEG_INFINITY;
    fn run<'a>(x: &'a Array2<f32>, f: impl FnOnce(&mut Problem<'a>)) -> SpecError {
        let mut p = Problem::new(Logits::F32(x.view()));
        f(&mut p);
        Oracle::default().forward(&p, Dtype::F32).unwrap_err()
    }
    let x = array![[0.0f32, 1.0], [f32::NAN, 1.0]];
    assert!(matches!(
        run(&x, |_| {}),
        SpecError::NonFiniteLogit { row: 1, col: 0, .. }
    ));
    let x = array![[0.0f32, f32::INFINITY]];
    assert!(matches!(
        run(&x, |_| {}),
        SpecError::NonFiniteLogit { row: 0, col: 1, .. }
    ));
    let x = array![[ninf, ninf]];
    assert!(matches!(
        run(&x, |_| {}),
        SpecError::NoFiniteLogit { row: 0, .. }
    ));
    let x = array![[0.0f32, ninf]];
    let t = array![1i64];
    assert!(matches!(
        run(&x, |p| p.tokens = Some(t.view())),
        SpecError::TokenNegInf { row: 0, token: 1 }
    ));
    let t = array![2i64];
    assert!(matches!(
        run(&x, |p| p.tokens = Some(t.view())),
        SpecError::TokenOutOfRange { token: 2, .. }
    ));
    let t = array![0i64];
    let m = array![[false, true]];
    let x2 = array![[0.0f32, 1.0]];
    assert!(matches!(
        run(&x2, |p| {
            p.tokens = Some(t.view());
            p.sampling_mask = Some(m.view());
        }),
        SpecError::TokenMasked { row: 0, token: 0 }
    ));
    let ids = array![[0i64, 5]];
    assert!(matches!(
        run(&x, |p| p.topk_ids = Some(ids.view())),
        SpecError::TopkIdOutOfRange { k: 1, id: 5, .. }
    ));
    assert!(matches!(
        run(&x, |p| p.options.temperature = -1.0),
        SpecError::BadTemperature { .. }
    ));
    assert!(matches!(
        run(&x, |p| p.options.temperature = f64::NAN),
        SpecError::BadTemperature { .. }
    ));
    let t3 = array![0i64, 0, 0];
    assert!(matches!(
        run(&x, |p| p.tokens = Some(t3.view())),
        SpecError::ShapeMismatch {
            tensor: "tokens",
            ..
        }
    ));
    assert!(matches!(
        run(&x, |p| p.options.vocab_size = Some(3)),
        SpecError::BadVocabSize { .. }
    ));
    // Temperature in the input dtype: x / T overflows f16.
    let xh = array![[f16::from_f32(60000.0), f16::from_f32(1.0)]];
    let mut p = Problem::new(Logits::F16(xh.view()));
    p.options.temperature = 0.5;
    p.options.temperature_dtype = TemperatureDtype::Input;
    assert!(matches!(
        o.forward(&p, Dtype::F32),
        Err(SpecError::NonFiniteLogit { col: 0, .. })
    ));
    let xh = array![[f16::from_f32(-60000.0), f16::from_f32(1.0)]];
    let t = array![0i64];
    p.logits = Logits::F16(xh.view());
    p.tokens = Some(t.view());
    assert_eq!(
        o.forward(&p, Dtype::F32).unwrap_err(),
        SpecError::TokenNegInf { row: 0, token: 0 }
    );
    let xh = array![[f16::from_f32(-60000.0), f16::from_f32(-65000.0)]];
    p.logits = Logits::F16(xh.view());
    p.tokens = None;
    assert!(matches!(
        o.forward(&p, Dtype::F32),
        Err(SpecError::NoFiniteLogit { row: 0, .. })
    ));
    // VJP cotangent errors.
    let x = array![[0.0f32, 1.0]];
    let mut p = Problem::new(Logits::F32(x.view()));
    assert!(matches!(
        o.vjp(&p, &Cotangents::default(), Dtype::F32),
        Err(SpecError::NoCotangent { .. })
    ));
    let g = array![1.0];
    let c = Cotangents::default().with_column(Output::LogProbs, g.view());
    assert!(matches!(
        o.vjp(&p, &c, Dtype::F32),
        Err(SpecError::MissingTensor {
            tensor: "tokens",
            ..
        })
    ));
    let t = array![0i64];
    p.tokens = Some(t.view());
    let bad = array![f64::NAN];
    let c = Cotangents::default().with_column(Output::LogProbs, bad.view());
    assert!(matches!(
        o.vjp(&p, &c, Dtype::F32),
        Err(SpecError::NonFiniteCotangent { .. })
    ));
    p.options.entropy = None;
    let c = Cotangents::default().with_column(Output::Entropy, g.view());
    assert!(matches!(
        o.vjp(&p, &c, Dtype::F32),
        Err(SpecError::NoCotangent { .. })
    ));
    // row_stats on a row past N.
    assert!(matches!(
        o.row_stats(&p, 1),
        Err(SpecError::ShapeMismatch { tensor: "row", .. })
    ));
}
