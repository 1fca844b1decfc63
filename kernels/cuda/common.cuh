// logprobe CUDA prelude: prepended (as text) to every kernels/cuda/*.cu file
// before NVRTC compiles it, so each file is one self-contained program.
//
// Conventions (docs/design.md, "The kernels"):
// - f32 accumulation; bf16/f16 logits are loaded as 16-bit words and widened
//   exactly; 64-bit row offsets (N * V exceeds 2^31 at real sizes).
// - Full-precision libdevice math, never the fast intrinsics: expf (max 2 ulp),
//   log1pf (max 1 ulp), IEEE division (CUDA C++ Programming Guide, "Mathematical
//   Functions", single-precision table). Compiled with --fmad=false, so every
//   fused multiply-add is an explicit fmaf().
// - One block per row; blockDim is a power of two chosen from the row's column
//   count alone (host: cuda::launch::block_size), so each row's reduction order
//   depends on V and blockDim only, never on N, chunking or other rows.

typedef unsigned short lp_u16;
typedef unsigned char lp_u8;
typedef long long lp_i64;

#define LP_NEG_INF (__int_as_float(0xff800000))
#define LP_POS_INF (__int_as_float(0x7f800000))
// Largest block the kernels are launched with (host: cuda::launch::MAX_BLOCK).
#define LP_MAX_BLOCK 512
// Consecutive columns per tile (one 16-byte f32 or 8-byte 16-bit load).
#define LP_TILE 4
// Tiles per rescaling group: the running max is raised at most once a group.
#define LP_GROUP 4
#define LP_GROUP_ELEMS (LP_TILE * LP_GROUP)
// Words of one row's statistics: the softmax set P then the entropy set W,
// each (m, s, b, idx) (see LpState).
#define LP_STATE_WORDS 8
// gather-index marker of a top-k id that the sampling mask disallows.
#define LP_MASKED_ID (-2)

// ---------------------------------------------------------------- dtypes

__device__ __forceinline__ float lp_bf16_to_f32(lp_u16 b) {
    return __uint_as_float(((unsigned)b) << 16);
}

