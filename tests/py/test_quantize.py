"""`llmq quantize` and `llmq calib` end to end (quant/quantize.h, calib/calib.h).

stories260K (5 blocks, D 64, F 172) for the methods, refusals and determinism; SmolLM2-135M (Q4_1)
with a few calibration windows for "GPTQ's per-layer output error < RTN's" on real activations and
for the awq / gptq output formats loading back in `llmq eval`.
"""
import json
import math
import os
import pathlib
import re

import pytest

from conftest import run

EVAL = ["--ppl", "wikitext-2", "--ctx", "128", "--chunks", "4", "--threads", "2"]


def ppl(llmq_bin, model, data_dir):
    r = run([llmq_bin, "eval", "--model", model, *EVAL], env={**os.environ, "LLMQ_DATA": str(data_dir)})
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", r.stdout)
    assert m, r.stdout
    return float(m.group(1))


def quantize(llmq_bin, model, out, *args, check=True):
    return run([llmq_bin, "quantize", "--model", model, "--out", out, "--threads", "2", *args], check=check)


CAL = ["--calib", "wikitext-2-valid", "--nsamples", "6", "--seqlen", "64", "--seed", "3"]


@pytest.fixture(scope="module")
def base_ppl(llmq_bin, stories_v1, data_dir):
    return ppl(llmq_bin, stories_v1, data_dir)


@pytest.mark.parametrize("method", ["rtn", "gptq", "awq", "awq+gptq"])
def test_methods_run_and_load(llmq_bin, stories_v1, data_dir, tmp_path, base_ppl, method):
    out = tmp_path / "q"
    js = tmp_path / "q.json"
    cal = [] if method == "rtn" else CAL
    r = quantize(llmq_bin, stories_v1, out, "--method", method, "--bits", "4", "--group-size", "4", "--format", "fake",
                 "--json", js, *cal)
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    rep = json.loads(js.read_text())
    assert len(rep["layers"]) == 5 * 7
    assert rep["settings"]["method"] == method
    for row in rep["layers"]:
        e = row.get("err", row.get("weight_err"))
        assert 0 <= e < 0.05, row
    if method != "rtn":
        c = rep["settings"]["calibration"]
        assert c["tokens"] == 6 * 64 and c["sources"][0]["sha256"].startswith("4cd0f687")
    assert re.search(r"blk\.4\.ffn_down\s+64 x 172\s+" + re.escape(method), r.stderr)
    q = ppl(llmq_bin, out, data_dir)
    assert math.isfinite(q) and q < base_ppl * 1.5, (q, base_ppl)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_deterministic_and_spill_identical(llmq_bin, stories_v1, tmp_path, method):
    """Two runs give the same bytes; the second keeps its activations in a spill file (--max-memory 1K)."""
    outs = []
    for k in range(2):
        out = tmp_path / f"d{k}"
        spill = ["--max-memory", "1K"] if k == 1 else []
        r = quantize(llmq_bin, stories_v1, out, "--method", method, "--group-size", "4", "--format", "fake",
                     "--json", tmp_path / f"d{k}.json", *CAL, *spill)
        assert ("temporary file" in r.stderr) == (k == 1), r.stderr[-2000:]
        outs.append(out)
    files = sorted(p.name for p in outs[0].iterdir())
    assert files == sorted(p.name for p in outs[1].iterdir())
    for f in files:
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
    a, b = (json.loads((tmp_path / f"d{k}.json").read_text()) for k in range(2))
    for ra, rb in zip(a["layers"], b["layers"]):
        ra.pop("seconds"), rb.pop("seconds")
        assert ra == rb


def test_tile_refusal(llmq_bin, stories_v1, tmp_path):
    out = tmp_path / "t"
    r = quantize(llmq_bin, stories_v1, out, "--method", "rtn", "--group-size", "32", "--format", "fake", check=False)
    assert r.returncode == 2  # a usage error: the group size does not fit this model
    assert "blk.0.ffn_down" in r.stderr and "172" in r.stderr and "--fallback rtn-per-channel" in r.stderr
    assert "--group-size 4 tiles every linear" in r.stderr  # the largest power of two <= 32 dividing 64 and 172
    assert not out.exists()


