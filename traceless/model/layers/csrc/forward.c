/*
 * The decoder layers of one step in one call and one OpenMP parallel region, for the CPU models
 * whose matmuls all run on quantized weights (csrc/qmatmul.c) and whose attention is the paged
 * kernel (csrc/kernels.c): the built-in model's case. The Python loop over layers (LlamaModel.
 * forward) makes ~10 calls per layer, each a ctypes call and a parallel region of its own; at one
 * decoded token per step that was a third of the step, the second thread idle through all of it.
 * Here the team stays together from the first norm to the last: every kernel is a worksharing loop
 * (NAME_for / NAME_team in the other files) whose closing barrier orders it before the next.
 *
 *     h = norm(x, attn_norm[0])
 *     per layer:  qkv = h Wqkv^T (+ b)      rope in place, this step's k, v into the paged cache
 *                 o = attention(q) Wo^T     x += o;  h = norm(x, mlp_norm)
 *                 gu = h Wgu^T              act = silu(gu[:I]) * gu[I:]
 *                 m = act Wd^T              x += m;  h = norm(x, next layer's attn_norm or the final norm)
 *
 * The same kernel functions compute every value, in the same order, as the per-call path: a
 * request's numbers do not depend on which of the two ran its step (the runner takes this one only
 * for steps whose sequences all go through the paged kernel, see model/layers/fused_decode.py).
 *
 * Buffers: x, h, qkv, attn, o, gu, act, m are the caller's (torch tensors, float32, row-major,
 * T rows). The quantized activations of every matmul live in one scratch allocation and the
 * attention scores in one per thread, all wiped before they are freed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "shapes.h"

size_t tl_qmatmul_scratch_bytes(long K, long T, int threads);
int tl_qshape_ok(const QShape *s, int isa);
void tl_qmatmul_team(const QShape *s, const uint8_t *w, const float *x, long T, float *y, long ldy,
                     const float *bias, int isa, char *scratch, int threads);
void tl_add_rms_norm_f32_for(float *x, const float *delta, const float *w, float *out, long rows, int H, float eps);
void tl_silu_mul_f32_for(const float *gu, float *out, long rows, int I);
void tl_rope_cache_f32_for(const RopeShape *s, float *qkv, const float *cos_t, const float *sin_t,
                           const int64_t *positions, const int64_t *blocks, const int64_t *offsets,
                           float *k_cache, float *v_cache);
void tl_paged_attention_f32_team(const AttnShape *s, const float *q, const float *k_cache, const float *v_cache,
                                 const int32_t *block_tables, const int32_t *cu_q, const int32_t *context_lens,
                                 float *out, float *scratch, float *scores);
void tl_rope_cache_f32h_for(const RopeShape *s, float *qkv, const float *cos_t, const float *sin_t,
                            const int64_t *positions, const int64_t *blocks, const int64_t *offsets,
                            _Float16 *k_cache, _Float16 *v_cache);
void tl_paged_attention_f32h_team(const AttnShape *s, const float *q, const _Float16 *k_cache,
                                  const _Float16 *v_cache, const int32_t *block_tables, const int32_t *cu_q,
                                  const int32_t *context_lens, float *out, float *scratch, float *scores);

enum { MAX_PARTS = 3 };

/* One matmul of a layer: its weight as parts stacked by rows (a fused QKV whose tensors came in
 * different formats), part i writing output columns [col[i], col[i] + rows). */
typedef struct {
    int n_parts;
    QShape shape[MAX_PARTS];
    const uint8_t *w[MAX_PARTS];
    const float *bias[MAX_PARTS]; /* [rows] float32 or NULL */
    long col[MAX_PARTS];
} FwdMatmul;

typedef struct {
    const float *attn_norm, *mlp_norm; /* [H] */
    FwdMatmul qkv, o, gate_up, down;
    const float *cos, *sin; /* RoPE tables [positions][D / 2] */
    long kv_slot;           /* the layer's index into the cache's first dimension */
    int window;             /* keys each query sees; 0: all */
} FwdLayer;

typedef struct {
    int num_layers, hidden, num_heads, num_kv_heads, head_dim, inter, isa;
    float eps;
    const float *final_norm;
    const FwdLayer *layers;
} FwdModel;

typedef struct {
    long T;
    int num_layers; /* the first layers only (a self-speculation draft), then the final norm */
    float *x, *h, *qkv, *attn, *o, *gu, *act, *m;
    const int64_t *positions, *blocks, *offsets; /* [T] */
    void *k_cache, *v_cache;                     /* [slots][blocks][kv heads][D][BS], [..][BS][D] */
    long slot_elems;                             /* elements of one layer slot */
    int kv_f16;                                  /* the cache holds float16 (else float32) */
    int block_size, num_seqs, max_blocks;
    const int32_t *block_tables, *cu_q, *context_lens;
    float scale;
} FwdStep;

static long matmul_in(const FwdMatmul *mm) { return mm->shape[0].cols; }

static long matmul_out(const FwdMatmul *mm) {
    long n = 0;
    for (int i = 0; i < mm->n_parts; i++) n += mm->shape[i].rows;
    return n;
}

/* 1 when the shapes are consistent and every weight is one the kernels take (checked once, when
 * the model is bound). */
