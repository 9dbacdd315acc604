"""Builds tiny random-weight models of every transformers family llmq supports, with SmolLM2's real GPT-2 style BPE
tokenizer (vocab 49152), and writes transformers' token ids and perplexity of a text: the reference side of
tests/py/test_family_real_text.py. Runs in the transformers venv (LLMQ_HF_PYTHON), never in the oracle venv.

    python hf_real_text_model.py TOKENIZER_DIR TEXT_FILE CTX CHUNKS OUT_DIR

TOKENIZER_DIR: SmolLM2's HF tokenizer files (`llmq convert --to hf` of its GGUF). Per family of FAMILIES a config
(hidden 64, 2 layers, 4 heads, 2 kv heads, vocab_size = the tokenizer's, bos / eos / pad ids the tokenizer's),
every parameter drawn by tests/py/hf_family.py randomize_and_save from torch.manual_seed(SEED + i), saved as f32
safetensors into OUT_DIR/rt-<family> with the tokenizer files. OUT_DIR/ids.json: AutoTokenizer's ids of TEXT_FILE
(read whole, one trailing '\\n' removed as llama-perplexity -f does) with and without special tokens. Per family
OUT_DIR/rt-<family>.json: the llama.cpp perplexity protocol (calib/eval/eval.h) on those ids: CHUNKS windows of CTX
consecutive ids, position 0 of each set to BOS when the tokenizer adds one, positions CTX/2 .. CTX-2 predicting the
next id; ppl = exp(mean NLL) in float64 of the f32 logits (from_pretrained, CPU, eager attention).
"""
import json
import math
import pathlib
import sys

import torch
import transformers

from hf_family import load, randomize_and_save

SEED = 2468
HEADS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512)
T = transformers
FAMILIES = {  # family: (config class, model class, config keys, norm center: Gemma scales by 1 + w)
    "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM,
              dict(intermediate_size=128, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True),
              1.0),
    "gemma2": (T.Gemma2Config, T.Gemma2ForCausalLM,
               dict(intermediate_size=128, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                    attn_logit_softcapping=5.0, final_logit_softcapping=10.0, tie_word_embeddings=True), 0.0),
    "gemma3_text": (T.Gemma3TextConfig, T.Gemma3ForCausalLM,
                    dict(intermediate_size=128, head_dim=32, query_pre_attn_scalar=32, sliding_window=16,
                         rope_theta=1e6, rope_local_base_freq=1e4, tie_word_embeddings=True), 0.0),
    "phi3": (T.Phi3Config, T.Phi3ForCausalLM,
             dict(intermediate_size=128, original_max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=1e4,
                  sliding_window=None, tie_word_embeddings=False), 1.0),
    "mixtral": (T.MixtralConfig, T.MixtralForCausalLM,
                dict(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                     rms_norm_eps=1e-5, rope_theta=1e4, tie_word_embeddings=False), 1.0),
    "qwen3_moe": (T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM,
                  dict(intermediate_size=128, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                       head_dim=16, norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6,
                       tie_word_embeddings=False), 1.0),
    "qwen2_moe": (T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM,
                  dict(intermediate_size=128, moe_intermediate_size=64, shared_expert_intermediate_size=96,
                       num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, rms_norm_eps=1e-6,
                       rope_theta=1e4, tie_word_embeddings=False), 1.0),
}


def llamacpp_ppl(model, ids, ctx, chunks, bos):
    """exp(mean NLL) of the llama.cpp protocol's scored positions, with the count of them."""
    first, nll, count = ctx // 2, 0.0, 0
    for k in range(chunks):
        w = list(ids[k * ctx:(k + 1) * ctx])
        assert len(w) == ctx, f"the text has {len(ids)} ids, under {chunks} windows of {ctx}"
        if bos is not None:
            w[0] = bos
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([w])).logits[0].double(), dim=-1)
        for p in range(first, ctx - 1):
            nll -= float(lp[p, w[p + 1]])
            count += 1
    return math.exp(nll / count), count


def main():
    tok_dir, text_file, ctx, chunks, out_dir = sys.argv[1:6]
    ctx, chunks, out = int(ctx), int(chunks), pathlib.Path(out_dir)
    torch.set_num_threads(2)
    text = pathlib.Path(text_file).read_bytes().decode("utf-8")
    text = text[:-1] if text.endswith("\n") else text
    tok = T.AutoTokenizer.from_pretrained(tok_dir)
    ids = tok(text, add_special_tokens=True)["input_ids"]
    plain = tok(text, add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id if len(ids) > len(plain) and ids[0] == tok.bos_token_id else None
    (out / "ids.json").write_text(json.dumps(dict(special=ids, plain=plain, bos_added=bos is not None)))
    special = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    for i, (name, (cfg_cls, model_cls, keys, center)) in enumerate(FAMILIES.items()):
        d = out / f"rt-{name}"
        torch.manual_seed(SEED + i)
        randomize_and_save(model_cls(cfg_cls(**HEADS, **special, **keys)).float(), d, tok_dir, center)
        ppl, count = llamacpp_ppl(load(d), ids, ctx, chunks, bos)
        rec = dict(dir=str(d), ppl=ppl, count=count, torch=torch.__version__, transformers=T.__version__)
        pathlib.Path(f"{d}.json").write_text(json.dumps(rec))
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
