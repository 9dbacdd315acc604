/*
 * formats/gguf.h — GGUF reader (versions 1, 2, 3) and streaming, atomic GGUF writer (version 3).
 *
 * GGUF is the single-file model format of ggml / llama.cpp (spec: ggml docs/gguf.md; a reader and
 * writer in Python: gguf-py, PyPI `gguf`, which tests/py/test_gguf_oracle.py uses as the oracle).
 * This module parses and validates the header and hands out non-owning views into a read-only
 * mapping of the file; it never reads tensor data while opening (opening a 100 GB file costs only
 * the header) and never copies large arrays (the token list of a 49152-entry vocabulary stays in
 * the mapping; only per-element offsets are stored). It does not interpret what the keys mean
 * (that is the model loader's job) and does not convert tensor data (formats/ggml/quants.h does).
 *
 * ---- Byte layout (all integers little-endian, no padding between fields) ------------------------
 *
 *   offset 0   char[4]  magic "GGUF" (0x47 0x47 0x55 0x46)
 *          4   u32      version: 1, 2 or 3
 *          8   LEN      n_tensors
 *              LEN      n_kv
 *              KV       n_kv key/value pairs
 *              TI       n_tensors tensor infos
 *              u8[]     zero padding up to a multiple of ALIGN          <- data section starts here
 *              u8[]     tensor data; each tensor at data_start + TI.offset, TI.offset % ALIGN == 0
 *
 *   LEN     u32 in version 1, u64 in versions 2 and 3. Also used for string lengths, array counts
 *           and (in version 1) the tensor dims.
 *   STRING  LEN n, then n bytes (UTF-8, not NUL-terminated)
 *   KV      STRING key, u32 value type, value
 *   value   by type id:  0 u8   1 i8   2 u16   3 i16   4 u32   5 i32   6 f32   7 bool (1 byte)
 *                        8 STRING   9 ARRAY   10 u64   11 i64   12 f64
 *   ARRAY   u32 element type, LEN count, then count values of that type, packed (strings each with
 *           their own length). Arrays of arrays are legal in the spec but unused by llama.cpp and
 *           rejected here with LLMQ_ERR_UNSUPPORTED.
 *   TI      STRING name, u32 n_dims (0..4), n_dims x dim (u32 in v1, u64 in v2/v3; ne[0] first =
 *           the FASTEST-varying dimension), u32 ggml type id, u64 offset relative to the data start
 *   ALIGN   the u32 value of key "general.alignment" (nonzero power of two), default 32.
 *
 * ---- What the reader checks (each failure: one log line naming the file, the problem and the
 *      offset / key / tensor; the status in brackets) ---------------------------------------------
 *   magic [MAGIC]; version 0 or > 3 [VERSION]; any field running past the end of the file,
 *   reported with its byte offset [TRUNCATED]; n_kv and n_tensors larger than the remaining bytes
 *   could hold [TRUNCATED]; string lengths and array counts x element size beyond the file
 *   [TRUNCATED]; keys and tensor names that are empty, hold a NUL or are not valid UTF-8
 *   [CORRUPT]; duplicate keys or tensor names [DUPLICATE]; unknown value types [CORRUPT]; nested
 *   arrays [UNSUPPORTED]; general.alignment not a u32 or not a nonzero power of two [CORRUPT];
 *   n_dims > 4 [UNSUPPORTED] (0 is a scalar); negative dims [CORRUPT] (dims of 0 are accepted: an
 *   empty tensor, as in ggml); unknown ggml type ids [UNSUPPORTED]; element counts or byte sizes
 *   overflowing int64 [OVERFLOW]; ne[0] not a multiple of the type's block size [CORRUPT];
 *   misaligned tensor offsets [CORRUPT]; tensor data past the end of the file [TRUNCATED];
 *   overlapping tensor data [CORRUPT] (gaps between tensors are allowed).
 *   Memory grows with the entries actually parsed, never with a count the header merely claims.
 *   String VALUES are not UTF-8-validated (real tokenizers carry raw bytes); use llmq_utf8_valid.
 *
 * ---- Ownership ------------------------------------------------------------------------------------
 *   Every pointer handed out by a reader (keys, names, string values, array data, tensor views and
 *   their data) stays valid until llmq_gguf_free() of that reader. Pointers into the mapping are
 *   NOT aligned: read multi-byte values with memcpy or with the accessors below. The host must be
 *   little-endian (checked at compile time).
 */
