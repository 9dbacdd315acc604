"""Oracle for `llmq convert` (formats/convert/convert.h) against independent implementations.

  gguf-py (PyPI gguf)       reads every GGUF llmq writes; gguf.quants.dequantize is the reference for
                            SmolLM2 Q4_1 -> f32 (bit for bit), gguf.quants.quantize(BF16) and numpy's
                            astype(float16) for the f16 / bf16 outputs.
  safetensors (PyPI)        reads the Hugging Face directories; the q/k rows checked with llama.cpp's
                            convert_hf_to_gguf.py permute (written here in numpy) applied to them.
  tokenizers (PyPI)         loads the rebuilt tokenizer.json; its ids on all of wiki.test.raw must be
                            llama.cpp's (tests/golden/convert_tokenize.json, made by
                            gen_golden_convert.py with llama-cpp-python; checked live when llama_cpp
                            imports), and so must llmq's own tokenizer loading the HF directory.
Round trips: GGUF -> HF -> GGUF at f32 reproduces every tensor byte and the tokenizer arrays for
SmolLM2 (after Q4_1 -> f32) and stories260K. Plus: sharding, refusing an existing output, corrupt
inputs that leave nothing behind, CLI usage errors.
"""
import functools
import hashlib
import json
import shutil

import numpy as np
import pytest
import gguf
from gguf import GGUFReader, GGMLQuantizationType as T

from conftest import run
import gen_golden_convert as gc

try:
    import tokenizers
    HAVE_TOKENIZERS = True
except ImportError:
    HAVE_TOKENIZERS = False
try:
    import llama_cpp  # noqa: F401
    HAVE_LLAMA_CPP = True
except ImportError:
    HAVE_LLAMA_CPP = False

TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                    "tokenizer.ggml.scores")


def convert(llmq_bin, src, dst, *flags, check=True):
    return run([llmq_bin, "convert", "--model", src, "--out", dst, "--quiet", *flags], check=check)


# ---- fixtures: every conversion once per module ---------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="module")
def smol_f32(llmq_bin, smollm2, work):
    p = work / "smollm2-f32.gguf"
    r = convert(llmq_bin, smollm2, p, "--to", "gguf")
    print(r.stdout.strip())
    return p


@pytest.fixture(scope="module")
def smol_hf(llmq_bin, smol_f32, work):
    p = work / "smollm2-hf"
    print(convert(llmq_bin, smol_f32, p).stdout.strip())
    return p


@pytest.fixture(scope="module")
def smol_back(llmq_bin, smol_hf, work):
    p = work / "smollm2-back.gguf"
    print(convert(llmq_bin, smol_hf, p).stdout.strip())
    return p


@pytest.fixture(scope="module")
def stories_hf(llmq_bin, stories_v3, work):
    p = work / "stories-hf"
    convert(llmq_bin, stories_v3, p)
    return p


@pytest.fixture(scope="module")
def stories_back(llmq_bin, stories_hf, work):
    p = work / "stories-back.gguf"
    convert(llmq_bin, stories_hf, p)
    return p


# ---- helpers -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def reader(path):
    """One GGUFReader per file (opening SmolLM2 costs gguf-py seconds: it parses 98k strings)."""
    return GGUFReader(str(path))


def dequant(t):
    """gguf-py's f32 values of a GGUF tensor, outermost-first shape."""
    shape = [int(x) for x in reversed(t.shape.tolist())]
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)


def permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF q/k rows -> GGUF rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(name):
    table = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if name in table:
        return table[name]
    blk = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
           "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    _, layer, part, kind = name.split(".")
    return f"model.layers.{layer}.{blk[part]}.{kind}"


def field_value(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def array_bytes(reader, key):
    """The elements of an array KV as raw bytes (strings as bytes), None when absent."""
    f = reader.fields.get(key)
    if f is None:
        return None
    return [bytes(f.parts[i]) for i in f.data]


def bf16_bits(x):
    return np.asarray(gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), T.BF16)).view(np.uint16)


def ids_digest(ids):
    d = gc.digest(ids)
    return {k: d[k] for k in ("n_tokens", "sha256", "first", "last")}


