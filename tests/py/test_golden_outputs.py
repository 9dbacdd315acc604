"""Golden outputs: the sha256 of every file a fixed set of llmq commands writes, against a committed list.

This is the "no output byte changes" guard for refactors: conversions (GGUF <-> HF, f32 / f16 / bf16),
calibration statistics and imatrix files, quantization with rtn / gptq / awq / awq+gptq into fake, awq,
gptq and several GGUF types, the `--json` reports of quantize and eval. Inputs: stories260K (the real
trained 260K model, five blocks, ffn_down 172 wide) and SmolLM2-135M (via its f32 conversion, so no case
requantizes an already quantized tensor), small calibration (a few windows of wikitext-2-valid).

The commands run in a temporary directory with relative output paths (provenance records the paths of
some inputs, e.g. an imatrix file). What is hashed: every file of an output (a directory: each file by its relative name). A JSON report is
hashed after dropping the fields that depend on the machine or the run rather than on the computation:
timings (`seconds`, `tokens_per_s`, quantize's `profile`: seconds by stage), paths (`model`, `base_model`, `output`, `text`) and the device
description; every other key stays, so a changed figure or a renamed key fails the test.

Determinism: llmq's own arithmetic is fixed by its sources (no -march=native, no fast-math, fixed thread
count) but OpenBLAS picks its kernels by CPU, and GPTQ / AWQ / calibration results depend on the sgemm
kernel's summation order. The commands therefore run with OPENBLAS_CORETYPE=Sandybridge (AVX without FMA:
a kernel family every x86-64 CPU since 2011 runs; the test is skipped, saying so, on a CPU without AVX or
on a non-x86 machine) and `--threads 2`.

Regenerate the list (only when an output is meant to change, and say why in the commit):
    LLMQ_GOLDEN_UPDATE=1 ctest --test-dir build -R py_test_golden_outputs
"""
import json
import os
import pathlib
import platform
import subprocess

import pytest

from conftest import SRC

GOLDEN = SRC / "tests" / "golden" / "outputs.sha256"
CORETYPE = "Sandybridge"
DROP_KEYS = {"seconds", "tokens_per_s", "profile", "model", "base_model", "output", "text", "device"}

CAL = ["--calib", "wikitext-2-valid", "--nsamples", "4", "--seqlen", "64", "--seed", "1"]
CAL_M = ["--calib", "wikitext-2-valid", "--nsamples", "2", "--seqlen", "64", "--seed", "1"]
PPL = ["--ppl", "wikitext-2", "--ctx", "128", "--chunks", "3"]

