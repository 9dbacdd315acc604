/*
 * datasets/datasets.c — the named-dataset resolver (datasets/datasets.h documents the manifest, the
 * search order and the errors; this file only implements them).
 */
#include "datasets/datasets.h"

#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Set by the top-level CMakeLists.txt for this file: the source tree's datasets/, the ../shared/datasets
// beside it, and the install's data directory relative to the prefix.
#ifndef LLMQ_SOURCE_DATASETS
#define LLMQ_SOURCE_DATASETS ""
#endif
#ifndef LLMQ_SOURCE_SHARED
#define LLMQ_SOURCE_SHARED ""
#endif
#ifndef LLMQ_SHARE_REL
#define LLMQ_SHARE_REL "share/llmq"
#endif

#define MAX_MANIFEST_BYTES (1u << 20)
#define MAX_DIRS 6

static const struct {
    const char *alias, *name;
} aliases[] = {
    {"wikitext-2", "wikitext-2-test"},
};

const char *llmq_dataset_canonical(const char *name) {
    for (size_t i = 0; i < sizeof(aliases) / sizeof(aliases[0]); i++)
        if (strcmp(name, aliases[i].alias) == 0) return aliases[i].name;
    return name;
}

// dir of the running binary into buf ("" if unknown)
static void exe_dir(char *buf, size_t n) {
    buf[0] = '\0';
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0) return;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(buf, n, "%s", exe);
}

#define MANIFEST_WHERE                                                                                                 \
    "$LLMQ_MANIFEST, <llmq's dir>/../datasets/, <llmq's dir>/../" LLMQ_SHARE_REL "/, " LLMQ_SOURCE_DATASETS            \
    ", ./datasets/"
static char *find_manifest(void) {
    const char *env = getenv("LLMQ_MANIFEST");
    if (env && *env) return strdup(env);
    char dir[PATH_MAX], p[PATH_MAX + 64];
    exe_dir(dir, sizeof(dir));
    if (dir[0]) {
        snprintf(p, sizeof(p), "%s/../datasets/manifest.tsv", dir);
        if (llmq_file_exists(p)) return strdup(p);
        snprintf(p, sizeof(p), "%s/../%s/manifest.tsv", dir, LLMQ_SHARE_REL);
        if (llmq_file_exists(p)) return strdup(p);
    }
    if (LLMQ_SOURCE_DATASETS[0]) {
        snprintf(p, sizeof(p), "%s/manifest.tsv", LLMQ_SOURCE_DATASETS);
        if (llmq_file_exists(p)) return strdup(p);
    }
    if (llmq_file_exists("datasets/manifest.tsv")) return strdup("datasets/manifest.tsv");
    return NULL;
}

// One manifest row; the fields point into the manifest text.
struct row {
    const char *file, *sha, *licence, *data_file;
};

// Finds name's row in text (modified: fields are cut at their TABs). Appends every name seen to
// names (for the error message). Returns false when there is no such row.
static bool find_row(char *text, const char *name, struct row *r, char *names, size_t names_cap) {
    size_t used = 0;
    bool header = true;
    for (char *line = text; line && *line;) {
        char *nl = strchr(line, '\n'), *next = nl ? nl + 1 : NULL;
        if (nl) *nl = '\0';
        if (nl > line && nl[-1] == '\r') nl[-1] = '\0';
        char *f[6] = {0}, *p = line;
        for (int i = 0; i < 6 && p; i++) {
            f[i] = p;
            p = strchr(p, '\t');
            if (p) *p++ = '\0';
        }
        bool skip = line[0] == '#' || line[0] == '\0';
        if (!skip && header) { // the first line that is not a comment is the header row
            header = false;
            skip = true;
        }
        if (!skip && f[2]) {
            if (strcmp(f[0], name) == 0) {
                *r = (struct row){f[1], f[2], f[3] ? f[3] : "", f[4] && f[5] && strcmp(f[5], "-") ? f[5] : NULL};
                return true;
            }
            int k = snprintf(names + used, names_cap - used, "%s%s", used ? ", " : "", f[0]);
            if (k > 0 && (size_t)k < names_cap - used) used += (size_t)k;
        }
        line = next;
    }
    return false;
}

// rel ('+'-separated parts) under dir: true when every part exists; paths[] then holds them (malloc'd).
static bool parts_under(const char *dir, const char *rel, char **paths, int max_parts, int *n_parts) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", rel);
    int n = 0;
    bool ok = true;
    for (char *save = NULL, *part = strtok_r(buf, "+", &save); part && ok; part = strtok_r(NULL, "+", &save)) {
        if (n == max_parts)
            ok = false;
        else if (!(paths[n] = llmq_path_join(dir, part)))
            ok = false;
        else
            ok = llmq_file_exists(paths[n++]);
    }
    if (!ok || n == 0) {
        for (int i = 0; i < n; i++) free(paths[i]);
        return false;
    }
    *n_parts = n;
    return true;
}

// Reads and concatenates the parts into d->data.
static enum llmq_status read_parts(const char *name, char **paths, int n, size_t max_bytes, struct llmq_dataset *d) {
    for (int i = 0; i < n; i++) {
        char *buf = NULL;
        size_t len = 0;
        enum llmq_status st = llmq_read_file(paths[i], max_bytes - d->len, &buf, &len);
        if (st) return st;
        if (!d->data) {
            d->data = buf;
            d->len = len;
            continue;
        }
        char *nd = realloc(d->data, d->len + len + 1);
        if (!nd) {
            free(buf);
            return llmq_errorf(LLMQ_ERR_NOMEM, "datasets: %s: out of memory for %zu bytes", name, d->len + len);
        }
        memcpy(nd + d->len, buf, len + 1);
        d->data = nd;
        d->len += len;
        free(buf);
    }
    return LLMQ_OK;
}

