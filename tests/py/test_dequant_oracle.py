"""Oracle: llmq's f32 decoders (formats/ggml/quants.h) against gguf-py's gguf.quants.dequantize.

Every comparison is bit for bit (outputs viewed as uint32). Three kinds of input:
  (a) legacy types Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: f32 data (random and adversarial) quantized by
      gguf.quants.quantize, then decoded by both;
  (b) K-quants and IQ4_NL/IQ4_XS, which gguf-py cannot quantize: random block bytes whose f16
      scale fields are replaced by finite random halves (full range, and realistic small scales);
  (c) the real tensors of SmolLM2-135M-Instruct.Q4_1.gguf (all Q4_1, the Q8_0 token_embd, F32).
Plus the plain types: all 65536 F16 and BF16 bit patterns, F32 pass-through, F64 (gguf-py has no
F64 decoder: numpy's astype(float32), round-to-nearest like the C cast).

Why the bits agree, type by type. gguf-py evaluates in numpy float32, one rounding per ufunc, and
never fuses; ggml's reference C (ggml-quants.c, dequantize_row_*) does the same operations in the
same order when built without FMA contraction (llmq builds formats/ggml/decode.c with -ffp-contract=off):
  Q4_0/Q5_0/Q8_0/IQ4_NL  y = d * q                    both: one product of two exact f32s
  Q4_1/Q5_1              y = (d * q) + m              both: product rounded, then sum
  Q2_K                   y = (d*sc) * q - (dmin*m)    numpy: dl = d*sc, ml = dmin*m, dl*q - ml
  Q3_K/Q6_K/IQ4_XS       y = (d*sc) * q               numpy: dl = d*sc first, then dl*q
  Q4_K/Q5_K              y = (d*sc) * q - (dmin*m)    same grouping as Q2_K
The integer parts (q, sc, m, the -32/-16/-8 offsets) are exact in both, so no type differs.
Only NaN payloads could differ (scales that are NaN/Inf are excluded in (b), as the brief allows).
"""
import numpy as np
import pytest
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

from conftest import run

LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# byte offsets of the f16 fields inside one block (ggml-common.h layouts)
F16_FIELDS = {
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
BLOCKS_RAW = 3000  # random blocks per K-quant case


@pytest.fixture(scope="module")
def dequant(tool, tmp_path_factory):
    """dequant(qtype, raw uint8 blocks, *flags) -> llmq's f32 output as uint32 bits."""
    exe = tool("dequant_tool")
    d = tmp_path_factory.mktemp("dequant")

    def go(qtype, raw, *flags):
        src, dst = d / "in.bin", d / "out.f32"
        np.ascontiguousarray(raw).tofile(src)
        run([exe, *flags, qtype.name.lower(), src, dst])
        return np.fromfile(dst, dtype=np.uint32)
    return go


def oracle_bits(raw, qtype):
    return np.ascontiguousarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).reshape(-1).view(np.uint32)


def assert_same_bits(got, want, what):
    assert got.shape == want.shape, f"{what}: {got.shape} elements, expected {want.shape}"
    bad = np.nonzero(got != want)[0]
    if len(bad):
        i = bad[:8]
        raise AssertionError(
            f"{what}: {len(bad)} of {len(want)} elements differ; first at {i.tolist()}: "
            f"llmq {got[i].view(np.float32).tolist()} ({[hex(v) for v in got[i]]}) "
            f"gguf-py {want[i].view(np.float32).tolist()} ({[hex(v) for v in want[i]]})")


