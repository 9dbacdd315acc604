"""GPTQ oracle: llmq's quant/gptq.c (through tests/tools/gptq_tool) against the numpy port of the
reference fasterquant (gptq_ref.py), on random and on real SmolLM2 W / H.

Two comparisons per case:
  exact   the port is fed llmq's Hinv and does the lazy update with the same cblas_sgemm (the system
          OpenBLAS that llmq links): integer codes, scales, zeros, g_idx and Q must be bit-identical.
          (A float32 GEMM's rounding depends on the BLAS kernel's blocking, and numpy bundles another
          OpenBLAS build; spotri vs numpy's triangular inverse differ at ~1e-5 relative.)
  indep   the port runs everything itself (numpy.linalg.cholesky chain, numpy's matmul). Both Hinv
          (llmq's spotrf/spotri/spotrf and numpy's) must be the Cholesky factor of H_damped⁻¹ within
          the bound of that float32 chain (hinv_residual_bound). The codes are NOT compared: from the
          first rounding that the two float32 paths decide differently, GPTQ's error feedback sends
          the rest of that row elsewhere, so the agreement fraction (printed; 0.989 to 0.999 across
          OpenBLAS kernels) measures chaos, not correctness. The exact mode checks the algorithm.
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


def _blas_lib(tool_path):
    """The OpenBLAS shared library the llmq tools are linked against (from ldd)."""
    out = run(["ldd", tool_path]).stdout
    for line in out.splitlines():
        if "libopenblas" in line and "=>" in line:
            return line.split("=>")[1].split("(")[0].strip()
    pytest.fail(f"no libopenblas in ldd {tool_path}:\n{out}")


def _numpy_blas_threads(n):
    """Set the thread count of numpy's bundled OpenBLAS (scipy-openblas); returns the old one or None."""
    import ctypes
    import glob
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "libscipy_openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for suffix in ("64_", "_64_", ""):
            get = getattr(lib, "scipy_openblas_get_num_threads" + suffix, None)
            set_ = getattr(lib, "scipy_openblas_set_num_threads" + suffix, None)
            if get and set_:
                old = get()
                set_(ctypes.c_int(n))
                return lambda: set_(ctypes.c_int(old))
    return None


@pytest.fixture(scope="module")
def gptq(tool, tmp_path_factory):
    # One BLAS thread for numpy, the ctypes-loaded OpenBLAS and gptq_tool: the cases are small, and on
    # a shared machine spinning BLAS threads cost more than they bring (3x here).
    exe = tool("gptq_tool")
    d = tmp_path_factory.mktemp("gptq")
    exact_update = gptq_ref.lazy_update_cblas(_blas_lib(exe), threads=1)
    restore = _numpy_blas_threads(1)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")

    def call(W, H, bits=4, groupsize=128, sym=False, actorder=False, static_groups=False,
             percdamp=0.01, rtn=False, check=True, group_aware=False, grid="minmax"):
        R, C = W.shape
        W.astype(F).tofile(d / "W")
        H.astype(F).tofile(d / "H")
        args = [exe, "--W", d / "W", "--H", d / "H", "--R", R, "--C", C, "--out", d / "o",
                "--bits", bits, "--group", groupsize, "--percdamp", repr(percdamp)]
        args += ["--sym"] * sym + ["--act-order"] * actorder + ["--static-groups"] * static_groups
        args += ["--rtn"] * rtn + ["--group-aware"] * group_aware + ["--grid", grid]
        r = run(args, check=False, env=env)
        if not check:
            return r
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        NG = info["n_groups"]
        res = dict(info=info, stderr=r.stderr,
                   codes=np.fromfile(d / "o.q", np.uint8).reshape(R, C),
                   scales=np.fromfile(d / "o.scales", F).reshape(R, NG),
                   zeros=np.fromfile(d / "o.zeros", F).reshape(R, NG),
                   g_idx=np.fromfile(d / "o.gidx", np.int32),
                   Q=np.fromfile(d / "o.Q", F).reshape(R, C))
        if not rtn:
            res["Hinv"] = np.fromfile(d / "o.Hinv", F).reshape(C, C)
        return res

    call.exact_update = exact_update
    yield call
    if restore:
        restore()


