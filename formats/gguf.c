// formats/gguf.c — GGUF v1/v2/v3 reader over a read-only mapping, and the atomic v3 writer.
// The byte layout, the checks and the ownership rules are documented in formats/gguf.h.
#include "formats/gguf.h"

#include "common/io.h"

#include <inttypes.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "formats/gguf.c reads GGUF fields in host byte order: a little-endian host is required"
#endif

// ---- value types ----------------------------------------------------------------------------------

static const struct {
    const char *name;
    size_t size; // 0: variable size
} type_info[LLMQ_GGUF_TYPE_COUNT] = {
    [LLMQ_GGUF_TYPE_UINT8] = {"u8", 1},      [LLMQ_GGUF_TYPE_INT8] = {"i8", 1},
    [LLMQ_GGUF_TYPE_UINT16] = {"u16", 2},    [LLMQ_GGUF_TYPE_INT16] = {"i16", 2},
    [LLMQ_GGUF_TYPE_UINT32] = {"u32", 4},    [LLMQ_GGUF_TYPE_INT32] = {"i32", 4},
    [LLMQ_GGUF_TYPE_FLOAT32] = {"f32", 4},   [LLMQ_GGUF_TYPE_BOOL] = {"bool", 1},
    [LLMQ_GGUF_TYPE_STRING] = {"string", 0}, [LLMQ_GGUF_TYPE_ARRAY] = {"array", 0},
    [LLMQ_GGUF_TYPE_UINT64] = {"u64", 8},    [LLMQ_GGUF_TYPE_INT64] = {"i64", 8},
    [LLMQ_GGUF_TYPE_FLOAT64] = {"f64", 8},
};

const char *llmq_gguf_type_name(enum llmq_gguf_type t) {
    return (unsigned)t < LLMQ_GGUF_TYPE_COUNT ? type_info[t].name : "?";
}

size_t llmq_gguf_type_size(enum llmq_gguf_type t) { return (unsigned)t < LLMQ_GGUF_TYPE_COUNT ? type_info[t].size : 0; }

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }
static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); } // a: power of two

// An integer read from a value of any integer type: signed types fill s, unsigned ones u.
struct ival {
    bool is_signed;
    int64_t s;
    uint64_t u;
};

static bool read_int(enum llmq_gguf_type t, const uint8_t *p, struct ival *v) {
    bool is_signed =
        t == LLMQ_GGUF_TYPE_INT8 || t == LLMQ_GGUF_TYPE_INT16 || t == LLMQ_GGUF_TYPE_INT32 || t == LLMQ_GGUF_TYPE_INT64;
    bool is_unsigned = t == LLMQ_GGUF_TYPE_UINT8 || t == LLMQ_GGUF_TYPE_UINT16 || t == LLMQ_GGUF_TYPE_UINT32 ||
                       t == LLMQ_GGUF_TYPE_UINT64;
    size_t sz = type_info[t < LLMQ_GGUF_TYPE_COUNT ? t : 0].size;
    uint64_t u = 0;
    if (!is_signed && !is_unsigned) return false;
    memcpy(&u, p, sz);                                                          // little-endian: the low sz bytes
    if (is_signed && sz < 8 && (u >> (8 * sz - 1)) & 1) u |= ~0ull << (8 * sz); // sign-extend
    v->is_signed = is_signed;
    v->u = u;
    memcpy(&v->s, &u, 8);
    return true;
}

static bool elem_i64(enum llmq_gguf_type t, const uint8_t *p, int64_t *out) {
    struct ival v;
    if (!read_int(t, p, &v)) return false;
    if (v.is_signed)
        *out = v.s;
    else if (v.u <= (uint64_t)INT64_MAX)
        *out = (int64_t)v.u;
    else
        return false;
    return true;
}

static bool elem_u64(enum llmq_gguf_type t, const uint8_t *p, uint64_t *out) {
    struct ival v;
    if (!read_int(t, p, &v)) return false;
    if (!v.is_signed)
        *out = v.u;
    else if (v.s >= 0)
        *out = (uint64_t)v.s;
    else
        return false;
    return true;
}

static bool elem_f64(enum llmq_gguf_type t, const uint8_t *p, double *out) {
    struct ival v;
    if (t == LLMQ_GGUF_TYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
        return true;
    }
    if (t == LLMQ_GGUF_TYPE_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    if (!read_int(t, p, &v)) return false;
    *out = v.is_signed ? (double)v.s : (double)v.u;
    return true;
}

static bool elem_bool(enum llmq_gguf_type t, const uint8_t *p, bool *out) {
    if (t != LLMQ_GGUF_TYPE_BOOL) return false;
    *out = p[0] != 0;
    return true;
}

// ---- a hash index from names to positions (keys, tensor names) ------------------------------------

struct slot {
    const char *s; // NULL: empty; not owned (points at a stable, NUL-terminated copy)
    size_t len;
    int64_t idx;
};

struct name_index {
    struct slot *slots; // (cap) entries, cap a power of two, load <= 1/2
    size_t cap, count;
};

static uint64_t hash_bytes(const char *s, size_t n) { // FNV-1a, 64 bit
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static int64_t index_find(const struct name_index *ix, const char *s, size_t n) {
    if (ix->cap == 0) return -1;
    for (size_t i = hash_bytes(s, n) & (ix->cap - 1);; i = (i + 1) & (ix->cap - 1)) {
        const struct slot *sl = &ix->slots[i];
        if (!sl->s) return -1;
        if (sl->len == n && memcmp(sl->s, s, n) == 0) return sl->idx;
    }
}

static bool index_reserve(struct name_index *ix, size_t n) {
    size_t cap = 16;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 4 / sizeof(struct slot)) return false;
        cap *= 2;
    }
    if (cap <= ix->cap) return true;
    struct slot *slots = calloc(cap, sizeof(*slots));
    if (!slots) return false;
    for (size_t k = 0; k < ix->cap; k++) {
        const struct slot *sl = &ix->slots[k];
        if (!sl->s) continue;
        size_t i = hash_bytes(sl->s, sl->len) & (cap - 1);
        while (slots[i].s) i = (i + 1) & (cap - 1);
        slots[i] = *sl;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    return true;
}

// Inserts a name that is known to be absent. false on out-of-memory.
static bool index_insert(struct name_index *ix, const char *s, size_t n, int64_t idx) {
    if (!index_reserve(ix, ix->count + 1)) return false;
    size_t i = hash_bytes(s, n) & (ix->cap - 1);
    while (ix->slots[i].s) i = (i + 1) & (ix->cap - 1);
    ix->slots[i] = (struct slot){s, n, idx};
    ix->count++;
    return true;
}

static void index_free(struct name_index *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof(*ix));
}

// ---- a chunked arena for the NUL-terminated copies of keys, names and scalar strings --------------

struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    char data[];
};

static char *arena_strdup(struct arena_block **a, const uint8_t *s, size_t n) {
    struct arena_block *b = *a;
    if (n >= SIZE_MAX - sizeof(struct arena_block) - 65536) return NULL;
    if (!b || b->cap - b->used < n + 1) {
        size_t cap = n + 1 > 65536 ? n + 1 : 65536;
        b = malloc(sizeof(*b) + cap);
        if (!b) return NULL;
        b->next = *a;
        b->used = 0;
        b->cap = cap;
        *a = b;
    }
    char *out = b->data + b->used;
    if (n) memcpy(out, s, n);
    out[n] = '\0';
    b->used += n + 1;
    return out;
}

