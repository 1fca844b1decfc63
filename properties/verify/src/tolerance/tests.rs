//! Unit tests of the tolerance model: shape of the bounds (finite,
//! monotone, offset-invariant, no 0/0) on hand-built statistics, and
//! soundness spot checks of f32 kernels written here against an f64
//! reference with explicit margins.

use logprobe_reference::oracle::{Exact, Interval, RowStats};
use logprobe_reference::spec::{Dtype, Output};
use logprobe_reference::spec::{LossOptions, Reduction, Shift, Summation, TopkKl};
use logprobe_reference::splitmix::SplitMix64;

use super::*;

// ---------------------------------------------------------------- helpers

/// f64 statistics of one logit set, with margins wide enough to enclose
/// the exact reals (f64 `exp`/`ln` within 1 ulp, sums of `V` terms).
struct SetF64 {
    d: Vec<Interval>,
    s: Interval,
    ln_s: Interval,
    p: Vec<Interval>,
    r: Interval,
    m2: Interval,
}

fn widen(lo: f64, hi: f64, rel: f64) -> Interval {
    Interval {
        lo: lo - lo.abs() * rel - 1e-300,
        hi: hi + hi.abs() * rel + 1e-300,
    }
}

fn set_f64(x: &[f64], t: f64, allowed: &dyn Fn(usize) -> bool) -> SetF64 {
    let v = x.len();
    let m = (0..v)
        .filter(|&j| allowed(j) && x[j].is_finite())
        .map(|j| x[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let d: Vec<Interval> = (0..v)
        .map(|j| {
            if allowed(j) && x[j].is_finite() {
                let dj = (x[j] - m) / t;
                widen(dj, dj, 1e-15)
            } else {
                Interval {
                    lo: f64::NEG_INFINITY,
                    hi: f64::NEG_INFINITY,
                }
            }
        })
        .collect();
    let rel = (v as f64 + 8.0) * 3e-16;
    let s_lo: f64 = d.iter().map(|d| d.lo.exp()).sum::<f64>() * (1.0 - rel);
    let s_hi: f64 = d.iter().map(|d| d.hi.exp()).sum::<f64>() * (1.0 + rel);
    let ln_s = widen(s_lo.ln(), s_hi.ln(), 1e-15);
    let p: Vec<Interval> = d
        .iter()
        .map(|d| {
            widen(
                (d.lo - ln_s.hi).exp(),
                (d.hi - ln_s.lo).exp().min(1.0),
                1e-15,
            )
        })
        .collect();
    // Sum of `f(p_j, d_j)` over the finite entries.
    let sum = |f: fn(&Interval, &Interval) -> f64| -> f64 {
        p.iter()
            .zip(&d)
            .filter(|(_, d)| d.hi.is_finite())
            .map(|(p, d)| f(p, d))
            .sum()
    };
    let r_lo = sum(|p, d| p.lo * -d.hi);
    let r_hi = sum(|p, d| p.hi * -d.lo);
    let m2_lo = sum(|p, d| p.lo * d.hi * d.hi);
    let m2_hi = sum(|p, d| p.hi * d.lo * d.lo);
    SetF64 {
        d,
        s: Interval { lo: s_lo, hi: s_hi },
        ln_s,
        p,
        r: widen(r_lo.max(0.0), r_hi, rel),
        m2: widen(m2_lo.max(0.0), m2_hi, rel),
    }
}

/// Row statistics (log-prob set masked by `mask`, entropy over all logits).
fn stats_f64(x: &[f64], t: f64, mask: Option<&[bool]>, target: Option<usize>) -> RowStats {
    let pz = set_f64(x, t, &|j| mask.is_none_or(|m| m[j]));
    let w = set_f64(x, t, &|_| true);
    RowStats {
        d_t: target.map(|t| pz.d[t]),
        s: pz.s,
        ln_s: pz.ln_s,
        s_w: w.s,
        ln_s_w: w.ln_s,
        r: w.r,
        m2: w.m2,
        p: pz.p,
        q: w.p,
        e: w.d,
        d: pz.d,
    }
}

/// Far-end error of `c` against an enclosure.
fn far_error(c: f64, v: Interval) -> f64 {
    (c - v.lo).abs().max((c - v.hi).abs())
}

fn exact_log_prob(st: &RowStats) -> Interval {
    let d = st.d_t.unwrap();
    Interval {
        lo: d.lo - st.ln_s.hi,
        hi: d.hi - st.ln_s.lo,
    }
}

fn exact_entropy(st: &RowStats) -> Interval {
    Interval {
        lo: st.ln_s_w.lo + st.r.lo,
        hi: st.ln_s_w.hi + st.r.hi,
    }
}

fn ctx1() -> RowContext {
    RowContext {
        temperature: 1.0,
        z_max_abs: 0.0,
        softcap: None,
        linear: None,
    }
}

fn abs(b: &ErrorBound) -> f64 {
    match b {
        ErrorBound::Abs(x) => *x,
        ErrorBound::Upward(x) => panic!("expected a two-sided bound, got +{x}"),
        ErrorBound::None { reason } => panic!("expected a bound, got {reason}"),
    }
}

/// A row recipe: `kind` picks the distribution.
fn row(rng: &mut SplitMix64, v: usize, kind: usize) -> Vec<f64> {
    let f = |x: f64| x as f32 as f64; // exactly representable in f32
    (0..v)
        .map(|j| {
            f(match kind {
                0 => rng.normal(),                                      // gaussian
                1 => 0.3 * rng.normal(),                                // near-uniform
                2 => -1.2 * ((j + 1) as f64).ln() + 0.5 * rng.normal(), // Zipf-shaped
                3 => 8.0 * rng.normal(),                                // wide gaussian
                4 => 1e4 + 3.0 * rng.normal(),                          // offset
                _ => {
                    if j == 7 % v {
                        25.0
                    } else {
                        rng.normal()
                    }
                } // dominant token
            })
        })
        .collect()
}

/// Cotangents `g = 0.7` at target 3, `h = -1.3`, `G = 0.25` at top-k id 6.
fn target_and_id_cot() -> GradCotangents<'static> {
    GradCotangents {
        g: 0.7,
        h: -1.3,
        token: Some(3),
        topk: &[(6, 0.25)],
        ..Default::default()
    }
}

/// verify's four models of an f32-accumulating kernel: its `lanes=8` and
/// the three foreign presets.
fn verify_models() -> [Model; 4] {
    let [a, b, c] = foreign_presets(Dtype::F32);
    [Model::lanes(8), a, b, c]
}

/// A mask over `n` entries that drops `start`, `start + step`, ...
fn mask_every(n: usize, start: usize, step: usize) -> Vec<bool> {
    (0..n)
        .map(|j| j < start || !(j - start).is_multiple_of(step))
        .collect()
}

/// Each of [`row`]'s kinds `0..6` (`n` entries, drawn from `seed`), without
/// and with a mask that drops every `every`-th entry from 0: `f(kind, x,
/// mask, statistics (T = 1, target 3), verify_models(), their bounds)`.
fn each_masked_row(
    seed: u64,
    n: usize,
    every: usize,
    mut f: impl FnMut(usize, &[f64], Option<&[bool]>, &RowStats, &[Model; 4], &[RowBounds<'_>; 4]),
) {
    let mut rng = SplitMix64::new(seed);
    let models = verify_models();
    for kind in 0..6 {
        let x = row(&mut rng, n, kind);
        let mask = mask_every(x.len(), 0, every);
        for m in [None, Some(&mask[..])] {
            let st = stats_f64(&x, 1.0, m, Some(3));
            let all = RowBounds::new_all(&models, &st, &ctx1());
            f(kind, &x, m, &st, &models, &all);
        }
    }
}

// ---------------------------------------------------------------- f32 kernels under test

#[derive(Clone, Copy)]
enum Sum32 {
    Sequential,
    Lanes8,
    Tree,
}

fn sum32(xs: &[f32], how: Sum32) -> f32 {
    match how {
        Sum32::Sequential => xs.iter().fold(0.0f32, |a, &x| a + x),
        Sum32::Lanes8 => {
            let mut acc = [0.0f32; 8];
            for (j, &x) in xs.iter().enumerate() {
                acc[j % 8] += x;
            }
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        }
        Sum32::Tree => {
            if xs.len() <= 1 {
                xs.first().copied().unwrap_or(0.0)
            } else {
                let (a, b) = xs.split_at(xs.len() / 2);
                sum32(a, how) + sum32(b, how)
            }
        }
    }
}

struct Out32 {
    lp: Vec<f32>,
    entropy_fused: f32,
    entropy_logsoftmax: f32,
}

/// Two-pass f32 log_softmax and entropy, subtract-then-scale.
fn kernel32(x: &[f64], t: f32, how: Sum32) -> Out32 {
    let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d: Vec<f32> = x.iter().map(|&v| (v - m) / t).collect();
    let e: Vec<f32> = d.iter().map(|&v| v.exp()).collect();
    let s = sum32(&e, how);
    let l = s.ln();
    let lp: Vec<f32> = d.iter().map(|&v| v - l).collect();
    let b: Vec<f32> = e.iter().zip(&d).map(|(&e, &d)| e * -d).collect();
    let entropy_fused = l + sum32(&b, how) / s;
    let terms: Vec<f32> = lp.iter().map(|&v| -(v.exp() * v)).collect();
    let entropy_logsoftmax = sum32(&terms, how);
    Out32 {
        lp,
        entropy_fused,
        entropy_logsoftmax,
    }
}

fn model_for(how: Sum32) -> Model {
    match how {
        Sum32::Sequential => Model::sequential(),
        Sum32::Lanes8 => Model::lanes(8),
        Sum32::Tree => Model::tree(),
    }
}

// ---------------------------------------------------------------- shape of the bounds

#[test]
fn bounds_are_finite_and_positive_on_ordinary_rows() {
    let mut rng = SplitMix64::new(1);
    for kind in 0..6 {
        let x = row(&mut rng, 1000, kind);
        let st = stats_f64(&x, 1.0, None, Some(3));
        for m in foreign_presets(Dtype::F32) {
            let rb = m.row_bounds(&st, &ctx1());
            for out in [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F64] {
                for b in [rb.log_prob(out), rb.entropy(out), rb.topk(5, out)] {
                    let v = abs(&b);
                    assert!(v.is_finite() && v > 0.0, "{} {kind} {out}: {v}", m.name());
                }
                let cot = GradCotangents {
                    g: 0.7,
                    h: -1.3,
                    token: Some(3),
                    topk: &[(5, 0.25), (3, -2.0)],
                    ..Default::default()
                };
                for j in [0, 3, 5, 999] {
                    let v = abs(&rb.grad(j, &cot, out));
                    assert!(v.is_finite() && v > 0.0, "grad {j}: {v}");
                }
            }
        }
    }
}

#[test]
fn bf16_accumulation_over_a_real_vocabulary_gives_no_bound() {
    let mut rng = SplitMix64::new(2);
    let x = row(&mut rng, 32000, 0);
    let st = stats_f64(&x, 1.0, None, Some(0));
    let rb = Model::sequential()
        .with_accumulation(Dtype::Bf16)
        .row_bounds(&st, &ctx1());
    assert!(matches!(
        rb.log_prob(Dtype::Bf16),
        ErrorBound::None {
            reason: NoBound::GammaUndefined { n: 32000, .. }
        }
    ));
    assert!(matches!(rb.entropy(Dtype::Bf16), ErrorBound::None { .. }));
    let cot = GradCotangents {
        g: 1.0,
        h: 1.0,
        token: Some(0),
        topk: &[],
        ..Default::default()
    };
    assert!(matches!(
        rb.grad(1, &cot, Dtype::Bf16),
        ErrorBound::None { .. }
    ));
    // lanes=8 is 4000 deep: still nothing. A tree (depth 1 + 15) is certified, loosely.
    let lanes = Model::lanes(8)
        .with_accumulation(Dtype::Bf16)
        .row_bounds(&st, &ctx1());
    assert!(lanes.log_prob(Dtype::Bf16).value().is_none());
    let tree = Model::tree()
        .with_accumulation(Dtype::Bf16)
        .row_bounds(&st, &ctx1());
    assert!(tree.log_prob(Dtype::Bf16).value().is_some_and(|b| b > 0.05));
}

#[test]
fn bounds_grow_with_leaf_depth() {
    let mut rng = SplitMix64::new(3);
    let x = row(&mut rng, 4096, 2);
    let st = stats_f64(&x, 1.0, None, Some(10));
    let mut last = [0.0f64; 3];
    for h in [1usize, 2, 16, 256, 4096] {
        let m = Model {
            order: Order::Declared(Summation { leaf: h, merges: 2 }),
            ..Model::tree()
        };
        let rb = m.row_bounds(&st, &ctx1());
        let cot = GradCotangents {
            g: 1.0,
            h: 1.0,
            token: Some(10),
            topk: &[],
            ..Default::default()
        };
        let now = [
            abs(&rb.log_prob(Dtype::F32)),
            abs(&rb.entropy(Dtype::F32)),
            abs(&rb.grad(10, &cot, Dtype::F32)),
        ];
        for k in 0..3 {
            assert!(
                now[k] >= last[k],
                "h = {h}, output {k}: {} < {}",
                now[k],
                last[k]
            );
        }
        last = now;
    }
    // Sequential >= lanes=8 >= tree on a real vocabulary.
    let b: Vec<f64> = foreign_presets(Dtype::F32)
        .iter()
        .map(|m| abs(&m.row_bounds(&st, &ctx1()).log_prob(Dtype::F32)))
        .collect();
    assert!(b[0] < b[1] && b[1] < b[2], "{b:?}");
}

#[test]
fn subtract_then_scale_bound_is_offset_invariant_and_raw_grows() {
    let mut rng = SplitMix64::new(4);
    let x = row(&mut rng, 512, 0);
    for t in [1.0, 0.7] {
        let st = stats_f64(&x, t, None, Some(1));
        // (log_prob, entropy) bounds; None where the model certifies nothing.
        let at = |shift: Shift, z: f64| {
            let m = Model {
                shift,
                ..Model::lanes(8)
            }
            .with_entropy_form(EntropyForm::Fused);
            let rb = m.row_bounds(
                &st,
                &RowContext {
                    temperature: t,
                    z_max_abs: z,
                    softcap: None,
                    linear: None,
                },
            );
            (
                rb.log_prob(Dtype::F32).value(),
                rb.entropy(Dtype::F32).value(),
            )
        };
        let huge = |b: Option<f64>| b.is_none_or(|b| b > 1e20);
        let stt = at(Shift::SubtractThenScale, 0.0);
        assert!(stt.0.is_some() && stt.1.is_some());
        assert_eq!(stt, at(Shift::SubtractThenScale, 1e30));
        // Raw: lse = z_max + ln S is rounded at 1e30, and with T = 0.7 every
        // z_j = x_j / T carries ~1e23 nats: huge or no bound at all.
        let (raw0, raw_big) = (at(Shift::Raw, 0.0), at(Shift::Raw, 1e30));
        assert!(
            raw0.0.is_some() && huge(raw_big.0) && huge(raw_big.1),
            "{raw_big:?}"
        );
        if t == 1.0 {
            assert!(raw_big.0.is_some() && raw_big.1.is_some());
        }
        let raw_any = Model {
            shift: Shift::Raw,
            ..Model::lanes(8)
        }
        .row_bounds(
            &st,
            &RowContext {
                temperature: t,
                z_max_abs: 1e30,
                softcap: None,
                linear: None,
            },
        )
        .entropy(Dtype::F32);
        assert!(huge(raw_any.value()), "{raw_any}");
        let sts = at(Shift::ScaleThenSubtract, 1e6);
        if t == 1.0 {
            // Scaling by a power of two is exact: scale-then-subtract is offset-invariant too.
            assert_eq!(sts, at(Shift::ScaleThenSubtract, 0.0));
        } else {
            assert!(
                sts.0.is_some_and(|b| b > 0.1) && sts.1.is_some_and(|b| b > 0.1),
                "{sts:?}"
            );
        }
    }
}

#[test]
fn uniform_one_hot_and_single_entry_rows_have_finite_bounds() {
    let uniform = vec![0.5f64; 1000];
    let mut one_hot = vec![-1000.0f64; 1000];
    one_hot[3] = 0.0;
    let mut neg_inf = vec![f64::NEG_INFINITY; 100];
    neg_inf[42] = 1.0;
    neg_inf[43] = 1.0;
    let mask: Vec<bool> = (0..1000).map(|j| j % 3 == 0).collect();
    type Case<'m> = (Vec<f64>, Option<&'m [bool]>, usize);
    let cases: Vec<Case<'_>> = vec![
        (uniform.clone(), None, 0),
        (one_hot, None, 3),
        (neg_inf, None, 42),
        (vec![2.5], None, 0),
        (uniform, Some(&mask), 3),
    ];
    for (x, mask, t) in cases {
        let st = stats_f64(&x, 1.0, mask, Some(t));
        for m in foreign_presets(Dtype::F32) {
            let rb = m.row_bounds(&st, &ctx1());
            let lp = abs(&rb.log_prob(Dtype::F32));
            let h = abs(&rb.entropy(Dtype::F32));
            assert!(
                lp.is_finite() && lp > 0.0 && h.is_finite() && h > 0.0,
                "V={} {lp} {h}",
                x.len()
            );
            let cot = GradCotangents {
                g: 1.0,
                h: 1.0,
                token: Some(t),
                topk: &[],
                ..Default::default()
            };
            for j in 0..x.len() {
                let b = abs(&rb.grad(j, &cot, Dtype::F32));
                assert!(b.is_finite(), "grad {j}");
                if st.q[j].hi == 0.0 && st.p[j].hi == 0.0 && j != t {
                    // Exactly-zero entries get only the underflow floor.
                    assert!(b < 1e-30, "floor {b}");
                }
            }
        }
    }
    // A masked top-k id is the constant -inf: bound exactly 0.
    let x: Vec<f64> = (0..30).map(|j| j as f64 * 0.1).collect();
    let mask: Vec<bool> = (0..30).map(|j| j != 4).collect();
    let st = stats_f64(&x, 1.0, Some(&mask), Some(0));
    assert_eq!(
        Model::lanes(8).row_bounds(&st, &ctx1()).topk(4, Dtype::F32),
        ErrorBound::Abs(0.0)
    );
}

// ---------------------------------------------------------------- soundness spot checks

/// f32 two-pass kernels in three summation orders against the f64
/// reference, within the matching model; also reports tightness.
#[test]
fn f32_two_pass_kernels_are_within_their_summation_models() {
    let mut rng = SplitMix64::new(5);
    for how in [Sum32::Sequential, Sum32::Lanes8, Sum32::Tree] {
        let (mut worst_lp, mut worst_h) = (0.0f64, 0.0f64);
        for case in 0..24 {
            let v = [1, 7, 100, 1000, 5000, 30522][case % 6];
            let t = [1.0f32, 0.7, 2.0][case % 3];
            let x = row(&mut rng, v, case % 6);
            let tgt = (case * 37) % v;
            let st = stats_f64(&x, t as f64, None, Some(tgt));
            let out = kernel32(&x, t, how);
            let ctx = RowContext {
                temperature: t as f64,
                z_max_abs: 0.0,
                softcap: None,
                linear: None,
            };
            let rb = model_for(how).row_bounds(&st, &ctx);
            let fused = model_for(how)
                .with_entropy_form(EntropyForm::Fused)
                .row_bounds(&st, &ctx);
            let ls = model_for(how)
                .with_entropy_form(EntropyForm::LogSoftmax)
                .row_bounds(&st, &ctx);
            let b_lp = abs(&rb.log_prob(Dtype::F32));
            let e_lp = far_error(out.lp[tgt] as f64, exact_log_prob(&st));
            assert!(e_lp <= b_lp, "log_prob case {case} V={v}: {e_lp} > {b_lp}");
            let e_f = far_error(out.entropy_fused as f64, exact_entropy(&st));
            let e_l = far_error(out.entropy_logsoftmax as f64, exact_entropy(&st));
            let (b_f, b_l) = (
                abs(&fused.entropy(Dtype::F32)),
                abs(&ls.entropy(Dtype::F32)),
            );
            assert!(e_f <= b_f, "fused entropy case {case} V={v}: {e_f} > {b_f}");
            assert!(
                e_l <= b_l,
                "log-softmax entropy case {case} V={v}: {e_l} > {b_l}"
            );
            assert!(abs(&rb.entropy(Dtype::F32)) >= b_f.max(b_l));
            worst_lp = worst_lp.max(e_lp / b_lp);
            worst_h = worst_h.max(e_f / b_f).max(e_l / b_l);
        }
        eprintln!(
            "tightness {}: log_prob {worst_lp:.3}, entropy {worst_h:.3}",
            model_for(how).name()
        );
    }
}

/// PyTorch's measured fact: an 8-lane f32 log_softmax on near-uniform rows
/// of V = 30522 passes lanes=8, and the tree bound is 1-2 orders tighter.
#[test]
fn eight_lane_order_on_near_uniform_rows_passes_lanes_8() {
    let mut rng = SplitMix64::new(6);
    let x = row(&mut rng, 30522, 1);
    let st = stats_f64(&x, 1.0, None, Some(100));
    let out = kernel32(&x, 1.0, Sum32::Lanes8);
    let lanes = abs(&Model::lanes(8)
        .row_bounds(&st, &ctx1())
        .log_prob(Dtype::F32));
    let tree = abs(&Model::tree().row_bounds(&st, &ctx1()).log_prob(Dtype::F32));
    let err = far_error(out.lp[100] as f64, exact_log_prob(&st));
    assert!(err <= lanes);
    // The measured 1.5e-5 passes lanes=8 and fails tree.
    assert!(
        1.5e-5 <= lanes && 1.5e-5 > tree,
        "lanes {lanes} tree {tree}"
    );
    assert!(
        lanes / tree > 10.0 && lanes / tree < 1000.0,
        "lanes/tree = {}",
        lanes / tree
    );
}

/// Outputs truncated to f16 fail a sound f32-accumulation bound somewhere;
/// correctly rounded ones pass everywhere (the `f16_truncated_outputs` dump).
#[test]
fn f16_truncated_outputs_fail_and_rounded_ones_pass() {
    let mut rng = SplitMix64::new(7);
    let (mut worst_trunc, mut worst_round) = (0.0f64, 0.0f64);
    for case in 0..32 {
        let x = row(&mut rng, 8192, case % 4);
        let tgt = (case * 101) % 8192;
        let st = stats_f64(&x, 1.0, None, Some(tgt));
        let rb = Model::lanes(8).row_bounds(&st, &ctx1());
        let out = kernel32(&x, 1.0, Sum32::Lanes8);
        for (v, exact, b) in [
            (
                out.lp[tgt] as f64,
                exact_log_prob(&st),
                abs(&rb.log_prob(Dtype::F16)),
            ),
            (
                out.entropy_logsoftmax as f64,
                exact_entropy(&st),
                abs(&rb.entropy(Dtype::F16)),
            ),
        ] {
            let rounded = Dtype::F16.round_f64(v);
            let truncated = half::f16::from_bits(half::f16::from_f64(rounded).to_bits()).to_f64();
            let truncated = if (truncated - v).abs() > 0.0 && truncated.abs() > v.abs() {
                // Toward zero: step one f16 ulp back when rounding went away from zero.
                truncated - truncated.signum() * Dtype::F16.ulp(v)
            } else {
                truncated
            };
            worst_round = worst_round.max(far_error(rounded, exact) / b);
            worst_trunc = worst_trunc.max(far_error(truncated, exact) / b);
        }
    }
    assert!(worst_round <= 1.0, "rounded {worst_round}");
    assert!(worst_trunc > 1.2, "truncated {worst_trunc}");
}

/// Autograd-form f32 gradient (log_softmax backward and the entropy's
/// `-p (lp + H)`) within the per-element bound.
#[test]
fn f32_autograd_gradients_are_within_the_element_bound() {
    let mut rng = SplitMix64::new(8);
    for case in 0..12 {
        let v = [3, 100, 2000][case % 3];
        let t = [1.0f32, 0.7][case % 2];
        let x = row(&mut rng, v, case % 6);
        let tgt = (case * 13) % v;
        let (g, h) = (0.9f32, -1.7f32);
        let st = stats_f64(&x, t as f64, None, Some(tgt));
        let out = kernel32(&x, t, Sum32::Lanes8);
        let hh = out.entropy_logsoftmax;
        let ctx = RowContext {
            temperature: t as f64,
            z_max_abs: 0.0,
            softcap: None,
            linear: None,
        };
        let rb = Model::lanes(8).row_bounds(&st, &ctx);
        let cot = GradCotangents {
            g: g as f64,
            h: h as f64,
            token: Some(tgt),
            topk: &[],
            ..Default::default()
        };
        let r_mid = 0.5 * (st.r.lo + st.r.hi);
        for j in 0..v {
            let p = out.lp[j].exp();
            let ind = if j == tgt { 1.0f32 } else { 0.0 };
            let cand = (g * (ind - p) + h * (-p * (out.lp[j] + hh))) / t;
            let (pe, e) = (
                0.5 * (st.p[j].lo + st.p[j].hi),
                0.5 * (st.e[j].lo + st.e[j].hi),
            );
            let exact = (g as f64 * (ind as f64 - pe) - h as f64 * pe * (e + r_mid)) / t as f64;
            let margin =
                1e-9 * (pe * (1.0 + e.abs() + r_mid) + 1e-300) + (st.r.hi - st.r.lo) * pe * 2.0;
            let b = abs(&rb.grad(j, &cot, Dtype::F32));
            let err = (cand as f64 - exact).abs() + margin;
            assert!(err <= b, "case {case} j {j}: {err} > {b}");
        }
    }
}

// ---------------------------------------------------------------- judging and the flash rule

fn exact_of(v: Interval, dtype: Dtype) -> Exact {
    let mid = 0.5 * (v.lo + v.hi);
    Exact::new(
        v,
        dtype.round_f64(mid),
        dtype.round_f64(v.lo) == dtype.round_f64(v.hi),
    )
}

#[test]
fn judge_passes_iff_error_is_within_the_bound() {
    let ex = exact_of(Interval { lo: -2.0, hi: -2.0 }, Dtype::F32);
    let j = judge(&ex, -2.0 + 1e-6, Dtype::F32, &ErrorBound::Abs(2e-6));
    assert!(j.pass && j.verdict() == ValueVerdict::Pass);
    assert!((j.ratio.unwrap() - 0.5).abs() < 1e-3);
    let j = judge(&ex, -2.0 + 3e-6, Dtype::F32, &ErrorBound::Abs(2e-6));
    assert!(!j.pass && j.verdict() == ValueVerdict::Fail);
    let none = ErrorBound::None {
        reason: NoBound::GammaUndefined {
            n: 300,
            u: 1.0 / 256.0,
        },
    };
    let j = judge(&ex, -2.0, Dtype::F32, &none);
    assert!(!j.pass && j.ratio.is_none() && j.verdict() == ValueVerdict::NoBound);
    assert_eq!(j.verdict().to_string(), "no bound");
    let j = judge(&ex, f64::NAN, Dtype::F32, &ErrorBound::Abs(1.0));
    assert!(!j.pass);
    // An exact value below f16's range is judged against its rounding, -inf.
    let ex = exact_of(
        Interval {
            lo: -70000.0,
            hi: -70000.0,
        },
        Dtype::F16,
    );
    assert!(judge(&ex, f64::NEG_INFINITY, Dtype::F16, &ErrorBound::Abs(0.0)).pass);
}

#[test]
fn judge_takes_an_exact_value_beyond_the_candidates_range_as_its_infinity() {
    let tiny = ErrorBound::Abs(1e-30);
    // Enclosed and rounded in a wider target (f64, f32) than the candidate:
    // both ends round to the same infinity in the candidate's dtype.
    let big = exact_of(
        Interval {
            lo: 1e56,
            hi: 1e56 * (1.0 + 1e-15),
        },
        Dtype::F64,
    );
    let j = judge(&big, f64::INFINITY, Dtype::F32, &tiny);
    assert!(j.pass && j.error_abs == 0.0);
    assert!(!judge(&big, f64::NEG_INFINITY, Dtype::F32, &tiny).pass);
    assert!(!judge(&big, f32::MAX as f64, Dtype::F32, &tiny).pass);
    // In f64 the same value is finite: an infinite f64 candidate is wrong.
    assert!(!judge(&big, f64::INFINITY, Dtype::F64, &ErrorBound::Abs(1e300)).pass);
    let low = exact_of(
        Interval {
            lo: -70000.5,
            hi: -70000.25,
        },
        Dtype::F32,
    );
    assert!(judge(&low, f64::NEG_INFINITY, Dtype::F16, &tiny).pass);
    // bf16 reaches 3.4e38: there the value is finite and -inf is wrong.
    assert!(!judge(&low, f64::NEG_INFINITY, Dtype::Bf16, &ErrorBound::Abs(1e6)).pass);
    // An enclosure straddling the overflow threshold decides nothing: its
    // low end rounds to the largest finite f16 (65504).
    let edge = exact_of(
        Interval {
            lo: 65519.0,
            hi: 65521.0,
        },
        Dtype::F32,
    );
    assert!(!judge(&edge, f64::INFINITY, Dtype::F16, &tiny).pass);
    // The same for a masked top-k id: -inf exact, -inf candidate.
    let masked = Exact::point(f64::NEG_INFINITY);
    assert!(judge(&masked, f64::NEG_INFINITY, Dtype::Bf16, &tiny).pass);
    assert!(!judge(&masked, -3.0e38, Dtype::F32, &ErrorBound::Abs(1e300)).pass);
}

#[test]
fn tightest_model_names_the_tightest_satisfied_preset() {
    let mut rng = SplitMix64::new(9);
    let x = row(&mut rng, 30522, 1);
    let st = stats_f64(&x, 1.0, None, Some(5));
    let v = exact_log_prob(&st);
    let ex = exact_of(v, Dtype::F32);
    let mid = 0.5 * (v.lo + v.hi);
    let got = |c: f64| {
        tightest_model(
            &st,
            &ctx1(),
            &RowTargets::default(),
            Dtype::F32,
            Output::LogProbs,
            0,
            &ex,
            c,
            Dtype::F32,
        )
        .map(|m| m.name())
    };
    assert_eq!(got(Dtype::F32.round_f64(mid)).as_deref(), Some("tree"));
    assert_eq!(got(mid + 1.5e-5).as_deref(), Some("lanes=8"));
    assert_eq!(got(mid + 1e-3).as_deref(), Some("sequential"));
    assert_eq!(got(mid + 1.0), None);
}

#[test]
fn naive_same_dtype_computation_and_relative_ratio() {
    let x: Vec<f64> = (0..1000)
        .map(|j| ((j * 7919) % 1000) as f64 * 0.01)
        .collect();
    let st = stats_f64(&x, 1.0, None, Some(3));
    let lp64 = naive_log_softmax(&x, 1.0, Dtype::F64);
    assert!(far_error(lp64[3], exact_log_prob(&st)) < 1e-12);
    assert!(far_error(naive_entropy(&x, 1.0, Dtype::F64), exact_entropy(&st)) < 1e-12);
    // bf16 naive: S summed in bf16 stagnates, so the naive error is large.
    let lp = naive_log_softmax(&x, 1.0, Dtype::Bf16);
    let ex = exact_of(exact_log_prob(&st), Dtype::Bf16);
    let naive_err = far_error(lp[3], exact_log_prob(&st));
    assert!(naive_err > 0.05, "{naive_err}");
    let mut rule = RelativeRule::new();
    rule.observe(&ex, ex.rounded, &[lp[3]], 0.0, Dtype::Bf16);
    assert!(!rule.fires() && rule.ratio() < 0.1);
    let mut rule = RelativeRule::new();
    rule.observe(
        &ex,
        ex.rounded + (RELATIVE_R + 1.0) * naive_err,
        &[lp[3]],
        0.0,
        Dtype::Bf16,
    );
    assert!(rule.fires());
    // The largest of careful code's values sets the reference; a NaN
    // candidate fires.
    let mut rule = RelativeRule::new();
    rule.observe(
        &ex,
        ex.rounded + 2.0 * naive_err,
        &[ex.rounded, lp[3]],
        0.0,
        Dtype::Bf16,
    );
    assert!(!rule.fires());
    rule.observe(&ex, f64::NAN, &[lp[3]], 0.0, Dtype::Bf16);
    assert!(rule.fires() && rule.ratio().is_infinite());
    // -inf entries add nothing to the naive entropy.
    let mut y = x.clone();
    y[0] = f64::NEG_INFINITY;
    assert!(naive_entropy(&y, 1.0, Dtype::F32).is_finite());
}

#[test]
fn naive_row_equals_the_vector_naive_computation_bit_for_bit() {
    use logprobe_reference::spec::{EntropyLogits, Logits, Problem};
    use ndarray::Array2;
    let mut rng = SplitMix64::new(12);
    // Long rows too: their naive sums stall, and the terms too small to
    // move them are passed over (`below_adds_nothing`).
    for case in 0..10u64 {
        let v = if case < 8 { 3000 } else { 60_000 };
        let (t, masked, entropy) = match case % 4 {
            0 => (1.0, false, None),
            1 => (0.7, true, Some(EntropyLogits::Unmasked)),
            2 => (1.3, true, Some(EntropyLogits::Masked)),
            _ => (0.5, false, Some(EntropyLogits::Unmasked)),
        };
        let x: Vec<f64> = (0..v)
            .map(|j| {
                if j % 97 == 5 {
                    f64::NEG_INFINITY
                } else {
                    (rng.uniform() - 0.5) * 20.0 * (1 + case % 3) as f64
                }
            })
            .collect();
        let allow: Vec<bool> = (0..v).map(|j| !masked || j % 5 != 1).collect();
        let xb: Vec<half::bf16> = x.iter().map(|&a| half::bf16::from_f64(a)).collect();
        let xh: Vec<half::f16> = x.iter().map(|&a| half::f16::from_f64(a)).collect();
        let xf: Vec<f32> = x.iter().map(|&a| a as f32).collect();
        let ab = Array2::from_shape_vec((1, v), xb).unwrap();
        let ah = Array2::from_shape_vec((1, v), xh).unwrap();
        let af = Array2::from_shape_vec((1, v), xf).unwrap();
        let am = Array2::from_shape_vec((1, v), allow.clone()).unwrap();
        let toks = ndarray::array![7i64];
        for logits in [
            Logits::Bf16(ab.view()),
            Logits::F16(ah.view()),
            Logits::F32(af.view()),
        ] {
            let mut p = Problem::new(logits);
            p.tokens = Some(toks.view());
            p.options.temperature = t;
            p.options.entropy = entropy;
            if masked {
                p.sampling_mask = Some(am.view());
            }
            let row = p.logits.row_f64(0);
            let allowed: Vec<f64> = row
                .iter()
                .zip(&allow)
                .map(|(&a, &ok)| if ok || !masked { a } else { f64::NEG_INFINITY })
                .collect();
            let ent_logits = match entropy {
                Some(EntropyLogits::Unmasked) => row.clone(),
                _ => allowed.clone(),
            };
            let targets = RowTargets {
                vocab_size: v,
                token: Some(7),
                topk_ids: vec![0, 11, 7, 5],
                ..Default::default()
            };
            for dtype in [Dtype::Bf16, Dtype::F16, Dtype::F32, Dtype::F64] {
                let mut nr = CarefulRow::new(
                    &p,
                    0,
                    dtype,
                    (Shift::ScaleThenSubtract, Order::Sequential),
                    None,
                );
                let lp = naive_log_softmax(&allowed, t, dtype);
                let h = naive_entropy(&ent_logits, t, dtype);
                let same =
                    |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                let got = nr.values(Output::LogProbs, 0, &targets, dtype).unwrap()[0];
                assert!(same(got, lp[7]), "case {case} {dtype}: {got} vs {}", lp[7]);
                for (k, &id) in targets.topk_ids.iter().enumerate() {
                    let got = nr.values(Output::TopkLogProbs, k, &targets, dtype).unwrap()[0];
                    assert!(same(got, lp[id]), "case {case} {dtype} id {id}");
                }
                let got = nr.values(Output::Entropy, 0, &targets, dtype).unwrap()[0];
                assert!(same(got, h), "case {case} {dtype}: entropy {got} vs {h}");
            }
        }
    }
}

/// Careful code by its definition, over vectors: `(log-probs shifted,
/// log-probs raw, entropy, lse, (sum of the log-probs, soft cross-entropy))` of `x` in `dtype`, scale first or subtract
/// first, every sum in blocks of `leaf` terms in order, the block sums
/// merged pairwise (split at the largest power of two below their count).
fn careful_vectors(
    x: &[f64],
    t: f64,
    dtype: Dtype,
    sub_first: bool,
    leaf: usize,
) -> (Vec<f64>, Vec<f64>, f64, f64, (f64, f64)) {
    let r = |v: f64| dtype.round_f64(v);
    fn merge(s: &[f64], r: &dyn Fn(f64) -> f64) -> f64 {
        if s.len() == 1 {
            return s[0];
        }
        let mut p = 1;
        while p * 2 < s.len() {
            p *= 2;
        }
        r(merge(&s[..p], r) + merge(&s[p..], r))
    }
    let sum = |terms: &[f64]| -> f64 {
        let blocks: Vec<f64> = terms
            .chunks(leaf)
            .map(|b| b.iter().fold(0.0, |a, &v| r(a + v)))
            .collect();
        merge(&blocks, &r)
    };
    let t = r(t);
    let z: Vec<f64> = x
        .iter()
        .map(|&v| {
            if sub_first || t == 1.0 {
                r(v)
            } else {
                r(v / t)
            }
        })
        .collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let d: Vec<f64> = z
        .iter()
        .map(|&zj| {
            if sub_first && t != 1.0 {
                r(r(zj - m) / t)
            } else {
                r(zj - m)
            }
        })
        .collect();
    let e: Vec<f64> = d.iter().map(|&dj| r(dj.exp())).collect();
    let l = r(sum(&e).ln());
    let lp: Vec<f64> = d.iter().map(|&dj| r(dj - l)).collect();
    let raw: Vec<f64> = if sub_first {
        lp.clone()
    } else {
        z.iter().map(|&zj| r(zj - r(m + l))).collect()
    };
    let terms: Vec<f64> = lp
        .iter()
        .map(|&l| {
            let p = r(l.exp());
            if p != 0.0 {
                -r(p * l)
            } else {
                0.0
            }
        })
        .collect();
    let lse = r(if sub_first && t != 1.0 { r(m / t) } else { m } + l);
    // The soft cross-entropy against the teacher probabilities
    // `p_j = (j % 7) / (7 V)`: `-sum r(r(p_j) lp_j)`.
    let soft: Vec<f64> = lp
        .iter()
        .enumerate()
        .map(|(j, &l)| {
            let p = (j % 7) as f64 / (7 * x.len()) as f64;
            if p == 0.0 {
                0.0
            } else {
                r(r(p) * l)
            }
        })
        .collect();
    let sum_lp = sum(&lp);
    (lp, raw, sum(&terms), lse, (sum_lp, -sum(&soft)))
}

#[test]
fn careful_row_follows_the_declared_form_and_order() {
    use logprobe_reference::spec::{Logits, Problem};
    use ndarray::Array2;
    let mut rng = SplitMix64::new(31);
    for case in 0..12u64 {
        let v = [1000, 4099, 257][case as usize % 3];
        let t = [1.0, 0.7, 1.3][(case / 3) as usize % 3];
        let offset = [0.0, 30.0, -300.0, 1000.0][(case / 4) as usize % 4];
        let x: Vec<f64> = (0..v)
            .map(|_| ((rng.uniform() - 0.5) * 16.0 + offset) as f32 as f64)
            .collect();
        let xf: Vec<f32> = x.iter().map(|&a| a as f32).collect();
        let af = Array2::from_shape_vec((1, v), xf).unwrap();
        let toks = ndarray::array![3i64];
        let mut p = Problem::new(Logits::F32(af.view()));
        p.tokens = Some(toks.view());
        p.options.temperature = t;
        let targets = RowTargets {
            vocab_size: v,
            token: Some(3),
            ..Default::default()
        };
        let weights = ndarray::array![0.75];
        let teacher = ndarray::array![[-0.5, -1.75, -3.0]];
        let tp: Vec<f64> = (0..v).map(|j| (j % 7) as f64 / (7 * v) as f64).collect();
        let tp = ndarray::Array2::from_shape_vec((1, v), tp).unwrap();
        for (form, order) in [
            (Shift::Any, Order::Lanes(8)),
            (Shift::Raw, Order::Tree),
            (Shift::SubtractThenScale, Order::Lanes(3)),
            (Shift::ScaleThenSubtract, Order::Sequential),
        ] {
            for acc in [Dtype::F32, Dtype::Bf16] {
                let leaf = order.summation(v).leaf;
                let sub_first = form == Shift::SubtractThenScale;
                let (lp, raw, h, lse, (sum_lp, soft)) =
                    careful_vectors(&x, t, acc, sub_first, leaf);
                let mut c = CarefulRow::new(&p, 0, acc, (form, order), None);
                let got = c.values(Output::LogProbs, 0, &targets, Dtype::F64).unwrap();
                let want = match form {
                    Shift::Any => [lp[3], raw[3]],
                    Shift::Raw => [raw[3], raw[3]],
                    _ => [lp[3], lp[3]],
                };
                assert_eq!(
                    got.map(f64::to_bits),
                    want.map(f64::to_bits),
                    "case {case} {form:?} {order} {acc}"
                );
                let got = c.values(Output::Entropy, 0, &targets, Dtype::F64).unwrap()[0];
                assert_eq!(
                    got.to_bits(),
                    h.to_bits(),
                    "case {case} {form:?} {order} {acc}: {got} vs {h}"
                );
                let got = c.values(Output::Lse, 0, &targets, Dtype::F64).unwrap()[0];
                assert_eq!(
                    got.to_bits(),
                    lse.to_bits(),
                    "case {case} {form:?} {order} {acc}"
                );
                // The cross-entropy under `none` with label smoothing 0.1
                // and a weight: `r(w r(r(0.9 (-lp)) + r(0.1 r(-r(sum / V)))))`.
                let r = |v: f64| acc.round_f64(v);
                let (eps, w) = (r(0.1), r(weights[0]));
                let mean = -r(sum_lp / v as f64);
                let want = r(w * r(r((1.0 - eps) * -lp[3]) + r(eps * mean)));
                let mut q = p;
                q.options.loss = Some(LossOptions {
                    reduction: Reduction::None,
                    label_smoothing: 0.1,
                    ..LossOptions::default()
                });
                q.loss_weights = Some(weights.view());
                let mut cl = CarefulRow::new(&q, 0, acc, (form, order), None);
                let got = cl.values(Output::Loss, 0, &targets, Dtype::F64).unwrap()[0];
                if form != Shift::Raw {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "case {case} {form:?} {order} {acc}"
                    );
                    // The top-k KL at ids 0, 5, 3 against a teacher:
                    // `sum_k r(r(e^a_k) r(a_k - lp_k))` and its reverse.
                    let mut q = p;
                    q.options.topk_kl = Some(TopkKl {
                        forward: true,
                        reverse: true,
                        renormalized: false,
                        teacher_dtype: Dtype::F32,
                    });
                    q.teacher_topk_log_probs = Some(teacher.view());
                    let tk = RowTargets {
                        topk_ids: vec![0, 5, 3],
                        ..targets.clone()
                    };
                    let mut ck = CarefulRow::new(&q, 0, acc, (form, order), None);
                    let (mut f, mut b) = (0.0, 0.0);
                    for (&id, &a) in tk.topk_ids.iter().zip(teacher.row(0)) {
                        let (a, l) = (r(a), lp[id]);
                        f = r(f + r(r(a.exp()) * r(a - l)));
                        b = r(b + r(r(l.exp()) * r(l - a)));
                    }
                    let got = ck.values(Output::ForwardKl, 0, &tk, Dtype::F64).unwrap()[0];
                    assert_eq!(got.to_bits(), f.to_bits(), "case {case} {form:?} {acc}");
                    let got = ck.values(Output::ReverseKl, 0, &tk, Dtype::F64).unwrap()[0];
                    assert_eq!(got.to_bits(), b.to_bits(), "case {case} {form:?} {acc}");
                    // The soft cross-entropy (teacher probabilities).
                    let mut q = p;
                    q.teacher_probs = Some(tp.view());
                    let mut cs = CarefulRow::new(&q, 0, acc, (form, order), None);
                    let got = cs
                        .values(Output::SoftCrossEntropy, 0, &targets, Dtype::F64)
                        .unwrap()[0];
                    assert_eq!(got.to_bits(), soft.to_bits(), "case {case} {form:?} {acc}");
                }
                // Rounded to the output's dtype at the end.
                let got = c.values(Output::Entropy, 0, &targets, Dtype::Bf16).unwrap()[0];
                assert_eq!(got, Dtype::Bf16.round_f64(h));
            }
        }
    }
}