#ifndef LLMQ_GGUF_H
#define LLMQ_GGUF_H

#include "common/dtype.h"
#include "common/status.h"
#include "common/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LLMQ_GGUF_MAGIC "GGUF"
#define LLMQ_GGUF_VERSION 3 // the version the writer produces
#define LLMQ_GGUF_DEFAULT_ALIGNMENT 32
#define LLMQ_GGUF_KEY_ALIGNMENT "general.alignment"
#define LLMQ_GGUF_MAX_NAME 64 // llama.cpp's GGML_MAX_NAME: the writer wants names < 64 bytes

// Metadata value types, numbered as on disk.
enum llmq_gguf_type {
    LLMQ_GGUF_TYPE_UINT8 = 0,
    LLMQ_GGUF_TYPE_INT8 = 1,
    LLMQ_GGUF_TYPE_UINT16 = 2,
    LLMQ_GGUF_TYPE_INT16 = 3,
    LLMQ_GGUF_TYPE_UINT32 = 4,
    LLMQ_GGUF_TYPE_INT32 = 5,
    LLMQ_GGUF_TYPE_FLOAT32 = 6,
    LLMQ_GGUF_TYPE_BOOL = 7,
    LLMQ_GGUF_TYPE_STRING = 8,
    LLMQ_GGUF_TYPE_ARRAY = 9,
    LLMQ_GGUF_TYPE_UINT64 = 10,
    LLMQ_GGUF_TYPE_INT64 = 11,
    LLMQ_GGUF_TYPE_FLOAT64 = 12,
    LLMQ_GGUF_TYPE_COUNT
};

// "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64";
// "?" for anything else.
const char *llmq_gguf_type_name(enum llmq_gguf_type t);
// Bytes of one value of a fixed-size type (1, 2, 4 or 8); 0 for STRING, ARRAY and unknown types.
size_t llmq_gguf_type_size(enum llmq_gguf_type t);

// ==================================================================================================
// Reader
// ==================================================================================================

struct llmq_gguf; // an opened file: the mapping plus the parsed header (opaque)

// One key/value pair. Read the value with the llmq_gguf_kv_* accessors; the fields marked
// "private" exist so the accessors need no reader argument.
struct llmq_gguf_kv {
    const char *key;              // NUL-terminated copy (valid UTF-8, no NUL inside)
    enum llmq_gguf_type type;     // the value type; ARRAY for arrays
    enum llmq_gguf_type arr_type; // ARRAY: the element type (never ARRAY); otherwise == type
    uint64_t n;                   // ARRAY: number of elements; otherwise 1
    const uint8_t *data;          // into the mapping: a scalar's bytes, a STRING's bytes (see str),
                                  // an ARRAY's packed elements (for strings: the first length field)
    uint64_t nbytes;              // bytes at data: scalar size, string length, array payload size
    const char *str;              // STRING: NUL-terminated copy of the value (may hold inner NULs;
                                  // nbytes is the true length); NULL otherwise
    uint64_t offset;              // absolute file offset of the value (after the type id), for messages
    const uint64_t *str_off;      // private: ARRAY of STRING: file offset of each element's length
    const uint8_t *base;          // private: start of the mapping
    uint8_t len_size;             // private: 4 (version 1) or 8 bytes per string length
};

// One tensor: the common view (outermost-first shape) plus GGUF's own description of it.
struct llmq_gguf_tensor {
    struct llmq_tensor_view view; // name, dtype, n_dims, shape (reversed ne), data, nbytes, file_offset
    uint32_t ggml_type;           // the on-disk type id (view.dtype == llmq_dtype_from_ggml(ggml_type))
    int64_t ne[LLMQ_MAX_DIMS];    // ggml order: ne[0] is the fastest dimension; unused entries are 1
    uint64_t offset;              // relative to the data section start (as stored)
};

// Opens and validates path (see "What the reader checks"). On success *out owns the mapping and
// must be released with llmq_gguf_free(). On failure *out is NULL, one error line was logged
// (llmq_last_error() names the path) and the status says why. Tensor data is not touched.
enum llmq_status llmq_gguf_open(const char *path, struct llmq_gguf **out);
void llmq_gguf_free(struct llmq_gguf *g); // NULL is a no-op

