"""The preflight plan of `llmq quantize` (quant/plan.h; issue "Long jobs that survive", "Preflight plan").

  every format   --dry-run for gguf, awq, gptq and fake prints the output size, the peak RAM, the spill and
                 checkpoint disk with the free space there and an estimated time per stage, --json the same in
                 "preflight"; it exits 0 and writes nothing (no output, no temporary, no checkpoint). The
                 predicted output size is the real run's within 5 % (the tensor data is exact; the headers and
                 side files are estimated).
  the memory     on a shape where the solver's buffers dominate (SmolLM2-135M's, one block), the predicted peak
  model          RSS is within 40 % of the measured maximum RSS (os.wait4's ru_maxrss, file pages included),
                 and GPTQ's peak is at ffn_down (its 1536-wide input's XᵀX in f64 and Hessian).
  free space     a real run whose output does not fit the output directory, or whose activations beyond
                 --max-memory do not fit the spill directory, is refused before any work: exit 1 and a line
                 naming the directory, the bytes needed and the bytes free; nothing is left there. A dry run
                 onto the same directory exits 0 and says a real run would be refused. The file systems are
                 1 MiB tmpfs mounts in a private mount namespace (unshare -rm), skipped where that is not
                 permitted.
The models are tests/tools/synth_ckpt checkpoints with the stories260K tokenizer; every run takes well under a
second, the whole file a few seconds.
"""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from conftest import run


@pytest.fixture(scope="module")
def models(llmq_bin, tool, stories_v3, tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    run([llmq_bin, "convert", "--model", stories_v3, "--to", "hf", "--out", d / "tok", "--quiet"])
    run([tool("synth_ckpt"), "--shape", "tiny", "--tokenizer", d / "tok", "--out", d / "tiny"])
    run([tool("synth_ckpt"), "--shape", "smollm2-135m", "--layers", "1", "--tokenizer", d / "tok", "--out", d / "smol1"])
    rng = np.random.default_rng(1)
    words = "the cat sat on a mat and then went home to see the dog who was happy".split()
    (d / "calib.txt").write_text("\n".join(" ".join(rng.choice(words, 60)) for _ in range(80)) + "\n")
    return d


CAL = ["--nsamples", "8", "--seqlen", "32"]
FORMATS = {
    "gguf": ["--method", "rtn", "--format", "gguf", "--gguf-type", "Q4_K_M"],
    "awq": ["--method", "awq", "--format", "awq", "--group-size", "64", *CAL],
    "gptq": ["--method", "gptq", "--format", "gptq", "--group-size", "64", *CAL],
    "fake": ["--method", "rtn", "--format", "fake", "--group-size", "64"],
}


def quantize(llmq_bin, models, model, out, flags, *extra, check=True):
    cal = ["--calib", models / "calib.txt"] if "--nsamples" in flags else []
    return run([llmq_bin, "quantize", "--model", models / model, "--threads", "2", *flags, *cal, *extra,
                *(["--out", out] if out else [])], check=check)


def size_of(p):
    return p.stat().st_size if p.is_file() else sum(f.stat().st_size for f in p.iterdir())


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_dry_run_prints_the_plan_and_writes_nothing(llmq_bin, models, tmp_path, fmt):
    out, js = tmp_path / ("o.gguf" if fmt == "gguf" else "o"), tmp_path / "plan.json"
    r = quantize(llmq_bin, models, "tiny", out, FORMATS[fmt], "--dry-run", "--json", js)
    for what in ("preflight plan (estimates, nothing written)", "  output       ", "  peak RAM     ",
                 "  spill        none", f"  checkpoint   {out}.partial/", f"  free space   {tmp_path}: ",
                 "  time         about ", "f32 GEMM", "GFLOP/s", "    weights to f32 "):
        assert what in r.stdout, (what, r.stdout)
    if "--nsamples" in FORMATS[fmt]:
        assert "  calibration  256 tokens" in r.stdout, r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no output, temporary or checkpoint
    p = json.load(open(js))["preflight"]
    assert p["estimate"] is True and p["output"] == str(out) and p["vram_bytes"] is None  # a CPU run
    assert p["output_bytes"] > 0 and p["ram_peak_bytes"] >= p["ram_anon_bytes"] > 0 and p["ram_peak_phase"]
    assert p["checkpoint_written"] is True and p["linear_output_bytes"] > 0  # every run keeps OUT.partial
    if fmt == "gguf":  # rtn into GGUF: its state; the partial output in it is the output's own file
        assert p["checkpoint_bytes"] == 65536, p["checkpoint_bytes"]
    else:  # the blocks' outputs and the activations
        assert p["checkpoint_bytes"] >= p["linear_output_bytes"], p["checkpoint_bytes"]
    assert p["seconds"] > 0 and p["stages"] and all(s["seconds"] >= 0 for s in p["stages"])
    assert p["rates"]["sgemm_flops"] > 0 and p["disk"][0]["dir"] == str(tmp_path)
    assert p["disk"][0]["bytes"] == p["output_bytes"] + p["checkpoint_bytes"]
    assert p["disk"][0]["free_bytes"] > 0
    quantize(llmq_bin, models, "tiny", out, FORMATS[fmt])
    real = size_of(out)
    assert abs(p["output_bytes"] - real) <= 0.05 * real, (p["output_bytes"], real)


def test_dry_run_of_a_directory_without_out(llmq_bin, models, tmp_path):
    r = run([llmq_bin, "quantize", "--model", models / "tiny", "--format", "gptq", "--group-size", "64",
             "--dry-run"], cwd=tmp_path)
    assert "  output       (no --out): " in r.stdout and "  free space   .: " in r.stdout, r.stdout
    assert not list(tmp_path.iterdir())
    r = run([llmq_bin, "quantize", "--model", models / "tiny", "--format", "gptq", "--group-size", "64"],
            check=False, cwd=tmp_path)
    assert r.returncode == 2 and "--out DIR is required" in r.stderr, r.stderr


def max_rss(cmd):
    """Exit status and maximum RSS in bytes (anonymous and file pages) of one run of cmd."""
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_peak_ram_against_the_measured_rss(llmq_bin, models, tmp_path, fmt):
    out, js = tmp_path / "o", tmp_path / "plan.json"
    flags = [*FORMATS[fmt][:-4], "--nsamples", "4", "--seqlen", "32", "--calib", models / "calib.txt"]
    base = [llmq_bin, "quantize", "--model", models / "smol1", "--threads", "2", *flags, "--out", out]
    run([*base, "--dry-run", "--json", js])
    p = json.load(open(js))["preflight"]
    rc, rss = max_rss(base)
    assert rc == 0
    assert 0.6 * rss <= p["ram_peak_bytes"] <= 1.4 * rss, (p["ram_peak_bytes"], rss, p["ram_peak_phase"])
    if fmt == "gptq":
        assert "ffn_down" in p["ram_peak_phase"], p["ram_peak_phase"]


# ---- free space ----------------------------------------------------------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    """A command runner inside a private mount namespace with a 1 MiB tmpfs on tmp_path / "fs"."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) to mount a small tmpfs")
    fs = tmp_path / "fs"
    fs.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {fs}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {probe.stderr.strip()}")

    def in_ns(cmd, env=None):
        """Runs cmd with the tmpfs mounted; prints the tmpfs's entries after it ("left: ...")."""
        line = " ".join(f"'{c}'" for c in map(str, cmd))
        script = f"mount -t tmpfs -o size=1m tmpfs {fs} && {line}; rc=$?; echo left: $(ls -A {fs}); exit $rc"
        return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True,
                              env={**os.environ, **(env or {})})
    return fs, in_ns


