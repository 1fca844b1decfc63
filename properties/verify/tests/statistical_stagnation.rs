//! TOLERANCE.md (S2a): on LLM rows at large `V` (one token holding most of
//! the mass, a body of terms a few ulps of the lane holding it), a correct
//! f32 log-softmax stagnates: its error adds up with one sign. A correct
//! 8-lane kernel (PyTorch's AVX2 reduction) must not be SUSPECT there;
//! a sequential f32 sum, undeclared, stagnates on eight times the terms
//! careful code's blocks do and stays SUSPECT.

use logprobe_reference::spec::Dtype;
use logprobe_verify::tensors::{verify_tensors, TensorBytes};
use logprobe_verify::tolerance::naive_log_softmax;
use logprobe_verify::verify::{FileReport, ReportVerdict, VerifyConfig};

const V: usize = 256_000;
const N: usize = 4;

/// `N` rows: a Gaussian body `N(0, 2^2)` and five tokens 10-15 above it
/// (f32), and each row's token (the argmax on even rows).
fn rows() -> (Vec<Vec<f64>>, Vec<i64>) {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut rows = Vec::new();
    let mut tokens = Vec::new();
    for r in 0..N {
        let mut x: Vec<f64> = (0..V)
            .map(|_| {
                let (a, b) = (uniform(), uniform());
                2.0 * (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
            })
            .collect();
        for _ in 0..5 {
            let j = (uniform() * V as f64) as usize;
            x[j] += 10.0 + 5.0 * uniform();
        }
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v as f32)).collect();
        let argmax = (0..V).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap();
        tokens.push(if r % 2 == 0 {
            argmax as i64
        } else {
            (uniform() * V as f64) as i64
        });
        rows.push(x);
    }
    (rows, tokens)
}

/// PyTorch's CPU reduction on AVX2: 8 interleaved f32 lanes, merged
/// pairwise.
fn lanes8_log_prob(x: &[f64], t: usize) -> f32 {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32;
    let mut lanes = [0f32; 8];
    for (j, &v) in x.iter().enumerate() {
        lanes[j % 8] += (v as f32 - m).exp();
    }
    let mut w = 8;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            lanes[i] += lanes[i + w];
        }
    }
    (x[t] as f32 - m) - lanes[0].ln()
}

fn verify(rows: &[Vec<f64>], tokens: &[i64], lp: &[f32]) -> FileReport {
    let logits: Vec<u8> = rows
        .iter()
        .flatten()
        .flat_map(|&v| (v as f32).to_le_bytes())
        .collect();
    let toks: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let lps: Vec<u8> = lp.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (shape, n) = ([N, V], [N]);
    let f32_ = safetensors::Dtype::F32;
    let tensors = [
        (
            "logits",
            TensorBytes {
                dtype: f32_,
                shape: &shape,
                data: &logits,
            },
        ),
        (
            "tokens",
            TensorBytes {
                dtype: safetensors::Dtype::I64,
                shape: &n,
                data: &toks,
            },
        ),
        (
            "log_probs",
            TensorBytes {
                dtype: f32_,
                shape: &n,
                data: &lps,
            },
        ),
    ];
    verify_tensors(&tensors, &[], "stagnation", &VerifyConfig::default()).expect("verifies")
}

#[test]
fn a_correct_lane_sum_that_stagnates_is_not_suspect_and_a_sequential_one_is() {
    let (rows, tokens) = rows();
    let lanes: Vec<f32> = rows
        .iter()
        .zip(&tokens)
        .map(|(x, &t)| lanes8_log_prob(x, t as usize))
        .collect();
    let r = verify(&rows, &tokens, &lanes);
    let lp = &r.outputs[0];
    assert_eq!(lp.verdict, ReportVerdict::Pass, "{lp:?}");
    // The rows do stagnate: the kernel errs beyond (S2)'s unfloored
    // threshold on the normaliser, `c sqrt(V/8) u`.
    let unfloored = 8.0 * (V as f64 / 8.0).sqrt() * f64::from(f32::EPSILON) / 2.0;
    assert!(
        lp.max_abs_error > unfloored,
        "{} vs {unfloored}",
        lp.max_abs_error
    );
    let sequential: Vec<f32> = rows
        .iter()
        .zip(&tokens)
        .map(|(x, &t)| naive_log_softmax(x, 1.0, Dtype::F32)[t as usize] as f32)
        .collect();
    let r = verify(&rows, &tokens, &sequential);
    assert_eq!(
        r.outputs[0].verdict,
        ReportVerdict::Suspect,
        "{:?}",
        r.outputs[0]
    );
}
