#!/usr/bin/env bash
# CUDA checks on a GPU machine that has no crate registry (issue 6): runs the
# CUDA properties and the fused-forward bandwidth benchmark from a prebuilt,
# stripped release test binary, in well under 4 minutes on one H200.
#
# On the build machine (x86-64, with the registry and NVRTC):
#
#   export LD_LIBRARY_PATH="$(scripts/install-nvrtc.sh | tail -n1):${LD_LIBRARY_PATH:-}"
#   CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
#     cargo test --release --no-run --features cuda -p logprobe-kernels --test cuda_runtime
#   # cargo prints: Executable tests/cuda_runtime.rs (target/release/deps/cuda_runtime-<hash>)
#   mkdir -p gpu && cp target/release/deps/cuda_runtime-<hash> gpu/cuda_runtime
#   LOGPROBE_CUDA_PTX_OUT=gpu/ptx cargo test --features cuda -p logprobe-kernels --test cuda_compile
#   # the property suite (oracle included) with the CUDA kernels in its kernel lists:
#   CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
#     cargo test --release --no-run --features cuda -p logprobe-cli --test properties
#   cp target/release/deps/properties-<hash> gpu/properties
#
# Then copy gpu/ (binaries + ptx/, well under 64 MiB) to the GPU machine and run:
#
#   scripts/gpu-check.sh gpu/cuda_runtime gpu/ptx gpu/properties
#
# The PTX folder is used only when the GPU machine cannot load libnvrtc.so.13
# (LOGPROBE_CUDA_PTX_DIR); otherwise the binary compiles the kernels itself
# with NVRTC. The binary loads libcuda at run time (cudarc dynamic loading).
#
# Output: the test results, then lines "BENCH fused forward bf16 ..." and
# "BENCH fused forward f32 ..." with time, bytes moved, GB/s and the fraction
# of the H200's 4.8 TB/s. Set LOGPROBE_CUDA_BENCH_MIN=0.8 to make a fraction
# below 80% fail the run. Exit status: that of the test binary.
set -euo pipefail
bin="${1:?usage: gpu-check.sh CUDA_RUNTIME_TEST_BINARY [PTX_DIR] [PROPERTIES_TEST_BINARY]}"
ptx="${2:-}"
props="${3:-}"
if [[ -n "$ptx" ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13' \
    && ! { [[ -n "${LD_LIBRARY_PATH:-}" ]] && ls ${LD_LIBRARY_PATH//:/ } 2>/dev/null | grep -q 'libnvrtc\.so\.13'; }; then
    echo "no libnvrtc.so.13 here: loading prebuilt PTX from $ptx"
    export LOGPROBE_CUDA_PTX_DIR="$ptx"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
export LOGPROBE_CUDA_BENCH=1
# The test binaries also hold the host build of the same kernels (feature
# cuda-host), which every CI run already covers: spend the GPU's time on the
# GPU. What the host build cannot show (libdevice bits, timing, coalescing,
# warp scheduling, nvcc/NVRTC code generation) is why this script exists.
export LOGPROBE_CUDA_HOST=0
start=$(date +%s)
# One test at a time: the device is shared and the benchmark wants it alone.
timeout 150 "$bin" --test-threads=1 --nocapture
if [[ -n "$props" ]]; then
    # Every property (oracle agreement, chunk-size bit invariance, gradients,
    # bf16/f16, vocab-parallel, edges) on CPU and CUDA kernels alike.
    timeout 75 "$props" --test-threads=4
fi
echo "gpu-check: $(( $(date +%s) - start )) s"
