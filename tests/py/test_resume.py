"""`llmq quantize --resume` (quant/checkpoint.h): a run killed at any point continues from its checkpoint
OUT.partial and writes the bytes of an uninterrupted run.

Model: tests/tools/synth_ckpt.c's "small" shape (four LlamaForCausalLM blocks of width 256, FF 512, bf16, with
stories260K's tokenizer), which every writer tiles: Q4_K_M's 256-blocks, AWQ's and GPTQ's 8-row packing.
Calibration: 4 x 16 tokens of the first 20 kB of wikitext-2 valid, one thread. The three runs of the issue's
"Done when" (GPTQ -> GGUF, AWQ -> awq directory, AWQ+GPTQ -> gptq directory) are each killed with SIGKILL at
checkpoint events drawn from a seeded generator (LLMQ_CKPT_KILL_AT: after a linear was recorded, after a block
file, an activation file or state.json was committed, after the old activations were removed), 10 points in
all, one resume itself killed again, then resumed; plus kills at whatever instant a timer hits. Every resumed
output must equal the uninterrupted run's byte for byte (sha256 of every file), the report's rows (but their
seconds) must equal too, and no temporary or checkpoint may be left. The oracle is the uninterrupted run of
the same executable: what resume promises is that identity, which no other tool can state.

Also: SIGTERM keeps the checkpoint and says how to resume (exit 143); a checkpoint is refused without
--resume, by a resume with other options, another model file or another calibration (the message names
what differs), and discarded by --force; --resume without a checkpoint starts at block 0; two runs onto one
output: the second stops at the first's locked checkpoint; OUT.partial is guarded as every output is.

Every other method x format pair (rtn / gptq / awq / awq+gptq x gguf / awq / gptq / fake) is killed once and
resumed, against its uninterrupted --no-checkpoint run.

rtn into GGUF (the writer alone, no block loop: its output streams into OUT.partial and is committed every
16 MiB) on SmolLM2-135M f32 -> Q4_K_M: kill -9 at 5 seeded tensors (one resume killed again), a timer kill and
SIGTERM after the first commit, a refused resume with other options, --force, rtn --calib (the importance
gathered again on resume) and rtn --imatrix (its sha256 in the fingerprint); each resumed output equals the uninterrupted --no-checkpoint run's byte for byte.

About 70 runs of a second or less, and about 30 SmolLM2 runs of 1-10 s (about 95 s); every CI variant runs it.
"""
import hashlib
import json
import os
import pathlib
import random
import signal
import subprocess
import time

import pytest

from conftest import run

N_LAYER = 4  # synth_ckpt --layers
# checkpoint events of a run of N_LAYER blocks with activations: 7 linears, the block file, state.json per
# block, the next block's activations for all but the last, the previous activations' removal for all but
# the first (quant/checkpoint.c llmq_ckpt_commit_block); block 0's state.json is event 10
EVENTS = 11 * N_LAYER - 2
SEED = int(os.environ.get("LLMQ_TEST_SEED", "16"))
CAL = ["--nsamples", "4", "--seqlen", "16", "--seed", "3", "--threads", "1"]
CASES = {
    # blk.1's ffn_down in f16: a linear handed over as f32 weights (the writer's conversion), next to encoded rows
    "gptq-gguf": (["--method", "gptq", "--format", "gguf", "--gguf-type", "Q4_K_M", "--tensor-type",
                   "blk\\.1\\.ffn_down=f16"], "out.gguf", 4),
    "awq-awq": (["--method", "awq", "--format", "awq", "--group-size", "64"], "out", 3),
    "awqgptq-gptq": (["--method", "awq+gptq", "--format", "gptq", "--group-size", "64"], "out", 3),
}


@pytest.fixture(scope="module")
def work(llmq_bin, tool, stories_v3, data_dir, tmp_path_factory):
    """{model, cal}: the synthetic model and the calibration text."""
    d = tmp_path_factory.mktemp("resume")
    run([llmq_bin, "convert", "--model", stories_v3, "--out", d / "tok", "--to", "hf", "--quiet"])
    run([tool("synth_ckpt"), "--shape", "small", "--layers", N_LAYER, "--out", d / "model", "--tokenizer", d / "tok"])
    cal = d / "cal.txt"
    cal.write_bytes((data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()[:20000])
    return {"model": d / "model", "cal": cal, "root": d}


def argv(llmq_bin, work, case, out, *extra):
    flags, _, _ = CASES[case]
    return [llmq_bin, "quantize", "--model", work["model"], "--calib", work["cal"], *CAL, *flags, "--out", out,
            *extra]


def llmq(cmd, kill_at=None):
    env = dict(os.environ)
    env.pop("LLMQ_CKPT_KILL_AT", None)
    if kill_at is not None:
        env["LLMQ_CKPT_KILL_AT"] = str(kill_at)
    return run(cmd, check=False, env=env)


def digest(p):
    p = pathlib.Path(p)
    if p.is_file():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()}
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(p.iterdir())}


