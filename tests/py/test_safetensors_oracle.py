"""formats/safetensors against the reference implementation (the `safetensors` PyPI package).

Both directions:
  * llmq writes (tests/tools/st_write_demo, single file and sharded) and safetensors reads: every
    tensor's dtype, shape, values and raw bytes, the metadata, the header layout and the index.
  * safetensors writes (save_file / serialize_file, plus a hand-made HF-style index) and llmq reads
    (tests/tools/st_dump): dtype, shape, byte size, FNV-1a checksum and raw bytes of every tensor.
  * corrupt files: whatever the reference rejects, llmq rejects too, with the documented status.
"""
import json
import pathlib
import struct
import subprocess

import numpy as np
import pytest
import safetensors
from safetensors import safe_open
from safetensors.numpy import save_file

from conftest import run

# ------------------------------------------------ the demo set (st_write_demo.c, tests/tensor_specs.h) ----
# name, safetensors dtype, shape — in declared order; values: v = (i*37 + k*11) % 97 - 48.
DEMO = [
    ("model.embed_tokens.weight", "F32", [7, 5]),
    ("f64", "F64", [3]),
    ("f16", "F16", [2, 3, 4]),
    ("bf16", "BF16", [4, 4]),
    ("i64", "I64", [5]),
    ("i32", "I32", [1, 1, 1, 3]),
    ("scalar", "F32", []),
    ("i16", "I16", [6]),
    ("empty", "F16", [0, 4]),
    ("i8", "I8", [9]),
    ("u8", "U8", [10]),
    ("empty2", "I64", [0]),
    ("bool", "BOOL", [11]),
    ("na\u00efve.\u00fc", "U8", [2]),
    ("layers.0.na\u00efve \u2713", "BF16", [2]),
    ("big", "F32", [64, 33]),
]
DEMO_META = {"format": "pt", "llmq.demo": "h\u00e9llo \u2713"}
NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
      "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def demo_values(k, dtype, shape):
    """The expected tensor k as a numpy array (BF16 as float32, exactly representable)."""
    n = int(np.prod(shape, dtype=np.int64))
    v = (np.arange(n, dtype=np.int64) * 37 + k * 11) % 97 - 48
    if dtype in ("F64", "F32", "F16", "BF16"):
        a = v.astype(np.float64) * 0.5
    else:
        a = {"I64": v * 1000000007, "I32": v * 100003, "I16": v * 300, "I8": v, "U8": v + 148,
             "BOOL": v > 0}[dtype]
    if dtype == "BF16":
        return a.astype(np.float32).reshape(shape)
    return a.astype(NP[dtype]).reshape(shape)


def raw_bytes(dtype, arr):
    """Little-endian bytes of arr stored as dtype (BF16: the top half of each float32)."""
    if dtype == "BF16":
        bits = np.ascontiguousarray(arr, dtype="<f4").view("<u4")
        assert not np.any(bits & 0xFFFF), "demo values must be exact in bf16"
        return (bits >> 16).astype("<u2").tobytes()
    return np.ascontiguousarray(arr).astype(np.dtype(NP[dtype]).newbyteorder("<")).tobytes()


def read_header(path):
    b = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", b[:8])
    text = b[8:8 + n].decode("utf-8")
    return n, text, json.loads(text, object_pairs_hook=lambda kv: dict(kv))


