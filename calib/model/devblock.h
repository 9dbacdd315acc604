/*
 * calib/model/devblock.h — a model's decoder block as a kernels/block.h block: the shape from the hyper-parameters,
 * the weights of a weight set (struct llmq_layer) converted to f32 and uploaded.
 *
 * What it is: the bridge between calib/model/model.h and the backend block forward, for the families that block
 * covers (llama, mistral, qwen2, qwen3). Used by `llmq eval`'s block path (calib/eval/eval_run.c: the decoder
 * blocks with --device cuda, or on the CPU through the LLMQ_EVAL_BLOCK=cpu test hook; calib/eval/eval.h "Decoder
 * blocks"), the calibration pass's (calib/calib_run.c, likewise with LLMQ_CALIB_BLOCK=cpu; calib/calib.h "Decoder
 * blocks"), quantize's rtn / gptq passes and AWQ's scale search (calib/blocks.h, LLMQ_QUANT_BLOCK=cpu likewise;
 * quant/quantize.h "Decoder blocks", quant/awq.h "On the block path") and tests/unit/test_block.c. The CUDA block
 * behind it has never run on a GPU (kernels/block.h).
 */
#ifndef LLMQ_CALIB_DEVBLOCK_H
#define LLMQ_CALIB_DEVBLOCK_H

#include "calib/model/model.h"
#include "common/status.h"
#include "kernels/block.h"

#include <stdbool.h>
#include <stddef.h>

// s = the block shape of m (every block of a model has the same one), its rope_ff pointing at ff (Dh/2, the
// caller's; llmq_block_init copies it). LLMQ_ERR_UNSUPPORTED, naming the family or the feature, for anything but
// llama / mistral / qwen2 / qwen3 without sliding window, attention softcap, linear RoPE scaling or partial RoPE
// (n_rot != head_dim: the block rotates whole heads).
enum llmq_status llmq_devblock_shape(const struct llmq_model *m, float *ff, struct llmq_block_shape *s);

// Whether m's blocks can take a block path: true with *s (as llmq_devblock_shape, rope_ff in ff); false with
// devblock's refusal (the family or the feature, naming the model) written into why (cap bytes) and not logged as an
// error: the caller's info line names it as its reason for the forward.c path.
bool llmq_devblock_supported(const struct llmq_model *m, float *ff, struct llmq_block_shape *s, char *why, size_t cap);

// Whether a caller on backend asks for its block path (calib/eval/eval.h, calib/calib.h "Decoder blocks"), by its
// test hook, the environment variable var: unset or empty, *want = backend is CUDA, on *be = backend; "cpu", *want
// and *hook, on *be = CPU whatever the device; "off", not *want, with the info line "<who>: decoder blocks through
// calib/model/forward.c: <var>=off". Anything else is LLMQ_ERR_ARG, the message starting with who ("eval", ...).
enum llmq_status llmq_devblock_want(const char *var, const char *who, enum llmq_backend backend, bool *want, bool *hook,
                                    enum llmq_backend *be);

// The arithmetic of block b's linears by the environment variable LLMQ_BLOCK_MATH (unset, empty or "fp32": FP32, the
// default; "tf32": TF32 tensor cores, kernels/block.h llmq_block_set_tf32, with the info line "<who>: the block's
// linears on TF32 tensor cores (LLMQ_BLOCK_MATH=tf32, experimental: not measured)"). Anything else is LLMQ_ERR_ARG;
// tf32 on a CPU block LLMQ_ERR_UNSUPPORTED. An experiment switch for the GPU run's measurement, not a product option
// (issue 17: each reduced-precision choice is measured before it becomes one).
enum llmq_status llmq_devblock_math(struct llmq_block *b, const char *who);

// Logs the info line of a fallback: "<who>: decoder blocks through calib/model/forward.c (its linears' products on
// cuda | on the CPU, by be): <why>".
void llmq_devblock_info_fallback(const char *who, enum llmq_backend be, const char *why);

// Uploads every weight of the weight set ly (shapes as the model's blocks) into b, converting a weight that is not
// f32 on n_threads threads into a scratch allocated for the call (an f32 weight is uploaded from its view in
// place). LLMQ_ERR_ARG for a missing weight or one whose size differs from the block's (named); the conversion's
// errors (LLMQ_ERR_UNSUPPORTED); LLMQ_ERR_NOMEM; the upload's.
enum llmq_status llmq_devblock_load(struct llmq_block *b, const struct llmq_layer *ly, int n_threads);

#endif // LLMQ_CALIB_DEVBLOCK_H