def leftovers(d):
    """Everything in d but the output, the report and the inputs: temporaries, checkpoints."""
    return sorted(p.name for p in pathlib.Path(d).iterdir()
                  if ".tmp." in p.name or ".old." in p.name or p.name.endswith(".partial"))


def rows(report):
    """The report's per-linear rows without their timings."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(pathlib.Path(report).read_text())["layers"]]


def case_dir(work, case, label):
    """A new directory for one scenario of case, and the case's output name."""
    d = work["root"] / label
    d.mkdir()
    return d, CASES[case][1]


def killed_run(llmq_bin, work, case, label, k):
    """case run in a new directory and SIGKILLed at checkpoint event k: (directory, output name, output)."""
    d, name = case_dir(work, case, label)
    r = llmq(argv(llmq_bin, work, case, d / name), kill_at=k)
    assert r.returncode == -signal.SIGKILL, (case, k, r.returncode, r.stderr[-2000:])
    return d, name, d / name


def partial(out):
    return pathlib.Path(str(out) + ".partial")


@pytest.fixture(scope="module")
def reference(llmq_bin, work):
    """case -> (output digest, report rows) of the uninterrupted run."""
    ref = {}
    for case, (_, name, _) in CASES.items():
        d = work["root"] / f"ref-{case}"
        d.mkdir()
        r = llmq(argv(llmq_bin, work, case, d / name, "--json", d / "r.json"))
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"checkpoint {d / name}.partial removed" in r.stderr, r.stderr[-3000:]
        assert leftovers(d) == [], leftovers(d)
        ref[case] = (digest(d / name), rows(d / "r.json"))
    return ref


def kill_points():
    """case -> the sorted kill points of its runs (10 in all), drawn once from SEED."""
    rng = random.Random(SEED)
    return {case: sorted(rng.sample(range(1, EVENTS + 1), n)) for case, (_, _, n) in CASES.items()}


def resume_and_check(llmq_bin, work, case, d, name, reference, why):
    r = llmq(argv(llmq_bin, work, case, d / name, "--resume", "--json", d / "r.json"))
    assert r.returncode == 0, (why, r.stderr[-3000:])
    assert digest(d / name) == reference[case][0], why
    assert rows(d / "r.json") == reference[case][1], why
    assert leftovers(d) == [], (why, leftovers(d))
    return r


@pytest.mark.parametrize("case", sorted(CASES))
def test_kill9_then_resume_is_byte_identical(llmq_bin, work, reference, case):
    _, name, _ = CASES[case]
    points = kill_points()[case]
    for i, k in enumerate(points):
        why = f"{case}: SIGKILL at checkpoint event {k} of {EVENTS} (LLMQ_TEST_SEED={SEED})"
        d = work["root"] / f"kill-{case}-{i}"
        d.mkdir()
        r = llmq(argv(llmq_bin, work, case, d / name), kill_at=k)
        assert r.returncode == -signal.SIGKILL, (why, r.returncode, r.stderr[-2000:])
        assert not (d / name).exists() and partial(d / name).is_dir(), why
        if i == 0 and k < EVENTS:  # the resume is killed too, at a point of its own (it has >= EVENTS - k)
            k2 = random.Random(SEED + k).randint(1, EVENTS - k)
            r = llmq(argv(llmq_bin, work, case, d / name, "--resume"), kill_at=k2)
            assert r.returncode == -signal.SIGKILL, (why, f"then at {k2} of the resume", r.stderr[-2000:])
        r = resume_and_check(llmq_bin, work, case, d, name, reference, why)
        if k >= 10:  # block 0 was committed: 7 linears, its file, its activations, its state.json
            assert "resuming from the checkpoint" in r.stderr, (why, r.stderr[-2000:])


