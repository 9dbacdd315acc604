/*
 * calib/eval/task_read.c — the task readers of calib/eval/tasks.h: file bytes -> items holding the
 * request strings of a protocol (the formats and the string rules are in the header).
 */
#include "calib/eval/tasks.h"

#include "common/io.h"
#include "common/log.h"
#include "common/sha256.h"
#include "datasets/datasets.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_TASK_BYTES = 256 << 20 };

// ---- strings ------------------------------------------------------------------------------------------

// A malloc'd concatenation of the NULL-terminated list of strings.
static char *cat(const char *first, ...) {
    va_list ap;
    size_t n = 0;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) n += strlen(s);
    va_end(ap);
    char *out = malloc(n + 1), *p = out;
    if (!out) return NULL;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) {
        size_t k = strlen(s);
        memcpy(p, s, k);
        p += k;
    }
    va_end(ap);
    *p = '\0';
    return out;
}

// Unicode code points of a UTF-8 string (bytes that are not continuation bytes): Python's len(str).
static int64_t code_points(const char *s) {
    int64_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

// Python's str.isspace for the ASCII range (str.strip() also strips Unicode spaces; the task texts
// hold none at their ends).
static bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

// lm-eval hellaswag/utils.py preprocess(): strip, " [title]" -> ". ", remove "[...]" (non-greedy, within
// the text), then one pass of "  " -> " ". malloc'd.
static char *hellaswag_preprocess(const char *s) {
    size_t n = strlen(s);
    while (n && py_space((unsigned char)s[n - 1])) n--;
    while (n && py_space((unsigned char)*s)) s++, n--;
    char *a = malloc(n + 1), *b = malloc(n + 1);
    if (!a || !b) {
        free(a);
        free(b);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) { // " [title]" -> ". "
        if (n - i >= 8 && memcmp(s + i, " [title]", 8) == 0) {
            a[k++] = '.';
            a[k++] = ' ';
            i += 8;
        } else {
            a[k++] = s[i++];
        }
    }
    a[k] = '\0';
    size_t m = 0;
    for (size_t i = 0; i < k;) { // re.sub("\\[.*?\\]", "", text): '.' matches anything but '\n'
        if (a[i] == '[') {
            size_t j = i + 1;
            while (j < k && a[j] != ']' && a[j] != '\n') j++;
            if (j < k && a[j] == ']') {
                i = j + 1;
                continue;
            }
        }
        b[m++] = a[i++];
    }
    b[m] = '\0';
    k = 0;
    for (size_t i = 0; i < m;) { // text.replace("  ", " ")
        if (i + 1 < m && b[i] == ' ' && b[i + 1] == ' ') {
            a[k++] = ' ';
            i += 2;
        } else {
            a[k++] = b[i++];
        }
    }
    a[k] = '\0';
    free(b);
    return a;
}

// ---- items ----------------------------------------------------------------------------------------------

struct reader {
    struct llmq_task_set *s;
    int64_t cap;
    const char *what;
    int64_t line; // 1-based line of the item being read
};

static void item_free(struct llmq_task_item *it) {
    for (int c = 0; c < it->n_choices; c++) {
        free(it->ch[c].ctx);
        free(it->ch[c].cont);
    }
    it->n_choices = 0;
}

void llmq_task_set_free(struct llmq_task_set *s) {
    if (!s) return;
    for (int64_t i = 0; i < s->n_items; i++) item_free(&s->items[i]);
    free(s->items);
    free(s->path);
    memset(s, 0, sizeof(*s));
}

static enum llmq_status bad(const struct reader *r, const char *msg) {
    return llmq_errorf(LLMQ_ERR_CORRUPT, "%s:%lld: %s task: %s", r->what, (long long)r->line, llmq_task_name(r->s->id),
                       msg);
}

// Appends an item with n choices; the strings are taken over (freed on failure). norm: the choice
// texts of lm-eval's acc_norm (may be NULL: 1 each).
static enum llmq_status add_item(struct reader *r, int n, int gold, char **ctx, char **cont, char **norm) {
    enum llmq_status st = LLMQ_OK;
    bool ok = true;
    for (int c = 0; c < n; c++) ok = ok && ctx[c] && cont[c];
    if (!ok) st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", r->what);
    if (!st && (gold < 0 || gold >= n)) st = bad(r, "the gold answer is not one of the choices");
    if (!st && r->s->n_items == r->cap) {
        int64_t cap = r->cap ? 2 * r->cap : 1024;
        struct llmq_task_item *p = realloc(r->s->items, (size_t)cap * sizeof(*p));
        if (!p)
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", r->what);
        else
            r->s->items = p, r->cap = cap;
    }
    if (st) {
        for (int c = 0; c < n; c++) free(ctx[c]), free(cont[c]);
        return st;
    }
    struct llmq_task_item *it = &r->s->items[r->s->n_items++];
    memset(it, 0, sizeof(*it));
    it->index = r->s->n_items - 1;
    it->n_choices = n;
    it->gold = gold;
    for (int c = 0; c < n; c++) {
        int64_t len = norm && norm[c] ? code_points(norm[c]) : 1;
        it->ch[c] = (struct llmq_task_choice){ctx[c], cont[c], len > 0 ? len : 1};
    }
    return LLMQ_OK;
}

// ---- hellaswag: 6 lines per item ------------------------------------------------------------------------

static enum llmq_status read_hellaswag(struct reader *r, char *data, size_t len) {
    enum { MAXL = 6 };
    char *lines[MAXL];
    int nl = 0;
    enum llmq_status st = LLMQ_OK;
    char *p = data, *end = data + len;
    int64_t lineno = 0;
    while (p < end && !st) {
        char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q) q = end;
        *q = '\0'; // the buffer is ours (a copy)
        lines[nl++] = p;
        lineno++;
        p = q + 1;
        if (nl < MAXL) continue;
        nl = 0;
        r->line = lineno - 5;
        char *e = NULL;
        long gold = strtol(lines[1], &e, 10);
        if (e == lines[1] || (*e && *e != '\r')) return bad(r, "line 2 of the item is not the gold ending 0..3");
        char *ctx[4], *cont[4], *norm[4] = {0};
        bool lm = r->s->protocol == LLMQ_TASK_PROTOCOL_LMEVAL;
        char *pc = lm ? hellaswag_preprocess(lines[0]) : NULL;
        for (int c = 0; c < 4; c++) {
            norm[c] = lm ? hellaswag_preprocess(lines[2 + c]) : NULL;
            ctx[c] = cat(lm ? (pc ? pc : "") : lines[0], (char *)NULL);
            cont[c] = cat(" ", lm ? (norm[c] ? norm[c] : "") : lines[2 + c], (char *)NULL);
        }
        st = add_item(r, 4, (int)gold, ctx, cont, norm);
        for (int c = 0; c < 4; c++) free(norm[c]);
        free(pc);
    }
    if (!st && nl != 0) {
        r->line = lineno;
        return bad(r, "the number of lines is not a multiple of 6");
    }
    return st;
}

