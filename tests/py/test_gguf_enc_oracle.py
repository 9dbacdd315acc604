"""formats/ggml/encode.h against ggml's quantizers and gguf-py, byte for byte.

tests/tools/gguf_enc_tool encodes raw f32 rows into raw blocks. Its bytes must equal:
  - ggml_quantize_chunk of llama-cpp-python's libggml-base.so (what llama-quantize writes), called
    through ctypes, with a NULL imatrix and with a random positive one, for every block type llmq
    encodes and for F16 / BF16 (skipped when llama_cpp is not importable);
  - gguf.quants.quantize (gguf-py) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 without importance (always run);
  - itself across --threads 1, --threads 2, --threads 3 and --ref (row-by-row reference encoder).
Inputs: random rows of several distributions (gaussian, student-t, all-zero blocks, constant blocks,
tiny 1e-30 and huge 1e30 magnitudes, mixed signs over six decades, values on a half-integer grid) and
real rows of several SmolLM2 tensors (~/.cache/llmq/smollm2-f32.gguf). A mismatch names the input,
row and block, and prints the block's values and both encodings.
"""

import numpy as np
import pytest

from conftest import ggml_quantizer, run

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402

# llmq display name -> (ggml type id, block elements, block bytes); ids from ggml.h enum ggml_type
TYPES = {
    "q4_0": (2, 32, 18), "q4_1": (3, 32, 20), "q5_0": (6, 32, 22), "q5_1": (7, 32, 24), "q8_0": (8, 32, 34),
    "q2_k": (10, 256, 84), "q3_k": (11, 256, 110), "q4_k": (12, 256, 144), "q5_k": (13, 256, 176),
    "q6_k": (14, 256, 210), "iq4_nl": (20, 32, 18), "iq4_xs": (23, 256, 136),
    "f16": (1, 1, 2), "bf16": (30, 1, 2),
}
LEGACY = {"q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0, "q5_1": QT.Q5_1, "q8_0": QT.Q8_0}
N_PER_ROW = 1024     # synthetic rows: 4 super-blocks, 32 blocks
ROWS_PER_CASE = 12
REAL_TENSORS = ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.14.attn_v.weight",
                "blk.29.ffn_down.weight", "blk.17.ffn_gate.weight", "token_embd.weight"]
REAL_ROWS = 8


