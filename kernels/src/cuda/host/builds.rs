//! The host builds of the CUDA sources (feature `cuda-host`): the real one
//! and the planted mutants, as data shared by `kernels/build.rs` (which
//! compiles them) and the launcher (which finds their kernels).
//!
//! A mutant build is the real program with one text patch applied to one
//! file (`find` must occur exactly once, or the build fails). Files the patch
//! leaves unchanged are not rebuilt: the mutant launcher takes their kernels
//! from the real build. A patch to `common.cuh` rebuilds every file.

/// One planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MutantPatch {
    /// Build name: a C identifier, part of every symbol of the build.
    pub build: &'static str,
    /// The patched file: `common.cuh` or a `kernels/cuda/*.cu` module name
    /// with its extension.
    pub file: &'static str,
    /// Text to replace (exactly one occurrence).
    pub find: &'static str,
    /// Its replacement.
    pub replace: &'static str,
    /// What the bug is, in one line.
    pub what: &'static str,
}

/// Name of the real (unpatched) build.
pub const REAL_BUILD: &str = "real";

/// The `.cu` modules, in `source::SOURCES` order (checked by a test).
pub const SOURCE_FILES: [&str; 6] = [
    "row_stats",
    "forward",
    "chunked",
    "backward",
    "vocab_parallel",
    "fill",
];

/// Bytes of dynamic shared memory a host launch may ask for (CUDA's default
/// limit without opt-in: 48 KiB; the backward asks for `(K + 1) * 4`).
pub const DYNAMIC_SHARED_BYTES: u32 = 48 * 1024;

/// The planted bugs of issue 21, each killed by a test of the default
/// `cargo test` (`kernels/tests/cuda_host.rs`).
pub const MUTANTS: [MutantPatch; 3] = [
    MutantPatch {
        build: "int32_row_offset",
        file: "row_stats.cu",
        find: "const typename L::T* row = x + r * x_stride;",
        replace: "const typename L::T* row = x + (int)(r * x_stride);",
        what: "row offset truncated to 32 bits: rows past element 2^31 are read from the wrong address",
    },
    MutantPatch {
        build: "chunk_remainder",
        file: "chunked.cu",
        find: "const lp_i64 total = (lp_i64)rows * cols;",
        replace: "const lp_i64 total = (lp_i64)rows * cols / LP_TILE * LP_TILE;",
        what: "the chunk widening drops the last rows * cols % 4 elements (a vector loop without its tail)",
    },
    MutantPatch {
        build: "shuffle_width",
        file: "common.cuh",
        find: "st.s = __shfl_down_sync(0xffffffffu, st.s, off);",
        replace: "st.s = __shfl_down_sync(0xffffffffu, st.s, off, 16);",
        what: "the block reduction shuffles the sum over 16 lanes, not 32: lanes 16..31 never reach lane 0",
    },
];
