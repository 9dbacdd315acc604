/*
 * formats/safetensors.h — read and write safetensors checkpoints (single files and sharded sets).
 *
 * What it is: an mmap reader that validates the header of every file completely before handing
 * out views into the mapping, and a streaming, atomic writer that shards at a size limit the way
 * Hugging Face checkpoints do. What it is not: it never converts dtypes, never reads tensor data
 * while opening (opening a 100 GB checkpoint touches only the headers), and never modifies its input.
 *
 * ---- Byte layout of one .safetensors file (huggingface/safetensors README, "Format") -----------
 *
 *   offset 0      u64 little-endian N: byte length of the JSON header
 *   offset 8      N bytes of UTF-8 JSON, starting with '{', optionally padded at the end with
 *                 spaces (0x20); the writer pads so that 8 + N is a multiple of 8
 *   offset 8+N    the data section: the bytes of every tensor, back to back
 *
 *   The header is one JSON object:
 *     { "__metadata__": { "format": "pt", ... },            optional, string -> string only
 *       "<tensor name>": { "dtype": "BF16",                 F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL
 *                          "shape": [576, 49152],           outermost first; [] is a scalar
 *                          "data_offsets": [begin, end] },  relative to the data section start
 *       ... }
 *   Little-endian, row-major (C order) data. The tensors' [begin, end) ranges must cover the data
 *   section exactly: sorted by begin, the first starts at 0, each starts where the previous ended,
 *   the last ends at the end of the file (no gaps, no overlaps, no trailing bytes — the spec forbids
 *   holes so that a file cannot be a polyglot). Zero-size tensors have begin == end.
 *
 * ---- Sharded checkpoints ---------------------------------------------------------------------
 *
 *   <dir>/model-00001-of-00003.safetensors ... model-00003-of-00003.safetensors, each a complete
 *   safetensors file, plus <dir>/model.safetensors.index.json:
 *     { "metadata": { "total_size": <sum of all tensor bytes> },
 *       "weight_map": { "<tensor name>": "model-00001-of-00003.safetensors", ... } }
 *   Shard names are plain file names in the index's directory: a name containing '/' or ".." is
 *   rejected (the reader never leaves that directory).
 *
 * ---- Validation (every check has a handcrafted test file in tests/unit/test_safetensors.c) -----
 *
 *   Every failure logs ONE line "<file>: <problem>" (with the tensor name / offset where there is
 *   one) through llmq_errorf and returns:
 *     file shorter than 8 bytes                                   LLMQ_ERR_TRUNCATED
 *     header length N > LLMQ_ST_MAX_HEADER (100,000,000)          LLMQ_ERR_OVERFLOW
 *     8 + N past the end of the file                              LLMQ_ERR_TRUNCATED
 *     header not valid UTF-8                                      LLMQ_ERR_CORRUPT
 *     header not starting with '{', not JSON, not an object,
 *       or followed by anything but whitespace                    LLMQ_ERR_CORRUPT
 *     the same key twice in a JSON object (tensor or metadata)    LLMQ_ERR_DUPLICATE
 *     __metadata__ not an object, or a non-string value           LLMQ_ERR_CORRUPT
 *     entry not an object / missing or mistyped dtype, shape,
 *       data_offsets                                              LLMQ_ERR_CORRUPT
 *     a dim that is not a non-negative integer                    LLMQ_ERR_CORRUPT
 *     an integer too large for int64 anywhere in the header       LLMQ_ERR_OVERFLOW
 *     shape product or shape x dtype size overflows int64         LLMQ_ERR_OVERFLOW
 *     data_offsets not [begin, end] integers with 0 <= begin <= end   LLMQ_ERR_CORRUPT
 *     unknown dtype string (F8_E4M3, U16, ...)                    LLMQ_ERR_UNSUPPORTED
 *     shape x dtype size != end - begin                           LLMQ_ERR_CORRUPT
 *     end past the end of the data section                        LLMQ_ERR_TRUNCATED
 *     more than LLMQ_MAX_DIMS (4) dims                            LLMQ_ERR_UNSUPPORTED
 *     overlapping ranges, gaps, bytes after the last tensor       LLMQ_ERR_CORRUPT
 *   and for an index.json:
 *     unreadable index file                                       LLMQ_ERR_IO
 *     larger than LLMQ_ST_MAX_HEADER, or an integer too large     LLMQ_ERR_OVERFLOW
 *     not JSON / not an object / no "weight_map" object /
 *       a weight_map value that is not a string / a shard name
 *       that is empty or contains '/' or ".."                     LLMQ_ERR_CORRUPT
 *     a duplicate key in the index                                LLMQ_ERR_DUPLICATE
 *     a shard file that does not exist                            LLMQ_ERR_NOT_FOUND
 *     a listed tensor absent from its shard                       LLMQ_ERR_NOT_FOUND
 *     the same tensor name in two shards                          LLMQ_ERR_DUPLICATE
 *     a shard tensor the index does not map to that shard         LLMQ_ERR_CORRUPT
 *   plus LLMQ_ERR_IO (open/stat/mmap failed), LLMQ_ERR_NOT_FOUND (no such path), LLMQ_ERR_NOMEM,
 *   LLMQ_ERR_ARG (a directory with several *.safetensors and no index).
 *   Deliberately stricter than the reference reader (huggingface/safetensors), which keeps one of
 *   two duplicate names, accepts leading whitespace and any number of dims; checked in
 *   tests/py/test_safetensors_oracle.py together with every case both implementations reject.
 *
 * Thread safety: a model is immutable after llmq_st_open and may be read from many threads.
 */
