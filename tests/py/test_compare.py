"""`llmq compare` and the --fail-if quality gates (cli/cmd_compare.c, calib/eval/compare.h, calib/eval/gate.h).

The figures compare prints are `llmq eval`'s (whose perplexity and KLD tests/py/test_eval_oracle.py checks against
llama.cpp): the same PPL for every artifact and the base, the same KLD with f32 cached logits. On top of that:
the gate demo CI runs (stories260K at 2 bits violates ppl_increase>5% and exits 3 naming the gate, 8 bits
passes), the zero-shot columns (--tasks: `llmq eval --tasks`'s figures, Δ points vs the base, task gates), the cache (a second run evaluates only the artifacts; a damaged entry is recomputed), bad inputs (exit
1 naming the file, usage errors exit 2, no output clobbered without --force), and the HTML page rendered by
headless Chromium (one point per artifact in each plot, no request leaves the page).
"""
import json
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from conftest import run

EVAL = ["--ctx", "128", "--chunks", "4", "--threads", "2"]


@pytest.fixture(scope="module")
def quantized(llmq_bin, stories_v1, tmp_path_factory):
    """stories260K at 2 and 8 bits (RTN, group 32, the 172-wide ffn_down per channel), fake-quant directories."""
    d = tmp_path_factory.mktemp("q")
    out = {}
    for bits in (2, 8):
        out[bits] = d / f"q{bits}"
        run([llmq_bin, "quantize", "--model", stories_v1, "--method", "rtn", "--bits", bits, "--group-size", "32",
             "--fallback", "rtn-per-channel", "--format", "fake", "--out", out[bits], "--quiet"])
    return out


def compare(llmq_bin, base, arts, tmp_path, *extra, check=True):
    return run([llmq_bin, "compare", "--base", base, *arts, "--ppl", "wikitext-2", *EVAL, "--cache-dir",
                tmp_path / "cache", *extra], check=check)


def eval_json(llmq_bin, model, tmp_path, *extra):
    j = tmp_path / "e.json"
    run([llmq_bin, "eval", "--model", model, "--ppl", "wikitext-2", *EVAL, "--json", j, "--force", *extra, "--quiet"])
    return json.loads(j.read_text())


def test_gate_demo(llmq_bin, stories_v1, quantized, tmp_path):
    """The CI gate demo: 2-bit stories260K breaks 'ppl_increase>5%' (exit 3, one line naming gate, artifact and
    value; the JSON records the verdict), 8-bit passes (exit 0)."""
    js = tmp_path / "c.json"
    r = compare(llmq_bin, stories_v1, [quantized[2]], tmp_path, "--fail-if", "ppl_increase>5%", "--json", js,
                check=False)
    assert r.returncode == 3, r.stderr
    lines = [l for l in r.stderr.splitlines() if "violated" in l]
    assert len(lines) == 1 and "'ppl_increase>5%'" in lines[0] and "q2" in lines[0], r.stderr
    rep = json.loads(js.read_text())
    art = rep["artifacts"][1]
    assert rep["exit_status"] == 3 and rep["gates_violated"] == 1
    assert rep["gates"] == [{"gate": "ppl_increase>5%", "metric": "ppl_increase", "threshold": 5.0, "artifact": "q2",
                             "value": art["ppl_delta_percent"], "verdict": "fail"}]
    assert f"ppl_increase = {art['ppl_delta_percent']:.3f}%" in lines[0]
    assert art["ppl_delta_percent"] > 5

    r = compare(llmq_bin, stories_v1, [quantized[8]], tmp_path, "--fail-if", "ppl_increase>5%", "--json", js,
                "--force")
    rep = json.loads(js.read_text())
    assert rep["exit_status"] == 0 and rep["gates"][0]["verdict"] == "pass" and "violated" not in r.stderr
    assert 0 <= rep["gates"][0]["value"] < 5