// ---------------------------------------------------------------- against the oracle

/// The f32 kernels above, judged with the oracle's statistics and exact
/// values: each within its own summation model, f32 and bf16 outputs.
#[test]
fn f32_kernels_are_within_their_models_against_the_oracle() {
    use logprobe_reference::oracle::Oracle;
    use logprobe_reference::spec::{Logits, Problem};
    use ndarray::{Array1, Array2};
    let mut rng = SplitMix64::new(10);
    let oracle = Oracle::default();
    for case in 0..6 {
        let v = [5, 300, 3000][case % 3];
        let x = row(&mut rng, v, case);
        let tgt = (case * 7) % v;
        let xs = Array2::from_shape_vec((1, v), x.iter().map(|&a| a as f32).collect()).unwrap();
        let tokens = Array1::from_vec(vec![tgt as i64]);
        let mut problem = Problem::new(Logits::F32(xs.view()));
        problem.tokens = Some(tokens.view());
        let st = oracle.row_stats(&problem, 0).unwrap();
        let ctx = RowContext::from_problem(&problem, 0).unwrap();
        for out in [Dtype::F32, Dtype::Bf16] {
            let fwd = oracle.forward(&problem, out).unwrap();
            let lp_exact = fwd.values[Output::LogProbs][[0, 0]];
            let h_exact = fwd.values[Output::Entropy][[0, 0]];
            for how in [Sum32::Sequential, Sum32::Lanes8, Sum32::Tree] {
                let k = kernel32(&x, 1.0, how);
                let rb = model_for(how).row_bounds(&st, &ctx);
                let j = judge(
                    &lp_exact,
                    out.round_f64(k.lp[tgt] as f64),
                    out,
                    &rb.log_prob(out),
                );
                assert!(
                    j.pass,
                    "{} case {case} {out} log_prob: {j:?}",
                    model_for(how).name()
                );
                for h in [k.entropy_fused, k.entropy_logsoftmax] {
                    let j = judge(&h_exact, out.round_f64(h as f64), out, &rb.entropy(out));
                    assert!(
                        j.pass,
                        "{} case {case} {out} entropy: {j:?}",
                        model_for(how).name()
                    );
                }
            }
        }
    }
}

