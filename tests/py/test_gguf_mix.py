"""`llmq quantize --format gguf` against llama.cpp's own quantizer (quant/gguf_mix.h, quant/gguf_export.h).

The oracle is llama-cpp-python 0.3.36: llama_cpp.llama_model_quantize(in, out, params) on the same f32
input, with the same importance (params.imatrix) and options (tt_overrides, output_tensor_type,
token_embedding_type, pure). `llmq quantize --method rtn --no-provenance` must write the SAME FILE,
byte for byte. The comparisons skip when llama_cpp is not importable; the llmq-only checks (dry run,
errors, stories260K v1, gguf-py dequantization) always run.

Inputs:
  smol8   SmolLM2-135M f32 cut to its first 8 blocks (gguf-py), so that all 18 types run in about a
          minute; 8 blocks keep every layer rule alive (n/8 = 1, 7n/8 = 7, use_more_bits 0, 3, 6, 7).
  smollm2 the full f32 base (30 blocks): the type plan of every ftype against llama.cpp's dry run,
          and Q4_K_M byte for byte, dequantized by gguf-py, run by llama.cpp.
  stories260K v3 (llama.cpp reads it) and v1 (GGUF v1: llama.cpp refuses to read it at all); its
          172-wide ffn_down tiles no block type, both llama.cpp 0.3.36 and llmq write it as F16.
"""
import ctypes
import json
import os
import pathlib
import re
import struct

import numpy as np
import pytest
import gguf

from conftest import gguf_first_blocks, run

FTYPES = {"Q8_0": 7, "Q6_K": 18, "Q5_K_M": 17, "Q5_K_S": 16, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "Q4_K_S": 14,
          "Q4_0": 2, "Q4_1": 3, "Q3_K_L": 13, "Q3_K_M": 12, "Q3_K_S": 11, "Q2_K": 10, "IQ4_NL": 25, "IQ4_XS": 30,
          "F16": 1, "BF16": 32}
T = gguf.GGMLQuantizationType
GGML_COUNT = 41  # GGML_TYPE_COUNT of the llama.cpp in llama-cpp-python 0.3.36 ("not set")


def smol_f32_path():
    cache = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
    p = cache / "smollm2-f32.gguf"
    assert p.exists(), f"{p} missing: see README (llmq convert --dtype f32 of SmolLM2)"
    return p


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf_mix")


@pytest.fixture(scope="module")
def smollm2_f32():
    return smol_f32_path()


@pytest.fixture(scope="module")
def smol8(smollm2_f32, work):
    """SmolLM2 f32 with only blocks 0..7 (block_count 8), every KV kept."""
    return gguf_first_blocks(smollm2_f32, work / "smol8.gguf", 8)


@pytest.fixture(scope="module")
def lc():
    try:  # not a test requirement (tests/requirements-llamacpp.txt): skip the comparisons without it
        import llama_cpp
    except Exception as e:  # missing package, or its shared libraries do not load
        pytest.skip(f"llama_cpp not importable: {e}")
    return llama_cpp


def llmq_q(llmq_bin, model, out, gtype, *flags, check=True):
    return run([llmq_bin, "quantize", "--model", model, "--format", "gguf", "--gguf-type", gtype, "--method", "rtn",
                "--threads", "2", "--out", out, "--force", *flags], check=check)