# The other method x format pairs (each with one kill): GGUF takes Q4_K_M (AWQ's Q8_0: its search encodes with the
# type 20 times per linear, and Q4_K's importance search makes that seconds), the directories group 64; rtn runs
# without calibration (no activations: 9 events a block) except into fake, which takes them for its err column.
METHODS = ["rtn", "gptq", "awq", "awq+gptq"]
FORMATS = ["gguf", "awq", "gptq", "fake"]
DONE = {("gptq", "gguf"), ("awq", "awq"), ("awq+gptq", "gptq")}
OTHERS = [(m, f) for m in METHODS for f in FORMATS if (m, f) not in DONE]


def pair_argv(llmq_bin, work, method, fmt, out, *extra):
    gguf_type = "Q8_0" if method.startswith("awq") else "Q4_K_M"
    flags = ["--gguf-type", gguf_type] if fmt == "gguf" else ["--group-size", "64"]
    cal = [] if method == "rtn" and fmt != "fake" else ["--calib", work["cal"], *CAL]
    return [llmq_bin, "quantize", "--model", work["model"], "--method", method, "--format", fmt, *flags, *cal,
            "--threads", "1", "--out", out, *extra]


@pytest.mark.parametrize("method,fmt", OTHERS)
def test_every_method_and_format(llmq_bin, work, method, fmt):
    name = "out.gguf" if fmt == "gguf" else "out"
    d = work["root"] / f"pair-{method}-{fmt}"
    (d / "ref").mkdir(parents=True)
    r = llmq(pair_argv(llmq_bin, work, method, fmt, d / "ref" / name, "--no-checkpoint"))
    assert r.returncode == 0 and "checkpoint" not in r.stderr, r.stderr[-2000:]
    ref = digest(d / "ref" / name)
    out = d / name
    # rtn into GGUF, the writer alone: one event per tensor (the model's 39 are < 16 MiB: no commit, so the resume
    # starts at the first tensor; the SmolLM2 tests below resume from committed ones)
    hi = 4 * 9 + 3 if method == "rtn" and fmt == "gguf" else 9 * N_LAYER
    k = random.Random(f"{SEED}{method}{fmt}").randint(10, hi)
    r = llmq(pair_argv(llmq_bin, work, method, fmt, out), kill_at=k)
    assert r.returncode == -signal.SIGKILL, (k, r.returncode, r.stderr[-2000:])
    r = llmq(pair_argv(llmq_bin, work, method, fmt, out, "--resume"))
    assert r.returncode == 0 and "resuming from the checkpoint" in r.stderr, (k, r.stderr[-2000:])
    assert digest(out) == ref, (method, fmt)
    assert leftovers(d) == [], leftovers(d)


def state(out):
    p = partial(out) / "state.json"
    return json.loads(p.read_text()) if p.exists() else {}


def start(cmd):
    env = {k: v for k, v in os.environ.items() if k != "LLMQ_CKPT_KILL_AT"}
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def wait_blocks(proc, out, n, timeout=120, key="next_block"):
    """Waits until out's checkpoint holds n blocks (key "tensors_done": a stream checkpoint n tensors) (True), or
    the run ended first (False)."""
    t0 = time.time()
    while state(out).get(key, 0) < n:
        if proc.poll() is not None:
            return False
        assert time.time() - t0 < timeout, "timed out"
        time.sleep(0.002)
    return True


def test_timer_kill9_then_resume(llmq_bin, work, reference):
    """kill -9 at whatever instant a timer hits after block k: the state is always consistent."""
    rng = random.Random(SEED + 1)
    killed = 0
    for i, case in enumerate(["awq-awq", "gptq-gguf"]):
        d, name = case_dir(work, case, f"timer-{case}")
        p = start(argv(llmq_bin, work, case, d / name))
        k = rng.randint(1, N_LAYER - 2)
        if wait_blocks(p, d / name, k):
            time.sleep(rng.uniform(0, 0.05))
            p.kill()
        p.communicate(timeout=120)
        if p.returncode == -signal.SIGKILL:
            killed += 1
            resume_and_check(llmq_bin, work, case, d, name, reference, f"{case}: timer kill after block {k}")
    assert killed >= 1, "every run ended before its timer: no kill happened"


