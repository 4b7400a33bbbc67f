/*
 * Matmuls against weights kept in GGML's quantized block formats (the bytes of a GGUF file, as
 * they are), y[T][N] = x[T][K] W[N][K]^T (+ bias), and row gathers (the embedding).
 *
 * The activations are quantized per block of 32 to int8 (d = max|x| / 127, q = round(x / d)), and
 * every weight block is dotted with its activation block in integers:
 *
 *     Q8_0   d_w q_w             sum = d_w d_a (q_w . q_a)
 *     Q4_0   d_w (q_w - 8)       sum = d_w d_a (q_w . q_a) - 8 d_w d_a sum(q_a)
 *     Q4_1   d_w q_w + m_w       sum = d_w d_a (q_w . q_a) + m_w d_a sum(q_a)
 *     Q4_K   per 32: (d sc) q - dmin m,          as Q4_1 with 6-bit scales and mins
 *     Q5_K   as Q4_K with a fifth bit
 *     Q6_K   per 16: (d sc) (q - 32), q in 0..63, sc int8
 *
 * Weights are unsigned (4, 5, 6 bits) except Q8_0; u8 x s8 products map onto one instruction:
 * AVX-512 VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd (no overflow: |u| <= 128, |s| <= 127).
 * For Q8_0, |w| and sign(w) * a make the pair unsigned x signed. All three ISA paths use the same
 * blocking and the same float order per block; the portable one is plain C.
 *
 * Row-split Q4_0/Q4_1 (the built-in model's weights) run 16 blocks at a time: weights and
 * activations are interleaved so that 32-bit lane j of a vector holds 4 bytes of block j, and the
 * integer dot products of 16 blocks accumulate in 16 lanes without a float step in between (one
 * scale multiply-add per 16 blocks). A register tile of NR weight rows by up to TILE activation
 * rows reuses every unpacked weight vector TILE times and every activation vector NR times: one
 * kernel for decoding (1 row) and for prefill and batches (many rows), no dequantized copy.
 *
 * Batch invariance: a row's result never depends on how many rows share the call or where the row
 * sits among them. Each (weight row, activation row) pair has its own accumulators; integer sums
 * are exact, and the float steps per pair run in one fixed order whatever the tile. This file is
 * compiled without reassociation (the pragma below), so the compiler keeps that order too.
 *
 * Threads: OpenMP over chunks of weight rows (every thread reads its own weights once); every
 * chunk runs all activation rows, TILE at a time. The library shares torch's libgomp, hence
 * torch's thread count, so the two pools never oversubscribe the cores.
 *
 * The quantized activations derive from user data: they live in one scratch allocation per call,
 * wiped before it is freed.
 */
#pragma GCC optimize("no-associative-math")

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "shapes.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TL_X86 1
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TL_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define TL_CLONES
#endif

/* F_Q4_0R / F_Q4_1R / F_Q8_0R: the same blocks regrouped per row (see the row-split layouts below) */
enum { F_Q8_0 = 0, F_Q4_0 = 1, F_Q4_1 = 2, F_Q4_K = 3, F_Q5_K = 4, F_Q6_K = 5, F_Q4_0R = 6, F_Q4_1R = 7, F_Q8_0R = 8 };
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
enum { QB = 32, QK_K = 256, TILE = 4, ROW_CHUNK = 16, X16 = 16, NR = 4, PREFETCH_BYTES = 8192, T_BLOCK = 64 };



/*
 * Quantized activations, rows padded to whole groups of 16 blocks (ld = nb rounded up to 16; the
 * padding is zero): scale d[t*ld + b], ds[t*ld + b] = d * sum(q of the block),
 * s16[(t*ld + b)*2 + h] = sum(q of half h); codes q[t*32*ld ..], in one of two layouts:
 *     natural  block b's 32 values at 32b
 *     x16      (row-split Q4 on SIMD) value i of block b = 16g + j of a whole group of 16 at
 *              512g + 64(i / 4) + 4j + i % 4: 64-byte chunk k of the group holds values 4k..4k+3
 *              of its 16 blocks, lane j = block j. The blocks of a last partial group (an even
 *              number) go in pairs: value i of its block 2p + e at 64p + 32(i / 16) + 16e + i % 16,
 *              [2p: 0-15 | 2p+1: 0-15 | 2p: 16-31 | 2p+1: 16-31], the order of the pair's nibbles
 *              (ACT_X16_PAIRS, row-split Q4); for row-split Q8_0 they stay natural (ACT_X16)
 */
typedef struct {
    int8_t *q;
    float *d, *ds;
    int32_t *s16;
    long K, nb, ld;
    int x16;
    int avx512; /* quantized by the AVX-512 path (the call's instruction set) */
} Act;

/* Act.x16: which layout the codes take (the row-split Q4 tail reads pairs, Q8_0's whole blocks) */
enum { ACT_NATURAL = 0, ACT_X16_PAIRS = 1, ACT_X16 = 2 };

static inline long act_pos(int x16, long nb, long b, int i) {
    const long b0 = b / X16 * X16, j = b - b0;
    if (!x16) return b * QB + i;
    if (b0 + X16 <= nb) return b0 * QB + (i / 4) * 64 + j * 4 + i % 4;
    if (x16 == ACT_X16) return b * QB + i;
    return b0 * QB + (j / 2) * 64 + (i / 16) * 32 + (j % 2) * 16 + i % 16;
}

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0x1f) u = sign | 0x7f800000u | (man << 13);
    else if (exp != 0) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (man == 0) u = sign;
    else { /* subnormal: renormalize */
        int e = -1;
        uint32_t m = man;
        do { e++; m <<= 1; } while (!(m & 0x400));
        u = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float rd_f16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Q4_K / Q5_K: 8 six-bit scales and mins from the 12 packed bytes (see ggml_blocks.py). */
static inline void scale_min_k4(const uint8_t *p, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        mn[j] = p[j + 4] & 63;
        sc[j + 4] = (p[j + 8] & 0xF) | ((p[j] >> 6) << 4);
        mn[j + 4] = (p[j + 8] >> 4) | ((p[j + 4] >> 6) << 4);
    }
}

/* ---- activation quantization ---------------------------------------------------------------- */

static void quantize_row(const float *x, long K, int x16, int8_t *q, float *d, float *ds, int32_t *s16) {
    for (long b = 0; b < K / QB; b++) {
        const float *xb = x + b * QB;
        float amax = 0.f;
        for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float db = amax / 127.f, id = db > 0.f ? 1.f / db : 0.f;
        int32_t s[2] = {0, 0};
        for (int i = 0; i < QB; i++) {
            const int v = (int)lrintf(xb[i] * id);
            q[act_pos(x16, K / QB, b, i)] = (int8_t)v;
            s[i >> 4] += v;
        }
        d[b] = db;
        ds[b] = db * (float)(s[0] + s[1]);
        s16[2 * b] = s[0];
        s16[2 * b + 1] = s[1];
    }
}

static int cpu_max_isa(void);
#ifdef TL_X86
static void quantize_row_avx2(const float *x, long K, int x16, int8_t *q, float *d, float *ds, int32_t *s16,
                              long b_from);
static void quantize_row_avx512(const float *x, long K, int x16, int8_t *q, float *d, float *ds, int32_t *s16);
#endif

/* tmp: one K-float row per thread (bf16 inputs are widened there first). A worksharing loop over
 * the rows: every thread of the calling team runs it (one thread outside a parallel region), and
 * it ends in the team's barrier. The padding blocks of each row [nb, ld) are zeroed here, so that a
 * scratch reused from a call with other shapes reads as a fresh one. */
static void quantize_acts_for(const void *x, int x_bf16, long T, const Act *a, float *tmp_rows) {
    const long K = a->K, ld = a->ld, nb = a->nb;
#pragma omp for schedule(static)
    for (long t = 0; t < T; t++) {
        const float *row = (const float *)x + t * K;
        if (x_bf16) {
            float *tmp = tmp_rows + (long)omp_get_thread_num() * K;
            const uint16_t *xr = (const uint16_t *)x + t * K;
            for (long i = 0; i < K; i++) tmp[i] = bf16_to_f32(xr[i]);
            row = tmp;
        }
        int8_t *q = a->q + t * ld * QB;
        float *d = a->d + t * ld, *ds = a->ds + t * ld;
        int32_t *s16 = a->s16 + t * ld * 2;
#ifdef TL_X86
        if (a->avx512 && a->x16) quantize_row_avx512(row, K, a->x16, q, d, ds, s16);
        else if (cpu_max_isa() >= ISA_AVX2) quantize_row_avx2(row, K, a->x16, q, d, ds, s16, 0);
        else
#endif
            quantize_row(row, K, a->x16, q, d, ds, s16);
        memset(q + nb * QB, 0, (size_t)(ld - nb) * QB);
        memset(d + nb, 0, sizeof(float) * (size_t)(ld - nb));
        memset(ds + nb, 0, sizeof(float) * (size_t)(ld - nb));
        memset(s16 + nb * 2, 0, sizeof(int32_t) * 2 * (size_t)(ld - nb));
    }
}

static void quantize_acts(const void *x, int x_bf16, long T, const Act *a, float *tmp_rows, int threads) {
#pragma omp parallel if (T >= 8) num_threads(threads)
    quantize_acts_for(x, x_bf16, T, a, tmp_rows);
}

/* ---- one 32-value block of a weight row, unpacked (portable path and the embedding) ---------- */

/* value_i = scale * u_i + m  (Q8_0: scale * (int8)u_i;  Q6_K: d * sc[i / 16] * (u_i - 32)) */
typedef struct {
    uint8_t u[QB];
    float scale, m;
    int8_t sc[2];
} Blk;

/*
 * Row-split Q4_0/Q4_1 (the layout the kernels read fastest; same bytes as the GGML blocks, no
 * value changes): a row of nb blocks is [nb x 16 code bytes][nb x f16 d][nb x f16 m (Q4_1)].
 * The code bytes of whole groups of 16 blocks are interleaved: code byte i of block 16g + j sits
 * at 256g + 64 (i / 4) + 4j + i % 4, so one 64-byte load holds bytes 4c..4c+3 of every block of
 * the group, lane j = block j (low nibbles: values 4c..4c+3, high nibbles: values 16+4c..16+4c+3).
 * The blocks after the last whole group (an even number, fewer than 16) keep 16 bytes each at 16b.
 * 16 scales convert in one instruction.
 */
static inline const uint8_t *rs_group(const uint8_t *row, long b0) { return row + b0 * 16; }
static inline void rs_codes(const uint8_t *row, long nb, long b, uint8_t qs[16]) {
    const long b0 = b / X16 * X16;
    const int j = (int)(b - b0);
    if (b0 + X16 > nb) {
        memcpy(qs, row + 16 * b, 16);
        return;
    }
    for (int c = 0; c < 4; c++) memcpy(qs + 4 * c, rs_group(row, b0) + 64 * c + 4 * j, 4);
}
static inline const uint8_t *rs_d(const uint8_t *row, long nb, long b) { return row + nb * 16 + 2 * b; }
static inline const uint8_t *rs_m(const uint8_t *row, long nb, long b) { return row + nb * 18 + 2 * b; }

