"""Writes tests/golden/convert_tokenize.json: llama.cpp's token ids of wiki.test.raw for the two
test models, as a count, the sha256 of the ids (int32 little-endian) and the first / last ids.
tests/py/test_convert_oracle.py checks that the Hugging Face directories `llmq convert` writes
tokenize to exactly these ids (with the `tokenizers` library and with llmq's own HF loader), so the
check runs without llama_cpp. Run by hand, with llama-cpp-python installed:

    LLMQ_DATA=../shared/datasets ~/.cache/llmq/venv/bin/python tests/py/gen_golden_convert.py
"""
import hashlib
import json
import os
import pathlib

import numpy as np

SRC = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = SRC / "tests" / "golden" / "convert_tokenize.json"
N_EDGE = 16


def models(data_dir, cache):
    return {
        "smollm2": cache / "SmolLM2-135M-Instruct.Q4_1.gguf",
        "stories260k": data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.v3.gguf",
    }


def digest(ids):
    ids = np.asarray(ids, dtype="<i4")
    return {"n_tokens": int(ids.size), "sha256": hashlib.sha256(ids.tobytes()).hexdigest(),
            "first": ids[:N_EDGE].tolist(), "last": ids[-N_EDGE:].tolist()}


def llama_cpp_ids(model, text):
    import llama_cpp
    m = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    return m.tokenize(text.encode("utf-8"), add_bos=False, special=False)


def main():
    data_dir = pathlib.Path(os.environ.get("LLMQ_DATA", SRC.parent / "shared" / "datasets"))
    cache = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
    text = (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
    out = {"text": "wikitext-2-raw/wiki.test.raw", "add_special": False, "parse_special": False, "models": {}}
    for name, path in models(data_dir, cache).items():
        out["models"][name] = {"gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                               **digest(llama_cpp_ids(path, text))}
        print(name, out["models"][name]["n_tokens"])
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
