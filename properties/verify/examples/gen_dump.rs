//! Writes a large LLM-like dump for timing `logprobe verify`
//! (docs/benchmarks-history.md, "verify at batch scale"): `logits [N, V]`
//! in `--dtype` (Gaussian logits, standard deviation 3, plus a few spikes,
//! a deterministic xorshift stream), `tokens [N]`, and candidate
//! `log_probs [N]`, `entropy [N]` and,
//! with `--grad`, cotangents `grad_log_probs [N]`, `grad_entropy [N]` and
//! candidate `grad_logits [N, V]`, all in the logits' dtype. The candidates
//! are computed in f64 (log_softmax, entropy `ln S + R`, VJP
//! `g (1[j=t] - p_j) - h q_j (e_j + R)`) and rounded once: a correct
//! implementation, so verify should pass them. With `--softcap C` the
//! dump carries the meta `softcap = C` (`softcap_dtype` accumulation) and
//! the candidates are those of `x' = C tanh(x / C)` (Gemma 2's final-logit
//! softcap; the VJP times `1 - tanh^2(x / C)`).
//!
//! ```sh
//! cargo run --release -p logprobe-verify --example gen_dump -- /tmp/fwd.safetensors 256 152064 bf16
//! cargo run --release -p logprobe-verify --example gen_dump -- /tmp/grad.safetensors 128 152064 f32 --grad
//! cargo run --release -p logprobe-verify --example gen_dump -- /tmp/cap.safetensors 64 152064 bf16 --softcap 30
//! ```
//! Large files: do not commit them.

use logprobe_reference::spec::Dtype;
use logprobe_verify::dump::{serialize_dump, DumpTensor};
use logprobe_verify::keys;

/// xorshift64* (Vigna 2016): deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `(0, 1)`.
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (a, b) = (self.uniform(), self.uniform());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }
}

fn round(dtype: Dtype, x: f64) -> f64 {
    match dtype {
        Dtype::F64 => x,
        Dtype::F32 => x as f32 as f64,
        d => d.round_f64(x),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: gen_dump OUT N V f32|bf16|f16|f64 [--grad] [--softcap C]");
        std::process::exit(2);
    }
    let out = &args[0];
    let n: usize = args[1].parse().expect("N");
    let v: usize = args[2].parse().expect("V");
    let dtype = Dtype::ALL
        .into_iter()
        .find(|d| d.name() == args[3])
        .expect("dtype: f64, f32, bf16 or f16");
    let grad = args.iter().any(|a| a == "--grad");
    let softcap: Option<f64> = args.iter().position(|a| a == "--softcap").map(|i| {
        args.get(i + 1)
            .expect("--softcap C")
            .parse()
            .expect("C > 0")
    });
    let cap = |x: f64| softcap.map_or(x, |c| c * (x / c).tanh());

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut logits = Vec::with_capacity(n * v);
    let mut tokens = Vec::with_capacity(n);
    let (mut lp, mut ent) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut g_lp, mut g_ent) = (Vec::new(), Vec::new());
    let mut grad_logits = Vec::new();
    for _ in 0..n {
        let row: Vec<f64> = (0..v)
            .map(|_| {
                let spike = if rng.uniform() < 1e-4 { 12.0 } else { 0.0 };
                round(dtype, 3.0 * rng.normal() + spike)
            })
            .collect();
        let t = (rng.next_u64() % v as u64) as usize;
        let raw = row;
        let row: Vec<f64> = raw.iter().map(|&x| cap(x)).collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|&x| (x - m).exp()).sum();
        let ln_s = s.ln();
        let r: f64 = row.iter().map(|&x| (x - m).exp() * (m - x)).sum::<f64>() / s;
        tokens.push(t as i64);
        lp.push(round(dtype, row[t] - m - ln_s));
        ent.push(round(dtype, ln_s + r));
        if grad {
            let (g, h) = (round(dtype, -1.0 + 0.1 * rng.normal()), round(dtype, 0.01));
            g_lp.push(g);
            g_ent.push(h);
            for (j, &x) in row.iter().enumerate() {
                let p = (x - m).exp() / s;
                let ind = if j == t { 1.0 } else { 0.0 };
                let factor = softcap.map_or(1.0, |c| 1.0 - (raw[j] / c).tanh().powi(2));
                grad_logits.push(round(dtype, (g * (ind - p) - h * p * (x - m + r)) * factor));
            }
        }
        logits.extend(raw);
    }
    let mut tensors = vec![
        ("logits", DumpTensor::floats(dtype, &[n, v], &logits)),
        ("tokens", DumpTensor::i64s(&[n], &tokens)),
        ("log_probs", DumpTensor::floats(dtype, &[n], &lp)),
        ("entropy", DumpTensor::floats(dtype, &[n], &ent)),
    ];
    if grad {
        tensors.push(("grad_log_probs", DumpTensor::floats(dtype, &[n], &g_lp)));
        tensors.push(("grad_entropy", DumpTensor::floats(dtype, &[n], &g_ent)));
        tensors.push((
            "grad_logits",
            DumpTensor::floats(dtype, &[n, v], &grad_logits),
        ));
    }
    let c_text = softcap.map(|c| c.to_string());
    let meta: Vec<(&str, &str)> = match &c_text {
        Some(c) => vec![
            (keys::FORMAT_VERSION.name, "2"),
            (keys::SOFTCAP.name, c.as_str()),
        ],
        None => Vec::new(),
    };
    let bytes = serialize_dump(&tensors, &meta).expect("consistent shapes");
    std::fs::write(out, &bytes).expect("write the dump");
    eprintln!(
        "wrote {out}: [{n}, {v}] {} logits{}, {} bytes",
        dtype.name(),
        if grad { " with grad_logits" } else { "" },
        bytes.len()
    );
}