/*
 * Row-split Q8_0 (F_Q8_0R; same size as Q8_0): a row of nb blocks is [nb x 32 code bytes][nb x f16 d].
 * A code is stored as w + 128 (w ^ 0x80): unsigned, VNNI's u8 x s8 product takes it as it is and
 * the kernel subtracts 128 sum(q_a), exact in integers. The codes of whole groups of 16 blocks are
 * interleaved as the x16 activations are (act_pos): code i of block 16g + j at
 * 512g + 64 (i / 4) + 4j + i % 4, so that one 64-byte load of weights and one of activations pair
 * lane j with lane j. The blocks after the last whole group (any number below 16) keep 32 bytes
 * each at 32b.
 */
static inline void r8_codes(const uint8_t *row, long nb, long b, uint8_t w[QB]) {
    const long b0 = b / X16 * X16;
    if (b0 + X16 > nb) memcpy(w, row + QB * b, QB);
    else
        for (int c = 0; c < 8; c++) memcpy(w + 4 * c, row + QB * b0 + 64 * c + 4 * (b - b0), 4);
    for (int i = 0; i < QB; i++) w[i] ^= 0x80; /* the int8 code's bits */
}
static inline const uint8_t *r8_d(const uint8_t *row, long nb, long b) { return row + nb * QB + 2 * b; }

static void get_block_nb(int fmt, const uint8_t *w, long b, long nb, Blk *o);

/* nb: blocks per row, needed by the row-split formats only */
static void get_block_nb(int fmt, const uint8_t *w, long b, long nb, Blk *o) {
    o->m = 0.f;
    if (fmt == F_Q8_0R) {
        r8_codes(w, nb, b, o->u);
        o->scale = rd_f16(r8_d(w, nb, b));
    } else if (fmt == F_Q4_0R || fmt == F_Q4_1R) {
        uint8_t qs[16];
        rs_codes(w, nb, b, qs);
        for (int i = 0; i < 16; i++) {
            o->u[i] = qs[i] & 0xF;
            o->u[i + 16] = qs[i] >> 4;
        }
        o->scale = rd_f16(rs_d(w, nb, b));
        o->m = fmt == F_Q4_0R ? -8.f * o->scale : rd_f16(rs_m(w, nb, b));
    } else if (fmt == F_Q8_0) {
        const uint8_t *blk = w + b * 34;
        memcpy(o->u, blk + 2, QB);
        o->scale = rd_f16(blk);
    } else if (fmt == F_Q4_0 || fmt == F_Q4_1) {
        const int q0 = fmt == F_Q4_0 ? 2 : 4;
        const uint8_t *blk = w + b * (fmt == F_Q4_0 ? 18 : 20);
        for (int i = 0; i < 16; i++) {
            o->u[i] = blk[q0 + i] & 0xF;
            o->u[i + 16] = blk[q0 + i] >> 4;
        }
        o->scale = rd_f16(blk);
        o->m = fmt == F_Q4_0 ? -8.f * o->scale : rd_f16(blk + 2);
    } else if (fmt == F_Q4_K || fmt == F_Q5_K) {
        const int j = (int)(b % 8);
        const uint8_t *blk = w + (b / 8) * (fmt == F_Q4_K ? 144 : 176);
        const uint8_t *qs = blk + (fmt == F_Q4_K ? 16 : 48) + (j / 2) * 32;
        uint8_t sc[8], mn[8];
        scale_min_k4(blk + 4, sc, mn);
        for (int i = 0; i < QB; i++) {
            o->u[i] = (j & 1) ? qs[i] >> 4 : qs[i] & 0xF;
            if (fmt == F_Q5_K) o->u[i] |= ((blk[16 + i] >> j) & 1) << 4;
        }
        o->scale = rd_f16(blk) * (float)sc[j];
        o->m = -(rd_f16(blk + 2) * (float)mn[j]);
    } else { /* F_Q6_K: half h = j / 4 of 128 values, chunk k = j % 4 of 32 */
        const int j = (int)(b % 8), h = j / 4, k = j % 4;
        const uint8_t *blk = w + (b / 8) * 210, *ql = blk + 64 * h + (k & 1) * 32, *qh = blk + 128 + 32 * h;
        for (int i = 0; i < QB; i++)
            o->u[i] = (uint8_t)(((k & 2) ? ql[i] >> 4 : ql[i] & 0xF) | (((qh[i] >> (2 * k)) & 3) << 4));
        o->scale = rd_f16(blk + 208);
        o->sc[0] = (int8_t)blk[192 + 2 * j];
        o->sc[1] = (int8_t)blk[192 + 2 * j + 1];
    }
}

/* Row dot products with nt activation rows: out[t] = sum over blocks. */
typedef void (*dot_fn)(int fmt, const uint8_t *w, const Act *a, long t0, int nt, float *out);

static void dot_portable(int fmt, const uint8_t *w, const Act *a, long t0, int nt, float *out) {
    for (int t = 0; t < nt; t++) out[t] = 0.f;
    for (long b = 0; b < a->nb; b++) {
        Blk k;
        get_block_nb(fmt, w, b, a->nb, &k);
        for (int t = 0; t < nt; t++) {
            const long ab = (t0 + t) * a->ld + b;
            const int8_t *q = a->q + (t0 + t) * a->ld * QB + b * QB;
            int32_t i0 = 0, i1 = 0;
            if (fmt == F_Q8_0 || fmt == F_Q8_0R) {
                for (int i = 0; i < QB; i++) i0 += (int32_t)(int8_t)k.u[i] * q[i];
                out[t] += k.scale * a->d[ab] * (float)i0;
                continue;
            }
            for (int i = 0; i < 16; i++) i0 += (int32_t)k.u[i] * q[i];
            for (int i = 16; i < QB; i++) i1 += (int32_t)k.u[i] * q[i];
            if (fmt == F_Q6_K)
                out[t] += k.scale * a->d[ab] *
                          (float)(k.sc[0] * (i0 - 32 * a->s16[2 * ab]) + k.sc[1] * (i1 - 32 * a->s16[2 * ab + 1]));
            else
                out[t] += k.scale * a->d[ab] * (float)(i0 + i1) + k.m * a->ds[ab];
        }
    }
}

#ifdef TL_X86
/* ---- SIMD paths: one macro body, two instruction sets -------------------------------------- */

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define VNNI_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* 8 int32 lanes, lane i = sum of u[4i..4i+3] * s[4i..4i+3] (u unsigned, s signed) */
AVX2_TARGET static inline __m256i dot_us_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
VNNI_TARGET static inline __m256i dot_us_vnni(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

AVX2_TARGET static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* quantize_row with 8 lanes, to the same bits: the block maximum is exact in any order, x * id is
 * one rounding either way, and vcvtps2dq rounds as lrintf does (to nearest even) */
AVX2_TARGET static void quantize_row_avx2(const float *x, long K, int x16, int8_t *q, float *d, float *ds,
                                          int32_t *s16, long b_from) {
    const long nb = K / QB;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (long b = b_from; b < nb; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + b * QB + 8 * i);
            m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
        const float db = amax / 127.f, id = db > 0.f ? 1.f / db : 0.f;
        __m256i qi[4];
        for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
        int32_t s[2];
        for (int h = 0; h < 2; h++) {
            const __m256i sv = _mm256_add_epi32(qi[2 * h], qi[2 * h + 1]);
            __m128i x4 = _mm_add_epi32(_mm256_castsi256_si128(sv), _mm256_extracti128_si256(sv, 1));
            x4 = _mm_add_epi32(x4, _mm_shuffle_epi32(x4, 0x4E));
            s[h] = _mm_cvtsi128_si32(_mm_add_epi32(x4, _mm_shuffle_epi32(x4, 0xB1)));
        }
        /* |q| <= 127: the packs do not saturate; the permute undoes their lane interleave */
        const __m256i p8 = _mm256_permutevar8x32_epi32(
            _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3])), order);
        const long b0 = b / X16 * X16, j = b - b0;
        if (!x16 || (x16 == ACT_X16 && b0 + X16 > nb)) {
            _mm256_storeu_si256((__m256i *)(q + b * QB), p8);
        } else if (b0 + X16 <= nb) { /* value 4k..4k+3 at 64k + 4j */
            int32_t w4[8];
            _mm256_storeu_si256((__m256i *)w4, p8);
            for (int k = 0; k < 8; k++) memcpy(q + b0 * QB + 64 * k + 4 * j, &w4[k], 4);
        } else { /* a pair: values 0-15 at 16 (j % 2), 16-31 32 bytes on */
            int8_t *o = q + b0 * QB + (j / 2) * 64 + (j % 2) * 16;
            _mm_storeu_si128((__m128i *)o, _mm256_castsi256_si128(p8));
            _mm_storeu_si128((__m128i *)(o + 32), _mm256_extracti128_si256(p8, 1));
        }
        d[b] = db;
        ds[b] = db * (float)(s[0] + s[1]);
        s16[2 * b] = s[0];
        s16[2 * b + 1] = s[1];
    }
}

/*
 * quantize_row_avx2's numbers (the same operations per value: |x| max, d = amax / 127, id = 1 / d,
 * codes rounded to nearest even), 16 blocks at a time for the x16 layouts' whole groups: a block's
 * 32 codes, 8 words, were 8 scattered 4-byte stores (most of the quantizer's time); here the 16
 * blocks' words are transposed in registers to the group's 8 vectors, lane j = block j, and its
 * half sums come from those vectors (one VNNI step a word). The blocks after the last whole group
 * go through quantize_row_avx2.
 */
