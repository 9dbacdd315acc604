"""`llmq quantize`'s block path (quant/quantize.h "Decoder blocks", calib/blocks.h: rtn's and gptq's passes and AWQ's
scale search through
kernels/block.h, the calibration activations resident where the block computes, llmq_block_gather for the
true-sequential statistics passes) against the forward.c path, on the CPU backend through the test hook
LLMQ_QUANT_BLOCK=cpu, so that the wiring --device cuda uses (the resident activations, the weights uploaded once per
block, the solved linears' decodings uploaded after each group, the one-input gathers, the output pass, the
checkpoint's download of the activations) runs without a GPU.

Agreement, as measured (OpenBLAS 0.3.21): with --threads 1 BIT FOR BIT — every output file and every report row but
its seconds — for gptq (true-sequential and --no-true-sequential) into fake / gptq directories and into GGUF
(Q4_K_M: GPTQ onto ggml blocks), and for rtn --calib into a directory, on stories260K (llama, D 64), SmolLM2-135M's
first 4 blocks (D 576, 9 / 3 heads), a random qwen3 (q/k norms, head_dim 32 with 4 heads on D 64, so Dq != D) and a
random qwen2 (q/k/v biases): the CPU block repeats forward.c's operations (kernels/block.h), its gathers stop where
forward.c's sub-block passes stop (calib/model/forward.h), its sums are calib/calib.c's. A run killed at checkpoint
events on the block path and resumed writes the same bytes as the uninterrupted run (the checkpoint's activations are
downloaded after each block and uploaded again on --resume).
AWQ (quant/awq.h "On the block path"): awq and awq+gptq into fake directories and GGUF Q4_0, bit for bit too, with
4 x 256 tokens in one micro-batch (see AWQ_CAL); below the resident budget it takes forward.c.
Fallbacks (one info line naming the reason, the bytes unchanged): GPTAQ,
a family kernels/block.h does not cover (gemma2), LLMQ_QUANT_BLOCK=off; a bad LLMQ_QUANT_BLOCK is an error that
writes nothing; so are LLMQ_BLOCK_MATH=tf32 on the CPU hook (TF32 needs a CUDA block) and an unknown LLMQ_BLOCK_MATH.
Non-finite activations: both paths fail naming the same block and input, and write nothing.
"""
import hashlib
import json
import os
import pathlib
import re
import signal

import numpy as np
import pytest

from conftest import gguf_first_blocks, plant_f32, run, tiny_gemma2

HOOK = "quantize: decoder blocks on cpu through kernels/block.h (LLMQ_QUANT_BLOCK=cpu, the test hook)"
FALLBACK = "quantize: decoder blocks through calib/model/forward.c (on the CPU): "
CAL = ["--calib", "wikitext-2-valid", "--nsamples", "5", "--seqlen", "32", "--seed", "3", "--micro-batch", "2",
       "--threads", "1"]