int tl_forward_check(const FwdModel *m) {
    const long H = m->hidden, qkv = (long)(m->num_heads + 2 * m->num_kv_heads) * m->head_dim;
    if (m->num_layers <= 0 || m->num_kv_heads <= 0 || m->num_heads % m->num_kv_heads || m->head_dim % 2) return 0;
    for (int l = 0; l < m->num_layers; l++) {
        const FwdLayer *L = &m->layers[l];
        const FwdMatmul *mms[4] = {&L->qkv, &L->o, &L->gate_up, &L->down};
        const long ins[4] = {H, (long)m->num_heads * m->head_dim, H, m->inter};
        const long outs[4] = {qkv, H, 2L * m->inter, H};
        for (int i = 0; i < 4; i++) {
            const FwdMatmul *mm = mms[i];
            if (mm->n_parts < 1 || mm->n_parts > MAX_PARTS || matmul_in(mm) != ins[i] || matmul_out(mm) != outs[i])
                return 0;
            long col = 0;
            for (int p = 0; p < mm->n_parts; p++) {
                if (!tl_qshape_ok(&mm->shape[p], m->isa) || mm->shape[p].cols != ins[i] || mm->col[p] != col) return 0;
                col += mm->shape[p].rows;
            }
        }
    }
    return 1;
}

static void matmul(const FwdMatmul *mm, const float *x, long T, float *y, int isa, char *scratch, int threads) {
    const long ldy = matmul_out(mm);
    for (int p = 0; p < mm->n_parts; p++)
        tl_qmatmul_team(&mm->shape[p], mm->w[p], x, T, y + mm->col[p], ldy, mm->bias[p], isa, scratch, threads);
}

static void layer(const FwdModel *m, const FwdStep *st, int l, char *act_scratch, int threads, float *scratch,
                  float *scores) {
    const FwdLayer *L = &m->layers[l];
    const long T = st->T, H = m->hidden;
    const int isa = m->isa;
    const long slot = L->kv_slot * st->slot_elems;
    const RopeShape rs = {T, m->num_heads, m->num_kv_heads, m->head_dim, st->block_size};
    const AttnShape as = {st->num_seqs, m->num_heads, m->num_kv_heads, m->head_dim, st->block_size, st->max_blocks,
                          st->scale, matmul_out(&L->qkv), L->window, 0.f, NULL};
    matmul(&L->qkv, st->h, T, st->qkv, isa, act_scratch, threads);
    if (st->kv_f16) {
        _Float16 *kc = (_Float16 *)st->k_cache + slot, *vc = (_Float16 *)st->v_cache + slot;
        tl_rope_cache_f32h_for(&rs, st->qkv, L->cos, L->sin, st->positions, st->blocks, st->offsets, kc, vc);
        tl_paged_attention_f32h_team(&as, st->qkv, kc, vc, st->block_tables, st->cu_q, st->context_lens, st->attn,
                                     scratch, scores);
    } else {
        float *kc = (float *)st->k_cache + slot, *vc = (float *)st->v_cache + slot;
        tl_rope_cache_f32_for(&rs, st->qkv, L->cos, L->sin, st->positions, st->blocks, st->offsets, kc, vc);
        tl_paged_attention_f32_team(&as, st->qkv, kc, vc, st->block_tables, st->cu_q, st->context_lens, st->attn,
                                    scratch, scores);
    }
    matmul(&L->o, st->attn, T, st->o, isa, act_scratch, threads);
    tl_add_rms_norm_f32_for(st->x, st->o, L->mlp_norm, st->h, T, (int)H, m->eps);
    matmul(&L->gate_up, st->h, T, st->gu, isa, act_scratch, threads);
    tl_silu_mul_f32_for(st->gu, st->act, T, m->inter);
    matmul(&L->down, st->act, T, st->m, isa, act_scratch, threads);
    const float *next = l + 1 < st->num_layers ? m->layers[l + 1].attn_norm : m->final_norm;
    tl_add_rms_norm_f32_for(st->x, st->m, next, st->h, T, (int)H, m->eps);
}

/* Runs st->num_layers layers on st->x (the embedded tokens; it ends as the residual stream) into
 * st->h (final-normed hidden states). Returns 0, 1 when scratch memory cannot be allocated, 2 on a
 * bad step. */
int tl_forward_layers(const FwdModel *m, const FwdStep *st) {
    if (st->num_layers < 1 || st->num_layers > m->num_layers || st->T < 1 || st->num_seqs < 1) return 2;
    const int threads = tl_team_threads();
    const long T = st->T, widest = m->inter > m->hidden ? m->inter : m->hidden;
    const long attn_in = (long)m->num_heads * m->head_dim, k_max = widest > attn_in ? widest : attn_in;
    const size_t act_bytes = tl_qmatmul_scratch_bytes(k_max, T, threads);
    char *act_scratch = calloc(act_bytes, 1);
    if (!act_scratch) return 1;
    const AttnShape as = {st->num_seqs, m->num_heads, m->num_kv_heads, m->head_dim, st->block_size, st->max_blocks,
                          st->scale, 0, 0, 0.f, NULL};
    const long n_scratch = attn_scratch_floats(&as), n_scores = attn_scores_floats(&as, st->context_lens);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        float *scratch = malloc(sizeof(float) * n_scratch), *scores = malloc(sizeof(float) * n_scores);
        failed = !scratch || !scores;
        float *s1 = failed ? NULL : scratch, *s2 = failed ? NULL : scores; /* NULL: the thread skips its tasks */
        tl_add_rms_norm_f32_for(st->x, NULL, m->layers[0].attn_norm, st->h, T, m->hidden, m->eps);
        for (int l = 0; l < st->num_layers; l++) layer(m, st, l, act_scratch, threads, s1, s2);
        if (scratch) memset(scratch, 0, sizeof(float) * n_scratch); /* derived from user data */
        if (scores) memset(scores, 0, sizeof(float) * n_scores);
        free(scratch);
        free(scores);
    }
    memset(act_scratch, 0, act_bytes);
    free(act_scratch);
    return failed;
}
