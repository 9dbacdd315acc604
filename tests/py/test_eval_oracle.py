"""Oracle: `llmq eval` against perplexity / KL-divergence figures computed from llama.cpp's own tokens
and logits (llama-cpp-python, f32 KV cache; eval_util.py), plus the CLI contract of `llmq eval`.

Golden figures (tests/golden/ppl_*.json, kld_*.json, written by gen_golden_ppl.py) hold per-chunk
NLL sums, so these tests compare the first chunks only (ctest stays fast); with llama_cpp importable
one live test recomputes the reference. Models:
  SmolLM2 f32     SmolLM2-135M-Instruct Q4_1 dequantized to an f32 GGUF by gguf-py: llmq and
                  llama.cpp do the same f32 arithmetic, so the perplexity must agree within 0.1%
                  (measured: 4e-7 relative).
  SmolLM2 Q4_1    the file itself: llama.cpp multiplies with 8-bit-quantized activations, llmq in
                  f32 with the dequantized weights (so llmq's Q4_1 figure equals its f32 figure);
                  the gap to llama.cpp is that activation rounding (< 1% here).
  stories260K     SPM tokenizer that adds BOS: exercises the BOS-per-chunk substitution (llamacpp)
                  and BOS-once-per-text (gptq), with the rows of wiki.test.raw joined by "\\n\\n".
  q4_0rt          the f32 model with every 2-D weight round-tripped through Q4_0 (still f32): the
                  second model of the KL-divergence oracle.
"""
import json
import pathlib

import gguf
import pytest

import eval_util as eu
from conftest import run

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "golden"
PPL_RTOL = 1e-3  # the 0.1%

try:
    import llama_cpp  # noqa: F401
    HAVE_LLAMA_CPP = True
except ImportError:
    HAVE_LLAMA_CPP = False
needs_llama_cpp = pytest.mark.skipif(not HAVE_LLAMA_CPP, reason="llama_cpp (llama-cpp-python) is not importable")


def golden(name):
    return json.loads((GOLDEN / name).read_text())


def golden_ppl(g, chunks):
    """exp(mean NLL) of the first `chunks` chunks of golden g."""
    import math
    rows = g["count"] // g["chunks"]
    return math.exp(sum(g["per_chunk_nll_sum"][:chunks]) / (rows * chunks))


@pytest.fixture(scope="module")
def wiki(data_dir):
    return data_dir / "wikitext-2-raw" / "wiki.test.raw"


@pytest.fixture(scope="module")
def eval_cache(build_dir):
    return build_dir / "tests" / "eval_cache"


@pytest.fixture(scope="module")
def smol_f32(smollm2, eval_cache):
    return eu.cached_f32_gguf(smollm2, eval_cache)


@pytest.fixture(scope="module")
def smol_q4rt(smollm2, eval_cache):
    return eu.cached_f32_gguf(smollm2, eval_cache, gguf.GGMLQuantizationType.Q4_0)


@pytest.fixture(scope="module")
def stories(data_dir):
    return data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf"


@pytest.fixture
def llmq_eval(llmq_bin, tmp_path):
    """llmq_eval(*args) -> (json report, CompletedProcess); --threads 2 unless given."""
    def go(*args, check=True):
        j = tmp_path / "out.json"
        if j.exists():
            j.unlink()
        extra = [] if "--threads" in args else ["--threads", "2"]
        r = run([llmq_bin, "eval", *args, *extra, "--json", j], check=check)
        return (json.loads(j.read_text()) if j.exists() else None), r
    return go


# ---- the CLI contract ------------------------------------------------------------------------------

def test_help_lists_every_flag_with_default(llmq_bin):
    out = run([llmq_bin, "eval", "--help"]).stdout
    for flag in ["--model", "--ppl", "--protocol", "--ctx", "--chunks", "--threads", "--kld-base", "--save-logits",
                 "--kld", "--json", "--logits-dtype", "--rows"]:
        line = next((l for l in out.splitlines() if l.strip().startswith(flag + " ")), None)
        assert line and "(default: " in line, flag


