"""`llmq quantize --format gguf --mix quality / --target-bpw / --target-size` (quant/gguf_choose.h).

Oracles: gguf-py decodes every tensor of the files (its own dequantizers, not llmq's), numpy computes each
tensor's reconstruction error against the f32 input, and llama.cpp (llama-cpp-python 0.3.36) runs the files.
  - --mix quality: every tensor's type is no larger than the llama mix's; where it differs, gguf-py's error
    of the chosen type is lower than that of the mix's type in the mix's file (no importance: plain squared
    error, the choice's measure then); where it is the same, the bytes are the same; llama.cpp runs the file.
  - --target-bpw: the file's bits per weight (tensor data × 8 / weights, from gguf-py) is at most the target
    and within one linear's largest step of it; --dry-run prints the plan and writes nothing.
  - the same command twice gives the same bytes; GPTQ gets the types RTN gets from the same calibration.
  - --sensitivity measured: every allocated linear's measured and predicted KLD in --json and --dry-run
    (quant/gguf_sens.h; their values are checked in tests/unit/test_gguf_sens.c), a choice unlike uniform's;
  - flag errors exit 2 with a message naming the flag.
Input: smol8 (SmolLM2 f32 cut to 8 blocks, 576-wide rows that 256-blocks do not tile) and stories260K.
"""
import json

import numpy as np
import pytest
import gguf

from conftest import gguf_first_blocks, run
from test_gguf_mix import smol_f32_path


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf_choose")


@pytest.fixture(scope="module")
def smol8(work):
    return gguf_first_blocks(smol_f32_path(), work / "smol8.gguf", 8)


def quantize(llmq_bin, model, out, gtype, *flags, check=True):
    return run([llmq_bin, "quantize", "--model", model, "--format", "gguf", "--gguf-type", gtype, "--threads", "2",
                "--no-provenance", "--force", "--out", out, *flags], check=check)


def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def decoded(t):
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1, t.shape[0])


def sq_err(orig, t):
    """Σ (w - q)² over the rows the choice samples (stride ceil(R / 2048), quant/gguf_choose.h)."""
    w = np.asarray(orig.data, dtype=np.float64).reshape(-1, orig.shape[0])
    stride = -(-w.shape[0] // 2048)
    return float(((w[::stride] - decoded(t)[::stride]) ** 2).sum())


def tensor_bits(path):
    ts = tensors(path).values()
    return 8.0 * sum(int(t.n_bytes) for t in ts) / sum(int(t.n_elements) for t in ts)


@pytest.mark.heavy
@pytest.mark.parametrize("gtype", ["Q3_K_M", "Q4_K_M"])
def test_quality_lower_error_no_larger(llmq_bin, smol8, work, gtype):
    mix, qual = mix_file(llmq_bin, smol8, work, gtype), work / f"qual_{gtype}.gguf"
    quantize(llmq_bin, smol8, qual, gtype, "--mix", "quality")
    src, tm, tq = tensors(smol8), tensors(mix), tensors(qual)
    assert tm.keys() == tq.keys()
    changed = 0
    for name, a in tm.items():
        b = tq[name]
        assert int(b.n_bytes) <= int(a.n_bytes), (name, a.tensor_type.name, b.tensor_type.name)
        if a.tensor_type == b.tensor_type:
            assert np.array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8)), name
            continue
        changed += 1
        ea, eb = sq_err(src[name], a), sq_err(src[name], b)
        assert eb < ea, (name, a.tensor_type.name, ea, b.tensor_type.name, eb)
    # 576-wide rows: Q3_K's fallback Q4_0 loses to IQ4_NL (same size), Q4_K's Q5_0 to Q4_1 on this base
    assert changed > 0
    assert tensor_bits(qual) <= tensor_bits(mix)


@pytest.fixture(scope="module")
def lc():
    try:
        import llama_cpp
    except Exception as e:  # missing package, or its shared libraries do not load
        pytest.skip(f"llama_cpp not importable: {e}")
    return llama_cpp


def mix_file(llmq_bin, smol8, work, gtype="Q3_K_M"):
    mix = work / f"mix_{gtype}.gguf"
    if not mix.exists():
        quantize(llmq_bin, smol8, mix, gtype)
    return mix