def test_default_format_is_the_methods(llmq_bin, stories_v1, tmp_path):
    """No --format: awq for awq (4 bits, a group size), gptq for rtn / gptq / awq+gptq (2, 3, 4, 8 bits), else
    fake. stories260K's 172 rows fit neither packed layout, so the refusal names the format that was chosen."""
    for method, extra, msg in (("awq", [], "AWQ GEMM packs 8 output channels"),
                               ("awq", ["--bits", "3"], "GPTQ packs 3-bit codes"),
                               ("gptq", [], "GPTQ packs 4-bit codes"),
                               ("awq+gptq", [], "GPTQ packs 4-bit codes"),
                               ("rtn", [], "GPTQ packs 4-bit codes")):
        r = quantize(llmq_bin, stories_v1, tmp_path / "d", "--method", method, "--group-size", "4", *extra,
                     *([] if method == "rtn" else CAL), check=False)
        assert r.returncode == 2 and msg in r.stderr, (method, extra, r.stderr)
    for extra in (["--bits", "5"], ["--fallback", "rtn-per-channel"]):
        out = tmp_path / f"f{extra[0]}"
        r = quantize(llmq_bin, stories_v1, out, "--method", "rtn", "--group-size", "4", *extra)
        assert f"({'fake'}, rtn" in r.stdout, r.stdout
        assert json.loads((out / "config.json").read_text()).get("quantization_config") is None


def test_tile_fallback(llmq_bin, stories_v1, data_dir, tmp_path, base_ppl):
    out = tmp_path / "f"
    r = quantize(llmq_bin, stories_v1, out, "--method", "gptq", "--group-size", "32", "--format", "fake",
                 "--fallback", "rtn-per-channel", *CAL, check=False)
    if r.returncode != 0 and "the export expects" in r.stderr:
        pytest.xfail("quant/export.c counts floor(C/G) groups where quant/quantizer.h says ceil(C/G)")
    assert r.returncode == 0, r.stderr
    assert re.search(r"blk\.0\.ffn_down .* rtn-pc", r.stderr)
    assert math.isfinite(ppl(llmq_bin, out, data_dir))


def test_existing_output_refused(llmq_bin, stories_v1, tmp_path):
    out = tmp_path / "e"
    out.mkdir()
    (out / "config.json").write_text("{}")
    r = quantize(llmq_bin, stories_v1, out, "--method", "rtn", "--group-size", "4", "--format", "fake", check=False)
    assert r.returncode == 1 and str(out) in r.stderr
    assert (out / "config.json").read_text() == "{}"
    # --force replaces only a directory llmq wrote (common/io.h LLMQ_OUTDIR_MARKER), not this one
    r = quantize(llmq_bin, stories_v1, out, "--method", "rtn", "--group-size", "4", "--format", "fake", "--force",
                 check=False)
    assert r.returncode == 1 and "neither a directory llmq wrote" in r.stderr, r.stderr
    assert (out / "config.json").read_text() == "{}"
    (out / "config.json").unlink()
    quantize(llmq_bin, stories_v1, out, "--method", "rtn", "--group-size", "4", "--format", "fake", "--force")
    quantize(llmq_bin, stories_v1, out, "--method", "rtn", "--group-size", "4", "--format", "fake", "--force")
    assert (out / "model.safetensors").exists()


