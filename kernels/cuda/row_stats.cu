// Row statistics pass (one block per row): the online max / sum / sum e*d of
// common.cuh over the row's real columns, written as LP_STATE_WORDS floats per
// row. Used by the fused forward, the chunked forward (on the widened chunk),
// the backward's stats pass and, per shard, the vocab-parallel partials.
//
// Thread t owns tiles t, t + B, t + 2B, ... (tile i = columns 4i .. 4i + 3) and
// consumes them LP_GROUP at a time, in order; tail columns past `cols` are
// -inf. Vector loads are used when the row start is aligned, scalar loads
// otherwise: the values, and so the reduction order, are the same.
//
// Arguments: x [rows, x_stride] logits (or a shard / widened chunk); cols real
// columns (the rest of the row is padding); col_off: global column of local
// column 0 (vocab-parallel shards); mask [rows, mask_stride] bytes (1 =
// allowed) or null; zmode / temp_z: see lp_z; temp / t_one: see lp_shift;
// two_sets: 1 = also reduce the unmasked entropy set W (mask present and
// entropy over unmasked logits), 0 = W is P; state [rows, LP_STATE_WORDS].

template <class L>
__device__ __forceinline__ void lp_row_stats(const typename L::T* x, lp_i64 x_stride, int cols, int col_off,
                                             const lp_u8* mask, lp_i64 mask_stride, int zmode, float temp_z,
                                             float temp, int t_one, int two_sets, float* state) {
    __shared__ LpState red[33];
    const lp_i64 r = blockIdx.x;
    const typename L::T* row = x + r * x_stride;
    const lp_u8* mrow = mask ? mask + r * mask_stride : (const lp_u8*)0;
    const bool vec = (((unsigned long long)row) % (LP_TILE * sizeof(typename L::T))) == 0;
    const int ntiles = (cols + LP_TILE - 1) / LP_TILE;
    const int step = blockDim.x;
    LpState p = lp_state_empty();
    LpState w = lp_state_empty();
    for (int t0 = threadIdx.x; t0 < ntiles; t0 += LP_GROUP * step) {
        float v[LP_GROUP_ELEMS];
        int col[LP_GROUP];
#pragma unroll
        for (int g = 0; g < LP_GROUP; ++g) {
            const int t = t0 + g * step;
            const int c0 = t * LP_TILE;
            col[g] = c0 + col_off;
            if (t < ntiles && vec && c0 + LP_TILE <= cols) {
                L::tile(row + c0, v + g * LP_TILE);
            } else {
#pragma unroll
                for (int e = 0; e < LP_TILE; ++e) {
                    v[g * LP_TILE + e] = (t < ntiles && c0 + e < cols) ? L::widen(row[c0 + e]) : LP_NEG_INF;
                }
            }
        }
        if (zmode != 0) {
#pragma unroll
            for (int k = 0; k < LP_GROUP_ELEMS; ++k) {
                v[k] = lp_z(v[k], zmode, temp_z);
            }
        }
        if (mrow) {
            float vp[LP_GROUP_ELEMS];
#pragma unroll
            for (int k = 0; k < LP_GROUP_ELEMS; ++k) {
                const int c = col[k / LP_TILE] - col_off + (k % LP_TILE);
                vp[k] = (c < cols && mrow[c]) ? v[k] : LP_NEG_INF;
            }
            lp_update(p, vp, col, temp, t_one);
            if (two_sets) {
                lp_update(w, v, col, temp, t_one);
            }
        } else {
            lp_update(p, v, col, temp, t_one);
        }
    }
    p = lp_block_reduce(p, red, temp, t_one);
    if (two_sets) {
        w = lp_block_reduce(w, red, temp, t_one);
    } else {
        w = p;
    }
    if (threadIdx.x == 0) {
        lp_state_store(state + r * LP_STATE_WORDS, p, w);
    }
}

#define LP_ROW_STATS(NAME, LOADER)                                                                          \
    extern "C" __global__ void __launch_bounds__(LP_MAX_BLOCK)                                              \
        NAME(const LOADER::T* x, lp_i64 x_stride, int cols, int col_off, const lp_u8* mask,                 \
             lp_i64 mask_stride, int zmode, float temp_z, float temp, int t_one, int two_sets, float* state) { \
        lp_row_stats<LOADER>(x, x_stride, cols, col_off, mask, mask_stride, zmode, temp_z, temp, t_one,      \
                             two_sets, state);                                                               \
    }

LP_ROW_STATS(lp_row_stats_f32, LoadF32)
LP_ROW_STATS(lp_row_stats_bf16, LoadBf16)
LP_ROW_STATS(lp_row_stats_f16, LoadF16)
