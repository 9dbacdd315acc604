"""Independent unpacker for AWQ "GEMM" and GPTQ (v1 / gptq_v2) safetensors directories, written from
the layouts of quant/export.h (AutoAWQ WQLinear_GEMM, AutoGPTQ / GPTQModel QuantLinear; and, for 3 bits, AutoGPTQ's QuantLinear.pack 10/1/10/1/10 word scheme) with numpy
only — it shares no code with llmq's writer (quant/export.c) or loader (calib/model/model.c).

Decoding rule (the one llmq's loader uses, so the comparison can be bit for bit):
    W[n, k] = float32(q[k, n] - z[g, n]) * float32(s[g, n])     g = k // G (AWQ) or g_idx[k] (GPTQ)
q and z are integers, s the stored fp16 scale widened to f32: one rounding (the product), in f32.
GPTQ v1 stores z - 1 (the decoder adds 1 back, unmasked as the GPTQ kernels do); gptq_v2 stores z.
"""
import json
import pathlib

import numpy as np
from safetensors import safe_open

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a word holds column 8j + AWQ_ORDER[i]
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def awq_unpack(packed):
    """int32 [X, N/8] -> int64 [X, N]: 8 nibbles per word, in AWQ_ORDER."""
    u = packed.view(np.uint32).astype(np.int64)
    out = np.empty((u.shape[0], u.shape[1] * 8), np.int64)
    for i in range(8):
        out[:, AWQ_ORDER[i]::8] = (u >> (4 * i)) & 15
    return out


def _unpack3_rows(u):
    """AutoGPTQ's 3-bit layout along axis 0: every 3 words (rows) hold 32 values:
    word0 bits 0..29 = v0..v9, bits 30-31 = low 2 bits of v10; word1 bit 0 = bit 2 of v10,
    bits 1..30 = v11..v20, bit 31 = low bit of v21; word2 bits 0-1 = bits 1-2 of v21, bits 2..31 = v22..v31."""
    nblk = u.shape[0] // 3
    out = np.empty((nblk * 32,) + u.shape[1:], np.int64)
    for b in range(nblk):
        w0, w1, w2 = u[3 * b], u[3 * b + 1], u[3 * b + 2]
        o = out[32 * b: 32 * b + 32]
        for j in range(10):
            o[j] = (w0 >> (3 * j)) & 7
        o[10] = ((w0 >> 30) & 3) | ((w1 & 1) << 2)
        for j in range(10):
            o[11 + j] = (w1 >> (3 * j + 1)) & 7
        o[21] = ((w1 >> 31) & 1) | ((w2 & 3) << 1)
        for j in range(10):
            o[22 + j] = (w2 >> (3 * j + 2)) & 7
    return out


def gptq_unpack_rows(packed, bits):
    """int32 [X*bits/32, N] packed along axis 0 -> int64 [X, N]."""
    u = packed.view(np.uint32).astype(np.int64)
    if bits == 3:
        return _unpack3_rows(u)
    per = 32 // bits
    out = np.empty((u.shape[0] * per, u.shape[1]), np.int64)
    for j in range(per):
        out[j::per] = (u >> (bits * j)) & ((1 << bits) - 1)
    return out


def gptq_unpack_cols(packed, bits):
    """int32 [X, N*bits/32] packed along axis 1 -> int64 [X, N]."""
    return gptq_unpack_rows(np.ascontiguousarray(packed.T), bits).T


def dequant_awq(t, G):
    """t: dict of qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N] -> W f32 [N, K]."""
    q = awq_unpack(t["qweight"])
    z = awq_unpack(t["qzeros"])
    s = t["scales"].astype(np.float32)
    g = np.arange(q.shape[0]) // G
    return ((q - z[g]).astype(np.float32) * s[g]).T


def dequant_gptq(t, bits, v1):
    """t: dict of qweight [K*b/32, N], qzeros [ng, N*b/32], scales [ng, N], g_idx [K] -> W f32 [N, K]."""
    q = gptq_unpack_rows(t["qweight"], bits)
    z = gptq_unpack_cols(t["qzeros"], bits) + (1 if v1 else 0)
    s = t["scales"].astype(np.float32)
    g = t["g_idx"].astype(np.int64)
    return ((q - z[g]).astype(np.float32) * s[g]).T


def save_plain_dir(tensors, cfg, src, dst):
    """A plain f32 HF directory dst: tensors {name: f32 array}, cfg (config.json without its quantization_config and
    llmq keys), the tokenizer files of src."""
    import shutil
    from safetensors.numpy import save_file
    dst.mkdir(exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(dst / "model.safetensors"))
    cfg = {k: v for k, v in cfg.items() if k not in ("quantization_config", "llmq")}
    cfg["torch_dtype"] = "float32"
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, dst / f.name)


class QuantDir:
    """A quantized HF directory: config, tensors by name (read with the safetensors package)."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.config = json.loads((self.path / "config.json").read_text())
        self.qc = self.config.get("quantization_config")
        self.handles = []
        idx = self.path / "model.safetensors.index.json"
        files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
        self.where = {}
        for f in files:
            h = safe_open(str(self.path / f), "np")
            self.handles.append(h)
            for k in h.keys():
                self.where[k] = h

    def metadata(self):
        return self.handles[0].metadata()

    def tensor(self, name):
        return self.where[name].get_tensor(name)

    def has(self, name):
        return name in self.where

    def linear(self, layer, lin):
        """The decoded W [N, K] f32 of model.layers.<layer>.<lin>."""
        p = f"model.layers.{layer}.{lin}"
        if self.has(p + ".weight"):
            return self.tensor(p + ".weight").astype(np.float32)
        parts = {k: self.tensor(f"{p}.{k}") for k in ["qweight", "qzeros", "scales", "g_idx"] if self.has(f"{p}.{k}")}
        if self.qc["quant_method"] == "awq":
            return dequant_awq(parts, self.qc["group_size"])
        v1 = self.qc.get("checkpoint_format", "gptq") == "gptq"
        return dequant_gptq(parts, self.qc["bits"], v1)

    def scales(self, layer, lin):
        return self.tensor(f"model.layers.{layer}.{lin}.scales").astype(np.float32)
