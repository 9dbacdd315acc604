"""`llmq calib`'s block path (calib/calib.h "Decoder blocks": the decoder blocks through kernels/block.h with its Gram
and column sums, every calibration sequence resident, layer-major) against the forward.c path, on the CPU backend
through the test hook LLMQ_CALIB_BLOCK=cpu, so that the wiring the CUDA path uses (the resident activations, the
micro-batch views into them, the weights loaded once per layer, the sums downloaded once per layer, the finite
check, the fallbacks) runs without a GPU.

Agreement, as measured (OpenBLAS 0.3.21, Haswell kernels):
  --threads 1   BIT FOR BIT: the .lcs statistics file (XᵀX, Σ|x|, Σx², counts) and the imatrix written from it are
                the same bytes, with XᵀX and without (--no-xtx), for micro-batches with a short tail (3 sequences in
                micro-batches of 2): the CPU block repeats forward.c's operations (kernels/block.h), its Gram sums
                are kernels/gemm.h llmq_gram_acc_f64's on the same rows, and its column sums are calib/calib.c's loop.
  --threads 2   the block path gives the same bytes as with one thread (its products are single-threaded); forward.c
                splits each linear's rows over the threads, a reordering of the same f32 sums, so the files differ.
                Measured max relative difference (Σ|x| and Σx² per column against the value, XᵀX against
                sqrt(XᵀX_ii XᵀX_jj)): stories260K (5 x 64 tokens) 6.5e-7 / 1.4e-6 / 1.5e-6, SmolLM2 (4 blocks,
                3 x 128) 7.6e-7 / 3.3e-6 / 3.2e-6: forward.c's own difference between 1 and 2 threads.
  Tolerance for --threads 2: REORDER_RTOL = 1e-4 is NOT derived from an error analysis: it is 30x the largest
  reordering difference measured above and far under what a wiring error moves (a lost micro-batch changes every
  sum of a layer by a third, a block run on another layer's weights or a shifted sequence by O(1)).
Streamed (--max-vram a byte short of the resident activations: calib/blocks.h streams them from the host a
micro-batch at a time): the same bytes as forward.c's with one thread, with XᵀX and without.
Fallbacks (one info line naming the reason): a family kernels/block.h does not cover (a random gemma2 checkpoint),
LLMQ_CALIB_BLOCK=off; a bad LLMQ_CALIB_BLOCK value is an error. Non-finite activations: both paths fail naming the
same block and input, and write no file.
"""
import os
import re
import struct

import numpy as np
import pytest

from conftest import gguf_first_blocks, plant_f32, run, tiny_gemma2

REORDER_RTOL = 1e-4
HOOK = "calib: decoder blocks on cpu through kernels/block.h (LLMQ_CALIB_BLOCK=cpu, the test hook)"
FALLBACK = "calib: decoder blocks through calib/model/forward.c (on the CPU): "


def env_with(block, data_dir):
    """The environment with LLMQ_CALIB_BLOCK set to block (None: unset) and LLMQ_DATA."""
    env = {k: v for k, v in os.environ.items() if k != "LLMQ_CALIB_BLOCK"}
    env["LLMQ_DATA"] = str(data_dir)
    if block:
        env["LLMQ_CALIB_BLOCK"] = block
    return env


@pytest.fixture(scope="module")
def smol4(smollm2, tmp_path_factory):
    """SmolLM2-135M-Instruct Q4_1 cut to its first 4 blocks: its shapes (D 576, 9 / 3 heads of 64, F 1536)."""
    return gguf_first_blocks(smollm2, tmp_path_factory.mktemp("smol4") / "smol4.gguf", 4)


