//! The host build of the CUDA kernels (feature `cuda-host`, on in every
//! `cargo test` of this crate): its conversions and math against `half` and
//! the CPU kernels, its thread and warp primitives against CUDA's documented
//! semantics, its bits against the CPU kernels where both declare the same
//! algorithm, 64-bit row offsets through offset views, and the planted
//! mutants, each failing a check the real build passes.
#![cfg(feature = "cuda-host")]

mod cuda_common;

use std::sync::Arc;

use half::{bf16, f16};
use ndarray::{Array1, Array2};

use cuda_common::{bits2, chunk_invariance, ensure, oracle_agreement, Check, Owned, SplitMix64};
use logprobe_kernels::cuda::host::{offset::OffsetView, probe};
use logprobe_kernels::cuda::AllocKind;
use logprobe_kernels::cuda::{
    launch::block_size, Arg, CudaChunked, CudaFused, CudaVocabParallel, HostBuild, HostLauncher,
    LaunchConfig, Launcher, MemoryTracker, Shards,
};
use logprobe_kernels::exp::{exp_f32, ln_1p_f32};
use logprobe_kernels::{CpuKernel, Kernel};
use logprobe_reference::spec::{
    Cotangents, Dtype, EntropyLogits, Options, Output, Problem, TemperatureDtype,
};

fn real() -> Arc<dyn Launcher> {
    HostLauncher::shared()
}

fn mutant(name: &str) -> Arc<dyn Launcher> {
    HostLauncher::new(HostBuild::mutant(name).expect("a mutant of builds::MUTANTS"))
}

// ---------------------------------------------------------- conversions

/// f32 values where rounding to a 16-bit format changes direction: every
/// midpoint between neighbouring finite values of the format (`to_f32` of
/// bit patterns `b` and `b + 1`), one f32 ulp either side, the overflow
/// threshold, and the specials.
fn rounding_boundaries(to_f32: impl Fn(u16) -> f32, max_finite: u16) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001), // signalling NaN
        f32::from_bits(0xffbf_ffff),
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
    ];
    for sign in [0u16, 0x8000] {
        for b in 0..max_finite {
            let (lo, hi) = (to_f32(sign | b), to_f32(sign | (b + 1)));
            let mid = ((lo as f64 + hi as f64) / 2.0) as f32; // exact: 16-bit formats have < 24 bits
            for x in [mid, mid.next_down(), mid.next_up()] {
                v.push(x);
            }
        }
        // Halfway from the largest finite value to the next (unrepresentable) one.
        let top = to_f32(sign | max_finite) as f64;
        let step = top - to_f32(sign | (max_finite - 1)) as f64;
        let mid = (top + step / 2.0) as f32;
        v.extend([mid, mid.next_down(), mid.next_up()]);
    }
    v
}

/// Every 4093rd f32 bit pattern (about a million values of every
/// exponent, both signs, NaNs included).
fn dense_f32_sample() -> impl Iterator<Item = f32> {
    (0..=u32::MAX / 4093).map(|i| f32::from_bits(i.wrapping_mul(4093)))
}

/// Equal bits, or both NaN of the same sign: NaN payloads are not pinned
/// (logits are never NaN in a valid problem; the device's `cvt` and
/// `half` may quiet or canonicalise them differently).
fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
        || (a.is_nan() && b.is_nan() && a.is_sign_negative() == b.is_sign_negative())
}

/// As [`same_f32`] for 16-bit patterns with `exp_mask` (0x7c00 f16, 0x7f80 bf16).
fn same_16(a: u16, b: u16, exp_mask: u16) -> bool {
    let nan = |x: u16| x & exp_mask == exp_mask && x & !exp_mask & 0x7fff != 0;
    a == b || (nan(a) && nan(b) && (a ^ b) & 0x8000 == 0)
}

#[test]
fn f16_and_bf16_widen_to_f32_exactly_on_all_65536_inputs() {
    for b in 0..=u16::MAX {
        for (got, want, what) in [
            (probe::f16_to_f32(b), f16::from_bits(b).to_f32(), "f16"),
            (probe::bf16_to_f32(b), bf16::from_bits(b).to_f32(), "bf16"),
        ] {
            assert!(same_f32(got, want), "{what} {b:#06x}: {got:e} vs {want:e}");
        }
    }
}

