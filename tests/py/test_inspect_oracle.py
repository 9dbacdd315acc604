"""`llmq inspect --json` against the gguf package's GGUFReader (an independent GGUF parser).

For SmolLM2-135M-Instruct (Q4_1) and stories260K (v3; the v1 original is compared with its v3
twin, which gguf can read and which holds the same keys and tensors), every metadata key, its type,
every value (full arrays), every tensor's name, type, shape, byte size and offset, and the totals
must agree.
"""
import json
import math

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from conftest import run

TYPE_NAMES = {
    GGUFValueType.UINT8: "u8", GGUFValueType.INT8: "i8", GGUFValueType.UINT16: "u16",
    GGUFValueType.INT16: "i16", GGUFValueType.UINT32: "u32", GGUFValueType.INT32: "i32",
    GGUFValueType.FLOAT32: "f32", GGUFValueType.BOOL: "bool", GGUFValueType.STRING: "string",
    GGUFValueType.ARRAY: "array", GGUFValueType.UINT64: "u64", GGUFValueType.INT64: "i64",
    GGUFValueType.FLOAT64: "f64",
}


def inspect_json(llmq_bin, path, *extra):
    r = run([llmq_bin, "inspect", path, "--json", *extra])
    return json.loads(r.stdout)


def same_scalar(got, want):
    if isinstance(want, float):
        return got == want or (math.isnan(want) and got == "nan")
    if isinstance(want, bytes):
        want = want.decode("utf-8", errors="replace")
    return got == want


def check_against_gguf(rep, reader, check_offsets=True):
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    meta = rep["metadata"]
    assert list(meta.keys()) == list(fields.keys())
    for key, f in fields.items():
        m = meta[key]
        assert m["type"] == TYPE_NAMES[f.types[0]], key
        want = f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            assert m["element_type"] == TYPE_NAMES[f.types[-1]], key
            assert m["count"] == len(want), key
            assert len(m["values"]) == len(want), key
            bad = [i for i, (g, w) in enumerate(zip(m["values"], want)) if not same_scalar(g, w)]
            assert not bad, f"{key}: first mismatch at [{bad[0]}]: {m['values'][bad[0]]!r} vs {want[bad[0]]!r}"
        else:
            assert same_scalar(m["value"], want), f"{key}: {m['value']!r} vs {want!r}"

    ts = rep["tensors"]
    assert len(ts) == len(reader.tensors)
    for got, t in zip(ts, reader.tensors):
        assert got["name"] == t.name
        assert got["dtype"] == t.tensor_type.name, t.name
        assert got["shape"] == [int(d) for d in reversed(t.shape.tolist())], t.name
        assert got["ne"] == [int(d) for d in t.shape.tolist()], t.name
        assert got["elements"] == int(t.n_elements), t.name
        assert got["bytes"] == int(t.n_bytes), t.name
        if check_offsets:
            assert got["offset"] == int(t.data_offset), t.name
    assert rep["n_tensors"] == len(reader.tensors)
    assert rep["n_params"] == sum(int(t.n_elements) for t in reader.tensors)
    assert rep["n_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    assert rep["bits_per_weight"] == pytest.approx(8 * rep["n_bytes"] / rep["n_params"])
    arch = fields["general.architecture"].contents()
    assert rep["architecture"] == arch
    for key, f in fields.items():
        if key.startswith(arch + ".") and f.types[0] != GGUFValueType.ARRAY:
            assert key[len(arch) + 1:] in rep["hyperparameters"]


def test_inspect_smollm2(llmq_bin, smollm2):
    rep = inspect_json(llmq_bin, smollm2, "--max-array", "-1")
    reader = GGUFReader(smollm2)
    assert rep["format"] == "gguf" and rep["gguf_version"] == 3
    assert rep["file_bytes"] == smollm2.stat().st_size
    check_against_gguf(rep, reader)
    hp = rep["hyperparameters"]
    assert (hp["embedding_length"], hp["block_count"], hp["vocab_size"]) == (576, 30, 49152)


def test_inspect_stories_v3(llmq_bin, stories_v3):
    rep = inspect_json(llmq_bin, stories_v3, "--max-array", "-1")
    check_against_gguf(rep, GGUFReader(stories_v3))
    # SOURCES.md: 260,032 parameters with the classifier tied to the embedding; the GGUF stores
    # output.weight as its own 512 x 64 copy
    assert rep["n_params"] == 260032 + 512 * 64


def test_inspect_stories_v1_matches_v3(llmq_bin, stories_v1, stories_v3):
    rep = inspect_json(llmq_bin, stories_v1, "--max-array", "-1")
    assert rep["gguf_version"] == 1
    # the v1 file has other data offsets; everything else equals gguf's reading of the v3 twin
    check_against_gguf(rep, GGUFReader(stories_v3), check_offsets=False)


def test_inspect_default_truncates_arrays(llmq_bin, smollm2):
    rep = inspect_json(llmq_bin, smollm2)
    toks = rep["metadata"]["tokenizer.ggml.tokens"]
    assert toks["count"] == 49152 and len(toks["values"]) == 8


def test_inspect_text_mode(llmq_bin, smollm2):
    out = run([llmq_bin, "inspect", smollm2]).stdout
    assert "architecture:  llama" in out
    assert "token_embd.weight" in out and "Q8_0" in out
    assert "272 tensors" in out and "bits per weight" in out


def test_inspect_safetensors_dir(llmq_bin, tmp_path):
    from safetensors.numpy import save_file
    w = {"model.embed_tokens.weight": np.arange(12, dtype=np.float32).reshape(4, 3),
         "model.norm.weight": np.ones(3, dtype=np.float16)}
    save_file(w, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3}))
    rep = inspect_json(llmq_bin, tmp_path)
    assert rep["format"] == "hf" and rep["architecture"] == "LlamaForCausalLM"
    assert rep["hyperparameters"]["hidden_size"] == 3
    assert rep["metadata"]["format"]["value"] == "pt"
    got = {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in rep["tensors"]}
    assert got == {"model.embed_tokens.weight": ("F32", [4, 3], 48), "model.norm.weight": ("F16", [3], 6)}
    assert rep["n_params"] == 15 and rep["n_bytes"] == 54


