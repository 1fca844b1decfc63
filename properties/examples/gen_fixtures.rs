//! Writes the golden inputs `fixtures/golden/*.safetensors`, deterministically
//! (a fixed xorshift64 stream per fixture; the committed files are the
//! reference, regenerating them only matters when a fixture is added).
//!
//! ```sh
//! cargo run --release -p logprobe-cli --example gen_fixtures
//! ```
//!
//! Each file is in the dump format (`docs/dump-from-pytorch.md`) without
//! candidates: `logits [N, V_total]`, `tokens [N]`, `topk_ids [N, 4]`,
//! optionally `sampling_mask`, and metadata (`temperature`, `vocab_size`).
//! `properties/tests/golden.rs` snapshots the oracle's values and each CPU
//! kernel's outputs on them.

use std::path::Path;

use logprobe_reference::spec::Dtype;
use logprobe_verify::dump::{serialize_dump, DumpTensor};
use logprobe_verify::keys;

/// xorshift64 (Marsaglia 2003): a fixed stream from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Approximately standard normal (sum of 4 uniforms, rescaled).
    fn normal(&mut self) -> f64 {
        ((0..4).map(|_| self.unit()).sum::<f64>() - 2.0) * 3f64.sqrt()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One golden input.
struct Fixture {
    name: &'static str,
    dtype: Dtype,
    n: usize,
    v_total: usize,
    logits: Vec<f64>,
    mask: Option<Vec<bool>>,
    meta: Vec<(&'static str, String)>,
}

/// LLM-like rows: Zipf-shaped scores over a random permutation of the
/// vocabulary (`-1.1 ln(rank)`), Gaussian noise, one dominant token.
fn llm_like(rng: &mut Rng, n: usize, v: usize) -> Vec<f64> {
    let mut x = Vec::with_capacity(n * v);
    for _ in 0..n {
        let mut row: Vec<f64> = (0..v)
            .map(|j| 4.0 - 1.1 * ((j + 1) as f64).ln() + 0.7 * rng.normal())
            .collect();
        for j in (1..v).rev() {
            row.swap(j, rng.below(j + 1));
        }
        let top = rng.below(v);
        row[top] += 6.0;
        x.extend(row);
    }
    x
}

fn fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    let rng = |seed: u64| Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);

    for (name, dtype, v, seed) in [
        ("llm_like_bf16", Dtype::Bf16, 32000, 1),
        ("llm_like_f16", Dtype::F16, 32000, 2),
        ("llm_like_f32", Dtype::F32, 50257, 3),
    ] {
        let n = 4;
        out.push(Fixture {
            name,
            dtype,
            n,
            v_total: v,
            logits: llm_like(&mut rng(seed), n, v),
            mask: None,
            meta: vec![],
        });
    }

    // Temperature 0.7 on f32 LLM-like rows.
    let (n, v) = (3, 4096);
    out.push(Fixture {
        name: "temperature_f32",
        dtype: Dtype::F32,
        n,
        v_total: v,
        logits: llm_like(&mut rng(4), n, v),
        mask: None,
        meta: vec![(keys::TEMPERATURE.name, "0.7".into())],
    });

    // Sampling mask: about half the vocabulary disallowed (top-p / grammar).
    let (n, v) = (4, 1000);
    let mut r = rng(5);
    let logits = llm_like(&mut r, n, v);
    let mask: Vec<bool> = (0..n * v).map(|_| r.unit() < 0.5).collect();
    out.push(Fixture {
        name: "masked_vocab_f32",
        dtype: Dtype::F32,
        n,
        v_total: v,
        logits,
        mask: Some(mask),
        meta: vec![],
    });

    // -inf entries (banned tokens written into the logits).
    let mut r = rng(6);
    let mut logits = llm_like(&mut r, n, v);
    for x in logits.iter_mut() {
        if r.unit() < 0.3 {
            *x = f64::NEG_INFINITY;
        }
    }
    out.push(Fixture {
        name: "neg_inf_entries_f32",
        dtype: Dtype::F32,
        n,
        v_total: v,
        logits,
        mask: None,
        meta: vec![],
    });

    // Ties: rows of a few repeated values, and two equal maxima.
    let v = 64;
    let logits: Vec<f64> = (0..3 * v)
        .map(|i| [2.0, 2.0, 0.5, -1.0][(i * 7 + i / v) % 4])
        .collect();
    out.push(Fixture {
        name: "ties_f32",
        dtype: Dtype::F32,
        n: 3,
        v_total: v,
        logits,
        mask: None,
        meta: vec![],
    });

    // Uniform rows: entropy ln V, log-probs -ln V.
    let v = 4096;
    let logits: Vec<f64> = (0..2 * v).map(|i| if i < v { 0.0 } else { -3.5 }).collect();
    out.push(Fixture {
        name: "uniform_bf16",
        dtype: Dtype::Bf16,
        n: 2,
        v_total: v,
        logits,
        mask: None,
        meta: vec![],
    });

    // Large offsets: f32 rows around 1e30 and -1e4 (spacing >> 1), f16 near 65504.
    let v = 1000;
    let mut r = rng(8);
    let base = llm_like(&mut r, 2, v);
    let logits: Vec<f64> = base
        .iter()
        .enumerate()
        .map(|(i, x)| if i < v { 1e30 + x * 1e23 } else { -1e4 + x })
        .collect();
    out.push(Fixture {
        name: "large_offsets_f32",
        dtype: Dtype::F32,
        n: 2,
        v_total: v,
        logits,
        mask: None,
        meta: vec![],
    });
    let logits: Vec<f64> = llm_like(&mut r, 2, v)
        .iter()
        .map(|x| 65000.0 + 30.0 * x)
        .collect();
    out.push(Fixture {
        name: "large_offsets_f16",
        dtype: Dtype::F16,
        n: 2,
        v_total: v,
        logits,
        mask: None,
        meta: vec![],
    });

    // Padded vocabulary (tensor-parallel): 1000 real columns of 1024; the
    // padding holds large values that must be ignored.
    let (n, v, vt) = (4, 1000, 1024);
    let mut r = rng(9);
    let real = llm_like(&mut r, n, v);
    let logits: Vec<f64> = (0..n * vt)
        .map(|i| {
            if i % vt < v {
                real[(i / vt) * v + i % vt]
            } else {
                30.0
            }
        })
        .collect();
    out.push(Fixture {
        name: "padded_vocab_bf16",
        dtype: Dtype::Bf16,
        n,
        v_total: vt,
        logits,
        mask: None,
        meta: vec![(keys::VOCAB_SIZE.name, v.to_string())],
    });
    out
}