@pytest.mark.heavy
def test_quality_and_target_files_run_in_llama_cpp(llmq_bin, lc, smol8, work):
    files = [work / "qual_Q3_K_M.gguf", work / "target_run.gguf"]
    if not files[0].exists():
        quantize(llmq_bin, smol8, files[0], "Q3_K_M", "--mix", "quality")
    quantize(llmq_bin, smol8, files[1], "Q3_K_M", "--target-bpw", f"{tensor_bits(mix_file(llmq_bin, smol8, work)):.6f}")
    for f in files:
        llm = lc.Llama(model_path=str(f), n_ctx=64, n_batch=64, logits_all=True, n_threads=2, verbose=False)
        toks = [1, 504, 3458, 282, 253, 1345]
        llm.eval(toks)
        logits = np.array(llm.scores[:len(toks)], dtype=np.float32)
        llm.close()
        assert np.isfinite(logits).all() and logits.std() > 0.1, f


@pytest.mark.heavy
def test_target_bpw_budget_and_dry_run(llmq_bin, smol8, work):
    mix = mix_file(llmq_bin, smol8, work)
    src = tensors(smol8)
    params = sum(int(t.n_elements) for t in src.values())
    # one linear's largest step: its Q8_0 bytes less its smallest type's (Q2_K / Q4_0 ...), bounded by Q8_0
    step_bits = 8.0 * max(int(t.n_elements) * 34 // 32 for n, t in src.items() if n.startswith("blk.")) / params
    # smol8's floor is high (its 49152 x 576 token_embd keeps the mix's Q8_0): targets around the mix's size
    for target in (tensor_bits(mix), tensor_bits(mix) + 0.25):
        out, js = work / "target.gguf", work / "target.json"
        # without Q4_1, which rebuilds this base's linears exactly (every error would be 0 at 5 bits)
        quantize(llmq_bin, smol8, out, "Q3_K_M", "--target-bpw", f"{target:.6f}", "--json", js, "--mix-exclude", "q4_1")
        got = tensor_bits(out)
        assert got <= target + 1e-9 and target - got <= step_bits, (target, got, step_bits)
        rep = json.load(open(js))
        assert rep["settings"]["mix"] == "target" and rep["totals"]["predicted_err"] > 0
        assert any("target: ->" in t["note"] for t in rep.get("gguf", rep)["tensors"])  # rtn: the writer's report
    dry = work / "dry_target.gguf"
    target = tensor_bits(mix) + 0.1
    r = quantize(llmq_bin, smol8, dry, "Q3_K_M", "--target-bpw", f"{target:.6f}", "--dry-run")
    assert not dry.exists() and not list(work.glob("dry_target.gguf.tmp*"))
    assert "type choice: target; predicted err" in r.stdout and "target: -> " in r.stdout, r.stdout
    r2 = quantize(llmq_bin, smol8, dry, "Q3_K_M", "--target-size", str(int(target * params / 8)), "--dry-run")
    # the same budget in bytes: the same plan (the preflight after it has this run's measured rates)
    assert r2.stdout.split("\npreflight plan")[0] == r.stdout.split("\npreflight plan")[0]


@pytest.mark.heavy
def test_same_command_same_bytes(llmq_bin, smol8, work):
    target = f"{tensor_bits(mix_file(llmq_bin, smol8, work)):.6f}"
    for flags in (["--mix", "quality"], ["--target-bpw", target, "--mix-exclude", "q4_1"]):
        a, b = work / "det_a.gguf", work / "det_b.gguf"
        quantize(llmq_bin, smol8, a, "Q3_K_M", *flags)
        quantize(llmq_bin, smol8, b, "Q3_K_M", *flags)
        assert a.read_bytes() == b.read_bytes(), flags
        if "--mix-exclude" in flags:
            assert all(t.tensor_type != gguf.GGMLQuantizationType.Q4_1 for t in tensors(a).values())


def test_gptq_gets_the_types_rtn_gets(llmq_bin, stories_v3, work):
    """GPTQ chooses from the full-precision model's statistics on its calibration: the same as rtn --calib."""
    cal = ["--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "64", "--mix", "quality"]
    a, b = work / "st_rtn.gguf", work / "st_gptq.gguf"
    quantize(llmq_bin, stories_v3, a, "Q3_K_M", "--method", "rtn", *cal)
    r = quantize(llmq_bin, stories_v3, b, "Q3_K_M", "--method", "gptq", *cal)
    ta, tb = tensors(a), tensors(b)
    assert {n: t.tensor_type for n, t in ta.items()} == {n: t.tensor_type for n, t in tb.items()}
    assert any(t.tensor_type == gguf.GGMLQuantizationType.IQ4_NL for t in tb.values()), r.stderr


def test_measured_sensitivity_reports_predicted_kld(llmq_bin, stories_v3, work):
    """--sensitivity measured (auto's choice for a size target with --calib): every allocated linear gets a
    positive measured KLD (sens_kld) and a predicted one; the totals sum them; --dry-run prints the predicted KLD
    next to the types; the choice differs from uniform's (asked for, or auto's without --calib); the settings
    record the windows."""
    cal = ["--calib", "wikitext-2-valid", "--nsamples", "3", "--seqlen", "64", "--sensitivity-windows", "2",
           "--sensitivity-seqlen", "48"]
    mix = work / "st_mix.gguf"
    quantize(llmq_bin, stories_v3, mix, "Q4_K_M")
    target = ["--target-bpw", f"{tensor_bits(mix) + 0.3:.6f}", "--mix-exclude", "q4_1"]
    js, out = work / "st_meas.json", work / "st_meas.gguf"
    quantize(llmq_bin, stories_v3, out, "Q4_K_M", *target, *cal, "--json", js)  # auto: measured with --calib
    rep = json.load(open(js))
    ts = [t for t in rep.get("gguf", rep)["tensors"] if "sens_kld" in t]
    assert len(ts) == 5 * 6, [t["name"] for t in ts]  # every linear but the 172-wide ffn_down (no block tiles it)
    assert all(t["sens_kld"] > 0 and t["pred_kld"] > 0 for t in ts)
    tot = rep["totals"]
    assert tot["predicted_kld"] == pytest.approx(sum(t["pred_kld"] for t in ts), rel=1e-9)
    assert tot["predicted_kld_mix"] == pytest.approx(sum(t["sens_kld"] for t in ts), rel=1e-9)
    assert tot["predicted_kld"] < tot["predicted_kld_mix"]  # 0.3 bits per weight more than the mix
    assert tot["sensitivity"]["tokens"] == 2 * 48 and rep["settings"]["sensitivity"] == {"windows": 2, "seqlen": 48}
    uni, ujs = work / "st_uni.gguf", work / "st_uni.json"
    quantize(llmq_bin, stories_v3, uni, "Q4_K_M", *target, *cal, "--sensitivity", "uniform", "--json", ujs)
    assert {n: t.tensor_type for n, t in tensors(uni).items()} != {n: t.tensor_type for n, t in tensors(out).items()}
    assert "predicted_kld" not in json.load(open(ujs))["totals"]
    quantize(llmq_bin, stories_v3, uni, "Q4_K_M", *target, "--json", ujs)  # auto without --calib: uniform
    assert "predicted_kld" not in json.load(open(ujs))["totals"]
    r = quantize(llmq_bin, stories_v3, work / "st_dry.gguf", "Q4_K_M", *target, "--sensitivity", "measured", *cal,
                 "--dry-run")
    assert "sensitivity: measured on 96 calibration tokens; predicted KLD of the linears" in r.stdout, r.stdout
    assert r.stdout.count("predicted KLD ") == 5 * 6 + 1


@pytest.mark.parametrize("flags,msg", [
    (["--gguf-type", "Q4_K_M", "--target-bpw", "5", "--target-size", "1M"], "exclude each other"),
    (["--gguf-type", "Q4_K_M", "--mix", "quality", "--target-bpw", "5"], "--mix quality excludes"),
    (["--gguf-type", "Q4_K_M", "--mix", "best"], "--mix must be llama or quality"),
    (["--gguf-type", "Q4_K_M", "--target-bpw", "0"], "--target-bpw must be"),
    (["--gguf-type", "Q4_K_M", "--target-size", "lots"], "--target-size 'lots'"),
    (["--gguf-type", "Q4_K_M", "--mix-exclude", "q4_1"], "--mix-exclude needs"),
    (["--gguf-type", "Q4_K_M", "--mix", "quality", "--mix-exclude", "f16"], "not a block type"),
    (["--format", "gptq", "--target-bpw", "4"], "need --format gguf"),
    (["--format", "awq", "--mix", "quality"], "need --format gguf"),
    (["--gguf-type", "Q4_K_M", "--target-bpw", "1.5"], "below the smallest this model reaches"),
    (["--gguf-type", "Q4_K_M", "--target-bpw", "8", "--sensitivity", "kld"], "--sensitivity must be"),
    (["--gguf-type", "Q4_K_M", "--sensitivity", "measured"], "--sensitivity needs"),
    (["--gguf-type", "Q4_K_M", "--target-bpw", "8", "--sensitivity", "measured"], "needs --calib"),
    (["--gguf-type", "Q4_K_M", "--target-bpw", "8", "--sensitivity-windows", "0"], "must be >= 1"),
])
def test_bad_flags(llmq_bin, stories_v3, work, flags, msg):
    out = work / "bad.gguf"
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--out", out, *flags], check=False)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)
    assert not out.exists()
