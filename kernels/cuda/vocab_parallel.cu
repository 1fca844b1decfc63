// Vocab-parallel merge: each shard's lp_row_stats_* (row_stats.cu, with the
// shard's col_off) leaves partial states in parts [shards, rows,
// LP_STATE_WORDS]; one thread per row merges them, as an all-reduce would, in
// a fixed pairwise tree over the shard index (ceil(log2 shards) levels),
// in place, and writes the row's state to state [rows, LP_STATE_WORDS].
// All-padding or all-masked shards are empty states (-inf, 0, 0) and merge
// exactly, never into NaN.
extern "C" __global__ void lp_merge_shards(float* parts, int shards, int rows, float temp, int t_one, float* state) {
    const lp_i64 r = (lp_i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) {
        return;
    }
    const lp_i64 shard_words = (lp_i64)rows * LP_STATE_WORDS;
    for (int set = 0; set < 2; ++set) {
        for (int stride = 1; stride < shards; stride *= 2) {
            for (int i = 0; i + stride < shards; i += 2 * stride) {
                float* a = parts + i * shard_words + r * LP_STATE_WORDS + set * 4;
                const float* b = parts + (i + stride) * shard_words + r * LP_STATE_WORDS + set * 4;
                const LpState m = lp_merge(lp_state_load(a), lp_state_load(b), temp, t_one);
                a[0] = m.m;
                a[1] = m.s;
                a[2] = m.b;
                a[3] = __int_as_float(m.idx);
            }
        }
    }
    const float* root = parts + r * LP_STATE_WORDS;
    for (int k = 0; k < LP_STATE_WORDS; ++k) {
        state[r * LP_STATE_WORDS + k] = root[k];
    }
}
