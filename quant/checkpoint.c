/*
 * quant/checkpoint.c — the checkpoint directory of `llmq quantize` (contract and layout: quant/checkpoint.h).
 * Legend: R rows/out, C cols/in, ng groups per row, N calibration tokens, D n_embd.
 */
#include "quant/checkpoint.h"

#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "kernels/backend.h"
#include "quant/quantize.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT 1
#define BLOCK_MAGIC "LLMQCKB1"
#define STATE_MAX_BYTES (64u << 20)
#define STREAM_KIND "gguf-stream"
#define STREAM_FILE "output.gguf.part"

struct llmq_ckpt {
    char *dir;          // "<out>.partial"
    int lock_fd;        // the directory, flock'ed while the run lives
    bool fresh;         // created by this run
    bool stream;        // the writer-only run's checkpoint (quant/checkpoint.h "The writer-only run")
    int64_t n_layer;    // blocks of the run (stream: tensors of the output, 0 until the first commit)
    int64_t next_block; // blocks committed so far (stream: tensors)
    uint64_t offset;    // stream: the bytes of the partial output that hold them
    char *part;         // stream: dir/STREAM_FILE
    json_t *state;      // what state.json holds now (owned)
    // the block being recorded
    struct llmq_afile bf;
    bool bf_open;
    int64_t bf_layer;
    struct llmq_sha256 sha;
    uint64_t nbytes;
};

// ---- fault injection (quant/checkpoint.h) ---------------------------------------------------------------

static void kill_point(void) {
    static long at = -1, events;
    if (at < 0) {
        const char *e = getenv("LLMQ_CKPT_KILL_AT");
        at = e ? strtol(e, NULL, 10) : 0;
        if (at < 0) at = 0;
    }
    if (at > 0 && ++events == at) {
        fprintf(stderr, "llmq: LLMQ_CKPT_KILL_AT=%ld: SIGKILL at checkpoint event %ld\n", at, events);
        fflush(stderr);
        kill(getpid(), SIGKILL);
    }
}

uint64_t llmq_ckpt_stream_sync_bytes(void) {
    const char *e = getenv("LLMQ_CKPT_SYNC_BYTES");
    long long n = e ? strtoll(e, NULL, 10) : 0;
    return n > 0 ? (uint64_t)n : LLMQ_CKPT_STREAM_SYNC_BYTES;
}

// ---- paths and the non-linear tensors of a block ----------------------------------------------------------

// dir/name formatted, malloc'd (NULL when out of memory).
static char *pathf(const char *dir, const char *fmt, long long i) {
    char name[64];
    snprintf(name, sizeof name, fmt, i);
    return llmq_path_join(dir, name);
}

static const char *block_fmt = "block-%05lld.bin", *x_fmt = "x-%05lld.bin";

// The views of struct llmq_layer that a writer reads next to the block's linears (roles of "TENS").
static const size_t tensor_field[] = {offsetof(struct llmq_layer, attn_norm),
                                      offsetof(struct llmq_layer, ffn_norm),
                                      offsetof(struct llmq_layer, bq),
                                      offsetof(struct llmq_layer, bk),
                                      offsetof(struct llmq_layer, bv),
                                      offsetof(struct llmq_layer, q_norm),
                                      offsetof(struct llmq_layer, k_norm),
                                      offsetof(struct llmq_layer, attn_post_norm),
                                      offsetof(struct llmq_layer, ffn_post_norm),
                                      offsetof(struct llmq_layer, router),
                                      offsetof(struct llmq_layer, shexp_gate)};
#define N_TENSORS ((int)(sizeof tensor_field / sizeof tensor_field[0]))

static const struct llmq_tensor_view **tensor_slot(const struct llmq_layer *L, int i) {
    return (const struct llmq_tensor_view **)((char *)(uintptr_t)L + tensor_field[i]);
}

// ---- the fingerprint -------------------------------------------------------------------------------------

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static json_t *file_entry(const char *name, const struct stat *sb) {
    return json_pack("{s:s, s:I, s:I}", "name", name, "size", (json_int_t)sb->st_size, "mtime_ns",
                     (json_int_t)sb->st_mtim.tv_sec * 1000000000 + (json_int_t)sb->st_mtim.tv_nsec);
}

// What a loader reads from a model directory (safetensors shards and index, config and tokenizer files).
static bool model_file(const char *name) {
    return name[0] != '.' &&
           (llmq_ends_with(name, ".safetensors") || llmq_ends_with(name, ".json") || llmq_ends_with(name, ".model"));
}

// The files of the model at path: one file, or a directory's (sorted by name).
static json_t *model_json(const char *path) {
    char real[PATH_MAX];
    struct stat sb;
    json_t *j = json_object(), *files = json_array();
    json_object_set_new(j, "path", json_string(realpath(path, real) ? real : path));
    if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) json_array_append_new(files, file_entry(".", &sb));
    DIR *d = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? opendir(path) : NULL;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!model_file(e->d_name)) continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 32) * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    if (d) closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char *p = llmq_path_join(path, names[i]);
        if (p && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) json_array_append_new(files, file_entry(names[i], &sb));
        free(p);
        free(names[i]);
    }
    free(names);
    json_object_set_new(j, "files", files);
    return j;
}

json_t *llmq_ckpt_fingerprint(const struct llmq_model *m, const struct llmq_quantize_opts *o, const json_t *settings) {
    json_t *fp = json_object(), *run = json_object();
    json_object_set_new(fp, "llmq_version", json_string(LLMQ_VERSION));
    json_object_set_new(fp, "model", model_json(m->path));
    json_object_set_new(fp, "settings", settings ? json_deep_copy(settings) : json_null());
    json_object_set_new(run, "backend", json_string(llmq_backend_name(o->backend)));
    json_object_set_new(run, "micro_batch", json_integer(o->micro_batch));
    json_object_set_new(run, "threads", json_integer(o->n_threads));
    if (m->hp.moe) { // a mixture of experts: the experts' statistics and fallbacks (not in the provenance)
        json_object_set_new(run, "moe_calib", json_string(o->moe_calib_all ? "all" : "routed"));
        json_object_set_new(run, "moe_token_floor", json_integer(o->moe_token_floor));
    }
    if (o->to_gguf) {
        json_object_set_new(run, "no_provenance", json_boolean(o->gguf.no_provenance));
        json_object_set_new(run, "gguf_threads", json_integer(o->gguf.n_threads));
    } else {
        json_object_set_new(run, "fake_dtype", json_integer(o->out.fake_dtype));
        json_object_set_new(run, "max_shard_bytes", json_integer((json_int_t)o->out.max_shard_bytes));
    }
    json_object_set_new(fp, "run", run);
    return fp;
}