static void arena_free(struct arena_block *a) {
    while (a) {
        struct arena_block *next = a->next;
        free(a);
        a = next;
    }
}

// ==================================================================================================
// Reader
// ==================================================================================================

struct llmq_gguf {
    struct llmq_mmap map;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;                     // parsed so far (the declared count once open succeeded)
    struct llmq_gguf_kv *kvs;         // (n_kv), capacity kv_cap
    int64_t n_tensors;                // parsed so far, like n_kv
    struct llmq_gguf_tensor *tensors; // (n_tensors), capacity tensor_cap
    uint64_t kv_cap, tensor_cap;
    struct name_index kv_index, tensor_index;
    struct arena_block *arena;
};

// Makes room for element i of *arr (capacity *cap, elements of sz bytes, zero-filled), growing
// geometrically up to max: memory follows what was actually parsed, not what a header claims.
static bool grow(void **arr, uint64_t *cap, uint64_t i, uint64_t max, size_t sz) {
    if (i < *cap) return true;
    uint64_t ncap = *cap < 32 ? 32 : 2 * *cap;
    if (ncap > max) ncap = max;
    if (ncap <= i || ncap > SIZE_MAX / sz) return false;
    uint8_t *p = realloc(*arr, (size_t)ncap * sz);
    if (!p) return false;
    memset(p + *cap * sz, 0, (size_t)(ncap - *cap) * sz);
    *arr = p;
    *cap = ncap;
    return true;
}

// A read position in the mapping. `ctx` names what is being parsed ("key #3", "tensor 'x'") for
// error messages.
struct cursor {
    const uint8_t *p;
    uint64_t size, pos;
    const char *path;
    unsigned len_size; // 4 (v1) or 8
    char ctx[320];
};

static enum llmq_status need(struct cursor *c, uint64_t n, const char *what) {
    if (n <= c->size - c->pos) return LLMQ_OK;
    return llmq_errorf(LLMQ_ERR_TRUNCATED,
                       "%s: truncated header: %s of %s needs %" PRIu64 " bytes at offset %" PRIu64
                       ", but the file ends at %" PRIu64,
                       c->path, what, c->ctx, n, c->pos, c->size);
}

static enum llmq_status get_u32(struct cursor *c, uint32_t *v, const char *what) {
    enum llmq_status st = need(c, 4, what);
    if (st) return st;
    *v = rd_u32(c->p + c->pos);
    c->pos += 4;
    return LLMQ_OK;
}

static enum llmq_status get_u64(struct cursor *c, uint64_t *v, const char *what) {
    enum llmq_status st = need(c, 8, what);
    if (st) return st;
    *v = rd_u64(c->p + c->pos);
    c->pos += 8;
    return LLMQ_OK;
}

// A LEN field: u32 in version 1, u64 later.
static enum llmq_status get_len(struct cursor *c, uint64_t *v, const char *what) {
    if (c->len_size == 8) return get_u64(c, v, what);
    uint32_t x = 0;
    enum llmq_status st = get_u32(c, &x, what);
    *v = x;
    return st;
}

// A STRING: *s points into the mapping, *n bytes.
static enum llmq_status get_str(struct cursor *c, const uint8_t **s, uint64_t *n, const char *what) {
    uint64_t len_pos = c->pos;
    enum llmq_status st = get_len(c, n, what);
    if (st) return st;
    if (*n > c->size - c->pos)
        return llmq_errorf(LLMQ_ERR_TRUNCATED,
                           "%s: truncated header: %s of %s at offset %" PRIu64 " has length %" PRIu64
                           ", past the end of the file (%" PRIu64 " bytes)",
                           c->path, what, c->ctx, len_pos, *n, c->size);
    *s = c->p + c->pos;
    c->pos += *n;
    return LLMQ_OK;
}

// Checks a key or tensor name read at offset off and copies it into the arena.
static enum llmq_status take_name(struct llmq_gguf *g, struct cursor *c, const uint8_t *s, uint64_t n, uint64_t off,
                                  const char *what, const char **out) {
    if (n == 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s of %s at offset %" PRIu64 " is empty", c->path, what, c->ctx, off);
    if (memchr(s, 0, n))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s of %s at offset %" PRIu64 " contains a NUL byte", c->path, what,
                           c->ctx, off);
    if (!llmq_utf8_valid((const char *)s, n))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s of %s at offset %" PRIu64 " is not valid UTF-8", c->path, what,
                           c->ctx, off);
    *out = arena_strdup(&g->arena, s, n);
    if (!*out) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", c->path);
    return LLMQ_OK;
}

// Parses the value of kv (its type id already read into kv->type) at the cursor.
static enum llmq_status parse_value(struct llmq_gguf *g, struct cursor *c, struct llmq_gguf_kv *kv) {
    enum llmq_status st;
    uint64_t type_pos = c->pos - 4;
    kv->offset = c->pos;
    kv->base = c->p;
    kv->len_size = (uint8_t)c->len_size;
    kv->n = 1;
    kv->arr_type = kv->type;
    if ((unsigned)kv->type >= LLMQ_GGUF_TYPE_COUNT)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: unknown value type %u of %s at offset %" PRIu64, c->path,
                           (unsigned)kv->type, c->ctx, type_pos);
    if (kv->type == LLMQ_GGUF_TYPE_STRING) {
        const uint8_t *s = NULL;
        uint64_t n;
        if ((st = get_str(c, &s, &n, "string value"))) return st;
        kv->data = s;
        kv->nbytes = n;
        kv->str = arena_strdup(&g->arena, s, n);
        if (!kv->str) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", c->path);
        return LLMQ_OK;
    }
    if (kv->type != LLMQ_GGUF_TYPE_ARRAY) {
        size_t sz = type_info[kv->type].size;
        if ((st = need(c, sz, "value"))) return st;
        kv->data = c->p + c->pos;
        kv->nbytes = sz;
        c->pos += sz;
        return LLMQ_OK;
    }

    // ARRAY: element type, count, elements
    uint32_t et;
    uint64_t n;
    if ((st = get_u32(c, &et, "array element type"))) return st;
    if (et >= LLMQ_GGUF_TYPE_COUNT)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: unknown array element type %u of %s at offset %" PRIu64, c->path, et,
                           c->ctx, c->pos - 4);
    if (et == LLMQ_GGUF_TYPE_ARRAY)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: nested arrays are not supported (%s at offset %" PRIu64 ")",
                           c->path, c->ctx, c->pos - 4);
    kv->arr_type = (enum llmq_gguf_type)et;
    uint64_t count_pos = c->pos;
    if ((st = get_len(c, &n, "array count"))) return st;
    kv->n = n;
    kv->data = c->p + c->pos;
    uint64_t remaining = c->size - c->pos;
    if (et != LLMQ_GGUF_TYPE_STRING) {
        size_t sz = type_info[et].size;
        if (n > remaining / sz)
            return llmq_errorf(LLMQ_ERR_TRUNCATED,
                               "%s: truncated header: array of %s at offset %" PRIu64 " holds %" PRIu64
                               " %s elements, past the end of the file (%" PRIu64 " bytes)",
                               c->path, c->ctx, count_pos, n, type_info[et].name, c->size);
        kv->nbytes = n * sz;
        c->pos += n * sz;
        return LLMQ_OK;
    }
    // array of strings: every element needs at least its length field
    if (n > remaining / c->len_size)
        return llmq_errorf(LLMQ_ERR_TRUNCATED,
                           "%s: truncated header: array of %s at offset %" PRIu64 " holds %" PRIu64
                           " strings, past the end of the file (%" PRIu64 " bytes)",
                           c->path, c->ctx, count_pos, n, c->size);
    uint64_t *off = NULL, cap = 0;
    uint64_t start = c->pos;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t len = 0;
        if (!grow((void **)&off, &cap, j, n, sizeof(*off)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %" PRIu64 " strings of %s", c->path, n, c->ctx);
        kv->str_off = off; // owned by kv from here on, also on failure
        off[j] = c->pos;
        bool ok = c->size - c->pos >= c->len_size;
        if (ok) {
            len = c->len_size == 8 ? rd_u64(c->p + c->pos) : rd_u32(c->p + c->pos);
            c->pos += c->len_size;
            ok = len <= c->size - c->pos;
        }
        if (!ok)
            return llmq_errorf(LLMQ_ERR_TRUNCATED,
                               "%s: truncated header: string %" PRIu64 " of the array of %s at offset %" PRIu64
                               " runs past the end of the file (%" PRIu64 " bytes)",
                               c->path, j, c->ctx, off[j], c->size);
        c->pos += len;
    }
    kv->nbytes = c->pos - start;
    return LLMQ_OK;
}

