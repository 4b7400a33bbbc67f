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
 * Threads: OpenMP over chunks of weight rows (every thread reads its own weights once), and up to
 * TILE activation rows per weight row, so that a block is unpacked once for several rows (the
 * prefill and batch path). The library shares torch's libgomp, hence torch's thread count.
 *
 * The quantized activations derive from user data: they live in one scratch allocation per call,
 * wiped before it is freed.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TL_X86 1
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TL_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define TL_CLONES
#endif

/* F_Q4_0R / F_Q4_1R: the same blocks regrouped per row (see RowSplit below) */
enum { F_Q8_0 = 0, F_Q4_0 = 1, F_Q4_1 = 2, F_Q4_K = 3, F_Q5_K = 4, F_Q6_K = 5, F_Q4_0R = 6, F_Q4_1R = 7 };
enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };
enum { QB = 32, QK_K = 256, TILE = 4, ROW_CHUNK = 16 };

typedef struct {
    int fmt;
    long rows;       /* N */
    long cols;       /* K, a multiple of the format's block size */
    long row_bytes;  /* bytes of one weight row */
} QShape;

/* Quantized activations: row t's block b is q[t*K + 32b ..], scale d[t*nb + b],
 * ds[t*nb + b] = d * sum(q of the block), s16[(t*nb + b)*2 + h] = sum(q of half h). */
typedef struct {
    int8_t *q;
    float *d, *ds;
    int32_t *s16;
    long K, nb;
} Act;

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

static void quantize_row(const float *x, long K, int8_t *q, float *d, float *ds, int32_t *s16) {
    for (long b = 0; b < K / QB; b++) {
        const float *xb = x + b * QB;
        float amax = 0.f;
        for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float db = amax / 127.f, id = db > 0.f ? 1.f / db : 0.f;
        int32_t s[2] = {0, 0};
        for (int i = 0; i < QB; i++) {
            const int v = (int)lrintf(xb[i] * id);
            q[b * QB + i] = (int8_t)v;
            s[i >> 4] += v;
        }
        d[b] = db;
        ds[b] = db * (float)(s[0] + s[1]);
        s16[2 * b] = s[0];
        s16[2 * b + 1] = s[1];
    }
}

/* tmp: one K-float row per thread (bf16 inputs are widened there first) */
static void quantize_acts(const void *x, int x_bf16, long T, const Act *a, float *tmp_rows) {
    const long K = a->K, nb = a->nb;
#pragma omp parallel for if (T >= 8) schedule(static)
    for (long t = 0; t < T; t++) {
        const float *row = (const float *)x + t * K;
        if (x_bf16) {
            float *tmp = tmp_rows + (long)omp_get_thread_num() * K;
            const uint16_t *xr = (const uint16_t *)x + t * K;
            for (long i = 0; i < K; i++) tmp[i] = bf16_to_f32(xr[i]);
            row = tmp;
        }
        quantize_row(row, K, a->q + t * K, a->d + t * nb, a->ds + t * nb, a->s16 + t * nb * 2);
    }
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
 * value changes): a row of nb blocks is [nb x 16 code bytes][nb x f16 d][nb x f16 m (Q4_1)], so
 * 16 scales convert in one instruction and two blocks' codes are one 32-byte load.
 */
static inline const uint8_t *rs_codes(const uint8_t *row, long b) { return row + b * 16; }
static inline const uint8_t *rs_d(const uint8_t *row, long nb, long b) { return row + nb * 16 + 2 * b; }
static inline const uint8_t *rs_m(const uint8_t *row, long nb, long b) { return row + nb * 18 + 2 * b; }

static void get_block_nb(int fmt, const uint8_t *w, long b, long nb, Blk *o);

