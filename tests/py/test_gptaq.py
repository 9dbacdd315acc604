"""GPTAQ (quant/gptq.h "GPTAQ") through tests/tools/gptq_tool --dxxt, against a float64 numpy reference written
from the paper's equations (Li et al. 2025, arXiv 2504.02692), column by column, without the Cholesky
reformulation or the lazy blocks that llmq uses:

  objective ‖W X − Q X̃‖², X̃ the quantized model's input (H = 2/N X̃ᵀX̃ + damping), X the full-precision one,
  D = 2/N ΔXᵀX̃ (D[i, j] = Σ Δx_i x̃_j). Fixing column i to q_i, the free columns F = {i+1, ...} take the least-
  squares compensation of the error (v_i − q_i) x̃_i + alpha · v_i Δx_i on X̃_F:
      v_F += ((v_i − q_i) H[i, F] + alpha · v_i D[i, F]) · H[F, F]⁻¹      (np.linalg.solve, float64)
  with (scale, zero) of each group from the current v at the group's first column (the min/max grid of the
  reference quant.py, gptq_ref.find_params).

Checks: (1) llmq's codes equal the reference's and its Q is within float32 rounding of it, with blocks smaller
than the group (so that the lazy update and the in-block update both carry the term); (2) with D = 0 the result
is bit-identical to plain GPTQ; (3) on a layer whose fp input differs from its quantized input, the asymmetric
objective ‖W X − Q X̃‖² is lower with GPTAQ than with plain GPTQ (alpha 1 and upstream's 0.25), and plain GPTQ's
own objective ‖(W − Q) X̃‖² is lower with plain GPTQ (what each minimises).
"""
import json
import os
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gptq_ref  # noqa: E402
from conftest import run  # noqa: E402

F = np.float32