#ifndef LLMQ_FORMATS_SAFETENSORS_H
#define LLMQ_FORMATS_SAFETENSORS_H

#include "common/status.h"
#include "common/tensor.h"

#include <stdint.h>

#define LLMQ_ST_MAX_HEADER 100000000ull // bytes; the same limit as the reference implementation
#define LLMQ_ST_INDEX_NAME "model.safetensors.index.json"
#define LLMQ_ST_SINGLE_NAME "model.safetensors"

// ================================================================================== reader ====

struct llmq_st_model; // opaque: the mapped shards, their parsed headers and a name index

// One file of a checkpoint (a single-file checkpoint has exactly one shard).
struct llmq_st_shard_info {
    const char *path;      // path of the shard file as opened (the index dir joined with its name)
    const char *file_name; // the last path component ("model-00001-of-00002.safetensors")
    uint64_t file_size;    // bytes
    uint64_t header_len;   // N, the JSON header length including its padding
    uint64_t data_start;   // 8 + N: file offset of the data section
    int64_t n_tensors;     // tensors stored in this shard
};

/*
 * Opens a checkpoint. `path` is one of:
 *   - a .safetensors file (any name): a single-file checkpoint;
 *   - an index file (a name ending in ".json", normally model.safetensors.index.json): a sharded
 *     checkpoint whose shards live next to the index;
 *   - a directory, searched in this order: model.safetensors, model.safetensors.index.json, else
 *     the only *.safetensors file in it (none: LLMQ_ERR_NOT_FOUND; several: LLMQ_ERR_ARG).
 * Maps every shard read-only and validates every header (see the table above). Tensor data is
 * not read. On success *out owns the mappings and must be released with llmq_st_free(); on failure
 * *out is NULL and one error line was logged.
 */
enum llmq_status llmq_st_open(const char *path, struct llmq_st_model **out);

// Unmaps and frees everything; every pointer obtained from the model dies with it. NULL: no-op.
void llmq_st_free(struct llmq_st_model *m);

/*
 * Tensors, in file order: shards in index order (sorted by file name), and inside a shard in the
 * order of its JSON header. llmq_st_tensor returns NULL when i is out of range. The view's name,
 * and its data (a pointer into the read-only mapping; nbytes bytes, little-endian, row-major,
 * NOT aligned beyond what the file provides), live as long as the model. file_offset is the
 * absolute offset of the data in its shard file.
 */
int64_t llmq_st_n_tensors(const struct llmq_st_model *m);
const struct llmq_tensor_view *llmq_st_tensor(const struct llmq_st_model *m, int64_t i);

// Index of the tensor called `name` (hash lookup, O(1)), or -1 when there is none.
int64_t llmq_st_find(const struct llmq_st_model *m, const char *name);
// The view of tensor `name`, or NULL when there is none (nothing is logged: absence is not an error).
const struct llmq_tensor_view *llmq_st_get(const struct llmq_st_model *m, const char *name);

// Shards: their count, the info of shard s (NULL when out of range), and the shard of tensor i
// (-1 when i is out of range).
int llmq_st_n_shards(const struct llmq_st_model *m);
const struct llmq_st_shard_info *llmq_st_shard(const struct llmq_st_model *m, int s);
int llmq_st_tensor_shard(const struct llmq_st_model *m, int64_t i);

/*
 * The __metadata__ string map. For a sharded checkpoint it is the union over the shards in shard
 * order; when two shards disagree on a key the first shard's value wins. Keys keep header order.
 * Pointers live as long as the model. llmq_st_metadata_get returns NULL when the key is absent.
 */
int64_t llmq_st_n_metadata(const struct llmq_st_model *m);
const char *llmq_st_metadata_key(const struct llmq_st_model *m, int64_t i);   // NULL if out of range
const char *llmq_st_metadata_value(const struct llmq_st_model *m, int64_t i); // NULL if out of range
const char *llmq_st_metadata_get(const struct llmq_st_model *m, const char *key);

// Sum of nbytes over all tensors (the index's "total_size" when it is right).
uint64_t llmq_st_total_bytes(const struct llmq_st_model *m);
// The path given to llmq_st_open, and the index path (NULL for a single-file checkpoint).
const char *llmq_st_path(const struct llmq_st_model *m);
const char *llmq_st_index_path(const struct llmq_st_model *m);