def lc_quantize(lc, src, dst, ftype, imatrix=None, tt=None, output_type=None, emb_type=None, pure=False,
                dry_run=False):
    """llama_model_quantize; imatrix {name: f32 array}; tt [(pattern, type name)]. Returns its log text."""
    p = lc.llama_model_quantize_default_params()
    p.ftype = ftype
    p.nthread = 2
    p.pure = pure
    p.dry_run = dry_run
    keep = []
    if output_type:
        p.output_tensor_type = int(T[output_type.upper()])
    if emb_type:
        p.token_embedding_type = int(T[emb_type.upper()])
    if imatrix is not None:
        arr = (lc.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, v) in enumerate(imatrix.items()):
            v = np.ascontiguousarray(v, dtype=np.float32)
            keep.append(v)
            arr[i].name = name.encode()
            arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        arr[len(imatrix)].name = None
        keep.append(arr)
        p.imatrix = arr
    if tt:
        arr = (lc.llama_model_tensor_override * (len(tt) + 1))()
        for i, (pat, ty) in enumerate(tt):
            arr[i].pattern = pat.encode()
            arr[i].type = int(T[ty.upper()])
        arr[len(tt)].pattern = None
        keep.append(arr)
        p.tt_overrides = arr
    log = []

    @lc.llama_log_callback
    def cb(level, text, user):
        log.append(text.decode("utf-8", "replace"))

    lc.llama_log_set(cb, ctypes.c_void_p(0))
    try:
        rc = lc.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(p))
    finally:
        import llama_cpp._logger as lg
        lc.llama_log_set(lg.llama_log_callback, ctypes.c_void_p(0))
    text = "".join(log)
    assert rc == 0, f"llama_model_quantize failed:\n{text[-3000:]}"
    return text


def same_file(a, b):
    da, db = pathlib.Path(a).read_bytes(), pathlib.Path(b).read_bytes()
    if da == db:
        return None
    n = min(len(da), len(db))
    i = next((k for k in range(n) if da[k] != db[k]), n)
    return f"sizes {len(da)} / {len(db)}, first difference at byte {i}"


# ---- byte identity ------------------------------------------------------------------------------------

@pytest.mark.heavy
def test_rtn_byte_identical_every_type(llmq_bin, lc, smol8, work):
    """All 18 file types: llmq's file == llama.cpp's file (the whole loop in one test to bound CI time)."""
    differ = {}
    for name, ft in FTYPES.items():
        ref, mine = work / f"ref_{name}.gguf", work / f"mine_{name}.gguf"
        lc_quantize(lc, smol8, ref, ft)
        llmq_q(llmq_bin, smol8, mine, name, "--no-provenance")
        d = same_file(ref, mine)
        if d:
            differ[name] = d
        ref.unlink()
        if name not in ("Q4_K_M", "Q4_0"):
            mine.unlink()
    assert not differ, differ


def read_dat(path):
    """llama.cpp legacy imatrix .dat -> {name: values / ncall} in f32 (llama-quantize's load_imatrix)."""
    b = pathlib.Path(path).read_bytes()
    (n,), off, out = struct.unpack_from("<i", b, 0), 4, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<i", b, off)
        name = b[off + 4:off + 4 + ln].decode()
        off += 4 + ln
        ncall, nval = struct.unpack_from("<ii", b, off)
        v = np.frombuffer(b, dtype="<f4", count=nval, offset=off + 8).copy()
        off += 8 + 4 * nval
        out[name] = v / np.float32(ncall) if ncall > 0 else v
    return out


def read_lcs(path, n_layer):
    """llmq .lcs -> {weight name: (float)(sum_sq / count)} (quant/gguf_export.h "Importance")."""
    b = pathlib.Path(path).read_bytes()
    assert b[:8] == b"LLMQCALS"
    (flags,) = struct.unpack_from("<I", b, 12)
    off, out = 72, {}
    slots = [["attn_q", "attn_k", "attn_v"], ["attn_output"], ["ffn_gate", "ffn_up"], ["ffn_down"]]
    for l in range(n_layer):
        for names in slots:
            n_in, count = struct.unpack_from("<qq", b, off)
            off += 16
            sum_sq = np.frombuffer(b, dtype="<f8", count=n_in, offset=off + 8 * n_in)
            off += 16 * n_in + (8 * n_in * n_in if flags & 1 else 0)
            for nm in names:
                out[f"blk.{l}.{nm}.weight"] = (sum_sq / count).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def smol8_stats(llmq_bin, smol8, work, data_dir):
    lcs, dat = work / "smol8.lcs", work / "smol8.dat"
    run([llmq_bin, "calib", "--model", smol8, "--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "64",
         "--no-xtx", "--threads", "2", "--out", lcs, "--imatrix-out", dat],
        env={**os.environ, "LLMQ_DATA": str(data_dir)})
    return lcs, dat