def test_usage_errors(llmq_bin, stories_v1, tmp_path):
    r = quantize(llmq_bin, stories_v1, tmp_path / "u", "--method", "gptq", "--group-size", "4", "--format", "fake",
                 check=False)
    assert r.returncode == 2 and "needs calibration data" in r.stderr
    r = quantize(llmq_bin, stories_v1, tmp_path / "u", "--method", "nope", check=False)
    assert r.returncode == 2 and "--method" in r.stderr
    r = run([llmq_bin, "quantize", "--help"])
    for flag in ("--act-order", "--static-groups", "--act-group-aware", "--damp", "--fallback", "--nsamples",
                 "--seqlen", "--seed", "--micro-batch", "--max-memory"):
        assert flag in r.stdout
    # --act-group-aware: GPTQ only, not with --act-order / --static-groups, needs a group size, not gguf
    for extra, msg in ((["--method", "rtn"], "needs --method gptq"),
                       (["--method", "gptq", "--act-order"], "excludes --act-order"),
                       (["--method", "gptq", "--static-groups"], "excludes --act-order and --static-groups"),
                       (["--method", "gptq", "--group-size", "-1"], "needs a group size"),
                       (["--method", "gptq", "--format", "gguf", "--gguf-type", "Q4_0"], "directory format")):
        r = run([llmq_bin, "quantize", "--model", stories_v1, "--out", tmp_path / "gar", "--act-group-aware",
                 *extra], check=False)
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)
    # GPTQ's own flags are refused (not ignored) with rtn and awq, into any format
    for method in ("rtn", "awq"):
        for fmt in ("fake", "awq", "gptq"):
            for flag in (["--act-order"], ["--static-groups"], ["--no-true-sequential"], ["--damp", "0.05"]):
                r = run([llmq_bin, "quantize", "--model", stories_v1, "--out", tmp_path / "g", "--method", method,
                         "--format", fmt, *flag], check=False)
                assert r.returncode == 2 and f"{flag[0]} needs --method gptq" in r.stderr, (method, fmt, flag, r.stderr)
    r = run([llmq_bin, "quantize", "--model", stories_v1, "--out", tmp_path / "g", "--method", "gptq",
             "--damp", "nan"], check=False)
    assert r.returncode == 2 and "not a finite number" in r.stderr, r.stderr
    # the shared calibration flags are range-checked alike in quantize and calib
    for cmd in ("quantize", "calib"):
        for flag, val in (("--nsamples", "0"), ("--seqlen", "1"), ("--micro-batch", "0"), ("--seed", "-1"),
                          ("--max-memory", "3Q")):
            r = run([llmq_bin, cmd, "--model", stories_v1, "--out", tmp_path / "x", "--calib", "self", flag, val],
                    check=False)
            assert r.returncode == 2 and flag in r.stderr, (cmd, flag, r.stderr)


def test_calib_cli(llmq_bin, stories_v1, tmp_path):
    lcs, dat = tmp_path / "s.lcs", tmp_path / "s.dat"
    r = run([llmq_bin, "calib", "--model", stories_v1, *CAL, "--out", lcs, "--imatrix-out", dat, "--threads", "2"])
    assert "tokens sha256" in r.stdout and lcs.stat().st_size > 72
    raw = dat.read_bytes()
    assert int.from_bytes(raw[:4], "little") == 35
    r2 = run([llmq_bin, "calib", "--model", stories_v1, "--imatrix-in", dat])
    r3 = run([llmq_bin, "calib", "--model", stories_v1, "--stats-in", lcs])
    # the per-block mean x² lines agree between the stats file and the imatrix read back
    pick = lambda s: [ln for ln in s.splitlines() if ln.startswith("blk.")]
    assert pick(r2.stdout) == pick(r3.stdout) == pick(r.stdout)
    bad = tmp_path / "bad.lcs"
    bad.write_bytes(b"NOTMAGIC" + lcs.read_bytes()[8:])
    r4 = run([llmq_bin, "calib", "--model", stories_v1, "--stats-in", bad], check=False)
    assert r4.returncode == 1 and "magic" in r4.stderr


def test_installed_manifest(llmq_bin, build_dir, stories_v1, tmp_path):
    """`cmake --install` puts the manifest in share/llmq, and the installed binary reads that one."""
    import shutil
    if shutil.which("cmake") is None:
        pytest.skip("no cmake on PATH")
    prefix = tmp_path / "inst"
    run(["cmake", "--install", build_dir, "--prefix", prefix])
    exe, man = prefix / "bin" / "llmq", prefix / "share" / "llmq" / "manifest.tsv"
    assert exe.exists() and man.exists()
    env = {k: v for k, v in os.environ.items() if k != "LLMQ_MANIFEST"}
    args = [exe, "calib", "--model", stories_v1, *CAL, "--out", tmp_path / "s.lcs"]
    run(args, env=env, cwd=tmp_path)
    # a wrong sha256 in the installed copy is caught, and the message names that copy
    lines = man.read_text().splitlines()
    lines = [re.sub(r"\t[0-9a-f]{64}\t", "\t" + "0" * 64 + "\t", ln) if ln.startswith("wikitext-2-valid\t") else ln
             for ln in lines]
    man.write_text("\n".join(lines) + "\n")
    r = run([*args, "--force"], env=env, cwd=tmp_path, check=False)
    assert r.returncode == 1 and str(prefix / "bin" / ".." / "share" / "llmq" / "manifest.tsv") in r.stderr, r.stderr


