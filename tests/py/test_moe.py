"""Oracle: the mixture-of-experts families (mixtral, qwen3_moe) against transformers and llama.cpp.

The models: tests/py/hf_moe_model.py builds random-weight MixtralForCausalLM / Qwen3MoeForCausalLM checkpoints
(hidden 64, 2 layers, 8 experts; mixtral top-2 of width 96, qwen3_moe top-3 of width 48 with head_dim 16 and
norm_topk_prob true, and the same weights with norm_topk_prob false; "wide-mix" / "wide-qmoe": hidden 256, 4 experts
of width 256, top-2, so that the K-quant blocks tile every row), 48 token ids. Then:

  transformers   llmq's forward on the HF directory, f32 against f32: max |diff| <= 1e-4 * max |logit|
                 (tests/py/test_qwen3.py's analysis; the mixture adds K products and a softmax per token, a few
                 more chained ops, well inside the x10 margin). Top-1 equal at every position.
  routing ties   excluded by measurement, not by luck: the reference script records, for every token and layer,
                 the gap between the K-th and (K+1)-th largest router probability; the test requires the
                 smallest gap to exceed MARGIN = 1e-5. The two forwards' hidden states differ by about 1e-6
                 relative (the logit gap measured below), so the router probabilities (<= 1) differ by about
                 1e-6: a gap ten times that cannot flip between the implementations, and every token is routed
                 alike. A seed that produced a near-tie would fail that assertion, not the logit comparison.
                 Measured smallest gaps: 1.4e-3 (mixtral), 9.0e-5 (qwen3_moe), 7.4e-4 (unnormalised), 6.2e-4 and
                 3.1e-4 (wide-mix, wide-qmoe).
  norm_topk_prob the unnormalised variant matches transformers too and differs from the normalised one.
  GGUF           `llmq convert` stacks the experts as convert_hf_to_gguf.py does (ffn_{gate,up,down}_exps (E, ., .),
                 expert x at [x]; router ffn_gate_inp f32, also with --dtype f16); mixtral is GGUF "llama" with
                 expert_count / expert_used_count; qwen3_moe "qwen3moe" with expert_feed_forward_length too. llmq on
                 the GGUF equals llmq on the HF directory (qwen3_moe bit for bit; mixtral within TOL_REL: its
                 q/k rows are permuted and RoPE pairs adjacent values; measured 3.5e-6 / 4.9e-6 absolute).
                 norm_topk_prob false has no GGUF form: refused.
  llama.cpp      llama-cpp-python 0.3.36 on that GGUF agrees within F32_TOL = 1e-3 (LLaMA's tolerance,
                 tests/py/test_forward_oracle.py), top-1 equal. Measured max |diff| / max |logit|: 9.4e-7 (tiny-mix),
                 1.0e-6 (tiny-qmoe), 1.3e-6 (wide-mix), 1.5e-6 (wide-qmoe).
  GGUF -> HF     every tensor bit-identical, the per-expert names and the moe config keys back.
  quantize       `llmq quantize --method rtn --format gguf --no-provenance` byte-identical to llama_model_quantize
                 for Q8_0, Q4_K_M, Q6_K (measured: identical, all four models). The tiny models hold 8 experts, so
                 llama-quantize's n_expert == 8 rules are live (attn_k / attn_v Q8_0, attn_output Q5_K), and
                 ffn_down_exps takes its block from the tensor name (Q4_K_M: Q6_K in block 1 only); their 64- / 48- /
                 96-wide rows fall back to Q5_0 / Q5_1 / Q8_0 / F16 as llama.cpp's do. The wide models (4 experts)
                 quantize the stacked experts in Q4_K and Q6_K themselves. The same file comes from the HF directory
                 as input. Per-expert importance from an --imatrix file and the type choice (--mix quality /
                 --target-*): tests/py/test_moe_imatrix.py; GPTQ / AWQ, --calib and the directories:
                 tests/py/test_moe_quant.py.
Figures measured: the module's print lines (pytest -s).
"""
import json

import numpy as np
import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, N_VOCAB, build_hf_models, forward, gguf_back_to_hf, moe_ggufs, moe_models
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import F32_TOL, HAVE_LLAMA_CPP, check_live
import gen_golden_forward as gg
import test_gguf_mix as gm
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)

