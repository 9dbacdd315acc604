"""Oracle for quant/export.h (llmq quantize --format awq|gptq|fake) and for reading those outputs back.

tests/tools/export_tool RTN-quantizes SmolLM2-135M-Instruct (the Q4_1 GGUF; --layers 1 keeps the first
block so each case writes ~60 MB, mostly the fp16 embeddings) and exports it, writing next to it a
reference: the f32 weights every linear must decode to, W = f32(q - z) * f32(s) with s rounded to fp16 (awq, gptq) or kept in f32 (fake).
unpack_ref.py (numpy, written from the layouts documented in quant/export.h) decodes the directory independently; llmq's own loader
(calib/model/model.c, `export_tool dequant`) decodes it too. All three must agree BIT FOR BIT, for AWQ (asym,
sym) and GPTQ v1 (sym) / gptq_v2 (asym), 2/3/4/8 bits, act-order g_idx and per-channel groups.
Also checked: tensor names / dtypes / shapes, config.json and quantize_config.json fields, provenance in
config.json and the safetensors metadata, the GGUF q/k row permutation undone (against gguf-py's own
dequantization of the input), `llmq eval` on the fake and awq outputs of the full model agreeing within
fp16 rounding, `llmq inspect` on all three, atomicity and refusal of an existing output.
"""
import json
import os

import gguf
import numpy as np
import pytest

import unpack_ref as ur
from conftest import run

LAYERS = 1  # blocks kept: the packing is the same in every block; tests/unit/test_export.c streams 5


@pytest.fixture(scope="module")
def exporter(tool, smollm2, tmp_path_factory):
    cache = {}
    base = tmp_path_factory.mktemp("export")

    def go(fmt, bits, group, sym, act_order=False, layers=LAYERS):
        key = (fmt, bits, group, sym, act_order, layers)
        if key not in cache:
            name = f"{fmt}-{bits}-{group}-{'sym' if sym else 'asym'}{'-ao' if act_order else ''}-{layers}"
            out, ref, deq = base / name, base / (name + ".ref"), base / (name + ".deq")
            args = [tool("export_tool"), "quantize", smollm2, out, fmt, bits, group, "sym" if sym else "asym",
                    "--ref", ref]
            if act_order:
                args.append("--act-order")
            if layers:
                args += ["--layers", layers]
            run(args)
            run([tool("export_tool"), "dequant", out, deq])
            cache[key] = (out, ref / "model.safetensors", deq / "model.safetensors")
        return cache[key]
    return go


