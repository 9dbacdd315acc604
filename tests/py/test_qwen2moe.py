"""Oracle: Qwen2-MoE (qwen2_moe: routed experts plus a sigmoid-gated shared expert) against transformers and llama.cpp.

The models: tests/py/hf_qwen2moe_model.py builds random-weight Qwen2MoeForCausalLM checkpoints ("tiny-q2moe": hidden
64, 8 experts of width 48, top-3, shared expert of width 96, norm_topk_prob false; "tiny-q2moe-norm": the same
weights with norm_topk_prob true; "wide-q2moe": hidden 256, 4 experts of width 256, top-2, shared expert of width
512), 48 token ids. Then, as tests/py/test_moe.py does for mixtral / qwen3_moe:

  transformers   llmq's forward on the HF directory (the per-expert and shared-expert tensors as save_pretrained
                 writes them), f32 against f32: max |diff| <= TOL_REL * max |logit| (tests/py/test_qwen3.py's
                 analysis; the shared expert adds one dense MLP, a (1, D) product and a sigmoid per token, a few
                 chained ops inside the x10 margin). Top-1 equal at every position.
  routing ties   excluded by measurement: the smallest gap between the K-th and (K+1)-th router probability over
                 every token and layer must exceed MARGIN = 1e-5 (test_moe.py's derivation: the two forwards' hidden
                 states differ by about 1e-6 relative, so a gap ten times that cannot flip).
  shared expert  the sigmoid gate is live: with the gate's weights scaled so that it saturates the logits move
                 (test_shared_expert_gate_is_live), so a forward that ignored the shared expert or its gate would
                 fail the comparison above.
  norm_topk_prob true differs from false and matches transformers too; it has no GGUF form (llama.cpp's qwen2moe
                 graph never renormalises): refused.
  GGUF           `llmq convert` writes general.architecture qwen2moe, ffn_{gate,up,down}_exps stacked as for
                 qwen3moe, ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp (ne [D, 1], f32 as convert_hf_to_gguf.py keeps
                 it) and expert_feed_forward_length / expert_shared_feed_forward_length; llmq on the GGUF equals llmq
                 on the HF directory bit for bit (no q/k permutation).
  llama.cpp      llama-cpp-python on that GGUF agrees within F32_TOL (LLaMA's tolerance), top-1 equal.
  GGUF -> HF     every tensor bit-identical (shared_expert_gate back as (1, D)), the config keys back.
  quantize       `llmq quantize --method rtn --format gguf --no-provenance` byte-identical to llama_model_quantize
                 for Q8_0, Q4_K_M, Q6_K on both GGUFs (llama-quantize writes ffn_gate_inp_shexp 1-D: ggml_n_dims), and
                 the HF directory as input gives the same file.
Figures measured: the module's print lines (pytest -s).
"""
import json

import numpy as np
import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, build_hf_models, forward, gguf_back_to_hf, moe_ggufs, moe_models
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import F32_TOL, HAVE_LLAMA_CPP, check_live
import gen_golden_forward as gg
import test_gguf_mix as gm
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)

pytestmark = [pytest.mark.heavy, pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)]
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")
TOL_REL = 1e-4
MARGIN = 1e-5  # derived in test_moe.py's docstring
VARIANTS = ["tiny-q2moe", "tiny-q2moe-norm", "wide-q2moe"]
GGUF_VARIANTS = ["tiny-q2moe", "wide-q2moe"]
SHAPES = {"tiny-q2moe": (8, 64, 48, 96, 3), "wide-q2moe": (4, 256, 256, 512, 2)}  # E, D, Fe, Fs, K


@pytest.fixture(scope="module")
def models(llmq_bin, tool, stories_v3, work, ids):
    return moe_models(llmq_bin, tool, stories_v3, work, ids, "hf_qwen2moe_model.py", VARIANTS)


@pytest.fixture(scope="module")
def ggufs(llmq_bin, tool, models, work, ids):
    return moe_ggufs(llmq_bin, tool, models, work, ids, GGUF_VARIANTS)


