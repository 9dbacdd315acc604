"""Oracle: a mixture of experts' per-expert importance in GGUF output, and the type choice over its stacked experts.

Models: tests/py/hf_moe_model.py's random mixtral / qwen3_moe (tests/py/test_moe.py describes them), converted to
GGUF by `llmq convert`. Text: the first 60000 bytes of wikitext-2's validation split (their stories260K tokenizer
reads it with byte fallback). The importance comes from llama.cpp's own llama-imatrix (8 chunks of 128 tokens, GGUF
and --output-format dat) and from `llmq calib --imatrix-out`. Oracles: llama.cpp 0.3.36's llama-quantize (the tool,
reading the file itself) and llama_model_quantize (llama-cpp-python, given the importance llama-quantize's
load_imatrix derives: GGUF in_sum2 / counts per expert, 1 for an expert of count 0; .dat values / ncall), gguf-py.

  --imatrix      `llmq quantize --method rtn --format gguf --imatrix F` on each model: every tensor byte-identical
                 to llama-quantize --imatrix F, and the whole file to llama_model_quantize (--no-provenance), for
                 Q4_K_M, Q6_K and IQ4_XS (wide models: the experts in Q4_K / Q6_K / IQ4_XS themselves; tiny ones:
                 their fallbacks), both file forms; the importance changes the experts' bytes (where their type takes
                 importance: not the tiny models' Q8_0 / F16 fallbacks of Q6_K / IQ4_XS). An expert of count 0
                 (an imatrix edited so) takes importance 1 as in llama-quantize.
  llmq calib     --imatrix-out writes llama-imatrix's entries and shapes (ffn_gate_inp, the stacked *_exps with one
                 row and one count per expert, Σ counts = top-k × tokens); llama-quantize loads it and writes the
                 tensors llmq writes from it; a llama-imatrix GGUF read and written back is the same file.
  type choice    --mix quality, --target-bpw (at the mix's size and 0.5 above), --target-size: each stacked tensor
                 keeps its (E, R, C) shape in one type, the router stays F32, the file meets the budget, the predicted
                 error is no larger than the mix's, llama.cpp loads the file and its logits are finite; --dry-run
                 prints the choice and writes nothing.
  refusals       --sensitivity measured (also auto's for --target-* with --calib) and --imatrix with a solver.
"""
import json
import os
import re
import struct

import numpy as np
import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, moe_ggufs, moe_models
from family_oracle import ids, work  # noqa: F401 (fixtures)
import test_gguf_mix as gm
import gen_golden_forward as gg
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)
from test_imatrix_gguf import llama_tools, read_dat, rewrite, tensor_bytes

gguf = pytest.importorskip("gguf")
pytestmark = [pytest.mark.heavy, pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)]

VARIANTS = ["tiny-mix", "tiny-qmoe", "wide-mix", "wide-qmoe"]
TOP_K = {"tiny-mix": 2, "tiny-qmoe": 3, "wide-mix": 2, "wide-qmoe": 2}
N_EXPERT = {"tiny-mix": 8, "tiny-qmoe": 8, "wide-mix": 4, "wide-qmoe": 4}
EXPS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


@pytest.fixture(scope="module")
def ggufs(llmq_bin, tool, stories_v3, work, ids):
    models = moe_models(llmq_bin, tool, stories_v3, work, ids, "hf_moe_model.py", VARIANTS)
    return moe_ggufs(llmq_bin, tool, models, work, ids, VARIANTS)


