"""Oracle: the GPTQ and AWQ directories llmq writes for a mixture of experts load in GPTQModel (7.7, its own
loader: GPTQModel.load, as users of MoE checkpoints load them; transformers 5.24 itself cannot, its experts being
fused 3-D parameters: tests/py/test_moe_quant.py) and compute what llmq computes from the same directory.

Models: random qwen3_moe, mixtral and qwen2_moe (tests/py/hf_moe_gptqmodel.py: hidden 64, 8 experts of width 64,
top-2; qwen2_moe with a shared expert of width 128), RTN 4-bit group 32 into --format gptq --sym (GPTQ v1), --format
gptq (asymmetric: gptq_v2) and --format awq. GPTQModel runs them in float16 with its TORCH kernels
(hf_moe_gptqmodel.py says why not its AVX-512 f32 kernel, nor bfloat16), so the check is test_hf_load's, tighter: the
two agree far more closely than the quantized model agrees with the unquantized one:
    rms(gptqmodel - llmq) < 0.02 * rms(llmq - f32 model), top-1 equal wherever llmq's top two logits are more
    than 0.1 apart (float16's rounding moves the logits by ~0.002 rms; closer pairs may be ties at that precision),
and every expert linear GPTQModel built (qwen2_moe: the shared expert's too) is a quantized module (the experts sit
where its module tree has them).
Measured 2026-12-03, rms(gptqmodel - llmq) / quantization effect, gptq sym | gptq asym | awq:
    qwen3_moe  0.0018 / 0.52 | 0.0019 / 0.56 | 0.0019 / 0.56
    mixtral    0.0015 / 0.44 | 0.0016 / 0.40 | 0.0016 / 0.40   (--expert-names gptqmodel)
    qwen2_moe  0.0009 / 0.17 | 0.0009 / 0.12 | 0.0009 / 0.12
(ratios 0.0034 - 0.0073); top-1 equal at all 32 positions of every case. (In bfloat16 qwen3_moe measured rms
0.018 - 0.021, and mixtral's GPTQ sym 0.083 against 0.44: three positions where bf16 flips a near-tied routing.)
Mixtral is written with --expert-names gptqmodel: GPTQModel 7.7's Mixtral definition (models/definitions/mixtral.py,
over Defuser's per-expert LinearMixtralSparseMoeBlock) has the block's modules at mlp.gate and
mlp.experts.E.{gate,up,down}_proj, and its quantized loader (models/loader.py from_quantized ->
accelerate.load_checkpoint_in_model) reads the checkpoint's keys as they are: Defuser's Mixtral key renaming
(block_sparse_moe -> mlp, w1 / w3 / w2 -> gate / up / down_proj) is a transformers conversion mapping, applied by
from_pretrained (unquantized checkpoints) only, and renames .weight keys only. So the Hub spelling llmq writes by
default (model.layers.N.block_sparse_moe.experts.E.w1 / w3 / w2, which the Hub's GPTQ / AWQ Mixtrals and vLLM's
Mixtral loader use) is refused for gptq ("Missing required quantized weights ... mlp.experts.0.down_proj.qweight")
and, for awq, loaded with every expert and the router left unset (accelerate's "weights ... were not used"
warning; the logits were NaN), measured 2026-12-03. qwen3_moe and qwen2_moe have one spelling (GPTQModel's module
trees match their checkpoints). test_expert_names: the two spellings hold the same tensors under the two names and
give llmq the same logits; the option's refusals.
Heavy tier; skipped without LLMQ_HF_PYTHON.
"""
import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import run

HF_PYTHON = os.environ.get("LLMQ_HF_PYTHON")
HERE = Path(__file__).parent
pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not HF_PYTHON, reason="LLMQ_HF_PYTHON unset: no transformers venv "
                                 "(tests/run.sh sets it up with LLMQ_WITH_HF=1)")]
IDS = [1, 5, 9, 33, 70, 100, 200, 300, 400, 7, 8, 9, 44, 55, 66, 77, 12, 250, 31, 480, 3, 99, 150, 222, 301, 17,
       64, 128, 256, 511, 42, 2]
FAMILIES = ["qmoe", "mix", "q2moe"]
CASES = {"gptq-sym": ["--format", "gptq", "--sym"], "gptq-asym": ["--format", "gptq"], "awq": ["--format", "awq"]}
NAMES = {"mix": ["--expert-names", "gptqmodel"]}  # GPTQModel's names (the docstring); the others have one spelling
RTN = ["--method", "rtn", "--bits", "4", "--group-size", "32", "--quiet"]


