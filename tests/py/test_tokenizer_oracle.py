"""Oracle: llmq's tokenizer (calib/tokenizer/tokenizer.h, driven through tests/tools/tokenize_tool) against
llama.cpp's (llama-cpp-python, Llama(vocab_only=True).tokenize / llama_token_to_piece).

Always (no llama_cpp needed): the goldens tests/golden/tokenizer_{smollm2,stories260k}.json written
by gen_golden_tokenizer.py from llama.cpp: the whole of wiki.test.raw as llama-perplexity tokenizes
it (n_tokens, sha256 of the int32 ids, first / last 32 ids) for SmolLM2 (byte-level BPE, pre
"smollm") and stories260K (SentencePiece BPE; llmq reads both the v1 and the v3 file), and the full
id lists of tokenizer_cases.FIXED under the four add_special / parse_special settings. Also decode
round trips and a GGUF without tokenizer.ggml.pre.

With llama_cpp importable (else skipped, saying so): the same model files tokenized by llama.cpp
live, ~250 adversarial texts x 4 settings, every token's piece (render_special on and off), and the
same for llama.cpp's own vocabulary test files (ggml-vocab-{gpt-2,llama-bpe,qwen2,llama-spm,phi-3,
starcoder,mpt}.gguf with their .inp texts) when they are in $LLMQ_CACHE/vocab (taken from the
llama-cpp-python sdist's vendor/llama.cpp/models; skipped when absent).
"""
import ctypes
import hashlib
import json
import os
import pathlib
import struct

import pytest

from conftest import SRC, run
from tokenizer_cases import BEYOND_U10FFFF, FIXED, all_cases, ggml_vocab_cases, random_cases

try:
    import llama_cpp
except ImportError:  # pragma: no cover - depends on the machine
    llama_cpp = None

needs_llama_cpp = pytest.mark.skipif(llama_cpp is None, reason="llama_cpp (llama-cpp-python) is not importable: "
                                     "live llama.cpp comparisons skipped (the goldens still run)")
GOLDEN = SRC / "tests" / "golden"
CACHE = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
VOCABS = ["gpt-2", "llama-bpe", "qwen2", "llama-spm", "phi-3", "starcoder", "mpt"]


def digest(ids):
    return {"n_tokens": len(ids), "sha256": hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest(),
            "first": ids[:32], "last": ids[-32:]}


def llmq_ids(tool, model, path, add=True, parse=False):
    args = [tool("tokenize_tool"), model, path] + ([] if add else ["--no-special"]) + (["--parse-special"] if parse else [])
    return [int(x) for x in run(args).stdout.split()]


def llmq_batch(tool, model, texts, tmp_path, add, parse):
    f = tmp_path / "texts.hex"
    f.write_text("".join(t.hex() + "\n" for t in texts))
    args = [tool("tokenize_tool"), model, f, "--hex-lines"] + ([] if add else ["--no-special"]) + \
        (["--parse-special"] if parse else [])
    lines = run(args).stdout.split("\n")
    return [[int(x) for x in line.split()] for line in lines[:len(texts)]]


@pytest.fixture(scope="module")
def models(stories_v1, stories_v3, smollm2):
    return {"smollm2": [smollm2], "stories260k": [stories_v1, stories_v3]}


# ---- goldens (always)

@pytest.mark.parametrize("name", ["smollm2", "stories260k"])
def test_golden_wiki(tool, data_dir, models, name):
    g = json.loads((GOLDEN / ("tokenizer_%s.json" % name)).read_text())
    for model in models[name]:
        ids = llmq_ids(tool, model, data_dir / g["wiki"]["file"], add=g["wiki"]["add_special"])
        d = digest(ids)
        for k in ("n_tokens", "first", "last", "sha256"):
            assert d[k] == g["wiki"][k], "%s: wiki.test.raw %s differs from llama.cpp's" % (model.name, k)


