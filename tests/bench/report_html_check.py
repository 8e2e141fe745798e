#!/usr/bin/env python3
"""report_html_check.py MPBENCH - report.html in headless Chromium.

Runs mpbench on two small built-in workloads and three allocators, opens
the report.html it wrote in Debian's chromium (--headless --dump-dom, then
--screenshot), and checks that the page opened without the network, drew
(the marker attributes its script sets after drawing: curves, blocks,
painted pixels) and shows the figures of results.json in its table.
Exits 77 (ctest's skip) when chromium is not installed (cmake/deps.sh
installs it)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MAX_BLOCKS = 6000  # MPB_HTML_MAX_BLOCKS in bench/core/mpbench.h


def fail(msg):
    print("report_html_check: FAIL: " + msg)
    sys.exit(1)


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def main():
    mpbench = sys.argv[1]
    browser = chromium()
    if browser is None:
        print("report_html_check: skip: chromium is not installed (cmake/deps.sh installs it)")
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="mpb_html_")
    try:
        out = os.path.join(tmp, "out")
        allocators = ["pool", "direct", "pool:max_split=64M"]
        cmd = [mpbench, "run", "--workload", "llm:requests=3,layers=4",
               "--workload", "cnn:batches=20", "--no-traces", "--no-capacity",
               "--no-plots", "--quiet", "--out", out]
        for a in allocators:
            cmd += ["--allocator", a]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        page = os.path.join(out, "report.html")
        results = json.load(open(os.path.join(out, "results.json")))
        html = open(page, encoding="utf-8").read()
        # Self-contained: nothing fetched from anywhere.
        if re.search(r"""(src|href)\s*=\s*["']?[a-z]+:""", html, re.I) or "http" in html.lower():
            fail("report.html refers to something outside itself")
        if "<script src" in html or "<link" in html:
            fail("report.html loads a script or style from a file")
        base = [browser, "--headless", "--no-sandbox", "--disable-gpu",
                "--user-data-dir=" + os.path.join(tmp, "profile"),
                "--virtual-time-budget=5000", "--window-size=1280,2000"]
        dom = subprocess.run(base + ["--dump-dom", "file://" + page], capture_output=True,
                             text=True, timeout=120).stdout
        body = re.search(r"<body([^>]*)>", dom)
        if body is None:
            fail("chromium gave no DOM (did it start?)")
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
        workloads = sorted({r["workload"] for r in results})
        if attrs.get("data-drawn") != "1":
            fail("the page did not finish drawing: %s" % attrs)
        want = {"data-rows": len(results), "data-figures": len(workloads),
                "data-curves": len(results) + len(workloads), "data-maps": len(workloads)}
        for k, v in want.items():
            if int(attrs.get(k, -1)) != v:
                fail("%s is %s, expected %d" % (k, attrs.get(k), v))
        blocks = int(attrs["data-blocks"])
        if not 0 < blocks <= MAX_BLOCKS:
            fail("block map drew %d blocks" % blocks)
        for k in ("data-curve-ink", "data-map-ink"):
            if int(attrs.get(k, 0)) < 1000:
                fail("%s: only %s painted pixels" % (k, attrs.get(k)))
        # The table shows results.json's figures, row by row.
        for i, r in enumerate(results):
            row = re.search(r'<tr id="mp-row-%d"[^>]*>(.*?)</tr>' % i, dom, re.S)
            if row is None:
                fail("no table row %d" % i)
            cells = re.findall(r"<td([^>]*)>(.*?)</td>", row.group(1), re.S)
            text = [c[1] for c in cells]
            if text[0] != r["workload"].replace("&", "&amp;") or not text[1].startswith(r["allocator"]):
                fail("row %d names %s / %s" % (i, text[0], text[1]))
            got = [int(re.search(r'data-bytes="(\d+)"', cells[k][0]).group(1)) for k in (2, 3)]
            if got != [r["peak_live_bytes"], r["peak_reserved_bytes"]]:
                fail("row %d bytes %s, results.json %s" % (
                    i, got, [r["peak_live_bytes"], r["peak_reserved_bytes"]]))
            if text[4] != "%.3f" % r["ratio"]:
                fail("row %d ratio %s, results.json %.3f" % (i, text[4], r["ratio"]))
        shot = os.path.join(tmp, "shot.png")
        subprocess.run(base + ["--hide-scrollbars", "--screenshot=" + shot, "file://" + page],
                       capture_output=True, timeout=120)
        if not os.path.exists(shot) or os.path.getsize(shot) < 20000:
            fail("no screenshot, or a blank one")
        if os.environ.get("MPB_KEEP_SHOT"):
            shutil.copy(shot, os.environ["MPB_KEEP_SHOT"])
        print("report_html_check: ok: %d rows, %s curves, %d blocks drawn" % (
            len(results), attrs["data-curves"], blocks))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