@pytest.mark.parametrize("args, msg", [
    ([], "--model is required"),
    (["--model", "m.gguf"], "--ppl FILE is required"),
    (["--model", "m", "--ppl", "t", "--protocol", "lm-eval"], "--protocol"),
    (["--model", "m", "--ppl", "t", "--ctx", "1"], "--ctx"),
    (["--model", "m", "--ppl", "t", "--chunks", "0"], "--chunks"),
    (["--model", "m", "--ppl", "t", "--threads", "0"], "--threads"),
    (["--model", "m", "--ppl", "t", "--kld-base", "b", "--save-logits", "x"], "exclude each other"),
    (["--model", "m", "--ppl", "t", "--logits-dtype", "bf16"], "--logits-dtype"),
    (["--model", "m", "--ppl", "t", "--rows", "maybe"], "--rows"),
    (["--model", "m", "--ppl", "t", "--bogus"], "--bogus"),
])
def test_usage_errors(llmq_bin, args, msg):
    r = run([llmq_bin, "eval", *args], check=False)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_missing_inputs_name_the_file(llmq_bin, stories, tmp_path):
    r = run([llmq_bin, "eval", "--model", stories, "--ppl", tmp_path / "nope.txt"], check=False)
    assert r.returncode == 1 and "nope.txt" in r.stderr
    r = run([llmq_bin, "eval", "--model", tmp_path / "nope.gguf", "--ppl", "wikitext-2"], check=False)
    assert r.returncode == 1 and "nope.gguf" in r.stderr
    short = tmp_path / "short.txt"
    short.write_text("Once upon a time")
    r = run([llmq_bin, "eval", "--model", stories, "--ppl", short], check=False)
    assert r.returncode == 1 and "fewer than one chunk of 512" in r.stderr


# ---- perplexity against llama.cpp -------------------------------------------------------------------

def test_ppl_smollm2_f32_llamacpp(llmq_eval, smol_f32, wiki):
    g = golden("ppl_smollm2_f32_llamacpp.json")
    rep, r = llmq_eval("--model", smol_f32, "--ppl", wiki, "--chunks", "2")
    assert rep["text_tokens"] == g["text_tokens"]           # llama.cpp's tokenizer on the same text
    assert rep["text_sha256"] == g["text_sha256"] == eu.sha256(eu.llamacpp_text(wiki.read_bytes()))
    assert rep["protocol"] == "llamacpp" and rep["ctx"] == 512 and rep["first_scored_position"] == 256
    assert rep["tokens_scored"] == 2 * 255 and rep["tokens_evaluated"] == 1024 and rep["bos_per_chunk"] is None
    assert rep["ppl"] == pytest.approx(golden_ppl(g, 2), rel=PPL_RTOL)
    assert rep["ppl"] == pytest.approx(golden_ppl(g, 2), rel=1e-5)  # what f32 arithmetic actually gives
    assert "Final estimate: PPL = " in r.stdout and "llamacpp" in r.stdout
    assert "eval: chunk 2/2" in r.stderr and "ETA" in r.stderr   # non-TTY progress lines
    for k in ["model", "text", "text_sha256", "llmq_version", "chunks", "ppl_uncertainty", "tokens_per_s"]:
        assert k in rep


def test_ppl_smollm2_q4_1_llamacpp(llmq_eval, smollm2, wiki):
    g = golden("ppl_smollm2_q4_1_llamacpp.json")
    g32 = golden("ppl_smollm2_f32_llamacpp.json")
    rep, _ = llmq_eval("--model", smollm2, "--ppl", wiki, "--chunks", "1")
    # llmq runs the dequantized weights in f32: its Q4_1 figure is the f32 file's figure
    assert rep["ppl"] == pytest.approx(golden_ppl(g32, 1), rel=1e-5)
    # llama.cpp's Q4_1 figure differs by its 8-bit activation rounding only
    assert rep["ppl"] == pytest.approx(golden_ppl(g, 1), rel=1e-2)