def compare(gptq, W, H, **kw):
    """Run llmq and both port modes; assert; return the indep code agreement fraction."""
    got = gptq(W, H, **kw)
    ref = gptq_ref.fasterquant(W, H, Hinv=got["Hinv"], lazy_update=gptq.exact_update, **kw)
    for k in ("codes", "scales", "zeros", "g_idx", "Q"):
        a, b = got[k], ref[k]
        if not np.array_equal(a, b):
            bad = np.argwhere(a != b)
            pytest.fail(f"{kw}: {k} differs in {len(bad)} places, first {bad[:3].tolist()}: "
                        f"llmq {a[tuple(bad[0])]} port {b[tuple(bad[0])]}")
    # same w, q and Hinv_ii (bit-identical above): the port forms each nonnegative term ½(w-q)²/d² in
    # float32 (<= 4 roundings: <= 4u = 2.4e-7 relative, llmq may form it in double) and both sum in
    # double (<= C·R·2⁻⁵³ < 1e-11 relative): the sums agree to < 2.5e-7 relative; 1e-6 is 4x that.
    assert abs(got["info"]["loss"] - ref["loss"]) <= 1e-6 * max(1.0, ref["loss"])
    # dequantization contract: W = (q - zero[g_idx]) * scale[g_idx]
    deq = (got["codes"].astype(F) - got["zeros"][:, got["g_idx"]]) * got["scales"][:, got["g_idx"]]
    assert np.array_equal(deq, got["Q"])

    ind = gptq_ref.fasterquant(W, H, **kw)
    # the damping retries step percdamp by 0.0025 in float32 on both sides: equal to float32 precision
    assert got["info"]["percdamp"] == pytest.approx(ind["percdamp"], abs=1e-7)
    A = damped(H, ind["perm"], ind["percdamp"])
    Ainv = np.linalg.inv(A)
    tol = hinv_residual_bound(A)
    for who, R in (("llmq", got["Hinv"]), ("numpy port", ind["Hinv"])):
        # GPTQ reads the upper triangle; an upper R with a positive diagonal and RᵀR = A⁻¹ is unique
        R = np.triu(R.astype(np.float64))
        assert np.all(np.diag(R) > 0), f"{kw}: {who}'s Hinv has a non-positive diagonal"
        res = np.linalg.norm(R.T @ R - Ainv, 2) / np.linalg.norm(Ainv, 2)
        assert res <= tol, f"{kw}: {who}'s Hinv is not chol(H⁻¹): residual {res:.3g} > bound {tol:.3g}"
    frac = float((ind["codes"] == got["codes"]).mean())
    print(f"indep code agreement {frac:.6f} (information only) {kw}")
    return frac


def damped(H, perm, percdamp):
    """H as GPTQ factors it, in float64: dead columns' diagonal 1, permuted, diagonal += percdamp *
    mean(diag H) (float32, as both implementations add it)."""
    H = np.array(H, F)
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    H = H[perm][:, perm]
    idx = np.arange(len(H))
    H[idx, idx] += F(percdamp) * F(np.mean(np.diag(H).astype(np.float64)))
    return H.astype(np.float64)


def hinv_residual_bound(A):
    """Bound on ||RᵀR - A⁻¹||₂ / ||A⁻¹||₂ for R = Hinv computed in float32 (u = 2⁻²⁴) by the chain
    chol(A) -> inverse from the factor -> chol(A⁻¹) in any blocking (Higham, Accuracy and Stability
    of Numerical Algorithms, 2nd ed.: Thm 10.3 for Cholesky, whose computed factor is exact for a
    matrix within γ_(C+1)|Rᵀ||R| of its input; §14.3 for the inverse from a Cholesky factor, within
    c·C·u·κ₂(A) relative): the factorizations add (C+1)u each, the inversion and the product of its
    factors (C+1)u·κ₂(A) each, 2(C+1)u(κ₂(A) + 1) in all. κ₂(A) ≈ 3e3 for the random cases: the
    bound is 0.10; a valid factor gives ~1e-6, a wrong one O(1) (measured on seed 204: chol(H) 3.8e3,
    no damping 112, H not permuted 0.85, the lower factor's upper part 0.70, L⁻¹ without the second
    Cholesky 0.48)."""
    C = len(A)
    return 2 * (C + 1) * 2.0 ** -24 * (np.linalg.cond(A) + 1)


# (bits, group, sym, act_order, static_groups): every group x act-order x static combination, with
# bits cycling 2, 3, 4, 8 and sym / asym alternating in runs of four; then the other bit widths.
_GAS = [(g, a, st) for g in (-1, 64, 128) for a in (False, True) for st in (False, True)
        if not (g == -1 and st)]