/// Top-k ids with a `-inf` logit (or a probability that underflows at an
/// offset of `-1e30`) that `sampling_mask` allows are live outputs: their
/// gradient is `G_k / T` at the id and `-G_k p_j / T` elsewhere (oracle,
/// PyTorch). The bound covers the fused kernel on every element, f32 and
/// bf16 outputs; leaving such an id out (the old "masked constant" reading)
/// breaks it; a masked id's cotangent adds nothing.
#[test]
fn live_topk_ids_with_neg_inf_logits_are_differentiated() {
    use logprobe_kernels::{CpuKernel, Kernel};
    use logprobe_reference::oracle::Oracle;
    use logprobe_reference::spec::{Cotangents, Logits, Problem};
    use ndarray::{Array1, Array2};
    let oracle = Oracle::default();
    let ninf = f32::NEG_INFINITY;
    // Columns: 1 is -inf (live), 4 is masked, 5 sits 1e30 below the max.
    let x: Vec<f32> = vec![1.0, ninf, 0.5, 2.0, -0.25, -1e30];
    let v = x.len();
    let xs = Array2::from_shape_vec((1, v), x).unwrap();
    let mut mask = Array2::from_elem((1, v), true);
    mask[[0, 4]] = false;
    let ids = Array2::from_shape_vec((1, 4), vec![1i64, 4, 3, 5]).unwrap();
    let gk = Array2::from_shape_vec((1, 4), vec![0.7f64, 1.25, -0.375, 0.5]).unwrap();
    let g = Array1::from_vec(vec![0.0f64]);
    let tokens = Array1::from_vec(vec![0i64]);
    for t in [1.0f64, 0.7] {
        let mut problem = Problem::new(Logits::F32(xs.view()));
        problem.tokens = Some(tokens.view());
        problem.sampling_mask = Some(mask.view());
        problem.topk_ids = Some(ids.view());
        problem.options.temperature = t;
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with(Output::TopkLogProbs, gk.view());
        let st = oracle.row_stats(&problem, 0).unwrap();
        let ctx = RowContext::from_problem(&problem, 0).unwrap();
        let shape = problem.validate_shapes().unwrap();
        let model = Model::declared(&CpuKernel::fused().algorithm(&shape));
        let rb = model.row_bounds(&st, &ctx);
        let live = GradCotangents::live_topk(
            ids.row(0).iter().copied(),
            gk.row(0).iter().copied(),
            |id| problem.allowed(0, id),
        );
        assert_eq!(live, vec![(1, 0.7), (3, -0.375), (5, 0.5)]);
        let old: Vec<(usize, f64)> = vec![(3, -0.375), (5, 0.5)];
        for out in [Dtype::F32, Dtype::Bf16] {
            let exact = oracle.vjp(&problem, &cot, out).unwrap();
            let cand = CpuKernel::fused().backward(&problem, &cot, out).unwrap();
            let mk = |topk| GradCotangents {
                g: 0.0,
                h: 0.0,
                token: Some(0),
                topk,
                ..Default::default()
            };
            let (now, before) = (mk(&live), mk(&old));
            let mut old_fails = false;
            for j in 0..v {
                let jd = judge(&exact[[0, j]], cand[[0, j]], out, &rb.grad(j, &now, out));
                assert!(jd.pass, "T={t} {out} j={j}: {jd:?}");
                let jo = judge(&exact[[0, j]], cand[[0, j]], out, &rb.grad(j, &before, out));
                old_fails |= !jo.pass;
            }
            // Column 1 gets G_k / T exactly in the reals: not within a 1e-37 floor.
            assert!(exact[[0, 1]].enclosure.lo >= 0.7 / t * (1.0 - 1e-12));
            assert!(old_fails, "T={t} {out}: the old reading passed");
            // The masked id's cotangent is dropped: its column is exactly 0.
            assert_eq!(cand[[0, 4]], 0.0);
            assert!(abs(&rb.grad(4, &now, out)) < 1e-30);
        }
    }
}

