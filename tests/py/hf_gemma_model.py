"""Builds small random-weight Gemma 2 / Gemma 3 (text) checkpoints with Hugging Face transformers and writes
their logits: the reference side of tests/py/test_gemma.py. Runs in the transformers venv (LLMQ_HF_PYTHON),
never in the oracle venv.

    python hf_gemma_model.py TOKENIZER_DIR IDS_FILE OUT_DIR

Variants (every parameter drawn from torch.manual_seed(SEED + i): linears and the embedding N(0, 1/in), norm
weights N(0, 0.3^2), which Gemma's RMSNorm uses as 1 + w), all with vocab 512, hidden 64, intermediate 128,
4 heads, 2 kv heads, head_dim 32 (q_proj 128 x 64), query_pre_attn_scalar 32 (= head_dim, what llama.cpp
derives), sliding_window 8, float32, the tokenizer files of TOKENIZER_DIR copied next to them:
  gemma2        Gemma2Config, 4 layers (sliding, full, sliding, full), attn_logit_softcapping 5 and
                final_logit_softcapping 10 (small enough that tanh bends: see the -nocap logits), tied
  gemma3        Gemma3TextConfig, 6 layers (5 sliding, 1 full: the default period 6), rope_theta 1e6 on the
                full layer, rope_local_base_freq 1e4 on the sliding ones, tied
  gemma3-scaled the same with linear rope scaling (factor 4) on the full layer, untied
For each directory D: D.hf.f32 the logits (n, 512) f32 of the ids of IDS_FILE (one sequence from position 0;
from_pretrained, float32, CPU, eager attention); D.hf-wide.f32 the same with sliding_window 4096 (longer than
the sequence); gemma2 also D.hf-nocap.f32 with both soft-cappings off. stdout: one JSON line per directory.
"""
import json
import pathlib
import sys

import numpy as np
import torch
import transformers

from hf_family import load, logits, randomize_and_save

SEED = 4321
COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=32, query_pre_attn_scalar=32, sliding_window=8, max_position_embeddings=512,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
VARIANTS = {
    "gemma2": (transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
               dict(num_hidden_layers=4, attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                    tie_word_embeddings=True)),
    "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               dict(num_hidden_layers=6, rope_theta=1e6, rope_local_base_freq=1e4, tie_word_embeddings=True)),
    "gemma3-scaled": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
                      dict(num_hidden_layers=6, rope_theta=1e6, rope_local_base_freq=1e4,
                           rope_scaling={"rope_type": "linear", "factor": 4.0}, tie_word_embeddings=False)),
}


def overridden_logits(d, ids, **overrides):
    """Logits with config attributes overridden, also where the attention modules copied them."""
    model = load(d, **overrides)
    for m in model.modules():
        if overrides.get("sliding_window") and getattr(m, "sliding_window", None):
            m.sliding_window = overrides["sliding_window"]
        if "attn_logit_softcapping" in overrides and hasattr(m, "attn_logit_softcapping"):
            m.attn_logit_softcapping = overrides["attn_logit_softcapping"]
    return logits(model, ids)


def main():
    tok_dir, ids_file, out_dir = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    for i, (name, (cfg_cls, model_cls, extra)) in enumerate(VARIANTS.items()):
        d = pathlib.Path(out_dir) / name
        torch.manual_seed(SEED + i)
        randomize_and_save(model_cls(cfg_cls(**COMMON, **extra)).float(), d, tok_dir, 0.0)  # Gemma: x * (1 + w)
        logits(load(d), ids).astype(np.float32).tofile(f"{d}.hf.f32")
        overridden_logits(d, ids, sliding_window=4096).astype(np.float32).tofile(f"{d}.hf-wide.f32")
        if name == "gemma2":
            overridden_logits(d, ids, attn_logit_softcapping=None, final_logit_softcapping=None).astype(
                np.float32).tofile(f"{d}.hf-nocap.f32")
        print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
