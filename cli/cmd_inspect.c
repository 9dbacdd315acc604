/*
 * cli/cmd_inspect.c — `llmq inspect PATH`: what a model file or directory holds, from its headers.
 *
 * PATH is a GGUF file, a safetensors file (or its index.json), or a Hugging Face model directory
 * (config.json + safetensors). One report is built as a JSON object and printed either as JSON
 * (--json) or as text; both carry the same facts:
 *   format, file size, architecture, hyperparameters, every metadata key (arrays shown with their
 *   first --max-array elements), one entry per tensor (name, dtype, shape outermost-first, bytes,
 *   offset), and totals (tensors, parameters, bytes, bits per weight).
 * Tensor data is never read: only headers are parsed, so this is instant on any model size.
 */
#include "cli/args.h"
#include "cli/commands.h"
#include "common/io.h"
#include "common/status.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

// config.json keys shown as hyperparameters of a Hugging Face model (all of config.json is in
// the JSON report under "config").
static const char *hf_hparams[] = {
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "torch_dtype",
    "quantization_config",
    NULL,
};

static void upper(char *dst, const char *src, size_t n) {
    size_t i = 0;
    for (; src[i] && i + 1 < n; i++) dst[i] = (char)toupper((unsigned char)src[i]);
    dst[i] = '\0';
}

// A JSON string from bytes that may not be UTF-8 (tokenizer pieces can be raw bytes): invalid
// sequences become U+FFFD so the report stays valid JSON.
static json_t *json_bytes(const char *s, size_t n) {
    if (llmq_utf8_valid(s, n)) return json_stringn(s, n);
    char *buf = malloc(n * 3 + 1);
    size_t k = 0;
    if (!buf) return json_null();
    for (size_t i = 0; i < n;) {
        size_t len = 1;
        unsigned c = (unsigned char)s[i];
        if (c >= 0xc0) len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        if (c < 0x80 || (i + len <= n && llmq_utf8_valid(s + i, len))) {
            if (c < 0x80) len = 1;
            memcpy(buf + k, s + i, len);
            k += len;
            i += len;
        } else {
            memcpy(buf + k, "\xef\xbf\xbd", 3);
            k += 3;
            i++;
        }
    }
    json_t *j = json_stringn(buf, k);
    free(buf);
    return j;
}

