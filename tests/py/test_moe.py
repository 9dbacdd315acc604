"""Oracle: the mixture-of-experts families (mixtral, qwen3_moe) against transformers and llama.cpp.

The models: tests/py/hf_moe_model.py builds random-weight MixtralForCausalLM / Qwen3MoeForCausalLM checkpoints
(hidden 64, 2 layers, 8 experts; mixtral top-2 of width 96, qwen3_moe top-3 of width 48 with head_dim 16 and
norm_topk_prob true, and the same weights with norm_topk_prob false), 48 token ids. Then:

  transformers   llmq's forward on the HF directory, f32 against f32: max |diff| <= 1e-4 * max |logit|
                 (tests/py/test_qwen3.py's analysis; the mixture adds K products and a softmax per token, a few
                 more chained ops, well inside the x10 margin). Top-1 equal at every position.
  routing ties   excluded by measurement, not by luck: the reference script records, for every token and layer,
                 the gap between the K-th and (K+1)-th largest router probability; the test requires the
                 smallest gap to exceed MARGIN = 1e-5. The two forwards' hidden states differ by about 1e-6
                 relative (the logit gap measured below), so the router probabilities (<= 1) differ by about
                 1e-6: a gap ten times that cannot flip between the implementations, and every token is routed
                 alike. A seed that produced a near-tie would fail that assertion, not the logit comparison.
                 Measured smallest gaps: 1.4e-3 (mixtral), 9.0e-5 (qwen3_moe), 7.4e-4 (unnormalised).
  norm_topk_prob the unnormalised variant matches transformers too and differs from the normalised one.
  NOT DONE YET (skipped, NOT_DONE): the GGUF, llama.cpp, GGUF -> HF and quantize checks below; the GGUF
  loader reads stacked experts, but `llmq convert` does not write them yet.
  GGUF           `llmq convert` stacks the experts as convert_hf_to_gguf.py does (ffn_{gate,up,down}_exps (E, ., .),
                 router ffn_gate_inp f32); mixtral is GGUF "llama" with expert_count; qwen3_moe "qwen3moe". llmq on
                 the GGUF equals llmq on the HF directory (qwen3_moe bit for bit; mixtral within TOL_REL: its
                 q/k rows are permuted and RoPE pairs adjacent values). norm_topk_prob false has no GGUF form:
                 refused.
  llama.cpp      llama-cpp-python on that GGUF agrees within F32_TOL (LLaMA's tolerance), top-1 equal.
  GGUF -> HF     every tensor bit-identical, the per-expert names back.
  quantize       `llmq quantize --method rtn --format gguf --no-provenance` byte-identical to llama_model_quantize
                 for Q8_0, Q4_K_M, Q6_K.
Figures measured: the module's print lines (pytest -s).
"""
import json

import numpy as np
import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, N_VOCAB, build_hf_models, forward, gguf_back_to_hf
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import F32_TOL, HAVE_LLAMA_CPP, check_live
import gen_golden_forward as gg
import test_gguf_mix as gm
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)

pytestmark = [pytest.mark.heavy, pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)]
NOT_DONE = pytest.mark.skip(reason="not implemented yet: llmq convert does not stack the experts into "
                                    "ffn_*_exps (issue 15, MoE step 2)")
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")
TOL_REL = 1e-4
MARGIN = 1e-5  # derived in the module docstring
VARIANTS = ["tiny-mix", "tiny-qmoe", "tiny-qmoe-raw"]
GGUF_VARIANTS = ["tiny-mix", "tiny-qmoe"]


@pytest.fixture(scope="module")
def models(llmq_bin, tool, stories_v3, work, ids):
    build_hf_models(llmq_bin, stories_v3, work, ids, "hf_moe_model.py", HF_PYTHON)
    out = {}
    for v in VARIANTS:
        d = work / v
        out[v] = dict(hf=d, ref=np.fromfile(f"{d}.hf.f32", np.float32).reshape(48, -1),
                      margin=json.loads((work / f"{v}.margin.json").read_text()),
                      llmq_hf=forward(tool, d, ids["path"], work / f"{v}.llmq-hf.f32"))
    return out


@pytest.fixture(scope="module")
def ggufs(llmq_bin, tool, models, work, ids):
    for v in GGUF_VARIANTS:
        gguf = work / f"{v}.gguf"
        run([llmq_bin, "convert", "--model", models[v]["hf"], "--out", gguf, "--quiet"])
        models[v].update(gguf=gguf, llmq_gguf=forward(tool, gguf, ids["path"], work / f"{v}.llmq-gguf.f32"))
    return models


@pytest.mark.parametrize("v", VARIANTS)
def test_routing_has_no_near_ties(models, v):
    gaps = [layer["gap"] for layer in models[v]["margin"]]
    counts = [x["counts"] for x in models[v]["margin"]]
    print(f"{v}: smallest top-k router gap per layer {gaps}, tokens per expert {counts}")
    assert min(gaps) > MARGIN


