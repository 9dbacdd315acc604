"""Shared pieces of the transformers-venv scripts that build random-weight family models (hf_qwen3_model.py,
hf_gemma_model.py). Runs in the transformers venv (LLMQ_HF_PYTHON) only."""
import pathlib
import shutil

import torch
import transformers


def randomize_and_save(model, out, tok_dir, norm_center):
    """Draws every parameter (the caller seeds torch): linears, stacked experts and the embedding N(0, 1/in), 1-D
    (norm) weights norm_center + N(0, 0.3^2); saves model as safetensors into out with the tokenizer files of tok_dir."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(norm_center + 0.3 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)  # (…, out, in): N(0, 1/in)
    model.save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(tok_dir) / f, pathlib.Path(out) / f)


def load(d, **overrides):
    """from_pretrained(d) in float32 on the CPU with eager attention, config attributes overridden."""
    cfg = transformers.AutoConfig.from_pretrained(d)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32, device_map="cpu",
                                                              attn_implementation="eager")
    return model.eval()


def logits(model, ids):
    """(n, V) float32 logits of one sequence of ids from position 0."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()