VNNI_TARGET static void quantize_group_avx512(const float *x, int8_t *q, float *d, float *ds, int32_t *s16) {
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    float amax[X16];
    for (int j = 0; j < X16; j++) {
        const __m512 v0 = _mm512_and_ps(_mm512_loadu_ps(x + j * QB), abs_mask);
        const __m512 v1 = _mm512_and_ps(_mm512_loadu_ps(x + j * QB + 16), abs_mask);
        amax[j] = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1));
    }
    const __m512 db = _mm512_div_ps(_mm512_loadu_ps(amax), _mm512_set1_ps(127.f));
    float id[X16];
    _mm512_storeu_ps(id, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(db, _mm512_setzero_ps(), _CMP_GT_OQ),
                                             _mm512_set1_ps(1.f), db));
    __m512i z[X16 / 2]; /* blocks 2i (words 0-7: lanes 0-7) and 2i + 1 (lanes 8-15) */
    for (int i = 0; i < X16 / 2; i++) {
        __m256i row[2];
        for (int k = 0; k < 2; k++) {
            const int j = 2 * i + k;
            const __m512 s = _mm512_set1_ps(id[j]);
            const __m128i lo = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j * QB), s)));
            const __m128i hi =
                _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + j * QB + 16), s)));
            row[k] = _mm256_set_m128i(hi, lo); /* |code| <= 127: the narrowing keeps it */
        }
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(row[0]), row[1], 1);
    }
    /* quad m (blocks 4m..4m+3): a[m] lane 4w + r = block 4m + r's word w, b[m] its word w + 4 */
    const __m512i ia = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(4));
    __m512i a[4], b[4];
    for (int m = 0; m < 4; m++) {
        a[m] = _mm512_permutex2var_epi32(z[2 * m], ia, z[2 * m + 1]);
        b[m] = _mm512_permutex2var_epi32(z[2 * m], ib, z[2 * m + 1]);
    }
    /* word k of the 16 blocks: 128-bit chunk k of a[0..3] (b for k >= 4), a 4 x 4 chunk transpose */
    __m512i c[8];
    for (int h = 0; h < 2; h++) {
        const __m512i *src = h ? b : a;
        const __m512i t0 = _mm512_shuffle_i32x4(src[0], src[1], 0x44), t1 = _mm512_shuffle_i32x4(src[0], src[1], 0xEE);
        const __m512i t2 = _mm512_shuffle_i32x4(src[2], src[3], 0x44), t3 = _mm512_shuffle_i32x4(src[2], src[3], 0xEE);
        c[4 * h + 0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
        c[4 * h + 1] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
        c[4 * h + 2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
        c[4 * h + 3] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
    }
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i half[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int k = 0; k < 8; k++) {
        _mm512_storeu_si512((void *)(q + 64 * k), c[k]);
        half[k / 4] = _mm512_dpbusd_epi32(half[k / 4], ones, c[k]); /* values 0-15, 16-31 */
    }
    _mm512_storeu_ps(d, db);
    _mm512_storeu_ps(ds, _mm512_mul_ps(db, _mm512_cvtepi32_ps(_mm512_add_epi32(half[0], half[1]))));
    /* s16[2j + h]: interleave the halves, then put the 128-bit chunks in block order */
    const __m512i lo = _mm512_unpacklo_epi32(half[0], half[1]), hi = _mm512_unpackhi_epi32(half[0], half[1]);
    const __m512i s0 = _mm512_shuffle_i32x4(lo, hi, 0x44), s1 = _mm512_shuffle_i32x4(lo, hi, 0xEE);
    _mm512_storeu_si512((void *)s16, _mm512_shuffle_i32x4(s0, s0, 0xD8));
    _mm512_storeu_si512((void *)(s16 + 16), _mm512_shuffle_i32x4(s1, s1, 0xD8));
}

VNNI_TARGET static void quantize_row_avx512(const float *x, long K, int x16, int8_t *q, float *d, float *ds,
                                            int32_t *s16) {
    const long nb = K / QB;
    long b0 = 0;
    for (; b0 + X16 <= nb; b0 += X16) quantize_group_avx512(x + b0 * QB, q + b0 * QB, d + b0, ds + b0, s16 + 2 * b0);
    if (b0 < nb) quantize_row_avx2(x, K, x16, q, d, ds, s16, b0);
}

AVX2_TARGET static inline float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 32 nibbles of 16 bytes: [low nibbles (values 0..15) | high nibbles (values 16..31)] */
AVX2_TARGET static inline __m256i nibbles16(const uint8_t *p) {
    const __m128i x = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

AVX2_TARGET static inline __m256i lo4(__m256i x) { return _mm256_and_si256(x, _mm256_set1_epi8(0x0F)); }
AVX2_TARGET static inline __m256i hi4(__m256i x) {
    return _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F));
}
/* per byte: ((x >> n) & mask) << up */
AVX2_TARGET static inline __m256i bits_at(__m256i x, int n, int mask, int up) {
    const __m256i v = _mm256_and_si256(_mm256_srl_epi16(x, _mm_cvtsi32_si128(n)), _mm256_set1_epi8((char)mask));
    return _mm256_sll_epi16(v, _mm_cvtsi32_si128(up));
}

#define LD_ACT(t, b) _mm256_loadu_si256((const __m256i *)(a->q + ((t0 + (t)) * a->ld + (b)) * QB))
#define ACT(arr, t, b) (a->arr[(t0 + (t)) * a->ld + (b)])

/*
 * The block loops below are written once for a compile-time tile of NT activation rows (the
 * dispatcher instantiates NT = 1..TILE), so the accumulators stay in registers. Blocks alternate
 * between two accumulator sets (P = b & 1): two independent add chains instead of one.
 *     acc[P][t]  += I(u . act(t, b)) * (scale * d_a)      8 float lanes
 *     accm[P][t] += m * ds_a                               the offset term, scalar
 */
#define BLOCK_Q(DOT, u, b, scale, m)                                                           \
    for (int t = 0; t < NT; t++) {                                                             \
        const __m256i I = DOT((u), LD_ACT(t, (b)));                                            \
        acc[(b) & 1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps((scale) * ACT(d, t, (b))), \
                                          acc[(b) & 1][t]);                                    \
        accm[(b) & 1][t] += (m) * ACT(ds, t, (b));                                             \
    }

#define BODY_Q8_0(DOT)                                                                         \
    for (long b = 0; b < nb; b++) {                                                            \
        const uint8_t *blk = w + b * 34;                                                       \
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 2));                      \
        const __m256i u = _mm256_sign_epi8(q, q); /* |w|, paired with sign(w) * a */           \
        const float d = ld_f16(blk);                                                           \
        for (int t = 0; t < NT; t++) {                                                         \
            const __m256i I = DOT(u, _mm256_sign_epi8(LD_ACT(t, b), q));                       \
            acc[b & 1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(d * ACT(d, t, b)), acc[b & 1][t]); \
        }                                                                                      \
    }

#define BODY_Q4(DOT)                                                                           \
    const int sz = fmt == F_Q4_0 ? 18 : 20;                                                    \
    for (long b = 0; b < nb; b++) {                                                            \
        const uint8_t *blk = w + b * sz;                                                       \
        const float d = ld_f16(blk), m = fmt == F_Q4_0 ? -8.f * d : ld_f16(blk + 2);          \
        const __m256i u = nibbles16(blk + sz - 16);                                            \
        BLOCK_Q(DOT, u, b, d, m)                                                               \
    }

#define BODY_K45(DOT)                                                                          \
    const int sz = fmt == F_Q4_K ? 144 : 176, q0 = fmt == F_Q4_K ? 16 : 48;                    \
    for (long sb = 0; sb < nb / 8; sb++) {                                                     \
        const uint8_t *blk = w + sb * sz;                                                      \
        uint8_t sc[8], mn[8];                                                                  \
        scale_min_k4(blk + 4, sc, mn);                                                         \
        const float d = ld_f16(blk), dmin = ld_f16(blk + 2);                                   \
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));                    \
        for (int c = 0; c < 4; c++) {                                                          \
            const __m256i x = _mm256_loadu_si256((const __m256i *)(blk + q0 + 32 * c));        \
            for (int h = 0; h < 2; h++) {                                                      \
                const int j = 2 * c + h;                                                       \
                __m256i u = h ? hi4(x) : lo4(x);                                               \
                if (fmt == F_Q5_K) u = _mm256_or_si256(u, bits_at(qh, j, 1, 4));               \
                BLOCK_Q(DOT, u, sb * 8 + j, d * (float)sc[j], -(dmin * (float)mn[j]))          \
            }                                                                                  \
        }                                                                                      \
    }

#define BODY_Q6_K(DOT)                                                                         \
    for (long sb = 0; sb < nb / 8; sb++) {                                                     \
        const uint8_t *blk = w + sb * 210;                                                     \
        const float d = ld_f16(blk + 208);                                                     \
        for (int h = 0; h < 2; h++) {                                                          \
            const __m256i qa = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));            \
            const __m256i qb = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));       \
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));      \
            for (int k = 0; k < 4; k++) {                                                      \
                const int j = 4 * h + k;                                                       \
                const long b = sb * 8 + j;                                                     \
                const __m256i x = (k & 1) ? qb : qa;                                           \
                const __m256i u = _mm256_or_si256((k & 2) ? hi4(x) : lo4(x), bits_at(qh, 2 * k, 3, 4)); \
                const int s0 = (int8_t)blk[192 + 2 * j], s1 = (int8_t)blk[193 + 2 * j];        \
                const __m256i sv = _mm256_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1);          \
                for (int t = 0; t < NT; t++) {                                                 \
                    const __m256i I = _mm256_mullo_epi32(DOT(u, LD_ACT(t, b)), sv);            \
                    const float da = d * ACT(d, t, b);                                         \
                    acc[b & 1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), _mm256_set1_ps(da), acc[b & 1][t]); \
                    const int32_t *s16 = a->s16 + 2 * ((t0 + t) * a->ld + b);                  \
                    accm[b & 1][t] -= 32.f * da * (float)(s0 * s16[0] + s1 * s16[1]);         \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

#define DEFINE_SIMD_DOT(NAME, TARGET, DOT)                                                     \
    TARGET static inline __attribute__((always_inline)) void NAME##_nt(                        \
        int fmt, const uint8_t *w, const Act *a, long t0, const int NT, float *out)            \
    {                                                                                          \
        __m256 acc[2][TILE];                                                                   \
        float accm[2][TILE];                                                                   \
        for (int t = 0; t < NT; t++)                                                           \
            for (int p = 0; p < 2; p++) { acc[p][t] = _mm256_setzero_ps(); accm[p][t] = 0.f; } \
        const long nb = a->nb;                                                                 \
        if (fmt == F_Q8_0) { BODY_Q8_0(DOT) }                                                  \
        else if (fmt == F_Q4_0 || fmt == F_Q4_1) { BODY_Q4(DOT) }                              \
        else if (fmt == F_Q4_K || fmt == F_Q5_K) { BODY_K45(DOT) }                             \
        else { BODY_Q6_K(DOT) }                                                                \
        for (int t = 0; t < NT; t++)                                                           \
            out[t] = hsum8(_mm256_add_ps(acc[0][t], acc[1][t])) + (accm[0][t] + accm[1][t]);   \
    }                                                                                          \
    TARGET static void NAME(int fmt, const uint8_t *w, const Act *a, long t0, int nt, float *out) \
    {                                                                                          \
        switch (nt) {                                                                          \
        case 1: NAME##_nt(fmt, w, a, t0, 1, out); break;                                       \
        case 2: NAME##_nt(fmt, w, a, t0, 2, out); break;                                       \
        case 3: NAME##_nt(fmt, w, a, t0, 3, out); break;                                       \
        default: NAME##_nt(fmt, w, a, t0, 4, out); break;                                      \
        }                                                                                      \
    }

DEFINE_SIMD_DOT(dot_avx2, AVX2_TARGET, dot_us_avx2)
DEFINE_SIMD_DOT(dot_avx512, VNNI_TARGET, dot_us_vnni)

/*
 * Row-split Q4, 16 blocks a step (see the x16 layouts above). For weight row r and activation row
 * t of the tile, per whole group of 16 blocks (lane j = block 16g + j):
 *     I[j]    = sum over the block's 32 values of u * q            (exact, int32)
 *     acc[j] += float(I[j]) * (d_w[j] d_a[j]);  acc[j] += m_w[j] ds_a[j]     (two fused mult-adds)
 * A row's last n < 16 blocks (n even) go a pair at a time in 8 lanes, lanes 0-3 block 2p and
 * 4-7 block 2p + 1 (lane i: values 4i..4i+3 and 16+4i..16+4i+3 of its block, the pair layout):
 * tail += float(I) * (d_w d_a of the lane's block), from zero; the offsets m_w ds_a go to acc
 * lanes 0..n-1 as above, then acc lanes 0-7 += tail. The 16 lanes are summed by one fixed tree
 * (hsum16). A last group of exactly 2 blocks has its own float steps instead (x16_tail2_avx512).
 * AVX2 runs the same lanes as two 8-lane halves, with the same operations in the same order: both
 * paths give the same bits.
 */
