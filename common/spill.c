// common/spill.c — see spill.h.
#include "common/spill.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

#define HDR 64                      // header in front of every buffer; keeps the returned pointer 64-byte aligned
#define MAGIC 0x6c6c6d7173706c6cull // "llmqspll"

struct hdr {
    uint64_t magic;
    uint64_t size;   // bytes the caller asked for
    uint64_t mapped; // 0: heap; else the length of the file mapping (HDR + size)
};
_Static_assert(sizeof(struct hdr) <= HDR, "spill header");

static uint64_t budget, ram, file, peak_file;

void llmq_spill_configure(uint64_t max_bytes) { budget = max_bytes; }
uint64_t llmq_spill_ram_bytes(void) { return ram; }
uint64_t llmq_spill_file_bytes(void) { return file; }
uint64_t llmq_spill_peak_file_bytes(void) { return peak_file; }
uint64_t llmq_spill_budget(void) { return budget; }

bool llmq_parse_bytes(const char *s, uint64_t *out) {
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return false;
    uint64_t mul = 1;
    switch (*end) {
    case 'k':
    case 'K': mul = 1ull << 10, end++; break;
    case 'm':
    case 'M': mul = 1ull << 20, end++; break;
    case 'g':
    case 'G': mul = 1ull << 30, end++; break;
    case 't':
    case 'T': mul = 1ull << 40, end++; break;
    default: break;
    }
    if (mul > 1 && *end == 'i') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return false;
    double b = v * (double)mul;
    if (b > 18e18) return false;
    *out = (uint64_t)b;
    return true;
}

const char *llmq_spill_dir(void) {
    const char *dir = getenv("LLMQ_SPILL_DIR");
    if (!dir || !*dir) dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    return dir;
}

// A spill file of len bytes, its blocks allocated up front (posix_fallocate): a full disk is an error here,
// naming the directory and the bytes, not a SIGBUS when a page of a sparse file is first written.
static void *spill_map(size_t len, const char *what) {
    const char *dir = llmq_spill_dir();
    char path[4096];
    snprintf(path, sizeof path, "%s/llmq-spill-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) {
        (void)llmq_errorf(LLMQ_ERR_IO, "%s: cannot create a spill file in %s: %s", what, dir, strerror(errno));
        return NULL;
    }
    unlink(path); // no name: nothing stays on disk, whatever happens
    void *p = MAP_FAILED;
    int e = posix_fallocate(fd, 0, (off_t)len);
    if (e == 0)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    else
        (void)llmq_errorf(LLMQ_ERR_IO,
                          "%s: the spill directory %s cannot hold the %zu bytes (%.2f GiB) needed: %s (set "
                          "LLMQ_SPILL_DIR to a larger file system, or raise --max-memory)",
                          what, dir, len, (double)len / 1073741824.0, strerror(e));
    close(fd);
    if (p == MAP_FAILED) {
        if (e == 0)
            (void)llmq_errorf(LLMQ_ERR_IO, "%s: cannot map a %zu-byte spill file in %s: %s", what, len, dir,
                              strerror(errno));
        return NULL;
    }
    return p;
}

uint64_t llmq_phys_mem_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

enum llmq_status llmq_spill_preflight(uint64_t bytes, const char *what) {
    uint64_t ram_bytes = llmq_phys_mem_bytes();
    if (budget == 0) {
        if (ram_bytes && bytes > ram_bytes)
            return llmq_errorf(LLMQ_ERR_NOMEM,
                               "%s: %llu bytes (%.2f GiB) needed, more than this machine's %.2f GiB of RAM: use "
                               "fewer tokens, or --max-memory to spill them to disk",
                               what, (unsigned long long)bytes, (double)bytes / 1073741824.0,
                               (double)ram_bytes / 1073741824.0);
        return LLMQ_OK;
    }
    if (bytes <= budget) return LLMQ_OK;
    struct statvfs sv;
    const char *dir = llmq_spill_dir();
    uint64_t need = bytes - budget;
    if (statvfs(dir, &sv) != 0)
        return llmq_errorf(LLMQ_ERR_IO, "%s: the spill directory %s: %s", what, dir, strerror(errno));
    uint64_t avail = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    if (need > avail)
        return llmq_errorf(LLMQ_ERR_IO,
                           "%s: %llu bytes (%.2f GiB) beyond --max-memory go to the spill directory %s, which has "
                           "%llu bytes free (set LLMQ_SPILL_DIR to a larger file system, or raise --max-memory)",
                           what, (unsigned long long)need, (double)need / 1073741824.0, dir, (unsigned long long)avail);
    return LLMQ_OK;
}

void *llmq_big_alloc(size_t n, const char *what) {
    if (n > SIZE_MAX - HDR) return NULL;
    size_t len = HDR + n;
    struct hdr h = {MAGIC, n, 0};
    void *base = NULL;
    if (budget == 0 || ram + n <= budget) {
        base = aligned_alloc(HDR, (len + HDR - 1) / HDR * HDR);
        if (base) ram += n;
        if (!base && budget == 0) { // no --max-memory: no silent fallback to disk
            (void)llmq_errorf(LLMQ_ERR_NOMEM,
                              "%s: cannot allocate %zu bytes (%.2f GiB) (--max-memory spills such "
                              "buffers to a file instead)",
                              what ? what : "buffer", n, (double)n / 1073741824.0);
            return NULL;
        }
    }
    if (!base) {
        base = spill_map(len, what ? what : "buffer");
        if (!base) return NULL;
        h.mapped = len;
        file += n;
        if (file > peak_file) peak_file = file;
        static bool told;
        llmq_log(told ? LLMQ_LOG_DEBUG : LLMQ_LOG_INFO,
                 "%s: %.1f MiB go to a temporary file (--max-memory %.1f MiB reached; %.1f MiB spilled now)",
                 what ? what : "buffer", (double)n / 1048576.0, (double)budget / 1048576.0, (double)file / 1048576.0);
        told = true;
    }
    memcpy(base, &h, sizeof h);
    return (char *)base + HDR;
}

void llmq_big_free(void *p) {
    if (!p) return;
    char *base = (char *)p - HDR;
    struct hdr h;
    memcpy(&h, base, sizeof h);
    if (h.magic != MAGIC) {
        llmq_log(LLMQ_LOG_ERROR, "llmq_big_free: not a big buffer (%p)", p);
        abort();
    }
    if (h.mapped) {
        file -= h.size;
        munmap(base, h.mapped);
    } else {
        ram -= h.size;
        free(base);
    }
}