// ---- jsonl ------------------------------------------------------------------------------------------------

static const char *jstr(json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

static enum llmq_status read_arc(struct reader *r, json_t *o) {
    json_t *q = json_object_get(o, "question"), *chs = json_object_get(q, "choices");
    const char *stem = jstr(q, "stem"), *key = jstr(o, "answerKey");
    size_t n = json_array_size(chs);
    if (!stem || !key || !json_is_array(chs)) return bad(r, "expected question.stem, question.choices and answerKey");
    if (n < 2 || n > LLMQ_TASK_MAX_CHOICES) return bad(r, "an ARC item needs 2 to 8 choices");
    char *ctx[LLMQ_TASK_MAX_CHOICES], *cont[LLMQ_TASK_MAX_CHOICES], *norm[LLMQ_TASK_MAX_CHOICES];
    int gold = -1;
    for (size_t c = 0; c < n; c++) {
        const char *t = jstr(json_array_get(chs, c), "text"), *l = jstr(json_array_get(chs, c), "label");
        if (!t || !l) {
            for (size_t k = 0; k < c; k++) free(ctx[k]), free(cont[k]);
            return bad(r, "a choice without text or label");
        }
        if (strcmp(l, key) == 0 && gold < 0) gold = (int)c;
        ctx[c] = cat("Question: ", stem, "\nAnswer:", (char *)NULL);
        cont[c] = cat(" ", t, (char *)NULL);
        norm[c] = (char *)t;
    }
    if (gold < 0) {
        for (size_t k = 0; k < n; k++) free(ctx[k]), free(cont[k]);
        return bad(r, "answerKey names no choice label");
    }
    return add_item(r, (int)n, gold, ctx, cont, norm);
}

static enum llmq_status read_piqa(struct reader *r, json_t *o, const char **labels, const char *labels_end) {
    const char *goal = jstr(o, "goal"), *s1 = jstr(o, "sol1"), *s2 = jstr(o, "sol2");
    if (!goal || !s1 || !s2) return bad(r, "expected goal, sol1 and sol2");
    int gold;
    json_t *lab = json_object_get(o, "label");
    if (json_is_integer(lab)) {
        gold = (int)json_integer_value(lab);
    } else {
        if (!*labels || *labels >= labels_end) return bad(r, "no label for this item (the labels file is too short)");
        char *e;
        gold = (int)strtol(*labels, &e, 10);
        if (e == *labels) return bad(r, "the labels file holds no integer for this item");
        const char *nl = memchr(*labels, '\n', (size_t)(labels_end - *labels));
        *labels = nl ? nl + 1 : labels_end;
    }
    char *ctx[2], *cont[2], *norm[2] = {(char *)s1, (char *)s2};
    for (int c = 0; c < 2; c++) {
        ctx[c] = cat("Question: ", goal, "\nAnswer:", (char *)NULL);
        cont[c] = cat(" ", norm[c], (char *)NULL);
    }
    return add_item(r, 2, gold, ctx, cont, norm);
}

static enum llmq_status read_winogrande(struct reader *r, json_t *o) {
    char *ctx[2] = {0}, *cont[2] = {0};
    bool lm = r->s->protocol == LLMQ_TASK_PROTOCOL_LMEVAL;
    int gold;
    const char *sent = jstr(o, "sentence");
    if (sent) { // the original schema
        const char *o1 = jstr(o, "option1"), *o2 = jstr(o, "option2"), *ans = jstr(o, "answer");
        const char *us = strchr(sent, '_');
        if (!o1 || !o2 || !ans || !us || (strcmp(ans, "1") && strcmp(ans, "2")))
            return bad(r, "expected sentence (with one '_'), option1, option2 and answer \"1\" or \"2\"");
        gold = ans[0] - '1';
        const char *opt[2] = {o1, o2}, *rest = us + 1;
        char *stripped = NULL;
        if (lm) { // preprocess_winogrande.py doc_to_target: sentence[idx + 1:].strip()
            while (py_space((unsigned char)*rest)) rest++;
            size_t n = strlen(rest);
            while (n && py_space((unsigned char)rest[n - 1])) n--;
            stripped = llmq_strndup_bytes(rest, n);
        }
        for (int c = 0; c < 2; c++) {
            char *first = llmq_strndup_bytes(sent, (size_t)(us - sent));
            ctx[c] = first ? cat(first, opt[c], (char *)NULL) : NULL;
            cont[c] = lm ? (stripped ? cat(" ", stripped, (char *)NULL) : NULL) : cat(rest, (char *)NULL);
            free(first);
        }
        free(stripped);
        return add_item(r, 2, gold, ctx, cont, NULL);
    }
    json_t *opts = json_object_get(o, "context_options"), *g = json_object_get(o, "gold");
    const char *c0 = json_string_value(json_array_get(opts, 0)), *c1 = json_string_value(json_array_get(opts, 1));
    const char *rest = jstr(o, "continuation");
    if (json_array_size(opts) != 2 || !c0 || !c1 || !rest || !json_is_integer(g))
        return bad(r,
                   "expected context_options (2 strings), continuation and gold, or sentence/option1/option2/answer");
    gold = (int)json_integer_value(g);
    // llamacpp: the original "_." sentences have no space between the blank and the punctuation
    bool nospace = !lm && rest[0] && strchr(".,;:!?", rest[0]);
    const char *opt[2] = {c0, c1};
    for (int c = 0; c < 2; c++) {
        ctx[c] = cat(opt[c], (char *)NULL);
        cont[c] = cat(nospace ? "" : " ", rest, (char *)NULL);
    }
    return add_item(r, 2, gold, ctx, cont, NULL);
}

static enum llmq_status read_lambada(struct reader *r, json_t *o) {
    const char *ctx0 = jstr(o, "context"), *word = jstr(o, "continuation"), *text = jstr(o, "text");
    char *ctx[1], *cont[1];
    if (ctx0 && word) {
        ctx[0] = cat(ctx0, (char *)NULL);
        cont[0] = cat(" ", word, (char *)NULL);
    } else if (text) { // lambada_openai.yaml: text.split(' ')[:-1] joined, ' ' + text.split(' ')[-1]
        const char *sp = strrchr(text, ' ');
        if (!sp) return bad(r, "\"text\" has no space to split off the last word");
        ctx[0] = llmq_strndup_bytes(text, (size_t)(sp - text));
        cont[0] = cat(sp, (char *)NULL);
    } else {
        return bad(r, "expected context and continuation, or text");
    }
    return add_item(r, 1, 0, ctx, cont, NULL);
}

static enum llmq_status read_jsonl(struct reader *r, const char *data, size_t len, const char *labels,
                                   size_t labels_len) {
    const char *p = data, *end = data + len, *lab = labels, *lab_end = labels ? labels + labels_len : NULL;
    int64_t lineno = 0;
    enum llmq_status st = LLMQ_OK;
    while (p < end && !st) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        if (!q) q = end;
        lineno++;
        r->line = lineno;
        const char *b = p;
        p = q + 1;
        while (b < q && isspace((unsigned char)*b)) b++;
        if (b == q) continue; // blank line
        json_error_t err;
        json_t *o = json_loadb(b, (size_t)(q - b), 0, &err);
        if (!json_is_object(o)) {
            json_decref(o);
            char msg[240];
            snprintf(msg, sizeof(msg), "not a JSON object (%s, column %d)", err.text, err.column);
            return bad(r, msg);
        }
        switch (r->s->id) {
        case LLMQ_TASK_ARC_EASY:
        case LLMQ_TASK_ARC_CHALLENGE: st = read_arc(r, o); break;
        case LLMQ_TASK_PIQA: st = read_piqa(r, o, &lab, lab_end); break;
        case LLMQ_TASK_WINOGRANDE: st = read_winogrande(r, o); break;
        case LLMQ_TASK_LAMBADA: st = read_lambada(r, o); break;
        default: st = bad(r, "not a jsonl task");
        }
        json_decref(o);
    }
    if (!st && r->s->id == LLMQ_TASK_PIQA && lab) {
        while (lab < lab_end && isspace((unsigned char)*lab)) lab++;
        if (lab < lab_end) st = bad(r, "the labels file has more lines than the task file has items");
    }
    return st;
}

