/*
 * fake_libcuda.c: a test double of libcuda.so.1 for gpusnap.
 *
 * It implements the slice of the CUDA driver API gpusnap binds: cuInit,
 * cuGetProcAddress(_v2), version, error names, device queries, the six
 * cuCheckpointProcess* calls with the driver's state machine, and the CUDA 13.4
 * CustomStorage pieces (cuCheckpointOperationComplete, mapped regions).
 *
 * All process state lives in files, because the caller (the shim) and the
 * "CUDA process" (the workload) are different processes. The state directory is
 * $GPUSNAP_FAKE_CUDA_DIR, or, when that is unset, the directory holding this
 * library. The second rule lets tests run in parallel: each copies the library
 * into its own directory and gets a private instance without touching the
 * process environment.
 *
 * Layout (all optional except procs/):
 *   procs/<pid>              state word: running|locked|checkpointed|failed|
 *   procs/id-<id>-<nspid>    the same, for a process with GPUSNAP_FAKE_CUDA_ID=<id> in its
 *                            environment and pid <nspid> in its container (survives CRIU
 *                            restore, like real driver state)
 *                            checkpointing|restoring (empty = running).
 *                            Creating the file makes <pid> a CUDA process.
 *   driver_version           integer, default 13000 (like the 580 driver)
 *   devices                  lines "GPU-<uuid> <total bytes> <name...>"
 *   hidden_symbols           symbol names cuGetProcAddress pretends not to know
 *   init_error               cuInit returns this code
 *   unknown_pid_code         what calls on a non-CUDA pid return (default 1)
 *   faults/<pid>/<op>        tokens: code=N hang_ms=N busy_ms=N then=<state> once
 *                            op: lock checkpoint restore unlock get_state
 *                                restore_tid operation_complete
 *   vram/<key>/<dev>         device memory of a process on device index <dev>; <key> as
 *                            for procs/ (the pid, or id-<id>-<nspid>). CustomStorage maps
 *                            it; the driver-managed checkpoint moves it to
 *                            staged/<key>/ (the real driver copies it into process memory,
 *                            which CRIU then dumps) and its restore moves it back
 *   calls.log                one line per checkpoint call: "<op> <pid> <rc> k=v..."
 *   procaddr.log             one line per lookup: "<symbol> <version> <status>"
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUcheckpointOperation_st *CUcheckpointOperationHandle;
typedef struct { char bytes[16]; } CUuuid;

typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;

typedef struct {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;

typedef struct {
    CUdeviceptr devPtr;
    size_t size;
    CUstream stream;
} CUcheckpointCustomStoragePerDeviceData;

typedef struct {
    CUcheckpointOperationHandle handle;
    CUcheckpointCustomStoragePerDeviceData *perDeviceData;
    unsigned int deviceCount;
} CUcheckpointCustomStorageInfo;

typedef struct {
    CUcheckpointCustomStorageInfo **customStorageInfo_out;
    char reserved[64 - sizeof(CUcheckpointCustomStorageInfo *)];
} CUcheckpointCheckpointArgs;

typedef struct {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;

typedef struct {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    unsigned int padding0;
    CUcheckpointCustomStorageInfo **customStorageInfo_out;
    char reserved[64 - 8 - 2 * 4 - 8];
} CUcheckpointRestoreArgs;

_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "lock args");
_Static_assert(sizeof(CUcheckpointUnlockArgs) == 64, "unlock args");
_Static_assert(sizeof(CUcheckpointCheckpointArgs) == 64, "checkpoint args");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "restore args");
_Static_assert(sizeof(CUcheckpointGpuPair) == 32, "gpu pair");
_Static_assert(sizeof(CUcheckpointCustomStoragePerDeviceData) == 24, "per device");
_Static_assert(sizeof(CUcheckpointCustomStorageInfo) == 24, "storage info");

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

enum { PROC_SUCCESS = 0, PROC_SYMBOL_NOT_FOUND = 1, PROC_VERSION_NOT_SUFFICIENT = 2 };

enum {
    S_RUNNING = 0,
    S_LOCKED = 1,
    S_CHECKPOINTED = 2,
    S_FAILED = 3,
    S_CHECKPOINTING = 4,
    S_RESTORING = 5,
    S_COUNT = 6,
};
static const char *const STATE_NAMES[S_COUNT] = {
    "running", "locked", "checkpointed", "failed", "checkpointing", "restoring",
};

#define MAX_DEVICES 16
#define DEFAULT_VRAM_BYTES (64 * 1024)

/* ------------------------------------------------------------------------- */
/* state directory and small file helpers                                     */