/// Tokens and top-4 ids for a fixture: allowed, finite, inside the real
/// vocabulary (the row's argmax as the first id, then fixed picks).
fn targets(f: &Fixture) -> (Vec<i64>, Vec<i64>) {
    let v = f
        .meta
        .iter()
        .find(|(k, _)| *k == keys::VOCAB_SIZE.name)
        .map_or(f.v_total, |(_, s)| s.parse().unwrap());
    let mut rng = Rng(0xDEAD_BEEF ^ f.name.len() as u64);
    let (mut tokens, mut ids) = (Vec::new(), Vec::new());
    for r in 0..f.n {
        let ok = |j: usize| {
            let x = f.dtype.round_f64(f.logits[r * f.v_total + j]);
            x.is_finite() && f.mask.as_ref().is_none_or(|m| m[r * f.v_total + j])
        };
        let live: Vec<usize> = (0..v).filter(|&j| ok(j)).collect();
        let argmax = *live
            .iter()
            .max_by(|&&a, &&b| f.logits[r * f.v_total + a].total_cmp(&f.logits[r * f.v_total + b]))
            .expect("a live entry");
        tokens.push(live[rng.below(live.len())] as i64);
        ids.push(argmax as i64);
        for _ in 0..3 {
            ids.push(live[rng.below(live.len())] as i64);
        }
    }
    (tokens, ids)
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden");
    std::fs::create_dir_all(&dir).expect("create fixtures/golden");
    let mut total = 0;
    for f in fixtures() {
        let (tokens, ids) = targets(&f);
        let mut t = vec![
            (
                "logits",
                DumpTensor::floats(f.dtype, &[f.n, f.v_total], &f.logits),
            ),
            ("tokens", DumpTensor::i64s(&[f.n], &tokens)),
            ("topk_ids", DumpTensor::i64s(&[f.n, 4], &ids)),
        ];
        if let Some(m) = &f.mask {
            t.push(("sampling_mask", DumpTensor::bools(&[f.n, f.v_total], m)));
        }
        let meta: Vec<(&str, &str)> = f.meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let bytes = serialize_dump(&t, &meta).expect("valid fixture");
        total += bytes.len();
        let path = dir.join(format!("{}.safetensors", f.name));
        std::fs::write(&path, &bytes).expect("write fixture");
        println!("{} ({} bytes)", path.display(), bytes.len());
    }
    println!("{total} bytes in all");
}