@pytest.fixture(scope="module")
def work(llmq_bin, stories_v3, tmp_path_factory):
    """The models, their quantized directories and GPTQModel's logits of each (one transformers process)."""
    d = tmp_path_factory.mktemp("moe_gptqmodel")
    run([llmq_bin, "convert", "--model", stories_v3, "--out", d / "tok", "--to", "hf", "--quiet"])  # its tokenizer
    run([HF_PYTHON, HERE / "hf_moe_gptqmodel.py", "build", d / "tok", d])
    (d / "ids.txt").write_text(" ".join(map(str, IDS)))
    pairs = []
    for family in FAMILIES:
        for case, flags in CASES.items():
            q = d / f"{family}-{case}"
            run([llmq_bin, "quantize", "--model", d / family, "--out", q] + RTN + flags + NAMES.get(family, []))
            pairs += [q, d / f"{family}-{case}-gq.f32"]
    r = run([HF_PYTHON, HERE / "hf_moe_gptqmodel.py", "load", d / "ids.txt"] + pairs)
    (d / "gptqmodel.log").write_text(r.stdout)
    return d


def logits(tool, model, work, name):
    out = work / f"{name}.f32"
    run([tool("forward_logits"), model, work / "ids.txt", out, 2, 0, "none"])
    return np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_gptqmodel_loads_and_agrees(tool, work, family, case):
    src, q = work / family, work / f"{family}-{case}"
    base, ours = logits(tool, src, work, f"{family}-base"), logits(tool, q, work, f"{family}-{case}-llmq")
    theirs = np.fromfile(work / f"{family}-{case}-gq.f32", dtype=np.float32).reshape(len(IDS), -1)
    line = next(x for x in (work / "gptqmodel.log").read_text().splitlines() if x.startswith(f"{q}:"))
    kinds = line.split(": ")[-1].split(",")
    assert kinds and all("Linear" in k and k != "Linear" for k in kinds), line
    rms, effect = np.sqrt(np.mean((theirs - ours) ** 2)), np.sqrt(np.mean((ours - base) ** 2))
    top2 = np.sort(ours, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.1
    same = theirs.argmax(1) == ours.argmax(1)
    print(f"{family} {case}: expert modules {kinds}; rms(gptqmodel - llmq) {rms:.4f}, quantization effect "
          f"{effect:.4f}, top-1 equal {int(same.sum())}/{len(IDS)}, at all {int(clear.sum())} clear positions: "
          f"{bool(same[clear].all())}")
    assert rms < 0.02 * effect and same[clear].all() and clear.sum() >= len(IDS) // 2, (rms, effect, same, clear)


def st_keys(d):
    """The tensor names of directory d's model.safetensors (its header)."""
    b = (Path(d) / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", b[:8])
    return set(json.loads(b[8:8 + n])) - {"__metadata__"}


def gptqmodel_spelling(name):
    """A Hub-spelled mixtral tensor name in GPTQModel's spelling (quant/export.h, formats/llama/arch.h)."""
    proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    return re.sub(r"\.experts\.(\d+)\.(w[123])\.", lambda m: f".experts.{m[1]}.{proj[m[2]]}.",
                  name.replace(".block_sparse_moe.", ".mlp."))


@pytest.mark.parametrize("case", ["gptq-asym", "awq"])
def test_expert_names(llmq_bin, tool, work, stories_v3, case):
    """mixtral: the Hub spelling holds the same tensors as GPTQModel's under its names, and llmq (which reads either)
    computes the same logits from both; qwen3_moe: --expert-names gptqmodel changes no name; the refusals."""
    hub = work / f"mix-{case}-hub"
    run([llmq_bin, "quantize", "--model", work / "mix", "--out", hub, "--force"] + RTN + CASES[case])
    ours = work / f"mix-{case}"
    keys = st_keys(hub)
    assert any(".block_sparse_moe.experts.0.w1." in k for k in keys), sorted(keys)[:8]
    assert {gptqmodel_spelling(k) for k in keys} == st_keys(ours)
    assert not any("block_sparse_moe" in k or re.search(r"\.w[123]\.", k) for k in st_keys(ours))
    assert json.loads((ours / "config.json").read_text())["llmq"]["expert_names"] == "gptqmodel"
    assert "expert_names" not in json.loads((hub / "config.json").read_text())["llmq"]
    assert np.array_equal(logits(tool, hub, work, f"mix-{case}-hub"), logits(tool, ours, work, f"mix-{case}-again"))
    q = work / f"qmoe-{case}-names"
    run([llmq_bin, "quantize", "--model", work / "qmoe", "--out", q, "--force"] + RTN + CASES[case] + NAMES["mix"])
    assert st_keys(q) == st_keys(work / f"qmoe-{case}")
    refused = [([stories_v3, "--group-size", "-1"], "has none"),  # a dense model
               ([work / "mix", "--format", "fake"], "needs --format gptq or awq"),
               ([work / "mix", "--format", "gguf", "--gguf-type", "Q4_0"], "applies to --format gptq and awq"),
               ([work / "mix", "--format", "gptq"], "must be hub or gptqmodel")]
    for i, (args, msg) in enumerate(refused):
        names = "vllm" if i == 3 else "gptqmodel"
        r = run([llmq_bin, "quantize", "--model", *args, "--out", work / "refused", "--expert-names", names,
                 "--quiet"] + (["--group-size", "32"] if i == 1 else []), check=False)
        assert r.returncode == 2 and msg in r.stderr and not (work / "refused").exists(), (args, r.stderr)
