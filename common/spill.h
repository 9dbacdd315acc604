/*
 * common/spill.h — the big activation buffers (calibration activations at a block boundary, the
 * forward pass's per-token intermediates) under a memory budget: `--max-memory`.
 *
 * What it is: an allocator for buffers whose size grows with the number of calibration tokens. While
 * the sum of the live buffers stays within the budget they are ordinary heap memory; a buffer that
 * would exceed it is placed in a temporary file instead (created in $LLMQ_SPILL_DIR, else $TMPDIR,
 * else /tmp, unlinked at once, its blocks allocated with posix_fallocate so that a full disk is an error
 * naming the directory and the bytes rather than a SIGBUS later, mapped shared), so the kernel can write
 * its pages out rather than hold them in RAM. Nothing is left on disk after exit, even after a crash (the
 * file has no name). Without a budget nothing is spilled: a failed allocation is an error.
 * What it is not: a limit on everything. Weights, Hessians (C × C) and work buffers of one layer are
 * ordinary allocations outside the budget; the budget bounds what grows with --nsamples × --seqlen.
 * Speed and RSS: spilled buffers are read and written through the page cache. Their pages may still
 * count in the process's RSS while the cache holds them, but they are file-backed: the kernel can write
 * them out and drop them under memory pressure (no swap needed), which anonymous heap memory cannot.
 * With a budget far below the activations and real memory pressure, runs get slower (disk-bound) but
 * finish. Results are bit-identical with and without a budget.
 *
 * Thread safety: llmq_spill_configure before starting work; alloc/free may be called from any one
 * thread at a time (the counters are not atomic; llmq allocates these buffers from the driver thread).
 */
#ifndef LLMQ_SPILL_H
#define LLMQ_SPILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

// max_bytes: budget for the live big buffers held in RAM; 0 = unlimited (the default).
void llmq_spill_configure(uint64_t max_bytes);
uint64_t llmq_spill_budget(void); // the configured budget (0: none)
// The directory spill files go to: $LLMQ_SPILL_DIR, else $TMPDIR, else /tmp (a static or environment string).
const char *llmq_spill_dir(void);

// Parses "123", "512K", "4M", "8G", "1T" (powers of 1024; a trailing "B" / "iB" allowed) into bytes.
// false (and *out untouched) on anything else.
bool llmq_parse_bytes(const char *s, uint64_t *out);

// n bytes, 64-byte aligned, uninitialised; NULL when neither memory nor (with a budget) a spill file is
// available (logged with `what`). Free with llmq_big_free only.
void *llmq_big_alloc(size_t n, const char *what);
void llmq_big_free(void *p); // NULL: no-op

// Before allocating `bytes` of big buffers (what: for the message): without a budget, refuses more than
// the machine's physical memory; with one, refuses when the part beyond it does not fit in the spill
// directory's free space (statvfs). LLMQ_ERR_NOMEM / LLMQ_ERR_IO with the numbers, else LLMQ_OK.
enum llmq_status llmq_spill_preflight(uint64_t bytes, const char *what);
// Physical memory of the machine in bytes (sysconf), 0 when unknown.
uint64_t llmq_phys_mem_bytes(void);

// Bytes currently in RAM / in spill files, and the largest amount ever spilled (for reports).
uint64_t llmq_spill_ram_bytes(void);
uint64_t llmq_spill_file_bytes(void);
uint64_t llmq_spill_peak_file_bytes(void);

#endif // LLMQ_SPILL_H
