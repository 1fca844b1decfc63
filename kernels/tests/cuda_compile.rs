//! Every CUDA source compiles to PTX with NVRTC (feature `cuda`).
#![cfg(feature = "cuda")]

use logprobe_kernels::cuda::source::{compile, nvrtc_present, write_ptx, SOURCES};

/// Whether a missing NVRTC must fail the test (under CI) or skip it.
fn nvrtc_or_skip() -> bool {
    if nvrtc_present() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(!ci, "CI=true but libnvrtc.so.13 cannot be loaded: run scripts/install-nvrtc.sh and put its lib folder on LD_LIBRARY_PATH");
    println!("skipping CUDA compile test: no NVRTC library (run scripts/install-nvrtc.sh, then set LD_LIBRARY_PATH)");
    false
}

#[test]
fn every_cuda_source_compiles_to_ptx_for_sm90_and_sm80() {
    if !nvrtc_or_skip() {
        return;
    }
    for arch in ["compute_90", "compute_80"] {
        for source in &SOURCES {
            let ptx = compile(source, arch).unwrap_or_else(|e| panic!("{e}"));
            let target = arch.replace("compute_", "sm_");
            assert!(
                ptx.contains(&format!(".target {target}")),
                "{}: {arch}",
                source.name
            );
            for line in source.text.lines() {
                // Every kernel named in the source is an entry of the PTX.
                if let Some(rest) = line.trim_start().strip_prefix("LP_") {
                    if let Some(open) = rest.find('(') {
                        if rest.ends_with(')') && !rest.contains('\\') {
                            let name = rest[open + 1..].split(',').next().unwrap().trim();
                            assert!(
                                ptx.contains(&format!(".entry {name}(")),
                                "{}: {name} missing for {arch}",
                                source.name
                            );
                        }
                    }
                }
                if let Some(rest) = line.strip_prefix("extern \"C\" __global__ void ") {
                    let name = rest.split('(').next().unwrap().trim();
                    assert!(
                        ptx.contains(&format!(".entry {name}(")),
                        "{}: {name} missing for {arch}",
                        source.name
                    );
                }
            }
        }
    }
}

/// With `LOGPROBE_CUDA_PTX_OUT=<dir>`, writes every module's PTX there for
/// `scripts/gpu-check.sh` (machines without NVRTC load it through
/// `LOGPROBE_CUDA_PTX_DIR`).
#[test]
fn ptx_is_written_where_asked() {
    let Ok(dir) = std::env::var("LOGPROBE_CUDA_PTX_OUT") else {
        return;
    };
    if !nvrtc_or_skip() {
        return;
    }
    let written = write_ptx(std::path::Path::new(&dir)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(written.len(), 3 * SOURCES.len());
    println!("wrote {} PTX files to {dir}", written.len());
}