def problem(R, C, N, seed, delta=0.15):
    """W (R, C); X (N, C) the fp inputs with correlated channels; X̃ = X + a correlated perturbation (what the
    quantized blocks before the layer do to its input); H, D as the pipeline forms them."""
    rng = np.random.default_rng(seed)
    k = max(4, C // 8)
    X = (rng.standard_normal((N, k)) @ rng.standard_normal((k, C)) + 0.5 * rng.standard_normal((N, C)))
    X *= rng.uniform(0.3, 2.0, C)
    Xq = X + delta * (rng.standard_normal((N, k)) @ rng.standard_normal((k, C)) / np.sqrt(k)
                      + rng.standard_normal((N, C))) * X.std(0)
    X, Xq = X.astype(F), Xq.astype(F)
    H = (F(2.0 / N) * (Xq.T.astype(np.float64) @ Xq)).astype(F)
    D = (F(2.0 / N) * ((X - Xq).T.astype(np.float64) @ Xq)).astype(F)
    W = (0.05 * rng.standard_normal((R, C))).astype(F)
    return W, X, Xq, H, D


def reference(W, H, D, bits, G, alpha, percdamp=0.01):
    """The column-by-column GPTAQ of the module docstring, float64 except the grid (float32, as quant.py)."""
    R, C = W.shape
    Hd = H.astype(np.float64).copy()
    Hd[np.arange(C), np.arange(C)] += np.float64(F(percdamp) * F(np.mean(np.diag(H).astype(np.float64))))
    Dd = D.astype(np.float64)
    v = W.astype(np.float64).copy()
    codes = np.zeros((R, C), np.uint8)
    Q = np.zeros((R, C))
    for i in range(C):
        if i % G == 0:
            s, z = gptq_ref.find_params(v[:, i:i + G].astype(F), bits, False)
        q, c = gptq_ref.quantize(v[:, i].astype(F), s, z, bits)
        codes[:, i], Q[:, i] = c.astype(np.uint8), q
        if i + 1 < C:
            Fi = slice(i + 1, C)
            rhs = np.outer(v[:, i] - q, Hd[i, Fi]) + alpha * np.outer(v[:, i], Dd[i, Fi])  # (R, |F|)
            v[:, Fi] += np.linalg.solve(Hd[Fi, Fi], rhs.T).T  # H_FF symmetric
        v[:, i] = q
    return codes, Q


@pytest.fixture(scope="module")
def solve(tool, tmp_path_factory):
    exe = tool("gptq_tool")
    d = tmp_path_factory.mktemp("gptaq")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

    def call(W, H, D=None, bits=4, G=32, blocksize=128, alpha=0.25):
        R, C = W.shape
        W.astype(F).tofile(d / "W")
        H.astype(F).tofile(d / "H")
        args = [exe, "--W", d / "W", "--H", d / "H", "--R", R, "--C", C, "--out", d / "o", "--bits", bits,
                "--group", G, "--blocksize", blocksize]
        if D is not None:
            D.astype(F).tofile(d / "D")
            args += ["--dxxt", d / "D", "--alpha", repr(alpha)]
        r = run(args, env=env)
        assert json.loads(r.stdout)["status"] == "ok"
        q = np.fromfile(d / "o.q", np.uint8).reshape(R, C)
        Q = np.fromfile(d / "o.Q", F).reshape(R, C)
        return q, Q

    return call


@pytest.mark.parametrize("bits,G,blocksize,alpha,seed", [(4, 32, 8, 1.0, 1), (3, 32, 16, 0.25, 2),
                                                          (4, 64, 64, 0.5, 3)])
def test_matches_reference(solve, bits, G, blocksize, alpha, seed):
    W, X, Xq, H, D = problem(12, 64, 512, seed)
    codes_ref, Q_ref = reference(W, H, D, bits, G, alpha)
    codes_plain, _ = reference(W, H, np.zeros_like(D), bits, G, alpha)
    # the term changes the result at all (else this test could not fail on it)
    assert (codes_ref != codes_plain).mean() > 0.02
    q, Q = solve(W, H, D, bits=bits, G=G, blocksize=blocksize, alpha=alpha)
    agree = (q == codes_ref).mean()
    print(f"bits {bits} G {G} B {blocksize} alpha {alpha}: code agreement with the reference {agree:.4f}")
    assert agree == 1.0
    assert np.max(np.abs(Q - Q_ref)) <= 1e-5 * np.max(np.abs(Q_ref))


def test_zero_cross_term_is_plain_gptq(solve):
    W, X, Xq, H, D = problem(16, 64, 512, 4)
    q0, Q0 = solve(W, H, bits=3, G=32, blocksize=16)
    q1, Q1 = solve(W, H, np.zeros_like(D), bits=3, G=32, blocksize=16, alpha=1.0)
    assert np.array_equal(q0, q1) and np.array_equal(Q0, Q1)


@pytest.mark.parametrize("bits", [3, 4])
def test_asymmetric_objective_lower(solve, bits):
    W, X, Xq, H, D = problem(64, 128, 2048, 5)
    target = X.astype(np.float64) @ W.T.astype(np.float64)  # (N, R) the fp layer's output on fp inputs

    def asym(Q):
        return float(np.sum((Xq.astype(np.float64) @ Q.T.astype(np.float64) - target) ** 2))

    def sym(Q):
        return float(np.sum((Xq.astype(np.float64) @ (W - Q).T.astype(np.float64)) ** 2))

    _, Qg = solve(W, H, bits=bits, G=64)
    res = {"gptq": (asym(Qg), sym(Qg))}
    for alpha in (1.0, 0.25):
        _, Qa = solve(W, H, D, bits=bits, G=64, alpha=alpha)
        res[f"gptaq alpha {alpha}"] = (asym(Qa), sym(Qa))
    print({k: (f"{a:.4g}", f"{s:.4g}") for k, (a, s) in res.items()})
    for alpha in (1.0, 0.25):
        a, s = res[f"gptaq alpha {alpha}"]
        assert a < res["gptq"][0]
        assert s > res["gptq"][1]
    # the full closed form goes further on its own objective than the damped one
    assert res["gptaq alpha 1.0"][0] < res["gptaq alpha 0.25"][0]