/* nb: blocks per row, needed by the row-split formats only */
static void get_block_nb(int fmt, const uint8_t *w, long b, long nb, Blk *o) {
    o->m = 0.f;
    if (fmt == F_Q4_0R || fmt == F_Q4_1R) {
        const uint8_t *qs = rs_codes(w, b);
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
            const long ab = (t0 + t) * a->nb + b;
            const int8_t *q = a->q + ab * QB;
            int32_t i0 = 0, i1 = 0;
            if (fmt == F_Q8_0) {
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

#define LD_ACT(t, b) _mm256_loadu_si256((const __m256i *)(a->q + ((t0 + (t)) * nb + (b)) * QB))
#define ACT(arr, t, b) (a->arr[(t0 + (t)) * nb + (b)])

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

#define BODY_Q4R(DOT)                                                                          \
    for (long b = 0; b < nb; b++) {                                                            \
        const float d = ld_f16(rs_d(w, nb, b));                                                \
        const float m = fmt == F_Q4_0R ? -8.f * d : ld_f16(rs_m(w, nb, b));                    \
        const __m256i u = nibbles16(rs_codes(w, b));                                           \
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
                    const int32_t *s16 = a->s16 + 2 * ((t0 + t) * nb + b);                     \
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
        else if (fmt == F_Q4_0R || fmt == F_Q4_1R) { BODY_Q4R(DOT) }                           \
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
DEFINE_SIMD_DOT(dot_avx512_ymm, VNNI_TARGET, dot_us_vnni)

/*
 * Row-split Q4 on AVX-512: two blocks per 512-bit dot product, scales for 16 blocks at a time.
 *   codes of blocks b, b+1 (32 bytes):  lo = [b: 0-15 | b+1: 0-15], hi = [b: 16-31 | b+1: 16-31]
 *   u = [b lo | b hi | b+1 lo | b+1 hi]  (one vpermt2q), so lanes 0-7 are block b, 8-15 block b+1
 *   sc[t] = d_w[16] * d_a[t][16]; the pair's scale vector picks sc[2p] x8, sc[2p+1] x8
 *   offsets: sum_b m_b ds_a[b], 16 blocks per fused multiply-add
 */
VNNI_TARGET static inline __attribute__((always_inline)) void q4r_avx512_nt(
    int fmt, const uint8_t *w, const Act *a, long t0, const int NT, float *out)
{
    const long nb = a->nb;
    const __m512i perm = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m512 acc[2][TILE], accm[TILE];
    for (int t = 0; t < NT; t++) { acc[0][t] = acc[1][t] = accm[t] = _mm512_setzero_ps(); }
    for (long b0 = 0; b0 < nb; b0 += 16) {
        const int n = nb - b0 < 16 ? (int)(nb - b0) : 16;
        const __mmask16 mk = (__mmask16)((1u << n) - 1);
        const __m512 dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, rs_d(w, nb, b0)));
        const __m512 mw = fmt == F_Q4_0R ? _mm512_mul_ps(dw, _mm512_set1_ps(-8.f))
                                         : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mk, rs_m(w, nb, b0)));
        __m512 sc[TILE];
        for (int t = 0; t < NT; t++) {
            const long ab = (t0 + t) * nb + b0;
            sc[t] = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(mk, a->d + ab));
            accm[t] = _mm512_fmadd_ps(mw, _mm512_maskz_loadu_ps(mk, a->ds + ab), accm[t]);
        }
        for (int p = 0; p < n / 2; p++) {
            const long b = b0 + 2 * p;
            const __m256i x = _mm256_loadu_si256((const __m256i *)rs_codes(w, b));
            const __m256i lo = _mm256_and_si256(x, m4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
            const __m512i u = _mm512_permutex2var_epi64(_mm512_castsi256_si512(lo), perm, _mm512_castsi256_si512(hi));
            const __m512i pick = _mm512_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p,
                                                   2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                   2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1);
            for (int t = 0; t < NT; t++) {
                const __m512i act = _mm512_loadu_si512((const void *)(a->q + ((t0 + t) * nb + b) * QB));
                const __m512i I = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, act);
                acc[p & 1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_permutexvar_ps(pick, sc[t]),
                                                acc[p & 1][t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        out[t] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0][t], acc[1][t]), accm[t]));
}

