// Forward outputs from row statistics (fused and vocab-parallel forward).
//
// gidx [rows, k1] (k1 = K + 1), built by the host: slot 0 is the target
// column (-1: no tokens or an ignore_index row), slots 1..K the top-k ids
// (LP_MASKED_ID where the sampling mask disallows the id).
//
// lp_gather_*: one thread per (row, slot) copies z at that column into
// gz [rows, k1] when the column lies in this source's [col_off, col_off + cols).
// lp_finish_forward: one thread per row:
//   log_prob = (z_t - m) / T - log1p(s)        (0 on ignore_index rows)
//   entropy  = log1p(s_w) + b_w / (1 + s_w)
//   topk[k]  = (z_id - m) / T - log1p(s)       (-inf for masked ids)

template <class L>
__device__ __forceinline__ void lp_gather(const typename L::T* x, lp_i64 x_stride, int cols, int col_off,
                                          const int* gidx, int k1, int rows, int zmode, float temp_z, float* gz) {
    const lp_i64 i = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (lp_i64)rows * k1) {
        return;
    }
    const lp_i64 r = i / k1;
    const int id = gidx[i];
    const int c = id - col_off;
    if (id >= 0 && c >= 0 && c < cols) {
        gz[i] = lp_z(L::widen(x[r * x_stride + c]), zmode, temp_z);
    }
}

#define LP_GATHER(NAME, LOADER)                                                                       \
    extern "C" __global__ void NAME(const LOADER::T* x, lp_i64 x_stride, int cols, int col_off,       \
                                    const int* gidx, int k1, int rows, int zmode, float temp_z, float* gz) { \
        lp_gather<LOADER>(x, x_stride, cols, col_off, gidx, k1, rows, zmode, temp_z, gz);             \
    }

LP_GATHER(lp_gather_f32, LoadF32)
LP_GATHER(lp_gather_bf16, LoadBf16)
LP_GATHER(lp_gather_f16, LoadF16)

extern "C" __global__ void lp_finish_forward(const float* state, const float* gz, const int* gidx, int k1, int rows,
                                             float temp, int t_one, int want_lp, int want_ent, float* log_probs,
                                             float* entropy, float* topk) {
    const lp_i64 r = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const float* st = state + r * LP_STATE_WORDS;
    const float m = st[0];
    const float s = st[1];
    const lp_i64 base = r * k1;
    if (want_lp) {
        log_probs[r] = gidx[base] >= 0 ? lp_log_softmax(gz[base], m, s, temp, t_one) : 0.0f;
    }
    if (want_ent) {
        entropy[r] = lp_entropy(st[5], st[6]);
    }
    for (int k = 1; k < k1; ++k) {
        topk[r * (k1 - 1) + (k - 1)] =
            gidx[base + k] == LP_MASKED_ID ? LP_NEG_INF : lp_log_softmax(gz[base + k], m, s, temp, t_one);
    }
}
