"""Oracle: `llmq quantize` of Phi-3, whose checkpoints store q/k/v as one qkv_proj and gate/up as one gate_up_proj
(llama.cpp: attn_qkv, ffn_up of 2 n_ff rows, gate then up). llmq solves q, k, v (and gate, up) as the row ranges
they are (they share one input, so one Hessian / one AWQ input scale: solving the fused linear row by row is the
same computation) and writes each fused linear back as ONE packed linear, rows q|k|v and gate|up as the
checkpoint has them; the JSON row of each part names the tensor and the rows it is ("fused").

The model: tests/py/hf_phi3_quant_model.py "p3w", a random Phi3ForCausalLM with 256-wide rows (hidden 256,
intermediate 256, 4 heads of 64, 2 kv heads, 2 layers, vocab 512) so that the K-quants tile every linear;
calibration: wikitext-2 test, 4 x 64 tokens.
  GGUF rtn       `llmq quantize --format gguf --method rtn --no-provenance` on the converted GGUF is byte-identical
                 to llama_model_quantize for Q8_0, Q4_K_M, Q6_K; from the HF directory too (Q4_K_M).
  directories    gptq and awq+gptq (4 bits, group 32, --format gptq): every linear's error below its RTN error on
                 the same calibration; awq (--format awq): its total error below an RTN run's (AWQ minimises each
                 scaled group's output, not each linear's error; tests/py/test_gemma.py's check). Each has
                 self_attn.qkv_proj (512 rows) and mlp.gate_up_proj (512 rows) packed, no q/k/v/gate/up_proj.
  loads          numpy (tests/py/unpack_ref.py, no llmq code) unpacks each packed directory into a plain f32 HF
                 directory; transformers' Phi3ForCausalLM on it matches llmq's forward on the PACKED directory
                 within the forward tolerance of tests/py/test_phi3.py (1e-4 of max |logit|).
                 The packed gptq and awq directories load in transformers 5.24 (GPTQModel 7.7's kernels,
                 tests/py/hf_load_logits.py: the fused qkv_proj / gate_up_proj become its quantized linears) and
                 agree with llmq with tests/py/test_hf_load.py's thresholds (measured: rms 7.0e-4, max <= 4.4e-3,
                 against a quantization effect of rms 0.33 to 0.45; top-1 equal). Not here: GPTQModel.load itself
                 (7.7) refuses them, "Missing required quantized weights ... mlp.gate_proj.qweight, mlp.up_proj
                 .qweight": its phi3 definition expects gate and up as two linears (qkv_proj fused), a layout no
                 Phi-3 checkpoint has.
  GGUF solvers   gptq, awq, awq+gptq into GGUF (Q4_K_M): complete, gptq / awq+gptq errors <= rtn_err ("gptq:rtn"
                 rows equal, tests/py/test_moe_quant.py's rule); llama.cpp (llama-cpp-python) loads each file and
                 its logits agree with llmq's (llama.cpp's CPU arithmetic emulated, tests/tools/forward_logits
                 "llamacpp-cpu") within test_moe_quant.py's LLAMA_TOL rule.
"""
import json
import os

import numpy as np
import pytest

from conftest import run
from family_oracle import HERE, HF_PYTHON, HF_SKIP_REASON, N_VOCAB, forward
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import HAVE_LLAMA_CPP
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)
from test_hf_load import check_agreement
import gen_golden_forward as gg
import test_gguf_mix as gm
import unpack_ref

pytestmark = pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")
SCRIPT = os.path.join(HERE, "hf_phi3_quant_model.py")
TOL_REL = 1e-4
LLAMA_TOL = 0.06
DIR_FORMAT = {"rtn": "awq", "gptq": "gptq", "awq": "awq", "awq+gptq": "gptq"}
ENV = dict(os.environ, OMP_NUM_THREADS="2")


