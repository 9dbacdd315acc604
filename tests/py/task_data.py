"""Task files of calib/eval/tasks.h rewritten into the formats the reference tools read.

- lm-evaluation-harness: the Hugging Face schemas its own task YAMLs expect (allenai/ai2_arc, baber/piqa,
  allenai/winogrande, Rowan/hellaswag, EleutherAI/lambada_openai), as jsonl, plus a task YAML per task that
  `include`s lm-eval's YAML and only points it at the local file.
- llama.cpp's llama-perplexity: the hellaswag 6-line text (as shipped), the winogrande CSV
  (index,sentence,option1,option2,answer), and the --multiple-choice binary file
  (tools/perplexity/perplexity.cpp multiple_choice_task::deserialize: u32 n_task, u32 offsets[n_task],
  then per task: string question, mc1 {u32 n, n strings, n i32 labels}, mc2 {same}; a string is
  u32 length + bytes).

Every conversion keeps the strings both tools will read identical to what llmq builds from the original
file (the header of calib/eval/tasks.h states llmq's rules).
"""
import gzip
import json
import os
import struct
from pathlib import Path

SRC = Path(os.environ.get("LLMQ_SRC", Path(__file__).resolve().parents[2]))
MANIFEST_FILES = {
    "hellaswag": ["data/hellaswag.part1.txt.gz", "data/hellaswag.part2.txt.gz"],
    "arc-easy": ["data/arc-easy.jsonl.gz"],
    "arc-challenge": ["data/arc-challenge.jsonl.gz"],
    "piqa": ["data/piqa.jsonl.gz"],
    "piqa-labels": ["data/piqa-labels.lst.gz"],
    "winogrande": ["data/winogrande.jsonl.gz"],
    "lambada": ["data/lambada.jsonl.gz"],
}
LMEVAL_TASK = {"hellaswag": "hellaswag/hellaswag.yaml", "arc-easy": "arc/arc_easy.yaml",
               "arc-challenge": "arc/arc_challenge.yaml", "piqa": "piqa/piqa.yaml",
               "winogrande": "winogrande/default.yaml", "lambada": "lambada/lambada_openai.yaml"}
LMEVAL_SPLIT = {"hellaswag": "validation_split", "arc-easy": "test_split", "arc-challenge": "test_split",
                "piqa": "validation_split", "winogrande": "validation_split", "lambada": "test_split"}


def read_text(name):
    """The shipped dataset's bytes (gzip parts concatenated), as str."""
    data = b"".join(gzip.decompress((SRC / "datasets" / p).read_bytes()) for p in MANIFEST_FILES[name])
    return data.decode("utf-8")


def jsonl(name):
    return [json.loads(line) for line in read_text(name).splitlines() if line.strip()]


def hellaswag_items():
    lines = read_text("hellaswag").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [{"ctx": lines[i], "label": int(lines[i + 1]), "endings": lines[i + 2:i + 6]}
            for i in range(0, len(lines), 6)]


def winogrande_split(d):
    """An llm-foundry item as the original schema: sentence with '_', option1, option2 (their
    concatenations with the text before '_' are the item's context_options)."""
    a, b = d["context_options"]
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    first = a[:k]
    assert "_" not in first, d
    return first, a[k:], b[k:]


# ---- lm-evaluation-harness ---------------------------------------------------------------------------