def test_saved_layout(models):
    """What transformers' save_pretrained writes for qwen2_moe: one tensor per expert and the shared expert's."""
    from safetensors.numpy import load_file
    t = load_file(str(models["tiny-q2moe"]["hf"] / "model.safetensors"))
    E, D, fe, fs, _ = SHAPES["tiny-q2moe"]
    p = "model.layers.1.mlp."
    assert t[p + "gate.weight"].shape == (E, D)
    assert t[p + f"experts.{E - 1}.gate_proj.weight"].shape == (fe, D)
    assert t[p + f"experts.{E - 1}.down_proj.weight"].shape == (D, fe)
    assert t[p + "shared_expert.gate_proj.weight"].shape == (fs, D)
    assert t[p + "shared_expert.down_proj.weight"].shape == (D, fs)
    assert t[p + "shared_expert_gate.weight"].shape == (1, D)
    assert "model.layers.1.self_attn.q_proj.bias" in t and "model.layers.1.self_attn.o_proj.bias" not in t
    print(f"tiny-q2moe: {len(t)} tensors, e.g. {sorted(k for k in t if k.startswith(p + 'shared'))}")


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
    a, b = models["tiny-q2moe"]["ref"], models["tiny-q2moe-norm"]["ref"]
    assert float(np.abs(a - b).max()) > 1000 * TOL_REL * float(np.abs(a).max())


def test_shared_expert_gate_is_live(tool, models, work, ids):
    """The shared expert's sigmoid gate changes the output: scaling its weights by -50 (sigmoid -> ~0 or 1 per token)
    moves llmq's logits far beyond TOL_REL, so the transformers agreement above covers the shared expert's path."""
    import shutil
    from safetensors.numpy import load_file, save_file
    src, dst = models["tiny-q2moe"]["hf"], work / "tiny-q2moe-gate"
    shutil.copytree(src, dst, dirs_exist_ok=True)
    t = load_file(str(src / "model.safetensors"))
    for l in range(2):
        t[f"model.layers.{l}.mlp.shared_expert_gate.weight"] = t[f"model.layers.{l}.mlp.shared_expert_gate.weight"] * -50
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    got = forward(tool, dst, ids["path"], work / "gate.llmq.f32")
    base = models["tiny-q2moe"]["llmq_hf"]
    d = float(np.abs(got - base).max()) / float(np.abs(base).max())
    print(f"tiny-q2moe: shared gate x -50 moves the logits by {d:.3g} of max |logit|")
    assert d > 100 * TOL_REL


def test_normalised_routing_has_no_gguf(llmq_bin, models, work):
    out = work / "norm.gguf"
    r = run([llmq_bin, "convert", "--model", models["tiny-q2moe-norm"]["hf"], "--out", out], check=False)
    assert r.returncode != 0 and "norm_topk_prob true" in r.stderr and not out.exists(), r.stderr


