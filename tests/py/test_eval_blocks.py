"""`llmq eval`'s block path (calib/eval/eval.h "Decoder blocks": the decoder blocks through kernels/block.h,
layer-major over a batch of chunks) against the forward.c path, on the CPU backend through the test hook
LLMQ_EVAL_BLOCK=cpu, so that the wiring the CUDA path uses (batches, upload / download of the hidden state,
the weights loaded once per layer and batch, the finite check, the fallbacks) runs without a GPU.

Agreement, as measured (OpenBLAS 0.3.21, Haswell kernels):
  one chunk per batch, --threads 1   BIT FOR BIT: the same cblas_sgemm calls and op code paths (kernels/block.h),
                                     so the logits files are byte-identical, and PPL / KLD figures equal.
  B > 1 chunks per batch             the block's products run over M = B·n tokens instead of n, and forward.c on
                                     --threads 2 splits W's rows over the threads: both are reorderings of the same
                                     f32 sums. Measured max |Δlogit| / max |logit|: stories260K 1.0e-6 (8 chunks of
                                     128) and 2.0e-6 (300 chunks of 64, batches of 256 + 44), SmolLM2 Q4_1 2.9e-6
                                     (3 chunks of 512; forward.c --threads 1 vs 2 alone: 5.0e-6); PPL within 1.1e-7
                                     relative.
  Tolerances for B > 1: LOGIT_RTOL = 1e-4 of max |logit| is NOT derived from an error analysis: it is 20x the
  largest reordering difference measured above and 4 orders of magnitude under what a wiring error moves (a
  chunk attending to another chunk, a block skipped or run twice, a wrong position: O(1) logits). The other
  checks follow from it exactly: NLL = logsumexp(z) - z_target moves by at most 2 max |Δz|, so
  |ln(PPL_a / PPL_b)| <= 2 max |Δz|; and KL(p || q) <= 2 max |Δz|^2 for logits z, z + Δz (KL <= chi^2 / 2 and
  |q/p - 1| <= e^(2 max |Δz|) - 1), which bounds the block path's KLD against forward.c's saved logits (plus
  KLD_FLOOR, the rounding of llmq's own KLD sum, which can be slightly negative for near-equal logits).

--max-vram bounds the batch (fewer chunks per batch; below one chunk's buffers: forward.c).
Fallbacks (one info line naming the reason): --emulate, a family kernels/block.h does not cover (a random gemma2
checkpoint on stories260K's tokenizer), a bad LLMQ_EVAL_BLOCK value (an error). Non-finite hidden states: the block
path names the same layer, position and chunk as forward.c.
"""
import json
import struct

import numpy as np
import pytest

from conftest import run, tiny_gemma2

LOGIT_RTOL = 1e-4
KLD_FLOOR = 1e-9  # the KLD's own rounding (double sums over V = 49152 terms): measured -1.9e-10 for near-equal logits
HOOK = "eval: decoder blocks on cpu through kernels/block.h (LLMQ_EVAL_BLOCK=cpu, the test hook)"
FALLBACK = "eval: decoder blocks through calib/model/forward.c (on the CPU): "


@pytest.fixture(scope="module")
def wiki(data_dir):
    return data_dir / "wikitext-2-raw" / "wiki.test.raw"


def env_with(block):
    """The environment with LLMQ_EVAL_BLOCK set to block (None: unset)."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "LLMQ_EVAL_BLOCK"}
    if block:
        env["LLMQ_EVAL_BLOCK"] = block
    return env


@pytest.fixture
def ev(llmq_bin, tmp_path):
    """ev(name, *args, block=False, save=False) -> (json report, logits (K, R, V) or None, stderr). block: through
    the hook (LLMQ_EVAL_BLOCK=cpu; its info line is checked); save: --save-logits in f32, read back."""
    def go(name, *args, block=False, save=False):
        j, lg = tmp_path / f"{name}.json", tmp_path / f"{name}.logits"
        extra = ["--save-logits", lg, "--logits-dtype", "f32", "--force"] if save else []
        r = run([llmq_bin, "eval", *args, *extra, "--json", j], env=env_with("cpu" if block else None))
        assert (HOOK in r.stderr) == block, r.stderr
        return json.loads(j.read_text()), (read_logits(lg) if save else None), r.stderr
    return go


def final(stdout):
    """The "Final estimate: PPL = ..." line of `llmq eval`'s report (the rest holds timings)."""
    return next(line for line in stdout.splitlines() if line.startswith("Final estimate"))