// The first difference of a (the checkpoint's) and b (now): "where: A in the checkpoint, B now" into msg.
static bool json_differs(const json_t *a, const json_t *b, const char *where, char *msg, size_t n) {
    if (json_equal((json_t *)a, (json_t *)b)) return false;
    char sub[512];
    if (json_is_object(a) && json_is_object(b)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            snprintf(sub, sizeof sub, "%s%s%s", where, *where ? "." : "", k);
            json_t *w = json_object_get(b, k);
            if (!w) return snprintf(msg, n, "%s is in the checkpoint, absent now", sub), true;
            if (json_differs(v, w, sub, msg, n)) return true;
        }
        json_object_foreach((json_t *)b, k, v) {
            if (json_object_get(a, k)) continue;
            snprintf(msg, n, "%s%s%s is absent in the checkpoint, present now", where, *where ? "." : "", k);
            return true;
        }
    }
    if (json_is_array(a) && json_is_array(b) && json_array_size(a) == json_array_size(b))
        for (size_t i = 0; i < json_array_size(a); i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", where, i);
            if (json_differs(json_array_get(a, i), json_array_get(b, i), sub, msg, n)) return true;
        }
    char *ta = json_dumps(a, JSON_COMPACT | JSON_ENCODE_ANY), *tb = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(msg, n, "%s: %.200s in the checkpoint, %.200s now", where, ta ? ta : "?", tb ? tb : "?");
    free(ta);
    free(tb);
    return true;
}

// ---- opening: the guard, the lock, the state -----------------------------------------------------------------

static char *partial_path(const char *out) {
    size_t n = strlen(out) + sizeof ".partial";
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s.partial", out);
    return p;
}

// Whether another process holds the lock of the checkpoint directory dir (a run writing that output).
static bool locked_by_another(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    bool busy = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (fd >= 0) close(fd); // releases the probe's lock
    return busy;
}

static enum llmq_status busy_error(const char *out, const char *dir) {
    return llmq_errorf(LLMQ_ERR_IO,
                       "%s: another llmq run is writing this output (its checkpoint %s is locked): not "
                       "started",
                       out, dir);
}

enum llmq_status llmq_ckpt_check(const char *out, bool resume, bool force) {
    char *dir = partial_path(out);
    struct stat sb;
    enum llmq_status st = LLMQ_OK;
    if (!dir) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
    char *mark = llmq_path_join(dir, LLMQ_OUTDIR_MARKER);
    bool exists = lstat(dir, &sb) == 0, is_dir = exists && S_ISDIR(sb.st_mode);
    if (exists && (!is_dir || !mark || !llmq_file_exists(mark)))
        st = llmq_errorf(LLMQ_ERR_ARG,
                         "%s: exists and is not a checkpoint directory llmq wrote: not replaced or resumed", dir);
    else if (lstat(dir, &sb) == 0 && locked_by_another(dir))
        st = busy_error(out, dir);
    else if (lstat(dir, &sb) == 0 && !resume && !force)
        st = llmq_errorf(LLMQ_ERR_ARG,
                         "%s: the checkpoint of an interrupted run of this output is there: add --resume to continue "
                         "it, or --force to discard it and start over",
                         dir);
    free(mark);
    free(dir);
    return st;
}

static enum llmq_status lock_dir(struct llmq_ckpt *ck, const char *path, const char *out) {
    ck->lock_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (ck->lock_fd < 0) return llmq_errorf(LLMQ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (flock(ck->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        close(ck->lock_fd);
        ck->lock_fd = -1;
        return busy_error(out, ck->dir);
    }
    return LLMQ_OK;
}

// state.json of dir from ck->state.
static enum llmq_status write_state(struct llmq_ckpt *ck, const char *dir) {
    char *p = llmq_path_join(dir, "state.json");
    enum llmq_status st =
        p ? llmq_write_json(p, ck->state, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))
          : llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    free(p);
    return st;
}

// A new checkpoint: staged as "<dir>.tmp.<pid>" (marker, lock, state.json of block 0), then renamed onto
// dir exclusively (replace: an existing checkpoint the guard let --force replace).
static enum llmq_status create_fresh(struct llmq_ckpt *ck, const char *out, const json_t *fp, bool replace) {
    char *tmp = NULL;
    enum llmq_status st = llmq_outdir_create(ck->dir, &tmp);
    if (st) return st;
    if (ck->stream)
        ck->state = json_pack("{s:i, s:s, s:s, s:i, s:i, s:i, s:O}", "format", CKPT_FORMAT, "kind", STREAM_KIND, "file",
                              STREAM_FILE, "n_tensors", 0, "tensors_done", 0, "offset", 0, "fingerprint", fp);
    else
        ck->state = json_pack("{s:i, s:I, s:i, s:O, s:[], s:n}", "format", CKPT_FORMAT, "n_layer",
                              (json_int_t)ck->n_layer, "next_block", 0, "fingerprint", fp, "blocks", "x");
    if (!ck->state) st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", ck->dir);
    if (!st) st = lock_dir(ck, tmp, out);
    if (!st) st = write_state(ck, tmp);
    if (!st) st = llmq_outdir_publish(tmp, ck->dir, replace);
    if (st) llmq_outdir_discard(tmp);
    free(tmp);
    ck->fresh = true;
    return st;
}

// The string member key of j, "" when absent.
static const char *str_of(const json_t *j, const char *key) {
    const char *s = json_string_value(json_object_get(j, key));
    return s ? s : "";
}

// Whether name is one state.json names (the marker and state.json included).
static bool named_by_state(const json_t *state, const char *name) {
    if (!strcmp(name, LLMQ_OUTDIR_MARKER) || !strcmp(name, "state.json")) return true;
    if (!strcmp(str_of(state, "kind"), STREAM_KIND)) return !strcmp(name, STREAM_FILE);
    const json_t *x = json_object_get(state, "x"), *b;
    size_t i;
    if (json_is_object(x) && !strcmp(name, str_of(x, "file"))) return true;
    json_array_foreach(json_object_get(state, "blocks"), i, b) {
        if (!strcmp(name, str_of(b, "file"))) return true;
    }
    return false;
}

// Removes what a killed run left in the (locked) directory beyond what state.json names.
static void remove_leftovers(struct llmq_ckpt *ck) {
    DIR *d = opendir(ck->dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || named_by_state(ck->state, e->d_name)) continue;
        char *p = llmq_path_join(ck->dir, e->d_name);
        if (p) {
            llmq_debug("%s: removed %s (not part of the committed state)", ck->dir, e->d_name);
            llmq_remove_tree(p);
        }
        free(p);
    }
    if (d) closedir(d);
}

