"""llama.cpp imatrix files in both forms (calib/calib.h "llama.cpp imatrix files").

Fixtures: tests/golden/imatrix_stories260k.{gguf,dat}, written by the real llama-imatrix (llama.cpp of
llama-cpp-python 0.3.36) from one computation, GGUF (its default) and --output-format dat
(tests/py/gen_golden_imatrix.sh has the command). The oracle for their contents is gguf-py (PyPI `gguf`)
and a plain reading of the .dat layout; corrupt variants are made here with gguf-py's GGUFWriter.
"""
import pathlib
import struct

import numpy as np
import pytest

from conftest import SRC, run

gguf = pytest.importorskip("gguf")

GOLD = SRC / "tests" / "golden"
TWIN_GGUF = GOLD / "imatrix_stories260k.gguf"
TWIN_DAT = GOLD / "imatrix_stories260k.dat"
LINEARS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
N_LAYER = 5


def read_gguf_imatrix(path):
    """{weight: (in_sum2 f32 array, count)} and the KVs, by gguf-py."""
    r = gguf.GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}
    ent = {}
    for name, x in t.items():
        if name.endswith(".in_sum2"):
            w = name[: -len(".in_sum2")]
            assert x.tensor_type == gguf.GGMLQuantizationType.F32
            c = t[w + ".counts"]
            assert c.tensor_type == gguf.GGMLQuantizationType.F32
            ent[w] = (np.array(x.data, dtype=np.float32).reshape(-1), float(np.array(c.data).reshape(-1)[0]))
    kv = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return ent, kv, r


def read_dat(path):
    """{weight: (values f32 array, ncall)}, last_call, dataset: the legacy layout read plainly."""
    b = pathlib.Path(path).read_bytes()
    (n,), off, ent = struct.unpack_from("<i", b), 4, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", b, off)
        name = b[off + 4: off + 4 + ln].decode()
        off += 4 + ln
        ncall, nval = struct.unpack_from("<ii", b, off)
        off += 8
        ent[name] = (np.frombuffer(b, dtype="<f4", count=nval, offset=off).copy(), ncall)
        off += 4 * nval
    last, dl = struct.unpack_from("<ii", b, off)
    return ent, last, b[off + 8: off + 8 + dl].decode()


def importance_gguf(ent):
    return {w: (s / np.float32(c)).astype(np.float32) for w, (s, c) in ent.items()}


def importance_dat(ent):
    return {w: (v / np.float32(n)).astype(np.float32) for w, (v, n) in ent.items()}


