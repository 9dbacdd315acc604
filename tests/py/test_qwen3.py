"""Oracle: the Qwen3 family (model_type / general.architecture "qwen3": per-head RMSNorm q_norm / k_norm
before NEOX RoPE, no biases, head_dim not tied to hidden / heads) against transformers and llama.cpp.

The model: tests/py/hf_qwen3_model.py builds two random-weight Qwen3ForCausalLM checkpoints in the
transformers venv (LLMQ_HF_PYTHON; hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 32 so q_proj is
128 x 64 and o_proj 64 x 128, intermediate 128, vocab 512, rope_theta 1e6 (written by transformers 5 as
"rope_parameters"), tie_word_embeddings false and true, f32; norm weights random so that q_norm, k_norm
and the block norms all differ), with the tokenizer of stories260K (converted to tokenizer.json by
`llmq convert`), and the reference logits of 48 fixed token ids. Then:

  transformers   llmq's forward on the HF directory (tests/tools/forward_logits). Both compute in f32
                 with different summation orders. Rounding errors of random sign accumulate like
                 sqrt(K) * u per dot product (u = 2^-24, K <= 128 here: 7e-7 relative); about 15
                 chained products, norms and softmaxes from the embedding to the logits, times 10 for
                 cancellation in the sums, give max |diff| <= 1e-4 * max |logit|. Measured (transformers
                 5.24, eager attention): 1.2e-6 (untied) and 1.0e-6 (tied) of max |logit| (4.8e-6 and
                 4.4e-6 on logits within +-4.4); top-1 equal at every position.
  GGUF           `llmq convert` HF -> GGUF (f32): the same bytes through the same code, so llmq's forward
                 on the GGUF equals the HF-directory forward exactly (measured: bit-identical).
  llama.cpp      llama-cpp-python 0.3.36 loads that GGUF: every logit within F32_TOL = 1e-3 of llmq's,
                 the tolerance of tests/py/test_forward_oracle.py for LLaMA (measured: 6.2e-6 untied,
                 5.8e-6 tied); top-1 equal everywhere.
  GGUF -> HF     every tensor comes back bit-identical, config.json says qwen3 / head_dim 32 / 1e6.
  quantize       `llmq quantize --method rtn --format gguf --gguf-type Q8_0 | Q4_K_M --no-provenance` on
                 the GGUF is byte-identical to llama_model_quantize (measured: identical, both variants;
                 Q4_K_M's K-quants fall back for these 64- / 128-column rows exactly as llama.cpp's do).
  GPTQ           `llmq quantize --method gptq --format gptq` writes q_norm / k_norm (rounded to f16 as
                 the directory's other norms), every
                 linear's error is below RTN's on the calibration tokens, and transformers (GPTQModel's
                 kernels, tests/py/hf_load_logits.py) computes what llmq computes from that directory,
                 with the thresholds of tests/py/test_hf_load.py (measured: rms 6.5e-4, max 4.3e-3,
                 against a quantization effect of rms 0.40; top-1 100%).

The tests that need transformers skip when LLMQ_HF_PYTHON is unset; the unsupported-architecture check
runs without it.
"""
import json

import numpy as np
import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, N_VOCAB, build_hf_models, check_hf_loads, forward
from family_oracle import gguf_back_to_hf
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_forward_oracle import F32_TOL, HAVE_LLAMA_CPP, check_live
import gen_golden_forward as gg
import test_gguf_mix as gm
from test_gguf_mix import lc  # noqa: F401 (the fixture: llama_cpp, or a skip)

needs_hf = pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")
TOL_REL = 1e-4  # derived in the module docstring
VARIANTS = ["untied", "tied"]


@pytest.fixture(scope="module")
def models(llmq_bin, tool, stories_v3, work, ids):
    """Per variant: the HF directory, transformers' logits, llmq's logits on the HF directory and on its
    GGUF conversion, and the GGUF path."""
    if not HF_PYTHON:
        pytest.skip("LLMQ_HF_PYTHON unset")
    build_hf_models(llmq_bin, stories_v3, work, ids, "hf_qwen3_model.py", HF_PYTHON)
    out = {}
    for v in VARIANTS:
        d = work / f"qwen3-{v}"
        gguf = work / f"qwen3-{v}.gguf"
        run([llmq_bin, "convert", "--model", d, "--out", gguf, "--quiet"])
        out[v] = dict(hf=d, gguf=gguf, ref=np.fromfile(f"{d}.hf.f32", np.float32).reshape(-1, N_VOCAB),
                      llmq_hf=forward(tool, d, ids["path"], work / f"{v}.llmq-hf.f32"),
                      llmq_gguf=forward(tool, gguf, ids["path"], work / f"{v}.llmq-gguf.f32"))
    return out