// The state's block entries and activations named as this module names them, counts in range.
static bool state_valid(const json_t *s, int64_t n_layer) {
    const json_t *blocks = json_object_get(s, "blocks"), *x = json_object_get(s, "x"), *b;
    json_int_t next = json_integer_value(json_object_get(s, "next_block"));
    if (json_integer_value(json_object_get(s, "format")) != CKPT_FORMAT || !json_is_array(blocks) ||
        !json_is_integer(json_object_get(s, "next_block")) || next < 0 || next > n_layer ||
        (json_int_t)json_array_size(blocks) != next || !json_is_object(json_object_get(s, "fingerprint")))
        return false;
    char want[64];
    size_t i;
    json_array_foreach(blocks, i, b) {
        snprintf(want, sizeof want, block_fmt, (long long)i);
        const char *f = json_string_value(json_object_get(b, "file")),
                   *h = json_string_value(json_object_get(b, "sha256"));
        if (!f || strcmp(f, want) || !h || strlen(h) != 64 || !json_is_integer(json_object_get(b, "bytes")))
            return false;
    }
    if (json_is_null(x)) return true;
    snprintf(want, sizeof want, x_fmt, (long long)next);
    const char *f = json_string_value(json_object_get(x, "file")), *h = json_string_value(json_object_get(x, "sha256"));
    return f && !strcmp(f, want) && h && strlen(h) == 64 && json_is_integer(json_object_get(x, "bytes"));
}

// A stream's state (create_fresh, llmq_ckpt_stream_step): its counts in range.
static bool stream_state_valid(const json_t *s) {
    const json_t *n = json_object_get(s, "n_tensors"), *d = json_object_get(s, "tensors_done"),
                 *o = json_object_get(s, "offset");
    return json_integer_value(json_object_get(s, "format")) == CKPT_FORMAT && !strcmp(str_of(s, "kind"), STREAM_KIND) &&
           !strcmp(str_of(s, "file"), STREAM_FILE) && json_is_integer(n) && json_is_integer(d) && json_is_integer(o) &&
           json_integer_value(d) >= 0 && json_integer_value(o) >= 0 && json_integer_value(d) <= json_integer_value(n) &&
           (json_integer_value(d) == 0) == (json_integer_value(o) == 0);
}

// Whether the state of an existing checkpoint is one this run's kind writes, for its n_layer blocks.
static bool kind_valid(const struct llmq_ckpt *ck) {
    if (ck->stream) return stream_state_valid(ck->state);
    return json_integer_value(json_object_get(ck->state, "n_layer")) == ck->n_layer &&
           state_valid(ck->state, ck->n_layer);
}

static enum llmq_status resume_existing(struct llmq_ckpt *ck, const char *out, const json_t *fp) {
    enum llmq_status st = lock_dir(ck, ck->dir, out);
    if (st) return st;
    char *p = llmq_path_join(ck->dir, "state.json"), msg[1024];
    struct stat sb;
    json_error_t je;
    if (!p) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", ck->dir);
    if (stat(p, &sb) != 0 || sb.st_size > STATE_MAX_BYTES)
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: missing or larger than %u bytes: not a checkpoint llmq can resume", p,
                         STATE_MAX_BYTES);
    else if (!(ck->state = json_load_file(p, JSON_REJECT_DUPLICATES, &je)))
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: line %d: %s", p, je.line, je.text);
    else if (!json_is_object(json_object_get(ck->state, "fingerprint")))
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: no fingerprint: not a checkpoint llmq can resume", p);
    else if (json_differs(json_object_get(ck->state, "fingerprint"), fp, "", msg, sizeof msg))
        st = llmq_errorf(LLMQ_ERR_ARG,
                         "%s: the checkpoint is of another run: %s; not resumed (resume with the same model, "
                         "calibration, options and llmq, or pass --force to discard it and start over)",
                         ck->dir, msg);
    else if (!kind_valid(ck) && ck->stream)
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: not a state this llmq writes for a writer-only GGUF run", p);
    else if (!kind_valid(ck))
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: not a state this llmq writes for a %lld-block model", p,
                         (long long)ck->n_layer);
    free(p);
    if (st) return st;
    if (ck->stream) {
        ck->n_layer = json_integer_value(json_object_get(ck->state, "n_tensors"));
        ck->next_block = json_integer_value(json_object_get(ck->state, "tensors_done"));
        ck->offset = (uint64_t)json_integer_value(json_object_get(ck->state, "offset"));
    } else {
        ck->next_block = json_integer_value(json_object_get(ck->state, "next_block"));
    }
    remove_leftovers(ck);
    return LLMQ_OK;
}

// "checkpoint kept in DIR (k of n blocks done): run the same command with --resume to continue" into line.
static void kept_line(const struct llmq_ckpt *ck, char *line, size_t n) {
    if (ck->stream)
        snprintf(line, n,
                 "checkpoint kept in %s (%lld of %lld tensors written): run the same command with --resume to "
                 "continue",
                 ck->dir, (long long)ck->next_block, (long long)ck->n_layer);
    else
        snprintf(line, n,
                 "checkpoint kept in %s (%lld of %lld blocks done): run the same command with --resume to continue",
                 ck->dir, (long long)ck->next_block, (long long)ck->n_layer);
}

static void set_note(const struct llmq_ckpt *ck) {
    char line[1024];
    kept_line(ck, line, sizeof line);
    llmq_guard_set_note(line);
}