def test_sigterm_keeps_the_checkpoint(llmq_bin, work, reference):
    case = "awqgptq-gptq"
    d, name = case_dir(work, case, "sigterm")
    p = start(argv(llmq_bin, work, case, d / name))
    assert wait_blocks(p, d / name, 2), "the run ended before block 2"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    last = err.rstrip().splitlines()[-1]
    assert p.returncode == 143, (p.returncode, err[-2000:])
    assert "SIGTERM" in last and f"checkpoint kept in {d / name}.partial" in last and "--resume" in last, last
    assert not (d / name).exists() and not any(".tmp." in n for n in os.listdir(d)), os.listdir(d)
    assert not any(".tmp." in n for n in os.listdir(partial(d / name))), os.listdir(partial(d / name))
    resume_and_check(llmq_bin, work, case, d, name, reference, "after SIGTERM")


def test_a_checkpoint_of_another_run_is_refused(llmq_bin, work, reference):
    case = "gptq-gguf"
    d, name, out = killed_run(llmq_bin, work, case, "mismatch", 25)
    before = digest(partial(out))
    r = llmq(argv(llmq_bin, work, case, out))
    assert r.returncode == 1 and "add --resume to continue it, or --force" in r.stderr, r.stderr[-2000:]
    cmd = argv(llmq_bin, work, case, out, "--resume")
    i = cmd.index("--nsamples")
    for what, changed in [("settings.damp", [*cmd, "--damp", "0.02"]),
                          ("settings.calibration.nsamples", cmd[:i + 1] + ["5"] + cmd[i + 2:]),
                          ("settings.gguf_type", [c if c != "Q4_K_M" else "Q5_K_M" for c in cmd])]:
        r = llmq(changed)
        assert r.returncode == 1 and "the checkpoint is of another run" in r.stderr and what in r.stderr, \
            (what, r.stderr[-2000:])
    shard = work["model"] / "model.safetensors"
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    try:
        r = llmq(cmd)
        assert r.returncode == 1 and "model.files[" in r.stderr and "mtime_ns" in r.stderr, r.stderr[-2000:]
    finally:
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert digest(partial(out)) == before, "a refused resume changed the checkpoint"
    resume_and_check(llmq_bin, work, case, d, name, reference, "after the refusals")


def test_force_discards_and_resume_without_checkpoint_starts_over(llmq_bin, work, reference):
    case = "awq-awq"
    d, name, out = killed_run(llmq_bin, work, case, "force", 30)
    r = llmq(argv(llmq_bin, work, case, out, "--force"))
    assert r.returncode == 0 and "the previous checkpoint is discarded (--force)" in r.stderr, r.stderr[-2000:]
    assert digest(out) == reference[case][0] and leftovers(d) == []
    d2 = work["root"] / "fresh-resume"
    d2.mkdir()
    r = resume_and_check(llmq_bin, work, case, d2, name, reference, "--resume without a checkpoint")
    assert "nothing to resume, starting at block 0" in r.stderr, r.stderr[-2000:]


def test_the_checkpoint_path_is_guarded(llmq_bin, work):
    """OUT.partial goes through the output guard: a directory llmq did not write is neither resumed nor
    replaced, and one that holds an input of the run is not replaced even with --force."""
    case = "awq-awq"
    d, name = case_dir(work, case, "guard")
    p = partial(d / name)
    p.mkdir()
    (p / "notes.txt").write_text("the user's")
    for extra in (["--resume"], ["--force"]):
        r = llmq(argv(llmq_bin, work, case, d / name, *extra))
        assert r.returncode == 1 and "is not a checkpoint directory llmq wrote" in r.stderr, (extra, r.stderr[-2000:])
    (p / ".llmq-output").write_text("")
    (p / "cal.txt").write_bytes(work["cal"].read_bytes())
    cmd = argv(llmq_bin, work, case, d / name, "--force")
    cmd[cmd.index("--calib") + 1] = p / "cal.txt"
    r = llmq(cmd)
    assert r.returncode == 1 and "is an input of this run" in r.stderr, r.stderr[-2000:]
    assert (p / "notes.txt").read_text() == "the user's" and not (d / name).exists()