enum llmq_status llmq_task_set_parse(enum llmq_task_id id, enum llmq_task_protocol p, const char *data, size_t len,
                                     const char *labels, size_t labels_len, const char *what,
                                     struct llmq_task_set *out) {
    memset(out, 0, sizeof(*out));
    if ((unsigned)id >= LLMQ_TASK_COUNT || (unsigned)p >= LLMQ_TASK_PROTOCOL_COUNT)
        return llmq_errorf(LLMQ_ERR_ARG, "tasks: bad task or protocol");
    out->id = id;
    out->protocol = p;
    struct reader r = {out, 0, what, 0};
    enum llmq_status st;
    uint8_t dig[32];
    llmq_sha256(data, len, dig);
    llmq_sha256_hex(dig, out->sha256);
    if (id == LLMQ_TASK_HELLASWAG) {
        char *copy = llmq_strndup_bytes(data, len);
        st = copy ? read_hellaswag(&r, copy, len) : llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", what);
        free(copy);
    } else {
        st = read_jsonl(&r, data, len, labels, labels_len);
    }
    if (!st && out->n_items == 0) st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: no %s items", what, llmq_task_name(id));
    if (!st && !(out->path = cat(what, (char *)NULL))) st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", what);
    out->n_file_items = out->n_items;
    if (st) llmq_task_set_free(out);
    return st;
}

