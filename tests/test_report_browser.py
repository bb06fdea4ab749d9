"""The results index and the reports it links, opened in a real headless browser (Chromium from the
distribution): every page loads, every image decodes, every link resolves to a file that exists."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_campaign_report import results_tree

from testbed.report.folders import build_index

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser")

HARNESS = """<!doctype html><html><head><meta charset="utf-8"><title>check</title></head><body>
<pre id="result">pending</pre>
<script>
const pages = %s;
const seen = {};
let pending = pages.length;
for (const p of pages) {
  const f = document.createElement("iframe");
  f.onload = () => {
    const d = f.contentDocument;
    seen[p] = d ? {
      title: d.title,
      images: [...d.images].map(i => [i.getAttribute("src"), i.complete && i.naturalWidth > 0]),
      links: [...d.querySelectorAll("a[href]")].map(a => a.href.split("#")[0]),
    } : {error: "not readable"};
    if (--pending === 0) links();
  };
  f.src = p;
  document.body.appendChild(f);
}
function links() {
  const all = [...new Set(Object.values(seen).flatMap(s => s.links || []))];
  const ok = {};
  let n = all.length;
  const done = () => { document.getElementById("result").textContent = JSON.stringify({pages: seen, links: ok}); };
  if (!n) return done();
  for (const url of all) {
    const x = new XMLHttpRequest();
    x.open("GET", url);
    x.onload = () => { ok[url] = true; if (--n === 0) done(); };
    x.onerror = () => { ok[url] = false; if (--n === 0) done(); };
    x.send();
  }
}
</script></body></html>
"""


def _browser() -> str:
    for b in BROWSERS:
        if shutil.which(b):
            return b
    pytest.skip("no Chromium here (make deps installs chromium-headless-shell)")


def open_in_browser(root: Path, pages: list[str]) -> dict[str, object]:
    """Load ``pages`` (paths under ``root``) in headless Chromium; what each page showed and which links resolved."""
    harness = root / ".browser-check.html"
    harness.write_text(HARNESS % json.dumps(pages))
    try:
        r = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                            "--virtual-time-budget=20000", "--dump-dom", harness.as_uri()],
                           capture_output=True, text=True, timeout=120, check=False)
    finally:
        harness.unlink()
    m = re.search(r'<pre id="result">(.*?)</pre>', r.stdout, re.S)
    assert m and m[1] != "pending", r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(html.unescape(m[1]))


@pytest.mark.slow
def test_index_and_reports_open_with_every_image_and_link(tmp_path: Path) -> None:
    root = results_tree(tmp_path / "results")
    build_index(root, "html")
    index = (root / "index.html").read_text()
    linked = sorted({h for h in re.findall(r'href="([^"#]+)"', index) if h.endswith(".html")})
    assert len(linked) >= 12, linked  # every run's report and the campaign reports
    out = open_in_browser(root, ["index.html", *linked])
    pages = out["pages"]
    assert isinstance(pages, dict) and set(pages) == {"index.html", *linked}
    unreadable = [p for p, s in pages.items() if "error" in s]
    bad_links = [u for u, ok in out["links"].items() if not ok]
    assert not unreadable and not bad_links, (unreadable, bad_links)
    broken_images = [(p, src) for p, s in pages.items() for src, ok in s["images"] if not ok]
    assert not broken_images, broken_images
    assert sum(len(s["images"]) for s in pages.values()) > 10  # the reports' figures were really there
    assert all(s["title"] for s in pages.values())