def test_calibrated_methods_get_the_imatrix_mix(llmq_bin, smol8, smol8_stats, work, data_dir):
    """gptq / awq have calibration statistics: their plan is llama-quantize's --imatrix plan (Q4_0: the
    first n_layer/8 ffn_down are Q4_1), so their files have the size of llama-quantize --imatrix's."""
    def plan(*flags):
        r = run([llmq_bin, "quantize", "--model", smol8, "--format", "gguf", "--gguf-type", "Q4_0", "--dry-run",
                 "--out", work / "mixdry.gguf", *flags], env={**os.environ, "LLMQ_DATA": str(data_dir)})
        return re.findall(r"^(blk\.\d+\.ffn_down\.weight)\s+\[[^\]]*\]\s+\S+\s+(\S+)", r.stdout, re.M)
    imat = plan("--method", "rtn", "--imatrix", smol8_stats[0])
    plain = plan("--method", "rtn")
    assert ("blk.0.ffn_down.weight", "q4_1") in imat and imat != plain, (imat, plain)
    for m in ("gptq", "awq", "awq+gptq"):
        assert plan("--method", m, "--calib", "wikitext-2-valid", "--nsamples", "2", "--seqlen", "64") == imat, m


@pytest.mark.parametrize("name", ["Q4_K_M", "Q4_0", "IQ4_XS"])
def test_rtn_imatrix_byte_identical(llmq_bin, lc, smol8, smol8_stats, work, name):
    """With importance (.dat as llama-quantize reads it; .lcs for Q4_K_M): the same file as llama.cpp's."""
    lcs, dat = smol8_stats
    cases = [(dat, read_dat(dat))] + ([(lcs, read_lcs(lcs, 8))] if name == "Q4_K_M" else [])
    for path, imat in cases:
        ref, mine = work / f"ref_im_{name}.gguf", work / f"mine_im_{name}.gguf"
        lc_quantize(lc, smol8, ref, FTYPES[name], imatrix=imat)
        llmq_q(llmq_bin, smol8, mine, name, "--no-provenance", "--imatrix", path)
        assert same_file(ref, mine) is None, (name, path.name, same_file(ref, mine))
        plain = work / f"mine_{name}.gguf"  # kept by the loop above: the importance must change the bytes
        assert not plain.exists() or same_file(plain, mine) is not None


# Every type llmq writes, in one file: the overrides (first match wins, counters skip manual tensors),
# --output-type on the tied token_embd.
OVERRIDES = [("blk\\.0\\.ffn_down", "q2_k"), ("blk\\.1\\.ffn_down", "q3_k"), ("blk\\.2\\.ffn_down", "q4_k"),
             ("blk\\.3\\.ffn_down", "q5_k"), ("blk\\.4\\.ffn_down", "q6_k"), ("blk\\.5\\.ffn_down", "iq4_xs"),
             ("blk\\.6\\.ffn_down", "bf16"), ("attn_q", "q4_1"), ("attn_k", "q5_1"), ("attn_v", "iq4_nl"),
             ("attn_output", "q4_0"), ("ffn_gate", "q5_0"), ("blk\\.[0-3]\\.ffn_up", "q8_0")]


@pytest.fixture(scope="module")
def every_type(llmq_bin, smol8, work):
    out = work / "every_type.gguf"
    flags = [x for p, t in OVERRIDES for x in ("--tensor-type", f"{p}={t}")]
    llmq_q(llmq_bin, smol8, out, "Q4_K_M", "--no-provenance", "--output-type", "f16", *flags)
    return out