def adversarial_rows(rng):
    """(rows, 256) f32: rows that stress the legacy quantizers and the decoders."""
    rows = [
        np.zeros(256),                                   # all zero: d = 0
        np.full(256, 0.75), np.full(256, -3.0),          # constant rows (d = 0 for Q4_1/Q5_1)
        rng.standard_normal(256) * 6.0e4 / 4,            # huge (scales near the f16 maximum)
        np.where(rng.random(256) < 0.5, 6.0e4, -6.0e4),  # +-max f16-ish, min field at the limit
        rng.standard_normal(256) * 1e-6,                 # tiny: f16 subnormal scales
        rng.standard_normal(256) * 1e-9,                 # tinier: scales flush to zero in f16
        -np.abs(rng.standard_normal(256)) - 1,           # negative-max rows (d > 0 for Q4_0)
        np.abs(rng.standard_normal(256)) + 1,            # positive-max rows
        np.tile([1.0, -1.0], 128),                       # alternating signs, ties in |max|
        np.linspace(-1, 1, 256),
        np.concatenate([np.full(255, 1e-3), [-1e3]]),    # one outlier
    ]
    one_hot = np.zeros(256)
    one_hot[37] = -2.5
    rows.append(one_hot)
    return np.stack(rows).astype(np.float32)


@pytest.mark.parametrize("qtype", LEGACY, ids=lambda t: t.name)
def test_legacy_quantized_by_gguf(dequant, qtype):
    rng = np.random.default_rng(1234 + int(qtype))
    data = np.concatenate([
        rng.standard_normal((64, 256)).astype(np.float32),
        (rng.standard_normal((16, 256)) * rng.lognormal(0, 3, (16, 1))).astype(np.float32),
        adversarial_rows(rng),
    ])
    raw = gguf.quants.quantize(data, qtype)
    want = oracle_bits(raw, qtype)
    for flags in ([], ["--ref"], ["--misalign"]):
        assert_same_bits(dequant(qtype, raw, *flags), want, f"{qtype.name} {flags}")


def random_blocks(rng, qtype, nb, scale_kind):
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
    offs = F16_FIELDS.get(qtype, [0])
    for off in offs:
        if scale_kind == "full":  # any finite half, subnormals and +-0 included
            bits = rng.integers(0, 0x10000, size=nb, dtype=np.uint32).astype(np.uint16)
            finite = (bits & 0x7C00) != 0x7C00
            bits = np.where(finite, bits, bits & 0x83FF)  # inf/nan -> same-sign subnormal
            h = bits.view(np.float16)
        else:  # what real models carry: small positive scales
            h = (np.abs(rng.standard_normal(nb)) * 0.003 + 1e-5).astype(np.float16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
    return raw


@pytest.mark.parametrize("scale_kind", ["full", "real"])
@pytest.mark.parametrize("qtype", list(F16_FIELDS) + LEGACY, ids=lambda t: t.name)
def test_random_blocks(dequant, qtype, scale_kind):
    rng = np.random.default_rng(99 + int(qtype) * 7 + (scale_kind == "real"))
    block_size, _ = GGML_QUANT_SIZES[qtype]
    nb = BLOCKS_RAW if block_size == 256 else BLOCKS_RAW * 4
    raw = random_blocks(rng, qtype, nb, scale_kind)
    if qtype in (T.Q4_1, T.Q5_1):  # second f16 field (m)
        raw[:, 2:4] = random_blocks(rng, T.Q4_0, nb, scale_kind)[:, 0:2]
    want = oracle_bits(raw, qtype)
    assert not np.isnan(want.view(np.float32)).any()
    for flags in ([], ["--ref"], ["--misalign"]):
        assert_same_bits(dequant(qtype, raw, *flags), want, f"{qtype.name} {scale_kind} {flags}")


def test_f16_all_patterns(dequant):
    raw = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = raw.view(np.float16).astype(np.float32).view(np.uint32)
    for flags in ([], ["--ref"], ["--misalign"]):
        got = dequant(T.F16, raw.view(np.uint8), *flags)
        # numpy keeps NaN payloads (it may quiet signaling NaNs); compare NaNs by class only
        nan = np.isnan(want.view(np.float32))
        assert np.array_equal(np.isnan(got.view(np.float32)), nan)
        assert_same_bits(got[~nan], want[~nan], f"F16 {flags}")
        # llmq keeps the exact payload: f32 bits = sign | 0xff exponent | mantissa << 13
        exp_nan = ((raw[nan].astype(np.uint32) & 0x8000) << 16) | 0x7F800000 | ((raw[nan].astype(np.uint32) & 0x3FF) << 13)
        assert np.array_equal(got[nan], exp_nan)


def test_bf16_all_patterns(dequant):
    raw = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    want = oracle_bits(raw.view(np.uint8), T.BF16)
    for flags in ([], ["--ref"], ["--misalign"]):
        assert_same_bits(dequant(T.BF16, raw.view(np.uint8), *flags), want, f"BF16 {flags}")


def test_f32_and_f64(dequant):
    rng = np.random.default_rng(5)
    f32 = np.concatenate([rng.standard_normal(4096).astype(np.float32),
                          np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4e38], dtype=np.float32)])
    assert_same_bits(dequant(T.F32, f32.view(np.uint8)), f32.view(np.uint32), "F32")
    f64 = np.concatenate([rng.standard_normal(4096) * 10.0 ** rng.integers(-50, 50, 4096),
                          [0.0, -0.0, np.inf, -np.inf, 1e300, -1e300, 1e-300, 1 + 2**-24, 1 + 3 * 2**-24]])
    with np.errstate(over="ignore"):
        want = f64.astype(np.float32).view(np.uint32)
    for flags in ([], ["--misalign"]):
        assert_same_bits(dequant(T.F64, f64.view(np.uint8), *flags), want, f"F64 {flags}")


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_encode_half(tool, tmp_path, qtype):
    """f32 -> f16 / bf16 row helpers vs numpy astype(float16) and gguf-py's BF16 quantizer."""
    rng = np.random.default_rng(7)
    x = np.concatenate([
        rng.standard_normal(20000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, 20000).astype(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519, 65520, -65520, 1e-8, 2.0**-25, 3 * 2.0**-26,
                  1 + 2**-11, 1 + 3 * 2**-11, 3.4e38, -1e-45], dtype=np.float32),
        np.arange(0, 2**32, 9973, dtype=np.uint64).astype(np.uint32).view(np.float32),  # sweeps bits
    ])
    if qtype == T.F16:
        x = x[~np.isnan(x)]  # numpy's NaN conversion does not follow one documented rule
        with np.errstate(over="ignore"):
            want = x.astype(np.float16).view(np.uint8)
    else:
        want = gguf.quants.quantize(x, T.BF16).view(np.uint8)
    src, dst = tmp_path / "x.f32", tmp_path / "y.bin"
    x.tofile(src)
    run([tool("dequant_tool"), "--encode", qtype.name.lower(), src, dst])
    got = np.fromfile(dst, dtype=np.uint8)
    assert_same_bits(got.view(np.uint16).astype(np.uint32), want.view(np.uint16).astype(np.uint32), f"encode {qtype.name}")


