/* The dead part of the calling thread's stack, cleared.

   A native library leaves its locals on the stack of the thread that called it: a regex literal
   llguidance parsed, a word a tokenizer split. Nothing frees or overwrites that memory (freed-memory
   scrubbing covers the heap only); it stays until a later call happens to reach as deep. Everything
   below this function's frame is dead once the call that put it there returned, so:

     - the pages from the stack's low end up to NEAR_BYTES below this frame are given back
       (madvise MADV_DONTNEED: a private anonymous page reads as zeros after it, and is not
       resident until used again);
     - the NEAR_BYTES and a few pages closest to this frame, where the madvise call itself runs,
       are overwritten with zeros from a local array instead.

   tl_stack_bounds reports the calling thread's stack, for tests that search it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NEAR_BYTES (64 * 1024)
#define NEAR_PAGES 4 /* more than this function's and madvise's frames and the alignment take */

int tl_stack_bounds(uintptr_t *low, uintptr_t *high) {
    pthread_attr_t attr;
    void *addr;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return -1;
    int rc = pthread_attr_getstack(&attr, &addr, &size);
    pthread_attr_destroy(&attr);
    if (rc != 0) return -1;
    *low = (uintptr_t)addr;
    *high = (uintptr_t)addr + size;
    return 0;
}

static __attribute__((noinline)) void wipe_near(size_t page) {
    /* a variable-length array reaching NEAR_BYTES + NEAR_PAGES pages below the caller's frame */
    size_t n = NEAR_BYTES + NEAR_PAGES * page;
    unsigned char buf[n];
    explicit_bzero(buf, n);
    __asm__ volatile("" : : "r"(buf) : "memory");
}

int tl_scrub_dead_stack(void) {
    uintptr_t low, high;
    if (tl_stack_bounds(&low, &high) != 0) return -1;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (here <= low || here > high || here - low <= NEAR_BYTES + (NEAR_PAGES + 1) * page) return -1;
    uintptr_t start = (low + page - 1) & ~(page - 1);
    uintptr_t end = (here - NEAR_BYTES) & ~(page - 1);
    /* ENOMEM: part of the range is not mapped (the main thread's stack not grown that far);
       the mapped part is still cleared */
    if (end > start && madvise((void *)start, end - start, MADV_DONTNEED) != 0 && errno != ENOMEM) return -1;
    wipe_near(page);
    return 0;
}