static enum llmq_status parse_kvs(struct llmq_gguf *g, struct cursor *c, uint64_t n_kv) {
    enum llmq_status st;
    for (int64_t i = 0; i < (int64_t)n_kv; i++) {
        if (!grow((void **)&g->kvs, &g->kv_cap, (uint64_t)i, n_kv, sizeof(*g->kvs)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %" PRIu64 " keys", c->path, n_kv);
        g->n_kv = i + 1;
        struct llmq_gguf_kv *kv = &g->kvs[i];
        const uint8_t *s = NULL;
        uint64_t n, key_pos = c->pos;
        uint32_t type;
        snprintf(c->ctx, sizeof(c->ctx), "key #%" PRId64, i);
        if ((st = get_str(c, &s, &n, "name"))) return st;
        if ((st = take_name(g, c, s, n, key_pos, "name", &kv->key))) return st;
        int64_t prev = index_find(&g->kv_index, kv->key, n);
        if (prev >= 0)
            return llmq_errorf(LLMQ_ERR_DUPLICATE,
                               "%s: duplicate key '%s' at offset %" PRIu64 " (also key #%" PRId64 ")", c->path, kv->key,
                               key_pos, prev);
        if (!index_insert(&g->kv_index, kv->key, n, i))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", c->path);
        snprintf(c->ctx, sizeof(c->ctx), "key '%.256s'", kv->key);
        if ((st = get_u32(c, &type, "value type"))) return st;
        kv->type = (enum llmq_gguf_type)type;
        if ((st = parse_value(g, c, kv))) return st;
    }
    return LLMQ_OK;
}

static enum llmq_status parse_alignment(struct llmq_gguf *g) {
    const struct llmq_gguf_kv *kv = llmq_gguf_find_kv(g, LLMQ_GGUF_KEY_ALIGNMENT);
    g->alignment = LLMQ_GGUF_DEFAULT_ALIGNMENT;
    if (!kv) return LLMQ_OK;
    if (kv->type != LLMQ_GGUF_TYPE_UINT32)
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: key '%s' at offset %" PRIu64 " has type %s; the alignment must be a u32", g->map.path,
                           kv->key, kv->offset, llmq_gguf_type_name(kv->type));
    uint32_t a = rd_u32(kv->data);
    if (!is_pow2(a))
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: bad alignment %u in key '%s' at offset %" PRIu64 ": not a nonzero power of two",
                           g->map.path, a, kv->key, kv->offset);
    g->alignment = a;
    return LLMQ_OK;
}

static enum llmq_status parse_tensor_infos(struct llmq_gguf *g, struct cursor *c, uint64_t n_tensors) {
    enum llmq_status st;
    for (int64_t i = 0; i < (int64_t)n_tensors; i++) {
        if (!grow((void **)&g->tensors, &g->tensor_cap, (uint64_t)i, n_tensors, sizeof(*g->tensors)))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tensors", c->path, n_tensors);
        g->n_tensors = i + 1;
        struct llmq_gguf_tensor *t = &g->tensors[i];
        const uint8_t *s = NULL;
        uint64_t n, name_pos = c->pos;
        uint32_t n_dims, type;
        snprintf(c->ctx, sizeof(c->ctx), "tensor #%" PRId64, i);
        if ((st = get_str(c, &s, &n, "name"))) return st;
        if ((st = take_name(g, c, s, n, name_pos, "name", &t->view.name))) return st;
        int64_t prev = index_find(&g->tensor_index, t->view.name, n);
        if (prev >= 0)
            return llmq_errorf(LLMQ_ERR_DUPLICATE,
                               "%s: duplicate tensor name '%s' at offset %" PRIu64 " (also tensor #%" PRId64 ")",
                               c->path, t->view.name, name_pos, prev);
        if (!index_insert(&g->tensor_index, t->view.name, n, i))
            return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", c->path);
        snprintf(c->ctx, sizeof(c->ctx), "tensor '%.256s'", t->view.name);

        if ((st = get_u32(c, &n_dims, "n_dims"))) return st;
        if (n_dims > LLMQ_MAX_DIMS)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                               "%s: %s at offset %" PRIu64 " has %u dimensions (at most %d supported)", c->path, c->ctx,
                               c->pos - 4, n_dims, LLMQ_MAX_DIMS);
        int64_t nel = 1;
        for (int k = 0; k < LLMQ_MAX_DIMS; k++) t->ne[k] = 1;
        for (uint32_t k = 0; k < n_dims; k++) {
            uint64_t d, dim_pos = c->pos;
            if ((st = get_len(c, &d, "dimension"))) return st;
            if (d > (uint64_t)INT64_MAX)
                return llmq_errorf(LLMQ_ERR_CORRUPT,
                                   "%s: %s has a negative dimension ne[%u] = %" PRId64 " at offset %" PRIu64, c->path,
                                   c->ctx, k, (int64_t)d, dim_pos);
            t->ne[k] = (int64_t)d;
            if (!llmq_mul_i64(nel, t->ne[k], &nel))
                return llmq_errorf(LLMQ_ERR_OVERFLOW,
                                   "%s: element count of %s overflows int64 (dimension ne[%u] at offset %" PRIu64 ")",
                                   c->path, c->ctx, k, dim_pos);
        }
        uint64_t type_pos = c->pos;
        if ((st = get_u32(c, &type, "ggml type"))) return st;
        if ((st = get_u64(c, &t->offset, "data offset"))) return st;

        enum llmq_dtype dt = llmq_dtype_from_ggml(type);
        if (dt == LLMQ_DTYPE_INVALID)
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: %s has unknown ggml type id %u at offset %" PRIu64, c->path,
                               c->ctx, type, type_pos);
        const struct llmq_dtype_traits *tr = llmq_dtype_traits(dt);
        if (t->ne[0] % tr->blck != 0)
            return llmq_errorf(LLMQ_ERR_CORRUPT,
                               "%s: %s: row length ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId64,
                               c->path, c->ctx, t->ne[0], tr->name, tr->blck);
        size_t nbytes;
        if (!llmq_dtype_nbytes(dt, nel, &nbytes))
            return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: byte size of %s (%" PRId64 " elements of %s) overflows", c->path,
                               c->ctx, nel, tr->name);
        t->ggml_type = type;
        t->view.dtype = dt;
        t->view.n_dims = (int)n_dims;
        for (int k = 0; k < LLMQ_MAX_DIMS; k++) t->view.shape[k] = 1;
        for (uint32_t k = 0; k < n_dims; k++) t->view.shape[k] = t->ne[n_dims - 1 - k];
        t->view.nbytes = nbytes;
    }
    return LLMQ_OK;
}

