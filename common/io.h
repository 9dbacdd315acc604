/*
 * common/io.h — file plumbing shared by the format readers and writers.
 *
 * llmq_mmap: a read-only, private mapping of a whole input file (inputs are never modified).
 *   An empty file maps to data == NULL, size == 0.
 * llmq_afile: an atomic output file. Bytes go to "<path>.tmp.<pid>"; llmq_afile_commit() flushes,
 *   fsyncs, renames over <path> and fsyncs the directory; llmq_afile_abort() (or a crash) leaves
 *   <path> untouched. Writes are buffered; any write error is sticky and reported by commit.
 */
#ifndef LLMQ_IO_H
#define LLMQ_IO_H

#include "common/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct llmq_mmap {
    const uint8_t *data; // (size) bytes, read-only
    size_t size;
    char *path; // owned copy of the path, for messages
};

// Maps path read-only. On failure logs "<path>: <reason>" and returns LLMQ_ERR_IO.
enum llmq_status llmq_mmap_open(struct llmq_mmap *m, const char *path);
void llmq_mmap_close(struct llmq_mmap *m); // safe on a zeroed struct

struct llmq_afile {
    FILE *fp;
    char *path;     // final path (owned)
    char *tmp_path; // temporary path (owned)
    uint64_t pos;   // bytes written so far (the current offset)
    int err;        // first errno seen, 0 if none
};

enum llmq_status llmq_afile_open(struct llmq_afile *f, const char *path);
enum llmq_status llmq_afile_write(struct llmq_afile *f, const void *buf, size_t n);
enum llmq_status llmq_afile_pad(struct llmq_afile *f, size_t n);      // n zero bytes
enum llmq_status llmq_afile_seek(struct llmq_afile *f, uint64_t off); // absolute
enum llmq_status llmq_afile_commit(struct llmq_afile *f);             // flush + fsync + rename; frees
void llmq_afile_abort(struct llmq_afile *f);                          // unlink the temp; frees; NULL-safe

// Reads a whole (small) file into a NUL-terminated heap buffer, at most max_size bytes.
// Transparently gunzips files whose name ends in ".gz" (several concatenated gzip members read as one
// text, as gunzip does); a .gz that ends inside a member is LLMQ_ERR_TRUNCATED, a bad CRC or deflate
// stream LLMQ_ERR_CORRUPT, never a shorter text. *out is owned by the caller (free()).
enum llmq_status llmq_read_file(const char *path, size_t max_size, char **out, size_t *out_size);

// Writes a jansson value as text (json_dumps with dump_flags, then a newline) to path atomically
// (llmq_afile). Logs and returns the status on failure; nothing is left at path then.
struct json_t;
enum llmq_status llmq_write_json(const char *path, const struct json_t *j, size_t dump_flags);

// Reads a JSON object (duplicate keys rejected) of at most max_size bytes from path into *out (owned:
// json_decref). Not JSON or not an object: LLMQ_ERR_CORRUPT naming path, line and column; *out NULL.
enum llmq_status llmq_read_json_object(const char *path, size_t max_size, struct json_t **out);

bool llmq_is_dir(const char *path);
bool llmq_file_exists(const char *path);
// Joins dir and name with one '/', into a malloc'd string (NULL on OOM).
char *llmq_path_join(const char *dir, const char *name);
// Removes a file or directory tree, best effort (symbolic links are removed, not followed).
void llmq_remove_tree(const char *path);
// The rule for every output path: out may not be the input; an existing out is refused (LLMQ_ERR_ARG,
// "use --force") unless force, and even then only a regular file (dir false) or a directory holding
// config.json or nothing (dir true) is replaced, anything else refused rather than deleted.
// *exists: whether out exists.
enum llmq_status llmq_output_check(const char *in, const char *out, bool dir, bool force, bool *exists);
// Whether s ends with suffix (byte comparison; "" is a suffix of every string).
bool llmq_ends_with(const char *s, const char *suffix);
// SHA-256 of a file's bytes as stored (a .gz is hashed compressed), streamed, as lower-case hex into
// hex (65 bytes). Unreadable: LLMQ_ERR_IO naming path.
enum llmq_status llmq_file_sha256(const char *path, char hex[65]);

// Strict UTF-8 validation (no overlongs, no surrogates, max U+10FFFF).
bool llmq_utf8_valid(const char *s, size_t n);

#endif // LLMQ_IO_H
