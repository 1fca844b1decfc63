// Benchmark inputs generated on the device (no multi-GB host upload):
// x[i] = 4 (u1 + u2 - 1) + 8 [hash(i) % 4096 == 0], u1, u2 uniform in [0, 1)
// from a 64-bit integer hash of (i, seed): a bell-shaped row with a few
// dominant tokens, every value finite, rounded to the target dtype.

__device__ __forceinline__ unsigned long long lp_mix(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float lp_fill_value(lp_i64 i, unsigned seed) {
    const unsigned long long h = lp_mix((unsigned long long)i ^ ((unsigned long long)seed << 40));
    const float u1 = (float)(h >> 40) * 5.9604644775390625e-8f;
    const float u2 = (float)((h >> 16) & 0xffffffull) * 5.9604644775390625e-8f;
    const float spike = (h & 4095ull) == 0 ? 8.0f : 0.0f;
    return 4.0f * (u1 + u2 - 1.0f) + spike;
}

extern "C" __global__ void lp_fill_f32(float* x, lp_i64 n, unsigned seed) {
    for (lp_i64 i = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (lp_i64)gridDim.x * blockDim.x) {
        x[i] = lp_fill_value(i, seed);
    }
}

extern "C" __global__ void lp_fill_bf16(lp_u16* x, lp_i64 n, unsigned seed) {
    for (lp_i64 i = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (lp_i64)gridDim.x * blockDim.x) {
        x[i] = lp_f32_to_bf16(lp_fill_value(i, seed));
    }
}

extern "C" __global__ void lp_fill_f16(lp_u16* x, lp_i64 n, unsigned seed) {
    for (lp_i64 i = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (lp_i64)gridDim.x * blockDim.x) {
        x[i] = lp_f32_to_f16(lp_fill_value(i, seed));
    }
}
