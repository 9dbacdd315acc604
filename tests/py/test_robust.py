"""Long jobs that survive (issue "Long jobs that survive"): no output ever clobbers an input or an existing
file, temporaries never outlive their run, bad inputs are refused with a message naming them.

Every case runs the llmq executable on stories260K (five blocks, dim 64) with small calibration and
asserts the exit code and the message; all are light (seconds), so every CI variant runs them (ASan too).
What they check is llmq's own contract (common/io.h "The output guard", common/spill.h), for which no
other tool is an oracle: the files compared are the inputs' own bytes before and after.
"""
import gzip
import hashlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import run

CAL = ["--nsamples", "4", "--seqlen", "32"]


def sha(p):
    return hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()


@pytest.fixture
def work(tmp_path, stories_v3):
    """A directory holding a copy of stories260K (model.gguf) and a calibration text (calib.txt)."""
    shutil.copy(stories_v3, tmp_path / "model.gguf")
    rng = np.random.default_rng(1)
    words = "the cat sat on a mat and then went home to see the dog who was happy".split()
    text = "\n".join(" ".join(rng.choice(words, 60)) for _ in range(50)) + "\n"
    (tmp_path / "calib.txt").write_text(text)
    return tmp_path


def llmq(llmq_bin, cwd, *args, **kw):
    return run([llmq_bin, *args], check=False, cwd=cwd, **kw)


def temps(d):
    return sorted(p.name for p in pathlib.Path(d).iterdir() if ".tmp." in p.name or ".old." in p.name)


# ---- 1. every output path guarded alike ----------------------------------------------------------------

