"""Oracle: the GPTQ and AWQ directories llmq writes for a mixture of experts load in GPTQModel (7.7, its own
loader: GPTQModel.load, as users of MoE checkpoints load them; transformers 5.24 itself cannot, its experts being
fused 3-D parameters: tests/py/test_moe_quant.py) and compute what llmq computes from the same directory.

Models: random qwen3_moe and mixtral (tests/py/hf_moe_gptqmodel.py: hidden 64, 8 experts of width 64, top-2), RTN
4-bit group 32 into --format gptq --sym (GPTQ v1), --format gptq (asymmetric: gptq_v2) and --format awq. GPTQModel
runs them in bfloat16 with its TORCH kernels (hf_moe_gptqmodel.py says why not its AVX-512 f32 kernel), so the check
is test_hf_load's: the two agree far more closely than the quantized model agrees with the unquantized one:
    rms(gptqmodel - llmq) < 0.1 * rms(llmq - f32 model), top-1 equal wherever llmq's top two logits are more
    than 0.1 apart (bf16's rounding moves the logits by ~0.02 rms: closer pairs are ties at that precision),
and every expert linear GPTQModel built is a quantized module (the experts sit where its module tree has them).
Measured 2026-12-03 (qwen3_moe): rms 0.018 / 0.021 / 0.021 (gptq sym / asym / awq) against a quantization effect of
0.52 / 0.56 / 0.56; top-1 equal at every clear position.
Mixtral is not checked here: llmq writes its experts under the names its checkpoints have (transformers 5.24's own
save_pretrained writes model.layers.N.block_sparse_moe.experts.E.w1 / w2 / w3, as the Hub's GPTQ Mixtrals and vLLM's
loader have them), while GPTQModel 7.7's loader patches Mixtral's block into per-expert linears named
mlp.experts.E.{gate,up,down}_proj and refuses a directory without those ("Missing required quantized weights ...
mlp.experts.0.down_proj.qweight").
Heavy tier; skipped without LLMQ_HF_PYTHON.
"""
import os
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
FAMILIES = ["qmoe"]
CASES = {"gptq-sym": ["--format", "gptq", "--sym"], "gptq-asym": ["--format", "gptq"], "awq": ["--format", "awq"]}


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
            run([llmq_bin, "quantize", "--model", d / family, "--method", "rtn", "--bits", "4", "--group-size", "32",
                 "--out", q, "--quiet"] + flags)
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
    assert rms < 0.1 * effect and same[clear].all() and clear.sum() >= len(IDS) // 2, (rms, effect, same, clear)
