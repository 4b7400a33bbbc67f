/*
 * How many threads the kernels' parallel regions use: all of OpenMP's, or one while the machine
 * is oversubscribed.
 *
 * Every kernel region ends in a barrier, and a decode step passes hundreds of them. When other
 * processes want the cores too, the thread a barrier waits for is often descheduled, and each
 * barrier then costs a scheduler time slice: decoding fell from ~120 to ~6 tokens/s with two
 * CPU-bound processes beside the engine. One thread has no barrier to wait at.
 *
 * The signal is the calling thread's own time waiting on a run queue (/proc/thread-self/
 * schedstat, second field): at most every CHECK_MS of wall time, its share of that interval.
 * Above ENTER the kernels run on one thread, for at least a hold; below LEAVE they use all again.
 * With one busy process beside a 2-core engine, one thread has a core to itself and waits for
 * nothing, so the team comes back, meets the contention again within a check and leaves: each such
 * return doubles the hold (HOLD_MS up to MAX_HOLD_MS), and a team that lasts resets it.
 * The machine's load decides this, never a request: and the kernels' results do not depend on the
 * number of threads (each output row is one thread's work in a fixed order), so neither do a
 * request's numbers.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <omp.h>

enum { CHECK_MS = 50, HOLD_MS = 500, MAX_HOLD_MS = 8000 };
#define ENTER 0.15 /* run-queue wait / wall time that makes the kernels go single-threaded */
#define LEAVE 0.05 /* ... and that lets them use every thread again */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int single;          /* read without the lock: a stale value only delays a switch */
static volatile long next_check_ns;  /* when the next look at schedstat is due */
static long last_wall_ns, last_wait_ns, single_since_ns, team_since_ns, hold_ns = HOLD_MS * 1000000L;
static pthread_t last_thread;
static int over; /* the last interval's share was at least ENTER */
static int mode = -1; /* TRACELESS_CPU_TEAM: 0 "auto" (default), 1 "all" threads always, 2 "one" always */

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* The calling thread's run-queue wait in ns, or -1 where the kernel does not report it. */
static long runqueue_wait_ns(void) {
    char buf[96];
    const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    strtoull(buf, &end, 10); /* time on a CPU */
    const long wait = (long)strtoull(end, &end, 10);
    return wait;
}

/* The decision alone (tests call it): 1 for one thread, 0 for all, given the share of an
 * interval spent waiting for a CPU, the current state, how long it has held, the hold, and
 * whether the previous interval was over ENTER too. */
int tl_team_decide(double wait_share, int was_single, long held_ns, long hold, int over_before) {
    if (was_single) return held_ns < hold || wait_share > LEAVE;
    return wait_share >= ENTER && over_before; /* two checks in a row: not one start-up burst */
}

/* The hold of a single-threaded spell that starts now, after a team spell of team_ns. */
long tl_team_hold(long team_ns, long previous) {
    if (team_ns > 4L * CHECK_MS * 1000000L) return HOLD_MS * 1000000L;
    return previous * 2 < MAX_HOLD_MS * 1000000L ? previous * 2 : MAX_HOLD_MS * 1000000L;
}

static void check(long now) {
    if (pthread_mutex_trylock(&lock) != 0) return;
    if (now >= next_check_ns) {
        const long wait = runqueue_wait_ns();
        const pthread_t self = pthread_self();
        if (wait >= 0 && pthread_equal(self, last_thread) && now > last_wall_ns) {
            const double share = (double)(wait - last_wait_ns) / (double)(now - last_wall_ns);
            const int next = tl_team_decide(share, single, now - single_since_ns, hold_ns, over);
            over = share >= ENTER;
            if (next && !single) {
                hold_ns = tl_team_hold(now - team_since_ns, hold_ns);
                single_since_ns = now;
            }
            if (!next && single) team_since_ns = now;
            single = next;
        }
        last_thread = self;
        last_wall_ns = now;
        last_wait_ns = wait;
        next_check_ns = now + CHECK_MS * 1000000L;
    }
    pthread_mutex_unlock(&lock);
}

/* Threads for the next kernel region. */
int tl_team_threads(void) {
    if (mode < 0) {
        const char *env = getenv("TRACELESS_CPU_TEAM");
        mode = env && !strcmp(env, "all") ? 1 : env && !strcmp(env, "one") ? 2 : 0; /* Python checks the word */
    }
    const int all = omp_get_max_threads();
    if (mode == 1 || all < 2) return all;
    if (mode == 2) return 1;
    const long now = now_ns();
    if (now >= next_check_ns) check(now);
    return single ? 1 : all;
}

/* 1 while the kernels run single-threaded (for the tests). */
int tl_team_single(void) { return mode == 2 || (mode != 1 && single); }