// The checkpoint directory of out opened, resumed or created (llmq_ckpt_open's contract); stream: of a writer-only
// run. NULL with the status logged on failure.
static enum llmq_status ckpt_open(const char *out, const json_t *fp, bool resume, bool force, bool stream,
                                  int64_t n_layer, struct llmq_ckpt **out_ck) {
    *out_ck = NULL;
    enum llmq_status st = llmq_ckpt_check(out, resume, force);
    if (st) return st;
    struct llmq_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = partial_path(out)) || (stream && !(ck->part = llmq_path_join(ck->dir, STREAM_FILE)))) {
        if (ck) free(ck->dir);
        free(ck);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", out);
    }
    ck->lock_fd = -1;
    ck->stream = stream;
    ck->n_layer = n_layer;
    bool exists = false;
    // the guard's rules: never an input (nor a directory holding one); an existing one only if llmq wrote it
    st = llmq_output_check(NULL, ck->dir, true, true, &exists);
    if (!st && exists && resume) {
        st = resume_existing(ck, out, fp);
    } else if (!st) {
        if (resume)
            llmq_info("quantize: no checkpoint at %s: nothing to resume, starting at %s", ck->dir,
                      ck->stream ? "the first tensor" : "block 0");
        if (exists) llmq_info("quantize: %s: the previous checkpoint is discarded (--force)", ck->dir);
        st = create_fresh(ck, out, fp, exists);
    }
    if (st) {
        ck->fresh = false; // an existing one stays as it was; a failed new one was discarded
        llmq_ckpt_close(ck);
        return st;
    }
    *out_ck = ck;
    return LLMQ_OK;
}

enum llmq_status llmq_ckpt_open(const char *out, const json_t *fp, bool resume, bool force, int64_t n_layer,
                                struct llmq_ckpt **out_ck, int64_t *next_block) {
    *next_block = 0;
    struct llmq_ckpt *ck;
    enum llmq_status st = ckpt_open(out, fp, resume, force, false, n_layer, out_ck);
    if (st) return st;
    ck = *out_ck;
    if (ck->next_block == n_layer)
        llmq_info("quantize: resuming from the checkpoint %s: all %lld blocks done, the output is written from it",
                  ck->dir, (long long)n_layer);
    else if (ck->next_block > 0)
        llmq_info("quantize: resuming from the checkpoint %s: blocks 0..%lld done, continuing at block %lld", ck->dir,
                  (long long)ck->next_block - 1, (long long)ck->next_block);
    else
        llmq_info("quantize: checkpoint after each block in %s (an interrupted run continues with --resume)", ck->dir);
    set_note(ck);
    *next_block = ck->next_block;
    return LLMQ_OK;
}

// ---- the writer-only run ---------------------------------------------------------------------------------

enum llmq_status llmq_ckpt_open_stream(const char *out, const json_t *fp, bool resume, bool force,
                                       struct llmq_ckpt **out_ck, int64_t *done, uint64_t *offset) {
    *done = 0;
    *offset = 0;
    enum llmq_status st = ckpt_open(out, fp, resume, force, true, 0, out_ck);
    if (st) return st;
    struct llmq_ckpt *ck = *out_ck;
    if (ck->next_block > 0)
        llmq_info("quantize: resuming from the checkpoint %s: %lld of %lld tensors written (%.2f MiB), continuing "
                  "there",
                  ck->dir, (long long)ck->next_block, (long long)ck->n_layer, (double)ck->offset / 1048576.0);
    else if (!ck->fresh)
        llmq_info("quantize: resuming from the checkpoint %s: no tensor committed yet, starting at the first", ck->dir);
    else
        llmq_info("quantize: checkpoint of the output as it streams in %s (an interrupted run continues with "
                  "--resume)",
                  ck->dir);
    set_note(ck);
    *done = ck->next_block;
    *offset = ck->offset;
    return LLMQ_OK;
}

const char *llmq_ckpt_stream_part(const struct llmq_ckpt *ck) { return ck->part; }

enum llmq_status llmq_ckpt_stream_step(struct llmq_ckpt *ck, int64_t done, int64_t n_tensors, bool synced,
                                       uint64_t offset) {
    LLMQ_ASSERT(ck->stream);
    enum llmq_status st = LLMQ_OK;
    if (synced) {
        LLMQ_ASSERT(done > ck->next_block && offset > ck->offset);
        json_object_set_new(ck->state, "n_tensors", json_integer(n_tensors));
        json_object_set_new(ck->state, "tensors_done", json_integer(done));
        json_object_set_new(ck->state, "offset", json_integer((json_int_t)offset));
        if ((st = write_state(ck, ck->dir))) return st; // the commit point
        ck->n_layer = n_tensors;
        ck->next_block = done;
        ck->offset = offset;
        set_note(ck);
    }
    kill_point();
    return st;
}

// ---- recording a block ---------------------------------------------------------------------------------------

static enum llmq_status bwrite(struct llmq_ckpt *ck, const void *p, size_t n) {
    llmq_sha256_update(&ck->sha, p, n);
    ck->nbytes += n;
    return llmq_afile_write(&ck->bf, p, n);
}
static enum llmq_status bwrite_i32(struct llmq_ckpt *ck, int32_t v) { return bwrite(ck, &v, sizeof v); }
static enum llmq_status bwrite_i64(struct llmq_ckpt *ck, int64_t v) { return bwrite(ck, &v, sizeof v); }

// The codes q (n) as stored: two per byte (low nibble first) when bits <= 4, else one per byte.
static enum llmq_status bwrite_codes(struct llmq_ckpt *ck, const uint8_t *q, int64_t n, int bits) {
    if (bits > 4) return bwrite(ck, q, (size_t)n);
    uint8_t buf[1 << 15]; // packs 2 * sizeof buf codes at a time
    enum llmq_status st = LLMQ_OK;
    for (int64_t i = 0; i < n && !st; i += 2 * (int64_t)sizeof buf) {
        int64_t k = n - i < 2 * (int64_t)sizeof buf ? n - i : 2 * (int64_t)sizeof buf;
        for (int64_t j = 0; j < k; j += 2) buf[j / 2] = (uint8_t)(q[i + j] | (j + 1 < k ? q[i + j + 1] << 4 : 0));
        st = bwrite(ck, buf, (size_t)(k + 1) / 2);
    }
    return st;
}