#define FOR_RT for (int r = 0; r < R; r++) for (int t = 0; t < MT; t++)

AVX2_TARGET static inline float hsum16(__m256 lo, __m256 hi) { return hsum8(_mm256_add_ps(lo, hi)); }

/*
 * Lane 4t + r = hsum16 of v[r][t] (r, t < 4; the tiles' out layout): the 16 accumulators reduced
 * side by side, each by hsum16's own pairs in its order (lanes i + (i + 8), then i + (i + 4), then
 * the four left as (0 + 2) + (1 + 3)), 45 instructions for the 16 sums.
 */
VNNI_TARGET static inline __m512 hsum16_x16(const __m512 v[NR][TILE]) {
    __m512 h[8], x[4];
    for (int i = 0; i < 8; i++) { /* accumulators 2i, 2i + 1: [a_i + a_i+8 (i < 8) | b_i + b_i+8] */
        const __m512 a = v[i / 2][2 * (i % 2)], b = v[i / 2][2 * (i % 2) + 1];
        h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    for (int r = 0; r < 4; r++) /* 128-bit chunk t = accumulator (r, t), its lanes i + (i + 4) */
        x[r] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * r], h[2 * r + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * r], h[2 * r + 1], 0xDD));
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    /* chunk t, lane r: accumulator (r, t)'s (x0 + x2) + (x1 + x3) */
    const __m512 f = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s01), _mm512_castps_pd(s23))));
    return f;
}

/* the tile's sums (lane 4t + r), plus the last pair's tail[r] (lane t) where there is one, to out */
VNNI_TARGET static inline void store_sums_avx512(__m512 acc[NR][TILE], const int R, const int MT, const int tail2,
                                                 __m128 tail[NR], float *out) {
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < TILE; t++)
            if (r >= R || t >= MT) acc[r][t] = _mm512_setzero_ps();
    __m512 sums = hsum16_x16(acc);
    if (tail2) {
        for (int r = R; r < NR; r++) tail[r] = _mm_setzero_ps();
        const __m512 t01 = _mm512_insertf32x4(_mm512_castps128_ps512(tail[0]), tail[1], 1);
        const __m512 rt = _mm512_insertf32x8(t01, _mm256_insertf128_ps(_mm256_castps128_ps256(tail[2]), tail[3], 1), 1);
        const __m512i transpose = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        sums = _mm512_add_ps(sums, _mm512_permutexvar_ps(transpose, rt)); /* lane 4r + t -> 4t + r */
    }
    _mm512_storeu_ps(out, sums);
}

/*
 * The last group when it has exactly 2 blocks (K = 576, the built-in model's width, is 16 + 2): its
 * own float steps, added to the row's sum after the 16 lanes are (the same on every SIMD path):
 *     I_k    = block b0 + k's exact integer dot product (k = 0, 1)
 *     e_k    = fma(float(I_k), d_w d_a, m_w ds_a)       (the block's two products, one rounding each)
 *     out    = hsum16(acc) + (e_0 + e_1)
 * A row pair's 2 blocks fill one vector (row r: lanes 0-7, 4 per block; row r + 1: lanes 8-15), a
 * dot product per activation row; four rows' vectors reduce in integers to one, lane 4c + t =
 * (row, block) c against activation row t, and the floats above run on all 16 at once. Spread
 * over the accumulators' lanes instead (its float work per row pair and activation row), this pair
 * of blocks cost two thirds of the group of 16 before it on prefill tiles.
 */

/* lane 4c + t = the sum of I[t]'s four lanes in 128-bit chunk c (exact integers) */
VNNI_TARGET static inline __m512i chunk_sums_x4(const __m512i I[TILE]) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(I[0], I[1]), _mm512_unpackhi_epi32(I[0], I[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(I[2], I[3]), _mm512_unpackhi_epi32(I[2], I[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

/* v[t * ld + k] for k = 0, 1 and t < MT (0 past MT) at lane 4k + t, and again in lanes 8-15 */
VNNI_TARGET static inline __m512 tail2_act_scales(const float *v, long ld, const int MT) {
    __m128i p[TILE];
    for (int t = 0; t < TILE; t++)
        p[t] = t < MT ? _mm_loadl_epi64((const __m128i *)(v + t * ld)) : _mm_setzero_si128();
    const __m256i x = _mm256_set_m128i(_mm_unpacklo_epi64(p[2], p[3]), _mm_unpacklo_epi64(p[0], p[1]));
    const __m512i idx = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7);
    return _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(_mm256_castsi256_ps(x)));
}

/* the 2 float16 at p0 and at p1 as lanes 0-3, 4-7 (p0) and 8-11, 12-15 (p1) */
VNNI_TARGET static inline __m512 tail2_row_scales(const uint8_t *p0, const uint8_t *p1) {
    uint32_t a, b;
    memcpy(&a, p0, 4);
    memcpy(&b, p1, 4);
    const __m128 x = _mm_cvtph_ps(_mm_set_epi32(0, 0, (int)b, (int)a));
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(x));
}

VNNI_TARGET static inline __attribute__((always_inline)) void x16_tail2_avx512(
    int fmt, const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0,
    __m128 tail[NR])
{
    const long nb = a->nb, ld = a->ld;
    const __m256i m4y = _mm256_set1_epi8(0x0F);
    const __m512 da = tail2_act_scales(a->d + t0 * ld + b0, ld, MT);
    const __m512 ds = tail2_act_scales(a->ds + t0 * ld + b0, ld, MT);
    for (int r = 0; r < R; r += 2) {
        const uint8_t *row0 = w + r * row_bytes, *row1 = r + 1 < R ? row0 + row_bytes : row0;
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)rs_group(row0, b0));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)rs_group(row1, b0));
        const __m512i x = _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1);
        const __m512i ulo = _mm512_and_si512(x, _mm512_broadcast_i64x4(m4y));
        const __m512i uhi = _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_broadcast_i64x4(m4y));
        __m512i I[TILE];
        for (int t = 0; t < TILE; t++) {
            if (t >= MT) {
                I[t] = _mm512_setzero_si512();
                continue;
            }
            const int8_t *q = a->q + ((t0 + t) * ld + b0) * QB;
            I[t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ulo,
                                       _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)q)));
            I[t] = _mm512_dpbusd_epi32(I[t], uhi, _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(q + 32))));
        }
        const __m512i sum = chunk_sums_x4(I);
        const __m512 dw = tail2_row_scales(rs_d(row0, nb, b0), rs_d(row1, nb, b0));
        const __m512 mw = fmt == F_Q4_0R ? _mm512_mul_ps(dw, _mm512_set1_ps(-8.f))
                                         : tail2_row_scales(rs_m(row0, nb, b0), rs_m(row1, nb, b0));
        const __m512 e = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, da), _mm512_mul_ps(mw, ds));
        const __m512 both = _mm512_add_ps(e, _mm512_shuffle_f32x4(e, e, 0xB1)); /* chunks 0 + 1, 2 + 3 */
        tail[r] = _mm512_castps512_ps128(both);
        if (r + 1 < R) tail[r + 1] = _mm512_extractf32x4_ps(both, 2);
    }
}

/* One whole group of 16 blocks at b0 into acc (first: acc starts at zero, not read) */
VNNI_TARGET static inline __attribute__((always_inline)) void x16_group_avx512(
    int fmt, const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0,
    const int first, __m512 acc[NR][TILE])
{
    const long nb = a->nb, ld = a->ld;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i I[NR][TILE];
    FOR_RT I[r][t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i lo[NR], hi[NR];
        for (int r = 0; r < R; r++) {
            const __m512i x = _mm512_loadu_si512((const void *)(rs_group(w + r * row_bytes, b0) + 64 * c));
            lo[r] = _mm512_and_si512(x, m4);
            hi[r] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        }
        for (int t = 0; t < MT; t++) {
            const int8_t *q = a->q + ((t0 + t) * ld + b0) * QB;
            const __m512i alo = _mm512_loadu_si512((const void *)(q + 64 * c));
            const __m512i ahi = _mm512_loadu_si512((const void *)(q + 64 * (c + 4)));
            for (int r = 0; r < R; r++) {
                I[r][t] = _mm512_dpbusd_epi32(I[r][t], lo[r], alo);
                I[r][t] = _mm512_dpbusd_epi32(I[r][t], hi[r], ahi);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * row_bytes;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rs_d(row, nb, b0)));
        const __m512 mw = fmt == F_Q4_0R ? _mm512_mul_ps(dw, _mm512_set1_ps(-8.f))
                                         : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rs_m(row, nb, b0)));
        for (int t = 0; t < MT; t++) {
            const long ab = (t0 + t) * ld + b0;
            const __m512 sc = _mm512_mul_ps(dw, _mm512_loadu_ps(a->d + ab));
            const __m512 prev = first ? _mm512_setzero_ps() : acc[r][t];
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r][t]), sc, prev);
            acc[r][t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a->ds + ab), acc[r][t]);
        }
    }
}

VNNI_TARGET static inline __attribute__((always_inline)) void x16_avx512_nt(
    int fmt, const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, float *out)
{
    const long nb = a->nb, ld = a->ld;
    __m512 acc[NR][TILE];
    long b0 = 0;
    if (nb >= X16) {
        x16_group_avx512(fmt, w, row_bytes, R, a, t0, MT, 0, 1, acc);
        b0 = X16;
    } else {
        FOR_RT acc[r][t] = _mm512_setzero_ps();
    }
    for (; b0 + X16 <= nb; b0 += X16) x16_group_avx512(fmt, w, row_bytes, R, a, t0, MT, b0, 0, acc);
    const int tail2 = b0 + 2 == nb;
    __m128 tail[NR];
    if (tail2) {
        x16_tail2_avx512(fmt, w, row_bytes, R, a, t0, MT, b0, tail);
    } else if (b0 < nb) {
        const int n = (int)(nb - b0);
        const __mmask16 mk = (__mmask16)((1u << n) - 1);
        const __m256i m4y = _mm256_set1_epi8(0x0F);
        for (int r = 0; r < R; r++) {
            const uint8_t *row = w + r * row_bytes;
            const __m512 dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, rs_d(row, nb, b0)));
            const __m512 mw = fmt == F_Q4_0R ? _mm512_mul_ps(dw, _mm512_set1_ps(-8.f))
                                             : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, rs_m(row, nb, b0)));
            __m512 sc[TILE];
            __m256 tail[TILE];
            for (int t = 0; t < MT; t++) {
                const long ab = (t0 + t) * ld + b0;
                sc[t] = _mm512_mul_ps(dw, _mm512_loadu_ps(a->d + ab));
                acc[r][t] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a->ds + ab), acc[r][t]);
                tail[t] = _mm256_setzero_ps();
            }
            for (int p = 0; p < n / 2; p++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(rs_group(row, b0) + 32 * p));
                const __m256i lo = _mm256_and_si256(x, m4y), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4y);
                const __m512i pick = _mm512_castsi256_si512(_mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1,
                                                                              2 * p + 1, 2 * p + 1, 2 * p + 1));
                for (int t = 0; t < MT; t++) {
                    const int8_t *q = a->q + ((t0 + t) * ld + b0) * QB + 64 * p;
                    __m256i I = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, _mm256_loadu_si256((const __m256i *)q));
                    I = _mm256_dpbusd_epi32(I, hi, _mm256_loadu_si256((const __m256i *)(q + 32)));
                    const __m256 s = _mm512_castps512_ps256(_mm512_permutexvar_ps(pick, sc[t]));
                    tail[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), s, tail[t]);
                }
            }
            for (int t = 0; t < MT; t++)
                acc[r][t] = _mm512_mask_add_ps(acc[r][t], 0xFF, acc[r][t], _mm512_castps256_ps512(tail[t]));
        }
    }
    store_sums_avx512(acc, R, MT, tail2, tail, out);
}

