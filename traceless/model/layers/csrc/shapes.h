/* The argument structs the kernel files share (kernels.c, qmatmul.c, forward.c), defined once:
 * Python mirrors them with ctypes (kernels.py, qkernels.py, fused_decode.py). */
#ifndef TL_SHAPES_H
#define TL_SHAPES_H

#include <stdint.h>

/* a weight matrix in GGML blocks (qmatmul.c) */
typedef struct {
    int fmt;
    long rows;       /* N */
    long cols;       /* K, a multiple of the format's block size */
    long row_bytes;  /* bytes of one weight row */
} QShape;

/* one paged-attention call (kernels.c) */
typedef struct {
    int num_seqs;
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int block_size;
    int max_blocks;  /* row stride of block_tables */
    float scale;
    long q_stride;   /* elements between consecutive query rows (q may be a view into qkv rows) */
    int window;      /* keys each query sees, itself included; 0: all of them */
    float softcap;   /* 0: none */
    const float *sinks; /* [num_heads] float32, or NULL: none */
} AttnShape;

/* one RoPE + KV-cache write (kernels.c): T rows of qkv */
typedef struct {
    long rows;
    int num_heads, num_kv_heads, head_dim, block_size;
} RopeShape;

/* kernels.c: the floats of one paged-attention thread's scratch and scores */
long attn_scratch_floats(const AttnShape *s);
long attn_scores_floats(const AttnShape *s, const int32_t *context_lens);

int tl_team_threads(void); /* team.c: how many threads the next kernel region uses */

#endif
