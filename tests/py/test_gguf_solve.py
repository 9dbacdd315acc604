"""GPTQ and AWQ into GGUF end to end (quant/gptq_gguf.h, quant/quantize.c with to_gguf, quant/awq.h's
pluggable quantizer): `llmq quantize --format gguf --method gptq|awq|awq+gptq` on SmolLM2-135M.

To stay within a few minutes the f32 base is cut to its first 4 blocks (real weights, tokenizer and
hyperparameters; the copy is written by gguf-py, independent of llmq). With 4 blocks the Q4_K_M mix
still uses every rule it uses on the whole model: Q4_K where a row tiles 256 (ffn_down, 1536), the
Q5_0 / Q8_0 fallbacks for the 576-wide rows, Q6_K / Q8_0 bumps of attn_v and ffn_down.

Q3_K_S stands in for the Q3_K / Q2_K mixes: it is the one that keeps Q3_K blocks on a 4-block
SmolLM2 (Q3_K_M bumps every ffn_down to Q4_K / Q5_K and the 576-wide rows fall back to Q4_0 / Q5_x).

Checked per file:
  - the --json table: 28 linears, each with its GGUF type; GPTQ's output error on the calibration
    Hessian below the encoder's alone with the same importance (rtn_err) for every layer the solver
    kept, never above it (a layer where GPTQ loses is written by the encoder: method "gptq:rtn"; at
    most 10% of the layers). These are in-sample figures: with this little calibration data GPTQ
    does not beat RTN + imatrix on held-out text (see quant/quantize.h, "Calibration size");
  - gguf-py's dequantize of every tensor equals llmq's (llmq convert --dtype f32 of the same file),
    bit for bit;
  - llama.cpp (llama-cpp-python) loads it, its logits are finite and its top-1 agrees with llmq's
    forward pass on the same file (llama.cpp multiplies with 8-bit activations: not bit-equal);
  - the llmq.* provenance keys name the method.
"""
import json
import os
import pathlib
import re

import gguf
import numpy as np
import pytest

from conftest import gguf_first_blocks, run

try:
    import llama_cpp  # noqa: F401
    HAVE_LLAMA_CPP = True
except ImportError:
    HAVE_LLAMA_CPP = False

N_LAYERS = 4
CAL_GPTQ = ["--calib", "wikitext-2-valid", "--nsamples", "8", "--seqlen", "256", "--seed", "1"]
CAL_AWQ = ["--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "128", "--seed", "1"]
TOP1 = 0.9


@pytest.fixture(scope="module")
def smol4(tmp_path_factory):
    """The first N_LAYERS blocks of the SmolLM2-135M f32 base (llama.block_count rewritten)."""
    cache = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
    src = cache / "smollm2-f32.gguf"
    assert src.exists(), f"{src} missing: see README (llmq convert of SmolLM2 to f32)"
    return gguf_first_blocks(src, tmp_path_factory.mktemp("smol4") / "smollm2-4l-f32.gguf", N_LAYERS)


def quantize(llmq_bin, model, out, method, gguf_type, cal, data_dir):
    js = out.with_suffix(".json")
    r = run([llmq_bin, "quantize", "--model", model, "--format", "gguf", "--gguf-type", gguf_type, "--method", method,
             "--threads", "2", "--out", out, "--json", js, *cal], env={**os.environ, "LLMQ_DATA": str(data_dir)})
    return json.loads(js.read_text()), r.stderr


def check_dequant_equal(llmq_bin, path, tmp_path):
    """gguf-py dequantize of every tensor == llmq's f32 conversion of the same file, bit for bit."""
    f32 = tmp_path / (path.stem + "-f32.gguf")
    run([llmq_bin, "convert", "--model", path, "--dtype", "f32", "--out", f32, "--force"])
    ours = {t.name: t for t in gguf.GGUFReader(str(f32)).tensors}
    types = set()
    for t in gguf.GGUFReader(str(path)).tensors:
        want = np.ascontiguousarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
        got = np.asarray(ours[t.name].data, dtype=np.float32)
        assert got.size == want.size, t.name
        a, b = got.reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32)
        bad = np.flatnonzero(a != b)
        assert bad.size == 0, f"{t.name} ({t.tensor_type.name}): {bad.size} elements differ, first at {bad[0]}"
        types.add(t.tensor_type.name)
    return types


def check_llama_cpp(path, tool, tmp_path):
    """llama.cpp loads the file; finite logits; top-1 agreement with llmq's forward pass."""
    if not HAVE_LLAMA_CPP:
        pytest.skip("llama_cpp (llama-cpp-python) is not importable")
    text = "The quick brown fox jumps over the lazy dog. In 1907 the city council voted to build a new bridge"
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, logits_all=True, n_threads=2,
                          n_threads_batch=2, type_k=0, type_v=0, flash_attn=False, verbose=False)
    tokens = llm.tokenize(text.encode(), add_bos=True)[:48]
    llm.reset()
    llm.eval(tokens)
    ref = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    del llm
    assert np.isfinite(ref).all()
    ids, out = tmp_path / "ids.txt", tmp_path / "logits.f32"
    ids.write_text(" ".join(str(t) for t in tokens))
    r = run([tool("forward_logits"), path, ids, out, 2])
    n, n_vocab = (int(x) for x in r.stdout.split())
    got = np.fromfile(out, dtype=np.float32).reshape(n, n_vocab)
    agree = float(np.mean(got.argmax(axis=1) == ref.argmax(axis=1)))
    assert agree >= TOP1, f"top-1 agreement llmq vs llama.cpp {agree:.3f}"
    return agree