/// `RowBounds::new_all` shares the order-independent per-entry work of
/// several models: its bounds equal `RowBounds::new`'s bit for bit (one
/// model's bounds run the same shared walks).
#[test]
fn shared_bounds_of_all_models_equal_the_one_by_one_bounds() {
    each_masked_row(7, 2000, 5, |kind, _, _, st, models, all| {
        let cot = target_and_id_cot();
        for (model, shared) in models.iter().zip(all) {
            let one = model.row_bounds(st, &ctx1());
            for out in [Dtype::F32, Dtype::Bf16] {
                let pairs = [
                    (one.log_prob(out), shared.log_prob(out)),
                    (one.entropy(out), shared.entropy(out)),
                    (one.topk(6, out), shared.topk(6, out)),
                    (one.grad(4, &cot, out), shared.grad(4, &cot, out)),
                ];
                for (p, q) in pairs {
                    assert_eq!(
                        abs(&p).to_bits(),
                        abs(&q).to_bits(),
                        "{kind} {out}: {p} vs {q}"
                    );
                }
            }
        }
    });
}

/// Gate: our own kernels (Fused, Chunked) are never SUSPECT: their errors
/// are within the statistical threshold of their declared model and of
/// `verify`'s default `lanes=8`, on Gaussian, near-uniform and Zipf-like
/// rows (oracle statistics); and the threshold lies between the
/// deterministic part (`c = 0`) and the sound bound.
#[test]
fn our_kernels_are_never_suspect() {
    use super::Statistical;
    use logprobe_kernels::{CpuKernel, Kernel};
    use logprobe_reference::oracle::Oracle;
    use logprobe_reference::spec::{Logits, Problem};
    use ndarray::{Array1, Array2};
    let mut rng = SplitMix64::new(13);
    let oracle = Oracle::default();
    for case in 0..4 {
        let v = [3000, 8192][case % 2];
        let x = row(&mut rng, v, case);
        let tgt = (case * 11) % v;
        let xs = Array2::from_shape_vec((1, v), x.iter().map(|&a| a as f32).collect()).unwrap();
        let tokens = Array1::from_vec(vec![tgt as i64]);
        let mut problem = Problem::new(Logits::F32(xs.view()));
        problem.tokens = Some(tokens.view());
        let st = oracle.row_stats(&problem, 0).unwrap();
        let ctx = RowContext::from_problem(&problem, 0).unwrap();
        let shape = problem.validate_shapes().unwrap();
        let out = Dtype::F32;
        let fwd = oracle.forward(&problem, out).unwrap();
        let lp_exact = fwd.values[Output::LogProbs][[0, 0]];
        let h_exact = fwd.values[Output::Entropy][[0, 0]];
        let kernels: [&dyn Kernel; 2] = [&CpuKernel::fused(), &CpuKernel::chunked(256)];
        for k in kernels {
            let o = k.forward(&problem, out).unwrap();
            let declared = Model::declared(&k.algorithm(&shape));
            for model in [declared, Model::lanes(8)] {
                let stat = Statistical::new(model).row_bounds(&st, &ctx);
                let sound = model.row_bounds(&st, &ctx);
                let det = Statistical::new(model).with_c(0.0).row_bounds(&st, &ctx);
                let lp = o.values[Output::LogProbs][[0, 0]];
                let h = o.values[Output::Entropy][[0, 0]];
                for (name, exact, cand, t, sb, d) in [
                    (
                        "log_prob",
                        &lp_exact,
                        lp,
                        stat.log_prob(out),
                        sound.log_prob(out),
                        det.log_prob(out),
                    ),
                    (
                        "entropy",
                        &h_exact,
                        h,
                        stat.entropy(out),
                        sound.entropy(out),
                        det.entropy(out),
                    ),
                ] {
                    let (t, sb, d) = (abs(&t), abs(&sb), abs(&d));
                    assert!(d <= t && t <= sb, "{name}: {d} <= {t} <= {sb}");
                    let j = judge(exact, cand, out, &ErrorBound::Abs(t));
                    assert!(
                        j.pass,
                        "{} {} case {case} {name}: SUSPECT {j:?}",
                        k.name(),
                        model.name()
                    );
                }
            }
        }
    }
}