def test_smollm2_gptq_beats_rtn_per_layer(llmq_bin, smollm2, data_dir, tmp_path):
    """Real activations, few samples: every linear's ‖WX-QX‖²/‖WX‖² is lower with GPTQ than with RTN of
    the same W on the same X (the pipeline reports both), and the gptq-format output loads in eval."""
    out, js = tmp_path / "g", tmp_path / "g.json"
    quantize(llmq_bin, smollm2, out, "--method", "gptq", "--bits", "4", "--group-size", "64", "--format", "gptq",
             "--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "64", "--json", js, "--allow-requantize")
    rep = json.loads(js.read_text())
    assert len(rep["layers"]) == 30 * 7
    worse = [(r["name"], r["err"], r["rtn_err"]) for r in rep["layers"] if not r["err"] < r["rtn_err"]]
    assert not worse, worse
    assert math.isfinite(ppl(llmq_bin, out, data_dir))


def test_smollm2_awq_format_rtn(llmq_bin, smollm2, data_dir, tmp_path):
    out = tmp_path / "a"
    quantize(llmq_bin, smollm2, out, "--method", "rtn", "--bits", "4", "--group-size", "64", "--format", "awq",
             "--allow-requantize")  # the input is Q4_1
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "awq"
    assert math.isfinite(ppl(llmq_bin, out, data_dir))


def test_calib_sources_self_and_jsonl_gz(llmq_bin, stories_v1, tmp_path):
    import gzip
    src = tmp_path / "c.jsonl.gz"
    with gzip.open(src, "wt") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"Once upon a time there was a dog number {i}. It liked to run and play."}) + "\n")
    reps = []
    for k, cal in enumerate([["--calib", src], ["--calib", "self"], ["--calib", "self"]]):
        js = tmp_path / f"s{k}.json"
        quantize(llmq_bin, stories_v1, tmp_path / f"s{k}", "--method", "gptq", "--group-size", "4", "--format", "fake", *cal,
                 "--nsamples", "2", "--seqlen", "24", "--json", js)
        reps.append(json.loads(js.read_text())["settings"]["calibration"])
    assert reps[0]["sources"][0]["kind"] == "file" and reps[0]["sources"][0]["texts"] == 20
    assert reps[1]["sources"][0]["kind"] == "self" and reps[1]["tokens"] == 48
    assert reps[1]["tokens_sha256"] == reps[2]["tokens_sha256"]  # seeded
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"nope": 1}\n')
    r = quantize(llmq_bin, stories_v1, tmp_path / "sb", "--method", "gptq", "--group-size", "4", "--format", "fake",
                 "--calib", bad, check=False)
    assert r.returncode == 1 and "line 2" in r.stderr


def test_nonfinite_named(llmq_bin, stories_v3, tmp_path):
    """NaN in a weight -> error naming the tensor; Inf in a norm -> non-finite activation named by block."""
    import struct
    from gguf import GGUFReader
    rd = GGUFReader(str(stories_v3))
    off = {t.name: int(t.data_offset) for t in rd.tensors}
    raw = bytearray(pathlib.Path(stories_v3).read_bytes())
    for name, val, expect, method in [("blk.2.ffn_up.weight", float("nan"), "blk.2.ffn_up", "rtn"),
                                      ("blk.1.attn_norm.weight", float("inf"), "blk.1", "gptq")]:
        bad = bytearray(raw)
        bad[off[name] + 8:off[name] + 12] = struct.pack("<f", val)
        p = tmp_path / f"bad_{method}.gguf"
        p.write_bytes(bad)
        r = quantize(llmq_bin, p, tmp_path / f"o_{method}", "--method", method, "--group-size", "4", "--format", "fake",
                     *([] if method == "rtn" else CAL), check=False)
        assert r.returncode == 1 and expect in r.stderr, r.stderr
        assert not (tmp_path / f"o_{method}").exists()
