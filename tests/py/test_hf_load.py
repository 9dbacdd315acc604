"""Oracle: the AWQ and GPTQ directories llmq writes load in Hugging Face transformers (5.x, through
GPTQModel's kernels, as users load them) and compute what llmq computes from the same directory.

For each case: `llmq quantize` SmolLM2-135M into a directory; transformers (in the separate venv named by
LLMQ_HF_PYTHON, tests/requirements-hf.txt) loads it on the CPU in float32 and returns the logits of one
96-token wikitext sequence (tests/py/hf_load_logits.py); llmq's forward pass (tests/tools/forward_logits)
reads the same directory (one transformers process loads every case's directory). A packing, zero-point,
g_idx or config mistake moves the logits by as much as the quantization itself does, so the check is that
the two agree far more closely than the quantized model agrees with the unquantized one:
    rms(hf - llmq) < 0.02 and < 0.1 * rms(llmq - base), max |hf - llmq| < 0.25, top-1 agreement >= 98%.
(Measured with transformers 5.24 / gptqmodel 7.7: rms 0.003-0.007, 29-750x below the quantization
effect.) Heavy tier; skipped when LLMQ_HF_PYTHON is unset (tests/run.sh sets it with LLMQ_WITH_HF=1,
which .ci/run does for the CPU-only variant).
"""
import json
import os

import numpy as np
import pytest

from conftest import run

HF_PYTHON = os.environ.get("LLMQ_HF_PYTHON")
pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not HF_PYTHON, reason="LLMQ_HF_PYTHON unset: no transformers venv "
                                 "(tests/run.sh sets it up with LLMQ_WITH_HF=1)")]
CALIB = ["--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "128"]

# name -> (llmq quantize flags, expected quant_method in config.json, GPTQ checkpoint_format or None)
CASES = {
    "awq-rtn4": (["--method", "rtn", "--bits", "4", "--format", "awq"], "awq", None),
    "awq-gptq-gar4": (["--method", "gptq", "--act-group-aware", "--bits", "4", "--format", "awq"] + CALIB,
                      "awq", None),
    "gptq-rtn4-sym": (["--method", "rtn", "--bits", "4", "--sym", "--format", "gptq"], "gptq", "gptq"),
    "gptq-rtn4-asym": (["--method", "rtn", "--bits", "4", "--format", "gptq"], "gptq", "gptq_v2"),
    "gptq-rtn3-sym": (["--method", "rtn", "--bits", "3", "--sym", "--format", "gptq"], "gptq", "gptq"),
    "gptq-rtn8-asym": (["--method", "rtn", "--bits", "8", "--format", "gptq"], "gptq", "gptq_v2"),
    "gptq-actorder4-sym": (["--method", "gptq", "--act-order", "--bits", "4", "--sym", "--format", "gptq"] + CALIB,
                           "gptq", "gptq"),
}


@pytest.fixture(scope="module")
def seq(tool, smollm2, data_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    text = (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_bytes()[2000:4000]
    (d / "text").write_bytes(text)
    ids = [int(x) for x in run([tool("tokenize_tool"), smollm2, d / "text"]).stdout.split()][:95]
    assert len(ids) == 95
    ids_file = d / "ids.txt"
    ids_file.write_text(" ".join(map(str, [1] + ids)))  # BOS + 95 tokens
    base = d / "base.f32"
    run([tool("forward_logits"), smollm2, ids_file, base, 2])
    return dict(dir=d, ids=ids_file, base=np.fromfile(base, np.float32))


@pytest.fixture(scope="module")
def hf(llmq_bin, tool, smollm2, seq):
    """Every case quantized by llmq and read by llmq's forward pass, then all of them loaded by one
    transformers process (importing torch once instead of once per case)."""
    args = []
    for case, (flags, _, _) in CASES.items():
        out = seq["dir"] / case
        run([llmq_bin, "quantize", "--model", smollm2, "--group-size", "64", "--out", out, "--threads", "2",
             "--allow-requantize"] + flags)  # the input is Q4_1
        run([tool("forward_logits"), out, seq["ids"], seq["dir"] / f"{case}.llmq.f32", 2])
        args += [out, seq["dir"] / f"{case}.hf.f32"]
    r = run([HF_PYTHON, os.path.join(os.path.dirname(__file__), "hf_load_logits.py"), seq["ids"], "float32"] + args,
            env=dict(os.environ, OMP_NUM_THREADS="2"))
    infos = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(infos) == len(CASES), r.stdout
    return {case: info for case, info in zip(CASES, infos)}


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_loads_and_agrees(seq, hf, case):
    _, method, ckpt = CASES[case]
    out = seq["dir"] / case
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == method
    if ckpt:
        assert qc["checkpoint_format"] == ckpt

    info = hf[case]
    assert "error" not in info, f"transformers did not load {out}:\n{info.get('error')}"
    assert info["quant_method"] == method
    assert info["linear_classes"], "transformers replaced no linear layer with a quantized one"

    ours, theirs = seq["dir"] / f"{case}.llmq.f32", seq["dir"] / f"{case}.hf.f32"
    a, b, base = np.fromfile(theirs, np.float32), np.fromfile(ours, np.float32), seq["base"]
    assert a.shape == b.shape == base.shape
    n_vocab = info["n_vocab"]
    check_agreement(f"{case}: {info['linear_classes']}", a.reshape(-1, n_vocab), b.reshape(-1, n_vocab),
                    base.reshape(-1, n_vocab), info["versions"])


def check_agreement(label, theirs, ours, base, versions=""):
    """transformers' logits `theirs` and llmq's `ours` (n, V) from one quantized directory, `base` llmq's
    logits of the unquantized model: the thresholds of the module docstring."""
    rms = float(np.sqrt(np.mean((theirs - ours) ** 2)))
    qrms = float(np.sqrt(np.mean((ours - base) ** 2)))
    mx = float(np.abs(theirs - ours).max())
    top1 = float((theirs.argmax(1) == ours.argmax(1)).mean())
    print(f"{label} rms(hf-llmq) {rms:.5f} max {mx:.4f} rms(llmq-base) {qrms:.4f} top-1 {top1:.3f} {versions}")
    assert rms < 0.02 and rms < 0.1 * qrms and mx < 0.25 and top1 >= 0.98, (rms, qrms, mx, top1)