def test_second_run_stops_at_the_first_ones_checkpoint(llmq_bin, work):
    case = "awq-awq"
    d, name = case_dir(work, case, "two")
    p = start(argv(llmq_bin, work, case, d / name))
    assert wait_blocks(p, d / name, 1), "the first run ended before block 1"
    p.send_signal(signal.SIGSTOP)  # it holds its checkpoint's lock while the others try
    try:
        for extra in ([], ["--resume"], ["--force"]):
            r = llmq(argv(llmq_bin, work, case, d / name, *extra))
            assert r.returncode == 1 and "another llmq run is writing this output" in r.stderr, \
                (extra, r.stderr[-2000:])
    finally:
        p.send_signal(signal.SIGCONT)
    p.communicate(timeout=120)
    assert p.returncode == 0 and leftovers(d) == [], leftovers(d)


# ---- rtn into GGUF: the writer alone, its output streamed into OUT.partial (quant/checkpoint.h "The writer-only
# run"). SmolLM2-135M f32 -> Q4_K_M: 272 tensors, 98.9 MiB of tensor data, so 5 commits (one per 16 MiB);
# one checkpoint event per tensor written (after its commit, when it made one).
N_TENSORS = 272
RTN = ["--method", "rtn", "--format", "gguf", "--gguf-type", "Q4_K_M", "--threads", "2"]


def rtn_argv(llmq_bin, model, out, *extra):
    return [llmq_bin, "quantize", "--model", model, *RTN, "--out", out, *extra]


@pytest.fixture(scope="module")
def rtn_ref(llmq_bin, smollm2_f32, tmp_path_factory):
    """The sha256 of the uninterrupted run (no checkpoint at all: the oracle of what a checkpoint may change)."""
    d = tmp_path_factory.mktemp("rtn-ref")
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, d / "out.gguf", "--no-checkpoint"))
    assert r.returncode == 0 and "checkpoint" not in r.stderr, r.stderr[-2000:]
    return digest(d / "out.gguf")["out.gguf"]


def rtn_resume(llmq_bin, model, d, ref, why, *extra):
    """--resume in d: the output of the uninterrupted run, no temporary, the checkpoint removed."""
    out = d / "out.gguf"
    r = llmq(rtn_argv(llmq_bin, model, out, "--resume", *extra))
    assert r.returncode == 0 and "resuming from the checkpoint" in r.stderr, (why, r.stderr[-2000:])
    assert f"checkpoint {out}.partial removed" in r.stderr, (why, r.stderr[-2000:])
    assert digest(out)["out.gguf"] == ref, why
    assert leftovers(d) == [], (why, leftovers(d))
    return r


def test_rtn_gguf_kill9_then_resume_is_byte_identical(llmq_bin, smollm2_f32, rtn_ref, tmp_path):
    points = sorted(random.Random(SEED + 2).sample(range(1, N_TENSORS + 1), 5))
    resumed_from = set()
    for i, k in enumerate(points):
        why = f"rtn -> Q4_K_M: SIGKILL at tensor {k} of {N_TENSORS} (LLMQ_TEST_SEED={SEED})"
        d = tmp_path / f"kill-{i}"
        d.mkdir()
        out = d / "out.gguf"
        r = llmq(rtn_argv(llmq_bin, smollm2_f32, out), kill_at=k)
        assert r.returncode == -signal.SIGKILL, (why, r.returncode, r.stderr[-2000:])
        assert not out.exists() and (partial(out) / "output.gguf.part").is_file(), why
        st = state(out)
        assert st["kind"] == "gguf-stream" and st["tensors_done"] <= k, (why, st)
        # what was written after the commit is cut off again: the file may be longer than the state says
        assert (partial(out) / "output.gguf.part").stat().st_size >= st["offset"], why
        resumed_from.add(st["tensors_done"])
        if i == 0 and k < N_TENSORS:  # the resume is killed too, at a point of its own
            r = llmq(rtn_argv(llmq_bin, smollm2_f32, out, "--resume"), kill_at=random.Random(SEED + k).randint(1, 40))
            assert r.returncode == -signal.SIGKILL, (why, "then in the resume", r.stderr[-2000:])
        r = rtn_resume(llmq_bin, smollm2_f32, d, rtn_ref, why)
        if st["tensors_done"]:
            assert f"continuing at tensor {st['tensors_done'] + 1} of {N_TENSORS}" in r.stderr or i == 0, why
    assert len(resumed_from - {0}) >= 2, f"too few points after a commit: {sorted(resumed_from)}"