const char *llmq_gguf_path(const struct llmq_gguf *g);
uint32_t llmq_gguf_version(const struct llmq_gguf *g);     // 1, 2 or 3
uint64_t llmq_gguf_alignment(const struct llmq_gguf *g);   // general.alignment or 32
uint64_t llmq_gguf_data_offset(const struct llmq_gguf *g); // absolute start of the data section
uint64_t llmq_gguf_file_size(const struct llmq_gguf *g);

// ---- key/value pairs, in file order
int64_t llmq_gguf_n_kv(const struct llmq_gguf *g);
const struct llmq_gguf_kv *llmq_gguf_kv_at(const struct llmq_gguf *g, int64_t i);         // NULL if out of range
const struct llmq_gguf_kv *llmq_gguf_find_kv(const struct llmq_gguf *g, const char *key); // NULL if absent
int64_t llmq_gguf_find_kv_index(const struct llmq_gguf *g, const char *key);              // -1 if absent

// Scalar accessors: false (and *out untouched) when the value has another type or does not fit.
//   as_i64: any integer type, if the value fits in int64     as_u64: any integer type, if >= 0
//   as_f64: f32, f64 and any integer type (u64/i64 beyond 2^53 round)
//   as_bool: bool only                                        as_str: STRING only (NUL-terminated,
//   *len, if not NULL, gets the byte length; NULL for other types)
bool llmq_gguf_kv_as_i64(const struct llmq_gguf_kv *kv, int64_t *out);
bool llmq_gguf_kv_as_u64(const struct llmq_gguf_kv *kv, uint64_t *out);
bool llmq_gguf_kv_as_f64(const struct llmq_gguf_kv *kv, double *out);
bool llmq_gguf_kv_as_bool(const struct llmq_gguf_kv *kv, bool *out);
const char *llmq_gguf_kv_as_str(const struct llmq_gguf_kv *kv, size_t *len);

// Array element accessors (kv->type == ARRAY, j < kv->n), same conversion rules as the scalar ones;
// false / NULL for a wrong type or j out of range. For numeric arrays kv->data points at kv->n
// packed elements of llmq_gguf_type_size(kv->arr_type) bytes each (unaligned).
bool llmq_gguf_kv_arr_i64(const struct llmq_gguf_kv *kv, uint64_t j, int64_t *out);
bool llmq_gguf_kv_arr_u64(const struct llmq_gguf_kv *kv, uint64_t j, uint64_t *out);
bool llmq_gguf_kv_arr_f64(const struct llmq_gguf_kv *kv, uint64_t j, double *out);
bool llmq_gguf_kv_arr_bool(const struct llmq_gguf_kv *kv, uint64_t j, bool *out);
// Element j of an array of strings: a pointer into the mapping (NOT NUL-terminated) and its length.
const char *llmq_gguf_kv_arr_str(const struct llmq_gguf_kv *kv, uint64_t j, size_t *len);

// Getters by key for model loaders. Each logs one line naming the file and key on failure:
// LLMQ_ERR_NOT_FOUND if the key is absent, LLMQ_ERR_CORRUPT if its type does not convert (rules
// of the as_* accessors), LLMQ_ERR_OVERFLOW if an integer does not fit. *out is untouched on failure.
enum llmq_status llmq_gguf_get_i64(const struct llmq_gguf *g, const char *key, int64_t *out);
enum llmq_status llmq_gguf_get_u64(const struct llmq_gguf *g, const char *key, uint64_t *out);
enum llmq_status llmq_gguf_get_f64(const struct llmq_gguf *g, const char *key, double *out);
enum llmq_status llmq_gguf_get_bool(const struct llmq_gguf *g, const char *key, bool *out);
enum llmq_status llmq_gguf_get_str(const struct llmq_gguf *g, const char *key, const char **out);
// An array whose elements have type elem (pass LLMQ_GGUF_TYPE_COUNT to accept any element type).
enum llmq_status llmq_gguf_get_arr(const struct llmq_gguf *g, const char *key, enum llmq_gguf_type elem,
                                   const struct llmq_gguf_kv **out);