def test_output_that_does_not_fit_is_refused(llmq_bin, models, small_fs):
    fs, in_ns = small_fs
    base = [llmq_bin, "quantize", "--model", models / "smol1", "--gguf-type", "Q8_0", "--threads", "2",
            "--out", fs / "o.gguf"]
    r = in_ns(base)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"not enough free space in {fs} for the output {fs}/o.gguf" in r.stderr, r.stderr
    assert re.search(r"\d+ bytes \([0-9.]+ [KMG]iB\) needed, 1048576 bytes \(1\.0 MiB\) free; nothing was started", r.stderr) \
        and "--out" in r.stderr, r.stderr
    assert "left: \n" in r.stdout or r.stdout.strip() == "left:", r.stdout  # nothing written there
    r = in_ns([*base, "--dry-run"])
    assert r.returncode == 0 and f"  free space   {fs}: " in r.stdout and "a real run would be refused" in r.stdout, \
        (r.returncode, r.stdout, r.stderr)
    # a directory format alike
    r = in_ns([llmq_bin, "quantize", "--model", models / "smol1", "--format", "fake", "--group-size", "64",
               "--out", fs / "fake"])
    assert r.returncode == 1 and f"not enough free space in {fs} for the output {fs}/fake" in r.stderr, r.stderr


def test_spill_that_does_not_fit_is_refused(llmq_bin, models, tmp_path, small_fs):
    fs, in_ns = small_fs
    cmd = [llmq_bin, "quantize", "--model", models / "tiny", "--method", "gptq", "--format", "gptq",
           "--group-size", "64", "--calib", models / "calib.txt", "--nsamples", "16", "--seqlen", "64",
           "--max-memory", "4K", "--threads", "2", "--out", tmp_path / "o"]
    r = in_ns(cmd, env={"LLMQ_SPILL_DIR": str(fs)})
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert f"not enough free space in {fs} for the spill files beyond --max-memory" in r.stderr, r.stderr
    assert "LLMQ_SPILL_DIR" in r.stderr and re.search(r"\d+ bytes \([0-9.]+ MiB\) needed", r.stderr), r.stderr
    assert not (tmp_path / "o").exists() and not [p for p in tmp_path.iterdir() if ".tmp." in p.name]
    r = in_ns([*cmd, "--dry-run"], env={"LLMQ_SPILL_DIR": str(fs)})
    assert r.returncode == 0 and f"in {fs} (activations beyond --max-memory)" in r.stdout, r.stdout