static char g_dir[PATH_MAX];
static pthread_once_t g_dir_once = PTHREAD_ONCE_INIT;
static int g_initialized;

EXPORT CUresult cuInit(unsigned int flags);

static void resolve_dir(void) {
    const char *env = getenv("GPUSNAP_FAKE_CUDA_DIR");
    if (env && *env) {
        snprintf(g_dir, sizeof g_dir, "%s", env);
        return;
    }
    Dl_info info;
    if (dladdr((void *)&cuInit, &info) && info.dli_fname) {
        snprintf(g_dir, sizeof g_dir, "%s", info.dli_fname);
        char *slash = strrchr(g_dir, '/');
        if (slash) {
            *slash = '\0';
            return;
        }
    }
    snprintf(g_dir, sizeof g_dir, ".");
}

static const char *state_dir(void) {
    pthread_once(&g_dir_once, resolve_dir);
    return g_dir;
}

static void path_of(char *out, size_t cap, const char *fmt, ...) {
    char rel[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rel, sizeof rel, fmt, ap);
    va_end(ap);
    snprintf(out, cap, "%s/%s", state_dir(), rel);
}

/* Reads a whole small file; returns its length or -1 when it does not exist. */
static ssize_t read_small(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t total = 0;
    while ((size_t)total < cap - 1) {
        ssize_t n = read(fd, buf + total, cap - 1 - (size_t)total);
        if (n <= 0) break;
        total += n;
    }
    close(fd);
    buf[total] = '\0';
    return total;
}

static void trim(char *s) {
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

static long long read_number(const char *rel, long long dflt) {
    char path[PATH_MAX], buf[64];
    path_of(path, sizeof path, "%s", rel);
    if (read_small(path, buf, sizeof buf) <= 0) return dflt;
    return strtoll(buf, NULL, 10);
}

/* Atomic replace: readers in other processes never see a torn state word. */
static int write_atomic(const char *path, const void *data, size_t len) {
    char tmp[PATH_MAX + 64];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%lu", path, (int)getpid(), (unsigned long)pthread_self());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n <= 0) {
            close(fd);
            unlink(tmp);
            return -1;
        }
        p += n;
        left -= (size_t)n;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void mkdir_p(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    }
    mkdir(buf, 0755);
}

static void append_line(const char *rel, const char *fmt, ...) {
    char path[PATH_MAX], line[2048];
    path_of(path, sizeof path, "%s", rel);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    /* One write per line with O_APPEND keeps lines whole across processes. */
    ssize_t ignored = write(fd, line, (size_t)n);
    (void)ignored;
    close(fd);
}

static void sleep_ms(long ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int driver_version(void) { return (int)read_number("driver_version", 13000); }

/* What calls on a pid that is not a CUDA process return. The real 580 driver
 * gives NOT_INITIALIZED for a live non-CUDA process and OPERATING_SYSTEM for a
 * pid that does not exist; the default keeps the documented INVALID_VALUE. */
static CUresult unknown_pid_code(void) {
    return (CUresult)read_number("unknown_pid_code", CUDA_ERROR_INVALID_VALUE);
}

/* ------------------------------------------------------------------------- */
/* devices                                                                    */

struct device {
    CUuuid uuid;
    unsigned long long total;
    char name[256];
};

static int parse_uuid(const char *text, CUuuid *out) {
    if (strncmp(text, "GPU-", 4) == 0) text += 4;
    int nibbles = 0;
    memset(out, 0, sizeof *out);
    for (const char *p = text; *p && nibbles < 32; p++) {
        int v;
        if (*p == '-') continue;
        if (*p >= '0' && *p <= '9') v = *p - '0';
        else if (*p >= 'a' && *p <= 'f') v = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F') v = *p - 'A' + 10;
        else return -1;
        out->bytes[nibbles / 2] = (char)((unsigned char)out->bytes[nibbles / 2] | (v << (nibbles % 2 ? 0 : 4)));
        nibbles++;
    }
    return nibbles == 32 ? 0 : -1;
}

static void format_uuid(const CUuuid *u, char *out, size_t cap) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, cap,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* Re-read on every call: tests may change the device list between loads. */
static int load_devices(struct device *devs) {
    char path[PATH_MAX], buf[8192];
    path_of(path, sizeof path, "devices");
    if (read_small(path, buf, sizeof buf) < 0) {
        parse_uuid("GPU-a1b2c3d4-0000-4000-8000-000000000001", &devs[0].uuid);
        devs[0].total = 150109880320ULL; /* what the 580 driver reports for an H200 */
        snprintf(devs[0].name, sizeof devs[0].name, "NVIDIA H200");
        return 1;
    }
    int count = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line && count < MAX_DEVICES;
         line = strtok_r(NULL, "\n", &save)) {
        char uuid[128] = {0};
        unsigned long long total = 0;
        int consumed = 0;
        if (line[0] == '#') continue;
        if (sscanf(line, "%127s %llu %n", uuid, &total, &consumed) < 2) continue;
        if (parse_uuid(uuid, &devs[count].uuid) != 0) continue;
        devs[count].total = total;
        snprintf(devs[count].name, sizeof devs[count].name, "%s", line + consumed);
        trim(devs[count].name);
        count++;
    }
    return count;
}

