"""The transformers-venv side of tests/py/test_phi3_quant.py (LLMQ_HF_PYTHON only).

    python hf_phi3_quant_model.py build TOK_DIR IDS_FILE OUT_DIR  a random f32 Phi-3 "p3w" in OUT_DIR/p3w with
                                                                  TOK_DIR's tokenizer files
    python hf_phi3_quant_model.py logits IDS_FILE DIR OUT [DIR OUT ...]
                                                                  transformers' Phi3ForCausalLM (f32, eager) on DIR

p3w: vocab 512, hidden 256, intermediate 256 (gate_up_proj 512 x 256), 2 layers, 4 heads of 64, 2 kv heads (qkv_proj
512 x 256), rope_theta 1e4, no rope scaling, no window, untied, float32; every row 256 wide so that the K-quants
tile it. Parameters: hf_family.randomize_and_save under torch.manual_seed(2468). Logits: (n, 512) f32 of IDS_FILE's
ids from position 0, to OUT. stdout: one JSON line per model.
"""
import json
import pathlib
import sys

import numpy as np
import torch
import transformers

from hf_family import load, logits, randomize_and_save


def build(tok, out):
    cfg = transformers.Phi3Config(vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                  original_max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4,
                                  sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0)
    torch.manual_seed(2468)
    d = pathlib.Path(out) / "p3w"
    randomize_and_save(transformers.Phi3ForCausalLM(cfg).float(), d, tok, 1.0)
    print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__}))


def hf_logits(ids, pairs):
    for d, out in zip(pairs[0::2], pairs[1::2]):
        m = load(d)
        kinds = sorted({type(x).__name__ for n, x in m.named_modules() if n.endswith("_proj")})
        logits(m, ids).astype(np.float32).tofile(out)
        print(json.dumps({"dir": d, "linear_classes": kinds}))


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[4])
    else:
        toks = [int(t) for t in pathlib.Path(sys.argv[2]).read_text().split()]
        torch.set_num_threads(2)
        hf_logits(toks, sys.argv[3:])
