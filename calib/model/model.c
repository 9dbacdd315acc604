/*
 * calib/model/model.c — loading a LLaMA-family model from GGUF or an HF directory (see calib/model/model.h).
 *
 * The hyper-parameters come from the readers of formats/llama/arch.h (both formats); this file adds
 * what the forward pass cannot run (check_forward) and n_vocab from the HF embedding.
 */
#include "calib/model/model.h"

#include "calib/tokenizer/tokenizer.h"
#include "common/io.h"
#include "common/log.h"
#include "formats/ggml/quants.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

// ---------------------------------------------------------------------------------------------
// Weight conversion
// ---------------------------------------------------------------------------------------------

enum llmq_status llmq_model_rows_f32(const struct llmq_tensor_view *w, int64_t r0, int64_t n, float *dst) {
    int64_t C = w->shape[w->n_dims > 0 ? w->n_dims - 1 : 0];
    int64_t R = w->n_dims > 0 ? llmq_tensor_nelements(w) / (C > 0 ? C : 1) : 1;
    size_t row_bytes = 0;
    if (r0 < 0 || n < 0 || r0 + n > R)
        return llmq_errorf(LLMQ_ERR_ARG, "%s: rows [%lld, %lld) out of range (%lld rows)", w->name, (long long)r0,
                           (long long)(r0 + n), (long long)R);
    if (n == 0) return LLMQ_OK;
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(w->dtype);
    if (!tr || !tr->can_dequant)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: dtype %s cannot be converted to f32", w->name,
                           llmq_dtype_name(w->dtype));
    if (!llmq_dtype_nbytes(w->dtype, C, &row_bytes))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: row of %lld elements does not fit dtype %s", w->name, (long long)C,
                           llmq_dtype_name(w->dtype));
    return llmq_dequantize_row(w->dtype, (const uint8_t *)w->data + (size_t)r0 * row_bytes, dst, n * C);
}

struct conv_job {
    const struct llmq_tensor_view *w;
    float *dst;
    int64_t R, C;
    int nth, ith;
    enum llmq_status st;
};

static void *conv_worker(void *arg) {
    struct conv_job *j = arg;
    int64_t per = (j->R + j->nth - 1) / j->nth;
    int64_t r0 = per * j->ith, r1 = r0 + per < j->R ? r0 + per : j->R;
    j->st = r0 < r1 ? llmq_model_rows_f32(j->w, r0, r1 - r0, j->dst + r0 * j->C) : LLMQ_OK;
    return NULL;
}

enum llmq_status llmq_model_weight_f32(const struct llmq_tensor_view *w, float *dst, int n_threads) {
    enum { MAX_THREADS = 256 };
    int64_t C = w->n_dims > 0 ? w->shape[w->n_dims - 1] : 1;
    int64_t R = C > 0 ? llmq_tensor_nelements(w) / C : 0;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads < 1 || R * C < (1 << 16)) n_threads = 1;
    if (n_threads > R) n_threads = R > 0 ? (int)R : 1;
    struct conv_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int i = 0; i < n_threads; i++)
        jobs[i] = (struct conv_job){.w = w, .dst = dst, .R = R, .C = C, .nth = n_threads, .ith = i, .st = LLMQ_OK};
    for (int i = 1; i < n_threads; i++) started[i] = pthread_create(&tid[i], NULL, conv_worker, &jobs[i]) == 0;
    conv_worker(&jobs[0]);
    for (int i = 1; i < n_threads; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            conv_worker(&jobs[i]); // could not start a thread: do its share here
    }
    for (int i = 0; i < n_threads; i++)
        if (jobs[i].st != LLMQ_OK) return jobs[i].st;
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// RoPE frequency factors
// ---------------------------------------------------------------------------------------------

void llmq_model_rope_freq_factors(const struct llmq_model *m, float *ff) {
    if (m->rope_freqs && llmq_model_rows_f32(m->rope_freqs, 0, 1, ff) == LLMQ_OK) return;
    llmq_rope_llama3_factors(&m->hp, ff);
}

// ---------------------------------------------------------------------------------------------
// Tensor lookup and shape checks
// ---------------------------------------------------------------------------------------------

// Where the model came from, for messages: the GGUF file or the HF directory.
static const char *src_name(const struct llmq_model *m) { return m->path; }

static const struct llmq_tensor_view *find_tensor(const struct llmq_model *m, const char *name) {
    if (m->gguf) {
        const struct llmq_gguf_tensor *t = llmq_gguf_find_tensor(m->gguf, name);
        return t ? &t->view : NULL;
    }
    return llmq_st_get(m->st, name);
}

// Finds tensor `name` and checks it has n_dims dims equal to (d0[, d1]) and a dtype that converts.
// `what` names where the expectation comes from, for the message.
static enum llmq_status get_tensor(const struct llmq_model *m, const char *name, bool required, int n_dims, int64_t d0,
                                   int64_t d1, const char *what, const struct llmq_tensor_view **out) {
    const struct llmq_tensor_view *t = find_tensor(m, name);
    *out = NULL;
    if (!t) {
        if (!required) return LLMQ_OK;
        return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s", src_name(m), name);
    }
    bool ok = t->n_dims == n_dims && t->shape[0] == d0 && (n_dims < 2 || t->shape[1] == d1);
    if (!ok) {
        char got[96];
        llmq_tensor_shape_str(t, got, sizeof got);
        if (n_dims == 1)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has shape %s, expected [%lld] (%s)", src_name(m), name,
                               got, (long long)d0, what);
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has shape %s, expected [%lld, %lld] (%s)", src_name(m),
                           name, got, (long long)d0, (long long)d1, what);
    }
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t->dtype);
    if (!tr || !tr->can_dequant)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s, which llmq cannot convert to f32",
                           src_name(m), name, llmq_dtype_name(t->dtype));
    *out = t;
    return LLMQ_OK;
}