def hf(*args):
    r = run([HF_PYTHON, SCRIPT, *args], env=ENV)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def quantize(llmq_bin, data_dir, model, method, out, *fmt):
    js = out.parent / f"{out.name}.json"
    run([llmq_bin, "quantize", "--model", model, "--method", method, *fmt, "--calib",
         data_dir / "wikitext-2-raw" / "wiki.test.raw", "--nsamples", "4", "--seqlen", "64", "--threads", "2",
         "--out", out, "--json", js, "--force"])
    return json.loads(js.read_text())["layers"]


@pytest.fixture(scope="module")
def model(llmq_bin, tool, stories_v3, work, ids):
    tok = work / "tok"
    run([llmq_bin, "convert", "--model", stories_v3, "--out", tok, "--to", "hf", "--quiet"])
    hf("build", tok, ids["path"], work)
    d = work / "p3w"
    gguf = work / "p3w.gguf"
    run([llmq_bin, "convert", "--model", d, "--out", gguf, "--quiet"])
    return dict(hf=d, gguf=gguf, base=forward(tool, d, ids["path"], work / "p3w.llmq.f32"))


@pytest.fixture(scope="module")
def dirs(llmq_bin, data_dir, model, work):
    out = {}
    for m, fmt in DIR_FORMAT.items():
        o = work / f"d-{m}"
        out[m] = (o, quantize(llmq_bin, data_dir, model["hf"], m, o, "--bits", "4", "--group-size", "32", "--format",
                              fmt))
    return out


@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_K_M", "Q6_K"])
def test_rtn_gguf_byte_identical_to_llama_quantize(llmq_bin, lc, model, work, gtype):
    ref, mine = work / f"ref-{gtype}.gguf", work / f"mine-{gtype}.gguf"
    gm.lc_quantize(lc, model["gguf"], ref, gm.FTYPES[gtype])
    gm.llmq_q(llmq_bin, model["gguf"], mine, gtype, "--no-provenance")
    assert gm.same_file(ref, mine) is None, gm.same_file(ref, mine)
    if gtype == "Q4_K_M":  # the HF directory's fused tensors give the same bytes
        mine_hf = work / "mine-hf-Q4_K_M.gguf"
        gm.llmq_q(llmq_bin, model["hf"], mine_hf, gtype, "--no-provenance")
        assert gm.same_file(ref, mine_hf) is None, gm.same_file(ref, mine_hf)


def test_directories_fused_and_below_rtn(dirs):
    from safetensors.numpy import load_file
    for m, (o, layers) in dirs.items():
        assert len(layers) == 14
        t = load_file(str(o / "model.safetensors"))
        for l in range(2):
            p = f"model.layers.{l}."
            assert t[f"{p}self_attn.qkv_proj.scales"].shape == (8, 512), m
            assert t[f"{p}mlp.gate_up_proj.scales"].shape == (8, 512), m
            assert not any(k.startswith((f"{p}self_attn.{x}_proj", f"{p}mlp.{x}_proj")) for k in t
                           for x in ("q", "k", "v", "gate", "up")), m
        fused = {r["name"]: r["fused"] for r in layers if "fused" in r}
        assert fused["blk.1.attn_k"] == {"tensor": "blk.1.attn_qkv", "rows": [256, 384]}
        assert fused["blk.0.ffn_up"] == {"tensor": "blk.0.ffn_up", "rows": [256, 512]}
        assert len(fused) == 10 and not any("fused" in r for r in layers if r["name"].endswith(("_output", "_down")))
    for m in ("gptq", "awq+gptq"):
        assert all(x["err"] < x["rtn_err"] for x in dirs[m][1]), dirs[m][1]
    awq, rtn = (sum(x["err"] for x in dirs[m][1]) for m in ("awq", "rtn"))
    print(f"phi3: awq total error {awq:.4g}, rtn {rtn:.4g}")
    assert awq < rtn


