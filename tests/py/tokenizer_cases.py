"""Test texts for the tokenizer oracles (tests/py/test_tokenizer_oracle.py, gen_golden_tokenizer.py).

FIXED: hand-picked adversarial texts (bytes): whitespace runs, newlines, contractions in every case,
digit runs, CJK, emoji with ZWJ, combining marks, non-ASCII spaces, special-token texts, invalid
UTF-8 (stray continuation bytes, truncated and overlong sequences, surrogates), NULs, long runs.
random_cases(): seeded mixes of those ingredients plus random bytes.
BEYOND_U10FFFF(text): True for texts with a 4-byte sequence decoding above U+10FFFF, on which
llama.cpp's byte-level BPE aborts (std::invalid_argument); llmq encodes those as U+FFFD instead.
"""
import random
import re

FIXED = [
    b"", b" ", b"  ", b"   ", b"\t", b"\n", b"\n\n", b"\r\n", b" \n", b"\n ", b"\t\n \t",
    b"Hello world", b" Hello world", b"Hello World!", b"hello, world!",
    b"I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    b"don't DON'T Don'T it's IT'S we're WE'RE they'll", b"''''''", b"'", b"'s", b" 's", b"x's", b"3's",
    b"1 12 123 1234 12345 123456 1234567 12345678", b"3.14159 2,000,000 1e10 0x1F",
    "\u0663\u0664 \u216b \u00bd".encode(), b"   leading and trailing   ", b"a  b   c    d", b"a\n\nb\n\n\nc",
    b"tab\there\t\tthere", b"line\r\nline\rline",
    "日本語のテキスト、漢字と仮名。中文：你好，世界！한국어 텍스트".encode(),
    "Привет мир! Ελληνικά. עברית العربية".encode(),
    "🚀 (normal) 😶\u200d🌫️ (emojis) ✅ 🦙🦙 👨‍👩‍👧‍👦".encode(), "naïve café résumé Zoë".encode(),
    "e\u0301 a\u0308 combining".encode(), "\u00a0nbsp\u2003em\u3000ideo\u2028ls\u0085nel".encode(),
    b"------======= ......!!!!!!?????? ```````\"\"\"\"",
    b"<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", b"<|endoftext|>text<|endoftext|>",
    b"<s>hi</s> <unk>", b"<|begin_of_text|><|start_header_id|>x<|end_header_id|>", b"<s>", b" <s> ", b"</s>",
    b"<|im_end|>", b"\xff\xfe invalid \x80\x81 bytes \xc3", b"trunc \xe2\x82", b"overlong \xc0\x80 \xe0\x80\x80",
    b"surrogate \xed\xa0\x80 x", b"\x00nul\x00", b"\x01\x02\x1b[0m", b"a" * 300, b"ab" * 200, b"1" * 50,
    b" " * 40 + b"x", b"\n" * 30, "ſ Kelvin\u212a İstanbul ǅ".encode(),
    "\U0002ebf0 \U00010d40 \U000e0001 \ue000 \U0010fffd".encode(), b"w048 7tuijk dsdfhu",
    b" this is \xf0\x9f\xa6\x99.cpp", b"$100 + <tag> = ^~|` @#%", b"x = a[i] {b} (c) _d_ \\e",
    b"beyond \xf5\x80\x80\x80 max",
]

_ALPHA = ["a", "b", "Z", " ", "  ", "\n", "\t", "'", "s", "1", "23", ".", ",", "!", "é", "日", "🦙", "\u00a0", "\r",
          "-", "_", "<", ">", "|"]


def random_cases(n_text=150, n_bytes=30, seed=1234):
    rnd = random.Random(seed)
    out = ["".join(rnd.choice(_ALPHA) for _ in range(rnd.randint(1, 30))).encode() for _ in range(n_text)]
    out += [bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 20))) for _ in range(n_bytes)]
    return out


def all_cases():
    return FIXED + random_cases()


def BEYOND_U10FFFF(text):
    return re.search(rb"[\xf5-\xf7][\x80-\xbf]{3}", text) is not None


def ggml_vocab_cases(inp_path):
    """The texts of llama.cpp's models/ggml-vocab-*.gguf.inp test files."""
    with open(inp_path, encoding="utf-8") as f:
        return [s.encode() for s in f.read().split("\n__ggml_vocab_test__\n")]