def test_overrides_byte_identical(lc, smol8, every_type, work):
    ref = work / "ref_every_type.gguf"
    lc_quantize(lc, smol8, ref, FTYPES["Q4_K_M"], tt=OVERRIDES, output_type="f16")
    assert same_file(ref, every_type) is None, same_file(ref, every_type)
    types = {t.tensor_type.name for t in gguf.GGUFReader(str(every_type)).tensors}
    assert types >= {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                     "Q8_0", "F16", "BF16", "F32"}, types


@pytest.mark.parametrize("name,flags,kw", [
    ("Q4_K_S", ["--pure"], {"pure": True}),
    ("Q2_K", ["--pure"], {"pure": True}),
    ("Q6_K", ["--embedding-type", "q8_0"], {"emb_type": "q8_0"}),
    ("Q4_0", ["--output-type", "q5_1", "--tensor-type", "FFN_DOWN=q8_0"], {"output_type": "q5_1", "tt": [("ffn_down", "q8_0")]}),
])
def test_pure_and_types_byte_identical(llmq_bin, lc, smol8, work, name, flags, kw):
    ref, mine = work / "ref_opt.gguf", work / "mine_opt.gguf"
    lc_quantize(lc, smol8, ref, FTYPES[name], **kw)
    llmq_q(llmq_bin, smol8, mine, name, "--no-provenance", *flags)
    assert same_file(ref, mine) is None, same_file(ref, mine)


def plan_from_log(text):
    """tensor -> type from llama.cpp's dry-run log lines."""
    out = {}
    for m in re.finditer(r"\]\s+(\S+)\s+- \[[^\]]*\], type =\s+(\S+), size =\s+[0-9.]+ MiB(?: ->\s+[0-9.]+ MiB \((\S+)\))?",
                         text):
        out[m.group(1)] = (m.group(3) or m.group(2)).lower()
    return out