def test_rtn_gguf_timer_kill_and_sigterm(llmq_bin, smollm2_f32, rtn_ref, tmp_path):
    """kill -9 at whatever instant a timer hits after the first commit; SIGTERM keeps the checkpoint (exit 143,
    its last line says how to continue) and removes no part of it."""
    rng = random.Random(SEED + 3)
    for sig in (signal.SIGKILL, signal.SIGTERM):
        d = tmp_path / sig.name
        d.mkdir()
        out = d / "out.gguf"
        p = start(rtn_argv(llmq_bin, smollm2_f32, out))
        assert wait_blocks(p, out, 1, key="tensors_done"), "the run ended before its first commit"
        time.sleep(rng.uniform(0, 0.5))
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)  # (the first commit comes after ~1 s of a ~4 s run)
        if sig == signal.SIGTERM:
            last = err.rstrip().splitlines()[-1]
            assert p.returncode == 143, (p.returncode, err[-2000:])
            assert "SIGTERM" in last and f"checkpoint kept in {out}.partial" in last and "--resume" in last, last
            assert f"of {N_TENSORS} tensors written" in last, last
        else:
            assert p.returncode == -signal.SIGKILL, (p.returncode, err[-2000:])
        assert not out.exists() and not any(".tmp." in n for n in os.listdir(d)), os.listdir(d)
        assert sorted(os.listdir(partial(out))) == [".llmq-output", "output.gguf.part", "state.json"], \
            os.listdir(partial(out))
        rtn_resume(llmq_bin, smollm2_f32, d, rtn_ref, f"after {sig.name}")


def test_rtn_gguf_checkpoint_of_another_run_is_refused(llmq_bin, smollm2_f32, rtn_ref, tmp_path):
    out = tmp_path / "out.gguf"
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, out), kill_at=150)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    before = digest(partial(out))
    assert state(out)["tensors_done"] > 0
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, out))
    assert r.returncode == 1 and "add --resume to continue it, or --force" in r.stderr, r.stderr[-2000:]
    cmd = rtn_argv(llmq_bin, smollm2_f32, out, "--resume")
    for what, changed in [("settings.gguf_type: \"Q4_K_M\" in the checkpoint, \"Q5_K_M\" now",
                           [c if c != "Q4_K_M" else "Q5_K_M" for c in cmd]),
                          ("settings.pure", [*cmd, "--pure"]),
                          ("run.threads: 2 in the checkpoint, 1 now", [c if c != "2" else "1" for c in cmd])]:
        r = llmq(changed)
        assert r.returncode == 1 and "the checkpoint is of another run" in r.stderr and what in r.stderr, \
            (what, r.stderr[-2000:])
    assert digest(partial(out)) == before, "a refused resume changed the checkpoint"
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, out, "--force"))  # --force discards it and starts over
    assert r.returncode == 0 and "the previous checkpoint is discarded (--force)" in r.stderr, r.stderr[-2000:]
    assert digest(out)["out.gguf"] == rtn_ref and leftovers(tmp_path) == [], leftovers(tmp_path)


def test_rtn_gguf_calibrated_importance_resumes(llmq_bin, smollm2_f32, data_dir, tmp_path):
    """rtn --calib into GGUF: a resume gathers the importance again from the same windows (their tokens_sha256
    and the threads are in the fingerprint) and continues with the same bytes; other windows are refused."""
    cal = tmp_path / "cal.txt"
    cal.write_bytes((data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()[:20000])
    flags = ["--calib", cal, "--nsamples", "2", "--seqlen", "32", "--seed", "3"]
    (tmp_path / "ref").mkdir()
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, tmp_path / "ref" / "out.gguf", *flags, "--no-checkpoint"))
    assert r.returncode == 0, r.stderr[-2000:]
    ref = digest(tmp_path / "ref" / "out.gguf")["out.gguf"]
    d = tmp_path / "run"
    d.mkdir()
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, d / "out.gguf", *flags), kill_at=240)
    assert r.returncode == -signal.SIGKILL and state(d / "out.gguf")["tensors_done"] > 0, r.stderr[-2000:]
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, d / "out.gguf", "--resume", *flags[:-1], "4"))
    assert r.returncode == 1 and "settings.calibration.seed" in r.stderr, r.stderr[-2000:]
    rtn_resume(llmq_bin, smollm2_f32, d, ref, "rtn --calib", *flags)


