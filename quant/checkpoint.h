/*
 * quant/checkpoint.h — the resumable state of `llmq quantize` (quant/quantize.h "Checkpoint and resume"): a
 * directory "<out>.partial" next to the output that holds, after every finished block, what the block loop
 * needs to continue without redoing it, and the replay of that state into a fresh writer.
 *
 * What it is: a recorder (every linear the pipeline hands to the writer, exactly as handed over, and the
 * block's non-linear tensors the writer reads meanwhile), a commit per block (the next block's input
 * activations and the report rows with it), a fingerprint check and a replay. What it is not: no solver and
 * no writer: a resumed run replays the saved blocks through quant/writer.h in their order, so the writer
 * produces the bytes it would have produced without the interruption, then the pipeline continues at the
 * next block from the saved activations.
 *
 * Why this is enough for byte-identical output: between blocks the pipeline's only state is the block
 * input x (N, D) (GPTQ: of the quantized model so far, AWQ / RTN: of the full-precision model), the report
 * rows and the bit count (a mixture of experts: and the coverage report's rows and fallback count; its
 * statistics, routed counts and held expert results are the block's own, rebuilt by the block that needs
 * them); the calibration windows are drawn once from --seed before block 0 (there is no RNG state after that), so a
 * resumed run draws them again and the fingerprint's tokens_sha256 proves they are the same; everything else (the GGUF
 * plan and its importance, the forward objects) is rebuilt from the same model and options. What the writer receives
 * per block is replayed bit for bit.
 *
 * ---- Layout of <out>.partial/ ----------------------------------------------------------------------------
 *   .llmq-output       the marker of a directory llmq wrote (common/io.h): only such a directory is resumed
 *                      or replaced by --force
 *   state.json         the commit point, replaced atomically after each block:
 *                      {"format": 1, "n_layer", "next_block": k, "fingerprint": {...},
 *                       "blocks": [{"file", "bytes", "sha256"}] (k entries: blocks 0..k-1),
 *                       "x": {"file", "bytes", "sha256"} or null (no calibration, or k == n_layer)}
 *   block-LLLLL.bin    what block L handed to the writer (below)
 *   x-LLLLL.bin        (N, D) f32, host order: block L's input activations (L = next_block)
 *   Files are written as "<name>.tmp.<pid>", fsynced and renamed (common/io.h llmq_afile); a block's file and
 *   its activations are in place before state.json names them, and the previous activations are removed
 *   after; so a kill at any instant leaves a state.json that names complete files. Leftovers (temporaries,
 *   files state.json does not name) are removed when the checkpoint is resumed.
 *
 * ---- block-LLLLL.bin (host byte order and sizes: read back on the machine that wrote it) ------------------
 *   magic "LLMQCKB1", layer i64, then records, each a 4-byte tag:
 *     "TENS"  role i32 (0 attn_norm, 1 ffn_norm, 2 bq, 3 bk, 4 bv, 5 q_norm, 6 k_norm, 7 attn_post_norm,
 *             8 ffn_post_norm, 9 router, 10 shexp_gate), dtype i32, nbytes i64, the bytes: the view the writer
 *             reads while the block's linears are handed over (quant/writer.h "Order of reads": AWQ's folded
 *             norms and v bias, a moe block's router and qwen2_moe's shared expert gate with AWQ's scales in
 *             their columns), taken at the block's first linear; one per tensor the model has
 *     "LINR"  which i32, kind i32 (enum llmq_qpayload_kind), then
 *             CODES: R, C i64, bits, group_size, sym i32, n_groups i64, q (R, C): one code per byte, or two
 *                    (low nibble first, the last byte's high nibble 0 when R * C is odd) when bits <= 4,
 *                    scales f32 (R, ng), zeros f32 (R, ng), g_idx i32 (C)
 *             ROWS:  nbytes i64 (R * the row bytes of the target type), the encoded rows
 *             F32:   n i64 (R * C), f32 (R, C)
 *     "EXPT"  a moe block's expert linear (quant/writer.h llmq_qwriter_put_expert): which i32 (gate, up, down),
 *             expert i64, then kind and the payload as "LINR"'s, against the writer's expert target; in the order
 *             the pipeline handed them over (between and after the block's "LINR" records)
 *     "JSON"  nbytes i64, text {"rows": [the block's report rows], "bits_total": the run's total so far}; a moe
 *             run adds "moe": {"layers": [the block's rows of the report's coverage "moe.layers" (routed tokens
 *             per expert, under the floor)], "fallback_rtn": the run's count so far}
 *     "END."
 *   Every count is checked against the model and the writer's target before anything is allocated, and the
 *   file's sha256 against state.json.
 *
 * ---- Fingerprint -------------------------------------------------------------------------------------------
 *   {"llmq_version", "model": the real path of the model and, per file it reads (the file, or a directory's
 *   *.safetensors / *.json / *.model), size and mtime in ns, "settings": the run's provenance (every option
 *   that changes bytes, the calibration sources' sha256 and tokens_sha256, the imatrix's sha256, the
 *   threads), "run": backend, micro-batch, threads and the writer options outside the provenance}. A resume
 *   whose fingerprint differs is refused naming the first differing entry with both values.
 *
 * ---- Size and cost -----------------------------------------------------------------------------------------
 *   The blocks hold the payloads as handed over (directory formats: the codes two per byte up to 4 bits, else
 *   one, with f32 scales and zeros; GGUF: the linears' bytes; a moe block: every expert's too), plus one copy of
 *   the activations (N x D x 4 bytes), written once per block. Memory: none beyond a 32 KiB packing buffer (each
 *   linear, an expert's included, is streamed into the block's file as it is handed over).
 *
 * ---- The writer-only run (rtn into GGUF: no block loop) ----------------------------------------------------
 *   The writer encodes every tensor from the model's views in file order, so its state is the output itself:
 *   the output streams into "<out>.partial/output.gguf.part" (formats/gguf.h llmq_gguf_writer_begin_part: not
 *   "<out>.tmp.<pid>", which the signal handler removes) and is renamed onto out when complete. state.json,
 *   {"format": 1, "kind": "gguf-stream", "file": "output.gguf.part", "n_tensors", "tensors_done": k, "offset":
 *   the bytes that hold tensors 0..k-1 (the zero header placeholder included), "fingerprint"}, is written after
 *   the first tensor that brings the bytes written since the last commit to LLMQ_CKPT_STREAM_SYNC_BYTES, once the
 *   file is fsynced (a state never names bytes not on disk). A resume checks the fingerprint, checks that offset
 *   is where tensor k starts in this run's layout, cuts the file there (a killed run leaves bytes after it) and
 *   continues at tensor k: the encoders are deterministic, the header is written last from this run's KVs and
 *   tensor infos, so the file has the uninterrupted run's bytes. The importance of rtn --calib is gathered again
 *   by the resumed run (one calibration pass), from the same windows: tokens_sha256 and the threads are in the
 *   fingerprint; an --imatrix is in it by its sha256. The partial file is not hashed (reading it back would cost
 *   as much as writing it): the checks are its length and the fingerprint. Size: state.json (under 1 KB for one
 *   model file) next to the partial output, which is the output's own file: no disk beyond the output.
 *
 * ---- Fault injection (tests/py/test_resume.py) ------------------------------------------------------------
 *   LLMQ_CKPT_KILL_AT=K in the environment: the process sends itself SIGKILL at the K-th checkpoint event
 *   (1-based: each linear recorded, an expert's included, each block file, activation file and state.json
 *   committed, each old activation file removed), i.e. at a reproducible point of the block loop; the writer-only
 *   run: one event per tensor written (after its state.json when it committed one). Unset or 0: nothing.
 *   LLMQ_CKPT_SYNC_BYTES=N: the writer-only run commits every N bytes instead of 16 MiB
 *   (llmq_ckpt_stream_sync_bytes; the small test models' outputs commit too).
 *
 * Errors: one log line naming the checkpoint path and a status; nothing here touches the output itself.
 * Driver thread only.
 */