def test_figures_are_evals(llmq_bin, stories_v1, stories_v3, quantized, tmp_path):
    """Every PPL equals `llmq eval`'s on the same chunks; Δ% is against the base's; with f32 cached logits the KLD
    and same-top-1 figures equal `llmq eval --kld-base`'s exactly (the same logits, the same sums)."""
    js, csv = tmp_path / "c.json", tmp_path / "c.csv"
    arts = [quantized[2], quantized[8], stories_v3]
    r = compare(llmq_bin, stories_v1, arts, tmp_path, "--kld", "--logits-dtype", "f32", "--json", js, "--csv", csv)
    rep = json.loads(js.read_text())
    rows = rep["artifacts"]
    assert [a["path"] for a in rows] == [str(p) for p in [stories_v1, *arts]] and rows[0]["base"]
    base = eval_json(llmq_bin, stories_v1, tmp_path)
    assert rows[0]["ppl"] == base["ppl"] and rows[0]["ppl_uncertainty"] == base["ppl_uncertainty"]
    for row, path in zip(rows[1:], arts):
        e = eval_json(llmq_bin, path, tmp_path, "--kld-base", stories_v1)
        assert row["ppl"] == e["ppl"], (path, row["ppl"], e["ppl"])
        assert row["ppl_delta_percent"] == pytest.approx(100 * (e["ppl"] / base["ppl"] - 1), rel=1e-12)
        assert row["kld_mean"] == pytest.approx(e["kld"]["kld_mean"], rel=1e-12, abs=1e-15)
        assert row["kld_p99"] == pytest.approx(e["kld"]["kld_quantiles"]["p99"], rel=1e-12, abs=1e-15)
        assert row["same_top1_percent"] == pytest.approx(100 * e["kld"]["same_top_p"], rel=1e-12)
    # the v3 file holds the same f32 weights as the base: KLD 0, Δ 0
    assert rows[3]["kld_mean"] == 0 and rows[3]["ppl_delta_percent"] == 0
    # sizes: the fake-quant directories store f32, so 32 bits per weight like the base
    assert rows[0]["bpw"] == pytest.approx(32, rel=1e-12) and rows[1]["params"] == rows[0]["params"]
    # stdout's table has a line per artifact with its PPL; the CSV the same figures
    for a in rows:
        assert re.search(rf"^{re.escape(a['artifact'])}\s.*{a['ppl']:.4f}", r.stdout, re.M), r.stdout
    lines = csv.read_text().splitlines()
    assert len(lines) == 1 + len(rows) and lines[0].startswith("artifact,path,base,")
    assert float(lines[2].split(",")[7]) == rows[1]["ppl"]


def test_cache(llmq_bin, stories_v1, quantized, tmp_path):
    """The base is evaluated once: the second run takes its report and logits from the cache (and gives the same
    figures); --kld after a plain run evaluates the base once more for its logits; a damaged logits entry is recomputed with a warning."""
    js = tmp_path / "c.json"

    def go(*extra):
        r = compare(llmq_bin, stories_v1, [quantized[8]], tmp_path, "--json", js, "--force", *extra)
        return r, json.loads(js.read_text())

    _, a = go()
    assert not a["cache"]["base_report_cached"]
    r, b = go()
    assert b["cache"]["base_report_cached"] and "from the cache" in r.stderr and "[1/1]" in r.stderr
    assert a["artifacts"] == [dict(x, seconds=y["seconds"]) for x, y in zip(b["artifacts"], a["artifacts"])]
    r, c = go("--kld")  # the logits are not cached yet: the base runs again and saves them
    assert not c["cache"]["base_logits_cached"] and "[1/2]" in r.stderr
    _, d = go("--kld")
    assert d["cache"]["base_logits_cached"] and d["artifacts"][1]["kld_mean"] == c["artifacts"][1]["kld_mean"]
    logits = tmp_path / "cache" / (d["cache"]["entry"] + ".logits")
    with open(logits, "r+b") as f:
        f.write(b"NOTLOGIT")
    r, e = go("--kld")
    assert "evaluating the base again" in r.stderr and not e["cache"]["base_logits_cached"]
    assert e["artifacts"][1]["kld_mean"] == d["artifacts"][1]["kld_mean"]
    # another chunk count is another entry
    _, f2 = go("--chunks", "3")
    assert f2["cache"]["entry"] != e["cache"]["entry"] and not f2["cache"]["base_report_cached"]


