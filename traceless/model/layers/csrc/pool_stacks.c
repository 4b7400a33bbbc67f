/* The dead stacks of the OpenMP worker threads, cleared.

   The kernels (and torch's own CPU operators, which share this OpenMP runtime) run on a pool of
   worker threads kept by the thread that called them (the engine thread). What a kernel computed
   from a request stays in the dead part of each worker's stack: a tile of matmul results, spilled
   vector registers, an attention row. tl_scrub_dead_stack (server/csrc/dead_stack.c, compiled into
   this library too) clears a thread's stack below its caller; here every thread of the calling
   thread's team runs it, from below a zeroed gap that covers the frames the kernels' parallel
   regions had at the same depth (they were called from the same worker loop frame).

   tl_pool_stack_bounds reports each team thread's stack, for tests that search it. */
#define _GNU_SOURCE
#include <omp.h>
#include <stdint.h>
#include <string.h>

int tl_scrub_dead_stack(void);
int tl_stack_bounds(uintptr_t *low, uintptr_t *high);

#define GAP_BYTES 16384 /* more than any kernel's outlined parallel frame */

static __attribute__((noinline)) int scrub_from_below_a_gap(void) {
    unsigned char gap[GAP_BYTES];
    explicit_bzero(gap, sizeof gap);
    int rc = tl_scrub_dead_stack();
    __asm__ volatile("" : : "r"(gap) : "memory");
    return rc;
}

/* 0 when every thread of the team cleared its dead stack. */
int tl_scrub_pool_stacks(void) {
    int bad = 0;
#pragma omp parallel reduction(| : bad)
    bad |= scrub_from_below_a_gap() != 0;
    return bad;
}

/* Stack bounds of each team thread, by thread number, for at most cap threads; the team's size. */
int tl_pool_stack_bounds(uintptr_t *low, uintptr_t *high, int cap) {
    int n = 0;
#pragma omp parallel
    {
        int i = omp_get_thread_num();
        if (i < cap) tl_stack_bounds(&low[i], &high[i]);
#pragma omp single
        n = omp_get_num_threads();
    }
    return n;
}
