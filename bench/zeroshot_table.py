#!/usr/bin/env python3
"""bench/zeroshot_table.py WORK MODEL... — the markdown tables of bench/zeroshot.sh from its WORK directory.
   bench/zeroshot_table.py --cut SRC DST N — SRC's report cut to its first N items (see cut()).

Reads WORK/eval_<model>.json (`llmq eval --tasks ... --json --json-items`) for each MODEL (the first is the
base; a model without its JSON, or with another protocol / limit / seed than the base's, is listed as not
evaluated, so a partial run prints a partial table) and prints:
  1. per task acc ± stderr (and acc_norm ± stderr where the task defines it), in %, LAMBADA's perplexity of
     the last word ± its stderr, then the mean acc over the tasks;
  2. per task the change against the base in points, ± the standard error of the paired difference: for
     item i, d_i = correct_model(i) − correct_base(i) over the items both runs scored, SE = sd(d) / sqrt(n)
     (sd with n − 1, as lm-eval's stderr of the mean). A change beyond 2 SE is in bold. The paired SE is much
     smaller than the two rows' own stderrs combined because both models get mostly the same items right.
"""
import json
import math
import os
import sys


def correct(task, item, norm):
    if task == "lambada":
        return 1.0 if item["greedy"] else 0.0
    return 1.0 if item["pred_norm" if norm else "pred"] == item["gold"] else 0.0


def paired(task, base_items, items, norm):
    """(mean difference, its standard error, n) over the items both lists have, by index."""
    by_index = {it["index"]: it for it in base_items}
    d = [correct(task, it, norm) - correct(task, by_index[it["index"]], norm)
         for it in items if it["index"] in by_index]
    n = len(d)
    if n < 2:
        return float("nan"), float("nan"), n
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, math.sqrt(var / n), n


def cut(src, dst, n):
    """Write to dst the report of src (a --json-items run of the first L items) cut to its first n < L items:
    every figure recomputed from the per-item choices (acc, acc_norm, lm-eval's stderr with n - 1, LAMBADA's
    perplexity exp(-mean log-likelihood) and its delta-method stderr); tokens and seconds are dropped (they
    were the longer run's); cut_from_limit records L."""
    with open(src) as f:
        j = json.load(f)
    if j["task_seed"] is not None or j["task_limit"] != -1 and j["task_limit"] <= n:
        sys.exit(f"zeroshot_table: {src} is not a first-N run of more than {n} items")

    def mean_se(xs):
        m = sum(xs) / len(xs)
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))

    for t in j["tasks"]:
        items = [it for it in t["per_item"] if it["index"] < n]
        t["per_item"], t["items"] = items, len(items)
        t["acc"], t["acc_stderr"] = mean_se([correct(t["task"], it, False) for it in items])
        if "acc_norm" in t:
            t["acc_norm"], t["acc_norm_stderr"] = mean_se([correct(t["task"], it, True) for it in items])
        if "ppl" in t:
            m, se = mean_se([it["scores"][0] for it in items])
            t["ppl"], t["ppl_stderr"] = math.exp(-m), math.exp(-m) * se
        for k in ("tokens", "seconds", "tokens_per_s"):
            t.pop(k, None)
    j["cut_from_limit"], j["task_limit"] = j["task_limit"], n
    with open(dst + ".part", "w") as f:
        json.dump(j, f, indent=1)
    os.replace(dst + ".part", dst)


def label(m):
    return m.replace("_", " ") + ("" if m == "base" else "-bit")


def main():
    if sys.argv[1] == "--cut":
        cut(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    work, models = sys.argv[1], sys.argv[2:]
    reports, settings = {}, {}
    for m in models:
        path = f"{work}/eval_{m}.json"
        if os.path.exists(path):
            with open(path) as f:
                j = json.load(f)
            reports[m] = {t["task"]: t for t in j["tasks"]}
            settings[m] = (j["task_protocol"], j["task_limit"], j["task_seed"])
    base = models[0]
    if base not in reports:
        sys.exit(f"zeroshot_table: no {work}/eval_{base}.json")
    tasks = list(reports[base])
    for m in list(reports):
        if settings[m] != settings[base]:
            sys.stderr.write(f"zeroshot_table: {m} left out: protocol / limit / seed {settings[m]}, "
                             f"the base's {settings[base]}\n")
            del reports[m]
    cols = [(t, n) for t in tasks for n in (False, True) if not n or "acc_norm" in reports[base][t]]

    head = ["model"] + [f"{t} {'acc_norm' if n else 'acc'} ({reports[base][t]['items']})" for t, n in cols]
    ppl = [t for t in tasks if "ppl" in reports[base][t]]
    head += [f"{t} ppl" for t in ppl]
    print("| " + " | ".join(head + ["mean acc"]) + " |")
    print("|" + "---|" * (len(head) + 1))
    for m in models:
        if m not in reports:
            print("| " + " | ".join([label(m)] + ["not evaluated"] * (len(head))) + " |")
            continue
        row, accs = [label(m)], []
        for t, n in cols:
            r = reports[m][t]
            key = "acc_norm" if n else "acc"
            row.append(f"{100 * r[key]:.2f} ± {100 * r[key + '_stderr']:.2f}")
            if not n:
                accs.append(r["acc"])
        row += [f"{reports[m][t]['ppl']:.2f} ± {reports[m][t]['ppl_stderr']:.2f}" for t in ppl]
        row.append(f"{100 * sum(accs) / len(accs):.2f}")
        print("| " + " | ".join(row) + " |")

    print("\nChange against the base, points ± the paired standard error (bold: beyond 2 SE):\n")
    print("| " + " | ".join(["model"] + [f"{t} {'acc_norm' if n else 'acc'}" for t, n in cols]) + " |")
    print("|" + "---|" * (len(cols) + 1))
    for m in models[1:]:
        if m not in reports:
            continue
        row = [label(m)]
        for t, n in cols:
            mean, se, _ = paired(t, reports[base][t]["per_item"], reports[m][t]["per_item"], n)
            cell = f"{100 * mean:+.2f} ± {100 * se:.2f}"
            row.append(f"**{cell}**" if abs(mean) > 2 * se else cell)
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