struct extent {
    uint64_t begin, end;
    int64_t idx;
};

static int cmp_extent(const void *a, const void *b) {
    const struct extent *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

// Places every tensor in the data section: aligned, inside the file, not overlapping.
static enum llmq_status place_tensors(struct llmq_gguf *g) {
    const char *path = g->map.path;
    struct extent *ext = NULL;
    int64_t n_ext = 0;
    if (g->n_tensors > 0) {
        ext = malloc((size_t)g->n_tensors * sizeof(*ext));
        if (!ext) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct llmq_gguf_tensor *t = &g->tensors[i];
        uint64_t begin, end;
        if (t->offset % g->alignment != 0) {
            llmq_errorf(LLMQ_ERR_CORRUPT,
                        "%s: tensor '%s' data offset %" PRIu64
                        " is misaligned (not a multiple of the alignment %" PRIu64 ")",
                        path, t->view.name, t->offset, g->alignment);
            goto fail;
        }
        if (!llmq_add_u64(g->data_offset, t->offset, &begin) || !llmq_add_u64(begin, t->view.nbytes, &end) ||
            end > g->map.size) {
            llmq_errorf(LLMQ_ERR_TRUNCATED,
                        "%s: tensor '%s' data (%zu bytes at offset %" PRIu64 " of the data section at %" PRIu64
                        ") runs past the end of the file (%zu bytes)",
                        path, t->view.name, t->view.nbytes, t->offset, g->data_offset, g->map.size);
            goto fail;
        }
        t->view.file_offset = begin;
        t->view.data = g->map.data ? g->map.data + begin : NULL;
        if (t->view.nbytes > 0) ext[n_ext++] = (struct extent){begin, end, i};
    }
    if (n_ext > 1) qsort(ext, (size_t)n_ext, sizeof(*ext), cmp_extent);
    for (int64_t k = 1; k < n_ext; k++) {
        if (ext[k].begin < ext[k - 1].end) {
            const struct llmq_gguf_tensor *a = &g->tensors[ext[k - 1].idx], *b = &g->tensors[ext[k].idx];
            llmq_errorf(LLMQ_ERR_CORRUPT,
                        "%s: data of tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64
                        ") overlap",
                        path, a->view.name, ext[k - 1].begin, ext[k - 1].end, b->view.name, ext[k].begin, ext[k].end);
            goto fail;
        }
    }
    free(ext);
    return LLMQ_OK;
fail:
    free(ext);
    return llmq_last_status();
}

static enum llmq_status parse_header(struct llmq_gguf *g) {
    struct cursor c = {.p = g->map.data, .size = g->map.size, .pos = 0, .path = g->map.path, .len_size = 8};
    enum llmq_status st;
    uint64_t n_tensors, n_kv;
    snprintf(c.ctx, sizeof(c.ctx), "the file header");

    if (c.size < 4) {
        if (c.size == 0 || memcmp(c.p, LLMQ_GGUF_MAGIC, c.size) == 0)
            return llmq_errorf(LLMQ_ERR_TRUNCATED,
                               "%s: truncated header: the magic at offset 0 needs 4 bytes, the file has %" PRIu64,
                               c.path, c.size);
        return llmq_errorf(LLMQ_ERR_MAGIC, "%s: bad magic at offset 0: not a GGUF file (%" PRIu64 " bytes)", c.path,
                           c.size);
    }
    if (memcmp(c.p, LLMQ_GGUF_MAGIC, 4) != 0)
        return llmq_errorf(LLMQ_ERR_MAGIC, "%s: bad magic %02x %02x %02x %02x at offset 0: not a GGUF file", c.path,
                           c.p[0], c.p[1], c.p[2], c.p[3]);
    c.pos = 4;
    if ((st = get_u32(&c, &g->version, "version"))) return st;
    if (g->version == 0 || g->version > 3) {
        uint32_t swapped = __builtin_bswap32(g->version);
        return llmq_errorf(LLMQ_ERR_VERSION, "%s: unsupported GGUF version %u at offset 4 (llmq reads 1, 2 and 3%s)",
                           c.path, g->version,
                           swapped >= 1 && swapped <= 3 ? "; this looks like a big-endian file" : "");
    }
    c.len_size = g->version == 1 ? 4 : 8;
    if ((st = get_len(&c, &n_tensors, "n_tensors"))) return st;
    if ((st = get_len(&c, &n_kv, "n_kv"))) return st;

    // bound the counts by the bytes that could hold them before allocating anything
    uint64_t remaining = c.size - c.pos;
    uint64_t min_kv = c.len_size + 4 + 1;     // key length, type, smallest value
    uint64_t min_ti = c.len_size + 4 + 4 + 8; // name length, n_dims, type, offset
    if (n_kv > remaining / min_kv)
        return llmq_errorf(LLMQ_ERR_TRUNCATED,
                           "%s: truncated header: n_kv = %" PRIu64 " (offset %u) cannot fit in the %" PRIu64
                           " bytes after the header fields",
                           c.path, n_kv, 8 + c.len_size, remaining);
    if (n_tensors > (remaining - n_kv * min_kv) / min_ti)
        return llmq_errorf(LLMQ_ERR_TRUNCATED,
                           "%s: truncated header: n_tensors = %" PRIu64 " (offset 8) cannot fit in the %" PRIu64
                           " bytes after the header fields",
                           c.path, n_tensors, remaining);
    if ((st = parse_kvs(g, &c, n_kv))) return st;
    if ((st = parse_alignment(g))) return st;
    if ((st = parse_tensor_infos(g, &c, n_tensors))) return st;
    g->data_offset = align_up(c.pos, g->alignment);
    return place_tensors(g);
}

enum llmq_status llmq_gguf_open(const char *path, struct llmq_gguf **out) {
    enum llmq_status st;
    struct llmq_gguf *g = calloc(1, sizeof(*g));
    *out = NULL;
    if (!g) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    if ((st = llmq_mmap_open(&g->map, path))) goto fail;
    if ((st = parse_header(g))) goto fail;
    *out = g;
    return LLMQ_OK;
fail:
    llmq_gguf_free(g);
    return st;
}

void llmq_gguf_free(struct llmq_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) free((void *)g->kvs[i].str_off);
    free(g->kvs);
    free(g->tensors);
    index_free(&g->kv_index);
    index_free(&g->tensor_index);
    arena_free(g->arena);
    llmq_mmap_close(&g->map);
    free(g);
}

const char *llmq_gguf_path(const struct llmq_gguf *g) { return g->map.path; }
uint32_t llmq_gguf_version(const struct llmq_gguf *g) { return g->version; }
uint64_t llmq_gguf_alignment(const struct llmq_gguf *g) { return g->alignment; }
uint64_t llmq_gguf_data_offset(const struct llmq_gguf *g) { return g->data_offset; }
uint64_t llmq_gguf_file_size(const struct llmq_gguf *g) { return g->map.size; }