# name -> (argv after `llmq`, output kind). {S1}: stories260K (GGUF v1), {S3}: its v3 twin, {M}: SmolLM2
# Q4_1, {out}: this case's output path, {c:NAME}: the output of case NAME (run first). Outputs: "dir",
# "file" (one file at {out}), or a list of file suffixes written next to {out} ({out}.json etc.).
CASES = {
    # ---- conversions
    "conv_s_hf_f32": (["convert", "--model", "{S1}", "--to", "hf", "--dtype", "f32", "--out", "{out}"], "dir"),
    "conv_s_hf_f16": (["convert", "--model", "{S1}", "--to", "hf", "--dtype", "f16", "--out", "{out}"], "dir"),
    "conv_s_hf_bf16": (["convert", "--model", "{S1}", "--to", "hf", "--dtype", "bf16", "--out", "{out}"], "dir"),
    "conv_s_hf_gguf_f32": (["convert", "--model", "{c:conv_s_hf_f32}", "--dtype", "f32", "--out", "{out}.gguf"],
                           "file"),
    "conv_s_hf_gguf_f16": (["convert", "--model", "{c:conv_s_hf_f32}", "--dtype", "f16", "--out", "{out}.gguf"],
                           "file"),
    "conv_s_hf16_gguf_bf16": (["convert", "--model", "{c:conv_s_hf_f16}", "--dtype", "bf16", "--out",
                               "{out}.gguf"], "file"),
    "conv_s_gguf_f16": (["convert", "--model", "{S3}", "--dtype", "f16", "--out", "{out}.gguf"], "file"),
    "conv_m_gguf_f32": (["convert", "--model", "{M}", "--dtype", "f32", "--out", "{out}.gguf"], "file"),
    "conv_m_hf_bf16": (["convert", "--model", "{M}", "--to", "hf", "--dtype", "bf16", "--out", "{out}"], "dir"),
    # ---- calibration statistics and llama.cpp's legacy imatrix
    "calib_s": (["calib", "--model", "{S1}", *CAL, "--out", "{out}.lcs", "--imatrix-out", "{out}.dat"],
                [".lcs", ".dat"]),
    # ---- directory formats, stories260K (group 4 tiles 64 and 172; fake holds every layer)
    "q_s_rtn_fake": (["quantize", "--model", "{S1}", "--method", "rtn", "--bits", "4", "--group-size", "4",
                      "--format", "fake", "--out", "{out}", "--json", "{out}.json"], "dir+json"),
    "q_s_gptq_fake_ao": (["quantize", "--model", "{S1}", "--method", "gptq", "--bits", "3", "--group-size", "4",
                          "--act-order", "--format", "fake", *CAL, "--out", "{out}", "--json", "{out}.json"],
                         "dir+json"),
    "q_s_gptq_fake_gar": (["quantize", "--model", "{S1}", "--method", "gptq", "--bits", "4", "--group-size", "4",
                           "--act-group-aware", "--sym", "--format", "fake", *CAL, "--out", "{out}", "--json",
                           "{out}.json"], "dir+json"),
    "q_s_awq_fake": (["quantize", "--model", "{S1}", "--method", "awq", "--bits", "4", "--group-size", "4",
                      "--format", "fake", *CAL, "--out", "{out}", "--json", "{out}.json"], "dir+json"),
    "q_s_awqgptq_fake": (["quantize", "--model", "{S1}", "--method", "awq+gptq", "--bits", "4", "--group-size",
                          "4", "--format", "fake", *CAL, "--out", "{out}", "--json", "{out}.json"], "dir+json"),
    "q_s_gptq_fake_fallback": (["quantize", "--model", "{S1}", "--method", "gptq", "--bits", "4", "--group-size",
                                "32", "--fallback", "rtn-per-channel", "--format", "fake", *CAL, "--out", "{out}",
                                "--json", "{out}.json"], "dir+json"),
    # ---- directory formats, SmolLM2 (f32 base; group 64). AWQ's search on all 30 blocks costs minutes even with
    # a few tokens (and ~10x that in the sanitizer build): AWQ and AWQ+GPTQ are covered on stories260K.
    "q_m_rtn_awq": (["quantize", "--model", "{c:conv_m_gguf_f32}.gguf", "--method", "rtn", "--bits", "4",
                     "--group-size", "64", "--format", "awq", "--out", "{out}", "--json", "{out}.json"], "dir+json"),
    "q_m_gptq_gptq_sym_ao": (["quantize", "--model", "{c:conv_m_gguf_f32}.gguf", "--method", "gptq", "--bits", "4",
                              "--group-size", "64", "--sym", "--act-order", "--format", "gptq", *CAL_M, "--out",
                              "{out}", "--json", "{out}.json"], "dir+json"),
    "g_s_q8_0_noprov": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q8_0",
                         "--no-provenance", "--out", "{out}.gguf"], "file"),
    "g_s_q4_k_m_calib": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q4_K_M", *CAL,
                          "--out", "{out}.gguf", "--json", "{out}.json"], "file+json"),
    "g_s_q4_k_m_imatrix": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q4_K_M",
                            "--imatrix", "{c:calib_s}.dat", "--out", "{out}.gguf"], "file"),
    "g_s_q4_0_gptq": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q4_0", "--method", "gptq",
                       *CAL, "--out", "{out}.gguf", "--json", "{out}.json"], "file+json"),
    "g_s_q4_0_gptq_ao": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q4_0", "--method",
                          "gptq", "--act-order", *CAL, "--out", "{out}.gguf"], "file"),
    "g_s_iq4_nl_awq": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "IQ4_NL", "--method",
                        "awq", *CAL, "--out", "{out}.gguf", "--json", "{out}.json"], "file+json"),
    "g_s_q5_1_awqgptq": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q5_1", "--method",
                          "awq+gptq", *CAL, "--out", "{out}.gguf"], "file"),
    "g_s_mix_overrides": (["quantize", "--model", "{S1}", "--format", "gguf", "--gguf-type", "Q4_1",
                           "--tensor-type", "attn_v=Q8_0", "--output-type", "Q6_K", "--embedding-type", "Q5_0",
                           "--out", "{out}.gguf"], "file"),
    "g_m_q4_k_m": (["quantize", "--model", "{c:conv_m_gguf_f32}.gguf", "--format", "gguf", "--gguf-type", "Q4_K_M",
                    "--out", "{out}.gguf"], "file"),
    "e_s_ppl": (["eval", "--model", "{S1}", *PPL, "--json", "{out}.json"], "json"),
    "e_s_gptq_ppl": (["eval", "--model", "{c:q_s_gptq_fake_ao}", *PPL, "--json", "{out}.json"], "json"),
    "e_s_kld": (["eval", "--model", "{c:g_s_q4_k_m_calib}.gguf", "--kld-base", "{S1}", *PPL, "--json",
                 "{out}.json"], "json"),
    "e_s_gptq_protocol": (["eval", "--model", "{c:g_s_q4_0_gptq}.gguf", "--ppl", "wikitext-2", "--protocol", "gptq",
                           "--ctx", "256", "--chunks", "2", "--json", "{out}.json"], "json"),
    "e_m_gptq_dir": (["eval", "--model", "{c:q_m_gptq_gptq_sym_ao}", *PPL, "--json", "{out}.json"], "json"),
    "e_m_awq_dir_emulate": (["eval", "--model", "{c:q_m_rtn_awq}", *PPL, "--emulate", "llamacpp-cpu", "--json",
                             "{out}.json"], "json"),
    "e_m_gguf_kld": (["eval", "--model", "{c:g_m_q4_k_m}.gguf", "--kld-base", "{c:conv_m_gguf_f32}.gguf", *PPL,
                      "--json", "{out}.json"], "json"),
}


