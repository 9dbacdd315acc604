"""Numpy port of the reference GPTQ `fasterquant` (IST-DASLab/gptq gptq.py + quant.py), written from
the paper (Frantar et al. 2022, Algorithm 1) as the oracle for quant/gptq.c. float32 throughout, like torch.

Conventions that the reference leaves open and llmq fixes (the same choices here):
  * act-order permutation: argsort(diag H, descending) made STABLE (ties keep ascending index);
  * damping mean: mean(diag H) summed in float64, rounded to float32; damp = f32(percdamp) * mean;
  * Cholesky failure: percdamp += damp_increment (GPTQModel), retried from the undamped H, until >= 1;
  * g_idx / code / scale layout as AutoGPTQ & GPTQModel (codes in original column order).

The Cholesky chain uses numpy.linalg.cholesky (LAPACK spotrf in float32) and a triangular inverse;
`Hinv=` lets a test feed llmq's own Hinv instead, to check everything downstream bit for bit.

Usable as a module (fasterquant, rtn) and as a script for bench/gptq_speed.sh:
  python gptq_ref.py --bench R C [--seed S] [--group G]  -> prints {"seconds": ...}
"""
import json
import sys
import time

import numpy as np

F = np.float32


def _grid(xmin, xmax, bits, sym):
    """The (scale, zero) of find_params from a range already forced to include 0."""
    maxq = F(2 ** bits - 1)
    if sym:
        xmax = np.maximum(np.abs(xmin), xmax)
        xmin = np.where(xmin < 0, -xmax, xmin)
    both = (xmin == 0) & (xmax == 0)
    xmin = np.where(both, F(-1), xmin)
    xmax = np.where(both, F(1), xmax)
    scale = ((xmax - xmin) / maxq).astype(F)
    if sym:
        zero = np.full_like(scale, (maxq + F(1)) / F(2))
    else:
        zero = np.round(-xmin / scale).astype(F)
    return scale, zero


def find_params(x, bits, sym, grid="minmax", wt=None):
    """quant.py Quantizer.find_params(x, weight=True): x (R, n) -> scale (R,), zero (R,).
    grid "mse": quant.py's mse=True search (grid 100, maxshrink 0.8, norm 2.4): the range shrunk by
    p = 1, 0.99, ..., 0.21, the p of least sum |x - q|^norm kept (ties: the larger p); "hmse": the same
    with norm 2 and the weights wt (n,) (diag H). llmq's convention for the sum (the reference sums in
    float32): |x - q| in float32, its power, the weights and an element-order sum in float64."""
    zeros = np.zeros(x.shape[0], F)
    xmin = np.minimum(x.min(1), zeros)
    xmax = np.maximum(x.max(1), zeros)
    scale, zero = _grid(xmin, xmax, bits, sym)
    if grid == "minmax":
        return scale, zero
    norm = 2.4 if grid == "mse" else 2.0
    w = np.ones(x.shape[1]) if wt is None or grid == "mse" else np.asarray(wt, np.float64)
    best = np.full(x.shape[0], np.inf)
    for i in range(80):
        p = F(1) - F(i) / F(100)
        s1, z1 = _grid((p * xmin).astype(F), (p * xmax).astype(F), bits, sym)
        q, _ = quantize(x, s1[:, None], z1[:, None], bits)
        d = np.abs(q - x).astype(F).astype(np.float64)
        e = np.cumsum(w * (d * d if norm == 2.0 else d ** norm), axis=1)[:, -1]
        better = e < best
        best[better] = e[better]
        scale[better] = s1[better]
        zero[better] = z1[better]
    return scale, zero


def quantize(x, scale, zero, bits):
    """quant.py quantize(): x, scale, zero (R,) -> (dequantized (R,), integer code (R,))."""
    maxq = F(2 ** bits - 1)
    q = np.clip(np.round(x / scale) + zero, F(0), maxq).astype(F)
    return (scale * (q - zero)).astype(F), q


def hinv_chain(H, percdamp, damp_increment=0.0025):
    """Steps 5-6: damping, then Hinv = cholesky(cholesky_inverse(cholesky(H)), upper=True).
    Returns (Hinv upper (C, C) f32, percdamp that worked, number of retries)."""
    C = H.shape[0]
    mean = F(np.mean(np.diag(H).astype(np.float64)))
    idx = np.arange(C)
    retries = 0
    while True:
        Hd = H.copy()
        Hd[idx, idx] += F(percdamp) * mean
        try:
            L = np.linalg.cholesky(Hd)
            Linv = np.linalg.inv(L).astype(F)
            Hi = (Linv.T @ Linv).astype(F)
            U = np.linalg.cholesky(Hi).T.astype(F)
            if np.all(np.isfinite(U)) and np.all(np.diag(U) > 0):
                return np.triu(U), percdamp, retries
        except np.linalg.LinAlgError:
            pass
        nxt = F(percdamp) + F(damp_increment)
        if not nxt < 1:
            raise np.linalg.LinAlgError(f"H is not positive definite even with percdamp {percdamp}")
        percdamp, retries = nxt, retries + 1


