// formats/hf/hfdir.c — a Hugging Face model directory as llmq writes one (formats/hf/hfdir.h): the
// hyper-parameters as the HF side reads them, the non-tensor files, the GGUF keys of an HF directory and
// the staging of an output directory. Shared by formats/convert/convert.c and quant/'s writers.
#include "formats/hf/hfdir.h"

#include "common/io.h"
#include "common/log.h"
#include "formats/ggml/quants.h"
#include "formats/hf/vocab.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_CTX_ABSENT 2048 // context_length / max_position_embeddings absent: written as 2048

// ---- hyper-parameters ------------------------------------------------------------------------------------

// Recovers llama3 rope-scaling parameters from a rope_freqs.weight tensor (low_freq_factor fixed to
// 1, the rest fitted), accepted only when calib/model/model.h regenerates the tensor from them.
static enum llmq_status fit_llama3(const char *path, const struct llmq_tensor_view *t, struct llmq_hparams *hp) {
    int64_t half = hp->n_rot / 2;
    enum llmq_status st = LLMQ_OK;
    float *ff = malloc((size_t)half * sizeof(float)), *re = malloc((size_t)half * sizeof(float));
    if (!ff || !re) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (llmq_tensor_nelements(t) != half || !llmq_dtype_traits(t->dtype)->can_dequant ||
        (st = llmq_dequantize_row(t->dtype, t->data, ff, half))) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: rope_freqs.weight: expected %lld decodable values", path,
                         (long long)half);
        goto done;
    }
    float factor = 1.0f;
    for (int64_t i = 0; i < half; i++) factor = ff[i] > factor ? ff[i] : factor;
    if (factor == 1.0f) { // all ones: no scaling at all
        hp->rope_scaling.type = LLMQ_ROPE_SCALING_NONE;
        goto done;
    }
    // band points: 1 < ff < factor, s = (1/ff - 1/factor) / (1 - 1/factor) = L / ((hi - 1) wavelen) - 1 / (hi - 1)
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int n = 0;
    for (int64_t i = 0; i < half; i++) {
        if (!(ff[i] > 1.0f && ff[i] < factor)) continue;
        double freq = 1.0 / pow(hp->rope_theta, (double)(2 * i) / (double)hp->n_rot);
        double x = freq / (2.0 * M_PI), y = (1.0 / ff[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
    }
    struct llmq_hparams mh = *hp;
    mh.rope_scaling.type = LLMQ_ROPE_SCALING_LLAMA3;
    mh.rope_scaling.factor = factor;
    mh.rope_scaling.low_freq_factor = 1.0f;
    double a = 0, b = 0;
    if (n >= 2 && n * sxx - sx * sx != 0) {
        a = (n * sxy - sx * sy) / (n * sxx - sx * sx);
        b = -(sy - a * sx) / n;
    }
    if (a > 0 && b > 0) {
        mh.rope_scaling.high_freq_factor = (float)(round((1.0 + 1.0 / b) * 1000.0) / 1000.0);
        mh.rope_scaling.original_max_pos = (int64_t)llround(a / b);
    } else { // too few band points to fit: Llama 3.1's values
        mh.rope_scaling.high_freq_factor = 4.0f;
        mh.rope_scaling.original_max_pos = 8192;
    }
    llmq_rope_llama3_factors(&mh, re);
    for (int64_t i = 0; i < half; i++)
        if (fabsf(re[i] - ff[i]) > 1e-6f * fabsf(ff[i])) {
            st = llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                             "%s: rope_freqs.weight does not follow llama3 rope scaling (value %lld: %g, fitted %g): "
                             "config.json cannot express it",
                             path, (long long)i, (double)ff[i], (double)re[i]);
            goto done;
        }
    hp->rope_scaling = mh.rope_scaling;
done:
    free(ff);
    free(re);
    return st;
}