pytestmark = [pytest.mark.heavy, pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)]
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")
TOL_REL = 1e-4
MARGIN = 1e-5  # derived in the module docstring
VARIANTS = ["tiny-mix", "tiny-qmoe", "tiny-qmoe-raw", "wide-mix", "wide-qmoe"]
GGUF_VARIANTS = ["tiny-mix", "tiny-qmoe", "wide-mix", "wide-qmoe"]
SHAPES = {"tiny-mix": (8, 64, 96), "tiny-qmoe": (8, 64, 48), "wide-mix": (4, 256, 256), "wide-qmoe": (4, 256, 256)}


@pytest.fixture(scope="module")
def models(llmq_bin, tool, stories_v3, work, ids):
    return moe_models(llmq_bin, tool, stories_v3, work, ids, "hf_moe_model.py", VARIANTS)


@pytest.fixture(scope="module")
def ggufs(llmq_bin, tool, models, work, ids):
    return moe_ggufs(llmq_bin, tool, models, work, ids, GGUF_VARIANTS)


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
    E, D, fe = SHAPES[v]
    mix = v.endswith("-mix")
    assert list(t["blk.1.ffn_gate_exps.weight"].shape) == [D, fe, E]
    assert list(t["blk.1.ffn_up_exps.weight"].shape) == [D, fe, E]
    assert list(t["blk.1.ffn_down_exps.weight"].shape) == [fe, D, E]
    assert list(t["blk.1.ffn_gate_inp.weight"].shape) == [D, E]
    assert t["blk.1.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert not any(n.endswith(("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")) for n in t)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    assert arch == ("llama" if mix else "qwen3moe")
    assert int(r.fields[f"{arch}.expert_count"].parts[-1][0]) == E
    assert int(r.fields[f"{arch}.expert_used_count"].parts[-1][0]) == (2 if mix or v == "wide-qmoe" else 3)
    assert mix == (f"{arch}.expert_feed_forward_length" not in r.fields)  # convert_hf_to_gguf.py: Qwen2MoeModel
    if not mix:
        assert int(r.fields[f"{arch}.expert_feed_forward_length"].parts[-1][0]) == fe
    # the last expert's up rows of block 1 are HF's up tensor of that expert, and the down rows likewise
    from safetensors.numpy import load_file
    hf = load_file(str(models[v]["hf"] / "model.safetensors"))
    x = E - 1
    up, down = (f"block_sparse_moe.experts.{x}.w3.weight", f"block_sparse_moe.experts.{x}.w2.weight") if mix else \
        (f"mlp.experts.{x}.up_proj.weight", f"mlp.experts.{x}.down_proj.weight")
    assert np.array_equal(np.asarray(t["blk.1.ffn_up_exps.weight"].data)[x], hf[f"model.layers.1.{up}"])
    assert np.array_equal(np.asarray(t["blk.1.ffn_down_exps.weight"].data)[x], hf[f"model.layers.1.{down}"])
    a, b = models[v]["llmq_gguf"], models[v]["llmq_hf"]
    d = float(np.abs(a - b).max())
    print(f"{v}: max |llmq GGUF - llmq HF| = {d:.3g}")
    if not mix:
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
    n_exp = [c.get("num_local_experts", c.get("num_experts")) for c in (cfg, src)]
    assert n_exp[0] == n_exp[1] == SHAPES[v][0]
    if not v.endswith("-mix"):
        assert cfg["moe_intermediate_size"] == SHAPES[v][2] and cfg["norm_topk_prob"] is True


@pytest.mark.parametrize("v", GGUF_VARIANTS)
@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_K_M", "Q6_K"])
def test_rtn_gguf_byte_identical_to_llama_quantize(llmq_bin, lc, ggufs, work, v, gtype):
    models = ggufs
    ref_, mine = work / f"ref-{v}-{gtype}.gguf", work / f"mine-{v}-{gtype}.gguf"
    gm.lc_quantize(lc, models[v]["gguf"], ref_, gm.FTYPES[gtype])
    gm.llmq_q(llmq_bin, models[v]["gguf"], mine, gtype, "--no-provenance")
    assert gm.same_file(ref_, mine) is None, gm.same_file(ref_, mine)


@pytest.mark.parametrize("v", GGUF_VARIANTS)
def test_rtn_gguf_from_hf_equals_from_gguf(llmq_bin, ggufs, work, v):
    """The HF directory as input (its per-expert tensors stacked by the writer, mixtral's q / k rows permuted) gives the
    file quantizing its GGUF conversion gives."""
    gtype = "Q4_K_M"
    a, b = work / f"hf-{v}-{gtype}.gguf", work / f"gg-{v}-{gtype}.gguf"
    gm.llmq_q(llmq_bin, ggufs[v]["hf"], a, gtype, "--no-provenance")
    gm.llmq_q(llmq_bin, ggufs[v]["gguf"], b, gtype, "--no-provenance")
    assert gm.same_file(a, b) is None, gm.same_file(a, b)


def test_convert_f16_keeps_the_router_f32(llmq_bin, ggufs, work):
    import gguf
    out = work / "qmoe-f16.gguf"
    run([llmq_bin, "convert", "--model", ggufs["tiny-qmoe"]["gguf"], "--out", out, "--dtype", "f16", "--quiet"])
    t = {x.name: x.tensor_type for x in gguf.GGUFReader(str(out)).tensors}
    F = gguf.GGMLQuantizationType
    assert t["blk.0.ffn_gate_inp.weight"] == F.F32 and t["blk.0.ffn_norm.weight"] == F.F32
    assert t["blk.0.ffn_up_exps.weight"] == F.F16 and t["blk.0.attn_q.weight"] == F.F16


def peak_rss(cmd):
    """Exit status and peak RSS in bytes (VmHWM of /proc/PID/status, read every 10 ms until it exits) of cmd."""
    import subprocess
    import time
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hwm = 0
    while p.poll() is None:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.01)
    return p.returncode, hwm


