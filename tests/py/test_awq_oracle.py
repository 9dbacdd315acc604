"""quant/awq.c against tests/py/awq_ref.py (a numpy port of AutoAWQ's search) on one real SmolLM2 block.

tests/tools/awq_tool runs llmq's full-precision model on the first 2 x 256 tokens of wiki.valid.raw up
to block 3, runs the search (its clip search on every 4th token), dumps the block input and the inputs of its linears (as llmq's search sees them), and the
search results. The numpy port then runs the same search on those inputs:
  - every candidate's scales are bit-identical (same float32 operations, the C library's powf:
    awq_ref.ratio_scales), hence so are the candidate weights; the chosen ratio of every scale group
    is the same, unless the two losses are a tie at the resolution of llmq's float32 arithmetic;
  - the losses (float32 module outputs in llmq, float64 in numpy) agree within a bound derived from
    the rounding of every float32 operation of the module, valid for any summation order, i.e. any
    BLAS kernel (awq_ref.loss_tolerance; 0.8e-4 to 1.7e-4 of the loss here, measured differences
    <= 1e-6 of it; the smallest gap between a group's best and runner-up is 9e-4);
    it is evaluated at ratio 0, llmq's and the port's best and the port's runner-up (each costs two
    backward passes of the module), the ratios that decide the choice;
  - given llmq's scales, apply_scale and the clip search give exactly llmq's clip values, and the
    scaled + clipped weights and folded norms are bit-identical.
Needs ~/.cache/llmq/smollm2-f32.gguf (llmq convert of the Q4_1 file; made here when missing).
"""
import json
import pathlib

import numpy as np
import pytest

import awq_ref
from conftest import run

LAYER, N_SEQ, SEQLEN, GROUP, BITS = 3, 2, 256, 64, 4
N_SAMPLE_TOKEN = 128  # the clip search samples every 4th token (AutoAWQ: 512; smaller keeps the test fast)


@pytest.fixture(scope="module")
def awq_run(tool, smollm2_f32, data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("awq")
    run([tool("awq_tool"), smollm2_f32, data_dir / "wikitext-2-raw" / "wiki.valid.raw", out, LAYER, N_SEQ, SEQLEN,
         GROUP, BITS, 2, N_SAMPLE_TOKEN])
    res = json.loads((out / "result.json").read_text())
    N = res["N"]

    def ld(name, *shape):
        return np.fromfile(out / name, dtype=np.float32).reshape(shape)

    blk = awq_ref.Block(smollm2_f32, LAYER)
    D = blk.D
    cap = {"n1": ld("n1.f32", N, D), "att": ld("att.f32", N, -1), "n2": ld("n2.f32", N, D),
           "act": ld("act.f32", N, -1)}
    scales = {g["prev"]: ld(f"scales_{g['prev']}.f32", -1) for g in res["groups"]}
    ref = awq_ref.awq_block(blk, ld("x.f32", N, D), N_SEQ, SEQLEN, BITS, GROUP, captured=cap,
                            scales_override=scales, n_sample_token=N_SAMPLE_TOKEN,
                            tolerances={g["prev"]: [g["best"]] for g in res["groups"]})
    return res, ref, scales, ld


def test_scale_groups_and_ratios(awq_run):
    res, ref, scales, _ = awq_run
    # SmolLM2 has GQA (v is 192 x 576, o 576 x 576): no v -> o group
    assert [g["prev"] for g in res["groups"]] == ["attn_norm", "ffn_norm", "up"]
    assert [g["prev"] for g in ref["groups"]] == ["attn_norm", "ffn_norm", "up"]
    for got, want in zip(res["groups"], ref["groups"]):
        a, b, tol, gb, wb = got["loss"], want["loss"], want["tol"], got["best"], want["best"]
        for i, t in sorted(tol.items()):
            # the float32-vs-float64 bound of awq_ref.loss_tolerance (its notes have the derivation)
            assert abs(a[i] - b[i]) <= t, (got["prev"], i, a[i], b[i], t)
        if gb != wb:  # only a tie within both bounds may choose differently
            assert b[gb] - b[wb] <= tol[gb] + tol[wb], (got["prev"], gb, wb, b[gb], b[wb], tol[gb], tol[wb])
        assert a[gb] == min(a) and a.index(a[gb]) == gb  # the first strictly smallest of its own losses
        # same ratio, same float32 operations and the same powf: bit-identical scales
        assert np.array_equal(scales[got["prev"]], want["cand_scales"][gb]), got["prev"]
        # the search found something better than no scaling on this block
        assert min(a) <= a[0]


def test_clip_values_equal(awq_run):
    res, ref, _, ld = awq_run
    for lin, want in ref["clip"].items():
        got = ld(f"clip_{lin}.f32", *want.shape)
        bad = np.argwhere(got != want)
        assert bad.size == 0, f"{lin}: {len(bad)} of {want.size} clip values differ, first {bad[:5].tolist()}"
    # q and k are never clipped
    assert set(res["clip_err"]) == {"v", "o", "gate", "up", "down"}


def test_scaled_weights_equal(awq_run):
    _, ref, _, ld = awq_run
    for name, want in ref["w"].items():
        got = ld(f"{name}.f32" if name.endswith("norm") else f"w_{name}.f32", *want.shape)
        assert np.array_equal(got, want), f"{name}: max |diff| {np.abs(got - want).max()}"


def test_pseudo_quantize_grid():
    # AutoAWQ's grid on a hand-made group: min -1, max 2, 4 bits -> scale 0.2, zero 5
    w = np.array([[-1.0, 0.0, 0.5, 2.0, 0.1, 0.3, -0.7, 1.1]], dtype=np.float32)
    q = awq_ref.pseudo_quantize(w, 4, 8)
    scale = np.float32(3.0) / np.float32(15)
    zero = np.float32(5)
    want = (np.clip(np.rint(w / scale) + zero, 0, 15) - zero) * scale
    assert np.array_equal(q, want.astype(np.float32))