#[test]
fn f32_rounds_to_f16_as_half_does_at_every_boundary_and_a_dense_sample() {
    let cases = rounding_boundaries(|b| f16::from_bits(b).to_f32(), 0x7bff);
    assert!(cases.len() > 6 * 0x7bff);
    for x in cases.into_iter().chain(dense_f32_sample()) {
        let (got, want) = (probe::f32_to_f16(x), f16::from_f32(x).to_bits());
        assert!(
            same_16(got, want, 0x7c00),
            "f32 {x:e} ({:#010x}): {got:#06x} vs {want:#06x}",
            x.to_bits()
        );
    }
}

#[test]
fn f32_rounds_to_bf16_as_half_does_at_every_boundary_and_a_dense_sample() {
    let cases = rounding_boundaries(|b| bf16::from_bits(b).to_f32(), 0x7f7f);
    for x in cases.into_iter().chain(dense_f32_sample()) {
        let (got, want) = (probe::f32_to_bf16(x), bf16::from_f32(x).to_bits());
        assert!(
            same_16(got, want, 0x7f80),
            "f32 {x:e} ({:#010x}): {got:#06x} vs {want:#06x}",
            x.to_bits()
        );
    }
}

#[test]
fn expf_and_log1pf_are_the_cpu_kernels_functions() {
    let mut b = 0u32;
    while b < u32::MAX - 7919 {
        let x = f32::from_bits(b);
        let (e, want) = (probe::expf(x), exp_f32(x));
        assert!(
            e.to_bits() == want.to_bits() || (e.is_nan() && want.is_nan()),
            "expf({x:e})"
        );
        if x >= 0.0 || x.is_nan() {
            let (l, want) = (probe::log1pf(x), ln_1p_f32(x));
            assert!(
                l.to_bits() == want.to_bits() || (l.is_nan() && want.is_nan()),
                "log1pf({x:e})"
            );
        }
        b += 7919;
    }
}

/// `lp_z` (temperature applied in the input dtype) is `x / T` in f32, or the
/// f32 quotient rounded again to bf16 / f16 (the spec's `Dtype::scaled_input`:
/// PyTorch's two roundings).
#[test]
fn temperature_in_the_input_dtype_rounds_as_the_spec_does() {
    let mut r = SplitMix64::new(7);
    for _ in 0..200_000 {
        let t = (0.05 + 3.0 * r.uniform()) as f32;
        let x = (200.0 * (r.uniform() - 0.5)) as f32;
        assert_eq!(probe::z(x, 0, t).to_bits(), x.to_bits());
        assert_eq!(probe::z(x, 1, t).to_bits(), (x / t).to_bits(), "{x} / {t}");
        let xb = bf16::from_f32(x).to_f32();
        let want = Dtype::Bf16.scaled_input(xb as f64, t as f64) as f32;
        assert_eq!(
            probe::z(xb, 2, t).to_bits(),
            want.to_bits(),
            "bf16 {xb} / {t}"
        );
        let xh = f16::from_f32(x).to_f32();
        let want = Dtype::F16.scaled_input(xh as f64, t as f64) as f32;
        assert_eq!(
            probe::z(xh, 3, t).to_bits(),
            want.to_bits(),
            "f16 {xh} / {t}"
        );
    }
}

// ----------------------------------------------------------- primitives

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: shared,
    }
}

/// Launches `name` with an output buffer of `len` T's first, then `rest`.
fn run_selftest<T: logprobe_kernels::cuda::backend::DeviceElem>(
    name: &str,
    c: LaunchConfig,
    len: usize,
    rest: &[Arg],
) -> Result<Vec<T>, String> {
    let l = real();
    let t = MemoryTracker::new();
    let out = l.zeros::<T>(&t, AllocKind::Output, len).unwrap();
    let mut args = vec![Arg::Ptr(out.ptr())];
    args.extend_from_slice(rest);
    // SAFETY: a self-test kernel of cuda/host/selftest.cu writing at most
    // `len` elements of `out` (one per thread or as documented there).
    unsafe { l.launch(name, c, &args) }.map_err(|e| e.to_string())?;
    Ok(l.download(&out, len).unwrap())
}

/// CUDA's shuffle semantics, written from the Programming Guide ("Warp
/// Shuffle Functions"): lanes in segments of `width`; down/up move within
/// the segment or return the caller's value; xor may reach earlier
/// segments, not later ones; idx reads `src % width` of the own segment.
fn shuffle_model(mode: i32, lane: u32, arg: u32, width: u32) -> u32 {
    let seg = lane / width;
    match mode {
        0 => {
            let src = lane + arg;
            if src / width == seg {
                src
            } else {
                lane
            }
        }
        1 => {
            if lane >= arg && (lane - arg) / width == seg {
                lane - arg
            } else {
                lane
            }
        }
        2 => {
            let src = lane ^ arg;
            if src / width <= seg {
                src
            } else {
                lane
            }
        }
        _ => seg * width + arg % width,
    }
}