@pytest.mark.heavy
def test_plans_full_model_match_llama_cpp_dry_run(llmq_bin, lc, smollm2_f32, work):
    """30 blocks: every ftype's per-tensor types (use_more_bits, n/8, n/16, attn_v counters) == llama.cpp's."""
    bad = {}
    for name, ft in FTYPES.items():
        for im in (False, True):
            if im and name not in ("Q4_0", "Q5_0", "IQ4_NL", "IQ4_XS"):
                continue
            imat = {f"blk.{l}.{k}.weight": np.ones(576 if k != "ffn_down" else 1536, np.float32) for l in range(30)
                    for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
            ref = plan_from_log(lc_quantize(lc, smollm2_f32, work / "none.gguf", ft, imatrix=imat if im else None,
                                            dry_run=True))
            js = work / "plan.json"
            flags = ["--dry-run", "--json", js]
            if im:  # have_imatrix changes ffn_down choices; --calib with --dry-run only sets that flag
                flags += ["--calib", "wikitext-2-valid"]
            llmq_q(llmq_bin, smollm2_f32, work / "none.gguf", name, *flags)
            mine = {t["name"]: t["type"] for t in json.loads(js.read_text())["tensors"]}
            assert len(ref) == 272 and not (work / "none.gguf").exists()
            if mine != ref:
                bad[(name, im)] = {k: (mine.get(k), ref.get(k)) for k in ref if mine.get(k) != ref[k]}
    assert not bad, bad


@pytest.mark.heavy
def test_full_smollm2_q4_k_m(llmq_bin, lc, smollm2_f32, work):
    """The headline: SmolLM2 f32 -> Q4_K_M equals llama.cpp's file, and llama.cpp runs it."""
    ref, mine = work / "ref_full.gguf", work / "mine_full.gguf"
    lc_quantize(lc, smollm2_f32, ref, FTYPES["Q4_K_M"])
    llmq_q(llmq_bin, smollm2_f32, mine, "Q4_K_M", "--no-provenance")
    assert same_file(ref, mine) is None, same_file(ref, mine)
    ref.unlink()
    logits = llama_logits(lc, mine, [1, 504, 3458, 282, 253, 1345])
    assert np.isfinite(logits).all() and logits.std() > 0.1


def llama_logits(lc, path, tokens):
    llm = lc.Llama(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, n_threads=2, verbose=False)
    llm.eval(tokens)
    out = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    llm.close()
    return out


# ---- llmq only -----------------------------------------------------------------------------------------

def test_every_type_dequantizes_like_gguf_py(llmq_bin, every_type, work):
    """gguf-py's dequantize of every tensor == llmq's (llmq convert --dtype f32 decodes exactly)."""
    f32 = work / "every_type_f32.gguf"
    run([llmq_bin, "convert", "--model", every_type, "--dtype", "f32", "--out", f32, "--force"])
    back = {t.name: t for t in gguf.GGUFReader(str(f32)).tensors}
    for t in gguf.GGUFReader(str(every_type)).tensors:
        ref = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
        got = np.asarray(back[t.name].data, dtype=np.float32).reshape(-1)
        assert np.array_equal(ref.view(np.uint32), got.view(np.uint32)), (t.name, t.tensor_type.name)


def test_provenance_keys_and_report(llmq_bin, smol8, work):
    """Default: llmq.* keys after general.file_type; tensor data unchanged; --json report with totals."""
    out, js = work / "prov.gguf", work / "prov.json"
    r = llmq_q(llmq_bin, smol8, out, "q4_k_m", "--json", js)
    assert "bits per weight" in r.stdout
    rd = gguf.GGUFReader(str(out))
    keys = [k for k in rd.fields if not k.startswith("GGUF.")]
    i = keys.index("general.file_type")
    assert keys[i - 1] == "general.quantization_version"
    assert keys[i + 1:] == ["llmq.version", "llmq.method", "llmq.gguf_type", "llmq.params"], keys[i + 1:]
    assert rd.fields["general.file_type"].contents() == 15
    assert rd.fields["llmq.method"].contents() == "rtn"
    assert json.loads(rd.fields["llmq.params"].contents())["gguf_type"] == "Q4_K_M"
    bare = work / "prov_bare.gguf"
    llmq_q(llmq_bin, smol8, bare, "Q4_K_M", "--no-provenance")
    plain = {t.name: bytes(t.data) for t in gguf.GGUFReader(str(bare)).tensors}
    assert all(bytes(t.data) == plain[t.name] for t in rd.tensors)
    rep = json.loads(js.read_text())
    assert rep["totals"]["tensors"] == len(rd.tensors) and rep["totals"]["file_bytes"] == out.stat().st_size
    assert 4.5 < rep["totals"]["bits_per_weight"] < 9


def test_stories_v3_matches_llama_cpp(llmq_bin, lc, stories_v3, work):
    """ffn_down (172 wide) tiles no 32-element type: F16 in both, said in the log; the rest identical."""
    for name in ("Q4_0", "Q4_K_M", "IQ4_XS"):
        ref, mine = work / "ref_st.gguf", work / "mine_st.gguf"
        lc_quantize(lc, stories_v3, ref, FTYPES[name])
        r = llmq_q(llmq_bin, stories_v3, mine, name, "--no-provenance")
        assert same_file(ref, mine) is None, (name, same_file(ref, mine))
        assert re.search(r"blk\.4\.ffn_down\.weight\s.* ncols 172 not divisible by \d+ \(\w+\) -> f16", r.stderr), r.stderr
        rd = gguf.GGUFReader(str(mine))
        assert {t.tensor_type.name for t in rd.tensors if "ffn_down" in t.name} == {"F16"}


@pytest.fixture(scope="module")
def stories_v1_q4_0(llmq_bin, stories_v1, work):
    out = work / "st_v1_q4_0.gguf"
    r = llmq_q(llmq_bin, stories_v1, out, "Q4_0")
    return out, r


def test_stories_v1_written(stories_v1_q4_0):
    """llama.cpp cannot read GGUF v1 at all; llmq writes a v3 Q4_0 file, ffn_down in F16, and says so."""
    out, r = stories_v1_q4_0
    assert re.search(r"blk\.0\.ffn_down\.weight\s.* ncols 172 not divisible by 32 \(q4_0\) -> f16", r.stderr), r.stderr
    rd = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type.name for t in rd.tensors}
    assert types["blk.0.ffn_down.weight"] == "F16" and types["blk.0.attn_q.weight"] == "Q4_0"
    assert types["output.weight"] == "Q8_0" and types["blk.0.attn_norm.weight"] == "F32"