@pytest.fixture(scope="module")
def smol_ref(smollm2):
    """gguf-py's f32 values of every SmolLM2 Q4_1 tensor (computed once: the slow part)."""
    return {t.name: dequant(t) for t in reader(smollm2).tensors}


def read_safetensors(path):
    """{name: array} of one .safetensors file, parsed here (numpy has no bfloat16, so BF16 comes back
    as its raw uint16 words), plus the __metadata__."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    np_dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(raw, dtype=np_dtype[e["dtype"]], count=(end - b) // np.dtype(np_dtype[e["dtype"]]).itemsize,
                                  offset=8 + n + b).reshape(e["shape"])
    return out, meta


@pytest.fixture(scope="module")
def golden(data_dir, smollm2, stories_v3):
    g = json.loads(gc.GOLDEN.read_text())
    for name, path in (("smollm2", smollm2), ("stories260k", stories_v3)):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == g["models"][name]["gguf_sha256"], \
            f"{path} is not the file {gc.GOLDEN} was made from"
    return g


@pytest.fixture(scope="module")
def wiki_text(data_dir):
    return (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")


# ---- GGUF -> GGUF ----------------------------------------------------------------------------------

def test_q4_1_to_f32_equals_gguf_py(smollm2, smol_f32, smol_ref):
    src, out = reader(smollm2), reader(smol_f32)
    assert [t.name for t in src.tensors] == [t.name for t in out.tensors]
    for a, b in zip(src.tensors, out.tensors):
        assert b.tensor_type == T.F32, b.name
        want, got = smol_ref[a.name], dequant(b)
        assert want.shape == got.shape, a.name
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), f"{a.name} differs from gguf-py"
    # every KV copied in order, file_type ALL_F32, quantization_version gone
    keys_in = [k for k in src.fields if not k.startswith("GGUF.")]
    keys_out = [k for k in out.fields if not k.startswith("GGUF.")]
    assert keys_out == [k for k in keys_in if k != "general.quantization_version"]
    assert field_value(out, "general.file_type") == 0
    for k in keys_out:
        if k != "general.file_type":
            assert field_value(out, k) == field_value(src, k), k


@pytest.mark.parametrize("dtype, file_type", [("f16", 1), ("bf16", 32)])
def test_gguf_half_types(llmq_bin, smollm2, smol_ref, work, dtype, file_type):
    p = work / f"smollm2-{dtype}.gguf"
    convert(llmq_bin, smollm2, p, "--to", "gguf", "--dtype", dtype)
    src, out = reader(smollm2), reader(p)
    assert field_value(out, "general.file_type") == file_type
    for a, b in zip(src.tensors, out.tensors):
        x = smol_ref[a.name]
        if x.ndim == 1:  # norms stay f32 as llama.cpp keeps them
            assert b.tensor_type == T.F32 and np.array_equal(dequant(b).view(np.uint32), x.view(np.uint32)), a.name
            continue
        got = np.asarray(b.data).view(np.uint16).reshape(x.shape)
        want = x.astype(np.float16).view(np.uint16) if dtype == "f16" else bf16_bits(x).reshape(x.shape)
        assert b.tensor_type == (T.F16 if dtype == "f16" else T.BF16), a.name
        assert np.array_equal(got, want), f"{a.name}: {np.count_nonzero(got != want)} values differ"


# ---- GGUF -> HF -> GGUF -------------------------------------------------------------------------

def check_round_trip(src_path, back_path):
    src, back = reader(src_path), reader(back_path)
    a = {t.name: t for t in src.tensors}
    b = {t.name: t for t in back.tensors}
    assert sorted(a) == sorted(b)
    for name, t in a.items():
        assert t.tensor_type == T.F32 and b[name].tensor_type == T.F32, name
        assert list(t.shape) == list(b[name].shape), name
        assert np.array_equal(np.asarray(t.data).view(np.uint32), np.asarray(b[name].data).view(np.uint32)), \
            f"tensor {name} differs"
    for key in TOKENIZER_ARRAYS:
        assert array_bytes(back, key) == array_bytes(src, key), key
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.chat_template"):
        assert field_value(back, key) == field_value(src, key), key
    arch = field_value(src, "general.architecture")
    for k in src.fields:
        if k.startswith(arch + ".") and k != f"{arch}.tensor_data_layout":
            assert field_value(back, k) == field_value(src, k), k
    return src, back


def test_round_trip_smollm2(smol_f32, smol_back):
    src, back = check_round_trip(smol_f32, smol_back)
    assert field_value(back, "tokenizer.ggml.pre") == "smollm"
    assert field_value(back, "tokenizer.ggml.add_bos_token") is False


def test_round_trip_stories(stories_v3, stories_back):
    src, back = check_round_trip(stories_v3, stories_back)
    assert array_bytes(back, "tokenizer.ggml.scores") is not None
    assert field_value(back, "tokenizer.ggml.add_bos_token") is True  # llama.cpp's SPM default, now explicit


def test_sharded_round_trip(llmq_bin, stories_v3, work):
    hf, back = work / "stories-sharded", work / "stories-sharded.gguf"
    convert(llmq_bin, stories_v3, hf, "--max-shard-size", "200KB")
    shards = sorted(hf.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (hf / "model.safetensors.index.json").exists()
    assert not (hf / "model.safetensors").exists()
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert {v for v in index["weight_map"].values()} == {s.name for s in shards}
    convert(llmq_bin, hf, back)
    check_round_trip(stories_v3, back)


# ---- the HF directory --------------------------------------------------------------------------------

def check_hf_weights(gguf_path, hf_dir, dtype, ref=None):
    from safetensors import safe_open
    src = reader(gguf_path)
    cfg = json.loads((hf_dir / "config.json").read_text())
    n_head, n_head_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    got = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        tensors, meta = read_safetensors(f)
        assert meta == {"format": "pt"}
        got.update(tensors)
        with safe_open(str(f), framework="np") as h:  # the reference reader accepts the file
            assert h.metadata() == {"format": "pt"} and sorted(h.keys()) == sorted(tensors)
            if dtype != "bf16":
                for k in h.keys():
                    assert np.array_equal(h.get_tensor(k), tensors[k]), k
    want_names = {hf_name(t.name) for t in src.tensors if t.name != "rope_freqs.weight"}
    assert set(got) == want_names
    for t in src.tensors:
        x, y = (ref[t.name] if ref else dequant(t)), got[hf_name(t.name)]
        if ".attn_q." in t.name:
            y = permute(y, n_head)
        elif ".attn_k." in t.name:
            y = permute(y, n_head_kv)
        if dtype == "f32":
            assert y.dtype == np.float32 and np.array_equal(x.view(np.uint32), y.view(np.uint32)), t.name
        elif dtype == "f16":
            assert y.dtype == np.float16 and np.array_equal(x.astype(np.float16).view(np.uint16), y.view(np.uint16)), t.name
        else:  # numpy has no bfloat16: safetensors hands out the raw 16-bit words
            assert np.array_equal(bf16_bits(x).reshape(x.shape), y.view(np.uint16)), t.name
    return cfg


def test_hf_config_and_weights_smollm2(smol_f32, smol_hf):
    cfg = check_hf_weights(smol_f32, smol_hf, "f32")
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (576, 1536, 30)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 100000.0 and cfg["rope_scaling"] is None
    assert cfg["max_position_embeddings"] == 8192 and cfg["torch_dtype"] == "float32"
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    tc = json.loads((smol_hf / "tokenizer_config.json").read_text())
    assert tc["bos_token"] == "<|im_start|>" and tc["eos_token"] == "<|im_end|>"
    assert tc["chat_template"] == field_value(reader(smol_f32), "tokenizer.chat_template")


def test_hf_bf16_from_q4_1(llmq_bin, smollm2, smol_ref, work):
    """Q4_1 straight to HF: dequantized, un-permuted and rounded in one pass."""
    hf = work / "smollm2-hf-bf16"
    convert(llmq_bin, smollm2, hf, "--dtype", "bf16")
    cfg = check_hf_weights(smollm2, hf, "bf16", smol_ref)
    assert cfg["torch_dtype"] == "bfloat16"


def test_hf_f16_stories(llmq_bin, stories_v3, work):
    hf = work / "stories-hf-f16"
    convert(llmq_bin, stories_v3, hf, "--dtype", "f16")
    assert check_hf_weights(stories_v3, hf, "f16")["torch_dtype"] == "float16"


def test_hf_weights_stories(stories_v3, stories_hf):
    cfg = check_hf_weights(stories_v3, stories_hf, "f32")
    assert cfg["tie_word_embeddings"] is False and (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (8, 4)


# ---- tokenization of the HF directory -----------------------------------------------------------------

MODELS = ["smollm2", "stories260k"]


@pytest.fixture(scope="module")
def hf_dirs(smol_hf, stories_hf):
    return {"smollm2": smol_hf, "stories260k": stories_hf}


@pytest.mark.skipif(not HAVE_TOKENIZERS, reason="the tokenizers package is not importable")
@pytest.mark.parametrize("name", MODELS)
def test_tokenizers_library_matches_llama_cpp(name, hf_dirs, golden, wiki_text):
    tok = tokenizers.Tokenizer.from_file(str(hf_dirs[name] / "tokenizer.json"))
    ids = tok.encode(wiki_text, add_special_tokens=False).ids
    want = {k: golden["models"][name][k] for k in ("n_tokens", "sha256", "first", "last")}
    assert ids_digest(ids) == want
    # BOS as the GGUF says: stories260K (SPM default) adds it, SmolLM2 (add_bos_token false) does not
    with_special = tok.encode("Hello world", add_special_tokens=True).ids
    assert (with_special[0] == 1) == (name == "stories260k")


@pytest.mark.parametrize("name", MODELS)
def test_llmq_tokenizer_on_hf_dir(name, hf_dirs, golden, tool, data_dir):
    r = run([tool("tokenize_tool"), hf_dirs[name], data_dir / "wikitext-2-raw" / "wiki.test.raw", "--no-special"])
    ids = [int(x) for x in r.stdout.split()]
    want = {k: golden["models"][name][k] for k in ("n_tokens", "sha256", "first", "last")}
    assert ids_digest(ids) == want


@pytest.mark.skipif(not (HAVE_LLAMA_CPP and HAVE_TOKENIZERS), reason="llama_cpp or tokenizers not importable")
def test_tokenizers_library_live_llama_cpp(hf_dirs, smollm2, stories_v3, wiki_text):
    sample = wiki_text[:200000]
    for name, path in (("smollm2", smollm2), ("stories260k", stories_v3)):
        tok = tokenizers.Tokenizer.from_file(str(hf_dirs[name] / "tokenizer.json"))
        assert tok.encode(sample, add_special_tokens=False).ids == gc.llama_cpp_ids(path, sample), name


def test_hf_tokenizer_json_variants(llmq_bin, stories_v3, stories_hf, tmp_path, wiki_text):
    """The other spellings of the same tokenizer that HF directories use read back identically:
    Metaspace (prepend_scheme first, no split) instead of the Prepend + Replace normalizer, BOS only
    in the post-processor (no add_bos_token in tokenizer_config.json), merges as [a, b] pairs."""
    d = tmp_path / "variant"
    shutil.copytree(stories_hf, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["normalizer"] = None
    tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    tj["model"]["merges"] = [m.split(" ") for m in tj["model"]["merges"]]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    del tc["add_bos_token"], tc["add_eos_token"]
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    out = tmp_path / "variant.gguf"
    convert(llmq_bin, d, out)
    src, back = reader(stories_v3), GGUFReader(str(out))
    for key in TOKENIZER_ARRAYS:
        assert array_bytes(back, key) == array_bytes(src, key), key
    assert field_value(back, "tokenizer.ggml.add_bos_token") is True
    assert field_value(back, "tokenizer.ggml.add_space_prefix") is True
    # (The two spellings are not the same tokenizer everywhere: Metaspace does not prepend "\u2581" to a
    # text that already starts with a space, llama.cpp and the Prepend normalizer always do — which is
    # why llmq writes the Prepend form.)


# ---- refusals and corrupt inputs ------------------------------------------------------------------------

def leftovers(d):
    return sorted(p.name for p in d.iterdir() if ".tmp." in p.name or ".old." in p.name)


def test_refuses_existing_output(llmq_bin, stories_v3, tmp_path):
    out = tmp_path / "hf"
    convert(llmq_bin, stories_v3, out)
    r = convert(llmq_bin, stories_v3, out, check=False)
    assert r.returncode == 1 and "--force" in r.stderr and str(out) in r.stderr
    before = (out / "config.json").stat().st_mtime_ns
    r = convert(llmq_bin, stories_v3, out, "--force", "--dtype", "f16")
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    assert (out / "config.json").stat().st_mtime_ns >= before
    gg = tmp_path / "x.gguf"
    gg.write_bytes(b"not a model")
    r = convert(llmq_bin, stories_v3, gg, "--to", "gguf", check=False)
    assert r.returncode == 1 and gg.read_bytes() == b"not a model"
    convert(llmq_bin, stories_v3, gg, "--to", "gguf", "--force")
    assert GGUFReader(str(gg)).tensors  # not cached: the file was replaced
    assert leftovers(tmp_path) == []


def test_corrupt_gguf_writes_nothing(llmq_bin, stories_v3, tmp_path):
    bad = tmp_path / "truncated.gguf"
    data = stories_v3.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    for to in ("hf", "gguf"):
        out = tmp_path / f"out-{to}"
        r = convert(llmq_bin, bad, out, "--to", to, check=False)
        assert r.returncode == 1
        assert str(bad) in r.stderr and "past the end of the file" in r.stderr, r.stderr
        assert not out.exists()
    assert leftovers(tmp_path) == []


def test_corrupt_hf_writes_nothing(llmq_bin, stories_hf, tmp_path):
    cases = {
        "config.json": (b'{"model_type": "llama", "hidden_size": ', "config.json"),
        "tokenizer.json": (b'{"model": {"type": "Unigram", "vocab": []}}', "Unigram"),
        "model.safetensors": (None, "past the end of the data section"),
    }
    for fname, (content, needle) in cases.items():
        d = tmp_path / f"bad-{fname}"
        shutil.copytree(stories_hf, d)
        if content is None:  # truncated weights
            p = d / fname
            p.write_bytes(p.read_bytes()[:-1000])
        else:
            (d / fname).write_bytes(content)
        out = tmp_path / f"out-{fname}.gguf"
        r = convert(llmq_bin, d, out, check=False)
        assert r.returncode == 1 and needle in r.stderr, r.stderr
        assert not out.exists()
    # weights that do not match the architecture: an unknown tensor, a missing one, a wrong shape
    from safetensors.numpy import load_file, save_file
    base = load_file(str(stories_hf / "model.safetensors"))
    edits = {
        "extra": ({**base, "model.layers.0.mlp.extra.weight": np.zeros((2, 2), np.float32)},
                  "model.layers.0.mlp.extra.weight has no GGUF name"),
        "missing": ({k: v for k, v in base.items() if k != "model.layers.4.mlp.up_proj.weight"},
                    "missing tensor model.layers.4.mlp.up_proj.weight"),
        "shape": ({**base, "model.norm.weight": np.zeros(63, np.float32)}, "model.norm.weight has shape [63]"),
    }
    for name, (tensors, needle) in edits.items():
        d = tmp_path / f"bad-{name}"
        shutil.copytree(stories_hf, d)
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
        out = tmp_path / f"out-{name}.gguf"
        r = convert(llmq_bin, d, out, check=False)
        assert r.returncode == 1 and needle in r.stderr, r.stderr
        assert not out.exists()
    assert leftovers(tmp_path) == []


def test_cli_usage(llmq_bin, stories_v3, tmp_path):
    r = run([llmq_bin, "convert", "--help"])
    for flag in ("--model", "--out", "--to", "--dtype", "--max-shard-size", "--force"):
        assert flag in r.stdout
    assert "(default: 5GB)" in r.stdout and "(default: f32)" in r.stdout
    for bad in (["--dtype", "q4_0"], ["--to", "onnx"], ["--max-shard-size", "lots"], ["--bogus"]):
        r = run([llmq_bin, "convert", "--model", stories_v3, "--out", tmp_path / "o", *bad], check=False)
        assert r.returncode == 2, bad
    r = run([llmq_bin, "convert", "--out", tmp_path / "o"], check=False)
    assert r.returncode == 2 and "--model" in r.stderr