// What the forward pass (calib/model/forward.c) cannot run, though the hyper-parameter readers accept it.
static enum llmq_status check_forward(const struct llmq_hparams *hp, const char *file) {
    if (hp->rope_scaling.type == LLMQ_ROPE_SCALING_LINEAR && hp->arch != LLMQ_ARCH_GEMMA3)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: linear rope scaling is not supported (only none or llama3; linear for gemma3)", file);
    if (hp->attn_bias)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: attention_bias = true (an o_proj bias) is not supported", file);
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// AWQ / GPTQ directories: dequantized on load (calib/model/model.h "Quantized HF directories")
// ---------------------------------------------------------------------------------------------

static const int awq_order[8] = {0, 2, 4, 6, 1, 3, 5, 7}; // nibble i holds column 8j + awq_order[i]

// Element i of an int32 tensor in the mapping (safetensors data need not be 4-byte aligned).
static uint32_t rd32(const struct llmq_tensor_view *t, int64_t i) {
    uint32_t x;
    memcpy(&x, (const uint8_t *)t->data + (size_t)i * 4, 4);
    return x;
}

// <prefix>.<suffix> with n_dims dims (d0[, d1]); dtype I32 when want_i32, else any dtype that
// converts to f32. Absent and !required: *out = NULL.
static enum llmq_status qtensor(const struct llmq_model *m, const char *prefix, const char *suffix, bool want_i32,
                                bool required, int n_dims, int64_t d0, int64_t d1,
                                const struct llmq_tensor_view **out) {
    char name[160];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const struct llmq_tensor_view *t = find_tensor(m, name);
    *out = NULL;
    if (!t) {
        if (!required) return LLMQ_OK;
        return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s (nor %s.weight) for %s quantization", src_name(m),
                           name, prefix, m->quant->method);
    }
    if (t->n_dims != n_dims || t->shape[0] != d0 || (n_dims == 2 && t->shape[1] != d1)) {
        char got[96];
        llmq_tensor_shape_str(t, got, sizeof got);
        if (n_dims == 1)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: tensor %s has shape %s, expected [%lld] (%s, %d bits, group %d)",
                               src_name(m), name, got, (long long)d0, m->quant->method, m->quant->bits,
                               m->quant->group_size);
        return llmq_errorf(
            LLMQ_ERR_CORRUPT, "%s: tensor %s has shape %s, expected [%lld, %lld] (%s, %d bits, group %d)", src_name(m),
            name, got, (long long)d0, (long long)d1, m->quant->method, m->quant->bits, m->quant->group_size);
    }
    const struct llmq_dtype_traits *tr = llmq_dtype_traits(t->dtype);
    if (want_i32 ? t->dtype != LLMQ_DTYPE_I32 : (!tr || !tr->can_dequant))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (expected %s)", src_name(m), name,
                           llmq_dtype_name(t->dtype), want_i32 ? "I32" : "F16, BF16 or F32");
    *out = t;
    return LLMQ_OK;
}

// Reads n values of b bits from the little-endian bit stream in words w(0), w(1), ... where
// w(i) = rd32(t, first + i * stride); value i sits at stream bits [b*i, b*i + b).
static void unpack_stream(const struct llmq_tensor_view *t, int64_t first, int64_t stride, int64_t n, int b,
                          int32_t *v) {
    uint32_t mask = (1u << b) - 1;
    for (int64_t i = 0; i < n; i++) {
        int64_t bit = i * b, word = bit / 32, off = bit % 32;
        uint64_t x = rd32(t, first + word * stride) >> off;
        if (off + b > 32) x |= (uint64_t)rd32(t, first + (word + 1) * stride) << (32 - off);
        v[i] = (int32_t)(x & mask);
    }
}

// Output rows [n0, n1) of one linear: W[n, c] = f32(q - z) * s (AWQ: n0, n1 multiples of 8).
struct deq_job {
    bool awq, nomem;
    const struct llmq_tensor_view *qw;
    int bits;
    int64_t R, C, n0, n1;
    const float *s;      // (ng, R) scales
    const int32_t *z;    // (ng, R) zero points
    const int32_t *gidx; // (C) group of each column
    float *W;            // (R, C) output
};

static void *deq_worker(void *arg) {
    struct deq_job *j = arg;
    int64_t R = j->R, C = j->C;
    if (j->awq) {
        for (int64_t c = 0; c < C; c++) {
            int64_t g = j->gidx[c];
            for (int64_t jj = j->n0 / 8; jj < j->n1 / 8; jj++) {
                uint32_t w = rd32(j->qw, c * (R / 8) + jj);
                for (int i = 0; i < 8; i++) {
                    int64_t n = 8 * jj + awq_order[i];
                    int32_t v = (int32_t)((w >> (4 * i)) & 15u);
                    j->W[n * C + c] = (float)(v - j->z[g * R + n]) * j->s[g * R + n];
                }
            }
        }
        return NULL;
    }
    int32_t *codes = malloc((size_t)C * sizeof *codes);
    if (!codes) {
        j->nomem = true;
        return NULL;
    }
    for (int64_t n = j->n0; n < j->n1; n++) {
        unpack_stream(j->qw, n, R, C, j->bits, codes); // column n of qweight, words R apart
        for (int64_t c = 0; c < C; c++) {
            int64_t g = j->gidx[c];
            j->W[n * C + c] = (float)(codes[c] - j->z[g * R + n]) * j->s[g * R + n];
        }
    }
    free(codes);
    return NULL;
}

