"""Oracle: the text path of every transformers family on a real tokenizer. The other family oracles (test_qwen3.py,
test_gemma.py, test_phi3.py, test_moe.py, test_qwen2moe.py) feed ids of stories260K's 512-token vocabulary; here
tests/py/hf_real_text_model.py builds a tiny random model per family (hidden 64, 2 layers, 4 experts where the family
has experts) with SmolLM2-135M's GPT-2 style BPE tokenizer (`llmq convert --to hf` of its GGUF: vocab 49152, its
bos / eos ids) and text goes in: EXCERPT_CHARS characters of wiki.test.raw.
  tokens     tests/tools/tokenize_tool on each model directory (add_special, as llmq eval tokenizes) equals
             transformers' AutoTokenizer ids, with and without special tokens.
  eval       `llmq eval --ppl EXCERPT --ctx CTX --chunks CHUNKS --json` equals transformers' perplexity on the same
             windows (the llama.cpp protocol of calib/eval/eval.h, computed in the script) within PPL_REL.
             Measured (2000 characters = 538 ids, no BOS added by SmolLM2's tokenizer; 62 scored positions): the
             perplexities are 6.2e4 .. 9.6e4 (random weights) and agree within 1.9e-7 relative.
  quantize   `llmq quantize` to a GPTQ directory (gptq, 4 bits, group 32, the excerpt as calibration) and to a Q8_0
             GGUF (rtn); `llmq eval` of each gives a finite perplexity within QUANT_REL of the f32 model's.
             Measured ratios to f32: gptq 0.92 (phi3) .. 1.05 (mixtral), Q8_0 0.989 .. 0.999.
"""
import json
import math
import os

import pytest

from conftest import run
from family_oracle import HF_PYTHON, HF_SKIP_REASON, HERE, work  # noqa: F401 (work: the fixture)

pytestmark = pytest.mark.skipif(not HF_PYTHON, reason=HF_SKIP_REASON)
FAMILIES = ["qwen3", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen3_moe", "qwen2_moe"]
EXCERPT_CHARS = 2000
CTX, CHUNKS = 64, 2
PPL_REL = 1e-3
QUANT_REL = 0.5


@pytest.fixture(scope="module")
def real(llmq_bin, smollm2, data_dir, work):
    """The excerpt, transformers' ids and every family's directory with transformers' perplexity."""
    tok = work / "tok"
    run([llmq_bin, "convert", "--model", smollm2, "--out", tok, "--to", "hf", "--quiet"])
    text = (data_dir / "wikitext-2-raw" / "wiki.test.raw").read_bytes().decode("utf-8")[:EXCERPT_CHARS]
    excerpt = work / "excerpt.txt"
    excerpt.write_bytes(text.rstrip("\n").encode("utf-8"))  # no trailing '\n': tokenize_tool reads the file whole
    r = run([HF_PYTHON, os.path.join(HERE, "hf_real_text_model.py"), tok, excerpt, CTX, CHUNKS, work],
            env=dict(os.environ, OMP_NUM_THREADS="2"))
    print(r.stdout)
    ids = json.loads((work / "ids.json").read_text())
    fams = {f: json.loads((work / f"rt-{f}.json").read_text()) for f in FAMILIES}
    return dict(excerpt=excerpt, ids=ids, fams=fams)


def eval_ppl(llmq_bin, model, excerpt, js):
    run([llmq_bin, "eval", "--model", model, "--ppl", excerpt, "--ctx", CTX, "--chunks", CHUNKS, "--threads", "2",
         "--json", js])
    return json.loads(js.read_text())["ppl"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_equal_transformers(tool, real, family):
    d = real["fams"][family]["dir"]
    got = [int(x) for x in run([tool("tokenize_tool"), d, real["excerpt"]]).stdout.split()]
    plain = [int(x) for x in run([tool("tokenize_tool"), d, real["excerpt"], "--no-special"]).stdout.split()]
    assert len(real["ids"]["plain"]) >= CTX * CHUNKS
    assert plain == real["ids"]["plain"]
    assert got == real["ids"]["special"]


@pytest.mark.parametrize("family", FAMILIES)
def test_eval_and_quantize(llmq_bin, real, work, family):
    ref = real["fams"][family]
    d = ref["dir"]
    ppl = eval_ppl(llmq_bin, d, real["excerpt"], work / f"{family}.eval.json")
    print(f"{family}: llmq ppl {ppl:.6f}, transformers {ref['ppl']:.6f} over {ref['count']} positions")
    assert math.isfinite(ppl) and abs(ppl - ref["ppl"]) <= PPL_REL * ref["ppl"]
    outs = {"gptq": (work / f"{family}-gptq", ["--method", "gptq", "--bits", "4", "--group-size", "32", "--format",
                                              "gptq", "--calib", real["excerpt"], "--nsamples", "2", "--seqlen",
                                              "64"]),
            "q8_0": (work / f"{family}-q8_0.gguf", ["--method", "rtn", "--format", "gguf", "--gguf-type", "Q8_0"])}
    for name, (out, flags) in outs.items():
        run([llmq_bin, "quantize", "--model", d, *flags, "--threads", "2", "--out", out, "--force"])
        q = eval_ppl(llmq_bin, out, real["excerpt"], work / f"{family}-{name}.eval.json")
        print(f"{family} {name}: ppl {q:.6f} (f32 {ppl:.6f}, ratio {q / ppl:.4f})")
        assert math.isfinite(q) and abs(q - ppl) <= QUANT_REL * ppl, (name, q, ppl)