def test_bad_input_rejected(tool, tmp_path):
    src = tmp_path / "odd.bin"
    np.zeros(19, dtype=np.uint8).tofile(src)  # not a whole Q4_0 block
    r = run([tool("dequant_tool"), "q4_0", src, tmp_path / "o.f32"], check=False)
    assert r.returncode == 1 and "block" in r.stderr
    np.zeros(292, dtype=np.uint8).tofile(src)
    r = run([tool("dequant_tool"), "q8_k", src, tmp_path / "o.f32"], check=False)
    assert r.returncode == 1 and "q8_k" in r.stderr


def test_smollm2_real_tensors(dequant, smollm2):
    reader = gguf.GGUFReader(smollm2)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type, []).append(t)
    assert T.Q4_1 in by_type and T.Q8_0 in by_type, "expected Q4_1 and Q8_0 tensors in SmolLM2 Q4_1"
    names = {t.name for t in by_type[T.Q8_0]}
    assert "token_embd.weight" in names
    for qtype, tensors in by_type.items():
        raw = np.concatenate([np.asarray(t.data).view(np.uint8).reshape(-1) for t in tensors])
        want = np.concatenate([
            np.ascontiguousarray(gguf.quants.dequantize(np.asarray(t.data), qtype), dtype=np.float32).reshape(-1)
            for t in tensors]).view(np.uint32)
        assert_same_bits(dequant(qtype, raw), want, f"SmolLM2 {qtype.name} ({len(tensors)} tensors)")
