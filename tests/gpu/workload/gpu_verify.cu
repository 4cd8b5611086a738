// gpu_verify: a CUDA workload whose device memory must survive checkpoint/restore bit for bit.
//
//   gpu_verify [--procs N] [--fleet] MIB LOG [INTERVAL_MS=500] [MAX_STEPS=0 (forever)]
//
// Holds MIB MiB of device memory (plain cudaMalloc). Step 0 fills it with pattern(i, 0). Then,
// every INTERVAL_MS, it verifies the whole buffer on the GPU against pattern(i, step) (counting
// mismatching 64-bit words with an atomic counter), rewrites it with pattern(i, step + 1), and
// appends one line to LOG (opened, appended and closed each step, so no descriptor stays open
// on it across a checkpoint):
//
//   step=<verified step> mismatches=<this step> total=<all steps> ts=<unix ms> run=<id>
//       pid=<pid> mib=<MIB> gpu_ms=<verify+rewrite time> proc=<process index>
//
// --procs N: the process forks N workers before any CUDA call (it never touches the GPU
// itself) and waits for them. Worker i holds MIB/N MiB with its own buffer, its own `run` and
// its own lines, all tagged proc=i, in the same LOG (each line is one O_APPEND write). The
// parent writes `parent pid=<pid> procs=N ...` once, `child-exit proc=<i> ...` when a worker
// ends, forwards SIGTERM/SIGINT to the workers and exits non-zero if any worker did. Without
// --procs there is one process, which logs proc=0.
//
// --fleet: the shape of scripts/bench-fleet.sh (issue 21): the first 5/8 of the buffer are
// "weights", pattern(i, FLEET_WEIGHTS) — the same bytes in every process and every run, like a
// model loaded from the same file —, the next 5/16 a zero "KV cache", the last 1/16 the
// changing state, pattern(i ^ salt, step) with a salt drawn per run (so two replicas differ
// there). Each step verifies all three and rewrites only the state.
//
// `run` is drawn once at start: a restored process keeps it, a restarted one gets a new one, so
// the log tells a continuation from a restart. The line also goes to stdout (non-blocking:
// nobody may be reading it). Any mismatch is shouted on stderr and in LOG (`MISMATCH ...`) and
// the program keeps going; a CUDA error writes `ERROR ...` to LOG and exits with status 3.
//
// Build (needs only libcuda.so.1 from the driver at run time):
//   nvcc -O2 -arch=sm_90 -cudart static -o gpu_verify gpu_verify.cu
// CPU stand-in with the same output, for rehearsing the test scripts without a GPU:
//   g++ -O2 -x c++ -o gpu_verify gpu_verify.cu
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#define HD __host__ __device__
#else
#define HD
#endif

static HD inline uint64_t pattern(uint64_t i, uint64_t step) {
    // splitmix64 of (index, step): every word changes every step, no two steps alike.
    uint64_t z = i * 0x9E3779B97F4A7C15ull + (step + 1) * 0xD1B54A32D192ED03ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const uint64_t FLEET_WEIGHTS = 0x5eed;

// The word at index i of n after `step` steps.
static HD inline uint64_t expected(uint64_t i, uint64_t n, uint64_t step, uint64_t salt,
                                   int fleet) {
    if (!fleet) return pattern(i, step);
    if (i < n / 8 * 5) return pattern(i, FLEET_WEIGHTS);
    if (i < n / 16 * 15) return 0;
    return pattern(i ^ salt, step);
}

static int g_fleet;     // --fleet
static uint64_t g_salt; // the run's salt for the fleet state
static const char *g_log;
static int g_proc;  // worker index (proc=), 0 without --procs
static volatile sig_atomic_t g_stop;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// One line to LOG (open/append/close) and to stdout (non-blocking, errors ignored).
static void emit(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = sizeof line - 2;
    line[n++] = '\n';
    int fd = open(g_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, line, n);
        (void)w;
        close(fd);
    }
    int fl = fcntl(1, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK)) fcntl(1, F_SETFL, fl | O_NONBLOCK);
    ssize_t w = write(1, line, n);
    (void)w;
}

static void on_term(int sig) {
    (void)sig;
    g_stop = 1;
}

#ifdef __CUDACC__
__global__ void fill_kernel(uint64_t *buf, uint64_t n, uint64_t step, uint64_t salt, int fleet) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x)
        buf[i] = expected(i, n, step, salt, fleet);
}

