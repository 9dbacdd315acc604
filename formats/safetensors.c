// formats/safetensors.c — safetensors reader (mmap + full header validation) and streaming writer.
// The format, the checks and the API contracts are documented in formats/safetensors.h.
#include "formats/safetensors.h"

#include "common/io.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ============================================================================ name -> index hash ====
// Open addressing with linear probing over int64 indices into the owner's array; the owner supplies
// the name of index i. Grows at load factor 1/2, so lookups stay O(1) for 100k-tensor checkpoints.

struct name_index {
    int64_t *slots; // (cap) indices, -1 = empty
    size_t cap;     // a power of two, or 0 before the first insert
    int64_t count;
    const char *(*name_of)(const void *owner, int64_t i);
    const void *owner;
};

static uint64_t hash_str(const char *s) { // FNV-1a, 64 bit
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int64_t index_find(const struct name_index *ix, const char *name) {
    if (ix->cap == 0) return -1;
    for (size_t k = hash_str(name) & (ix->cap - 1);; k = (k + 1) & (ix->cap - 1)) {
        int64_t i = ix->slots[k];
        if (i < 0) return -1;
        if (strcmp(ix->name_of(ix->owner, i), name) == 0) return i;
    }
}

static bool index_grow(struct name_index *ix, size_t cap) {
    int64_t *slots = malloc(cap * sizeof(*slots));
    if (!slots) return false;
    for (size_t k = 0; k < cap; k++) slots[k] = -1;
    for (size_t j = 0; j < ix->cap; j++) {
        int64_t i = ix->slots[j];
        if (i < 0) continue;
        size_t k = hash_str(ix->name_of(ix->owner, i)) & (cap - 1);
        while (slots[k] >= 0) k = (k + 1) & (cap - 1);
        slots[k] = i;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    return true;
}

// Inserts index i (whose name the owner already stores). Returns -1 when inserted, the index of the
// entry with the same name when there is one (nothing inserted), or -2 when out of memory.
static int64_t index_insert(struct name_index *ix, int64_t i) {
    const char *name = ix->name_of(ix->owner, i);
    if ((size_t)(ix->count + 1) * 2 > ix->cap && !index_grow(ix, ix->cap ? ix->cap * 2 : 64)) return -2;
    size_t k = hash_str(name) & (ix->cap - 1);
    for (; ix->slots[k] >= 0; k = (k + 1) & (ix->cap - 1))
        if (strcmp(ix->name_of(ix->owner, ix->slots[k]), name) == 0) return ix->slots[k];
    ix->slots[k] = i;
    ix->count++;
    return -1;
}

static void index_free(struct name_index *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->cap = 0;
    ix->count = 0;
}

// Grows a heap array *p of *cap elements of size sz to hold at least n elements.
static bool grow_array(void **p, int64_t *cap, int64_t n, size_t sz) {
    if (n <= *cap) return true;
    int64_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < n) ncap *= 2;
    void *np = realloc(*p, (size_t)ncap * sz);
    if (!np) return false;
    *p = np;
    *cap = ncap;
    return true;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

// "model-00001-of-00002.safetensors" is fine; "../x", "a/b", "" and ".." are not.
static bool plain_file_name(const char *name) { return name[0] != '\0' && !strchr(name, '/') && !strstr(name, ".."); }

// Maps a jansson parse failure to a status and logs it against `path`.
static enum llmq_status json_fail(const char *path, const char *what, const json_error_t *err) {
    switch (json_error_code(err)) {
    case json_error_duplicate_key:
        return llmq_errorf(LLMQ_ERR_DUPLICATE, "%s: %s has a duplicate key (a name given twice) at byte %d: %s", path,
                           what, err->position, err->text);
    case json_error_numeric_overflow:
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: %s has a number too large for int64 at byte %d: %s", path, what,
                           err->position, err->text);
    case json_error_out_of_memory: return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory parsing %s", path, what);
    default:
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s is not valid JSON: %s (at byte %d)", path, what, err->text,
                           err->position);
    }
}

// ================================================================================== reader ====

struct st_shard {
    struct llmq_mmap map;
    struct llmq_st_shard_info info; // info.path = map.path; info.file_name points into it
};

struct st_meta {
    char *key;
    char *value;
};

struct llmq_st_model {
    char *path;       // as given to llmq_st_open
    char *index_path; // NULL for a single file
    struct st_shard *shards;
    int n_shards;
    struct llmq_tensor_view *tensors; // (n_tensors) in file order; names owned (strdup)
    int *tensor_shard;                // (n_tensors)
    int64_t n_tensors, cap_tensors;
    struct st_meta *meta; // (n_meta)
    int64_t n_meta, cap_meta;
    struct name_index by_name, meta_by_key;
    uint64_t total_bytes;
};

static const char *model_tensor_name(const void *owner, int64_t i) {
    return ((const struct llmq_st_model *)owner)->tensors[i].name;
}
static const char *model_meta_key(const void *owner, int64_t i) {
    return ((const struct llmq_st_model *)owner)->meta[i].key;
}

// One tensor's data range inside a shard, for the coverage check.
struct st_range {
    uint64_t begin, end; // relative to the data section
    int64_t tensor;      // model index
};