#[test]
fn clopper_pearson_upper_bounds() {
    use super::{clopper_pearson_upper, per_dump_rate};
    // k = 0: 1 - 0.05^(1/n) (the "rule of three": about 3/n).
    let p = clopper_pearson_upper(0, 1000, 0.95);
    assert!((p - (1.0 - 0.05f64.powf(1e-3))).abs() < 1e-12 && (p * 1000.0 - 3.0).abs() < 0.01);
    // k = 1, n = 10: the 95% one-sided upper limit is 0.3942.
    assert!((clopper_pearson_upper(1, 10, 0.95) - 0.3942).abs() < 1e-3);
    assert_eq!(clopper_pearson_upper(5, 5, 0.95), 1.0);
    assert!((per_dump_rate(1e-3, 100) - (1.0 - 0.999f64.powi(100))).abs() < 1e-12);
}

/// `RowBounds::new_shared` with grouping keys (bf16 logits: few distinct
/// values) and the statistical threshold: the grouped bounds and the
/// threshold agree with the entry-by-entry ones to within the upward
/// widening of the sums (each of the `V = 3000` upward additions widens
/// by `4 eps`; a group adds once: `V * 16 eps` relative covers it), a key
/// that does not describe the statistics falls back to entry by entry
/// (bit for bit), and `grad_many` equals `grad` bit for bit.
#[test]
fn grouped_and_statistical_bounds_equal_the_one_by_one_bounds() {
    use super::Statistical;
    let mut rng = SplitMix64::new(8);
    let tol = 3000.0 * 16.0 * f64::EPSILON;
    let close = |a: f64, b: f64| (a - b).abs() <= tol * a.abs().max(b.abs());
    let bf = |x: f64| Dtype::Bf16.round_f64(x);
    for kind in 0..4 {
        let x: Vec<f64> = row(&mut rng, 3000, kind).into_iter().map(bf).collect();
        let keys: Vec<u32> = x
            .iter()
            .map(|&v| u32::from(half::bf16::from_f32(v as f32).to_bits()))
            .collect();
        let mask = mask_every(x.len(), 0, 7);
        for m in [None, Some(&mask[..])] {
            let keys: Vec<u32> = match m {
                None => keys.clone(),
                Some(m) => keys
                    .iter()
                    .zip(m)
                    .map(|(&k, &ok)| k | (u32::from(ok) << 16))
                    .collect(),
            };
            let st = stats_f64(&x, 1.0, m, Some(3));
            let models = verify_models();
            let stat = Statistical::new(models[0]);
            let (one, _) = RowBounds::new_shared(&models, None, &st, &ctx1(), None);
            let (grouped, sg) =
                RowBounds::new_shared(&models, Some(&stat), &st, &ctx1(), Some(&keys));
            let sg = sg.expect("statistical bounds");
            let s1 = stat.row_bounds(&st, &ctx1());
            // A key naming two different logits alike: no grouping, same bounds.
            let bad = vec![0u32; x.len()];
            let (ungrouped, _) = RowBounds::new_shared(&models, None, &st, &ctx1(), Some(&bad));
            let cot = target_and_id_cot();
            for out in [Dtype::F32, Dtype::Bf16] {
                for (o, (g, u)) in one.iter().zip(grouped.iter().zip(&ungrouped)) {
                    for (p, q, r) in [
                        (o.log_prob(out), g.log_prob(out), u.log_prob(out)),
                        (o.entropy(out), g.entropy(out), u.entropy(out)),
                        (o.topk(6, out), g.topk(6, out), u.topk(6, out)),
                    ] {
                        assert!(close(abs(&p), abs(&q)), "{kind} {out}: {p} vs {q}");
                        assert_eq!(p, r, "{kind} {out}");
                    }
                }
                for (p, q) in [
                    (s1.log_prob(out), sg.log_prob(out)),
                    (s1.entropy(out), sg.entropy(out)),
                ] {
                    assert!(close(abs(&p), abs(&q)), "{kind} {out}: {p} vs {q}");
                }
                for j in [0, 3, 6, 100, 2999] {
                    let many = RowBounds::grad_many(&one, j, &cot, out);
                    for (rb, b) in one.iter().zip(&many) {
                        assert_eq!(&rb.grad(j, &cot, out), b, "{kind} {out} {j}");
                    }
                }
            }
        }
    }
}