def _sha256(data):
    import hashlib
    return hashlib.sha256(data).hexdigest()


def _strip(v):
    if isinstance(v, dict):
        return {k: _strip(x) for k, x in v.items() if k not in DROP_KEYS}
    if isinstance(v, list):
        return [_strip(x) for x in v]
    return v


def json_digest(path):
    """sha256 of a JSON report without timing, path and device fields (key order kept: it is output too)."""
    text = json.dumps(_strip(json.loads(pathlib.Path(path).read_text())), separators=(",", ":"))
    return _sha256(text.encode())


def coretype_supported():
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return "avx" in flags


class Runner:
    def __init__(self, llmq, work, inputs, env, reuse=False):
        self.llmq, self.work, self.inputs, self.env, self.reuse = llmq, pathlib.Path(work), inputs, env, reuse
        self.done = {}

    def out(self, name):
        if name not in self.done:
            argv, kind = CASES[name]
            out = pathlib.Path(name)  # relative to self.work, the cwd of every command: no temp path in an output
            if self.reuse and self._written(self.work / out, kind):  # regeneration only (LLMQ_GOLDEN_WORK)
                self.done[name] = out
                return out
            args = [self._subst(a, out) for a in argv]
            threads = [] if argv[0] == "convert" else ["--threads", "2"]  # convert has no threads
            r = subprocess.run([str(self.llmq), *args, *threads], env=self.env, capture_output=True, text=True,
                               cwd=self.work)
            assert r.returncode == 0, f"case {name}: llmq {' '.join(args)}\nexit {r.returncode}\n{r.stderr[-3000:]}"
            self.done[name] = out
        return self.done[name]

    @staticmethod
    def _written(out, kind):
        if isinstance(kind, list):
            return all(pathlib.Path(f"{out}{suf}").exists() for suf in kind)
        ok = (not kind.startswith("dir") or (out / "config.json").exists())
        ok = ok and (not kind.startswith("file") or pathlib.Path(f"{out}.gguf").exists())
        return ok and (not kind.endswith("json") or pathlib.Path(f"{out}.json").exists())

    def _subst(self, a, out):
        while "{c:" in a:
            i = a.index("{c:")
            j = a.index("}", i)
            a = a[:i] + str(self.out(a[i + 3:j])) + a[j + 1:]
        return a.format(out=out, **self.inputs)

    def digests(self, name):
        """[(key, sha256)] of case NAME's outputs, sorted by key."""
        out = self.work / self.out(name)
        kind = CASES[name][1]
        rows = []
        if isinstance(kind, list):
            for suf in kind:
                rows.append((f"{name}{suf}", _sha256(pathlib.Path(f"{out}{suf}").read_bytes())))
            return rows
        if kind.startswith("dir"):
            for p in sorted(out.rglob("*")):
                # the marker of a directory llmq wrote (common/io.h LLMQ_OUTDIR_MARKER): fixed text, not model bytes
                if p.is_file() and p.name != ".llmq-output":
                    rows.append((f"{name}/{p.relative_to(out)}", _sha256(p.read_bytes())))
        if kind.startswith("file"):
            rows.append((f"{name}.gguf", _sha256(pathlib.Path(f"{out}.gguf").read_bytes())))
        if kind.endswith("json"):
            rows.append((f"{name}.json", json_digest(f"{out}.json")))
        return rows