@pytest.mark.parametrize("name", ["smollm2", "stories260k"])
def test_golden_strings(tool, models, name, tmp_path):
    g = json.loads((GOLDEN / ("tokenizer_%s.json" % name)).read_text())
    for model in models[name]:
        for add in (True, False):
            for sp in (False, True):
                cases = [c for c in g["strings"] if c["add_special"] == add and c["parse_special"] == sp]
                texts = [bytes.fromhex(c["hex"]) for c in cases]
                got = llmq_batch(tool, model, texts, tmp_path, add, sp)
                for c, t, ids in zip(cases, texts, got):
                    assert ids == c["ids"], "%s add_special=%s parse_special=%s %r" % (model.name, add, sp, t[:60])


def decode(tool, model, ids, tmp_path, render=False):
    """The bytes of each id's piece (one tokenize_tool run)."""
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ids)))
    args = [tool("tokenize_tool"), model, f, "--decode", "--hex-lines"] + (["--render-special"] if render else [])
    return [bytes.fromhex(h) for h in run(args).stdout.split("\n")[:len(ids)]]


def decode_each(tool, model, id_lists, tmp_path, render=False):
    pieces = decode(tool, model, [i for ids in id_lists for i in ids], tmp_path, render)
    out, k = [], 0
    for ids in id_lists:
        out.append(b"".join(pieces[k:k + len(ids)]))
        k += len(ids)
    return out


def test_roundtrip(tool, stories_v3, smollm2, tmp_path):
    """Pieces concatenate back to the text, for valid UTF-8 texts without control characters (as in
    llama.cpp: invalid bytes next to a space are escaped with it in SPM and become U+FFFD in byte-level
    BPE, and SmolLM2 has no tokens for some control bytes); SPM adds its space prefix."""
    texts = []
    for t in FIXED + random_cases(n_bytes=0):
        try:
            t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if t and not any(b < 0x20 and b not in b"\t\n\r" for b in t):
            texts.append(t)
    got = decode_each(tool, stories_v3, llmq_batch(tool, stories_v3, texts, tmp_path, False, False), tmp_path)
    for t, back in zip(texts, got):
        assert back == b" " + t, t
    got = decode_each(tool, smollm2, llmq_batch(tool, smollm2, texts, tmp_path, False, True), tmp_path, render=True)
    for t, back in zip(texts, got):
        assert back == t, t


def test_greedy_ids_decode(tool, data_dir, stories_v1, tmp_path):
    d = data_dir / "models" / "stories260K"
    ids = [int(x) for x in (d / "expected_greedy_ids.txt").read_text().split()]
    text = b"".join(decode(tool, stories_v1, ids, tmp_path)).decode()
    # the first piece is "▁Once" -> " Once"; llama2.c drops that space after BOS
    assert text.startswith(" ") and text[1:] == (d / "expected_greedy.txt").read_text().rstrip("\n")


# ---- live llama.cpp comparisons

def lcp(model):
    return llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)


def vocab_file(name):
    p = CACHE / "vocab" / ("ggml-vocab-%s.gguf" % name)
    if not p.exists():
        pytest.skip("%s not present (copy llama.cpp's models/ggml-vocab-*.gguf there to run this)" % p)
    return p


@needs_llama_cpp
@pytest.mark.parametrize("which", ["smollm2", "stories260k"])
def test_llama_cpp_wiki(tool, data_dir, stories_v3, smollm2, which):
    model = smollm2 if which == "smollm2" else stories_v3
    wiki = data_dir / "wikitext-2-raw" / "wiki.test.raw"
    ref = lcp(model).tokenize(wiki.read_bytes(), add_bos=True, special=False)
    assert llmq_ids(tool, model, wiki) == ref