// Opens block layer's file: magic, layer, and its non-linear tensors as the weight set ly handed to the writer
// holds them (AWQ's folded norms among them).
static enum llmq_status block_open(struct llmq_ckpt *ck, const struct llmq_layer *ly, int64_t layer) {
    char *p = pathf(ck->dir, block_fmt, (long long)layer);
    enum llmq_status st = p ? llmq_afile_open(&ck->bf, p) : llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", ck->dir);
    free(p);
    if (st) return st;
    ck->bf_open = true;
    ck->bf_layer = layer;
    ck->nbytes = 0;
    llmq_sha256_init(&ck->sha);
    st = bwrite(ck, BLOCK_MAGIC, 8);
    if (!st) st = bwrite_i64(ck, layer);
    for (int i = 0; !st && i < N_TENSORS; i++) {
        const struct llmq_tensor_view *v = *tensor_slot(ly, i);
        if (!v) continue;
        st = bwrite(ck, "TENS", 4);
        if (!st) st = bwrite_i32(ck, i);
        if (!st) st = bwrite_i32(ck, (int32_t)v->dtype);
        if (!st) st = bwrite_i64(ck, (int64_t)v->nbytes);
        if (!st) st = bwrite(ck, v->data, v->nbytes);
    }
    return st;
}

enum llmq_status llmq_ckpt_put_block(struct llmq_ckpt *ck, int64_t layer, const struct llmq_layer *ly) {
    LLMQ_ASSERT(layer == ck->next_block && !ck->bf_open);
    return block_open(ck, ly, layer);
}

// One linear's payload p (R, C; ROWS: in type) after its record's header: the layout of "LINR" / "EXPT".
static enum llmq_status write_payload(struct llmq_ckpt *ck, int64_t R, int64_t C, enum llmq_dtype type,
                                      const struct llmq_qpayload *p) {
    enum llmq_status st = bwrite_i32(ck, (int32_t)p->kind);
    if (st) return st;
    if (p->kind == LLMQ_QPAYLOAD_CODES) {
        const struct llmq_qlinear *q = p->codes;
        size_t ng = (size_t)(q->R * q->n_groups);
        st = bwrite_i64(ck, q->R);
        if (!st) st = bwrite_i64(ck, q->C);
        if (!st) st = bwrite_i32(ck, q->bits);
        if (!st) st = bwrite_i32(ck, q->group_size);
        if (!st) st = bwrite_i32(ck, q->sym);
        if (!st) st = bwrite_i64(ck, q->n_groups);
        if (!st) st = bwrite_codes(ck, q->q, q->R * q->C, q->bits);
        if (!st) st = bwrite(ck, q->scales, ng * sizeof(float));
        if (!st) st = bwrite(ck, q->zeros, ng * sizeof(float));
        if (!st) st = bwrite(ck, q->g_idx, (size_t)q->C * sizeof(int32_t));
    } else if (p->kind == LLMQ_QPAYLOAD_ROWS) {
        size_t rb = 0;
        (void)llmq_dtype_nbytes(type, C, &rb); // the writer took them
        st = bwrite_i64(ck, (int64_t)(rb * (size_t)R));
        if (!st) st = bwrite(ck, p->rows, rb * (size_t)R);
    } else {
        st = bwrite_i64(ck, R * C);
        if (!st) st = bwrite(ck, p->w, (size_t)(R * C) * sizeof(float));
    }
    if (!st) kill_point();
    return st;
}

enum llmq_status llmq_ckpt_put_linear(struct llmq_ckpt *ck, const struct llmq_model *m, const struct llmq_qwriter *w,
                                      int64_t layer, enum llmq_linear which, const struct llmq_qpayload *p) {
    LLMQ_ASSERT(layer == ck->next_block && (!ck->bf_open || ck->bf_layer == layer));
    enum llmq_status st = ck->bf_open ? LLMQ_OK : block_open(ck, &m->layers[layer], layer);
    const struct llmq_tensor_view *v = m->layers[layer].w[which];
    if (!st) st = bwrite(ck, "LINR", 4);
    if (!st) st = bwrite_i32(ck, (int32_t)which);
    if (st) return st;
    return write_payload(ck, v->shape[0], v->shape[1], llmq_qwriter_target(w, layer, which).type, p);
}

enum llmq_status llmq_ckpt_put_expert(struct llmq_ckpt *ck, const struct llmq_model *m, const struct llmq_qwriter *w,
                                      int64_t layer, enum llmq_linear which, int64_t expert,
                                      const struct llmq_qpayload *p) {
    LLMQ_ASSERT(layer == ck->next_block && (!ck->bf_open || ck->bf_layer == layer));
    enum llmq_status st = ck->bf_open ? LLMQ_OK : block_open(ck, &m->layers[layer], layer);
    const struct llmq_tensor_view *v = llmq_layer_linear(&m->layers[layer], which, expert);
    LLMQ_ASSERT(v);
    if (!st) st = bwrite(ck, "EXPT", 4);
    if (!st) st = bwrite_i32(ck, (int32_t)which);
    if (!st) st = bwrite_i64(ck, expert);
    if (st) return st;
    return write_payload(ck, v->shape[0], v->shape[1], llmq_qwriter_expert_target(w, layer, which).type, p);
}

// x (n floats) into dir/x-<layer>.bin; its state entry into *entry.
static enum llmq_status write_x(struct llmq_ckpt *ck, int64_t layer, const float *x, int64_t n, json_t **entry) {
    char *p = pathf(ck->dir, x_fmt, (long long)layer), hex[65];
    struct llmq_afile f;
    struct llmq_sha256 sh;
    uint8_t dg[32];
    enum llmq_status st = p ? llmq_afile_open(&f, p) : llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", ck->dir);
    free(p);
    if (st) return st;
    llmq_sha256_init(&sh);
    const size_t chunk = (size_t)1 << 22; // floats per write
    for (int64_t i = 0; i < n && !st; i += (int64_t)chunk) {
        size_t k = (size_t)(n - i) < chunk ? (size_t)(n - i) : chunk;
        llmq_sha256_update(&sh, x + i, k * sizeof(float));
        st = llmq_afile_write(&f, x + i, k * sizeof(float));
    }
    if (st) {
        llmq_afile_abort(&f);
        return st;
    }
    if ((st = llmq_afile_commit(&f))) return st;
    llmq_sha256_final(&sh, dg);
    llmq_sha256_hex(dg, hex);
    char name[64];
    snprintf(name, sizeof name, x_fmt, (long long)layer);
    *entry = json_pack("{s:s, s:I, s:s}", "file", name, "bytes", (json_int_t)n * 4, "sha256", hex);
    return LLMQ_OK;
}

