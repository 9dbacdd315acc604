"""Oracle: the Phi-3 family (model_type / general.architecture "phi3": fused qkv_proj / attn_qkv and
gate_up_proj / ffn_up, NEOX RoPE, the sliding window of every layer in transformers) against transformers and
llama.cpp. What llmq does not do yet for Phi-3 is refused, and tested as refused: LongRoPE ("longrope" / "su" short
and long factors), partial rotary factors. Quantized output (the fused linears written back fused):
tests/py/test_phi3_quant.py.

The models: tests/py/hf_phi3_model.py builds random-weight Phi3ForCausalLM checkpoints (hidden 64, 2 layers, 4
heads, 2 kv heads, intermediate 128, vocab 512, untied, f32), "tiny" without a window and "tiny-swa" with
sliding_window 8 over 48 token ids (the directories are not named "phi3": llama.cpp's vocabulary loader applies
Phi-3 special-token rules by general.name, which this test tokenizer (stories260K's) lacks).
  transformers   max |diff| <= 1e-4 * max |logit| (tests/py/test_qwen3.py's analysis). Measured: 1.0e-6 (tiny),
                 8.2e-7 (tiny-swa) of max |logit|; top-1 equal everywhere. The window matters (llmq without it
                 differs from transformers' tiny-swa logits by about 5).
  GGUF           `llmq convert`: attn_qkv (128 x 64) and ffn_up (256 x 64) as llama.cpp stores them; llmq's
                 forward on it equals the HF forward bit for bit; llama-cpp-python 0.3.36 agrees within
                 F32_TOL = 1e-3 (LLaMA's tolerance; measured 4.8e-6), top-1 equal.
  GGUF -> HF     every tensor bit-identical, config.json phi3.
"""
import json
import shutil

import numpy as np
import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, build_hf_models, forward, gguf_back_to_hf
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import F32_TOL, HAVE_LLAMA_CPP, check_live
import gen_golden_forward as gg

needs_hf = pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")
TOL_REL = 1e-4
VARIANTS = ["tiny", "tiny-swa"]


@pytest.fixture(scope="module")
def models(llmq_bin, tool, stories_v3, work, ids):
    if not HF_PYTHON:
        pytest.skip(HF_SKIP_REASON)
    build_hf_models(llmq_bin, stories_v3, work, ids, "hf_phi3_model.py", HF_PYTHON)
    out = {}
    for v in VARIANTS:
        d = work / v
        out[v] = dict(hf=d, ref=np.fromfile(f"{d}.hf.f32", np.float32).reshape(48, -1),
                      llmq_hf=forward(tool, d, ids["path"], work / f"{v}.llmq-hf.f32"))
    gguf = work / "tiny.gguf"
    run([llmq_bin, "convert", "--model", out["tiny"]["hf"], "--out", gguf, "--quiet"])
    out["tiny"].update(gguf=gguf, llmq_gguf=forward(tool, gguf, ids["path"], work / "tiny.llmq-gguf.f32"))
    return out


@needs_hf
@pytest.mark.parametrize("v", VARIANTS)
def test_forward_matches_transformers(models, v):
    r, got = models[v]["ref"], models[v]["llmq_hf"]
    scale, d = float(np.abs(r).max()), float(np.abs(r - got).max())
    print(f"{v}: max |transformers - llmq| = {d:.3g}, {d / scale:.3g} of max |logit| {scale:.3g}")
    assert d <= TOL_REL * scale and (r.argmax(1) == got.argmax(1)).all()


@needs_hf
def test_sliding_window_matters(tool, models, work, ids):
    d = work / "tiny-swa-nowindow"
    shutil.copytree(models["tiny-swa"]["hf"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    got = forward(tool, d, ids["path"], work / "nowindow.f32")
    assert float(np.abs(got - models["tiny-swa"]["ref"]).max()) > 1000 * TOL_REL * float(np.abs(got).max())


@needs_hf
def test_gguf(models):
    import gguf
    r = gguf.GGUFReader(str(models["tiny"]["gguf"]))
    shapes = {t.name: list(t.shape) for t in r.tensors}
    assert shapes["blk.0.attn_qkv.weight"] == [64, 128] and shapes["blk.0.ffn_up.weight"] == [64, 256]
    assert not any(n.endswith(("attn_q.weight", "attn_k.weight", "ffn_gate.weight")) for n in shapes)
    assert np.array_equal(models["tiny"]["llmq_gguf"], models["tiny"]["llmq_hf"])


@needs_hf
@needs_llama_cpp
def test_llama_cpp_agrees(models, ids):
    check_live("phi3 f32", models["tiny"]["llmq_gguf"], gg.llama_cpp_logits(models["tiny"]["gguf"], ids["tokens"]),
               F32_TOL, 1.0)


@needs_hf
def test_gguf_to_hf_reproduces_tensors(llmq_bin, models, work):
    a, b, cfg = gguf_back_to_hf(llmq_bin, models["tiny"]["gguf"], models["tiny"]["hf"], work / "back")
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    assert cfg["model_type"] == "phi3" and cfg["architectures"] == ["Phi3ForCausalLM"]


@pytest.mark.parametrize("change, message", [
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                           "long_factor": [2.0] * 8}), "LongRoPE short / long factors are not implemented"),
    (dict(rope_scaling={"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}),
     'rope_scaling type "su" is not supported'),
    (dict(partial_rotary_factor=0.75), "partial_rotary_factor other than 1 is not supported"),
])
def test_refused_configs(llmq_bin, tmp_path, change, message):
    from safetensors.numpy import save_file
    d = tmp_path / "m"
    d.mkdir()
    cfg = dict(model_type="phi3", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=512, hidden_act="silu")
    (d / "config.json").write_text(json.dumps({**cfg, **change}))
    save_file({"model.embed_tokens.weight": np.zeros((512, 64), np.float32)}, str(d / "model.safetensors"))
    r = run([llmq_bin, "convert", "--model", d, "--out", tmp_path / "x.gguf"], check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