// Dequantizes linear k of layer il (R, C) into an owned F32 view; x >= 0: expert x's gate / up / down (k 0, 1, 2)
// of a moe layer, under its HF name (model.layers.N.mlp.experts.X.gate_proj, ...).
static enum llmq_status dequant_linear(struct llmq_model *m, int il, int k, int64_t x, int64_t R, int64_t C,
                                       const struct llmq_tensor_view **out) {
    struct llmq_model_quant *q = (struct llmq_model_quant *)m->quant;
    const struct llmq_tensor_view *qw, *qz, *sc, *gi = NULL;
    int b = q->bits, G = q->group_size;
    int64_t ng = G > 0 ? (C + G - 1) / G : 1;
    float *W = NULL, *s = NULL;
    int32_t *z = NULL, *gidx = NULL;
    char prefix[160], name[160];
    enum llmq_status st;

    if (x < 0 && llmq_arch_info_of(m->hp.arch)->fused && k != LLMQ_LIN_O && k != LLMQ_LIN_DOWN) {
        llmq_tensor_full_name(m->hp.arch, LLMQ_T_LINEAR_0 + k, il, true, prefix, sizeof prefix); // qkv / gate_up
        prefix[strlen(prefix) - strlen(".weight")] = 0;
    } else if (x < 0) {
        llmq_arch_linear_full_name(m->hp.arch, k, il, true, prefix, sizeof prefix);
    } else {
        llmq_tensor_expert_hf_name(m->hp.arch, m->expert_names, LLMQ_T_FFN_GATE_EXPS + k, il, x, prefix, sizeof prefix);
        size_t len = strlen(prefix);
        if (len > 7 && strcmp(prefix + len - 7, ".weight") == 0) prefix[len - 7] = 0;
    }
    if (strcmp(q->method, "awq") == 0) {
        if (R % 8 != 0 || C % G != 0)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s (%lld x %lld) cannot be AWQ-packed with group %d", src_name(m),
                               prefix, (long long)R, (long long)C, G);
        if ((st = qtensor(m, prefix, "qweight", true, true, 2, C, R / 8, &qw)) ||
            (st = qtensor(m, prefix, "qzeros", true, true, 2, ng, R / 8, &qz)) ||
            (st = qtensor(m, prefix, "scales", false, true, 2, ng, R, &sc)))
            return st;
    } else {
        if ((C * b) % 32 != 0 || (R * b) % 32 != 0)
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s (%lld x %lld) cannot be GPTQ-packed at %d bits", src_name(m),
                               prefix, (long long)R, (long long)C, b);
        if ((st = qtensor(m, prefix, "qweight", true, true, 2, C * b / 32, R, &qw)) ||
            (st = qtensor(m, prefix, "qzeros", true, true, 2, ng, R * b / 32, &qz)) ||
            (st = qtensor(m, prefix, "scales", false, true, 2, ng, R, &sc)) ||
            (st = qtensor(m, prefix, "g_idx", true, false, 1, C, 0, &gi)))
            return st;
    }
    W = malloc((size_t)R * (size_t)C * sizeof *W);
    s = malloc((size_t)ng * (size_t)R * sizeof *s);
    z = malloc((size_t)ng * (size_t)R * sizeof *z);
    gidx = malloc((size_t)C * sizeof *gidx);
    if (!W || !s || !z || !gidx) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory dequantizing %s (%lld x %lld)", src_name(m), prefix,
                         (long long)R, (long long)C);
        goto fail;
    }
    if ((st = llmq_model_weight_f32(sc, s, 1))) goto fail;
    for (int64_t c = 0; c < C; c++) {
        gidx[c] = gi ? (int32_t)rd32(gi, c) : (int32_t)(G > 0 ? c / G : 0);
        if (gidx[c] < 0 || gidx[c] >= ng) {
            st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %s.g_idx[%lld] = %d is not a group (0..%lld)", src_name(m), prefix,
                             (long long)c, gidx[c], (long long)ng - 1);
            goto fail;
        }
    }
    bool awq = strcmp(q->method, "awq") == 0;
    if (awq) {
        for (int64_t g = 0; g < ng; g++)
            for (int64_t j = 0; j < R / 8; j++) {
                uint32_t w = rd32(qz, g * (R / 8) + j);
                for (int i = 0; i < 8; i++) z[g * R + 8 * j + awq_order[i]] = (int32_t)((w >> (4 * i)) & 15u);
            }
    } else {
        bool v1 = strcmp(q->checkpoint_format, "gptq") == 0;
        int64_t nw = R * b / 32;
        for (int64_t g = 0; g < ng; g++) {
            unpack_stream(qz, g * nw, 1, R, b, z + g * R);
            if (v1)
                for (int64_t n = 0; n < R; n++) z[g * R + n] += 1;
        }
    }
    // the codes, rows split over threads (each output element is computed once: any split gives the same bits)
    enum { MAX_THREADS = 16 };
    struct deq_job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = R * C < (1 << 18) || ncpu < 2 ? 1 : ncpu > MAX_THREADS ? MAX_THREADS : (int)ncpu;
    int64_t blocks = awq ? R / 8 : R, per = (blocks + nth - 1) / nth;
    for (int i = 0; i < nth; i++) {
        int64_t b0 = per * i < blocks ? per * i : blocks, b1 = b0 + per < blocks ? b0 + per : blocks;
        int64_t unit = awq ? 8 : 1;
        jobs[i] = (struct deq_job){.awq = awq,
                                   .qw = qw,
                                   .bits = b,
                                   .R = R,
                                   .C = C,
                                   .n0 = b0 * unit,
                                   .n1 = b1 * unit,
                                   .s = s,
                                   .z = z,
                                   .gidx = gidx,
                                   .W = W};
    }
    for (int i = 1; i < nth; i++) started[i] = pthread_create(&tid[i], NULL, deq_worker, &jobs[i]) == 0;
    deq_worker(&jobs[0]);
    for (int i = 1; i < nth; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            deq_worker(&jobs[i]);
    }
    for (int i = 0; i < nth; i++)
        if (jobs[i].nomem) {
            st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory dequantizing %s", src_name(m), prefix);
            goto fail;
        }
    const size_t vi = x < 0 ? (size_t)il * LLMQ_LIN_COUNT + (size_t)k
                            : (size_t)(m->hp.n_layer * LLMQ_LIN_COUNT + (il * m->hp.n_expert + x) * 3 + k);
    struct llmq_tensor_view *v = &q->views[vi];
    char *vname = strdup(name);
    if (!vname) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src_name(m));
        goto fail;
    }
    *v = (struct llmq_tensor_view){.name = vname,
                                   .dtype = LLMQ_DTYPE_F32,
                                   .n_dims = 2,
                                   .shape = {R, C, 1, 1},
                                   .data = W,
                                   .nbytes = (size_t)R * (size_t)C * sizeof *W,
                                   .file_offset = 0};
    q->n_dequantized++;
    q->bytes += v->nbytes;
    *out = v;
    W = NULL;
