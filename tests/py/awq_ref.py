"""A numpy port of AutoAWQ's per-block search (awq/quantize/quantizer.py), the oracle for quant/awq.c.

Written from AutoAWQ's behaviour (awq/quantize/quantizer.py; the layouts in quant/awq.h), independent of llmq's code:
  pseudo_quantize      pseudo_quantize_tensor, zero point: per (row, group) in float32
                       scale = clamp(max - min, 1e-5) / maxq, zero = clamp(-round(min / scale), 0, maxq),
                       w' = (clamp(round(w / scale) + zero, 0, maxq) - zero) * scale  (round half to even)
  search_scale         _search_best_scale + _compute_best_scale (duo scaling, n_grid ratios, MSE of the
                       inspected module's output; the first strictly smallest loss wins)
  apply_scale          scale_ln_fcs / scale_fc_fc (prev op /= s, the group's linears' columns *= s),
                       in the order of the scale groups
  search_clip          _compute_best_clip (tokens ::max(1, N // n_sample_token), candidates
                       max|w| * (1 - i/n_grid) for i < max_shrink * n_grid, error = mean over tokens of the
                       squared difference of the group dot products; first strictly smallest wins)
The modules (attention and MLP of a llama block, llama.cpp's GGUF layout: RoPE on pairs (2i, 2i+1),
its angles as llama.cpp's rope cache makes them) run in float64 from float32 weights; the scales use
the C library's powf (ratio_scales says why). loss_tolerance bounds how far llmq's float32 losses can
be from these float64 ones, for any BLAS kernel. Weights come from the GGUF through the gguf package.
"""
import numpy as np

F32 = np.float32
_LIBM = {}