#[test]
fn warp_shuffles_follow_cuda_semantics_for_every_width() {
    for block in [32u32, 64, 256] {
        for width in [1u32, 2, 4, 8, 16, 32] {
            for mode in 0..4 {
                for arg in [0u32, 1, 3, 8, 16, 31] {
                    for twice in [0, 1] {
                        let got: Vec<i32> = run_selftest(
                            "lp_selftest_shuffle",
                            cfg((2, 1, 1), (block, 1, 1), 0),
                            2 * block as usize,
                            &[
                                Arg::I32(mode),
                                Arg::I32(arg as i32),
                                Arg::I32(width as i32),
                                Arg::I32(twice),
                            ],
                        )
                        .unwrap();
                        for b in 0..2u32 {
                            for t in 0..block {
                                let (warp, lane) = (t / 32, t % 32);
                                let mut src = shuffle_model(mode, lane, arg, width);
                                if twice == 1 {
                                    src = shuffle_model(mode, src, arg, width);
                                }
                                let want = (1000 * b + warp * 32 + src) as i32;
                                assert_eq!(
                                    got[(b * block + t) as usize],
                                    want,
                                    "block {block} width {width} mode {mode} arg {arg} twice {twice} thread {t}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn warp_votes_follow_cuda_semantics() {
    for modulus in [1, 2, 3, 7, 33] {
        let got: Vec<u32> = run_selftest(
            "lp_selftest_vote",
            cfg((1, 1, 1), (96, 1, 1), 0),
            3 * 96,
            &[Arg::I32(modulus)],
        )
        .unwrap();
        for t in 0..96u32 {
            let warp = t / 32;
            let ballot = (0..32u32)
                .filter(|l| (warp * 32 + l) % modulus as u32 == 0)
                .fold(0u32, |b, l| b | 1 << l);
            assert_eq!(got[3 * t as usize], ballot, "ballot {modulus} {t}");
            assert_eq!(
                got[3 * t as usize + 1],
                u32::from(ballot != 0),
                "any {modulus} {t}"
            );
            assert_eq!(
                got[3 * t as usize + 2],
                u32::from(ballot == u32::MAX),
                "all {modulus} {t}"
            );
        }
    }
}

#[test]
fn block_barriers_order_shared_memory_across_rounds_up_to_1024_threads() {
    for (block, rounds) in [(32u32, 5), (512, 9), (1024, 3), (96, 1)] {
        let n = block as usize;
        let got: Vec<i32> = run_selftest(
            "lp_selftest_shared",
            cfg((3, 1, 1), (block, 1, 1), 0),
            3 * n,
            &[Arg::I32(rounds)],
        )
        .unwrap();
        for b in 0..3 {
            let mut s: Vec<i64> = (0..n as i64).map(|t| t + 1000 * b as i64).collect();
            for _ in 0..rounds {
                s = (0..n).map(|t| s[t] + s[(t + 1) % n]).collect();
            }
            let want: Vec<i32> = s.iter().map(|&v| v as i32).collect();
            assert_eq!(
                &got[b * n..(b + 1) * n],
                &want[..],
                "block {block} rounds {rounds}"
            );
        }
    }
}

#[test]
fn dynamic_shared_memory_and_3d_indices_are_cuda_s() {
    let got: Vec<f32> = run_selftest(
        "lp_selftest_dynamic_shared",
        cfg((2, 1, 1), (128, 1, 1), 128 * 4),
        256,
        &[],
    )
    .unwrap();
    for b in 0..2 {
        for t in 0..128 {
            assert_eq!(got[b * 128 + t], (127 - t) as f32 + 0.5);
        }
    }
    let (grid, block) = ((3u32, 2, 2), (8u32, 4, 2));
    let got: Vec<u32> = run_selftest(
        "lp_selftest_indices",
        cfg(grid, block, 0),
        12 * 12 * 64,
        &[],
    )
    .unwrap();
    let mut i = 0;
    for bz in 0..grid.2 {
        for by in 0..grid.1 {
            for bx in 0..grid.0 {
                for tz in 0..block.2 {
                    for ty in 0..block.1 {
                        for tx in 0..block.0 {
                            let want = [
                                tx, ty, tz, bx, by, bz, block.0, block.1, block.2, grid.0, grid.1,
                                grid.2,
                            ];
                            assert_eq!(&got[12 * i..12 * i + 12], &want, "thread {i}");
                            i += 1;
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn barrier_misuse_is_a_typed_fault_not_a_hang() {
    let err = run_selftest::<i32>(
        "lp_selftest_divergent_shuffle",
        cfg((1, 1, 1), (64, 1, 1), 0),
        64,
        &[],
    )
    .unwrap_err();
    assert!(err.contains("barrier deadlock"), "{err}");
    // Exited threads count as arrived at __syncthreads, as on the hardware.
    let got: Vec<i32> = run_selftest(
        "lp_selftest_exit_before_barrier",
        cfg((1, 1, 1), (256, 1, 1), 0),
        256,
        &[],
    )
    .unwrap();
    for (t, &v) in got.iter().enumerate() {
        assert_eq!(v, if t % 3 == 0 { 0 } else { t as i32 });
    }
    // Arguments are checked against the kernel's parameter types.
    let err = run_selftest::<u32>(
        "lp_selftest_vote",
        cfg((1, 1, 1), (32, 1, 1), 0),
        96,
        &[Arg::F32(1.0)],
    )
    .unwrap_err();
    assert!(err.contains("do not match"), "{err}");
    let err = run_selftest::<u32>(
        "lp_selftest_vote",
        cfg((1, 1, 1), (2048, 1, 1), 0),
        1,
        &[Arg::I32(1)],
    )
    .unwrap_err();
    assert!(err.contains("geometry"), "{err}");
}

// ------------------------------------------------ bits against the CPU

/// A problem on which every sum of both reduction orders is exact: each
/// row's allowed values are its max `m` (ties included), values 128 below
/// it (`exp((z - m) / T)` underflows to exactly 0 for `T <= 1`), or `-inf`;
/// masked entries may hold anything of those. Then `S - 1` is the count of
/// other maxima and `sum e * d` is 0 in any order, and only the order-free
/// steps remain: widening, temperature, `log1pf`, gathers, masks, padding.
/// With `one_max`, each row has exactly one maximum in both sets (`S = 1`).
fn exact_case(seed: u64, n: usize, vt: usize, v: usize, one_max: bool) -> cuda_common::Case {
    let mut r = SplitMix64::new(seed);
    let mut x = Array2::<f64>::zeros((n, vt));
    let mut mask = Array2::from_elem((n, vt), true);
    for row in 0..n {
        let m = [0.0, 4.0, -8.0, 16.0][r.below(4)];
        let top = r.below(v);
        for j in 0..vt {
            x[[row, j]] = match r.below(10) {
                0 => f64::NEG_INFINITY,
                1..=3 if !one_max => m,
                _ => m - 128.0,
            };
            mask[[row, j]] = r.below(5) != 0;
        }
        x[[row, top]] = m;
        mask[[row, top]] = true;
        if one_max {
            // The only m of the row: masked entries stay below it too.
            for j in 0..vt {
                if j != top && x[[row, j]] == m {
                    x[[row, j]] = m - 128.0;
                }
            }
        }
    }
    let allowed = |row: usize, j: usize| mask[[row, j]] && x[[row, j]].is_finite();
    let tokens = Array1::from_shape_fn(n, |row| {
        if row % 5 == 4 {
            return -100;
        }
        (0..v)
            .map(|k| (k * 13 + 7 * row) % v)
            .find(|&j| allowed(row, j))
            .unwrap_or(0) as i64
    });
    let ids = Array2::from_shape_fn((n, 4.min(v)), |(row, k)| ((3 * row + 11 * k) % v) as i64);
    cuda_common::Case {
        x,
        tokens,
        mask: Some(mask),
        ids,
        options: Options {
            vocab_size: Some(v),
            temperature: 0.75,
            ..Options::default()
        },
    }
}

/// The declared algorithms of the host-built kernels and the CPU kernels
/// agree in accumulation dtype, exp, log and shift, and differ in the
/// summation model: the reason their bits differ in general.
#[test]
fn host_and_cpu_kernels_declare_the_same_math_and_different_reductions() {
    for v in [1usize, 100, 2048, 32_000, 152_064] {
        let shape = logprobe_reference::spec::Shape {
            n: 4,
            vocab_size: v,
            v_total: v,
            k: 2,
            dtype: Dtype::Bf16,
            accumulation: Dtype::F32,
            temperature: 1.0,
        };
        let host = CudaFused::host().algorithm(&shape);
        let cpu = CpuKernel::fused().algorithm(&shape);
        assert_eq!(
            (host.accumulation, host.exp_ulps, host.log_ulps, host.shift),
            (cpu.accumulation, cpu.exp_ulps, cpu.log_ulps, cpu.shift),
            "V = {v}"
        );
        assert_ne!(
            (host.summation, host.rescaling_exps),
            (cpu.summation, cpu.rescaling_exps),
            "V = {v}: the same reduction would have to give the same bits everywhere"
        );
    }
}

fn same_forward_bits(a: &dyn Kernel, b: &dyn Kernel, p: &Problem<'_>, out: Dtype) -> Check {
    let fa = a.forward(p, out).map_err(|e| e.to_string())?;
    let fb = b.forward(p, out).map_err(|e| e.to_string())?;
    for o in Output::FORWARD {
        ensure!(
            fa.values.get(o).map(bits2) == fb.values.get(o).map(bits2),
            "{} vs {}: {o} {:?} vs {:?}",
            a.name(),
            b.name(),
            fa.values.get(o),
            fb.values.get(o)
        );
    }
    Ok(())
}

/// Where the summation order cannot matter (exact sums), the host-built
/// kernels give the CPU kernels' bits: forward outputs in every dtype, both
/// temperature dtypes, masked and unmasked entropy, padded vocabularies,
/// fused, chunked and vocab-parallel layouts.
#[test]
fn host_built_forward_gives_the_cpu_bits_where_sums_are_exact() {
    for (seed, n, vt, v) in [(1u64, 6, 40, 37), (2, 5, 700, 700), (3, 3, 2100, 2050)] {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for (tdt, ent, temp) in [
                (
                    TemperatureDtype::Accumulation,
                    EntropyLogits::Unmasked,
                    0.75,
                ),
                (TemperatureDtype::Input, EntropyLogits::Masked, 0.75),
                (TemperatureDtype::Accumulation, EntropyLogits::Masked, 1.0),
            ] {
                let mut c = exact_case(seed, n, vt, v, false);
                c.options.temperature_dtype = tdt;
                c.options.entropy = Some(ent);
                c.options.temperature = temp;
                let owned = Owned::new(&c.x, dtype);
                let p = cuda_common::problem(&c, owned.view());
                let widths = vec![vt / 3, vt - vt / 3];
                let pairs: [(Box<dyn Kernel>, Box<dyn Kernel>); 3] = [
                    (Box::new(CudaFused::host()), Box::new(CpuKernel::fused())),
                    (
                        Box::new(CudaChunked::host(2).unwrap()),
                        Box::new(CpuKernel::chunked(3)),
                    ),
                    (
                        Box::new(CudaVocabParallel::host(Shards::Widths(widths.clone()))),
                        Box::new(CpuKernel::vocab_parallel(widths)),
                    ),
                ];
                for (host, cpu) in &pairs {
                    for out in [Dtype::F32, dtype] {
                        same_forward_bits(host.as_ref(), cpu.as_ref(), &p, out).unwrap_or_else(
                            |e| panic!("seed {seed} {dtype} {tdt:?} T={temp} -> {out}: {e}"),
                        );
                    }
                }
            }
        }
    }
}

/// Gradients: the device computes `p_j = exp(d_j) / S` and the CPU
/// `exp(d_j - ln S)` (a difference the declared algorithm does not model),
/// so their bits agree where both are exact: rows with one maximum (S = 1)
/// and dyadic cotangents. Out of place, in place, masks, padding, top-k
/// ids on the same column (merged slots).
#[test]
fn host_built_backward_gives_the_cpu_bits_where_both_are_exact() {
    for (seed, n, vt, v) in [(4u64, 6, 50, 45), (5, 4, 1030, 1024)] {
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            for tdt in [TemperatureDtype::Accumulation, TemperatureDtype::Input] {
                let mut c = exact_case(seed, n, vt, v, true);
                c.options.temperature_dtype = tdt;
                c.ids[[0, 1]] = c.ids[[0, 0]];
                let g = Array1::from_shape_fn(n, |r| 0.5 - 0.25 * r as f64);
                let h = Array1::from_shape_fn(n, |r| 0.25 * r as f64 - 0.5);
                let gk = Array2::from_shape_fn((n, c.ids.ncols()), |(r, k)| {
                    0.125 * (k as f64 + 1.0) - 0.0625 * r as f64
                });
                let cot = Cotangents::default()
                    .with_column(Output::LogProbs, g.view())
                    .with_column(Output::Entropy, h.view())
                    .with(Output::TopkLogProbs, gk.view());
                let owned = Owned::new(&c.x, dtype);
                let p = cuda_common::problem(&c, owned.view());
                let pairs: [(Box<dyn Kernel>, Box<dyn Kernel>); 2] = [
                    (Box::new(CudaFused::host()), Box::new(CpuKernel::fused())),
                    (
                        Box::new(CudaChunked::host(4).unwrap()),
                        Box::new(CpuKernel::chunked(1)),
                    ),
                ];
                for (host, cpu) in &pairs {
                    let what = format!("seed {seed} {dtype} {tdt:?} {}", host.name());
                    for out in [Dtype::F32, dtype] {
                        let a = host.backward(&p, &cot, out).unwrap();
                        let b = cpu.backward(&p, &cot, out).unwrap();
                        assert_eq!(bits2(&a), bits2(&b), "{what} -> {out}: {a} vs {b}");
                    }
                    let mut ia = Owned::new(&c.x, dtype);
                    let mut ib = Owned::new(&c.x, dtype);
                    for (k, o) in [(host, &mut ia), (cpu, &mut ib)] {
                        k.backward_in_place(p.with_logits(o.view_mut()), &cot)
                            .unwrap();
                    }
                    assert_eq!(bits2(&ia.to_f64()), bits2(&ib.to_f64()), "{what} in place");
                }
            }
        }
    }
}

// ------------------------------------------------------ 64-bit offsets

/// A stride past 2^31 elements: row 1 of the view starts past element 2^31,
/// row 2 past 2^32 (their 32-bit offsets, -2^31 + 2^20 and 2^21, land on
/// decoys clear of every row).
const WIDE_STRIDE: usize = (1 << 31) + (1 << 20);

fn launch(l: &dyn Launcher, name: &str, c: LaunchConfig, args: &[Arg]) -> Check {
    // SAFETY: the callers pass arguments matching the kernel (the host
    // build checks their types) and views or buffers covering every row.
    unsafe { l.launch(name, c, args) }.map_err(|e| e.to_string())
}

/// Logits in the device layout: f32 values as bits, or 16-bit patterns.
fn device_words(x: &Array2<f64>, dtype: Dtype) -> Vec<u32> {
    x.iter()
        .map(|&v| match dtype {
            Dtype::Bf16 => bf16::from_f64(v).to_bits() as u32,
            Dtype::F16 => f16::from_f64(v).to_bits() as u32,
            _ => (v as f32).to_bits(),
        })
        .collect()
}

/// The row kernels read (stats, gathers, widening, backward) and write
/// (backward, in place too) rows through 64-bit offsets: three rows of an
/// offset view of stride 2^31 + 2^20 elements (rows at elements 0,
/// 2^31 + 2^20 and 2^32 + 2^21; a 32-bit offset would land on decoy rows)
/// give the bits
/// of the same rows packed contiguously, for f32, bf16 and f16 logits and
/// masks of the same stride.
fn offsets_past_2_31(l: &Arc<dyn Launcher>) -> Check {
    let l = l.as_ref();
    let t = MemoryTracker::new();
    let (rows, v, k1) = (3usize, 300usize, 3usize);
    let s = WIDE_STRIDE;
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let c = cuda_common::case(41, rows, v, v, true, dtype);
        let words = device_words(&c.x, dtype);
        let mask: Vec<u8> = c
            .mask
            .as_ref()
            .unwrap()
            .iter()
            .map(|&b| u8::from(b))
            .collect();
        let es = dtype.size_bytes().min(4);
        let suffix = match dtype {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            _ => "f32",
        };
        // The offset views: logits, mask, f32 gradients.
        let xv = OffsetView::new(rows, s, v, es).map_err(|e| e.to_string())?;
        let mv = OffsetView::new(rows, s, v, 1).map_err(|e| e.to_string())?;
        let gv = OffsetView::new(rows, s, v, 4).map_err(|e| e.to_string())?;
        let decoy_word = match dtype {
            Dtype::Bf16 => bf16::from_f32(2.5).to_bits() as u32,
            Dtype::F16 => f16::from_f32(2.5).to_bits() as u32,
            _ => 2.5f32.to_bits(),
        };
        let write_words = |view: &OffsetView, addr: u64, w: &[u32]| {
            if es == 4 {
                view.write::<u32>(addr, w);
            } else {
                view.write::<u16>(addr, &w.iter().map(|&x| x as u16).collect::<Vec<_>>());
            }
        };
        for r in 0..rows {
            write_words(&xv, xv.row_ptr(r), &words[r * v..(r + 1) * v]);
            mv.write::<u8>(mv.row_ptr(r), &mask[r * v..(r + 1) * v]);
            if let Some(d) = xv.decoy_ptr(r) {
                write_words(&xv, d, &vec![decoy_word; v]);
            }
            if let Some(d) = mv.decoy_ptr(r) {
                mv.write::<u8>(d, &vec![1u8; v]);
            }
        }
        ensure!(
            xv.decoy_ptr(1).is_some(),
            "row 1 must sit past element 2^31"
        );
        // The same rows packed contiguously.
        let xc = if es == 4 {
            l.upload(&t, AllocKind::Input, &words)
                .map(|b| (b.ptr(), Some(b), None))
        } else {
            let w16: Vec<u16> = words.iter().map(|&x| x as u16).collect();
            l.upload(&t, AllocKind::Input, &w16)
                .map(|b| (b.ptr(), None, Some(b)))
        }
        .map_err(|e| e.to_string())?;
        let mc = l
            .upload(&t, AllocKind::Input, &mask)
            .map_err(|e| e.to_string())?;
        let (zmode, temp_z, temp, t_one) = (0, 1.0f32, 0.75f32, 0);
        let row_cfg = cfg((rows as u32, 1, 1), (block_size(v), 1, 1), 0);
        let item_cfg = cfg((1, 1, 1), (256, 1, 1), 0);
        let f32s = |len: usize| l.zeros::<f32>(&t, AllocKind::Workspace, len).unwrap();
        let get = |b: &logprobe_kernels::cuda::DeviceBuffer<f32>, len: usize| -> Vec<u32> {
            l.download(b, len)
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        // Row statistics, both sets.
        let (sv, sc) = (f32s(rows * 8), f32s(rows * 8));
        for (x, xs, m, ms, st) in [
            (xv.base(), s, mv.base(), s, &sv),
            (xc.0, v, mc.ptr(), v, &sc),
        ] {
            launch(
                l,
                &format!("lp_row_stats_{suffix}"),
                row_cfg,
                &[
                    Arg::Ptr(x),
                    Arg::I64(xs as i64),
                    Arg::I32(v as i32),
                    Arg::I32(0),
                    Arg::Ptr(m),
                    Arg::I64(ms as i64),
                    Arg::I32(zmode),
                    Arg::F32(temp_z),
                    Arg::F32(temp),
                    Arg::I32(t_one),
                    Arg::I32(1),
                    Arg::Ptr(st.ptr()),
                ],
            )?;
        }
        ensure!(
            get(&sv, rows * 8) == get(&sc, rows * 8),
            "{dtype}: row statistics through the offset view differ"
        );
        // Gathers at the target and top-k columns.
        let gidx: Vec<i32> = vec![5, 17, 299, 0, 150, 42, 7, 8, 9];
        let gi = l
            .upload(&t, AllocKind::Workspace, &gidx)
            .map_err(|e| e.to_string())?;
        let (gzv, gzc) = (f32s(rows * k1), f32s(rows * k1));
        for (x, xs, gz) in [(xv.base(), s, &gzv), (xc.0, v, &gzc)] {
            launch(
                l,
                &format!("lp_gather_{suffix}"),
                item_cfg,
                &[
                    Arg::Ptr(x),
                    Arg::I64(xs as i64),
                    Arg::I32(v as i32),
                    Arg::I32(0),
                    Arg::Ptr(gi.ptr()),
                    Arg::I32(k1 as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(2),
                    Arg::F32(0.75),
                    Arg::Ptr(gz.ptr()),
                ],
            )?;
        }
        ensure!(
            get(&gzv, rows * k1) == get(&gzc, rows * k1),
            "{dtype}: gathers through the offset view differ"
        );
        // Widening into a chunk buffer.
        let (wv, wc) = (f32s(rows * v), f32s(rows * v));
        for (x, xs, w) in [(xv.base(), s, &wv), (xc.0, v, &wc)] {
            launch(
                l,
                &format!("lp_widen_{suffix}"),
                cfg((4, 1, 1), (256, 1, 1), 0),
                &[
                    Arg::Ptr(x),
                    Arg::I64(xs as i64),
                    Arg::I32(rows as i32),
                    Arg::I32(v as i32),
                    Arg::I32(3),
                    Arg::F32(0.8),
                    Arg::Ptr(w.ptr()),
                ],
            )?;
        }
        ensure!(
            get(&wv, rows * v) == get(&wc, rows * v),
            "{dtype}: widening through the offset view differs"
        );
        // Backward into f32 gradients of the same stride, then in place.
        let sidx: Vec<i32> = vec![5, 17, -1, 0, 150, 42, 7, -1, -1];
        let sa: Vec<f32> = vec![1.0, 0.5, 0.0, 0.25, 0.75, -1.0, 2.0, 0.0, 0.0];
        let so: Vec<f32> = vec![0.5, 1.0, 0.0, -0.25, -0.5, 1.0, 0.0, 0.0, 0.0];
        let up = |d: &[f32]| l.upload(&t, AllocKind::Workspace, d).unwrap();
        let (bi, ba, bo) = (
            l.upload(&t, AllocKind::Workspace, &sidx).unwrap(),
            up(&sa),
            up(&so),
        );
        let (gs, hc) = (up(&[1.5, 0.0, 2.0]), up(&[0.5, -0.25, 1.0]));
        let gc = f32s(rows * v);
        let bwd =
            |x: u64, xs: usize, m: u64, ms: usize, src: &str, dst: &str, out: u64, os: usize| {
                launch(
                    l,
                    &format!("lp_backward_{src}_to_{dst}"),
                    cfg((rows as u32, 1, 1), (block_size(v), 1, 1), (k1 * 4) as u32),
                    &[
                        Arg::Ptr(x),
                        Arg::I64(xs as i64),
                        Arg::I32(v as i32),
                        Arg::I32(v as i32),
                        Arg::I32(0),
                        Arg::Ptr(m),
                        Arg::I64(ms as i64),
                        Arg::I32(zmode),
                        Arg::F32(temp_z),
                        Arg::F32(temp),
                        Arg::I32(t_one),
                        Arg::F32(temp),
                        Arg::I32(t_one),
                        Arg::Ptr(sc.ptr()),
                        Arg::I32(0),
                        Arg::Ptr(bi.ptr()),
                        Arg::Ptr(ba.ptr()),
                        Arg::Ptr(bo.ptr()),
                        Arg::I32(k1 as i32),
                        Arg::Ptr(gs.ptr()),
                        Arg::Ptr(hc.ptr()),
                        Arg::Ptr(out),
                        Arg::I64(os as i64),
                    ],
                )
            };
        bwd(xv.base(), s, mv.base(), s, suffix, "f32", gv.base(), s)?;
        bwd(xc.0, v, mc.ptr(), v, suffix, "f32", gc.ptr(), v)?;
        let packed = get(&gc, rows * v);
        for r in 0..rows {
            ensure!(
                gv.read::<u32>(gv.row_ptr(r), v) == packed[r * v..(r + 1) * v],
                "{dtype}: backward row {r} through the offset view differs"
            );
        }
        if es == 2 {
            bwd(xv.base(), s, mv.base(), s, suffix, suffix, xv.base(), s)?;
            bwd(xc.0, v, mc.ptr(), v, suffix, suffix, xc.0, v)?;
            let packed = l.download(xc.2.as_ref().unwrap(), rows * v).unwrap();
            for r in 0..rows {
                ensure!(
                    xv.read::<u16>(xv.row_ptr(r), v) == packed[r * v..(r + 1) * v],
                    "{dtype}: in-place backward row {r} through the offset view differs"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn row_offsets_past_2_31_elements_are_64_bit() {
    offsets_past_2_31(&real()).unwrap();
}

// --------------------------------------------------------------- mutants

/// Each planted bug fails a check the real build passes (the real build's
/// runs are the tests above and in `cuda_runtime.rs`).
fn killed(name: &str, check: fn(&Arc<dyn Launcher>) -> Check) -> String {
    check(&mutant(name)).expect_err(&format!("mutant `{name}` survived its check"))
}

#[test]
fn int32_row_offset_mutant_is_killed_by_the_offset_view() {
    let e = killed("int32_row_offset", offsets_past_2_31);
    assert!(e.contains("row statistics"), "{e}");
    // Small problems cannot see it: the offset view is what kills it.
    oracle_agreement(&mutant("int32_row_offset")).unwrap();
}

#[test]
fn chunk_remainder_mutant_is_killed_by_chunk_size_invariance() {
    let e = killed("chunk_remainder", chunk_invariance);
    assert!(e.contains("chunk"), "{e}");
}

#[test]
fn shuffle_width_mutant_is_killed_by_oracle_agreement() {
    let e = killed("shuffle_width", oracle_agreement);
    assert!(e.contains("cuda-host[shuffle_width]"), "{e}");
}
