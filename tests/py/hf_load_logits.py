"""Loads a quantized directory with Hugging Face transformers (+ gptqmodel's kernels) on the CPU and
writes the logits of one token sequence: the "loadable by transformers" check of tests/py/test_hf_load.py.
Runs in a separate python that has torch, transformers and gptqmodel (LLMQ_HF_PYTHON), never in the
oracle venv.

    python hf_load_logits.py DIR IDS_FILE OUT_FILE

IDS_FILE: whitespace-separated token ids. OUT_FILE: (n, n_vocab) float32 logits, row-major. stdout: one
JSON line {"n", "n_vocab", "quant_method", "linear_classes", "versions"}.
"""
import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    d, ids_file, out = sys.argv[1:4]
    ids = [int(x) for x in open(ids_file).read().split()]
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, sys.argv[4] if len(sys.argv) > 4 else "float16"), device_map="cpu")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    logits.astype(np.float32).tofile(out)
    classes = sorted({type(m).__name__ for m in model.modules()
                      if "Linear" in type(m).__name__ and type(m).__name__ != "Linear"})
    import gptqmodel
    print(json.dumps({"n": int(logits.shape[0]), "n_vocab": int(logits.shape[1]),
                      "quant_method": model.config.quantization_config.get("quant_method")
                      if isinstance(model.config.quantization_config, dict)
                      else getattr(model.config.quantization_config, "quant_method", None),
                      "linear_classes": classes,
                      "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                   "gptqmodel": gptqmodel.__version__}}, default=str))


if __name__ == "__main__":
    main()
