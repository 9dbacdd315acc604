/*
 * tests/tools/synth_ckpt.c — a synthetic Hugging Face checkpoint of a named shape: random bf16 weights,
 * seeded, sharded safetensors, config.json, for scale tests and benchmarks (bench/scale.sh, the GPU
 * pipeline's device runs) where downloading a real 8B / 70B checkpoint is not an option.
 *
 *   synth_ckpt --shape NAME --out DIR [--layers N] [--seed S] [--shard-bytes B] [--tokenizer DIR]
 *              [--vocab V] [--force] [--list]
 *
 * Shapes (LlamaForCausalLM; the published parameter counts are what --list prints for the full depth):
 *   name            D     L   heads kv  FF     vocab   tied  params
 *   tiny            64    2   4     2   128    512     no    (tests)
 *   small           256   6   4     2   512    512     no    (tests: k-quant, AWQ and GPTQ packing tile it)
 *   smollm2-135m    576   30  9     3   1536   49152   yes   134,515,008
 *   llama-3-8b      4096  32  32    8   14336  128256  no    8,030,261,248
 *   llama-3-70b     8192  80  64    8   28672  128256  no    70,553,706,496
 * --layers N keeps the first N blocks (a 70B limited to 4 layers is 5.5 B parameters, 2.1 B of them the
 * embedding and the head). --vocab V overrides the vocabulary (e.g. to a tokenizer's size).
 *
 * Values: every linear and the embedding uniform in [-a, a) with a = sqrt(3) * 0.02 (std 0.02, the
 * transformers init std), norm weights 1 + uniform * 0.1, each tensor from its own xorshift64 stream
 * seeded by (seed, tensor index), so a tensor's bytes do not depend on --layers, and the same command
 * writes the same bytes. Not a trained model: its perplexity is that of noise, its activations have
 * no outliers; it measures memory and time, not quality.
 *
 * --tokenizer DIR copies DIR/tokenizer.json and DIR/tokenizer_config.json (when present), so that
 * text calibration runs on the synthetic model (a tokenizer with fewer tokens than the vocabulary is
 * accepted by llmq). --list prints the tensors and the totals without writing anything. The output
 * directory is refused when it exists, unless --force (then only the checkpoint files are replaced:
 * formats/safetensors.h's writer). Exit 0 on success, 1 on a failure (one line naming the path),
 * 2 on a usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/io.h"
#include "formats/safetensors.h"
#include "tests/util.h"

struct shape {
    const char *name;
    int64_t D, L, n_head, n_kv, FF, vocab;
    bool tied;
    double rope_theta;
    int64_t max_pos;
};

static const struct shape SHAPES[] = {
    {"tiny", 64, 2, 4, 2, 128, 512, false, 10000.0, 2048},
    {"small", 256, 6, 4, 2, 512, 512, false, 10000.0, 2048},
    {"smollm2-135m", 576, 30, 9, 3, 1536, 49152, true, 100000.0, 8192},
    {"llama-3-8b", 4096, 32, 32, 8, 14336, 128256, false, 500000.0, 8192},
    {"llama-3-70b", 8192, 80, 64, 8, 28672, 128256, false, 500000.0, 8192},
};
#define N_SHAPES (sizeof SHAPES / sizeof SHAPES[0])

enum kind { KIND_LINEAR, KIND_NORM };

struct tensor {
    char name[96];
    int n_dims;
    int64_t shape[2];
    enum kind kind;
    uint64_t index; // stream id: position in the full-depth layout
};

static int usage(const char *msg) {
    if (msg) fprintf(stderr, "synth_ckpt: %s\n", msg);
    fprintf(stderr, "usage: synth_ckpt --shape NAME --out DIR [--layers N] [--seed S] [--shard-bytes B]\n"
                    "                  [--tokenizer DIR] [--vocab V] [--force] [--list]\n"
                    "shapes:");
    for (size_t i = 0; i < N_SHAPES; i++) fprintf(stderr, " %s", SHAPES[i].name);
    fprintf(stderr, "\n");
    return 2;
}

static void add(struct tensor *t, int64_t *n, const char *name, int n_dims, int64_t d0, int64_t d1, enum kind k,
                uint64_t index) {
    struct tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->n_dims = n_dims;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->kind = k;
    x->index = index;
}

// The tensors in the order transformers' state_dict lists them. Per block 9 stream ids, so that a
// block's streams do not depend on how many blocks are kept.
static int64_t layout(const struct shape *s, int64_t L, struct tensor *t) {
    const int64_t hd = s->D / s->n_head, q = s->n_head * hd, kv = s->n_kv * hd;
    int64_t n = 0;
    char nm[96];
    add(t, &n, "model.embed_tokens.weight", 2, s->vocab, s->D, KIND_LINEAR, 0);
    for (int64_t l = 0; l < L; l++) {
        const uint64_t b = 16 + (uint64_t)l * 9;
        struct {
            const char *suffix;
            int n_dims;
            int64_t d0, d1;
            enum kind k;
        } blk[9] = {
            {"input_layernorm.weight", 1, s->D, 0, KIND_NORM},
            {"self_attn.q_proj.weight", 2, q, s->D, KIND_LINEAR},
            {"self_attn.k_proj.weight", 2, kv, s->D, KIND_LINEAR},
            {"self_attn.v_proj.weight", 2, kv, s->D, KIND_LINEAR},
            {"self_attn.o_proj.weight", 2, s->D, q, KIND_LINEAR},
            {"post_attention_layernorm.weight", 1, s->D, 0, KIND_NORM},
            {"mlp.gate_proj.weight", 2, s->FF, s->D, KIND_LINEAR},
            {"mlp.up_proj.weight", 2, s->FF, s->D, KIND_LINEAR},
            {"mlp.down_proj.weight", 2, s->D, s->FF, KIND_LINEAR},
        };
        for (int i = 0; i < 9; i++) {
            snprintf(nm, sizeof nm, "model.layers.%" PRId64 ".%s", l, blk[i].suffix);
            add(t, &n, nm, blk[i].n_dims, blk[i].d0, blk[i].d1, blk[i].k, b + (uint64_t)i);
        }
    }
    add(t, &n, "model.norm.weight", 1, s->D, 0, KIND_NORM, 1);
    if (!s->tied) add(t, &n, "lm_head.weight", 2, s->vocab, s->D, KIND_LINEAR, 2);
    return n;
}

static int64_t numel(const struct tensor *t) { return t->n_dims == 1 ? t->shape[0] : t->shape[0] * t->shape[1]; }

static int write_config(const char *dir, const struct shape *s, int64_t L) {
    char *path = llmq_path_join(dir, "config.json");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) {
        fprintf(stderr, "synth_ckpt: %s: cannot create: %s\n", path ? path : dir, strerror(errno));
        free(path);
        return 1;
    }
    fprintf(f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"hidden_size\": %" PRId64 ",\n  \"intermediate_size\": %" PRId64 ",\n"
            "  \"num_hidden_layers\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64 ",\n"
            "  \"num_key_value_heads\": %" PRId64 ",\n  \"head_dim\": %" PRId64 ",\n  \"vocab_size\": %" PRId64 ",\n"
            "  \"max_position_embeddings\": %" PRId64 ",\n  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": %.1f,\n"
            "  \"rope_scaling\": null,\n  \"hidden_act\": \"silu\",\n  \"attention_bias\": false,\n"
            "  \"mlp_bias\": false,\n  \"tie_word_embeddings\": %s,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
            "  \"torch_dtype\": \"bfloat16\"\n}\n",
            s->D, s->FF, L, s->n_head, s->n_kv, s->D / s->n_head, s->vocab, s->max_pos, s->rope_theta,
            s->tied ? "true" : "false");
    int bad = ferror(f);
    if ((fclose(f) != 0) | bad) {
        fprintf(stderr, "synth_ckpt: %s: write failed\n", path);
        free(path);
        return 1;
    }
    free(path);
    return 0;
}

static int copy_file(const char *src_dir, const char *dst_dir, const char *name, bool required) {
    char *src = llmq_path_join(src_dir, name), *dst = llmq_path_join(dst_dir, name);
    int rc = 0;
    FILE *in = src ? fopen(src, "rb") : NULL, *out = NULL;
    if (!in) {
        if (required) fprintf(stderr, "synth_ckpt: %s: cannot open: %s\n", src ? src : src_dir, strerror(errno));
        rc = required;
        goto done;
    }
    if (!(out = fopen(dst, "wb"))) {
        fprintf(stderr, "synth_ckpt: %s: cannot create: %s\n", dst, strerror(errno));
        rc = 1;
        goto done;
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) break;
    if (ferror(in) || ferror(out)) {
        fprintf(stderr, "synth_ckpt: copying %s to %s failed\n", src, dst);
        rc = 1;
    }
done:
    if (out && fclose(out) != 0) rc = 1;
    if (in) fclose(in);
    free(src);
    free(dst);
    return rc;
}

// One tensor's values as bf16, streamed through buf (cap elements) into the writer.
static int write_tensor(struct llmq_st_writer *w, const struct tensor *t, uint64_t seed, uint16_t *buf, int64_t cap) {
    uint64_t st = (seed ^ (0x9E3779B97F4A7C15ull * (t->index + 1))) | 1;
    for (int i = 0; i < 4; i++) test_xorshift64(&st);
    const float a = t->kind == KIND_LINEAR ? 1.7320508f * 0.02f : 0.1f, base = t->kind == KIND_LINEAR ? 0.0f : 1.0f;
    for (int64_t done = 0, n = numel(t); done < n;) {
        const int64_t k = n - done < cap ? n - done : cap;
        for (int64_t i = 0; i < k; i++) buf[i] = llmq_f32_to_bf16(base + a * test_frand(&st));
        if (llmq_st_writer_write(w, buf, (size_t)k * sizeof *buf) != LLMQ_OK) {
            fprintf(stderr, "synth_ckpt: writing %s failed\n", t->name);
            return 1;
        }
        done += k;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *shape_name = NULL, *out = NULL, *tok_dir = NULL;
    int64_t layers = -1, vocab = -1;
    uint64_t seed = 1, shard = 5000000000ull;
    bool force = false, list = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--force"))
            force = true;
        else if (!strcmp(a, "--list"))
            list = true;
        else if (!v)
            return usage("a flag without its value");
        else if (!strcmp(a, "--shape"))
            shape_name = argv[++i];
        else if (!strcmp(a, "--out"))
            out = argv[++i];
        else if (!strcmp(a, "--tokenizer"))
            tok_dir = argv[++i];
        else if (!strcmp(a, "--layers"))
            layers = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(a, "--vocab"))
            vocab = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(a, "--seed"))
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--shard-bytes"))
            shard = strtoull(argv[++i], NULL, 10);
        else
            return usage("unknown flag");
    }
    const struct shape *s0 = NULL;
    for (size_t i = 0; shape_name && i < N_SHAPES; i++)
        if (!strcmp(SHAPES[i].name, shape_name)) s0 = &SHAPES[i];
    if (!s0) return usage(shape_name ? "unknown --shape" : "--shape is required");
    struct shape s = *s0;
    if (vocab != -1 && (vocab < 1 || vocab > (1 << 24))) return usage("--vocab must be in [1, 16777216]");
    if (vocab != -1) s.vocab = vocab;
    if (layers != -1 && (layers < 1 || layers > s.L)) return usage("--layers must be in [1, the shape's depth]");
    const int64_t L = layers == -1 ? s.L : layers;
    if (!list && !out) return usage("--out is required (or --list)");
    if (shard < (1u << 20)) return usage("--shard-bytes must be at least 1048576");

    struct tensor *t = calloc((size_t)(L * 9 + 3), sizeof *t);
    if (!t) return 1;
    const int64_t n = layout(&s, L, t);
    int64_t params = 0, big = 0;
    for (int64_t i = 0; i < n; i++) {
        params += numel(&t[i]);
        big = numel(&t[i]) > big ? numel(&t[i]) : big;
    }
    if (list) {
        for (int64_t i = 0; i < n; i++) {
            if (t[i].n_dims == 2)
                printf("%s %" PRId64 "x%" PRId64 "\n", t[i].name, t[i].shape[0], t[i].shape[1]);
            else
                printf("%s %" PRId64 "\n", t[i].name, t[i].shape[0]);
        }
        printf("shape %s layers %" PRId64 " tensors %" PRId64 " params %" PRId64 " bytes %" PRId64 "\n", s.name, L, n,
               params, params * 2);
        free(t);
        return 0;
    }
    struct stat sb;
    if (stat(out, &sb) == 0 && !force) {
        fprintf(stderr, "synth_ckpt: %s exists (--force replaces its checkpoint files)\n", out);
        free(t);
        return 1;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "synth_ckpt: %s: cannot create: %s\n", out, strerror(errno));
        free(t);
        return 1;
    }
    int rc = 1;
    struct llmq_st_writer *w = NULL;
    const int64_t cap = big < (1 << 20) ? big : (1 << 20);
    uint16_t *buf = malloc((size_t)cap * sizeof *buf);
    if (!buf || llmq_st_writer_init(out, shard, &w) != LLMQ_OK) goto done;
    if (llmq_st_writer_set_metadata(w, "format", "pt") != LLMQ_OK) goto done;
    for (int64_t i = 0; i < n; i++)
        if (llmq_st_writer_add_tensor(w, t[i].name, LLMQ_DTYPE_BF16, t[i].n_dims, t[i].shape) != LLMQ_OK) goto done;
    for (int64_t i = 0; i < n; i++) {
        if (write_tensor(w, &t[i], seed, buf, cap)) goto done;
        if (isatty(2)) fprintf(stderr, "\rsynth_ckpt: %" PRId64 "/%" PRId64 " tensors", i + 1, n);
    }
    if (isatty(2)) fprintf(stderr, "\n");
    enum llmq_status st = llmq_st_writer_finish(w);
    w = NULL;
    if (st != LLMQ_OK || write_config(out, &s, L)) goto done;
    if (tok_dir &&
        (copy_file(tok_dir, out, "tokenizer.json", true) || copy_file(tok_dir, out, "tokenizer_config.json", false)))
        goto done;
    printf("synth_ckpt: %s: shape %s, %" PRId64 " layers, %" PRId64 " tensors, %" PRId64
           " parameters (bf16, seed %" PRIu64 ")\n",
           out, s.name, L, n, params, seed);
    rc = 0;
done:
    llmq_st_writer_abort(w);
    free(buf);
    free(t);
    return rc;
}
