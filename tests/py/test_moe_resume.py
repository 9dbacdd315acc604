"""`llmq quantize --resume` of a mixture of experts (quant/checkpoint.h): a run killed at a block boundary, inside a
block's experts or at whatever instant a timer hits continues from its checkpoint OUT.partial and writes the bytes of
an uninterrupted run, with the same report.

Models: the random tiny MoE checkpoints of tests/py/hf_moe_model.py (tiny-qmoe: qwen3_moe, 8 experts of width 48,
top-3; tiny-mix: mixtral, 8 experts of width 96, top-2; wide-qmoe: qwen3_moe, 4 experts of width 256) and
tests/py/hf_qwen2moe_model.py (tiny-q2moe, wide-q2moe: qwen2_moe with its shared expert), two blocks each (the
fixtures of tests/py/family_oracle.py). Calibration: 4 x 32 tokens of the first 20 kB of wikitext-2 valid, one
thread.

Checkpoint events of a run (LLMQ_CKPT_KILL_AT, quant/checkpoint.h "Fault injection"): per block one per linear
handed over (4 attention linears, 3 per expert, qwen2_moe: 3 of the shared expert), then the block file, the next
block's activations (block 0 only), state.json, and the previous activations' removal (block 1 only). With n linears
a block the boundaries are n + 1 (block 0's file, not yet committed: resumes at block 0), n + 3 (block 0 committed),
2n + 4 (block 1's file, not committed), 2n + 5 (every block committed: the resume replays both and only writes);
the state.json next_block at each is checked, so the arithmetic is too. A kill inside block 1's experts (n + 3 + n/2)
leaves a partly recorded block that the resume discards.

Each resumed output must equal the uninterrupted run's (sha256 of every file), the report's rows (but their seconds),
its "moe" coverage object (per-layer routed counts, experts under the floor, fallback_rtn) and bits per weight must
too, and no temporary or checkpoint may be left. The qwen3_moe GPTQ case runs --moe-calib routed with a token floor
that some experts of block 0 miss: their RTN fallback and the report's fallback count come from the checkpoint.

Cases: qwen3_moe gptq -> gptq directory (5 kill points), qwen3_moe awq -> GGUF Q8_0 (4 points; the stacked
ffn_gate_exps / ffn_up_exps in Q8_0 are encoded rows, ffn_down_exps (48-wide rows) in F16 is handed over as f32
weights, the router carries AWQ's scales), mixtral awq+gptq -> gptq directory (3), mixtral rtn -> awq directory (1),
qwen2_moe gptq -> GGUF Q4_K_M (2, wide-q2moe: Q4_K / Q6_K stacked experts, the shared expert and its gate) plus a
timer kill, qwen2_moe awq -> awq directory (1); rtn -> GGUF Q4_K_M (the writer alone, its output streamed into the
checkpoint, LLMQ_CKPT_SYNC_BYTES making the small file commit) at 2 points; a checkpoint refused by a resume with
another --moe-calib or --moe-token-floor (the fingerprint's run.moe_calib / run.moe_token_floor).
"""
import json
import os
import pathlib
import random
import signal
import subprocess
import time

import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, build_hf_models
from family_oracle import ids, work  # noqa: F401 (fixtures)
from test_resume import digest, leftovers, partial, state

pytestmark = pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)
SEED = int(os.environ.get("LLMQ_TEST_SEED", "16"))
CAL = ["--nsamples", "4", "--seqlen", "32", "--seed", "3", "--threads", "1"]
N_LAYER = 2
ROUTED = ["--moe-calib", "routed", "--moe-token-floor", "40"]  # 128 tokens x top-3 over 8: some experts miss 40
CASES = {  # name: model, flags, output name, kill points (by boundary name, see boundaries())
    "qmoe-gptq-dir": ("tiny-qmoe", ["--method", "gptq", "--format", "gptq", "--bits", "4", "--group-size", "16",
                                    *ROUTED], "out", ["file0", "block0", "file1", "all", "mid1"]),
    "qmoe-awq-gguf": ("tiny-qmoe", ["--method", "awq", "--format", "gguf", "--gguf-type", "Q8_0"], "out.gguf",
                      ["file0", "block0", "file1", "all"]),
    "mix-awqgptq-dir": ("tiny-mix", ["--method", "awq+gptq", "--format", "gptq", "--bits", "4", "--group-size", "16"],
                        "out", ["block0", "file1", "mid1"]),
    "mix-rtn-awq": ("tiny-mix", ["--method", "rtn", "--format", "awq", "--group-size", "16"], "out", ["block0"]),
    "q2moe-gptq-gguf": ("wide-q2moe", ["--method", "gptq", "--format", "gguf", "--gguf-type", "Q4_K_M"], "out.gguf",
                        ["block0", "file1"]),
    "q2moe-awq-dir": ("tiny-q2moe", ["--method", "awq", "--format", "awq", "--group-size", "16"], "out", ["mid1"]),
}