// ---- tensors, in file (tensor info) order
int64_t llmq_gguf_n_tensors(const struct llmq_gguf *g);
const struct llmq_gguf_tensor *llmq_gguf_tensor_at(const struct llmq_gguf *g, int64_t i); // NULL if out of range
const struct llmq_gguf_tensor *llmq_gguf_find_tensor(const struct llmq_gguf *g, const char *name); // NULL if absent
int64_t llmq_gguf_find_tensor_index(const struct llmq_gguf *g, const char *name);                  // -1 if absent

// ==================================================================================================
// Writer (always version 3)
// ==================================================================================================
//
// Usage:   w = llmq_gguf_writer_init();
//          llmq_gguf_writer_copy_kvs(w, src, except);   and / or   llmq_gguf_writer_set_*(w, ...);
//          llmq_gguf_writer_add_tensor(w, name, dtype, n_dims, shape);       (once per tensor)
//          llmq_gguf_writer_begin(w, path);
//          llmq_gguf_writer_write_tensor(w, data, n);   (tensor bytes, in declared order, any chunks)
//          llmq_gguf_writer_commit(w);                  (or llmq_gguf_writer_abort(w))
//          llmq_gguf_writer_free(w);
//
// begin() opens "<path>.tmp.<pid>" (common/io.h llmq_afile) and writes a zero placeholder as long
// as the header plus its alignment padding (its size is known once the KVs and tensor infos are);
// tensor data then streams straight to disk with zero padding to ALIGN after every tensor; commit()
// seeks back, writes the real header, fsyncs and renames onto path. Nothing exists at path before
// commit() succeeds; abort(), free() of an uncommitted writer, SIGINT / SIGTERM (in the llmq
// executable) remove the temporary file; a crash or kill -9 leaves it, and the next run to path
// removes it (common/io.h "The output guard"). The final rename is exclusive unless path was checked
// with --force. KVs are written in the order first set; setting an existing key again replaces its
// value in place. ALIGN is general.alignment if the caller set it (a u32 nonzero power of two, else
// begin() fails with LLMQ_ERR_ARG), otherwise 32 (and no key is added).
// All set/add calls copy their arguments. Errors: LLMQ_ERR_ARG for misuse (bad key or name,
// wrong call order, wrong byte counts), LLMQ_ERR_DUPLICATE for a tensor name given twice,
// LLMQ_ERR_UNSUPPORTED for a dtype without a GGUF id, LLMQ_ERR_OVERFLOW for a size overflow,
// LLMQ_ERR_IO / LLMQ_ERR_NOMEM from the system; each is logged once. After any failure of
// begin / write_tensor / commit the writer only accepts abort() and free().

struct llmq_gguf_writer;

struct llmq_gguf_writer *llmq_gguf_writer_init(void);   // NULL (logged) on out-of-memory
void llmq_gguf_writer_free(struct llmq_gguf_writer *w); // aborts an uncommitted output; NULL no-op

// Keys must be non-empty valid UTF-8. Only before begin().
enum llmq_status llmq_gguf_writer_set_u8(struct llmq_gguf_writer *w, const char *key, uint8_t v);
enum llmq_status llmq_gguf_writer_set_i8(struct llmq_gguf_writer *w, const char *key, int8_t v);
enum llmq_status llmq_gguf_writer_set_u16(struct llmq_gguf_writer *w, const char *key, uint16_t v);
enum llmq_status llmq_gguf_writer_set_i16(struct llmq_gguf_writer *w, const char *key, int16_t v);
enum llmq_status llmq_gguf_writer_set_u32(struct llmq_gguf_writer *w, const char *key, uint32_t v);
enum llmq_status llmq_gguf_writer_set_i32(struct llmq_gguf_writer *w, const char *key, int32_t v);
enum llmq_status llmq_gguf_writer_set_f32(struct llmq_gguf_writer *w, const char *key, float v);
enum llmq_status llmq_gguf_writer_set_bool(struct llmq_gguf_writer *w, const char *key, bool v);
enum llmq_status llmq_gguf_writer_set_u64(struct llmq_gguf_writer *w, const char *key, uint64_t v);
enum llmq_status llmq_gguf_writer_set_i64(struct llmq_gguf_writer *w, const char *key, int64_t v);
enum llmq_status llmq_gguf_writer_set_f64(struct llmq_gguf_writer *w, const char *key, double v);
// A NUL-terminated string (set_strn: n bytes, which may include NULs).
enum llmq_status llmq_gguf_writer_set_str(struct llmq_gguf_writer *w, const char *key, const char *s);
enum llmq_status llmq_gguf_writer_set_strn(struct llmq_gguf_writer *w, const char *key, const char *s, size_t n);
// An array of n fixed-size elements of type elem (not STRING / ARRAY), packed little-endian at data
// (n * llmq_gguf_type_size(elem) bytes; bool elements are single bytes). data may be NULL if n == 0.
enum llmq_status llmq_gguf_writer_set_arr(struct llmq_gguf_writer *w, const char *key, enum llmq_gguf_type elem,
                                          const void *data, uint64_t n);