// f16 -> f32 (exact) and f32 -> f16 (to nearest even) by the PTX
// conversions. The host build (cuda/host/lp_host.h) has no PTX: its
// bit-exact C fallbacks.
#ifdef LP_HOST_BUILD
__device__ __forceinline__ float lp_f16_to_f32(lp_u16 h) { return lp_host_f16_to_f32(h); }
__device__ __forceinline__ lp_u16 lp_f32_to_f16(float f) { return lp_host_f32_to_f16(f); }
#else
__device__ __forceinline__ float lp_f16_to_f32(lp_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ lp_u16 lp_f32_to_f16(float f) {
    lp_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

// Round to nearest even; NaN stays NaN, overflow carries into infinity.
__device__ __forceinline__ lp_u16 lp_f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (lp_u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (lp_u16)(u >> 16);
}

// Loaders: element type T, exact widening to f32, one tile of LP_TILE
// consecutive elements by one vector load (caller checks alignment).
struct LoadF32 {
    typedef float T;
    static __device__ __forceinline__ float widen(T v) { return v; }
    static __device__ __forceinline__ void tile(const T* p, float* v) {
        float4 q = *reinterpret_cast<const float4*>(p);
        v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
    }
};

// One tile of four 16-bit elements by one 8-byte load, each widened by
// `L::widen` (the bf16 and f16 loaders' shared tile).
template <typename L>
__device__ __forceinline__ void lp_tile_u16(const lp_u16* p, float* v) {
    uint2 q = *reinterpret_cast<const uint2*>(p);
    v[0] = L::widen((lp_u16)(q.x & 0xffffu));
    v[1] = L::widen((lp_u16)(q.x >> 16));
    v[2] = L::widen((lp_u16)(q.y & 0xffffu));
    v[3] = L::widen((lp_u16)(q.y >> 16));
}

struct LoadBf16 {
    typedef lp_u16 T;
    static __device__ __forceinline__ float widen(T v) { return lp_bf16_to_f32(v); }
    static __device__ __forceinline__ void tile(const T* p, float* v) { lp_tile_u16<LoadBf16>(p, v); }
};

struct LoadF16 {
    typedef lp_u16 T;
    static __device__ __forceinline__ float widen(T v) { return lp_f16_to_f32(v); }
    static __device__ __forceinline__ void tile(const T* p, float* v) { lp_tile_u16<LoadF16>(p, v); }
};

// Stores of the backward's grad logits: f32, or rounded to the logits' dtype
// (in-place backward).
struct StoreF32 {
    typedef float T;
    static __device__ __forceinline__ T narrow(float v) { return v; }
};
struct StoreBf16 {
    typedef lp_u16 T;
    static __device__ __forceinline__ T narrow(float v) { return lp_f32_to_bf16(v); }
};
struct StoreF16 {
    typedef lp_u16 T;
    static __device__ __forceinline__ T narrow(float v) { return lp_f32_to_f16(v); }
};

// x (double, the exactly rounded-to-f64 quotient) correctly rounded to a
// binary format of `prec` significant bits whose quantum never falls below
// 2^min_sub_exp, overflowing to infinity past max_finite. Mirrors
// spec::Dtype::round_f64; exact because every step but rint is a power of two.
__device__ __forceinline__ float lp_round_f64(double x, int prec, int min_sub_exp, double max_finite) {
    if (x == 0.0 || !isfinite(x)) {
        return (float)x;
    }
    int q = ilogb(x) - prec + 1;
    q = q < min_sub_exp ? min_sub_exp : q;
    double r = ldexp(rint(ldexp(x, -q)), q);
    if (fabs(r) > max_finite) {
        return x < 0.0 ? LP_NEG_INF : LP_POS_INF;
    }
    return (float)r;
}

// The logit z the softmax sees (options.temperature_dtype):
//   zmode 0: z = x (the temperature is applied after the max shift, lp_shift);
//   zmode 1: z = fl32(x / T)               (f32 logits, temperature_dtype = input);
//   zmode 2: z = round_bf16(fl32(x / T))   (bf16 logits, temperature_dtype = input);
//   zmode 3: z = round_f16(fl32(x / T))    (f16 logits, temperature_dtype = input).
// Two roundings, as PyTorch materialises `x / T` in a 16-bit dtype: the f32
// quotient, then the 16-bit rounding of it (Dtype::scaled_input on the host).
// With zmode != 0 the host passes temperature 1 to lp_shift.
__device__ __forceinline__ float lp_z(float x, int zmode, float temp_z) {
    switch (zmode) {
    case 1:
        return __fdiv_rn(x, temp_z);
    case 2:
        return lp_round_f64((double)__fdiv_rn(x, temp_z), 8, -133, 3.3895313892515355e38);
    case 3:
        return lp_round_f64((double)__fdiv_rn(x, temp_z), 11, -24, 65504.0);
    default:
        return x;
    }
}

// d = (z - m) / T: subtract the max first (one rounding), then scale (one
// more); t_one skips the exact division by T = 1.
__device__ __forceinline__ float lp_shift(float z, float m, float temp, int t_one) {
    float d = __fsub_rn(z, m);
    return t_one ? d : __fdiv_rn(d, temp);
}

// ------------------------------------------------------- row statistics
//
// Online row statistics over a set of entries z_j (docs/design.md, "The kernels", fused):
//   m   = max_j z_j                       (-inf: empty set)
//   idx = global column of one argmax (the first in this thread's order; the
//         smallest one when merging ties)
//   s   = sum_{j != idx} exp((z_j - m) / T)    so S = 1 + s, ln S = log1p(s)
//   b   = sum_j exp((z_j - m) / T) * (m - z_j) / T   so R = b / S
// Entries at -inf (masked, padding, -inf logits) contribute nothing.
struct LpState {
    float m;
    float s;
    float b;
    int idx;
};

__device__ __forceinline__ LpState lp_state_empty() {
    LpState st;
    st.m = LP_NEG_INF;
    st.s = 0.0f;
    st.b = 0.0f;
    st.idx = -1;
    return st;
}

// Adds one group of LP_GROUP tiles (v[g * LP_TILE + e] at global column
// col[g] + e, in that order) to a thread's state. The running max is raised
// at most once per group: one rescaling exp per group.
//   rescale by f = exp(-(m_new - m) / T):  s' = (s + 1) f,  b' = f (b + dl (s + 1))
__device__ __forceinline__ void lp_update(LpState& st, const float* v, const int* col, float temp, int t_one) {
    float gm = v[0];
#pragma unroll
    for (int k = 1; k < LP_GROUP_ELEMS; ++k) {
        gm = fmaxf(gm, v[k]);
    }
    if (gm > st.m) {
        if (st.m != LP_NEG_INF) {
            float dl = lp_shift(gm, st.m, temp, t_one);
            float f = expf(-dl);
            float a = __fadd_rn(st.s, 1.0f);
            st.b = __fmul_rn(f, fmaf(dl, a, st.b));
            st.s = __fmul_rn(a, f);
        }
        st.m = gm;
        int first = -1;
#pragma unroll
        for (int k = LP_GROUP_ELEMS - 1; k >= 0; --k) {
            if (v[k] == gm) {
                first = col[k / LP_TILE] + (k % LP_TILE);
            }
        }
        st.idx = first;
    }
#pragma unroll
    for (int k = 0; k < LP_GROUP_ELEMS; ++k) {
        int c = col[k / LP_TILE] + (k % LP_TILE);
        if (v[k] != LP_NEG_INF && c != st.idx) {
            float d = lp_shift(v[k], st.m, temp, t_one);
            float t = expf(d);
            st.s = __fadd_rn(st.s, t);
            st.b = fmaf(t, -d, st.b);
        }
    }
}

// Merges two states; commutative (the larger max, or on a tie the smaller
// idx, is the base), exact when either side is empty.
//   base a, other b, dl = (a.m - b.m) / T, f = exp(-dl), A_b = b.s + 1:
//   s = a.s + A_b f,  b = a.b + f (b.b + dl A_b);  equal maxima: s = a.s + b.s + 1.
__device__ __forceinline__ LpState lp_merge(LpState a, LpState b, float temp, int t_one) {
    if (b.m == LP_NEG_INF) {
        return a;
    }
    if (a.m == LP_NEG_INF) {
        return b;
    }
    if (a.m < b.m || (a.m == b.m && b.idx < a.idx)) {
        LpState t = a;
        a = b;
        b = t;
    }
    if (a.m == b.m) {
        a.s = __fadd_rn(__fadd_rn(a.s, b.s), 1.0f);
        a.b = __fadd_rn(a.b, b.b);
        return a;
    }
    float dl = lp_shift(a.m, b.m, temp, t_one);
    float f = expf(-dl);
    float ab = __fadd_rn(b.s, 1.0f);
    a.s = __fadd_rn(a.s, __fmul_rn(ab, f));
    a.b = __fadd_rn(a.b, __fmul_rn(f, fmaf(dl, ab, b.b)));
    return a;
}

__device__ __forceinline__ LpState lp_shfl_down(LpState st, int off) {
    st.m = __shfl_down_sync(0xffffffffu, st.m, off);
    st.s = __shfl_down_sync(0xffffffffu, st.s, off);
    st.b = __shfl_down_sync(0xffffffffu, st.b, off);
    st.idx = __shfl_down_sync(0xffffffffu, st.idx, off);
    return st;
}

// Fixed reduction tree over the block (blockDim a power of two, >= 32):
// log2(32) shuffle levels inside each warp, then log2(blockDim / 32) levels
// over the warps' results in warp 0 (padded with empty states, exact no-ops).
// Every thread gets the result. `red` holds 33 states in shared memory.
__device__ __forceinline__ LpState lp_block_reduce(LpState st, LpState* red, float temp, int t_one) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        st = lp_merge(st, lp_shfl_down(st, off), temp, t_one);
    }
    if (lane == 0) {
        red[warp] = st;
    }
    __syncthreads();
    if (warp == 0) {
        st = lane < nwarps ? red[lane] : lp_state_empty();
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            st = lp_merge(st, lp_shfl_down(st, off), temp, t_one);
        }
        if (lane == 0) {
            red[32] = st;
        }
    }
    __syncthreads();
    LpState r = red[32];
    __syncthreads();
    return r;
}

__device__ __forceinline__ void lp_state_store(float* out, LpState p, LpState w) {
    out[0] = p.m;
    out[1] = p.s;
    out[2] = p.b;
    out[3] = __int_as_float(p.idx);
    out[4] = w.m;
    out[5] = w.s;
    out[6] = w.b;
    out[7] = __int_as_float(w.idx);
}

__device__ __forceinline__ LpState lp_state_load(const float* in) {
    LpState st;
    st.m = in[0];
    st.s = in[1];
    st.b = in[2];
    st.idx = __float_as_int(in[3]);
    return st;
}

// log-softmax of entry z under the (merged) softmax state: (z - m) / T - log1p(s).
__device__ __forceinline__ float lp_log_softmax(float z, float m, float s, float temp, int t_one) {
    return __fsub_rn(lp_shift(z, m, temp, t_one), log1pf(s));
}

// entropy = ln S_w + R with S_w = 1 + s_w, R = b_w / S_w.
__device__ __forceinline__ float lp_entropy(float s_w, float b_w) {
    return __fadd_rn(log1pf(s_w), __fdiv_rn(b_w, __fadd_rn(1.0f, s_w)));
}