static int find_device(const CUuuid *uuid) {
    struct device devs[MAX_DEVICES];
    int n = load_devices(devs);
    for (int i = 0; i < n; i++)
        if (memcmp(devs[i].uuid.bytes, uuid->bytes, 16) == 0) return i;
    return -1;
}

/* ------------------------------------------------------------------------- */
/* per-pid state, locks and faults                                            */

/* The last NSpid field of /proc/<pid>/status: the pid inside the innermost pid namespace. */
static int ns_pid(int pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    if (read_small(path, buf, sizeof buf) < 0) return pid;
    char *line = strstr(buf, "NSpid:");
    if (!line) return pid;
    int last = pid;
    char *p = line + 6;
    while (*p && *p != '\n') {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        last = (int)v;
        p = end;
    }
    return last;
}

/* The name of a process's state file. A real driver keeps its state inside the process, so
 * it survives a CRIU restore under a new host pid; the fake gets the same effect for a
 * process started with GPUSNAP_FAKE_CUDA_ID=<id> in its environment: procs/id-<id>-<nspid>,
 * keyed by the pid inside its container, which CRIU restores too (children inherit the
 * variable but have other pids, so they stay non-CUDA). Other processes are keyed by pid. */
static void proc_key(int pid, char *out, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    snprintf(out, cap, "%d", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    static const char want[] = "GPUSNAP_FAKE_CUDA_ID=";
    char buf[16384];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = '\0';
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
        if (strncmp(buf + i, want, sizeof want - 1) == 0) {
            snprintf(out, cap, "id-%s-%d", buf + i + sizeof want - 1, ns_pid(pid));
            return;
        }
    }
}

/* Returns the state, or -1 when <pid> is not a CUDA process. */
static int load_state(int pid) {
    char path[PATH_MAX], buf[64], key[96];
    proc_key(pid, key, sizeof key);
    path_of(path, sizeof path, "procs/%s", key);
    if (read_small(path, buf, sizeof buf) < 0) return -1;
    trim(buf);
    if (buf[0] == '\0') return S_RUNNING;
    for (int s = 0; s < S_COUNT; s++)
        if (strcmp(buf, STATE_NAMES[s]) == 0) return s;
    return S_FAILED;
}

static void store_state(int pid, int state) {
    char path[PATH_MAX], line[32], key[96];
    proc_key(pid, key, sizeof key);
    path_of(path, sizeof path, "procs/%s", key);
    int n = snprintf(line, sizeof line, "%s\n", STATE_NAMES[state]);
    write_atomic(path, line, (size_t)n);
}

/* Serialises transitions of one pid across threads and processes. */
static int lock_pid(int pid) {
    char dir[PATH_MAX], path[PATH_MAX];
    path_of(dir, sizeof dir, "locks");
    mkdir(dir, 0755);
    path_of(path, sizeof path, "locks/%d", pid);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) flock(fd, LOCK_EX);
    return fd;
}

static void unlock_pid(int fd) {
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

struct fault {
    int present;
    int has_code;
    int code;
    long hang_ms;
    long busy_ms;
    int then_state; /* -1 = none */
};

static void load_fault(int pid, const char *op, struct fault *f) {
    char path[PATH_MAX], buf[512];
    memset(f, 0, sizeof *f);
    f->then_state = -1;
    path_of(path, sizeof path, "faults/%d/%s", pid, op);
    if (read_small(path, buf, sizeof buf) < 0) return;
    f->present = 1;
    int once = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
        if (strncmp(tok, "code=", 5) == 0) {
            f->has_code = 1;
            f->code = atoi(tok + 5);
        } else if (strncmp(tok, "hang_ms=", 8) == 0) {
            f->hang_ms = atol(tok + 8);
        } else if (strncmp(tok, "busy_ms=", 8) == 0) {
            f->busy_ms = atol(tok + 8);
        } else if (strncmp(tok, "then=", 5) == 0) {
            for (int s = 0; s < S_COUNT; s++)
                if (strcmp(tok + 5, STATE_NAMES[s]) == 0) f->then_state = s;
        } else if (strcmp(tok, "once") == 0) {
            once = 1;
        }
    }
    /* Remove before acting so a concurrent second call does not fire it again. */
    if (once) unlink(path);
}