def read_logits(path):
    """(K, R, V) f32 logits of an llmq logits file (calib/eval/eval.h "Logits file")."""
    b = path.read_bytes()
    assert b[:8] == b"LLMQLOGT" and struct.unpack("<I", b[12:16])[0] == 0  # f32
    V, n, K, _, R = struct.unpack("<5q", b[24:64])
    off = (128 + 4 * K * n + 63) // 64 * 64
    return np.frombuffer(b[off:], np.float32).reshape(K, R, V)


def check_close(a, b, la, lb, what):
    """Reports a and b (json), logits la and lb: within LOGIT_RTOL and the PPL bound that follows from it."""
    dz = float(np.max(np.abs(la.astype(np.float64) - lb)))
    zmax = float(np.max(np.abs(la)))
    print(f"{what}: max |dlogit| {dz:.3g} = {dz / zmax:.2g} of max |logit| {zmax:.3g}; "
          f"ppl {a['ppl']!r} vs {b['ppl']!r} (rel {abs(a['ppl'] / b['ppl'] - 1):.2g})")
    assert dz <= LOGIT_RTOL * zmax, what
    assert abs(np.log(a["ppl"] / b["ppl"])) <= 2 * dz + 1e-12, what
    return dz


# ---- bit for bit: one chunk per batch, one thread ---------------------------------------------------------

def test_one_chunk_one_thread_bit_for_bit(ev, data_dir, smollm2, wiki):
    stories = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"
    for name, model, ctx in [("st", stories, "128"), ("smol", smollm2, "512")]:
        args = ["--model", model, "--ppl", wiki, "--ctx", ctx, "--chunks", "1", "--threads", "1"]
        a, la, _ = ev(name + "_fwd", *args, save=True)
        b, lb, err = ev(name + "_blk", *args, save=True, block=True)
        assert "batches of 1 chunks" in err
        assert np.array_equal(la.view(np.uint32), lb.view(np.uint32)), name
        assert a["ppl"] == b["ppl"] and a["ppl_uncertainty"] == b["ppl_uncertainty"], name


@pytest.fixture(scope="module")
def smol_perturbed(smollm2, tmp_path_factory):
    """The SmolLM2 Q4_1 file with blk.3.ffn_norm.weight (f32) scaled by 1.5: a second model of the same vocabulary
    that diverges from the first (gguf-py finds the offset)."""
    import shutil

    from gguf import GGUFReader
    p = tmp_path_factory.mktemp("smol") / "perturbed.gguf"
    shutil.copy(smollm2, p)
    t = next(t for t in GGUFReader(str(p)).tensors if t.name == "blk.3.ffn_norm.weight")
    w = np.array(t.data, np.float32) * np.float32(1.5)
    with open(p, "r+b") as f:
        f.seek(t.data_offset)
        f.write(w.tobytes())
    return p


@pytest.mark.heavy
def test_kld_base_one_chunk_one_thread_equal(ev, smollm2, smol_perturbed, wiki):
    args = ["--model", smol_perturbed, "--kld-base", smollm2, "--ppl", wiki, "--chunks", "1", "--threads", "1"]
    a, _, _ = ev("kb_fwd", *args)
    b, _, _ = ev("kb_blk", *args, block=True)
    print(f"KLD-base: kld_mean {a['kld']['kld_mean']:.4g}, ppl {a['ppl']:.6g} vs base {a['kld']['ppl_base']:.6g}")
    assert a["kld"]["kld_mean"] > 1e-3  # a real divergence, computed the same way by both paths
    assert a["kld"] == b["kld"] and a["ppl"] == b["ppl"]  # every KLD-mode figure, both PPLs included