@pytest.fixture(scope="module")
def models(llmq_bin, stories_v3, work, ids):  # noqa: F811 (fixtures)
    """name -> the random model's directory (both scripts, each in its own directory)."""
    out = {}
    for sub, script in (("moe", "hf_moe_model.py"), ("q2moe", "hf_qwen2moe_model.py")):
        (work / sub).mkdir()
        build_hf_models(llmq_bin, stories_v3, work / sub, ids, script, HF_PYTHON)
        out.update({p.name: p for p in (work / sub).iterdir() if (p / "config.json").exists()})
    return out


@pytest.fixture(scope="module")
def cal(data_dir, work):  # noqa: F811 (fixtures)
    p = work / "cal.txt"
    p.write_bytes((data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()[:20000])
    return p


def argv(llmq_bin, models, cal, case, out, *extra):
    model, flags, _, _ = CASES[case]
    return [llmq_bin, "quantize", "--model", models[model], "--calib", cal, *CAL, *flags, "--out", out, *extra]


def llmq(cmd, kill_at=None, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_CKPT_")}
    env.update(env_extra or {})
    if kill_at is not None:
        env["LLMQ_CKPT_KILL_AT"] = str(kill_at)
    return run(cmd, check=False, env=env)


def report(path):
    """What a resume must reproduce of the JSON report: rows without their seconds, the coverage, the bits."""
    j = json.loads(pathlib.Path(path).read_text())
    return dict(rows=[{k: v for k, v in r.items() if k != "seconds"} for r in j["layers"]], moe=j.get("moe"),
                bpw=j["totals"]["bits_per_weight"])


def n_linears(model_dir):
    """The linears handed over per block: 4 attention, 3 per expert, qwen2_moe's shared expert's 3."""
    c = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    e = c.get("num_local_experts") or c.get("num_experts")
    return 4 + 3 * e + (3 if c.get("shared_expert_intermediate_size", 0) > 0 else 0)


def boundaries(n):
    """boundary name -> (checkpoint event, the next_block state.json holds after a kill there)."""
    return {"file0": (n + 1, 0), "block0": (n + 3, 1), "mid1": (n + 3 + n // 2, 1), "file1": (2 * n + 4, 1),
            "all": (2 * n + 5, 2)}


@pytest.fixture(scope="module")
def reference(llmq_bin, models, cal, work):  # noqa: F811 (fixtures)
    """case -> (output digest, report) of the uninterrupted run (with its checkpoint, removed at the end)."""
    ref = {}
    for case, (_, _, name, _) in CASES.items():
        d = work / f"ref-{case}"
        d.mkdir()
        r = llmq(argv(llmq_bin, models, cal, case, d / name, "--json", d / "r.json"))
        assert r.returncode == 0, r.stderr[-3000:]
        assert f"checkpoint {d / name}.partial removed" in r.stderr, r.stderr[-3000:]
        assert leftovers(d) == [], leftovers(d)
        ref[case] = (digest(d / name), report(d / "r.json"))
    return ref


def resume_and_check(llmq_bin, models, cal, case, d, reference, why):
    name = CASES[case][2]
    r = llmq(argv(llmq_bin, models, cal, case, d / name, "--resume", "--json", d / "r.json"))
    assert r.returncode == 0, (why, r.stderr[-3000:])
    assert digest(d / name) == reference[case][0], why
    got, want = report(d / "r.json"), reference[case][1]
    for k in want:
        assert got[k] == want[k], (why, k)
    assert leftovers(d) == [], (why, leftovers(d))
    return r


def test_the_routed_case_falls_back_in_block_0(reference):
    """The qwen3_moe gptq case's report has experts under the floor in block 0: its fallbacks come from the
    checkpoint when the resume starts at block 1."""
    moe = reference["qmoe-gptq-dir"][1]["moe"]
    assert moe["calib"] == "routed" and moe["layers"][0]["under_floor"] and moe["fallback_rtn"] > 0, moe
    rows = reference["qmoe-gptq-dir"][1]["rows"]
    assert any(r.get("fallback") and r["name"].startswith("blk.0.") for r in rows)


@pytest.mark.parametrize("case", sorted(CASES))
def test_kill9_at_block_boundaries_then_resume_is_byte_identical(llmq_bin, models, cal, work, reference, case):
    model, _, name, points = CASES[case]
    b = boundaries(n_linears(models[model]))
    for where in points:
        k, next_block = b[where]
        why = f"{case}: SIGKILL at checkpoint event {k} ({where})"
        d = work / f"kill-{case}-{where}"
        d.mkdir()
        r = llmq(argv(llmq_bin, models, cal, case, d / name), kill_at=k)
        assert r.returncode == -signal.SIGKILL, (why, r.returncode, r.stderr[-2000:])
        assert not (d / name).exists() and state(d / name)["next_block"] == next_block, (why, state(d / name))
        r = resume_and_check(llmq_bin, models, cal, case, d, reference, why)
        said = f"all {N_LAYER} blocks done" if next_block == N_LAYER else f"replayed {next_block} blocks"
        if next_block:
            assert "resuming from the checkpoint" in r.stderr and said in r.stderr, (why, r.stderr[-2000:])


def test_timer_kill9_then_resume(llmq_bin, models, cal, work, reference):
    """kill -9 at whatever instant a timer hits after block 0 was committed (wide-q2moe gptq -> Q4_K_M: its block 1
    takes most of a second)."""
    case = "q2moe-gptq-gguf"
    rng = random.Random(SEED)
    killed = 0
    for i in range(2):
        d = work / f"timer-{i}"
        d.mkdir()
        out = d / CASES[case][2]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMQ_CKPT_")}
        p = subprocess.Popen([str(c) for c in argv(llmq_bin, models, cal, case, out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        t0 = time.time()
        while state(out).get("next_block", 0) < 1 and p.poll() is None:
            assert time.time() - t0 < 120, "timed out"
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.3))
        p.kill()
        p.communicate(timeout=120)
        if p.returncode == -signal.SIGKILL:
            killed += 1
            resume_and_check(llmq_bin, models, cal, case, d, reference, f"timer kill {i}")
    assert killed >= 1, "every run ended before its timer: no kill happened"


def test_rtn_gguf_stream_resumes(llmq_bin, models, work):
    """rtn into GGUF (the writer alone): the stacked experts stream into OUT.partial like any tensor; committed
    every 100 kB here (LLMQ_CKPT_SYNC_BYTES), a kill after some commits resumes at the committed tensor."""
    cmd = [llmq_bin, "quantize", "--model", models["wide-qmoe"], "--method", "rtn", "--format", "gguf",
           "--gguf-type", "Q4_K_M", "--threads", "1"]
    (work / "rtn-ref").mkdir()
    r = llmq([*cmd, "--out", work / "rtn-ref" / "out.gguf", "--no-checkpoint"])
    assert r.returncode == 0, r.stderr[-2000:]
    ref = digest(work / "rtn-ref" / "out.gguf")
    sync = {"LLMQ_CKPT_SYNC_BYTES": "100000"}
    for k in (12, 26):
        d = work / f"rtn-{k}"
        d.mkdir()
        r = llmq([*cmd, "--out", d / "out.gguf"], kill_at=k, env_extra=sync)
        assert r.returncode == -signal.SIGKILL, (k, r.stderr[-2000:])
        done = state(d / "out.gguf")["tensors_done"]
        assert 0 < done <= k, (k, done)
        r = llmq([*cmd, "--out", d / "out.gguf", "--resume"], env_extra=sync)
        assert r.returncode == 0 and f"{done} of 27 tensors written" in r.stderr, (k, r.stderr[-2000:])
        assert digest(d / "out.gguf") == ref and leftovers(d) == [], k


def test_a_resume_with_other_moe_options_is_refused(llmq_bin, models, cal, work, reference):
    case = "qmoe-gptq-dir"
    name = CASES[case][2]
    d = work / "mismatch"
    d.mkdir()
    k, _ = boundaries(n_linears(models["tiny-qmoe"]))["block0"]
    r = llmq(argv(llmq_bin, models, cal, case, d / name), kill_at=k)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    before = digest(partial(d / name))
    cmd = argv(llmq_bin, models, cal, case, d / name, "--resume")
    i = cmd.index("--moe-calib")
    for what, changed in [("run.moe_calib", cmd[:i + 1] + ["all"] + cmd[i + 2:]),
                          ("run.moe_token_floor", cmd[:i + 3] + ["8"] + cmd[i + 4:])]:
        r = llmq(changed)
        assert r.returncode == 1 and "the checkpoint is of another run" in r.stderr and what in r.stderr, \
            (what, r.stderr[-2000:])
    assert digest(partial(d / name)) == before, "a refused resume changed the checkpoint"
    resume_and_check(llmq_bin, models, cal, case, d, reference, "after the refusals")


def test_dry_run_counts_the_checkpoint(llmq_bin, models, cal, work):
    """--dry-run's plan counts a moe run's checkpoint (quant/plan.h "Disk"): at its largest (both blocks committed,
    the last activations not yet removed) the real one is within the planned bytes, which hold the experts' linears."""
    case = "q2moe-gptq-gguf"
    d = work / "plan"
    d.mkdir()
    out = d / CASES[case][2]
    r = llmq(argv(llmq_bin, models, cal, case, out, "--dry-run", "--json", d / "plan.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    p = json.loads((d / "plan.json").read_text())["preflight"]
    assert p["checkpoint_written"] is True and p["checkpoint_bytes"] >= p["linear_output_bytes"] > 0, p
    assert p["disk"][0]["bytes"] == p["output_bytes"] + p["checkpoint_bytes"], p["disk"]
    k, _ = boundaries(n_linears(models["wide-q2moe"]))["all"]
    r = llmq(argv(llmq_bin, models, cal, case, out), kill_at=k)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    names = sorted(f.name for f in partial(out).iterdir())
    assert names == [".llmq-output", "block-00000.bin", "block-00001.bin", "state.json", "x-00001.bin"], names
    used = sum(f.stat().st_size for f in partial(out).iterdir())
    assert 0.5 * p["checkpoint_bytes"] < used <= p["checkpoint_bytes"], (used, p["checkpoint_bytes"])