static json_t *tensor_json(const struct llmq_tensor_view *t) {
    char dt[16];
    json_t *shape = json_array();
    upper(dt, llmq_dtype_name(t->dtype), sizeof(dt));
    for (int d = 0; d < t->n_dims; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    return json_pack("{s:s, s:s, s:o, s:I, s:I, s:I}", "name", t->name, "dtype", dt, "shape", shape, "elements",
                     (json_int_t)llmq_tensor_nelements(t), "bytes", (json_int_t)t->nbytes, "offset",
                     (json_int_t)t->file_offset);
}

// ---- GGUF --------------------------------------------------------------------------------------

static json_t *gguf_scalar(const struct llmq_gguf_kv *kv, enum llmq_gguf_type t, uint64_t j, bool arr) {
    int64_t i;
    uint64_t u;
    double f;
    bool b;
    size_t len;
    const char *s;
    switch (t) {
    case LLMQ_GGUF_TYPE_FLOAT32:
    case LLMQ_GGUF_TYPE_FLOAT64:
        if (arr ? llmq_gguf_kv_arr_f64(kv, j, &f) : llmq_gguf_kv_as_f64(kv, &f))
            return isfinite(f) ? json_real(f) : json_string(isnan(f) ? "nan" : f > 0 ? "inf" : "-inf");
        break;
    case LLMQ_GGUF_TYPE_BOOL:
        if (arr ? llmq_gguf_kv_arr_bool(kv, j, &b) : llmq_gguf_kv_as_bool(kv, &b)) return json_boolean(b);
        break;
    case LLMQ_GGUF_TYPE_STRING:
        s = arr ? llmq_gguf_kv_arr_str(kv, j, &len) : llmq_gguf_kv_as_str(kv, &len);
        if (s) return json_bytes(s, len);
        break;
    default:
        if (arr ? llmq_gguf_kv_arr_i64(kv, j, &i) : llmq_gguf_kv_as_i64(kv, &i)) return json_integer(i);
        // u64 beyond INT64_MAX: JSON integers are int64 here, so give the exact digits as a string
        if (arr ? llmq_gguf_kv_arr_u64(kv, j, &u) : llmq_gguf_kv_as_u64(kv, &u)) {
            char buf[32];
            snprintf(buf, sizeof(buf), "%llu", (unsigned long long)u);
            return json_string(buf);
        }
        break;
    }
    return json_null();
}

static json_t *gguf_kv_json(const struct llmq_gguf_kv *kv, long max_array) {
    if (kv->type != LLMQ_GGUF_TYPE_ARRAY)
        return json_pack("{s:s, s:o}", "type", llmq_gguf_type_name(kv->type), "value",
                         gguf_scalar(kv, kv->type, 0, false));
    json_t *vals = json_array();
    uint64_t n = max_array < 0 || (uint64_t)max_array > kv->n ? kv->n : (uint64_t)max_array;
    for (uint64_t j = 0; j < n; j++) json_array_append_new(vals, gguf_scalar(kv, kv->arr_type, j, true));
    return json_pack("{s:s, s:s, s:I, s:o}", "type", "array", "element_type", llmq_gguf_type_name(kv->arr_type),
                     "count", (json_int_t)kv->n, "values", vals);
}

static enum llmq_status inspect_gguf(const char *path, long max_array, json_t *rep) {
    struct llmq_gguf *g = NULL;
    enum llmq_status st = llmq_gguf_open(path, &g);
    if (st) return st;
    const char *arch = NULL;
    const struct llmq_gguf_kv *akv = llmq_gguf_find_kv(g, "general.architecture");
    if (akv) arch = llmq_gguf_kv_as_str(akv, NULL);
    size_t arch_len = arch ? strlen(arch) : 0;

    json_object_set_new(rep, "format", json_string("gguf"));
    json_object_set_new(rep, "gguf_version", json_integer(llmq_gguf_version(g)));
    json_object_set_new(rep, "alignment", json_integer((json_int_t)llmq_gguf_alignment(g)));
    json_object_set_new(rep, "data_offset", json_integer((json_int_t)llmq_gguf_data_offset(g)));
    json_object_set_new(rep, "file_bytes", json_integer((json_int_t)llmq_gguf_file_size(g)));
    json_object_set_new(rep, "architecture", arch ? json_string(arch) : json_null());

    json_t *hp = json_object(), *meta = json_object();
    for (int64_t i = 0; i < llmq_gguf_n_kv(g); i++) {
        const struct llmq_gguf_kv *kv = llmq_gguf_kv_at(g, i);
        json_t *v = gguf_kv_json(kv, max_array);
        if (arch && strncmp(kv->key, arch, arch_len) == 0 && kv->key[arch_len] == '.' &&
            kv->type != LLMQ_GGUF_TYPE_ARRAY)
            json_object_set(hp, kv->key + arch_len + 1, json_object_get(v, "value"));
        json_object_set_new(meta, kv->key, v);
    }
    json_object_set_new(rep, "hyperparameters", hp);
    json_object_set_new(rep, "metadata", meta);

    json_t *tensors = json_array();
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++) {
        const struct llmq_gguf_tensor *t = llmq_gguf_tensor_at(g, i);
        json_t *tj = tensor_json(&t->view);
        json_t *ne = json_array();
        for (int d = 0; d < t->view.n_dims; d++) json_array_append_new(ne, json_integer(t->ne[d]));
        json_object_set_new(tj, "ne", ne);
        json_array_append_new(tensors, tj);
    }
    json_object_set_new(rep, "tensors", tensors);
    llmq_gguf_free(g);
    return LLMQ_OK;
}

// ---- safetensors / Hugging Face directory ----------------------------------------------------

static enum llmq_status read_config(const char *dir, json_t **out) {
    char *cfg_path = llmq_path_join(dir, "config.json");
    enum llmq_status st = LLMQ_OK;
    *out = NULL;
    if (!cfg_path) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", dir);
    if (llmq_file_exists(cfg_path)) st = llmq_read_json_object(cfg_path, 16u << 20, out); // absent: bare safetensors
    free(cfg_path);
    return st;
}

static enum llmq_status inspect_safetensors(const char *path, bool is_dir, json_t *rep) {
    struct llmq_st_model *m = NULL;
    json_t *cfg = NULL;
    enum llmq_status st;
    char *dir = NULL;