def check_layers(rep, method, allow_fallback):
    rows = rep["layers"]
    assert len(rows) == N_LAYERS * 7
    for row in rows:
        assert row["type"] and 0 <= row["err"] < 0.05, row
        assert row["method"] in (method, method + ":rtn", "convert"), row
    if not allow_fallback:
        return rows
    solved = [r for r in rows if r["method"] != "convert"]  # (a 4-block SmolLM2 has no F16 linears)
    kept = [r for r in solved if r["method"] == method]
    for row in solved:
        assert row["err"] <= row["rtn_err"], row
    for row in kept:
        assert row["err"] < row["rtn_err"], row
    for row in solved:
        if row["method"] != method:  # written by the encoder: the rejected GPTQ result was no better
            assert row["gptq_err"] >= row["rtn_err"] and row["err"] == row["rtn_err"], row
    assert len(kept) >= 0.9 * len(rows), [r["name"] for r in rows if r not in kept]
    return rows


@pytest.mark.heavy
@pytest.mark.parametrize("gguf_type,want_types", [("Q4_K_M", {"q4_k", "q5_0", "q6_k"}), ("Q4_0", {"q4_0"}),
                                                    ("Q3_K_S", {"q3_k", "q4_0"})])
def test_gptq_into_gguf(llmq_bin, tool, smol4, data_dir, tmp_path, gguf_type, want_types):
    out = tmp_path / f"gptq-{gguf_type}.gguf"
    rep, err = quantize(llmq_bin, smol4, out, "gptq", gguf_type, CAL_GPTQ, data_dir)
    rows = check_layers(rep, "gptq", allow_fallback=True)
    assert want_types <= {r["type"] for r in rows}, {r["type"] for r in rows}
    assert re.search(r"blk\.3\.ffn_down\s+576 x 1536\s+gptq\S*\s+q\d_\w+\s+err", err), err[-2000:]
    ratio = np.median([r["err"] / r["rtn_err"] for r in rows])
    print(f"{gguf_type}: median err / rtn_err {ratio:.3f}, {sum(r['method'] != 'gptq' for r in rows)} fallback(s)")
    fields = gguf.GGUFReader(str(out)).fields
    assert fields["llmq.method"].contents() == "gptq"
    assert fields["general.file_type"].contents() == {"Q4_K_M": 15, "Q4_0": 2, "Q3_K_S": 11}[gguf_type]
    types = check_dequant_equal(llmq_bin, out, tmp_path)
    assert {t.lower() for t in want_types} <= {t.lower() for t in types}
    check_llama_cpp(out, tool, tmp_path)


@pytest.mark.heavy
def test_gptq_act_order_into_gguf(llmq_bin, tool, smol4, data_dir, tmp_path):
    """--act-order: every block's grid from the original weights, codes in decreasing diag(H) order; the
    bytes still decode to what GPTQ compensated for, and it beats the encoder alone on every layer."""
    out = tmp_path / "gptq-ao-Q4_K_M.gguf"
    rep, err = quantize(llmq_bin, smol4, out, "gptq", "Q4_K_M", CAL_GPTQ + ["--act-order"], data_dir)
    check_layers(rep, "gptq", allow_fallback=True)
    assert rep["settings"]["act_order"] is True, rep["settings"]
    check_dequant_equal(llmq_bin, out, tmp_path)
    check_llama_cpp(out, tool, tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize("method,gguf_type", [("awq", "Q4_0"), ("awq+gptq", "Q4_K_M")])
def test_awq_into_gguf(llmq_bin, tool, smol4, data_dir, tmp_path, method, gguf_type):
    out = tmp_path / f"{method}-{gguf_type}.gguf"
    rep, err = quantize(llmq_bin, smol4, out, method, gguf_type, CAL_AWQ, data_dir)
    check_layers(rep, method, allow_fallback=method == "awq+gptq")
    assert "awq: layer 3 up->down: ratio" in err
    assert gguf.GGUFReader(str(out)).fields["llmq.method"].contents() == method
    check_dequant_equal(llmq_bin, out, tmp_path)
    check_llama_cpp(out, tool, tmp_path)


@pytest.mark.parametrize("method", ["gptq", "gptq --act-order", "awq", "awq+gptq"])
def test_stories_solvers_into_gguf_light(llmq_bin, stories_v3, tmp_path, method):
    """The light tier's check of the solvers into GGUF (it runs under the sanitizers too): stories260K,
    tiny calibration, Q4_0. Every quantized tensor decodes in gguf-py, the 172-wide ffn_down stays F16,
    and the JSON names a method and type for every linear."""
    out = tmp_path / f"s_{method.replace('+', '_').replace(' ', '_')}.gguf"
    rep = tmp_path / "r.json"
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--format", "gguf", "--gguf-type", "Q4_0", "--method",
             *method.split(), "--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "64", "--seed", "2",
             "--threads", "2", "--json", rep, "--out", out])
    assert "ffn_down" in r.stderr and "f16" in r.stderr.lower()
    js = json.loads(rep.read_text())
    layers = js["layers"]
    assert len(layers) == 5 * 7 and all(l.get("type") for l in layers)
    if "gptq" in method:
        assert js["settings"]["act_order"] is ("--act-order" in method), js["settings"]
    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_0" and types["blk.0.ffn_down.weight"] == "F16"
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.isfinite(w).all(), t.name
