"""Oracle: llmq's forward pass (calib/model/forward.h, via tests/tools/forward_logits) against llama.cpp.

Model: SmolLM2-135M-Instruct, both the Q4_1 GGUF and its f32 dequantization written by gguf-py
(gen_golden_forward.make_f32_gguf). Tokens: BOS + the first 63 tokens of wiki.test.raw.

  f32 file   llmq and llama.cpp do the same f32 arithmetic up to summation order: every logit
             must agree within 1e-3 (measured: max 6.5e-5 over 64 positions, 8.3e-5 over 512),
             and the top-1 token everywhere.
  Q4_1 file  llama.cpp multiplies Q4_1 / Q8_0 weights with activations quantized to 8 bits
             (q8_1 / q8_0 blocks of 32) while llmq dequantizes the weights and multiplies in f32,
             so logits differ by rounding noise that grows through the 30 layers (measured: max
             1.5, mean 0.18 over 64 positions on logits spanning [-32, 34]). The check is loose:
             top-1 agreement >= 95% and every compared logit within 3.

The golden file tests/golden/forward_smollm2.json (llama.cpp's top-8 logits per position, written by
gen_golden_forward.py) makes both checks run without llama_cpp; with llama_cpp importable, the live
tests compare all 49152 logits at every position.
"""
import hashlib
import json

import numpy as np
import pytest

from conftest import run
import gen_golden_forward as gg

F32_TOL = 1e-3
Q41_TOL = 3.0
Q41_TOP1 = 0.95

try:
    import llama_cpp  # noqa: F401
    HAVE_LLAMA_CPP = True
except ImportError:
    HAVE_LLAMA_CPP = False
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")


@pytest.fixture(scope="module")
def golden(smollm2):
    g = json.loads(gg.GOLDEN.read_text())
    sha = hashlib.sha256(smollm2.read_bytes()).hexdigest()
    assert sha == g["model_sha256"], f"{smollm2} is not the file the golden data was made from"
    assert len(g["tokens"]) == gg.N_POS
    return g


@pytest.fixture(scope="module")
def smollm2_f32(smollm2, tmp_path_factory):
    p = tmp_path_factory.mktemp("fwd") / "smollm2-f32.gguf"
    gg.make_f32_gguf(smollm2, p)
    return p


@pytest.fixture(scope="module")
def llmq_logits(tool, tmp_path_factory):
    """llmq_logits(model, tokens) -> (n, n_vocab) float32 from tests/tools/forward_logits."""
    d = tmp_path_factory.mktemp("fwdout")

    def go(model, tokens, threads=2):
        ids, out = d / "ids.txt", d / "logits.f32"
        ids.write_text(" ".join(str(t) for t in tokens))
        r = run([tool("forward_logits"), model, ids, out, threads])
        n, n_vocab = (int(x) for x in r.stdout.split())
        assert n == len(tokens)
        return np.fromfile(out, dtype=np.float32).reshape(n, n_vocab)
    return go


def compare_topk(got, ref):
    """got: llmq logits (n, V); ref: a golden section. Returns (max |diff| at llama.cpp's top-K
    ids, top-1 agreement)."""
    ids = np.array(ref["topk_ids"])
    want = np.array(ref["topk_logits"], dtype=np.float64)
    diff = np.abs(np.take_along_axis(got, ids, axis=1) - want)
    agree = float(np.mean(got.argmax(axis=1) == np.array(ref["top1"])))
    return float(diff.max()), agree


def check_golden(label, got, ref, tol, top1):
    """llmq's logits `got` against a golden section: within tol at llama.cpp's top-K ids, top-1 agreement >= top1."""
    d, agree = compare_topk(got, ref)
    print(f"{label} vs llama.cpp golden: max |diff| at top-{gg.TOP_K} = {d:.3g}, top-1 agreement {agree:.3f}")
    assert d < tol, f"llmq {label} logits differ from llama.cpp by {d} (> {tol})"
    assert agree >= top1


def check_live(label, got, ref, tol, top1):
    """llmq's logits `got` against llama.cpp's `ref`, all of them: within tol, top-1 agreement >= top1."""
    d = np.abs(got - ref)
    agree = float(np.mean(got.argmax(1) == ref.argmax(1)))
    print(f"{label} vs llama.cpp, all logits of {len(ref)} positions: max {d.max():.3g}, mean {d.mean():.3g}, "
          f"top-1 agreement {agree:.3f}")
    assert d.max() < tol
    assert agree >= top1


def test_golden_f32(golden, smollm2_f32, llmq_logits):
    check_golden("f32", llmq_logits(smollm2_f32, golden["tokens"]), golden["f32"], F32_TOL, 1.0)


def test_golden_q4_1(golden, smollm2, llmq_logits):
    check_golden("Q4_1", llmq_logits(smollm2, golden["tokens"]), golden["q4_1"], Q41_TOL, Q41_TOP1)


def test_threads_do_not_change_results(golden, smollm2, llmq_logits):
    a = llmq_logits(smollm2, golden["tokens"][:40], threads=1)
    b = llmq_logits(smollm2, golden["tokens"][:40], threads=3)
    assert np.abs(a - b).max() < 1e-3


@needs_llama_cpp
def test_llama_cpp_tokens_match_golden(golden, smollm2, data_dir):
    assert gg.wiki_tokens(smollm2, data_dir) == golden["tokens"]


@needs_llama_cpp
def test_llama_cpp_live_f32(golden, smollm2_f32, llmq_logits):
    ref = gg.llama_cpp_logits(smollm2_f32, golden["tokens"])
    check_live("f32", llmq_logits(smollm2_f32, golden["tokens"]), ref, F32_TOL, 1.0)


@needs_llama_cpp
def test_llama_cpp_live_q4_1(golden, smollm2, llmq_logits):
    ref = gg.llama_cpp_logits(smollm2, golden["tokens"])
    check_live("Q4_1", llmq_logits(smollm2, golden["tokens"]), ref, Q41_TOL, Q41_TOP1)