def load_st(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def bits_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype == np.float32 and np.array_equal(a.view(np.uint32),
                                                                                       b.view(np.uint32))


CASES = [  # fmt, bits, group, sym, act_order
    ("awq", 4, 64, False, False),
    ("awq", 4, 64, True, False),
    ("awq", 4, 32, False, False),
    ("gptq", 4, 64, True, False),    # v1
    ("gptq", 4, 64, False, False),   # gptq_v2
    ("gptq", 4, 64, True, True),     # act-order g_idx
    ("gptq", 4, 64, False, True),
    ("gptq", 2, 64, False, False),
    ("gptq", 3, 64, True, False),
    ("gptq", 3, 64, False, True),
    ("gptq", 8, 64, False, False),
    ("gptq", 8, 32, True, False),
    ("gptq", 4, -1, True, False),    # one group per row
]


@pytest.mark.parametrize("fmt,bits,group,sym,act_order", CASES)
def test_unpack_bit_exact(exporter, fmt, bits, group, sym, act_order):
    out, ref_path, deq_path = exporter(fmt, bits, group, sym, act_order)
    ref, deq = load_st(ref_path), load_st(deq_path)
    d = ur.QuantDir(out)
    assert len(ref) == LAYERS * 7
    for layer in range(LAYERS):
        for lin in ur.LINEARS:
            name = f"model.layers.{layer}.{lin}.weight"
            mine = d.linear(layer, lin)
            assert bits_equal(mine, ref[name]), f"{name}: unpack_ref differs from the writer's reference"
            assert bits_equal(deq[name], ref[name]), f"{name}: llmq's loader differs from the writer's reference"
            assert not d.has(name), "a quantized linear must not also carry .weight"


@pytest.mark.parametrize("fmt,bits,group,sym,act_order", CASES)
def test_layout_and_config(exporter, fmt, bits, group, sym, act_order):
    out, _, _ = exporter(fmt, bits, group, sym, act_order)
    d = ur.QuantDir(out)
    cfg, qc = d.config, d.qc
    D, F = cfg["hidden_size"], cfg["intermediate_size"]
    assert cfg["num_hidden_layers"] == LAYERS and cfg["torch_dtype"] == "float16"
    assert qc["quant_method"] == fmt and qc["bits"] == bits and qc["group_size"] == group
    if fmt == "awq":
        assert qc == {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                      "version": "gemm", "modules_to_not_convert": None}
    else:
        want = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order, "sym": sym,
                "static_groups": False, "true_sequential": True,
                "checkpoint_format": "gptq" if sym else "gptq_v2"}
        for k, v in want.items():
            assert qc[k] == v, k
        assert qc["damp_percent"] == pytest.approx(0.01)
        assert json.loads((out / "quantize_config.json").read_text()) == qc
    prov = cfg["llmq"]
    assert prov["format"] == fmt and prov["bits"] == bits and prov["group_size"] == group and prov["sym"] == sym
    assert prov["method"] == "rtn" and prov["seed"] == 0 and "version" in prov
    md = d.metadata()
    assert md["format"] == "pt" and md["llmq_format"] == fmt and json.loads(md["llmq_provenance"]) == prov
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        assert (out / f).exists(), f
    assert not any(p.name.startswith(out.name + ".tmp") for p in out.parent.iterdir())
    # tensors: names, dtypes, shapes
    shapes = {"self_attn.q_proj": (D, D), "self_attn.k_proj": (192, D), "self_attn.v_proj": (192, D),
              "self_attn.o_proj": (D, D), "mlp.gate_proj": (F, D), "mlp.up_proj": (F, D), "mlp.down_proj": (D, F)}
    for lin, (N, K) in shapes.items():
        p = f"model.layers.0.{lin}"
        ng = K // group if group > 0 else 1
        qw, qz, sc = d.tensor(p + ".qweight"), d.tensor(p + ".qzeros"), d.tensor(p + ".scales")
        assert qw.dtype == qz.dtype == np.int32 and sc.dtype == np.float16
        if fmt == "awq":
            assert qw.shape == (K, N // 8) and qz.shape == (ng, N // 8) and sc.shape == (ng, N)
            assert not d.has(p + ".g_idx")
        else:
            gi = d.tensor(p + ".g_idx")
            assert qw.shape == (K * bits // 32, N) and qz.shape == (ng, N * bits // 32) and sc.shape == (ng, N)
            assert gi.dtype == np.int32 and gi.shape == (K,)
            assert np.bincount(gi, minlength=ng).tolist() == [K // ng] * ng
            assert (np.all(np.diff(gi) >= 0)) == (not act_order or group < 0)
            if sym:  # v1 stores zero - 1 = 2^(b-1) - 1 everywhere
                assert np.all(ur.gptq_unpack_cols(qz, bits) == 2 ** (bits - 1) - 1)
    for n in ["model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
              "model.layers.0.post_attention_layernorm.weight"]:
        assert d.tensor(n).dtype == np.float16
    assert not d.has("lm_head.weight")  # SmolLM2 ties the embeddings
    assert not d.has(f"model.layers.{LAYERS}.input_layernorm.weight")


def test_fake_output(exporter):
    out, ref_path, deq_path = exporter("fake", 3, 64, False)
    ref, deq = load_st(ref_path), load_st(deq_path)
    d = ur.QuantDir(out)
    assert "quantization_config" not in d.config  # a plain checkpoint: transformers loads it as is
    assert d.config["llmq"]["format"] == "fake" and d.config["torch_dtype"] == "float32"
    assert d.tensor("model.embed_tokens.weight").dtype == np.float32  # Q4_1 input: f32
    for name, w in ref.items():
        assert bits_equal(d.tensor(name), w), name
        assert bits_equal(deq[name], w), name
        assert len(np.unique(d.tensor(name)[0, :64])) <= 8  # 3 bits: at most 8 levels per group


def test_qk_permutation_undone(exporter, smollm2):
    """AWQ q/k/v weights against gguf-py's dequantization of the input, un-permuted here: RTN error <= s/2."""
    out, _, _ = exporter("awq", 4, 64, False)
    d = ur.QuantDir(out)
    r = gguf.GGUFReader(str(smollm2))
    src = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in r.tensors if t.name.startswith("blk.0.attn")}
    H, Hkv = d.config["num_attention_heads"], d.config["num_key_value_heads"]

    def unpermute(w, n_head):  # inverse of convert_hf_to_gguf.py's permute
        R, C = w.shape
        return w.reshape(n_head, R // n_head // 2, 2, C).swapaxes(1, 2).reshape(R, C)

    for gname, lin, heads in [("attn_q", "self_attn.q_proj", H), ("attn_k", "self_attn.k_proj", Hkv),
                              ("attn_v", "self_attn.v_proj", None)]:
        w = src[f"blk.0.{gname}.weight"]
        if heads:
            w = unpermute(w, heads)
        mine = d.linear(0, lin)
        s = d.scales(0, lin).T  # [N, K/G]
        bound = 0.52 * np.repeat(s, 64, axis=1) + 1e-7
        assert np.all(np.abs(mine - w) <= bound), lin
        if heads:  # and the permuted order would NOT fit: the check has teeth
            assert not np.all(np.abs(mine - src[f"blk.0.{gname}.weight"]) <= bound)


def test_eval_fake_and_awq_agree(exporter, llmq_bin, data_dir, tmp_path):
    """The full model: `llmq eval` reads both outputs; perplexities agree within fp16 scale rounding."""
    wiki = data_dir / "wikitext-2-raw" / "wiki.test.raw"
    ppl = {}
    for fmt in ["awq", "fake"]:
        out, _, _ = exporter(fmt, 4, 64, False, layers=0)
        j = tmp_path / f"{fmt}.json"
        run([llmq_bin, "eval", "--model", out, "--ppl", wiki, "--ctx", 128, "--chunks", 3, "--threads", 2,
             "--json", j])
        ppl[fmt] = json.loads(j.read_text())["ppl"]
    assert 10 < ppl["fake"] < 200
    assert ppl["awq"] == pytest.approx(ppl["fake"], rel=2e-3)


@pytest.mark.parametrize("fmt,bits", [("awq", 4), ("gptq", 3), ("fake", 4)])
def test_inspect_reads_output(exporter, llmq_bin, fmt, bits):
    out, _, _ = exporter(fmt, bits, 64, False)
    rep = json.loads(run([llmq_bin, "inspect", out, "--json"]).stdout)
    text = json.dumps(rep)
    assert "model.layers.0.self_attn.q_proj" in text
    if fmt != "fake":
        assert '"quant_method": "%s"' % fmt in text or '"quant_method":"%s"' % fmt in text
    r = run([llmq_bin, "inspect", out])
    assert "q_proj" in r.stdout


def test_refuses_existing_output_and_force(tool, smollm2, tmp_path):
    out = tmp_path / "o"
    args = [tool("export_tool"), "quantize", smollm2, out, "gptq", 8, 64, "sym", "--layers", 1]
    run(args)
    before = (out / "model.safetensors").stat().st_mtime_ns
    r = run(args, check=False)
    assert r.returncode == 1 and "exists" in r.stderr and "--force" in r.stderr
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    run(args + ["--force"])
    assert json.loads((out / "config.json").read_text())["quantization_config"]["bits"] == 8
    (tmp_path / "notmodel").mkdir()
    (tmp_path / "notmodel" / "precious.txt").write_text("keep")
    r = run([*args[:3], tmp_path / "notmodel", *args[4:], "--force"], check=False)
    assert r.returncode == 1 and (tmp_path / "notmodel" / "precious.txt").exists()


def test_abort_leaves_nothing(tool, smollm2, tmp_path):
    out = tmp_path / "aborted"
    run([tool("export_tool"), "quantize", smollm2, out, "awq", 4, 64, "asym", "--layers", 2, "--abort-at", 0])
    assert sorted(os.listdir(tmp_path)) == []


def test_refusals_name_the_problem(tool, smollm2, data_dir, tmp_path):
    stories = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"
    cases = [
        ([smollm2, "awq", 3, 64, "asym"], "4-bit"),
        ([smollm2, "gptq", 5, 64, "sym"], "2, 3, 4 or 8"),
        ([smollm2, "awq", 4, -1, "asym"], "group size"),
        ([stories, "awq", 4, 4, "asym"], "model.layers.0.mlp.gate_proj (172 x 64)"),
        ([stories, "gptq", 8, 64, "sym"], "model.layers.0.mlp.down_proj (64 x 172): in_features 172 is not a "
                                          "multiple of group size 64"),
    ]
    for args, msg in cases:
        out = tmp_path / "x"
        r = run([tool("export_tool"), "quantize", args[0], out, *args[1:], "--layers", 1], check=False)
        assert r.returncode == 1 and msg in r.stderr, (args, r.stderr)
        assert not out.exists() and os.listdir(tmp_path) == []


def test_hf_input(tool, llmq_bin, data_dir, tmp_path):
    """An HF input (stories260K converted by `llmq convert`): side files copied, no row permutation,
    8-bit GPTQ with group 4 (the 172-wide ffn fits) decoded bit for bit by unpack_ref and by llmq."""
    stories = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"
    hf = tmp_path / "hf"
    run([llmq_bin, "convert", "--model", stories, "--out", hf])
    (hf / "special_tokens_map.json").write_text('{"bos_token": "<s>"}\n')
    out, ref, deq = tmp_path / "q", tmp_path / "ref", tmp_path / "deq"
    run([tool("export_tool"), "quantize", hf, out, "gptq", 8, 4, "asym", "--ref", ref])
    run([tool("export_tool"), "dequant", out, deq])
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]:
        assert (out / f).read_bytes() == (hf / f).read_bytes(), f
    src_cfg, cfg = json.loads((hf / "config.json").read_text()), json.loads((out / "config.json").read_text())
    for k, v in src_cfg.items():
        if k != "torch_dtype":
            assert cfg[k] == v, k
    assert cfg["quantization_config"]["checkpoint_format"] == "gptq_v2" and not cfg["quantization_config"]["desc_act"]
    d, r, q = ur.QuantDir(out), load_st(ref / "model.safetensors"), load_st(deq / "model.safetensors")
    for layer in range(cfg["num_hidden_layers"]):
        for lin in ur.LINEARS:
            name = f"model.layers.{layer}.{lin}.weight"
            assert bits_equal(d.linear(layer, lin), r[name]) and bits_equal(q[name], r[name]), name
    # no permutation for an HF input: q_proj stays close to the input's own rows
    from safetensors.numpy import load_file
    w = load_file(str(hf / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"]
    s = np.repeat(d.scales(0, "self_attn.q_proj"), 4, axis=0).T  # [N, K]: group of column k is k // 4
    # RTN error <= s/2, plus |q - z| <= 255 times the fp16 rounding of s (2^-11 relative)
    assert np.all(np.abs(d.linear(0, "self_attn.q_proj") - w) <= (0.5 + 256 * 2.0 ** -11 + 0.01) * s + 1e-7)


def test_qwen2_biases(tool, llmq_bin, data_dir, tmp_path):
    """q/k/v biases (qwen2): written next to their linear as fp16 (awq, gptq) or the fake dtype, rows
    untouched (no permutation for qwen2), and read back by llmq's loader."""
    from safetensors.numpy import load_file, save_file
    stories = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"
    hf = tmp_path / "hf"
    run([llmq_bin, "convert", "--model", stories, "--out", hf])
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    (hf / "config.json").write_text(json.dumps(cfg))
    t = load_file(str(hf / "model.safetensors"))
    rng = np.random.default_rng(0)
    for layer in range(cfg["num_hidden_layers"]):
        for lin in ["q", "k", "v"]:
            rows = t[f"model.layers.{layer}.self_attn.{lin}_proj.weight"].shape[0]
            t[f"model.layers.{layer}.self_attn.{lin}_proj.bias"] = rng.standard_normal(rows).astype(np.float32)
    save_file(t, str(hf / "model.safetensors"), metadata={"format": "pt"})
    for fmt, dt in [("gptq", np.float16), ("fake", np.float32)]:
        out, ref, deq = tmp_path / fmt, tmp_path / (fmt + ".ref"), tmp_path / (fmt + ".deq")
        run([tool("export_tool"), "quantize", hf, out, fmt, 8, 4, "sym", "--ref", ref])
        run([tool("export_tool"), "dequant", out, deq])  # the loader accepts the biases
        d = ur.QuantDir(out)
        assert d.config["model_type"] == "qwen2"
        r = load_st(ref / "model.safetensors")
        for layer in range(cfg["num_hidden_layers"]):
            for lin in ["q", "k", "v"]:
                name = f"model.layers.{layer}.self_attn.{lin}_proj.bias"
                b = d.tensor(name)
                assert b.dtype == dt and np.array_equal(b, t[name].astype(dt)), name
            assert bits_equal(d.linear(layer, "self_attn.q_proj"), r[f"model.layers.{layer}.self_attn.q_proj.weight"])
    rep = json.loads(run([llmq_bin, "eval", "--model", tmp_path / "gptq", "--ppl", data_dir / "wikitext-2-raw" /
                          "wiki.test.raw", "--ctx", 64, "--chunks", 1, "--threads", 1, "--json", tmp_path / "e.json"])
                     and (tmp_path / "e.json").read_text())
    assert rep["ppl"] > 1