def lmeval_docs(task):
    """Docs in the Hugging Face schema lm-eval's own YAML for `task` reads."""
    if task in ("arc-easy", "arc-challenge"):
        return [{"id": d["id"], "question": d["question"]["stem"],
                 "choices": {"text": [c["text"] for c in d["question"]["choices"]],
                             "label": [c["label"] for c in d["question"]["choices"]]},
                 "answerKey": d["answerKey"]} for d in jsonl(task)]
    if task == "piqa":
        labels = [int(x) for x in read_text("piqa-labels").split()]
        return [dict(d, label=l) for d, l in zip(jsonl("piqa"), labels, strict=True)]
    if task == "winogrande":
        out = []
        for d in jsonl("winogrande"):
            first, o1, o2 = winogrande_split(d)
            out.append({"sentence": first + "_ " + d["continuation"], "option1": o1, "option2": o2,
                        "answer": str(d["gold"] + 1)})
        return out
    if task == "hellaswag":
        out = []
        for it in hellaswag_items():
            label, _, rest = it["ctx"].partition(": ")
            # utils.process_docs: preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize());
            # with ctx_b = "" the trailing space is stripped again: the query is preprocess(line 1)
            out.append({"activity_label": label, "ctx_a": rest, "ctx_b": "", "endings": it["endings"],
                        "label": str(it["label"])})
        return out
    if task == "lambada":
        return [{"text": d["context"] + " " + d["continuation"]} for d in jsonl("lambada")]
    raise KeyError(task)


def lmeval_task_dir(dst, tasks, lm_eval_pkg):
    """Writes per task a jsonl and a YAML `llmq_<task>` including lm-eval's own YAML; returns the names."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    names = {}
    for t in tasks:
        data = dst / f"{t}.jsonl"
        with open(data, "w") as f:
            for d in lmeval_docs(t):
                f.write(json.dumps(d) + "\n")
        split = LMEVAL_SPLIT[t]
        name = "llmq_" + t.replace("-", "_")
        inc = Path(lm_eval_pkg) / "tasks" / LMEVAL_TASK[t]
        (dst / f"{name}.yaml").write_text(
            f"include: {inc}\ntask: {name}\ntag: []\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    data: {data}\n{split}: data\n"
            + "".join(f"{k}: null\n" for k in ("training_split", "validation_split", "test_split")
                      if k != split))
        names[t] = name
    return names


# ---- llama.cpp's llama-perplexity ---------------------------------------------------------------------

def winogrande_csv(dst):
    """llama.cpp's CSV; llmq's llamacpp strings from the jsonl are first + option + second with second =
    " " + continuation (no space before . , ; : ! ?), which is what this file spells. Quotes: the sentence is
    quoted when it holds a comma (llama.cpp's parser); options with commas or quotes are not representable."""
    rows, skipped = [], []
    for i, d in enumerate(jsonl("winogrande")):
        first, o1, o2 = winogrande_split(d)
        c = d["continuation"]
        second = c if c[:1] in tuple(".,;:!?") else " " + c
        sent = first + "_" + second
        if any(x in o for o in (o1, o2) for x in ',"') or '"' in sent:
            skipped.append(i)
            rows.append(None)
            continue
        if "," in sent:
            sent = '"' + sent + '"'
        rows.append(f"{i},{sent},{o1},{o2},{d['gold'] + 1}")
    Path(dst).write_text("".join(r + "\n" for r in rows if r is not None))
    return [i for i, r in enumerate(rows) if r is not None], skipped


def _s(b):
    b = b.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def multiple_choice_bin(dst, task):
    """--multiple-choice binary of arc-* / piqa with llmq's llamacpp question "Question: {q}\\nAnswer:"."""
    items = []
    if task == "piqa":
        for d in lmeval_docs("piqa"):
            items.append((f"Question: {d['goal']}\nAnswer:", [d["sol1"], d["sol2"]], d["label"]))
    else:
        for d in lmeval_docs(task):
            items.append((f"Question: {d['question']}\nAnswer:", d["choices"]["text"],
                          d["choices"]["label"].index(d["answerKey"])))
    blobs = []
    for q, answers, gold in items:
        mc = struct.pack("<I", len(answers)) + b"".join(_s(a) for a in answers)
        mc += struct.pack(f"<{len(answers)}i", *[int(k == gold) for k in range(len(answers))])
        blobs.append(_s(q) + mc + struct.pack("<I", 0))
    head = 4 + 4 * len(blobs)
    offs, pos = [], head
    for b in blobs:
        offs.append(pos)
        pos += len(b)
    Path(dst).write_bytes(struct.pack("<I", len(blobs)) + struct.pack(f"<{len(blobs)}I", *offs) + b"".join(blobs))
    return len(items)
