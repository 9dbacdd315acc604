"""Shared pieces of the model-family oracles (tests/py/test_qwen3.py, tests/py/test_gemma.py): the token ids,
llmq's forward through tests/tools/forward_logits, and the random-weight HF directories built by a script of
the transformers venv (tests/py/hf_family.py and the hf_*_model.py scripts)."""
import json
import os

import numpy as np
import pytest

from conftest import run

N_VOCAB = 512  # the vocabulary of stories260K's tokenizer, which every random family model uses
HERE = os.path.dirname(__file__)


def make_ids(work):
    """BOS + 47 seeded ids below N_VOCAB, written to work/ids.txt: dict(path, tokens)."""
    rng = np.random.default_rng(7)
    toks = [1] + [int(x) for x in rng.integers(3, N_VOCAB, size=47)]
    p = work / "ids.txt"
    p.write_text(" ".join(map(str, toks)))
    return dict(path=p, tokens=toks)


def forward(tool, model, ids_path, out):
    """llmq's logits (n, N_VOCAB) of the ids in ids_path, computed by tests/tools/forward_logits into out."""
    run([tool("forward_logits"), model, ids_path, out, 2])
    return np.fromfile(out, np.float32).reshape(-1, N_VOCAB)


def build_hf_models(llmq_bin, stories_v3, work, ids, script, hf_python):
    """Runs the transformers-venv script (TOKENIZER_DIR IDS_FILE OUT_DIR) with stories260K's tokenizer."""
    tok = work / "tok"
    run([llmq_bin, "convert", "--model", stories_v3, "--out", tok, "--to", "hf", "--quiet"])
    r = run([hf_python, os.path.join(HERE, script), tok, ids["path"], work], env=dict(os.environ, OMP_NUM_THREADS="2"))
    print(r.stdout)


HF_PYTHON = os.environ.get("LLMQ_HF_PYTHON")
HF_SKIP_REASON = "LLMQ_HF_PYTHON unset: no transformers venv (tests/run.sh sets it up with LLMQ_WITH_HF=1)"


@pytest.fixture(scope="module")
def work(request, tmp_path_factory):
    """A temporary directory per test module (import this fixture into the module)."""
    return tmp_path_factory.mktemp(request.module.__name__)


@pytest.fixture(scope="module")
def ids(work):
    return make_ids(work)


def moe_models(llmq_bin, tool, stories_v3, work, ids, script, variants):
    """Builds the script's random MoE models; per variant its directory, transformers' logits (48 positions), the
    router margins and llmq's logits on the directory (test_moe.py, test_qwen2moe.py)."""
    build_hf_models(llmq_bin, stories_v3, work, ids, script, HF_PYTHON)
    out = {}
    for v in variants:
        d = work / v
        out[v] = dict(hf=d, ref=np.fromfile(f"{d}.hf.f32", np.float32).reshape(48, -1),
                      margin=json.loads((work / f"{v}.margin.json").read_text()),
                      llmq_hf=forward(tool, d, ids["path"], work / f"{v}.llmq-hf.f32"))
    return out


def moe_ggufs(llmq_bin, tool, models, work, ids, variants):
    """`llmq convert` of each variant's directory to GGUF and llmq's logits on it, added to models[v]."""
    for v in variants:
        gguf = work / f"{v}.gguf"
        run([llmq_bin, "convert", "--model", models[v]["hf"], "--out", gguf, "--quiet"])
        models[v].update(gguf=gguf, llmq_gguf=forward(tool, gguf, ids["path"], work / f"{v}.llmq-gguf.f32"))
    return models


def gguf_back_to_hf(llmq_bin, gguf, hf_dir, back):
    """`llmq convert` GGUF -> HF into back: (the tensors of hf_dir, those of back, back's config.json)."""
    import json
    from safetensors.numpy import load_file
    run([llmq_bin, "convert", "--model", gguf, "--out", back, "--to", "hf", "--quiet"])
    a, b = load_file(str(hf_dir / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert sorted(a) == sorted(b)
    return a, b, json.loads((back / "config.json").read_text())


def check_hf_loads(tool, out, ids, work, method, label, base):
    """The quantized directory out loads in transformers (tests/py/hf_load_logits.py) as `method` and gives
    llmq's logits with the thresholds of tests/py/test_hf_load.py (base: llmq's unquantized logits)."""
    import json
    from test_hf_load import check_agreement
    ours = forward(tool, out, ids["path"], work / f"{out.name}.llmq.f32")
    r = run([HF_PYTHON, os.path.join(HERE, "hf_load_logits.py"), ids["path"], "float32", out,
             work / f"{out.name}.hf.f32"], env=dict(os.environ, OMP_NUM_THREADS="2"))
    info = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")][0]
    assert "error" not in info, info.get("error")
    assert info["quant_method"] == method and info["linear_classes"]
    theirs = np.fromfile(work / f"{out.name}.hf.f32", np.float32).reshape(-1, N_VOCAB)
    check_agreement(f"{label}: {info['linear_classes']}", theirs, ours, base)