def test_bad_inputs(llmq_bin, stories_v1, smollm2, quantized, tmp_path):
    """An unknown path, a file that is no model, a different vocabulary: exit 1 naming the file, before any
    evaluation; an existing output is not replaced without --force."""
    missing = tmp_path / "nope.gguf"
    text = tmp_path / "t.txt"
    text.write_text("not a model\n")
    for art, words in ((missing, ["no such file"]), (text, ["not a model"]), (smollm2, ["vocabulary"])):
        r = compare(llmq_bin, stories_v1, [quantized[8], art], tmp_path, check=False)
        assert r.returncode == 1 and str(art) in r.stderr and all(w in r.stderr for w in words), r.stderr
        assert "compare: [" not in r.stderr  # nothing was evaluated
    out = tmp_path / "exists.json"
    out.write_text("keep")
    r = compare(llmq_bin, stories_v1, [quantized[8]], tmp_path, "--json", out, check=False)
    assert r.returncode == 1 and "--force" in r.stderr and out.read_text() == "keep"
    r = compare(llmq_bin, stories_v1, [quantized[8]], tmp_path, "--json", stories_v1, "--force", check=False)
    assert r.returncode == 1 and stories_v1.stat().st_size > 1000


USAGE = [
    ([], "--base"),
    (["--base", "B"], "at least one artifact"),
    (["--base", "B", "A", "--fail-if", "perplexity>3"], "unknown metric 'perplexity'"),
    (["--base", "B", "A", "--fail-if", "top1<0.9"], "is a percentage"),
    (["--base", "B", "A", "--fail-if", "kld>0.05"], "needs --kld"),
    (["--base", "B", "A", "--fail-if", "hellaswag.acc_drop>1.0"], "needs --tasks hellaswag"),
    (["--base", "B", "A", "--fail-if", "mmlu.acc<30"], "unknown task 'mmlu'"),
    (["--base", "B", "A", "--tasks", "hellaswag", "--fail-if", "piqa.acc>1"], "which --tasks hellaswag does not name"),
    (["--base", "B", "A", "--tasks", "mmlu"], "unknown task 'mmlu'"),
    (["--base", "B", "A", "--limit", "3"], "--limit and --seed need --tasks"),
    (["--base", "B", "A", "--tasks", "piqa", "--task-protocol", "gptq"], "--task-protocol"),
    (["--base", "B", "A", "--chunks", "0"], "--chunks"),
    (["--base", "B", "A", "--logits-dtype", "q8"], "--logits-dtype"),
    (["--base", "B", "A", "--fail-if"], "--fail-if needs a value"),
]