@pytest.fixture
def calib(llmq_bin, data_dir, tmp_path):
    """calib(name, model, *flags, block=False) -> (the .lcs bytes, the imatrix GGUF bytes, stderr); block: through
    the hook (its info line checked)."""
    def go(name, model, *flags, block=False):
        lcs, imat = tmp_path / f"{name}.lcs", tmp_path / f"{name}.gguf"
        r = run([llmq_bin, "calib", "--model", model, "--calib", "wikitext-2-valid", "--seed", "3", *flags,
                 "--out", lcs, "--imatrix-out", imat, "--force"], env=env_with("cpu" if block else None, data_dir))
        assert (HOOK in r.stderr) == block, r.stderr
        return lcs.read_bytes(), imat.read_bytes(), r.stderr
    return go


def read_lcs(b):
    """The records of an .lcs file (calib/calib.h "Stats file"): [(count, sum_abs, sum_sq, xtx or None)]."""
    assert b[:8] == b"LLMQCALS"
    (flags,) = struct.unpack_from("<I", b, 12)
    (n_layer,) = struct.unpack_from("<q", b, 16)
    off, recs = 72, []
    for _ in range(4 * n_layer):
        n, count = struct.unpack_from("<qq", b, off)
        off += 16
        sa = np.frombuffer(b, "<f8", n, off)
        sq = np.frombuffer(b, "<f8", n, off + 8 * n)
        off += 16 * n
        xtx = None
        if flags & 1:
            xtx = np.frombuffer(b, "<f8", n * n, off).reshape(n, n)
            off += 8 * n * n
        recs.append((count, sa, sq, xtx))
    assert off == len(b)
    return recs


def max_rel(a, b):
    """Max relative differences of two .lcs files: (Σ|x|, Σx² per column against b's value, XᵀX against
    sqrt(b_ii b_jj)); the counts must be equal."""
    w = [0.0, 0.0, 0.0]
    for ra, rb in zip(read_lcs(a), read_lcs(b), strict=True):
        assert ra[0] == rb[0]
        for k in (1, 2):
            w[k - 1] = max(w[k - 1], float(np.max(np.abs(ra[k] - rb[k]) / np.maximum(np.abs(rb[k]), 1e-300))))
        if rb[3] is not None:
            d = np.sqrt(np.outer(np.diag(rb[3]), np.diag(rb[3])))
            w[2] = max(w[2], float(np.max(np.abs(ra[3] - rb[3]) / np.maximum(d, 1e-300))))
    return w


def models(stories_v3, smol4):
    return [("stories260K", stories_v3, ["--nsamples", "5", "--seqlen", "64"]),
            ("SmolLM2 4 blocks", smol4, ["--nsamples", "3", "--seqlen", "128"])]


# ---- bit for bit with one thread ---------------------------------------------------------------------------------

@pytest.mark.parametrize("xtx", [True, False], ids=["xtx", "no-xtx"])
def test_one_thread_bit_for_bit(calib, stories_v3, smol4, xtx):
    for name, model, size in models(stories_v3, smol4):
        flags = [*size, "--micro-batch", "2", "--threads", "1", *([] if xtx else ["--no-xtx"])]
        a_lcs, a_imat, _ = calib("fwd", model, *flags)
        b_lcs, b_imat, err = calib("blk", model, *flags, block=True)
        assert "micro-batches of 2" in err
        assert a_lcs == b_lcs, f"{name}: the statistics files differ: {max_rel(b_lcs, a_lcs)}"
        assert a_imat == b_imat, name


# ---- the activations streamed from the host (--max-vram; calib/blocks.h) -------------------------------------------

@pytest.mark.parametrize("xtx", [True, False], ids=["xtx", "no-xtx"])
def test_streamed_bit_for_bit(calib, stories_v3, xtx):
    """--max-vram a byte short of what the resident activations need: streamed a micro-batch at a time, the same
    bytes as forward.c's with one thread."""
    flags = ["--nsamples", "5", "--seqlen", "64", "--micro-batch", "2", "--threads", "1",
             *([] if xtx else ["--no-xtx"])]
    a_lcs, a_imat, _ = calib("fwd", stories_v3, *flags)
    _, _, err = calib("res", stories_v3, *flags, block=True)
    m = re.search(r"5 sequences resident, micro-batches of 2, [\d.]+ MiB \((\d+) bytes\)", err)
    assert m, err[-2000:]
    b_lcs, b_imat, err = calib("str", stories_v3, *flags, "--max-vram", str(int(m.group(1)) - 1), block=True)
    assert "5 sequences streamed from the host, micro-batches of 2" in err, err[-2000:]
    assert a_lcs == b_lcs and a_imat == b_imat