def test_ppl_smollm2_f32_gptq(llmq_eval, smol_f32, wiki):
    g = golden("ppl_smollm2_f32_gptq.json")
    rep, r = llmq_eval("--model", smol_f32, "--ppl", wiki, "--protocol", "gptq", "--ctx", "512", "--chunks", "1")
    assert rep["rows_joined"] and rep["text_sha256"] == g["text_sha256"] == eu.sha256(eu.gptq_text(wiki.read_bytes()))
    assert rep["text_tokens"] == g["text_tokens"] and rep["tokens_scored"] == 511
    assert rep["ppl"] == pytest.approx(golden_ppl(g, 1), rel=1e-5)
    assert "gptq" in r.stdout


@pytest.mark.parametrize("protocol, ctx, chunks, name", [
    ("llamacpp", 128, 8, "ppl_stories260k_llamacpp.json"),
    ("gptq", 128, 6, "ppl_stories260k_gptq.json"),
    ("gptq", 1300, 2, "ppl_stories260k_gptq_ctx1300.json"),  # 1299 scored rows: three head slices
])
def test_ppl_stories260k(llmq_eval, stories, wiki, protocol, ctx, chunks, name):
    g = golden(name)
    rep, _ = llmq_eval("--model", stories, "--ppl", "wikitext-2", "--protocol", protocol, "--ctx", str(ctx),
                       "--chunks", str(chunks))
    assert rep["text_tokens"] == g["text_tokens"] and g["add_bos"]
    assert rep["bos_per_chunk"] == (1 if protocol == "llamacpp" else None)
    assert rep["tokens_scored"] == g["count"]
    assert rep["ppl"] == pytest.approx(g["ppl"], rel=1e-5)
    assert rep["ppl_uncertainty"] == pytest.approx(g["ppl_uncertainty"], rel=1e-4)


def test_rows_flag_overrides_the_protocol_default(llmq_eval, stories, wiki):
    on, _ = llmq_eval("--model", stories, "--ppl", wiki, "--ctx", "64", "--chunks", "1", "--rows", "on")
    off, _ = llmq_eval("--model", stories, "--ppl", wiki, "--ctx", "64", "--chunks", "1")
    assert on["rows_joined"] and not off["rows_joined"] and on["text_tokens"] > off["text_tokens"]


@needs_llama_cpp
def test_ppl_live_llama_cpp(llmq_eval, stories, data_dir, wiki):
    v3 = data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.v3.gguf"
    ref = eu.reference_ppl(v3, wiki, "llamacpp", ctx=64, chunks=5, threads=2)
    rep, _ = llmq_eval("--model", stories, "--ppl", wiki, "--ctx", "64", "--chunks", "5")
    assert rep["text_tokens"] == ref["text_tokens"]
    assert rep["ppl"] == pytest.approx(ref["ppl"], rel=1e-5)


# ---- KL divergence --------------------------------------------------------------------------------

def test_kld_base_against_llama_cpp(llmq_eval, smol_f32, smol_q4rt, wiki):
    g = golden("kld_smollm2_q4_0rt_vs_f32.json")
    rep, r = llmq_eval("--model", smol_q4rt, "--kld-base", smol_f32, "--ppl", wiki, "--chunks", "2")
    k = rep["kld"]
    assert rep["tokens_scored"] == g["count"]
    assert k["kld_mean"] == pytest.approx(g["kld_mean"], rel=1e-3)
    assert rep["ppl"] == pytest.approx(g["ppl"], rel=1e-4)
    assert k["ppl_base"] == pytest.approx(g["ppl_base"], rel=1e-4)
    assert k["same_top_p"] == pytest.approx(g["same_top_p"], abs=2.5 / g["count"])
    assert k["delta_p_rms"] == pytest.approx(g["delta_p_rms"], rel=1e-3)
    assert k["delta_p_mean"] == pytest.approx(g["delta_p_mean"], abs=1e-4)
    assert k["kld_quantiles"]["max"] == pytest.approx(g["kld_max"], rel=1e-3)
    assert k["kld_quantiles"]["p50"] == pytest.approx(g["kld_median"], rel=1e-3)
    for line in ["Mean    KLD:", "Same top p:", "RMS Δp", "Mean PPL(base)"]:
        assert line in r.stdout