enum llmq_status llmq_hf_hparams_from_gguf(const struct llmq_gguf *g, struct llmq_hparams *hp) {
    const char *path = llmq_gguf_path(g);
    enum llmq_status st = llmq_hparams_from_gguf(g, N_CTX_ABSENT, hp);
    if (st) return st;
    if (hp->arch == LLMQ_ARCH_MISTRAL)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED,
                           "%s: architecture \"%s\" is not supported (llama, qwen2, qwen3, gemma2, gemma3, phi3)", path,
                           llmq_arch_name(hp->arch));
    const struct llmq_gguf_tensor *rf = llmq_gguf_find_tensor(g, LLMQ_GGUF_ROPE_FREQS);
    if (!rf) return LLMQ_OK;
    if (hp->rope_scaling.type != LLMQ_ROPE_SCALING_NONE)
        return llmq_errorf(LLMQ_ERR_UNSUPPORTED, "%s: rope_freqs.weight together with %s.rope.scaling.type", path,
                           llmq_arch_name(hp->arch));
    return fit_llama3(path, &rf->view, hp);
}

enum llmq_status llmq_hf_hparams_from_dir(const char *dir, json_t **cfg, struct llmq_hparams *hp) {
    char *path = NULL;
    enum llmq_status st = llmq_hf_config_load(dir, cfg, &path);
    if (!st) st = llmq_hparams_from_hf_config(path, *cfg, N_CTX_ABSENT, hp);
    if (!st && hp->n_vocab == 0) st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: missing key \"vocab_size\"", path);
    free(path);
    return st;
}

const char *llmq_hf_model_name(const char *in, char *buf, size_t size) {
    size_t len = strlen(in);
    while (len > 1 && in[len - 1] == '/') len--;
    const char *base = in + len;
    while (base > in && base[-1] != '/') base--;
    snprintf(buf, size, "%.*s", (int)(in + len - base), base);
    return buf;
}

// ---- the non-tensor files --------------------------------------------------------------------------------

static const char *torch_dtype(enum llmq_dtype d) {
    return d == LLMQ_DTYPE_F16 ? "float16" : d == LLMQ_DTYPE_BF16 ? "bfloat16" : "float32";
}

enum llmq_status llmq_hf_files_from_gguf(const struct llmq_gguf *g, const struct llmq_hparams *hp,
                                         enum llmq_dtype dtype, struct llmq_hf_files *out) {
    const char *in = llmq_gguf_path(g);
    struct cv_vocab v = {0};
    memset(out, 0, sizeof(*out));
    enum llmq_status st = cv_vocab_from_gguf(g, &v);
    if (st) goto done;
    if (v.n != hp->n_vocab) {
        st = llmq_errorf(LLMQ_ERR_CORRUPT, "%s: %lld tokens but token_embd.weight has %lld rows", in, (long long)v.n,
                         (long long)hp->n_vocab);
        goto done;
    }
    if ((st = cv_vocab_to_hf(&v, in, hp->n_ctx_train, &out->tokenizer, &out->tokenizer_config))) goto done;
    out->config =
        llmq_hparams_to_hf_config(hp, v.special[CV_BOS], v.special[CV_EOS], v.special[CV_PAD], torch_dtype(dtype));
    out->generation = json_pack("{s:b}", "_from_model_config", 1);
    json_t *gen = out->generation;
    if (v.special[CV_BOS] >= 0) json_object_set_new(gen, "bos_token_id", json_integer(v.special[CV_BOS]));
    if (v.special[CV_EOS] >= 0) json_object_set_new(gen, "eos_token_id", json_integer(v.special[CV_EOS]));
    if (v.special[CV_PAD] >= 0) json_object_set_new(gen, "pad_token_id", json_integer(v.special[CV_PAD]));
done:
    if (st) llmq_hf_files_free(out);
    cv_vocab_free(&v);
    return st;
}

enum llmq_status llmq_hf_files_write(const struct llmq_hf_files *f, const char *dir, bool with_config) {
    enum llmq_status st = LLMQ_OK;
    if ((with_config && (st = llmq_hf_write_json(dir, "config.json", f->config))) ||
        (st = llmq_hf_write_json(dir, "generation_config.json", f->generation)) ||
        (st = llmq_hf_write_json(dir, "tokenizer.json", f->tokenizer)) ||
        (st = llmq_hf_write_json(dir, "tokenizer_config.json", f->tokenizer_config)))
        return st;
    return LLMQ_OK;
}

void llmq_hf_files_free(struct llmq_hf_files *f) {
    json_decref(f->config);
    json_decref(f->generation);
    json_decref(f->tokenizer);
    json_decref(f->tokenizer_config);
    memset(f, 0, sizeof(*f));
}

