"""Loads quantized directories with Hugging Face transformers (+ gptqmodel's kernels) on the CPU and
writes the logits of one token sequence for each: the "loadable by transformers" check of
tests/py/test_hf_load.py. Runs in a separate python that has torch, transformers and gptqmodel
(LLMQ_HF_PYTHON), never in the oracle venv. One process serves every directory, so torch and
transformers are imported once.

    python hf_load_logits.py IDS_FILE DTYPE DIR OUT_FILE [DIR OUT_FILE ...]

IDS_FILE: whitespace-separated token ids. DTYPE: a torch dtype name (float32, float16). OUT_FILE:
(n, n_vocab) float32 logits, row-major. stdout: one JSON line per DIR, in order: {"dir", "n", "n_vocab",
"quant_method", "linear_classes", "versions"}, or {"dir", "error"} when that directory did not load.
"""
import json
import sys
import traceback

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM


def one(d, ids, dtype, out):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, device_map="cpu")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    logits.astype(np.float32).tofile(out)
    classes = sorted({type(m).__name__ for m in model.modules()
                      if "Linear" in type(m).__name__ and type(m).__name__ != "Linear"})
    qc = model.config.quantization_config
    import gptqmodel
    return {"n": int(logits.shape[0]), "n_vocab": int(logits.shape[1]),
            "quant_method": qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None),
            "linear_classes": classes,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "gptqmodel": gptqmodel.__version__}}


def main():
    ids_file, dtype_name, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
    if not pairs or len(pairs) % 2:
        sys.exit("usage: hf_load_logits.py IDS_FILE DTYPE DIR OUT_FILE [DIR OUT_FILE ...]")
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    dtype = getattr(torch, dtype_name)
    for d, out in zip(pairs[0::2], pairs[1::2]):
        try:
            info = one(d, ids, dtype, out)
        except Exception:
            info = {"error": traceback.format_exc()}
        print(json.dumps(dict(dir=d, **info), default=str), flush=True)


if __name__ == "__main__":
    main()
