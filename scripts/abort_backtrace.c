/* LD_PRELOAD helper for the abort at interpreter exit (docs/PERF-NOTES.md, twenty-second and
 * twenty-third sessions): on SIGABRT (glibc's "free(): invalid pointer" ends in abort()) it prints
 * the native stack, one "library(symbol+offset)[address]" line a frame, then dies as before.
 * faulthandler prints only Python frames, and the image has no gdb.
 *
 *   gcc -shared -fPIC -O1 -o /tmp/abort_backtrace.so scripts/abort_backtrace.c
 *   LD_PRELOAD=/tmp/abort_backtrace.so python3 -m pytest ...
 */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void print_stack(int sig) {
    static const char banner[] = "\n=== native stack at SIGABRT\n";
    void *frames[96];
    int count;
    (void)sig;
    if (write(2, banner, sizeof banner - 1) < 0) { /* stderr gone: print the stack anyway */ }
    count = backtrace(frames, 96);
    backtrace_symbols_fd(frames, count, 2);
    signal(SIGABRT, SIG_DFL);
    raise(SIGABRT);
}

__attribute__((constructor)) static void install(void) {
    void *warm[2];
    /* The first backtrace() loads libgcc_s through dlopen, which allocates: do it now, while
     * malloc is sound, not inside the handler after the heap is corrupt. */
    backtrace(warm, 2);
    signal(SIGABRT, print_stack);
}
