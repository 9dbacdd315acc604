"""The synthetic-checkpoint generator (tests/tools/synth_ckpt.c), the input of bench/scale.sh and of the GPU
pipeline's device runs, checked against what does not depend on it:

  shapes         --list's parameter counts at full depth equal the published ones: SmolLM2-135M
                 134,515,008 (HuggingFaceTB/SmolLM2-135M), Llama-3-8B 8,030,261,248 and Llama-3-70B
                 70,553,706,496 (their safetensors index / model cards).
  the files      the `safetensors` package reads every tensor as bf16 with the shape config.json implies;
                 two runs with one seed write the same bytes, another seed other bytes, and a block's
                 values do not depend on --layers (each tensor has its own stream); --shard-bytes shards.
  transformers   (LLMQ_HF_PYTHON) loads the directory as LlamaForCausalLM, and its fp32 logits on fixed
                 ids equal llmq's forward on the same directory within 1e-4 of max |logit| (the bound of
                 tests/py/test_qwen3.py, derived there), top-1 equal: config.json says what the weights are.
  llmq           `llmq quantize --method rtn --format gguf` runs on it (with the stories260K tokenizer,
                 whose 512 tokens the tiny shape's vocabulary matches).
  errors         an existing --out without --force, an unknown shape and out-of-range --layers exit
                 non-zero with a message.
"""
import hashlib
import json
import os

import numpy as np
import pytest

from conftest import run

HF_PYTHON = os.environ.get("LLMQ_HF_PYTHON")
PUBLISHED = {"smollm2-135m": 134515008, "llama-3-8b": 8030261248, "llama-3-70b": 70553706496}


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def files(d):
    return {p: sha(os.path.join(d, p)) for p in sorted(os.listdir(d)) if p.endswith((".safetensors", ".json"))}


@pytest.fixture(scope="module")
def tok(llmq_bin, stories_v3, tmp_path_factory):
    d = tmp_path_factory.mktemp("synth-tok")
    run([llmq_bin, "convert", "--model", stories_v3, "--out", d / "hf", "--to", "hf", "--quiet"])
    return d / "hf"


def synth(tool, out, *args):
    return run([tool("synth_ckpt"), "--out", out, *map(str, args)])


@pytest.mark.parametrize("shape", sorted(PUBLISHED))
def test_parameter_counts(tool, shape):
    last = run([tool("synth_ckpt"), "--shape", shape, "--list"]).stdout.strip().splitlines()[-1].split()
    params = int(last[last.index("params") + 1])
    assert params == PUBLISHED[shape]


