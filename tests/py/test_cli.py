"""The llmq command line: help text lists every flag with its default, bad flags name themselves."""
import json
import re

import pytest

from conftest import run

COMMANDS = ["inspect", "devices", "convert", "generate", "eval", "calib", "quantize"]


def test_top_level_help(llmq_bin):
    out = run([llmq_bin, "--help"]).stdout
    for c in COMMANDS:
        assert re.search(rf"^\s+{c}\s", out, re.M), c
    assert run([llmq_bin, "--version"]).stdout.startswith("llmq ")


def test_no_args_is_usage_error(llmq_bin):
    r = run([llmq_bin], check=False)
    assert r.returncode == 2 and "usage" in r.stderr


def test_unknown_command(llmq_bin):
    r = run([llmq_bin, "frobnicate"], check=False)
    assert r.returncode == 2 and "frobnicate" in r.stderr


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_flag_has_a_default(llmq_bin, cmd):
    out = run([llmq_bin, cmd, "--help"]).stdout
    flags = [l for l in out.splitlines() if l.strip().startswith("--") and not l.strip().startswith("--help")]
    assert flags, out
    for line in flags:
        assert "(default: " in line, line


@pytest.mark.parametrize("cmd", COMMANDS)
def test_unknown_flag_names_itself(llmq_bin, cmd):
    r = run([llmq_bin, cmd, "--no-such-flag"], check=False)
    assert r.returncode == 2 and "--no-such-flag" in r.stderr


def test_flag_value_errors(llmq_bin, smollm2):
    r = run([llmq_bin, "inspect", smollm2, "--max-array", "lots"], check=False)
    assert r.returncode == 2 and "--max-array" in r.stderr
    r = run([llmq_bin, "inspect", smollm2, "--max-array"], check=False)
    assert r.returncode == 2 and "needs a value" in r.stderr
    r = run([llmq_bin, "inspect", smollm2, "--json=yes"], check=False)
    assert r.returncode == 2 and "--json" in r.stderr


def test_devices(llmq_bin):
    rep = json.loads(run([llmq_bin, "devices", "--json"]).stdout)
    assert isinstance(rep["cuda_devices"], list)
    if not rep["cuda_devices"]:
        assert rep["reason"]
    out = run([llmq_bin, "devices"]).stdout
    assert "cpu: available" in out


def test_llama_quantize_flag_names_are_aliases(llmq_bin, stories_v3, tmp_path):
    """--output-tensor-type / --token-embedding-type (llama-quantize's names) are --output-type /
    --embedding-type: listed in --help, parsed the same, same bytes."""
    out = run([llmq_bin, "quantize", "--help"]).stdout
    assert re.search(r"^\s+--output-tensor-type S\s+same as --output-type", out, re.M), out
    assert re.search(r"^\s+--token-embedding-type S\s+same as --embedding-type", out, re.M), out
    base = [llmq_bin, "quantize", "--model", stories_v3, "--format", "gguf", "--gguf-type", "Q4_0", "--threads", "2",
            "--no-provenance"]
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    run(base + ["--out", a, "--output-type", "q8_0", "--embedding-type", "q5_0"])
    run(base + ["--out", b, "--output-tensor-type", "q8_0", "--token-embedding-type=q5_0"])
    run(base + ["--out", c])
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    # a bad value is named by the flag the user typed
    r = run(base + ["--out", tmp_path / "d.gguf", "--token-embedding-type", "q9_9"], check=False)
    assert r.returncode == 2 and "q9_9" in r.stderr, r.stderr
    r = run(base + ["--out", tmp_path / "d.gguf", "--output-tensor-type"], check=False)
    assert r.returncode == 2 and "--output-tensor-type" in r.stderr, r.stderr