@pytest.mark.parametrize("v", GGUF_VARIANTS)
def test_gguf(ggufs, v):
    import gguf
    models = ggufs
    r = gguf.GGUFReader(str(models[v]["gguf"]))
    t = {x.name: x for x in r.tensors}
    E, D, fe, fs, K = SHAPES[v]
    F = gguf.GGMLQuantizationType
    assert list(t["blk.1.ffn_gate_exps.weight"].shape) == [D, fe, E]
    assert list(t["blk.1.ffn_down_exps.weight"].shape) == [fe, D, E]
    assert list(t["blk.1.ffn_gate_shexp.weight"].shape) == [D, fs]
    assert list(t["blk.1.ffn_up_shexp.weight"].shape) == [D, fs]
    assert list(t["blk.1.ffn_down_shexp.weight"].shape) == [fs, D]
    assert list(t["blk.1.ffn_gate_inp_shexp.weight"].shape) == [D, 1]
    assert list(t["blk.1.ffn_gate_inp.weight"].shape) == [D, E]
    for n in ("ffn_gate_inp", "ffn_gate_inp_shexp"):
        assert t[f"blk.1.{n}.weight"].tensor_type == F.F32
    assert "blk.1.attn_q.bias" in t and not any(n.endswith(("ffn_gate.weight", "ffn_down.weight")) for n in t)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == "qwen2moe"
    for key, want in (("expert_count", E), ("expert_used_count", K), ("expert_feed_forward_length", fe),
                      ("expert_shared_feed_forward_length", fs)):
        assert int(r.fields[f"{arch}.{key}"].parts[-1][0]) == want, key
    from safetensors.numpy import load_file
    hf = load_file(str(models[v]["hf"] / "model.safetensors"))
    assert np.array_equal(np.asarray(t["blk.1.ffn_down_shexp.weight"].data),
                          hf["model.layers.1.mlp.shared_expert.down_proj.weight"])
    assert np.array_equal(np.asarray(t["blk.1.ffn_gate_inp_shexp.weight"].data).reshape(1, D),
                          hf["model.layers.1.mlp.shared_expert_gate.weight"])
    assert np.array_equal(np.asarray(t["blk.1.ffn_up_exps.weight"].data)[E - 1],
                          hf[f"model.layers.1.mlp.experts.{E - 1}.up_proj.weight"])
    a, b = models[v]["llmq_gguf"], models[v]["llmq_hf"]
    print(f"{v}: max |llmq GGUF - llmq HF| = {float(np.abs(a - b).max()):.3g}")
    assert np.array_equal(a, b)


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
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name], b[name]), name
    src = json.loads((models[v]["hf"] / "config.json").read_text())
    for k in ("model_type", "architectures", "num_experts_per_tok", "intermediate_size", "moe_intermediate_size",
              "shared_expert_intermediate_size", "norm_topk_prob"):
        assert cfg[k] == src[k], k
    assert cfg.get("num_experts", cfg.get("num_local_experts")) == SHAPES[v][0]


@pytest.mark.parametrize("v", GGUF_VARIANTS)
@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_K_M", "Q6_K"])
def test_rtn_gguf_byte_identical_to_llama_quantize(llmq_bin, lc, ggufs, work, v, gtype):
    import gguf
    ref_, mine = work / f"ref-{v}-{gtype}.gguf", work / f"mine-{v}-{gtype}.gguf"
    gm.lc_quantize(lc, ggufs[v]["gguf"], ref_, gm.FTYPES[gtype])
    gm.llmq_q(llmq_bin, ggufs[v]["gguf"], mine, gtype, "--no-provenance")
    t = {x.name: x for x in gguf.GGUFReader(str(ref_)).tensors}
    types = {n: t[f"blk.0.{n}.weight"].tensor_type.name for n in ("ffn_down_shexp", "ffn_down_exps", "ffn_up_shexp")}
    print(f"{v} {gtype}: llama-quantize's types {types}, ffn_gate_inp_shexp {list(t['blk.0.ffn_gate_inp_shexp.weight'].shape)}")
    assert gm.same_file(ref_, mine) is None, gm.same_file(ref_, mine)


@pytest.mark.parametrize("v", GGUF_VARIANTS)
def test_rtn_gguf_from_hf_equals_from_gguf(llmq_bin, ggufs, work, v):
    gtype = "Q4_K_M"
    a, b = work / f"hf-{v}-{gtype}.gguf", work / f"gg-{v}-{gtype}.gguf"
    gm.llmq_q(llmq_bin, ggufs[v]["hf"], a, gtype, "--no-provenance")
    gm.llmq_q(llmq_bin, ggufs[v]["gguf"], b, gtype, "--no-provenance")
    assert gm.same_file(a, b) is None, gm.same_file(a, b)


def test_quantized_gguf_loads_back(llmq_bin, tool, ggufs, work, ids):
    """llmq reads its own quantized qwen2moe file (ffn_gate_inp_shexp 1-D there) and converts it back to HF with the
    shared expert gate as (1, D)."""
    q = work / "mine-tiny-q2moe-Q8_0.gguf"
    if not q.exists():
        gm.llmq_q(llmq_bin, ggufs["tiny-q2moe"]["gguf"], q, "Q8_0", "--no-provenance")
    got = forward(tool, q, ids["path"], work / "q8.llmq.f32")
    base = ggufs["tiny-q2moe"]["llmq_gguf"]
    d = float(np.abs(got - base).max()) / float(np.abs(base).max())
    print(f"tiny-q2moe Q8_0: max |llmq(Q8_0) - llmq(f32)| / max |logit| = {d:.3g}")
    assert d < 0.05