/// `DetachedBounds::attach` gives back the same bounds, bit for bit, over
/// the statistics they were built from, and refuses any other row's.
#[test]
fn detached_bounds_attach_only_to_their_own_row() {
    let mut rng = SplitMix64::new(11);
    let x = row(&mut rng, 500, 1);
    let y = row(&mut rng, 500, 2);
    let st = stats_f64(&x, 1.0, None, Some(3));
    let other = stats_f64(&y, 1.0, None, Some(3));
    let model = Model::lanes(8);
    let rb = model.row_bounds(&st, &ctx1());
    let (lp, h) = (rb.log_prob(Dtype::F32), rb.entropy(Dtype::F32));
    let detached = rb.detach();
    let again = detached.attach(&st).expect("its own statistics");
    assert_eq!(
        format!("{:?}", again.log_prob(Dtype::F32)),
        format!("{lp:?}")
    );
    assert_eq!(format!("{:?}", again.entropy(Dtype::F32)), format!("{h:?}"));
    assert!(
        detached.attach(&other).is_none(),
        "another row's statistics"
    );
    let copy = st.clone();
    assert!(
        detached.attach(&copy).is_none(),
        "another object, same values"
    );
}

/// (T18) `SECH2_Y_MAX` bounds `max_{y >= 0} y sech^2(y)`: `g(y) = y
/// sech^2(y)` rises while `2 y tanh(y) < 1` and falls after (`g' = sech^2
/// (1 - 2 y tanh y)`), so its maximum is at the root, near 0.7717; a dense
/// grid around it (and the root itself, by bisection) stays below the
/// constant, with the grid spacing's slack (`|g'| <= 1`) added.
#[test]
fn sech2_y_max_bounds_the_maximum() {
    let g = |y: f64| y / y.cosh().powi(2);
    let (mut lo, mut hi) = (0.5f64, 1.0f64);
    for _ in 0..100 {
        let m = 0.5 * (lo + hi);
        if 2.0 * m * m.tanh() < 1.0 {
            lo = m;
        } else {
            hi = m;
        }
    }
    assert!(g(lo) < super::bounds::SECH2_Y_MAX - 1e-5, "{}", g(lo));
    let step = 1e-6;
    let mut y = 0.0;
    while y < 20.0 {
        assert!(g(y) + step < super::bounds::SECH2_Y_MAX, "y = {y}");
        y += step * 37.0;
    }
    assert!(g(lo) > 0.4477, "the constant is tight: {}", g(lo));
}

