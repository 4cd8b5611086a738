// raw_ckpt: the CUDA driver's process-checkpoint primitives, by hand, on another process.
//
//   raw_ckpt ACTION[,ACTION...] PID [LOCK_TIMEOUT_MS=0]
//
// ACTION: lock | checkpoint | restore | unlock | state | tid
//         suspend (= lock,checkpoint) | resume (= restore,unlock)
// Prints one line per action:
//   raw_ckpt action=<a> pid=<p> ms=<wall ms> result=<CUresult> name=<CUDA_...> [state=<s>|tid=<t>]
// and exits non-zero on the first failing action.
//
// libcuda.so.1 is dlopen()ed (GPUSNAP_LIBCUDA overrides the name/path), so this needs no CUDA
// toolkit to build: `cc -O2 -o raw_ckpt raw_ckpt.c -ldl`. Needs ptrace rights over PID (root).
// All argument structs are zeroed 64-byte blocks: valid on every driver since 12.8 (see
// shared/reference/cuda-checkpoint-api.md §3).
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    uint64_t reserved1[7];
} LockArgs;
typedef struct {
    uint64_t reserved[8];
} Args64;

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*drv_ver_fn)(int *);
typedef CUresult (*lock_fn)(int, LockArgs *);
typedef CUresult (*op_fn)(int, Args64 *);
typedef CUresult (*state_fn)(int, int *);
typedef CUresult (*tid_fn)(int, int *);
typedef CUresult (*errname_fn)(CUresult, const char **);

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *need(void *lib, const char *sym) {
    void *p = dlsym(lib, sym);
    if (!p) {
        fprintf(stderr, "raw_ckpt: %s not found in libcuda: %s\n", sym, dlerror());
        exit(2);
    }
    return p;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ACTION[,ACTION...] PID [LOCK_TIMEOUT_MS]\n", argv[0]);
        return 2;
    }
    const char *libname = getenv("GPUSNAP_LIBCUDA");
    if (!libname || !*libname) libname = "libcuda.so.1";
    void *lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "raw_ckpt: dlopen(%s): %s\n", libname, dlerror());
        return 2;
    }
    init_fn cuInit = (init_fn)need(lib, "cuInit");
    drv_ver_fn cuDriverGetVersion = (drv_ver_fn)need(lib, "cuDriverGetVersion");
    lock_fn lockf = (lock_fn)need(lib, "cuCheckpointProcessLock");
    op_fn ckptf = (op_fn)need(lib, "cuCheckpointProcessCheckpoint");
    op_fn restf = (op_fn)need(lib, "cuCheckpointProcessRestore");
    op_fn unlockf = (op_fn)need(lib, "cuCheckpointProcessUnlock");
    state_fn statef = (state_fn)need(lib, "cuCheckpointProcessGetState");
    tid_fn tidf = (tid_fn)need(lib, "cuCheckpointProcessGetRestoreThreadId");
    errname_fn errname = (errname_fn)dlsym(lib, "cuGetErrorName");

    double t0 = mono_ms();
    CUresult r = cuInit(0);
    int ver = 0;
    cuDriverGetVersion(&ver);
    fprintf(stderr, "raw_ckpt: cuInit=%d driver_api=%d init_ms=%.1f\n", r, ver, mono_ms() - t0);
    if (r != 0) return 2;

    int pid = atoi(argv[2]);
    unsigned int timeout = argc > 3 ? (unsigned int)strtoul(argv[3], NULL, 10) : 0;

    // Expand the action list.
    char list[512] = "";
    char *acts = strdup(argv[1]);
    for (char *a = strtok(acts, ","); a; a = strtok(NULL, ",")) {
        const char *x = a;
        if (!strcmp(a, "suspend")) x = "lock,checkpoint";
        else if (!strcmp(a, "resume")) x = "restore,unlock";
        if (*list) strncat(list, ",", sizeof list - strlen(list) - 1);
        strncat(list, x, sizeof list - strlen(list) - 1);
    }

    for (char *a = strtok(list, ","); a; a = strtok(NULL, ",")) {
        int extra = -1;
        const char *extra_name = NULL;
        double s = mono_ms();
        if (!strcmp(a, "lock")) {
            LockArgs la;
            memset(&la, 0, sizeof la);
            la.timeoutMs = timeout;
            r = lockf(pid, &la);
        } else if (!strcmp(a, "checkpoint")) {
            Args64 z;
            memset(&z, 0, sizeof z);
            r = ckptf(pid, &z);
        } else if (!strcmp(a, "restore")) {
            Args64 z;
            memset(&z, 0, sizeof z);
            r = restf(pid, &z);
        } else if (!strcmp(a, "unlock")) {
            Args64 z;
            memset(&z, 0, sizeof z);
            r = unlockf(pid, &z);
        } else if (!strcmp(a, "state")) {
            r = statef(pid, &extra);
            extra_name = "state";
        } else if (!strcmp(a, "tid")) {
            r = tidf(pid, &extra);
            extra_name = "tid";
        } else {
            fprintf(stderr, "raw_ckpt: unknown action %s\n", a);
            return 2;
        }
        double ms = mono_ms() - s;
        const char *name = "?";
        if (errname) errname(r, &name);
        if (extra_name)
            printf("raw_ckpt action=%s pid=%d ms=%.1f result=%d name=%s %s=%d\n", a, pid, ms, r,
                   name ? name : "?", extra_name, extra);
        else
            printf("raw_ckpt action=%s pid=%d ms=%.1f result=%d name=%s\n", a, pid, ms, r,
                   name ? name : "?");
        fflush(stdout);
        if (r != 0) return 1;
    }
    return 0;
}