static int range_cmp(const void *a, const void *b) {
    const struct st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

// Adds one __metadata__ pair unless the key is already there (an earlier shard wins).
static enum llmq_status add_meta(struct llmq_st_model *m, const char *path, const char *key, const char *value) {
    if (index_find(&m->meta_by_key, key) >= 0) return LLMQ_OK;
    if (!grow_array((void **)&m->meta, &m->cap_meta, m->n_meta + 1, sizeof(*m->meta)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    struct st_meta *e = &m->meta[m->n_meta];
    e->key = strdup(key);
    e->value = strdup(value);
    if (!e->key || !e->value) {
        free(e->key);
        free(e->value);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    m->n_meta++;
    if (index_insert(&m->meta_by_key, m->n_meta - 1) == -2) {
        m->n_meta--;
        free(e->key);
        free(e->value);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    return LLMQ_OK;
}

static enum llmq_status parse_metadata(struct llmq_st_model *m, const char *path, json_t *obj) {
    const char *key;
    json_t *v;
    if (!json_is_object(obj)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"__metadata__\" is not a JSON object", path);
    json_object_foreach(obj, key, v) {
        if (!json_is_string(v))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: __metadata__ key \"%s\" has a non-string value", path, key);
        enum llmq_status st = add_meta(m, path, key, json_string_value(v));
        if (st) return st;
    }
    return LLMQ_OK;
}

// Validates one header entry and fills *t (name not set). data_size: bytes of the data section.
static enum llmq_status parse_entry(const char *path, const char *name, json_t *e, uint64_t data_start,
                                    uint64_t data_size, struct llmq_tensor_view *t, struct st_range *r) {
    if (!json_is_object(e))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': entry is not a JSON object", path, name);
    json_t *jdtype = json_object_get(e, "dtype");
    json_t *jshape = json_object_get(e, "shape");
    json_t *joffs = json_object_get(e, "data_offsets");
    if (!json_is_string(jdtype))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
    if (!json_is_array(jshape))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': missing or non-array \"shape\"", path, name);
    if (!json_is_array(joffs) || json_array_size(joffs) != 2)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': missing \"data_offsets\" or not a [begin, end] array",
                           path, name);

    // shape: non-negative integers whose product fits int64
    size_t n_dims = json_array_size(jshape);
    int64_t nel = 1;
    bool has_zero = false;
    for (size_t d = 0; d < n_dims; d++) {
        json_t *jd = json_array_get(jshape, d);
        if (!json_is_integer(jd) || json_integer_value(jd) < 0)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                               name, d);
        has_zero |= json_integer_value(jd) == 0;
    }
    for (size_t d = 0; d < n_dims && !has_zero; d++)
        if (!llmq_mul_i64(nel, (int64_t)json_integer_value(json_array_get(jshape, d)), &nel))
            return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: tensor '%s': the shape's element count overflows int64", path,
                               name);
    if (has_zero) nel = 0;

    // data_offsets: 0 <= begin <= end
    json_t *jb = json_array_get(joffs, 0), *je = json_array_get(joffs, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 || json_integer_value(je) < 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': data_offsets are not non-negative integers", path, name);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (begin > end)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s': data_offsets [%llu, %llu] have begin > end", path, name,
                           (unsigned long long)begin, (unsigned long long)end);

    const char *dtype_name = json_string_value(jdtype);
    enum llmq_dtype dtype = llmq_dtype_from_st_name(dtype_name);
    if (dtype == LLMQ_DTYPE_INVALID)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor '%s': unsupported dtype \"%s\"", path, name, dtype_name);
    size_t nbytes;
    if (!llmq_dtype_nbytes(dtype, nel, &nbytes))
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: tensor '%s': %lld elements of %s overflow the byte size", path, name,
                           (long long)nel, dtype_name);
    if ((uint64_t)nbytes != end - begin)
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: tensor '%s': size mismatch: %lld elements of %s need %zu bytes but data_offsets "
                           "[%llu, %llu] span %llu",
                           path, name, (long long)nel, dtype_name, nbytes, (unsigned long long)begin,
                           (unsigned long long)end, (unsigned long long)(end - begin));
    if (end > data_size)
        return llmq_errorf(LLMQ_ERR_TRUNCATED,
                           "%s: tensor '%s': data_offsets end %llu is past the end of the data section (%llu bytes): "
                           "file truncated?",
                           path, name, (unsigned long long)end, (unsigned long long)data_size);
    if (n_dims > LLMQ_MAX_DIMS)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor '%s': %zu dims, at most %d are supported", path, name,
                           n_dims, LLMQ_MAX_DIMS);

    t->dtype = dtype;
    t->n_dims = (int)n_dims;
    for (int d = 0; d < LLMQ_MAX_DIMS; d++)
        t->shape[d] = (size_t)d < n_dims ? (int64_t)json_integer_value(json_array_get(jshape, (size_t)d)) : 1;
    t->nbytes = nbytes;
    t->file_offset = data_start + begin;
    r->begin = begin;
    r->end = end;
    return LLMQ_OK;
}

// The ranges sorted by begin must tile [0, data_size) exactly.
static enum llmq_status check_coverage(const struct llmq_st_model *m, const char *path, struct st_range *r, size_t n,
                                       uint64_t data_start, uint64_t data_size) {
    qsort(r, n, sizeof(*r), range_cmp);
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = m->tensors[r[i].tensor].name;
        if (r[i].begin < expect)
            return llmq_errorf(LLMQ_ERR_CORRUPT,
                               "%s: tensor '%s': data [%llu, %llu) overlaps tensor '%s' which ends at data offset %llu",
                               path, name, (unsigned long long)r[i].begin, (unsigned long long)r[i].end,
                               m->tensors[r[i - 1].tensor].name, (unsigned long long)expect);
        if (r[i].begin > expect)
            return llmq_errorf(LLMQ_ERR_CORRUPT,
                               "%s: gap of %llu unused bytes at data offset %llu (file offset %llu) before tensor '%s'",
                               path, (unsigned long long)(r[i].begin - expect), (unsigned long long)expect,
                               (unsigned long long)(data_start + expect), name);
        expect = r[i].end;
    }
    if (expect != data_size)
        return llmq_errorf(LLMQ_ERR_CORRUPT,
                           "%s: %llu trailing byte(s) at data offset %llu (file offset %llu) belong to no tensor", path,
                           (unsigned long long)(data_size - expect), (unsigned long long)expect,
                           (unsigned long long)(data_start + expect));
    return LLMQ_OK;
}