// The block's report record: {"rows": layers[from..], "bits_total"[, "moe": {"layers": moe.layers[moe_from..],
// "fallback_rtn"}]}; a new object.
static json_t *report_record(const json_t *layers, size_t from, double bits_total, const json_t *moe, size_t moe_from) {
    json_t *rows = json_array();
    for (size_t i = from; i < json_array_size(layers); i++) json_array_append(rows, json_array_get(layers, i));
    json_t *rec = json_pack("{s:o, s:f}", "rows", rows, "bits_total", bits_total);
    if (rec && moe) {
        const json_t *ml = json_object_get(moe, "layers");
        json_t *mrows = json_array();
        for (size_t i = moe_from; i < json_array_size(ml); i++) json_array_append(mrows, json_array_get(ml, i));
        json_object_set_new(rec, "moe",
                            json_pack("{s:o, s:I}", "layers", mrows, "fallback_rtn",
                                      json_integer_value(json_object_get(moe, "fallback_rtn"))));
    }
    return rec;
}

enum llmq_status llmq_ckpt_commit_block(struct llmq_ckpt *ck, int64_t layer, const json_t *layers, size_t from,
                                        double bits_total, const json_t *moe, size_t moe_from, const float *x,
                                        int64_t n_x) {
    LLMQ_ASSERT(layer == ck->next_block && ck->bf_open && ck->bf_layer == layer);
    json_t *xe = json_null(), *old_x = json_incref(json_object_get(ck->state, "x"));
    json_t *rec = report_record(layers, from, bits_total, moe, moe_from);
    char *text = rec ? json_dumps(rec, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL, hex[65];
    enum llmq_status st = text ? LLMQ_OK : llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", ck->dir);
    if (!st) st = bwrite(ck, "JSON", 4);
    if (!st) st = bwrite_i64(ck, (int64_t)strlen(text));
    if (!st) st = bwrite(ck, text, strlen(text));
    if (!st) st = bwrite(ck, "END.", 4);
    free(text);
    json_decref(rec);
    ck->bf_open = false;
    if (st) {
        llmq_afile_abort(&ck->bf);
        goto done;
    }
    if ((st = llmq_afile_commit(&ck->bf))) goto done;
    kill_point();
    uint8_t dg[32];
    llmq_sha256_final(&ck->sha, dg);
    llmq_sha256_hex(dg, hex);
    char name[64];
    snprintf(name, sizeof name, block_fmt, (long long)layer);
    json_array_append_new(json_object_get(ck->state, "blocks"),
                          json_pack("{s:s, s:I, s:s}", "file", name, "bytes", (json_int_t)ck->nbytes, "sha256", hex));
    if (x && layer + 1 < ck->n_layer) {
        json_decref(xe);
        if ((st = write_x(ck, layer + 1, x, n_x, &xe))) goto done;
        kill_point();
    }
    json_object_set(ck->state, "x", xe);
    json_object_set_new(ck->state, "next_block", json_integer(layer + 1));
    if ((st = write_state(ck, ck->dir))) goto done; // the commit point
    ck->next_block = layer + 1;
    kill_point();
    if (json_is_object(old_x)) {
        char *p = llmq_path_join(ck->dir, json_string_value(json_object_get(old_x, "file")));
        if (p) unlink(p);
        free(p);
        kill_point();
    }
    set_note(ck);
done:
    json_decref(xe);
    json_decref(old_x);
    return st;
}

// ---- replay --------------------------------------------------------------------------------------------------

struct reader {
    FILE *f;
    const char *path;
    struct llmq_sha256 sha;
    uint64_t nbytes, size; // read so far, file size
};

static enum llmq_status rd(struct reader *r, void *p, size_t n) {
    if (n > r->size - r->nbytes || fread(p, 1, n, r->f) != n)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: truncated at byte %llu", r->path, (unsigned long long)r->nbytes);
    llmq_sha256_update(&r->sha, p, n);
    r->nbytes += n;
    return LLMQ_OK;
}

// n bytes (at most what the file still holds) into a new buffer *p.
static enum llmq_status rd_alloc(struct reader *r, size_t n, void **p) {
    *p = NULL;
    if (n > r->size - r->nbytes)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: a record of %zu bytes at byte %llu runs past the end", r->path, n,
                           (unsigned long long)r->nbytes);
    if (!(*p = malloc(n ? n : 1))) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", r->path);
    return rd(r, *p, n);
}

// n codes into q, stored as bwrite_codes stores them; a code beyond the grid is LLMQ_ERR_CORRUPT.
static enum llmq_status rd_codes(struct reader *r, uint8_t *q, int64_t n, int bits) {
    enum llmq_status st = bits > 4 ? rd(r, q, (size_t)n) : LLMQ_OK;
    for (int64_t i = 0; !st && bits <= 4 && i < n; i += 2) {
        uint8_t b;
        if ((st = rd(r, &b, 1))) break;
        q[i] = b & 15;
        if (i + 1 < n) q[i + 1] = b >> 4;
    }
    for (int64_t i = 0; !st && i < n; i++)
        if (q[i] >> bits)
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: code %d at %lld is not on a %d-bit grid", r->path, q[i],
                             (long long)i, bits);
    return st;
}

static enum llmq_status bad(const struct reader *r, const char *what) {
    return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s (at byte %llu): not what this run hands over", r->path, what,
                       (unsigned long long)r->nbytes);
}

// The saved non-linear tensors of one block; bound: handed to the writer.
struct block_tensors {
    struct llmq_tensor_view view[N_TENSORS];
    void *data[N_TENSORS];
    bool have[N_TENSORS], bound;
};

