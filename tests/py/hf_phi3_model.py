"""Builds small random-weight Phi-3 checkpoints with Hugging Face transformers and writes their logits: the
reference side of tests/py/test_phi3.py. Runs in the transformers venv (LLMQ_HF_PYTHON) only.

    python hf_phi3_model.py TOKENIZER_DIR IDS_FILE OUT_DIR

Phi3Config: vocab 512, hidden 64, intermediate 128 (gate_up_proj 256 x 64), 2 layers, 4 heads, 2 kv heads
(qkv_proj 128 x 64), rope_theta 1e4, rope_scaling null, untied, float32; parameters drawn from
torch.manual_seed(SEED + i) (linears and the embedding N(0, 1/in), norms 1 + N(0, 0.3^2)); "tiny" without a
sliding window, "tiny-swa" with sliding_window 8 (every layer). D.hf.f32: the logits (n, 512) of the ids of
IDS_FILE (from_pretrained, float32, CPU, eager attention). stdout: one JSON line per directory.

"tiny-longrope": "tiny" with rope_scaling {"type": "longrope", short_factor, long_factor} (8 values each, drawn
uniformly from [1, 4] with numpy seed SEED), original_max_position_embeddings 256 (llama.cpp pads its context to
a multiple of 256, so 256 is the smallest original context its short factors can be reached under),
max_position_embeddings 1024 (attention factor sqrt(1 + ln 4 / ln 256)). Its token ids: LONGROPE_IDS (N_LONG
seeded random ids), written to D.ids; D.hf-long.f32 the logits of all N_LONG (> 256: transformers takes the long
factors), D.hf-short.f32 those of the first N_SHORT (<= 256: the short ones), each as one forward call.
"""
import json
import pathlib
import sys

import numpy as np
import torch
import transformers

from hf_family import load, logits, randomize_and_save

SEED = 777
N_LONG, N_SHORT = 300, 200


def main():
    tok_dir, ids_file, out_dir = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    for i, (name, window) in enumerate((("tiny", None), ("tiny-swa", 8))):  # not "phi3": see test_phi3.py
        cfg = transformers.Phi3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      original_max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4,
                                      sliding_window=window, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
        d = pathlib.Path(out_dir) / name
        torch.manual_seed(SEED + i)
        randomize_and_save(transformers.Phi3ForCausalLM(cfg).float(), d, tok_dir, 1.0)
        logits(load(d), ids).astype(np.float32).tofile(f"{d}.hf.f32")
        print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__}),
              flush=True)
    longrope(out_dir, tok_dir)


def longrope(out_dir, tok_dir):
    rng = np.random.default_rng(SEED)
    short, long = (rng.uniform(1.0, 4.0, 8).round(4).tolist() for _ in range(2))
    cfg = transformers.Phi3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                  original_max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1e4,
                                  rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
                                  sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0)
    d = pathlib.Path(out_dir) / "tiny-longrope"
    torch.manual_seed(SEED + 2)
    randomize_and_save(transformers.Phi3ForCausalLM(cfg).float(), d, tok_dir, 1.0)
    ids = rng.integers(3, 512, N_LONG).tolist()
    pathlib.Path(f"{d}.ids").write_text(" ".join(map(str, ids)))
    m = load(d)
    logits(m, ids).astype(np.float32).tofile(f"{d}.hf-long.f32")
    logits(m, ids[:N_SHORT]).astype(np.float32).tofile(f"{d}.hf-short.f32")
    print(json.dumps({"dir": str(d), "rope_parameters": m.config.rope_parameters}), flush=True)


if __name__ == "__main__":
    main()