fail:
    free(W);
    free(s);
    free(z);
    free(gidx);
    return st;
}

// Reads config.json "quantization_config" (absent / null: m->quant stays NULL).
static enum llmq_status parse_quant(struct llmq_model *m, json_t *root, const char *file) {
    json_t *qc = json_object_get(root, "quantization_config");
    if (!qc || json_is_null(qc)) return LLMQ_OK;
    if (!json_is_object(qc)) return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"quantization_config\" is not an object", file);
    json_t *meth = json_object_get(qc, "quant_method"), *bits = json_object_get(qc, "bits");
    json_t *gs = json_object_get(qc, "group_size"), *fmt = json_object_get(qc, "checkpoint_format");
    json_t *ver = json_object_get(qc, "version"), *sym = json_object_get(qc, "sym");
    json_t *da = json_object_get(qc, "desc_act");
    if (!meth || !json_is_string(meth))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: quantization_config has no string \"quant_method\"", file);
    const char *mt = json_string_value(meth);
    bool awq = strcmp(mt, "awq") == 0;
    if (!awq && strcmp(mt, "gptq") != 0)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: quant_method \"%s\" is not supported (llmq reads awq and gptq)",
                           file, mt);
    if (!bits || !json_is_integer(bits) || !gs || !json_is_integer(gs))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: quantization_config needs integer \"bits\" and \"group_size\"", file);
    int64_t b = json_integer_value(bits), g = json_integer_value(gs);
    const char *cf = awq ? "gemm" : "gptq";
    if (awq && ver && !json_is_null(ver) && (!json_is_string(ver) || strcasecmp(json_string_value(ver), "gemm") != 0))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: AWQ version %s is not supported (only \"gemm\")", file,
                           json_is_string(ver) ? json_string_value(ver) : "(not a string)");
    if (!awq && fmt && !json_is_null(fmt)) {
        if (!json_is_string(fmt))
            return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: \"checkpoint_format\" is not a string", file);
        if (strcmp(json_string_value(fmt), "gptq") == 0)
            cf = "gptq";
        else if (strcmp(json_string_value(fmt), "gptq_v2") == 0)
            cf = "gptq_v2";
        else
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: checkpoint_format \"%s\" is not supported (gptq, gptq_v2)",
                               file, json_string_value(fmt));
    }
    if (awq ? b != 4 : (b != 2 && b != 3 && b != 4 && b != 8))
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: %s with %lld bits is not supported", file, mt, (long long)b);
    if (g == 0 || g < -1 || g > LLMQ_HPARAMS_MAX_DIM || (awq && g < 1))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: group_size %lld is out of range", file, (long long)g);
    struct llmq_model_quant *q = calloc(1, sizeof *q);
    const int64_t n_views = m->hp.n_layer * (LLMQ_LIN_COUNT + (m->hp.moe ? 3 * m->hp.n_expert : 0));
    if (!q || !(q->views = calloc((size_t)n_views, sizeof *q->views))) {
        free(q);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", file);
    }
    q->n_views = n_views;
    q->method = awq ? "awq" : "gptq";
    q->checkpoint_format = cf;
    q->bits = (int)b;
    q->group_size = (int)g;
    q->sym = sym && json_is_true(sym);
    q->desc_act = da && json_is_true(da);
    m->quant = q;
    return LLMQ_OK;
}