/* 8 float16 of which the first k (an even number, 0..8) are read, the rest zero: a masked load
 * (whole 32-bit pairs), which never touches the bytes past the k-th */
AVX2_TARGET static inline __m256 ld_f16x8(const uint8_t *p, int k) {
    if (k == 8) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    const __m128i mask = _mm_cmpgt_epi32(_mm_set1_epi32(k / 2), _mm_setr_epi32(0, 1, 2, 3));
    return _mm256_cvtph_ps(_mm_maskload_epi32((const int *)p, mask));
}

AVX2_TARGET static inline __m256 mw_f16x8(int fmt, const uint8_t *row, long nb, long b, int k, __m256 dw) {
    return fmt == F_Q4_0R ? _mm256_mul_ps(dw, _mm256_set1_ps(-8.f)) : ld_f16x8(rs_m(row, nb, b), k);
}

/* x16_tail2_avx512's sums (the same float steps) for one weight row against MT activation rows:
 * tail[t] = e_0 + e_1 */
AVX2_TARGET static inline __attribute__((always_inline)) void x16_tail2_avx2(
    int fmt, const uint8_t *row, const Act *a, long t0, const int MT, long b0, float *tail)
{
    const long nb = a->nb, ld = a->ld;
    const __m256i x = _mm256_loadu_si256((const __m256i *)rs_group(row, b0)), lo = lo4(x), hi = hi4(x);
    float dw[2], mw[2];
    for (int k = 0; k < 2; k++) {
        dw[k] = ld_f16(rs_d(row, nb, b0 + k));
        mw[k] = fmt == F_Q4_0R ? dw[k] * -8.f : ld_f16(rs_m(row, nb, b0 + k));
    }
    for (int t = 0; t < MT; t++) {
        const long ab = (t0 + t) * ld + b0;
        const int8_t *q = a->q + ab * QB;
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q)),
                                             _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 32))));
        __m256i I = _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); /* lanes 0-3: block b0, 4-7: b0 + 1 */
        I = _mm256_hadd_epi32(I, I);
        I = _mm256_hadd_epi32(I, I);
        const int I0 = _mm_cvtsi128_si32(_mm256_castsi256_si128(I));
        const int I1 = _mm_cvtsi128_si32(_mm256_extracti128_si256(I, 1));
        const float e0 = fmaf((float)I0, dw[0] * a->d[ab], mw[0] * a->ds[ab]);
        const float e1 = fmaf((float)I1, dw[1] * a->d[ab + 1], mw[1] * a->ds[ab + 1]);
        tail[t] = e0 + e1;
    }
}

/* the same tile on AVX2: half h of a group is lanes 8h..8h+7. The integer sums of a half add
 * up in 16 bits over the group's 4 chunks before one widening: a lane sums 8 maddubs pairs,
 * |sum| <= 8 * 2 * 15 * 127 = 30480 < 2^15 (codes <= 15, |activations| <= 127), so I is exact. */
AVX2_TARGET static inline __attribute__((always_inline)) void x16_avx2_nt(
    int fmt, const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, float *out)
{
    const long nb = a->nb, ld = a->ld;
    const __m256i one = _mm256_set1_epi16(1);
    __m256 acc[NR][2][2];
    FOR_RT acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    long b0 = 0;
    /* not unrolled: the unrolled halves and chunks need more than 16 registers and spill */
    for (; b0 + X16 <= nb; b0 += X16)
#pragma GCC unroll 1
        for (int h = 0; h < 2; h++) {
            __m256i S[NR][2];
            FOR_RT S[r][t] = _mm256_setzero_si256();
#pragma GCC unroll 1
            for (int c = 0; c < 4; c++) {
                __m256i alo[2], ahi[2];
                for (int t = 0; t < MT; t++) {
                    const int8_t *q = a->q + ((t0 + t) * ld + b0) * QB;
                    alo[t] = _mm256_loadu_si256((const __m256i *)(q + 64 * c + 32 * h));
                    ahi[t] = _mm256_loadu_si256((const __m256i *)(q + 64 * (c + 4) + 32 * h));
                }
                for (int r = 0; r < R; r++) {
                    const uint8_t *p = rs_group(w + r * row_bytes, b0) + 64 * c + 32 * h;
                    const __m256i x = _mm256_loadu_si256((const __m256i *)p), lo = lo4(x), hi = hi4(x);
                    for (int t = 0; t < MT; t++)
                        S[r][t] = _mm256_add_epi16(S[r][t], _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo[t]),
                                                                             _mm256_maddubs_epi16(hi, ahi[t])));
                }
            }
            for (int r = 0; r < R; r++) {
                const uint8_t *row = w + r * row_bytes;
                const __m256 dw = ld_f16x8(rs_d(row, nb, b0 + 8 * h), 8);
                const __m256 mw = mw_f16x8(fmt, row, nb, b0 + 8 * h, 8, dw);
                for (int t = 0; t < MT; t++) {
                    const long ab = (t0 + t) * ld + b0 + 8 * h;
                    const __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(a->d + ab));
                    const __m256i I = _mm256_madd_epi16(S[r][t], one);
                    acc[r][t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, acc[r][t][h]);
                    acc[r][t][h] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a->ds + ab), acc[r][t][h]);
                }
            }
        }
    const int tail2 = b0 + 2 == nb;
    float tail[NR][2] = {{0.f}};
    if (tail2) {
        for (int r = 0; r < R; r++) x16_tail2_avx2(fmt, w + r * row_bytes, a, t0, MT, b0, tail[r]);
    } else if (b0 < nb) {
        /* The last n blocks (k0 in lanes 0-7, k1 in 8-15), a pair per 32-byte load: its low
         * nibbles meet the pair's values 0-15, its high ones 16-31. A half with no block (k1 = 0)
         * adds nothing: acc is never -0, so skipping its zero offsets keeps the bits. */
        const int n = (int)(nb - b0), k0 = n < 8 ? n : 8, k1 = n - k0;
        for (int r = 0; r < R; r++) {
            const uint8_t *row = w + r * row_bytes;
            const __m256 dw0 = ld_f16x8(rs_d(row, nb, b0), k0), mw0 = mw_f16x8(fmt, row, nb, b0, k0, dw0);
            __m256 dw1 = _mm256_setzero_ps(), mw1 = dw1;
            if (k1) {
                dw1 = ld_f16x8(rs_d(row, nb, b0 + 8), k1);
                mw1 = mw_f16x8(fmt, row, nb, b0 + 8, k1, dw1);
            }
            for (int t = 0; t < MT; t++) {
                const long ab = (t0 + t) * ld + b0;
                const __m256 sc0 = _mm256_mul_ps(dw0, _mm256_loadu_ps(a->d + ab));
                __m256 sc1 = sc0;
                acc[r][t][0] = _mm256_fmadd_ps(mw0, _mm256_loadu_ps(a->ds + ab), acc[r][t][0]);
                if (k1) {
                    sc1 = _mm256_mul_ps(dw1, _mm256_loadu_ps(a->d + ab + 8));
                    acc[r][t][1] = _mm256_fmadd_ps(mw1, _mm256_loadu_ps(a->ds + ab + 8), acc[r][t][1]);
                }
                __m256 tail = _mm256_setzero_ps();
                for (int p = 0; p < n / 2; p++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(rs_group(row, b0) + 32 * p));
                    const int8_t *q = a->q + ab * QB + 64 * p;
                    const __m256i s16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo4(x), _mm256_loadu_si256((const __m256i *)q)),
                        _mm256_maddubs_epi16(hi4(x), _mm256_loadu_si256((const __m256i *)(q + 32))));
                    const int k = 2 * p % 8;
                    const __m256i pick = _mm256_setr_epi32(k, k, k, k, k + 1, k + 1, k + 1, k + 1);
                    const __m256 s = _mm256_permutevar8x32_ps(p < 4 ? sc0 : sc1, pick);
                    tail = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, one)), s, tail);
                }
                acc[r][t][0] = _mm256_add_ps(acc[r][t][0], tail);
            }
        }
    }
    FOR_RT out[t * NR + r] = tail2 ? hsum16(acc[r][t][0], acc[r][t][1]) + tail[r][t]
                                   : hsum16(acc[r][t][0], acc[r][t][1]);
}

/* Decoding (one activation row) streams every weight once from DRAM, a tile's nr rows at a time.
 * The hardware prefetcher alone kept one core at 6-13 GB/s on the row-split tiles (1536- and
 * 576-wide rows, AVX2 and AVX-512 alike); asking for the rows about 8 KiB ahead into L2 gives
 * 13-21 GB/s, for a few percent more time on weights already in cache. Past the matrix or the
 * thread's rows is harmless: a prefetch never faults. Always inlined: a function of prefetches
 * alone has no side effects, so a call to an out-of-line copy (another target's) is dropped. */
AVX2_TARGET static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *w, int nr,
                                                                              long row_bytes) {
    const char *ahead = (const char *)w + (PREFETCH_BYTES / row_bytes) * row_bytes;
    for (long i = 0; i < nr * row_bytes; i += 64) _mm_prefetch(ahead + i, _MM_HINT_T1);
}

/* Tiles: out[t * NR + r] = weight row r (< nr <= NR) dotted with activation row t0 + t (< mt <= TILE),
 * the layout of y's rows (an activation row's results side by side) */
typedef void (*tile_fn)(int fmt, const uint8_t *w, long row_bytes, int nr, const Act *a, long t0, int mt, float *out);

#define X16_MT(FN, RR)                                                                         \
    switch (mt) {                                                                              \
    case 1: FN(fmt, w, row_bytes, RR, a, t0, 1, out); break;                                   \
    case 2: FN(fmt, w, row_bytes, RR, a, t0, 2, out); break;                                   \
    case 3: FN(fmt, w, row_bytes, RR, a, t0, 3, out); break;                                   \
    default: FN(fmt, w, row_bytes, RR, a, t0, 4, out); break;                                  \
    }

VNNI_TARGET static void tile_x16_avx512(int fmt, const uint8_t *w, long row_bytes, int nr, const Act *a, long t0,
                                        int mt, float *out) {
    if (mt == 1) prefetch_ahead(w, nr, row_bytes);
    switch (nr) {
    case 1: X16_MT(x16_avx512_nt, 1) break;
    case 2: X16_MT(x16_avx512_nt, 2) break;
    case 3: X16_MT(x16_avx512_nt, 3) break;
    default: X16_MT(x16_avx512_nt, 4) break;
    }
}