// Room for n tensors in the parallel arrays tensors / tensor_shard.
static bool reserve_tensors(struct llmq_st_model *m, int64_t n) {
    if (n <= m->cap_tensors) return true;
    int64_t cap = m->cap_tensors;
    if (!grow_array((void **)&m->tensors, &cap, n, sizeof(*m->tensors))) return false;
    int *ts = realloc(m->tensor_shard, (size_t)cap * sizeof(*ts));
    if (!ts) return false; // tensors grew but cap_tensors did not: harmless, the next call retries
    m->tensor_shard = ts;
    m->cap_tensors = cap;
    return true;
}

// Maps shard s (info.path already set by the caller through map.path) and appends its tensors.
static enum llmq_status open_shard(struct llmq_st_model *m, int s, const char *path) {
    struct st_shard *sh = &m->shards[s];
    struct st_range *ranges = NULL;
    json_t *root = NULL;
    json_error_t jerr;
    enum llmq_status st = llmq_mmap_open(&sh->map, path);
    if (st) return st;
    sh->info.path = sh->map.path;
    sh->info.file_name = base_name(sh->map.path);
    sh->info.file_size = sh->map.size;

    const uint8_t *p = sh->map.data;
    if (sh->map.size < 8) {
        st = llmq_errorf(LLMQ_ERR_TRUNCATED, "%s: file is %zu bytes, shorter than the 8-byte header length: truncated",
                         path, sh->map.size);
        goto fail;
    }
    uint64_t n = read_le64(p);
    if (n > LLMQ_ST_MAX_HEADER) {
        st = llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: header length %llu exceeds the limit of %llu bytes", path,
                         (unsigned long long)n, LLMQ_ST_MAX_HEADER);
        goto fail;
    }
    if (8 + n > sh->map.size) {
        st = llmq_errorf(LLMQ_ERR_TRUNCATED,
                         "%s: header length %llu runs past the end of the file (%zu bytes): truncated", path,
                         (unsigned long long)n, sh->map.size);
        goto fail;
    }
    const char *hdr = (const char *)p + 8;
    uint64_t data_start = 8 + n, data_size = sh->map.size - data_start;
    sh->info.header_len = n;
    sh->info.data_start = data_start;
    if (!llmq_utf8_valid(hdr, (size_t)n)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: header is not valid UTF-8", path);
        goto fail;
    }
    if (n == 0 || hdr[0] != '{') {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: header does not start with '{': not a JSON object", path);
        goto fail;
    }
    root = json_loadb(hdr, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = json_fail(path, "header", &jerr);
        goto fail;
    }
    if (!json_is_object(root)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: header is not a JSON object", path);
        goto fail;
    }

    size_t n_entries = json_object_size(root);
    ranges = malloc((n_entries ? n_entries : 1) * sizeof(*ranges));
    if (!ranges || !reserve_tensors(m, m->n_tensors + (int64_t)n_entries)) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %zu header entries", path, n_entries);
        goto fail;
    }
    size_t n_ranges = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((st = parse_metadata(m, path, v))) goto fail;
            continue;
        }
        struct llmq_tensor_view *t = &m->tensors[m->n_tensors];
        memset(t, 0, sizeof(*t));
        struct st_range *r = &ranges[n_ranges];
        if ((st = parse_entry(path, key, v, data_start, data_size, t, r))) goto fail;
        char *name = strdup(key);
        if (!name) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        t->name = name;
        t->data = p + t->file_offset;
        r->tensor = m->n_tensors;
        m->tensor_shard[m->n_tensors] = s;
        m->n_tensors++;
        n_ranges++;
        sh->info.n_tensors++;
        m->total_bytes += t->nbytes;
    }
    if ((st = check_coverage(m, path, ranges, n_ranges, data_start, data_size))) goto fail;
    json_decref(root);
    free(ranges);
    return LLMQ_OK;
fail:
    json_decref(root);
    free(ranges);
    return st;
}

// Adds the tensors of every shard to the name index; a repeated name is a duplicate across shards
// (inside one shard the JSON parser already rejected it).
static enum llmq_status build_name_index(struct llmq_st_model *m) {
    for (int64_t i = 0; i < m->n_tensors; i++) {
        int64_t j = index_insert(&m->by_name, i);
        if (j == -2) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", m->path);
        if (j >= 0)
            return llmq_errorf(LLMQ_ERR_DUPLICATE, "%s: tensor '%s' is in two shards: %s and %s",
                               m->index_path ? m->index_path : m->path, m->tensors[i].name,
                               m->shards[m->tensor_shard[j]].info.path, m->shards[m->tensor_shard[i]].info.path);
    }
    return LLMQ_OK;
}

static int str_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

static enum llmq_status open_index(struct llmq_st_model *m, const char *index_path) {
    enum llmq_status st;
    char *buf = NULL, *dir = NULL, *shard_path = NULL;
    const char **files = NULL;
    json_t *root = NULL;
    json_error_t jerr;
    size_t size, n_files = 0;
    const char *key;
    json_t *v;