# (argv, the input it names as an output): each secondary output onto an input of the same run, with and
# without --force.
ONTO_INPUTS = [
    (["calib", "--model", "model.gguf", "--calib", "calib.txt", *CAL, "--out", "model.gguf"], "model.gguf"),
    (["calib", "--model", "model.gguf", "--calib", "calib.txt", *CAL, "--out", "c.lcs", "--imatrix-out",
      "calib.txt"], "calib.txt"),
    (["quantize", "--model", "model.gguf", "--gguf-type", "Q8_0", "--calib", "calib.txt", *CAL, "--out", "q.gguf",
      "--json", "calib.txt"], "calib.txt"),
    (["quantize", "--model", "model.gguf", "--gguf-type", "Q8_0", "--out", "model.gguf"], "model.gguf"),
    (["eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "64", "--json", "calib.txt"], "calib.txt"),
    (["eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "64", "--save-logits", "model.gguf"],
     "model.gguf"),
    (["convert", "--model", "model.gguf", "--dtype", "f16", "--out", "model.gguf"], "model.gguf"),
]


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("case", range(len(ONTO_INPUTS)))
def test_output_onto_an_input_is_refused(llmq_bin, work, case, force):
    argv, victim = ONTO_INPUTS[case]
    before = sha(work / victim)
    r = llmq(llmq_bin, work, *argv, *(["--force"] if force else []))
    assert r.returncode == 1, (argv, r.returncode, r.stderr)
    assert f"{victim}: the output is an input of this run" in r.stderr, r.stderr
    assert sha(work / victim) == before and temps(work) == []


def test_output_onto_an_input_through_another_name(llmq_bin, work):
    """Inputs are compared by device and inode, not by name: a hard link and a symbolic link to the model."""
    os.link(work / "model.gguf", work / "hard.gguf")
    os.symlink("calib.txt", work / "soft.txt")
    before = sha(work / "model.gguf")
    for out in ("hard.gguf", "soft.txt"):
        r = llmq(llmq_bin, work, "calib", "--model", "model.gguf", "--calib", "calib.txt", *CAL, "--out", out,
                 "--force")
        assert r.returncode == 1 and "the output is an input of this run" in r.stderr, r.stderr
    assert sha(work / "model.gguf") == before and (work / "soft.txt").is_symlink()


@pytest.mark.parametrize("flag", ["--out", "--imatrix-out", "--json-eval", "--save-logits", "--json-quantize"])
def test_existing_output_needs_force(llmq_bin, work, flag):
    out = work / "existing"
    out.write_bytes(b"keep me")
    if flag.startswith("--json-"):
        cmd = (["eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "64", "--json", "existing"]
               if flag == "--json-eval" else
               ["quantize", "--model", "model.gguf", "--gguf-type", "Q8_0", "--out", "q.gguf", "--json", "existing"])
    elif flag == "--save-logits":
        cmd = ["eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "64", "--save-logits", "existing"]
    else:
        cmd = ["calib", "--model", "model.gguf", "--calib", "calib.txt", *CAL, flag, "existing"]
    r = llmq(llmq_bin, work, *cmd)
    assert r.returncode == 1 and "existing: exists (use --force to replace it)" in r.stderr, r.stderr
    assert out.read_bytes() == b"keep me"
    r = llmq(llmq_bin, work, *cmd, "--force")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() != b"keep me" and temps(work) == []


def test_force_replaces_only_a_directory_llmq_wrote(llmq_bin, work):
    mine = work / "mine"
    (mine).mkdir()
    (mine / "config.json").write_text("{}")
    (mine / "precious.txt").write_text("keep")
    conv = ["convert", "--model", "model.gguf", "--to", "hf"]
    r = llmq(llmq_bin, work, *conv, "--out", "mine", "--force")
    assert r.returncode == 1 and "neither a directory llmq wrote" in r.stderr and ".llmq-output" in r.stderr
    assert (mine / "precious.txt").read_text() == "keep"
    r = llmq(llmq_bin, work, *conv, "--out", "hf")
    assert r.returncode == 0 and (work / "hf" / ".llmq-output").is_file(), r.stderr
    r = llmq(llmq_bin, work, *conv, "--out", "hf", "--dtype", "f16", "--force")
    assert r.returncode == 0, r.stderr
    assert '"float16"' in (work / "hf" / "config.json").read_text() and temps(work) == []
    # an output directory holding an input of the run is not replaced, even though llmq wrote it
    shutil.copy(work / "calib.txt", work / "hf" / "calib.txt")
    r = llmq(llmq_bin, work, "quantize", "--model", "model.gguf", "--method", "gptq", "--calib", "hf/calib.txt",
             *CAL, "--format", "fake", "--group-size", "4", "--out", "hf", "--force")
    assert r.returncode == 1 and "the output is an input of this run (or holds one)" in r.stderr, r.stderr
    assert (work / "hf" / "calib.txt").exists()


def test_two_outputs_of_one_run_on_one_path(llmq_bin, work):
    r = llmq(llmq_bin, work, "calib", "--model", "model.gguf", "--calib", "calib.txt", *CAL, "--out", "x",
             "--imatrix-out", "x")
    assert r.returncode == 1 and "x: named for two outputs of this run" in r.stderr, r.stderr


def wait_for(pred, proc, timeout=120):
    t0 = time.time()
    while not pred():
        assert proc.poll() is None, f"llmq ended (rc {proc.returncode}) before the awaited state"
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.01)


def start(llmq_bin, cwd, *args):
    return subprocess.Popen([str(llmq_bin), *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# Runs that hold their temporary output for seconds (the signal and exclusivity cases act while it exists):
# 400 chunks of 128 tokens (a few seconds; the signal cases stop it early), a GPTQ run of 32 x 128 tokens.
SLOW_EVAL = ["eval", "--model", "model.gguf", "--ppl", "wikitext-2", "--ctx", "128", "--chunks", "400",
             "--threads", "1"]
SLOW_DIR = ["quantize", "--model", "model.gguf", "--method", "gptq", "--calib", "calib.txt", "--nsamples", "32",
            "--seqlen", "128", "--format", "fake", "--group-size", "4", "--threads", "1"]


def test_new_output_is_created_exclusively(llmq_bin, work):
    """A file that appears at a new output path while a run writes it (another run's) is not replaced:
    the final rename is exclusive without --force; the run fails naming the path."""
    p = start(llmq_bin, work, *SLOW_EVAL, "--save-logits", "l.bin")
    wait_for(lambda: any(n.startswith("l.bin.tmp.") for n in temps(work)), p)
    (work / "l.bin").write_bytes(b"the other run's")
    _, err = p.communicate(timeout=600)
    assert p.returncode == 1 and "l.bin: appeared while this run was writing it" in err, err
    assert (work / "l.bin").read_bytes() == b"the other run's" and temps(work) == []


@pytest.mark.parametrize("kind", ["gguf", "dir"])
def test_two_concurrent_runs_one_wins(llmq_bin, work, kind):
    """Two runs started together onto one new path, without --force: exactly one succeeds, the other
    fails naming the path (at its final rename, or at its check when the winner was already done)."""
    argv = ([*SLOW_DIR, "--out", "o"] if kind == "dir" else
            [*SLOW_DIR[:5], "--gguf-type", "Q4_0", *SLOW_DIR[5:11], "--threads", "1", "--out", "o"])
    procs = [start(llmq_bin, work, *argv) for _ in range(2)]
    res = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    ok = [rc for rc, _ in res if rc == 0]
    assert len(ok) == 1, [(rc, e[-1500:]) for rc, e in res]
    loser = [(rc, e) for rc, e in res if rc != 0][0]
    # the loser stops at its final rename, at its check, or (both keep a checkpoint) at the winner's checkpoint
    # o.partial: its creation is exclusive and it is locked while the winner runs (quant/checkpoint.h)
    assert loser[0] == 1 and any(m in loser[1] for m in (
        "o: appeared while this run was writing it", "o: exists", "o.partial: appeared while this run was writing it",
        "o: another llmq run is writing this output")), loser[1][-1500:]
    assert (work / "o").exists() and temps(work) == []


# ---- 2. signals and temporaries --------------------------------------------------------------------------

@pytest.mark.parametrize("sig,rc,word", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
@pytest.mark.parametrize("kind", ["file", "dir"])
def test_signal_removes_temporaries(llmq_bin, work, sig, rc, word, kind):
    argv = [*SLOW_EVAL, "--save-logits", "out"] if kind == "file" else [*SLOW_DIR, "--out", "out"]
    p = start(llmq_bin, work, *argv)
    wait_for(lambda: any(n.startswith("out.tmp.") for n in temps(work)), p)
    time.sleep(0.2)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == rc, (p.returncode, err[-2000:])
    assert err.rstrip().splitlines()[-1].startswith(f"llmq: ") and word in err.rstrip().splitlines()[-1], err
    assert temps(work) == [] and not (work / "out").exists()


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_kill9_leftover_removed_by_next_run(llmq_bin, work, kind):
    # (the quantization keeps no checkpoint here: what kill -9 does to one is tests/py/test_resume.py's)
    argv = [*SLOW_EVAL, "--save-logits", "out"] if kind == "file" else [*SLOW_DIR, "--out", "out", "--no-checkpoint"]
    p = start(llmq_bin, work, *argv)
    wait_for(lambda: any(n.startswith("out.tmp.") for n in temps(work)), p)
    p.kill()
    p.wait()
    left = temps(work)
    assert left == [f"out.tmp.{p.pid}"], left  # what kill -9 leaves
    fast = (["eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "64", "--save-logits", "out"]
            if kind == "file" else
            ["quantize", "--model", "model.gguf", "--format", "fake", "--group-size", "4", "--out", "out"])
    r = llmq(llmq_bin, work, *fast)
    assert r.returncode == 0, r.stderr
    assert f"removed out.tmp.{p.pid}" in r.stderr.replace(str(work) + "/", ""), r.stderr
    assert temps(work) == [] and (work / "out").exists()


def test_a_live_process_temporary_is_kept(llmq_bin, work):
    """A "<out>.tmp.<pid>" whose pid runs is another run's work in progress: not removed."""
    live = subprocess.Popen(["sleep", "60"])
    try:
        (work / f"out.lcs.tmp.{live.pid}").write_bytes(b"in progress")
        r = llmq(llmq_bin, work, "calib", "--model", "model.gguf", "--calib", "calib.txt", *CAL, "--out", "out.lcs")
        assert r.returncode == 0, r.stderr
        assert temps(work) == [f"out.lcs.tmp.{live.pid}"]
    finally:
        live.kill()
        live.wait()


# ---- 3. bad input ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bad_models(stories_v3, tmp_path_factory):
    """stories260K with one NaN / one -Inf in blk.1.ffn_up.weight at row 2, column 7 (gguf-py finds the offset)."""
    from gguf import GGUFReader
    d = tmp_path_factory.mktemp("bad")
    out = {}
    for name, val in (("nan", np.nan), ("-inf", -np.inf)):
        p = d / f"{name}.gguf"
        shutil.copy(stories_v3, p)
        t = next(t for t in GGUFReader(str(p)).tensors if t.name == "blk.1.ffn_up.weight")
        cols = int(t.shape[0])  # gguf-py lists ne0 (the row length) first
        with open(p, "r+b") as f:
            f.seek(t.data_offset + 4 * (2 * cols + 7))
            f.write(np.float32(val).tobytes())
        out[name] = (p, 2 * cols + 7)
    return out


@pytest.mark.parametrize("bad", ["nan", "-inf"])
@pytest.mark.parametrize("method", ["rtn", "gptq", "awq", "awq+gptq"])
@pytest.mark.parametrize("fmt", [["--gguf-type", "Q8_0"], ["--gguf-type", "Q4_K_M"], ["--format", "fake",
                                                                                     "--group-size", "4"]])
def test_non_finite_weights_refused_alike(llmq_bin, work, bad_models, bad, method, fmt):
    path, index = bad_models[bad]
    cal = ["--calib", "calib.txt", *CAL] if method != "rtn" else []
    r = llmq(llmq_bin, work, "quantize", "--model", path, "--method", method, *fmt, *cal, "--out", "o")
    assert r.returncode == 1, (r.returncode, r.stderr)
    want = (f"blk.1.ffn_up.weight: element [2, 7] (index {index}) is {'NaN' if bad == 'nan' else '-Inf'}: "
            "non-finite weights are refused")
    assert want in r.stderr, r.stderr
    assert not (work / "o").exists() and temps(work) == []


def test_eval_names_the_first_non_finite_layer(llmq_bin, work, bad_models):
    r = llmq(llmq_bin, work, "eval", "--model", bad_models["nan"][0], "--ppl", "calib.txt", "--ctx", "64")
    assert r.returncode == 1 and "the output of blk.1 is NaN" in r.stderr, r.stderr


def test_truncated_gzip_is_an_error(llmq_bin, work):
    gz = gzip.compress((work / "calib.txt").read_bytes() * 4)
    (work / "cut.txt.gz").write_bytes(gz[: len(gz) // 2])
    for cmd in (["calib", "--model", "model.gguf", "--calib", "cut.txt.gz", *CAL, "--out", "o.lcs"],
                ["eval", "--model", "model.gguf", "--ppl", "cut.txt.gz", "--ctx", "32"]):
        r = llmq(llmq_bin, work, *cmd)
        assert r.returncode == 1 and "cut.txt.gz: truncated gzip file" in r.stderr, r.stderr
    assert not (work / "o.lcs").exists()


def test_gzip_bomb_is_refused_early(llmq_bin, work):
    """Deflate reaches ~1000:1 on zeros; text compresses ~3-10:1. A .gz that inflates past the cap
    (common/io.h llmq_read_file) is refused once the cap is passed, not after inflating all of it."""
    (work / "bomb.txt.gz").write_bytes(gzip.compress(b"\0" * (256 << 20), 9))  # 250 KiB
    argv = [llmq_bin, "calib", "--model", "model.gguf", "--calib", "bomb.txt.gz", *CAL, "--out", "o.lcs"]
    timed = os.path.exists("/usr/bin/time")
    r = run(["/usr/bin/time", "-f", "maxrss_kb %M", *argv] if timed else argv, check=False, cwd=work)
    assert r.returncode == 1 and "bomb.txt.gz: decompresses to more than" in r.stderr, r.stderr
    assert f"200 times its {(work / 'bomb.txt.gz').stat().st_size} bytes" in r.stderr, r.stderr
    if timed:  # the cap (50 MB here), the buffer's doubling, the model: far below the 256 MiB inflated
        rss_mb = int(r.stderr.split("maxrss_kb ")[1].split()[0]) / 1024
        # ASan's shadow memory and quarantine add about half again (161 MB measured under ASan, ~72 MB without)
        assert rss_mb < (240 if os.environ.get("ASAN_OPTIONS") else 160), rss_mb


@pytest.mark.parametrize("name", ["empty.txt", "empty.txt.gz"])
def test_empty_calibration_text(llmq_bin, work, name):
    (work / name).write_bytes(gzip.compress(b"") if name.endswith(".gz") else b"")
    r = llmq(llmq_bin, work, "calib", "--model", "model.gguf", "--calib", name, *CAL, "--out", "o.lcs")
    assert r.returncode == 1 and f"{name}: the calibration text is empty" in r.stderr, r.stderr


def test_eval_flags(llmq_bin, work):
    r = llmq(llmq_bin, work, "eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "0")
    assert r.returncode == 2 and "--ctx must be between 2 and 1048576" in r.stderr, r.stderr
    r = llmq(llmq_bin, work, "eval", "--model", "model.gguf", "--ppl", ".")
    assert r.returncode == 1 and ".: is a directory" in r.stderr, r.stderr
    r = llmq(llmq_bin, work, "eval", "--model", "model.gguf", "--ppl", "calib.txt", "--ctx", "1024", "--chunks", "1")
    assert "past the training context of model.gguf (512 tokens)" in r.stderr, r.stderr


def test_calibration_sizes_checked_before_allocating(llmq_bin, work):
    r = llmq(llmq_bin, work, "calib", "--model", "model.gguf", "--calib", "calib.txt", "--nsamples", "1048576",
             "--seqlen", "1048576", "--out", "o.lcs")
    assert r.returncode == 1 and "more than this machine's" in r.stderr and "--max-memory" in r.stderr, r.stderr
    r = llmq(llmq_bin, work, "calib", "--model", "model.gguf", "--calib", "calib.txt", "--nsamples", "1048576",
             "--seqlen", "1024", "--max-memory", "1M", "--out", "o.lcs")
    assert r.returncode == 1 and "go to the spill directory" in r.stderr and "bytes free" in r.stderr, r.stderr


def test_spill_enospc_is_a_clear_error(llmq_bin, tool, work):
    """A full spill directory: an error naming it and the bytes, not a SIGBUS (a 1 MiB tmpfs in a user +
    mount namespace; skipped where that is not permitted)."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) to mount a small tmpfs")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {work}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {probe.stderr.strip()}")
    spill = work / "spill"
    spill.mkdir()
    script = (f"mount -t tmpfs -o size=1m tmpfs {spill} && LLMQ_SPILL_DIR={spill} exec {llmq_bin} calib "
              f"--model model.gguf --calib calib.txt --nsamples 64 --seqlen 128 --max-memory 4K --out o.lcs")
    # the preflight (statvfs) refuses 2 MiB beyond the budget in a 1 MiB directory ...
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, cwd=work)
    assert r.returncode == 1 and f"the spill directory {spill}" in r.stderr, r.stderr
    # ... and the allocation itself: a spill file that does not fit is refused by posix_fallocate, where a
    # sparse file would have died of SIGBUS at the first write of a page past the free space
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {spill} && "
                        f"LLMQ_SPILL_DIR={spill} exec {tool('spill_tool')} 4194304 4096"],
                       capture_output=True, text=True, cwd=work)
    assert r.returncode == 1 and f"the spill directory {spill} cannot hold the 4194368 bytes" in r.stderr, \
        (r.returncode, r.stderr)


def test_tokenizer_json_huge_id_refused_before_allocating(llmq_bin, work):
    """One id of 16,777,215 in a small tokenizer.json: refused at once, not padded to 16M tokens (it took
    ~45 s and 800 MB before)."""
    import json
    r = llmq(llmq_bin, work, "convert", "--model", "model.gguf", "--to", "hf", "--out", "hf")
    assert r.returncode == 0, r.stderr
    tj = json.loads((work / "hf" / "tokenizer.json").read_text())
    tj["model"]["vocab"]["zzzz"] = 16777215
    (work / "hf" / "tokenizer.json").write_text(json.dumps(tj))
    t0 = time.time()
    r = llmq(llmq_bin, work, "eval", "--model", "hf", "--ppl", "calib.txt", "--ctx", "32")
    assert r.returncode == 1 and "tokenizer.json: token ids reach 16777215 but only" in r.stderr, r.stderr
    assert time.time() - t0 < 20  # generous for sanitizer builds; the refusal itself takes milliseconds