static void log_call(const char *op, int pid, CUresult rc, const char *extra) {
    append_line("calls.log", "%s %d %d%s%s\n", op, pid, rc, extra && *extra ? " " : "",
                extra ? extra : "");
}

/* ------------------------------------------------------------------------- */
/* CustomStorage operations (CUDA 13.4)                                       */

enum { OP_CHECKPOINT = 1, OP_RESTORE = 2 };

struct storage_op {
    int kind;
    int pid;
    char key[96];
    int dev_index[MAX_DEVICES];
    CUcheckpointCustomStoragePerDeviceData per[MAX_DEVICES];
    CUcheckpointCustomStorageInfo info;
    struct storage_op *next;
};

static pthread_mutex_t g_ops_mu = PTHREAD_MUTEX_INITIALIZER;
static struct storage_op *g_ops;
static int g_retained[MAX_DEVICES];

static int retained_all(int ndev) {
    for (int i = 0; i < ndev; i++)
        if (g_retained[i] <= 0) return 0;
    return 1;
}

static unsigned char *read_blob(const char *path, size_t *len) {
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    unsigned char *buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!buf) return NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        free(buf);
        return NULL;
    }
    *len = fread(buf, 1, (size_t)st.st_size, fp);
    fclose(fp);
    return buf;
}

/* Maps one region per device the pid has memory on (vram/<pid>/<dev>), or one
 * default region on device 0 filled with a pattern when the test provided none.
 * Restore maps zeroed regions of the sizes recorded at checkpoint. */