@pytest.mark.parametrize("v", VARIANTS)
def test_forward_matches_transformers(models, v):
    r, got = models[v]["ref"], models[v]["llmq_hf"]
    scale, d = float(np.abs(r).max()), float(np.abs(r - got).max())
    print(f"{v}: max |transformers - llmq| = {d:.3g}, {d / scale:.3g} of max |logit| {scale:.3g}")
    assert d <= TOL_REL * scale and (r.argmax(1) == got.argmax(1)).all()


def test_norm_topk_prob_matters(models):
    a, b = models["tiny-qmoe"]["ref"], models["tiny-qmoe-raw"]["ref"]
    assert float(np.abs(a - b).max()) > 1000 * TOL_REL * float(np.abs(a).max())


def test_unnormalised_routing_has_no_gguf(llmq_bin, models, work):
    out = work / "raw.gguf"
    r = run([llmq_bin, "convert", "--model", models["tiny-qmoe-raw"]["hf"], "--out", out], check=False)
    assert r.returncode != 0 and "norm_topk_prob false" in r.stderr and not out.exists(), r.stderr


@pytest.mark.parametrize("v", GGUF_VARIANTS)
def test_gguf(ggufs, v):
    import gguf
    models = ggufs
    r = gguf.GGUFReader(str(models[v]["gguf"]))
    t = {x.name: x for x in r.tensors}
    E, fe = 8, 96 if v == "tiny-mix" else 48
    assert list(t["blk.1.ffn_gate_exps.weight"].shape) == [64, fe, E]
    assert list(t["blk.1.ffn_up_exps.weight"].shape) == [64, fe, E]
    assert list(t["blk.1.ffn_down_exps.weight"].shape) == [fe, 64, E]
    assert list(t["blk.1.ffn_gate_inp.weight"].shape) == [64, E]
    assert t["blk.1.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert not any(n.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")) for n in t)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == ("llama" if v == "tiny-mix" else "qwen3moe")
    assert int(r.fields[f"{arch}.expert_count"].parts[-1][0]) == E
    # expert 5's up rows of block 1 are HF's experts.5 up tensor
    from safetensors.numpy import load_file
    hf = load_file(str(models[v]["hf"] / "model.safetensors"))
    up = "block_sparse_moe.experts.5.w3.weight" if v == "tiny-mix" else "mlp.experts.5.up_proj.weight"
    assert np.array_equal(np.asarray(t["blk.1.ffn_up_exps.weight"].data)[5], hf[f"model.layers.1.{up}"])
    a, b = models[v]["llmq_gguf"], models[v]["llmq_hf"]
    d = float(np.abs(a - b).max())
    print(f"{v}: max |llmq GGUF - llmq HF| = {d:.3g}")
    if v == "tiny-qmoe":
        assert np.array_equal(a, b)
    else:
        assert d <= TOL_REL * float(np.abs(b).max()) and (a.argmax(1) == b.argmax(1)).all()


@needs_llama_cpp
@pytest.mark.parametrize("v", GGUF_VARIANTS)
def test_llama_cpp_agrees(ggufs, ids, v):
    mine, ref = ggufs[v]["llmq_gguf"], gg.llama_cpp_logits(ggufs[v]["gguf"], ids["tokens"])
    scale = float(np.abs(ref).max())
    print(f"{v}: max |llama.cpp - llmq| / max |logit| = {float(np.abs(mine - ref).max()) / scale:.3g} (max |logit| "
          f"{scale:.3g})")
    check_live(f"{v} f32", mine, ref, F32_TOL, 1.0)


@pytest.mark.parametrize("v", GGUF_VARIANTS)
def test_gguf_to_hf_reproduces_tensors(llmq_bin, ggufs, work, v):
    models = ggufs
    a, b, cfg = gguf_back_to_hf(llmq_bin, models[v]["gguf"], models[v]["hf"], work / f"back-{v}")
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    src = json.loads((models[v]["hf"] / "config.json").read_text())
    for k in ("model_type", "architectures", "num_experts_per_tok", "intermediate_size"):
        assert cfg[k] == src[k], k
    if v == "tiny-qmoe":
        assert cfg["moe_intermediate_size"] == 48 and cfg["norm_topk_prob"] is True


@NOT_DONE
@pytest.mark.parametrize("v", GGUF_VARIANTS)
@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_K_M", "Q6_K"])
def test_rtn_gguf_byte_identical_to_llama_quantize(llmq_bin, lc, ggufs, work, v, gtype):
    models = ggufs
    ref_, mine = work / f"ref-{v}-{gtype}.gguf", work / f"mine-{v}-{gtype}.gguf"
    gm.lc_quantize(lc, models[v]["gguf"], ref_, gm.FTYPES[gtype])
    gm.llmq_q(llmq_bin, models[v]["gguf"], mine, gtype, "--no-provenance")
    assert gm.same_file(ref_, mine) is None, gm.same_file(ref_, mine)