// Copies in_dir/name to out_dir/name when it exists (atomically).
static enum llmq_status copy_side_file(const char *in_dir, const char *out_dir, const char *name) {
    char *src = llmq_path_join(in_dir, name), *dst = llmq_path_join(out_dir, name), *data = NULL;
    struct llmq_afile f = {0};
    size_t n = 0;
    enum llmq_status st = LLMQ_OK;
    if (!src || !dst) {
        st = llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", in_dir);
        goto done;
    }
    if (!llmq_file_exists(src)) goto done;
    if ((st = llmq_read_file(src, 1u << 30, &data, &n))) goto done;
    if ((st = llmq_afile_open(&f, dst))) goto done;
    if ((st = llmq_afile_write(&f, data, n))) {
        llmq_afile_abort(&f);
        goto done;
    }
    st = llmq_afile_commit(&f);
done:
    free(data);
    free(src);
    free(dst);
    return st;
}

enum llmq_status llmq_hf_side_files(const char *in, const char *dir, enum llmq_dtype dtype,
                                    const json_t *config_extra) {
    static const char *copied[] = {"generation_config.json",
                                   "tokenizer.json",
                                   "tokenizer_config.json",
                                   "special_tokens_map.json",
                                   "added_tokens.json",
                                   "tokenizer.model",
                                   "vocab.json",
                                   "merges.txt",
                                   "chat_template.jinja",
                                   "chat_template.json"};
    struct llmq_gguf *g = NULL;
    struct llmq_hf_files f = {0};
    struct llmq_hparams hp;
    json_t *cfg = NULL;
    enum llmq_status st = LLMQ_OK;

    if (llmq_is_dir(in)) {
        if ((st = llmq_hf_config_load(in, &cfg, NULL))) goto done;
        for (size_t i = 0; i < sizeof copied / sizeof copied[0]; i++)
            if ((st = copy_side_file(in, dir, copied[i]))) goto done;
        json_object_del(cfg, "quantization_config");
        json_object_set_new(cfg, "torch_dtype", json_string(torch_dtype(dtype)));
    } else {
        if ((st = llmq_gguf_open(in, &g)) || (st = llmq_hf_hparams_from_gguf(g, &hp)) ||
            (st = llmq_hf_files_from_gguf(g, &hp, dtype, &f)) || (st = llmq_hf_files_write(&f, dir, false)))
            goto done;
        cfg = json_incref(f.config);
    }
    if (config_extra && json_object_update(cfg, (json_t *)config_extra) != 0) {
        st = llmq_errorf(LLMQ_ERR_ARG, "%s: config.json additions are not a JSON object", dir);
        goto done;
    }
    st = llmq_hf_write_json(dir, "config.json", cfg);
done:
    json_decref(cfg);
    llmq_hf_files_free(&f);
    llmq_gguf_free(g);
    return st;
}

enum llmq_status llmq_hf_gguf_kvs(const char *in, int64_t file_type, struct llmq_gguf_writer *w) {
    struct cv_vocab v = {0};
    struct llmq_hparams hp;
    json_t *cfg = NULL;
    char name[256];
    enum llmq_status st;
    if (!(st = llmq_hf_hparams_from_dir(in, &cfg, &hp)) && !(st = cv_vocab_from_hf(in, cfg, hp.n_vocab, &v)) &&
        !(st = llmq_hparams_to_gguf(w, &hp, llmq_hf_model_name(in, name, sizeof name), file_type)))
        st = cv_vocab_write_gguf(&v, w);
    cv_vocab_free(&v);
    json_decref(cfg);
    return st;
}

// ---- staging -----------------------------------------------------------------------------------------------

enum llmq_status llmq_hf_write_json(const char *dir, const char *name, const json_t *j) {
    char *path = llmq_path_join(dir, name);
    if (!path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    enum llmq_status st = llmq_write_json(path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    free(path);
    return st;
}

enum llmq_status llmq_hf_stage_create(const char *out, char **tmp) { return llmq_outdir_create(out, tmp); }

enum llmq_status llmq_hf_stage_prepare(const char *in, const char *out, bool force, char **tmp, bool *replace) {
    *tmp = NULL;
    *replace = false;
    enum llmq_status st = llmq_output_check(in, out, true, force, replace);
    return st ? st : llmq_hf_stage_create(out, tmp);
}

enum llmq_status llmq_hf_stage_publish(const char *tmp, const char *out, bool replace) {
    return llmq_outdir_publish(tmp, out, replace);
}