def read_bf16(path):
    """Every tensor of one safetensors file as float32, parsed from its header (numpy has no bfloat16)."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        u = np.frombuffer(raw[8 + n + s:8 + n + e], np.uint16).astype(np.uint32) << 16
        out[k] = u.view(np.float32).reshape(v["shape"])
    return out


def expected_shapes(cfg):
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    want = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D]}
    if not cfg["tie_word_embeddings"]:
        want["lm_head.weight"] = [V, D]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        want.update({p + "input_layernorm.weight": [D], p + "post_attention_layernorm.weight": [D],
                     p + "self_attn.q_proj.weight": [q, D], p + "self_attn.k_proj.weight": [kv, D],
                     p + "self_attn.v_proj.weight": [kv, D], p + "self_attn.o_proj.weight": [D, q],
                     p + "mlp.gate_proj.weight": [F, D], p + "mlp.up_proj.weight": [F, D],
                     p + "mlp.down_proj.weight": [D, F]})
    return want


def test_files(tool, tmp_path):
    from safetensors import safe_open
    a, b, c, one = (tmp_path / n for n in ("a", "b", "c", "one"))
    synth(tool, a, "--shape", "tiny", "--seed", 5)
    synth(tool, b, "--shape", "tiny", "--seed", 5)
    synth(tool, c, "--shape", "tiny", "--seed", 6)
    synth(tool, one, "--shape", "tiny", "--seed", 5, "--layers", 1)
    assert files(a) == files(b)
    assert files(a)["model.safetensors"] != files(c)["model.safetensors"]
    cfg = json.load(open(a / "config.json"))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2
    with safe_open(str(a / "model.safetensors"), "numpy") as f:
        got = {k: f.get_slice(k).get_shape() for k in f.keys()}
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert got == expected_shapes(cfg)
    ta, t1 = read_bf16(a / "model.safetensors"), read_bf16(one / "model.safetensors")
    assert set(t1) < set(ta)
    for k in t1:  # block 0, the embedding, the final norm and the head: the same streams
        assert np.array_equal(ta[k], t1[k]), k
    w = ta["model.layers.1.mlp.down_proj.weight"]
    assert abs(float(w.std()) - 0.02) < 0.002 and abs(float(w.mean())) < 0.002
    assert np.all(np.abs(ta["model.norm.weight"] - 1.0) <= 0.1)


def test_sharded(tool, tmp_path):
    d = tmp_path / "sh"
    synth(tool, d, "--shape", "tiny", "--layers", 2, "--vocab", 8192, "--shard-bytes", 1 << 20)
    idx = json.load(open(d / "model.safetensors.index.json"))
    shards = sorted(set(idx["weight_map"].values()))
    assert len(shards) == 3 and all(os.path.exists(d / s) for s in shards)
    assert json.load(open(d / "config.json"))["vocab_size"] == 8192


def test_errors(tool, tmp_path):
    d = tmp_path / "e"
    synth(tool, d, "--shape", "tiny")
    r = run([tool("synth_ckpt"), "--shape", "tiny", "--out", d], check=False)
    assert r.returncode == 1 and "exists" in r.stderr
    r = run([tool("synth_ckpt"), "--shape", "llama-9b", "--list"], check=False)
    assert r.returncode == 2 and "unknown --shape" in r.stderr and "llama-3-8b" in r.stderr
    r = run([tool("synth_ckpt"), "--shape", "tiny", "--layers", 3, "--list"], check=False)
    assert r.returncode == 2 and "--layers" in r.stderr


def test_llmq_quantizes_it(llmq_bin, tool, tok, tmp_path):
    d, out = tmp_path / "m", tmp_path / "m.gguf"
    synth(tool, d, "--shape", "tiny", "--tokenizer", tok)
    run([llmq_bin, "quantize", "--model", d, "--method", "rtn", "--format", "gguf", "--gguf-type", "Q8_0",
         "--out", out])
    assert out.stat().st_size > 0


HF_LOGITS = """
import sys, numpy as np, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32, attn_implementation="eager")
ids = [int(x) for x in open(sys.argv[2]).read().split()]
with torch.no_grad():
    m(torch.tensor([ids])).logits[0].numpy().astype(np.float32).tofile(sys.argv[3])
"""


@pytest.mark.skipif(not HF_PYTHON, reason="LLMQ_HF_PYTHON unset: no transformers venv (tests/run.sh sets it up "
                    "with LLMQ_WITH_HF=1)")
def test_transformers_agrees(llmq_bin, tool, tmp_path):
    d = tmp_path / "m"
    synth(tool, d, "--shape", "tiny", "--seed", 3)
    ids = tmp_path / "ids.txt"
    rng = np.random.default_rng(3)
    ids.write_text(" ".join(str(int(x)) for x in [1] + list(rng.integers(3, 512, size=31))))
    script = tmp_path / "hf_logits.py"
    script.write_text(HF_LOGITS)
    run([HF_PYTHON, script, d, ids, tmp_path / "ref.f32"], env=dict(os.environ, OMP_NUM_THREADS="2"))
    run([tool("forward_logits"), d, ids, tmp_path / "got.f32", 2])
    ref = np.fromfile(tmp_path / "ref.f32", np.float32).reshape(32, 512)
    got = np.fromfile(tmp_path / "got.f32", np.float32).reshape(32, 512)
    scale, diff = float(np.abs(ref).max()), float(np.abs(ref - got).max())
    print(f"max |transformers - llmq| = {diff:.3g} of max |logit| {scale:.3g}")
    assert diff <= 1e-4 * scale
    assert (ref.argmax(1) == got.argmax(1)).all()
