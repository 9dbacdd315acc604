"""Oracle: llmq's dtype table (common/dtype.c) against gguf-py's GGMLQuantizationType ids and
GGML_QUANT_SIZES (elements per block, bytes per block), for every type llmq knows."""
import json

import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from conftest import run

NO_GGUF_ID = {"u8", "bool"}  # safetensors-only dtypes

# Known oracle defect: gguf-py 0.19 lists Q8_1 as (32, 4 + 4 + 32) = 40 bytes, the layout from when
# d and s were f32. ggml's ggml-common.h has block_q8_1 { ggml_half d; ggml_half s; int8_t qs[32]; }
# with static_assert(sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1), i.e. 36 bytes; ggml defines
# the layout, so llmq says 36. (Q8_1 is an activation format, never stored in GGUF files, and
# gguf-py has no Q8_1 codec.) If gguf-py is fixed, the second assertion below fails: drop this.
GGUF_PY_STALE = {"q8_1": ((32, 36), (32, 40))}


def load_table(tool):
    rows = json.loads(run([tool("dequant_tool"), "--table"]).stdout)
    assert rows, "empty dtype table"
    return rows


def test_table_matches_gguf(tool):
    rows = load_table(tool)
    seen = set()
    for r in rows:
        name, gid = r["name"], r["ggml_id"]
        if name in NO_GGUF_ID:
            assert gid == -1 and r["blck"] == 1, r
            continue
        assert gid >= 0, f"{name} has no GGUF id"
        assert gid not in seen, f"duplicate GGUF id {gid}"
        seen.add(gid)
        qt = T(gid)
        assert qt.name.lower() == name, f"id {gid}: llmq {name}, gguf-py {qt.name}"
        if name in GGUF_PY_STALE:
            ggml_size, gguf_py_size = GGUF_PY_STALE[name]
            assert (r["blck"], r["size"]) == ggml_size, r
            assert GGML_QUANT_SIZES[qt] == gguf_py_size, "gguf-py fixed its Q8_1 size: update the test"
            continue
        assert GGML_QUANT_SIZES[qt] == (r["blck"], r["size"]), f"{name}: llmq {(r['blck'], r['size'])}, gguf-py {GGML_QUANT_SIZES[qt]}"


def test_tsv_matches_json(tool):
    rows = load_table(tool)
    lines = run([tool("dequant_tool"), "--table", "--tsv"]).stdout.strip().split("\n")
    assert lines[0].split("\t") == ["name", "ggml_id", "blck", "size", "can_dequant"]
    assert len(lines) - 1 == len(rows)
    for line, r in zip(lines[1:], rows):
        name, gid, blck, size, can = line.split("\t")
        assert (name, int(gid), int(blck), int(size), bool(int(can))) == \
            (r["name"], r["ggml_id"], r["blck"], r["size"], r["can_dequant"])


def test_dequantizable_set(tool):
    """The types llmq decodes: the plain floats plus the 12 block formats of formats/ggml/quants.h."""
    can = {r["name"] for r in load_table(tool) if r["can_dequant"]}
    assert can == {"f32", "f16", "bf16", "f64", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k",
                   "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"}
    # and gguf-py (the oracle) can decode every one of them except F64, which it lacks
    for name in can - {"f64", "f32", "f16"}:
        assert T[name.upper()] in gguf.quants._type_traits, name