enum llmq_status llmq_dataset_load(const char *arg, const char *manifest, size_t max_bytes, struct llmq_dataset *out) {
    memset(out, 0, sizeof(*out));
    const char *name = llmq_dataset_canonical(arg);
    struct llmq_dataset d = {0};
    char *text = NULL, *paths[8] = {0}, names[1024] = "", dirs[MAX_DIRS][PATH_MAX + 32],
         where[MAX_DIRS * (PATH_MAX + 34)] = "";
    int n_parts = 0, n_dirs = 0;
    size_t len;
    enum llmq_status st = LLMQ_OK;
    d.manifest = manifest ? strdup(manifest) : find_manifest();
    if (!d.manifest) {
        if (strchr(arg, '/')) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no such file", arg);
        return llmq_errorf(LLMQ_ERR_NOT_FOUND,
                           "datasets: %s: not a file, and no manifest.tsv to look the name up in "
                           "(looked at " MANIFEST_WHERE "; set LLMQ_MANIFEST)",
                           arg);
    }
    if ((st = llmq_read_file(d.manifest, MAX_MANIFEST_BYTES, &text, &len))) goto fail;
    struct row r;
    if (!find_row(text, name, &r, names, sizeof(names))) {
        st = llmq_is_dir(arg) ? llmq_errorf(LLMQ_ERR_ARG, "%s: is a directory, not a text file or a dataset name", arg)
             : strchr(arg, '/')
                 ? llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no such file (and not a dataset name)", arg)
                 : llmq_errorf(LLMQ_ERR_NOT_FOUND, "datasets: %s: not a file and not a name in %s (names: %s)", arg,
                               d.manifest, names);
        goto fail;
    }

    // the data directories, in the order of datasets.h
    char ed[PATH_MAX];
    exe_dir(ed, sizeof(ed));
    const char *slash = strrchr(d.manifest, '/'), *env = getenv("LLMQ_DATA");
    if (slash)
        snprintf(dirs[n_dirs++], sizeof(dirs[0]), "%.*s", (int)(slash - d.manifest), d.manifest);
    else
        snprintf(dirs[n_dirs++], sizeof(dirs[0]), ".");
    if (LLMQ_SOURCE_DATASETS[0]) snprintf(dirs[n_dirs++], sizeof(dirs[0]), "%s", LLMQ_SOURCE_DATASETS);
    if (ed[0]) snprintf(dirs[n_dirs++], sizeof(dirs[0]), "%s/../%s", ed, LLMQ_SHARE_REL);
    if (env && *env) snprintf(dirs[n_dirs++], sizeof(dirs[0]), "%s", env);
    snprintf(dirs[n_dirs++], sizeof(dirs[0]), "../shared/datasets");
    if (LLMQ_SOURCE_SHARED[0]) snprintf(dirs[n_dirs++], sizeof(dirs[0]), "%s", LLMQ_SOURCE_SHARED);
    bool found = false;
    for (int i = 0; i < n_dirs && !found; i++) {
        found = parts_under(dirs[i], r.file, paths, 8, &n_parts) ||
                (r.data_file && parts_under(dirs[i], r.data_file, paths, 8, &n_parts));
        size_t w = strlen(where);
        snprintf(where + w, sizeof(where) - w, "%s%s", i ? ", " : "", dirs[i]);
    }
    if (!found) {
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "datasets: %s: %s%s%s not found under %s (set LLMQ_DATA)", arg, r.file,
                         r.data_file ? " or " : "", r.data_file ? r.data_file : "", where);
        goto fail;
    }
    if ((st = read_parts(arg, paths, n_parts, max_bytes, &d))) goto fail;
    uint8_t dig[32];
    llmq_sha256(d.data, d.len, dig);
    llmq_sha256_hex(dig, d.sha256);
    if (strcmp(d.sha256, r.sha) != 0) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "datasets: %s: sha256 of %s%s (decompressed) is %s, the manifest %s says %s",
                         arg, paths[0], n_parts > 1 ? " + parts" : "", d.sha256, d.manifest, r.sha);
        goto fail;
    }
    d.name = strdup(name);
    d.licence = strdup(r.licence);
    if ((d.path = realpath(paths[0], NULL)))
        free(paths[0]); // the path logged and recorded
    else
        d.path = paths[0];
    paths[0] = NULL;
    d.n_parts = n_parts;
    if (!d.name || !d.licence) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "datasets: %s: out of memory", arg);
        goto fail;
    }
    for (int i = 1; i < n_parts; i++) free(paths[i]);
    free(text);
    *out = d;
    return LLMQ_OK;
fail:
    for (int i = 0; i < n_parts; i++) free(paths[i]);
    free(text);
    llmq_dataset_free(&d);
    return st;
}

void llmq_dataset_free(struct llmq_dataset *d) {
    if (!d) return;
    free(d->name);
    free(d->path);
    free(d->manifest);
    free(d->licence);
    free(d->data);
    memset(d, 0, sizeof(*d));
}
