// Chunked forward (the algorithm training frameworks ship): for each chunk of
// rows, widen the chunk into an f32 buffer W [chunk, V] (z of lp_z), reduce
// its rows with lp_row_stats_f32 (row_stats.cu), write the log-softmax
// buffer LS [chunk, V], then gather log-probs and top-k log-probs from LS.
// Extra memory: exactly the two [chunk, V] f32 buffers plus O(chunk) state.

// W[r, c] = lp_z(x[r, c]) for the chunk's rows and the real columns c < cols.
template <class L>
__device__ __forceinline__ void lp_widen(const typename L::T* x, lp_i64 x_stride, int rows, int cols, int zmode,
                                         float temp_z, float* w) {
    const lp_i64 total = (lp_i64)rows * cols;
    for (lp_i64 i = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (lp_i64)gridDim.x * blockDim.x) {
        const lp_i64 r = i / cols;
        const lp_i64 c = i - r * cols;
        w[i] = lp_z(L::widen(x[r * x_stride + c]), zmode, temp_z);
    }
}

#define LP_WIDEN(NAME, LOADER)                                                                           \
    extern "C" __global__ void NAME(const LOADER::T* x, lp_i64 x_stride, int rows, int cols, int zmode, \
                                    float temp_z, float* w) {                                            \
        lp_widen<LOADER>(x, x_stride, rows, cols, zmode, temp_z, w);                                     \
    }

LP_WIDEN(lp_widen_f32, LoadF32)
LP_WIDEN(lp_widen_bf16, LoadBf16)
LP_WIDEN(lp_widen_f16, LoadF16)

// One block per row: LS[r, c] = (W[r, c] - m) / T - log1p(s), -inf where the
// sampling mask disallows c.
extern "C" __global__ void lp_log_softmax_rows(const float* w, int cols, const lp_u8* mask, lp_i64 mask_stride,
                                               const float* state, float temp, int t_one, float* ls) {
    const lp_i64 r = blockIdx.x;
    const float* st = state + r * LP_STATE_WORDS;
    const float m = st[0];
    const float s = st[1];
    const float* wrow = w + r * cols;
    float* lrow = ls + r * cols;
    const lp_u8* mrow = mask ? mask + r * mask_stride : (const lp_u8*)0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        lrow[c] = (mrow && !mrow[c]) ? LP_NEG_INF : lp_log_softmax(wrow[c], m, s, temp, t_one);
    }
}

// One thread per row: log_prob = LS[r, t] (0 on ignore_index rows), entropy
// from the W statistics, topk[k] = LS[r, id_k] (-inf for masked ids).
extern "C" __global__ void lp_chunked_finish(const float* ls, int cols, const float* state, const int* gidx, int k1,
                                             int rows, int want_lp, int want_ent, float* log_probs, float* entropy,
                                             float* topk) {
    const lp_i64 r = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const float* lrow = ls + r * cols;
    const float* st = state + r * LP_STATE_WORDS;
    const lp_i64 base = r * k1;
    if (want_lp) {
        const int t = gidx[base];
        log_probs[r] = t >= 0 ? lrow[t] : 0.0f;
    }
    if (want_ent) {
        entropy[r] = lp_entropy(st[5], st[6]);
    }
    for (int k = 1; k < k1; ++k) {
        const int id = gidx[base + k];
        topk[r * (k1 - 1) + (k - 1)] = id == LP_MASKED_ID ? LP_NEG_INF : lrow[id];
    }
}