def synthetic_cases():
    """[(name, (ROWS_PER_CASE, N_PER_ROW) f32)] of distributions that stress the scale searches."""
    rng = np.random.default_rng(1234)
    shape = (ROWS_PER_CASE, N_PER_ROW)
    g = rng.standard_normal(shape)
    zero = rng.standard_normal(shape)
    zero.reshape(ROWS_PER_CASE, -1, 32)[:, ::3] = 0          # every third 32-block zero
    zero[1::2, :256] = 0                                    # whole zero super-blocks
    zero[5] = 0                                             # a zero row
    const = rng.standard_normal(shape)
    cb = const.reshape(ROWS_PER_CASE, -1, 32)
    cb[:, ::2] = rng.choice([-3.0, -0.5, 0.25, 1.0, 7.0], size=(ROWS_PER_CASE, cb.shape[1] // 2, 1))
    const[2] = 0.125                                        # a constant row
    const[3, :256] = -2.0                                   # a constant super-block
    mixed = rng.choice([-1.0, 1.0], size=shape) * 10.0 ** rng.uniform(-3, 3, size=shape)
    grid = rng.integers(-16, 17, size=shape) * 0.25         # exact ties for the rounding rules
    cases = [
        ("gaussian", g),
        ("student_t2", rng.standard_t(2, size=shape)),
        ("zero_blocks", zero),
        ("const_blocks", const),
        ("tiny_1e-30", rng.standard_normal(shape) * 1e-30),
        ("huge_1e30", rng.standard_normal(shape) * 1e30),
        ("mixed_signs", mixed),
        ("half_grid", grid),
        ("positive", np.abs(rng.standard_normal(shape)) + 0.5),
        ("outlier", g * 0.01 + (rng.random(shape) < 0.01) * 5.0),
    ]
    return [(n, np.ascontiguousarray(a, dtype=np.float32)) for n, a in cases]


@pytest.fixture(scope="module")
def smollm2_f32(smollm2, request):
    p = smollm2.parent / "smollm2-f32.gguf"
    if not p.exists():   # made like test_awq_oracle does: llmq convert of the Q4_1 file
        run([request.getfixturevalue("llmq_bin"), "convert", "--model", smollm2, "--dtype", "f32", "--out", p])
    return p


@pytest.fixture(scope="module")
def real_cases(smollm2_f32):
    """[(name, (REAL_ROWS, width) f32)] rows spread over real SmolLM2 tensors."""
    reader = gguf.GGUFReader(str(smollm2_f32))
    by_name = {t.name: t for t in reader.tensors}
    out = []
    for name in REAL_TENSORS:
        t = by_name[name]
        assert t.tensor_type == QT.F32, name
        data = np.asarray(t.data).reshape(-1, int(t.shape[0]))   # (rows, cols)
        idx = np.linspace(0, data.shape[0] - 1, REAL_ROWS).astype(int)
        out.append((name, np.ascontiguousarray(data[idx], dtype=np.float32)))
    return out


@pytest.fixture(scope="module")
def encode(tool, tmp_path_factory):
    """encode(type, rows, imatrix=None, threads=1, ref=False) -> bytes from gguf_enc_tool."""
    d = tmp_path_factory.mktemp("gguf_enc")
    exe = tool("gguf_enc_tool")

    def enc(tname, rows, imatrix=None, threads=1, ref=False):
        src, out = d / "in.f32", d / "out.bin"
        rows.astype("<f4").tofile(src)
        cmd = [exe, tname, src, rows.shape[0], rows.shape[1], out, "--threads", threads]
        if imatrix is not None:
            imatrix.astype("<f4").tofile(d / "imp.f32")
            cmd += ["--imatrix", d / "imp.f32"]
        if ref:
            cmd.append("--ref")
        run(cmd)
        return out.read_bytes()
    return enc


@pytest.fixture(scope="module")
def ggml():
    """ggml_quantize_chunk of llama-cpp-python's libggml-base.so, or skip."""
    return ggml_quantizer(TYPES)


def random_imatrix(n, seed):
    rng = np.random.default_rng(seed)
    return np.exp(rng.normal(0.0, 1.5, size=n)).astype(np.float32)   # positive, spread over decades


def compare(label, tname, rows, got, want):
    """Assert equal bytes; otherwise report the first differing block with its input values."""
    if got == want:
        return
    _, blck, size = TYPES[tname]
    assert len(got) == len(want), f"{label} {tname}: {len(got)} bytes, expected {len(want)}"
    a, b = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
    off = int(np.flatnonzero(a != b)[0])
    blk = off // size
    per_row = rows.shape[1] // blck
    r, k = divmod(blk, per_row)
    n_bad = int((a.reshape(-1, size) != b.reshape(-1, size)).any(axis=1).sum())
    vals = rows[r, k * blck:(k + 1) * blck]
    pytest.fail(f"{label} {tname}: {n_bad} of {len(a) // size} blocks differ; first: row {r} block {k} "
                f"(byte {off % size} of the block)\n"
                f"input  {np.array2string(vals, precision=9, max_line_width=160, threshold=300)}\n"
                f"llmq   {a[blk * size:(blk + 1) * size].tobytes().hex()}\n"
                f"oracle {b[blk * size:(blk + 1) * size].tobytes().hex()}")


def tiles(tname, rows):
    return rows.shape[1] % TYPES[tname][1] == 0


# ---- ggml (llama.cpp) ---------------------------------------------------------------------------

@pytest.mark.parametrize("tname", list(TYPES))
def test_synthetic_vs_ggml(tname, ggml, encode):
    for name, rows in synthetic_cases():
        compare(f"{name} (no imatrix)", tname, rows, encode(tname, rows), ggml(tname, rows))
        imp = random_imatrix(rows.shape[1], 7)
        compare(f"{name} (imatrix)", tname, rows, encode(tname, rows, imp), ggml(tname, rows, imp))


@pytest.mark.parametrize("tname", list(TYPES))
def test_smollm2_vs_ggml(tname, ggml, encode, real_cases):
    n_checked = 0
    for name, rows in real_cases:
        if not tiles(tname, rows):
            continue
        compare(f"{name} (no imatrix)", tname, rows, encode(tname, rows), ggml(tname, rows))
        imp = random_imatrix(rows.shape[1], 11)
        compare(f"{name} (imatrix)", tname, rows, encode(tname, rows, imp, threads=2), ggml(tname, rows, imp))
        n_checked += 1
    assert n_checked >= 2, f"{tname}: fewer than two SmolLM2 tensors tile its blocks"


# ---- gguf-py (legacy types) ---------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e30 -> f16 inf, as ggml
@pytest.mark.parametrize("tname", list(LEGACY))
def test_legacy_vs_gguf_py(tname, encode, real_cases):
    for name, rows in synthetic_cases() + real_cases:
        want = gguf.quants.quantize(rows, LEGACY[tname]).tobytes()
        compare(f"{name} (gguf-py)", tname, rows, encode(tname, rows), want)


# ---- threads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("tname", list(TYPES))
def test_threads_equal_ref(tname, encode):
    rows = np.concatenate([r for _, r in synthetic_cases()])[:37]   # odd row count: uneven thread split
    imp = random_imatrix(rows.shape[1], 3)
    for imatrix in (None, imp):
        ref = encode(tname, rows, imatrix, ref=True)
        for threads in (1, 2, 3):
            compare(f"--threads {threads} vs --ref", tname, rows, encode(tname, rows, imatrix, threads=threads), ref)


def test_tool_errors(tool, tmp_path):
    src = tmp_path / "in.f32"
    np.zeros(64, np.float32).tofile(src)
    r = run([tool("gguf_enc_tool"), "q4_k", src, 1, 64, tmp_path / "o.bin"], check=False)
    assert r.returncode == 1 and "multiple of the block size" in r.stderr
    r = run([tool("gguf_enc_tool"), "q8_1", src, 2, 32, tmp_path / "o.bin"], check=False)
    assert r.returncode == 1 and "cannot encode" in r.stderr
    r = run([tool("gguf_enc_tool"), "q4_0", src, 3, 32, tmp_path / "o.bin"], check=False)
    assert r.returncode == 1 and "expected 96 floats" in r.stderr
