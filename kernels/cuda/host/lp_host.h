// Host build of the CUDA kernels (feature `cuda-host`): what CUDA C++ gives
// a kernel, for a C++17 compiler. kernels/build.rs includes this before the
// program NVRTC compiles (common.cuh, then one .cu file), unchanged.
//
// - __global__ / __device__ / __forceinline__ / __launch_bounds__ as plain C++;
//   __shared__ is `thread_local` (a block runs on one OS thread; its threads
//   are fibers of that thread, see runtime.cpp).
// - threadIdx / blockIdx / blockDim / gridDim read the current fiber and block.
// - __syncthreads and the warp shuffles and votes (full-warp masks only) are
//   barriers of the fiber scheduler; shuffles exchange 32 lanes' values.
// - __fadd_rn & co. are the IEEE operations (compiled with -ffp-contract=off,
//   as the device's --fmad=false); bit casts by memcpy.
// - lp_host_f16_to_f32 / lp_host_f32_to_f16: bit-exact C fallbacks of the
//   PTX cvt instructions (round to nearest even; NaN quieted, payload kept
//   as `half` and x86 F16C keep it), used by common.cuh under LP_HOST_BUILD.
// - expf / log1pf are routed to the CPU kernels' exp_f32 / ln_1p_f32
//   (kernels/src/exp.rs) through lp_host_math, set by the Rust launcher: the
//   host build declares their error, not libdevice's. Other float math
//   functions are poisoned (a compile error) until someone routes them.

#ifndef LP_HOST_H
#define LP_HOST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>
#include <utility>

#define LP_HOST_BUILD 1

#ifndef LP_HOST_DYN_SHARED_BYTES
#define LP_HOST_DYN_SHARED_BYTES (48 * 1024)
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ thread_local
#define __restrict__ __restrict
#define warpSize 32

// ------------------------------------------------------------ vector types

struct uint3 {
    unsigned x, y, z;
};
typedef uint3 dim3;
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};

// ------------------------------------------------ runtime state (runtime.cpp)

// The head of the current thread's fiber.
struct LpHostFiberHead {
    uint3 thread_idx;
    unsigned lane;       // linear thread index % 32
    unsigned warp;       // linear thread index / 32
    unsigned warp_mask;  // lanes of this warp that exist in the block
};

struct LpHostDims {
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};

// expf / log1pf of the host build (the CPU kernels' functions).
struct LpHostMath {
    float (*expf)(float);
    float (*log1pf)(float);
};

// One kernel of a generated unit: its name, a trampoline taking the
// argument array of a launch (as cuLaunchKernel's kernelParams), and its
// parameter signature (one letter per parameter: p pointer, l long long,
// i int, u unsigned, f float; ? anything else).
struct LpHostEntry {
    const char* name;
    void (*run)(void* const* args);
    const char* signature;
};

extern "C" {
extern __thread LpHostFiberHead* lp_host_fiber;
extern __thread LpHostDims lp_host_dims;
extern LpHostMath lp_host_math;
// Exchanges one 64-bit value among the warp's lanes (a warp barrier) and
// returns the 32 lanes' values; valid until this lane's next warp operation
// but one.
const uint64_t* lp_host_warp_exchange(unsigned mask, uint64_t value);
void lp_host_syncthreads(void);
// Records a fault of the running launch (the first one is reported).
void lp_host_fault(const char* what);
}

#define threadIdx (lp_host_fiber->thread_idx)
#define blockIdx (lp_host_dims.block_idx)
#define blockDim (lp_host_dims.block_dim)
#define gridDim (lp_host_dims.grid_dim)

// ------------------------------------------------------------- arithmetic

// The bit casts: one memcpy between same-sized types.
template <typename To, typename From>
static inline To lp_host_bit_cast(From x) {
    static_assert(sizeof(To) == sizeof(From), "bit cast between same sizes");
    To y;
    memcpy(&y, &x, sizeof y);
    return y;
}
static inline float __int_as_float(int i) { return lp_host_bit_cast<float>(i); }
static inline int __float_as_int(float f) { return lp_host_bit_cast<int>(f); }
static inline float __uint_as_float(unsigned u) { return lp_host_bit_cast<float>(u); }
static inline unsigned __float_as_uint(float f) { return lp_host_bit_cast<unsigned>(f); }
// One IEEE operation each, round to nearest even (SSE; no contraction).
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }

