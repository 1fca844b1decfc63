//! `masked_log_probs = finfo_min` (issue 42): SGLang stores a masked id's
//! top-k log-prob as `torch.finfo(dtype).min` on purpose. With the key that
//! value is judged as the exact `-inf`; without it, it fails; at a live id
//! (exact value finite) it fails either way; a bad value names the key.

use std::path::Path;

use logprobe_reference::oracle::Oracle;
use logprobe_reference::spec::{Dtype, Logits, Output, Problem};
use logprobe_verify::dump::{serialize_dump, Dump, DumpError, DumpTensor};
use logprobe_verify::keys;
use logprobe_verify::verify::{verify_dump, FileReport, ReportVerdict, VerifyConfig};
use ndarray::Array2;

const N: usize = 3;
const V: usize = 16;

/// f32 logits with a `-inf` at column 5 of every row, top-k ids `[0, 5, 9]`
/// (id 5 masked: its log-prob is exactly `-inf`).
fn inputs() -> (Array2<f32>, Array2<i64>) {
    let x = Array2::from_shape_fn((N, V), |(r, j)| {
        if j == 5 {
            f32::NEG_INFINITY
        } else {
            ((r * 7 + j * 3) % 11) as f32 * 0.37 - 1.5
        }
    });
    let ids = Array2::from_shape_fn((N, 3), |(_, k)| [0, 5, 9][k]);
    (x, ids)
}

/// The exact top-k log-probs rounded to `dtype`, with the masked ones
/// replaced by `masked` and, when `live` is set, id 0's by `live`.
fn dump(dtype: Dtype, masked: f64, live: Option<f64>, key: Option<&str>) -> Vec<u8> {
    let (x, ids) = inputs();
    let mut p = Problem::new(Logits::F32(x.view()));
    p.topk_ids = Some(ids.view());
    let exact = Oracle::default().forward(&p, dtype).unwrap();
    let lp: Vec<f64> = exact.values[Output::TopkLogProbs]
        .iter()
        .enumerate()
        .map(|(i, e)| match (i % 3, live) {
            (1, _) => masked,
            (0, Some(v)) => v,
            _ => e.rounded,
        })
        .collect();
    let mut meta = vec![(keys::FORMAT_VERSION.name, "2")];
    if let Some(k) = key {
        meta.push((keys::MASKED_LOG_PROBS.name, k));
    }
    let xs: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    serialize_dump(
        &[
            ("logits", DumpTensor::floats(Dtype::F32, &[N, V], &xs)),
            (
                "topk_ids",
                DumpTensor::i64s(&[N, 3], ids.as_slice().unwrap()),
            ),
            ("topk_log_probs", DumpTensor::floats(dtype, &[N, 3], &lp)),
        ],
        &meta,
    )
    .unwrap()
}

fn verify(bytes: &[u8]) -> Result<FileReport, DumpError> {
    verify_dump(
        &Dump::parse(bytes)?,
        Path::new("masked.safetensors"),
        &VerifyConfig::default(),
    )
}

#[test]
fn finfo_min_at_masked_ids_passes_only_when_declared() {
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let min = -dtype.max_finite();
        let exact_inf = verify(&dump(dtype, f64::NEG_INFINITY, None, None)).unwrap();
        assert_eq!(exact_inf.verdict, ReportVerdict::Pass, "{dtype}: -inf");
        let undeclared = verify(&dump(dtype, min, None, None)).unwrap();
        assert_eq!(
            undeclared.verdict,
            ReportVerdict::Fail,
            "{dtype}: undeclared"
        );
        let declared = verify(&dump(dtype, min, None, Some("finfo_min"))).unwrap();
        assert_eq!(declared.verdict, ReportVerdict::Pass, "{dtype}: declared");
        // -inf stays right under the key; the default spelled out is the default.
        let inf = verify(&dump(dtype, f64::NEG_INFINITY, None, Some("finfo_min"))).unwrap();
        assert_eq!(inf.verdict, ReportVerdict::Pass, "{dtype}");
        let neg_inf = verify(&dump(dtype, min, None, Some("neg_inf"))).unwrap();
        assert_eq!(neg_inf.verdict, ReportVerdict::Fail, "{dtype}");
        // Another dtype's finfo.min is not this one's (f16's -65504 is a
        // finite value of f32 and bf16; the wider ones overflow f16).
        if dtype != Dtype::F16 {
            let wrong = verify(&dump(
                dtype,
                -Dtype::F16.max_finite(),
                None,
                Some("finfo_min"),
            ));
            assert_eq!(
                wrong.unwrap().verdict,
                ReportVerdict::Fail,
                "{dtype}: f16's finfo.min"
            );
        }
    }
}

#[test]
fn finfo_min_at_a_live_id_fails_and_a_bad_value_names_the_key() {
    let min = -Dtype::F32.max_finite();
    let live = verify(&dump(Dtype::F32, min, Some(min), Some("finfo_min"))).unwrap();
    assert_eq!(live.verdict, ReportVerdict::Fail);
    match verify(&dump(Dtype::F32, min, None, Some("clamped"))) {
        Err(DumpError::BadMetadata { key, value, .. }) => {
            assert_eq!((key, value.as_str()), ("masked_log_probs", "clamped"));
        }
        other => panic!("{other:?}"),
    }
}