    if (!(m->index_path = strdup(index_path))) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", index_path);
    if ((st = llmq_read_file(index_path, LLMQ_ST_MAX_HEADER, &buf, &size))) return st;
    root = json_loadb(buf, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = json_fail(index_path, "index", &jerr);
        goto fail;
    }
    json_t *wmap = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wmap)) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: index has no \"weight_map\" object", index_path);
        goto fail;
    }

    // the distinct shard files, sorted by name
    files = malloc((json_object_size(wmap) + 1) * sizeof(*files));
    if (!files) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", index_path);
        goto fail;
    }
    json_object_foreach(wmap, key, v) {
        if (!json_is_string(v)) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: weight_map value for tensor '%s' is not a string", index_path, key);
            goto fail;
        }
        if (!plain_file_name(json_string_value(v))) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT,
                             "%s: weight_map maps tensor '%s' to \"%s\", which is not a plain file name in the index's "
                             "directory ('/' or '..')",
                             index_path, key, json_string_value(v));
            goto fail;
        }
        files[n_files++] = json_string_value(v);
    }
    qsort(files, n_files, sizeof(*files), str_cmp);
    size_t k = 0;
    for (size_t i = 0; i < n_files; i++)
        if (k == 0 || strcmp(files[k - 1], files[i]) != 0) files[k++] = files[i];
    n_files = k;

    if (!(dir = dir_of(index_path)) || !(m->shards = calloc(n_files ? n_files : 1, sizeof(*m->shards)))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", index_path);
        goto fail;
    }
    for (size_t i = 0; i < n_files; i++) {
        if (!(shard_path = llmq_path_join(dir, files[i]))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", index_path);
            goto fail;
        }
        if (!llmq_file_exists(shard_path)) {
            st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: shard file %s listed in weight_map not found", index_path,
                             shard_path);
            goto fail;
        }
        m->n_shards++;
        if ((st = open_shard(m, (int)i, shard_path))) goto fail;
        free(shard_path);
        shard_path = NULL;
    }
    if ((st = build_name_index(m))) goto fail;

    // every listed tensor is in the shard the index names, and every shard tensor is listed
    json_object_foreach(wmap, key, v) {
        int64_t i = llmq_st_find(m, key);
        if (i < 0 || strcmp(m->shards[m->tensor_shard[i]].info.file_name, json_string_value(v)) != 0) {
            st = llmq_errorf(LLMQ_ERR_NOT_FOUND,
                             "%s: tensor '%s' is listed in weight_map for %s but not found in it%s%s%s", index_path,
                             key, json_string_value(v), i < 0 ? "" : " (it is in ",
                             i < 0 ? "" : m->shards[m->tensor_shard[i]].info.file_name, i < 0 ? "" : ")");
            goto fail;
        }
    }
    if ((size_t)m->n_tensors != json_object_size(wmap)) {
        for (int64_t i = 0; i < m->n_tensors; i++) {
            if (json_object_get(wmap, m->tensors[i].name)) continue;
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor '%s' of shard %s is not listed in weight_map", index_path,
                             m->tensors[i].name, m->shards[m->tensor_shard[i]].info.path);
            goto fail;
        }
    }
    st = LLMQ_OK;
fail:
    free(shard_path);
    free(dir);
    free(files);
    json_decref(root);
    free(buf);
    return st;
}

static enum llmq_status open_single(struct llmq_st_model *m, const char *path) {
    if (!(m->shards = calloc(1, sizeof(*m->shards)))) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    m->n_shards = 1;
    enum llmq_status st = open_shard(m, 0, path);
    if (st) return st;
    return build_name_index(m);
}

// Picks the checkpoint inside a directory; *file is malloc'd, *is_index tells its kind.
static enum llmq_status resolve_dir(const char *dir, char **file, bool *is_index) {
    enum llmq_status st = LLMQ_OK;
    DIR *d = NULL;
    char *found = NULL;
    int n_found = 0;
    *file = NULL;
    *is_index = false;
    char *p = llmq_path_join(dir, LLMQ_ST_SINGLE_NAME);
    if (!p) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    if (llmq_file_exists(p)) {
        *file = p;
        return LLMQ_OK;
    }
    free(p);
    if (!(p = llmq_path_join(dir, LLMQ_ST_INDEX_NAME))) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    if (llmq_file_exists(p)) {
        *file = p;
        *is_index = true;
        return LLMQ_OK;
    }
    free(p);
    p = NULL;
    if (!(d = opendir(dir))) return llmq_errorf(LLMQ_ERR_IO, "%s: cannot read directory: %s", dir, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!llmq_ends_with(de->d_name, ".safetensors")) continue;
        free(p);
        if (!(p = llmq_path_join(dir, de->d_name))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
            goto done;
        }
        if (!llmq_file_exists(p)) continue;
        n_found++;
        free(found);
        found = p;
        p = NULL;
    }
    if (n_found == 0)
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no %s, %s or other *.safetensors file in the directory", dir,
                         LLMQ_ST_SINGLE_NAME, LLMQ_ST_INDEX_NAME);
    else if (n_found > 1)
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: %d *.safetensors files and no %s: name the file to open", dir, n_found,
                         LLMQ_ST_INDEX_NAME);
done:
    closedir(d);
    free(p);
    if (st == LLMQ_OK)
        *file = found;
    else
        free(found);
    return st;
}

