"""Dataset names through the CLI (datasets/datasets.h): every command resolves a name the same way,
from the repository's datasets/data even with LLMQ_DATA pointing nowhere, and `eval --base` reports
the base's perplexity next to the model's with the difference."""
import json
import os
import re

import pytest

from conftest import run

EVAL = ["--ctx", "128", "--chunks", "3", "--threads", "2"]


def no_data_env():
    env = {k: v for k, v in os.environ.items() if k not in ("LLMQ_DATA", "LLMQ_MANIFEST")}
    env["LLMQ_DATA"] = "/nonexistent"
    return env


def test_eval_names_agree(llmq_bin, stories_v1, tmp_path):
    """--ppl wikitext-2 (the alias) and wikitext-2-test are the same text, read from the repository."""
    reps = {}
    for name in ("wikitext-2", "wikitext-2-test"):
        js = tmp_path / f"{name}.json"
        run([llmq_bin, "eval", "--model", stories_v1, "--ppl", name, *EVAL, "--json", js], env=no_data_env(),
            cwd=tmp_path)
        reps[name] = json.loads(js.read_text())
    a, b = reps["wikitext-2"], reps["wikitext-2-test"]
    assert a["dataset"] == b["dataset"] == "wikitext-2-test"
    assert a["text"].endswith("/datasets/data/wikitext-2-test.raw.gz") and a["text"] == b["text"]
    assert a["text_sha256"] == b["text_sha256"] and a["ppl"] == b["ppl"]


def test_calib_names_agree(llmq_bin, stories_v1, tmp_path):
    """--calib takes the same names: the alias gives the test split's tokens, with a warning."""
    out = {}
    for name in ("wikitext-2", "wikitext-2-test", "wikitext-2-valid"):
        r = run([llmq_bin, "calib", "--model", stories_v1, "--calib", name, "--nsamples", "2", "--seqlen", "32",
                 "--out", tmp_path / f"{name}.lcs"], env=no_data_env(), cwd=tmp_path)
        m = re.search(r"tokens sha256 ([0-9a-f]{64})", r.stdout)
        assert m, r.stdout
        out[name] = (m.group(1), "test split" in r.stderr)
    assert out["wikitext-2"] == out["wikitext-2-test"] and out["wikitext-2"][1]
    assert out["wikitext-2-valid"][0] != out["wikitext-2"][0] and not out["wikitext-2-valid"][1]


def test_unknown_name_lists_names(llmq_bin, stories_v1, tmp_path):
    r = run([llmq_bin, "eval", "--model", stories_v1, "--ppl", "wikitext-3", *EVAL], check=False, env=no_data_env())
    assert r.returncode == 1 and "wikitext-3" in r.stderr and "wikitext-2-valid" in r.stderr, r.stderr


def test_eval_base(llmq_bin, stories_v1, stories_v3, tmp_path):
    """--base: the model's PPL (as a plain run gives it), the base's (as a plain run of the base gives it),
    and their difference, on stdout's last three lines and in --json."""
    js, jm, jb = tmp_path / "both.json", tmp_path / "m.json", tmp_path / "b.json"
    # a different model as the base: stories260K at 2-bit RTN (same vocabulary)
    q = tmp_path / "q2"
    run([llmq_bin, "quantize", "--model", stories_v1, "--method", "rtn", "--bits", "2", "--group-size", "32",
         "--fallback", "rtn-per-channel", "--format", "fake", "--out", q])
    r = run([llmq_bin, "eval", "--model", q, "--base", stories_v3, "--ppl", "wikitext-2", *EVAL, "--json", js])
    run([llmq_bin, "eval", "--model", q, "--ppl", "wikitext-2", *EVAL, "--json", jm])
    run([llmq_bin, "eval", "--model", stories_v3, "--ppl", "wikitext-2", *EVAL, "--json", jb])
    both, m, b = (json.loads(p.read_text()) for p in (js, jm, jb))
    assert both["ppl"] == pytest.approx(m["ppl"], rel=1e-9)
    assert both["base_ppl"] == pytest.approx(b["ppl"], rel=1e-9)
    assert both["ppl_diff"] == pytest.approx(m["ppl"] - b["ppl"], rel=1e-6)
    assert both["ppl_diff_percent"] == pytest.approx(100 * (m["ppl"] / b["ppl"] - 1), rel=1e-6)
    assert both["ppl_diff"] > 0 and both["base_model"].endswith(".v3.gguf")
    last = r.stdout.strip().splitlines()[-3:]
    assert last[0].startswith("base:") and f"{b['ppl']:.4f}" in last[0], last
    assert last[1].startswith("quantized:") and f"{m['ppl']:.4f}" in last[1], last
    assert last[2].startswith("difference:") and f"{both['ppl_diff_percent']:+.3f}%" in last[2], last
    bad = run([llmq_bin, "eval", "--model", q, "--base", stories_v3, "--kld-base", stories_v3, "--ppl", "wikitext-2"],
              check=False)
    assert bad.returncode == 2 and "exclude each other" in bad.stderr
