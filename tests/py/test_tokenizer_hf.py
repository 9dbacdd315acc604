"""The Hugging Face form of a tokenizer (tokenizer.json + tokenizer_config.json, loaded with
llmq_tokenizer_load_hf) must tokenize exactly as the GGUF form (llmq_tokenizer_load_gguf), which
test_tokenizer_oracle.py proves equal to llama.cpp. The HF directories are rebuilt from the GGUF
vocabularies by hf_vocab.py in the layout of the real repositories (SmolLM2: Digits + ByteLevel;
GPT-2: ByteLevel; Llama 3: Split + ByteLevel + TemplateProcessing; Qwen2: NFC + Split + ByteLevel;
Llama 2 / stories260K: SentencePiece-style BPE with byte_fallback, merges ordered by score).

Optional: with the `tokenizers` package importable, HF's own tokenizer on those files agrees with
llmq on wiki.test.raw (a 300 kB prefix) and on the valid-UTF-8 test texts, except where llama.cpp
(and so llmq) knowingly differs from HF: special-token texts (HF always matches added special
tokens), Qwen2's NFC normalizer (llama.cpp does not normalize), and code points whose category
changed after Unicode 15.1 (llama.cpp's table).
"""
import json
import os
import pathlib

import pytest

from conftest import run
from hf_vocab import write_hf_dir
from tokenizer_cases import FIXED, all_cases

CACHE = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
VOCABS = ["gpt-2", "llama-bpe", "qwen2", "llama-spm"]


def info(tool, model):
    return json.loads(run([tool("tokenize_tool"), model, "--info"]).stdout)


def batch(tool, model, path, flags):
    return run([tool("tokenize_tool"), model, path, "--hex-lines"] + flags).stdout


def same_tokenization(tool, gguf, hf, data_dir, tmp_path, full=True):
    """full: all test texts under the 4 special settings and the whole wiki.test.raw; else (the big
    vocabularies, whose tokenizer.json takes ~0.5 s to parse) FIXED under 2 settings and 200 kB."""
    gi, hi = info(tool, gguf), info(tool, hf)
    assert gi == hi, "properties differ:\n  gguf %s\n  hf   %s" % (gi, hi)
    f = tmp_path / "texts.hex"
    f.write_text("".join(t.hex() + "\n" for t in (all_cases() if full else FIXED)))
    settings = [[], ["--no-special"], ["--parse-special"], ["--no-special", "--parse-special"]]
    for flags in settings if full else settings[::3]:
        assert batch(tool, gguf, f, flags) == batch(tool, hf, f, flags), flags
    wiki = data_dir / "wikitext-2-raw" / "wiki.test.raw"
    if not full:
        (tmp_path / "wiki.txt").write_bytes(wiki.read_bytes()[:200000])
        wiki = tmp_path / "wiki.txt"
    assert run([tool("tokenize_tool"), gguf, wiki]).stdout == run([tool("tokenize_tool"), hf, wiki]).stdout


def gguf_of(name, smollm2, stories_v3):
    if name == "smollm2":
        return smollm2
    if name == "stories260k":
        return stories_v3
    p = CACHE / "vocab" / ("ggml-vocab-%s.gguf" % name)
    if not p.exists():
        pytest.skip("%s not present (llama.cpp's models/ggml-vocab-*.gguf)" % p)
    return p


@pytest.mark.parametrize("name,style", [("smollm2", "pairs"), ("smollm2", "strings"), ("stories260k", "pairs"),
                                        ("stories260k", "strings")] + [(v, "pairs") for v in VOCABS])
def test_hf_equals_gguf(tool, data_dir, smollm2, stories_v3, tmp_path, name, style):
    gguf = gguf_of(name, smollm2, stories_v3)
    hf = write_hf_dir(gguf, tmp_path / "hf", merges_style=style)
    same_tokenization(tool, gguf, hf, data_dir, tmp_path, full=name in ("smollm2", "stories260k"))


def test_hf_spm_exact_scores(tool, data_dir, stories_v3, tmp_path):
    """model.llmq_scores / llmq_token_types (what llmq convert writes) are taken verbatim."""
    hf = write_hf_dir(stories_v3, tmp_path / "hf", with_llmq_scores=True)
    same_tokenization(tool, stories_v3, hf, data_dir, tmp_path)


@pytest.mark.parametrize("name", ["smollm2", "stories260k"] + VOCABS)
def test_hf_tokenizers_library(tool, data_dir, smollm2, stories_v3, tmp_path, name):
    tokenizers = pytest.importorskip("tokenizers", reason="the `tokenizers` package is not installed")
    gguf = gguf_of(name, smollm2, stories_v3)
    hf = write_hf_dir(gguf, tmp_path / "hf")
    tk = tokenizers.Tokenizer.from_file(str(hf / "tokenizer.json"))
    wiki = (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")[:300000]
    f = tmp_path / "wiki.txt"
    f.write_text(wiki, encoding="utf-8")
    got = [int(x) for x in run([tool("tokenize_tool"), hf, f, "--no-special"]).stdout.split()]
    assert got == tk.encode(wiki, add_special_tokens=False).ids
    texts = []
    for t in all_cases():
        try:
            s = t.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "<" in s or any(0x10D40 <= ord(c) <= 0x10D8F for c in s):  # specials; Garay (Unicode 16)
            continue
        if name == "qwen2" and s != __import__("unicodedata").normalize("NFC", s):
            continue
        texts.append((t, s))
    f = tmp_path / "texts.hex"
    f.write_text("".join(t.hex() + "\n" for t, _ in texts))
    lines = batch(tool, hf, f, ["--no-special"]).split("\n")
    for (t, s), line in zip(texts, lines):
        assert [int(x) for x in line.split()] == tk.encode(s, add_special_tokens=False).ids, s