static enum llmq_status read_tensor(struct reader *r, const struct llmq_model *m, int64_t l, struct block_tensors *bt) {
    int32_t role, dtype;
    int64_t nb;
    size_t want = 0;
    enum llmq_status st = rd(r, &role, 4);
    if (!st) st = rd(r, &dtype, 4);
    if (!st) st = rd(r, &nb, 8);
    if (st) return st;
    const struct llmq_tensor_view *v = role >= 0 && role < N_TENSORS ? *tensor_slot(&m->layers[l], role) : NULL;
    if (!v || bt->have[role] || !llmq_dtype_traits((enum llmq_dtype)dtype) ||
        !llmq_dtype_nbytes((enum llmq_dtype)dtype, llmq_tensor_nelements(v), &want) || (size_t)nb != want)
        return bad(r, "a tensor record that does not fit the model");
    if ((st = rd_alloc(r, want, &bt->data[role]))) return st;
    bt->view[role] = *v;
    bt->view[role].dtype = (enum llmq_dtype)dtype;
    bt->view[role].data = bt->data[role];
    bt->view[role].nbytes = want;
    bt->have[role] = true;
    return LLMQ_OK;
}

// Hands block l's weight set to w once, before its first linear: the model's block with the saved non-linear
// tensors in place of its own (the model is not changed).
static enum llmq_status put_saved_block(const struct llmq_model *m, struct llmq_qwriter *w, int64_t l,
                                        struct block_tensors *bt) {
    if (bt->bound) return LLMQ_OK;
    struct llmq_layer ly = m->layers[l];
    for (int i = 0; i < N_TENSORS; i++)
        if (bt->have[i]) *tensor_slot(&ly, i) = &bt->view[i];
    bt->bound = true;
    return llmq_qwriter_put_block(w, l, &ly);
}

// One "LINR" (expert false) or "EXPT" record into w.
static enum llmq_status replay_linear(struct reader *r, const struct llmq_model *m, struct llmq_qwriter *w, int64_t l,
                                      bool expert) {
    int32_t which, kind, bits, gs, sym;
    int64_t R, C, ng, n, x = -1;
    enum llmq_status st = rd(r, &which, 4);
    if (!st && expert) st = rd(r, &x, 8);
    if (!st) st = rd(r, &kind, 4);
    if (st) return st;
    if (which < 0 || which >= LLMQ_LIN_COUNT || kind < 0 || kind > LLMQ_QPAYLOAD_F32 ||
        (expert && (x < 0 || x >= m->hp.n_expert)))
        return bad(r, "a bad linear");
    const struct llmq_tensor_view *v = llmq_layer_linear(&m->layers[l], which, x);
    if (!v) return bad(r, expert ? "an expert's linear this model has not" : "a linear this model's block has not");
    struct llmq_qtarget t = expert ? llmq_qwriter_expert_target(w, l, (enum llmq_linear)which)
                                   : llmq_qwriter_target(w, l, (enum llmq_linear)which);
    struct llmq_qlinear q = {0};
    struct llmq_qpayload p = {.kind = (enum llmq_qpayload_kind)kind, .codes = &q};
    void *buf = NULL;
    size_t rb = 0;
    if ((enum llmq_qpayload_kind)kind != t.kind) return bad(r, "a linear of another payload kind than the target's");
    if (kind == LLMQ_QPAYLOAD_CODES) {
        st = rd(r, &R, 8);
        if (!st) st = rd(r, &C, 8);
        if (!st) st = rd(r, &bits, 4);
        if (!st) st = rd(r, &gs, 4);
        if (!st) st = rd(r, &sym, 4);
        if (!st) st = rd(r, &ng, 8);
        if (st) return st;
        if (R != v->shape[0] || C != v->shape[1] || bits != t.q.bits || gs != t.q.group_size || sym != t.q.sym ||
            ng != llmq_qconfig_n_groups(&t.q, C))
            return bad(r, "codes of another shape or grid");
        if ((st = llmq_qlinear_init(R, C, &t.q, &q))) return st;
        st = rd_codes(r, q.q, R * C, bits);
        if (!st) st = rd(r, q.scales, (size_t)(R * ng) * sizeof(float));
        if (!st) st = rd(r, q.zeros, (size_t)(R * ng) * sizeof(float));
        if (!st) st = rd(r, q.g_idx, (size_t)C * sizeof(int32_t));
    } else {
        bool rows = kind == LLMQ_QPAYLOAD_ROWS;
        if (rows && !llmq_dtype_nbytes(t.type, v->shape[1], &rb)) return bad(r, "rows that do not tile the type");
        int64_t want = rows ? (int64_t)rb * v->shape[0] : v->shape[0] * v->shape[1];
        if ((st = rd(r, &n, 8))) return st;
        if (n != want) return bad(r, "a linear of another size");
        st = rd_alloc(r, rows ? (size_t)n : (size_t)n * sizeof(float), &buf);
        p.rows = buf;
        p.w = buf;
    }
    if (!st)
        st = expert ? llmq_qwriter_put_expert(w, l, (enum llmq_linear)which, x, &p)
                    : llmq_qwriter_put_linear(w, l, (enum llmq_linear)which, &p);
    llmq_qlinear_free(&q);
    free(buf);
    return st;
}