// The bytes of a task file or dataset: *data malloc'd, *shown the path to name (malloc'd).
static enum llmq_status load_bytes(const char *name, const char *path, char **data, size_t *len, char **shown) {
    if (path) {
        *shown = cat(path, (char *)NULL);
        return llmq_read_file(path, MAX_TASK_BYTES, data, len);
    }
    struct llmq_dataset ds;
    enum llmq_status st = llmq_dataset_load(name, NULL, MAX_TASK_BYTES, &ds);
    if (st) return st;
    *data = ds.data;
    *len = ds.len;
    *shown = ds.path;
    ds.data = NULL;
    ds.path = NULL;
    llmq_dataset_free(&ds);
    return LLMQ_OK;
}

enum llmq_status llmq_task_set_load(enum llmq_task_id id, enum llmq_task_protocol p, const char *path,
                                    struct llmq_task_set *out) {
    char *data = NULL, *labels = NULL, *shown = NULL, *lshown = NULL, *file = NULL;
    size_t len = 0, llen = 0;
    const char *lpath = NULL;
    enum llmq_status st = LLMQ_OK;
    memset(out, 0, sizeof(*out));
    if (path) {
        file = cat(path, (char *)NULL);
        char *at = file && id == LLMQ_TASK_PIQA ? strrchr(file, '@') : NULL;
        if (at) *at = '\0', lpath = at + 1;
        if (!file) return llmq_errorf(LLMQ_ERR_NOMEM, "out of memory");
    }
    if ((st = load_bytes(llmq_task_name(id), file, &data, &len, &shown))) goto done;
    if (id == LLMQ_TASK_PIQA && (!file || lpath) && (st = load_bytes("piqa-labels", lpath, &labels, &llen, &lshown)))
        goto done;
    st = llmq_task_set_parse(id, p, data, len, labels, llen, shown ? shown : "?", out);
done:
    free(data);
    free(labels);
    free(shown);
    free(lshown);
    free(file);
    return st;
}