int64_t llmq_gguf_n_kv(const struct llmq_gguf *g) { return g->n_kv; }

const struct llmq_gguf_kv *llmq_gguf_kv_at(const struct llmq_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_kv ? &g->kvs[i] : NULL;
}

int64_t llmq_gguf_find_kv_index(const struct llmq_gguf *g, const char *key) {
    return index_find(&g->kv_index, key, strlen(key));
}

const struct llmq_gguf_kv *llmq_gguf_find_kv(const struct llmq_gguf *g, const char *key) {
    return llmq_gguf_kv_at(g, llmq_gguf_find_kv_index(g, key));
}

int64_t llmq_gguf_n_tensors(const struct llmq_gguf *g) { return g->n_tensors; }

const struct llmq_gguf_tensor *llmq_gguf_tensor_at(const struct llmq_gguf *g, int64_t i) {
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

int64_t llmq_gguf_find_tensor_index(const struct llmq_gguf *g, const char *name) {
    return index_find(&g->tensor_index, name, strlen(name));
}

const struct llmq_gguf_tensor *llmq_gguf_find_tensor(const struct llmq_gguf *g, const char *name) {
    return llmq_gguf_tensor_at(g, llmq_gguf_find_tensor_index(g, name));
}

// ---- value accessors

static bool is_scalar(const struct llmq_gguf_kv *kv) {
    return kv && kv->type != LLMQ_GGUF_TYPE_ARRAY && kv->type != LLMQ_GGUF_TYPE_STRING;
}

bool llmq_gguf_kv_as_i64(const struct llmq_gguf_kv *kv, int64_t *out) {
    return is_scalar(kv) && elem_i64(kv->type, kv->data, out);
}
bool llmq_gguf_kv_as_u64(const struct llmq_gguf_kv *kv, uint64_t *out) {
    return is_scalar(kv) && elem_u64(kv->type, kv->data, out);
}
bool llmq_gguf_kv_as_f64(const struct llmq_gguf_kv *kv, double *out) {
    return is_scalar(kv) && elem_f64(kv->type, kv->data, out);
}
bool llmq_gguf_kv_as_bool(const struct llmq_gguf_kv *kv, bool *out) {
    return is_scalar(kv) && elem_bool(kv->type, kv->data, out);
}

const char *llmq_gguf_kv_as_str(const struct llmq_gguf_kv *kv, size_t *len) {
    if (!kv || kv->type != LLMQ_GGUF_TYPE_STRING) return NULL;
    if (len) *len = (size_t)kv->nbytes;
    return kv->str;
}

// The packed element j of a numeric array, or NULL.
static const uint8_t *arr_elem(const struct llmq_gguf_kv *kv, uint64_t j) {
    if (!kv || kv->type != LLMQ_GGUF_TYPE_ARRAY || kv->arr_type == LLMQ_GGUF_TYPE_STRING || j >= kv->n) return NULL;
    return kv->data + j * type_info[kv->arr_type].size;
}

bool llmq_gguf_kv_arr_i64(const struct llmq_gguf_kv *kv, uint64_t j, int64_t *out) {
    const uint8_t *p = arr_elem(kv, j);
    return p && elem_i64(kv->arr_type, p, out);
}
bool llmq_gguf_kv_arr_u64(const struct llmq_gguf_kv *kv, uint64_t j, uint64_t *out) {
    const uint8_t *p = arr_elem(kv, j);
    return p && elem_u64(kv->arr_type, p, out);
}
bool llmq_gguf_kv_arr_f64(const struct llmq_gguf_kv *kv, uint64_t j, double *out) {
    const uint8_t *p = arr_elem(kv, j);
    return p && elem_f64(kv->arr_type, p, out);
}
bool llmq_gguf_kv_arr_bool(const struct llmq_gguf_kv *kv, uint64_t j, bool *out) {
    const uint8_t *p = arr_elem(kv, j);
    return p && elem_bool(kv->arr_type, p, out);
}

const char *llmq_gguf_kv_arr_str(const struct llmq_gguf_kv *kv, uint64_t j, size_t *len) {
    if (!kv || kv->type != LLMQ_GGUF_TYPE_ARRAY || kv->arr_type != LLMQ_GGUF_TYPE_STRING || j >= kv->n) return NULL;
    const uint8_t *p = kv->base + kv->str_off[j];
    uint64_t n = kv->len_size == 8 ? rd_u64(p) : rd_u32(p);
    if (len) *len = (size_t)n;
    return (const char *)p + kv->len_size;
}

// ---- getters by key

static enum llmq_status find_for_get(const struct llmq_gguf *g, const char *key, const struct llmq_gguf_kv **kv) {
    *kv = llmq_gguf_find_kv(g, key);
    if (!*kv) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: key '%s' not found", g->map.path, key);
    return LLMQ_OK;
}

static bool is_int_type(enum llmq_gguf_type t) {
    struct ival v;
    static const uint8_t zero[8];
    return read_int(t, zero, &v);
}

static enum llmq_status bad_type(const struct llmq_gguf *g, const struct llmq_gguf_kv *kv, const char *want) {
    if (is_int_type(kv->type))
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: value of key '%s' (%s at offset %" PRIu64 ") does not fit in %s",
                           g->map.path, kv->key, llmq_gguf_type_name(kv->type), kv->offset, want);
    return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' at offset %" PRIu64 " has type %s, expected %s", g->map.path,
                       kv->key, kv->offset, llmq_gguf_type_name(kv->type), want);
}

enum llmq_status llmq_gguf_get_i64(const struct llmq_gguf *g, const char *key, int64_t *out) {
    const struct llmq_gguf_kv *kv;
    enum llmq_status st = find_for_get(g, key, &kv);
    if (st) return st;
    return llmq_gguf_kv_as_i64(kv, out) ? LLMQ_OK : bad_type(g, kv, "an int64");
}

enum llmq_status llmq_gguf_get_u64(const struct llmq_gguf *g, const char *key, uint64_t *out) {
    const struct llmq_gguf_kv *kv;
    enum llmq_status st = find_for_get(g, key, &kv);
    if (st) return st;
    return llmq_gguf_kv_as_u64(kv, out) ? LLMQ_OK : bad_type(g, kv, "a non-negative integer");
}

enum llmq_status llmq_gguf_get_f64(const struct llmq_gguf *g, const char *key, double *out) {
    const struct llmq_gguf_kv *kv;
    enum llmq_status st = find_for_get(g, key, &kv);
    if (st) return st;
    if (llmq_gguf_kv_as_f64(kv, out)) return LLMQ_OK;
    return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' at offset %" PRIu64 " has type %s, expected a number",
                       g->map.path, kv->key, kv->offset, llmq_gguf_type_name(kv->type));
}

enum llmq_status llmq_gguf_get_bool(const struct llmq_gguf *g, const char *key, bool *out) {
    const struct llmq_gguf_kv *kv;
    enum llmq_status st = find_for_get(g, key, &kv);
    if (st) return st;
    if (llmq_gguf_kv_as_bool(kv, out)) return LLMQ_OK;
    return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' at offset %" PRIu64 " has type %s, expected bool", g->map.path,
                       kv->key, kv->offset, llmq_gguf_type_name(kv->type));
}

