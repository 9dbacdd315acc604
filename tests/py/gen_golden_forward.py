"""Golden forward-pass data from llama.cpp (llama-cpp-python) for tests/py/test_forward_oracle.py.

Run by hand when llama_cpp is importable (it is not a test requirement):
    ~/.cache/llmq/venv/bin/python tests/py/gen_golden_forward.py [--data ../shared/datasets]
writes tests/golden/forward_smollm2.json:
  tokens       BOS + the first N_POS-1 tokens of wiki.test.raw, tokenized by llama.cpp
  q4_1 / f32   for SmolLM2-135M-Instruct.Q4_1.gguf and for its f32 dequantization (made with the
               gguf package, see make_f32_gguf): per position llama.cpp's top-K ids and logits
llama.cpp settings: n_ctx 512, f32 K and V cache, no flash attention, logits for every position,
n_threads 2, one batch.

The helpers here (make_f32_gguf, llama_cpp_logits, wiki_tokens) are shared with the test.
"""
import argparse
import hashlib
import json
import os
import pathlib

import numpy as np

N_POS = 64      # positions compared
TOP_K = 8       # llama.cpp's top-K logits stored per position
GGML_TYPE_F32 = 0
HERE = pathlib.Path(__file__).resolve().parent
GOLDEN = HERE.parent / "golden" / "forward_smollm2.json"


def make_f32_gguf(src, dst):
    """Dequantize every tensor of GGUF src to f32 into dst with gguf-py (an implementation
    independent of llmq): all KVs copied, general.file_type = 0 (ALL_F32)."""
    import gguf
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type",
                                                "general.quantization_version"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(x) for x in reversed(t.shape.tolist())]  # outermost first
        writer.add_tensor(t.name, np.ascontiguousarray(data.reshape(shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_model(path, n_ctx=512):
    import llama_cpp
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                           type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32, flash_attn=False, n_threads=2,
                           n_threads_batch=2, verbose=False)


def llama_cpp_logits(path, tokens):
    """(len(tokens), n_vocab) float32 logits of llama.cpp for one sequence from position 0."""
    llm = llama_cpp_model(path)
    llm.reset()
    llm.eval(list(tokens))
    out = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    del llm
    return out


def wiki_tokens(model_path, data_dir, n=N_POS):
    """BOS then the first n-1 tokens of wiki.test.raw, tokenized by llama.cpp."""
    import llama_cpp
    text = (pathlib.Path(data_dir) / "wikitext-2-raw" / "wiki.test.raw").read_bytes()[:20000]
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    ids = llm.tokenize(text, add_bos=False, special=False)
    return [int(llm.token_bos())] + [int(i) for i in ids[:n - 1]]


def topk(logits, k=TOP_K):
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return ids, np.take_along_axis(logits, ids, axis=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("LLMQ_DATA", str(HERE.parents[2] / "shared" / "datasets")))
    ap.add_argument("--model", default=str(pathlib.Path.home() / ".cache" / "llmq" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--f32", default="/tmp/smollm2_f32_golden.gguf", help="where to write the f32 dequantization")
    args = ap.parse_args()
    import llama_cpp
    tokens = wiki_tokens(args.model, args.data)
    if not os.path.exists(args.f32):
        make_f32_gguf(args.model, args.f32)
    out = {"what": "llama.cpp logits for tests/py/test_forward_oracle.py (gen_golden_forward.py)",
           "llama_cpp_python": llama_cpp.__version__,
           "model": os.path.basename(args.model),
           "model_sha256": hashlib.sha256(pathlib.Path(args.model).read_bytes()).hexdigest(),
           "settings": "n_ctx 512, type_k/type_v f32, flash_attn off, logits_all, n_threads 2",
           "tokens": tokens}
    for key, path in (("q4_1", args.model), ("f32", args.f32)):
        lg = llama_cpp_logits(path, tokens)
        ids, vals = topk(lg)
        out[key] = {"top1": ids[:, 0].tolist(), "topk_ids": ids.tolist(),
                    "topk_logits": [[round(float(v), 5) for v in row] for row in vals]}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