enum llmq_status llmq_st_open(const char *path, struct llmq_st_model **out) {
    enum llmq_status st;
    char *file = NULL;
    bool is_index = false;
    struct stat sb;
    struct llmq_st_model *m = NULL;
    *out = NULL;
    if (!path || !*path) return llmq_errorf(LLMQ_ERR_ARG, "safetensors: empty path");
    if (stat(path, &sb) != 0) {
        return llmq_errorf(errno == ENOENT ? LLMQ_ERR_NOT_FOUND : LLMQ_ERR_IO, "%s: cannot open: %s", path,
                           strerror(errno));
    }
    if (!(m = calloc(1, sizeof(*m))) || !(m->path = strdup(path))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    m->by_name = (struct name_index){.name_of = model_tensor_name, .owner = m};
    m->meta_by_key = (struct name_index){.name_of = model_meta_key, .owner = m};
    if (S_ISDIR(sb.st_mode)) {
        if ((st = resolve_dir(path, &file, &is_index))) goto fail;
    } else {
        if (!(file = strdup(path))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        is_index = llmq_ends_with(path, ".json");
    }
    st = is_index ? open_index(m, file) : open_single(m, file);
    if (st) goto fail;
    free(file);
    *out = m;
    return LLMQ_OK;
fail:
    free(file);
    llmq_st_free(m);
    return st;
}

void llmq_st_free(struct llmq_st_model *m) {
    if (!m) return;
    for (int s = 0; s < m->n_shards; s++) llmq_mmap_close(&m->shards[s].map);
    for (int64_t i = 0; i < m->n_tensors; i++) free((char *)m->tensors[i].name);
    for (int64_t i = 0; i < m->n_meta; i++) {
        free(m->meta[i].key);
        free(m->meta[i].value);
    }
    index_free(&m->by_name);
    index_free(&m->meta_by_key);
    free(m->shards);
    free(m->tensors);
    free(m->tensor_shard);
    free(m->meta);
    free(m->index_path);
    free(m->path);
    free(m);
}

int64_t llmq_st_n_tensors(const struct llmq_st_model *m) { return m->n_tensors; }

const struct llmq_tensor_view *llmq_st_tensor(const struct llmq_st_model *m, int64_t i) {
    return i >= 0 && i < m->n_tensors ? &m->tensors[i] : NULL;
}

int64_t llmq_st_find(const struct llmq_st_model *m, const char *name) { return index_find(&m->by_name, name); }

const struct llmq_tensor_view *llmq_st_get(const struct llmq_st_model *m, const char *name) {
    return llmq_st_tensor(m, llmq_st_find(m, name));
}

int llmq_st_n_shards(const struct llmq_st_model *m) { return m->n_shards; }

const struct llmq_st_shard_info *llmq_st_shard(const struct llmq_st_model *m, int s) {
    return s >= 0 && s < m->n_shards ? &m->shards[s].info : NULL;
}

int llmq_st_tensor_shard(const struct llmq_st_model *m, int64_t i) {
    return i >= 0 && i < m->n_tensors ? m->tensor_shard[i] : -1;
}

int64_t llmq_st_n_metadata(const struct llmq_st_model *m) { return m->n_meta; }

const char *llmq_st_metadata_key(const struct llmq_st_model *m, int64_t i) {
    return i >= 0 && i < m->n_meta ? m->meta[i].key : NULL;
}

const char *llmq_st_metadata_value(const struct llmq_st_model *m, int64_t i) {
    return i >= 0 && i < m->n_meta ? m->meta[i].value : NULL;
}

const char *llmq_st_metadata_get(const struct llmq_st_model *m, const char *key) {
    return llmq_st_metadata_value(m, index_find(&m->meta_by_key, key));
}

uint64_t llmq_st_total_bytes(const struct llmq_st_model *m) { return m->total_bytes; }
const char *llmq_st_path(const struct llmq_st_model *m) { return m->path; }
const char *llmq_st_index_path(const struct llmq_st_model *m) { return m->index_path; }

// ================================================================================== writer ====

struct wtensor {
    char *name;
    enum llmq_dtype dtype;
    int n_dims;
    int64_t shape[LLMQ_MAX_DIMS];
    uint64_t nbytes;
    int shard;      // set by the layout
    uint64_t begin; // offset in its shard's data section, set by the layout
};

struct wshard {
    struct llmq_afile f; // open from the moment its header is written until finish
    bool opened;
    char *path;
    int64_t first, end;  // tensors [first, end)
    uint64_t data_bytes; // sum of their nbytes
    uint64_t data_start; // 8 + header length
};

struct llmq_st_writer {
    char *dir;
    uint64_t max_shard_bytes; // 0: unlimited
    struct wtensor *t;        // (n) declared tensors
    int64_t n, cap;
    struct st_meta *meta; // (n_meta)
    int64_t n_meta, cap_meta;
    struct name_index by_name, meta_by_key;
    // data phase
    bool laid_out;
    struct wshard *shards; // (n_shards)
    int n_shards;
    int n_opened;
    int64_t cur;       // tensor being written
    uint64_t cur_done; // bytes of it written so far
    enum llmq_status failed;
};

static const char *writer_tensor_name(const void *owner, int64_t i) {
    return ((const struct llmq_st_writer *)owner)->t[i].name;
}
static const char *writer_meta_key(const void *owner, int64_t i) {
    return ((const struct llmq_st_writer *)owner)->meta[i].key;
}

enum llmq_status llmq_st_writer_init(const char *dir, uint64_t max_shard_bytes, struct llmq_st_writer **out) {
    *out = NULL;
    if (!dir || !*dir) return llmq_errorf(LLMQ_ERR_ARG, "safetensors writer: empty output directory");
    if (!llmq_is_dir(dir)) return llmq_errorf(LLMQ_ERR_IO, "%s: output directory does not exist", dir);
    struct llmq_st_writer *w = calloc(1, sizeof(*w));
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    }
    w->max_shard_bytes = max_shard_bytes;
    w->by_name = (struct name_index){.name_of = writer_tensor_name, .owner = w};
    w->meta_by_key = (struct name_index){.name_of = writer_meta_key, .owner = w};
    *out = w;
    return LLMQ_OK;
}

enum llmq_status llmq_st_writer_set_metadata(struct llmq_st_writer *w, const char *key, const char *value) {
    if (w->laid_out) return llmq_errorf(LLMQ_ERR_ARG, "%s: metadata '%s' set after writing began", w->dir, key);
    if (!llmq_utf8_valid(key, strlen(key)) || !llmq_utf8_valid(value, strlen(value)))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: metadata '%s': key or value is not valid UTF-8", w->dir, key);
    if (index_find(&w->meta_by_key, key) >= 0)
        return llmq_errorf(LLMQ_ERR_DUPLICATE, "%s: metadata key '%s' set twice", w->dir, key);
    if (!grow_array((void **)&w->meta, &w->cap_meta, w->n_meta + 1, sizeof(*w->meta)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir);
    struct st_meta *e = &w->meta[w->n_meta];
    e->key = strdup(key);
    e->value = strdup(value);
    if (!e->key || !e->value || index_insert(&w->meta_by_key, w->n_meta) == -2) {
        free(e->key);
        free(e->value);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir);
    }
    w->n_meta++;
    return LLMQ_OK;
}

enum llmq_status llmq_st_writer_add_tensor(struct llmq_st_writer *w, const char *name, enum llmq_dtype dtype,
                                           int n_dims, const int64_t *shape) {
    if (!name || !*name) return llmq_errorf(LLMQ_ERR_ARG, "%s: tensor with an empty name", w->dir);
    if (w->laid_out) return llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s' declared after writing began", w->dir, name);
    if (!llmq_utf8_valid(name, strlen(name)))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: tensor name '%s' is not valid UTF-8", w->dir, name);
    if (strcmp(name, "__metadata__") == 0)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: tensor name '__metadata__' is reserved for the metadata", w->dir);
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(dtype);
    if (!tr || !tr->st_name)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s has no safetensors encoding", w->dir, name,
                           llmq_dtype_name(dtype));
    if (n_dims < 0 || n_dims > LLMQ_MAX_DIMS || (n_dims > 0 && !shape))
        return llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s': %d dims (0..%d allowed)", w->dir, name, n_dims,
                           LLMQ_MAX_DIMS);
    int64_t nel = 1;
    bool has_zero = false;
    for (int d = 0; d < n_dims; d++) {
        if (shape[d] < 0) return llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s': negative dim %d", w->dir, name, d);
        has_zero |= shape[d] == 0;
    }
    for (int d = 0; d < n_dims && !has_zero; d++)
        if (!llmq_mul_i64(nel, shape[d], &nel))
            return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: tensor '%s': element count overflows", w->dir, name);
    size_t nbytes;
    if (!llmq_dtype_nbytes(dtype, has_zero ? 0 : nel, &nbytes))
        return llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: tensor '%s': byte size overflows", w->dir, name);
    if (index_find(&w->by_name, name) >= 0)
        return llmq_errorf(LLMQ_ERR_DUPLICATE, "%s: tensor '%s' declared twice", w->dir, name);
    if (!grow_array((void **)&w->t, &w->cap, w->n + 1, sizeof(*w->t)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir);
    struct wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof(*t));
    if (!(t->name = strdup(name)) || index_insert(&w->by_name, w->n) == -2) {
        free(t->name);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir);
    }
    t->dtype = dtype;
    t->n_dims = n_dims;
    for (int d = 0; d < LLMQ_MAX_DIMS; d++) t->shape[d] = d < n_dims ? shape[d] : 1;
    t->nbytes = nbytes;
    w->n++;
    return LLMQ_OK;
}

