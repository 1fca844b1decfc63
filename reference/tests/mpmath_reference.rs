//! The oracle against independent reference values: mpmath at 60 digits
//! (`scripts/mpmath_reference.py`, output committed as
//! `tests/data/mpmath_reference.txt`), straight from the definitions.

use std::collections::HashMap;

use half::{bf16, f16};
use logprobe_reference::oracle::{round_to_dtype, Exact, Oracle};
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, Output, Problem, TemperatureDtype,
};
use ndarray::{Array1, Array2};
use rug::Float;

const DATA: &str = include_str!("data/mpmath_reference.txt");

/// A reference value: a finite number, `±inf`, or a number below every
/// exponent range (`tiny±`).
#[derive(Debug)]
enum Ref {
    Num(Float),
    Inf(f64),
    Tiny(f64),
}

fn parse_ref(s: &str) -> Ref {
    match s {
        "inf" => Ref::Inf(f64::INFINITY),
        "-inf" => Ref::Inf(f64::NEG_INFINITY),
        "tiny+" => Ref::Tiny(1.0),
        "tiny-" => Ref::Tiny(-1.0),
        _ => Ref::Num(Float::with_val(
            256,
            Float::parse(s).unwrap_or_else(|e| panic!("{s}: {e}")),
        )),
    }
}

/// The oracle's result agrees with the 50-digit reference: the enclosure
/// contains it (up to the reference's own error, 1e-40 relative), and the
/// rounded value is the reference's correct rounding.
fn check(what: &str, e: &Exact, r: &Ref, dtype: Dtype) {
    assert!(e.decided, "{what}: undecided {e:?}");
    match r {
        Ref::Inf(x) => assert_eq!(e.rounded, *x, "{what}"),
        Ref::Tiny(s) => {
            assert_eq!(e.rounded, 0.0, "{what}");
            if *s > 0.0 {
                assert!(
                    e.enclosure.hi > 0.0 && e.enclosure.lo <= 1e-300,
                    "{what}: {e:?}"
                );
            } else {
                assert!(
                    e.enclosure.lo < 0.0 && e.enclosure.hi >= -1e-300,
                    "{what}: {e:?}"
                );
            }
        }
        Ref::Num(x) => {
            let slack = Float::with_val(256, x.abs_ref()) * 1e-40 + 1e-300;
            let lo = Float::with_val(256, e.enclosure.lo) - &slack;
            let hi = Float::with_val(256, e.enclosure.hi) + &slack;
            assert!(lo <= *x && *x <= hi, "{what}: {x} outside {e:?}");
            // Where the reference is not within its error of a midpoint, the
            // rounding must be its rounding.
            let down = Float::with_val(256, x - &slack);
            let up = Float::with_val(256, x + &slack);
            let (rd, ru) = (round_to_dtype(&down, dtype), round_to_dtype(&up, dtype));
            if rd == ru {
                assert_eq!(e.rounded, rd, "{what}: reference {x}");
            }
        }
    }
}

#[test]
fn oracle_matches_mpmath_reference_rows() {
    let mut cases = 0;
    let mut block: HashMap<&str, &str> = HashMap::new();
    for line in DATA.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        if key == "end" {
            run_case(&block);
            cases += 1;
            block.clear();
        } else {
            block.insert(key, rest);
        }
    }
    assert!(cases >= 30, "only {cases} reference rows");
}

fn nums<T: std::str::FromStr>(s: &str) -> Vec<T>
where
    T::Err: std::fmt::Debug,
{
    s.split_whitespace().map(|w| w.parse().unwrap()).collect()
}