# ---- batches of several chunks ---------------------------------------------------------------------

@pytest.mark.parametrize("protocol, ctx, chunks, batches", [
    ("llamacpp", 128, 8, "batches of 8 chunks (1024 tokens)"),
    ("gptq", 64, 300, "batches of 256 chunks (16384 tokens)"),  # 256 + a tail of 44 (LLMQ_EVAL_BATCH_TOKENS)
])
def test_stories260k_batches(ev, data_dir, wiki, protocol, ctx, chunks, batches):
    stories = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"
    args = ["--model", stories, "--ppl", wiki, "--protocol", protocol, "--ctx", str(ctx), "--chunks", str(chunks)]
    a, la, _ = ev("fwd", *args, save=True)
    b, lb, err = ev("blk", *args, save=True, block=True)
    assert batches in err and a["tokens_scored"] == b["tokens_scored"]
    check_close(a, b, la, lb, f"stories260K {protocol} ctx {ctx} x {chunks}")


def test_max_vram_bounds_the_batch(ev, llmq_bin, data_dir, wiki):
    """--max-vram 1000K / 1500K (stories260K's buffers: about 0.55 MB per 128-token chunk): batches of 2 / 3 chunks, the
    logits within LOGIT_RTOL of the 8-chunk run's (the same reordering bound as above); 1K, below one chunk's
    buffers: forward.c, with the line saying why."""
    stories = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"
    args = ["--model", stories, "--ppl", wiki, "--ctx", "128", "--chunks", "8"]
    a, la, err = ev("full", *args, save=True, block=True)
    assert "batches of 8 chunks" in err
    r = run([llmq_bin, "eval", *args, "--max-vram", "1K"], env=env_with("cpu"))
    assert FALLBACK in r.stderr and "exceed --max-vram (0 MiB)" in r.stderr, r.stderr[-2000:]
    for vram, want in (("1000K", "batches of 2 chunks"), ("1500K", "batches of 3 chunks")):
        b, lb, err = ev(f"v{vram}", *args, "--max-vram", vram, save=True, block=True)
        assert want in err, err[-2000:]
        check_close(a, b, la, lb, f"--max-vram {vram}")


@pytest.mark.heavy
def test_smollm2_batch_and_kld_file(ev, smollm2, wiki, tmp_path):
    args = ["--model", smollm2, "--ppl", wiki, "--chunks", "2", "--threads", "2"]
    a, la, _ = ev("fwd", *args, save=True)
    b, lb, err = ev("blk", *args, save=True, block=True)
    assert "batches of 2 chunks (1024 tokens)" in err
    dz = check_close(a, b, la, lb, "SmolLM2 Q4_1 2 x 512")
    # the block path's logits against forward.c's saved ones (--kld FILE: the model's side through the blocks)
    k, _, _ = ev("kld", "--model", smollm2, "--kld", tmp_path / "fwd.logits", "--threads", "2", block=True)
    print(f"KLD of the block path against forward.c's logits: mean {k['kld']['kld_mean']:.3g}, bound {2 * dz * dz:.3g}")
    assert k["ppl"] == b["ppl"]  # the same block computation as the run that saved lb
    bound = 2 * dz * dz + KLD_FLOOR
    assert abs(k["kld"]["kld_mean"]) <= bound and abs(k["kld"]["kld_quantiles"]["max"]) <= bound
    assert k["kld"]["same_top_p"] == 1.0


# ---- fallbacks and errors ----------------------------------------------------------------------------

