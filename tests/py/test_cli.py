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
