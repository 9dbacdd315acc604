// tests/tools/gguf_dump.c — prints what llmq's GGUF reader sees as one JSON document, so that
// tests/py/test_gguf_oracle.py can compare it with gguf-py's GGUFReader.
//
//   gguf_dump FILE.gguf
//
// stdout: {"version", "alignment", "data_offset", "file_size",
//          "kv": [{"key", "type", "elem" (arrays), "value"}],
//          "tensors": [{"name", "ggml_type", "dtype", "ne", "shape", "offset", "data_offset",
//                       "nbytes", "crc32"}]}
// Integers that do not fit in int64 are written as decimal strings; non-finite floats as "nan",
// "inf", "-inf"; strings that are not valid UTF-8 as {"hex": "..."}.
// On a reader error: {"status": "<llmq_status_name>", "message": "..."} and exit status 1.
// Every value is read through the public accessors (llmq_gguf_kv_as_* / _arr_*), which this
// tool thereby exercises.
#include "common/io.h"
#include "common/status.h"
#include "formats/gguf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

static json_t *str_json(const char *s, size_t n) {
    if (llmq_utf8_valid(s, n)) return json_stringn(s, n);
    char *hex = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", (unsigned char)s[i]);
    json_t *o = json_pack("{s:s}", "hex", hex ? hex : "");
    free(hex);
    return o;
}

static json_t *float_json(double v) {
    if (isnan(v)) return json_string("nan");
    if (isinf(v)) return json_string(v > 0 ? "inf" : "-inf");
    return json_real(v);
}

static json_t *uint_json(uint64_t u) {
    if (u <= (uint64_t)INT64_MAX) return json_integer((json_int_t)u);
    char buf[32];
    snprintf(buf, sizeof(buf), "%llu", (unsigned long long)u);
    return json_string(buf);
}

// One element: scalar (j == UINT64_MAX) or element j of an array.
static json_t *elem_json(const struct llmq_gguf_kv *kv, enum llmq_gguf_type t, uint64_t j) {
    bool scalar = j == UINT64_MAX;
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    size_t len;
    switch (t) {
    case LLMQ_GGUF_TYPE_UINT8:
    case LLMQ_GGUF_TYPE_UINT16:
    case LLMQ_GGUF_TYPE_UINT32:
    case LLMQ_GGUF_TYPE_UINT64:
        if (!(scalar ? llmq_gguf_kv_as_u64(kv, &u) : llmq_gguf_kv_arr_u64(kv, j, &u))) return NULL;
        return uint_json(u);
    case LLMQ_GGUF_TYPE_INT8:
    case LLMQ_GGUF_TYPE_INT16:
    case LLMQ_GGUF_TYPE_INT32:
    case LLMQ_GGUF_TYPE_INT64:
        if (!(scalar ? llmq_gguf_kv_as_i64(kv, &i) : llmq_gguf_kv_arr_i64(kv, j, &i))) return NULL;
        return json_integer((json_int_t)i);
    case LLMQ_GGUF_TYPE_FLOAT32:
    case LLMQ_GGUF_TYPE_FLOAT64:
        if (!(scalar ? llmq_gguf_kv_as_f64(kv, &d) : llmq_gguf_kv_arr_f64(kv, j, &d))) return NULL;
        return float_json(d);
    case LLMQ_GGUF_TYPE_BOOL:
        if (!(scalar ? llmq_gguf_kv_as_bool(kv, &b) : llmq_gguf_kv_arr_bool(kv, j, &b))) return NULL;
        return json_boolean(b);
    case LLMQ_GGUF_TYPE_STRING: {
        const char *s = scalar ? llmq_gguf_kv_as_str(kv, &len) : llmq_gguf_kv_arr_str(kv, j, &len);
        return s ? str_json(s, len) : NULL;
    }
    default: return NULL;
    }
}

