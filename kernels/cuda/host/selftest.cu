// Host-build self-test module (not a CUDA source; compiled in the real host
// build only, after common.cuh like every module): kernels that pin the
// primitives of lp_host.h to CUDA's documented semantics (CUDA C++
// Programming Guide, "Warp Shuffle Functions", "Warp Vote Functions",
// "Synchronization Functions"), and probes of common.cuh's conversions and
// of the routed math. Driven by kernels/tests/cuda_host.rs.

__device__ __forceinline__ int lp_selftest_linear() {
    return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

__device__ __forceinline__ int lp_selftest_block_linear() {
    return (int)(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

// out[block, t] = the shuffled value of var = 1000 * block + t:
// mode 0 __shfl_down_sync(arg), 1 __shfl_up_sync(arg), 2 __shfl_xor_sync(arg),
// 3 __shfl_sync(arg), each over `width` lanes; twice in a row (the second
// shuffles the first's result), so slot reuse across operations is checked.
extern "C" __global__ void lp_selftest_shuffle(int* out, int mode, int arg, int width, int twice) {
    const int n = (int)(blockDim.x * blockDim.y * blockDim.z);
    const int t = lp_selftest_linear();
    int v = 1000 * lp_selftest_block_linear() + t;
    for (int rep = 0; rep < (twice ? 2 : 1); ++rep) {
        switch (mode) {
        case 0:
            v = __shfl_down_sync(0xffffffffu, v, (unsigned)arg, width);
            break;
        case 1:
            v = __shfl_up_sync(0xffffffffu, v, (unsigned)arg, width);
            break;
        case 2:
            v = __shfl_xor_sync(0xffffffffu, v, arg, width);
            break;
        default:
            v = __shfl_sync(0xffffffffu, v, arg, width);
            break;
        }
    }
    out[(lp_i64)lp_selftest_block_linear() * n + t] = v;
}

// out[t] = (ballot, any, all) of the predicate (t % modulus == 0).
extern "C" __global__ void lp_selftest_vote(unsigned* out, int modulus) {
    const int t = lp_selftest_linear();
    const int pred = t % modulus == 0;
    out[3 * t] = __ballot_sync(0xffffffffu, pred);
    out[3 * t + 1] = (unsigned)__any_sync(0xffffffffu, pred);
    out[3 * t + 2] = (unsigned)__all_sync(0xffffffffu, pred);
}

// Static shared memory across barriers, `rounds` times:
// s[t] = s[t] + s[(t + 1) % n] (each round reads the previous round's values).
extern "C" __global__ void lp_selftest_shared(int* out, int rounds) {
    __shared__ int s[1024];
    const int n = (int)(blockDim.x * blockDim.y * blockDim.z);
    const int t = lp_selftest_linear();
    s[t] = t + 1000 * lp_selftest_block_linear();
    __syncthreads();
    for (int k = 0; k < rounds; ++k) {
        const int v = s[t] + s[(t + 1) % n];
        __syncthreads();
        s[t] = v;
        __syncthreads();
    }
    out[(lp_i64)lp_selftest_block_linear() * n + t] = s[t];
}

// Dynamic shared memory: d[t] = t + 0.5, then out[t] = d[n - 1 - t].
extern "C" __global__ void lp_selftest_dynamic_shared(float* out) {
    extern __shared__ float lp_selftest_dyn[];
    const int n = (int)(blockDim.x * blockDim.y * blockDim.z);
    const int t = lp_selftest_linear();
    lp_selftest_dyn[t] = (float)t + 0.5f;
    __syncthreads();
    out[(lp_i64)lp_selftest_block_linear() * n + t] = lp_selftest_dyn[n - 1 - t];
}

// o[0..3] = x, y, z.
__device__ __forceinline__ void lp_selftest_put3(unsigned* o, unsigned x, unsigned y, unsigned z) {
    o[0] = x;
    o[1] = y;
    o[2] = z;
}

// out[global thread, 0..12] = threadIdx, blockIdx, blockDim, gridDim.
extern "C" __global__ void lp_selftest_indices(unsigned* out) {
    const lp_i64 n = (lp_i64)blockDim.x * blockDim.y * blockDim.z;
    unsigned* o = out + 12 * ((lp_i64)lp_selftest_block_linear() * n + lp_selftest_linear());
    lp_selftest_put3(o, threadIdx.x, threadIdx.y, threadIdx.z);
    lp_selftest_put3(o + 3, blockIdx.x, blockIdx.y, blockIdx.z);
    lp_selftest_put3(o + 6, blockDim.x, blockDim.y, blockDim.z);
    lp_selftest_put3(o + 9, gridDim.x, gridDim.y, gridDim.z);
}

// A shuffle that half the warp never reaches (undefined in CUDA): the host
// build must stop with a fault, not hang.
extern "C" __global__ void lp_selftest_divergent_shuffle(int* out) {
    const int t = lp_selftest_linear();
    if ((t & 31) < 16) {
        out[t] = __shfl_down_sync(0xffffffffu, t, 1);
    }
}

// Threads that exit before a barrier count as arrived (as on the hardware).
extern "C" __global__ void lp_selftest_exit_before_barrier(int* out) {
    __shared__ int s[1024];
    const int t = lp_selftest_linear();
    if (t % 3 == 0) {
        return;
    }
    s[t] = t;
    __syncthreads();
    out[t] = s[t];
}

// ---- probes of common.cuh as the kernels compile it (host entry points)

extern "C" float lp_host_probe_f16_to_f32(lp_u16 h) { return lp_f16_to_f32(h); }
extern "C" lp_u16 lp_host_probe_f32_to_f16(float f) { return lp_f32_to_f16(f); }
extern "C" float lp_host_probe_bf16_to_f32(lp_u16 h) { return lp_bf16_to_f32(h); }
extern "C" lp_u16 lp_host_probe_f32_to_bf16(float f) { return lp_f32_to_bf16(f); }
extern "C" float lp_host_probe_expf(float x) { return expf(x); }
extern "C" float lp_host_probe_log1pf(float x) { return log1pf(x); }
extern "C" float lp_host_probe_z(float x, int zmode, float temp_z) { return lp_z(x, zmode, temp_z); }