def read_golden():
    rows = {}
    if GOLDEN.exists():
        for line in GOLDEN.read_text().splitlines():
            if line and not line.startswith("#"):
                sha, key = line.split(None, 1)
                rows[key] = sha
    return rows


@pytest.fixture(scope="module")
def runner(llmq_bin, data_dir, smollm2, tmp_path_factory):
    if not coretype_supported():
        pytest.skip(f"needs an x86-64 CPU with AVX (OpenBLAS kernel family {CORETYPE} is pinned for the goldens)")
    env = {**os.environ, "LLMQ_DATA": str(data_dir), "OPENBLAS_CORETYPE": CORETYPE}
    inputs = {"S1": data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.gguf",
              "S3": data_dir / "models" / "stories260K" / "tinyllamas-stories-260k-f32.v3.gguf",
              "M": smollm2}
    work = os.environ.get("LLMQ_GOLDEN_WORK")  # regeneration: a directory whose finished outputs are reused
    if work and os.environ.get("LLMQ_GOLDEN_UPDATE") != "1":
        pytest.fail("LLMQ_GOLDEN_WORK is only for regenerating the list (with LLMQ_GOLDEN_UPDATE=1)")
    r = Runner(llmq_bin, work or tmp_path_factory.mktemp("golden"), inputs, env, reuse=bool(work))
    yield r
    if os.environ.get("LLMQ_GOLDEN_UPDATE") == "1":
        rows = []
        for name in CASES:
            rows += r.digests(name)
        head = ("# sha256 of llmq's outputs for the commands in tests/py/test_golden_outputs.py\n"
                f"# (OPENBLAS_CORETYPE={CORETYPE}, --threads 2). Regenerate: LLMQ_GOLDEN_UPDATE=1.\n")
        GOLDEN.write_text(head + "".join(f"{sha}  {key}\n" for key, sha in rows))


@pytest.mark.parametrize("name", list(CASES))
def test_golden(runner, name):
    got = runner.digests(name)
    if os.environ.get("LLMQ_GOLDEN_UPDATE") == "1":
        return
    want = read_golden()
    expect = sorted((k, v) for k, v in want.items() if k == name or k.startswith(name + "/") or
                    k.startswith(name + "."))
    assert expect, f"no golden rows for case {name} in {GOLDEN} (regenerate with LLMQ_GOLDEN_UPDATE=1)"
    bad = [f"{k}: got {g}, golden {want.get(k)}" for k, g in got if want.get(k) != g]
    missing = sorted(set(k for k, _ in expect) - set(k for k, _ in got))
    assert not bad and not missing, "outputs changed:\n" + "\n".join(bad + [f"{k}: not written" for k in missing])