/* AVX2 has 16 vector registers: one activation row with up to 4 weight rows (decoding), or
 * sub-tiles of at most 2 x 2 */
AVX2_TARGET static void tile_x16_avx2(int fmt, const uint8_t *w0, long row_bytes, int nr, const Act *a, long t00,
                                      int mt0, float *out0) {
    if (mt0 == 1) {
        prefetch_ahead(w0, nr, row_bytes);
        switch (nr) {
        case 1: x16_avx2_nt(fmt, w0, row_bytes, 1, a, t00, 1, out0); return;
        case 2: x16_avx2_nt(fmt, w0, row_bytes, 2, a, t00, 1, out0); return;
        case 3: x16_avx2_nt(fmt, w0, row_bytes, 3, a, t00, 1, out0); return;
        default: x16_avx2_nt(fmt, w0, row_bytes, 4, a, t00, 1, out0); return;
        }
    }
    for (int r0 = 0; r0 < nr; r0 += 2)
        for (int s0 = 0; s0 < mt0; s0 += 2) {
            const uint8_t *w = w0 + r0 * row_bytes;
            const long t0 = t00 + s0;
            const int mt = mt0 - s0 < 2 ? mt0 - s0 : 2;
            float *out = out0 + s0 * NR + r0;
            const int r2 = nr - r0 >= 2;
            if (r2 && mt == 2) x16_avx2_nt(fmt, w, row_bytes, 2, a, t0, 2, out);
            else if (r2) x16_avx2_nt(fmt, w, row_bytes, 2, a, t0, 1, out);
            else if (mt == 2) x16_avx2_nt(fmt, w, row_bytes, 1, a, t0, 2, out);
            else x16_avx2_nt(fmt, w, row_bytes, 1, a, t0, 1, out);
        }
}
#endif

/* the other formats and the portable path: one weight row at a time */
static void tile_by_rows(dot_fn dot, int fmt, const uint8_t *w, long row_bytes, int nr, const Act *a, long t0,
                         int mt, float *out) {
    for (int r = 0; r < nr; r++) {
        float row[TILE];
        dot(fmt, w + r * row_bytes, a, t0, mt, row);
        for (int t = 0; t < mt; t++) out[t * NR + r] = row[t];
    }
}

#ifdef TL_X86
/*
 * Row-split Q8_0, 16 blocks a step (see its layout above): the Q4 tile's lanes and float order,
 * lane j = block 16g + j, with 8 code chunks of 64 bytes a group instead of 4 of nibbles.
 *     I[j]    = sum over the block's 32 values of w * q                      (exact, int32)
 *     acc[j] += float(I[j]) * (d_w[j] d_a[j])                                 (one fused mult-add)
 * AVX-512 VNNI: I[j] = -128 sum(q_a) + sum of (w + 128) q, the stored codes as they are, the
 * offset from the activations' half-block sums. AVX2 (whose vpmaddubsw pairs would saturate at
 * 255 * 127 * 2) flips the code back to w and multiplies |w| by sign(w) q, as the Q8_0 dot does.
 * A row's last n < 16 blocks (natural layout) go two at a time on AVX-512, lanes 0-7 block b and
 * 8-15 block b + 1 (n odd: the last pair's second half masked to zero codes against the zero
 * padding of the activations), one at a time on AVX2, into lanes 0-7 (even b) or 8-15 (odd b):
 * acc += float(I) * (d_w d_a of the block), lane I the 4-value partial sum (its offset from those 4
 * activations); then one fixed tree sums the 16 lanes (hsum16). A last pair alone (n = 2, the LM
 * head's K = 576) is summed apart instead (q8x16_tail2_avx512). The integers of a lane are the same
 * on both paths, so are the float steps: both give the same bits.
 */

/*
 * The next tile's rows (the `bytes` after w, which are contiguous), asked for as a tile starts. A
 * tile reads R rows side by side, R short streams the hardware prefetchers follow badly: with one
 * activation row (a decoding step, bound by the weight read) the LM head ran at 0.6x the speed of
 * the one-row-at-a-time Q8_0 kernel without this, 1.5x to 1.8x with it (EPYC, AVX-512, one thread).
 * Prefetches never fault: past the matrix's end they are dropped. Only the first tile of a block
 * of activation rows asks (t0 a multiple of T_BLOCK): the later ones of the block meet the same
 * weight rows, in L1 by then; asking on every tile was 9.5% of the LM head's time at 64 rows.
 */
#define PREFETCH_ROWS(w, bytes) \
    for (long o_ = 0; o_ < (bytes); o_ += 64) _mm_prefetch((const char *)(w) + o_, _MM_HINT_T0)

/* -128 sum(q_a) of blocks b .. b + 15 of activation row block index ab (16 int32 lanes) */
VNNI_TARGET static inline __m512i q8_offset_x16(const Act *a, long ab) {
    const int32_t *s = a->s16 + 2 * ab; /* [block][half] */
    const __m512i v0 = _mm512_loadu_si512((const void *)s), v1 = _mm512_loadu_si512((const void *)(s + 16));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i sum = _mm512_add_epi32(_mm512_permutex2var_epi32(v0, even, v1), _mm512_permutex2var_epi32(v0, odd, v1));
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7));
}

/* the last n < 16 blocks of R weight rows against MT activation rows, into acc (see above) */
VNNI_TARGET static inline __attribute__((always_inline)) void q8x16_tail_avx512(
    const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0, __m512 acc[NR][TILE])
{
    const long nb = a->nb, ld = a->ld;
    const int n = (int)(nb - b0);
    const __mmask16 mk = (__mmask16)((1u << n) - 1);
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    __m512 dw[NR], da[TILE];
    for (int r = 0; r < R; r++) dw[r] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, r8_d(w + r * row_bytes, nb, b0)));
    for (int t = 0; t < MT; t++) da[t] = _mm512_loadu_ps(a->d + (t0 + t) * ld + b0);
    for (int p = 0; 2 * p < n; p++) {
        const __mmask64 mw = 2 * p + 1 < n ? ~0ull : 0xffffffffull;
        const __m512i pick = _mm512_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1,
                                               2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1);
        __m512i u[NR];
        __m512 dwp[NR];
        for (int r = 0; r < R; r++) {
            u[r] = _mm512_maskz_loadu_epi8(mw, w + r * row_bytes + (b0 + 2 * p) * QB);
            dwp[r] = _mm512_permutexvar_ps(pick, dw[r]);
        }
        for (int t = 0; t < MT; t++) {
            const __m512i q = _mm512_loadu_si512((const void *)(a->q + ((t0 + t) * ld + b0 + 2 * p) * QB));
            /* -128 q per lane: the lane's own 4 activations, the offset of its 4 codes */
            const __m512i off = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, q));
            const __m512 dap = _mm512_permutexvar_ps(pick, da[t]);
            for (int r = 0; r < R; r++) {
                const __m512i I = _mm512_dpbusd_epi32(off, u[r], q);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(dwp[r], dap), acc[r][t]);
            }
        }
    }
}

/*
 * A last pair of blocks (K = 576: the built-in model's LM head), as the row-split Q4's
 * (x16_tail2_avx512), summed apart from the 16 lanes: a row's 2 blocks are one 64-byte vector, the
 * four activation rows' dot products reduce in integers (lane 4c + t: (row, block) c against
 * activation row t, two weight rows a vector), then
 *     tail = fma(float(I_1), d_w1 d_a1, float(I_0) (d_w0 d_a0)),   out = hsum16(acc) + tail
 */
VNNI_TARGET static inline __attribute__((always_inline)) void q8x16_tail2_avx512(
    const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0, __m128 tail[NR])
{
    const long nb = a->nb, ld = a->ld;
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    const __m512 da = tail2_act_scales(a->d + t0 * ld + b0, ld, MT);
    __m512i q[TILE], off[TILE];
    for (int t = 0; t < MT; t++) {
        q[t] = _mm512_loadu_si512((const void *)(a->q + ((t0 + t) * ld + b0) * QB));
        off[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, q[t]));
    }
    for (int r = 0; r < R; r += 2) {
        __m512i blk[2];
        for (int k = 0; k < 2; k++) {
            const uint8_t *row = w + (r + k < R ? r + k : r) * row_bytes;
            const __m512i u = _mm512_loadu_si512((const void *)(row + b0 * QB));
            __m512i I[TILE];
            for (int t = 0; t < TILE; t++) I[t] = t < MT ? _mm512_dpbusd_epi32(off[t], u, q[t]) : _mm512_setzero_si512();
            const __m512i sum = chunk_sums_x4(I);
            blk[k] = _mm512_add_epi32(sum, _mm512_shuffle_i32x4(sum, sum, 0xB1)); /* chunk 0: block 0, 2: 1 */
        }
        const uint8_t *row0 = w + r * row_bytes, *row1 = r + 1 < R ? row0 + row_bytes : row0;
        const __m512 v = _mm512_cvtepi32_ps(_mm512_shuffle_i32x4(blk[0], blk[1], 0x88));
        const __m512 sc = _mm512_mul_ps(tail2_row_scales(r8_d(row0, nb, b0), r8_d(row1, nb, b0)), da);
        const __m512 both = _mm512_fmadd_ps(_mm512_shuffle_f32x4(v, v, 0xB1), _mm512_shuffle_f32x4(sc, sc, 0xB1),
                                            _mm512_mul_ps(v, sc));
        tail[r] = _mm512_castps512_ps128(both);
        if (r + 1 < R) tail[r + 1] = _mm512_extractf32x4_ps(both, 2);
    }
}

/* One whole group of 16 blocks at b0 into acc (first: acc starts at zero, not read). The tile's
 * float accumulators live in memory across groups whatever the code says (with the group's integer
 * sums they are 32 vectors): started from a zero constant, 16 stores of zeros per tile go. */
VNNI_TARGET static inline __attribute__((always_inline)) void q8x16_group_avx512(
    const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0, const int first,
    __m512 acc[NR][TILE])
{
    const long nb = a->nb, ld = a->ld;
    __m512i I[NR][TILE];
    for (int t = 0; t < MT; t++) {
        const __m512i off = q8_offset_x16(a, (t0 + t) * ld + b0);
        for (int r = 0; r < R; r++) I[r][t] = off;
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m512i u[NR];
        for (int r = 0; r < R; r++) u[r] = _mm512_loadu_si512((const void *)(w + r * row_bytes + b0 * QB + 64 * c));
        for (int t = 0; t < MT; t++) {
            const __m512i q = _mm512_loadu_si512((const void *)(a->q + ((t0 + t) * ld + b0) * QB + 64 * c));
            for (int r = 0; r < R; r++) I[r][t] = _mm512_dpbusd_epi32(I[r][t], u[r], q);
        }
    }
    for (int r = 0; r < R; r++) {
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)r8_d(w + r * row_bytes, nb, b0)));
        for (int t = 0; t < MT; t++) {
            const __m512 sc = _mm512_mul_ps(dw, _mm512_loadu_ps(a->d + (t0 + t) * ld + b0));
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[r][t]), sc, first ? _mm512_setzero_ps() : acc[r][t]);
        }
    }
}