@pytest.mark.parametrize("argv,msg", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors(llmq_bin, stories_v1, argv, msg):
    args = [str(stories_v1) if a in ("A", "B") else a for a in argv]
    r = run([llmq_bin, "compare", *args], check=False)
    assert r.returncode == 2 and msg in r.stderr, r.stderr


def test_eval_gates(llmq_bin, stories_v1, quantized, tmp_path):
    """--fail-if on `llmq eval`: with --base every metric is measured; without a base the base metrics are a usage
    error; the JSON records each verdict."""
    js = tmp_path / "e.json"
    r = run([llmq_bin, "eval", "--model", quantized[2], "--base", stories_v1, "--ppl", "wikitext-2", *EVAL, "--json", js,
             "--fail-if", "kld_p99>0.5", "--fail-if", "ppl>1e9", "--fail-if", "top1 < 90%"], check=False)
    assert r.returncode == 3, r.stderr
    rep = json.loads(js.read_text())
    v = {g["gate"]: g for g in rep["gates"]}
    assert v["kld_p99>0.5"]["verdict"] == "fail" and v["kld_p99>0.5"]["value"] == rep["kld"]["kld_quantiles"]["p99"]
    assert v["ppl>1e9"]["verdict"] == "pass" and v["ppl>1e9"]["value"] == rep["ppl"]
    assert v["top1 < 90%"]["verdict"] == "fail" and v["top1 < 90%"]["value"] == 100 * rep["kld"]["same_top_p"]
    assert sum("violated" in l for l in r.stderr.splitlines()) == 2
    r = run([llmq_bin, "eval", "--model", quantized[8], "--ppl", "wikitext-2", *EVAL, "--fail-if", "ppl_increase>1%"],
            check=False)
    assert r.returncode == 2 and "needs a base" in r.stderr
    r = run([llmq_bin, "eval", "--model", quantized[8], "--ppl", "wikitext-2", *EVAL, "--fail-if", "ppl>1e9"])
    assert r.returncode == 0


TASKS = ["--tasks", "arc-easy,piqa", "--limit", "20", "--threads", "2"]


def test_tasks(llmq_bin, stories_v1, quantized, tmp_path):
    """--tasks: every row's acc / acc_norm / stderr are `llmq eval --tasks`'s on the same model and items (whose
    figures tests/py/test_tasks_oracle.py checks against lm-eval); Δ points are against the base's row; the
    terminal table shows them; task gates pass and fail on those figures (exit 3 naming the gate)."""
    js = tmp_path / "c.json"
    r = compare(llmq_bin, stories_v1, [quantized[2]], tmp_path, *TASKS, "--json", js, "--fail-if",
                "arc-easy.acc_drop>50", "--fail-if", "arc-easy.acc>99")
    rep = json.loads(js.read_text())
    rows = rep["artifacts"]
    for row, model in zip(rows, [stories_v1, quantized[2]]):
        ej = tmp_path / "t.json"
        run([llmq_bin, "eval", "--model", model, *TASKS, "--json", ej, "--force", "--quiet"])
        want = {t["task"]: t for t in json.loads(ej.read_text())["tasks"]}
        assert [t["task"] for t in row["tasks"]] == ["arc-easy", "piqa"]
        for t in row["tasks"]:
            w = want[t["task"]]
            assert t["items"] == w["items"] == 20
            for k in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr"):
                assert t[k] == w[k], (model, t["task"], k)
            assert t["acc_delta_points"] == pytest.approx(100 * (t["acc"] - rows[0]["tasks"][row["tasks"].index(t)]
                                                                 ["acc"]), abs=1e-9)
            assert f"{100 * t['acc']:.2f}±{100 * t['acc_stderr']:.2f}" in r.stdout
    assert "arc-easy acc%" in r.stdout and "piqa acc%" in r.stdout
    drop = -rows[1]["tasks"][0]["acc_delta_points"]
    assert rep["exit_status"] == 0 and [g["verdict"] for g in rep["gates"]] == ["pass", "pass"]
    assert rep["gates"][0]["value"] == pytest.approx(drop, abs=1e-9)
    assert rep["gates"][1]["value"] == pytest.approx(100 * rows[1]["tasks"][0]["acc"], abs=1e-9)

    r = compare(llmq_bin, stories_v1, [quantized[2]], tmp_path, *TASKS, "--fail-if", "arc-easy.acc<99", check=False)
    lines = [l for l in r.stderr.splitlines() if "violated" in l]
    assert r.returncode == 3 and len(lines) == 1 and "'arc-easy.acc<99'" in lines[0] and "q2" in lines[0], r.stderr

    # llmq eval --tasks: acc / acc_norm gates on the model alone; *_drop needs a base eval does not have
    r = run([llmq_bin, "eval", "--model", quantized[2], *TASKS, "--fail-if", "piqa.acc_norm<99", "--fail-if",
             "arc-easy.acc>99"], check=False)
    lines = [l for l in r.stderr.splitlines() if "violated" in l]
    assert r.returncode == 3 and len(lines) == 1 and "'piqa.acc_norm<99'" in lines[0], r.stderr
    r = run([llmq_bin, "eval", "--model", quantized[2], *TASKS, "--fail-if", "arc-easy.acc_drop>1"], check=False)
    assert r.returncode == 2 and "needs the base's accuracy on arc-easy" in r.stderr and "llmq compare" in r.stderr
    r = run([llmq_bin, "eval", "--model", quantized[2], *TASKS, "--fail-if", "ppl>1"], check=False)
    assert r.returncode == 2 and "needs a perplexity run" in r.stderr


# ---- the HTML page in headless Chromium ----------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--host-resolver-rules=MAP * ~NOTFOUND",
                  "--window-size=1300,1000"]


