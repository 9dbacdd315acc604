"""formats/gguf against gguf-py (PyPI `gguf`), an independent GGUF reader and writer.

1. llmq's writer: tests/tools/gguf_copy (llmq reader -> llmq writer) copies stories260K v1 (to v3),
   stories260K v3 and SmolLM2 Q4_1; gguf-py's GGUFReader must read every field (key, types, value
   bytes incl. arrays) and every tensor (name, type, shape, raw bytes) of the copy exactly as it
   reads the original (for v1: the v3 twin, which holds the same model). These canonical files
   are also reproduced byte for byte.
2. llmq's reader: tests/tools/gguf_dump prints what llmq reads as JSON, compared value by value
   with GGUFReader on the same three files and on files handcrafted by gguf-py's GGUFWriter with
   every value type, arrays of every element type, several tensor types and a custom alignment.
3. Nested arrays (legal for GGUFWriter) are refused by llmq with a clean "unsupported" error.
"""
import hashlib
import json
import math
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter
from gguf.quants import quantize

from conftest import run

TYPE_NAMES = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
              VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "string", VT.ARRAY: "array",
              VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64"}


# ---- gguf-py's view of a file, normalised to raw bytes ------------------------------------------

def field_value(f):
    """A field's value as exact bytes (strings: bytes; arrays: list of bytes or one packed bytes)."""
    main = f.types[0]
    if main == VT.ARRAY:
        if f.types[-1] == VT.STRING:
            return [bytes(f.parts[i]) for i in f.data]
        return b"".join(f.parts[i].tobytes() for i in f.data)
    if main == VT.STRING:
        return bytes(f.parts[-1])
    return f.parts[-1].tobytes()


def fields_of(reader):
    return [(f.name, [int(t) for t in f.types], field_value(f)) for f in reader.fields.values()]


def tensors_of(reader):
    out = []
    for t in reader.tensors:
        raw = reader.data[t.data_offset:t.data_offset + t.n_bytes]
        out.append((t.name, int(t.tensor_type), [int(x) for x in t.shape], int(t.n_bytes),
                    hashlib.sha256(raw).hexdigest()))
    return out


# ---- 1. the writer ------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["stories_v1", "stories_v3", "smollm2"])
def test_copy_reads_identically(which, request, tool, tmp_path, stories_v3):
    src = request.getfixturevalue(which)
    ref = stories_v3 if which == "stories_v1" else src  # gguf-py reads v2/v3 only
    out = tmp_path / "copy.gguf"
    run([tool("gguf_copy"), src, out])
    assert not list(tmp_path.glob("copy.gguf.tmp.*")), "temporary file left behind"
    a, b = GGUFReader(out), GGUFReader(ref)
    assert int(a.fields["GGUF.version"].parts[-1][0]) == 3
    assert a.alignment == b.alignment and a.data_offset == b.data_offset
    fa, fb = fields_of(a), fields_of(b)
    assert [x[0] for x in fa] == [x[0] for x in fb]
    for x, y in zip(fa, fb):
        assert x == y, f"field {x[0]} differs"
    ta, tb = tensors_of(a), tensors_of(b)
    assert len(ta) == len(tb) and len(ta) > 0
    for x, y in zip(ta, tb):
        assert x == y, f"tensor {x[0]} differs"
    # these files use the canonical layout (KVs, infos, data in order, padded), so the copy is exact
    assert out.read_bytes() == ref.read_bytes()


# ---- 2. the reader ------------------------------------------------------------------------------

def json_elem(v, t):
    """A dumped element converted to what GGUFField.contents() returns."""
    if t in ("f32", "f64"):
        return float(v)  # non-finite values are dumped as "nan", "inf", "-inf"
    if t == "string":
        return bytes.fromhex(v["hex"]).decode("utf-8", "surrogateescape") if isinstance(v, dict) else v
    if t == "bool":
        return bool(v)
    return int(v)  # integers beyond int64 are dumped as decimal strings


def same(got, want):
    """Exact equality; floats also agree in sign of zero, and NaN equals NaN."""
    if isinstance(want, float):
        return isinstance(got, float) and ((math.isnan(got) and math.isnan(want)) or
                                           (got == want and math.copysign(1, got) == math.copysign(1, want)))
    return type(got) is type(want) and got == want


def check_dump(dump, reader, version=None, same_layout=True):
    """Compares gguf_dump's JSON with GGUFReader. same_layout=False: a v1 file against its v3 twin."""
    if version is not None:
        assert dump["version"] == version
    assert dump["alignment"] == reader.alignment
    if same_layout:
        assert dump["data_offset"] == reader.data_offset
    fields = [f for f in reader.fields.values() if not f.name.startswith("GGUF.")]
    assert [kv["key"] for kv in dump["kv"]] == [f.name for f in fields]
    for kv, f in zip(dump["kv"], fields):
        assert kv["type"] == TYPE_NAMES[f.types[0]], f.name
        want = f.contents()
        if f.types[0] == VT.ARRAY:
            et = TYPE_NAMES[f.types[-1]]
            assert kv["elem"] == et, f.name
            got = [json_elem(v, et) for v in kv["value"]]
            assert len(got) == len(want), f.name
            bad = [i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w)]
            assert not bad, f"{f.name}[{bad[0]}]: llmq {got[bad[0]]!r} != gguf {want[bad[0]]!r}"
        else:
            got = json_elem(kv["value"], kv["type"])
            assert same(got, want), f"{f.name}: llmq {got!r} != gguf {want!r}"
    assert len(dump["tensors"]) == len(reader.tensors)
    for d, t in zip(dump["tensors"], reader.tensors):
        raw = reader.data[t.data_offset:t.data_offset + t.n_bytes]
        assert d["name"] == t.name
        assert d["ggml_type"] == int(t.tensor_type)
        assert d["ne"] == [int(x) for x in t.shape]
        assert d["shape"] == [int(x) for x in reversed(t.shape)]
        assert d["nbytes"] == int(t.n_bytes)
        assert d["crc32"] == zlib.crc32(raw), t.name
        if same_layout:
            assert d["data_offset"] == t.data_offset


