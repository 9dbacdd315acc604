"""Sweeps: `llmq quantize --gguf-type A,B,...` / `--bits A,B,...` write one output per level from one command
(cli/cmd_quantize.c, quant/quantize.h "Sweeps"). Each level's output must be byte-identical to the single run
of that level (so the shared calibration changes nothing but the time), rtn's importance is gathered once, every
output path is checked before any work, and --compare runs `llmq compare` on the levels."""
import os
import re

from conftest import run

CAL = ["--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "64", "--threads", "2"]


def files(d):
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_gguf_sweep_equals_single_runs(llmq_bin, stories_v1, tmp_path):
    types = ["Q8_0", "Q4_0", "Q5_1"]  # 32-element blocks tile stories260K's 64-wide rows
    r = run([llmq_bin, "quantize", "--model", stories_v1, "--format", "gguf", "--gguf-type", ",".join(types),
             "--out", tmp_path / "s-{}.gguf", "--json", tmp_path / "s-{}.json", *CAL])
    # one calibration pass: the later levels say they reuse it
    assert r.stderr.count("importance from the sweep's calibration pass") == len(types) - 1, r.stderr
    for t in types:
        one = tmp_path / f"one-{t}.gguf"
        run([llmq_bin, "quantize", "--model", stories_v1, "--format", "gguf", "--gguf-type", t, "--out", one, *CAL])
        assert (tmp_path / f"s-{t}.gguf").read_bytes() == one.read_bytes(), t
        assert (tmp_path / f"s-{t}.json").exists()
        assert f"s-{t}.gguf (gguf {t}" in r.stdout


def test_bits_sweep_equals_single_runs(llmq_bin, stories_v1, tmp_path):
    common = ["--method", "rtn", "--group-size", "32", "--fallback", "rtn-per-channel", "--format", "fake"]
    run([llmq_bin, "quantize", "--model", stories_v1, *common, "--bits", "8,3", "--out", tmp_path / "b{}"])
    for b in (8, 3):
        run([llmq_bin, "quantize", "--model", stories_v1, *common, "--bits", b, "--out", tmp_path / f"one{b}"])
        assert files(tmp_path / f"b{b}") == files(tmp_path / f"one{b}"), b


def test_sweep_checks_every_output_first(llmq_bin, stories_v1, tmp_path):
    (tmp_path / "s-Q4_0.gguf").write_bytes(b"keep")
    r = run([llmq_bin, "quantize", "--model", stories_v1, "--format", "gguf", "--gguf-type", "Q8_0,Q4_0", "--out",
             tmp_path / "s-{}.gguf"], check=False)
    assert r.returncode == 1 and "s-Q4_0.gguf" in r.stderr and "--force" in r.stderr, r.stderr
    assert not (tmp_path / "s-Q8_0.gguf").exists() and (tmp_path / "s-Q4_0.gguf").read_bytes() == b"keep"


def test_sweep_usage_errors(llmq_bin, stories_v1, tmp_path):
    g = ["quantize", "--model", stories_v1, "--format", "gguf"]
    for argv, msg in ((g + ["--gguf-type", "Q8_0,Q4_0", "--out", tmp_path / "x.gguf"], "must hold {}"),
                      (g + ["--gguf-type", "Q8_0,Q9_9", "--out", tmp_path / "x-{}.gguf"], "'Q9_9' is unknown"),
                      (g + ["--gguf-type", "Q8_0,Q4_0", "--out", tmp_path / "x-{}.gguf", "--json", tmp_path / "j"],
                       "must hold {}"),
                      (g + ["--gguf-type", "Q8_0", "--out", tmp_path / "x.gguf", "--compare"], "two levels"),
                      (["quantize", "--model", stories_v1, "--bits", "8,x", "--out", tmp_path / "d{}"], "--bits"),
                      (["quantize", "--model", stories_v1, "--bits", "8,9", "--group-size", "32", "--fallback",
                        "rtn-per-channel", "--out", tmp_path / "d{}"], "--bits")):
        r = run([llmq_bin, *argv], check=False)
        assert r.returncode == 2 and msg in r.stderr, (argv, r.stderr)


def test_sweep_then_compare(llmq_bin, stories_v1, tmp_path):
    r = run([llmq_bin, "quantize", "--model", stories_v1, "--format", "gguf", "--gguf-type", "Q8_0,Q4_0", "--out",
             tmp_path / "s-{}.gguf", "--compare", "--compare-chunks", "2"], env=dict(os.environ, LLMQ_CACHE=str(tmp_path / "c")))
    for t in ("Q8_0", "Q4_0"):
        assert re.search(rf"^s-{t}\.gguf\s+\S+\s+\S+\s+\d+\.\d+", r.stdout, re.M), r.stdout
    assert (tmp_path / "c" / "compare").is_dir()