def test_emulate_takes_forward_c(llmq_bin, stories_v1, wiki):
    args = [llmq_bin, "eval", "--model", stories_v1, "--ppl", wiki, "--ctx", "64", "--chunks", "2", "--emulate",
            "llamacpp-cpu"]
    a, b = run(args, env=env_with(None)), run(args, env=env_with("cpu"))
    assert FALLBACK + "--emulate llamacpp-cpu rounds activations as llama.cpp does" in b.stderr, b.stderr
    assert "decoder blocks" not in a.stderr and final(a.stdout) == final(b.stdout)


def test_gemma2_takes_forward_c(llmq_bin, stories_v3, wiki, tmp_path):
    """A random gemma2 checkpoint (stories260K's tokenizer via `llmq convert`): the hook falls back, naming it."""
    d = tiny_gemma2(llmq_bin, stories_v3, tmp_path)
    args = [llmq_bin, "eval", "--model", d, "--ppl", wiki, "--ctx", "64", "--chunks", "2"]
    a, b = run(args, env=env_with(None)), run(args, env=env_with("cpu"))
    assert FALLBACK + f"{d}: the backend block forward covers llama, mistral, qwen2 and qwen3, not gemma2" in b.stderr
    assert "decoder blocks" not in a.stderr and final(a.stdout) == final(b.stdout)


def test_bad_hook_value_and_off(llmq_bin, stories_v1, wiki):
    args = [llmq_bin, "eval", "--model", stories_v1, "--ppl", wiki, "--ctx", "64", "--chunks", "1"]
    r = run(args, check=False, env=env_with("gpu"))
    assert r.returncode == 1 and "LLMQ_EVAL_BLOCK=gpu: must be cpu or off" in r.stderr, r.stderr
    r = run(args, env=env_with("off"))
    assert "eval: decoder blocks through calib/model/forward.c: LLMQ_EVAL_BLOCK=off" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def poisoned(stories_v3, wiki, llmq_bin, tmp_path_factory):
    """stories260K with a NaN in blk.1.ffn_up.weight (every position breaks at blk.1), and one with a NaN in the
    embedding row of a token that chunk 1 of the 64-token llamacpp chunks holds and chunk 0 does not (its first
    occurrence named by position). gguf-py finds the offsets; the chunks' tokens come from a saved logits file."""
    import shutil

    from gguf import GGUFReader
    d = tmp_path_factory.mktemp("poison")
    run([llmq_bin, "eval", "--model", stories_v3, "--ppl", wiki, "--ctx", "64", "--chunks", "2", "--save-logits",
         d / "t.logits", "--logits-dtype", "f16"])
    b = (d / "t.logits").read_bytes()
    toks = np.frombuffer(b[128:128 + 4 * 2 * 64], np.int32).reshape(2, 64)
    tok = next(int(t) for t in toks[1] if t not in toks[0])
    pos = int(np.argmax(toks[1] == tok))
    out = {}
    for name, tensor, index in (("ffn_up", "blk.1.ffn_up.weight", None), ("embd", "token_embd.weight", tok)):
        p = d / f"{name}.gguf"
        shutil.copy(stories_v3, p)
        t = next(t for t in GGUFReader(str(p)).tensors if t.name == tensor)
        cols = int(t.shape[0])  # gguf-py lists ne0 (the row length) first
        with open(p, "r+b") as f:
            f.seek(t.data_offset + 4 * ((2 if index is None else index) * cols + 7))
            f.write(np.float32(np.nan).tobytes())
        out[name] = p
    return out, pos


@pytest.mark.parametrize("which", ["ffn_up", "embd"])
def test_non_finite_named_alike(llmq_bin, poisoned, wiki, which):
    models, pos = poisoned
    want = {"ffn_up": "the output of blk.1 is NaN at position 0, component 0 of chunk 0",
            "embd": f"the output of token_embd is NaN at position {pos}, component 7 of chunk 1"}[which]
    args = [llmq_bin, "eval", "--model", models[which], "--ppl", wiki, "--ctx", "64", "--chunks", "3"]
    for block in (None, "cpu"):
        r = run(args, check=False, env=env_with(block))
        assert r.returncode == 1 and want in r.stderr, r.stderr
