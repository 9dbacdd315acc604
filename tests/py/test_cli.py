"""The llmq command line: help text lists every flag with its default, bad flags name themselves."""
import json
import re

import pytest

from conftest import run

COMMANDS = ["inspect", "devices", "convert", "generate", "eval", "calib", "quantize", "compare"]


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


# Every usage error exits 2 (README, "Exit status"), including those found only against the model's shapes
# (group size, format capacity) or between flags (a method without its calibration): (argv after
# `llmq`, a word the message must hold). M = stories260K (dim 64, ffn 172), T = a text file that exists.
USAGE_ERRORS = [
    (["inspect"], "missing argument"),
    (["inspect", "M", "--max-array", "-5"], "--max-array"),
    (["inspect", "M", "N"], "unexpected argument"),
    (["convert", "--model", "M"], "--out"),
    (["convert", "--model", "M", "--out", "O.gguf", "--to", "foo"], "--to"),
    (["convert", "--model", "M", "--out", "O.gguf", "--dtype", "q4_0"], "--dtype"),
    (["convert", "--model", "M", "--out", "O.gguf", "--max-shard-size", "lots"], "--max-shard-size"),
    (["calib", "--model", "M"], "exactly one of"),
    (["calib", "--calib", "T", "--out", "O.lcs"], "--model"),
    (["calib", "--model", "M", "--calib", "T", "--out", "O.lcs", "--device", "gpu"], "unknown device"),
    (["calib", "--model", "M", "--calib", "T", "--out", "O.lcs", "--nsamples", "0"], "--nsamples"),
    (["calib", "--model", "M", "--calib"], "--calib needs a value"),
    (["quantize", "--model", "M", "--out", "O", "--method", "foo"], "--method"),
    (["quantize", "--model", "M", "--out", "O", "--format", "foo"], "--format"),
    (["quantize", "--model", "M", "--out", "O", "--bits", "9"], "--bits"),
    (["quantize", "--model", "M", "--out", "O", "--device", "xyz"], "unknown device"),
    (["quantize", "--model", "M"], "--out"),
    (["quantize", "--out", "O"], "--model"),
    (["quantize", "--model", "M", "--out", "O", "--sym", "--asym"], "exclude each other"),
    (["quantize", "--model", "M", "--out", "O", "--group-size", "128", "--format", "fake"],
     "--group-size 4 tiles every linear"),
    (["quantize", "--model", "M", "--out", "O", "--group-size", "48", "--format", "gptq"],
     "--group-size 4 tiles every linear"),
    (["quantize", "--model", "M", "--out", "O", "--method", "gptq", "--group-size", "4", "--format", "fake"],
     "needs calibration data"),
    (["quantize", "--model", "M", "--out", "O", "--group-size", "4", "--format", "awq", "--bits", "3"],
     "4-bit weights only"),
    (["quantize", "--model", "M", "--out", "O", "--group-size", "4", "--format", "gptq", "--bits", "5"],
     "2, 3, 4 or 8 bits"),
    (["quantize", "--model", "M", "--out", "O", "--group-size", "8", "--format", "gptq", "--fallback",
      "rtn-per-channel"], "must be multiples of 8"),
    (["quantize", "--model", "M", "--out", "O.gguf", "--method", "gptq", "--gguf-type", "Q4_0"],
     "needs calibration data"),
    (["quantize", "--model", "M", "--out", "O.gguf", "--gguf-type", "Q9_9"], "--gguf-type"),
    (["quantize", "--model", "M", "--out", "O.gguf", "--gguf-type", "Q4_0", "--tensor-type", "x=foo"], "unknown type"),
    (["eval", "--model", "M"], "--ppl"),
    (["eval", "--model", "M", "--ppl", "T", "--protocol", "foo"], "--protocol"),
    (["eval", "--model", "M", "--ppl", "T", "--ctx", "1"], "--ctx"),
    (["eval", "--model", "M", "--ppl", "T", "--device", "xyz"], "unknown device"),
    (["eval", "--model", "M", "--ppl", "T", "--logits-dtype", "q8"], "--logits-dtype"),
    (["generate"], "--model"),
    (["generate", "--model", "M", "-n", "x"], "--n-predict"),
    (["generate", "--model", "M", "-n", "-3"], "--n-predict"),
    (["devices", "--json=1"], "--json"),
    (["devices", "extra"], "unexpected argument"),
]