def test_dry_run_plans_a_mixture_of_experts(llmq_bin, ggufs, work):
    """The preflight plan (quant/plan.h) models a mixture of experts: --dry-run prints it and writes nothing, and a real
    run makes the up-front free-space check (no "no free-space check" line) and writes its file."""
    out = work / "dry.gguf"
    flags = ["--method", "rtn", "--format", "gguf", "--gguf-type", "Q8_0"]
    r = run([llmq_bin, "quantize", "--model", ggufs["tiny-qmoe"]["gguf"], "--out", out, *flags, "--dry-run"])
    text = r.stdout + r.stderr
    assert "preflight plan (estimates, nothing written)" in text and "  peak RAM     " in text, text
    assert not out.exists()
    r = run([llmq_bin, "quantize", "--model", ggufs["tiny-qmoe"]["gguf"], "--out", out, *flags])
    assert "no free-space check" not in r.stderr and out.exists(), r.stderr


@pytest.mark.parametrize("method,fmt", [("gptq", "gptq"), ("awq", "awq")])
def test_moe_peak_ram_against_the_measured_rss(llmq_bin, models, work, method, fmt):
    """The plan's peak RAM of a moe run against the measured peak RSS (tests/py/test_plan.py's bound, 40 %: these
    models are small, so the process's libraries weigh in). Measured as the process's own VmHWM (polled), not
    ru_maxrss, which would count this pytest process's pages at the fork. On a random qwen3_moe of 64 experts (hidden 256, width
    512, top-8, 2 layers, bf16; 16 x 128 tokens) the plan was 5-7 % below the measured peak for gptq / awq / awq+gptq
    into a directory and gptq into GGUF (quant/plan.h "Mixture of experts")."""
    out, js = work / f"rss-{method}", work / f"rss-{method}.json"
    base = [llmq_bin, "quantize", "--model", models["wide-qmoe"]["hf"], "--out", out, "--method", method, "--format",
            fmt, "--bits", "4", "--group-size", "128", "--calib", "wikitext-2-valid", "--nsamples", "8", "--seqlen",
            "128", "--threads", "2"]
    run([*base, "--dry-run", "--json", js])
    p = json.load(open(js))["preflight"]
    rc, rss = peak_rss([*base, "--force"])
    assert rc == 0
    assert 0.6 * rss <= p["ram_peak_bytes"] <= 1.4 * rss, (p["ram_peak_bytes"], rss, p["ram_peak_phase"])