@needs_hf
@pytest.mark.parametrize("v", VARIANTS)
def test_forward_matches_transformers(models, v):
    m = models[v]
    ref, got = m["ref"], m["llmq_hf"]
    assert ref.shape == got.shape == (48, N_VOCAB)
    scale = float(np.abs(ref).max())
    d = float(np.abs(ref - got).max())
    print(f"{v}: max |transformers - llmq| = {d:.3g}, {d / scale:.3g} of max |logit| {scale:.3g}")
    assert d <= TOL_REL * scale
    assert (ref.argmax(1) == got.argmax(1)).all()


@needs_hf
@pytest.mark.parametrize("v", VARIANTS)
def test_gguf_forward_equals_hf_forward(models, v):
    import gguf
    r = gguf.GGUFReader(str(models[v]["gguf"]))

    def field(key):
        f = r.fields[key]
        val = f.parts[f.data[0]]
        return bytes(val).decode() if f.types[0] == gguf.GGUFValueType.STRING else val.tolist()[0]

    assert field("general.architecture") == "qwen3"
    assert field("qwen3.attention.key_length") == 32 and field("qwen3.attention.value_length") == 32
    assert field("qwen3.rope.freq_base") == 1e6
    names = {t.name for t in r.tensors}
    assert {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"} <= names
    assert ("output.weight" in names) == (v == "untied")
    assert np.array_equal(models[v]["llmq_gguf"], models[v]["llmq_hf"])


@needs_hf
@needs_llama_cpp
@pytest.mark.parametrize("v", VARIANTS)
def test_llama_cpp_agrees(models, ids, v):
    check_live(f"qwen3 {v} f32", models[v]["llmq_gguf"], gg.llama_cpp_logits(models[v]["gguf"], ids["tokens"]),
               F32_TOL, 1.0)


@needs_hf
@pytest.mark.parametrize("v", VARIANTS)
def test_gguf_to_hf_reproduces_tensors(llmq_bin, models, work, v):
    a, b, cfg = gguf_back_to_hf(llmq_bin, models[v]["gguf"], models[v]["hf"], work / f"back-{v}")
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["head_dim"] == 32 and cfg["rope_theta"] == 1e6 and cfg["tie_word_embeddings"] == (v == "tied")


@needs_hf
@pytest.mark.parametrize("v", VARIANTS)
@pytest.mark.parametrize("gtype", ["Q8_0", "Q4_K_M"])
def test_rtn_gguf_byte_identical_to_llama_quantize(llmq_bin, lc, models, work, v, gtype):
    ref, mine = work / f"ref-{v}-{gtype}.gguf", work / f"mine-{v}-{gtype}.gguf"
    gm.lc_quantize(lc, models[v]["gguf"], ref, gm.FTYPES[gtype])
    gm.llmq_q(llmq_bin, models[v]["gguf"], mine, gtype, "--no-provenance")
    assert gm.same_file(ref, mine) is None, gm.same_file(ref, mine)


@needs_hf
def test_gptq_directory(llmq_bin, tool, data_dir, models, ids, work):
    from safetensors.numpy import load_file
    out, js = work / "gptq", work / "gptq.json"
    run([llmq_bin, "quantize", "--model", models["untied"]["hf"], "--method", "gptq", "--bits", "4", "--sym",
         "--group-size", "32", "--format", "gptq", "--calib", data_dir / "wikitext-2-raw" / "wiki.test.raw",
         "--nsamples", "4", "--seqlen", "64", "--threads", "2", "--out", out, "--json", js])
    layers = json.loads(js.read_text())["layers"]
    assert len(layers) == 14 and all(x["err"] < x["rtn_err"] for x in layers), layers
    src, q = load_file(str(models["untied"]["hf"] / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for l in range(2):  # stored in the dtype of the directory's other norms (f16), rounded once
        dt = q[f"model.layers.{l}.input_layernorm.weight"].dtype
        for n in ("q_norm", "k_norm"):
            name = f"model.layers.{l}.self_attn.{n}.weight"
            assert q[name].dtype == dt and np.array_equal(src[name].astype(dt), q[name]), name

    check_hf_loads(tool, out, ids, work, "gptq", "qwen3 gptq", models["untied"]["llmq_hf"])


def test_unsupported_architecture_lists_qwen3(llmq_bin, tool, tmp_path):
    d = tmp_path / "gemma"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gemma", "hidden_size": 64}))
    for cmd in ([llmq_bin, "convert", "--model", d, "--out", tmp_path / "x.gguf"],
                [tool("forward_logits"), d, tmp_path / "ids", tmp_path / "out"]):
        (tmp_path / "ids").write_text("1 2")
        r = run(cmd, check=False)
        assert r.returncode != 0
        assert 'model_type "gemma" is not supported (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, mixtral, qwen3_moe, qwen2_moe)' in r.stderr, r.stderr
