//! A dump naming a shared LM-head weights file (`lm_head_weight_file`,
//! `lm_head_weight_sha256`; `dump::weights_file`) is judged exactly as the
//! dump holding the weights, and every way the file can be wrong is a typed
//! error naming it.

use std::path::{Path, PathBuf};

use logprobe_verify::dump::DumpError;
use logprobe_verify::tensors::{to_dump_bytes, verify_tensors, TensorBytes};
use logprobe_verify::verify::{verify_file, FileReport, VerifyConfig};
use safetensors::SafeTensors;
use sha2::{Digest, Sha256};

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/torch")
        .join(format!("{name}.safetensors"))
}

fn comparable(r: &FileReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("serialisable");
    let o = v.as_object_mut().expect("an object");
    for k in ["seconds", "path", "name"] {
        o.remove(k);
    }
    v
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Name, dtype, shape, bytes.
type Tensor = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

fn bytes_of(tensors: &[Tensor], meta: &[(&str, &str)]) -> Vec<u8> {
    let views: Vec<(&str, TensorBytes<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.as_str(),
                TensorBytes {
                    dtype: *d,
                    shape: s,
                    data: b,
                },
            )
        })
        .collect();
    to_dump_bytes(&views, meta).expect("writable")
}

/// The shipped fused dump's tensors split: (the weights', the rest), and
/// its metadata.
fn split(name: &str) -> (Vec<Tensor>, Vec<Tensor>, Vec<(String, String)>) {
    let bytes = std::fs::read(shipped(name)).expect("shipped");
    let st = SafeTensors::deserialize(&bytes).expect("valid");
    let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
    let meta = header
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let (mut weights, mut rest) = (Vec::new(), Vec::new());
    for (n, t) in st.tensors() {
        let x = (n.clone(), t.dtype(), t.shape().to_vec(), t.data().to_vec());
        if n == "lm_head_weight" || n == "lm_head_bias" {
            weights.push(x);
        } else {
            rest.push(x);
        }
    }
    (weights, rest, meta)
}

/// Writes `dir/w.safetensors` (a plain safetensors file, no metadata) and
/// `dir/dump.safetensors` naming it with `hash` (`None`: the file's own).
fn write(
    dir: &Path,
    weights: &[Tensor],
    rest: &[Tensor],
    meta: &[(String, String)],
    hash: Option<&str>,
) -> PathBuf {
    let w = safetensors::serialize(
        weights.iter().map(|(n, d, s, b)| {
            (
                n.as_str(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view"),
            )
        }),
        None,
    )
    .expect("serialisable");
    std::fs::write(dir.join("w.safetensors"), &w).expect("write");
    let own = sha256(&w);
    let mut m: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    m.push(("lm_head_weight_file", "w.safetensors"));
    m.push(("lm_head_weight_sha256", hash.unwrap_or(&own)));
    let path = dir.join("dump.safetensors");
    std::fs::write(&path, bytes_of(rest, &m)).expect("write");
    path
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("logprobe-weights-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn a_dump_naming_its_weights_file_is_judged_as_one_holding_them() {
    let dir = tempdir("same");
    for name in [
        "fused_linear_grad_cce_fp32",
        "fused_linear_grad_bf16_acc",
        "fused_linear_bias_dropped",
    ] {
        let (weights, rest, meta) = split(name);
        let path = write(&dir, &weights, &rest, &meta, None);
        let whole = verify_file(&shipped(name), &VerifyConfig::default()).expect(name);
        let got = verify_file(&path, &VerifyConfig::default()).expect(name);
        assert_eq!(comparable(&got), comparable(&whole), "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn error(path: &Path) -> String {
    let e = verify_file(path, &VerifyConfig::default()).unwrap_err();
    assert!(matches!(e, DumpError::WeightsFile(_)), "{e:?}");
    e.to_string()
}

#[test]
fn a_weights_file_that_does_not_fit_is_a_typed_error() {
    let dir = tempdir("errors");
    let (weights, rest, meta) = split("fused_linear_grad_cce_fp32");
    // Other weights than the dump was made with.
    let path = write(&dir, &weights, &rest, &meta, Some(&"ab".repeat(32)));
    let e = error(&path);
    assert!(
        e.contains("w.safetensors: SHA-256") && e.contains("not the weights"),
        "{e}"
    );
    // A malformed hash; none at all.
    let path = write(&dir, &weights, &rest, &meta, Some("xyz"));
    assert!(error(&path).contains("expected 64 hexadecimal digits"));
    let m: Vec<(&str, &str)> = meta
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([("lm_head_weight_file", "w.safetensors")])
        .collect();
    std::fs::write(&path, bytes_of(&rest, &m)).unwrap();
    assert!(error(&path).contains("needs `lm_head_weight_sha256`"));
    // A hash naming no file: nothing would be checked against it.
    let m: Vec<(&str, &str)> = meta
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([("lm_head_weight_sha256", "ab")])
        .collect();
    let both: Vec<Tensor> = rest.iter().chain(&weights).cloned().collect();
    std::fs::write(&path, bytes_of(&both, &m)).unwrap();
    assert!(error(&path).contains("without `lm_head_weight_file`"));
    // The file missing.
    let path = write(&dir, &weights, &rest, &meta, None);
    std::fs::remove_file(dir.join("w.safetensors")).unwrap();
    let e = error(&path);
    assert!(e.contains("w.safetensors: cannot read"), "{e}");
    // The weights in the dump too; a file holding another tensor.
    let both: Vec<Tensor> = rest.iter().chain(&weights).cloned().collect();
    let path = write(&dir, &weights, &both, &meta, None);
    assert!(error(&path).contains("is in the dump and in its weights file"));
    let extra: Vec<Tensor> = weights.iter().chain(&rest[..1]).cloned().collect();
    let path = write(&dir, &extra, &rest, &meta, None);
    assert!(error(&path).contains("a weights file holds `lm_head_weight`"));
    // Tensors in memory have no folder to find the file from.
    let views: Vec<(&str, TensorBytes<'_>)> = rest
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.as_str(),
                TensorBytes {
                    dtype: *d,
                    shape: s,
                    data: b,
                },
            )
        })
        .collect();
    let m: Vec<(&str, &str)> = meta
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([
            ("lm_head_weight_file", "w.safetensors"),
            ("lm_head_weight_sha256", "00"),
        ])
        .collect();
    let e = verify_tensors(&views, &m, "mem", &VerifyConfig::default()).unwrap_err();
    assert!(
        e.to_string().contains("is read only for a dump file"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