enum llmq_status llmq_gguf_get_str(const struct llmq_gguf *g, const char *key, const char **out) {
    const struct llmq_gguf_kv *kv;
    enum llmq_status st = find_for_get(g, key, &kv);
    if (st) return st;
    const char *s = llmq_gguf_kv_as_str(kv, NULL);
    if (!s)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' at offset %" PRIu64 " has type %s, expected string",
                           g->map.path, kv->key, kv->offset, llmq_gguf_type_name(kv->type));
    *out = s;
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_get_arr(const struct llmq_gguf *g, const char *key, enum llmq_gguf_type elem,
                                   const struct llmq_gguf_kv **out) {
    const struct llmq_gguf_kv *kv;
    enum llmq_status st = find_for_get(g, key, &kv);
    if (st) return st;
    if (kv->type != LLMQ_GGUF_TYPE_ARRAY || (elem != LLMQ_GGUF_TYPE_COUNT && kv->arr_type != elem))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: key '%s' at offset %" PRIu64 " has type %s%s%s, expected array of %s",
                           g->map.path, kv->key, kv->offset, llmq_gguf_type_name(kv->type),
                           kv->type == LLMQ_GGUF_TYPE_ARRAY ? " of " : "",
                           kv->type == LLMQ_GGUF_TYPE_ARRAY ? llmq_gguf_type_name(kv->arr_type) : "",
                           elem == LLMQ_GGUF_TYPE_COUNT ? "any type" : llmq_gguf_type_name(elem));
    *out = kv;
    return LLMQ_OK;
}

// ==================================================================================================
// Writer
// ==================================================================================================

// A growable byte buffer; an allocation failure is sticky (oom).
struct bytes {
    uint8_t *p;
    size_t n, cap;
    bool oom;
};

static void put(struct bytes *b, const void *src, size_t n) {
    if (b->oom || n == 0) return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap - b->n < n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(struct bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct bytes *b, const void *s, uint64_t n) {
    put_u64(b, n);
    put(b, s, (size_t)n);
}

struct wkv {
    char *key;
    enum llmq_gguf_type type;
    uint8_t *payload; // the value as written in version 3 (after the type id)
    size_t payload_len;
};

struct wtensor {
    char *name;
    enum llmq_dtype dtype;
    uint32_t n_dims;
    int64_t ne[LLMQ_MAX_DIMS]; // ggml order (fastest first)
    size_t nbytes;
    uint64_t offset; // relative to the data section, set by begin()
};

enum writer_state { WRITER_BUILD, WRITER_OPEN, WRITER_DONE, WRITER_FAILED };

struct llmq_gguf_writer {
    struct wkv *kvs; // (n_kv) in the order first set
    int64_t n_kv, cap_kv;
    struct name_index kv_index;
    struct wtensor *tensors; // (n_tensors) in declared order
    int64_t n_tensors, cap_tensors;
    struct name_index tensor_index;
    enum writer_state state;
    struct llmq_afile file;                                 // open in WRITER_OPEN only
    uint64_t alignment, header_size, data_offset, data_end; // data_end: relative to data_offset
    int64_t cur;                                            // the tensor being written
    size_t cur_written;                                     // bytes of it written so far
};

struct llmq_gguf_writer *llmq_gguf_writer_init(void) {
    struct llmq_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w) llmq_errorf(LLMQ_ERR_NOMEM, "gguf writer: out of memory");
    return w;
}

void llmq_gguf_writer_abort(struct llmq_gguf_writer *w) {
    if (!w) return;
    if (w->state == WRITER_OPEN) llmq_afile_abort(&w->file);
    if (w->state != WRITER_DONE) w->state = WRITER_FAILED;
}

void llmq_gguf_writer_free(struct llmq_gguf_writer *w) {
    if (!w) return;
    llmq_gguf_writer_abort(w);
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].payload);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->kvs);
    free(w->tensors);
    index_free(&w->kv_index);
    index_free(&w->tensor_index);
    free(w);
}

static enum llmq_status check_building(const struct llmq_gguf_writer *w, const char *what, const char *name) {
    if (w->state != WRITER_BUILD)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: cannot %s '%s' after begin() or a failure", what,
                           name ? name : "");
    return LLMQ_OK;
}

// Stores key = (type, payload); takes ownership of payload (freed on failure too).
static enum llmq_status set_payload(struct llmq_gguf_writer *w, const char *key, enum llmq_gguf_type type,
                                    struct bytes *payload) {
    enum llmq_status st = LLMQ_OK;
    char *key_copy = NULL;
    size_t klen = key ? strlen(key) : 0;
    if ((st = check_building(w, "set key", key))) goto fail;
    if (klen == 0 || !llmq_utf8_valid(key, klen)) {
        st = llmq_errorf(LLMQ_ERR_ARG, "gguf writer: key '%s' is empty or not valid UTF-8", key ? key : "(null)");
        goto fail;
    }
    if (payload->oom) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf writer: out of memory for the value of key '%s'", key);
        goto fail;
    }
    int64_t i = index_find(&w->kv_index, key, klen);
    if (i >= 0) { // replace in place
        free(w->kvs[i].payload);
        w->kvs[i].type = type;
        w->kvs[i].payload = payload->p;
        w->kvs[i].payload_len = payload->n;
        return LLMQ_OK;
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        struct wkv *kvs = realloc(w->kvs, (size_t)cap * sizeof(*kvs));
        if (!kvs) goto oom;
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    key_copy = strdup(key);
    if (!key_copy || !index_insert(&w->kv_index, key_copy, klen, w->n_kv)) goto oom;
    w->kvs[w->n_kv++] = (struct wkv){key_copy, type, payload->p, payload->n};
    return LLMQ_OK;
oom:
    st = llmq_errorf(LLMQ_ERR_NOMEM, "gguf writer: out of memory for key '%s'", key);
fail:
    free(key_copy);
    free(payload->p);
    return st;
}

static enum llmq_status set_scalar(struct llmq_gguf_writer *w, const char *key, enum llmq_gguf_type t, const void *v) {
    struct bytes b = {0};
    put(&b, v, type_info[t].size);
    return set_payload(w, key, t, &b);
}

enum llmq_status llmq_gguf_writer_set_u8(struct llmq_gguf_writer *w, const char *key, uint8_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_UINT8, &v);
}
enum llmq_status llmq_gguf_writer_set_i8(struct llmq_gguf_writer *w, const char *key, int8_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_INT8, &v);
}
enum llmq_status llmq_gguf_writer_set_u16(struct llmq_gguf_writer *w, const char *key, uint16_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_UINT16, &v);
}
enum llmq_status llmq_gguf_writer_set_i16(struct llmq_gguf_writer *w, const char *key, int16_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_INT16, &v);
}
enum llmq_status llmq_gguf_writer_set_u32(struct llmq_gguf_writer *w, const char *key, uint32_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_UINT32, &v);
}
enum llmq_status llmq_gguf_writer_set_i32(struct llmq_gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_INT32, &v);
}
enum llmq_status llmq_gguf_writer_set_f32(struct llmq_gguf_writer *w, const char *key, float v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_FLOAT32, &v);
}
enum llmq_status llmq_gguf_writer_set_bool(struct llmq_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, LLMQ_GGUF_TYPE_BOOL, &b);
}
enum llmq_status llmq_gguf_writer_set_u64(struct llmq_gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_UINT64, &v);
}
enum llmq_status llmq_gguf_writer_set_i64(struct llmq_gguf_writer *w, const char *key, int64_t v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_INT64, &v);
}
enum llmq_status llmq_gguf_writer_set_f64(struct llmq_gguf_writer *w, const char *key, double v) {
    return set_scalar(w, key, LLMQ_GGUF_TYPE_FLOAT64, &v);
}

