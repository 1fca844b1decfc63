//! Tensors in memory (the Python package's path, `verify_tensors`) are
//! judged exactly as the same tensors in a file: on every shipped dump, the
//! report from the file and the report from its tensors read in place agree
//! field for field (timing aside).

use std::path::{Path, PathBuf};

use logprobe_verify::tensors::{verify_tensors, TensorBytes};
use logprobe_verify::verify::{verify_file, FileReport, VerifyConfig};
use safetensors::SafeTensors;

fn shipped_dumps() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/torch");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures/torch")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.sort();
    paths
}

/// The report as JSON, timing and path removed.
fn comparable(r: &FileReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("serialisable");
    let o = v.as_object_mut().expect("an object");
    o.remove("seconds");
    o.remove("path");
    o.remove("name");
    v
}

#[test]
fn every_shipped_dump_reads_the_same_from_memory() {
    let paths = shipped_dumps();
    assert!(paths.len() >= 30, "found {} dumps", paths.len());
    let config = VerifyConfig::default();
    for path in paths {
        let bytes = std::fs::read(&path).expect("read");
        let st = SafeTensors::deserialize(&bytes).expect("a valid dump");
        let (_, header) = SafeTensors::read_metadata(&bytes).expect("header");
        let meta = header.metadata().clone().unwrap_or_default();
        let views = st.tensors();
        let tensors: Vec<(&str, TensorBytes<'_>)> = views
            .iter()
            .map(|(n, t)| {
                (
                    n.as_str(),
                    TensorBytes {
                        dtype: t.dtype(),
                        shape: t.shape(),
                        data: t.data(),
                    },
                )
            })
            .collect();
        let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let from_file = verify_file(&path, &config);
        let from_memory = verify_tensors(&tensors, &meta, "mem", &config);
        match (from_file, from_memory) {
            (Ok(a), Ok(b)) => assert_eq!(comparable(&a), comparable(&b), "{}", path.display()),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{}", path.display()),
            (a, b) => panic!(
                "{}: file {:?}, memory {:?}",
                path.display(),
                a.map(|r| r.verdict),
                b.map(|r| r.verdict)
            ),
        }
    }
}