# ---- two threads: the block path is thread-independent, forward.c reorders --------------------------------------

def test_two_threads(calib, stories_v3, smol4):
    for name, model, size in models(stories_v3, smol4):
        b1, _, _ = calib("blk1", model, *size, "--threads", "1", block=True)
        b2, _, _ = calib("blk2", model, *size, "--threads", "2", block=True)
        a2, _, _ = calib("fwd2", model, *size, "--threads", "2")
        assert b1 == b2, name
        w = max_rel(b2, a2)
        print(f"{name}: block path vs forward.c on 2 threads: max relative difference Σ|x| {w[0]:.2g}, Σx² {w[1]:.2g}, "
              f"XᵀX {w[2]:.2g}")
        assert max(w) <= REORDER_RTOL, name


# ---- fallbacks and errors ----------------------------------------------------------------------------------------

def test_gemma2_takes_forward_c(llmq_bin, stories_v3, data_dir, tmp_path):
    d = tiny_gemma2(llmq_bin, stories_v3, tmp_path)
    args = [llmq_bin, "calib", "--model", d, "--calib", "wikitext-2-valid", "--nsamples", "2", "--seqlen", "32"]
    a = run([*args, "--out", tmp_path / "a.lcs"], env=env_with(None, data_dir))
    b = run([*args, "--out", tmp_path / "b.lcs"], env=env_with("cpu", data_dir))
    assert FALLBACK + f"{d}: the backend block forward covers llama, mistral, qwen2 and qwen3, not gemma2" in b.stderr
    assert "decoder blocks" not in a.stderr
    assert (tmp_path / "a.lcs").read_bytes() == (tmp_path / "b.lcs").read_bytes()


def test_bad_hook_value_and_off(llmq_bin, stories_v3, data_dir, tmp_path):
    args = [llmq_bin, "calib", "--model", stories_v3, "--calib", "wikitext-2-valid", "--nsamples", "1", "--seqlen",
            "16", "--out", tmp_path / "s.lcs"]
    r = run(args, check=False, env=env_with("gpu", data_dir))
    assert r.returncode == 1 and "LLMQ_CALIB_BLOCK=gpu: must be cpu or off" in r.stderr, r.stderr
    assert not (tmp_path / "s.lcs").exists()
    r = run(args, env=env_with("off", data_dir))
    assert "calib: decoder blocks through calib/model/forward.c: LLMQ_CALIB_BLOCK=off" in r.stderr, r.stderr


def test_non_finite_named_alike(llmq_bin, stories_v3, data_dir, tmp_path):
    """An Inf in blk.1.attn_norm.weight (element 5): blk.1's q/k/v input is non-finite in channel 5 of every token;
    both paths fail naming that block, input and channel (the block path also names the sequence and position)."""
    p = plant_f32(stories_v3, tmp_path / "inf.gguf", "blk.1.attn_norm.weight", 5, np.inf)
    want = {None: r"calib: blk\.1 attn_in \(q/k/v\): non-finite activation -?inf at token 0, channel 5",
            "cpu": r"calib: blk\.1 attn_in \(q/k/v\): non-finite activation \(NaN or Inf\) at token 0 \(sequence 0, "
                   r"position 0\), channel 5"}
    for block, msg in want.items():
        out = tmp_path / f"{block}.lcs"
        r = run([llmq_bin, "calib", "--model", p, "--calib", "wikitext-2-valid", "--nsamples", "3", "--seqlen", "32",
                 "--out", out], check=False, env=env_with(block, data_dir))
        assert r.returncode == 1 and re.search(msg, r.stderr), r.stderr
        assert not out.exists()
