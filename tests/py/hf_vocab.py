"""Test helper: rebuilds a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json)
from a GGUF vocabulary, laid out as the real model repositories lay theirs out, so that
test_tokenizer_hf.py can check that llmq tokenizes the HF form exactly as the GGUF form.

Families (by tokenizer.ggml.model / .pre):
  smollm     pre_tokenizer Sequence[Digits(individual_digits), ByteLevel(use_regex)]  (SmolLM2)
  gpt-2      pre_tokenizer ByteLevel (GPT-2's file: no use_regex key)
  llama-bpe  Sequence[Split(llama3 regex, Isolated), ByteLevel(use_regex=false)], model.ignore_merges,
             post_processor TemplateProcessing starting with <|begin_of_text|>      (Llama 3)
  qwen2      normalizer NFC, Sequence[Split(qwen2 regex), ByteLevel(use_regex=false)] (Qwen2)
  llama      normalizer Sequence[Prepend("\u2581"), Replace(" ", "\u2581")], model BPE byte_fallback with
             merges ordered by piece score as transformers' SentencePieceExtractor makes them
             (Llama 2, TinyLlama, stories260K)
The GGUF is parsed here by hand (gguf-py's reader takes seconds on a 50k vocabulary).
"""
import json
import pathlib
import struct

RE_LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
RE_QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_kv(path):
    """{key: value} of a GGUF v2/v3 file; strings as bytes, arrays as lists."""
    data = pathlib.Path(path).read_bytes()
    assert data[:4] == b"GGUF"
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    assert version in (2, 3)
    off = 24

    def rd(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, data, off)[0]
        off += struct.calcsize(fmt)
        return v

    def rd_str():
        nonlocal off
        n = rd("<Q")
        s = data[off:off + n]
        off += n
        return s

    def rd_val(t):
        nonlocal off
        if t == 8:
            return rd_str()
        if t == 9:
            et, n = rd("<I"), rd("<Q")
            if et in _SCALAR:
                fmt = "<%d%s" % (n, _SCALAR[et][1])
                v = list(struct.unpack_from(fmt, data, off))
                off += struct.calcsize(fmt)
                return v
            return [rd_val(et) for _ in range(n)]
        return rd(_SCALAR[t])

    kv = {}
    for _ in range(n_kv):
        key = rd_str().decode()
        kv[key] = rd_val(rd("<I"))
    return kv


def _spm_merges(pieces, scores, ids):
    """transformers' SentencePieceExtractor: for every piece, every split into two vocabulary pieces,
    ordered by the piece's score (then by the ids of the parts)."""
    vocab = {p: i for p, i in zip(pieces, ids)}
    out = []
    for p, s, i in zip(pieces, scores, ids):
        local = []
        for k in range(1, len(p)):
            l, r = p[:k], p[k:]
            if l in vocab and r in vocab:
                local.append((l, r, s, i))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        out.extend(local)
    out.sort(key=lambda x: -x[2])  # stable: equal scores keep the id order
    return [[l, r] for l, r, _, _ in out]


def write_hf_dir(gguf_path, out_dir, merges_style="pairs", with_llmq_scores=False):
    kv = read_gguf_kv(gguf_path)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens = [t.decode("utf-8") for t in kv["tokenizer.ggml.tokens"]]
    types = kv.get("tokenizer.ggml.token_type", [1] * len(tokens))
    model_type = kv["tokenizer.ggml.model"].decode()
    pre = kv.get("tokenizer.ggml.pre", b"default").decode()
    vocab, seen = {}, set()
    for i, t in enumerate(tokens):
        assert t not in seen, "duplicate token text %r: not representable in tokenizer.json" % t
        seen.add(t)
        vocab[t] = i
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": types[i] in (2, 3)} for i, t in enumerate(tokens) if types[i] in (2, 3, 4)]
    cfg = {}
    for key, name in (("bos", "bos_token"), ("eos", "eos_token"), ("unknown", "unk_token"), ("padding", "pad_token")):
        v = kv.get("tokenizer.ggml.%s_token_id" % key)
        if v is not None and v < len(tokens):
            cfg[name] = tokens[v]
    if "tokenizer.ggml.add_bos_token" in kv:
        cfg["add_bos_token"] = bool(kv["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.add_eos_token" in kv:
        cfg["add_eos_token"] = bool(kv["tokenizer.ggml.add_eos_token"])
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
          "pre_tokenizer": None, "post_processor": None, "decoder": None}
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab}
    if model_type == "gpt2":
        merges = [m.decode("utf-8") for m in kv["tokenizer.ggml.merges"]]
        model["merges"] = merges if merges_style == "strings" else [m.split(" ", 1) for m in merges]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        tj["decoder"] = dict(byte_level)
        tj["post_processor"] = dict(byte_level, trim_offsets=False)
        if pre == "smollm":
            tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True}, byte_level]}
        elif pre == "gpt-2":
            tj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
        elif pre in ("llama-bpe", "qwen2"):
            split = {"type": "Split", "pattern": {"Regex": RE_LLAMA3 if pre == "llama-bpe" else RE_QWEN2},
                     "behavior": "Isolated", "invert": False}
            tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, dict(byte_level, use_regex=False)]}
            if pre == "llama-bpe":
                model["ignore_merges"] = True
                bos = cfg.get("bos_token")
                tj["post_processor"] = {"type": "Sequence", "processors": [
                    dict(byte_level, trim_offsets=False),
                    {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                                              {"Sequence": {"id": "A", "type_id": 0}}],
                     "pair": [], "special_tokens": {}}]}
                cfg.pop("add_bos_token", None)  # Llama 3's config has none: the template says it
            else:
                tj["normalizer"] = {"type": "NFC"}
        else:
            raise ValueError("no HF layout for pre %r" % pre)
    elif model_type == "llama":
        scores = kv["tokenizer.ggml.scores"]
        normal = [(t, s, i) for i, (t, s) in enumerate(zip(tokens, scores)) if types[i] == 1]
        unk = next((t for t, ty in zip(tokens, types) if ty == 2), cfg.get("unk_token"))
        model.update(byte_fallback=True, fuse_unk=True, unk_token=unk,
                     merges=_spm_merges([t for t, _, _ in normal], [s for _, s, _ in normal], [i for _, _, i in normal]))
        if merges_style == "strings":
            model["merges"] = [" ".join(m) for m in model["merges"]]
        tj["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        if with_llmq_scores:
            model["llmq_scores"] = list(scores)
            model["llmq_token_types"] = list(types)
        cfg.setdefault("add_bos_token", True)
    else:
        raise ValueError("no HF layout for tokenizer.ggml.model %r" % model_type)
    tj["model"] = model
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    return out