static void quant_free(const struct llmq_model_quant *cq) {
    struct llmq_model_quant *q = (struct llmq_model_quant *)cq;
    if (!q) return;
    for (int64_t i = 0; q->views && i < q->n_views; i++) {
        free((void *)q->views[i].data);
        free((char *)q->views[i].name);
    }
    free(q->views);
    free(q);
}

// An HF gemma norm (w, any dtype) as an owned F32 view of 1 + w (calib/model/model.h "Hyper-parameters").
static enum llmq_status shift_norm(struct llmq_model *m, const struct llmq_tensor_view **v) {
    int64_t n = (*v)->shape[0];
    float *d = malloc((size_t)n * sizeof *d);
    if (!d) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src_name(m));
    enum llmq_status st = llmq_model_rows_f32(*v, 0, 1, d);
    if (st) {
        free(d);
        return st;
    }
    for (int64_t i = 0; i < n; i++) d[i] = 1.0f + d[i];
    LLMQ_ASSERT(m->n_shifted < 1 + 6 * m->hp.n_layer);
    m->shifted[m->n_shifted++] = (struct llmq_tensor_view){.name = (*v)->name,
                                                           .dtype = LLMQ_DTYPE_F32,
                                                           .n_dims = 1,
                                                           .shape = {n, 1, 1, 1},
                                                           .data = d,
                                                           .nbytes = (size_t)n * sizeof *d};
    *v = &m->shifted[m->n_shifted - 1];
    return LLMQ_OK;
}

// A norm tensor of role `role` (shape (n)); an HF gemma model gets 1 + w (shift_norm).
static enum llmq_status get_norm(struct llmq_model *m, bool hf, enum llmq_tensor_role role, int64_t layer, int64_t n,
                                 const char *what, const struct llmq_tensor_view **out) {
    char name[128];
    enum llmq_status st =
        get_tensor(m, llmq_tensor_full_name(m->hp.arch, role, layer, hf, name, sizeof name), true, 1, n, 0, what, out);
    if (!st && hf && llmq_tensor_norm_shifted(m->hp.arch, role)) st = shift_norm(m, out);
    return st;
}

// phi3: views of rows [r0, r0 + n) of the fused tensor t (R, C) as linear k of layer il.
static enum llmq_status slice_rows(struct llmq_model *m, int il, int k, const struct llmq_tensor_view *t, int64_t r0,
                                   int64_t n, const struct llmq_tensor_view **out) {
    size_t row_bytes = 0;
    if (!llmq_dtype_nbytes(t->dtype, t->shape[1], &row_bytes))
        return llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rows of %s do not fit dtype %s", src_name(m), t->name,
                           llmq_dtype_name(t->dtype));
    struct llmq_tensor_view *v = &m->slices[(size_t)il * LLMQ_LIN_COUNT + (size_t)k];
    *v = *t;
    v->shape[0] = n;
    v->data = (const uint8_t *)t->data + (size_t)r0 * row_bytes;
    v->nbytes = (size_t)n * row_bytes;
    v->file_offset = t->file_offset + (uint64_t)r0 * row_bytes;
    *out = v;
    return LLMQ_OK;
}

// phi3: the fused q/k/v and gate/up tensors of layer il, split into the linears' row ranges.
static enum llmq_status bind_fused(struct llmq_model *m, bool hf, int il) {
    const struct llmq_hparams *hp = &m->hp;
    const int64_t D = hp->n_embd, F = hp->n_ff, Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim;
    const struct llmq_tensor_view *qkv, *gu;
    struct llmq_layer *L = &m->layers[il];
    char name[128];
    enum llmq_status st;
    if (m->quant && !find_tensor(m, llmq_tensor_full_name(hp->arch, LLMQ_T_LINEAR_0 + LLMQ_LIN_Q, il, hf, name,
                                                          sizeof name))) { // packed: dequantized now
        if ((st = dequant_linear(m, il, LLMQ_LIN_Q, -1, Dq + 2 * Dkv, D, &qkv)) ||
            (st = dequant_linear(m, il, LLMQ_LIN_UP, -1, 2 * F, D, &gu)))
            return st;
    } else if ((st = get_tensor(
                    m, llmq_tensor_full_name(hp->arch, LLMQ_T_LINEAR_0 + LLMQ_LIN_Q, il, hf, name, sizeof name), true,
                    2, Dq + 2 * Dkv, D, "(n_head + 2 n_head_kv) * head_dim, n_embd", &qkv)) ||
               (st = get_tensor(
                    m, llmq_tensor_full_name(hp->arch, LLMQ_T_LINEAR_0 + LLMQ_LIN_UP, il, hf, name, sizeof name), true,
                    2, 2 * F, D, "2 n_ff, n_embd", &gu)))
        return st;
    m->fused[2 * il] = qkv;
    m->fused[2 * il + 1] = gu;
    if ((st = slice_rows(m, il, LLMQ_LIN_Q, qkv, 0, Dq, &L->w[LLMQ_LIN_Q])) ||
        (st = slice_rows(m, il, LLMQ_LIN_K, qkv, Dq, Dkv, &L->w[LLMQ_LIN_K])) ||
        (st = slice_rows(m, il, LLMQ_LIN_V, qkv, Dq + Dkv, Dkv, &L->w[LLMQ_LIN_V])) ||
        (st = slice_rows(m, il, LLMQ_LIN_GATE, gu, 0, F, &L->w[LLMQ_LIN_GATE])) ||
        (st = slice_rows(m, il, LLMQ_LIN_UP, gu, F, F, &L->w[LLMQ_LIN_UP])))
        return st;
    return LLMQ_OK;
}