// Verifies step `step` and rewrites for `step + 1` in one pass.
__global__ void verify_kernel(uint64_t *buf, uint64_t n, uint64_t step, uint64_t salt,
                              int fleet, unsigned long long *bad,
                              unsigned long long *first_bad) {
    unsigned long long local = 0;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        uint64_t want = expected(i, n, step, salt, fleet), next = expected(i, n, step + 1, salt, fleet);
        if (buf[i] != want) {
            if (local == 0) atomicMin(first_bad, (unsigned long long)i);
            local++;
        }
        if (next != want || buf[i] != want) buf[i] = next;
    }
    if (local) atomicAdd(bad, local);
}

#define CK(call)                                                                        \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            emit("ERROR cuda call %s failed: %s (%s) ts=%llu proc=%d", #call,            \
                 cudaGetErrorName(e_), cudaGetErrorString(e_), (unsigned long long)now_ms(), \
                 g_proc);                                                               \
            fprintf(stderr, "gpu_verify: %s: %s\n", #call, cudaGetErrorString(e_));     \
            exit(3);                                                                    \
        }                                                                               \
    } while (0)

struct Buf {
    uint64_t *d;
    uint64_t n;
    unsigned long long *counters;  // [0] = mismatches, [1] = first bad index
    int blocks;
};

static void buf_init(Buf *b, uint64_t bytes) {
    b->n = bytes / sizeof(uint64_t);
    CK(cudaSetDevice(0));
    CK(cudaMalloc((void **)&b->d, b->n * sizeof(uint64_t)));
    CK(cudaMalloc((void **)&b->counters, 2 * sizeof(unsigned long long)));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    b->blocks = sms * 8;
    fill_kernel<<<b->blocks, 256>>>(b->d, b->n, 0, g_salt, g_fleet);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
}

static unsigned long long buf_step(Buf *b, uint64_t step, unsigned long long *first) {
    unsigned long long init[2] = {0, ~0ull}, out[2];
    CK(cudaMemcpy(b->counters, init, sizeof init, cudaMemcpyHostToDevice));
    verify_kernel<<<b->blocks, 256>>>(b->d, b->n, step, g_salt, g_fleet, &b->counters[0],
                                      &b->counters[1]);
    CK(cudaGetLastError());
    CK(cudaMemcpy(out, b->counters, sizeof out, cudaMemcpyDeviceToHost));
    *first = out[1];
    return out[0];
}

static const char *engine_name(void) {
    static char name[320];
    cudaDeviceProp p;
    int drv = 0;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "cuda";
    cudaDriverGetVersion(&drv);
    snprintf(name, sizeof name, "cuda device=\"%s\" driver_api=%d", p.name, drv);
    return name;
}
#else
struct Buf {
    uint64_t *d;
    uint64_t n;
};

static void buf_init(Buf *b, uint64_t bytes) {
    b->n = bytes / sizeof(uint64_t);
    b->d = (uint64_t *)malloc(b->n * sizeof(uint64_t));
    if (!b->d) {
        emit("ERROR malloc of %llu bytes failed proc=%d", (unsigned long long)bytes, g_proc);
        exit(3);
    }
    for (uint64_t i = 0; i < b->n; i++) b->d[i] = expected(i, b->n, 0, g_salt, g_fleet);
}

static unsigned long long buf_step(Buf *b, uint64_t step, unsigned long long *first) {
    unsigned long long bad = 0;
    *first = ~0ull;
    for (uint64_t i = 0; i < b->n; i++) {
        uint64_t want = expected(i, b->n, step, g_salt, g_fleet);
        uint64_t next = expected(i, b->n, step + 1, g_salt, g_fleet);
        if (b->d[i] != want) {
            if (!bad) *first = i;
            bad++;
        }
        if (next != want || b->d[i] != want) b->d[i] = next;
    }
    return bad;
}

static const char *engine_name(void) { return "cpu-stand-in"; }
#endif