/// (T14s): the screen's lower bounds are at most every model's (T14)
/// bound of the same element, each of those a finite `Abs`; the screen
/// answers for every non-indicator element of these rows, and is tight
/// (within a factor 2 of the bound; `verify` judges in full whatever it
/// cannot rule out, so a loose screen would only be slow).
#[test]
fn grad_screen_lower_bounds_are_below_every_models_bound() {
    each_masked_row(11, 1500, 7, |kind, x, m, _, _, all| {
        let count = m.map_or(x.len(), |m| m.iter().filter(|a| **a).count());
        let mask = m.map(ndarray::ArrayView1::from);
        // The loss side (T19): a mean cross-entropy with label smoothing; a
        // per-row one beside lse and z-loss cotangents.
        let mean_smoothed = LossGradCotangents {
            ell: 0.8 / 48.0,
            mean_rows: Some(64),
            eps: 0.1,
            count,
            mask,
            ..Default::default()
        };
        let with_z = LossGradCotangents {
            a: 0.5,
            zb: 2.0 * 1e-4 * -1.3,
            ell: 1.2,
            count,
            mask,
            ..Default::default()
        };
        for (g, h, topk, loss) in [
            (0.7, -1.3, &[(6, 0.25)][..], None),
            (-1.0, 0.0, &[][..], None),
            (0.0, 0.5, &[][..], None),
            (0.0, 0.0, &[][..], Some(mean_smoothed)),
            (0.0, 0.3, &[][..], Some(with_z)),
            (0.4, 0.0, &[(6, 0.25)][..], Some(mean_smoothed)),
        ] {
            let cot = GradCotangents {
                g,
                h,
                token: Some(3),
                topk,
                loss,
                ..Default::default()
            };
            let kind = format!("{kind} loss {}", loss.is_some());
            let row_c = RowBounds::grad_row(all, &cot);
            let Some(screen) = RowBounds::grad_screen(all, &row_c, &cot) else {
                panic!("{kind}: no screen for this row");
            };
            let (mut answered, mut tight) = (0usize, 0usize);
            for j in 0..x.len() {
                let exact = RowBounds::grad_many_with(all, &row_c, j, &cot, Dtype::F32);
                let Some(lower) = screen.lower(all, j, &cot) else {
                    continue;
                };
                // The four-lane models give the scalar bits.
                #[cfg(target_arch = "x86_64")]
                if super::bounds::lanes::available() {
                    let leaves = screen.leaves(all, j, &cot).expect("answered above");
                    // SAFETY: four models, AVX2 checked just above.
                    let l4 =
                        unsafe { logprobe_reference::simd::x86::lanes(screen.lower4(&leaves)) };
                    assert_eq!(l4.map(f64::to_bits), lower.map(f64::to_bits), "{kind} {j}");
                }
                answered += 1;
                let mut all_tight = true;
                for (l, e) in lower.iter().zip(&exact) {
                    let ErrorBound::Abs(e) = *e else {
                        panic!("{kind} {j}: screened but no bound: {e}");
                    };
                    assert!(e.is_finite() && *l <= e, "{kind} {j}: {l} > {e}");
                    all_tight &= 2.0 * l >= e;
                }
                tight += usize::from(all_tight);
            }
            let live = x.len() - m.map_or(0, |m| m.iter().filter(|a| !**a).count());
            assert!(
                answered + 2 >= live,
                "{kind}: {answered} of {live} answered"
            );
            assert!(2 * tight >= answered, "{kind}: {tight} of {answered} tight");
        }
    });
}