// moe: the router and every expert's gate / up / down of layer il (calib/model/model.h "Mixture of experts").
static enum llmq_status bind_experts(struct llmq_model *m, bool hf, int il) {
    const struct llmq_hparams *hp = &m->hp;
    const int64_t D = hp->n_embd, E = hp->n_expert, Fe = hp->n_ff_exp;
    const int64_t shape[3][2] = {{Fe, D}, {Fe, D}, {D, Fe}};
    const char *what[3] = {"n_ff_exp, n_embd", "n_ff_exp, n_embd", "n_embd, n_ff_exp"};
    const struct llmq_tensor_view **p = m->exp_ptrs + (size_t)il * (size_t)E * 3;
    struct llmq_layer *L = &m->layers[il];
    char name[160];
    enum llmq_status st;
    if (hf && il == 0) { // the spelling: the Hub's router where it is, else GPTQModel's (see "Mixture of experts")
        m->expert_names = LLMQ_EXPERT_NAMES_HUB;
        if (!find_tensor(m, llmq_tensor_router_hf_name(hp->arch, LLMQ_EXPERT_NAMES_HUB, 0, name, sizeof name)) &&
            find_tensor(m, llmq_tensor_router_hf_name(hp->arch, LLMQ_EXPERT_NAMES_GPTQMODEL, 0, name, sizeof name)))
            m->expert_names = LLMQ_EXPERT_NAMES_GPTQMODEL;
    }
    if (hf)
        llmq_tensor_router_hf_name(hp->arch, m->expert_names, il, name, sizeof name);
    else
        llmq_tensor_full_name(hp->arch, LLMQ_T_FFN_GATE_INP, il, false, name, sizeof name);
    if ((st = get_tensor(m, name, true, 2, E, D, "n_expert, n_embd", &L->router))) return st;
    L->exps = p;
    for (int k = 0; k < 3; k++) {
        enum llmq_tensor_role role = LLMQ_T_FFN_GATE_EXPS + k;
        if (hf) {
            for (int64_t x = 0; x < E; x++) {
                llmq_tensor_expert_hf_name(hp->arch, m->expert_names, role, il, x, name, sizeof name);
                if (m->quant && !find_tensor(m, name)) // an AWQ / GPTQ expert: dequantized now
                    st = dequant_linear(m, il, k, x, shape[k][0], shape[k][1], &p[3 * x + k]);
                else
                    st = get_tensor(m, name, true, 2, shape[k][0], shape[k][1], what[k], &p[3 * x + k]);
                if (st) return st;
            }
            continue;
        }
        const struct llmq_tensor_view *t =
            find_tensor(m, llmq_tensor_full_name(hp->arch, role, il, false, name, sizeof name));
        size_t row_bytes = 0;
        if (!t) return llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s", src_name(m), name);
        if (t->n_dims != 3 || t->shape[0] != E || t->shape[1] != shape[k][0] || t->shape[2] != shape[k][1]) {
            char got[96];
            llmq_tensor_shape_str(t, got, sizeof got);
            return llmq_errorf(LLMQ_ERR_CORRUPT,
                               "%s: tensor %s has shape %s, expected [%lld, %lld, %lld] (n_expert, %s)", src_name(m),
                               name, got, (long long)E, (long long)shape[k][0], (long long)shape[k][1], what[k]);
        }
        const struct llmq_dtype_traits *tr = llmq_dtype_traits(t->dtype);
        if (!tr || !tr->can_dequant || !llmq_dtype_nbytes(t->dtype, shape[k][1], &row_bytes))
            return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s, which llmq cannot convert to f32",
                               src_name(m), name, llmq_dtype_name(t->dtype));
        for (int64_t x = 0; x < E; x++) {
            struct llmq_tensor_view *v = &m->exp_slices[((size_t)il * (size_t)E + (size_t)x) * 3 + (size_t)k];
            size_t off = (size_t)x * (size_t)shape[k][0] * row_bytes;
            *v = *t;
            v->n_dims = 2;
            v->shape[0] = shape[k][0];
            v->shape[1] = shape[k][1];
            v->shape[2] = 1;
            v->data = (const uint8_t *)t->data + off;
            v->nbytes = (size_t)shape[k][0] * row_bytes;
            v->file_offset = t->file_offset + off;
            p[3 * x + k] = v;
        }
    }
    return LLMQ_OK;
}

// qwen2_moe: the shared expert's gate of layer il, (1, D) or (D) in the file, as a (1, D) view (m->shexp_views).
static enum llmq_status bind_shexp_gate(struct llmq_model *m, bool hf, int il) {
    const int64_t D = m->hp.n_embd;
    char name[128];
    llmq_tensor_full_name(m->hp.arch, LLMQ_T_FFN_GATE_INP_SHEXP, il, hf, name, sizeof name);
    const struct llmq_tensor_view *t = find_tensor(m, name);
    enum llmq_status st = t && t->n_dims == 1 ? get_tensor(m, name, true, 1, D, 0, "n_embd", &t)
                                              : get_tensor(m, name, true, 2, 1, D, "1, n_embd", &t);
    if (st) return st;
    struct llmq_tensor_view *v = &m->shexp_views[il];
    *v = *t;
    v->n_dims = 2;
    v->shape[0] = 1;
    v->shape[1] = D;
    m->layers[il].shexp_gate = v;
    return LLMQ_OK;
}