def png_colors(path):
    """Distinct RGB(A) pixel values of an 8-bit RGB / RGBA PNG (zlib and the five PNG row filters)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, prev, colors = zlib.decompress(idat), w * bpp, bytearray(w * bpp), set()
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        colors.update(bytes(line[i:i + bpp]) for i in range(0, stride, bpp * 7))
        prev = line
    return colors


def page_requests(chromium, page, tmp_path):
    """URLs the page itself requested while Chromium rendered it (its net log: requests whose initiator is an
    origin; the browser's own background requests carry 'not an origin'), and the screenshot's path."""
    log, shot = tmp_path / f"{page.stem}.netlog.json", tmp_path / f"{page.stem}.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--log-net-log={log}", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    urls = set()
    for e in json.loads(log.read_text())["events"]:
        p = e.get("params", {})
        if "url" in p and p.get("initiator") not in (None, "not an origin") and not p["url"].startswith("file:"):
            urls.add(p["url"])
    return urls, shot


def test_html_renders_offline(llmq_bin, stories_v1, quantized, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no chromium on PATH (Debian package chromium): the HTML page is not rendered")
    html = tmp_path / "c.html"
    arts = [quantized[2], quantized[8]]
    compare(llmq_bin, stories_v1, arts, tmp_path, "--kld", "--html", html)
    text = html.read_text()
    # self-contained: no URL, no reference to another resource, no script
    for bad in ("http:", "https:", "//", "src=", "href=", "url(", "@import", "<script", "<link", "<img"):
        assert bad not in text.replace("</", "<"), bad
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, "--dump-dom", html.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    for plot in ("plot-ppl", "plot-kld"):
        svg = re.search(rf'<svg id="{plot}".*?</svg>', dom, re.S)
        assert svg, plot
        pts = re.findall(r'<(circle|rect) class="pt[" ]', svg.group(0))
        assert len(pts) == 1 + len(arts) and pts.count("rect") == 1, (plot, pts)
        assert svg.group(0).count('<polyline class="front"') == 1
        for label in ("q2", "q8", stories_v1.name):
            assert f">{label}</text>" in svg.group(0)
    urls, shot = page_requests(chromium, html, tmp_path)
    assert not urls, urls
    assert len(png_colors(shot)) > 20  # text, grid, points: not a blank page
    # the network check can fail: a page with an external image and stylesheet is caught
    bad = tmp_path / "bad.html"
    bad.write_text('<html><body><img src="https://example.com/x.png">'
                   '<link rel="stylesheet" href="http://fonts.example.org/a.css"></body></html>')
    urls, _ = page_requests(chromium, bad, tmp_path)
    assert urls == {"https://example.com/x.png", "http://fonts.example.org/a.css"}, urls