// One worker: the buffer, the verify loop, the log lines. Returns the exit status.
static int worker(uint64_t mib, long interval_ms, uint64_t max_steps) {
    // The run id: unique per process start, kept by a restored process.
    char run[17];
    {
        uint64_t seed = now_ms() ^ ((uint64_t)getpid() << 32) ^ ((uint64_t)g_proc << 20);
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            uint64_t r;
            if (read(fd, &r, sizeof r) == (ssize_t)sizeof r) seed ^= r;
            close(fd);
        }
        snprintf(run, sizeof run, "%016llx", (unsigned long long)pattern(seed, 7));
        g_salt = pattern(seed, 11);
    }

    double t0 = mono_ms();
    Buf b;
    buf_init(&b, mib << 20);
    emit("start run=%s pid=%d mib=%llu interval_ms=%ld init_ms=%.1f ts=%llu proc=%d %s", run,
         (int)getpid(), (unsigned long long)mib, interval_ms, mono_ms() - t0,
         (unsigned long long)now_ms(), g_proc, engine_name());

    unsigned long long total = 0;
    for (uint64_t step = 0; !g_stop && (max_steps == 0 || step < max_steps); step++) {
        struct timespec ts = {interval_ms / 1000, (interval_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR && !g_stop) {
        }
        if (g_stop) break;
        double g0 = mono_ms();
        unsigned long long first = 0;
        unsigned long long bad = buf_step(&b, step, &first);
        double gms = mono_ms() - g0;
        total += bad;
        if (bad) {
            fprintf(stderr,
                    "gpu_verify: MISMATCH!!! step=%llu mismatches=%llu first_index=%llu run=%s "
                    "proc=%d\n",
                    (unsigned long long)step, bad, first, run, g_proc);
            emit("MISMATCH step=%llu mismatches=%llu first_index=%llu run=%s ts=%llu proc=%d",
                 (unsigned long long)step, bad, first, run, (unsigned long long)now_ms(), g_proc);
        }
        emit("step=%llu mismatches=%llu total=%llu ts=%llu run=%s pid=%d mib=%llu gpu_ms=%.2f "
             "proc=%d",
             (unsigned long long)step, bad, total, (unsigned long long)now_ms(), run,
             (int)getpid(), (unsigned long long)mib, gms, g_proc);
    }
    emit("exit run=%s total=%llu ts=%llu proc=%d", run, total, (unsigned long long)now_ms(),
         g_proc);
    return total ? 1 : 0;
}

static pid_t g_children[256];
static int g_nchildren;

static void forward_term(int sig) {
    g_stop = 1;
    for (int i = 0; i < g_nchildren; i++)
        if (g_children[i] > 0) kill(g_children[i], sig);
}

int main(int argc, char **argv) {
    int procs = 0;
    if (argc > 2 && strcmp(argv[1], "--procs") == 0) {
        procs = atoi(argv[2]);
        argv += 2;
        argc -= 2;
        if (procs < 1 || procs > 256) {
            fprintf(stderr, "gpu_verify: --procs must be 1..256\n");
            return 2;
        }
    }
    if (argc > 1 && strcmp(argv[1], "--fleet") == 0) {
        g_fleet = 1;
        argv += 1;
        argc -= 1;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s [--procs N] [--fleet] MIB LOG [INTERVAL_MS=500] [MAX_STEPS=0]\n",
                argv[0]);
        return 2;
    }
    uint64_t mib = strtoull(argv[1], NULL, 10);
    g_log = argv[2];
    long interval_ms = argc > 3 ? atol(argv[3]) : 500;
    uint64_t max_steps = argc > 4 ? strtoull(argv[4], NULL, 10) : 0;
    if (mib == 0 || interval_ms <= 0 || (procs > 0 && mib < (uint64_t)procs)) {
        fprintf(stderr, "gpu_verify: MIB and INTERVAL_MS must be positive (MIB >= procs)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (procs == 0) return worker(mib, interval_ms, max_steps);

    // --procs: workers only; this process never initialises CUDA (a CUDA context does not
    // survive fork).
    uint64_t each = mib / procs;
    for (int i = 0; i < procs; i++) {
        pid_t p = fork();
        if (p < 0) {
            emit("ERROR fork of worker %d failed: %s", i, strerror(errno));
            forward_term(SIGKILL);
            return 3;
        }
        if (p == 0) {
            g_nchildren = 0;
            g_proc = i;
            _exit(worker(each, interval_ms, max_steps));
        }
        g_children[g_nchildren++] = p;
    }
    signal(SIGTERM, forward_term);
    signal(SIGINT, forward_term);
    emit("parent pid=%d procs=%d mib_each=%llu ts=%llu", (int)getpid(), procs,
         (unsigned long long)each, (unsigned long long)now_ms());
    int worst = 0, left = procs;
    while (left > 0) {
        int st = 0;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int idx = -1;
        for (int i = 0; i < g_nchildren; i++)
            if (g_children[i] == p) idx = i;
        if (idx < 0) continue;  // not ours (as pid 1 of a container, an orphan)
        g_children[idx] = 0;
        left--;
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (code > worst) worst = code;
        emit("child-exit proc=%d pid=%d status=%d ts=%llu", idx, (int)p, code,
             (unsigned long long)now_ms());
    }
    return worst;
}
