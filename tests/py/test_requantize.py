"""Requantization needs --allow-requantize, as in llama-quantize (llama-quant.cpp: "requantizing from
type ... is disabled", exit 1), for every --format (quant/gguf_export.h "Requantization",
quant/quantize.h allow_requantize).

Input: stories260K quantized to Q8_0 by llmq itself (a small already-quantized GGUF), and SmolLM2's Q4_1
file for the refusal of the real case (dry run, no data written)."""
import os

import numpy as np
import pytest

from conftest import run

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def stories_q8(llmq_bin, stories_v3, tmp_path_factory):
    p = tmp_path_factory.mktemp("requant") / "stories_q8_0.gguf"
    run([llmq_bin, "quantize", "--model", stories_v3, "--format", "gguf", "--gguf-type", "Q8_0", "--pure",
         "--no-provenance", "--threads", "2", "--out", p])
    return p


def gguf_q(llmq_bin, model, out, gtype, *flags, check=True, **kw):
    return run([llmq_bin, "quantize", "--model", model, "--format", "gguf", "--gguf-type", gtype, "--threads", "2",
                "--no-provenance", "--out", out, *flags], check=check, **kw)


def test_gguf_refuses_requantizing_and_names_the_tensor(llmq_bin, stories_q8, tmp_path):
    out = tmp_path / "q4.gguf"
    for flags in ((), ("--dry-run",)):
        r = gguf_q(llmq_bin, stories_q8, out, "Q4_0", *flags, check=False)
        assert r.returncode == 1, r.stderr
        # the first tensor in llama.cpp's file order whose type changes: output.weight stays q8_0 (Q4_0's
        # q6_k does not tile 64 columns: q8_0, copied), output_norm is f32, then token_embd q8_0 -> q4_0
        assert "token_embd.weight" in r.stderr and "q8_0" in r.stderr and "--allow-requantize" in r.stderr, r.stderr
        assert str(stories_q8) in r.stderr
        assert not out.exists()


def test_gguf_copy_of_the_same_type_is_no_requantization(llmq_bin, stories_q8, tmp_path):
    """Q8_0 -> Q8_0 --pure changes no tensor's type: every tensor is copied, nothing is refused."""
    out = tmp_path / "same.gguf"
    gguf_q(llmq_bin, stories_q8, out, "Q8_0", "--pure")
    assert out.read_bytes() == stories_q8.read_bytes()


def test_gguf_allow_requantize_is_decode_then_encode(llmq_bin, stories_q8, tmp_path):
    """With the flag each requantized tensor is the encoding of its exactly decoded rows: the same bytes as
    quantizing the f32 decoding of the input (llmq convert --dtype f32), tensor by tensor."""
    a, f32, b = tmp_path / "a.gguf", tmp_path / "f32.gguf", tmp_path / "b.gguf"
    gguf_q(llmq_bin, stories_q8, a, "Q4_0", "--allow-requantize")
    run([llmq_bin, "convert", "--model", stories_q8, "--dtype", "f32", "--out", f32])
    gguf_q(llmq_bin, f32, b, "Q4_0")
    ta = {t.name: t for t in gguf.GGUFReader(str(a)).tensors}
    tb = {t.name: t for t in gguf.GGUFReader(str(b)).tensors}
    assert sorted(ta) == sorted(tb)
    changed = 0
    for n, t in ta.items():
        if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            continue  # copied from the Q8_0 input, vs re-encoded from f32 in b
        assert t.tensor_type == tb[n].tensor_type, n
        assert np.array_equal(np.array(t.data), np.array(tb[n].data)), n
        changed += 1
    assert changed >= 5 * 7  # every linear was requantized


def test_directory_formats_refuse_too(llmq_bin, stories_q8, smollm2, tmp_path):
    # fake on stories260K Q8_0; awq / gptq (8 channels per int32: not stories260K's 172-wide ffn, which the
    # usage check refuses first with exit 2) on SmolLM2's real Q4_1 file
    for fmt, model, group, qtype in (("fake", stories_q8, "4", "q8_0"), ("awq", smollm2, "64", "q4_1"),
                                     ("gptq", smollm2, "64", "q4_1")):
        out = tmp_path / fmt
        args = [llmq_bin, "quantize", "--model", model, "--method", "rtn", "--bits", "4", "--group-size", group,
                "--format", fmt, "--threads", "2", "--out", out]
        r = run(args, check=False)
        assert r.returncode == 1 and "blk.0.attn_q.weight" in r.stderr and qtype in r.stderr, (fmt, r.stderr)
        assert "--allow-requantize" in r.stderr and not out.exists()
        if fmt == "fake":
            run(args + ["--allow-requantize"])
            assert (out / "config.json").exists()


def test_smollm2_q4_1_is_refused(llmq_bin, smollm2, tmp_path):
    """The issue's case: llmq quantized SmolLM2's Q4_1 file to Q4_K_M without a word."""
    r = gguf_q(llmq_bin, smollm2, tmp_path / "q.gguf", "Q4_K_M", "--dry-run", check=False)
    assert r.returncode == 1 and "q4_1" in r.stderr and "--allow-requantize" in r.stderr, r.stderr
    r = gguf_q(llmq_bin, smollm2, tmp_path / "q.gguf", "Q4_K_M", "--dry-run", "--allow-requantize")
    assert "blk.0.attn_q.weight" in r.stdout


def test_gptq_into_gguf_refuses_even_where_the_type_stays(llmq_bin, stories_q8, data_dir, tmp_path):
    """gptq / awq re-encode every linear (their own codes), so Q8_0 -> Q8_0 is requantization for them,
    unlike rtn's byte copy; refused before any calibration work."""
    out = tmp_path / "g.gguf"
    for m in ("gptq", "awq"):
        r = gguf_q(llmq_bin, stories_q8, out, "Q8_0", "--pure", "--method", m, "--calib", "wikitext-2-valid",
                   "--nsamples", "2", "--seqlen", "32", check=False, env={**os.environ, "LLMQ_DATA": str(data_dir)})
        assert r.returncode == 1 and "blk.0.attn_q.weight" in r.stderr and "--allow-requantize" in r.stderr, r.stderr
        assert "calib: block" not in r.stderr and not out.exists()
    gguf_q(llmq_bin, stories_q8, out, "Q8_0", "--pure", "--method", "gptq", "--calib", "wikitext-2-valid",
           "--nsamples", "2", "--seqlen", "32", "--allow-requantize", env={**os.environ, "LLMQ_DATA": str(data_dir)})
    assert out.exists()
