"""Oracle: the Phi-3 family (model_type / general.architecture "phi3": fused qkv_proj / attn_qkv and
gate_up_proj / ffn_up, NEOX RoPE, the sliding window of every layer in transformers) against transformers and
llama.cpp, with LongRoPE and with Phi-4-mini's partial RoPE. Refused configs are tested as refused (the last
parametrized test). Quantized output (the fused linears written back fused): tests/py/test_phi3_quant.py.

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

Partial RoPE (Phi-4-mini's shape, formats/llama/arch.h "Phi-3": partial_rotary_factor 0.75, so 12 of a head's 16
values rotate, tie_word_embeddings true): "tiny-p4" (48 ids) and "tiny-p4-longrope" (its LongRoPE lists 6 long:
rotary dims / 2; the 300 / 200 ids of tiny-longrope).
  transformers   TOL_REL of max |logit|; measured 8.8e-7 (tiny-p4), 2.8e-6 (LongRoPE, 300 tokens, long), 8.4e-6 (200,
                 short); top-1 equal. Rotating whole heads instead (the factor removed) is far off.
  GGUF           phi3.rope.dimension_count 12 (convert_hf_to_gguf.py Phi3MiniModel's int(0.75 * n_embd) // n_head), no
                 output.weight, rope_factors_* of 6; llmq's forward on it equals the directory's bit for bit;
                 llama-cpp-python within F32_TOL, top-1 equal: measured 3.7e-6 (tiny-p4), 5.0e-6 (LongRoPE n_ctx 256,
                 200 tokens), 5.1e-6 (n_ctx 512, 300 tokens).
  GGUF -> HF     tensors bit-identical, config.json partial_rotary_factor 0.75 and tied; llmq's logits equal, and
                 transformers on the converted directory within TOL_REL (measured 8.8e-7).
  quantize       RTN Q8_0 (`--no-provenance`) byte-identical to llama_model_quantize, from the GGUF and from the HF
                 directory; gptq 4 bits group 32 (--format gptq, 4 x 64 wikitext tokens), numpy-unpacked, in
                 transformers within TOL_REL of llmq on the packed directory (measured 7.0e-7).
"""
import json
import os
import shutil

import numpy as np
import pytest

from conftest import run
from family_oracle import HERE, HF_PYTHON, HF_SKIP_REASON, build_hf_models, forward, gguf_back_to_hf
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import F32_TOL, HAVE_LLAMA_CPP, check_live
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)
from test_phi3_quant import unpacked_dir
import gen_golden_forward as gg
import test_gguf_mix as gm

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


def check_transformers(label, r, got):
    """llmq's logits got within TOL_REL of max |logit| of transformers' r, top-1 equal everywhere."""
    scale, d = float(np.abs(r).max()), float(np.abs(r - got).max())
    print(f"{label} ({len(r)} tokens): max |transformers - llmq| = {d:.3g}, {d / scale:.3g} of max |logit| {scale:.3g}")
    assert d <= TOL_REL * scale and (r.argmax(1) == got.argmax(1)).all(), label