// f16 bits -> f32, exact. NaN: quiet bit set, payload kept.
static inline float lp_host_f16_to_f32(unsigned short h) {
    const unsigned sign = (unsigned)(h & 0x8000u) << 16;
    const unsigned exp = (h >> 10) & 0x1fu;
    const unsigned man = h & 0x3ffu;
    if (exp == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
    }
    if (exp == 0) {
        // Zero or subnormal: man * 2^-24, exact in f32.
        const float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// f32 -> f16 bits, round to nearest even; overflow to infinity; NaN: quiet
// bit set, payload truncated to 9 bits.
static inline unsigned short lp_host_f32_to_f16(float f) {
    const unsigned x = __float_as_uint(f);
    const unsigned sign = (x >> 16) & 0x8000u;
    const unsigned exp = (x >> 23) & 0xffu;
    unsigned man = x & 0x7fffffu;
    if (exp == 0xffu) {
        return (unsigned short)(man ? (sign | 0x7e00u | (man >> 13)) : (sign | 0x7c00u));
    }
    const int e = (int)exp - 127 + 15;
    if (e >= 0x1f) {
        return (unsigned short)(sign | 0x7c00u);
    }
    if (e <= 0) {
        // Subnormal f16 (or zero): shift the significand, with its hidden
        // bit, right by 14 - e and round.
        if (14 - e > 24) {
            return (unsigned short)sign;
        }
        man |= 0x800000u;
        const unsigned shift = (unsigned)(14 - e);
        const unsigned half_man = man >> shift;
        const unsigned round_bit = 1u << (shift - 1);
        const bool up = (man & round_bit) && (man & (3u * round_bit - 1u));
        return (unsigned short)(sign | (half_man + (up ? 1u : 0u)));
    }
    const unsigned out = sign | ((unsigned)e << 10) | (man >> 13);
    const unsigned round_bit = 0x1000u;
    const bool up = (man & round_bit) && (man & (3u * round_bit - 1u));
    // A carry out of the significand raises the exponent (to infinity at the top).
    return (unsigned short)(out + (up ? 1u : 0u));
}

// ----------------------------------------------------------------- math

#define expf(x) (lp_host_math.expf(x))
#define log1pf(x) (lp_host_math.log1pf(x))
// Not routed yet: using one is a compile error, not silently libm's bits.
#define logf(...) lp_host_math_function_not_routed_logf
#define log2f(...) lp_host_math_function_not_routed_log2f
#define exp2f(...) lp_host_math_function_not_routed_exp2f
#define expm1f(...) lp_host_math_function_not_routed_expm1f
#define powf(...) lp_host_math_function_not_routed_powf
#define tanhf(...) lp_host_math_function_not_routed_tanhf
#define __expf(...) lp_host_math_function_not_routed___expf
#define __logf(...) lp_host_math_function_not_routed___logf
#define __fdividef(...) lp_host_math_function_not_routed___fdividef

// ---------------------------------------------------- barriers and warps

static inline void __syncthreads() { lp_host_syncthreads(); }

template <class T>
static inline uint64_t lp_host_to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled values are at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}

template <class T>
static inline T lp_host_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}

// Width of a shuffle segment: a power of two in [1, 32] (else a fault, and 32).
static inline unsigned lp_host_width(int width) {
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
        lp_host_fault("shuffle width is not a power of two in [1, 32]");
        return 32;
    }
    return (unsigned)width;
}

// The value of lane `src` after the exchange (own value if that lane does
// not exist: a partial last warp).
template <class T>
static inline T lp_host_shuffle(unsigned mask, T var, unsigned src) {
    const uint64_t* v = lp_host_warp_exchange(mask, lp_host_to_bits(var));
    if (src > 31 || !((lp_host_fiber->warp_mask >> src) & 1u)) {
        lp_host_fault("shuffle from a lane outside the block");
        src = lp_host_fiber->lane;
    }
    return lp_host_from_bits<T>(v[src]);
}

template <class T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    const unsigned w = lp_host_width(width);
    const unsigned lane = lp_host_fiber->lane;
    return lp_host_shuffle(mask, var, (lane & ~(w - 1u)) + ((unsigned)src_lane & (w - 1u)));
}

// Lane + delta within the lane's segment of `width` lanes, else its own value.
template <class T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    const unsigned w = lp_host_width(width);
    const unsigned lane = lp_host_fiber->lane;
    return lp_host_shuffle(mask, var, (lane & (w - 1u)) + delta < w ? lane + delta : lane);
}

// Lane - delta within the lane's segment, else its own value.
template <class T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    const unsigned w = lp_host_width(width);
    const unsigned lane = lp_host_fiber->lane;
    return lp_host_shuffle(mask, var, (lane & (w - 1u)) >= delta ? lane - delta : lane);
}

// Lane ^ lane_mask; a lane of a later segment gives the caller's own value.
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    const unsigned w = lp_host_width(width);
    const unsigned lane = lp_host_fiber->lane;
    const unsigned src = lane ^ (unsigned)lane_mask;
    return lp_host_shuffle(mask, var, (src & ~(w - 1u)) > (lane & ~(w - 1u)) ? lane : src);
}

static inline unsigned __ballot_sync(unsigned mask, int pred) {
    const uint64_t* v = lp_host_warp_exchange(mask, pred != 0);
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; ++l) {
        if (((mask & lp_host_fiber->warp_mask) >> l) & 1u) {
            ballot |= (v[l] != 0 ? 1u : 0u) << l;
        }
    }
    return ballot;
}

static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) {
    return __ballot_sync(mask, pred) == (mask & lp_host_fiber->warp_mask);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)lp_host_warp_exchange(mask, 0); }

// ------------------------------------------------------- kernel tables

template <class T>
struct LpHostArgCode {
    static constexpr char value = '?';
};
template <class T>
struct LpHostArgCode<T*> {
    static constexpr char value = 'p';
};
template <>
struct LpHostArgCode<long long> {
    static constexpr char value = 'l';
};
template <>
struct LpHostArgCode<int> {
    static constexpr char value = 'i';
};
template <>
struct LpHostArgCode<unsigned> {
    static constexpr char value = 'u';
};
template <>
struct LpHostArgCode<float> {
    static constexpr char value = 'f';
};

template <class F, F f>
struct LpHostKernel;

template <class... A, void (*f)(A...)>
struct LpHostKernel<void (*)(A...), f> {
    static constexpr char signature[sizeof...(A) + 1] = {LpHostArgCode<A>::value..., '\0'};
    template <size_t... I>
    static void call(void* const* args, std::index_sequence<I...>) {
        f(*static_cast<A*>(args[I])...);
    }
    static void run(void* const* args) { call(args, std::index_sequence_for<A...>{}); }
};

#define LP_HOST_ENTRY(NAME, FN) \
    {NAME, &LpHostKernel<decltype(&FN), &FN>::run, LpHostKernel<decltype(&FN), &FN>::signature}

#endif  // LP_HOST_H
