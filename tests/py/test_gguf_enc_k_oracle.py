"""The k-quant encoders (Q2_K .. Q6_K of formats/ggml/encode.h) against ggml, byte for byte, on many blocks.

tests/py/test_gguf_enc_oracle.py checks every type on a dozen rows per distribution; this file
stresses the k-quant scale searches (formats/ggml/encode_k.c, formats/ggml/search.c) with more blocks:
  - synthetic rows whose sub-blocks vary in scale, offset and sparsity inside one super-block (the
    6-bit / 4-bit scale and min quantization), near-constant and one-hot sub-blocks, rounding ties;
  - real SmolLM2 rows: blk.N.ffn_down.weight (1536 wide) of every layer, and a slice of every tensor
    of the file (2-D weights, embeddings, 1-D norms) reshaped into rows of 1024 (heavy);
each with no imatrix (quantize_row_qX_K_ref) and with several importance vectors (random
log-normal, with zero columns, all ones, and Σx²-like from the rows themselves: the _impl searches).
The oracle is ggml_quantize_chunk of llama-cpp-python's libggml-base.so through ctypes (skipped when
llama_cpp is not importable). A mismatch prints the first differing block, the field (d, dmin,
scales, qs, qh, hmask, ql) and byte, the decoded super-block scales and the block's inputs.
"""
import pathlib

import numpy as np
import pytest

from conftest import ggml_quantizer, run

gguf = pytest.importorskip("gguf")

QK_K = 256
# llmq display name -> (ggml type id, block bytes, [(field, start, end)] of the block layout)
K_TYPES = {
    "q2_k": (10, 84, [("scales", 0, 16), ("qs", 16, 80), ("d", 80, 82), ("dmin", 82, 84)]),
    "q3_k": (11, 110, [("hmask", 0, 32), ("qs", 32, 96), ("scales", 96, 108), ("d", 108, 110)]),
    "q4_k": (12, 144, [("d", 0, 2), ("dmin", 2, 4), ("scales", 4, 16), ("qs", 16, 144)]),
    "q5_k": (13, 176, [("d", 0, 2), ("dmin", 2, 4), ("scales", 4, 16), ("qh", 16, 48), ("qs", 48, 176)]),
    "q6_k": (14, 210, [("ql", 0, 128), ("qh", 128, 192), ("scales", 192, 208), ("d", 208, 210)]),
}
WIDTH = 1024            # synthetic rows: 4 super-blocks
ROWS = 48


@pytest.fixture(scope="module")
def ggml():
    """ggml_quantize_chunk of llama-cpp-python's libggml-base.so for the k-quants, or skip."""
    return ggml_quantizer({name: (tid, QK_K, size) for name, (tid, size, _) in K_TYPES.items()})


@pytest.fixture(scope="module")
def encode(tool, tmp_path_factory):
    """encode(type, rows, imatrix=None, threads=None) -> bytes of tests/tools/gguf_enc_tool
    (threads None: the row-by-row reference encoder, --ref)."""
    d = tmp_path_factory.mktemp("gguf_enc_k")
    exe = tool("gguf_enc_tool")

    def enc(tname, rows, imatrix=None, threads=None):
        src, out = d / "in.f32", d / "out.bin"
        np.ascontiguousarray(rows, dtype="<f4").tofile(src)
        cmd = [exe, tname, src, rows.shape[0], rows.shape[1], out]
        cmd += ["--ref"] if threads is None else ["--threads", threads]
        if imatrix is not None:
            np.ascontiguousarray(imatrix, dtype="<f4").tofile(d / "imp.f32")
            cmd += ["--imatrix", d / "imp.f32"]
        run(cmd)
        return out.read_bytes()
    return enc


def f16(b, off):
    return float(np.frombuffer(b[off:off + 2], "<f2")[0])


