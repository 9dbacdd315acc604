"""Gemma configurations that llmq (or llama.cpp, for a GGUF) cannot compute as transformers does are refused by
`llmq convert`, naming what is wrong, before any output exists (formats/llama/arch.h "Hyper-parameters",
llmq_hparams_to_gguf). Needs no transformers: the config.json files are written by hand."""
import json

import numpy as np
import pytest

from conftest import run


GEMMA2_CFG = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_size=64, intermediate_size=128,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
                  query_pre_attn_scalar=32, sliding_window=8, hidden_activation="gelu_pytorch_tanh",
                  tie_word_embeddings=True)


@pytest.mark.parametrize("change, message", [
    (dict(tie_word_embeddings=False), "gemma2 with tie_word_embeddings false"),
    (dict(hidden_activation="silu"), 'hidden_activation must be "gelu_pytorch_tanh"'),
    (dict(layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"]),
     "layer_types[3] = full_attention"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention is not supported"),
    (dict(query_pre_attn_scalar=256), "query_pre_attn_scalar 256 is not what llama.cpp derives"),
    (dict(attn_logit_softcapping=None), "gemma2 without attention / final logit soft-capping"),
    (dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], attn_logit_softcapping=50.0),
     "gemma3 with attn_logit_softcapping"),
    (dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], sliding_window=None),
     "gemma3 without a sliding window but with sliding layers of another RoPE"),
])
def test_refused_configs(llmq_bin, tmp_path, change, message):
    """What llmq or llama.cpp cannot compute as transformers does is refused, naming the key, before any output."""
    from safetensors.numpy import save_file
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**GEMMA2_CFG, **change}))
    save_file({"model.embed_tokens.weight": np.zeros((512, 64), np.float32)}, str(d / "model.safetensors"))
    r = run([llmq_bin, "convert", "--model", d, "--out", tmp_path / "x.gguf"], check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "x.gguf").exists()