def _libm(name):
    """A float32 function of the C library (powf), elementwise on float32 arrays: the one llmq calls.
    See ratio_scales for why the port does not use numpy's own float32 power."""
    if name not in _LIBM:
        import ctypes
        import ctypes.util
        f = getattr(ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6"), name)
        f.restype = ctypes.c_float
        f.argtypes = [ctypes.c_float, ctypes.c_float]
        _LIBM[name] = lambda x, r: np.vectorize(lambda v: f(float(v), float(r)), otypes=[F32])(np.asarray(x, F32))
    return _LIBM[name]


# ---- the quantizer ------------------------------------------------------------------------------

def pseudo_quantize(w, bits, group):
    """w (R, C) float32 -> fake-quantized float32, groups of `group` columns."""
    R, C = w.shape
    g = w.reshape(-1, group).astype(F32)
    maxq = F32(2 ** bits - 1)
    mx = g.max(axis=1, keepdims=True)
    mn = g.min(axis=1, keepdims=True)
    scale = np.maximum(mx - mn, F32(1e-5)) / maxq
    zero = np.clip(-np.rint(mn / scale), F32(0), maxq)
    q = np.clip(np.rint(g / scale) + zero, F32(0), maxq)
    return ((q - zero) * scale).astype(F32).reshape(R, C)


# ---- the block (llama, GGUF layout) -----------------------------------------------------------

class Block:
    def __init__(self, gguf_path, layer):
        import gguf
        r = gguf.GGUFReader(str(gguf_path))
        f = {k: v.contents() for k, v in r.fields.items() if k.startswith("llama.")}
        self.D = int(f["llama.embedding_length"])
        self.H = int(f["llama.attention.head_count"])
        self.Hkv = int(f["llama.attention.head_count_kv"])
        self.Dh = self.D // self.H
        self.eps = float(f["llama.attention.layer_norm_rms_epsilon"])
        self.theta = float(f["llama.rope.freq_base"])
        names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
                 "up": "ffn_up", "down": "ffn_down", "attn_norm": "attn_norm", "ffn_norm": "ffn_norm"}
        t = {x.name: x for x in r.tensors}
        self.w = {}
        for k, n in names.items():
            x = t[f"blk.{layer}.{n}.weight"]
            shape = [int(s) for s in reversed(x.shape.tolist())]
            self.w[k] = np.array(x.data, dtype=F32).reshape(shape if len(shape) > 1 else [shape[0]])

    def rmsnorm(self, x, w):
        """As calib/model/forward.h: f32 values, sum of squares in double, y = (x * scale) * w in f32."""
        x = x.astype(F32)
        ss = (x.astype(np.float64) ** 2).sum(axis=1)  # x*x is exact in double
        mean = (ss / x.shape[1]).astype(F32)
        scale = (F32(1) / np.sqrt(mean + F32(self.eps))).astype(F32)
        return ((x * scale[:, None]).astype(F32) * w).astype(F32)

    def rope_angles(self, seqlen):
        """(seqlen, Dh/2) float64 angles as llama.cpp defines them (ggml_rope_cache_init): theta_i =
        pos * theta_scale^i as a running float32 product, theta_scale = powf(base, -2/Dh). This is the
        model's definition in llama.cpp, not rounding noise: it differs from pos * base^(-2i/Dh) by up
        to ~5e-5 rad here, and llmq follows it; only cos/sin themselves are then evaluated in float64."""
        half = self.Dh // 2
        ts = _libm("powf")(F32(self.theta), F32(-2.0) / F32(self.Dh))
        ang = np.zeros((seqlen, half), F32)
        th = np.arange(seqlen, dtype=F32)
        for i in range(half):
            ang[:, i] = th
            th = (th * ts).astype(F32)
        return ang.astype(np.float64)

    def rope(self, x, seqlen, n_heads):
        """x (N, n_heads * Dh) float64, positions restart every seqlen rows; pairs (2i, 2i+1)."""
        N = x.shape[0]
        ang = self.rope_angles(seqlen)[np.arange(N) % seqlen]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.reshape(N, n_heads, self.Dh // 2, 2)
        a, b = x[..., 0], x[..., 1]
        out = np.stack([a * c - b * s, a * s + b * c], axis=-1)
        return out.reshape(N, n_heads * self.Dh)

    def attn(self, xn, w, n_seq, seqlen):
        """o_proj output (N, D) of the attention for normed input xn (N, D); w: dict of q, k, v, o."""
        x = xn.astype(np.float64)
        q = self.rope(x @ w["q"].astype(np.float64).T, seqlen, self.H)
        k = self.rope(x @ w["k"].astype(np.float64).T, seqlen, self.Hkv)
        v = x @ w["v"].astype(np.float64).T
        Dh, H, Hkv = self.Dh, self.H, self.Hkv
        att = np.zeros((x.shape[0], H * Dh))
        mask = np.triu(np.full((seqlen, seqlen), -np.inf), 1)
        for sq in range(n_seq):
            rows = slice(sq * seqlen, (sq + 1) * seqlen)
            for h in range(H):
                kh = h // (H // Hkv)
                qs = q[rows, h * Dh:(h + 1) * Dh]
                ks = k[rows, kh * Dh:(kh + 1) * Dh]
                vs = v[rows, kh * Dh:(kh + 1) * Dh]
                sc = qs @ ks.T / np.sqrt(Dh) + mask
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                sc /= sc.sum(axis=1, keepdims=True)
                att[rows, h * Dh:(h + 1) * Dh] = sc @ vs
        return att, att @ w["o"].astype(np.float64).T

    def mlp(self, xn, w):
        """(act (N, F), down output (N, D)) for normed input xn (N, D); w: dict of gate, up, down."""
        x = xn.astype(np.float64)
        g = x @ w["gate"].astype(np.float64).T
        u = x @ w["up"].astype(np.float64).T
        act = g / (1.0 + np.exp(-g)) * u
        return act, act @ w["down"].astype(np.float64).T


# ---- how far llmq's float32 evaluation of a loss can be from the float64 one here --------------
#
# llmq evaluates each candidate's loss L = mean((fp - out)^2) over M = N x D outputs from float32
# module outputs (sgemm, expf, ... in float32); this port evaluates the same candidates (bit-identical
# weights, same inputs) in float64. The difference is rounding error only, and its size depends on
# the summation order, i.e. on the BLAS kernel. loss_tolerance bounds it for ANY order, under the
# standard probabilistic model of rounding (N. J. Higham and T. Mary, "A New Approach to Probabilistic
# Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019: each rounding multiplies by (1 + e),
# the e independent, mean zero, |e| <= u = 2^-24):
#   * a float32 dot product of length K, in any order and blocking (FMA only removes roundings), has
#     at most 2K roundings, each of size <= u * sum_k |x_k w_k| (every partial sum is bounded by it):
#     its error is a sum of independent bounded terms, sub-Gaussian with scale
#         s = sqrt(2K) * u * sum_k |x_k w_k|                                   (Hoeffding's lemma);
#   * an elementwise operation (RoPE's products, expf, 1 + e, /, *) rounds once: s = u * |value|
#     (2u for expf, cosf, sinf, whose results are within 1 ulp <= 2u relative);
#   * to first order the error of L is sum_z a_z * err_z over all those roundings z, a_z = dL/dz (the
#     adjoint, computed below by a backward pass), so it is sub-Gaussian with variance proxy
#     V = sum_z (a_z s_z)^2, and |first-order error| <= lam * sqrt(V) with probability >= 1 - 2
#     exp(-lam^2 / 2) (Higham & Mary, Lemma 2.2). The roundings of the fp pass and of the
#     candidate's pass are distinct (their V add); the RoPE table is shared (its adjoints add first);
#   * the second-order part mean(d^2), d the output error (O(u^2), 1e-10 of L here): its expectation
#     under the model is mean(sum_z (d out_e / d z)^2 s_z^2); the forward passes below propagate
#     E_e = sqrt(sum_z (d out_e / d z)^2 s_z^2) as a root-sum-square (which treats the errors of
#     different inputs of an operation as uncorrelated: an estimate, not a bound), and the term is
#     taken as lam^2 mean(E^2), 64 times that expectation;
#   * the double-precision means (llmq's and this port's) add <= 2 M 2^-53 L.
# lam = 8: 2 exp(-32) < 3e-14 per bound. Nothing here depends on which kernel ran; a wrong forward (RoPE pairing,
# causal mask, GQA head map, SiLU) or a wrong candidate moves a loss by orders of magnitude more.

U = 2.0 ** -24
LAM = 8.0


def _dot_scale(ax, aw, K):
    """Per-element error scale of float32 x @ w.T (any summation order): sqrt(2K) u |x| @ |w|.T."""
    return np.sqrt(2.0 * K) * U * (ax @ aw.T)


class Rounding:
    """Error terms of one float32 pass: V (float), E (N, D) per-output scales, table adjoints of the
    RoPE cos / sin (seqlen, Dh/2) or None."""
    def __init__(self, V, E, dcos=None, dsin=None):
        self.V, self.E, self.dcos, self.dsin = V, E, dcos, dsin


def linear_rounding(x, W, g_out):
    """out = x @ W.T in float32, x exact (N, K); g_out = dL/dout (N, R)."""
    s = _dot_scale(np.abs(x.astype(np.float64)), np.abs(W.astype(np.float64)), x.shape[1])
    return Rounding(float(((g_out * s) ** 2).sum()), s)


def mlp_rounding(xn, w, g_out):
    """Wdown (SiLU(Wgate x) * Wup x) in float32 as calib/forward.c's mlp(), x exact (N, D)."""
    x = xn.astype(np.float64)
    ax = np.abs(x)
    Wg, Wu, Wd = (w[k].astype(np.float64) for k in ("gate", "up", "down"))
    D, F = x.shape[1], Wd.shape[1]
    g, u = x @ Wg.T, x @ Wu.T
    s_g, s_u = _dot_scale(ax, np.abs(Wg), D), _dot_scale(ax, np.abs(Wu), D)
    sig = 1.0 / (1.0 + np.exp(-g))
    silu = g * sig
    act = silu * u
    dact_dg = u * sig * (1.0 + g * (1.0 - sig))
    # (x / (1 + expf(-x))) * u: expf (2u, effect on act <= 2u |act|), 1 + e, /, * (u |act| each)
    s_act = np.sqrt(7.0) * U * np.abs(act)
    s_out = _dot_scale(np.abs(act), np.abs(Wd), F)
    E_act = np.sqrt((dact_dg * s_g) ** 2 + (silu * s_u) ** 2 + s_act ** 2)
    E = np.sqrt(E_act ** 2 @ (Wd ** 2).T + s_out ** 2)
    g_act = g_out @ Wd
    V = ((g_out * s_out) ** 2).sum() + ((g_act * s_act) ** 2).sum()
    V += ((g_act * dact_dg * s_g) ** 2).sum() + ((g_act * silu * s_u) ** 2).sum()
    return Rounding(float(V), E)


def attn_rounding(blk, xn, w, n_seq, seqlen, g_out):
    """Wo Attn(RoPE(Wq x), RoPE(Wk x), Wv x) in float32 as calib/forward.c's attn() (sgemm, the RoPE
    table, scores scaled by 1/sqrt(Dh) (exact: a power of two), softmax with expf and a double sum,
    P V, Wo), x exact (N, D); g_out = dL/dout (N, D)."""
    H, Hkv, Dh, T = blk.H, blk.Hkv, blk.Dh, seqlen
    rep, half, D = H // Hkv, Dh // 2, blk.D
    x = xn.astype(np.float64)
    ax = np.abs(x)
    Wq, Wk, Wv, Wo = (w[k].astype(np.float64) for k in ("q", "k", "v", "o"))
    N = x.shape[0]
    scale = 1.0 / np.sqrt(Dh)
    ang = blk.rope_angles(T)
    cs, sn = np.cos(ang), np.sin(ang)                                  # (T, half)

    def proj(W):
        return x @ W.T, _dot_scale(ax, np.abs(W), D)

    def rope_fwd(y, s_y, nh):  # (N, nh*Dh) -> rotated, own scales, forward scales; pairs (2i, 2i+1)
        y4, s4 = y.reshape(n_seq, T, nh, half, 2), s_y.reshape(n_seq, T, nh, half, 2)
        a, b, sa, sb = y4[..., 0], y4[..., 1], s4[..., 0], s4[..., 1]
        c, s = cs[None, :, None, :], sn[None, :, None, :]
        ra, rb = a * c - b * s, a * s + b * c
        own_a = U * np.sqrt((a * c) ** 2 + (b * s) ** 2 + ra ** 2)
        own_b = U * np.sqrt((a * s) ** 2 + (b * c) ** 2 + rb ** 2)
        tab2 = (2 * U) ** 2 * ((a * c) ** 2 + (b * s) ** 2)           # cosf / sinf within 1 ulp
        Ea = np.sqrt((c * sa) ** 2 + (s * sb) ** 2 + own_a ** 2 + tab2)
        Eb = np.sqrt((s * sa) ** 2 + (c * sb) ** 2 + own_b ** 2 + tab2)
        return (np.stack([ra, rb], -1), np.stack([own_a, own_b], -1), np.stack([Ea, Eb], -1), a, b)

    q, s_q = proj(Wq)
    k, s_k = proj(Wk)
    v, s_v = proj(Wv)
    qr, own_q, E_q, qa, qb = rope_fwd(q, s_q, H)        # (n_seq, T, H, half, 2) ...
    kr, own_k, E_k, ka, kb = rope_fwd(k, s_k, Hkv)
    qr, E_q = qr.reshape(n_seq, T, H, Dh), E_q.reshape(n_seq, T, H, Dh)
    kr, E_k = kr.reshape(n_seq, T, Hkv, Dh), E_k.reshape(n_seq, T, Hkv, Dh)
    v4, s_v4 = v.reshape(n_seq, T, Hkv, Dh), s_v.reshape(n_seq, T, Hkv, Dh)
    vis = np.tril(np.ones((T, T), bool))
    Dq = H * Dh
    att = np.zeros((n_seq, T, H, Dh))
    E_att = np.zeros_like(att)
    cache = []
    for sq in range(n_seq):
        for h in range(H):
            kh = h // rep
            Q, K_, Vh = qr[sq, :, h], kr[sq, :, kh], v4[sq, :, kh]
            S = np.where(vis, scale * (Q @ K_.T), -np.inf)
            m = S.max(axis=1, keepdims=True)
            P = np.exp(S - m)
            P /= P.sum(axis=1, keepdims=True)
            own_S = np.where(vis, scale * _dot_scale(np.abs(Q), np.abs(K_), Dh), 0.0)
            E_S2 = np.where(vis, scale ** 2 * (E_q[sq, :, h] ** 2 @ (K_ ** 2).T + Q ** 2 @ (E_k[sq, :, kh] ** 2).T), 0.0)
            sub = np.where(vis, U * np.abs(S - m), 0.0)                 # S - max, rounded
            A2 = E_S2 + own_S ** 2 + sub ** 2 + (2 * U) ** 2             # + expf, in score units
            E_P = np.sqrt(P ** 2 * (A2 + (P ** 2 * A2).sum(axis=1, keepdims=True)) + 2 * (U * P) ** 2)
            att[sq, :, h] = P @ Vh
            own_att = _dot_scale(P, np.abs(Vh).T, T)
            E_att[sq, :, h] = np.sqrt(E_P ** 2 @ Vh ** 2 + P ** 2 @ s_v4[sq, :, kh] ** 2 + own_att ** 2)
            cache.append((sq, h, kh, P, own_S, sub, own_att))
    att2 = att.reshape(N, Dq)
    s_out = _dot_scale(np.abs(att2), np.abs(Wo), Dq)
    E = np.sqrt(E_att.reshape(N, Dq) ** 2 @ (Wo ** 2).T + s_out ** 2)

    # backward: the adjoint of every rounding, V = sum (adjoint * scale)^2
    V = ((g_out * s_out) ** 2).sum()
    g_att = (g_out @ Wo).reshape(n_seq, T, H, Dh)
    g_qr = np.zeros_like(qr)
    g_kr = np.zeros_like(kr)
    g_v = np.zeros_like(v4)
    for sq, h, kh, P, own_S, sub, own_att in cache:
        ga = g_att[sq, :, h]
        V += ((ga * own_att) ** 2).sum()
        Vh = v4[sq, :, kh]
        g_P = ga @ Vh.T
        g_v[sq, :, kh] += P.T @ ga
        V += ((g_P * U * P) ** 2).sum() + ((U * (g_P * P).sum(axis=1)) ** 2).sum()  # * inv, inv
        g_S = P * (g_P - (P * g_P).sum(axis=1, keepdims=True))
        V += ((g_S * own_S) ** 2).sum() + ((g_S * sub) ** 2).sum() + ((g_S * 2 * U) ** 2).sum()
        g_qr[sq, :, h] += scale * g_S @ kr[sq, :, kh]
        g_kr[sq, :, kh] += scale * g_S.T @ qr[sq, :, h]

    def rope_bwd(g_r, own, a, b, nh):
        g5 = g_r.reshape(n_seq, T, nh, half, 2)
        ga, gb = g5[..., 0], g5[..., 1]
        Vr = ((g5 * own) ** 2).sum()
        dcos = (ga * a + gb * b).sum(axis=(0, 2))                      # (T, half)
        dsin = (-ga * b + gb * a).sum(axis=(0, 2))
        c, s = cs[None, :, None, :], sn[None, :, None, :]
        g_pre = np.stack([ga * c + gb * s, -ga * s + gb * c], -1).reshape(N, nh * Dh)
        return Vr, dcos, dsin, g_pre

    Vq, dcq, dsq, g_q = rope_bwd(g_qr, own_q, qa, qb, H)
    Vk, dck, dsk, g_k = rope_bwd(g_kr, own_k, ka, kb, Hkv)
    V += Vq + Vk + ((g_q * s_q) ** 2).sum() + ((g_k * s_k) ** 2).sum()
    V += ((g_v.reshape(N, -1) * s_v) ** 2).sum()
    return Rounding(float(V), E, dcq + dck, dsq + dsk)


def loss_tolerance(fp, cand, L, M, cos_sin=None):
    """|llmq's float32 loss - this port's float64 loss| bound for a candidate (see the notes above):
    fp, cand: Rounding of the fp pass (adjoint +2d/M) and of the candidate's (-2d/M); L the float64
    loss; cos_sin: (cos, sin) of the shared RoPE table when the passes use it."""
    V = fp.V + cand.V
    if cos_sin is not None:
        c, s = cos_sin
        V += ((2 * U * np.abs(c) * (fp.dcos + cand.dcos)) ** 2).sum()
        V += ((2 * U * np.abs(s) * (fp.dsin + cand.dsin)) ** 2).sum()
    second = LAM ** 2 * float(((fp.E + cand.E) ** 2).mean())
    return LAM * np.sqrt(V) + second + 2 * M * 2.0 ** -53 * L


# ---- the search -----------------------------------------------------------------------------

def x_mean_of(x):
    return (np.abs(x.astype(np.float64)).sum(axis=0) / x.shape[0]).astype(F32)


def w_mean_of(ws, group):
    acc = []
    for w in ws:
        g = np.abs(w.reshape(-1, group))
        acc.append((g / (g.max(axis=1, keepdims=True) + F32(1e-6))).astype(F32).reshape(w.shape))
    return (np.concatenate(acc, axis=0).astype(np.float64).mean(axis=0)).astype(F32)


def ratio_scales(x_mean, w_mean, ratio, duo=True):
    """AutoAWQ's x_mean^r / (w_mean^(1-r) + 1e-4), clamped and normalised, in float32.
    The powers come from the C library's powf, the one llmq calls: no float32 pow is correctly
    rounded, and numpy's (SIMD) float32 power differs from glibc's powf by one ulp on ~20% of the
    inputs. A one-ulp change of s[c] moves w·s[c] across a rounding boundary of the grid for a few
    weights, i.e. a different candidate with a different loss (up to 2.5e-4 of it here). With the
    same powf the candidates are bit-identical and the test can compare scales exactly."""
    _powf = _libm("powf")
    r = F32(ratio)
    if duo:
        s = _powf(x_mean, r) / (_powf(w_mean, F32(1) - r) + F32(1e-4))
    else:
        s = _powf(x_mean, r)
    s = np.maximum(s.astype(F32), F32(1e-4))
    s = (s / np.sqrt(s.max() * s.min())).astype(F32)
    s[~np.isfinite(s)] = 1
    return s


def search_scale(x_in, lin_ws, module, fp_out, bits, group, n_grid=20, duo=True, rounding=None, cos_sin=None,
                 tol_at=()):
    """Returns (best index, scales, losses, candidate scales, tolerances). module(list of candidate
    weights) -> output (float64). rounding(weights, dL/dout) -> Rounding of llmq's float32 pass with
    those weights; cos_sin: the RoPE table the passes share (loss_tolerance). Tolerances {ratio index:
    bound} are computed (two backward passes each) for ratio 0, the best, the runner-up and tol_at."""
    xm = x_mean_of(x_in)
    wm = w_mean_of(lin_ws, group)
    best, best_err, best_s, losses, cands = -1, np.inf, None, [], []

    def candidate(s):
        return [(pseudo_quantize((w * s[None, :]).astype(F32), bits, group) / s[None, :]).astype(F32)
                for w in lin_ws]
    for i in range(n_grid):
        s = ratio_scales(xm, wm, i / n_grid, duo)
        out = module(candidate(s))
        loss = float(((fp_out - out) ** 2).sum() / fp_out.size)
        losses.append(loss)
        cands.append(s)
        if loss < best_err:
            best, best_err, best_s = i, loss, s.copy()
    tols = {}
    if rounding is not None:
        for i in sorted({0, *np.argsort(losses, kind="stable")[:2].tolist(), *tol_at}):
            cand = candidate(cands[i])
            g = 2.0 * (fp_out - module(cand)) / fp_out.size   # dL/dfp; dL/dout = -g
            tols[i] = loss_tolerance(rounding(lin_ws, g), rounding(cand, -g), losses[i], fp_out.size, cos_sin)
    return best, best_s, losses, cands, tols


def sample_tokens(x, n_sample_token=512):
    step = max(1, x.shape[0] // n_sample_token)
    return x[::step]


def search_clip(w, x, bits, group, n_grid=20, max_shrink=0.5):
    """w (R, C) scaled weights, x (T, C) sampled scaled inputs -> best max per (row, group) (R, NG)."""
    R, C = w.shape
    NG = C // group
    xg = x.astype(np.float64).reshape(x.shape[0], NG, group)     # (T, NG, G)
    wg = w.reshape(R, NG, group)
    org_max = np.abs(wg).max(axis=2)                              # (R, NG)
    xb = xg.transpose(1, 0, 2)                                    # (NG, T, G)

    def group_dots(v):  # v (R, NG, G) -> (NG, T, R): per group, every token . every row
        return np.matmul(xb, v.astype(np.float64).transpose(1, 2, 0))

    org_out = group_dots(wg)
    best = org_max.copy()
    min_err = np.full((R, NG), 1e9)
    for i in range(int(max_shrink * n_grid)):
        mx = (org_max * F32(1 - i / n_grid)).astype(F32)
        cur = np.clip(wg, -mx[:, :, None], mx[:, :, None]).astype(F32)
        q = pseudo_quantize(cur.reshape(R, C), bits, group).reshape(R, NG, group)
        out = group_dots(q)
        err = ((out - org_out) ** 2).mean(axis=1).T                # (R, NG)
        better = err < min_err
        min_err[better] = err[better]
        best[better] = mx[better]
    return best.astype(F32)


def apply_clip(w, best, group):
    R, C = w.shape
    wg = w.reshape(R, C // group, group)
    return np.clip(wg, -best[:, :, None], best[:, :, None]).astype(F32).reshape(R, C)


def awq_block(blk, x, n_seq, seqlen, bits, group, n_grid=20, scales_override=None, n_sample_token=512,
              captured=None, tolerances=None):
    """The whole AutoAWQ step on one block. x (N, D) float32 fp block input.
    captured: {n1, att, n2, act} float32 inputs of q/k/v, o, gate/up, down to use instead of computing
    them here (so that the search runs on exactly llmq's inputs).
    scales_override: {prev: scales} to use instead of the searched ones for apply_scale / clip (so the
    clip search can be compared on exactly llmq's scaled inputs).
    tolerances: {prev: [ratio indices]} (may be empty) to also bound how far llmq's float32 loss may
    be from this port's (loss_tolerance; groups[i]["tol"] = {index: bound}) at ratio 0, the best, the
    runner-up and those indices. Returns a dict with groups, w, clip."""
    w = {k: v.copy() for k, v in blk.w.items()}
    if captured is None:
        n1 = blk.rmsnorm(x, w["attn_norm"])
        att, attn_fp = blk.attn(n1, w, n_seq, seqlen)
        att = att.astype(F32)  # the o input as llmq captures it (f32)
        h = (x.astype(np.float64) + attn_fp).astype(F32)
        n2 = blk.rmsnorm(h, w["ffn_norm"])
        act, mlp_fp = blk.mlp(n2, w)
        act = act.astype(F32)
    else:
        n1, att, n2, act = (captured[k] for k in ("n1", "att", "n2", "act"))
        attn_fp = blk.attn(n1, w, n_seq, seqlen)[1]
        mlp_fp = blk.mlp(n2, w)[1]

    a64 = att.astype(np.float64)
    x64 = act.astype(np.float64)
    ang = blk.rope_angles(seqlen)
    groups = [("attn_norm", ["q", "k", "v"], n1,
               lambda c: blk.attn(n1, {"q": c[0], "k": c[1], "v": c[2], "o": w["o"]}, n_seq, seqlen)[1], attn_fp,
               lambda c, g: attn_rounding(blk, n1, {"q": c[0], "k": c[1], "v": c[2], "o": w["o"]}, n_seq, seqlen, g),
               (np.cos(ang), np.sin(ang)))]
    if w["v"].shape == w["o"].shape:
        groups.append(("v", ["o"], att, lambda c: a64 @ c[0].astype(np.float64).T,
                       a64 @ w["o"].astype(np.float64).T, lambda c, g: linear_rounding(att, c[0], g), None))
    groups.append(("ffn_norm", ["gate", "up"], n2,
                   lambda c: blk.mlp(n2, {"gate": c[0], "up": c[1], "down": w["down"]})[1], mlp_fp,
                   lambda c, g: mlp_rounding(n2, {"gate": c[0], "up": c[1], "down": w["down"]}, g), None))
    groups.append(("up", ["down"], act, lambda c: x64 @ c[0].astype(np.float64).T,
                   x64 @ w["down"].astype(np.float64).T, lambda c, g: linear_rounding(act, c[0], g), None))
    res = {"groups": []}
    for prev, lins, xin, module, fp, rnd, cos_sin in groups:
        best, s, losses, cands, tols = search_scale(xin, [w[l] for l in lins], module, fp, bits, group, n_grid,
                                                    rounding=rnd if tolerances is not None else None,
                                                    cos_sin=cos_sin, tol_at=(tolerances or {}).get(prev, ()))
        res["groups"].append({"prev": prev, "best": best, "scales": s, "loss": losses, "lins": lins,
                              "cand_scales": cands, "tol": tols})
    # apply_scale in group order
    inputs = {"v": n1, "o": att, "gate": n2, "up": n2, "down": act}
    for g in res["groups"]:
        s = scales_override[g["prev"]] if scales_override else g["scales"]
        if g["prev"] in ("attn_norm", "ffn_norm"):
            w[g["prev"]] = (w[g["prev"]] / s).astype(F32)
        else:
            p = g["prev"]
            w[p][-s.shape[0]:] = (w[p][-s.shape[0]:] / s[:, None]).astype(F32)
        for l in g["lins"]:
            w[l] = (w[l] * s[None, :]).astype(F32)
            if l in inputs:
                inputs[l] = (inputs[l] / s[None, :]).astype(F32)
    res["clip"] = {}
    for l in ["v", "o", "gate", "up", "down"]:
        xs = sample_tokens(inputs[l], n_sample_token)
        best = search_clip(w[l], xs, bits, group)
        res["clip"][l] = best
        w[l] = apply_clip(w[l], best, group)
    res["w"] = w
    return res
