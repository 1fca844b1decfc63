//! TOLERANCE.md (T19b) and (S2b): bf16 logits at a large offset hold a
//! handful of distinct values (spacing 4 near 1000), each tens of
//! thousands of times. Sums of equal terms round alike, so their errors add
//! with one sign. PyTorch's autograd of log-probs plus entropy sums the
//! entropy's dense cotangent onto the lane that holds the target's `g` in
//! `log_softmax`'s backward (`dx = G - p sum G`, one f32 vector accumulator):
//! that sum stagnates on `|g|`, beyond (S2)'s `c sqrt(n) u`. Such a correct
//! kernel must pass, SUSPECT nowhere.

use logprobe_verify::tensors::{verify_tensors, TensorBytes};
use logprobe_verify::verify::{FileReport, ReportVerdict, VerifyConfig};

const V: usize = 256_000;
const N: usize = 8;
/// PyTorch's `Vectorized<float>` on AVX-512: the accumulator's lanes.
const LANES: usize = 16;

/// `N` rows of bf16-exact logits: `1000 + N(0, 2.5^2)` and four tokens
/// 12-14 above, rounded to bf16 (multiples of 4 in `[512, 1024)`), and
/// each row's token (a spike).
fn rows() -> (Vec<Vec<f32>>, Vec<i64>) {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut rows = Vec::new();
    let mut tokens = Vec::new();
    for _ in 0..N {
        let mut y: Vec<f64> = (0..V)
            .map(|_| {
                let (a, b) = (uniform(), uniform());
                2.5 * (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
            })
            .collect();
        let mut spike = 0;
        for _ in 0..4 {
            spike = (uniform() * V as f64) as usize;
            y[spike] = 12.0 + 2.0 * uniform();
        }
        let x = y
            .iter()
            .map(|&v| (4.0 * ((1000.0 + v) / 4.0).round()) as f32)
            .collect();
        rows.push(x);
        tokens.push(spike as i64);
    }
    (rows, tokens)
}

/// One `Vectorized<float>` accumulator over `x`, then its lanes summed
/// pairwise (ATen's `vec::reduce_all`).
fn reduce_all(x: impl Iterator<Item = f32>) -> f32 {
    let mut acc = [0f32; LANES];
    for (j, v) in x.enumerate() {
        acc[j % LANES] += v;
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0]
}

/// Autograd in f32 of `g lp_t + h H` with `lp = log_softmax(x)`, `H =
/// -(exp(lp) lp).sum()`: `(lp_t, H, dx)`.
fn autograd(x: &[f32], t: usize, g: f32, h: f32) -> (f32, f32, Vec<f32>) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = reduce_all(x.iter().map(|&v| (v - m).exp())).ln();
    let lp: Vec<f32> = x.iter().map(|&v| (v - m) - lse).collect();
    let p: Vec<f32> = lp.iter().map(|&l| l.exp()).collect();
    let ent = -reduce_all(p.iter().zip(&lp).map(|(&p, &l)| p * l));
    // The cotangent of lp: -h p (mul's backward) + (-h lp) p (exp's), and
    // g at the target (gather's backward).
    let mut big_g: Vec<f32> = p
        .iter()
        .zip(&lp)
        .map(|(&p, &l)| -h * p + (-h * l) * p)
        .collect();
    big_g[t] += g;
    let sum_g = reduce_all(big_g.iter().copied());
    let dx = big_g
        .iter()
        .zip(&p)
        .map(|(&gj, &p)| gj - p * sum_g)
        .collect();
    (lp[t], ent, dx)
}

fn bytes32(x: impl Iterator<Item = f32>) -> Vec<u8> {
    x.flat_map(f32::to_le_bytes).collect()
}

fn verify(rows: &[Vec<f32>], tokens: &[i64], gh: &[(f32, f32)]) -> FileReport {
    let mut lps = Vec::new();
    let mut ents = Vec::new();
    let mut grads = Vec::new();
    for ((x, &t), &(g, h)) in rows.iter().zip(tokens).zip(gh) {
        let (lp, ent, dx) = autograd(x, t as usize, g, h);
        lps.push(lp);
        ents.push(ent);
        grads.extend(dx);
    }
    // bf16: the top half of an f32 that is bf16-exact.
    let logits: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let toks: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let (lps, ents, grads) = (
        bytes32(lps.into_iter()),
        bytes32(ents.into_iter()),
        bytes32(grads.into_iter()),
    );
    let g = bytes32(gh.iter().map(|p| p.0));
    let h = bytes32(gh.iter().map(|p| p.1));
    let (shape, n) = ([N, V], [N]);
    let f32_ = safetensors::Dtype::F32;
    let t = |dtype, shape, data| TensorBytes { dtype, shape, data };
    let tensors = [
        (
            "logits",
            t(safetensors::Dtype::BF16, &shape[..], &logits[..]),
        ),
        ("tokens", t(safetensors::Dtype::I64, &n[..], &toks[..])),
        ("log_probs", t(f32_, &n[..], &lps[..])),
        ("entropy", t(f32_, &n[..], &ents[..])),
        ("grad_log_probs", t(f32_, &n[..], &g[..])),
        ("grad_entropy", t(f32_, &n[..], &h[..])),
        ("grad_logits", t(f32_, &shape[..], &grads[..])),
    ];
    verify_tensors(&tensors, &[], "ties", &VerifyConfig::default()).expect("verifies")
}

#[test]
fn autograd_on_tied_bf16_logits_is_not_suspect() {
    let (rows, tokens) = rows();
    // The log-prob cotangent dominating the entropy's (the case that
    // stagnates on |g|), then comparable ones and the reverse.
    let gh = [
        (-1.36, -0.03),
        (1.2, 0.04),
        (-1.5, 0.02),
        (1.4, -0.05),
        (0.9, 0.05),
        (-0.2, 1.1),
        (1.5, -0.8),
        (-0.7, 0.6),
    ];
    let r = verify(&rows, &tokens, &gh);
    for o in &r.outputs {
        assert_eq!(o.verdict, ReportVerdict::Pass, "{o:?}");
        assert_eq!(o.suspect_elements, 0, "{o:?}");
    }
    // The backward's sum does stagnate on |g|: its relative error is
    // beyond (S2)'s unfloored `c sqrt(V / LANES) u` (c = 8) on some row.
    let worst = rows
        .iter()
        .zip(&tokens)
        .zip(&gh)
        .map(|((x, &t), &(g, h))| sum_g_error(x, t as usize, g, h))
        .fold(0.0, f64::max);
    let unfloored = 8.0 * (V as f64 / LANES as f64).sqrt() * f64::from(f32::EPSILON) / 2.0;
    assert!(worst > unfloored, "{worst} vs {unfloored}");
}

/// The relative error of the backward's `sum G` (as [`autograd`] forms it).
fn sum_g_error(x: &[f32], t: usize, g: f32, h: f32) -> f64 {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = reduce_all(x.iter().map(|&v| (v - m).exp())).ln();
    let lp: Vec<f32> = x.iter().map(|&v| (v - m) - lse).collect();
    let p: Vec<f32> = lp.iter().map(|&l| l.exp()).collect();
    let mut big_g: Vec<f32> = p
        .iter()
        .zip(&lp)
        .map(|(&p, &l)| -h * p + (-h * l) * p)
        .collect();
    big_g[t] += g;
    let exact: f64 = big_g.iter().map(|&v| f64::from(v)).sum();
    (f64::from(reduce_all(big_g.iter().copied())) - exact).abs() / exact.abs()
}
