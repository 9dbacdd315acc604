/*
 * quant/gguf_sens.h — the measured sensitivity of the type choice (quant/gguf_choose.h, `--sensitivity
 * measured`): for each block linear t, the mean KL divergence of the model's next-token distribution when t
 * ALONE is quantized in a reference type, against the unquantized model, on a few calibration windows.
 *
 * What it is: a measurement through the whole network with the forward pass of calib/model/forward.h (its
 * block-by-block API: embed, blocks, head), so what a layer's error does downstream (attention mixing, the
 * norms, the head) is in the figure, not assumed. What it is not: no choice of types (gguf_choose.h turns
 * these figures into a KLD per unit of reconstruction error), no file writing.
 *
 * Legend: L n_layer, D n_embd, V n_vocab, N = n_windows · seqlen measured tokens, T tensors measured.
 *
 * ---- What is measured ----------------------------------------------------------------------------------
 *   Tokens: the first min(n_windows, d->n_seq) calibration windows, the first min(seqlen, d->seqlen) tokens
 *   of each (each window is one causal sequence from position 0), every position scored.
 *   Reference: x_l (N, D) the input of block l of the unquantized model (one pass: embedding, then every
 *   block, each x_l kept), and its logits P (N, V).
 *   Tensor t = (layer l, linear k, type τ): W (R, C) converted to f32, its rows encoded in τ with the
 *   importance (formats/ggml/encode.h, exactly as the file would be encoded by --method rtn) and decoded to
 *   Q; block l runs with a copy of its weight set whose linear k is Q (an F32 view), blocks l + 1 .. L-1 with
 *   the model's own, on a copy of x_l, and the head gives the logits Q (N, V) window by window;
 *     kld(t) = 1/N · Σ_positions Σ_v P_v (log P_v − log Q_v)
 *   with calib/eval/eval.h's per-row arithmetic (llmq_eval_score: identical rows give exactly 0).
 *   Only tensor t differs from the unquantized model: the token embedding and the head stay as loaded.
 *
 * ---- Cost (why this and not a cheaper proxy) --------------------------------------------------------------
 *   One full pass for the reference, then per tensor of block l: blocks l .. L-1 and the head over N tokens,
 *   plus the KLD over N × V logits: about T · (L/2 + head) block passes in all. SmolLM2-135M (L = 30, T = 210,
 *   the head ~8 blocks' work since V = 49152): ~120 full-pass equivalents. Measured (bench/README.md
 *   "gguf_choice", 4 × 256 tokens, --threads 2 on 2 cores shared with other jobs): 795 s wall at a load of
 *   6-8 (about 9 CPU-minutes, 2.6 CPU-s per tensor), 2420 s at a load of 13-14; the rest of a --target-size
 *   run took 60-100 s there. Chosen over the cheaper proxy considered (each tensor's error measured at its
 *   block's output, one propagation to the logits per block: ~5× less work) because that proxy assumes that
 *   every direction of a block's output hurts the logits alike, which is what the uniform weighting got
 *   wrong; the cost scales with N (--sensitivity-windows / --sensitivity-seqlen).
 *   Memory: L · N · D floats for the block inputs, N · V for the reference logits, seqlen · V for one
 *   window's logits, one linear's f32 weight, its encoding and decoding, the forward's buffers for N tokens
 *   (SmolLM2, 4 × 256: 71 MB + 201 MB + 50 MB + the rest).
 *
 * ---- Determinism, side effects ----------------------------------------------------------------------------
 *   The same model, windows, options and n_threads give the same figures; another n_threads changes them by
 *   the float rounding of the forward pass's GEMMs only (relative 1e-5 measured on stories260K). The choice
 *   that uses them is deterministic in the same sense (quant/quantize.h records --threads when calibration
 *   ran). The model is only read.
 *
 * Errors: LLMQ_ERR_ARG (no calibration windows, a tensor outside the model, a type that cannot encode its
 * rows), LLMQ_ERR_NOMEM, what the forward pass, the converters and the encoders return; one log line each.
 */
#ifndef LLMQ_QUANT_GGUF_SENS_H
#define LLMQ_QUANT_GGUF_SENS_H

#include "calib/calib.h"
#include "calib/model/model.h"
#include "common/dtype.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdint.h>

struct llmq_gguf_sens_opts {
    int64_t n_windows, seqlen; // the calibration windows measured (see "What is measured"); both >= 1
    int n_threads;             // forward and scoring threads (>= 1)
    enum llmq_backend backend; // GEMM backend of the forward pass (kernels/gemm.h)
};

// The defaults: 4 windows of 256 tokens, 1 thread, the CPU.
struct llmq_gguf_sens_opts llmq_gguf_sens_default_opts(void);

struct llmq_gguf_sens_tensor {
    int64_t layer;           // block
    int which;               // enum llmq_linear
    enum llmq_dtype type;    // the reference type τ
    const float *importance; // (C) or NULL: the importance the encoder gets
    double kld;              // out: kld(t)
};

// Measures kld of the n tensors t on the calibration d (see above). *n_tokens (may be NULL) gets N.
// Logs one info line with N, T and the seconds.
enum llmq_status llmq_gguf_sens_measure(const struct llmq_model *m, const struct llmq_calib_data *d,
                                        const struct llmq_gguf_sens_opts *o, int64_t n, struct llmq_gguf_sens_tensor *t,
                                        int64_t *n_tokens);

#endif // LLMQ_QUANT_GGUF_SENS_H