@pytest.mark.parametrize("content,needle", [
    (b"", "truncated"), (b"GGUF\x07\x00\x00\x00", "version"), (b"\x10\x00\x00\x00\x00\x00\x00\x00{}", "past the end")])
def test_inspect_bad_files_exit_nonzero(llmq_bin, tmp_path, content, needle):
    p = tmp_path / "bad.bin"
    p.write_bytes(content)
    r = run([llmq_bin, "inspect", p], check=False)
    assert r.returncode == 1
    assert str(p) in r.stderr and needle in r.stderr.replace(str(p), "").lower()


def test_inspect_usage_errors(llmq_bin, tmp_path):
    r = run([llmq_bin, "inspect", tmp_path / "missing.gguf"], check=False)
    assert r.returncode == 1 and "missing.gguf" in r.stderr
    r = run([llmq_bin, "inspect", "--bogus", "x"], check=False)
    assert r.returncode == 2 and "--bogus" in r.stderr
    r = run([llmq_bin, "inspect"], check=False)
    assert r.returncode == 2
    r = run([llmq_bin, "inspect", tmp_path], check=False)  # a directory without config.json
    assert r.returncode == 1 and "config.json" in r.stderr
    r = run([llmq_bin, "inspect", "--help"])
    assert "--max-array N" in r.stdout and "default: 8" in r.stdout and "--json" in r.stdout


def _st_file(header: dict, data: bytes, pad_header: bytes = b"") -> bytes:
    h = json.dumps(header).encode() + pad_header
    return len(h).to_bytes(8, "little") + h + data