static enum llmq_status writer_fail(struct llmq_st_writer *w, enum llmq_status st) {
    if (!w->failed) w->failed = st;
    return st;
}

// Assigns tensors to shards and names the shard files. Idempotent.
static enum llmq_status writer_layout(struct llmq_st_writer *w) {
    if (w->failed) return w->failed;
    if (w->laid_out) return LLMQ_OK;
    w->laid_out = true;
    int n_shards = 1;
    uint64_t cur = 0, total = 0;
    for (int64_t i = 0; i < w->n; i++) {
        uint64_t nb = w->t[i].nbytes;
        if (w->max_shard_bytes && nb > 0 && cur > 0 && (cur >= w->max_shard_bytes || nb > w->max_shard_bytes - cur)) {
            n_shards++;
            cur = 0;
        }
        // offsets and total_size are JSON integers (int64) in the files we write
        if (!llmq_add_u64(cur, nb, &cur) || !llmq_add_u64(total, nb, &total) || total > (uint64_t)INT64_MAX)
            return writer_fail(w, llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: checkpoint size overflows int64", w->dir));
        w->t[i].shard = n_shards - 1;
    }
    if (n_shards > 99999)
        return writer_fail(w, llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: %d shards, at most 99999", w->dir, n_shards));
    if (!(w->shards = calloc((size_t)n_shards, sizeof(*w->shards))))
        return writer_fail(w, llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir));
    w->n_shards = n_shards;
    for (int64_t i = 0; i < w->n; i++) {
        struct wshard *sh = &w->shards[w->t[i].shard];
        if (sh->end == 0) sh->first = i;
        sh->end = i + 1;
        w->t[i].begin = sh->data_bytes;
        sh->data_bytes += w->t[i].nbytes;
    }
    for (int s = 0; s < n_shards; s++) {
        char name[64];
        if (n_shards == 1)
            snprintf(name, sizeof(name), "%s", LLMQ_ST_SINGLE_NAME);
        else
            snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        if (!(w->shards[s].path = llmq_path_join(w->dir, name)))
            return writer_fail(w, llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir));
    }
    return LLMQ_OK;
}