static CUresult map_regions(struct storage_op *op, int restoring) {
    struct device devs[MAX_DEVICES];
    int ndev = load_devices(devs);
    unsigned int count = 0;
    for (int d = 0; d < ndev; d++) {
        char rel[160], path[PATH_MAX];
        size_t len = 0;
        unsigned char *data = NULL;
        if (restoring) {
            snprintf(rel, sizeof rel, "vram/%s/%d.size", op->key, d);
            long long size = read_number(rel, -1);
            if (size < 0) continue;
            len = (size_t)size;
            data = calloc(len ? len : 1, 1);
        } else {
            path_of(path, sizeof path, "vram/%s/%d", op->key, d);
            data = read_blob(path, &len);
            if (!data) {
                path_of(path, sizeof path, "vram/%s", op->key);
                struct stat st;
                if (d != 0 || stat(path, &st) == 0) continue;
                len = DEFAULT_VRAM_BYTES;
                data = malloc(len);
                for (size_t i = 0; data && i < len; i++)
                    data[i] = (unsigned char)((i * 31u + (unsigned)op->pid) & 0xff);
            }
        }
        if (!data) {
            for (unsigned int i = 0; i < count; i++) free((void *)(uintptr_t)op->per[i].devPtr);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        op->dev_index[count] = d;
        op->per[count].devPtr = (CUdeviceptr)(uintptr_t)data;
        op->per[count].size = len;
        op->per[count].stream = (CUstream)(uintptr_t)(0x5000 + d);
        count++;
    }
    op->info.handle = (CUcheckpointOperationHandle)op;
    op->info.perDeviceData = op->per;
    op->info.deviceCount = count;
    return CUDA_SUCCESS;
}

static void finish_regions(struct storage_op *op) {
    for (unsigned int i = 0; i < op->info.deviceCount; i++) {
        int d = op->dev_index[i];
        char dir[PATH_MAX], path[PATH_MAX], size_line[32];
        path_of(dir, sizeof dir, "vram/%s", op->key);
        mkdir_p(dir);
        if (op->kind == OP_CHECKPOINT) {
            /* The device memory is released; remember only how much there was. */
            path_of(path, sizeof path, "vram/%s/%d", op->key, d);
            unlink(path);
            path_of(path, sizeof path, "vram/%s/%d.size", op->key, d);
            int n = snprintf(size_line, sizeof size_line, "%zu\n", op->per[i].size);
            write_atomic(path, size_line, (size_t)n);
        } else {
            path_of(path, sizeof path, "vram/%s/%d", op->key, d);
            write_atomic(path, (void *)(uintptr_t)op->per[i].devPtr, op->per[i].size);
        }
        free((void *)(uintptr_t)op->per[i].devPtr);
    }
}

static CUresult start_storage_op(int kind, int pid, CUcheckpointCustomStorageInfo **out) {
    struct device devs[MAX_DEVICES];
    int ndev = load_devices(devs);
    if (!retained_all(ndev)) return CUDA_ERROR_INVALID_CONTEXT;
    struct storage_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = kind;
    op->pid = pid;
    proc_key(pid, op->key, sizeof op->key);
    CUresult rc = map_regions(op, kind == OP_RESTORE);
    if (rc != CUDA_SUCCESS) {
        free(op);
        return rc;
    }
    pthread_mutex_lock(&g_ops_mu);
    op->next = g_ops;
    g_ops = op;
    pthread_mutex_unlock(&g_ops_mu);
    *out = &op->info;
    return CUDA_SUCCESS;
}

/* The driver-managed path: device memory moves between the device (vram/) and the process's
 * host memory (staged/), as a whole directory per process. */
static void move_device_memory(int pid, const char *from, const char *to) {
    char key[96], a[PATH_MAX], b[PATH_MAX], dir[PATH_MAX];
    proc_key(pid, key, sizeof key);
    path_of(a, sizeof a, "%s/%s", from, key);
    path_of(b, sizeof b, "%s/%s", to, key);
    path_of(dir, sizeof dir, "%s", to);
    mkdir_p(dir);
    struct stat st;
    if (stat(a, &st) != 0) return; /* no device memory recorded for this process */
    /* Replace what an earlier transition left (files only: <dev> and <dev>.size). */
    DIR *old = opendir(b);
    if (old) {
        struct dirent *e;
        while ((e = readdir(old))) {
            if (e->d_name[0] == '.') continue;
            unlinkat(dirfd(old), e->d_name, 0);
        }
        closedir(old);
        rmdir(b);
    }
    rename(a, b);
}

/* ------------------------------------------------------------------------- */
/* checkpoint API                                                             */

#define REQUIRE_INIT()                                                                           \
    do {                                                                                         \
        if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;                                   \
    } while (0)

static int all_zero(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

/*
 * Shared shape of every transition: fault hang, registration check, injected
 * failure, state check, then the transition itself.
 */
static CUresult transition(const char *op, int pid, int from, int to, const char *extra) {
    struct fault f;
    load_fault(pid, op, &f);
    sleep_ms(f.hang_ms);
    int fd = lock_pid(pid);
    int state = load_state(pid);
    CUresult rc;
    if (state < 0) {
        rc = unknown_pid_code();
    } else if (f.has_code) {
        rc = f.code;
        if (f.then_state >= 0) store_state(pid, f.then_state);
    } else if (state != from) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        store_state(pid, f.then_state >= 0 ? f.then_state : to);
        rc = CUDA_SUCCESS;
    }
    unlock_pid(fd);
    log_call(op, pid, rc, extra);
    return rc;
}

EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    REQUIRE_INIT();
    unsigned int timeout = 0;
    char extra[64];
    if (args) {
        if (args->reserved0 || !all_zero(args->reserved1, sizeof args->reserved1)) {
            log_call("lock", pid, CUDA_ERROR_INVALID_VALUE, "reserved=nonzero");
            return CUDA_ERROR_INVALID_VALUE;
        }
        timeout = args->timeoutMs;
    }
    snprintf(extra, sizeof extra, "timeout_ms=%u", timeout);

    /* busy_ms models submitted work the lock must wait for. */
    struct fault f;
    load_fault(pid, "lock", &f);
    if (f.busy_ms > 0 && !f.has_code && load_state(pid) == S_RUNNING) {
        if (timeout > 0 && (long)timeout < f.busy_ms) {
            sleep_ms(timeout);
            log_call("lock", pid, CUDA_ERROR_NOT_READY, extra);
            return CUDA_ERROR_NOT_READY; /* gives up and leaves the target RUNNING */
        }
        sleep_ms(f.busy_ms);
    }
    return transition("lock", pid, S_RUNNING, S_LOCKED, extra);
}

EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    REQUIRE_INIT();
    if (args && !all_zero(args, sizeof *args)) {
        log_call("unlock", pid, CUDA_ERROR_INVALID_VALUE, "reserved=nonzero");
        return CUDA_ERROR_INVALID_VALUE;
    }
    return transition("unlock", pid, S_LOCKED, S_RUNNING, NULL);
}

EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    REQUIRE_INIT();
    if (args && !all_zero(args->reserved, sizeof args->reserved)) {
        log_call("checkpoint", pid, CUDA_ERROR_INVALID_VALUE, "reserved=nonzero");
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!args || !args->customStorageInfo_out) {
        CUresult rc = transition("checkpoint", pid, S_LOCKED, S_CHECKPOINTED, "storage=driver");
        if (rc == CUDA_SUCCESS) move_device_memory(pid, "vram", "staged");
        return rc;
    }

    /* Before 13.4 the field is reserved and must be zero. */
    if (driver_version() < 13040) {
        log_call("checkpoint", pid, CUDA_ERROR_INVALID_VALUE, "storage=custom");
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fault f;
    load_fault(pid, "checkpoint", &f);
    sleep_ms(f.hang_ms);
    int fd = lock_pid(pid);
    int state = load_state(pid);
    CUresult rc;
    if (state < 0) rc = unknown_pid_code();
    else if (f.has_code) rc = f.code;
    else if (state != S_LOCKED) rc = CUDA_ERROR_ILLEGAL_STATE;
    else rc = start_storage_op(OP_CHECKPOINT, pid, args->customStorageInfo_out);
    if (rc == CUDA_SUCCESS) store_state(pid, S_CHECKPOINTING);
    unlock_pid(fd);
    log_call("checkpoint", pid, rc, "storage=custom");
    return rc;
}

EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    REQUIRE_INIT();
    char extra[1200] = "pairs=";
    int custom = 0;
    if (args) {
        if (!all_zero(args->reserved, sizeof args->reserved) || args->padding0) {
            log_call("restore", pid, CUDA_ERROR_INVALID_VALUE, "reserved=nonzero");
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (args->gpuPairs || args->gpuPairsCount) {
            /* gpuPairs arrived in 13.0; older drivers require the bytes to be zero. */
            if (driver_version() < 13000 || !args->gpuPairs || args->gpuPairsCount == 0 ||
                args->gpuPairsCount > MAX_DEVICES) {
                log_call("restore", pid, CUDA_ERROR_INVALID_VALUE, "pairs=invalid");
                return CUDA_ERROR_INVALID_VALUE;
            }
            for (unsigned int i = 0; i < args->gpuPairsCount; i++) {
                char a[64], b[64], item[140];
                format_uuid(&args->gpuPairs[i].oldUuid, a, sizeof a);
                format_uuid(&args->gpuPairs[i].newUuid, b, sizeof b);
                snprintf(item, sizeof item, "%s%s:%s", i ? "," : "", a, b);
                strncat(extra, item, sizeof extra - strlen(extra) - 1);
                if (find_device(&args->gpuPairs[i].newUuid) < 0) {
                    log_call("restore", pid, CUDA_ERROR_INVALID_VALUE, extra);
                    return CUDA_ERROR_INVALID_VALUE;
                }
            }
        } else {
            strncat(extra, "none", sizeof extra - strlen(extra) - 1);
        }
        custom = args->customStorageInfo_out != NULL;
    } else {
        strncat(extra, "none", sizeof extra - strlen(extra) - 1);
    }
    if (!custom) {
        CUresult rc = transition("restore", pid, S_CHECKPOINTED, S_LOCKED, extra);
        if (rc == CUDA_SUCCESS) move_device_memory(pid, "staged", "vram");
        return rc;
    }

    strncat(extra, " storage=custom", sizeof extra - strlen(extra) - 1);
    if (driver_version() < 13040) {
        log_call("restore", pid, CUDA_ERROR_INVALID_VALUE, extra);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fault f;
    load_fault(pid, "restore", &f);
    sleep_ms(f.hang_ms);
    int fd = lock_pid(pid);
    int state = load_state(pid);
    CUresult rc;
    if (state < 0) rc = unknown_pid_code();
    else if (f.has_code) rc = f.code;
    else if (state != S_CHECKPOINTED) rc = CUDA_ERROR_ILLEGAL_STATE;
    else rc = start_storage_op(OP_RESTORE, pid, args->customStorageInfo_out);
    if (rc == CUDA_SUCCESS) store_state(pid, S_RESTORING);
    unlock_pid(fd);
    log_call("restore", pid, rc, extra);
    return rc;
}

EXPORT CUresult cuCheckpointProcessGetState(int pid, int *state_out) {
    REQUIRE_INIT();
    if (!state_out) return CUDA_ERROR_INVALID_VALUE;
    struct fault f;
    load_fault(pid, "get_state", &f);
    sleep_ms(f.hang_ms);
    if (f.then_state >= 0 && load_state(pid) >= 0) store_state(pid, f.then_state);
    if (f.has_code) return f.code;
    int state = load_state(pid);
    if (state < 0) return unknown_pid_code();
    *state_out = state;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
    REQUIRE_INIT();
    if (!tid) return CUDA_ERROR_INVALID_VALUE;
    struct fault f;
    load_fault(pid, "restore_tid", &f);
    sleep_ms(f.hang_ms);
    if (f.has_code) return f.code;
    if (load_state(pid) < 0) return unknown_pid_code();
    *tid = pid; /* the fake's "restore thread" is the main thread */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCheckpointOperationComplete(CUcheckpointOperationHandle handle) {
    REQUIRE_INIT();
    pthread_mutex_lock(&g_ops_mu);
    struct storage_op **link = &g_ops, *op = NULL;
    for (; *link; link = &(*link)->next) {
        if ((CUcheckpointOperationHandle)*link == handle) {
            op = *link;
            *link = op->next;
            break;
        }
    }
    pthread_mutex_unlock(&g_ops_mu);
    if (!op) return CUDA_ERROR_INVALID_VALUE;
    struct fault f;
    load_fault(op->pid, "operation_complete", &f);
    sleep_ms(f.hang_ms);
    int fd = lock_pid(op->pid);
    CUresult rc = CUDA_SUCCESS;
    if (f.has_code) {
        rc = f.code;
        store_state(op->pid, f.then_state >= 0 ? f.then_state : S_FAILED);
    } else {
        finish_regions(op);
        store_state(op->pid, op->kind == OP_CHECKPOINT ? S_CHECKPOINTED : S_LOCKED);
    }
    unlock_pid(fd);
    log_call("operation_complete", op->pid, rc,
             op->kind == OP_CHECKPOINT ? "kind=checkpoint" : "kind=restore");
    free(op);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* init, version, errors                                                      */

EXPORT CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    long long err = read_number("init_error", 0);
    if (err != 0) return (CUresult)err;
    g_initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = driver_version();
    return CUDA_SUCCESS;
}

struct error_text {
    CUresult code;
    const char *name;
    const char *text;
};
static const struct error_text ERRORS[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "fake libcuda: no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "fake libcuda: invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "fake libcuda: out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "fake libcuda: initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "fake libcuda: no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "fake libcuda: invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "fake libcuda: invalid device context"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "fake libcuda: OS call failed"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "fake libcuda: the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "fake libcuda: named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "fake libcuda: device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "fake libcuda: an illegal memory access was encountered"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "fake libcuda: operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "fake libcuda: unknown error"},
};

static const struct error_text *find_error(CUresult code) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == code) return &ERRORS[i];
    return NULL;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    const struct error_text *e = find_error(error);
    *out = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    const struct error_text *e = find_error(error);
    *out = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------------- */