// ================================================================================== writer ====

/*
 * A streaming, atomic writer for a checkpoint directory. Two phases, so that a caller producing
 * one tensor at a time never holds them all:
 *
 *   1. declare: llmq_st_writer_set_metadata() and llmq_st_writer_add_tensor() in any mix. Each
 *      call validates its input (names unique and valid UTF-8, dtypes safetensors dtypes, sizes
 *      free of overflow); a rejected call logs, returns its status and changes nothing.
 *   2. data: llmq_st_writer_write() / llmq_st_writer_write_tensor() deliver every tensor's bytes
 *      in the declared order. The first data call fixes the layout (no more declarations):
 *      tensors are assigned to shards greedily in declared order, a new shard starting when the
 *      next non-empty tensor would push the current shard's data bytes past max_shard_bytes (a
 *      tensor larger than the limit gets a shard of its own); max_shard_bytes == 0 means no limit.
 *   3. llmq_st_writer_finish() checks every byte arrived, then renames all shards into place
 *      (and writes the index last); or llmq_st_writer_abort() removes everything.
 *
 * Output in `dir` (which must exist):
 *   one shard:   model.safetensors
 *   N > 1:       model-00001-of-0000N.safetensors ... + model.safetensors.index.json
 * Each shard's header is {"__metadata__": {...}, tensors in declared order}, compact JSON padded
 * with spaces so that the data section starts at a multiple of 8; __metadata__ (omitted when
 * empty) is repeated in every shard. Shard data holds the tensors back to back in declared order.
 *
 * Atomicity: bytes go to "<final>.tmp.<pid>" files (common/io.h llmq_afile); nothing appears at a
 * final path before finish has written and fsynced every shard. A failed data call poisons the
 * writer: later calls return the same status, and finish removes the temporaries. Every shard
 * keeps one open file until finish. After a successful finish, files of an earlier checkpoint in
 * `dir` that this one did not produce (model.safetensors, model.safetensors.index.json,
 * model-NNNNN-of-NNNNN.safetensors) are removed, so that the directory never holds two checkpoints
 * that disagree; no other file is touched.
 */
struct llmq_st_writer;

// Creates a writer into directory dir. *out must be released by finish or abort.
enum llmq_status llmq_st_writer_init(const char *dir, uint64_t max_shard_bytes, struct llmq_st_writer **out);

// Adds __metadata__ key -> value (both UTF-8; copied). A repeated key is LLMQ_ERR_DUPLICATE.
enum llmq_status llmq_st_writer_set_metadata(struct llmq_st_writer *w, const char *key, const char *value);

/*
 * Declares the next tensor: name (copied; non-empty UTF-8, not "__metadata__", unique:
 * LLMQ_ERR_DUPLICATE otherwise), dtype (one of the 10 safetensors dtypes, else
 * LLMQ_ERR_UNSUPPORTED), shape[n_dims] outermost first (0 <= n_dims <= LLMQ_MAX_DIMS, dims >= 0;
 * n_dims == 0 is a scalar). Its byte size is nelements x dtype size (LLMQ_ERR_OVERFLOW if that
 * overflows). LLMQ_ERR_ARG after the data phase began.
 */
enum llmq_status llmq_st_writer_add_tensor(struct llmq_st_writer *w, const char *name, enum llmq_dtype dtype,
                                           int n_dims, const int64_t *shape);

/*
 * Appends n bytes to the data stream: the bytes of the declared tensors concatenated in declared
 * order. A tensor may arrive in several pieces, and one call may span several tensors.
 * Writing past the last declared byte is LLMQ_ERR_ARG.
 */
enum llmq_status llmq_st_writer_write(struct llmq_st_writer *w, const void *data, size_t n);

// Writes all nbytes of the next tensor at once, checking that it is the tensor called `name`, that
// none of it was written yet and that nbytes is its size (LLMQ_ERR_ARG otherwise).
enum llmq_status llmq_st_writer_write_tensor(struct llmq_st_writer *w, const char *name, const void *data,
                                             size_t nbytes);

// Number of shards the layout produces (fixes the layout like a data call does); 0 on error.
int llmq_st_writer_n_shards(struct llmq_st_writer *w);

/*
 * Completes the checkpoint: LLMQ_ERR_ARG if a declared tensor is incomplete; otherwise commits
 * (fsync + rename) every shard in order, then the index. Always frees w, success or not; on
 * failure the temporaries are removed. (If a rename itself fails part-way, shards renamed before
 * it stay, but the index — written last — does not.)
 */
enum llmq_status llmq_st_writer_finish(struct llmq_st_writer *w);

// Removes every temporary file and frees w. Nothing is left at the final paths. NULL: no-op.
void llmq_st_writer_abort(struct llmq_st_writer *w);

#endif // LLMQ_FORMATS_SAFETENSORS_H