@pytest.mark.parametrize("argv,msg", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_usage_errors_exit_2(llmq_bin, stories_v1, tmp_path, argv, msg):
    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a cat. " * 20)
    subst = {"M": str(stories_v1), "N": str(stories_v1), "T": str(text)}
    args = [subst.get(a, str(tmp_path / a) if a in ("O", "O.gguf", "O.lcs") else a) for a in argv]
    r = run([llmq_bin, *args], check=False)
    assert r.returncode == 2 and msg in r.stderr, (r.returncode, r.stderr)
    assert not any(p.name.startswith("O") for p in tmp_path.iterdir()), list(tmp_path.iterdir())


def test_failures_exit_1(llmq_bin, stories_v1, tmp_path):
    """Input that is missing or unreadable is a failure (1), not a usage error."""
    r = run([llmq_bin, "inspect", tmp_path / "nope.gguf"], check=False)
    assert r.returncode == 1 and "nope.gguf" in r.stderr
    r = run([llmq_bin, "eval", "--model", stories_v1, "--ppl", tmp_path / "nope.txt"], check=False)
    assert r.returncode == 1 and "nope.txt" in r.stderr
    dev = json.loads(run([llmq_bin, "devices", "--json"]).stdout)
    if not dev["cuda_devices"]:
        r = run([llmq_bin, "quantize", "--model", stories_v1, "--out", tmp_path / "q", "--device", "cuda"], check=False)
        assert r.returncode == 1 and f"--device cuda: no CUDA device found: {dev['reason']}" in r.stderr, r.stderr
        # --device auto: one info line, then the CPU
        r = run([llmq_bin, "quantize", "--model", stories_v1, "--out", tmp_path / "a", "--format", "fake",
                 "--group-size", "4"])
        assert r.stderr.splitlines()[0] == f"device: cpu (no CUDA device found: {dev['reason']})", r.stderr


def test_gguf_fallbacks_logged_once(llmq_bin, stories_v3, tmp_path):
    """A Q4_K_M of stories260K (64-wide rows, no 256-block tiles them): one summary warning, each tensor's
    fallback named once (in its progress line); --verbose adds the planning detail, --quiet prints nothing."""
    out = tmp_path / "q.gguf"
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--gguf-type", "Q4_K_M", "--out", out])
    summary = [l for l in r.stderr.splitlines() if "fell back" in l]
    assert len(summary) == 1 and "36 of 48 tensors" in summary[0], r.stderr
    notes = [l for l in r.stderr.splitlines() if "not divisible by" in l]
    assert len(notes) == 36 and len({n.split()[1] for n in notes}) == 36, notes  # one line per tensor
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--gguf-type", "Q4_K_M", "--out", out, "--force",
             "--verbose"])
    assert sum(l.startswith("debug: gguf mix:") for l in r.stderr.splitlines()) == 36, r.stderr
    r = run([llmq_bin, "quantize", "--model", stories_v3, "--gguf-type", "Q4_K_M", "--out", out, "--force", "--quiet"])
    assert r.stderr == "" and "output:" in r.stdout, r.stderr


def test_quiet_everywhere(llmq_bin, stories_v1, stories_v3, tmp_path):
    """--quiet: errors only on stderr (no device, progress, per-layer or info lines); stdout unchanged."""
    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a little cat. It liked to play in the sun. " * 40)
    cmds = [
        ["quantize", "--model", stories_v1, "--out", tmp_path / "q", "--group-size", "4", "--format", "fake"],
        ["quantize", "--model", stories_v1, "--out", tmp_path / "g", "--method", "gptq", "--group-size", "4",
         "--format", "fake", "--calib", text, "--nsamples", "2", "--seqlen", "16"],
        ["calib", "--model", stories_v1, "--calib", text, "--nsamples", "2", "--seqlen", "16", "--out", tmp_path / "s.lcs"],
        ["eval", "--model", stories_v1, "--ppl", text, "--ctx", "64"],
        ["convert", "--model", stories_v3, "--out", tmp_path / "c.gguf", "--dtype", "f16"],
        ["generate", "--model", stories_v1, "--prompt", "Once", "-n", "4"],
        ["inspect", stories_v3],
        ["devices"],
    ]
    for c in cmds:
        loud = run([llmq_bin, *c, *(["--force"] if c[0] in ("quantize", "convert", "calib") else [])])
        quiet = run([llmq_bin, *c, "--quiet", *(["--force"] if c[0] in ("quantize", "convert", "calib") else [])])
        assert quiet.stderr == "", (c, quiet.stderr)
        untimed = [re.sub(r"\d+\.\d+ (s|tokens/s)\b", "T", l) for l in (quiet.stdout, loud.stdout)]
        assert untimed[0] == untimed[1], (c, quiet.stdout, loud.stdout)
        if c[0] in ("quantize", "calib", "eval", "convert"):
            assert loud.stderr, c  # they do log progress without it
    r = run([llmq_bin, "quantize", "--model", stories_v1, "--out", tmp_path / "q", "--quiet", "--format", "fake",
             "--group-size", "4"], check=False)  # exists: the error still shows
    assert r.returncode == 1 and r.stderr.startswith("error:"), r.stderr


def test_quantize_help_explains_the_columns(llmq_bin):
    out = run([llmq_bin, "quantize", "--help"]).stdout
    block = out[out.index("What the columns"):]
    for col in ("err", "werr", "loss", "rtn_err", "ETA", "METHOD", "R x C"):
        assert re.search(rf"^\s+{re.escape(col.strip())}\s", block, re.M), col


def test_eval_ctx_conflicting_with_logits_exits_2(llmq_bin, stories_v1, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("Once upon a time there was a little cat. It liked to play in the sun. " * 40)
    logits = tmp_path / "base.logits"
    run([llmq_bin, "eval", "--model", stories_v1, "--ppl", text, "--ctx", "64", "--save-logits", logits, "--quiet"])
    r = run([llmq_bin, "eval", "--model", stories_v1, "--ppl", text, "--ctx", "128", "--kld", logits], check=False)
    assert r.returncode == 2 and "differs from the context 64" in r.stderr, r.stderr
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