// Builds shard s's header JSON (compact, padded with spaces to a multiple of 8) into *out.
static enum llmq_status build_header(struct llmq_st_writer *w, int s, char **out, size_t *out_len) {
    struct wshard *sh = &w->shards[s];
    enum llmq_status st = LLMQ_OK;
    char *text = NULL;
    json_t *root = json_object();
    bool ok = root != NULL;
    if (ok && w->n_meta > 0) {
        json_t *meta = json_object();
        ok = meta && json_object_set_new(root, "__metadata__", meta) == 0;
        for (int64_t i = 0; ok && i < w->n_meta; i++)
            ok = json_object_set_new(meta, w->meta[i].key, json_string(w->meta[i].value)) == 0;
    }
    for (int64_t i = sh->first; ok && i < sh->end; i++) {
        // json_object_set (not _new) takes its own reference: every local is released below
        const struct wtensor *t = &w->t[i];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        ok = e && shape && offs &&
             json_object_set_new(e, "dtype", json_string(llmq_dtype_traits(t->dtype)->st_name)) == 0;
        for (int d = 0; ok && d < t->n_dims; d++) ok = json_array_append_new(shape, json_integer(t->shape[d])) == 0;
        ok = ok && json_array_append_new(offs, json_integer((json_int_t)t->begin)) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)(t->begin + t->nbytes))) == 0;
        ok = ok && json_object_set(e, "shape", shape) == 0 && json_object_set(e, "data_offsets", offs) == 0 &&
             json_object_set(root, t->name, e) == 0;
        json_decref(shape);
        json_decref(offs);
        json_decref(e);
    }
    if (ok) ok = (text = json_dumps(root, JSON_COMPACT)) != NULL;
    if (!ok) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory building the header", sh->path);
        goto done;
    }
    size_t n = strlen(text), padded = (n + 7) & ~(size_t)7;
    if (padded > LLMQ_ST_MAX_HEADER) {
        st = llmq_errorf(LLMQ_ERR_OVERFLOW, "%s: header of %zu bytes exceeds the limit of %llu", sh->path, padded,
                         LLMQ_ST_MAX_HEADER);
        goto done;
    }
    char *p = realloc(text, padded + 1);
    if (!p) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", sh->path);
        goto done;
    }
    text = p;
    memset(text + n, ' ', padded - n);
    text[padded] = '\0';
    *out = text;
    *out_len = padded;
    text = NULL;
done:
    free(text);
    json_decref(root);
    return st;
}

// Opens every shard up to and including s, writing each one's header.
static enum llmq_status writer_open_through(struct llmq_st_writer *w, int s) {
    while (w->n_opened <= s) {
        struct wshard *sh = &w->shards[w->n_opened];
        char *hdr = NULL;
        size_t n = 0;
        uint8_t len[8];
        enum llmq_status st = build_header(w, w->n_opened, &hdr, &n);
        if (!st) st = llmq_afile_open(&sh->f, sh->path);
        if (!st) {
            sh->opened = true;
            for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
            st = llmq_afile_write(&sh->f, len, 8);
            if (!st) st = llmq_afile_write(&sh->f, hdr, n);
            sh->data_start = 8 + n;
        }
        free(hdr);
        if (st) return writer_fail(w, st);
        w->n_opened++;
    }
    return LLMQ_OK;
}

enum llmq_status llmq_st_writer_write(struct llmq_st_writer *w, const void *data, size_t n) {
    const uint8_t *p = data;
    enum llmq_status st = writer_layout(w);
    if (st) return st;
    if (n > 0 && !data) return writer_fail(w, llmq_errorf(LLMQ_ERR_ARG, "%s: NULL data of %zu bytes", w->dir, n));
    while (n > 0) {
        while (w->cur < w->n && w->cur_done == w->t[w->cur].nbytes) {
            w->cur++;
            w->cur_done = 0;
        }
        if (w->cur == w->n)
            return writer_fail(
                w, llmq_errorf(LLMQ_ERR_ARG, "%s: %zu bytes written past the last declared tensor", w->dir, n));
        struct wtensor *t = &w->t[w->cur];
        if ((st = writer_open_through(w, t->shard))) return st;
        size_t k = t->nbytes - w->cur_done < n ? (size_t)(t->nbytes - w->cur_done) : n;
        if ((st = llmq_afile_write(&w->shards[t->shard].f, p, k))) return writer_fail(w, st);
        w->cur_done += k;
        p += k;
        n -= k;
    }
    return LLMQ_OK;
}

enum llmq_status llmq_st_writer_write_tensor(struct llmq_st_writer *w, const char *name, const void *data,
                                             size_t nbytes) {
    enum llmq_status st = writer_layout(w);
    if (st) return st;
    for (;; w->cur++, w->cur_done = 0) {
        if (w->cur == w->n)
            return writer_fail(
                w, llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s' written after the last declared tensor", w->dir, name));
        if (strcmp(w->t[w->cur].name, name) == 0) break;
        if (w->cur_done != w->t[w->cur].nbytes) // an earlier tensor is not complete: out of order
            return writer_fail(w, llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s' written, but '%s' comes next", w->dir,
                                              name, w->t[w->cur].name));
    }
    const struct wtensor *t = &w->t[w->cur];
    if (w->cur_done != 0)
        return writer_fail(w, llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s' is already (partly) written", w->dir, name));
    if (nbytes != t->nbytes)
        return writer_fail(w, llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s': %zu bytes given, %llu declared", w->dir, name,
                                          nbytes, (unsigned long long)t->nbytes));
    return llmq_st_writer_write(w, data, nbytes);
}