enum llmq_status llmq_gguf_writer_set_strn(struct llmq_gguf_writer *w, const char *key, const char *s, size_t n) {
    struct bytes b = {0};
    put_str(&b, s, n);
    return set_payload(w, key, LLMQ_GGUF_TYPE_STRING, &b);
}

enum llmq_status llmq_gguf_writer_set_str(struct llmq_gguf_writer *w, const char *key, const char *s) {
    return llmq_gguf_writer_set_strn(w, key, s, strlen(s));
}

enum llmq_status llmq_gguf_writer_set_arr(struct llmq_gguf_writer *w, const char *key, enum llmq_gguf_type elem,
                                          const void *data, uint64_t n) {
    struct bytes b = {0};
    size_t sz = llmq_gguf_type_size(elem);
    if (sz == 0)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: key '%s': set_arr needs a fixed-size element type, not %s",
                           key ? key : "(null)", llmq_gguf_type_name(elem));
    if (n > (SIZE_MAX - 16) / sz)
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "gguf writer: key '%s': %" PRIu64 " elements overflow",
                           key ? key : "(null)", n);
    put_u32(&b, (uint32_t)elem);
    put_u64(&b, n);
    put(&b, data, (size_t)n * sz);
    return set_payload(w, key, LLMQ_GGUF_TYPE_ARRAY, &b);
}

enum llmq_status llmq_gguf_writer_set_arr_str(struct llmq_gguf_writer *w, const char *key, const char *const *strs,
                                              const size_t *lens, uint64_t n) {
    struct bytes b = {0};
    put_u32(&b, LLMQ_GGUF_TYPE_STRING);
    put_u64(&b, n);
    for (uint64_t j = 0; j < n && !b.oom; j++) put_str(&b, strs[j], lens ? lens[j] : strlen(strs[j]));
    return set_payload(w, key, LLMQ_GGUF_TYPE_ARRAY, &b);
}

enum llmq_status llmq_gguf_writer_set_kv(struct llmq_gguf_writer *w, const struct llmq_gguf_kv *kv) {
    struct bytes b = {0};
    if (kv->type == LLMQ_GGUF_TYPE_STRING) {
        put_str(&b, kv->data, kv->nbytes);
    } else if (kv->type != LLMQ_GGUF_TYPE_ARRAY) {
        put(&b, kv->data, (size_t)kv->nbytes);
    } else {
        put_u32(&b, (uint32_t)kv->arr_type);
        put_u64(&b, kv->n);
        if (kv->arr_type != LLMQ_GGUF_TYPE_STRING) {
            put(&b, kv->data, (size_t)kv->nbytes);
        } else {
            for (uint64_t j = 0; j < kv->n && !b.oom; j++) {
                size_t len = 0;
                const char *s = llmq_gguf_kv_arr_str(kv, j, &len);
                put_str(&b, s, len);
            }
        }
    }
    return set_payload(w, kv->key, kv->type, &b);
}

enum llmq_status llmq_gguf_writer_copy_kvs(struct llmq_gguf_writer *w, const struct llmq_gguf *src,
                                           const char *const *except) {
    for (int64_t i = 0; i < src->n_kv; i++) {
        const struct llmq_gguf_kv *kv = &src->kvs[i];
        bool skip = false;
        for (const char *const *e = except; e && *e && !skip; e++) skip = strcmp(*e, kv->key) == 0;
        if (skip) continue;
        enum llmq_status st = llmq_gguf_writer_set_kv(w, kv);
        if (st) return st;
    }
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_writer_add_tensor(struct llmq_gguf_writer *w, const char *name, enum llmq_dtype dtype,
                                             int n_dims, const int64_t *shape) {
    enum llmq_status st;
    size_t nlen = name ? strlen(name) : 0;
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(dtype);
    struct wtensor t = {0};
    int64_t nel = 1;
    if ((st = check_building(w, "add tensor", name))) return st;
    if (nlen == 0 || nlen >= LLMQ_GGUF_MAX_NAME || !llmq_utf8_valid(name, nlen))
        return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: tensor name '%s' must be valid UTF-8 of 1..%d bytes",
                           name ? name : "(null)", LLMQ_GGUF_MAX_NAME - 1);
    if (index_find(&w->tensor_index, name, nlen) >= 0)
        return llmq_errorf(LLMQ_ERR_DUPLICATE, "gguf writer: duplicate tensor name '%s'", name);
    if (!tr || tr->ggml_id < 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "gguf writer: tensor '%s': dtype %s has no GGUF type id", name,
                           llmq_dtype_name(dtype));
    if (n_dims < 0 || n_dims > LLMQ_MAX_DIMS || (n_dims > 0 && !shape))
        return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: tensor '%s': %d dimensions (0..%d allowed)", name, n_dims,
                           LLMQ_MAX_DIMS);
    for (int k = 0; k < LLMQ_MAX_DIMS; k++) t.ne[k] = 1;
    for (int k = 0; k < n_dims; k++) {
        if (shape[k] < 0)
            return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: tensor '%s': negative dimension %" PRId64, name, shape[k]);
        t.ne[n_dims - 1 - k] = shape[k];
        if (!llmq_mul_i64(nel, shape[k], &nel))
            return llmq_errorf(LLMQ_ERR_OVERFLOW, "gguf writer: tensor '%s': element count overflows", name);
    }
    if (t.ne[0] % tr->blck != 0)
        return llmq_errorf(LLMQ_ERR_ARG,
                           "gguf writer: tensor '%s': row length %" PRId64
                           " is not a multiple of the %s block size %" PRId64,
                           name, t.ne[0], tr->name, tr->blck);
    if (!llmq_dtype_nbytes(dtype, nel, &t.nbytes))
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "gguf writer: tensor '%s': byte size overflows", name);
    t.dtype = dtype;
    t.n_dims = (uint32_t)n_dims;
    if (w->n_tensors == w->cap_tensors) {
        int64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct wtensor *ts = realloc(w->tensors, (size_t)cap * sizeof(*ts));
        if (!ts) return llmq_errorf(LLMQ_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    t.name = strdup(name);
    if (!t.name || !index_insert(&w->tensor_index, t.name, nlen, w->n_tensors)) {
        free(t.name);
        return llmq_errorf(LLMQ_ERR_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
    }
    w->tensors[w->n_tensors++] = t;
    return LLMQ_OK;
}

int64_t llmq_gguf_writer_n_tensors(const struct llmq_gguf_writer *w) { return w->n_tensors; }

size_t llmq_gguf_writer_tensor_nbytes(const struct llmq_gguf_writer *w, int64_t i) {
    return i >= 0 && i < w->n_tensors ? w->tensors[i].nbytes : 0;
}

// Failure inside an open output: remove the temporary file, keep the status.
static enum llmq_status writer_fail(struct llmq_gguf_writer *w, enum llmq_status st) {
    llmq_gguf_writer_abort(w);
    return st;
}

// After a tensor is complete: pad it and move on past any empty tensors.
static enum llmq_status writer_next(struct llmq_gguf_writer *w) {
    while (w->cur < w->n_tensors && w->cur_written == w->tensors[w->cur].nbytes) {
        size_t nbytes = w->tensors[w->cur].nbytes;
        enum llmq_status st = llmq_afile_pad(&w->file, (size_t)(align_up(nbytes, w->alignment) - nbytes));
        if (st) return st;
        w->cur++;
        w->cur_written = 0;
    }
    return LLMQ_OK;
}

// The layout: the alignment, the header size, every tensor's offset and the end of the data.
static enum llmq_status writer_layout(struct llmq_gguf_writer *w, const char *path) {
    enum llmq_status st;
    if ((st = check_building(w, "begin writing", path))) return st;
    w->alignment = LLMQ_GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = index_find(&w->kv_index, LLMQ_GGUF_KEY_ALIGNMENT, strlen(LLMQ_GGUF_KEY_ALIGNMENT));
    if (ai >= 0) {
        const struct wkv *kv = &w->kvs[ai];
        uint32_t a = 0;
        if (kv->type == LLMQ_GGUF_TYPE_UINT32) memcpy(&a, kv->payload, 4);
        if (!is_pow2(a))
            return llmq_errorf(LLMQ_ERR_ARG, "%s: key '%s' must be a u32 nonzero power of two", path,
                               LLMQ_GGUF_KEY_ALIGNMENT);
        w->alignment = a;
    }
    // header size: magic, version, counts, KVs, tensor infos
    uint64_t hs = 4 + 4 + 8 + 8;
    for (int64_t i = 0; i < w->n_kv; i++) hs += 8 + strlen(w->kvs[i].key) + 4 + w->kvs[i].payload_len;
    for (int64_t i = 0; i < w->n_tensors; i++)
        hs += 8 + strlen(w->tensors[i].name) + 4 + 8 * w->tensors[i].n_dims + 4 + 8;
    w->header_size = hs;
    w->data_offset = align_up(hs, w->alignment);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        uint64_t padded = align_up(w->tensors[i].nbytes, w->alignment);
        if (padded < w->tensors[i].nbytes || !llmq_add_u64(off, padded, &off) ||
            off > (uint64_t)INT64_MAX - w->data_offset)
            return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: the tensor data section overflows at tensor '%s'", path,
                               w->tensors[i].name);
    }
    w->data_end = off;
    return LLMQ_OK;
}

