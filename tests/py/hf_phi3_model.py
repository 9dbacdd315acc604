"""Builds small random-weight Phi-3 checkpoints with Hugging Face transformers and writes their logits: the
reference side of tests/py/test_phi3.py. Runs in the transformers venv (LLMQ_HF_PYTHON) only.

    python hf_phi3_model.py TOKENIZER_DIR IDS_FILE OUT_DIR

Phi3Config: vocab 512, hidden 64, intermediate 128 (gate_up_proj 256 x 64), 2 layers, 4 heads, 2 kv heads
(qkv_proj 128 x 64), rope_theta 1e4, rope_scaling null, untied, float32; parameters drawn from
torch.manual_seed(SEED + k), k = 0, 1, 2, 3, 4 for the five models in the order below (linears and the embedding
N(0, 1/in), norms 1 + N(0, 0.3^2)); "tiny" without a
sliding window, "tiny-swa" with sliding_window 8 (every layer). D.hf.f32: the logits (n, 512) of the ids of
IDS_FILE (from_pretrained, float32, CPU, eager attention). stdout: one JSON line per directory.

"tiny-longrope": "tiny" with rope_scaling {"type": "longrope", short_factor, long_factor} (8 values each, drawn
uniformly from [1, 4] with numpy seed SEED), original_max_position_embeddings 256 (llama.cpp pads its context to
a multiple of 256, so 256 is the smallest original context its short factors can be reached under),
max_position_embeddings 1024 (attention factor sqrt(1 + ln 4 / ln 256)). Its token ids: N_LONG random ids (the
same numpy generator, after the factors), written to D.ids; D.hf-long.f32 the logits of all N_LONG (> 256: transformers takes the long
factors), D.hf-short.f32 those of the first N_SHORT (<= 256: the short ones), each as one forward call.

Phi-4-mini's shape (partial_rotary_factor 0.75: 12 of the 16 values of a head rotate; tie_word_embeddings true):
"tiny-p4", "tiny" with both, D.hf.f32 over IDS_FILE's ids; "tiny-p4-longrope", "tiny-longrope" with both (6
short / long factors: rotary dims / 2, drawn as above with numpy seed SEED + 10), D.ids, D.hf-long.f32 and
D.hf-short.f32 as for "tiny-longrope" (the same ids).
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


PHI4_MINI = dict(partial_rotary_factor=0.75, tie_word_embeddings=True)  # Phi-4-mini-instruct's config.json


def build(d, tok_dir, seed, **changes):
    """A random Phi3ForCausalLM of the shape above (tiny), changes applied to its Phi3Config, saved into d."""
    cfg = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=512,
               rms_norm_eps=1e-5, rope_theta=1e4, sliding_window=None, tie_word_embeddings=False, bos_token_id=1,
               eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    randomize_and_save(transformers.Phi3ForCausalLM(transformers.Phi3Config(**{**cfg, **changes})).float(), d,
                       tok_dir, 1.0)
    m = load(d)
    print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__,
                      "rope_parameters": getattr(m.config, "rope_parameters", None)}), flush=True)
    return m


def main():
    tok_dir, ids_file, out_dir = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    for name, seed, changes in (("tiny", SEED, {}), ("tiny-swa", SEED + 1, dict(sliding_window=8)),
                                ("tiny-p4", SEED + 3, PHI4_MINI)):
        d = pathlib.Path(out_dir) / name  # not "phi3": see test_phi3.py
        logits(build(d, tok_dir, seed, **changes), ids).astype(np.float32).tofile(f"{d}.hf.f32")
    rng = np.random.default_rng(SEED)
    factors = [rng.uniform(1.0, 4.0, 8).round(4).tolist() for _ in range(2)]
    ids = rng.integers(3, 512, N_LONG).tolist()
    longrope(pathlib.Path(out_dir) / "tiny-longrope", tok_dir, SEED + 2, factors, ids, {})
    rng = np.random.default_rng(SEED + 10)
    factors = [rng.uniform(1.0, 4.0, 6).round(4).tolist() for _ in range(2)]
    longrope(pathlib.Path(out_dir) / "tiny-p4-longrope", tok_dir, SEED + 4, factors, ids, PHI4_MINI)


def longrope(d, tok_dir, seed, factors, ids, changes):
    short, long = factors
    m = build(d, tok_dir, seed, max_position_embeddings=1024, original_max_position_embeddings=256,
              rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long}, **changes)
    pathlib.Path(f"{d}.ids").write_text(" ".join(map(str, ids)))
    logits(m, ids).astype(np.float32).tofile(f"{d}.hf-long.f32")
    logits(m, ids[:N_SHORT]).astype(np.float32).tofile(f"{d}.hf-short.f32")


if __name__ == "__main__":
    main()