CASES = [((2, 3, 4, 8)[i % 4], g, bool((i // 4) % 2), a, st) for i, (g, a, st) in enumerate(_GAS)]
CASES += [(b, 128, b == 3, True, False) for b in (2, 3, 8)] + [(4, 32, True, False, False)]


@pytest.mark.parametrize("bits,group,sym,act,static", CASES)
def test_random_exact(gptq, bits, group, sym, act, static):
    W, H = gptq_ref.correlated_problem(40, 300, seed=bits * 100 + max(group, 0))  # C = 300: ragged block
    compare(gptq, W, H, bits=bits, groupsize=group, sym=sym, actorder=act, static_groups=static)


# The searched grids (quant/gptq.h llmq_gptq_grid): quant.py's mse search and its diag(H)-weighted form,
# per row, dynamic, static and act-order groups; bit-identical with the port as the minmax cases.
@pytest.mark.parametrize("grid,bits,group,sym,act,static", [
    ("mse", 4, 64, False, False, False), ("mse", 3, -1, True, False, False), ("hmse", 4, 64, False, True, False),
    ("hmse", 3, 128, False, True, True), ("hmse", 2, 32, True, False, False)])
def test_grid_search_exact(gptq, grid, bits, group, sym, act, static):
    W, H = gptq_ref.correlated_problem(40, 300, seed=7 + bits)
    compare(gptq, W, H, bits=bits, groupsize=group, sym=sym, actorder=act, static_groups=static, grid=grid)
    # the search includes p = 1 (minmax): each group's searched error is no larger than minmax's
    x = W[:, :64].astype(F)
    wt = np.diag(H)[:64] if grid == "hmse" else None
    for g in ("minmax", grid):
        s, z = gptq_ref.find_params(x, bits, sym, g, wt)
        q, _ = gptq_ref.quantize(x, s[:, None], z[:, None], bits)
        d = np.abs(q - x).astype(np.float64) ** (2.4 if grid == "mse" else 2.0)
        e = (d * (wt if wt is not None else 1.0)).sum(1)
        if g == "minmax":
            e0 = e
    assert np.all(e <= e0 * (1 + 1e-12)) and np.any(e < e0)


# GPTQModel's act_group_aware (GAR) order: C = 300 leaves a tail of 300 % G columns after the full groups.
@pytest.mark.parametrize("bits,group,sym", [(4, 64, False), (3, 128, True), (2, 32, False), (8, 64, True)])
def test_group_aware_exact(gptq, bits, group, sym):
    W, H = gptq_ref.correlated_problem(40, 300, seed=bits * 7 + group)
    compare(gptq, W, H, bits=bits, groupsize=group, sym=sym, group_aware=True)
    got = gptq(W, H, bits=bits, groupsize=group, sym=sym, group_aware=True)
    assert np.array_equal(got["g_idx"], np.arange(300) // group)  # plain groups: any format holds them


def test_group_aware_refusals(gptq):
    W, H = gptq_ref.correlated_problem(8, 64, seed=1)
    for kw in (dict(groupsize=-1), dict(groupsize=32, actorder=True), dict(groupsize=32, static_groups=True)):
        r = gptq(W, H, group_aware=True, check=False, **kw)
        assert r.returncode == 2 and "group-aware" in r.stdout + r.stderr, (kw, r.stdout, r.stderr)


def test_dead_columns(gptq):
    W, H = gptq_ref.correlated_problem(24, 200, seed=7)
    dead = [0, 5, 64, 130, 199]
    H[dead, :] = 0
    H[:, dead] = 0
    for act in (False, True):
        for static in (False, True):
            compare(gptq, W, H, bits=4, groupsize=64, actorder=act, static_groups=static)
    got = gptq(W, H, groupsize=64, actorder=True)
    assert np.all(got["Q"][:, dead] == 0)
    # per-row grid (G = -1) is taken before the dead columns are zeroed, as in the reference
    compare(gptq, W, H, bits=3, groupsize=-1)


def test_damping_retry(gptq):
    # H = A - 0.004·mean(diag A)·I with A rank deficient: indefinite; percdamp 0.001 and 0.0035 fail,
    # 0.006 succeeds (the margins are far from the boundary, so both LAPACKs agree)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((64, 160)).astype(F)
    A = (X.T @ X / F(64)).astype(F)
    H = (A - F(0.004) * F(np.mean(np.diag(A))) * np.eye(160, dtype=F)).astype(F)
    W = (F(0.02) * rng.standard_normal((16, 160))).astype(F)
    got = gptq(W, H, percdamp=0.001)
    assert "retrying with percdamp" in got["stderr"] and "gptq_tool" in got["stderr"]
    assert got["info"]["percdamp"] == pytest.approx(0.006, abs=1e-6)
    compare(gptq, W, H, percdamp=0.001)
    # hopeless: a strongly negative definite H gives up with a numeric error
    r = gptq(W, -np.eye(160, dtype=F), percdamp=0.99, check=False)
    assert r.returncode == 2 and json.loads(r.stdout)["status"] == "numeric"
    assert "gptq_tool" in r.stderr and "giving up" in r.stderr


def test_nan_is_an_error(gptq):
    W, H = gptq_ref.correlated_problem(8, 64, seed=1)
    W[3, 5] = np.nan
    r = gptq(W, H, check=False)
    assert r.returncode == 2 and json.loads(r.stdout)["status"] == "numeric"
    assert "gptq_tool" in r.stderr and "(3, 5)" in r.stderr


@pytest.mark.parametrize("bits,group,sym", [(2, 64, False), (3, -1, True), (4, 128, False), (8, 64, True)])
def test_rtn(gptq, bits, group, sym):
    W, H = gptq_ref.correlated_problem(20, 256, seed=bits)
    got = gptq(W, H, bits=bits, groupsize=group, sym=sym, rtn=True)
    ref = gptq_ref.rtn(W, bits=bits, groupsize=group, sym=sym)
    for k in ("codes", "scales", "zeros"):
        assert np.array_equal(got[k], ref[k]), k


# ---- real SmolLM2 weights and a real-ish H from token embeddings of wiki.valid.raw

@pytest.fixture(scope="module")
def smol(smollm2, llmq_bin, tool, data_dir, tmp_path_factory):
    import gguf
    cache = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
    f32 = cache / "smollm2-f32.gguf"
    if not f32.exists():
        run([llmq_bin, "convert", "--model", smollm2, "--dtype", "f32", "--out", f32])
    r = gguf.GGUFReader(str(f32))
    t = {x.name: x for x in r.tensors}
    get = lambda n: np.asarray(t[n].data, dtype=F)  # noqa: E731  (out, in) like torch
    d = tmp_path_factory.mktemp("smol")
    text = (data_dir / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()[:16000]
    (d / "text").write_bytes(text)
    ids = np.array(run([tool("tokenize_tool"), f32, d / "text"]).stdout.split(), dtype=np.int64)
    assert len(ids) > 2000
    emb = get("token_embd.weight")
    X = emb[ids]                                                     # (N, 576)
    g, u = X @ get("blk.0.ffn_gate.weight").T, X @ get("blk.0.ffn_up.weight").T
    Xd = (g / (F(1) + np.exp(-g)) * u).astype(F)                    # (N, 1536) SwiGLU of embeddings
    N = len(ids)
    return dict(q=get("blk.0.attn_q.weight"), k=get("blk.0.attn_k.weight"),
                down=get("blk.0.ffn_down.weight")[:48],
                H=(F(2.0 / N) * (X.T @ X)).astype(F), Hd=(F(2.0 / N) * (Xd.T @ Xd)).astype(F))


@pytest.mark.parametrize("bits,group,sym,act,static", [
    (4, 64, False, False, False), (4, 64, False, True, False), (4, 64, True, True, True),
    (3, -1, False, True, False), (2, 64, False, False, True), (8, 64, True, True, False),
    (4, 128, False, True, False)])
def test_smollm2_exact(gptq, smol, bits, group, sym, act, static):
    kw = dict(bits=bits, groupsize=group, sym=sym, actorder=act, static_groups=static)
    compare(gptq, smol["k"], smol["H"], **kw)     # attn_k (192, 576)
    if group in (64, -1):
        compare(gptq, smol["down"], smol["Hd"], **kw)  # 48 rows of ffn_down (576, 1536)


@pytest.mark.parametrize("bits,group", [(4, 64), (3, 64)])
def test_smollm2_group_aware_exact(gptq, smol, bits, group):
    compare(gptq, smol["k"], smol["H"], bits=bits, groupsize=group, group_aware=True)
    compare(gptq, smol["down"], smol["Hd"], bits=bits, groupsize=group, group_aware=True)


def test_smollm2_gptq_beats_rtn(gptq, smol):
    W, H = smol["q"], smol["H"]                  # attn_q (576, 576)
    got = gptq(W, H, bits=3, groupsize=64, actorder=True)
    rtn = gptq(W, H, bits=3, groupsize=64, rtn=True)

    def out_err(Q):
        D = (Q - W).astype(np.float64)
        return float(np.einsum("rc,cd,rd->", D, H.astype(np.float64), D))
    assert out_err(got["Q"]) < 0.8 * out_err(rtn["Q"])