VNNI_TARGET static void dot_avx512(int fmt, const uint8_t *w, const Act *a, long t0, int nt, float *out) {
    if (fmt != F_Q4_0R && fmt != F_Q4_1R) {
        dot_avx512_ymm(fmt, w, a, t0, nt, out);
        return;
    }
    switch (nt) {
    case 1: q4r_avx512_nt(fmt, w, a, t0, 1, out); break;
    case 2: q4r_avx512_nt(fmt, w, a, t0, 2, out); break;
    case 3: q4r_avx512_nt(fmt, w, a, t0, 3, out); break;
    default: q4r_avx512_nt(fmt, w, a, t0, 4, out); break;
    }
}

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
    static const long block[] = {32, 32, 32, 256, 256, 256, 64, 64}, bytes[] = {34, 18, 20, 144, 176, 210, 36, 40};
    if (s->fmt < 0 || s->fmt > F_Q4_1R || s->cols <= 0 || s->cols % block[s->fmt]) return 0;
    return s->row_bytes == s->cols / block[s->fmt] * bytes[s->fmt];
}

/*
 * y[t * ldy + n] = sum_k x[t][k] W[n][k] (+ bias[n]) for t < T, n < N; x float32 or bfloat16
 * [T][K] contiguous; y float32 or bfloat16. isa <= tl_q_isa(). Returns 0, 1 when scratch memory
 * cannot be allocated, 2 on a bad shape or instruction set.
 */
int tl_qmatmul(const QShape *s, const uint8_t *w, const void *x, long T, int x_bf16, void *y, long ldy,
               int y_bf16, const float *bias, int isa) {
    if (!shape_ok(s) || isa < 0 || isa > cpu_max_isa() || T < 0) return 2;
    const long K = s->cols, nb = K / QB, N = s->rows;
    const int threads = omp_get_max_threads();
    const size_t bytes = (size_t)T * K + sizeof(float) * (2 * T * nb + (size_t)threads * K) +
                         sizeof(int32_t) * 2 * T * nb;
    char *scratch = malloc(bytes + 64);
    if (!scratch) return 1;
    Act a = {.K = K, .nb = nb};
    a.d = (float *)scratch;
    a.ds = a.d + T * nb;
    float *tmp = a.ds + T * nb;
    a.s16 = (int32_t *)(tmp + (size_t)threads * K);
    a.q = (int8_t *)(a.s16 + 2 * T * nb);
    quantize_acts(x, x_bf16, T, &a, tmp);
    dot_fn dot = dot_portable;
#ifdef TL_X86
    if (isa == ISA_AVX2) dot = dot_avx2;
    if (isa == ISA_AVX512) dot = dot_avx512;
#endif
    const long chunks = (N + ROW_CHUNK - 1) / ROW_CHUNK;
#pragma omp parallel for schedule(static)
    for (long c = 0; c < chunks; c++) {
        const long n1 = (c + 1) * ROW_CHUNK < N ? (c + 1) * ROW_CHUNK : N;
        for (long t0 = 0; t0 < T; t0 += TILE) {
            const int nt = T - t0 < TILE ? (int)(T - t0) : TILE;
            for (long n = c * ROW_CHUNK; n < n1; n++) {
                float out[TILE];
                dot(s->fmt, w + n * s->row_bytes, &a, t0, nt, out);
                const float bn = bias ? bias[n] : 0.f;
                for (int t = 0; t < nt; t++) {
                    const long i = (t0 + t) * ldy + n;
                    if (y_bf16) ((uint16_t *)y)[i] = f32_to_bf16(out[t] + bn);
                    else ((float *)y)[i] = out[t] + bn;
                }
            }
        }
    }
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
    } else if (fmt == F_Q4_0 || fmt == F_Q4_1 || fmt == F_Q4_0R || fmt == F_Q4_1R) {
        /* (codes, d, m) of block b; then one branch-free loop per kind (so that it vectorizes) */
        const int sz = fmt == F_Q4_0 ? 18 : 20, split = fmt >= F_Q4_0R, q40 = fmt == F_Q4_0 || fmt == F_Q4_0R;
        for (long b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * sz, *qs = split ? rs_codes(row, b) : blk + sz - 16;
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
    const int threads = omp_get_max_threads();
    float *tmp = out_bf16 ? malloc(sizeof(float) * K * threads) : NULL;
    if (out_bf16 && !tmp) return 1;
#pragma omp parallel for if (T >= 8) schedule(static)
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