def compare(label, tname, rows, got, want):
    """Assert equal bytes, else fail naming the first differing block, field and byte."""
    if got == want:
        return 0
    _, size, fields = K_TYPES[tname]
    assert len(got) == len(want), f"{label} {tname}: {len(got)} bytes, expected {len(want)}"
    a = np.frombuffer(got, np.uint8).reshape(-1, size)
    b = np.frombuffer(want, np.uint8).reshape(-1, size)
    bad = np.flatnonzero((a != b).any(axis=1))
    blk = int(bad[0])
    byte = int(np.flatnonzero(a[blk] != b[blk])[0])
    field = next(f"{n}[{byte - s}]" for n, s, e in fields if s <= byte < e)
    r, k = divmod(blk, rows.shape[1] // QK_K)
    ga, gb = a[blk].tobytes(), b[blk].tobytes()
    scales = {n: (f16(ga, s), f16(gb, s)) for n, s, e in fields if n in ("d", "dmin")}
    vals = rows[r, k * QK_K:(k + 1) * QK_K]
    pytest.fail(f"{label} {tname}: {len(bad)} of {len(a)} blocks differ; first: row {r} super-block {k}, "
                f"field {field} (llmq {a[blk][byte]:#04x}, ggml {b[blk][byte]:#04x}); "
                f"f16 scales llmq/ggml {scales}\n"
                f"input {np.array2string(vals, precision=9, max_line_width=160, threshold=300)}\n"
                f"llmq  {ga.hex()}\nggml  {gb.hex()}")


def imatrices(rows, seed):
    """[(name, (n) f32 importance)] for the weighted searches."""
    rng = np.random.default_rng(seed)
    n = rows.shape[1]
    lognormal = np.exp(rng.normal(0.0, 1.5, n))
    holes = rng.random(n) + 0.01
    holes[rng.random(n) < 0.1] = 0.0                      # dead columns, as real imatrix files have
    holes[:16] = 0.0                                       # a whole zero sub-block of Q2_K/Q3_K/Q6_K
    return [("imatrix lognormal", lognormal.astype(np.float32)),
            ("imatrix holes", holes.astype(np.float32)),
            ("imatrix ones", np.ones(n, np.float32)),
            ("imatrix x2", (np.mean(rows.astype(np.float64) ** 2, axis=0) + 1e-8).astype(np.float32))]


def synthetic_k_cases():
    """[(name, (ROWS, WIDTH) f32)]: distributions aimed at the k-quant sub-block scales and mins."""
    rng = np.random.default_rng(4242)
    shape = (ROWS, WIDTH)
    g = rng.standard_normal(shape)
    # per-16 sub-block scale spread over 4 decades inside each super-block
    sub16 = g * 10.0 ** rng.uniform(-2, 2, size=(ROWS, WIDTH // 16, 1)).repeat(16, axis=2).reshape(shape)
    # per-32 sub-block offsets (asymmetric sub-blocks: the mins of Q2_K/Q4_K/Q5_K)
    offs = g * 0.3 + rng.normal(0, 2, size=(ROWS, WIDTH // 32, 1)).repeat(32, axis=2).reshape(shape)
    # one-hot sub-blocks and near-constant sub-blocks with tiny noise
    onehot = np.zeros(shape)
    onehot.reshape(ROWS, -1, 16)[:, :, 3] = rng.choice([-5.0, 2.0, 9.0], size=(ROWS, WIDTH // 16))
    nearc = 1.0 + 1e-6 * rng.standard_normal(shape)
    nearc[::2] *= -1
    # sparse rows, all-negative rows, uniform rows
    sparse = g * (rng.random(shape) < 0.05)
    neg = -np.abs(g) - 0.1
    unif = rng.uniform(-1, 1, shape)
    # values on a grid that makes nearest_int ties frequent (x / d exactly half-integers)
    ties = rng.integers(-8, 9, size=shape) * 0.5 + 0.25
    # few large outliers over a small body (the max-driven first scale guess)
    outl = 0.01 * g + (rng.random(shape) < 0.004) * rng.choice([-30.0, 30.0], size=shape)
    # a mix of zero sub-blocks and normal ones inside each super-block
    zsub = g.copy()
    zsub.reshape(ROWS, -1, 16)[:, ::2] = 0.0
    cases = [("sub16_scales", sub16), ("sub32_offsets", offs), ("one_hot", onehot), ("near_const", nearc),
             ("sparse", sparse), ("negative", neg), ("uniform", unif), ("ties", ties), ("outliers", outl),
             ("zero_sub_blocks", zsub), ("gaussian_1e-3", g * 1e-3), ("gaussian_1e4", g * 1e4)]
    return [(n, np.ascontiguousarray(a, dtype=np.float32)) for n, a in cases]


@pytest.mark.parametrize("tname", list(K_TYPES))
def test_k_synthetic_vs_ggml(tname, ggml, encode):
    nblocks = 0
    for name, rows in synthetic_k_cases():
        compare(f"{name} (no imatrix)", tname, rows, encode(tname, rows), ggml(tname, rows))
        nblocks += rows.size // QK_K
        for iname, imp in imatrices(rows, 17):
            compare(f"{name} ({iname})", tname, rows, encode(tname, rows, imp, threads=2), ggml(tname, rows, imp))
            nblocks += rows.size // QK_K
    print(f"{tname}: {nblocks} synthetic blocks identical")


@pytest.fixture(scope="module")
def smollm2_tensors():
    p = pathlib.Path.home() / ".cache" / "llmq" / "smollm2-f32.gguf"
    assert p.exists(), f"{p} missing (the SmolLM2 f32 base, see tests/py/test_gguf_enc_oracle.py)"
    reader = gguf.GGUFReader(str(p))
    return {t.name: t for t in reader.tensors}


def rows_of(t):
    data = np.asarray(t.data, dtype=np.float32)
    return data.reshape(-1, int(t.shape[0]))


@pytest.mark.parametrize("tname", list(K_TYPES))
def test_k_ffn_down_vs_ggml(tname, ggml, encode, smollm2_tensors):
    """16 rows of every layer's ffn_down (1536 wide: 6 super-blocks per row)."""
    downs = sorted((n for n in smollm2_tensors if n.endswith("ffn_down.weight")),
                   key=lambda n: int(n.split(".")[1]))
    assert len(downs) == 30
    parts = []
    for n in downs:
        r = rows_of(smollm2_tensors[n])
        assert r.shape[1] == 1536, n
        parts.append(r[np.linspace(0, r.shape[0] - 1, 16).astype(int)])
    rows = np.ascontiguousarray(np.concatenate(parts))
    compare("ffn_down (no imatrix)", tname, rows, encode(tname, rows), ggml(tname, rows))
    for iname, imp in imatrices(rows, 23):
        compare(f"ffn_down ({iname})", tname, rows, encode(tname, rows, imp, threads=3), ggml(tname, rows, imp))
    print(f"{tname}: {rows.shape[0]} ffn_down rows x 5 variants = {5 * rows.size // QK_K} blocks identical")


@pytest.mark.heavy
@pytest.mark.parametrize("tname", list(K_TYPES))
def test_k_all_tensors_vs_ggml(tname, ggml, encode, smollm2_tensors):
    """A 16384-element slice of every tensor of the file (norms included), as 16 rows of 1024."""
    rng = np.random.default_rng(99)
    parts = []
    for n in sorted(smollm2_tensors):
        flat = np.asarray(smollm2_tensors[n].data, dtype=np.float32).reshape(-1)
        take = min(16384, flat.size // WIDTH * WIDTH)
        if take == 0:          # 1-D tensors of 576: tile them (the values still come from the model)
            flat = np.resize(flat, WIDTH)
            take = WIDTH
        start = int(rng.integers(0, flat.size - take + 1)) // WIDTH * WIDTH
        parts.append(flat[start:start + take].reshape(-1, WIDTH))
    rows = np.ascontiguousarray(np.concatenate(parts))
    compare("all tensors (no imatrix)", tname, rows, encode(tname, rows, threads=2), ggml(tname, rows))
    imps = imatrices(rows, 31)
    for iname, imp in (imps[0], imps[1]):
        compare(f"all tensors ({iname})", tname, rows, encode(tname, rows, imp, threads=2), ggml(tname, rows, imp))
    print(f"{tname}: {len(parts)} tensors, {rows.shape[0]} rows x 3 variants = {3 * rows.size // QK_K} blocks identical")