// An array of n strings; lens may be NULL (then every strs[j] is NUL-terminated).
enum llmq_status llmq_gguf_writer_set_arr_str(struct llmq_gguf_writer *w, const char *key, const char *const *strs,
                                              const size_t *lens, uint64_t n);
// A copy of one KV of an opened reader (any type), re-encoded for version 3, under kv->key.
enum llmq_status llmq_gguf_writer_set_kv(struct llmq_gguf_writer *w, const struct llmq_gguf_kv *kv);
// Every KV of src in file order, except the keys listed in except (a NULL-terminated array of
// keys; except itself may be NULL).
enum llmq_status llmq_gguf_writer_copy_kvs(struct llmq_gguf_writer *w, const struct llmq_gguf *src,
                                           const char *const *except);

// Declares the next tensor: shape is OUTERMOST-FIRST (n_dims entries, 0..4, each >= 0; written
// reversed as ggml ne), the innermost dim must be a multiple of the dtype's block size, dtype must
// have a GGUF type id, name must be valid UTF-8 of 1..63 bytes and new. Only before begin().
enum llmq_status llmq_gguf_writer_add_tensor(struct llmq_gguf_writer *w, const char *name, enum llmq_dtype dtype,
                                             int n_dims, const int64_t *shape);
int64_t llmq_gguf_writer_n_tensors(const struct llmq_gguf_writer *w);
size_t llmq_gguf_writer_tensor_nbytes(const struct llmq_gguf_writer *w, int64_t i); // 0 if out of range

// Opens the temporary output and writes the placeholder header.
enum llmq_status llmq_gguf_writer_begin(struct llmq_gguf_writer *w, const char *path);
// begin() into a file of the caller's, part, instead of "<path>.tmp.<pid>": part is not registered for removal
// and survives abort(), free(), a failed commit and SIGINT / SIGTERM (quant/checkpoint.h keeps it in a checkpoint);
// commit() renames it onto path. done == 0 (offset 0): part is created (emptied). done > 0: a resume; part holds
// tensors 0..done-1 as this writer lays them out (the same KVs and tensors declared), offset must be where they
// end (their padding included; else LLMQ_ERR_CORRUPT naming part) and part at least that long; it is cut there
// and writing continues with tensor done. The header placeholder is part of those bytes; commit writes the header.
enum llmq_status llmq_gguf_writer_begin_part(struct llmq_gguf_writer *w, const char *path, const char *part,
                                             int64_t done, uint64_t offset);
// At a tensor boundary (no tensor partly written): flushes and fsyncs the output; *done = the tensors complete,
// *offset = the bytes they end at (what begin_part takes to continue). LLMQ_ERR_ARG inside a tensor.
enum llmq_status llmq_gguf_writer_sync(struct llmq_gguf_writer *w, int64_t *done, uint64_t *offset);
// Appends n bytes of tensor data: the bytes of tensor 0 first, then tensor 1, ...; a call may carry
// any part of one tensor but must not cross into the next one (LLMQ_ERR_ARG). Padding is automatic.
enum llmq_status llmq_gguf_writer_write_tensor(struct llmq_gguf_writer *w, const void *data, size_t n);
// Checks that every tensor was written completely (LLMQ_ERR_ARG otherwise), writes the header,
// fsyncs and renames onto the path. On failure the temporary file is removed.
enum llmq_status llmq_gguf_writer_commit(struct llmq_gguf_writer *w);
// Removes the temporary output (no-op if none is open). The writer can then only be freed.
void llmq_gguf_writer_abort(struct llmq_gguf_writer *w);

#endif // LLMQ_GGUF_H