def unpacked_dir(src, dst, qkv_shape=(512, 256)):
    """A plain f32 HF directory with every packed linear of src unpacked by numpy (tests/py/unpack_ref.py); its
    qkv_proj of block 0 must come out qkv_shape (p3w's by default)."""
    from safetensors.numpy import load_file
    t = load_file(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    qc = cfg["quantization_config"]
    out = {}
    for k in t:
        if k.endswith(".qweight"):
            p = k[:-len(".qweight")]
            parts = {s: t[f"{p}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx") if f"{p}.{s}" in t}
            out[f"{p}.weight"] = (unpack_ref.dequant_awq(parts, qc["group_size"]) if qc["quant_method"] == "awq" else
                                  unpack_ref.dequant_gptq(parts, qc["bits"], qc["checkpoint_format"] == "gptq"))
        elif not k.endswith((".qzeros", ".scales", ".g_idx")):
            out[k] = t[k].astype(np.float32)
    assert out["model.layers.0.self_attn.qkv_proj.weight"].shape == qkv_shape
    unpack_ref.save_plain_dir(out, cfg, src, dst)


def test_directories_load(tool, dirs, model, ids, work):
    """numpy-unpacked in transformers, and the packed gptq / awq directories in transformers, against llmq."""
    args, ours = [], {}
    for m in ("gptq", "awq", "awq+gptq"):
        o = dirs[m][0]
        ours[m] = forward(tool, o, ids["path"], work / f"{o.name}.llmq.f32")
        unpacked_dir(o, work / f"u-{m}")
        args += [work / f"u-{m}", work / f"u-{m}.hf.f32"]
    info = hf("logits", ids["path"], *args)
    assert all("Linear" in c for i in info for c in i["linear_classes"]), info
    for m in ("gptq", "awq", "awq+gptq"):
        theirs = np.fromfile(work / f"u-{m}.hf.f32", np.float32).reshape(-1, N_VOCAB)
        scale, d = float(np.abs(theirs).max()), float(np.abs(theirs - ours[m]).max())
        print(f"phi3 {m}: max |transformers(numpy-unpacked) - llmq(packed)| = {d:.3g}, {d / scale:.3g} of max |logit|")
        assert d <= TOL_REL * scale and (theirs.argmax(1) == ours[m].argmax(1)).all()
    r = run([HF_PYTHON, os.path.join(HERE, "hf_load_logits.py"), ids["path"], "float32", dirs["gptq"][0],
             work / "d-gptq.hf.f32", dirs["awq"][0], work / "d-awq.hf.f32"], env=ENV)
    info = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    for i, m in zip(info, ("gptq", "awq")):
        assert "error" not in i and i["quant_method"] == m and i["linear_classes"], i
        theirs = np.fromfile(work / f"d-{m}.hf.f32", np.float32).reshape(-1, N_VOCAB)
        check_agreement(f"phi3 {m}: {i['linear_classes']}", theirs, ours[m], model["base"], i["versions"])


@pytest.mark.parametrize("m", ["gptq", "awq", "awq+gptq"])
def test_gguf_solvers(llmq_bin, tool, data_dir, model, ids, work, m):
    out = work / f"g-{m}.gguf"
    layers = quantize(llmq_bin, data_dir, model["hf"], m, out, "--format", "gguf", "--gguf-type", "Q4_K_M")
    assert len(layers) == 14 and sum("fused" in r for r in layers) == 10
    if m != "awq":
        assert all(x["err"] <= x["rtn_err"] for x in layers) and any(x["err"] < x["rtn_err"] for x in layers), layers
    if not HAVE_LLAMA_CPP:
        pytest.skip("llama_cpp (llama-cpp-python) is not importable")
    o = work / f"g-{m}.llmq.f32"
    run([tool("forward_logits"), out, ids["path"], o, 2, 0, "llamacpp-cpu"])
    mine = np.fromfile(o, np.float32).reshape(48, -1)
    ref = gg.llama_cpp_logits(out, ids["tokens"])
    d = np.abs(mine - ref).max(1) / float(np.abs(ref).max())
    agree = float(np.mean(mine.argmax(1) == ref.argmax(1)))
    print(f"phi3 {m} Q4_K_M: per-position max |llama.cpp - llmq| / max |logit|: median {np.median(d):.3g}, max "
          f"{d.max():.3g}; top-1 {agree:.3f}")
    assert np.median(d) <= LLAMA_TOL / 2 and np.sum(d > LLAMA_TOL) <= 5 and agree >= 0.85
