"""A numpy port of AutoAWQ's per-block search (awq/quantize/quantizer.py), the oracle for quant/awq.c.

Written from AutoAWQ's behaviour (REFERENCE §3), independent of llmq's code:
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
The modules (attention and MLP of a llama block, llama.cpp's GGUF layout: RoPE on pairs (2i, 2i+1))
run in float64 from float32 weights. Weights come from the GGUF through the gguf package.
"""
import numpy as np

F32 = np.float32


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

    def rope(self, x, seqlen, n_heads):
        """x (N, n_heads * Dh) float64, positions restart every seqlen rows; pairs (2i, 2i+1)."""
        N = x.shape[0]
        Dh = self.Dh
        pos = (np.arange(N) % seqlen).astype(np.float64)
        inv = self.theta ** (-np.arange(0, Dh, 2, dtype=np.float64) / Dh)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.reshape(N, n_heads, Dh // 2, 2)
        a, b = x[..., 0], x[..., 1]
        out = np.stack([a * c - b * s, a * s + b * c], axis=-1)
        return out.reshape(N, n_heads * Dh)

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
    r = F32(ratio)
    if duo:
        s = np.power(x_mean, r) / (np.power(w_mean, F32(1) - r) + F32(1e-4))
    else:
        s = np.power(x_mean, r)
    s = np.maximum(s.astype(F32), F32(1e-4))
    s = (s / np.sqrt(s.max() * s.min())).astype(F32)
    s[~np.isfinite(s)] = 1
    return s


def search_scale(x_in, lin_ws, module, fp_out, bits, group, n_grid=20, duo=True):
    """Returns (best index, scales, losses). module(list of candidate weights) -> output (float64)."""
    xm = x_mean_of(x_in)
    wm = w_mean_of(lin_ws, group)
    best, best_err, best_s, losses = -1, np.inf, None, []
    for i in range(n_grid):
        s = ratio_scales(xm, wm, i / n_grid, duo)
        cand = [(pseudo_quantize((w * s[None, :]).astype(F32), bits, group) / s[None, :]).astype(F32)
                for w in lin_ws]
        out = module(cand)
        loss = float(((fp_out - out) ** 2).sum() / fp_out.size)
        losses.append(loss)
        if loss < best_err:
            best, best_err, best_s = i, loss, s.copy()
    return best, best_s, losses


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
              captured=None):
    """The whole AutoAWQ step on one block. x (N, D) float32 fp block input.
    captured: {n1, att, n2, act} float32 inputs of q/k/v, o, gate/up, down to use instead of computing
    them here (so that the search runs on exactly llmq's inputs).
    scales_override: {prev: scales} to use instead of the searched ones for apply_scale / clip (so the
    clip search can be compared on exactly llmq's scaled inputs). Returns a dict with groups, w, clip."""
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

    groups = [("attn_norm", ["q", "k", "v"], n1,
               lambda c: blk.attn(n1, {"q": c[0], "k": c[1], "v": c[2], "o": w["o"]}, n_seq, seqlen)[1], attn_fp)]
    if w["v"].shape == w["o"].shape:
        groups.append(("v", ["o"], att, lambda c: att.astype(np.float64) @ c[0].astype(np.float64).T,
                       att.astype(np.float64) @ w["o"].astype(np.float64).T))
    groups.append(("ffn_norm", ["gate", "up"], n2,
                   lambda c: blk.mlp(n2, {"gate": c[0], "up": c[1], "down": w["down"]})[1], mlp_fp))
    groups.append(("up", ["down"], act, lambda c: act.astype(np.float64) @ c[0].astype(np.float64).T,
                   act.astype(np.float64) @ w["down"].astype(np.float64).T))
    res = {"groups": []}
    for prev, lins, xin, module, fp in groups:
        best, s, losses = search_scale(xin, [w[l] for l in lins], module, fp, bits, group, n_grid)
        res["groups"].append({"prev": prev, "best": best, "scales": s, "loss": losses, "lins": lins})
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