VNNI_TARGET static inline __attribute__((always_inline)) void q8x16_avx512_nt(
    int fmt, const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, float *out)
{
    (void)fmt;
    const long nb = a->nb;
    __m512 acc[NR][TILE];
    long b0 = 0;
    /* one activation row (decoding: the weight read bounds it) ran slower peeled, 0.7 vs 0.45 ms a
       step for the built-in model's LM head */
    if (nb >= X16 && MT > 1) {
        q8x16_group_avx512(w, row_bytes, R, a, t0, MT, 0, 1, acc);
        b0 = X16;
    } else {
        FOR_RT acc[r][t] = _mm512_setzero_ps();
    }
    for (; b0 + X16 <= nb; b0 += X16) q8x16_group_avx512(w, row_bytes, R, a, t0, MT, b0, 0, acc);
    const int tail2 = b0 + 2 == nb;
    __m128 tail[NR];
    if (tail2) q8x16_tail2_avx512(w, row_bytes, R, a, t0, MT, b0, tail);
    else if (b0 < nb) q8x16_tail_avx512(w, row_bytes, R, a, t0, MT, b0, acc);
    store_sums_avx512(acc, R, MT, tail2, tail, out);
}

/* 8 lanes of w . q over 4 values each: |w| (u8, at most 128) times sign(w) q (s8) */
AVX2_TARGET static inline __m256i q8_dot_avx2(__m256i wabs, __m256i w, __m256i q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(q, w)), _mm256_set1_epi16(1));
}

/* the AVX2 tail: block by block, into lanes 0-7 (even) or 8-15 (odd), as on AVX-512. The
 * scales d_w d_a are the same float products as AVX-512's lanes, taken one at a time (a vector
 * load of fewer than 8 float16 went through the stack, a store-forwarding stall per tile). */
AVX2_TARGET static inline __attribute__((always_inline)) void q8x16_tail_avx2(
    const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0, __m256 acc[2][2][2])
{
    const long nb = a->nb, ld = a->ld;
    const int n = (int)(nb - b0);
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * row_bytes;
        float dw[X16];
        for (int b = 0; b < n; b++) dw[b] = ld_f16(r8_d(row, nb, b0 + b));
        for (int b = 0; b < n; b++) {
            const __m256i ws = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + (b0 + b) * QB)), k80);
            const __m256i wa = _mm256_abs_epi8(ws);
            for (int t = 0; t < MT; t++) {
                const long ab = (t0 + t) * ld + b0 + b;
                const __m256i I = q8_dot_avx2(wa, ws, _mm256_loadu_si256((const __m256i *)(a->q + ab * QB)));
                const __m256 sc = _mm256_set1_ps(dw[b] * a->d[ab]);
                if (b & 1) acc[r][t][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, acc[r][t][1]);
                else acc[r][t][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, acc[r][t][0]);
            }
        }
    }
}

/* q8x16_tail2_avx512's float steps on AVX2, for R, MT <= 2 */
AVX2_TARGET static inline __attribute__((always_inline)) void q8x16_tail2_avx2(
    const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, long b0, float tail[2][2])
{
    const long nb = a->nb, ld = a->ld;
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    for (int r = 0; r < R; r++) {
        const uint8_t *row = w + r * row_bytes;
        __m256i ws[2], wa[2];
        float dw[2];
        for (int k = 0; k < 2; k++) {
            ws[k] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + (b0 + k) * QB)), k80);
            wa[k] = _mm256_abs_epi8(ws[k]);
            dw[k] = ld_f16(r8_d(row, nb, b0 + k));
        }
        for (int t = 0; t < MT; t++) {
            const long ab = (t0 + t) * ld + b0;
            float f[2];
            for (int k = 0; k < 2; k++) {
                const __m256i I = q8_dot_avx2(wa[k], ws[k], _mm256_loadu_si256((const __m256i *)(a->q + (ab + k) * QB)));
                __m128i h = _mm_add_epi32(_mm256_castsi256_si128(I), _mm256_extracti128_si256(I, 1));
                h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
                f[k] = (float)_mm_cvtsi128_si32(h);
            }
            tail[r][t] = fmaf(f[1], dw[1] * a->d[ab + 1], f[0] * (dw[0] * a->d[ab]));
        }
    }
}

/* the same tile on AVX2 (R, MT <= 2): half h of a group is lanes 8h..8h+7 */
AVX2_TARGET static inline __attribute__((always_inline)) void q8x16_avx2_nt(
    const uint8_t *w, long row_bytes, const int R, const Act *a, long t0, const int MT, float *out)
{
    const long nb = a->nb, ld = a->ld;
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    __m256 acc[2][2][2];
    FOR_RT acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    long b0 = 0;
    for (; b0 + X16 <= nb; b0 += X16) {
        __m256i I[2][2][2];
        FOR_RT I[r][t][0] = I[r][t][1] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++)
            for (int h = 0; h < 2; h++) {
                __m256i ws[2], wa[2];
                for (int r = 0; r < R; r++) {
                    const uint8_t *p = w + r * row_bytes + b0 * QB + 64 * c + 32 * h;
                    ws[r] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), k80);
                    wa[r] = _mm256_abs_epi8(ws[r]);
                }
                for (int t = 0; t < MT; t++) {
                    const int8_t *q = a->q + ((t0 + t) * ld + b0) * QB + 64 * c + 32 * h;
                    const __m256i qv = _mm256_loadu_si256((const __m256i *)q);
                    for (int r = 0; r < R; r++) I[r][t][h] = _mm256_add_epi32(I[r][t][h], q8_dot_avx2(wa[r], ws[r], qv));
                }
            }
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) {
                const __m256 dw = ld_f16x8(r8_d(w + r * row_bytes, nb, b0 + 8 * h), 8);
                for (int t = 0; t < MT; t++) {
                    const __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(a->d + (t0 + t) * ld + b0 + 8 * h));
                    acc[r][t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[r][t][h]), sc, acc[r][t][h]);
                }
            }
    }
    const int tail2 = b0 + 2 == nb;
    float tail[2][2] = {{0.f}};
    if (tail2) q8x16_tail2_avx2(w, row_bytes, R, a, t0, MT, b0, tail);
    else if (b0 < nb) q8x16_tail_avx2(w, row_bytes, R, a, t0, MT, b0, acc);
    FOR_RT out[t * NR + r] = tail2 ? hsum16(acc[r][t][0], acc[r][t][1]) + tail[r][t]
                                   : hsum16(acc[r][t][0], acc[r][t][1]);
}

VNNI_TARGET static void tile_q8x16_avx512(int fmt, const uint8_t *w, long row_bytes, int nr, const Act *a, long t0,
                                          int mt, float *out) {
    if (t0 % T_BLOCK == 0) PREFETCH_ROWS(w + nr * row_bytes, nr * row_bytes);
    switch (nr) {
    case 1: X16_MT(q8x16_avx512_nt, 1) break;
    case 2: X16_MT(q8x16_avx512_nt, 2) break;
    case 3: X16_MT(q8x16_avx512_nt, 3) break;
    default: X16_MT(q8x16_avx512_nt, 4) break;
    }
}

/* AVX2 has 16 vector registers: sub-tiles of at most 2 x 2 */
AVX2_TARGET static void tile_q8x16_avx2(int fmt, const uint8_t *w0, long row_bytes, int nr, const Act *a, long t00,
                                        int mt0, float *out0) {
    (void)fmt;
    if (t00 % T_BLOCK == 0) PREFETCH_ROWS(w0 + nr * row_bytes, nr * row_bytes);
    for (int r0 = 0; r0 < nr; r0 += 2)
        for (int s0 = 0; s0 < mt0; s0 += 2) {
            const uint8_t *w = w0 + r0 * row_bytes;
            const long t0 = t00 + s0;
            float *out = out0 + s0 * NR + r0;
            const int r2 = nr - r0 >= 2, m2 = mt0 - s0 >= 2;
            if (r2 && m2) q8x16_avx2_nt(w, row_bytes, 2, a, t0, 2, out);
            else if (r2) q8x16_avx2_nt(w, row_bytes, 2, a, t0, 1, out);
            else if (m2) q8x16_avx2_nt(w, row_bytes, 1, a, t0, 2, out);
            else q8x16_avx2_nt(w, row_bytes, 1, a, t0, 1, out);
        }
}
#endif

#ifdef TL_X86

static int cpu_max_isa(void) {
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        int isa = ISA_PORTABLE;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = ISA_AVX2;
        if (isa == ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vnni"))
            isa = ISA_AVX512;
        const char *cap = getenv("TRACELESS_CPU_ISA");
        if (cap && strcmp(cap, "avx2") == 0 && isa > ISA_AVX2) isa = ISA_AVX2;
        if (cap && strcmp(cap, "portable") == 0) isa = ISA_PORTABLE;
        cached = isa;
    }
    return cached;
}
#else
static int cpu_max_isa(void) { return ISA_PORTABLE; }
#endif

/* ---- entry points ----------------------------------------------------------------------------- */

/* The best instruction set of this CPU (2 AVX-512 VNNI, 1 AVX2+FMA, 0 portable), capped by
 * TRACELESS_CPU_ISA=avx2|portable. */
int tl_q_isa(void) { return cpu_max_isa(); }

static int shape_ok(const QShape *s) {
    static const long block[] = {32, 32, 32, 256, 256, 256, 64, 64, 32}, bytes[] = {34, 18, 20, 144, 176, 210, 36, 40, 34};
    if (s->fmt < 0 || s->fmt > F_Q8_0R || s->cols <= 0 || s->cols % block[s->fmt]) return 0;
    return s->row_bytes == s->cols / block[s->fmt] * bytes[s->fmt];
}

/*
 * y[t * ldy + n] = sum_k x[t][k] W[n][k] (+ bias[n]) for t < T, n < N; x float32 or bfloat16
 * [T][K] contiguous; y float32 or bfloat16. isa <= tl_q_isa(). Returns 0, 1 when scratch memory
 * cannot be allocated, 2 on a bad shape or instruction set.
 */
/* out (a tile of nr x mt results, out[t * NR + r]) + bias -> y[t0 + t][n0 + r] */
static void store_tile(const float *out, int nr, int mt, long n0, long t0, const float *bias, void *y, long ldy,
                       int y_bf16) {
    for (int t = 0; t < mt; t++) {
        const float *o = out + t * NR;
        const long i = (t0 + t) * ldy + n0;
        if (y_bf16) {
            for (int r = 0; r < nr; r++) ((uint16_t *)y)[i + r] = f32_to_bf16(bias ? o[r] + bias[n0 + r] : o[r]);
        } else if (bias) {
            for (int r = 0; r < nr; r++) ((float *)y)[i + r] = o[r] + bias[n0 + r];
        } else if (nr == NR) {
            memcpy((float *)y + i, o, sizeof(float) * NR); /* a constant size: one vector move, no call */
        } else {
            for (int r = 0; r < nr; r++) ((float *)y)[i + r] = o[r];
        }
    }
}

