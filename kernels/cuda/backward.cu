// Backward write pass (VJP of log_prob, entropy and top-k log-probs), one
// block per row, after the stats pass (row_stats.cu) over the same row:
//   dx_j = ( a_j (1 - p_j) - o_j p_j - h q_j (e_j + R) ) / T
// (the gradient with respect to x: dz/dx = 1/T in both temperature dtypes;
// grad_temp = T, grad_t_one = [T == 1], while temp / t_one are the shift's)
// with p = softmax(z') (masked), q = softmax(w) and e_j = (w_j - max w) / T
// the entropy's set, R = b_w / S_w, a_j the summed cotangents of the target
// and top-k slots at column j and o_j = G - a_j those of the other slots
// (G = g + sum_k G_k, host-computed in f64). This is docs/design.md's
//   dx_j = ( g (1[j=t] - p_j) + sum_k G_k (1[j=id_k] - p_j) - h q_j (e_j + R) ) / T.
// Cancellation-free at the argmax: 1 - p_idx = s / S. Entries with p_j = 0
// and q_j = 0 outside the special slots get exactly 0; padded columns 0.
//
// Generic columns (a_j = 0, o_j = G) are written first; then, after a block
// barrier, the special columns (host-deduplicated sidx [rows, k1], a in sa,
// o in so) are rewritten from z values saved in shared memory before any
// write, so x may alias out (in-place backward).
//
// Arguments: x [rows, x_stride] (logits, shard or widened chunk); cols_real
// real columns, cols_total columns to write (padding included); col_off:
// global column of local column 0; mask / zmode / temps as row_stats.cu;
// grad_temp / grad_t_one: the final division by T;
// state [rows, LP_STATE_WORDS]; same_sets: W is P (no separate entropy set);
// gsum [rows] = G, hcot [rows] = h; out [rows, out_stride].
// Dynamic shared memory: k1 floats.

__device__ __forceinline__ float lp_grad_entry(float z, bool allowed, int gcol, float a, float o, float h,
                                               LpState p, float big_s, LpState w, float big_sw, float r_w,
                                               int same_sets, float temp, int t_one, float grad_temp,
                                               int grad_t_one) {
    float prob = 0.0f;
    float one_minus = 1.0f;
    if (allowed && z != LP_NEG_INF) {
        prob = __fdiv_rn(expf(lp_shift(z, p.m, temp, t_one)), big_s);
        one_minus = gcol == p.idx ? __fdiv_rn(p.s, big_s) : __fsub_rn(1.0f, prob);
    }
    float dx = __fsub_rn(__fmul_rn(a, one_minus), __fmul_rn(o, prob));
    const bool in_w = same_sets ? allowed : true;
    if (h != 0.0f && in_w && z != LP_NEG_INF) {
        const float e = lp_shift(z, w.m, temp, t_one);
        const float q = __fdiv_rn(expf(e), big_sw);
        if (q != 0.0f) {
            dx = __fsub_rn(dx, __fmul_rn(__fmul_rn(h, q), __fadd_rn(e, r_w)));
        }
    }
    return grad_t_one ? dx : __fdiv_rn(dx, grad_temp);
}

template <class L, class O>
__device__ __forceinline__ void lp_backward(const typename L::T* x, lp_i64 x_stride, int cols_real, int cols_total,
                                            int col_off, const lp_u8* mask, lp_i64 mask_stride, int zmode,
                                            float temp_z, float temp, int t_one, float grad_temp, int grad_t_one,
                                            const float* state, int same_sets,
                                            const int* sidx, const float* sa, const float* so, int k1,
                                            const float* gsum, const float* hcot, typename O::T* out,
                                            lp_i64 out_stride) {
    extern __shared__ float saved_z[];
    const lp_i64 r = blockIdx.x;
    const typename L::T* row = x + r * x_stride;
    typename O::T* orow = out + r * out_stride;
    const lp_u8* mrow = mask ? mask + r * mask_stride : (const lp_u8*)0;
    const LpState p = lp_state_load(state + r * LP_STATE_WORDS);
    const LpState w = lp_state_load(state + r * LP_STATE_WORDS + 4);
    const float big_s = __fadd_rn(1.0f, p.s);
    const float big_sw = __fadd_rn(1.0f, w.s);
    const float r_w = __fdiv_rn(w.b, big_sw);
    const float g_all = gsum[r];
    const float h = hcot[r];
    const lp_i64 base = r * k1;
    for (int k = threadIdx.x; k < k1; k += blockDim.x) {
        const int c = sidx[base + k] - col_off;
        saved_z[k] = (sidx[base + k] >= 0 && c >= 0 && c < cols_real) ? lp_z(L::widen(row[c]), zmode, temp_z) : 0.0f;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols_total; c += blockDim.x) {
        float dx = 0.0f;
        if (c < cols_real) {
            const float z = lp_z(L::widen(row[c]), zmode, temp_z);
            const bool allowed = !mrow || mrow[c];
            dx = lp_grad_entry(z, allowed, c + col_off, 0.0f, g_all, h, p, big_s, w, big_sw, r_w, same_sets, temp,
                               t_one, grad_temp, grad_t_one);
        }
        orow[c] = O::narrow(dx);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < k1; k += blockDim.x) {
        const int c = sidx[base + k] - col_off;
        if (sidx[base + k] >= 0 && c >= 0 && c < cols_real) {
            const bool allowed = !mrow || mrow[c];
            orow[c] = O::narrow(lp_grad_entry(saved_z[k], allowed, c + col_off, sa[base + k], so[base + k], h, p,
                                              big_s, w, big_sw, r_w, same_sets, temp, t_one, grad_temp,
                                              grad_t_one));
        }
    }
}

#define LP_BACKWARD(NAME, LOADER, STORE)                                                                       \
    extern "C" __global__ void __launch_bounds__(LP_MAX_BLOCK)                                                 \
        NAME(const LOADER::T* x, lp_i64 x_stride, int cols_real, int cols_total, int col_off, const lp_u8* mask, \
             lp_i64 mask_stride, int zmode, float temp_z, float temp, int t_one, float grad_temp,               \
             int grad_t_one, const float* state, int same_sets, const int* sidx, const float* sa,               \
             const float* so, int k1, const float* gsum, const float* hcot, STORE::T* out, lp_i64 out_stride) {  \
        lp_backward<LOADER, STORE>(x, x_stride, cols_real, cols_total, col_off, mask, mask_stride, zmode,       \
                                   temp_z, temp, t_one, grad_temp, grad_t_one, state, same_sets, sidx, sa, so,  \
                                   k1, gsum, hcot, out, out_stride);                                            \
    }

// Into an f32 grad buffer.
LP_BACKWARD(lp_backward_f32_to_f32, LoadF32, StoreF32)
LP_BACKWARD(lp_backward_bf16_to_f32, LoadBf16, StoreF32)
LP_BACKWARD(lp_backward_f16_to_f32, LoadF16, StoreF32)
// In place over 16-bit logits (fused), or from a widened f32 chunk into them (chunked).
LP_BACKWARD(lp_backward_bf16_to_bf16, LoadBf16, StoreBf16)
LP_BACKWARD(lp_backward_f16_to_f16, LoadF16, StoreF16)
LP_BACKWARD(lp_backward_f32_to_bf16, LoadF32, StoreBf16)
LP_BACKWARD(lp_backward_f32_to_f16, LoadF32, StoreF16)