def far_with_config(tool, src, dst, ids, edit, ref):
    """llmq's logits on a copy of directory src whose config.json edit(cfg) changed are far (1000 TOL_REL of max
    |logit|) from ref: the edited key matters, so a forward ignoring it would fail its oracle test."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    got = forward(tool, dst, ids["path"], dst.with_suffix(".f32"))
    assert float(np.abs(got - ref).max()) > 1000 * TOL_REL * float(np.abs(got).max())


@needs_hf
@pytest.mark.parametrize("v", VARIANTS)
def test_forward_matches_transformers(models, v):
    check_transformers(v, models[v]["ref"], models[v]["llmq_hf"])


@needs_hf
def test_sliding_window_matters(tool, models, work, ids):
    far_with_config(tool, models["tiny-swa"]["hf"], work / "tiny-swa-nowindow", ids,
                    lambda cfg: cfg.update(sliding_window=None), models["tiny-swa"]["ref"])


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
    assert len(r) == (N_LONG if which == "long" else N_SHORT)
    check_transformers(f"longrope {which}", r, got)


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


def llama_cpp_vs_llmq(tool, gguf, ids, n_ctx, out, label):
    """llama.cpp's logits of the ids in one eval at context n_ctx, checked against llmq's with ROPE_CTX = n_ctx
    (llama.cpp's choice of LongRoPE factors) within F32_TOL; returns llama.cpp's."""
    llm = gg.llama_cpp_model(gguf, n_ctx=n_ctx)
    llm.reset()
    llm.eval(ids)
    ref = np.array(llm.scores[:len(ids)], dtype=np.float32)
    del llm
    check_live(label, llmq_logits(tool, gguf, ids, out, rope_ctx=n_ctx), ref, F32_TOL, 1.0)
    return ref


@needs_hf
@needs_llama_cpp
@pytest.mark.parametrize("n_ctx, n", [(256, N_SHORT), (512, N_SHORT), (512, N_LONG)])
def test_longrope_llama_cpp_agrees(tool, longrope, work, n_ctx, n):
    ref = llama_cpp_vs_llmq(tool, longrope["gguf"], longrope["ids"][:n], n_ctx, work / f"lr-cpp-{n_ctx}-{n}.f32",
                            f"phi3 longrope n_ctx {n_ctx}, {n} tokens")
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
    (dict(partial_rotary_factor=0.7), "partial_rotary_factor 0.7 of head_dim 16 gives 11 rotary dims"),
    (dict(partial_rotary_factor=1.5), "partial_rotary_factor 1.5 is not in (0, 1]"),
    (dict(partial_rotary_factor=0.75, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
     "partial_rotary_factor 0.75 at the top level and 0.5 in rope_parameters differ"),
    # LongRoPE lists of head_dim / 2 = 8 under partial RoPE: transformers (and llama.cpp) want rotary dims / 2 = 6
    (dict(partial_rotary_factor=0.75, rope_scaling={"type": "longrope", "short_factor": [1.0] * 8,
                                                    "long_factor": [1.0] * 8}),
     '"rope_scaling.short_factor" is not an array of 6 numbers'),
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


# ---- partial RoPE (Phi-4-mini's shape: partial_rotary_factor 0.75, tied embeddings) -------------------------------

P4, P4LR = "tiny-p4", "tiny-p4-longrope"  # as tests/py/hf_phi3_model.py
N_ROT = 12  # int(head_dim 16 * 0.75)


@pytest.fixture(scope="module")
def partial(llmq_bin, tool, models, work, ids):
    """Both partial-RoPE directories, their `llmq convert` GGUFs, transformers' logits and llmq's on the directory."""
    out = {}
    for v in (P4, P4LR):
        out[v] = dict(hf=work / v, gguf=work / f"{v}.gguf")
        run([llmq_bin, "convert", "--model", out[v]["hf"], "--out", out[v]["gguf"], "--quiet"])
    out[P4].update(ref=np.fromfile(work / f"{P4}.hf.f32", np.float32).reshape(48, -1),
                   llmq_hf=forward(tool, out[P4]["hf"], ids["path"], work / f"{P4}.llmq-hf.f32"),
                   llmq_gguf=forward(tool, out[P4]["gguf"], ids["path"], work / f"{P4}.llmq-gguf.f32"))
    toks = [int(x) for x in (work / f"{P4LR}.ids").read_text().split()]
    out[P4LR].update(ids=toks, ref={n: np.fromfile(work / f"{P4LR}.hf-{n}.f32", np.float32).reshape(-1, 512)
                                    for n in ("long", "short")},
                     long=llmq_logits(tool, out[P4LR]["hf"], toks, work / "p4lr-long.f32"),
                     short=llmq_logits(tool, out[P4LR]["hf"], toks[:N_SHORT], work / "p4lr-short.f32"))
    return out


def partial_pair(partial, which):
    """(transformers' logits, llmq's on the HF directory) of P4 ("p4") or of P4LR's long / short pass."""
    if which == "p4":
        return partial[P4]["ref"], partial[P4]["llmq_hf"]
    return partial[P4LR]["ref"][which], partial[P4LR][which]


@needs_hf
@pytest.mark.parametrize("which", ["p4", "long", "short"])
def test_partial_rotary_matches_transformers(partial, which):
    check_transformers(f"partial RoPE {which}", *partial_pair(partial, which))


def whole_heads(cfg):
    """config.json without partial_rotary_factor (top level, rope_parameters / rope_scaling): whole heads rotate."""
    for c in (cfg, cfg.get("rope_parameters"), cfg.get("rope_scaling")):
        if isinstance(c, dict):
            c.pop("partial_rotary_factor", None)


@needs_hf
def test_partial_rotary_matters(tool, partial, work, ids):
    far_with_config(tool, partial[P4]["hf"], work / "p4-whole-heads", ids, whole_heads, partial[P4]["ref"])


@needs_hf
def test_partial_rotary_gguf(tool, partial, work):
    """rope.dimension_count is n_rot (as convert_hf_to_gguf.py Phi3MiniModel writes it), no output.weight (tied), the
    LongRoPE factor tensors n_rot / 2 long; llmq's forward on the GGUF equals the one on the directory bit for bit
    (LongRoPE: transformers' rule without a context, so the short factors for 200 tokens)."""
    import gguf
    for v in (P4, P4LR):
        r = gguf.GGUFReader(str(partial[v]["gguf"]))
        f = {k: x.parts[-1][0] for k, x in r.fields.items() if k.startswith("phi3.")}
        t = {x.name: x for x in r.tensors}
        assert f["phi3.rope.dimension_count"] == N_ROT and "phi3.attention.key_length" not in f, v
        assert "output.weight" not in t and "token_embd.weight" in t, v
    cfg = json.loads((partial[P4LR]["hf"] / "config.json").read_text())
    rp = cfg.get("rope_parameters") or cfg["rope_scaling"]
    for n in ("long", "short"):
        assert len(rp[f"{n}_factor"]) == N_ROT // 2
        assert np.array_equal(t[f"rope_factors_{n}.weight"].data, np.float32(rp[f"{n}_factor"])), n
    assert np.array_equal(partial[P4]["llmq_gguf"], partial[P4]["llmq_hf"])
    got = llmq_logits(tool, partial[P4LR]["gguf"], partial[P4LR]["ids"][:N_SHORT], work / "p4lr-gguf-short.f32")
    assert np.array_equal(got, partial[P4LR]["short"])


@needs_hf
@needs_llama_cpp
@pytest.mark.parametrize("v, n_ctx, n", [(P4, 512, 48), (P4LR, 256, N_SHORT), (P4LR, 512, N_LONG)])
def test_partial_rotary_llama_cpp_agrees(tool, partial, ids, work, v, n_ctx, n):
    toks = ids["tokens"] if v == P4 else partial[v]["ids"][:n]
    llama_cpp_vs_llmq(tool, partial[v]["gguf"], toks, n_ctx, work / f"p4-cpp-{v}-{n_ctx}.f32",
                      f"phi3 partial RoPE {v} n_ctx {n_ctx}, {n} tokens")


@needs_hf
@pytest.mark.parametrize("v", [P4, P4LR])
def test_partial_rotary_gguf_to_hf(llmq_bin, tool, partial, work, ids, v):
    """GGUF -> HF: every tensor bit-identical (no lm_head: tied), config.json with partial_rotary_factor 0.75 and
    tie_word_embeddings; llmq's logits on it equal those on the original directory (transformers' on it:
    test_partial_rotary_written_dirs_in_transformers)."""
    a, b, cfg = gguf_back_to_hf(llmq_bin, partial[v]["gguf"], partial[v]["hf"], work / f"{v}-back")
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    assert "lm_head.weight" not in b and cfg["tie_word_embeddings"] is True and cfg["partial_rotary_factor"] == 0.75
    if v == P4:
        assert np.array_equal(forward(tool, work / f"{v}-back", ids["path"], work / "p4-back.f32"),
                              partial[P4]["llmq_hf"])
    else:
        got = llmq_logits(tool, work / f"{v}-back", partial[v]["ids"], work / "p4lr-back.f32")
        assert np.array_equal(got, partial[v]["long"])


@needs_hf
@pytest.mark.parametrize("v", [P4, P4LR])
def test_partial_rotary_q8_0_byte_identical_to_llama_quantize(llmq_bin, lc, partial, work, v):
    """`llmq quantize --method rtn --format gguf --gguf-type Q8_0 --no-provenance` of the converted GGUF, and of the
    HF directory, is llama_model_quantize's file (of the converted GGUF) byte for byte (tests/py/test_phi3_quant.py's
    check, here with a tied embedding and rope.dimension_count below the head size)."""
    ref, mine, mine_hf = (work / f"{v}-{x}-Q8_0.gguf" for x in ("ref", "mine", "mine-hf"))
    gm.lc_quantize(lc, partial[v]["gguf"], ref, gm.FTYPES["Q8_0"])
    gm.llmq_q(llmq_bin, partial[v]["gguf"], mine, "Q8_0", "--no-provenance")
    gm.llmq_q(llmq_bin, partial[v]["hf"], mine_hf, "Q8_0", "--no-provenance")  # from the directory: the same bytes
    assert gm.same_file(ref, mine) is None, gm.same_file(ref, mine)
    assert gm.same_file(ref, mine_hf) is None, gm.same_file(ref, mine_hf)


@needs_hf
def test_partial_rotary_written_dirs_in_transformers(llmq_bin, tool, data_dir, partial, ids, work):
    """Directories llmq writes for the partial-RoPE model, in transformers' Phi3ForCausalLM: the GGUF -> HF
    conversion (config.json from llmq's writer) and `llmq quantize --method gptq --bits 4 --format gptq` of the
    directory (numpy-unpacked by tests/py/unpack_ref.py), each against llmq's forward on the same directory
    (the packed one for gptq) within TOL_REL."""
    back, q, u = work / "p4-back-t", work / "p4-gptq", work / "p4-gptq-unpacked"
    run([llmq_bin, "convert", "--model", partial[P4]["gguf"], "--out", back, "--to", "hf", "--quiet"])
    run([llmq_bin, "quantize", "--model", partial[P4]["hf"], "--method", "gptq", "--bits", "4", "--group-size", "32",
         "--format", "gptq", "--calib", data_dir / "wikitext-2-raw" / "wiki.test.raw", "--nsamples", "4", "--seqlen",
         "64", "--threads", "2", "--out", q, "--force", "--quiet"])
    unpacked_dir(q, u, (128, 64))
    run([HF_PYTHON, os.path.join(HERE, "hf_phi3_quant_model.py"), "logits", ids["path"], back, f"{back}.hf.f32", u,
         f"{u}.hf.f32"], env=dict(os.environ, OMP_NUM_THREADS="2"))
    for label, d, ours in (("GGUF -> HF", back, back), ("gptq 4-bit", u, q)):
        check_transformers(f"partial RoPE {label}", np.fromfile(f"{d}.hf.f32", np.float32).reshape(48, -1),
                           forward(tool, ours, ids["path"], work / f"{ours.name}.llmq.f32"))