/* devices, contexts, memory                                                  */

EXPORT CUresult cuDeviceGetCount(int *count) {
    REQUIRE_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    struct device devs[MAX_DEVICES];
    *count = load_devices(devs);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    struct device devs[MAX_DEVICES];
    if (ordinal < 0 || ordinal >= load_devices(devs)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    REQUIRE_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    struct device devs[MAX_DEVICES];
    if (dev < 0 || dev >= load_devices(devs)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", devs[dev].name);
    return CUDA_SUCCESS;
}

/* v2 semantics: the device's own UUID (a MIG instance's UUID under MIG). */
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    REQUIRE_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    struct device devs[MAX_DEVICES];
    if (dev < 0 || dev >= load_devices(devs)) return CUDA_ERROR_INVALID_DEVICE;
    *uuid = devs[dev].uuid;
    return CUDA_SUCCESS;
}

/* v1 (the dlsym ABI) stands in for the "parent GPU" UUID: deliberately
 * different, so a binding that bypasses cuGetProcAddress is caught by tests. */
EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    CUresult rc = cuDeviceGetUuid_v2(uuid, dev);
    if (rc == CUDA_SUCCESS) uuid->bytes[15] = (char)(uuid->bytes[15] ^ 0xff);
    return rc;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    REQUIRE_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    struct device devs[MAX_DEVICES];
    if (dev < 0 || dev >= load_devices(devs)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)devs[dev].total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    REQUIRE_INIT();
    if (!ctx || dev < 0 || dev >= MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&g_retained[dev], 1, __ATOMIC_SEQ_CST);
    *ctx = (CUcontext)(uintptr_t)(0x1000 + dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    REQUIRE_INIT();
    if (dev < 0 || dev >= MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
    __atomic_sub_fetch(&g_retained[dev], 1, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    REQUIRE_INIT();
    (void)ctx;
    return CUDA_SUCCESS;
}

/* The file "copies_fail" in the state directory makes every copy fail, as a device fault
 * (illegal address) would. */
static int copies_fail(void) {
    char path[PATH_MAX];
    path_of(path, sizeof path, "copies_fail");
    return access(path, F_OK) == 0;
}

/* "Device" pointers handed out by the fake are host allocations. */
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream stream) {
    REQUIRE_INIT();
    (void)stream;
    if (copies_fail()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream stream) {
    REQUIRE_INIT();
    (void)stream;
    if (copies_fail()) return CUDA_ERROR_ILLEGAL_ADDRESS;
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags) {
    REQUIRE_INIT();
    (void)flags;
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    *pp = malloc(bytes ? bytes : 1);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemFreeHost(void *p) {
    REQUIRE_INIT();
    free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    REQUIRE_INIT();
    (void)stream;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------- */
/* entry points                                                               */

struct entry {
    const char *name;
    void *fn;
    int since; /* CUDA version that introduced this ABI of the symbol */
};

static const struct entry ENTRIES[] = {
    {"cuInit", (void *)cuInit, 2000},
    {"cuDriverGetVersion", (void *)cuDriverGetVersion, 2020},
    {"cuGetErrorName", (void *)cuGetErrorName, 6000},
    {"cuGetErrorString", (void *)cuGetErrorString, 6000},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount, 2000},
    {"cuDeviceGet", (void *)cuDeviceGet, 2000},
    {"cuDeviceGetName", (void *)cuDeviceGetName, 2000},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid, 9020},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2, 11040},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem_v2, 3020},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, 7000},
    {"cuDevicePrimaryCtxRelease", (void *)cuDevicePrimaryCtxRelease_v2, 11000},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent, 4000},
    {"cuMemcpyDtoHAsync", (void *)cuMemcpyDtoHAsync_v2, 3020},
    {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync_v2, 3020},
    {"cuMemHostAlloc", (void *)cuMemHostAlloc, 2020},
    {"cuMemFreeHost", (void *)cuMemFreeHost, 2000},
    {"cuStreamSynchronize", (void *)cuStreamSynchronize, 2000},
    {"cuCheckpointProcessLock", (void *)cuCheckpointProcessLock, 12080},
    {"cuCheckpointProcessCheckpoint", (void *)cuCheckpointProcessCheckpoint, 12080},
    {"cuCheckpointProcessRestore", (void *)cuCheckpointProcessRestore, 12080},
    {"cuCheckpointProcessUnlock", (void *)cuCheckpointProcessUnlock, 12080},
    {"cuCheckpointProcessGetState", (void *)cuCheckpointProcessGetState, 12080},
    {"cuCheckpointProcessGetRestoreThreadId", (void *)cuCheckpointProcessGetRestoreThreadId, 12080},
    {"cuCheckpointOperationComplete", (void *)cuCheckpointOperationComplete, 13040},
};

