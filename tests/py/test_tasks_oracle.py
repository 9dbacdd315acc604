"""Zero-shot accuracy (`llmq eval --tasks`, calib/eval/tasks.h) against the real tools.

- lm-evaluation-harness 0.4.13 itself (HF backend, CPU, float32; $LLMQ_HF_PYTHON) on the HF directory of
  SmolLM2 that `llmq convert` makes from the test GGUF, every task through a YAML that includes lm-eval's own
  task YAML and points it at the shipped file (tests/py/task_data.py): with --protocol lm-eval, per task on
  the first N items (N = 200, $LLMQ_TASKS_ORACLE_N), llmq's chosen answer (argmax of the summed
  log-likelihoods) equals lm-eval's on >= 99% of the items, acc / acc_norm / lambada's perplexity agree
  (0.5 points; 1% relative), and every per-choice log-likelihood is close.
  lm-eval's outputs are cached in $LLMQ_CACHE/lmeval-cache keyed by the sha256 of the model, the task
  files and N (lm-eval itself takes minutes on 2 cores).
- llama.cpp's llama-perplexity (built by bench/llama_tools.sh into $LLMQ_CACHE/llama-tools-0.3.36; skipped
  when it is not there): --hellaswag, --winogrande and --multiple-choice (ARC-Easy, ARC-Challenge, PIQA in
  its binary format) on the SmolLM2 GGUF at f32 and at Q4_K_M (made by llama-quantize), N tasks each
  (N = 400, $LLMQ_TASKS_LLAMA_N) as llama-perplexity selects them; llmq with --protocol llamacpp --emulate
  llamacpp-cpu --limit N --llamacpp-parallel 8 (the -np both run with) evaluates the same items in the same order: per-item correctness equal on >= 99%
  and the accuracy within 0.5 points. (llama-perplexity prints, per item, the running accuracy for
  hellaswag and multiple choice, from which each item's correctness follows, and the choice itself for
  winogrande.)
  Known to fail (every q4_k_m case but hellaswag, 99.00%): winogrande, 365 / 400 = 91.25% equal choices (llama.cpp
  against itself at -np 16: 395 / 400), piqa 96.75%, arc-challenge 98.25% (acc +0.75 points), and arc-easy,
  388 / 400 = 97.0% equal (llmq acc 46.00, llama.cpp 45.00; measured 2026-12-03,
  the fix for llama.cpp's flash-attention vector path included; 96.75% without it). The per-choice scores differ
  by a median of 0.14 there, as much as llmq's own with and without --emulate: llama.cpp's 8-bit activation
  rounding turns one ulp of another summation order into whole rounding steps that spread through the layers, so
  only a bit-identical replay of ggml's kernels would agree item by item on a quantized file. llama.cpp against
  itself at -np 16 instead of 8: 396 / 400, median 0.012. (f32: 400 / 400, median 7.6e-4.) Measured with a
  llama-perplexity that prints each task's per-choice scores (a LOG line added next to its running accuracy).
"""
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import task_data
from conftest import run

TASKS = ["arc-easy", "arc-challenge", "piqa", "winogrande", "hellaswag", "lambada"]
CACHE = Path(os.environ.get("LLMQ_CACHE", Path.home() / ".cache" / "llmq"))
N_LMEVAL = int(os.environ.get("LLMQ_TASKS_ORACLE_N", "200"))
N_LLAMA = int(os.environ.get("LLMQ_TASKS_LLAMA_N", "400"))
THREADS = os.environ.get("LLMQ_THREADS", "2")
NP = "8"  # llama-perplexity -np, and llmq's --llamacpp-parallel (which items share a batch: calib/eval/tasks.h)


def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