def check_demo_tensors(files_of, total_files):
    """files_of: name -> file; checks every demo tensor through safe_open and deserialize."""
    raw = {}
    for f in set(files_of.values()):
        raw.update({name: info for name, info in safetensors.deserialize(pathlib.Path(f).read_bytes())})
    assert set(raw) == {d[0] for d in DEMO}
    for k, (name, dtype, shape) in enumerate(DEMO):
        want = demo_values(k, dtype, shape)
        info = raw[name]
        assert info["dtype"] == dtype and list(info["shape"]) == shape, name
        assert bytes(info["data"]) == raw_bytes(dtype, want), name
        if dtype == "BF16":  # numpy has no bfloat16: decode the bits by hand
            got = (np.frombuffer(bytes(info["data"]), dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            np.testing.assert_array_equal(got.reshape(shape), want)
            continue
        with safe_open(files_of[name], framework="numpy") as f:
            got = f.get_tensor(name)
            assert f.metadata() == DEMO_META
        assert got.dtype == want.dtype and list(got.shape) == shape, name
        np.testing.assert_array_equal(got, want)
    assert len(set(files_of.values())) == total_files


def check_header_layout(path, names):
    n, text, hdr = read_header(path)
    assert n % 8 == 0, "data section must start at a multiple of 8"
    body = text.rstrip(" ")  # padding: spaces only, after the closing brace
    assert text.startswith("{") and body.endswith("}") and len(text) - len(body) < 8
    assert hdr.pop("__metadata__") == DEMO_META
    assert list(hdr) == names, "tensors keep declared order in the header"
    offs = [hdr[x]["data_offsets"] for x in names]
    assert offs[0][0] == 0 and all(a[1] == b[0] for a, b in zip(offs, offs[1:])), "declared order in the data"


def test_demo_single(tool, tmp_path):
    run([tool("st_write_demo"), tmp_path, 0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    f = str(tmp_path / "model.safetensors")
    check_demo_tensors({d[0]: f for d in DEMO}, 1)
    check_header_layout(f, [d[0] for d in DEMO])


def test_demo_sharded(tool, tmp_path):
    run([tool("st_write_demo"), tmp_path, 256])
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".safetensors")
    n = len(shards)
    assert n >= 3
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    wmap = index["weight_map"]
    assert list(wmap) == [d[0] for d in DEMO]
    total = sum(int(np.prod(s, dtype=np.int64)) * ITEMSIZE[t] for _, t, s in DEMO)
    assert index["metadata"]["total_size"] == total
    # what transformers does: open each shard the index names and find the tensor there
    for name, shard in wmap.items():
        with safe_open(str(tmp_path / shard), framework="numpy") as f:
            assert name in f.keys()
    check_demo_tensors({name: str(tmp_path / shard) for name, shard in wmap.items()}, n)
    for s in shards:  # each shard: its tensors in declared order, contiguous from offset 0
        check_header_layout(tmp_path / s, [name for name in wmap if wmap[name] == s])
    # greedy shards: none exceeds the limit unless it holds a single oversized tensor
    nbytes = {name: int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[dt] for name, dt, shape in DEMO}
    for s in shards:
        sizes = [nbytes[x] for x in wmap if wmap[x] == s]
        assert sum(sizes) <= 256 or len([b for b in sizes if b > 0]) == 1


# -------------------------------------------------------------------- the reverse direction ----

def st_dump(tool, path):
    out = run([tool("st_dump"), path]).stdout
    shards, meta, tensors = [], {}, {}
    for line in out.splitlines():
        f = line.split("\t")
        if f[0] == "shard":
            shards.append(f[2])
        elif f[0] == "meta":
            meta[f[1]] = f[2]
        elif f[0] == "tensor":
            shape = [int(x) for x in f[3].split(",")] if f[3] else []
            tensors[f[1]] = dict(dtype=f[2], shape=shape, nbytes=int(f[4]), shard=int(f[5]), fnv=int(f[6], 16))
        else:
            raise AssertionError(f"unexpected st_dump line {line!r}")
    return shards, meta, tensors


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def reference_tensors(seed):
    rng = np.random.default_rng(seed)
    t = {
        "w.f64": rng.standard_normal((3, 5)),
        "w.f32": rng.standard_normal((17, 9)).astype(np.float32),
        "w.f16": rng.standard_normal((2, 2, 3)).astype(np.float16),
        "w.i64": rng.integers(-2**62, 2**62, size=(7,), dtype=np.int64),
        "w.i32": rng.integers(-2**31, 2**31, size=(2, 3, 1, 2), dtype=np.int32),
        "w.i16": rng.integers(-2**15, 2**15, size=(5,), dtype=np.int16),
        "w.i8": rng.integers(-128, 128, size=(11,), dtype=np.int8),
        "w.u8": rng.integers(0, 256, size=(13,), dtype=np.uint8),
        "w.bool": rng.integers(0, 2, size=(6,)).astype(np.bool_),
        "scalar": np.array(3.25, dtype=np.float32),
        "zero": np.zeros((0, 3), dtype=np.float16),
    }
    return t


def check_llmq_reads(tool, path, expect, meta):
    """expect: name -> (dtype, shape, bytes)."""
    shards, got_meta, got = st_dump(tool, path)
    assert got_meta == meta
    assert set(got) == set(expect)
    for name, (dtype, shape, data) in expect.items():
        g = got[name]
        assert (g["dtype"], g["shape"], g["nbytes"]) == (dtype, shape, len(data)), name
        assert g["fnv"] == fnv1a64(data), name
        raw = subprocess.run([str(tool("st_dump")), "--raw", str(path), name], capture_output=True, check=True).stdout
        assert raw == data, name
    return shards, got


def np_dtype_name(a):
    return {np.dtype(v): k for k, v in NP.items()}[a.dtype]


def test_reads_numpy_save_file(tool, tmp_path):
    t = reference_tensors(1)
    meta = {"format": "np", "note": "\u00fcml\u00e4ut"}
    f = tmp_path / "ref.safetensors"
    save_file(t, str(f), metadata=meta)
    expect = {k: (np_dtype_name(a), list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes()) for k, a in t.items()}
    shards, _ = check_llmq_reads(tool, f, expect, meta)
    assert shards == ["ref.safetensors"]
    check_llmq_reads(tool, tmp_path, expect, meta)  # the only *.safetensors in the directory


def test_reads_serialize_file_bf16(tool, tmp_path):
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 2**16, size=(3, 7), dtype=np.uint16)  # every bit pattern is a valid bf16
    f32 = rng.standard_normal(4).astype(np.float32)
    specs = {
        "b": safetensors.TensorSpec(dtype="bfloat16", shape=[3, 7], data_ptr=bits.ctypes.data, data_len=bits.nbytes),
        "a": safetensors.TensorSpec(dtype="float32", shape=[4], data_ptr=f32.ctypes.data, data_len=f32.nbytes),
    }
    f = tmp_path / "model.safetensors"
    safetensors.serialize_file(specs, str(f), metadata=None)
    expect = {"b": ("BF16", [3, 7], bits.astype("<u2").tobytes()), "a": ("F32", [4], f32.astype("<f4").tobytes())}
    check_llmq_reads(tool, f, expect, {})


def test_reads_hf_style_shards(tool, tmp_path):
    t = reference_tensors(3)
    names = list(t)
    groups = [names[:4], names[4:5], names[5:]]
    n = len(groups)
    wmap = {}
    for i, g in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: t[k] for k in g}, str(tmp_path / shard), metadata={"format": "pt"})
        wmap.update({k: shard for k in g})
    total = sum(a.nbytes for a in t.values())
    # transformers writes the index with sorted keys
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}, indent=2))
    expect = {k: (np_dtype_name(a), list(a.shape), a.astype(a.dtype.newbyteorder("<")).tobytes()) for k, a in t.items()}
    shards, got = check_llmq_reads(tool, tmp_path, expect, {"format": "pt"})
    assert shards == [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for k, shard in wmap.items():
        assert shards[got[k]["shard"]] == shard


# ---------------------------------------------------------------------------- corrupt files ----

A = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


def st_bytes(header, data=b""):
    hb = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(hb)) + hb + data