// Where the data of tensor i starts in the file (i == n_tensors: the file's end).
static uint64_t tensor_file_offset(const struct llmq_gguf_writer *w, int64_t i) {
    return w->data_offset + (i < w->n_tensors ? w->tensors[i].offset : w->data_end);
}

// The open output at tensor `done`: the placeholder header first when nothing is written yet.
static enum llmq_status writer_start(struct llmq_gguf_writer *w, int64_t done) {
    enum llmq_status st;
    w->state = WRITER_OPEN;
    w->cur = done;
    w->cur_written = 0;
    if (done == 0 && (st = llmq_afile_pad(&w->file, (size_t)w->data_offset))) return writer_fail(w, st);
    if ((st = writer_next(w))) return writer_fail(w, st);
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_writer_begin(struct llmq_gguf_writer *w, const char *path) {
    enum llmq_status st = writer_layout(w, path);
    if (st || (st = llmq_afile_open(&w->file, path))) return st;
    return writer_start(w, 0);
}

enum llmq_status llmq_gguf_writer_begin_part(struct llmq_gguf_writer *w, const char *path, const char *part,
                                             int64_t done, uint64_t offset) {
    enum llmq_status st = writer_layout(w, path);
    if (st) return st;
    if (done < 0 || done > w->n_tensors || (done > 0 && offset != tensor_file_offset(w, done)) ||
        (done == 0 && offset != 0))
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: the checkpoint's %lld tensors in %llu bytes are not where this file's tensors end "
                           "(%llu bytes)",
                           part, (long long)done, (unsigned long long)offset,
                           (unsigned long long)(done >= 0 && done <= w->n_tensors ? tensor_file_offset(w, done) : 0));
    if ((st = llmq_afile_open_part(&w->file, path, part, offset))) return st;
    return writer_start(w, done);
}

enum llmq_status llmq_gguf_writer_sync(struct llmq_gguf_writer *w, int64_t *done, uint64_t *offset) {
    if (w->state != WRITER_OPEN || w->cur_written != 0)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: sync outside a tensor boundary of an open output");
    LLMQ_ASSERT(w->file.pos == tensor_file_offset(w, w->cur));
    enum llmq_status st = llmq_afile_sync(&w->file);
    if (st) return writer_fail(w, st);
    *done = w->cur;
    *offset = w->file.pos;
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_writer_write_tensor(struct llmq_gguf_writer *w, const void *data, size_t n) {
    enum llmq_status st;
    if (w->state != WRITER_OPEN)
        return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: write_tensor without a successful begin()");
    if (n == 0) return LLMQ_OK;
    if (w->cur >= w->n_tensors) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: %zu bytes of tensor data after the last tensor", w->file.path, n);
        return writer_fail(w, st);
    }
    const struct wtensor *t = &w->tensors[w->cur];
    if (n > t->nbytes - w->cur_written) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: write of %zu bytes crosses the end of tensor '%s' (%zu of %zu bytes left)",
                         w->file.path, n, t->name, t->nbytes - w->cur_written, t->nbytes);
        return writer_fail(w, st);
    }
    if ((st = llmq_afile_write(&w->file, data, n))) return writer_fail(w, st);
    w->cur_written += n;
    if ((st = writer_next(w))) return writer_fail(w, st);
    return LLMQ_OK;
}

enum llmq_status llmq_gguf_writer_commit(struct llmq_gguf_writer *w) {
    enum llmq_status st;
    struct bytes h = {0};
    if (w->state != WRITER_OPEN) return llmq_errorf(LLMQ_ERR_ARG, "gguf writer: commit without a successful begin()");
    if (w->cur < w->n_tensors) {
        const struct wtensor *t = &w->tensors[w->cur];
        st =
            llmq_errorf(LLMQ_ERR_ARG, "%s: commit before all tensor data was written: tensor '%s' has %zu of %zu bytes",
                        w->file.path, t->name, w->cur_written, t->nbytes);
        return writer_fail(w, st);
    }
    // the real header, built in memory (it holds the tokenizer: a few MB at most) then written at 0
    put(&h, LLMQ_GGUF_MAGIC, 4);
    put_u32(&h, LLMQ_GGUF_VERSION);
    put_u64(&h, (uint64_t)w->n_tensors);
    put_u64(&h, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) {
        const struct wkv *kv = &w->kvs[i];
        put_str(&h, kv->key, strlen(kv->key));
        put_u32(&h, (uint32_t)kv->type);
        put(&h, kv->payload, kv->payload_len);
    }
    for (int64_t i = 0; i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        put_str(&h, t->name, strlen(t->name));
        put_u32(&h, t->n_dims);
        for (uint32_t k = 0; k < t->n_dims; k++) put_u64(&h, (uint64_t)t->ne[k]);
        put_u32(&h, (uint32_t)llmq_dtype_traits(t->dtype)->ggml_id);
        put_u64(&h, t->offset);
    }
    if (h.oom) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for the header", w->file.path);
        goto fail;
    }
    LLMQ_ASSERT(h.n == w->header_size);
    if ((st = llmq_afile_seek(&w->file, 0))) goto fail;
    if ((st = llmq_afile_write(&w->file, h.p, h.n))) goto fail;
    free(h.p);
    h.p = NULL;
    st = llmq_afile_commit(&w->file); // frees the afile (and removes the temp on failure)
    w->state = st ? WRITER_FAILED : WRITER_DONE;
    return st;
fail:
    free(h.p);
    return writer_fail(w, st);
}
