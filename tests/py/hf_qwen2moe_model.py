"""Builds small random-weight Qwen2-MoE checkpoints (routed experts + a sigmoid-gated shared expert) with Hugging Face
transformers and writes their logits and router margins: the reference side of tests/py/test_qwen2moe.py and
tests/py/test_qwen2moe_quant.py. Runs in the transformers venv (LLMQ_HF_PYTHON) only.

    python hf_qwen2moe_model.py TOKENIZER_DIR IDS_FILE OUT_DIR

Every model: Qwen2MoeConfig, vocab 512, 2 layers, 4 heads, 2 kv heads, q/k/v biases, rope_theta 1e4, untied
(llama.cpp's qwen2moe loader requires output.weight), float32; parameters drawn from torch.manual_seed(SEED + i) by
hf_family.randomize_and_save (linears, router, stacked experts, the shared expert and its gate, the embedding
N(0, 1/in); 1-D weights, biases included, 1 + N(0, 0.3^2)). "tiny-q2moe": hidden 64, 8 experts of width 48, top-3,
shared expert of width 96 (intermediate_size 128 is the dense width, unused), norm_topk_prob false (Qwen2MoeConfig's
default and llama.cpp's qwen2moe graph). "tiny-q2moe-norm": the same weights with norm_topk_prob true (no GGUF
form). "wide-q2moe": hidden 256, 4 experts of width 256, top-2, shared expert of width 512 (head_dim 64): rows that
the 256-element K-quant blocks tile (and 4 experts: llama-quantize's n_expert == 8 rules off).
D.hf.f32: the logits (n, 512) of the ids of IDS_FILE (from_pretrained, float32, CPU, eager attention).
D.margin.json: per layer, the smallest gap over the tokens between the K-th and (K+1)-th largest router
probability, and the tokens routed to each expert. stdout: one JSON line per directory.
"""
import json
import pathlib
import sys

import numpy as np
import torch
import transformers

from hf_family import load, logits, randomize_and_save

SEED = 4321
COMMON = dict(vocab_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def router_margins(model, ids, k):
    """Runs model on ids with hooks on every router: per layer {gap, counts} over its probabilities."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    out = []

    def hook(mod, inp, res):
        p = res[0].float()
        if not ((p >= 0).all() and torch.allclose(p.sum(-1), torch.ones(p.shape[0]), atol=1e-4)):
            p = torch.softmax(p, dim=-1)  # logits, not yet probabilities
        top = torch.sort(p, dim=-1, descending=True).values
        gap = float((top[:, k - 1] - top[:, k]).min()) if p.shape[-1] > k else 1.0
        idx = torch.topk(p, k, dim=-1).indices
        out.append(dict(gap=gap, counts=torch.bincount(idx.flatten(), minlength=p.shape[-1]).tolist()))

    hs = [r.register_forward_hook(hook) for r in routers]
    logits(model, ids)
    for h in hs:
        h.remove()
    assert len(out) == 2, f"{len(routers)} routers hooked"
    return out


def main():
    tok_dir, ids_file, out_dir = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    tiny = transformers.Qwen2MoeConfig(hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                                       shared_expert_intermediate_size=96, num_experts=8, num_experts_per_tok=3,
                                       norm_topk_prob=False, **COMMON)
    wide = transformers.Qwen2MoeConfig(hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
                                       shared_expert_intermediate_size=512, num_experts=4, num_experts_per_tok=2,
                                       norm_topk_prob=False, **COMMON)
    models = [("tiny-q2moe", tiny, 3, None), ("tiny-q2moe-norm", None, 3, "tiny-q2moe"), ("wide-q2moe", wide, 2, None)]
    for i, (name, cfg, k, same_as) in enumerate(models):
        d = pathlib.Path(out_dir) / name
        if same_as:  # the same weights, norm_topk_prob true
            model = load(pathlib.Path(out_dir) / same_as, norm_topk_prob=True)
            model.save_pretrained(d, safe_serialization=True)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                (d / f).write_bytes((pathlib.Path(out_dir) / same_as / f).read_bytes())
        else:
            torch.manual_seed(SEED + i)
            randomize_and_save(transformers.Qwen2MoeForCausalLM(cfg).float(), d, tok_dir, 1.0)
        model = load(d)
        logits(model, ids).astype(np.float32).tofile(f"{d}.hf.f32")
        (pathlib.Path(f"{d}.margin.json")).write_text(json.dumps(router_margins(model, ids, k)))
        print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