static json_t *kv_json(const struct llmq_gguf_kv *kv) {
    json_t *o = json_object(), *v;
    json_object_set_new(o, "key", json_string(kv->key));
    json_object_set_new(o, "type", json_string(llmq_gguf_type_name(kv->type)));
    if (kv->type == LLMQ_GGUF_TYPE_ARRAY) {
        json_object_set_new(o, "elem", json_string(llmq_gguf_type_name(kv->arr_type)));
        v = json_array();
        for (uint64_t j = 0; j < kv->n; j++) {
            json_t *e = elem_json(kv, kv->arr_type, j);
            json_array_append_new(v, e ? e : json_null());
        }
    } else {
        v = elem_json(kv, kv->type, UINT64_MAX);
    }
    json_object_set_new(o, "value", v ? v : json_null());
    return o;
}

static json_t *tensor_json(const struct llmq_gguf_tensor *t) {
    json_t *o = json_object(), *ne = json_array(), *shape = json_array();
    for (int k = 0; k < t->view.n_dims; k++) {
        json_array_append_new(ne, json_integer(t->ne[k]));
        json_array_append_new(shape, json_integer(t->view.shape[k]));
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    const uint8_t *p = t->view.data;
    for (size_t done = 0; done < t->view.nbytes;) { // zlib takes uInt lengths
        size_t k = t->view.nbytes - done > (1u << 30) ? (1u << 30) : t->view.nbytes - done;
        crc = crc32(crc, p + done, (uInt)k);
        done += k;
    }
    json_object_set_new(o, "name", json_string(t->view.name));
    json_object_set_new(o, "ggml_type", json_integer(t->ggml_type));
    json_object_set_new(o, "dtype", json_string(llmq_dtype_name(t->view.dtype)));
    json_object_set_new(o, "ne", ne);
    json_object_set_new(o, "shape", shape);
    json_object_set_new(o, "offset", json_integer((json_int_t)t->offset));
    json_object_set_new(o, "data_offset", json_integer((json_int_t)t->view.file_offset));
    json_object_set_new(o, "nbytes", json_integer((json_int_t)t->view.nbytes));
    json_object_set_new(o, "crc32", json_integer((json_int_t)crc));
    return o;
}

int main(int argc, char **argv) {
    struct llmq_gguf *g = NULL;
    if (argc != 2) {
        fprintf(stderr, "usage: gguf_dump FILE.gguf\n");
        return 2;
    }
    enum llmq_status st = llmq_gguf_open(argv[1], &g);
    if (st) {
        json_t *err = json_pack("{s:s,s:s}", "status", llmq_status_name(st), "message", llmq_last_error());
        json_dumpf(err, stdout, JSON_COMPACT);
        putchar('\n');
        json_decref(err);
        return 1;
    }
    json_t *root = json_object(), *kvs = json_array(), *tensors = json_array();
    json_object_set_new(root, "version", json_integer(llmq_gguf_version(g)));
    json_object_set_new(root, "alignment", json_integer((json_int_t)llmq_gguf_alignment(g)));
    json_object_set_new(root, "data_offset", json_integer((json_int_t)llmq_gguf_data_offset(g)));
    json_object_set_new(root, "file_size", json_integer((json_int_t)llmq_gguf_file_size(g)));
    for (int64_t i = 0; i < llmq_gguf_n_kv(g); i++) json_array_append_new(kvs, kv_json(llmq_gguf_kv_at(g, i)));
    for (int64_t i = 0; i < llmq_gguf_n_tensors(g); i++)
        json_array_append_new(tensors, tensor_json(llmq_gguf_tensor_at(g, i)));
    json_object_set_new(root, "kv", kvs);
    json_object_set_new(root, "tensors", tensors);
    int rc = json_dumpf(root, stdout, JSON_COMPACT | JSON_REAL_PRECISION(17)) == 0 ? 0 : 1;
    putchar('\n');
    json_decref(root);
    llmq_gguf_free(g);
    return rc;
}