def compare_cases(tool, model, texts, tmp_path):
    m = lcp(model)
    bpe = m.metadata.get("tokenizer.ggml.model") == "gpt2"
    texts = [t for t in texts if not (bpe and BEYOND_U10FFFF(t))]  # llama.cpp aborts on those
    bad = []
    for add in (True, False):
        for sp in (False, True):
            got = llmq_batch(tool, model, texts, tmp_path, add, sp)
            for t, ids in zip(texts, got):
                ref = m.tokenize(t, add_bos=add, special=sp)
                if ids != ref:
                    bad.append("add=%s parse=%s %r\n  llama.cpp %s\n  llmq      %s" % (add, sp, t[:60], ref[:24], ids[:24]))
    assert not bad, "%d mismatches, first:\n%s" % (len(bad), "\n".join(bad[:5]))


def compare_pieces(tool, model, tmp_path, stride=1):
    """Every stride-th token's piece (and the last 2000 tokens, where the special ones live)."""
    m = lcp(model)
    vocab = llama_cpp.llama_model_get_vocab(m.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    ids = sorted(set(range(0, n, stride)) | set(range(max(0, n - 2000), n)))
    f = tmp_path / "all_ids.txt"
    f.write_text(" ".join(map(str, ids)))
    buf = ctypes.create_string_buffer(1 << 16)
    for special in (False, True):
        args = [tool("tokenize_tool"), model, f, "--decode", "--hex-lines"] + (["--render-special"] if special else [])
        got = run(args).stdout.split("\n")[:len(ids)]
        for i, g in zip(ids, got):
            k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
            assert g == buf.raw[:k].hex(), "token %d render_special=%s" % (i, special)


@needs_llama_cpp
@pytest.mark.parametrize("which", ["smollm2", "stories260k"])
def test_llama_cpp_adversarial(tool, stories_v3, smollm2, which, tmp_path):
    compare_cases(tool, smollm2 if which == "smollm2" else stories_v3, all_cases(), tmp_path)


@needs_llama_cpp
@pytest.mark.parametrize("which", ["smollm2", "stories260k"])
def test_llama_cpp_pieces(tool, stories_v3, smollm2, which, tmp_path):
    compare_pieces(tool, smollm2 if which == "smollm2" else stories_v3, tmp_path)


@needs_llama_cpp
@pytest.mark.parametrize("name", VOCABS)
def test_llama_cpp_vocab_files(tool, name, tmp_path):
    p = vocab_file(name)
    inp = pathlib.Path(str(p) + ".inp")
    compare_cases(tool, p, FIXED + (ggml_vocab_cases(inp) if inp.exists() else []), tmp_path)
    compare_pieces(tool, p, tmp_path, stride=7)


def patch_pre(src, dst, pre):
    """Copy of a tensor-free vocabulary GGUF (v3) whose tokenizer.ggml.pre is set to pre, or removed
    (pre None). Done on the bytes: gguf-py's reader and writer take seconds on a 50k vocabulary."""
    data = pathlib.Path(src).read_bytes()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    assert version == 3 and n_tensors == 0
    key = b"tokenizer.ggml.pre"
    i = data.index(struct.pack("<Q", len(key)) + key)
    j = i + 8 + len(key)
    assert struct.unpack_from("<I", data, j)[0] == 8  # a string
    end = j + 12 + struct.unpack_from("<Q", data, j + 4)[0]
    if pre is None:
        out = data[:16] + struct.pack("<Q", n_kv - 1) + data[24:i] + data[end:]
    else:
        out = data[:j + 4] + struct.pack("<Q", len(pre)) + pre.encode() + data[end:]
    pathlib.Path(dst).write_bytes(out)


@needs_llama_cpp
@pytest.mark.parametrize("pre", ["default", None])
def test_llama_cpp_default_pre(tool, pre, tmp_path):
    """gpt-2's vocabulary with tokenizer.ggml.pre "default" / absent: llama.cpp's 4-pattern chain."""
    dst = tmp_path / "gpt2-pre.gguf"
    patch_pre(vocab_file("gpt-2"), dst, pre)
    info = json.loads(run([tool("tokenize_tool"), dst, "--info"]).stdout)
    assert info["pre"] == "default"
    compare_cases(tool, dst, FIXED, tmp_path)