def dump(tool, path):
    return json.loads(run([tool("gguf_dump"), path]).stdout)


def test_dump_real_files(tool, stories_v1, stories_v3, smollm2):
    twin = GGUFReader(stories_v3)
    check_dump(dump(tool, stories_v1), twin, version=1, same_layout=False)
    check_dump(dump(tool, stories_v3), twin, version=3)
    check_dump(dump(tool, smollm2), GGUFReader(smollm2), version=3)


def write_handcrafted(path, alignment=None):
    rng = np.random.default_rng(1234)
    w = GGUFWriter(str(path), arch="llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 2**32 - 1)
    w.add_int32("t.i32", -2**31)
    w.add_float32("t.f32", -1.5e-3)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.str", "h\u00e9llo \u2581 \U0001F600")
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -2**63)
    w.add_float64("t.f64", math.pi)
    w.add_key_value("a.u8", [0, 1, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("a.i8", [-128, 0, 127], VT.ARRAY, sub_type=VT.INT8)
    w.add_key_value("a.u16", [0, 65535], VT.ARRAY, sub_type=VT.UINT16)
    w.add_key_value("a.i16", [-32768, 32767], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("a.u32", [0, 2**32 - 1], VT.ARRAY, sub_type=VT.UINT32)
    w.add_key_value("a.i32", [-2**31, 5, 2**31 - 1], VT.ARRAY, sub_type=VT.INT32)
    w.add_key_value("a.f32", [1.5, float("inf"), float("-inf"), float("nan"), 1e-40], VT.ARRAY,
                    sub_type=VT.FLOAT32)
    w.add_key_value("a.bool", [True, False, True], VT.ARRAY, sub_type=VT.BOOL)
    w.add_key_value("a.u64", [0, 2**64 - 1], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("a.i64", [-2**63, 2**63 - 1], VT.ARRAY, sub_type=VT.INT64)
    w.add_key_value("a.f64", [math.e, -0.0, 1e-300], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("a.str", ["", "a", "h\u00e9llo", "\U0001F600", "x" * 300])
    w.add_tensor("token_embd.weight", rng.standard_normal((5, 3)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal((2, 3, 4)).astype(np.float16))
    w.add_tensor("blk.0.attn_q.weight", quantize(rng.standard_normal((4, 64)).astype(np.float32), QT.Q8_0),
                 raw_dtype=QT.Q8_0)
    w.add_tensor("blk.0.attn_k.weight", quantize(rng.standard_normal((2, 96)).astype(np.float32), QT.Q4_1),
                 raw_dtype=QT.Q4_1)
    w.add_tensor("blk.0.attn_v.weight", quantize(rng.standard_normal((3, 32)).astype(np.float32), QT.BF16),
                 raw_dtype=QT.BF16)
    w.add_tensor("i8", np.arange(-7, 6, dtype=np.int8))
    w.add_tensor("i16", np.arange(9, dtype=np.int16).reshape(3, 3))
    w.add_tensor("i32", np.arange(5, dtype=np.int32))
    w.add_tensor("i64", np.arange(2, dtype=np.int64))
    w.add_tensor("f64", rng.standard_normal(3))
    w.add_tensor("four_d", rng.standard_normal((1, 2, 3, 4)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("alignment", [None, 64, 128])
def test_gguf_writer_file(tool, tmp_path, alignment):
    src = tmp_path / "handcrafted.gguf"
    write_handcrafted(src, alignment)
    reader = GGUFReader(src)
    assert reader.alignment == (alignment or 32)
    check_dump(dump(tool, src), reader, version=3)
    # and llmq's writer reproduces gguf-py's file exactly
    out = tmp_path / "copy.gguf"
    run([tool("gguf_copy"), src, out])
    assert fields_of(GGUFReader(out)) == fields_of(reader)
    assert tensors_of(GGUFReader(out)) == tensors_of(reader)
    assert out.read_bytes() == src.read_bytes()


def test_nested_array_rejected(tool, tmp_path):
    src = tmp_path / "nested.gguf"
    w = GGUFWriter(str(src), arch="llama")
    w.add_key_value("a.nested", [[1, 2], [3]], VT.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert GGUFReader(src).fields["a.nested"].types[:2] == [VT.ARRAY, VT.ARRAY]
    r = run([tool("gguf_dump"), src], check=False)
    assert r.returncode == 1
    err = json.loads(r.stdout)
    assert err["status"] == "unsupported"
    assert "nested arrays" in err["message"] and str(src) in err["message"] and "a.nested" in err["message"]
    r = run([tool("gguf_copy"), src, tmp_path / "out.gguf"], check=False)
    assert r.returncode == 1 and not (tmp_path / "out.gguf").exists()