def test_stories_v1_runs_in_llama_cpp(lc, stories_v1_q4_0):
    logits = llama_logits(lc, stories_v1_q4_0[0], [1, 365, 351, 263])
    assert np.isfinite(logits).all() and logits.std() > 0.1


def test_hf_input_equals_llama_cpp_of_converted(llmq_bin, lc, stories_v3, work):
    """HF directory in: the file llama.cpp makes from `llmq convert`'s GGUF of it (q/k rows permuted)."""
    hf, back = work / "st_hf", work / "st_back.gguf"
    run([llmq_bin, "convert", "--model", stories_v3, "--to", "hf", "--out", hf, "--force"])
    run([llmq_bin, "convert", "--model", hf, "--out", back, "--force"])
    ref, mine = work / "ref_hf.gguf", work / "mine_hf.gguf"
    lc_quantize(lc, back, ref, FTYPES["Q8_0"])
    llmq_q(llmq_bin, hf, mine, "Q8_0", "--no-provenance")
    assert same_file(ref, mine) is None, same_file(ref, mine)


def test_dry_run_writes_nothing(llmq_bin, stories_v3, work):
    out = work / "dry.gguf"
    r = llmq_q(llmq_bin, stories_v3, out, "Q4_K_M", "--dry-run")
    assert not out.exists() and not list(work.glob("dry.gguf.tmp*"))
    assert re.search(r"^blk\.0\.ffn_down\.weight\s+\[64, 172\]\s+f32\s+f16\s", r.stdout, re.M), r.stdout
    assert re.search(r"total: 48 tensors, \d+ weights, [0-9.]+ MiB .* [0-9.]+ bits per weight", r.stdout), r.stdout


@pytest.mark.parametrize("flags,code,msg", [
    (["--gguf-type", "Q4_K_X"], 2, "--gguf-type 'Q4_K_X' is unknown"),
    (["--gguf-type", "Q4_0", "--tensor-type", "attn_(q=q8_0"], 2, "bad regex"),
    (["--gguf-type", "Q4_0", "--tensor-type", "attn_q=iq2_xxs"], 2, "cannot write type iq2_xxs"),
    (["--gguf-type", "Q4_0", "--output-type", "q9_9"], 2, "--output-type 'q9_9'"),
    (["--gguf-type", "Q4_0", "--bits", "4"], 2, "--bits and --group-size do not apply to --format gguf"),
    (["--gguf-type", "Q4_0", "--group-size", "32"], 2, "--bits and --group-size do not apply"),
    (["--format", "gguf"], 2, "needs --gguf-type"),
    (["--format", "awq", "--pure"], 2, "need --format gguf"),
    (["--gguf-type", "Q4_0", "--act-order"], 2, "--act-order needs --method gptq or awq+gptq"),
])
def test_bad_flags(llmq_bin, stories_v3, work, flags, code, msg):
    out = work / "bad.gguf"
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--out", out, *flags], check=False)
    assert r.returncode == code and msg in r.stderr, (r.returncode, r.stderr)
    assert not out.exists()


def test_existing_output_refused(llmq_bin, stories_v3, work):
    out = work / "exists.gguf"
    out.write_bytes(b"keep me")
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--gguf-type", "Q4_0", "--out", out], check=False)
    assert r.returncode == 1 and "exists (use --force" in r.stderr, r.stderr
    assert out.read_bytes() == b"keep me" and not list(work.glob("exists.gguf.tmp*"))
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--gguf-type", "Q4_0", "--out", stories_v3, "--force"],
            check=False)
    assert r.returncode == 1 and "the output is an input of this run" in r.stderr, r.stderr
