/*
 * traceless native CPU kernels, loaded with ctypes (no Python C API, no torch headers, so the
 * build takes a second and needs only a C compiler).
 *
 * paged_attention_*: attention for sequences with a few new query tokens (decode, speculative
 * verification), reading K/V straight out of the paged cache through the block table, so no
 * gathered copy of the context is ever made.  Long prefill chunks go through torch's SDPA.
 *
 * Cache layout per layer:
 *     k_cache[num_blocks, num_kv_heads, head_dim, block_size]   (transposed: see DEFINE_ROW)
 *     v_cache[num_blocks, num_kv_heads, block_size, head_dim]
 * in the queries' dtype, or float16 under float32 queries (_f32h: --kv-cache-dtype float16), so the
 * keys (values) of one (block, kv head) pair are one contiguous run of
 * block_size * head_dim elements.
 *
 * Queries are packed varlen:  q[num_tokens, num_heads, head_dim]; sequence b owns query rows
 * [cu_q[b], cu_q[b+1]) and has context_lens[b] keys in the cache *including* its new tokens, so
 * query row i of b (0-based inside b) sits at position p = context_lens[b] - q_len_b + i and sees
 * keys [0, p], or with a sliding window of W keys only [max(0, p - W + 1), p]: the blocks below
 * that are never read (a windowed request's early blocks may be freed: its table points them at
 * the null block).
 *
 *         keys 0 .. ctx-1 of sequence b
 *         |--------------------------------------|
 *                   |<------ W ------>|
 *                                  |--- q_len ---|   new tokens (already written to the cache)
 *         query i sees keys [lo, ctx - q_len + i], lo = 0 or p - W + 1
 *
 * softcap > 0 (Gemma 2): scores become softcap * tanh(score / softcap) before the softmax.
 * sinks (gpt-oss): one logit per query head that joins each softmax's denominator and attends to
 * nothing: p_t = exp(s_t - m) / (sum_u exp(s_u - m) + exp(sink - m)), m the max over both.
 *
 * Threads: OpenMP over (sequence, kv head) pairs.  The library links libgomp.so.1 by soname; when
 * torch is imported first, the loader reuses torch's own libgomp, so both share one pool.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "shapes.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TL_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define TL_CLONES
#endif



/* The softmax's scalar parts are compiled once, for the baseline instruction set, and never
   inlined: inside an AVX-512 or AVX2 row under -ffast-math, their sums were vectorized at that
   target's width, each in its own order, and the two paths' bits parted. */
#define SOFTMAX_ONCE __attribute__((noinline))

/* Head g's scores [lo, n_keys): softcap in place; returns their max (the sink's, if larger). */
SOFTMAX_ONCE static float softmax_max(const AttnShape *s, float *sg, int G, int g, int lo, int n_keys, int kvh) {
    if (s->softcap > 0.f) {
        const float cap = s->softcap, inv_cap = 1.f / s->softcap;
        for (int t = lo; t < n_keys; t++) sg[t] = cap * tanhf(sg[t] * inv_cap);
    }
    float m = sg[lo];
    for (int t = lo + 1; t < n_keys; t++) m = sg[t] > m ? sg[t] : m;
    const float sink = s->sinks ? s->sinks[kvh * G + g] : 0.f;
    return s->sinks && sink > m ? sink : m;
}

/* Head g's exponentials sg[lo, n_keys) (max m taken out) summed in order, with the sink's, then
   each divided by the sum. */
SOFTMAX_ONCE static void softmax_finish(const AttnShape *s, float *sg, int G, int g, int lo, int n_keys, int kvh, float m) {
    float sum = 0.f;
    for (int t = lo; t < n_keys; t++) sum += sg[t];
    if (s->sinks) sum += expf(s->sinks[kvh * G + g] - m);
    const float inv = 1.f / sum;
    for (int t = lo; t < n_keys; t++) sg[t] *= inv;
}

/* Scores [lo, n_keys) of each of the G heads of kv head kvh (rows of n_pad): softcap, then
   softmax in place (with the heads' sinks in the denominators). */
SOFTMAX_ONCE static void softmax_rows(const AttnShape *s, float *scores, int G, int g0, int g1, int n_pad, int lo, int n_keys,
                         int kvh) {
    for (int g = g0; g < g1; g++) {
        float *sg = scores + (long)g * n_pad;
        const float m = softmax_max(s, sg, G, g, lo, n_keys, kvh);
        for (int t = lo; t < n_keys; t++) sg[t] = expf(sg[t] - m);
        softmax_finish(s, sg, G, g, lo, n_keys, kvh, m);
    }
}