fn run_case(b: &HashMap<&str, &str>) {
    let name = b["case"];
    let dtype = match b["dtype"] {
        "f64" => Dtype::F64,
        "f32" => Dtype::F32,
        "bf16" => Dtype::Bf16,
        _ => Dtype::F16,
    };
    let x: Vec<f64> = nums(b["x"]);
    let vt = x.len();
    let x64 = Array2::from_shape_vec((1, vt), x.clone()).unwrap();
    let x32 = x64.mapv(|v| v as f32);
    let xb = x64.mapv(|v| bf16::from_f32(v as f32));
    let xh = x64.mapv(|v| f16::from_f32(v as f32));
    for (i, &v) in x.iter().enumerate() {
        // The data holds exact values of the dtype.
        assert_eq!(dtype.round_f64(v), v, "{name} x[{i}]");
    }
    let logits = match dtype {
        Dtype::F64 => Logits::F64(x64.view()),
        Dtype::F32 => Logits::F32(x32.view()),
        Dtype::Bf16 => Logits::Bf16(xb.view()),
        Dtype::F16 => Logits::F16(xh.view()),
    };
    let mask = b.get("mask").map(|m| {
        Array2::from_shape_vec((1, vt), m.split_whitespace().map(|w| w == "1").collect()).unwrap()
    });
    let token = Array1::from_vec(nums::<i64>(b["token"]));
    let topk: Vec<i64> = nums(b["topk"]);
    let ids = Array2::from_shape_vec((1, topk.len()), topk.clone()).unwrap();
    let mut p = Problem::new(logits);
    p.tokens = Some(token.view());
    p.topk_ids = Some(ids.view());
    p.sampling_mask = mask.as_ref().map(|m| m.view());
    p.options.temperature = b["temperature"].parse().unwrap();
    p.options.temperature_dtype = if b["temperature_dtype"] == "input" {
        TemperatureDtype::Input
    } else {
        TemperatureDtype::Accumulation
    };
    p.options.entropy = match b["entropy_logits"] {
        "masked" => Some(EntropyLogits::Masked),
        "unmasked" => Some(EntropyLogits::Unmasked),
        _ => None,
    };
    p.options.vocab_size = Some(b["vocab_size"].parse().unwrap());
    let cot: Vec<f64> = nums(b["cot"]);
    let g = Array1::from_vec(vec![cot[0]]);
    let h = Array1::from_vec(vec![cot[1]]);
    let gk = Array2::from_shape_vec((1, topk.len()), cot[2..].to_vec()).unwrap();
    let cotangents = Cotangents::default()
        .with_column(Output::LogProbs, g.view())
        .with_column(Output::Entropy, p.options.entropy.map(|_| h.view()))
        .with(Output::TopkLogProbs, gk.view());
    for target in [Dtype::F64, Dtype::F32, Dtype::Bf16] {
        let f = Oracle::default().forward(&p, target).unwrap();
        check(
            &format!("{name} lse {target}"),
            &f.lse[0],
            &parse_ref(b["lse"]),
            target,
        );
        let lp = &f.values[Output::LogProbs][[0, 0]];
        match b["log_prob"] {
            "none" => assert!(!Output::LogProbs.judged(&p, 0), "{name}"),
            s => check(
                &format!("{name} log_prob {target}"),
                lp,
                &parse_ref(s),
                target,
            ),
        }
        match (b["entropy_logits"], f.values.get(Output::Entropy)) {
            ("none", None) => {}
            (_, Some(e)) => check(
                &format!("{name} entropy {target}"),
                &e[[0, 0]],
                &parse_ref(b["entropy"]),
                target,
            ),
            _ => panic!("{name}: entropy presence"),
        }
        let tk = &f.values[Output::TopkLogProbs];
        for (k, s) in b["topk_log_probs"].split_whitespace().enumerate() {
            check(
                &format!("{name} topk[{k}] {target}"),
                &tk[[0, k]],
                &parse_ref(s),
                target,
            );
        }
        let grad = Oracle::default().vjp(&p, &cotangents, target).unwrap();
        for (j, s) in b["grad"].split_whitespace().enumerate() {
            check(
                &format!("{name} grad[{j}] {target}"),
                &grad[[0, j]],
                &parse_ref(s),
                target,
            );
        }
    }
}
