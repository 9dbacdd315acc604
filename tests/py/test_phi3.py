"""Oracle: the Phi-3 family (model_type / general.architecture "phi3": fused qkv_proj / attn_qkv and
gate_up_proj / ffn_up, NEOX RoPE, the sliding window of every layer in transformers) against transformers and
llama.cpp. What llmq does not do yet for Phi-3 is refused, and tested as refused: partial rotary factors.
Quantized output (the fused linears written back fused): tests/py/test_phi3_quant.py.

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

LongRoPE ("tiny-longrope", tests/py/hf_phi3_model.py: random short / long factors in [1, 4], original context
256, max_position_embeddings 1024; 300 seeded token ids). The two tools choose the factors by different
quantities (formats/llama/arch.h "LongRoPE"): transformers by the sequence (long for 300 tokens, short for 200),
llama.cpp by its context n_ctx (short at 256, long at 512 even for 200 tokens; llama.cpp pads n_ctx to a multiple
of 256, hence the original context 256). llmq's forward takes transformers' rule by default and llama.cpp's when
given the context (tests/tools/forward_logits ROPE_CTX).
  transformers   TOL_REL of max |logit|; measured 3.4e-6 (300 tokens, long), 3.2e-6 (200, short); top-1 equal.
                 The choice matters: long and short logits of the same 200 tokens differ by about 5.6.
  llama.cpp      `llmq convert` writes rope_factors_long / _short.weight and phi3.rope.scaling.attn_factor
                 (sqrt(1.25)) / .original_context_length (256); llama-cpp-python against llmq with ROPE_CTX = its
                 n_ctx within F32_TOL, top-1 equal: measured 5.0e-6 (n_ctx 256, 200 tokens), 8.4e-6 (n_ctx 512,
                 200 and 300 tokens). llmq's GGUF forward without a context equals transformers' short logits.
  GGUF -> HF     rope_scaling longrope with the same factors, original_max_position_embeddings 256; llmq's logits
                 on it equal those on the original directory bit for bit.
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


N_LONG, N_SHORT, ORIG_CTX = 300, 200, 256  # as tests/py/hf_phi3_model.py


def llmq_logits(tool, model, ids, out, rope_ctx=0):
    """llmq's logits of the ids (a list) in one forward call; rope_ctx > 0: llama.cpp's choice of LongRoPE factors."""
    out.with_suffix(".ids").write_text(" ".join(map(str, ids)))
    run([tool("forward_logits"), model, out.with_suffix(".ids"), out, 2, 0, "none", rope_ctx])
    return np.fromfile(out, np.float32).reshape(len(ids), -1)


@pytest.fixture(scope="module")
def longrope(llmq_bin, tool, models, work):
    d = work / "tiny-longrope"
    toks = [int(x) for x in (work / "tiny-longrope.ids").read_text().split()]
    gguf = work / "tiny-longrope.gguf"
    run([llmq_bin, "convert", "--model", d, "--out", gguf, "--quiet"])
    ref = {n: np.fromfile(work / f"tiny-longrope.hf-{n}.f32", np.float32).reshape(-1, 512) for n in ("long", "short")}
    return dict(hf=d, gguf=gguf, ids=toks, ref=ref,
                long=llmq_logits(tool, d, toks, work / "lr-long.f32"),
                short=llmq_logits(tool, d, toks[:N_SHORT], work / "lr-short.f32"))


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


@needs_hf
@pytest.mark.parametrize("which", ["long", "short"])
def test_longrope_matches_transformers(longrope, which):
    r, got = longrope["ref"][which], longrope[which]
    scale, d = float(np.abs(r).max()), float(np.abs(r - got).max())
    print(f"longrope {which} ({len(r)} tokens): max |transformers - llmq| = {d:.3g}, {d / scale:.3g} of {scale:.3g}")
    assert len(r) == (N_LONG if which == "long" else N_SHORT)
    assert d <= TOL_REL * scale and (r.argmax(1) == got.argmax(1)).all()


@needs_hf
def test_longrope_factor_choice_matters(longrope):
    # the first 200 positions of the long pass against the short pass: the factor sets give other logits
    d = float(np.abs(longrope["long"][:N_SHORT] - longrope["short"]).max())
    assert d > 1000 * TOL_REL * float(np.abs(longrope["short"]).max()), d


@needs_hf
def test_longrope_gguf(tool, longrope, work):
    import gguf
    r = gguf.GGUFReader(str(longrope["gguf"]))
    t = {x.name: x for x in r.tensors}
    cfg = json.loads((longrope["hf"] / "config.json").read_text())
    rp = cfg.get("rope_parameters") or cfg["rope_scaling"]
    assert np.array_equal(t["rope_factors_long.weight"].data, np.float32(rp["long_factor"]))
    assert np.array_equal(t["rope_factors_short.weight"].data, np.float32(rp["short_factor"]))
    assert t["rope_factors_long.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    f = {k: v.parts[-1][0] for k, v in r.fields.items() if k.startswith("phi3.")}
    assert f["phi3.rope.scaling.original_context_length"] == ORIG_CTX and f["phi3.context_length"] == 1024
    assert np.float32(f["phi3.rope.scaling.attn_factor"]) == np.float32(np.sqrt(1 + np.log(4) / np.log(256)))
    # without a context llmq takes transformers' rule on the GGUF too
    got = llmq_logits(tool, longrope["gguf"], longrope["ids"][:N_SHORT], work / "lr-gguf-short.f32")
    assert np.array_equal(got, longrope["short"])


@needs_hf
@needs_llama_cpp
@pytest.mark.parametrize("n_ctx, n", [(256, N_SHORT), (512, N_SHORT), (512, N_LONG)])
def test_longrope_llama_cpp_agrees(tool, longrope, work, n_ctx, n):
    llm = gg.llama_cpp_model(longrope["gguf"], n_ctx=n_ctx)
    llm.reset()
    llm.eval(longrope["ids"][:n])
    ref = np.array(llm.scores[:n], dtype=np.float32)
    del llm
    got = llmq_logits(tool, longrope["gguf"], longrope["ids"][:n], work / f"lr-cpp-{n_ctx}-{n}.f32", rope_ctx=n_ctx)
    check_live(f"phi3 longrope n_ctx {n_ctx}, {n} tokens", got, ref, F32_TOL, 1.0)
    # llama.cpp's factors are those of its context: long at 512 even for 200 tokens, where transformers takes short
    hf_rule = longrope["long" if n > ORIG_CTX else "short"][:n]
    assert (float(np.abs(hf_rule - ref).max()) > 10 * F32_TOL) == (n_ctx > ORIG_CTX and n <= ORIG_CTX)


@needs_hf
def test_longrope_gguf_to_hf(llmq_bin, tool, longrope, work):
    back = work / "lr-back"
    run([llmq_bin, "convert", "--model", longrope["gguf"], "--out", back, "--to", "hf", "--quiet"])
    cfg = json.loads((back / "config.json").read_text())
    src = json.loads((longrope["hf"] / "config.json").read_text())["rope_parameters"]
    rs = cfg["rope_scaling"]
    assert rs["type"] == "longrope" and "attention_factor" not in rs and "factor" not in rs
    assert rs["long_factor"] == src["long_factor"] and rs["short_factor"] == src["short_factor"]
    assert cfg["original_max_position_embeddings"] == ORIG_CTX and cfg["max_position_embeddings"] == 1024
    got = llmq_logits(tool, back, longrope["ids"], work / "lr-back.f32")
    assert np.array_equal(got, longrope["long"])


@pytest.mark.parametrize("change, message", [
    (dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 7,
                           "long_factor": [2.0] * 8}), '"rope_parameters.short_factor" is not an array of 8 numbers'),
    (dict(rope_scaling={"type": "su", "short_factor": [1.0] * 8}), 'missing key "rope_scaling.long_factor"'),
    (dict(rope_scaling={"type": "su", "short_factor": [1.0] * 8, "long_factor": [0.0] * 8}),
     "LongRoPE factor 0 (short 1, long 0) must be positive"),
    (dict(rope_scaling={"type": "yarn", "factor": 2.0}), 'rope_scaling type "yarn" is not supported'),
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


@needs_hf
@pytest.mark.parametrize("src", ["hf", "gguf"])
def test_longrope_quantized_keeps_factors(llmq_bin, tool, longrope, work, src):
    """`llmq quantize` of a LongRoPE model keeps its factors: the GGUF holds rope_factors_long / _short in F32 and the
    phi3.rope.scaling keys as convert writes them, a directory's config.json its rope_scaling; llmq's logits on the
    RTN Q8_0 file are close to the f32 model's (the factor sets differ by far more: test_longrope_factor_choice)."""
    import gguf
    model = longrope[src]
    out = work / f"lr-q8-{src}.gguf"
    run([llmq_bin, "quantize", "--model", model, "--method", "rtn", "--format", "gguf", "--gguf-type", "Q8_0",
         "--out", out, "--force", "--quiet"])
    ref = gguf.GGUFReader(str(longrope["gguf"]))
    r = gguf.GGUFReader(str(out))
    t, t0 = {x.name: x for x in r.tensors}, {x.name: x for x in ref.tensors}
    for n in ("rope_factors_long.weight", "rope_factors_short.weight"):
        assert t[n].tensor_type == gguf.GGMLQuantizationType.F32 and np.array_equal(t[n].data, t0[n].data), n
    for k in ("phi3.rope.scaling.attn_factor", "phi3.rope.scaling.original_context_length"):
        assert r.fields[k].parts[-1][0] == ref.fields[k].parts[-1][0], k
    for n, ids in (("long", longrope["ids"]), ("short", longrope["ids"][:N_SHORT])):
        got = llmq_logits(tool, out, ids, work / f"lr-q8-{src}-{n}.f32")
        want = longrope[n]
        assert float(np.abs(got - want).max()) < 0.05 * float(np.abs(want).max()), n
    d = work / f"lr-fake-{src}"
    run([llmq_bin, "quantize", "--model", model, "--method", "rtn", "--format", "fake", "--bits", "8",
         "--group-size", "32", "--out", d, "--force", "--quiet"])
    cfg = json.loads((d / "config.json").read_text())
    rs = cfg.get("rope_scaling") or cfg["rope_parameters"]  # transformers 5 writes rope_parameters, 4 rope_scaling
    src_rp = json.loads((longrope["hf"] / "config.json").read_text())
    src_rp = src_rp.get("rope_parameters") or src_rp["rope_scaling"]
    assert "longrope" in (rs.get("type"), rs.get("rope_type")) and rs["long_factor"] == src_rp["long_factor"], rs
    assert rs["short_factor"] == src_rp["short_factor"] and cfg["original_max_position_embeddings"] == ORIG_CTX
    got = llmq_logits(tool, d, longrope["ids"], work / f"lr-fake-{src}.f32")
    assert float(np.abs(got - longrope["long"]).max()) < 0.05 * float(np.abs(longrope["long"]).max())