@pytest.fixture(scope="module")
def stories_q4rt(data_dir, eval_cache):
    return eu.cached_f32_gguf(data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.v3.gguf", eval_cache,
                              gguf.GGMLQuantizationType.Q4_0)


def test_save_logits_then_kld_equals_kld_base(llmq_eval, stories, stories_q4rt, wiki, tmp_path):
    """The two KLD modes give the same figures (f32 logits file), and a model against its own f16
    logits shows only f16 rounding."""
    lf = tmp_path / "base.logits"
    common = ["--ppl", wiki, "--ctx", "128", "--chunks", "6"]
    plain, r = llmq_eval("--model", stories, *common, "--save-logits", lf, "--logits-dtype", "f32")
    data_off = (128 + 4 * 6 * 128 + 63) // 64 * 64  # header + tokens, aligned (calib/eval/eval.h)
    assert lf.stat().st_size == data_off + 6 * 63 * 512 * 4
    assert "logits:" in r.stdout
    via_file, _ = llmq_eval("--model", stories_q4rt, "--kld", lf)
    via_base, _ = llmq_eval("--model", stories_q4rt, "--kld-base", stories, *common)
    assert via_file["text_sha256"] == plain["text_sha256"] and via_file["chunks"] == 6
    assert via_file["kld"]["ppl_base"] == pytest.approx(plain["ppl"], rel=1e-12)
    assert via_file["kld"]["kld_mean"] > 1e-3
    for key in ["kld_mean", "kld_uncertainty", "delta_p_rms", "same_top_p", "ln_ppl_ratio"]:
        assert via_file["kld"][key] == pytest.approx(via_base["kld"][key], rel=1e-9, abs=1e-12), key
    assert via_file["ppl"] == pytest.approx(via_base["ppl"], rel=1e-12)
    cut, _ = llmq_eval("--model", stories_q4rt, "--kld", lf, "--chunks", "2")
    assert cut["chunks"] == 2 and cut["tokens_scored"] == 2 * 63

    lf16 = tmp_path / "base16.logits"
    llmq_eval("--model", stories, *common, "--save-logits", lf16)
    assert lf16.stat().st_size == data_off + 6 * 63 * 512 * 2
    self_kld, _ = llmq_eval("--model", stories, "--kld", lf16, "--ppl", wiki)  # --ppl: checked against the file
    assert 0 <= self_kld["kld"]["kld_mean"] < 1e-4 and self_kld["kld"]["same_top_p"] > 0.99
    assert self_kld["ppl"] == pytest.approx(plain["ppl"], rel=1e-12)


