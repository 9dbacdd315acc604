// common/io.c — mmap inputs, atomic outputs, small-file reads, UTF-8 validation.
#include "common/io.h"
#include "common/sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <libgen.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define LLMQ_FOLIO_SPAN                                                                                                \
    ((size_t)2 << 20) // x86-64 / arm64 (4 KiB pages) PMD size: the largest page-cache folio mapped at once

// The live mappings of llmq_mmap_open (for llmq_mmap_release: only file pages are ever released).
#define MAX_MAPS 256
static struct {
    const uint8_t *data;
    size_t size;
} maps[MAX_MAPS];

static void maps_add(const uint8_t *data, size_t size) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (!maps[i].data) {
            maps[i].data = data, maps[i].size = size;
            return;
        }
}

static void maps_remove(const uint8_t *data) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].data == data) maps[i].data = NULL, maps[i].size = 0;
}

void llmq_mmap_release(const void *p, size_t n) {
    const uint8_t *a = p;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; n && i < MAX_MAPS; i++) {
        const uint8_t *d = maps[i].data;
        if (!d || a < d || a + n > d + maps[i].size) continue;
        // from the 2 MiB boundary below, clipped to the mapping: the page cache's large folios (up to PMD size)
        // are mapped whole on a fault, so reading the next range maps again the tail of one released before;
        // dropping that tail with this range keeps a chunk-by-chunk reader at ~0 file pages instead of ~30 %
        // of the tensor (measured on a 56 MB bf16 embedding, kernel 6.18). A neighbour's page dropped too is
        // only read again from the page cache.
        size_t span = page > LLMQ_FOLIO_SPAN ? page : LLMQ_FOLIO_SPAN;
        size_t lo = (size_t)(a - d) / span * span, hi = (size_t)(a - d) + n;
        madvise((void *)(d + lo), hi - lo, MADV_DONTNEED);
        return;
    }
}