// Finds and checks every weight under its name in the source format (hf: HF spelling, else GGUF).
static enum llmq_status bind_tensors(struct llmq_model *m, bool hf) {
    const struct llmq_hparams *hp = &m->hp;
    int64_t D = hp->n_embd, F = hp->shexp ? hp->n_ff_shexp : hp->n_ff, V = hp->n_vocab;
    int64_t Dq = hp->n_head * hp->head_dim, Dkv = hp->n_head_kv * hp->head_dim;
    enum llmq_status st;
    char name[128];

#define NAME(role, l) llmq_tensor_full_name(hp->arch, (role), (l), hf, name, sizeof name)
    if (hf && hp->gemma && !(m->shifted = calloc((size_t)(1 + 6 * hp->n_layer), sizeof *m->shifted)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src_name(m));
    const bool fused = llmq_arch_info_of(hp->arch)->fused;
    if (fused && (!(m->slices = calloc((size_t)hp->n_layer * LLMQ_LIN_COUNT, sizeof *m->slices)) ||
                  !(m->fused = calloc((size_t)hp->n_layer * 2, sizeof *m->fused))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src_name(m));
    const size_t n_exp = hp->moe ? (size_t)hp->n_layer * (size_t)hp->n_expert * 3 : 0;
    if (hp->moe && (!(m->exp_ptrs = calloc(n_exp, sizeof *m->exp_ptrs)) ||
                    (!hf && !(m->exp_slices = calloc(n_exp, sizeof *m->exp_slices)))))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src_name(m));
    if (hp->shexp && !(m->shexp_views = calloc((size_t)hp->n_layer, sizeof *m->shexp_views)))
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", src_name(m));
    if ((st = get_tensor(m, NAME(LLMQ_T_TOK_EMBD, 0), true, 2, V, D, "n_vocab, n_embd", &m->tok_embd))) return st;
    if ((st = get_norm(m, hf, LLMQ_T_OUTPUT_NORM, 0, D, "n_embd", &m->output_norm))) return st;
    if (hp->tied_embeddings)
        m->output = m->tok_embd;
    else if ((st = get_tensor(m, NAME(LLMQ_T_OUTPUT, 0), true, 2, V, D, "n_vocab, n_embd", &m->output)))
        return st;

    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory for %lld layers", src_name(m), (long long)hp->n_layer);
    const int64_t wshape[LLMQ_LIN_COUNT][2] = {{Dq, D}, {Dkv, D}, {Dkv, D}, {D, Dq}, {F, D}, {F, D}, {D, F}};
    const char *wwhat[LLMQ_LIN_COUNT] = {"n_head*head_dim, n_embd",
                                         "n_head_kv*head_dim, n_embd",
                                         "n_head_kv*head_dim, n_embd",
                                         "n_embd, n_head*head_dim",
                                         "n_ff, n_embd",
                                         "n_ff, n_embd",
                                         "n_embd, n_ff"};
    for (int il = 0; il < hp->n_layer; il++) {
        struct llmq_layer *L = &m->layers[il];
        if ((st = get_norm(m, hf, LLMQ_T_ATTN_NORM, il, D, "n_embd", &L->attn_norm)) ||
            (st = get_norm(m, hf, LLMQ_T_FFN_NORM, il, D, "n_embd", &L->ffn_norm)))
            return st;
        if (hp->gemma && ((st = get_norm(m, hf, LLMQ_T_ATTN_POST_NORM, il, D, "n_embd", &L->attn_post_norm)) ||
                          (st = get_norm(m, hf, LLMQ_T_FFN_POST_NORM, il, D, "n_embd", &L->ffn_post_norm))))
            return st;
        if (fused && (st = bind_fused(m, hf, il))) return st;
        if (hp->moe && (st = bind_experts(m, hf, il))) return st;
        if (hp->shexp && (st = bind_shexp_gate(m, hf, il))) return st;
        for (int k = 0; k < LLMQ_LIN_COUNT; k++) {
            if (fused && k != LLMQ_LIN_O && k != LLMQ_LIN_DOWN) continue; // bound by bind_fused
            if (hp->moe && !hp->shexp && k >= LLMQ_LIN_GATE) continue;    // experts: bound by bind_experts
            NAME(LLMQ_T_LINEAR_0 + k, il);
            if (m->quant && !find_tensor(m, name)) { // an AWQ / GPTQ linear: dequantize it now
                if ((st = dequant_linear(m, il, k, -1, wshape[k][0], wshape[k][1], &L->w[k]))) return st;
                continue;
            }
            if ((st = get_tensor(m, name, true, 2, wshape[k][0], wshape[k][1], wwhat[k], &L->w[k]))) return st;
        }
        if (hp->qkv_bias) {
            const struct llmq_tensor_view **b[3] = {&L->bq, &L->bk, &L->bv};
            for (int k = 0; k < 3; k++) {
                if ((st = get_tensor(m, NAME(LLMQ_T_BIAS_Q + k, il), true, 1, wshape[k][0], 0,
                                     k ? "n_head_kv*head_dim" : "n_head*head_dim", b[k])))
                    return st;
            }
        }
        if (hp->qk_norm && ((st = get_norm(m, hf, LLMQ_T_ATTN_Q_NORM, il, hp->head_dim, "head_dim", &L->q_norm)) ||
                            (st = get_norm(m, hf, LLMQ_T_ATTN_K_NORM, il, hp->head_dim, "head_dim", &L->k_norm))))
            return st;
    }
#undef NAME
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// GGUF
// ---------------------------------------------------------------------------------------------

static enum llmq_status load_gguf(struct llmq_model *m) {
    struct llmq_gguf *g = NULL;
    struct llmq_hparams *hp = &m->hp;
    enum llmq_status st = llmq_gguf_open(m->path, &g);
    if (st) return st;
    m->gguf = g;
    m->from_gguf = true;
    if ((st = llmq_hparams_from_gguf(g, 0, hp))) return st;
    m->arch_name = llmq_arch_name(hp->arch);
    if ((st = check_forward(hp, m->path))) return st;
    const struct llmq_gguf_tensor *rf = llmq_gguf_find_tensor(g, LLMQ_GGUF_ROPE_FREQS);
    if (rf) {
        const struct llmq_tensor_view *v = NULL;
        if ((st = get_tensor(m, LLMQ_GGUF_ROPE_FREQS, true, 1, hp->n_rot / 2, 0, "n_rot/2", &v))) return st;
        m->rope_freqs = v;
    }
    if ((st = bind_tensors(m, false))) return st;
    if (llmq_gguf_find_kv(g, "tokenizer.ggml.model")) {
        if ((st = llmq_tokenizer_load_gguf(g, &m->tok))) return st;
    } else {
        llmq_warn("%s: no tokenizer.ggml.model key: the model has no tokenizer", m->path);
    }
    return LLMQ_OK;
}

// ---------------------------------------------------------------------------------------------
// HF directory
// ---------------------------------------------------------------------------------------------

static enum llmq_status load_hf(struct llmq_model *m) {
    struct llmq_hparams *hp = &m->hp;
    json_t *cfg = NULL;
    char *cfg_path = NULL, *tok_path = NULL;
    enum llmq_status st;
    struct llmq_st_model *stm = NULL;
    const char *emb_name = llmq_tensor_hf_name(LLMQ_ARCH_LLAMA, LLMQ_T_TOK_EMBD); // the same in every family

    if ((st = llmq_hf_config_load(m->path, &cfg, &cfg_path))) goto done;
    if ((st = llmq_hparams_from_hf_config(cfg_path, cfg, 0, hp))) goto done;
    m->arch_name = llmq_arch_name(hp->arch);
    if ((st = check_forward(hp, cfg_path))) goto done;

    if ((st = llmq_st_open(m->path, &stm))) goto done;
    m->st = stm;
    const struct llmq_tensor_view *emb = llmq_st_get(stm, emb_name);
    if (!emb) {
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing tensor %s", m->path, emb_name);
        goto done;
    }
    int64_t vocab_cfg = hp->n_vocab; // 0: config.json has no vocab_size
    hp->n_vocab = emb->n_dims == 2 ? emb->shape[0] : vocab_cfg;
    if (vocab_cfg && vocab_cfg != hp->n_vocab) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: vocab_size = %lld but %s has %lld rows", cfg_path, (long long)vocab_cfg,
                         emb_name, (long long)hp->n_vocab);
        goto done;
    }
    if ((st = llmq_hparams_check(hp, cfg_path))) goto done;
    if ((st = parse_quant(m, cfg, cfg_path))) goto done;
    if ((st = bind_tensors(m, true))) goto done;
    if (!(tok_path = llmq_path_join(m->path, "tokenizer.json"))) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", m->path);
        goto done;
    }
    if (llmq_file_exists(tok_path)) {
        if ((st = llmq_tokenizer_load_hf(m->path, &m->tok))) goto done;
    } else {
        llmq_warn("%s: no tokenizer.json: the model has no tokenizer", m->path);
    }