@pytest.fixture(scope="module")
def text(work, data_dir):
    p = work / "wiki.txt"
    p.write_bytes((data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()[:60000])
    return p


@pytest.fixture(scope="module")
def imatrices(ggufs, text, work):
    """llama-imatrix's file of every model in both forms: {(v, fmt): path}."""
    tools = llama_tools()
    out = {}
    for v in VARIANTS:
        for fmt in ("gguf", "dat"):
            p = work / f"{v}.imatrix.{fmt}"
            run([tools / "llama-imatrix", "-m", ggufs[v]["gguf"], "-f", text, "-o", p, "--output-format", fmt,
                 "-c", "128", "--chunks", "8", "-t", "2", "--no-ppl"])
            out[v, fmt] = p
    return out


def importance(path):
    """{weight: f32 importance} as llama-quantize's load_imatrix derives it (tools/quantize/quantize.cpp)."""
    if path.read_bytes()[:4] == b"GGUF":
        t = {x.name: np.array(x.data, dtype=np.float32) for x in gguf.GGUFReader(str(path)).tensors}
        out = {}
        for name, s in t.items():
            if name.endswith(".in_sum2"):
                c = t[name[:-len(".in_sum2")] + ".counts"].reshape(-1)
                s = s.reshape(c.size, -1)
                out[name[:-len(".in_sum2")]] = np.where(c[:, None] > 0, s / np.maximum(c, 1)[:, None],
                                                        np.float32(1)).astype(np.float32).reshape(-1)
        return out
    ent, _, _ = read_dat(path)
    return {w: (v / np.float32(n)).astype(np.float32) if n > 0 else v for w, (v, n) in ent.items()}


def llmq_q(llmq_bin, model, out, gtype, *flags):
    return gm.llmq_q(llmq_bin, model, out, gtype, "--no-provenance", *flags)


@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("fmt", ["gguf", "dat"])
def test_imatrix_byte_identical_to_llama_quantize(llmq_bin, lc, ggufs, imatrices, work, v, fmt):
    tools, imat, src = llama_tools(), imatrices[v, fmt], ggufs[v]["gguf"]
    for gtype in ("Q4_K_M", "Q6_K", "IQ4_XS"):
        mine, tool_out, lib_out = (work / f"{k}-{v}-{fmt}-{gtype}.gguf" for k in ("mine", "tool", "lib"))
        llmq_q(llmq_bin, src, mine, gtype, "--imatrix", imat)
        run([tools / "llama-quantize", "--imatrix", imat, src, tool_out, gtype, "2"])
        assert tensor_bytes(mine) == tensor_bytes(tool_out), (v, fmt, gtype)
        gm.lc_quantize(lc, src, lib_out, gm.FTYPES[gtype], imatrix=importance(imat))
        assert gm.same_file(lib_out, mine) is None, (v, fmt, gtype, gm.same_file(lib_out, mine))
        if v.startswith("tiny") and gtype != "Q4_K_M":
            continue  # their rows fall back to Q8_0 / F16 there, which take no importance
        plain = work / f"plain-{v}-{gtype}.gguf"
        llmq_q(llmq_bin, src, plain, gtype)
        a, b = tensor_bytes(plain), tensor_bytes(mine)
        assert any(a[n] != b[n] for n in a if "_exps" in n), (v, gtype)  # the experts' importance is used


def test_expert_without_tokens_takes_importance_one(llmq_bin, ggufs, imatrices, work):
    """Expert 1 of block 0 zeroed in llama-imatrix's GGUF (count 0, Σx² 0, as llama-imatrix writes an expert no token
    reached): llama-quantize then uses importance 1 for its rows, and so does llmq."""
    v, tools = "wide-qmoe", llama_tools()
    r = gguf.GGUFReader(str(imatrices[v, "gguf"]))
    rep = {}
    for t in r.tensors:
        if t.name.startswith("blk.0.ffn_") and "_exps" in t.name:
            a = np.array(t.data, dtype=np.float32).copy()
            a[1] = 0
            rep[t.name] = a
    edited = rewrite(imatrices[v, "gguf"], work / "zeroed.imatrix.gguf", replace=rep)
    mine, theirs, before = work / "zeroed-mine.gguf", work / "zeroed-tool.gguf", work / "zeroed-before.gguf"
    llmq_q(llmq_bin, ggufs[v]["gguf"], mine, "Q4_K_M", "--imatrix", edited)
    llmq_q(llmq_bin, ggufs[v]["gguf"], before, "Q4_K_M", "--imatrix", imatrices[v, "gguf"])
    run([tools / "llama-quantize", "--imatrix", edited, ggufs[v]["gguf"], theirs, "Q4_K_M", "2"])
    assert tensor_bytes(mine) == tensor_bytes(theirs)
    assert tensor_bytes(mine)["blk.0.ffn_up_exps.weight"] != tensor_bytes(before)["blk.0.ffn_up_exps.weight"]


@pytest.mark.parametrize("v", ["tiny-qmoe", "wide-mix"])
def test_llmq_calib_writes_llama_imatrix_layout(llmq_bin, ggufs, imatrices, text, work, v):
    tools, src = llama_tools(), ggufs[v]["gguf"]
    theirs = {x.name: tuple(int(d) for d in x.shape) for x in gguf.GGUFReader(str(imatrices[v, "gguf"])).tensors}
    for fmt in ("gguf", "dat"):
        own = work / f"own-{v}.{fmt}"
        run([llmq_bin, "calib", "--model", src, "--calib", text, "--nsamples", "8", "--seqlen", "128", "--no-xtx",
             "--threads", "2", "--imatrix-out", own, "--force"])
        if fmt == "gguf":
            t = {x.name: x for x in gguf.GGUFReader(str(own)).tensors}
            assert {n: tuple(int(d) for d in x.shape) for n, x in t.items()} == theirs
            for layer in (0, 1):
                c = [np.array(t[f"blk.{layer}.{w}.weight.counts"].data).reshape(-1) for w in EXPS]
                assert all(np.array_equal(c[0], x) for x in c) and c[0].size == N_EXPERT[v]
                assert c[0].sum() == TOP_K[v] * 8 * 128, c[0]  # every token routed to top-k experts
        else:
            ent, _, _ = read_dat(own)  # the experts' rows one after another
            assert len(ent["blk.0.ffn_gate_exps.weight"][0]) == N_EXPERT[v] * len(ent["blk.0.attn_q.weight"][0])
        lq, mine = work / f"own-lq-{v}-{fmt}.gguf", work / f"own-mine-{v}-{fmt}.gguf"
        r = run([tools / "llama-quantize", "--imatrix", own, src, lq, "Q4_K_M", "2"])
        n = len([k for k in theirs if k.endswith(".in_sum2")])
        assert f"loaded {n} importance matrix entries" in r.stdout + r.stderr and "computed on 8 chunks" in r.stdout + r.stderr
        llmq_q(llmq_bin, src, mine, "Q4_K_M", "--imatrix", own)
        assert tensor_bytes(mine) == tensor_bytes(lq), (v, fmt)
    back = work / f"back-{v}.imatrix.gguf"
    run([llmq_bin, "calib", "--model", src, "--imatrix-in", imatrices[v, "gguf"], "--imatrix-out", back, "--force"])
    assert back.read_bytes() == imatrices[v, "gguf"].read_bytes()


def tensor_bits(path):
    ts = gguf.GGUFReader(str(path)).tensors
    return 8.0 * sum(int(t.n_bytes) for t in ts) / sum(int(t.n_elements) for t in ts)


def predicted(stdout):
    """(the choice's predicted err, the mix's) from the --dry-run line "type choice: MODE; predicted err X (the mix's
    types: Y)"."""
    m = re.search(r"type choice: \w+; predicted err ([0-9.e+-]+) \(the mix's types: ([0-9.e+-]+)\)", stdout)
    assert m, stdout
    return float(m.group(1)), float(m.group(2))


def check_runs(lc, path, expect_types=None):
    t = {x.name: x for x in gguf.GGUFReader(str(path)).tensors}
    F = gguf.GGMLQuantizationType
    for name, x in t.items():
        if "_exps" in name:
            assert len(x.shape) == 3, (name, x.shape)  # one stacked tensor, so one type for all its experts
        if "ffn_gate_inp" in name:
            assert x.tensor_type == F.F32, name
    logits = gg.llama_cpp_logits(path, [1, 45, 300, 12, 77, 401])
    assert np.isfinite(logits).all() and logits.std() > 0.01, path
    return {n: x.tensor_type.name for n, x in t.items()}


@pytest.mark.parametrize("v", ["tiny-qmoe", "wide-mix", "wide-qmoe"])
def test_type_choice(llmq_bin, lc, ggufs, imatrices, work, v):
    src, imat, gtype = ggufs[v]["gguf"], imatrices[v, "gguf"], "Q4_K_M"
    mix = work / f"choice-mix-{v}.gguf"
    llmq_q(llmq_bin, src, mix, gtype, "--imatrix", imat)
    mix_bits, mix_types = tensor_bits(mix), check_runs(lc, mix)
    qual = work / f"choice-quality-{v}.gguf"
    r = llmq_q(llmq_bin, src, qual, gtype, "--imatrix", imat, "--mix", "quality", "--dry-run")
    err, err_mix = predicted(r.stdout)
    assert err <= err_mix and not qual.exists()
    llmq_q(llmq_bin, src, qual, gtype, "--imatrix", imat, "--mix", "quality")
    check_runs(lc, qual)
    assert tensor_bits(qual) <= mix_bits + 1e-12
    params = sum(int(t.n_elements) for t in gguf.GGUFReader(str(src)).tensors)
    for target in (mix_bits, mix_bits + 0.5):
        out = work / f"choice-target-{v}-{target:.3f}.gguf"
        r = llmq_q(llmq_bin, src, out, gtype, "--imatrix", imat, "--target-bpw", f"{target:.6f}", "--dry-run")
        err, err_mix = predicted(r.stdout)
        assert "target: -> " in r.stdout or err == err_mix, r.stdout
        if target == mix_bits:
            assert err <= err_mix * (1 + 1e-9), (err, err_mix)
        r2 = llmq_q(llmq_bin, src, out, gtype, "--imatrix", imat, "--target-size", str(int(target * params / 8)),
                    "--dry-run")
        assert r2.stdout.split("\npreflight plan")[0] == r.stdout.split("\npreflight plan")[0]
        llmq_q(llmq_bin, src, out, gtype, "--imatrix", imat, "--target-bpw", f"{target:.6f}")
        types = check_runs(lc, out)
        assert tensor_bits(out) <= target + 1e-9, (tensor_bits(out), target)
        if target > mix_bits and v.startswith("wide"):  # 256-wide rows: Q5_K / Q6_K / Q8_0 candidates
            assert any(types[n] != mix_types[n] for n in types if "_exps" in n), types


def test_type_choice_from_calib(llmq_bin, lc, ggufs, text, work):
    """rtn --calib gathers the per-expert importance for the choice too (--sensitivity uniform)."""
    v = "wide-qmoe"
    out, js = work / "choice-calib.gguf", work / "choice-calib.json"
    llmq_q(llmq_bin, ggufs[v]["gguf"], out, "Q4_K_M", "--calib", text, "--nsamples", "4", "--seqlen", "128",
           "--target-bpw", "5.5", "--sensitivity", "uniform", "--json", js)
    check_runs(lc, out)
    assert tensor_bits(out) <= 5.5
    rep = json.load(open(js))
    assert rep["totals"]["predicted_err"] > 0


@pytest.mark.parametrize("flags,msg", [
    (["--target-bpw", "5", "--calib", "TEXT"], "--sensitivity measured is not implemented for a mixture of experts"),
    (["--mix", "quality", "--calib", "TEXT", "--sensitivity", "measured"], "--sensitivity measured is not implemented"),
    (["--method", "gptq", "--calib", "TEXT", "--imatrix", "IMAT"], "--imatrix for a mixture of experts"),
])
def test_refused(llmq_bin, ggufs, imatrices, text, work, flags, msg):
    out = work / "refused.gguf"
    flags = [str(text) if f == "TEXT" else str(imatrices["tiny-qmoe", "gguf"]) if f == "IMAT" else f for f in flags]
    r = run([llmq_bin, "quantize", "--model", ggufs["tiny-qmoe"]["gguf"], "--out", out, "--format", "gguf",
             "--gguf-type", "Q4_K_M", *flags], check=False)
    assert r.returncode != 0 and msg in r.stderr and not out.exists(), r.stderr