def env_with(block, data_dir, **extra):
    """The environment with LLMQ_QUANT_BLOCK set to block (None: unset), LLMQ_DATA and extra."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLMQ_QUANT_BLOCK", "LLMQ_CKPT_KILL_AT")}
    env["LLMQ_DATA"] = str(data_dir)
    if block:
        env["LLMQ_QUANT_BLOCK"] = block
    env.update({k: str(v) for k, v in extra.items()})
    return env


def digest(p):
    p = pathlib.Path(p)
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.is_file())
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def rows(report):
    layers = json.loads(pathlib.Path(report).read_text())["layers"]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in layers]


def tiny_family(llmq_bin, stories_v3, work, family):
    """A random 2-block qwen3 (q/k norms, head_dim 32: Dq 128 != D 64), qwen2 (q/k/v biases) or llama (4 / 4 heads) with
    stories260K's tokenizer in work/<family> (made once per module). Returns its directory."""
    if not (work / "st").exists():
        run([llmq_bin, "convert", "--model", stories_v3, "--out", work / "st"])
    d = work / family
    if (d / "model.safetensors").exists():  # made by an earlier test of the module
        return d
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((work / "st" / f).read_bytes())
    D, F, H, Hkv = 64, 128, 4, 4 if family == "llama" else 2  # llama: no GQA (AWQ's v -> o group)
    Dh = 32 if family == "qwen3" else D // H
    arch = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[family]
    (d / "config.json").write_text(json.dumps(dict(
        model_type=family, architectures=[arch], hidden_size=D, intermediate_size=F, num_hidden_layers=2,
        num_attention_heads=H, num_key_value_heads=Hkv, head_dim=Dh, vocab_size=512, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)))
    rng = np.random.default_rng(1)
    t = {"model.embed_tokens.weight": rng.normal(0, 0.5, (512, D)), "model.norm.weight": 1 + rng.normal(0, 0.1, D),
         "lm_head.weight": rng.normal(0, 0.1, (512, D))}
    for l in range(2):
        p = f"model.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[p + n + ".weight"] = 1 + rng.normal(0, 0.1, D)
        for n, s in (("q", (H * Dh, D)), ("k", (Hkv * Dh, D)), ("v", (Hkv * Dh, D)), ("o", (D, H * Dh)),
                     ("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
            t[p + ("self_attn." if n in "qkvo" else "mlp.") + f"{n}_proj.weight"] = rng.normal(0, 0.1, s)
            if family == "qwen2" and n in "qkv":
                t[p + f"self_attn.{n}_proj.bias"] = rng.normal(0, 0.1, s[0])
        if family == "qwen3":
            for n in ("q_norm", "k_norm"):
                t[p + f"self_attn.{n}.weight"] = 1 + rng.normal(0, 0.1, Dh)
    from safetensors.numpy import save_file
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("qblocks")


@pytest.fixture(scope="module")
def small(tool, llmq_bin, stories_v3, work):
    """tests/tools/synth_ckpt.c's "small" shape (D 256, FF 512, 2 blocks) with stories260K's tokenizer: Q4_K_M's
    256-blocks tile it."""
    run([llmq_bin, "convert", "--model", stories_v3, "--out", work / "tok", "--to", "hf", "--quiet"])
    run([tool("synth_ckpt"), "--shape", "small", "--layers", "2", "--out", work / "small", "--tokenizer",
         work / "tok"])
    return work / "small"


@pytest.fixture
def quantize(llmq_bin, data_dir, tmp_path):
    """quantize(name, model, out_name, *flags, block=None) -> (output digest, report rows, stderr)."""
    def go(name, model, out_name, *flags, block=None):
        d = tmp_path / name
        d.mkdir()
        hook = "cpu" if block == "fallback" else block  # fallback: the hook set on a run the block path refuses
        r = run([llmq_bin, "quantize", "--model", model, *CAL, *flags, "--out", d / out_name, "--json", d / "r.json",
                 "--no-checkpoint"], env=env_with(hook, data_dir))
        if block == "cpu":
            assert HOOK in r.stderr, r.stderr[-3000:]
        return digest(d / out_name), rows(d / "r.json"), r.stderr
    return go


# ---- bit for bit with one thread ---------------------------------------------------------------------------------

RUNS = {  # name -> (flags, output name)
    "gptq-fake": (["--method", "gptq", "--format", "fake"], "out"),
    "gptq-nts-gptq": (["--method", "gptq", "--format", "gptq", "--no-true-sequential"], "out"),
    "rtn-calib-fake": (["--method", "rtn", "--format", "fake"], "out"),
}


@pytest.mark.parametrize("family", ["stories260K", "qwen3", "qwen2"])
def test_one_thread_bit_for_bit(quantize, llmq_bin, stories_v3, work, family):
    model = stories_v3 if family == "stories260K" else tiny_family(llmq_bin, stories_v3, work, family)
    group = ["--group-size", "4"] if family == "stories260K" else ["--group-size", "32"]  # stories: C 172
    for name, (flags, out) in RUNS.items():
        if family == "stories260K" and "--format" in flags and flags[flags.index("--format") + 1] == "gptq":
            continue  # the gptq format packs 8 rows of codes: stories260K's 172-wide down does not tile
        a = quantize(f"{family}-{name}-fwd", model, out, *flags, *group)
        b = quantize(f"{family}-{name}-blk", model, out, *flags, *group, block="cpu")
        assert a[0] == b[0], f"{family} {name}: the outputs differ"
        assert a[1] == b[1], f"{family} {name}: the report rows differ"


@pytest.mark.heavy
def test_smollm2_bit_for_bit(quantize, smollm2, work):
    """SmolLM2-135M cut to its first 4 blocks (D 576, 9 / 3 heads of 64, F 1536; its Q4_1 linears requantized)."""
    smol4 = gguf_first_blocks(smollm2, work / "smol4.gguf", 4)
    flags = ["--method", "gptq", "--format", "gptq", "--group-size", "64", "--allow-requantize"]
    a = quantize("smol4-fwd", smol4, "out", *flags)
    b = quantize("smol4-blk", smol4, "out", *flags, block="cpu")
    assert a[0] == b[0] and a[1] == b[1]


def test_gptq_gguf_bit_for_bit(quantize, small):
    flags = ["--method", "gptq", "--format", "gguf", "--gguf-type", "Q4_K_M", "--no-provenance"]
    a = quantize("gguf-fwd", small, "out.gguf", *flags)
    b = quantize("gguf-blk", small, "out.gguf", *flags, block="cpu")
    assert a[0] == b[0] and a[1] == b[1]
    assert any(r["method"].startswith("gptq") for r in b[1])


# ---- AWQ's search on the block path (quant/awq.h "On the block path") ---------------------------------------------

# 4 x 256 tokens in one micro-batch: forward.c's AWQ runs every sequence in one call (its products' row count, which
# OpenBLAS's results can depend on, is then the block's), and its default rule takes the Gram form for v -> o and
# up -> down at these shapes, as the block path always does.
AWQ_CAL = ["--nsamples", "4", "--seqlen", "256", "--micro-batch", "4"]


@pytest.mark.parametrize("family", ["stories260K", "qwen3", "qwen2", "llama"])
def test_awq_bit_for_bit(quantize, llmq_bin, stories_v3, work, family):
    """awq and awq+gptq into a fake directory, awq into GGUF Q4_0 (a plugged-in quantizer: the candidates made on the
    host and uploaded): the block path's search gives forward.c's bytes and report rows. llama has no GQA, so its
    v -> o group is searched too; qwen2 folds the scales into the v bias, qwen3 has q/k norms."""
    model = stories_v3 if family == "stories260K" else tiny_family(llmq_bin, stories_v3, work, family)
    group = ["--group-size", "4"] if family == "stories260K" else ["--group-size", "32"]
    runs = [(["--method", "awq", "--format", "fake", *group], "out"),
            (["--method", "awq+gptq", "--format", "fake", *group], "out")]
    if family != "stories260K":  # its 172-wide down tiles no ggml block
        runs.append((["--method", "awq", "--format", "gguf", "--gguf-type", "Q4_0", "--no-provenance"], "o.gguf"))
    for flags, out in runs:
        name = f"awq-{family}-{flags[1].replace('+', '')}-{flags[3]}"
        a = quantize(f"{name}-fwd", model, out, *flags, *AWQ_CAL)
        b = quantize(f"{name}-blk", model, out, *flags, *AWQ_CAL, block="cpu")
        assert "awq: layer 0 attn_norm->q,k,v" in b[2]
        assert ("v->o" in b[2]) == (family == "llama"), b[2][-2000:]
        assert a[0] == b[0], f"{name}: the outputs differ"
        assert a[1] == b[1], f"{name}: the report rows differ"


def test_awq_needs_resident(quantize, stories_v3):
    """AWQ's search keeps its fp outputs with the activations: with --max-vram below that, forward.c, saying why."""
    flags = ["--method", "awq", "--format", "fake", "--group-size", "4", *AWQ_CAL]
    res = quantize("awq-res", stories_v3, "out", *flags, block="cpu")
    place, _, need = block_bytes(res[2])
    assert place == "resident"
    fb = quantize("awq-fb", stories_v3, "out", *flags, "--max-vram", str(need - 1), block="fallback")
    assert FALLBACK + "AWQ's search needs the activations and its outputs resident" in fb[2], fb[2][-2000:]
    assert fb[0] == res[0]


def test_awq_clip_gram_hook(llmq_bin, stories_v3, data_dir, tmp_path):
    """LLMQ_AWQ_CLIP=gram: the clip search as the device runs it (kernels/awq_clip.h, each group's error as a quadratic
    form on its Gram matrix) on the CPU, on the block path and on forward.c. It chooses as the default output form
    does wherever the shrinks' errors are not a near tie: on stories260K (group 4) the same bytes (measured), so the
    test asks for the same per-linear errors to 1e-9 and the same output bytes; the debug line shows the hook ran."""
    outs = {}
    for name, block, hook in (("ref", None, None), ("gram", None, "gram"), ("gram-blk", "cpu", "gram")):
        d = tmp_path / name
        d.mkdir()
        extra = {"LLMQ_AWQ_CLIP": hook} if hook else {}
        r = run([llmq_bin, "quantize", "--model", stories_v3, *CAL, *AWQ_CAL, "--method", "awq", "--format", "fake",
                 "--group-size", "4", "--out", d / "out", "--json", d / "r.json", "--no-checkpoint", "--verbose"],
                env=env_with(block, data_dir, **extra))
        seen = "clip search on the groups' Gram matrices (cpu)" in r.stderr
        assert seen == bool(hook), r.stderr[-2000:]
        outs[name] = (digest(d / "out"), json.loads((d / "r.json").read_text())["layers"])
    for name in ("gram", "gram-blk"):
        assert outs[name][0] == outs["ref"][0], name
        for a, b in zip(outs["ref"][1], outs[name][1]):
            assert abs(b["err"] - a["err"]) <= 1e-9 * abs(a["err"]), (name, a["name"])


# ---- the activations streamed from the host (--max-vram) -------------------------------------------------------------

def block_bytes(stderr):
    """The bytes the info line says the blocks take."""
    m = re.search(r"decoder blocks on cpu through kernels/block\.h .*?: \d+ sequences (resident|streamed from the host), "
                  r"micro-batches of (\d+), [\d.]+ MiB \((\d+) bytes\)", stderr)
    assert m, stderr[-2000:]
    return m.group(1), int(m.group(2)), int(m.group(3))


@pytest.mark.parametrize("family", ["stories260K", "qwen3"])
def test_streamed_bit_for_bit(quantize, llmq_bin, stories_v3, work, family):
    """--max-vram one byte below what the resident activations need: they stream from the host a micro-batch at a time
    (calib/blocks.h), and the bytes are forward.c's; below what streaming needs (the resident bytes less the N - mb
    sequences' activations): forward.c, with the line saying why."""
    model = stories_v3 if family == "stories260K" else tiny_family(llmq_bin, stories_v3, work, family)
    group = ["--group-size", "4"] if family == "stories260K" else ["--group-size", "32"]
    flags = ["--method", "gptq", "--format", "fake", *group]
    ref = quantize(f"s-{family}-fwd", model, "out", *flags)
    res = quantize(f"s-{family}-res", model, "out", *flags, block="cpu")
    place, mb, need = block_bytes(res[2])
    assert place == "resident" and mb == 2
    D = 64
    stream_need = need - (5 - mb) * 32 * D * 4  # CAL: 5 sequences of 32 tokens, micro-batches of 2
    st = quantize(f"s-{family}-str", model, "out", *flags, "--max-vram", str(need - 1), block="cpu")
    assert block_bytes(st[2])[0] == "streamed from the host" and block_bytes(st[2])[2] == stream_need
    assert st[0] == ref[0] and st[1] == ref[1]
    fb = quantize(f"s-{family}-fb", model, "out", *flags, "--max-vram", str(stream_need - 1), block="fallback")
    assert FALLBACK + "even with the activations streamed from the host the block buffers" in fb[2], fb[2][-2000:]
    assert fb[0] == ref[0]


# ---- checkpoint and resume on the block path ---------------------------------------------------------------------

def test_resume_on_the_block_path(llmq_bin, small, data_dir, tmp_path):
    """Killed (SIGKILL) at three checkpoint events (quant/checkpoint.h "Fault injection": within block 0, after block
    0's activations, within block 1), each resumed on the block path, and once with the activations streamed
    (--max-vram a byte short of resident): the bytes of the uninterrupted run."""
    args = ["quantize", "--model", small, *CAL, "--method", "gptq", "--format", "gptq", "--group-size", "64"]
    ref = tmp_path / "ref"
    r = run([llmq_bin, *args, "--out", ref], env=env_with("cpu", data_dir))
    stream = ["--max-vram", str(block_bytes(r.stderr)[2] - 1)]  # a byte short of resident: streamed
    for k, vram in ((3, []), (11, []), (15, []), (11, stream)):
        out = tmp_path / f"k{k}{'s' if vram else ''}"
        r = run([llmq_bin, *args, *vram, "--out", out], check=False,
                env=env_with("cpu", data_dir, LLMQ_CKPT_KILL_AT=k))
        assert r.returncode == -signal.SIGKILL, (k, r.returncode, r.stderr[-2000:])
        r = run([llmq_bin, *args, *vram, "--out", out, "--resume"], env=env_with("cpu", data_dir))
        assert HOOK in r.stderr and "resum" in r.stderr.lower(), r.stderr[-2000:]
        assert ("streamed from the host" in r.stderr) == bool(vram), r.stderr[-2000:]
        assert digest(out) == digest(ref), k
        assert not pathlib.Path(str(out) + ".partial").exists()


# ---- fallbacks and errors ----------------------------------------------------------------------------------------

def test_gptaq_takes_forward_c(quantize, stories_v3):
    for flags, why in ((["--method", "gptq", "--gptaq"], "GPTAQ's full-precision stream is not on the block path"),):
        name = "-".join(f.strip("-").replace("+", "") for f in flags)
        flags = [*flags, "--format", "fake", "--group-size", "4"]
        a = quantize(f"{name}-fwd", stories_v3, "out", *flags)
        b = quantize(f"{name}-hook", stories_v3, "out", *flags, block="fallback")
        c = quantize(f"{name}-off", stories_v3, "out", *flags, block="off")
        assert "decoder blocks" not in a[2]
        assert FALLBACK + why in b[2], b[2][-2000:]
        assert "quantize: decoder blocks through calib/model/forward.c: LLMQ_QUANT_BLOCK=off" in c[2], c[2][-2000:]
        assert a[0] == b[0] == c[0], name


def test_gemma2_takes_forward_c(quantize, llmq_bin, stories_v3, work):
    (work / "g").mkdir(exist_ok=True)
    d = tiny_gemma2(llmq_bin, stories_v3, work / "g")
    flags = ["--method", "gptq", "--format", "fake", "--group-size", "32"]
    a = quantize("g2-fwd", d, "out", *flags)
    b = quantize("g2-hook", d, "out", *flags, block="fallback")
    assert FALLBACK + f"{d}: the backend block forward covers llama, mistral, qwen2 and qwen3, not gemma2" in b[2]
    assert a[0] == b[0]


def test_bad_hook_value(llmq_bin, stories_v3, data_dir, tmp_path):
    out = tmp_path / "out"
    r = run([llmq_bin, "quantize", "--model", stories_v3, *CAL, "--method", "gptq", "--format", "fake", "--group-size",
             "4", "--out", out], check=False, env=env_with("gpu", data_dir))
    assert r.returncode == 1 and "LLMQ_QUANT_BLOCK=gpu: must be cpu or off" in r.stderr, r.stderr[-2000:]
    assert not out.exists() and not pathlib.Path(str(out) + ".partial").exists()


def test_block_math_switch(llmq_bin, stories_v3, data_dir, tmp_path):
    """LLMQ_BLOCK_MATH (calib/model/devblock.h llmq_devblock_math): fp32 is the default's bytes; tf32 needs a CUDA block
    (refused on the CPU hook, nothing written); another value is refused by name."""
    args = [llmq_bin, "quantize", "--model", stories_v3, *CAL, "--method", "gptq", "--format", "fake", "--group-size",
            "4", "--no-checkpoint"]
    run([*args, "--out", tmp_path / "a"], env=env_with("cpu", data_dir))
    run([*args, "--out", tmp_path / "b"], env=env_with("cpu", data_dir, LLMQ_BLOCK_MATH="fp32"))
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    for value, msg in (("tf32", "gemm_dev: TF32 products need a CUDA context (this one is on cpu)"),
                       ("bf16", "quantize: LLMQ_BLOCK_MATH=bf16: must be fp32 or tf32")):
        out = tmp_path / value
        r = run([*args, "--out", out], check=False, env=env_with("cpu", data_dir, LLMQ_BLOCK_MATH=value))
        assert r.returncode != 0 and msg in r.stderr, r.stderr[-2000:]
        assert not out.exists()


def test_non_finite_named_alike(llmq_bin, stories_v3, data_dir, tmp_path):
    """An Inf in blk.1.attn_norm.weight (element 5): blk.1's q/k/v input is non-finite in channel 5 of every token;
    both paths fail naming that block, input and channel (the block path also names the sequence and position), and
    write no output (--no-checkpoint: a failed run otherwise keeps its checkpoint, as on forward.c)."""
    p = plant_f32(stories_v3, tmp_path / "inf.gguf", "blk.1.attn_norm.weight", 5, np.inf)
    want = {None: r"blk\.1 attn_in \(q/k/v\): non-finite activation -?inf at token 0, channel 5",
            "cpu": r"blk\.1 attn_in \(q/k/v\): non-finite activation \(NaN or Inf\) at token 0 \(sequence 0, "
                   r"position 0\), channel 5"}
    for block, msg in want.items():
        out = tmp_path / f"out-{block}"
        r = run([llmq_bin, "quantize", "--model", p, *CAL, "--method", "gptq", "--format", "fake", "--group-size",
                 "4", "--out", out, "--no-checkpoint"], check=False, env=env_with(block, data_dir))
        assert r.returncode == 1 and re.search(msg, r.stderr), r.stderr[-2000:]
        assert not out.exists()