static inline float bf16_load(const uint16_t *p, int i) {
    uint32_t u = ((uint32_t)p[i]) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

/*
 * One query row of G heads that share kv head `kvh`.
 * K blocks are stored transposed, [head_dim][block_size], so the scores of a block's keys are a
 * sum over d of broadcast(q[d]) * krow_d: straight vector FMAs across keys, no horizontal sums.
 * V blocks are [block_size][head_dim]: the output is an axpy per key.
 * scratch: qf[G*D], tmp[max(D, BS)], acc[G*D]; scores[G][n_pad], n_pad = blocks * BS.
 */
#define DEFINE_ROW(NAME, T, TKV, LOAD, LOADKV)                                                 \
    TL_CLONES static void NAME(const AttnShape *s, const T *q_row, const TKV *k_cache,         \
                               const TKV *v_cache, const int32_t *table, int kvh, int g0,      \
                               int g1, int n_keys, int lo, float *scratch, float *scores,      \
                               T *out_row, int to_bf16)                                        \
    {                                                                                          \
        const int G = s->num_heads / s->num_kv_heads, D = s->head_dim, BS = s->block_size;     \
        const int nblk = (n_keys + BS - 1) / BS, n_pad = nblk * BS, lo_blk = lo / BS;          \
        const long blk_stride = (long)s->num_kv_heads * BS * D;                                \
        float *qf = scratch, *acc = scratch + G * D, *tmp = scratch + 2 * G * D;               \
        for (int g = g0; g < g1; g++)                                                            \
            for (int d = 0; d < D; d++)                                                        \
                qf[g * D + d] = LOAD(q_row, (kvh * G + g) * D + d) * s->scale;                 \
        for (int b = lo_blk; b < nblk; b++) {                                                  \
            const TKV *kb = k_cache + (long)table[b] * blk_stride + (long)kvh * BS * D;        \
            for (int g = g0; g < g1; g++)                                                        \
                for (int j = 0; j < BS; j++) scores[(long)g * n_pad + b * BS + j] = 0.f;       \
            for (int d = 0; d < D; d++) {                                                      \
                for (int j = 0; j < BS; j++) tmp[j] = LOADKV(kb, d * BS + j);                  \
                for (int g = g0; g < g1; g++) {                                                  \
                    float *sg = scores + (long)g * n_pad + b * BS;                             \
                    const float qd = qf[g * D + d];                                            \
                    for (int j = 0; j < BS; j++) sg[j] += qd * tmp[j];                         \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        softmax_rows(s, scores, G, g0, g1, n_pad, lo, n_keys, kvh);                                      \
        for (int i = 0; i < G * D; i++) acc[i] = 0.f;                                          \
        for (int b = lo_blk; b < nblk; b++) {                                                  \
            const TKV *vb = v_cache + (long)table[b] * blk_stride + (long)kvh * BS * D;        \
            const int n = n_keys - b * BS < BS ? n_keys - b * BS : BS;                         \
            for (int j = b == lo_blk ? lo - b * BS : 0; j < n; j++) {                          \
                for (int d = 0; d < D; d++) tmp[d] = LOADKV(vb, j * D + d);                      \
                for (int g = g0; g < g1; g++) {                                                  \
                    const float p = scores[(long)g * n_pad + b * BS + j];                      \
                    float *ag = acc + g * D;                                                   \
                    for (int d = 0; d < D; d++) ag[d] += p * tmp[d];                           \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int g = g0; g < g1; g++)                                                            \
            for (int d = 0; d < D; d++) {                                                      \
                const float x = acc[g * D + d];                                                \
                if (to_bf16)                                                                   \
                    ((uint16_t *)out_row)[(kvh * G + g) * D + d] = bf16_from_f32(x);           \
                else                                                                           \
                    ((float *)out_row)[(kvh * G + g) * D + d] = x;                             \
            }                                                                                  \
    }

#define LOAD_BF16(p, i) bf16_load((p), (i))
#define LOAD_F32(p, i) ((p)[(i)])
#define LOAD_F16(p, i) ((float)(p)[(i)])
DEFINE_ROW(row_bf16, uint16_t, uint16_t, LOAD_BF16, LOAD_BF16)
DEFINE_ROW(row_f32, float, float, LOAD_F32, LOAD_F32)
DEFINE_ROW(row_f32h, float, _Float16, LOAD_F32, LOAD_F16)


#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TL_HAVE_SIMD_PATH 1
/*
 * SIMD paths for the common shapes: block_size 16 (one zmm of keys, or two ymm), head_dim a
 * multiple of the vector width, up to DMAX. Same math as DEFINE_ROW with the accumulators in
 * registers:  scores: sacc[g] (16 keys)  +=  q[g][d] * K[d][0:16]
 *             output: acc[g][d:d+W]      +=  p[g][j] * V[j][d:d+W]
 * One body for both instruction sets (AVX-512: W = 16, prefix z; AVX2 + FMA: W = 8, prefix y):
 * every score and output element takes the same fused multiply-adds in the same order on both.
 */
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
typedef __m512 z_vec;
AVX512_TARGET static inline z_vec z_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
AVX512_TARGET static inline z_vec z_f32(const float *p) { return _mm512_loadu_ps(p); }
AVX512_TARGET static inline z_vec z_f16(const _Float16 *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
AVX512_TARGET static inline z_vec z_set1(float x) { return _mm512_set1_ps(x); }
AVX512_TARGET static inline z_vec z_fma(z_vec a, z_vec b, z_vec c) { return _mm512_fmadd_ps(a, b, c); }
AVX512_TARGET static inline void z_store(float *p, z_vec v) { _mm512_storeu_ps(p, v); }
AVX512_TARGET static inline z_vec z_sub(z_vec a, z_vec b) { return _mm512_sub_ps(a, b); }

typedef __m256 y_vec;
AVX2_TARGET static inline y_vec y_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
AVX2_TARGET static inline y_vec y_f32(const float *p) { return _mm256_loadu_ps(p); }
AVX2_TARGET static inline y_vec y_f16(const _Float16 *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
AVX2_TARGET static inline y_vec y_set1(float x) { return _mm256_set1_ps(x); }
AVX2_TARGET static inline y_vec y_fma(y_vec a, y_vec b, y_vec c) { return _mm256_fmadd_ps(a, b, c); }
AVX2_TARGET static inline void y_store(float *p, y_vec v) { _mm256_storeu_ps(p, v); }
AVX2_TARGET static inline y_vec y_sub(y_vec a, y_vec b) { return _mm256_sub_ps(a, b); }

/*
 * exp(x) for the softmax's x = score - max <= 0: 2^n p(r), n = rint(x log2 e), r = x - n ln 2 in
 * two steps, p Cephes expf's polynomial (about 1 ulp), 2^n put in the exponent. x below -87.3 is
 * taken as -87.3 (a weight under 1e-38 of the row's largest, where expf's result is subnormal).
 * The AVX-512 and AVX2 forms take the same operations lane by lane: both give the same bits.
 */
#define EXP_C1 0.693359375f
#define EXP_C2 -2.12194440e-4f
#define DEFINE_VEXP(P, TARGET, V, VI, SFX, ROUND)                                              \
    TARGET static inline V P##_exp(V x) {                                                       \
        x = _mm##SFX##_max_ps(x, _mm##SFX##_set1_ps(-87.3f));                                   \
        const V n = ROUND(_mm##SFX##_mul_ps(x, _mm##SFX##_set1_ps(1.44269504088896341f)));      \
        V r = _mm##SFX##_fmadd_ps(n, _mm##SFX##_set1_ps(-EXP_C1), x);                           \
        r = _mm##SFX##_fmadd_ps(n, _mm##SFX##_set1_ps(-EXP_C2), r);                             \
        V p = _mm##SFX##_set1_ps(1.9875691500e-4f);                                             \
        p = _mm##SFX##_fmadd_ps(p, r, _mm##SFX##_set1_ps(1.3981999507e-3f));                    \
        p = _mm##SFX##_fmadd_ps(p, r, _mm##SFX##_set1_ps(8.3334519073e-3f));                    \
        p = _mm##SFX##_fmadd_ps(p, r, _mm##SFX##_set1_ps(4.1665795894e-2f));                    \
        p = _mm##SFX##_fmadd_ps(p, r, _mm##SFX##_set1_ps(1.6666665459e-1f));                    \
        p = _mm##SFX##_fmadd_ps(p, r, _mm##SFX##_set1_ps(5.0000001201e-1f));                    \
        V y = _mm##SFX##_fmadd_ps(p, _mm##SFX##_mul_ps(r, r), r);                               \
        y = _mm##SFX##_add_ps(y, _mm##SFX##_set1_ps(1.f));                                      \
        const VI e = _mm##SFX##_slli_epi32(                                                     \
            _mm##SFX##_add_epi32(_mm##SFX##_cvtps_epi32(n), _mm##SFX##_set1_epi32(127)), 23);   \
        return _mm##SFX##_mul_ps(y, _mm##SFX##_castsi##SFX##_ps(e));                            \
    }
#define ROUND_Z(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define ROUND_Y(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
DEFINE_VEXP(z, AVX512_TARGET, __m512, __m512i, 512, ROUND_Z)
DEFINE_VEXP(y, AVX2_TARGET, __m256, __m256i, 256, ROUND_Y)

enum { DMAX = 256 }; /* the fast path's widest head */

/* The scores of NG heads gs.. of one kv head, four key blocks at a time: each K vector is loaded
 * once for all NG heads (one head at a time loaded every K vector G times: the loads, not the
 * multiply-adds, bounded it). Each score still sums its d in order from zero, as one head alone.
 * A row's last 1-3 blocks go as a group of their own count (padded to four, a prompt's early rows,
 * which see few blocks, spent a third of their multiply-adds on copies of block 0). */
#define ROW_SCORES(P, W, T, LOADV, NG)                                                         \
    {                                                                                          \
        int b = lo_blk;                                                                        \
        for (; b + 4 <= nblk; b += 4) ROW_SCORES_GROUP(P, W, T, LOADV, NG, 4)                  \
        if (nblk - b == 3) ROW_SCORES_GROUP(P, W, T, LOADV, NG, 3)                             \
        else if (nblk - b == 2) ROW_SCORES_GROUP(P, W, T, LOADV, NG, 2)                        \
        else if (nblk - b == 1) ROW_SCORES_GROUP(P, W, T, LOADV, NG, 1)                        \
    }

/* NB (a constant, 1-4) key blocks from b */
#define ROW_SCORES_GROUP(P, W, T, LOADV, NG, NB)                                               \
    {                                                                                          \
        const T *kb[NB];                                                                       \
        for (int i = 0; i < (NB); i++)                                                         \
            kb[i] = k_cache + (long)table[b + i] * blk_stride + (long)kvh * BS * D;            \
        /* Blocks sit anywhere in the pool: without prefetching, every block is a DRAM miss the \
           thread waits for. The first pass fetches the next K blocks and these V blocks, a line \
           of each among the multiply-adds of a key row (a loop of 256 prefetches ahead of them \
           filled the core's queues: nothing else ran while they drained). */                 \
        const T *pf[8];                                                                        \
        int npf = 0;                                                                           \
        if (gs == g0) {                                                                        \
            for (int i = 0; i < 4 && b + (NB) + i < nblk; i++)                                 \
                pf[npf++] = k_cache + (long)table[b + (NB) + i] * blk_stride + (long)kvh * BS * D; \
            for (int i = 0; i < (NB); i++)                                                     \
                pf[npf++] = v_cache + (long)table[b + i] * blk_stride + (long)kvh * BS * D;    \
        }                                                                                      \
        P##_vec sv[NG][NB][KV];                                                                \
        for (int g = 0; g < (NG); g++)                                                         \
            for (int i = 0; i < (NB); i++)                                                     \
                for (int h = 0; h < KV; h++) sv[g][i][h] = P##_set1(0.f);                      \
        for (int d = 0; d < D; d++) {                                                          \
            if ((d * BS * (int)sizeof(T)) % 64 == 0)                                           \
                for (int i = 0; i < npf; i++) __builtin_prefetch(pf[i] + d * BS, 0, 3);         \
            P##_vec k[NB][KV];                                                                 \
            for (int i = 0; i < (NB); i++)                                                     \
                for (int h = 0; h < KV; h++) k[i][h] = LOADV(kb[i] + d * BS + h * W);          \
            for (int g = 0; g < (NG); g++) {                                                   \
                const P##_vec q = P##_set1(qf[(gs + g) * D + d]);                              \
                for (int i = 0; i < (NB); i++)                                                 \
                    for (int h = 0; h < KV; h++) sv[g][i][h] = P##_fma(q, k[i][h], sv[g][i][h]); \
            }                                                                                  \
        }                                                                                      \
        for (int g = 0; g < (NG); g++)                                                         \
            for (int i = 0; i < (NB); i++)                                                     \
                for (int h = 0; h < KV; h++)                                                   \
                    P##_store(scores + (long)(gs + g) * n_pad + (b + i) * BS + h * W, sv[g][i][h]); \
    }

/* acc[g][0:D] = sum over the visible keys j, in order, of p[g][j] * V[j][0:D] for the NG heads
 * gs..: NC = D / W vectors a head, each V vector loaded once for all NG */
#define ROW_V(P, W, T, LOADV, NC, NG)                                                          \
    {                                                                                          \
        P##_vec a[NG][DMAX / W];                                                               \
        for (int g = 0; g < (NG); g++)                                                         \
            for (int c = 0; c < (NC); c++) a[g][c] = P##_set1(0.f);                            \
        for (int b = lo_blk; b < nblk; b++) {                                                  \
            const T *vb = v_cache + (long)table[b] * blk_stride + (long)kvh * BS * D;          \
            const int n = n_keys - b * BS < BS ? n_keys - b * BS : BS;                         \
            for (int j = b == lo_blk ? lo - b * BS : 0; j < n; j++) {                          \
                P##_vec v[DMAX / W];                                                           \
                for (int c = 0; c < (NC); c++) v[c] = LOADV(vb + j * D + c * W);               \
                for (int g = 0; g < (NG); g++) {                                               \
                    const P##_vec p = P##_set1(scores[(long)(gs + g) * n_pad + b * BS + j]);   \
                    for (int c = 0; c < (NC); c++) a[g][c] = P##_fma(p, v[c], a[g][c]);        \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int g = 0; g < (NG); g++)                                                         \
            for (int c = 0; c < (NC); c++) P##_store(acc + (gs + g) * D + c * W, a[g][c]);    \
    }

/* The heads g0..g1 of the kv head in passes of up to HG (AVX-512: 3, the register budget of three
 * heads' accumulators; AVX2's 16 registers: 1): BODY(..., NG) with the pass's head count a constant */
#define ROW_PASSES(HG, BODY, ...)                                                              \
    for (int gs = g0; gs < g1;) {                                                              \
        const int ng = g1 - gs < (HG) ? g1 - gs : (HG);                                        \
        if ((HG) >= 3 && ng == 3) { BODY(__VA_ARGS__, 3) }                                     \
        else if ((HG) >= 2 && ng == 2) { BODY(__VA_ARGS__, 2) }                                \
        else { BODY(__VA_ARGS__, 1) }                                                          \
        gs += ng;                                                                              \
    }

/* P: the vector prefix (z, y), W its floats, LOADV its load of W cache values (P##_f32, P##_bf16),
 * HG the heads of a pass */
#define DEFINE_ROW_SIMD(NAME, TARGET, P, W, T, TKV, LOADV, LOAD, HG)                           \
    TARGET static void NAME(const AttnShape *s, const T *q_row, const TKV *k_cache,            \
                            const TKV *v_cache, const int32_t *table, int kvh, int g0,           \
                            int g1, int n_keys, int lo, float *scratch, float *scores,         \
                            T *out_row, int to_bf16)                                           \
    {                                                                                          \
        enum { BS = 16, KV = BS / W }; /* KV vectors hold one key block's 16 scores */         \
        const int G = s->num_heads / s->num_kv_heads, D = s->head_dim;                         \
        const int nblk = (n_keys + BS - 1) / BS, n_pad = nblk * BS, lo_blk = lo / BS;          \
        const long blk_stride = (long)s->num_kv_heads * BS * D;                                \
        float *qf = scratch, *acc = scratch + G * D;                                           \
        /* the heads' queries and outputs are contiguous runs: vector loops (restrict, and the \
           scale out of the shape, which a float store could otherwise alias) */               \
        {                                                                                      \
            float *restrict qd = qf + g0 * D;                                                  \
            const T *restrict qs = q_row + (kvh * G + g0) * D;                                 \
            const float scale = s->scale;                                                      \
            for (int i = 0; i < (g1 - g0) * D; i++) qd[i] = LOAD(qs, i) * scale;               \
        }                                                                                      \
        ROW_PASSES(HG, ROW_SCORES, P, W, TKV, LOADV)                                           \
        /* the exponentials W at a time from the vector holding lo up to n_pad (whole blocks, every \
           score computed above; those outside [lo, n_keys) are never read) */                  \
        for (int g = g0; g < g1; g++) {                                                        \
            float *sg = scores + (long)g * n_pad;                                              \
            const float m = softmax_max(s, sg, G, g, lo, n_keys, kvh);                         \
            const P##_vec mv = P##_set1(m);                                                    \
            for (int t = lo / W * W; t < n_pad; t += W) P##_store(sg + t, P##_exp(P##_sub(P##_f32(sg + t), mv))); \
            softmax_finish(s, sg, G, g, lo, n_keys, kvh, m);                                   \
        }                                                                                      \
        /* NC a constant where D / W is 4 or 8 (the accumulators stay in registers) */           \
        if (D == 4 * W) { ROW_PASSES(HG, ROW_V, P, W, TKV, LOADV, 4) }                         \
        else if (D == 8 * W) { ROW_PASSES(HG, ROW_V, P, W, TKV, LOADV, 8) }                    \
        else for (int gs = g0; gs < g1; gs++) ROW_V(P, W, TKV, LOADV, D / W, 1)                \
        if (to_bf16)                                                                           \
            for (int i = g0 * D; i < g1 * D; i++)                                              \
                ((uint16_t *)out_row)[kvh * G * D + i] = bf16_from_f32(acc[i]);                \
        else                                                                                   \
            memcpy((float *)out_row + (kvh * G + g0) * D, acc + g0 * D, sizeof(float) * (g1 - g0) * D); \
    }

DEFINE_ROW_SIMD(row16_bf16, AVX512_TARGET, z, 16, uint16_t, uint16_t, z_bf16, LOAD_BF16, 3)
DEFINE_ROW_SIMD(row8_bf16, AVX2_TARGET, y, 8, uint16_t, uint16_t, y_bf16, LOAD_BF16, 1)
DEFINE_ROW_SIMD(row16_f32, AVX512_TARGET, z, 16, float, float, z_f32, LOAD_F32, 3)
DEFINE_ROW_SIMD(row8_f32, AVX2_TARGET, y, 8, float, float, y_f32, LOAD_F32, 1)
DEFINE_ROW_SIMD(row16_f32h, AVX512_TARGET, z, 16, float, _Float16, z_f16, LOAD_F32, 3)
DEFINE_ROW_SIMD(row8_f32h, AVX2_TARGET, y, 8, float, _Float16, y_f16, LOAD_F32, 1)

/* TRACELESS_CPU_ISA=avx2 (or "portable") makes an AVX-512 machine run the code an AVX2-only machine
 * runs, so that tests can check both paths on one machine (tests/model/layers/test_isa.py). */
static int cpu_isa_capped(void) {
    const char *cap = getenv("TRACELESS_CPU_ISA");
    return cap && (strcmp(cap, "avx2") == 0 || strcmp(cap, "portable") == 0);
}

static int cpu_has_avx512(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = !cpu_isa_capped() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    }
    return cached;
}

static int cpu_has_avx2(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        const char *cap = getenv("TRACELESS_CPU_ISA");
        cached = !(cap && strcmp(cap, "portable") == 0) && __builtin_cpu_supports("avx2") &&
                 __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return cached;
}
#endif

/* The scratch floats of one thread of a paged-attention team: per row, then scores. */
long attn_scratch_floats(const AttnShape *s) {
    const int G = s->num_heads / s->num_kv_heads, D = s->head_dim, BS = s->block_size;
    return 2L * G * D + (D > BS ? D : BS);
}

long attn_scores_floats(const AttnShape *s, const int32_t *context_lens) {
    const int G = s->num_heads / s->num_kv_heads, BS = s->block_size;
    int max_ctx = 1;
    for (int b = 0; b < s->num_seqs; b++) max_ctx = context_lens[b] > max_ctx ? context_lens[b] : max_ctx;
    return (long)G * ((max_ctx + BS - 1) / BS) * BS;
}

/* NAME_team: the (sequence, kv head) tasks as a worksharing loop over the calling team; `scratch`
 * and `scores` are the calling thread's own (attn_scratch_floats, attn_scores_floats). NAME: one
 * parallel region whose threads allocate and wipe their scratch. Returns 0 on success, 1 if
 * scratch memory could not be allocated. */
#define DEFINE_ENTRY(NAME, ROW, ROW8, ROW16, T, TKV, FN_T, TO_BF16)                                   \
    void NAME##_team(const AttnShape *s, const T *q, const TKV *k_cache, const TKV *v_cache,   \
                     const int32_t *block_tables, const int32_t *cu_q, const int32_t *context_lens, \
                     T *out, float *scratch, float *scores)                                    \
    {                                                                                          \
        const long row_stride = (long)s->num_heads * s->head_dim;                              \
        FN_T row = ROW;                                                                  \
        const int fast = simd_path(s);                                                         \
        if (fast) row = fast == 2 ? ROW16 : ROW8;                                              \
        /* Few (sequence, kv head) pairs for the team (one sequence decoding): a task per query \
           head of each, so that the threads share the work evenly. Each head's numbers are its \
           own in either case (the heads of a kv head never mix): the bits do not change. */      \
        const int G = s->num_heads / s->num_kv_heads;                                          \
        const long pairs = (long)s->num_seqs * s->num_kv_heads;                                \
        const int split = pairs < 4L * omp_get_num_threads() ? G : 1;                          \
        _Pragma("omp for schedule(dynamic, 1)")                                                \
        for (long task = 0; task < pairs * split; task++) {                                    \
            if (!scratch || !scores) continue;                                                 \
            const long pair = task / split;                                                    \
            const int g0 = (int)(task % split) * (G / split), g1 = g0 + G / split;              \
            const int b = (int)(pair / s->num_kv_heads), kvh = (int)(pair % s->num_kv_heads);  \
            const int q_len = cu_q[b + 1] - cu_q[b], ctx = context_lens[b];                    \
            const int32_t *table = block_tables + (long)b * s->max_blocks;                     \
            for (int i = 0; i < q_len; i++) {                                                  \
                const long r = cu_q[b] + i;                                                    \
                const int pos = ctx - q_len + i;                                               \
                const int lo = s->window > 0 && pos >= s->window ? pos - s->window + 1 : 0;    \
                row(s, q + r * s->q_stride, k_cache, v_cache, table, kvh, g0, g1, pos + 1, lo, \
                    scratch, scores, out + r * row_stride, TO_BF16);                           \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    int NAME(const AttnShape *s, const T *q, const TKV *k_cache, const TKV *v_cache,           \
             const int32_t *block_tables, const int32_t *cu_q, const int32_t *context_lens,    \
             T *out)                                                                           \
    {                                                                                          \
        const long n_scratch = attn_scratch_floats(s);                                         \
        const long n_scores = attn_scores_floats(s, context_lens);                             \
        int failed = 0;                                                                        \
        _Pragma("omp parallel reduction(|:failed) num_threads(tl_team_threads())")             \
        {                                                                                      \
            float *scratch = malloc(sizeof(float) * n_scratch);                                \
            float *scores = malloc(sizeof(float) * n_scores);                                  \
            failed = !scratch || !scores;                                                      \
            /* every thread runs the loop (its barrier waits for all); one without scratch */  \
            /* skips its tasks, and the call fails as a whole */                               \
            NAME##_team(s, q, k_cache, v_cache, block_tables, cu_q, context_lens, out,         \
                        failed ? NULL : scratch, failed ? NULL : scores);                      \
            /* scratch held activations derived from user data: wipe before release */     \
            if (scratch) memset(scratch, 0, sizeof(float) * n_scratch);                        \
            if (scores) memset(scores, 0, sizeof(float) * n_scores);                           \
            free(scratch);                                                                     \
            free(scores);                                                                      \
        }                                                                                      \
        return failed;                                                                         \
    }

typedef void (*row_fn_uint16_t)(const AttnShape *, const uint16_t *, const uint16_t *,
                                const uint16_t *, const int32_t *, int, int, int, int, int, float *, float *,
                                uint16_t *, int);
typedef void (*row_fn_float)(const AttnShape *, const float *, const float *, const float *,
                             const int32_t *, int, int, int, int, int, float *, float *, float *, int);
typedef void (*row_fn_f32h)(const AttnShape *, const float *, const _Float16 *, const _Float16 *,
                            const int32_t *, int, int, int, int, int, float *, float *, float *, int);

/* 2: the AVX-512 row kernel, 1: the AVX2 one, 0: the portable one */
static int simd_path(const AttnShape *s) {
#ifdef TL_HAVE_SIMD_PATH
    if (s->block_size != 16 || s->head_dim > DMAX) return 0;
    if (cpu_has_avx512() && s->head_dim % 16 == 0) return 2;
    return cpu_has_avx2() && s->head_dim % 8 == 0;
#else
    (void)s;
    return 0;
#endif
}

#ifndef TL_HAVE_SIMD_PATH
#define row16_bf16 row_bf16
#define row16_f32 row_f32
#define row8_bf16 row_bf16
#define row8_f32 row_f32
#define row16_f32h row_f32h
#define row8_f32h row_f32h
#endif

DEFINE_ENTRY(tl_paged_attention_bf16, row_bf16, row8_bf16, row16_bf16, uint16_t, uint16_t, row_fn_uint16_t, 1)
DEFINE_ENTRY(tl_paged_attention_f32, row_f32, row8_f32, row16_f32, float, float, row_fn_float, 0)
/* float32 queries and output, float16 K/V (--kv-cache-dtype float16) */
DEFINE_ENTRY(tl_paged_attention_f32h, row_f32h, row8_f32h, row16_f32h, float, _Float16, row_fn_f32h, 0)


/* ============================================================================================
 * Fused elementwise kernels for one decoder layer. Each replaces several small torch ops, whose
 * per-op overhead dominates a decode step at small batch. Math in float32, one rounding at the
 * end for bfloat16. Rows are split over OpenMP threads only when there are enough of them.
 * ============================================================================================ */

#define PAR_ROWS 8 /* below this many rows a parallel region costs more than it saves */

/* x[T][H] += delta[T][H] (if delta), then out[T][H] = x * rsqrt(mean(x^2) + eps) * w */
/* Each kernel below is a worksharing loop NAME_for, which every thread of a team runs (forward.c
 * calls it inside its one parallel region; one thread alone outside any), and NAME, its own
 * parallel region when there are enough rows. */
#define DEFINE_ADD_RMS_NORM(NAME, T, LOAD, STORE)                                              \
    void NAME##_for(T *x, const T *delta, const T *w, T *out, long rows, int H, float eps);    \
    TL_CLONES void NAME(T *x, const T *delta, const T *w, T *out, long rows, int H, float eps) \
    {                                                                                          \
        _Pragma("omp parallel if(rows >= PAR_ROWS) num_threads(tl_team_threads())")           \
        NAME##_for(x, delta, w, out, rows, H, eps);                                            \
    }                                                                                          \
    TL_CLONES void NAME##_for(T *x, const T *delta, const T *w, T *out, long rows, int H, float eps) \
    {                                                                                          \
        _Pragma("omp for schedule(static)")                                                    \
        for (long r = 0; r < rows; r++) {                                                      \
            T *xr = x + r * H;                                                                 \
            float ss = 0.f;                                                                    \
            for (int i = 0; i < H; i++) {                                                      \
                float v = LOAD(xr, i);                                                         \
                if (delta) { v += LOAD(delta + r * H, i); STORE(xr, i, v); v = LOAD(xr, i); }  \
                ss += v * v;                                                                   \
            }                                                                                  \
            const float inv = 1.f / sqrtf(ss / H + eps);                                       \
            for (int i = 0; i < H; i++) STORE(out + r * H, i, LOAD(xr, i) * inv * LOAD(w, i)); \
        }                                                                                      \
    }

/* out[T][I] = silu(gu[T][:I]) * gu[T][I:] */
#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE)                                                  \
    void NAME##_for(const T *gu, T *out, long rows, int I);                                    \
    TL_CLONES void NAME(const T *gu, T *out, long rows, int I)                                 \
    {                                                                                          \
        _Pragma("omp parallel if(rows >= PAR_ROWS) num_threads(tl_team_threads())")           \
        NAME##_for(gu, out, rows, I);                                                          \
    }                                                                                          \
    TL_CLONES void NAME##_for(const T *gu, T *out, long rows, int I)                           \
    {                                                                                          \
        _Pragma("omp for schedule(static)")                                                    \
        for (long r = 0; r < rows; r++) {                                                      \
            const T *g = gu + r * 2L * I, *u = g + I;                                          \
            for (int i = 0; i < I; i++) {                                                      \
                const float a = LOAD(g, i);                                                    \
                STORE(out + r * I, i, a / (1.f + expf(-a)) * LOAD(u, i));                      \
            }                                                                                  \
        }                                                                                      \
    }

/*
 * RoPE (rotate-half) in place on the q and k parts of qkv[T][(nh + 2 nkv) * D], then write this
 * step's k and v into the paged cache of one layer at slot (blocks[t], offsets[t]):
 *     k_cache[block][kvh][d][off]   (transposed)      v_cache[block][kvh][off][d]
 * cos/sin tables are float32 [positions][D/2].
 */


#define DEFINE_ROPE_CACHE(NAME, T, TKV, LOAD, STORE)                                           \
    void NAME##_for(const RopeShape *s, T *qkv, const float *cos_t, const float *sin_t,        \
                    const int64_t *positions, const int64_t *blocks, const int64_t *offsets,   \
                    TKV *k_cache, TKV *v_cache);                                               \
    TL_CLONES void NAME(const RopeShape *s, T *qkv, const float *cos_t, const float *sin_t,   \
                        const int64_t *positions, const int64_t *blocks,                       \
                        const int64_t *offsets, TKV *k_cache, TKV *v_cache)                    \
    {                                                                                          \
        _Pragma("omp parallel if(s->rows >= PAR_ROWS) num_threads(tl_team_threads())")        \
        NAME##_for(s, qkv, cos_t, sin_t, positions, blocks, offsets, k_cache, v_cache);        \
    }                                                                                          \
    TL_CLONES void NAME##_for(const RopeShape *s, T *qkv, const float *cos_t, const float *sin_t, \
                              const int64_t *positions, const int64_t *blocks,                 \
                              const int64_t *offsets, TKV *k_cache, TKV *v_cache)              \
    {                                                                                          \
        const int D = s->head_dim, half = D / 2, nh = s->num_heads, nkv = s->num_kv_heads;     \
        const int BS = s->block_size;                                                          \
        const long row_len = (long)(nh + 2 * nkv) * D;                                         \
        _Pragma("omp for schedule(static)")                                                    \
        for (long t = 0; t < s->rows; t++) {                                                   \
            T *row = qkv + t * row_len;                                                        \
            const float *c = cos_t + positions[t] * half, *sn = sin_t + positions[t] * half;   \
            for (int h = 0; h < nh + nkv; h++) {                                               \
                T *x = row + (long)h * D;                                                      \
                for (int i = 0; i < half; i++) {                                               \
                    const float x1 = LOAD(x, i), x2 = LOAD(x, i + half);                       \
                    STORE(x, i, x1 * c[i] - x2 * sn[i]);                                       \
                    STORE(x, i + half, x2 * c[i] + x1 * sn[i]);                                \
                }                                                                              \
            }                                                                                  \
            const long blk = blocks[t], off = offsets[t];                                      \
            for (int h = 0; h < nkv; h++) {                                                    \
                const T *k = row + (long)(nh + h) * D, *v = row + (long)(nh + nkv + h) * D;    \
                TKV *kc = k_cache + ((blk * nkv + h) * (long)D) * BS + off;                    \
                TKV *vc = v_cache + ((blk * nkv + h) * (long)BS + off) * D;                    \
                /* a float16 cache: each value rounded to nearest even (a C conversion) */       \
                for (int d = 0; d < D; d++) kc[(long)d * BS] = (TKV)k[d];                      \
                for (int d = 0; d < D; d++) vc[d] = (TKV)v[d];                                 \
            }                                                                                  \
        }                                                                                      \
    }

static inline void bf16_store(uint16_t *p, int i, float v) { p[i] = bf16_from_f32(v); }
static inline void f32_store(float *p, int i, float v) { p[i] = v; }
#define STORE_BF16(p, i, v) bf16_store((p), (i), (v))
#define STORE_F32(p, i, v) f32_store((p), (i), (v))

DEFINE_ADD_RMS_NORM(tl_add_rms_norm_bf16, uint16_t, LOAD_BF16, STORE_BF16)
DEFINE_ADD_RMS_NORM(tl_add_rms_norm_f32, float, LOAD_F32, STORE_F32)
DEFINE_SILU_MUL(tl_silu_mul_bf16, uint16_t, LOAD_BF16, STORE_BF16)
DEFINE_SILU_MUL(tl_silu_mul_f32, float, LOAD_F32, STORE_F32)
DEFINE_ROPE_CACHE(tl_rope_cache_bf16, uint16_t, uint16_t, LOAD_BF16, STORE_BF16)
DEFINE_ROPE_CACHE(tl_rope_cache_f32, float, float, LOAD_F32, STORE_F32)
DEFINE_ROPE_CACHE(tl_rope_cache_f32h, float, _Float16, LOAD_F32, STORE_F32)

/*
 * Greedy sampling's argmax of each row of x[rows][cols] (float32): torch.argmax's answer, the first
 * index of the row's largest value, the first NaN where the row has one (NaN ranks above every
 * number), 0 for a row of -inf. Lane-wise running maxima with strict > keep each lane's first
 * occurrence; the lanes' ties go to the smallest index. torch's CPU kernel compared one value at a
 * time: 2.6 ms (1.3 on two threads) for a 64 x 49152 step's logits.
 */
static long argmax_tail(const float *x, long from, long cols, float m, long best) {
    for (long j = from; j < cols; j++)
        if (x[j] > m) m = x[j], best = j;
    return best;
}

/* by the bits: under -ffast-math the compiler takes x != x to be false */
static long first_nan(const float *x, long cols) {
    for (long j = 0; j < cols; j++) {
        uint32_t u;
        memcpy(&u, x + j, sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) return j;
    }
    return -1;
}

/* the vector part's answer (its largest value `best` first seen at `i`) carried over [j, cols) */
static long argmax_finish(const float *x, long j, long cols, float best, long i) {
    const long nan = first_nan(x + j, cols - j);
    return nan >= 0 ? j + nan : argmax_tail(x, j, cols, best, i);
}

static long argmax_portable(const float *x, long cols) {
    const long nan = first_nan(x, cols);
    return nan >= 0 ? nan : argmax_tail(x, 1, cols, x[0], 0);
}

#ifdef TL_HAVE_SIMD_PATH
AVX512_TARGET static long argmax_avx512(const float *x, long cols) {
    if (cols < 16) return argmax_portable(x, cols);
    __m512 m = _mm512_loadu_ps(x);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), idx = lane;
    __mmask16 nan = _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q);
    long j = 16;
    for (; j + 16 <= cols; j += 16) {
        const __m512 v = _mm512_loadu_ps(x + j);
        lane = _mm512_add_epi32(lane, step);
        const __mmask16 gt = _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ);
        m = _mm512_mask_mov_ps(m, gt, v);
        idx = _mm512_mask_mov_epi32(idx, gt, lane);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
    if (nan) return first_nan(x, cols);
    const float best = _mm512_reduce_max_ps(m);
    const __mmask16 at = _mm512_cmp_ps_mask(m, _mm512_set1_ps(best), _CMP_EQ_OQ);
    const long i = _mm512_mask_reduce_min_epi32(at, idx);
    return argmax_finish(x, j, cols, best, i);
}

AVX2_TARGET static long argmax_avx2(const float *x, long cols) {
    if (cols < 8) return argmax_portable(x, cols);
    __m256 m = _mm256_loadu_ps(x), nan = _mm256_cmp_ps(m, m, _CMP_UNORD_Q);
    const __m256i step = _mm256_set1_epi32(8);
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = lane;
    long j = 8;
    for (; j + 8 <= cols; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        lane = _mm256_add_epi32(lane, step);
        const __m256 gt = _mm256_cmp_ps(v, m, _CMP_GT_OQ);
        m = _mm256_blendv_ps(m, v, gt);
        idx = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(idx), _mm256_castsi256_ps(lane), gt));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return first_nan(x, cols);
    float mv[8];
    int32_t iv[8];
    _mm256_storeu_ps(mv, m);
    _mm256_storeu_si256((__m256i *)iv, idx);
    float best = mv[0];
    long i = iv[0];
    for (int k = 1; k < 8; k++)
        if (mv[k] > best || (mv[k] == best && iv[k] < i)) best = mv[k], i = iv[k];
    return argmax_finish(x, j, cols, best, i);
}
#endif

void tl_argmax_f32(const float *x, long rows, long cols, int64_t *out) {
    long (*row)(const float *, long) = argmax_portable;
#ifdef TL_HAVE_SIMD_PATH
    if (cpu_has_avx512()) row = argmax_avx512;
    else if (cpu_has_avx2()) row = argmax_avx2;
#endif
    if (cols < 1) return;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * cols >= (1L << 16)) num_threads(tl_team_threads())
    for (long r = 0; r < rows; r++) out[r] = row(x + r * cols, cols);
}

/* ABI check from Python: bump when a signature or AttnShape changes. */
int tl_abi_version(void) { return 10; }

/* 1 when the AVX-512 paths run (this CPU has them and TRACELESS_CPU_ISA does not cap them). */
int tl_uses_avx512(void) {
#ifdef TL_HAVE_SIMD_PATH
    return cpu_has_avx512();
#else
    return 0;
#endif
}
