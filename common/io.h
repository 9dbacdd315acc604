/*
 * common/io.h — file plumbing shared by the format readers and writers.
 *
 * llmq_mmap: a read-only, private mapping of a whole input file (inputs are never modified).
 *   An empty file maps to data == NULL, size == 0.
 * llmq_afile: an atomic output file. Bytes go to "<path>.tmp.<pid>"; llmq_afile_commit() flushes,
 *   fsyncs, renames onto <path> (llmq_output_rename: exclusive unless --force, never onto an input) and
 *   fsyncs the directory; llmq_afile_abort(), a crash, SIGINT or SIGTERM leave <path> untouched. Writes are
 *   buffered; any write error is sticky and reported by commit.
 *
 * The output guard: one rule for every output path of a run (--out, --json, --save-logits, --imatrix-out,
 * statistics files, convert's output, and the files inside an output directory):
 *   - The run's inputs are recorded by device and inode: every file opened by llmq_mmap_open,
 *     llmq_read_file or llmq_file_sha256 (model files and shards, tokenizer and config files, calibration
 *     texts, imatrix and statistics files), and every path the command line names (llmq_input_add).
 *   - llmq_output_check, called before any work: an output that is an input (or, for a directory, holds
 *     one) is refused even with --force; an existing one is refused without --force; with --force only a
 *     regular file, or a directory llmq wrote (it holds LLMQ_OUTDIR_MARKER) or an empty one, is replaced.
 *     It also removes "<out>.tmp.<pid>" / "<out>.old.<pid>" left by processes that no longer run
 *     (kill(pid, 0) == ESRCH), and records whether out may be replaced.
 *   - The final rename (llmq_output_rename, called by llmq_afile_commit and llmq_outdir_publish) checks the
 *     inputs again and, for an output checked without --force, is exclusive (renameat2 RENAME_NOREPLACE,
 *     else link(2)): of two runs creating the same new path one succeeds, the other fails naming the path.
 *     A path never given to llmq_output_check (a test tool's) is renamed with rename(2), as before.
 *   - Temporaries (atomic files, staged directories) are registered while they exist; the handler that
 *     llmq_guard_begin_run installs removes them on SIGINT / SIGTERM, prints one line and exits 130 / 143.
 *     What is not registered stays: a quantization's checkpoint directory (quant/checkpoint.h), which that
 *     line then names with how to resume.
 * Not thread-safe: the driver thread checks, opens and commits outputs (the signal handler may run on
 * any thread and only reads the temporary list).
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
// Releases the resident pages of [p, p + n) when that range lies in a mapping of llmq_mmap_open
// (madvise(MADV_DONTNEED): the pages leave the process's RSS, a later read faults them in again from the
// file); anything else (heap memory: a dequantized view) is left alone. For streaming writers: the pages
// of weights already processed stop counting against a memory limit. The range is widened down to a 2 MiB
// boundary (a large folio's re-mapped tail; see common/io.c). Driver thread only.
void llmq_mmap_release(const void *p, size_t n);
// Drops the pages of a heap work buffer [p, p + n) whose contents the caller no longer needs: the whole pages
// inside the range leave the RSS (madvise(MADV_DONTNEED) on private anonymous memory) and read as zeros when
// touched again; the partial pages at both ends are kept. For C x C scratch that is rewritten before it is
// read again, so that a phase that does not use it does not hold it. NULL / 0: no-op.
void llmq_scratch_release(void *p, size_t n);

struct llmq_afile {
    FILE *fp;
    char *path;     // final path (owned)
    char *tmp_path; // temporary path (owned)
    uint64_t pos;   // bytes written so far (the current offset)
    int err;        // first errno seen, 0 if none
    bool keep;      // tmp_path is the caller's (llmq_afile_open_part): never registered, never unlinked
};

enum llmq_status llmq_afile_open(struct llmq_afile *f, const char *path);
enum llmq_status llmq_afile_write(struct llmq_afile *f, const void *buf, size_t n);
enum llmq_status llmq_afile_pad(struct llmq_afile *f, size_t n);      // n zero bytes
enum llmq_status llmq_afile_seek(struct llmq_afile *f, uint64_t off); // absolute
enum llmq_status llmq_afile_commit(struct llmq_afile *f);             // flush + fsync + rename; frees
void llmq_afile_abort(struct llmq_afile *f);                          // unlink the temp; frees; NULL-safe
// An atomic file whose temporary is the caller's file part, which survives signals, failures and abort (not
// registered, never unlinked: a quantization checkpoint's partial output, quant/checkpoint.h). off == 0: part is
// created (or emptied); else it must hold at least off bytes (LLMQ_ERR_CORRUPT naming it, nothing changed) and
// is cut to off, writing continues there. commit renames part onto path as llmq_afile_commit does (the guard's
// rules); a failed commit leaves part.
enum llmq_status llmq_afile_open_part(struct llmq_afile *f, const char *path, const char *part, uint64_t off);
// Flushes and fsyncs what was written so far; the file stays open.
enum llmq_status llmq_afile_sync(struct llmq_afile *f);

// Reads a whole (small) file into a NUL-terminated heap buffer, at most max_size bytes.
// Transparently gunzips files whose name ends in ".gz" (several concatenated gzip members read as one
// text, as gunzip does); a .gz that ends inside a member is LLMQ_ERR_TRUNCATED, a bad CRC or deflate
// stream LLMQ_ERR_CORRUPT, never a shorter text; a .gz that inflates to more than max(16 MiB, 200 x its
// size) LLMQ_ERR_OVERFLOW (text deflates ~3-10:1; a "gzip bomb" ~1000:1). A directory is LLMQ_ERR_IO.
// *out is owned by the caller (free()).
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
// The n bytes at s as a malloc'd NUL-terminated string (caller frees; bytes after a NUL inside are kept); NULL when
// out of memory.
char *llmq_strndup_bytes(const char *s, size_t n);
// Removes a file or directory tree, best effort (symbolic links are removed, not followed).
void llmq_remove_tree(const char *path);
// The file every output directory llmq creates holds (llmq_outdir_create): --force replaces only those.
#define LLMQ_OUTDIR_MARKER ".llmq-output"

// Records path as an input of this run (see above): a file, or a directory and the files directly in it.
// NULL or a path that does not exist: nothing. llmq_input_add_fd records an open file.
void llmq_input_add(const char *path);
void llmq_input_add_fd(int fd);
// Takes path back out of the inputs: for a file llmq reads and then rewrites as its own (a cache entry that
// was stale), never for a file the user named. Nothing when path is not recorded.
void llmq_input_forget(const char *path);
// The check of every output path (see above): in (NULL: none) is recorded as an input first; dir: out is
// a directory output. LLMQ_ERR_ARG with one line naming out when refused. *exists: whether out exists.
enum llmq_status llmq_output_check(const char *in, const char *out, bool dir, bool force, bool *exists);
// The same for a secondary output file (--json, --save-logits, --imatrix-out, ...).
enum llmq_status llmq_output_check_file(const char *out, bool force);
// Renames the finished tmp onto out under the guard's rules (see above). Logs and returns LLMQ_ERR_ARG
// (out is an input) or LLMQ_ERR_IO (out appeared meanwhile, or the rename failed); tmp is left then.
enum llmq_status llmq_output_rename(const char *tmp, const char *out, bool dir);
// fsync of the directory holding path (best effort).
void llmq_fsync_dir_of(const char *path);

// An output directory: llmq_outdir_create makes the empty "<out>.tmp.<pid>" (stale ones removed) holding
// LLMQ_OUTDIR_MARKER, *tmp (owned: free()) names it. llmq_outdir_publish renames it onto out (an
// existing out, when replace, is moved aside first and removed after the rename succeeded) and fsyncs the
// parent; on failure tmp is left to the caller, who removes it with llmq_outdir_discard.
enum llmq_status llmq_outdir_create(const char *out, char **tmp);
enum llmq_status llmq_outdir_publish(const char *tmp, const char *out, bool replace);
void llmq_outdir_discard(const char *tmp); // NULL: no-op

// The temporaries the signal handler removes (at most 64 live at once; more are not tracked).
void llmq_temp_register(const char *path, bool dir);
void llmq_temp_unregister(const char *path);
// The start of a command of the llmq executable (cli/main.c): from now on inputs are recorded (before it,
// in a library user or a test, llmq_input_add and the readers record nothing and only llmq_output_check's
// `in` is compared), and SIGINT / SIGTERM remove every registered temporary, print one line and
// _exit(128 + signal).
void llmq_guard_begin_run(void);
// What the SIGINT / SIGTERM handler's line says after "temporary outputs removed; " instead of ", nothing
// written" (what was kept and how to continue: a quantization's checkpoint, quant/checkpoint.h); NULL clears
// it. Copied (at most 1023 bytes); driver thread.
void llmq_guard_set_note(const char *line);

// Whether s ends with suffix (byte comparison; "" is a suffix of every string).
bool llmq_ends_with(const char *s, const char *suffix);
// SHA-256 of a file's bytes as stored (a .gz is hashed compressed), streamed, as lower-case hex into
// hex (65 bytes). Unreadable: LLMQ_ERR_IO naming path.
enum llmq_status llmq_file_sha256(const char *path, char hex[65]);

// Strict UTF-8 validation (no overlongs, no surrogates, max U+10FFFF).
bool llmq_utf8_valid(const char *s, size_t n);

#endif // LLMQ_IO_H