def test_kld_file_errors(llmq_eval, llmq_bin, smol_f32, stories, wiki, tmp_path):
    lf = tmp_path / "s.logits"
    llmq_eval("--model", stories, "--ppl", wiki, "--ctx", "64", "--chunks", "2", "--save-logits", lf)
    # another model's vocabulary
    r = run([llmq_bin, "eval", "--model", smol_f32, "--kld", lf], check=False)
    assert r.returncode == 1 and "vocabulary" in r.stderr
    # another text
    other = tmp_path / "other.txt"
    other.write_bytes(wiki.read_bytes()[:100000])
    r = run([llmq_bin, "eval", "--model", stories, "--kld", lf, "--ppl", other], check=False)
    assert r.returncode == 1 and "is not the one" in r.stderr
    # a context that contradicts the file: a flag in conflict, a usage error
    r = run([llmq_bin, "eval", "--model", stories, "--kld", lf, "--ctx", "128"], check=False)
    assert r.returncode == 2 and "--ctx 128" in r.stderr
    # truncated, bad magic, wrong version
    data = lf.read_bytes()
    bad = tmp_path / "bad.logits"
    for blob, msg in [(data[:-1], "header describes"), (b"GGUF" + data[4:], "not an llmq logits file"),
                      (data[:8] + b"\x07\0\0\0" + data[12:], "version 7"), (data[:100], "shorter than")]:
        bad.write_bytes(blob)
        r = run([llmq_bin, "eval", "--model", stories, "--kld", bad], check=False)
        assert r.returncode == 1 and msg in r.stderr and str(bad) in r.stderr, (msg, r.stderr)
    # a crash while saving leaves no file: an unwritable directory gives an error and nothing else
    r = run([llmq_bin, "eval", "--model", stories, "--ppl", wiki, "--ctx", "64", "--chunks", "1",
             "--save-logits", tmp_path / "no" / "dir" / "x.logits"], check=False)
    assert r.returncode == 1 and not (tmp_path / "no").exists()


def test_kld_base_refuses_other_vocabulary(llmq_bin, smol_f32, stories):
    r = run([llmq_bin, "eval", "--model", stories, "--kld-base", smol_f32, "--ppl", "wikitext-2", "--chunks", "1"],
            check=False)
    assert r.returncode == 1 and "same vocabulary" in r.stderr


def test_gzip_text_is_read_transparently(llmq_eval, stories, wiki, tmp_path):
    import gzip
    gz = tmp_path / "wiki.test.raw.gz"
    gz.write_bytes(gzip.compress(wiki.read_bytes()))
    a, _ = llmq_eval("--model", stories, "--ppl", gz, "--ctx", "64", "--chunks", "3")
    b, _ = llmq_eval("--model", stories, "--ppl", wiki, "--ctx", "64", "--chunks", "3")
    assert a["text_sha256"] == b["text_sha256"] and a["ppl"] == b["ppl"]


def test_hf_directory_gives_the_gguf_figure(llmq_eval, llmq_bin, smollm2, wiki, tmp_path):
    """The model converted to a Hugging Face directory (llmq convert) tokenizes the text identically
    and gives the same perplexity as the GGUF (llama.cpp's golden figure)."""
    hf = tmp_path / "smollm2-hf"
    run([llmq_bin, "convert", "--model", smollm2, "--out", hf, "--to", "hf", "--dtype", "f32", "--quiet"])
    g = golden("ppl_smollm2_f32_llamacpp.json")
    rep, _ = llmq_eval("--model", hf, "--ppl", wiki, "--chunks", "1")
    assert rep["text_tokens"] == g["text_tokens"]
    assert rep["ppl"] == pytest.approx(golden_ppl(g, 1), rel=1e-5)


@pytest.mark.skipif(not __import__("os").environ.get("LLMQ_SLOW"),
                    reason="whole wiki.test.raw (~15 min on 2 cores): set LLMQ_SLOW=1 to run")
@pytest.mark.parametrize("which", ["f32", "q4_1"])
def test_ppl_whole_file(llmq_eval, smol_f32, smollm2, wiki, which):
    """The issue's figure: all 592 chunks of wiki.test.raw, llamacpp protocol, ctx 512. On the f32
    file llmq must equal llama.cpp within 0.1%; on the Q4_1 file llama.cpp's 8-bit activations make
    its figure differ slightly (llmq's Q4_1 figure is its f32 figure)."""
    g = golden(f"ppl_smollm2_{which}_llamacpp_full.json")
    rep, _ = llmq_eval("--model", smol_f32 if which == "f32" else smollm2, "--ppl", wiki)
    assert rep["chunks"] == g["chunks"] == 592 and rep["tokens_scored"] == g["count"]
    assert rep["ppl"] == pytest.approx(g["ppl"], rel=PPL_RTOL if which == "f32" else 1e-2)