int llmq_st_writer_n_shards(struct llmq_st_writer *w) { return writer_layout(w) ? 0 : w->n_shards; }

// The index JSON: {"metadata": {"total_size": N}, "weight_map": {name: shard file, ...}}.
static enum llmq_status write_index(struct llmq_st_writer *w, struct llmq_afile *f, char *index_path) {
    enum llmq_status st = LLMQ_OK;
    uint64_t total = 0;
    char *text = NULL;
    json_t *root = json_object(), *meta = json_object(), *wmap = json_object();
    bool ok = root && meta && wmap;
    for (int64_t i = 0; ok && i < w->n; i++) {
        total += w->t[i].nbytes; // no overflow: the layout summed the same numbers per shard
        const char *file = base_name(w->shards[w->t[i].shard].path);
        ok = json_object_set_new(wmap, w->t[i].name, json_string(file)) == 0;
    }
    ok = ok && json_object_set_new(meta, "total_size", json_integer((json_int_t)total)) == 0;
    ok = ok && json_object_set(root, "metadata", meta) == 0 && json_object_set(root, "weight_map", wmap) == 0;
    ok = ok && (text = json_dumps(root, JSON_INDENT(2))) != NULL;
    if (!ok) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory building the index", index_path);
        goto done;
    }
    if ((st = llmq_afile_open(f, index_path))) goto done;
    if (!(st = llmq_afile_write(f, text, strlen(text)))) st = llmq_afile_write(f, "\n", 1);
done:
    free(text);
    json_decref(meta);
    json_decref(wmap);
    json_decref(root);
    return st;
}

// "model-00001-of-00002.safetensors": a shard name of this writer's scheme.
static bool is_shard_name(const char *name) {
    static const char pattern[] = "model-#####-of-#####.safetensors";
    if (strlen(name) != sizeof(pattern) - 1) return false;
    for (size_t i = 0; pattern[i]; i++)
        if (pattern[i] == '#' ? (name[i] < '0' || name[i] > '9') : name[i] != pattern[i]) return false;
    return true;
}

// After a successful finish: removes checkpoint files of an earlier save in the same directory
// (model.safetensors, the index, model-*-of-*.safetensors) that this save did not produce, so that
// the directory holds exactly one checkpoint (what transformers' save_pretrained does as well).
static void remove_stale(const struct llmq_st_writer *w) {
    DIR *d = opendir(w->dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *name = de->d_name;
        bool ours =
            strcmp(name, LLMQ_ST_SINGLE_NAME) == 0 || strcmp(name, LLMQ_ST_INDEX_NAME) == 0 || is_shard_name(name);
        if (!ours) continue;
        bool produced = w->n_shards > 1 && strcmp(name, LLMQ_ST_INDEX_NAME) == 0;
        for (int s = 0; s < w->n_shards && !produced; s++) produced = strcmp(base_name(w->shards[s].path), name) == 0;
        if (produced) continue;
        char *p = llmq_path_join(w->dir, name);
        if (p && unlink(p) == 0)
            llmq_info("%s: removed %s of an earlier checkpoint", w->dir, name);
        else if (p)
            llmq_warn("%s: cannot remove stale %s: %s", w->dir, name, strerror(errno));
        free(p);
    }
    closedir(d);
}

static void writer_free(struct llmq_st_writer *w) {
    for (int s = 0; s < w->n_shards; s++) {
        if (w->shards[s].opened) llmq_afile_abort(&w->shards[s].f);
        free(w->shards[s].path);
    }
    for (int64_t i = 0; i < w->n; i++) free(w->t[i].name);
    for (int64_t i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    index_free(&w->by_name);
    index_free(&w->meta_by_key);
    free(w->shards);
    free(w->t);
    free(w->meta);
    free(w->dir);
    free(w);
}

enum llmq_status llmq_st_writer_finish(struct llmq_st_writer *w) {
    struct llmq_afile index = {0};
    char *index_path = NULL;
    enum llmq_status st = writer_layout(w);
    if (st) goto done;
    while (w->cur < w->n && w->cur_done == w->t[w->cur].nbytes) {
        w->cur++;
        w->cur_done = 0;
    }
    if (w->cur < w->n) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: tensor '%s': only %llu of %llu bytes were written", w->dir,
                         w->t[w->cur].name, (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
        goto done;
    }
    if ((st = writer_open_through(w, w->n_shards - 1))) goto done;
    for (int s = 0; s < w->n_shards; s++)
        LLMQ_ASSERT(w->shards[s].f.pos == w->shards[s].data_start + w->shards[s].data_bytes);
    if (w->n_shards > 1) {
        if (!(index_path = llmq_path_join(w->dir, LLMQ_ST_INDEX_NAME))) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", w->dir);
            goto done;
        }
        if ((st = write_index(w, &index, index_path))) goto done;
    }
    for (int s = 0; s < w->n_shards; s++) {
        w->shards[s].opened = false; // commit frees the afile whether it succeeds or not
        if ((st = llmq_afile_commit(&w->shards[s].f))) goto done;
    }
    if (index.fp) st = llmq_afile_commit(&index);
    if (!st) remove_stale(w);
done:
    llmq_afile_abort(&index); // no-op after a commit
    free(index_path);
    writer_free(w);
    return st;
}

void llmq_st_writer_abort(struct llmq_st_writer *w) {
    if (w) writer_free(w);
}
