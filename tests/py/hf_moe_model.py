"""Builds small random-weight mixture-of-experts checkpoints (Mixtral, Qwen3-MoE) with Hugging Face transformers
and writes their logits and router margins: the reference side of tests/py/test_moe.py. Runs in the transformers
venv (LLMQ_HF_PYTHON) only.

    python hf_moe_model.py TOKENIZER_DIR IDS_FILE OUT_DIR

Every model: vocab 512, hidden 64, 2 layers, 4 heads, 2 kv heads, rope_theta 1e4, untied, float32; parameters
drawn from torch.manual_seed(SEED + i) (linears, router, stacked experts and the embedding N(0, 1/in), norms
1 + N(0, 0.3^2)). "tiny-mix": MixtralConfig, 8 experts of width 96, top-2, no sliding window. "tiny-qmoe":
Qwen3MoeConfig, 8 experts of width 48 (intermediate_size 128 is its dense width, unused), top-3, head_dim 16,
norm_topk_prob true. "tiny-qmoe-raw": the same weights with norm_topk_prob false. "wide-mix" / "wide-qmoe": hidden
256, 4 experts of width 256, top-2 (qwen3_moe: head_dim 64, intermediate_size 512): rows that the 256-element K-quant
blocks tile, so that quantizing the stacked experts exercises Q4_K / Q6_K themselves (the tiny models' 48- to 96-wide
rows fall back to 32-element types), with 4 experts rather than 8 (llama-quantize's n_expert == 8 rules off). (The
names avoid the family names, as tests/py/test_phi3.py explains.)
D.hf.f32: the logits (n, 512) of the ids of IDS_FILE (from_pretrained, float32, CPU, eager attention).
D.margin.json: per layer, the smallest gap over the tokens between the K-th and (K+1)-th largest router
probability, and the tokens routed to each expert: the routing is unambiguous when the gap is well above float
noise. stdout: one JSON line per directory.
"""
import json
import pathlib
import sys

import numpy as np
import torch
import transformers

from hf_family import load, logits, randomize_and_save

SEED = 1234
COMMON = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def router_margins(model, ids, k):
    """Runs model on ids with hooks on every router: per layer {gap, counts}."""
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    out = []

    def hook(mod, inp, res):
        p = torch.softmax(res[0].float(), dim=-1)
        top = torch.sort(p, dim=-1, descending=True).values
        gap = float((top[:, k - 1] - top[:, k]).min()) if p.shape[-1] > k else 1.0
        idx = torch.topk(p, k, dim=-1).indices
        out.append(dict(gap=gap, counts=torch.bincount(idx.flatten(), minlength=p.shape[-1]).tolist()))

    hs = [r.register_forward_hook(hook) for r in routers]
    logits(model, ids)
    for h in hs:
        h.remove()
    return out


def main():
    tok_dir, ids_file, out_dir = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    mix = transformers.MixtralConfig(intermediate_size=96, num_local_experts=8, num_experts_per_tok=2,
                                     sliding_window=None, **COMMON)
    qmoe = dict(intermediate_size=128, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=3, head_dim=16,
                **COMMON)
    wide = dict(COMMON, hidden_size=256)
    wide_mix = transformers.MixtralConfig(intermediate_size=256, num_local_experts=4, num_experts_per_tok=2,
                                          sliding_window=None, **wide)
    wide_qmoe = transformers.Qwen3MoeConfig(intermediate_size=512, moe_intermediate_size=256, num_experts=4,
                                            num_experts_per_tok=2, head_dim=64, norm_topk_prob=True, **wide)
    models = [("tiny-mix", transformers.MixtralForCausalLM, mix, 2, None),
              ("tiny-qmoe", transformers.Qwen3MoeForCausalLM, transformers.Qwen3MoeConfig(norm_topk_prob=True, **qmoe),
               3, None),
              ("tiny-qmoe-raw", None, None, 3, "tiny-qmoe"),
              ("wide-mix", transformers.MixtralForCausalLM, wide_mix, 2, None),
              ("wide-qmoe", transformers.Qwen3MoeForCausalLM, wide_qmoe, 2, None)]
    for i, (name, cls, cfg, k, same_as) in enumerate(models):
        d = pathlib.Path(out_dir) / name
        if same_as:  # the same weights, norm_topk_prob false
            model = load(pathlib.Path(out_dir) / same_as, norm_topk_prob=False)
            model.save_pretrained(d, safe_serialization=True)
            for f in ("tokenizer.json", "tokenizer_config.json"):
                (d / f).write_bytes((pathlib.Path(out_dir) / same_as / f).read_bytes())
        else:
            torch.manual_seed(SEED + i)
            randomize_and_save(cls(cfg).float(), d, tok_dir, 1.0)
        model = load(d)
        logits(model, ids).astype(np.float32).tofile(f"{d}.hf.f32")
        (pathlib.Path(f"{d}.margin.json")).write_text(json.dumps(router_margins(model, ids, k)))
        print(json.dumps({"dir": str(d), "torch": torch.__version__, "transformers": transformers.__version__}),
              flush=True)


if __name__ == "__main__":
    main()
