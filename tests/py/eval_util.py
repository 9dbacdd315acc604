"""Helpers for the `llmq eval` oracles (tests/py/test_eval_oracle.py, tests/py/gen_golden_ppl.py,
bench/eval_speed.sh): an f32 GGUF made from a quantized one with gguf-py alone, the protocols' texts
and chunks, and the reference figures computed from llama.cpp's own logits (llama-cpp-python).

The reference re-implements nothing of llmq: tokens come from llama.cpp's tokenizer, logits from
llama.cpp's forward pass, and the statistics are numpy float64 over those logits, following
llama.cpp tools/perplexity/perplexity.cpp (perplexity(), kl_divergence()) and IST-DASLab/gptq
(datautils.get_wikitext2 + llama_eval).
"""
import hashlib
import os
import pathlib

import numpy as np


# ---- f32 GGUF ----------------------------------------------------------------------------------

def make_f32_gguf(src, dst, roundtrip=None):
    """Dequantize every tensor of GGUF `src` to f32 (gguf.quants.dequantize) and write `dst` with all
    metadata copied and general.file_type = 0 (ALL_F32). Atomic: dst appears only when complete.
    roundtrip (a GGMLQuantizationType): every 2-D weight is also quantized to that type and back
    (gguf.quants.quantize / dequantize), still stored as f32: a perturbed f32 model that llama.cpp
    and llmq evaluate with the same f32 arithmetic (the KL-divergence oracle's second model)."""
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    tmp = pathlib.Path(str(dst) + f".tmp.{os.getpid()}")
    w = GGUFWriter(str(tmp), arch)
    skip = {"general.architecture", "general.file_type", "general.quantization_version"}
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in skip:
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), t, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), t)
    w.add_file_type(0)
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        if roundtrip is not None and a.ndim == 2 and a.shape[-1] % gguf.GGML_QUANT_SIZES[roundtrip][0] == 0:
            a = gguf.quants.dequantize(gguf.quants.quantize(a, roundtrip), roundtrip).astype(np.float32)
        w.add_tensor(t.name, np.ascontiguousarray(a), raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    return pathlib.Path(dst)


def cached_f32_gguf(src, cache_dir, roundtrip=None):
    """make_f32_gguf into cache_dir, reused while it is newer than src."""
    cache_dir = pathlib.Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tag = "" if roundtrip is None else "." + roundtrip.name.lower() + "rt"
    dst = cache_dir / (pathlib.Path(src).stem.replace(".Q4_1", "") + tag + ".f32.gguf")
    if not dst.exists() or dst.stat().st_mtime < pathlib.Path(src).stat().st_mtime:
        make_f32_gguf(src, dst, roundtrip)
    return dst


# ---- protocol texts ----------------------------------------------------------------------------

def llamacpp_text(raw: bytes) -> bytes:
    """The text as llama-perplexity -f reads it: one trailing newline removed."""
    return raw[:-1] if raw.endswith(b"\n") else raw


def gptq_text(raw: bytes) -> bytes:
    """"\\n\\n".join(load_dataset("wikitext", "wikitext-2-raw-v1", split=...)["text"]) from the raw
    file: every line (with its newline) is a row, whitespace-only rows become ""."""
    rows = raw.split(b"\n")
    if rows and rows[-1] == b"":
        rows.pop()
        lines = [r + b"\n" for r in rows]
    else:
        lines = [r + b"\n" for r in rows[:-1]] + rows[-1:]
    lines = [l if l.strip(b" \t\r\n\v\f") else b"" for l in lines]
    return b"\n\n".join(lines)


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---- the reference statistics ------------------------------------------------------------------

def log_softmax(logits):
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def ppl_figures(nll):
    """llama.cpp's "Final estimate: PPL = x +/- y" from per-position NLLs."""
    nll = np.asarray(nll, dtype=np.float64)
    n = nll.size
    mean = nll.mean()
    var = (nll * nll).mean() - mean * mean
    unc = np.sqrt(var / (n - 1)) if var > 0 else 0.0
    ppl = float(np.exp(mean))
    return {"count": int(n), "nll_mean": float(mean), "ppl": ppl, "ppl_uncertainty": ppl * float(unc)}


def chunk_plan(protocol, n_tokens, ctx, chunks, add_bos):
    n_max = n_tokens // ctx
    n = n_max if chunks < 0 else min(chunks, n_max)
    first = ctx // 2 if protocol == "llamacpp" else 0
    return n, first, protocol == "llamacpp" and add_bos


class LlamaCppReference:
    """llama.cpp (llama-cpp-python) on one GGUF: tokenizer, logits of a chunk with an f32 KV cache."""

    def __init__(self, model, ctx, threads=2):
        import llama_cpp
        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(model), n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, logits_all=True,
                                   n_threads=threads, n_threads_batch=threads, type_k=llama_cpp.GGML_TYPE_F32,
                                   type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False, verbose=False)
        self.ctx = ctx
        self.add_bos = bool(self.llm._model.add_bos_token())
        self.bos = self.llm.token_bos()

    def tokenize(self, text: bytes):
        return self.llm.tokenize(text, add_bos=True, special=False)  # add_special: BOS per the model's rule

    def logits(self, tokens):
        """(len(tokens), n_vocab) float32 logits of one sequence from position 0."""
        self.llm.reset()
        self.llm.eval(list(tokens))
        return np.array(self.llm.scores[: len(tokens)], dtype=np.float32)

    def chunks(self, tokens, protocol, chunks):
        """Yields (input tokens, targets, logits of the scored rows) per chunk of the protocol."""
        n, first, bos = chunk_plan(protocol, len(tokens), self.ctx, chunks, self.add_bos)
        for k in range(n):
            inp = list(tokens[k * self.ctx:(k + 1) * self.ctx])
            if bos:
                inp[0] = self.bos
            lg = self.logits(inp)
            yield inp, np.array(inp[first + 1:], dtype=np.int64), lg[first:self.ctx - 1]