    if (is_dir) {
        dir = strdup(path);
    } else {
        const char *slash = strrchr(path, '/');
        dir = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup(".");
    }
    if (!dir) return llmq_errorf(LLMQ_ERR_NOMEM, "%s: out of memory", path);
    st = read_config(dir, &cfg);
    if (st) goto done;
    if (is_dir && !cfg) {
        char *p = llmq_path_join(dir, "config.json");
        st = llmq_errorf(LLMQ_ERR_NOT_FOUND, "%s: no config.json: not a Hugging Face model directory", p ? p : dir);
        free(p);
        goto done;
    }
    st = llmq_st_open(path, &m);
    if (st) goto done;

    uint64_t file_bytes = 0;
    json_t *shards = json_array();
    for (int s = 0; s < llmq_st_n_shards(m); s++) {
        const struct llmq_st_shard_info *si = llmq_st_shard(m, s);
        file_bytes += si->file_size;
        json_array_append_new(shards, json_pack("{s:s, s:I, s:I, s:I}", "file", si->file_name, "bytes",
                                                (json_int_t)si->file_size, "header_bytes", (json_int_t)si->header_len,
                                                "tensors", (json_int_t)si->n_tensors));
    }
    json_object_set_new(rep, "format", json_string(is_dir ? "hf" : "safetensors"));
    json_object_set_new(rep, "file_bytes", json_integer((json_int_t)file_bytes));
    json_object_set_new(rep, "shards", shards);

    json_t *arch = NULL, *hp = json_object();
    if (cfg) {
        json_t *archs = json_object_get(cfg, "architectures");
        arch = json_array_get(archs, 0);
        if (!json_is_string(arch)) arch = json_object_get(cfg, "model_type");
        for (int i = 0; hf_hparams[i]; i++) {
            json_t *v = json_object_get(cfg, hf_hparams[i]);
            if (v) json_object_set(hp, hf_hparams[i], v);
        }
    }
    json_object_set(rep, "architecture", json_is_string(arch) ? arch : json_null());
    json_object_set_new(rep, "hyperparameters", hp);
    if (cfg) json_object_set(rep, "config", cfg);

    json_t *meta = json_object();
    for (int64_t i = 0; i < llmq_st_n_metadata(m); i++)
        json_object_set_new(meta, llmq_st_metadata_key(m, i),
                            json_pack("{s:s, s:s}", "type", "string", "value", llmq_st_metadata_value(m, i)));
    json_object_set_new(rep, "metadata", meta);

    json_t *tensors = json_array();
    for (int64_t i = 0; i < llmq_st_n_tensors(m); i++) {
        json_t *tj = tensor_json(llmq_st_tensor(m, i));
        if (llmq_st_n_shards(m) > 1)
            json_object_set_new(tj, "shard", json_string(llmq_st_shard(m, llmq_st_tensor_shard(m, i))->file_name));
        json_array_append_new(tensors, tj);
    }
    json_object_set_new(rep, "tensors", tensors);
done:
    llmq_st_free(m);
    json_decref(cfg);
    free(dir);
    return st;
}

// ---- totals and the text renderer --------------------------------------------------------------

// Bits per packed code of a GPTQ / AWQ directory (config.json quantization_config: "bits", AutoAWQ's
// older "w_bit"), 0 when the model is not one.
static int packed_bits(const json_t *rep) {
    const json_t *qc = json_object_get(json_object_get(rep, "config"), "quantization_config");
    const char *qm = json_string_value(json_object_get(qc, "quant_method"));
    if (!qm || (strcmp(qm, "gptq") && strcmp(qm, "awq"))) return 0;
    json_int_t b = json_integer_value(json_object_get(qc, "bits"));
    if (!b) b = json_integer_value(json_object_get(qc, "w_bit"));
    return b >= 1 && b <= 32 ? (int)b : 0;
}