/* Every weight chunk of ROW_CHUNK rows (one thread's) against all activation rows, in tiles of
 * NR weight rows by TILE activation rows. A worksharing loop, as quantize_acts_for, ending in the
 * team's barrier. The activation rows go T_BLOCK at a time (64 rows of the built-in model's width:
 * 37 KB of codes, in L2 beside the thread's weights); every chunk meeting all T rows at once
 * streamed a prefill chunk's activations (1.7 MB for 2048 rows) from L3 once per 16 weight rows:
 * 1.15-1.2x slower on 2048 rows. */
static void run_tiles_for(const QShape *s, const uint8_t *w, const Act *a, long T, int isa, void *y, long ldy,
                          int y_bf16, const float *bias) {
    dot_fn dot = dot_portable;
    tile_fn tile = NULL;
#ifdef TL_X86
    if (isa == ISA_AVX2) dot = dot_avx2;
    if (isa == ISA_AVX512) dot = dot_avx512;
    if (a->x16 && s->fmt == F_Q8_0R) tile = isa == ISA_AVX512 ? tile_q8x16_avx512 : tile_q8x16_avx2;
    else if (a->x16) tile = isa == ISA_AVX512 ? tile_x16_avx512 : tile_x16_avx2;
#endif
    const long N = s->rows, chunks = (N + ROW_CHUNK - 1) / ROW_CHUNK;
    /* the thread's chunks: a contiguous run, as a static schedule would give */
    const long nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const long c_lo = chunks * tid / nth, c_hi = chunks * (tid + 1) / nth;
    const long tb = T_BLOCK;
    for (long tb0 = 0; tb0 < T; tb0 += tb) {
        const long tb1 = tb0 + tb < T ? tb0 + tb : T;
        for (long c = c_lo; c < c_hi; c++) {
            const long n1 = (c + 1) * ROW_CHUNK < N ? (c + 1) * ROW_CHUNK : N;
            for (long t0 = tb0; t0 < tb1; t0 += TILE) {
                const int mt = tb1 - t0 < TILE ? (int)(tb1 - t0) : TILE;
                for (long n = c * ROW_CHUNK; n < n1; n += NR) {
                    const int nr = n1 - n < NR ? (int)(n1 - n) : NR;
                    float out[NR * TILE];
                    const uint8_t *wn = w + n * s->row_bytes;
                    if (tile) tile(s->fmt, wn, s->row_bytes, nr, a, t0, mt, out);
                    else tile_by_rows(dot, s->fmt, wn, s->row_bytes, nr, a, t0, mt, out);
                    store_tile(out, nr, mt, n, t0, bias, y, ldy, y_bf16);
                }
            }
        }
    }
#pragma omp barrier
}

static void run_tiles(const QShape *s, const uint8_t *w, const Act *a, long T, int isa, void *y, long ldy,
                      int y_bf16, const float *bias, int threads) {
#pragma omp parallel num_threads(threads)
    run_tiles_for(s, w, a, T, isa, y, ldy, y_bf16, bias);
}

/* The scratch of one matmul: act_bytes(K, T, threads) bytes, laid out by act_in. */
static size_t act_bytes(long K, long T, int threads) {
    const long nb = K / QB, ld = (nb + X16 - 1) / X16 * X16;
    return sizeof(float) * (2 * (size_t)T * ld + (size_t)threads * K) + sizeof(int32_t) * 2 * (size_t)T * ld +
           (size_t)T * ld * QB;
}

static Act act_in(char *scratch, const QShape *s, long T, int threads, int isa, float **tmp) {
    const long K = s->cols, nb = K / QB, ld = (nb + X16 - 1) / X16 * X16;
    Act a = {.K = K, .nb = nb, .ld = ld, .avx512 = isa == ISA_AVX512};
    if (isa != ISA_PORTABLE && (s->fmt == F_Q4_0R || s->fmt == F_Q4_1R)) a.x16 = ACT_X16_PAIRS;
    else if (isa != ISA_PORTABLE && s->fmt == F_Q8_0R) a.x16 = ACT_X16;
    a.d = (float *)scratch;
    a.ds = a.d + T * ld;
    *tmp = a.ds + T * ld;
    a.s16 = (int32_t *)(*tmp + (size_t)threads * K);
    a.q = (int8_t *)(a.s16 + 2 * T * ld);
    return a;
}

int tl_qshape_ok(const QShape *s, int isa) { return shape_ok(s) && isa >= 0 && isa <= cpu_max_isa(); }

size_t tl_qmatmul_scratch_bytes(long K, long T, int threads) { return act_bytes(K, T, threads) + 64; }

/* tl_qmatmul for float32 x and y, called by every thread of a team (forward.c): the activations
 * are quantized into `scratch` (tl_qmatmul_scratch_bytes(K, T, team size), shared by the team),
 * then the team splits the weight rows. Same arithmetic as tl_qmatmul, row for row. */
void tl_qmatmul_team(const QShape *s, const uint8_t *w, const float *x, long T, float *y, long ldy,
                     const float *bias, int isa, char *scratch, int threads) {
    float *tmp;
    Act a = act_in(scratch, s, T, threads, isa, &tmp);
    quantize_acts_for(x, 0, T, &a, tmp);
    run_tiles_for(s, w, &a, T, isa, y, ldy, 0, bias);
}

/*
 * y[t * ldy + n] = sum_k x[t][k] W[n][k] (+ bias[n]) for t < T, n < N; x float32 or bfloat16
 * [T][K] contiguous; y float32 or bfloat16. isa <= tl_q_isa(). Row t of y depends on row t of x
 * only, never on T or on the other rows. Returns 0, 1 when scratch memory cannot be allocated, 2
 * on a bad shape or instruction set.
 */
int tl_qmatmul(const QShape *s, const uint8_t *w, const void *x, long T, int x_bf16, void *y, long ldy,
               int y_bf16, const float *bias, int isa) {
    if (!shape_ok(s) || isa < 0 || isa > cpu_max_isa() || T < 0) return 2;
    const int threads = tl_team_threads();
    /* d, ds [T][ld] float; tmp [threads][K] float; s16 [T][ld][2] int32; q [T][ld * 32] int8 */
    const size_t bytes = act_bytes(s->cols, T, threads);
    char *scratch = calloc(bytes + 64, 1);
    if (!scratch) return 1;
    float *tmp;
    Act a = act_in(scratch, s, T, threads, isa, &tmp);
    quantize_acts(x, x_bf16, T, &a, tmp, threads);
    run_tiles(s, w, &a, T, isa, y, ldy, y_bf16, bias, threads);
    memset(scratch, 0, bytes); /* quantized activations: user data */
    free(scratch);
    return 0;
}

/*
 * One weight row dequantized to float32, exactly as the reference does (same float products and
 * sums: contraction into fused multiply-adds is off here, whatever the instruction set).
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TL_EXACT_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4"), \
                                       optimize("fp-contract=off")))
#else
#define TL_EXACT_CLONES
#endif

TL_EXACT_CLONES static inline void q40_values(const uint8_t *restrict qs, float d, float *restrict o) {
    for (int i = 0; i < 16; i++) {
        o[i] = d * (float)((int)(qs[i] & 0xF) - 8);
        o[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
    }
}

TL_EXACT_CLONES static inline void q41_values(const uint8_t *restrict qs, float d, float m, float *restrict o) {
    for (int i = 0; i < 16; i++) {
        o[i] = d * (float)(qs[i] & 0xF) + m;
        o[i + 16] = d * (float)(qs[i] >> 4) + m;
    }
}

TL_EXACT_CLONES static void dequant_row(int fmt, const uint8_t *row, long K, float *out) {
    const long nb = K / QB;
    if (fmt == F_Q8_0) {
        for (long b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * 34;
            const float d = rd_f16(blk);
            for (int i = 0; i < QB; i++) out[b * QB + i] = (float)(int8_t)blk[2 + i] * d;
        }
    } else if (fmt == F_Q8_0R) {
        for (long b = 0; b < nb; b++) {
            uint8_t codes[QB];
            r8_codes(row, nb, b, codes);
            const float d = rd_f16(r8_d(row, nb, b));
            for (int i = 0; i < QB; i++) out[b * QB + i] = (float)(int8_t)codes[i] * d;
        }
    } else if (fmt == F_Q4_0 || fmt == F_Q4_1 || fmt == F_Q4_0R || fmt == F_Q4_1R) {
        /* (codes, d, m) of block b; then one branch-free loop per kind (so that it vectorizes) */
        const int sz = fmt == F_Q4_0 ? 18 : 20, split = fmt >= F_Q4_0R, q40 = fmt == F_Q4_0 || fmt == F_Q4_0R;
        for (long b = 0; b < nb; b++) {
            uint8_t gathered[16];
            const uint8_t *blk = row + b * sz, *qs = blk + sz - 16;
            if (split) {
                rs_codes(row, nb, b, gathered);
                qs = gathered;
            }
            const float d = rd_f16(split ? rs_d(row, nb, b) : blk);
            const float m = q40 ? 0.f : rd_f16(split ? rs_m(row, nb, b) : blk + 2);
            float *o = out + b * QB;
            if (q40) q40_values(qs, d, o);
            else q41_values(qs, d, m, o);
        }
    } else {
        for (long b = 0; b < nb; b++) {
            Blk k;
            get_block_nb(fmt, row, b, nb, &k);
            float *o = out + b * QB;
            if (fmt == F_Q6_K)
                for (int i = 0; i < QB; i++) o[i] = (k.scale * (float)k.sc[i / 16]) * (float)((int)k.u[i] - 32);
            else
                for (int i = 0; i < QB; i++) o[i] = k.scale * (float)k.u[i] + k.m;
        }
    }
}

TL_CLONES static void f32_row_to_bf16(const float *x, long n, uint16_t *out) {
    for (long i = 0; i < n; i++) out[i] = f32_to_bf16(x[i]);
}

/* out[t][:] = W[ids[t]][:] dequantized (float32 exactly as the reference, or that rounded to
 * bfloat16). ids == NULL: rows 0..T-1 (the whole matrix, for the dense prefill path).
 * Returns 1 when scratch memory cannot be allocated, 2 on a bad shape or an id out of range. */
int tl_qdequant(const QShape *s, const uint8_t *w, const int64_t *ids, long T, void *out, int out_bf16) {
    if (!shape_ok(s)) return 2;
    for (long t = 0; ids && t < T; t++)
        if (ids[t] < 0 || ids[t] >= s->rows) return 2;
    if (!ids && T > s->rows) return 2;
    const long K = s->cols;
    const int threads = tl_team_threads();
    float *tmp = out_bf16 ? malloc(sizeof(float) * K * threads) : NULL;
    if (out_bf16 && !tmp) return 1;
#pragma omp parallel for if (T >= 8) num_threads(threads) schedule(static)
    for (long t = 0; t < T; t++) {
        const uint8_t *row = w + (ids ? ids[t] : t) * s->row_bytes;
        if (out_bf16) {
            float *f = tmp + (long)omp_get_thread_num() * K;
            dequant_row(s->fmt, row, K, f);
            f32_row_to_bf16(f, K, (uint16_t *)out + t * K);
        } else {
            dequant_row(s->fmt, row, K, (float *)out + t * K);
        }
    }
    free(tmp); /* weights only: nothing of a request's to wipe */
    return 0;
}