def lazy_update_numpy(W, Err1, Hinv, i1, i2):
    """W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:] (numpy's own BLAS)."""
    W[:, i2:] -= (Err1 @ Hinv[i1:i2, i2:]).astype(F)


def lazy_update_cblas(libpath, threads=None):
    """The same update through cblas_sgemm of a given OpenBLAS (alpha = -1, beta = 1, in place), i.e.
    with llmq's summation order: a float32 GEMM's rounding depends on the BLAS kernel's blocking, so an
    exact comparison needs the same library. Returns a drop-in replacement for lazy_update_numpy."""
    import ctypes
    lib = ctypes.CDLL(libpath)
    if threads:
        lib.openblas_set_num_threads(ctypes.c_int(threads))
    f = lib.cblas_sgemm
    i, fl, p = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    f.argtypes = [i, i, i, i, i, i, fl, p, i, p, i, fl, p, i]
    f.restype = None

    def update(W, Err1, Hinv, i1, i2):
        assert W.flags.c_contiguous and Hinv.flags.c_contiguous and W.dtype == F and Hinv.dtype == F
        E = np.ascontiguousarray(Err1, dtype=F)
        R, C = W.shape
        if i2 >= C:
            return
        f(101, 111, 111, R, C - i2, i2 - i1, fl(-1.0), E.ctypes.data, i2 - i1,
          Hinv.ctypes.data + 4 * (i1 * C + i2), C, fl(1.0), W.ctypes.data + 4 * i2, C)
    return update


def gar_perm(diag, G):
    """GPTQModel's act_group_aware order (gar.py, from Gafni et al. 2025): the full groups by
    decreasing max diag within the group, each group's columns by decreasing diag, then the C % G
    tail columns in place. Stable sorts (GPTQModel uses topk; ties are where the two may differ)."""
    C = len(diag)
    NF = C // G
    groups = diag[:NF * G].reshape(NF, G)
    order = np.argsort(-groups.max(axis=1), kind="stable")
    perm = [g * G + np.argsort(-groups[g], kind="stable") for g in order]
    return np.concatenate(perm + [np.arange(NF * G, C)]).astype(np.int64)