// Parameters: the logical weights a tensor holds. A GPTQ / AWQ qweight (int32) packs 32 / bits codes per
// element whichever dimension it packs (GPTQ the input, AWQ the output dimension), so it holds
// elements * 32 / bits weights; its qzeros, scales and g_idx are metadata of those weights (0 parameters,
// their bytes still count). Every other tensor: its elements.
static void add_totals(json_t *rep) {
    json_int_t n_params = 0, n_bytes = 0, n_elems = 0;
    size_t i;
    json_t *t;
    int bits = packed_bits(rep);
    json_array_foreach(json_object_get(rep, "tensors"), i, t) {
        const char *name = json_string_value(json_object_get(t, "name")),
                   *dt = json_string_value(json_object_get(t, "dtype"));
        json_int_t el = json_integer_value(json_object_get(t, "elements")), p = el;
        if (bits && llmq_ends_with(name, ".qweight") && strcmp(dt, "I32") == 0)
            p = el * 32 / bits;
        else if (bits &&
                 (llmq_ends_with(name, ".qzeros") || llmq_ends_with(name, ".scales") || llmq_ends_with(name, ".g_idx")))
            p = 0;
        if (bits) json_object_set_new(t, "params", json_integer(p));
        n_params += p;
        n_elems += el;
        n_bytes += json_integer_value(json_object_get(t, "bytes"));
    }
    json_object_set_new(rep, "n_tensors", json_integer((json_int_t)json_array_size(json_object_get(rep, "tensors"))));
    json_object_set_new(rep, "n_params", json_integer(n_params));
    json_object_set_new(rep, "n_elements", json_integer(n_elems));
    if (bits) json_object_set_new(rep, "packed_bits", json_integer(bits));
    json_object_set_new(rep, "n_bytes", json_integer(n_bytes));
    json_object_set_new(rep, "bits_per_weight",
                        n_params ? json_real(8.0 * (double)n_bytes / (double)n_params) : json_null());
}

// Prints a JSON value compactly on one line, cut at `width` characters.
static void print_value(const json_t *v, int width) {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(9));
    if (!s) return;
    size_t n = strlen(s);
    if (width > 3 && n > (size_t)width)
        printf("%.*s...", width - 3, s);
    else
        fputs(s, stdout);
    free(s);
}

static void print_size(double bytes) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) bytes /= 1024, u++;
    printf(u ? "%.2f %s" : "%.0f %s", bytes, unit[u]);
}

static void print_text(const json_t *rep) {
    const char *key;
    json_t *v;
    size_t i;
    printf("path:          %s\n", json_string_value(json_object_get(rep, "path")));
    printf("format:        %s", json_string_value(json_object_get(rep, "format")));
    if (json_object_get(rep, "gguf_version"))
        printf(" v%lld, alignment %lld, data at offset %lld",
               (long long)json_integer_value(json_object_get(rep, "gguf_version")),
               (long long)json_integer_value(json_object_get(rep, "alignment")),
               (long long)json_integer_value(json_object_get(rep, "data_offset")));
    if (json_object_get(rep, "shards")) printf(", %zu file(s)", json_array_size(json_object_get(rep, "shards")));
    printf("\nfile size:     ");
    print_size((double)json_integer_value(json_object_get(rep, "file_bytes")));
    v = json_object_get(rep, "architecture");
    printf("\narchitecture:  %s\n", json_is_string(v) ? json_string_value(v) : "(unknown)");

    json_t *hp = json_object_get(rep, "hyperparameters");
    if (json_object_size(hp)) printf("\nhyperparameters:\n");
    json_object_foreach(hp, key, v) {
        printf("  %-40s ", key);
        print_value(v, 80);
        printf("\n");
    }
    json_t *meta = json_object_get(rep, "metadata");
    printf("\nmetadata (%zu keys):\n", json_object_size(meta));
    json_object_foreach(meta, key, v) {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (strcmp(type, "array") == 0) {
            char t[48];
            snprintf(t, sizeof(t), "[%s x %lld]", json_string_value(json_object_get(v, "element_type")),
                     (long long)json_integer_value(json_object_get(v, "count")));
            printf("  %-40s %-16s ", key, t);
            print_value(json_object_get(v, "values"), 60);
        } else {
            printf("  %-40s %-16s ", key, type);
            print_value(json_object_get(v, "value"), 60);
        }
        printf("\n");
    }
    json_t *tensors = json_object_get(rep, "tensors");
    printf("\ntensors (%zu):\n", json_array_size(tensors));
    printf("  %-48s %-8s %-22s %14s\n", "name", "dtype", "shape", "bytes");
    json_array_foreach(tensors, i, v) {
        char shape[96];
        size_t off = 0, d;
        json_t *dim;
        shape[0] = '\0';
        json_array_foreach(json_object_get(v, "shape"), d, dim) off += (size_t)snprintf(
            shape + off, sizeof(shape) - off, d ? ", %lld" : "%lld", (long long)json_integer_value(dim));
        int pad = 20 - (int)strlen(shape);
        printf("  %-48s %-8s [%s]%*s %14lld\n", json_string_value(json_object_get(v, "name")),
               json_string_value(json_object_get(v, "dtype")), shape, pad > 0 ? pad : 0, "",
               (long long)json_integer_value(json_object_get(v, "bytes")));
    }
    printf("\ntotal:         %lld tensors, %lld parameters",
           (long long)json_integer_value(json_object_get(rep, "n_tensors")),
           (long long)json_integer_value(json_object_get(rep, "n_params")));
    if (json_object_get(rep, "packed_bits"))
        printf(" (%lld stored elements: %lld-bit codes packed in int32)",
               (long long)json_integer_value(json_object_get(rep, "n_elements")),
               (long long)json_integer_value(json_object_get(rep, "packed_bits")));
    printf(", ");
    print_size((double)json_integer_value(json_object_get(rep, "n_bytes")));
    v = json_object_get(rep, "bits_per_weight");
    if (json_is_real(v)) printf(", %.4f bits per weight", json_real_value(v));
    printf("\n");
}

