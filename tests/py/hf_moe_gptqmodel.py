"""The transformers-venv side of tests/py/test_moe_gptqmodel.py (LLMQ_HF_PYTHON only).

    python hf_moe_gptqmodel.py build TOK_DIR OUT_DIR   random f32 qwen3_moe, mixtral and qwen2_moe directories
                                                       OUT/{qmoe,mix,q2moe} with TOK_DIR's tokenizer files (GPTQModel
                                                       loads one)
    python hf_moe_gptqmodel.py load IDS_FILE DIR OUT [DIR OUT ...]
                                                       GPTQModel.load(DIR) on the CPU; logits (n, V) f32 of IDS to OUT

Models: vocab 512, hidden 64, 2 layers, 4 heads, 2 kv heads, 8 experts of width 64, top-2, untied, seeded
(hf_family.randomize_and_save's draws); qwen2_moe also a shared expert of width 128 with its sigmoid gate, q/k/v
biases, norm_topk_prob false (Qwen2MoeConfig's default). Loading: GPTQModel 7.7's own loader with its TORCH backend in
float16, the CPU kernel that reads every packing llmq writes (GPTQ v1 / v2, AWQ GEMM; it takes float16 or bfloat16
only); its AVX-512 f32 GPTQ kernel, which GPTQModel picks in float32, is not used: on llmq's asymmetric (gptq_v2)
directories it gives logits unrelated to the model's, dense ones included, while TORCH, transformers' own GPTQ path
(test_hf_load) and numpy (test_moe_quant) agree with llmq. float16, not bfloat16: bf16's 8-bit mantissa flips
near-tied router choices (the random mixtral's GPTQ sym directory: 3 of 32 positions 0.2-0.35 rms off, the others
~0.015; in float16 all 32 within 0.002).
"""
import pathlib
import sys

import numpy as np
import torch
import transformers

from hf_family import randomize_and_save

COMMON = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(tok, out):
    out = pathlib.Path(out)
    cfgs = {"qmoe": transformers.Qwen3MoeConfig(**COMMON, intermediate_size=128, moe_intermediate_size=64, head_dim=16,
                                                num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
            "mix": transformers.MixtralConfig(**COMMON, intermediate_size=64, num_local_experts=8,
                                              num_experts_per_tok=2, sliding_window=None),
            "q2moe": transformers.Qwen2MoeConfig(**COMMON, intermediate_size=128, moe_intermediate_size=64,
                                                 shared_expert_intermediate_size=128, num_experts=8,
                                                 num_experts_per_tok=2, norm_topk_prob=False)}
    for i, (name, cfg) in enumerate(cfgs.items()):
        torch.manual_seed(4321 + i)
        randomize_and_save(transformers.AutoModelForCausalLM.from_config(cfg).float(), out / name, tok, 1.0)


def load(ids_file, pairs):
    """pairs: DIR OUT ...; one process for all (importing GPTQModel takes most of the time)."""
    from gptqmodel import BACKEND, GPTQModel
    ids = [int(t) for t in pathlib.Path(ids_file).read_text().split()]
    for d, out in zip(pairs[0::2], pairs[1::2]):
        m = GPTQModel.load(d, device="cpu", dtype=torch.float16, backend=BACKEND.TORCH)
        kinds = sorted({type(x).__name__ for n, x in m.model.named_modules()
                        if (".experts." in n or ".shared_expert." in n) and n.endswith("_proj")})
        with torch.no_grad():
            lg = m.model(torch.tensor([ids])).logits[0].float().numpy()
        lg.astype(np.float32).tofile(out)
        print(f"{d}: expert modules: {','.join(kinds)}")


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3])
    else:
        load(sys.argv[2], sys.argv[3:])