def fasterquant(W, H, bits=4, groupsize=128, sym=False, percdamp=0.01, actorder=False,
                static_groups=False, blocksize=128, Hinv=None, lazy_update=lazy_update_numpy,
                group_aware=False, grid="minmax"):
    """GPTQ.fasterquant on W (R, C), H (C, C). Returns a dict with codes (R, C) uint8 in original
    order, scales / zeros (R, NG), g_idx (C,), Q (R, C) dequantized, Hinv, loss, percdamp.
    group_aware: GPTQModel's act_group_aware (GAR) order instead of act-order; its grids are put back
    at their original group index afterwards, so g_idx stays c // G."""
    W = np.array(W, dtype=F, copy=True)
    H = np.array(H, dtype=F, copy=True)
    R, C = W.shape
    G = groupsize
    NG = 1 if G <= 0 else -(-C // G)
    scales = np.zeros((R, NG), F)
    zeros = np.zeros((R, NG), F)
    dh = np.diag(H).copy()  # hmse's weights at steps 1 and 3 (a dead column's 0 weighs a zeroed weight)
    if G <= 0:
        scales[:, 0], zeros[:, 0] = find_params(W, bits, sym, grid, dh)   # before dead columns, as the reference

    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0

    static = static_groups and G > 0
    if static:
        for g in range(NG):
            scales[:, g], zeros[:, g] = find_params(W[:, g * G:(g + 1) * G], bits, sym, grid, dh[g * G:(g + 1) * G])

    perm = np.arange(C)
    if actorder or group_aware:
        perm = np.argsort(-np.diag(H), kind="stable") if actorder else gar_perm(np.diag(H), G)
        W = np.ascontiguousarray(W[:, perm])
        H = np.ascontiguousarray(H[perm][:, perm])
    invperm = np.argsort(perm)

    if Hinv is None:
        Hinv, percdamp, _ = hinv_chain(H, percdamp)
    Hinv = np.ascontiguousarray(Hinv, dtype=F)

    Q = np.zeros_like(W)
    codes = np.zeros((R, C), np.uint8)
    Losses = np.zeros_like(W)
    for i1 in range(0, C, blocksize):
        i2 = min(i1 + blocksize, C)
        count = i2 - i1
        W1 = W[:, i1:i2].copy()
        Q1 = np.zeros_like(W1)
        Err1 = np.zeros_like(W1)
        Losses1 = np.zeros_like(W1)
        Hinv1 = Hinv[i1:i2, i1:i2]
        for i in range(count):
            w = W1[:, i].copy()
            d = Hinv1[i, i]
            j = i1 + i
            if G > 0:
                if not static:
                    if j % G == 0:
                        scales[:, j // G], zeros[:, j // G] = find_params(W[:, j:j + G], bits, sym, grid,
                                                                          np.diag(H)[j:j + G])
                    g = j // G
                else:
                    g = perm[j] // G
            else:
                g = 0
            q, code = quantize(w, scales[:, g], zeros[:, g], bits)
            Q1[:, i] = q
            codes[:, perm[j]] = code.astype(np.uint8)
            Losses1[:, i] = (w - q) ** 2 / d ** 2
            err1 = ((w - q) / d).astype(F)
            W1[:, i:] -= np.outer(err1, Hinv1[i, i:]).astype(F)
            Err1[:, i] = err1
        Q[:, i1:i2] = Q1
        Losses[:, i1:i2] = Losses1 / 2
        lazy_update(W, Err1, Hinv, i1, i2)

    if group_aware:  # processing group j holds original group perm[j * G] // G
        NF = C // G
        src = perm[np.arange(NF) * G] // G
        for a in (scales, zeros):
            full = a[:, :NF].copy()
            a[:, src] = full
    if G <= 0:
        g_idx = np.zeros(C, np.int32)
    elif actorder and not static:
        g_idx = (invperm // G).astype(np.int32)
    else:
        g_idx = (np.arange(C) // G).astype(np.int32)
    return dict(codes=codes, scales=scales, zeros=zeros, g_idx=g_idx, Q=Q[:, invperm], Hinv=Hinv,
                loss=float(Losses.astype(np.float64).sum()), percdamp=float(percdamp), perm=perm)


def rtn(W, bits=4, groupsize=128, sym=False):
    """Round to nearest with the same grid: codes, scales, zeros."""
    W = np.asarray(W, F)
    R, C = W.shape
    G = C if groupsize <= 0 else groupsize
    NG = -(-C // G)
    codes = np.zeros((R, C), np.uint8)
    scales = np.zeros((R, NG), F)
    zeros = np.zeros((R, NG), F)
    for g in range(NG):
        s, z = find_params(W[:, g * G:(g + 1) * G], bits, sym)
        scales[:, g], zeros[:, g] = s, z
        for c in range(g * G, min(C, (g + 1) * G)):
            codes[:, c] = quantize(W[:, c], s, z, bits)[1].astype(np.uint8)
    return dict(codes=codes, scales=scales, zeros=zeros)


def correlated_problem(R, C, seed, n_tokens=None):
    """Seeded W (R, C) and a correlated Hessian H = 2/N XᵀX (C, C), X (N, C) with a low-rank mix."""
    rng = np.random.default_rng(seed)
    N = n_tokens or max(2 * C, 256)
    k = max(8, C // 16)
    X = (rng.standard_normal((N, k)).astype(F) @ rng.standard_normal((k, C)).astype(F)
         + F(0.5) * rng.standard_normal((N, C)).astype(F)) * rng.uniform(0.2, 3.0, C).astype(F)
    H = (F(2.0 / N) * (X.T @ X)).astype(F)
    W = (F(0.02) * rng.standard_normal((R, C))).astype(F)
    return W, H


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--bench":
        R, C = int(sys.argv[2]), int(sys.argv[3])
        args = sys.argv[4:]
        prefix = args[args.index("--in") + 1] if "--in" in args else None
        group = int(args[args.index("--group") + 1]) if "--group" in args else 128
        W = np.fromfile(prefix + ".W", F).reshape(R, C)
        H = np.fromfile(prefix + ".H", F).reshape(C, C)
        t = time.time()
        out = fasterquant(W, H, bits=4, groupsize=group)
        dt = time.time() - t
        if "--save" in args:
            out["codes"].tofile(prefix + ".ref.q")
        print(json.dumps({"seconds": dt, "loss": out["loss"]}))
    else:
        print(__doc__)
