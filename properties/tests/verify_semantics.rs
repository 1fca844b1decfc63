//! `logprobe verify` honours every part of the dump format: candidates equal
//! to the oracle's correctly rounded values pass, and the same dumps with a
//! value moved far beyond the bound fail, for each tensor dtype, the
//! metadata keys (temperature, vocab_size, entropy_logits, ignore_index,
//! temperature_dtype), masks, `-inf` logits, top-k and gradients.

use std::path::Path;

use ndarray::{Array1, Array2};

use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Logits, Options, Output, Problem, TemperatureDtype,
    DEFAULT_IGNORE_INDEX,
};
use logprobe_verify::dump::{serialize_dump, Dump, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{verify_dump, FileReport, ReportVerdict, RowSelection, VerifyConfig};

const N: usize = 4;
const VT: usize = 40;

/// Deterministic LLM-like logits `[N, VT]` (exact in every dtype: multiples
/// of 1/8 below 16), with `-inf` entries in row 1.
fn logits() -> Vec<f64> {
    let mut x: Vec<f64> = (0..N * VT)
        .map(|i| ((i * 37 + 11) % 97) as f64 / 8.0 - 6.0)
        .collect();
    x[VT + 3] = f64::NEG_INFINITY;
    x[VT + 17] = f64::NEG_INFINITY;
    x
}

struct Case {
    dtype: Dtype,
    out: Dtype,
    options: Options,
    mask: Option<Vec<bool>>,
    tokens: Vec<i64>,
    topk: Vec<i64>,
}

impl Case {
    fn new(dtype: Dtype, out: Dtype) -> Self {
        Case {
            dtype,
            out,
            options: Options::default(),
            mask: None,
            tokens: vec![5, 0, 39, 12],
            topk: vec![1, 2, 3, 4, 5, 6, 7, 8],
        }
    }

    /// Builds the dump with exact candidates, then applies `edit` to the
    /// tensors before serialising.
    fn dump(&self, edit: impl FnOnce(&mut Vec<(&'static str, DumpTensor)>)) -> Vec<u8> {
        self.dump_with(&[0.5, -0.25, 0.0, 1.0, -1.0, 0.5, 0.25, 0.25], edit)
    }

    /// As [`Case::dump`] with top-k cotangents `gk [N, 2]`.
    fn dump_with(
        &self,
        gk: &[f64],
        edit: impl FnOnce(&mut Vec<(&'static str, DumpTensor)>),
    ) -> Vec<u8> {
        let x = logits();
        let xr: Vec<f64> = x.iter().map(|&v| self.dtype.round_f64(v)).collect();
        let tokens = Array1::from(self.tokens.clone());
        let ids = Array2::from_shape_vec((N, 2), self.topk.clone()).unwrap();
        let mask = self
            .mask
            .clone()
            .map(|m| Array2::from_shape_vec((N, VT), m).unwrap());
        let xa = Array2::from_shape_vec((N, VT), xr.clone()).unwrap();
        let x32 = xa.mapv(|v| v as f32);
        let logits = match self.dtype {
            Dtype::F64 => Logits::F64(xa.view()),
            Dtype::F32 => Logits::F32(x32.view()),
            other => panic!("test logits are f64 or f32, not {other}"),
        };
        let p = Problem {
            logits,
            tokens: Some(tokens.view()),
            sampling_mask: mask.as_ref().map(|m| m.view()),
            topk_ids: Some(ids.view()),
            policy: Default::default(),
            teacher_topk_log_probs: None,
            teacher_probs: None,
            options: self.options,
            loss_weights: None,
        };
        let oracle = Oracle::default();
        let fwd = oracle.forward(&p, self.out).unwrap();
        // `ignore_index` rows hold the defined 0.
        let rounded = |o: Output| -> Vec<f64> { fwd.values[o].iter().map(|e| e.rounded).collect() };
        let (lp, ent, tk) = (
            rounded(Output::LogProbs),
            rounded(Output::Entropy),
            rounded(Output::TopkLogProbs),
        );
        let g = Array1::from(vec![1.0, -0.5, 0.25, 2.0]);
        let h = Array1::from(vec![0.5, 1.0, -1.0, 0.125]);
        let gk = Array2::from_shape_vec((N, 2), gk.to_vec()).unwrap();
        let cot = Cotangents::default()
            .with_column(Output::LogProbs, g.view())
            .with_column(Output::Entropy, h.view())
            .with(Output::TopkLogProbs, gk.view());
        let grad: Vec<f64> = oracle
            .vjp(&p, &cot, self.out)
            .unwrap()
            .iter()
            .map(|e| e.rounded)
            .collect();

        let mut t = vec![
            ("logits", DumpTensor::floats(self.dtype, &[N, VT], &xr)),
            ("tokens", DumpTensor::i64s(&[N], &self.tokens)),
            ("topk_ids", DumpTensor::i64s(&[N, 2], &self.topk)),
            ("log_probs", DumpTensor::floats(self.out, &[N], &lp)),
            ("entropy", DumpTensor::floats(self.out, &[N], &ent)),
            ("topk_log_probs", DumpTensor::floats(self.out, &[N, 2], &tk)),
            (
                "grad_log_probs",
                DumpTensor::floats(Dtype::F32, &[N], g.as_slice().unwrap()),
            ),
            (
                "grad_entropy",
                DumpTensor::floats(Dtype::F32, &[N], h.as_slice().unwrap()),
            ),
            (
                "grad_topk_log_probs",
                DumpTensor::floats(Dtype::F32, &[N, 2], gk.as_slice().unwrap()),
            ),
            ("grad_logits", DumpTensor::floats(self.out, &[N, VT], &grad)),
        ];
        if let Some(m) = &self.mask {
            t.push(("sampling_mask", DumpTensor::bools(&[N, VT], m)));
        }
        edit(&mut t);
        let o = &self.options;
        let t_str = o.temperature.to_string();
        let vs = o.vocab_size.unwrap_or(VT).to_string();
        let ii = o.ignore_index.to_string();
        let el = if o.entropy == Some(EntropyLogits::Masked) {
            "masked"
        } else {
            "unmasked"
        };
        let td = if o.temperature_dtype == TemperatureDtype::Input {
            "input"
        } else {
            "accumulation"
        };
        let meta = [
            (keys::TEMPERATURE.name, t_str.as_str()),
            (keys::VOCAB_SIZE.name, &vs),
            (keys::IGNORE_INDEX.name, &ii),
            (keys::ENTROPY_LOGITS.name, el),
            (keys::TEMPERATURE_DTYPE.name, td),
        ];
        serialize_dump(&t, &meta).unwrap()
    }
}

fn verify(bytes: &[u8]) -> FileReport {
    let dump = Dump::parse(bytes).unwrap();
    verify_dump(&dump, Path::new("case"), &VerifyConfig::default()).unwrap()
}

fn verdicts(r: &FileReport) -> Vec<(&'static str, ReportVerdict)> {
    r.outputs.iter().map(|o| (o.output, o.verdict)).collect()
}

/// Replaces element `i` of tensor `name` (a float tensor of `dtype`) by `value`.
fn set(t: &mut [(&'static str, DumpTensor)], name: &str, dtype: Dtype, i: usize, value: f64) {
    let (_, x) = t.iter_mut().find(|(n, _)| *n == name).unwrap();
    let w = dtype.size_bytes();
    let one = DumpTensor::floats(dtype, &[1], &[value]);
    x.data[i * w..(i + 1) * w].copy_from_slice(&one.data);
}

/// Element `i` of float tensor `name` of `dtype`, exactly.
fn get(t: &[(&'static str, DumpTensor)], name: &str, dtype: Dtype, i: usize) -> f64 {
    let (_, x) = t.iter().find(|(n, _)| *n == name).unwrap();
    let w = dtype.size_bytes();
    let b = &x.data[i * w..(i + 1) * w];
    match dtype {
        Dtype::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        Dtype::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        Dtype::Bf16 => half::bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        Dtype::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
    }
}

fn assert_all_pass(case: &Case) {
    let r = verify(&case.dump(|_| {}));
    assert_eq!(
        r.verdict,
        ReportVerdict::Pass,
        "{:?}\n{}",
        verdicts(&r),
        logprobe_verify::verify::render_table(&r)
    );
    assert_eq!(r.outputs.len(), 4);
    for o in &r.outputs {
        // The enclosure is rounded outward to f64: an f64 candidate may sit
        // up to 1 ulp from its far end.
        let max = if o.dtype == "f64" { 1.0 } else { 0.5 };
        assert!(
            o.max_ulps <= max,
            "{} {}: {} ulps",
            o.output,
            o.dtype,
            o.max_ulps
        );
    }
}

/// Moves one element of `name` by `delta` and expects only that output to fail.
fn assert_fails_on(case: &Case, name: &'static str, i: usize, delta: f64) {
    let bytes = case.dump(|t| {
        let old = get(t, name, case.out, i);
        set(t, name, case.out, i, old + delta);
    });
    let r = verify(&bytes);
    for o in &r.outputs {
        let want = if o.output == name {
            ReportVerdict::Fail
        } else {
            ReportVerdict::Pass
        };
        assert_eq!(o.verdict, want, "{}: {:?}", o.output, verdicts(&r));
    }
}

#[test]
fn exact_candidates_pass_in_every_output_dtype() {
    for (dtype, out) in [
        (Dtype::F32, Dtype::F32),
        (Dtype::F32, Dtype::Bf16),
        (Dtype::F32, Dtype::F16),
        (Dtype::F64, Dtype::F64),
    ] {
        assert_all_pass(&Case::new(dtype, out));
    }
}

#[test]
fn a_value_beyond_the_bound_fails_its_output_only() {
    let c = Case::new(Dtype::F32, Dtype::F32);
    assert_fails_on(&c, "log_probs", 2, 1e-3);
    assert_fails_on(&c, "entropy", 0, -1e-3);
    assert_fails_on(&c, "topk_log_probs", 5, 1e-3);
    assert_fails_on(&c, "grad_logits", VT + 7, 1e-3);
}

#[test]
fn metadata_is_honoured() {
    // Temperature: exact values at T = 0.7 pass; the same candidates judged
    // at T = 1 fail.
    let mut c = Case::new(Dtype::F32, Dtype::F32);
    c.options.temperature = 0.7;
    assert_all_pass(&c);
    let b = c.dump(|_| {});
    let st = safetensors::SafeTensors::deserialize(&b).unwrap();
    let t: Vec<(&str, DumpTensor)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let name: &'static str = logprobe_verify::dump::TENSOR_NAMES
                .iter()
                .copied()
                .find(|x| *x == n)
                .unwrap();
            (
                name,
                DumpTensor {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                },
            )
        })
        .collect();
    let r = verify(&serialize_dump(&t, &[]).unwrap());
    assert_eq!(r.verdict, ReportVerdict::Fail);

    // temperature_dtype = input.
    let mut c = Case::new(Dtype::F32, Dtype::F32);
    c.options.temperature = 0.3;
    c.options.temperature_dtype = TemperatureDtype::Input;
    assert_all_pass(&c);

    // Padded vocabulary: columns past vocab_size are ignored in the forward
    // and must be exactly 0 in grad_logits.
    let mut c = Case::new(Dtype::F32, Dtype::F32);
    c.options.vocab_size = Some(33);
    c.tokens = vec![5, 0, 32, 12];
    assert_all_pass(&c);
    assert_fails_on(&c, "grad_logits", 2 * VT + 35, 1e-30);

    // ignore_index rows: any log_prob passes.
    let mut c = Case::new(Dtype::F32, Dtype::F32);
    c.options.ignore_index = -1;
    c.tokens = vec![5, -1, 39, 12];
    let r = verify(&c.dump(|t| set(t, "log_probs", Dtype::F32, 1, 123.0)));
    assert_eq!(r.verdict, ReportVerdict::Pass, "{:?}", verdicts(&r));
    assert_eq!(r.outputs[0].count, N - 1);
    let _ = DEFAULT_IGNORE_INDEX;
}

/// Top-k id 3 of row 1 has logit `-inf` and is not masked: the oracle
/// differentiates its log-prob as PyTorch does (`G_k / T`), a value with
/// the rounding error of the division when `T = 0.7`.
#[test]
fn live_topk_id_at_neg_inf_logit_gets_its_gradient_bound() {
    let mut c = Case::new(Dtype::F32, Dtype::F32);
    c.options.temperature = 0.7;
    let r = verify(&c.dump_with(&[0.5, -0.25, 1.0, 0.0, -1.0, 0.5, 0.25, 0.25], |_| {}));
    assert_eq!(
        r.verdict,
        ReportVerdict::Pass,
        "{}",
        logprobe_verify::verify::render_table(&r)
    );
}

#[test]
fn masks_and_masked_entropy_are_honoured() {
    let mut c = Case::new(Dtype::F32, Dtype::F32);
    let mut m = vec![true; N * VT];
    for (i, a) in m.iter_mut().enumerate() {
        if i % 3 == 1 {
            *a = false;
        }
    }
    // Keep targets allowed; top-k id 4 of row 0 is masked (its log-prob is -inf).
    for (r, &t) in [5usize, 0, 39, 12].iter().enumerate() {
        m[r * VT + t] = true;
    }
    c.mask = Some(m);
    assert_all_pass(&c);
    c.options.entropy = Some(EntropyLogits::Masked);
    assert_all_pass(&c);
}

#[test]
fn rows_subset_and_sample_check_only_those_rows() {
    let c = Case::new(Dtype::F32, Dtype::F32);
    let b = c.dump(|t| set(t, "log_probs", Dtype::F32, 3, -1.0));
    let dump = Dump::parse(&b).unwrap();
    let cfg = |rows| VerifyConfig {
        rows,
        ..VerifyConfig::default()
    };
    let r = verify_dump(
        &dump,
        Path::new("x"),
        &cfg(RowSelection::Range { start: 0, end: 3 }),
    )
    .unwrap();
    assert_eq!((r.rows_checked, r.verdict), (3, ReportVerdict::Pass));
    let r = verify_dump(
        &dump,
        Path::new("x"),
        &cfg(RowSelection::Range { start: 3, end: 100 }),
    )
    .unwrap();
    assert_eq!((r.rows_checked, r.verdict), (1, ReportVerdict::Fail));
    let r = verify_dump(&dump, Path::new("x"), &cfg(RowSelection::Sample(2))).unwrap();
    assert_eq!(r.rows_checked, 2);
    assert_eq!(RowSelection::Sample(3).rows(10), vec![0, 3, 6]);
    assert_eq!(RowSelection::Sample(30).rows(4), vec![0, 1, 2, 3]);
    assert_eq!(
        "2..5".parse::<RowSelection>().unwrap(),
        RowSelection::Range { start: 2, end: 5 }
    );
    assert_eq!(
        "sample:7".parse::<RowSelection>().unwrap(),
        RowSelection::Sample(7)
    );
    assert!("5..2".parse::<RowSelection>().is_err());
}

#[test]
fn bf16_accumulation_over_a_real_vocabulary_has_no_bound() {
    let c = Case::new(Dtype::F32, Dtype::F32);
    let b = c.dump(|_| {});
    let dump = Dump::parse(&b).unwrap();
    // V = 40 terms in one bf16 accumulator: 40 * 2^-8 < 1 still bounds;
    // f16's u = 2^-11 too. Only past 256 terms does bf16 certify nothing.
    let cfg = VerifyConfig {
        accumulation: Some(Dtype::Bf16),
        model: "sequential".parse().unwrap(),
        ..VerifyConfig::default()
    };
    let r = verify_dump(&dump, Path::new("x"), &cfg).unwrap();
    assert_ne!(r.verdict, ReportVerdict::Fail);

    let n = 1;
    let v = 300;
    let x: Vec<f64> = (0..v).map(|i| (i % 13) as f64 / 4.0).collect();
    let t = vec![
        ("logits", DumpTensor::floats(Dtype::F32, &[n, v], &x)),
        ("entropy", DumpTensor::floats(Dtype::F32, &[n], &[5.0])),
    ];
    let b = serialize_dump(&t, &[]).unwrap();
    let dump = Dump::parse(&b).unwrap();
    let r = verify_dump(&dump, Path::new("x"), &cfg).unwrap();
    assert_eq!(r.verdict, ReportVerdict::NoBound, "{:?}", verdicts(&r));
    assert!(r.outputs[0].no_bound_reason.is_some());
}
