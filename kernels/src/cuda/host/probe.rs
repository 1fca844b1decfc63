//! The dtype conversions and math of `common.cuh` as the host build compiles
//! them, callable one value at a time (the `lp_host_probe_*` functions of
//! `cuda/host/selftest.cu`), so tests can check them against `half` and the
//! CPU kernels.

use super::ensure_math;

extern "C" {
    fn lp_host_probe_f16_to_f32(h: u16) -> f32;
    fn lp_host_probe_f32_to_f16(f: f32) -> u16;
    fn lp_host_probe_bf16_to_f32(h: u16) -> f32;
    fn lp_host_probe_f32_to_bf16(f: f32) -> u16;
    fn lp_host_probe_expf(x: f32) -> f32;
    fn lp_host_probe_log1pf(x: f32) -> f32;
    fn lp_host_probe_z(x: f32, zmode: i32, temp_z: f32) -> f32;
}

/// `lp_f16_to_f32`: f16 bits widened to f32.
pub fn f16_to_f32(h: u16) -> f32 {
    // SAFETY: a pure function of its argument.
    unsafe { lp_host_probe_f16_to_f32(h) }
}

/// `lp_f32_to_f16`: f32 rounded to f16 bits (nearest even).
pub fn f32_to_f16(f: f32) -> u16 {
    // SAFETY: a pure function of its argument.
    unsafe { lp_host_probe_f32_to_f16(f) }
}

/// `lp_bf16_to_f32`: bf16 bits widened to f32.
pub fn bf16_to_f32(h: u16) -> f32 {
    // SAFETY: a pure function of its argument.
    unsafe { lp_host_probe_bf16_to_f32(h) }
}

/// `lp_f32_to_bf16`: f32 rounded to bf16 bits (nearest even).
pub fn f32_to_bf16(f: f32) -> u16 {
    // SAFETY: a pure function of its argument.
    unsafe { lp_host_probe_f32_to_bf16(f) }
}

/// The kernels' `expf` in the host build.
pub fn expf(x: f32) -> f32 {
    ensure_math();
    // SAFETY: the math functions are set.
    unsafe { lp_host_probe_expf(x) }
}

/// The kernels' `log1pf` in the host build.
pub fn log1pf(x: f32) -> f32 {
    ensure_math();
    // SAFETY: the math functions are set.
    unsafe { lp_host_probe_log1pf(x) }
}

/// `lp_z(x, zmode, temp_z)`: the logit the softmax sees (zmode 0: x; 1/2/3:
/// `x / T` rounded to f32 / bf16 / f16).
pub fn z(x: f32, zmode: i32, temp_z: f32) -> f32 {
    // SAFETY: a pure function of its arguments.
    unsafe { lp_host_probe_z(x, zmode, temp_z) }
}