@pytest.fixture(scope="module")
def smol(llmq_bin, smollm2, tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    hf, f32 = d / "smol-hf", d / "smol-f32.gguf"
    run([llmq_bin, "convert", "--model", smollm2, "--out", hf, "--to", "hf", "--quiet"])
    run([llmq_bin, "convert", "--model", smollm2, "--out", f32, "--to", "gguf", "--quiet"])
    return {"dir": d, "hf": hf, "f32": f32}


def llmq_tasks(llmq_bin, model, out, tasks, extra):
    run([llmq_bin, "eval", "--model", model, "--tasks", tasks, "--threads", THREADS, "--json", out,
         "--json-items", "--quiet"] + extra)
    return {t["task"]: t for t in json.loads(Path(out).read_text())["tasks"]}


# ---- the CLI contract (light) -------------------------------------------------------------------------------

@pytest.mark.parametrize("args, msg", [
    (["--model", "m", "--tasks", "piqa,mmlu"], "unknown task 'mmlu'"),
    (["--model", "m", "--tasks", "piqa,piqa"], "given twice"),
    (["--model", "m", "--tasks", "all", "--protocol", "gptq"], "--protocol gptq applies to --ppl"),
    (["--model", "m", "--ppl", "t", "--limit", "3"], "need --tasks"),
    (["--model", "m", "--tasks", "all", "--limit", "0"], "--limit"),
    (["--model", "m", "--tasks", "all", "--json-items"], "--json-items needs --json"),
    (["--model", "m", "--tasks", "all", "--llamacpp-parallel", "0"], "--llamacpp-parallel must be between 1 and 256"),
])
def test_usage_errors(llmq_bin, args, msg):
    r = run([llmq_bin, "eval", *args], check=False)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_bad_task_file_names_file_and_line(llmq_bin, stories_v3, tmp_path):
    f = tmp_path / "arc.jsonl"
    f.write_text('{"question": {"stem": "q", "choices": [{"text": "a", "label": "A"}, {"text": "b", "label": "B"}]},'
                 ' "answerKey": "A"}\n{"question": {"stem": "q"}}\n')
    r = run([llmq_bin, "eval", "--model", stories_v3, "--tasks", f"arc-easy={f}"], check=False)
    assert r.returncode == 1 and f"{f}:2:" in r.stderr, r.stderr
    h = tmp_path / "hs.txt"
    h.write_text("ctx\n1\na\nb\nc\n")
    r = run([llmq_bin, "eval", "--model", stories_v3, "--tasks", f"hellaswag={h}"], check=False)
    assert r.returncode == 1 and "multiple of 6" in r.stderr, r.stderr


@pytest.mark.parametrize("protocol", ["lm-eval", "llamacpp"])
def test_items_do_not_depend_on_the_batching(llmq_bin, stories_v3, tmp_path, protocol):
    """The same items evaluated in other forward-call packings (another --limit packs other sequences together)
    get the same per-choice scores; the summary is the mean of the per-item verdicts."""
    def ev(limit, name):
        out = tmp_path / name
        run([llmq_bin, "eval", "--model", stories_v3, "--tasks", "arc-easy,winogrande,lambada", "--protocol",
             protocol, "--limit", str(limit), "--json", out, "--json-items", "--threads", "2", "--seed", "7"])
        return {t["task"]: t for t in json.loads(out.read_text())["tasks"]}
    a, b = ev(12, "a.json"), ev(40, "b.json")
    for t, ta in a.items():
        assert ta["items"] == 12 and len(ta["per_item"]) == 12
        assert ta["acc"] == pytest.approx(np.mean([i["pred"] == i["gold"] for i in ta["per_item"]]))
        by_index = {i["index"]: i for i in b[t]["per_item"]}
        common = [i for i in ta["per_item"] if i["index"] in by_index]
        assert len(common) == 12  # the first 12 draws of the seeded stream are the same
        for i in common:
            assert np.allclose(i["scores"], by_index[i["index"]]["scores"], rtol=1e-5, atol=1e-4), (t, i)
    assert any(len(v["per_item"]) for v in a.values())


@pytest.mark.parametrize("model", ["stories", "smollm2"])
@pytest.mark.parametrize("protocol", ["lm-eval", "llamacpp"])
def test_prefix_reuse_same_scores(llmq_bin, stories_v3, smollm2, tmp_path, protocol, model):
    """The shared prefix of an item run once (the default) against every choice from position 0
    (--no-prefix-reuse, the path before prefix reuse): the same per-item choices and per-choice scores within the
    bound of test_items_do_not_depend_on_the_batching (f32 rounding of other call shapes), and fewer tokens through
    the model on every multiple-choice task. Without emulation: its f16 / int8 roundings turn such rounding into
    whole steps (about 2% of a score under --emulate llamacpp-cpu on a Q4_1 file, as another --limit's batching
    does to the same item)."""
    path = stories_v3 if model == "stories" else smollm2
    tasks = "all" if model == "stories" else "hellaswag,arc-challenge,winogrande"
    limit = "20" if model == "stories" else "8"

    def ev(name, extra):
        out = tmp_path / name
        run([llmq_bin, "eval", "--model", path, "--tasks", tasks, "--protocol", protocol, "--limit", limit,
             "--json", out, "--json-items", "--threads", "2", "--quiet"] + extra)
        return {t["task"]: t for t in json.loads(out.read_text())["tasks"]}
    new, old = ev("reuse.json", []), ev("whole.json", ["--no-prefix-reuse"])
    worst = 0.0
    for t, tn in new.items():
        to = old[t]
        assert [i["index"] for i in tn["per_item"]] == [i["index"] for i in to["per_item"]], t
        for a, b in zip(tn["per_item"], to["per_item"]):
            assert a["pred"] == b["pred"] and a.get("pred_norm") == b.get("pred_norm"), (t, a, b)
            assert np.allclose(a["scores"], b["scores"], rtol=1e-5, atol=1e-4), (t, a, b)
            worst = max(worst, float(np.max(np.abs(np.array(a["scores"]) - b["scores"]) / np.abs(b["scores"]))))
        assert tn["acc"] == to["acc"] and tn.get("acc_norm") == to.get("acc_norm"), t
        if t == "lambada":  # one choice: nothing to share
            assert tn["tokens"] == to["tokens"], t
        else:
            assert tn["tokens"] < to["tokens"], (t, tn["tokens"], to["tokens"])
    print(f"{model} {protocol}: max relative score difference {worst:.2e}")


# ---- lm-evaluation-harness -------------------------------------------------------------------------------

def lmeval_results(smol, n):
    py = os.environ.get("LLMQ_HF_PYTHON", str(CACHE / "venv-hf" / "bin" / "python"))
    if not Path(py).exists():
        pytest.skip(f"no Python with lm-eval (LLMQ_HF_PYTHON={py} does not exist)")
    probe = run([py, "-c", "import lm_eval, os; print(os.path.dirname(lm_eval.__file__), lm_eval.__version__)"],
                check=False)
    if probe.returncode != 0:
        pytest.skip(f"lm-eval is not installed in {py} (tests/requirements-hf.txt)")
    pkg, version = probe.stdout.split()
    key = hashlib.sha256()
    key.update(sha256_file(smol["hf"] / "model.safetensors").encode())
    key.update(sha256_file(smol["hf"] / "tokenizer.json").encode())
    for t in TASKS + ["piqa-labels"]:
        key.update(task_data.read_text(t).encode())
    key.update(f"{version} {n}".encode())
    cached = CACHE / "lmeval-cache" / f"{key.hexdigest()}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    tdir = smol["dir"] / "lmeval-tasks"
    names = task_data.lmeval_task_dir(tdir, TASKS, pkg)
    out = smol["dir"] / "lmeval.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(smol["dir"] / "hf-datasets"), LLMQ_THREADS=THREADS)
    run([py, Path(__file__).with_name("lmeval_run.py"), smol["hf"], tdir, out, n]
        + [f"{t}={names[t]}" for t in TASKS], env=env)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(out.read_text())
    tmp.rename(cached)
    return json.loads(out.read_text())


@pytest.mark.heavy
def test_lmeval_protocol(llmq_bin, smol):
    ref = lmeval_results(smol, N_LMEVAL)
    ours = llmq_tasks(llmq_bin, smol["hf"], smol["dir"] / "llmq-lmeval.json", ",".join(TASKS),
                      ["--protocol", "lm-eval", "--limit", str(N_LMEVAL)])
    report, bad = [], []
    for t in TASKS:
        r, o = ref[t], ours[t]
        assert len(r["items"]) == N_LMEVAL and o["items"] == N_LMEVAL, t
        agree, max_dll = 0, 0.0
        for ri, oi in zip(r["items"], o["per_item"], strict=True):
            assert ri["doc_id"] == oi["index"], t
            lls = np.array(ri["lls"])
            if t == "lambada":
                agree += ri["greedy"][0] == oi["greedy"]
            else:
                agree += int(np.argmax(lls)) == oi["pred"]
            max_dll = max(max_dll, float(np.max(np.abs(lls - np.array(oi["scores"])))))
        frac = agree / N_LMEVAL
        d_acc = 100 * abs(r["acc"] - o["acc"])
        line = f"{t}: choices agree {100 * frac:.1f}%, acc {100 * o['acc']:.2f} vs {100 * r['acc']:.2f}"
        if r["acc_norm"] is not None:
            line += f", acc_norm {100 * o['acc_norm']:.2f} vs {100 * r['acc_norm']:.2f}"
            if 100 * abs(r["acc_norm"] - o["acc_norm"]) > 0.5:
                bad.append(f"{t} acc_norm")
        if r["perplexity"] is not None:
            line += f", ppl {o['ppl']:.4f} vs {r['perplexity']:.4f}"
            if abs(o["ppl"] / r["perplexity"] - 1) > 0.01:
                bad.append(f"{t} ppl")
        line += f", max |d ll| {max_dll:.2e}"
        report.append(line)
        if frac < 0.99:
            bad.append(f"{t} choices")
        if d_acc > 0.5:
            bad.append(f"{t} acc")
        if max_dll > 0.05:  # float32 on both sides over <= ~100-token continuations
            bad.append(f"{t} log-likelihoods")
    print("\n".join(report))
    assert not bad, "\n".join(report + bad)


# ---- llama.cpp ------------------------------------------------------------------------------------------

def llama_bin(name):
    if N_LLAMA == 0:
        pytest.skip("LLMQ_TASKS_LLAMA_N=0: the llama-perplexity cases are switched off (.ci/run does: a cached tool "
                    "built on another CPU may not run here, and 400 items take hours on 2 cores)")
    p = CACHE / "llama-tools-0.3.36" / "bin" / name
    if not p.exists():
        pytest.skip(f"{p} is not built (bench/llama_tools.sh builds it: ~10 min on 2 cores)")
    return p


@pytest.fixture(scope="module")
def q4km(smol):
    out = smol["dir"] / "smol-q4_k_m.gguf"
    run([llama_bin("llama-quantize"), smol["f32"], out, "Q4_K_M", THREADS])
    return out


def running_correct(values, scale):
    """Per-item correctness from llama-perplexity's running accuracy lines (value = 100 * correct / i)."""
    out, prev = [], 0
    for i, v in enumerate(values, 1):
        k = round(v * i / scale)
        out.append(k - prev)
        prev = k
    assert all(x in (0, 1) for x in out)
    return out


def perplexity_run(model, args):
    r = run([llama_bin("llama-perplexity"), "-m", model, "-t", THREADS, "-np", NP, "--no-warmup"] + args)
    return r.stdout + r.stderr


def case_inputs(smol, task):
    """(llama-perplexity args, llmq --tasks entry, item indices of the llmq file in llama.cpp's file order)."""
    d = smol["dir"]
    if task == "hellaswag":
        f = d / "hellaswag.txt"
        f.write_text(task_data.read_text("hellaswag"))
        return ["-f", f, "--hellaswag", "--hellaswag-tasks", str(N_LLAMA)], "hellaswag"
    if task == "winogrande":
        csv, js = d / "winogrande.csv", d / "winogrande-kept.jsonl"
        kept, _ = task_data.winogrande_csv(csv)
        # -f drops the file's final '\n' (common/arg.cpp), and load_winogrande_from_csv then stops at the eof of
        # the last line without reading it: llama-perplexity never sees the last row
        kept = kept[:-1]
        items = task_data.jsonl("winogrande")
        js.write_text("".join(json.dumps(items[i]) + "\n" for i in kept))
        return ["-f", csv, "--winogrande", "--winogrande-tasks", str(N_LLAMA)], f"winogrande={js}"
    f = d / f"{task}.bin"
    task_data.multiple_choice_bin(f, task)
    return ["-bf", f, "--multiple-choice", "--multiple-choice-tasks", str(N_LLAMA)], task


@pytest.mark.heavy
@pytest.mark.parametrize("task", ["hellaswag", "winogrande", "arc-easy", "arc-challenge", "piqa"])
@pytest.mark.parametrize("quant", ["f32", "q4_k_m"])
def test_llamacpp_protocol(llmq_bin, smol, request, task, quant):
    model = smol["f32"] if quant == "f32" else request.getfixturevalue("q4km")
    args, entry = case_inputs(smol, task)
    log = perplexity_run(model, args)
    ours = llmq_tasks(llmq_bin, model, smol["dir"] / f"llmq-{task}-{quant}.json", entry,
                      ["--protocol", "llamacpp", "--emulate", "llamacpp-cpu", "--limit", str(N_LLAMA),
                       "--llamacpp-parallel", NP])
    o = next(iter(ours.values()))
    mine = [int(it["pred"] == it["gold"]) for it in o["per_item"]]
    if task == "hellaswag":
        vals = [float(m.group(2)) for m in re.finditer(r"^(\d+)\t([\d.]+)%\t\[", log, re.M)]
        theirs = running_correct(vals, 100)
    elif task == "winogrande":
        rows = re.findall(r"^(\d+)\t([\d.]+)\t\s*(-?[\d.]+)\s+(-?[\d.]+)\s+(\d)\s+(\d)$", log, re.M)
        theirs = [int(r[4] == r[5]) for r in rows]
        their_pred = [int(r[4]) - 1 for r in rows]
        same_pred = np.mean([p == it["pred"] for p, it in zip(their_pred, o["per_item"], strict=True)])
        assert same_pred >= 0.99, f"{quant} winogrande: chosen option equal on {100 * same_pred:.1f}%"
    else:
        vals = [float(m.group(2)) for m in re.finditer(r"^(\d+)\t([\d.]+)$", log, re.M)]
        theirs = running_correct(vals, 100)
    n = min(N_LLAMA, o["items_in_file"])
    assert len(theirs) == n and len(mine) == n, (task, len(theirs), len(mine), log[-2000:])
    same = np.mean(np.array(theirs) == np.array(mine))
    acc_l, acc_m = 100 * np.mean(theirs), 100 * np.mean(mine)
    print(f"{quant} {task}: per-item correctness equal on {100 * same:.2f}% of {n}, acc llmq {acc_m:.2f} vs "
          f"llama.cpp {acc_l:.2f} (gap {acc_m - acc_l:+.2f} points)")
    assert same >= 0.99 and abs(acc_m - acc_l) <= 0.5, (quant, task, same, acc_m, acc_l)