# (file bytes, llmq status): the reference rejects every one of them too
BOTH_REJECT = {
    "short": (b"\x01\x02", "truncated"),
    "header_too_large": (struct.pack("<Q", 100000001) + b"{}", "overflow"),
    "header_past_eof": (struct.pack("<Q", 100) + b"{}", "truncated"),
    "bad_json": (st_bytes("{" + A, b"x" * 8), "corrupt"),
    "bad_utf8": (st_bytes(b'{"a\xff":1}'), "corrupt"),
    "overlap": (st_bytes("{" + A + ',"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}', b"x" * 8), "corrupt"),
    "gap": (st_bytes("{" + A + ',"b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]}}', b"x" * 16), "corrupt"),
    "trailing": (st_bytes("{" + A + "}", b"x" * 9), "corrupt"),
    "size_mismatch": (st_bytes('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}}', b"x" * 12), "corrupt"),
    "data_truncated": (st_bytes("{" + A + "}", b"x" * 5), "truncated"),
    "unknown_dtype": (st_bytes('{"a":{"dtype":"Q4","shape":[8],"data_offsets":[0,8]}}', b"x" * 8), "unsupported"),
    "negative_dim": (st_bytes('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', b"x" * 8), "corrupt"),
    "metadata_not_string": (st_bytes('{"__metadata__":{"k":1},' + A + "}", b"x" * 8), "corrupt"),
}
# Deliberately stricter than the reference (which accepts these): duplicate names silently keep one
# of the two entries there, and the spec requires the header to start with '{'.
LLMQ_STRICTER = {
    "duplicate_name": (st_bytes("{" + A + "," + A + "}", b"x" * 8), "duplicate"),
    "leading_space": (st_bytes(" {}"), "corrupt"),
}


@pytest.mark.parametrize("case", sorted(BOTH_REJECT))
def test_rejects_what_reference_rejects(tool, tmp_path, case):
    data, status = BOTH_REJECT[case]
    with pytest.raises(Exception):
        safetensors.deserialize(data)
    f = tmp_path / "bad.safetensors"
    f.write_bytes(data)
    r = run([tool("st_dump"), f], check=False)
    assert r.returncode == 1, r.stderr
    assert f"status: {status}" in r.stderr
    assert str(f) in r.stderr


@pytest.mark.parametrize("case", sorted(LLMQ_STRICTER))
def test_stricter_than_reference(tool, tmp_path, case):
    data, status = LLMQ_STRICTER[case]
    safetensors.deserialize(data)  # accepted there
    f = tmp_path / "bad.safetensors"
    f.write_bytes(data)
    r = run([tool("st_dump"), f], check=False)
    assert r.returncode == 1 and f"status: {status}" in r.stderr, r.stderr
