"""Runs lm-evaluation-harness (HF backend, CPU, float32) on local task YAMLs and writes per-item results.

Run with the venv that has torch, transformers and lm-eval ($LLMQ_HF_PYTHON), offline:
    lmeval_run.py MODEL_DIR TASK_DIR OUT.json LIMIT NAME=LMEVAL_TASK ...
OUT.json: {name: {"acc": .., "acc_norm": .., "perplexity": .., "items": [{"doc_id", "lls": [..],
"greedy": [..], "acc", "acc_norm"}]}} in doc order.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    model_dir, task_dir, out, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    pairs = dict(a.split("=", 1) for a in sys.argv[5:])
    import torch
    import lm_eval
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(int(os.environ.get("LLMQ_THREADS", "2")))
    tm = TaskManager(include_path=task_dir, include_defaults=False)
    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32,device=cpu",
                                  tasks=list(pairs.values()), task_manager=tm, limit=limit, log_samples=True,
                                  batch_size=int(os.environ.get("LLMQ_LMEVAL_BATCH", "16")), bootstrap_iters=0)
    outd = {}
    for name, task in pairs.items():
        r = res["results"][task]
        items = []
        for s in sorted(res["samples"][task], key=lambda s: s["doc_id"]):
            resps = [x[0] if isinstance(x, list) and len(x) == 1 else x for x in s["filtered_resps"]]
            items.append({"doc_id": s["doc_id"], "lls": [float(x[0]) for x in resps],
                          "greedy": [bool(x[1]) for x in resps], "acc": s.get("acc"),
                          "acc_norm": s.get("acc_norm"), "perplexity": s.get("perplexity")})
        outd[name] = {"acc": r.get("acc,none"), "acc_norm": r.get("acc_norm,none"),
                      "perplexity": r.get("perplexity,none"), "items": items}
    with open(out, "w") as f:
        json.dump(outd, f)


if __name__ == "__main__":
    main()
