"""`llmq generate` end to end: stories260K greedy from BOS reproduces expected_greedy.txt (the
sample llama2.c publishes for this model), SmolLM2 continues a chat prompt, and the flag errors."""
from conftest import run


def test_stories_greedy_text(llmq_bin, stories_v1, data_dir):
    want = (data_dir / "models" / "stories260K" / "expected_greedy.txt").read_text()
    r = run([llmq_bin, "generate", "--model", stories_v1, "--prompt", "", "-n", "256", "--threads", "2"])
    assert r.stdout == want + "\n"
    assert "generated 256 tokens" in r.stderr


def test_stories_prompt_is_echoed(llmq_bin, stories_v3):
    r = run([llmq_bin, "generate", "--model", stories_v3, "--prompt", "Once upon a time", "--n-predict=8"])
    assert r.stdout.startswith("Once upon a time")
    assert len(r.stdout) > len("Once upon a time\n")


def test_smollm2_chat(llmq_bin, smollm2):
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    r = run([llmq_bin, "generate", "--model", smollm2, "--prompt", prompt, "-n", "16", "--threads", "2"])
    assert r.stdout.startswith(prompt)
    assert "4" in r.stdout[len(prompt):]


def test_flag_errors(llmq_bin, stories_v1, tmp_path):
    r = run([llmq_bin, "generate", "--help"])
    for flag in ("--model", "--prompt", "--n-predict", "--threads", "--no-bos", "--ignore-eos"):
        assert flag in r.stdout
    r = run([llmq_bin, "generate", "--prompt", "x"], check=False)
    assert r.returncode == 2 and "--model is required" in r.stderr
    r = run([llmq_bin, "generate", "--model", stories_v1, "--bogus"], check=False)
    assert r.returncode == 2 and "--bogus" in r.stderr
    r = run([llmq_bin, "generate", "--model", stories_v1, "-n", "-3"], check=False)
    assert r.returncode == 2
    r = run([llmq_bin, "generate", "--model", tmp_path / "nope.gguf"], check=False)
    assert r.returncode == 1 and "nope.gguf" in r.stderr