// The "JSON" record: rows appended to layers, *bits_total; moe (the run's coverage report, NULL for a dense model):
// the block's coverage rows appended to its "layers", its "fallback_rtn" set.
static enum llmq_status replay_rows(struct reader *r, json_t *layers, json_t *moe, double *bits_total) {
    int64_t n;
    char *text = NULL;
    enum llmq_status st = rd(r, &n, 8);
    if (!st && (n < 0 || (uint64_t)n > r->size - r->nbytes)) st = bad(r, "a report record past the end");
    if (!st) st = rd_alloc(r, (size_t)n, (void **)&text);
    json_error_t je;
    json_t *j = st ? NULL : json_loadb(text, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    json_t *rows = json_object_get(j, "rows"), *jm = json_object_get(j, "moe");
    if (!st && (!json_is_array(rows) || !json_is_number(json_object_get(j, "bits_total"))))
        st = bad(r, "a report record that is not {rows, bits_total}");
    if (!st && (!moe != !jm || (jm && (!json_is_array(json_object_get(jm, "layers")) ||
                                       !json_is_integer(json_object_get(jm, "fallback_rtn"))))))
        st = bad(r, moe ? "a block report without its experts' coverage" : "an experts' coverage in a dense run");
    if (!st) {
        json_array_extend(layers, rows);
        *bits_total = json_number_value(json_object_get(j, "bits_total"));
    }
    if (!st && moe) {
        json_array_extend(json_object_get(moe, "layers"), json_object_get(jm, "layers"));
        json_object_set(moe, "fallback_rtn", json_object_get(jm, "fallback_rtn"));
    }
    json_decref(j);
    free(text);
    return st;
}

static enum llmq_status replay_records(struct reader *r, const struct llmq_model *m, struct llmq_qwriter *w, int64_t l,
                                       json_t *layers, json_t *moe, double *bits_total, struct block_tensors *bt) {
    char magic[8], tag[4];
    int64_t layer;
    enum llmq_status st = rd(r, magic, 8);
    if (!st) st = rd(r, &layer, 8);
    if (!st && (memcmp(magic, BLOCK_MAGIC, 8) || layer != l)) st = bad(r, "not this block's file");
    bool rows = false;
    while (!st && !(st = rd(r, tag, 4))) {
        if (!memcmp(tag, "TENS", 4)) {
            st = bt->bound ? bad(r, "a tensor after the block's first linear") : read_tensor(r, m, l, bt);
        } else if (!memcmp(tag, "LINR", 4) || !memcmp(tag, "EXPT", 4)) {
            st = put_saved_block(m, w, l, bt);
            if (!st) st = replay_linear(r, m, w, l, tag[0] == 'E');
        } else if (!memcmp(tag, "JSON", 4)) {
            st = replay_rows(r, layers, moe, bits_total);
            rows = true;
        } else if (!memcmp(tag, "END.", 4)) {
            break;
        } else {
            st = bad(r, "an unknown record");
        }
    }
    if (!st && (!rows || r->nbytes != r->size)) st = bad(r, "a block file without its report or with trailing bytes");
    return st;
}

// Opens dir/entry.file for reading, checking its size against entry.bytes.
static enum llmq_status reader_open(struct reader *r, const char *dir, const json_t *entry, char **path) {
    memset(r, 0, sizeof *r);
    *path = llmq_path_join(dir, json_string_value(json_object_get(entry, "file")));
    if (!*path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    r->path = *path;
    struct stat sb;
    if (!(r->f = fopen(*path, "rb")) || fstat(fileno(r->f), &sb) != 0)
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: cannot read the checkpoint's file: %s", *path, strerror(errno));
    r->size = (uint64_t)sb.st_size;
    if ((json_int_t)r->size != json_integer_value(json_object_get(entry, "bytes")))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %llu bytes, state.json says %lld", *path, (unsigned long long)r->size,
                           (long long)json_integer_value(json_object_get(entry, "bytes")));
    llmq_sha256_init(&r->sha);
    return LLMQ_OK;
}

static enum llmq_status reader_close(struct reader *r, const json_t *entry, enum llmq_status st) {
    if (r->f) fclose(r->f);
    if (st) return st;
    uint8_t dg[32];
    char hex[65];
    llmq_sha256_final(&r->sha, dg);
    llmq_sha256_hex(dg, hex);
    if (strcmp(hex, json_string_value(json_object_get(entry, "sha256"))))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: sha256 %s, state.json says %s: the checkpoint is damaged", r->path,
                           hex, json_string_value(json_object_get(entry, "sha256")));
    return LLMQ_OK;
}

enum llmq_status llmq_ckpt_replay(struct llmq_ckpt *ck, const struct llmq_model *m, struct llmq_qwriter *w,
                                  json_t *layers, json_t *moe, double *bits_total, float *x, int64_t n_x) {
    enum llmq_status st = LLMQ_OK;
    struct reader r;
    char *path = NULL;
    for (int64_t l = 0; l < ck->next_block && !st; l++) {
        const json_t *e = json_array_get(json_object_get(ck->state, "blocks"), (size_t)l);
        struct block_tensors bt = {0};
        st = reader_open(&r, ck->dir, e, &path);
        if (!st) st = replay_records(&r, m, w, l, layers, moe, bits_total, &bt);
        for (int i = 0; i < N_TENSORS; i++) free(bt.data[i]);
        st = reader_close(&r, e, st);
        free(path);
    }
    const json_t *xe = json_object_get(ck->state, "x");
    bool want_x = x && ck->next_block > 0 && ck->next_block < ck->n_layer;
    if (!st && want_x != json_is_object(xe))
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: state.json %s activations, this run %s them", ck->dir,
                         json_is_object(xe) ? "has" : "has no", want_x ? "needs" : "has no use for");
    if (st || !want_x) return st;
    st = reader_open(&r, ck->dir, xe, &path);
    if (!st && r.size != (uint64_t)n_x * sizeof(float))
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %llu bytes of activations, this run's are %lld x 4", path,
                         (unsigned long long)r.size, (long long)n_x);
    if (!st) st = rd(&r, x, (size_t)n_x * sizeof(float));
    st = reader_close(&r, xe, st);
    free(path);
    if (!st) llmq_info("quantize: replayed %lld blocks from %s", (long long)ck->next_block, ck->dir);
    return st;
}

// ---- the end -----------------------------------------------------------------------------------------------

static void ckpt_free(struct llmq_ckpt *ck) {
    if (ck->bf_open) llmq_afile_abort(&ck->bf);
    if (ck->lock_fd >= 0) close(ck->lock_fd);
    llmq_guard_set_note(NULL);
    json_decref(ck->state);
    free(ck->dir);
    free(ck->part);
    free(ck);
}

void llmq_ckpt_done(struct llmq_ckpt *ck) {
    if (!ck) return;
    llmq_remove_tree(ck->dir);
    llmq_info("quantize: checkpoint %s removed (the output is complete)", ck->dir);
    ckpt_free(ck);
}

void llmq_ckpt_close(struct llmq_ckpt *ck) {
    if (!ck) return;
    if (ck->next_block == 0 && ck->fresh && ck->lock_fd >= 0)
        llmq_remove_tree(ck->dir); // nothing to resume
    else if (ck->next_block > 0) {
        char line[1024];
        kept_line(ck, line, sizeof line);
        llmq_info("quantize: %s", line);
    }
    ckpt_free(ck);
}
