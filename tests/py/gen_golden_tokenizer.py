#!/usr/bin/env python3
"""Writes tests/golden/tokenizer_<model>.json from llama.cpp's tokenizer (llama-cpp-python).

Run by hand when llama_cpp is importable (the venv's: tests/run.sh builds it):
    python tests/py/gen_golden_tokenizer.py [--data ../shared/datasets] [--cache ~/.cache/llmq]

For SmolLM2-135M-Instruct.Q4_1.gguf and stories260K (the v3 GGUF: llama.cpp cannot read v1):
  "wiki": the whole of wikitext-2-raw/wiki.test.raw tokenized as llama-perplexity does
          (add_special = true, i.e. BOS iff the model adds it; parse_special = false):
          n_tokens, sha256 of the ids as little-endian int32, the first and last 32 ids;
  "strings": the full id lists of tokenizer_cases.FIXED for the 4 combinations of add_special /
          parse_special (texts stored in hex).
tests/py/test_tokenizer_oracle.py checks llmq against these files on every run.
"""
import argparse
import hashlib
import json
import pathlib
import struct
import sys

import llama_cpp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from tokenizer_cases import FIXED, BEYOND_U10FFFF  # noqa: E402

SRC = pathlib.Path(__file__).resolve().parents[2]


def digest(ids):
    return {"n_tokens": len(ids), "sha256": hashlib.sha256(struct.pack("<%di" % len(ids), *ids)).hexdigest(),
            "first": ids[:32], "last": ids[-32:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(SRC.parent / "shared" / "datasets"))
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache" / "llmq"))
    a = ap.parse_args()
    data, cache = pathlib.Path(a.data), pathlib.Path(a.cache)
    wiki_rel = "wikitext-2-raw/wiki.test.raw"
    wiki = (data / wiki_rel).read_bytes()
    models = {
        "smollm2": (cache / "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        "stories260k": (data / "models/stories260K/tinyllamas-stories-260k-f32.v3.gguf",
                        "models/stories260K/tinyllamas-stories-260k-f32.v3.gguf"),
    }
    for name, (path, rel) in models.items():
        m = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        bpe = m.metadata.get("tokenizer.ggml.model") == "gpt2"
        out = {"model": rel, "oracle": "llama-cpp-python %s" % llama_cpp.__version__,
               "wiki": dict(file=wiki_rel, add_special=True, parse_special=False,
                            **digest(m.tokenize(wiki, add_bos=True, special=False))),
               "strings": []}
        for text in FIXED:
            if bpe and BEYOND_U10FFFF(text):
                continue
            for add in (True, False):
                for sp in (False, True):
                    out["strings"].append({"hex": text.hex(), "add_special": add, "parse_special": sp,
                                           "ids": m.tokenize(text, add_bos=add, special=sp)})
        dst = SRC / "tests" / "golden" / ("tokenizer_%s.json" % name)
        dst.write_text(json.dumps(out, separators=(",", ":")) + "\n")
        print("%s: %d wiki tokens, %d strings -> %s" % (name, out["wiki"]["n_tokens"], len(out["strings"]), dst))


if __name__ == "__main__":
    main()
