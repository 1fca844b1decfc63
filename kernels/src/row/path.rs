//! The instruction set the block loops run with, detected once at run time
//! (all give the same bits).

use std::sync::OnceLock;

/// Which instruction set the block loop runs with: `"avx512"`, `"avx2"` or
/// `"sse2"` (x86_64), `"generic"` elsewhere. All give the same bits.
pub fn cpu_path() -> &'static str {
    match path() {
        Path::Avx512 => "avx512",
        Path::Avx2 => "avx2",
        Path::Baseline => {
            if cfg!(target_arch = "x86_64") {
                "sse2"
            } else {
                "generic"
            }
        }
    }
}

/// The block loops' instruction set, detected once ([`cpu_path`] names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    Avx512,
    Avx2,
    Baseline,
}

/// This CPU's [`Path`], detected once.
pub(crate) fn path() -> Path {
    static PATH: OnceLock<Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
            {
                return Path::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") {
                return Path::Avx2;
            }
        }
        Path::Baseline
    })
}