// ---- command -------------------------------------------------------------------------------------

static bool starts_with_gguf_magic(const char *path) {
    char magic[4] = {0};
    FILE *fp = fopen(path, "rb");
    if (!fp) return false;
    size_t n = fread(magic, 1, 4, fp);
    fclose(fp);
    return n == 4 && memcmp(magic, LLMQ_GGUF_MAGIC, 4) == 0;
}

int cmd_inspect(int argc, char **argv) {
    bool json = false;
    long max_array = 8;
    const struct cli_flag flags[] = {
        {"json", CLI_BOOL, &json, "off", "print the report as JSON on stdout"},
        {"max-array", CLI_INT, &max_array, "8", "array elements shown per metadata key (-1: all)"},
    };
    const struct cli_cmd cmd = {
        "inspect",
        "PATH [flags]",
        "Show the format, architecture, hyperparameters, metadata and tensors (name, dtype, shape,\n"
        "bytes) of a GGUF file, a safetensors file or index, or a Hugging Face model directory.\n"
        "Only headers are read: tensor data is never touched.",
        "Shapes are outermost-first (PyTorch order); GGUF's own fastest-first order is in the JSON as \"ne\".\n"
        "Parameters are logical weights: a GPTQ / AWQ directory's int32 qweight holds 32/bits codes per element\n"
        "(counted as such), its qzeros, scales and g_idx are metadata (0 parameters); a GGUF block type holds\n"
        "its elements. Bits per weight = 8 x all tensor bytes (metadata included) / parameters.\n"
        "Exit status: 0 ok, 1 unreadable or invalid input (the message names the file and the problem), 2 usage.",
        flags,
        2,
        1,
        1};
    const char *pos[1];
    int n_pos, rc = cli_parse(&cmd, argc, argv, pos, &n_pos);
    if (rc) return rc == 1 ? 0 : rc;
    if (max_array < -1) {
        fprintf(stderr, "llmq inspect: --max-array must be -1 or more\n");
        return 2;
    }
    const char *path = pos[0];
    struct stat sb;
    if (stat(path, &sb) != 0) {
        llmq_errorf(LLMQ_ERR_IO, "%s: no such file or directory", path);
        return 1;
    }
    json_t *rep = json_object();
    json_object_set_new(rep, "path", json_string(path));
    enum llmq_status st;
    if (S_ISDIR(sb.st_mode))
        st = inspect_safetensors(path, true, rep);
    else if (starts_with_gguf_magic(path) || llmq_ends_with(path, ".gguf"))
        st = inspect_gguf(path, max_array, rep);
    else
        st = inspect_safetensors(path, false, rep);
    if (st) {
        json_decref(rep);
        return 1;
    }
    add_totals(rep);
    if (json) {
        char *s = json_dumps(rep, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (s) puts(s);
        free(s);
    } else {
        print_text(rep);
    }
    json_decref(rep);
    return 0;
}