CORRUPT_CASES = {
    # name: (bytes, expected words in the message)
    "gguf_bad_magic": (b"GGUX" + b"\x00" * 28, "magic"),
    "gguf_truncated_header": (b"GGUF\x03\x00\x00\x00\x01\x00\x00\x00", "truncated"),
    "gguf_huge_kv_count": (b"GGUF\x03\x00\x00\x00" + (0).to_bytes(8, "little") + (2**62).to_bytes(8, "little"),
                           "n_kv"),
    "st_header_too_big": ((200_000_000).to_bytes(8, "little") + b"{}", "100"),
    "st_not_json": ((4).to_bytes(8, "little") + b"{x:1", "json"),
    "st_offsets_past_end": (_st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4),
                            "past the end"),
    "st_size_mismatch": (_st_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8), "size mismatch"),
    "st_overlap": (_st_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                             "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "overlaps"),
    "st_unknown_dtype": (_st_file({"a": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "f8_e4m3"),
    "st_negative_dim": (_st_file({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b""), "non-negative"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT_CASES))
def test_inspect_corrupt_files(llmq_bin, tmp_path, name):
    content, word = CORRUPT_CASES[name]
    p = tmp_path / f"{name}.{'gguf' if name.startswith('gguf') else 'safetensors'}"
    p.write_bytes(content)
    r = run([llmq_bin, "inspect", p], check=False)
    assert r.returncode == 1, r.stdout
    assert r.stdout == ""
    assert str(p) in r.stderr, r.stderr
    assert word in r.stderr.replace(str(p), "").lower(), r.stderr  # the problem, not just the file name
    assert p.read_bytes() == content  # the input is never modified


def test_inspect_truncated_real_gguf(llmq_bin, tmp_path, smollm2):
    # cut the real model in the middle of its tensor data: the header parses, a tensor runs past the end
    data = smollm2.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[: len(data) // 2])
    r = run([llmq_bin, "inspect", p], check=False)
    assert r.returncode == 1 and str(p) in r.stderr
    assert "past the end" in r.stderr.replace(str(p), ""), r.stderr


@pytest.mark.parametrize("fmt,bits", [("gptq", 4), ("gptq", 3), ("awq", 4)])
def test_inspect_packed_dirs_count_logical_params(llmq_bin, smollm2, tmp_path, fmt, bits):
    """A GPTQ / AWQ directory's parameters are the source model's: qweight int32 holds 32/bits codes per
    element (GPTQ packs the input, AWQ the output dimension), qzeros / scales / g_idx are metadata; bits per
    weight = 8 x every byte / parameters."""
    out = tmp_path / "q"
    run([llmq_bin, "quantize", "--model", smollm2, "--method", "rtn", "--bits", bits, "--group-size", "64",
         "--format", fmt, "--out", out, "--threads", "2", "--quiet", "--allow-requantize"])  # the input is Q4_1
    src = inspect_json(llmq_bin, smollm2)
    rep = inspect_json(llmq_bin, out)
    assert rep["packed_bits"] == bits
    assert rep["n_params"] == src["n_params"] == 134515008
    assert rep["n_elements"] == sum(t["elements"] for t in rep["tensors"]) < rep["n_params"]
    assert rep["bits_per_weight"] == pytest.approx(8 * rep["n_bytes"] / rep["n_params"])
    assert rep["bits_per_weight"] < 8  # 21 when the packed int32s counted as parameters
    per = {t["name"]: t for t in rep["tensors"]}
    q = per["model.layers.0.mlp.down_proj.qweight"]
    assert q["params"] == 576 * 1536 and q["elements"] * 32 // bits == 576 * 1536
    for meta in ("qzeros", "scales"):
        assert per[f"model.layers.0.mlp.down_proj.{meta}"]["params"] == 0
    text = run([llmq_bin, "inspect", out]).stdout
    assert f"134515008 parameters ({rep['n_elements']} stored elements: {bits}-bit codes packed in int32)" in text