static int hidden(const char *symbol) {
    char path[PATH_MAX], buf[4096];
    path_of(path, sizeof path, "hidden_symbols");
    if (read_small(path, buf, sizeof buf) < 0) return 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        trim(line);
        if (strcmp(line, symbol) == 0) return 1;
    }
    return 0;
}

/* Follows the documented contract: a version above the driver's is
 * INVALID_VALUE; an unknown or too-new symbol is SUCCESS with a NULL pointer
 * and a status saying why. */
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                    cuuint64_t flags, int *status) {
    (void)flags;
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int drv = driver_version();
    int st;
    CUresult rc = CUDA_SUCCESS;
    if (cuda_version > drv) {
        st = PROC_VERSION_NOT_SUFFICIENT;
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        const struct entry *best = NULL;
        int known = 0;
        for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++) {
            const struct entry *e = &ENTRIES[i];
            if (strcmp(e->name, symbol) != 0 || e->since > drv) continue;
            known = 1;
            if (e->since <= cuda_version && (!best || e->since > best->since)) best = e;
        }
        if (!known || hidden(symbol)) st = PROC_SYMBOL_NOT_FOUND;
        else if (!best) st = PROC_VERSION_NOT_SUFFICIENT;
        else {
            st = PROC_SUCCESS;
            *pfn = best->fn;
        }
    }
    if (status) *status = st;
    append_line("procaddr.log", "%s %d %d %d\n", symbol, cuda_version, st, rc);
    return rc;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                                 cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}
