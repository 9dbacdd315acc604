"""Builds small random-weight Qwen3 checkpoints with Hugging Face transformers and writes their logits:
the reference side of tests/py/test_qwen3.py. Runs in the transformers venv (LLMQ_HF_PYTHON), never in
the oracle venv.

    python hf_qwen3_model.py TOKENIZER_DIR IDS_FILE OUT_DIR

For tie_word_embeddings false and true: a Qwen3Config (hidden 64, 2 layers, 4 heads, 2 kv heads,
head_dim 32 so that q_proj is 128 x 64, intermediate 128, vocab 512, rope_theta 1e6, rms_norm_eps 1e-6),
Qwen3ForCausalLM with every parameter drawn from torch.manual_seed(SEED + tied) (linears and the
embedding N(0, 1/in), norms 1 + N(0, 0.3^2) so that q_norm and k_norm differ from each other and from 1),
saved with save_pretrained as float32 safetensors into OUT_DIR/qwen3-untied and OUT_DIR/qwen3-tied with
the tokenizer files of TOKENIZER_DIR copied next to them; then each directory is loaded back with
from_pretrained (float32, CPU, eager attention) and the logits of the ids of IDS_FILE (one sequence
from position 0) go to <dir>.hf.f32 as (n, 512) float32. stdout: one JSON line per directory with the
versions used.
"""
import json
import sys
import pathlib

import numpy as np
import torch
import transformers

from hf_family import load, logits, randomize_and_save

SEED = 1234


def build(out, tied, tok_dir):
    cfg = transformers.Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1e6,
                                   tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(SEED + int(tied))
    randomize_and_save(transformers.Qwen3ForCausalLM(cfg).float(), out, tok_dir, 1.0)


def main():
    tok_dir, ids_file, out_dir = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    for tied in (False, True):
        d = pathlib.Path(out_dir) / ("qwen3-tied" if tied else "qwen3-untied")
        build(d, tied, tok_dir)
        logits(load(d), ids).astype(np.float32).tofile(f"{d}.hf.f32")
        print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