/// The four-lane walks (`bounds/lanes.rs`: the log-softmax entropy sums,
/// four models per AVX vector) give every bound the scalar code gives, bit
/// for bit: log-prob, entropy, top-k and statistical bounds, and every
/// (T14) bound built on them, on rows with `-inf` entries, entries below
/// f32's normal range (the flush terms), masks, a temperature, and twin
/// models.
#[test]
fn four_lane_walks_equal_the_scalar_walks() {
    use super::bounds::lanes;
    use super::Statistical;
    if !lanes::available() {
        eprintln!("no AVX2 on this CPU: the lanes never run");
        return;
    }
    let mut rng = SplitMix64::new(21);
    for kind in 0..7 {
        let mut x: Vec<f64> = match kind {
            6 => row(&mut rng, 2000, 3)
                .into_iter()
                .map(|v| (25.0 * v) as f32 as f64)
                .collect(),
            k => row(&mut rng, 2000, k),
        };
        for j in (5..x.len()).step_by(97) {
            x[j] = f64::NEG_INFINITY;
        }
        let mask = mask_every(x.len(), 1, 11);
        for m in [None, Some(&mask[..])] {
            for t in [1.0, 0.7] {
                let st = stats_f64(&x, t, m, Some(3));
                let z = x
                    .iter()
                    .filter(|v| v.is_finite())
                    .fold(0.0f64, |a, v| a.max((v / t).abs()));
                let ctx = RowContext {
                    temperature: t,
                    z_max_abs: z,
                    softcap: None,
                    linear: None,
                };
                let models = verify_models();
                let stat = Statistical::new(models[0]);
                let build = || RowBounds::new_shared(&models, Some(&stat), &st, &ctx, None);
                let (vb, vs) = build();
                let (sb, ss) = lanes::scalar(build);
                let (vs, ss) = (vs.expect("statistical"), ss.expect("statistical"));
                let what = format!("kind {kind} mask {} T {t}", m.is_some());
                for out in [Dtype::F32, Dtype::Bf16] {
                    for (v, s) in vb.iter().zip(&sb) {
                        for (p, q) in [
                            (v.log_prob(out), s.log_prob(out)),
                            (v.entropy(out), s.entropy(out)),
                            (v.topk(6, out), s.topk(6, out)),
                        ] {
                            assert_eq!(format!("{p:?}"), format!("{q:?}"), "{what} {out}");
                        }
                    }
                    for (p, q) in [
                        (vs.log_prob(out), ss.log_prob(out)),
                        (vs.entropy(out), ss.entropy(out)),
                    ] {
                        assert_eq!(format!("{p:?}"), format!("{q:?}"), "{what} {out}");
                    }
                }
                for (g, h) in [(0.7, -1.3), (-1.0, 0.0), (0.0, 0.5)] {
                    let cot = GradCotangents {
                        g,
                        h,
                        token: Some(3),
                        topk: &[(6, 0.25)],
                        ..Default::default()
                    };
                    let row_c = RowBounds::grad_row(&vb, &cot);
                    let row_s = RowBounds::grad_row(&sb, &cot);
                    for j in (0..x.len()).step_by(16) {
                        let v = RowBounds::grad_many_with(&vb, &row_c, j, &cot, Dtype::F32);
                        let s = RowBounds::grad_many_with(&sb, &row_s, j, &cot, Dtype::F32);
                        assert_eq!(v, s, "{what} {g} {h} {j}");
                        for (rb, b) in vb.iter().zip(&v) {
                            assert_eq!(&rb.grad(j, &cot, Dtype::F32), b, "{what} {j}");
                        }
                    }
                }
            }
        }
    }
}

/// The log-softmax entropy sums from the row's moments ((T12m)) give the
/// entry-by-entry walk's bounds to within `1e-9` relative (the same reals,
/// other roundings) on every row kind, masked or not, at two temperatures,
/// with and without the lanes: the entropy bounds and the gradient's,
/// which read the entropy error (T13). Kind 3 at `T = 0.7` has
/// exceptions with `K |d_j| > 2^-16`; kind 6 (logits spread over hundreds
/// of nats) plain entries and exceptions of both kinds (also `lw_j` below
/// `ln_min_normal`).
#[test]
fn moment_sums_give_the_entry_by_entry_bounds() {
    use super::bounds::without_moments;
    let mut rng = SplitMix64::new(33);
    let close = |a: Option<f64>, b: Option<f64>, what: &str| match (a, b) {
        (Some(a), Some(b)) => {
            assert!(
                (a - b).abs() <= 1e-9 * a.abs().max(b.abs()),
                "{what}: {a:e} vs {b:e}"
            )
        }
        (a, b) => assert_eq!(a.is_some(), b.is_some(), "{what}"),
    };
    for kind in 0..7 {
        let x: Vec<f64> = match kind {
            6 => row(&mut rng, 3000, 3)
                .into_iter()
                .map(|v| (4.0 * v) as f32 as f64)
                .collect(),
            k => row(&mut rng, 3000, k),
        };
        let mask = mask_every(x.len(), 2, 13);
        for m in [None, Some(&mask[..])] {
            for t in [1.0, 0.7] {
                let st = stats_f64(&x, t, m, Some(3));
                let z = x.iter().fold(0.0f64, |a, v| a.max((v / t).abs()));
                let ctx = RowContext {
                    temperature: t,
                    z_max_abs: z,
                    softcap: None,
                    linear: None,
                };
                let models = verify_models();
                let build = || RowBounds::new_shared(&models, None, &st, &ctx, None).0;
                for lanes in [true, false] {
                    let (mo, by) = if lanes {
                        (build(), without_moments(build))
                    } else {
                        let scalar = super::bounds::lanes::scalar;
                        (scalar(build), without_moments(|| scalar(build)))
                    };
                    let cot = target_and_id_cot();
                    let (rm, rb) = (
                        RowBounds::grad_row(&mo, &cot),
                        RowBounds::grad_row(&by, &cot),
                    );
                    for (i, (a, b)) in mo.iter().zip(&by).enumerate() {
                        let what = format!("kind {kind} mask {} T {t} model {i}", m.is_some());
                        for out in [Dtype::F32, Dtype::Bf16] {
                            close(a.entropy(out).value(), b.entropy(out).value(), &what);
                        }
                    }
                    for j in (0..x.len()).step_by(37) {
                        let a = RowBounds::grad_many_with(&mo, &rm, j, &cot, Dtype::F32);
                        let b = RowBounds::grad_many_with(&by, &rb, j, &cot, Dtype::F32);
                        for (a, b) in a.iter().zip(&b) {
                            close(a.value(), b.value(), &format!("kind {kind} grad {j}"));
                        }
                    }
                }
            }
        }
    }
}

#[path = "tests_forms.rs"]
mod forms;
#[path = "tests_rank.rs"]
mod tests_rank;
