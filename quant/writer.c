/*
 * quant/writer.c — the writer interface over quant/export.h and quant/gguf_export.h (quant/writer.h).
 */
#include "quant/writer.h"

#include "common/log.h"

#include <stdlib.h>

struct llmq_qwriter {
    struct llmq_export *dir; // exactly one of the two
    struct llmq_gguf_export *gguf;
    struct llmq_qconfig q; // dir: the grid of every linear
};

static const char *kind_name(enum llmq_qpayload_kind k) {
    switch (k) {
    case LLMQ_QPAYLOAD_CODES: return "integer codes";
    case LLMQ_QPAYLOAD_ROWS: return "encoded rows";
    case LLMQ_QPAYLOAD_F32: return "f32 weights";
    }
    return "?";
}

enum llmq_status llmq_qwriter_check(const struct llmq_model *m, const struct llmq_qwriter_opts *o) {
    LLMQ_ASSERT(!o->dir != !o->gguf);
    return o->dir ? llmq_export_check(m, o->dir) : LLMQ_OK;
}

enum llmq_status llmq_qwriter_begin(const struct llmq_model *m, const char *out, const struct llmq_qwriter_opts *o,
                                    struct llmq_qwriter **w) {
    LLMQ_ASSERT(!o->dir != !o->gguf);
    *w = NULL;
    struct llmq_qwriter *x = calloc(1, sizeof(*x));
    if (!x) return llmq_errorf(LLMQ_ERR_NOMEM, "writer: out of memory");
    enum llmq_status st;
    if (o->dir) {
        x->q = o->dir->q;
        st = llmq_export_begin(m, out, o->dir, &x->dir);
    } else {
        st = llmq_gguf_export_begin(m, out, o->gguf, &x->gguf);
    }
    if (st) {
        free(x);
        return st;
    }
    *w = x;
    return LLMQ_OK;
}

struct llmq_qtarget llmq_qwriter_target(const struct llmq_qwriter *w, int64_t layer, enum llmq_linear which) {
    struct llmq_qtarget t = {.kind = LLMQ_QPAYLOAD_CODES, .type = LLMQ_DTYPE_INVALID};
    if (w->dir) {
        t.q = w->q;
        return t;
    }
    t.type = llmq_gguf_export_linear_type(w->gguf, layer, which);
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t.type);
    LLMQ_ASSERT(tr); // layer / which in range
    t.kind = tr->is_quant ? LLMQ_QPAYLOAD_ROWS : LLMQ_QPAYLOAD_F32;
    t.importance = llmq_gguf_export_linear_importance(w->gguf, layer, which);
    return t;
}

enum llmq_status llmq_qwriter_put_linear(struct llmq_qwriter *w, int64_t layer, enum llmq_linear which,
                                         const struct llmq_qpayload *p) {
    enum llmq_qpayload_kind want = llmq_qwriter_target(w, layer, which).kind;
    if (p->kind != want) {
        char name[64];
        llmq_linear_full_name(which, layer, false, name, sizeof(name));
        return llmq_errorf(LLMQ_ERR_ARG, "writer: %s: handed over as %s, the output takes %s", name, kind_name(p->kind),
                           kind_name(want));
    }
    switch (p->kind) {
    case LLMQ_QPAYLOAD_CODES: return llmq_export_layer(w->dir, layer, which, p->codes);
    case LLMQ_QPAYLOAD_ROWS: return llmq_gguf_export_linear_bytes(w->gguf, layer, which, p->rows);
    case LLMQ_QPAYLOAD_F32: return llmq_gguf_export_linear_f32(w->gguf, layer, which, p->w);
    }
    return llmq_errorf(LLMQ_ERR_ARG, "writer: unknown payload kind %d", (int)p->kind);
}

struct llmq_qtarget llmq_qwriter_expert_target(const struct llmq_qwriter *w, int64_t layer, enum llmq_linear which) {
    struct llmq_qtarget t = llmq_qwriter_target(w, layer, which);
    t.importance = NULL;
    if (w->dir) return t;
    t.type = llmq_gguf_export_expert_type(w->gguf, layer, which);   // the stacked tensor's (qwen2_moe: not its shared
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t.type); // expert's, the block's dense gate / up / down)
    LLMQ_ASSERT(tr);
    t.kind = tr->is_quant ? LLMQ_QPAYLOAD_ROWS : LLMQ_QPAYLOAD_F32;
    return t;
}

enum llmq_status llmq_qwriter_put_expert(struct llmq_qwriter *w, int64_t layer, enum llmq_linear which, int64_t expert,
                                         const struct llmq_qpayload *p) {
    enum llmq_qpayload_kind want = llmq_qwriter_expert_target(w, layer, which).kind;
    if (p->kind != want)
        return llmq_errorf(LLMQ_ERR_ARG, "writer: blk.%lld %s expert %lld: handed over as %s, the output takes %s",
                           (long long)layer, llmq_linear_name(which), (long long)expert, kind_name(p->kind),
                           kind_name(want));
    switch (p->kind) {
    case LLMQ_QPAYLOAD_CODES: return llmq_export_expert(w->dir, layer, which, expert, p->codes);
    case LLMQ_QPAYLOAD_ROWS: return llmq_gguf_export_expert_bytes(w->gguf, layer, which, expert, p->rows);
    case LLMQ_QPAYLOAD_F32: return llmq_gguf_export_expert_f32(w->gguf, layer, which, expert, p->w);
    }
    return llmq_errorf(LLMQ_ERR_ARG, "writer: unknown payload kind %d", (int)p->kind);
}

enum llmq_status llmq_qwriter_put_block(struct llmq_qwriter *w, int64_t layer, const struct llmq_layer *ly) {
    return w->dir ? llmq_export_block(w->dir, layer, ly) : llmq_gguf_export_block(w->gguf, layer, ly);
}

void llmq_qwriter_print_plan(const struct llmq_qwriter *w, FILE *f) {
    if (w->gguf) llmq_gguf_export_print_plan(w->gguf, f);
}

enum llmq_status llmq_qwriter_finish(struct llmq_qwriter *w) {
    enum llmq_status st = w->dir ? llmq_export_finish(w->dir) : llmq_gguf_export_finish(w->gguf);
    free(w);
    return st;
}

void llmq_qwriter_abort(struct llmq_qwriter *w) {
    if (!w) return;
    llmq_export_abort(w->dir);
    llmq_gguf_export_abort(w->gguf);
    free(w);
}