def reference_ppl(model, text_path, protocol="llamacpp", ctx=512, chunks=4, threads=2):
    """Perplexity under `protocol` from llama.cpp's logits, as a dict for tests/golden/ppl_*.json."""
    raw = pathlib.Path(text_path).read_bytes()
    text = llamacpp_text(raw) if protocol == "llamacpp" else gptq_text(raw)
    ref = LlamaCppReference(model, ctx, threads)
    tokens = ref.tokenize(text)
    nll, per_chunk = [], []
    for _, tgt, lg in ref.chunks(tokens, protocol, chunks):
        lp = log_softmax(lg)
        v = -lp[np.arange(len(tgt)), tgt]
        nll.append(v)
        per_chunk.append(float(v.sum()))
    out = ppl_figures(np.concatenate(nll))
    ids = np.asarray(tokens, dtype="<i4").tobytes()
    out.update({
        "model": pathlib.Path(model).name, "protocol": protocol, "ctx": ctx, "chunks": len(per_chunk),
        "text": pathlib.Path(text_path).name, "text_sha256": sha256(text), "text_tokens": len(tokens),
        "tokens_sha256": sha256(ids), "first_ids": list(map(int, tokens[:8])), "last_ids": list(map(int, tokens[-8:])),
        "add_bos": ref.add_bos, "per_chunk_nll_sum": per_chunk,
        "reference": f"llama-cpp-python {ref.llama_cpp.__version__}, f32 KV cache, n_batch {ctx}, no flash attention",
    })
    return out


def reference_kld(base_model, model, text_path, ctx=512, chunks=2, threads=2):
    """llama-perplexity --kl-divergence figures (llamacpp protocol) from both models' llama.cpp logits,
    computed exactly (no 16-bit log-prob quantization)."""
    raw = pathlib.Path(text_path).read_bytes()
    text = llamacpp_text(raw)
    base = LlamaCppReference(base_model, ctx, threads)
    tokens = base.tokenize(text)
    base_rows = list(base.chunks(tokens, "llamacpp", chunks))
    del base
    q = LlamaCppReference(model, ctx, threads)
    kld, nll, nll_b, dp, same = [], [], [], [], []
    for (inp, tgt, lb), (_, _, lq) in zip(base_rows, q.chunks(tokens, "llamacpp", chunks)):
        pb, pq = log_softmax(lb), log_softmax(lq)
        kld.append((np.exp(pb) * (pb - pq)).sum(axis=1))
        i = np.arange(len(tgt))
        nll.append(-pq[i, tgt])
        nll_b.append(-pb[i, tgt])
        dp.append(np.exp(pq[i, tgt]) - np.exp(pb[i, tgt]))
        same.append(lb.argmax(axis=1) == lq.argmax(axis=1))
    kld, nll, nll_b, dp, same = map(np.concatenate, (kld, nll, nll_b, dp, same))
    return {"count": int(kld.size), "kld_mean": float(kld.mean()), "ppl": float(np.exp(nll.mean())),
            "ppl_base": float(np.exp(nll_b.mean())), "delta_p_mean": float(dp.mean()),
            "delta_p_rms": float(np.sqrt((dp * dp).mean())), "same_top_p": float(same.mean()),
            "kld_max": float(kld.max()), "kld_median": float(np.median(kld))}