def test_fixtures_are_llama_imatrix_twins():
    """The two files hold one computation: the .dat's values are save_imatrix_legacy's f32
    (in_sum2 / counts) * ncall with ncall = ceil(count / chunk_size), the chunk count."""
    g, kv, _ = read_gguf_imatrix(TWIN_GGUF)
    d, last, dataset = read_dat(TWIN_DAT)
    assert kv["general.type"] == "imatrix" and kv["imatrix.chunk_count"] == 4 and kv["imatrix.chunk_size"] == 128
    assert kv["imatrix.datasets"] == [dataset] == ["wiki.valid.raw"] and last == 4
    assert sorted(g) == sorted(d) == sorted(f"blk.{l}.{w}.weight" for l in range(N_LAYER) for w in LINEARS)
    for w, (s, c) in g.items():
        v, ncall = d[w]
        assert c == 4 * 128 and ncall == -(-int(c) // 128)
        np.testing.assert_array_equal(v, ((s / np.float32(c)).astype(np.float32) * np.float32(ncall)).astype(np.float32))
    # ncall = 4 is a power of two, so the importance llama-quantize derives is the same from both
    ig, idat = importance_gguf(g), importance_dat(d)
    for w in ig:
        np.testing.assert_array_equal(ig[w], idat[w])


def llmq_gguf(llmq_bin, stories_v3, imatrix, out, tmp_path):
    """llmq's own GGUF writing of what it read from `imatrix` (calib --imatrix-in ... --imatrix-out)."""
    r = run([llmq_bin, "calib", "--model", stories_v3, "--imatrix-in", imatrix, "--imatrix-out", out])
    return r


def test_llmq_reads_both_twins_to_the_same_statistics(llmq_bin, stories_v3, tmp_path):
    """Each twin read by llmq and written back as GGUF: the importance (Σx² / count) equals what
    llama-quantize derives from the original (f32 in_sum2 / counts; .dat values / ncall), and both agree."""
    a, b = tmp_path / "from_gguf.gguf", tmp_path / "from_dat.gguf"
    ra = llmq_gguf(llmq_bin, stories_v3, TWIN_GGUF, a, tmp_path)
    rb = llmq_gguf(llmq_bin, stories_v3, TWIN_DAT, b, tmp_path)
    pick = lambda s: [ln for ln in s.splitlines() if ln.startswith("blk.")]
    assert pick(ra.stdout) == pick(rb.stdout) and len(pick(ra.stdout)) == N_LAYER
    ga, _, _ = read_gguf_imatrix(a)
    gb, _, _ = read_gguf_imatrix(b)
    g, _, _ = read_gguf_imatrix(TWIN_GGUF)
    d, _, _ = read_dat(TWIN_DAT)
    ig, id_ = importance_gguf(g), importance_dat(d)
    for w in ga:
        np.testing.assert_array_equal(importance_gguf(ga)[w], ig[w])
        np.testing.assert_array_equal(importance_gguf(gb)[w], id_[w])
        np.testing.assert_array_equal(importance_gguf(ga)[w], importance_gguf(gb)[w])
    # a GGUF read and written back is llama-imatrix's file byte for byte (same layout, names, KVs)
    assert a.read_bytes() == TWIN_GGUF.read_bytes()


def test_format_is_told_by_content_not_name(llmq_bin, stories_v3, tmp_path):
    gdat, dgguf = tmp_path / "really_gguf.dat", tmp_path / "really_dat.gguf"
    gdat.write_bytes(TWIN_GGUF.read_bytes())
    dgguf.write_bytes(TWIN_DAT.read_bytes())
    ref = [ln for ln in run([llmq_bin, "calib", "--model", stories_v3, "--imatrix-in", TWIN_GGUF]).stdout.splitlines()
           if ln.startswith("blk.")]
    for p in (gdat, dgguf):
        out = run([llmq_bin, "calib", "--model", stories_v3, "--imatrix-in", p]).stdout
        assert [ln for ln in out.splitlines() if ln.startswith("blk.")] == ref, p


def quantize(llmq_bin, model, out, *flags, check=True):
    return run([llmq_bin, "quantize", "--model", model, "--format", "gguf", "--gguf-type", "Q4_K_M", "--threads", "2",
                "--no-provenance", "--out", out, *flags], check=check)


def test_gguf_imatrix_quantizes_to_the_bytes_of_its_dat_twin(llmq_bin, stories_v3, tmp_path):
    """The acceptance test of issue 12: a llama-imatrix GGUF file drives `llmq quantize --imatrix` to the
    same bytes as its .dat twin (--no-provenance: the llmq.* keys name the imatrix file and its sha256)."""
    a, b, c = tmp_path / "g.gguf", tmp_path / "d.gguf", tmp_path / "none.gguf"
    quantize(llmq_bin, stories_v3, a, "--imatrix", TWIN_GGUF)
    quantize(llmq_bin, stories_v3, b, "--imatrix", TWIN_DAT)
    quantize(llmq_bin, stories_v3, c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()  # the importance was used
    # the provenance says which form was read
    import json
    for imat, form in ((TWIN_GGUF, "llama.cpp-imatrix-gguf"), (TWIN_DAT, "llama.cpp-imatrix-dat")):
        out = tmp_path / f"p_{form}.gguf"
        run([llmq_bin, "quantize", "--model", stories_v3, "--format", "gguf", "--gguf-type", "Q4_K_M", "--threads", "2",
             "--imatrix", imat, "--out", out])
        params = json.loads(gguf.GGUFReader(str(out)).fields["llmq.params"].contents())
        assert params["imatrix"]["format"] == form


def test_llmq_writer_is_upstream_layout(llmq_bin, stories_v1, data_dir, tmp_path):
    """llmq calib --imatrix-out X.gguf: llama-imatrix's names, types, shapes and KVs (read by gguf-py), the
    counts = tokens, chunk_count = sequences, chunk_size = seqlen; a read and re-write is byte-identical;
    .dat stays the legacy form, with the same importance up to the f32 rounding of Σx²."""
    import os
    x, dat = tmp_path / "x.gguf", tmp_path / "x.dat"
    env = {**os.environ, "LLMQ_DATA": str(data_dir)}
    run([llmq_bin, "calib", "--model", stories_v1, "--calib", "wikitext-2-valid", "--nsamples", "3", "--seqlen", "64",
         "--seed", "1", "--no-xtx", "--threads", "2", "--imatrix-out", x], env=env)
    run([llmq_bin, "calib", "--model", stories_v1, "--calib", "wikitext-2-valid", "--nsamples", "3", "--seqlen", "64",
         "--seed", "1", "--no-xtx", "--threads", "2", "--imatrix-out", dat], env=env)
    assert x.read_bytes()[:4] == b"GGUF" and dat.read_bytes()[:4] != b"GGUF"
    ent, kv, r = read_gguf_imatrix(x)
    assert kv["general.type"] == "imatrix" and kv["imatrix.datasets"] == ["wikitext-2-valid"]
    assert kv["imatrix.chunk_count"] == 3 and kv["imatrix.chunk_size"] == 64
    names = [t.name for t in r.tensors]
    weights = sorted(f"blk.{l}.{w}.weight" for l in range(N_LAYER) for w in LINEARS)
    assert names == [n for w in weights for n in (w + ".in_sum2", w + ".counts")]
    widths = {"ffn_down": 172}
    for w, (s, c) in ent.items():
        assert c == 3 * 64 and s.shape == (widths.get(w.split(".")[2], 64),) and np.all(s > 0)
    d, last, dataset = read_dat(dat)
    assert last == 3 and dataset == "wikitext-2-valid"
    # both are Σx²/count (f64) through two f32 roundings of relative error <= u = 2^-24 each (.dat: the
    # value, then / ncall; GGUF: Σx², then / count), so they differ by at most 4u relative
    for w, (v, n) in d.items():
        np.testing.assert_allclose(v / n, ent[w][0] / ent[w][1], rtol=4 * 2.0**-24, atol=0)
    y = tmp_path / "y.gguf"
    run([llmq_bin, "calib", "--model", stories_v1, "--imatrix-in", x, "--imatrix-out", y])
    assert y.read_bytes() == x.read_bytes()


# ---- corrupt input: each refused with exit 1, naming the file and the tensor / key


def rewrite(src, dst, drop=(), replace=None, kv_drop=(), kv_set=None):
    """A copy of imatrix GGUF src with tensors dropped / replaced ({name: array}) and KVs changed."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), "imatrix")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in kv_drop:
            continue
        if kv_set and k in kv_set:
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub)
    for k, (v, t) in (kv_set or {}).items():
        w.add_key_value(k, v, t)
    for t in r.tensors:
        if t.name in drop:
            continue
        a = (replace or {}).get(t.name)
        w.add_tensor(t.name, np.array(t.data) if a is None else a)
    for name, a in (replace or {}).items():
        if name not in [t.name for t in r.tensors]:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


W = "blk.2.attn_output.weight"
S = gguf.GGUFValueType.STRING
BAD = {
    "missing_counts": (dict(drop=(W + ".counts",)), W),
    "orphan_counts": (dict(drop=(W + ".in_sum2",)), W),
    "shape": (dict(replace={W + ".in_sum2": np.ones(63, np.float32)}), W),
    "nan": (dict(replace={W + ".in_sum2": np.array([np.nan] + [1.0] * 63, np.float32)}), W),
    "negative": (dict(replace={W + ".in_sum2": np.array([-1.0] + [1.0] * 63, np.float32)}), W),
    "count_zero": (dict(replace={W + ".counts": np.zeros(1, np.float32)}), W + ".counts"),
    "count_nan": (dict(replace={W + ".counts": np.array([np.inf], np.float32)}), W + ".counts"),
    "f16": (dict(replace={W + ".in_sum2": np.ones(64, np.float16)}), W + ".in_sum2"),
    "experts": (dict(replace={W + ".in_sum2": np.ones((2, 64), np.float32), W + ".counts": np.ones((2, 1), np.float32)}), W),
    "in_sum_size": (dict(replace={W + ".in_sum": np.ones(32, np.float32)}), W),
    "no_chunk_size": (dict(kv_drop=("imatrix.chunk_size",)), "imatrix.chunk_size"),
    "no_datasets": (dict(kv_drop=("imatrix.datasets",)), "imatrix.datasets"),
    "not_imatrix": (dict(kv_set={"general.type": ("model", S)}), "general.type"),
    "chunk_count_type": (dict(kv_set={"imatrix.chunk_count": ("4", S)}), "imatrix.chunk_count"),
    "chunk_size_range": (dict(kv_set={"imatrix.chunk_size": (-1, gguf.GGUFValueType.INT64)}), "chunk_size"),
    "datasets_type": (dict(kv_set={"imatrix.datasets": (5, gguf.GGUFValueType.UINT32)}), "imatrix.datasets"),
    "other_model": (dict(drop=tuple(f"blk.{l}.{w}.weight.{s}" for l in range(N_LAYER) for w in LINEARS
                                    for s in ("in_sum2", "counts")),
                         replace={"blk.0.ffn_gate_exps.weight.in_sum2": np.ones((2, 64), np.float32),
                                  "blk.0.ffn_gate_exps.weight.counts": np.ones((2, 1), np.float32)}),
                    "no entry names a linear"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_corrupt_gguf_imatrix_is_refused(llmq_bin, stories_v3, tmp_path, case):
    kw, what = BAD[case]
    bad = rewrite(TWIN_GGUF, tmp_path / f"{case}.gguf", **kw)
    for cmd in (["calib", "--model", stories_v3, "--imatrix-in", bad],
                ["quantize", "--model", stories_v3, "--format", "gguf", "--gguf-type", "Q4_0", "--imatrix", bad,
                 "--out", tmp_path / "o.gguf"]):
        r = run([llmq_bin, *cmd], check=False)
        assert r.returncode == 1, (case, r.returncode, r.stderr)
        assert str(bad) in r.stderr and what in r.stderr, (case, r.stderr)
    assert not (tmp_path / "o.gguf").exists()


def test_a_model_is_not_an_imatrix(llmq_bin, stories_v3, tmp_path):
    r = run([llmq_bin, "calib", "--model", stories_v3, "--imatrix-in", stories_v3], check=False)
    assert r.returncode == 1 and str(stories_v3) in r.stderr and "imatrix" in r.stderr, r.stderr


# ---- against llama.cpp's own tools, where bench/llama_tools.sh has built them (never in CI: skipped there)


def llama_tools():
    import os
    cache = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
    d = cache / "llama-tools-0.3.36" / "bin"
    if not all((d / t).exists() for t in ("llama-imatrix", "llama-quantize")):
        pytest.skip(f"llama.cpp tools not built in {d} (bench/llama_tools.sh)")
    return d


def tensor_bytes(path):
    return {t.name: np.array(t.data).tobytes() for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("ctx", [128, 500])
def test_twins_against_llama_quantize(llmq_bin, stories_v3, data_dir, tmp_path, ctx):
    """Fresh twins from llama-imatrix (3 chunks of ctx tokens): llmq's tensors equal llama-quantize's for
    each form, and the two forms agree in llmq exactly where they agree in llama-quantize (always for
    ctx 128, a power of two; for ctx 500 some values differ by an ulp: calib/calib.h)."""
    tools = llama_tools()
    (tmp_path / "wiki.valid.raw").write_bytes((data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes())
    q = {}
    for fmt in ("gguf", "dat"):
        imat = tmp_path / f"i.{fmt}"
        run([tools / "llama-imatrix", "-m", stories_v3, "-f", "wiki.valid.raw", "-o", imat.name, "--output-format", fmt,
             "--chunks", "3", "-c", ctx, "-b", ctx, "-t", "2", "--no-ppl"], cwd=tmp_path)
        quantize(llmq_bin, stories_v3, tmp_path / f"llmq_{fmt}.gguf", "--imatrix", imat)
        run([tools / "llama-quantize", "--imatrix", imat, stories_v3, tmp_path / f"lcpp_{fmt}.gguf", "Q4_K_M", "2"])
        q[fmt] = tensor_bytes(tmp_path / f"llmq_{fmt}.gguf"), tensor_bytes(tmp_path / f"lcpp_{fmt}.gguf")
        assert q[fmt][0] == q[fmt][1], fmt
    same = q["gguf"][0] == q["dat"][0]
    assert same == (q["gguf"][1] == q["dat"][1])
    assert same == (ctx == 128), ctx  # 500: the measured counter-example of calib/calib.h


def test_llama_quantize_reads_llmqs_gguf_imatrix(llmq_bin, stories_v3, data_dir, tmp_path):
    """llama-quantize loads the GGUF imatrix llmq calib writes (all 35 entries, its chunk count) and
    quantizes with it to llmq's tensors."""
    import os
    tools = llama_tools()
    own = tmp_path / "own.gguf"
    run([llmq_bin, "calib", "--model", stories_v3, "--calib", "wikitext-2-valid", "--nsamples", "3", "--seqlen", "100",
         "--no-xtx", "--threads", "2", "--imatrix-out", own], env={**os.environ, "LLMQ_DATA": str(data_dir)})
    r = run([tools / "llama-quantize", "--imatrix", own, stories_v3, tmp_path / "l.gguf", "Q4_K_M", "2"])
    assert "loaded 35 importance matrix entries" in r.stdout + r.stderr and "computed on 3 chunks" in r.stdout + r.stderr
    quantize(llmq_bin, stories_v3, tmp_path / "q.gguf", "--imatrix", own)
    assert tensor_bytes(tmp_path / "q.gguf") == tensor_bytes(tmp_path / "l.gguf")