#ifndef LLMQ_QUANT_CHECKPOINT_H
#define LLMQ_QUANT_CHECKPOINT_H

#include "calib/model/model.h"
#include "common/status.h"
#include "quant/writer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct llmq_quantize_opts;
struct llmq_ckpt; // opaque

// The writer-only run's commit interval: state.json after the first tensor that brings the bytes written since
// the last commit to this many (see "The writer-only run").
#define LLMQ_CKPT_STREAM_SYNC_BYTES ((uint64_t)16 << 20)

// The commit interval a run uses: LLMQ_CKPT_STREAM_SYNC_BYTES, or LLMQ_CKPT_SYNC_BYTES=N (> 0) from the
// environment (fault injection, like LLMQ_CKPT_KILL_AT: the tests' small models commit after fewer bytes; the
// output's bytes are the same whatever the interval).
uint64_t llmq_ckpt_stream_sync_bytes(void);

// The checks that need no model (the CLI's, before loading it): an existing "<out>.partial" is refused
// without resume or force (the message says both), and so is one that is not a directory.
enum llmq_status llmq_ckpt_check(const char *out, bool resume, bool force);

// The run's fingerprint (see "Fingerprint") from the model, the options and the provenance settings (the
// object the output records); a new object (json_decref).
json_t *llmq_ckpt_fingerprint(const struct llmq_model *m, const struct llmq_quantize_opts *o, const json_t *settings);