void llmq_scratch_release(void *p, size_t n) {
    if (!p || !n) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, lo = (a + page - 1) / page * page,
              hi = (a + n) / page * page;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

enum llmq_status llmq_mmap_open(struct llmq_mmap *m, const char *path) {
    struct stat st;
    int fd = -1;
    memset(m, 0, sizeof(*m));
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return llmq_errorf(LLMQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        llmq_errorf(LLMQ_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        llmq_errorf(LLMQ_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    llmq_input_add_fd(fd);
    m->path = strdup(path);
    if (!m->path) {
        llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            llmq_errorf(LLMQ_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, m->size, strerror(errno));
            free(m->path);
            m->path = NULL;
            goto fail;
        }
        m->data = p;
        maps_add(m->data, m->size);
    }
    close(fd);
    return LLMQ_OK;
fail:
    close(fd);
    return llmq_last_status();
}

void llmq_mmap_close(struct llmq_mmap *m) {
    if (!m) return;
    if (m->data) {
        maps_remove(m->data);
        munmap((void *)m->data, m->size);
    }
    free(m->path);
    memset(m, 0, sizeof(*m));
}

enum llmq_status llmq_afile_open(struct llmq_afile *f, const char *path) {
    memset(f, 0, sizeof(*f));
    size_t n = strlen(path) + 32;
    f->path = strdup(path);
    f->tmp_path = malloc(n);
    if (!f->path || !f->tmp_path) {
        free(f->path);
        free(f->tmp_path);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->fp = fopen(f->tmp_path, "wb");
    if (!f->fp) {
        enum llmq_status st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot create: %s", f->tmp_path, strerror(errno));
        free(f->path);
        free(f->tmp_path);
        memset(f, 0, sizeof(*f));
        return st;
    }
    llmq_temp_register(f->tmp_path, false);
    return LLMQ_OK;
}

enum llmq_status llmq_afile_open_part(struct llmq_afile *f, const char *path, const char *part, uint64_t off) {
    memset(f, 0, sizeof(*f));
    if (!(f->path = strdup(path)) || !(f->tmp_path = strdup(part))) {
        free(f->path);
        memset(f, 0, sizeof(*f));
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    f->keep = true;
    enum llmq_status st = LLMQ_OK;
    struct stat sb;
    int fd = open(part, off ? O_RDWR | O_CLOEXEC : O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        st = llmq_errorf(off && errno == ENOENT ? LLMQ_ERR_CORRUPT : LLMQ_ERR_IO, "%s: cannot open: %s", part,
                         strerror(errno));
    else if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < off)
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %lld bytes, fewer than the %llu the checkpoint recorded", part,
                         (long long)sb.st_size, (unsigned long long)off);
    else if (ftruncate(fd, (off_t)off) != 0 || lseek(fd, (off_t)off, SEEK_SET) != (off_t)off)
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot cut to %llu bytes: %s", part, (unsigned long long)off,
                         strerror(errno));
    else if (!(f->fp = fdopen(fd, "r+b")))
        st = llmq_errorf(LLMQ_ERR_IO, "%s: cannot open: %s", part, strerror(errno));
    if (st) {
        if (fd >= 0) close(fd);
        free(f->path);
        free(f->tmp_path);
        memset(f, 0, sizeof(*f));
        return st;
    }
    f->pos = off;
    return LLMQ_OK;
}

enum llmq_status llmq_afile_sync(struct llmq_afile *f) {
    if (!f->err && fflush(f->fp) != 0) f->err = errno;
    if (!f->err && fsync(fileno(f->fp)) != 0) f->err = errno;
    if (f->err) return llmq_errorf(LLMQ_ERR_IO, "%s: write failed: %s", f->tmp_path, strerror(f->err));
    return LLMQ_OK;
}

enum llmq_status llmq_afile_write(struct llmq_afile *f, const void *buf, size_t n) {
    if (f->err) return LLMQ_ERR_IO;
    if (n && fwrite(buf, 1, n, f->fp) != n) {
        f->err = errno ? errno : EIO;
        return llmq_errorf(LLMQ_ERR_IO, "%s: write failed: %s", f->tmp_path, strerror(f->err));
    }
    f->pos += n;
    return LLMQ_OK;
}

enum llmq_status llmq_afile_pad(struct llmq_afile *f, size_t n) {
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        enum llmq_status st = llmq_afile_write(f, zeros, k);
        if (st) return st;
        n -= k;
    }
    return LLMQ_OK;
}

enum llmq_status llmq_afile_seek(struct llmq_afile *f, uint64_t off) {
    if (f->err) return LLMQ_ERR_IO;
    if (fseeko(f->fp, (off_t)off, SEEK_SET) != 0) {
        f->err = errno;
        return llmq_errorf(LLMQ_ERR_IO, "%s: seek failed: %s", f->tmp_path, strerror(errno));
    }
    f->pos = off;
    return LLMQ_OK;
}

static void afile_free(struct llmq_afile *f) {
    if (f->tmp_path && !f->keep) llmq_temp_unregister(f->tmp_path);
    free(f->path);
    free(f->tmp_path);
    memset(f, 0, sizeof(*f));
}

void llmq_fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

enum llmq_status llmq_afile_commit(struct llmq_afile *f) {
    enum llmq_status st = LLMQ_OK;
    if (!f->err && fflush(f->fp) != 0) f->err = errno;
    if (!f->err && fsync(fileno(f->fp)) != 0) f->err = errno;
    if (fclose(f->fp) != 0 && !f->err) f->err = errno;
    f->fp = NULL;
    if (f->err) {
        st = llmq_errorf(LLMQ_ERR_IO, "%s: write failed: %s", f->tmp_path, strerror(f->err));
        if (!f->keep) unlink(f->tmp_path);
    } else if ((st = llmq_output_rename(f->tmp_path, f->path, false))) {
        if (!f->keep) unlink(f->tmp_path);
    } else {
        llmq_fsync_dir_of(f->path);
    }
    afile_free(f);
    return st;
}

void llmq_afile_abort(struct llmq_afile *f) {
    if (!f || !f->tmp_path) return;
    if (f->fp) fclose(f->fp);
    if (!f->keep) unlink(f->tmp_path);
    afile_free(f);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(p); // keep going: remove as much as possible
    return 0;
}

void llmq_remove_tree(const char *path) { nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

bool llmq_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

enum llmq_status llmq_file_sha256(const char *path, char hex[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) return llmq_errorf(LLMQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    llmq_input_add_fd(fileno(f));
    struct llmq_sha256 h;
    uint8_t buf[1 << 16], d[32];
    size_t n;
    llmq_sha256_init(&h);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) llmq_sha256_update(&h, buf, n);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err) return llmq_errorf(LLMQ_ERR_IO, "%s: read error: %s", path, strerror(err));
    llmq_sha256_final(&h, d);
    llmq_sha256_hex(d, hex);
    return LLMQ_OK;
}

#define GZ_MAX_RATIO 200
#define GZ_MIN_CAP ((size_t)16 << 20)

enum llmq_status llmq_read_file(const char *path, size_t max_size, char **out, size_t *out_size) {
    char *buf = NULL;
    size_t n = 0, cap = 0;
    gzFile gz = NULL;
    FILE *fp = NULL;
    bool is_gz = llmq_ends_with(path, ".gz");
    *out = NULL;
    if (is_gz)
        gz = gzopen(path, "rb");
    else
        fp = fopen(path, "rb");
    if (!gz && !fp) return llmq_errorf(LLMQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb = {0};
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        llmq_errorf(LLMQ_ERR_IO, "%s: is a directory, not a file", path);
        goto fail;
    }
    if (fp)
        llmq_input_add_fd(fileno(fp));
    else
        llmq_input_add(path);
    // a .gz may inflate to at most GZ_MAX_RATIO times its size (beyond GZ_MIN_CAP): text deflates ~3-10:1,
    // deflate's limit is ~1032:1, so a small "gzip bomb" costs proportionally small memory and time
    size_t gz_cap = SIZE_MAX;
    if (gz) {
        uint64_t c = (uint64_t)sb.st_size * GZ_MAX_RATIO;
        gz_cap = c < GZ_MIN_CAP ? GZ_MIN_CAP : c > SIZE_MAX ? SIZE_MAX : (size_t)c;
    }
    for (;;) {
        if (n == cap) {
            if (cap > max_size) {
                llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: larger than the limit of %zu bytes", path, max_size);
                goto fail;
            }
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t want = cap - n;
        long got;
        if (gz) {
            int r = gzread(gz, buf + n, want > (1u << 30) ? (1u << 30) : (unsigned)want);
            if (r < 0) {
                int e;
                llmq_errorf(LLMQ_ERR_CORRUPT, "%s: gzip error: %s", path, gzerror(gz, &e));
                goto fail;
            }
            got = r;
        } else {
            got = (long)fread(buf + n, 1, want, fp);
            if (got == 0 && ferror(fp)) {
                llmq_errorf(LLMQ_ERR_IO, "%s: read error", path);
                goto fail;
            }
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > gz_cap && gz_cap < max_size) {
            llmq_errorf(LLMQ_ERR_OVERFLOW,
                        "%s: decompresses to more than %zu bytes, %d times its %lld bytes: not a text (a gzip "
                        "bomb?)",
                        path, gz_cap, GZ_MAX_RATIO, (long long)sb.st_size);
            goto fail;
        }
    }
    // gzread returns the bytes it could inflate and then 0 when the file ends inside a gzip member:
    // only gzerror's Z_BUF_ERROR tells a truncated .gz from a complete one (zlib.h, gzread).
    if (gz) {
        int e = Z_OK;
        const char *msg = gzerror(gz, &e);
        if (e != Z_OK) {
            if (e == Z_BUF_ERROR)
                llmq_errorf(LLMQ_ERR_TRUNCATED,
                            "%s: truncated gzip file: it ends inside a compressed stream "
                            "after %zu decompressed bytes",
                            path, n);
            else
                llmq_errorf(LLMQ_ERR_CORRUPT, "%s: gzip error: %s", path, msg ? msg : "?");
            goto fail;
        }
    }
    if (n > max_size) {
        llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: larger than the limit of %zu bytes", path, max_size);
        goto fail;
    }
    if (!buf) {
        buf = malloc(1);
        if (!buf) {
            llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
    }
    buf[n] = '\0';
    if (gz) {
        int rc = gzclose_r(gz); // Z_BUF_ERROR here too when the last member was cut short
        gz = NULL;
        if (rc != Z_OK) {
            llmq_errorf(rc == Z_BUF_ERROR ? LLMQ_ERR_TRUNCATED : LLMQ_ERR_IO, "%s: gzip close failed (%d)", path, rc);
            goto fail;
        }
    }
    if (fp) fclose(fp);
    *out = buf;
    if (out_size) *out_size = n;
    return LLMQ_OK;
fail:
    free(buf);
    if (gz) gzclose(gz);
    if (fp) fclose(fp);
    return llmq_last_status();
}

enum llmq_status llmq_read_json_object(const char *path, size_t max_size, json_t **out) {
    char *text = NULL;
    size_t n = 0;
    json_error_t err;
    *out = NULL;
    enum llmq_status st = llmq_read_file(path, max_size, &text, &n);
    if (st) return st;
    *out = json_loadb(text, n, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!*out || !json_is_object(*out)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: line %d column %d: %s", path, err.line, err.column,
                         *out ? "not a JSON object" : err.text);
        json_decref(*out);
        *out = NULL;
    }
    return st;
}

enum llmq_status llmq_write_json(const char *path, const json_t *j, size_t dump_flags) {
    struct llmq_afile f;
    char *text = json_dumps(j, dump_flags);
    if (!text) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: JSON encoding failed", path);
    enum llmq_status st = llmq_afile_open(&f, path);
    if (!st) st = llmq_afile_write(&f, text, strlen(text));
    if (!st) st = llmq_afile_write(&f, "\n", 1);
    if (!st)
        st = llmq_afile_commit(&f);
    else
        llmq_afile_abort(&f);
    free(text);
    return st;
}

bool llmq_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool llmq_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

char *llmq_strndup_bytes(const char *s, size_t n) {
    char *out = malloc(n + 1);
    if (!out) return NULL;
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

char *llmq_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *s = malloc(a + b + 2);
    if (!s) return NULL;
    memcpy(s, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') s[k++] = '/';
    memcpy(s + k, name, b + 1);
    return s;
}

bool llmq_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t cp;
        if (c >= 0xc2 && c <= 0xdf)
            len = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            len = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            len = 4, cp = c & 0x07;
        else
            return false;
        if (i + (size_t)len > n) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) return false;
        if (cp >= 0xd800 && cp <= 0xdfff) return false;
        i += (size_t)len;
    }
    return true;
}