done:
    json_decref(cfg);
    free(cfg_path);
    free(tok_path);
    return st;
}

// ---------------------------------------------------------------------------------------------

enum llmq_status llmq_model_load(const char *path, struct llmq_model **out) {
    enum llmq_status st;
    struct llmq_model *m = NULL;
    *out = NULL;
    if (!path || !*path) return llmq_errorf(LLMQ_ERR_ARG, "model path is empty");
    m = calloc(1, sizeof *m);
    char *p = m ? strdup(path) : NULL;
    if (!p) {
        free(m);
        return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    }
    m->path = p;
    if (llmq_is_dir(path))
        st = load_hf(m);
    else if (llmq_file_exists(path))
        st = load_gguf(m);
    else
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no such file or directory", path);
    if (st == LLMQ_OK && m->tok && llmq_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: the tokenizer has %d tokens but the embedding only %lld rows", path,
                         (int)llmq_tokenizer_n_vocab(m->tok), (long long)m->hp.n_vocab);
    }
    if (st != LLMQ_OK) {
        llmq_model_free(m);
        return st;
    }
    *out = m;
    return LLMQ_OK;
}

void llmq_model_free(struct llmq_model *m) {
    if (!m) return;
    llmq_tokenizer_free(m->tok);
    quant_free(m->quant);
    for (int64_t i = 0; i < m->n_shifted; i++) free((void *)m->shifted[i].data);
    free(m->shifted);
    free(m->slices);
    free(m->fused);
    free(m->exp_slices);
    free(m->exp_ptrs);
    free(m->shexp_views);
    free(m->layers);
    llmq_gguf_free((struct llmq_gguf *)m->gguf);
    llmq_st_free((struct llmq_st_model *)m->st);
    free((char *)m->path);
    free(m);
}