// Opens the checkpoint of output `out` for a run of n_layer blocks. resume and an existing checkpoint: its
// fingerprint must equal fp (else LLMQ_ERR_ARG naming what differs; nothing is changed), *next_block = the
// first block not done. Otherwise a new, empty one (force replaces an existing one; resume without one
// starts at block 0, logged), *next_block = 0. The directory goes through the output guard (common/io.h:
// never an input or a directory holding one, exclusive creation, only a directory llmq wrote is replaced)
// and is locked (flock) against a second run. Logs its path; sets the line the signal handler prints.
enum llmq_status llmq_ckpt_open(const char *out, const json_t *fp, bool resume, bool force, int64_t n_layer,
                                struct llmq_ckpt **ck, int64_t *next_block);

// Records the weight set of block `layer` as just handed to the writer (llmq_qwriter_put_block): its non-linear
// tensors (norms, biases) as ly's views hold them. Called once per block, before its first linear.
enum llmq_status llmq_ckpt_put_block(struct llmq_ckpt *ck, int64_t layer, const struct llmq_layer *ly);

// Records linear `which` of block `layer` as just handed to w (p exactly as given to llmq_qwriter_put_linear;
// only read). Without an earlier llmq_ckpt_put_block the block's non-linear tensors are recorded from m's views.
enum llmq_status llmq_ckpt_put_linear(struct llmq_ckpt *ck, const struct llmq_model *m, const struct llmq_qwriter *w,
                                      int64_t layer, enum llmq_linear which, const struct llmq_qpayload *p);

// Records expert `expert`'s linear `which` (GATE, UP, DOWN) of moe block `layer` as just handed to w
// (llmq_qwriter_put_expert; p only read), as llmq_ckpt_put_linear does a dense one. Streamed to the block's file:
// nothing of it is kept in memory.
enum llmq_status llmq_ckpt_put_expert(struct llmq_ckpt *ck, const struct llmq_model *m, const struct llmq_qwriter *w,
                                      int64_t layer, enum llmq_linear which, int64_t expert,
                                      const struct llmq_qpayload *p);

// Commits block `layer` (the next one due): its recorded linears, the report rows layers[from..] and
// bits_total, moe's (the run's coverage report; NULL for a dense model) rows "layers"[moe_from..] and
// "fallback_rtn", and x (n_x floats, the next block's input; NULL: none). After it returns, a kill resumes at
// layer + 1.
enum llmq_status llmq_ckpt_commit_block(struct llmq_ckpt *ck, int64_t layer, const json_t *layers, size_t from,
                                        double bits_total, const json_t *moe, size_t moe_from, const float *x,
                                        int64_t n_x);

// Replays blocks 0..next_block-1 into w, in order (each block's saved non-linear tensors handed over with
// llmq_qwriter_put_block before its linears, in a copy of m's block; m is not changed), appends their report rows to
// layers (moe, NULL for a dense model: their coverage rows to its "layers", its "fallback_rtn" set), sets
// *bits_total, and reads the saved activations into x (n_x floats; NULL when the run has none). A file that does not
// match state.json or the model is LLMQ_ERR_CORRUPT naming it (the caller aborts the writer).
enum llmq_status llmq_ckpt_replay(struct llmq_ckpt *ck, const struct llmq_model *m, struct llmq_qwriter *w,
                                  json_t *layers, json_t *moe, double *bits_total, float *x, int64_t n_x);

// ---- the writer-only run (see "The writer-only run") ----
// Opens the checkpoint of a writer-only GGUF run onto out: the guard, the lock, the refusals and the fingerprint
// check of llmq_ckpt_open. *done, *offset: the tensors the partial output llmq_ckpt_stream_part holds and the
// bytes they end at (0, 0: a new output, or resume without a checkpoint), for quant/gguf_export.h's stream.
enum llmq_status llmq_ckpt_open_stream(const char *out, const json_t *fp, bool resume, bool force,
                                       struct llmq_ckpt **ck, int64_t *done, uint64_t *offset);
// "<out>.partial/output.gguf.part": the file the writer streams into (owned by ck).
const char *llmq_ckpt_stream_part(const struct llmq_ckpt *ck);
// The stream's step (quant/gguf_export.h struct llmq_gguf_export_stream): synced: the partial output holds
// tensors 0..done-1 (of n_tensors) fsynced in its first offset bytes; state.json records it (the commit point).
enum llmq_status llmq_ckpt_stream_step(struct llmq_ckpt *ck, int64_t done, int64_t n_tensors, bool synced,
                                       uint64_t offset);

// The output is committed: removes the checkpoint and frees ck. NULL: no-op.
void llmq_ckpt_done(struct llmq_ckpt *ck);
// The run stops without output: keeps the checkpoint when a block was committed (logging how to resume),
// removes one it created that holds none, and frees ck. NULL: no-op.
void llmq_ckpt_close(struct llmq_ckpt *ck);

#endif // LLMQ_QUANT_CHECKPOINT_H