def test_rtn_gguf_imatrix_is_in_the_fingerprint(llmq_bin, smollm2_f32, data_dir, tmp_path):
    """rtn --imatrix into GGUF: the file's sha256 is in the fingerprint (an imatrix of other content at the same
    path is refused naming it); with the same one the resume has the uninterrupted run's bytes."""
    cal = tmp_path / "cal.txt"
    cal.write_bytes((data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()[:20000])
    for seed in ("3", "4"):
        run([llmq_bin, "calib", "--model", smollm2_f32, "--calib", cal, "--nsamples", "2", "--seqlen", "32", "--seed",
             seed, "--threads", "2", "--no-xtx", "--imatrix-out", tmp_path / f"imat{seed}.dat", "--quiet"])
    imat = tmp_path / "imatrix.dat"
    imat.write_bytes((tmp_path / "imat3.dat").read_bytes())
    (tmp_path / "ref").mkdir()
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, tmp_path / "ref" / "out.gguf", "--imatrix", imat, "--no-checkpoint"))
    assert r.returncode == 0, r.stderr[-2000:]
    ref = digest(tmp_path / "ref" / "out.gguf")["out.gguf"]
    d = tmp_path / "run"
    d.mkdir()
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, d / "out.gguf", "--imatrix", imat), kill_at=240)
    assert r.returncode == -signal.SIGKILL and state(d / "out.gguf")["tensors_done"] > 0, r.stderr[-2000:]
    imat.write_bytes((tmp_path / "imat4.dat").read_bytes())
    r = llmq(rtn_argv(llmq_bin, smollm2_f32, d / "out.gguf", "--imatrix", imat, "--resume"))
    assert r.returncode == 1 and "settings.imatrix.sha256" in r.stderr, r.stderr[-2000:]
    imat.write_bytes((tmp_path / "imat3.dat").read_bytes())
    rtn_resume(llmq_bin, smollm2_f32, d, ref, "rtn --imatrix", "--imatrix", imat)


@pytest.mark.parametrize("fmt", ["gptq", "gguf"])
def test_gptaq_resumes_both_streams(llmq_bin, work, fmt):
    """--gptaq keeps a second (full-precision) activation stream; its checkpoint carries both (x_q, then x_fp in
    the one activation file): a run killed after block 1 and resumed writes the uninterrupted run's bytes. The
    flag changes the output (so the identity is not plain GPTQ's), and the checkpoint is refused by a resume
    without --gptaq or with another --gptaq-alpha (the settings differ)."""
    d = work["root"] / f"gptaq-{fmt}"
    name = "out.gguf" if fmt == "gguf" else "out"
    for sub in ("ref", "plain", "run"):
        (d / sub).mkdir(parents=True)
    r = llmq(pair_argv(llmq_bin, work, "gptq", fmt, d / "ref" / name, "--gptaq", "--no-checkpoint"))
    assert r.returncode == 0, r.stderr[-2000:]
    ref = digest(d / "ref" / name)
    r = llmq(pair_argv(llmq_bin, work, "gptq", fmt, d / "plain" / name, "--no-checkpoint"))
    assert r.returncode == 0 and digest(d / "plain" / name) != ref, r.stderr[-2000:]
    out = d / "run" / name
    r = llmq(pair_argv(llmq_bin, work, "gptq", fmt, out, "--gptaq"), kill_at=11 * 2)  # after block 1
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    act = [p for p in partial(out).iterdir() if p.name.startswith("x-")]
    n_embd = 256  # synth_ckpt's "small" shape
    assert act and act[0].stat().st_size == 2 * 4 * 16 * n_embd * 4, [(p.name, p.stat().st_size) for p in act]
    r = llmq(pair_argv(llmq_bin, work, "gptq", fmt, out, "--gptaq", "--gptaq-alpha", "0.5", "--resume"))
    assert r.returncode != 0 and "gptaq" in r.stderr, r.stderr[-2000:]  # another alpha: refused
    r = llmq(pair_argv(llmq_bin, work, "gptq", fmt, out, "--resume"))
    assert r.returncode != 0 and "gptaq" in r.stderr, r.stderr[-2000:]  # plain GPTQ: refused
    r = llmq(pair_argv(llmq_bin, work, "gptq", fmt, out, "--gptaq", "--resume"))
    assert r.returncode == 0 and "resuming from the checkpoint" in r.stderr, r.stderr[-2000:]
    assert digest(out) == ref
    assert leftovers(d / "run") == [], leftovers(d / "run")
