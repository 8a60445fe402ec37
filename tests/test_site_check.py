"""The site check catches one broken thing of each kind, on tiny pages built here.

No docs build is needed: each test writes a page or two into a temporary directory and
runs ``tools/site_check.py`` on it with Debian's Chromium. Skipped when Playwright or
Chromium is missing (``nox -s site-check`` installs both).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("playwright")
if shutil.which("chromium") is None:
    pytest.skip("no chromium on PATH (apt-get install -y chromium)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import site_check  # noqa: E402

MATHJAX = ROOT / "docs" / "_static" / "mathjax" / "tex-svg-full.js"
# A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
SEARCH = """<html><body><div id="search-results"></div><script>
const q = new URLSearchParams(location.search).get("q");
const hits = {RESULTS};
const box = document.getElementById("search-results");
const summary = document.createElement("p");
summary.className = "search-summary";
summary.textContent = "Search finished, found " + hits.length + " pages.";
const ul = document.createElement("ul");
ul.className = "search";
for (const h of hits) {
  const li = document.createElement("li");
  li.innerHTML = '<a href="' + h + '">' + h + '</a>';
  ul.appendChild(li);
}
box.append(summary, ul);
</script></body></html>"""


def page(body: str, head: str = "") -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'>{head}</head><body>"
        f"<article style='width: 600px'>{body}</article></body></html>"
    )


GOOD = page(
    "<h1 id='top'>Rotary</h1><p>Fine text, <a href='#top'>an anchor</a>, "
    "<a href='other.html#sec'>another page</a>, <a href='https://example.org/'>out</a>.</p>"
    "<img src='dot.png' alt='dot' style='width: 300px'><pre>short code</pre>"
)


def make_site(tmp_path: Path, index: str = GOOD, results: str = '["index.html"]') -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(index)
    (site / "other.html").write_text(page("<h2 id='sec'>Section</h2>"))
    (site / "dot.png").write_bytes(PNG)
    (site / "search.html").write_text(SEARCH.replace("{RESULTS}", results))
    return site


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = site_check._launch(pw)
        yield chromium
        chromium.close()


@pytest.fixture
def kinds(browser):
    def run(site: Path) -> set[str]:
        problems = site_check.check_site(site, browser=browser)
        for p in problems:
            print(p)
        return {p.kind for p in problems}

    return run


def test_good_site_passes(tmp_path, kinds):
    assert kinds(make_site(tmp_path)) == set()


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("console", "<script>console.error('boom')</script>"),
        ("console", "<script>undefinedFunction()</script>"),
        ("console", "<div class='explorer-controls'><select id='s'><option>a</option>"
         "<option>b</option></select></div><script>document.getElementById('s')"
         ".addEventListener('change', (e) => { if (e.target.value === 'b') missing(); });"
         "</script>"),
        ("request", "<script src='missing.js'></script>"),
        ("request", "<link rel='stylesheet' href='https://cdn.example.invalid/x.css'>"),
        ("image", "<img src='broken.png' alt='broken'>"),
        ("tex", r"<p>The norm is \(\sqrt{d/2}\).</p>"),
        ("tex", "<p>See {eq}`eq-dot`.</p>"),
        ("tex", "<p>The score is <code>Re[q conj(k) e^{i (m - n) theta_j}]</code>.</p>"),
        ("link", "<a href='nowhere.html'>a missing page</a>"),
        ("link", "<a href='other.html#missing'>a missing anchor</a>"),
        ("link", "<a href='#missing'>a missing anchor here</a>"),
        ("overflow", "<div style='width: 500px'><img src='dot.png' style='width: 800px'></div>"),
        (
            "overflow",
            "<div class='js-plotly-plot' style='width: 500px'>"
            "<svg class='main-svg' width='890' height='100'></svg></div>",
        ),
    ],
)
def test_each_kind_of_break_is_caught(tmp_path, kinds, kind, body):
    site = make_site(tmp_path, GOOD.replace("</article>", body + "</article>"))
    if kind == "image":
        (site / "broken.png").write_text("not a png")  # served with 200, but no picture
    assert kind in kinds(site)


def test_code_overflow_on_series_pages(tmp_path, kinds):
    site = make_site(tmp_path)
    (site / "series").mkdir()
    wide = "<pre style='white-space: pre'>" + "x = 1  # " + "long comment " * 20 + "</pre>"
    (site / "series" / "part.html").write_text(page(wide))
    assert "code-overflow" in kinds(site)


def test_search_without_results_fails(tmp_path, kinds):
    assert kinds(make_site(tmp_path, results="[]")) == {"search"}


def test_search_listing_a_page_twice_fails(tmp_path, kinds):
    assert kinds(make_site(tmp_path, results='["index.html", "index.html"]')) == {"search"}


@pytest.mark.skipif(not MATHJAX.is_file(), reason="vendored MathJax missing")
def test_typeset_math_passes_and_wide_equation_fails(tmp_path, kinds):
    head = "<script defer src='mathjax.js'></script>"
    narrow = r"<p>Inline \(\sqrt{d/2}\) and</p><div class='math'>\[x = \frac{a}{b}\]</div>"
    site = make_site(tmp_path, page(narrow, head))
    shutil.copy(MATHJAX, site / "mathjax.js")
    assert kinds(site) == set()
    wide = r"\[" + " + ".join(rf"\sin(p\theta_{{{i}}})" for i in range(40)) + r"\]"
    (site / "index.html").write_text(page(f"<div class='math'>{wide}</div>", head))
    assert kinds(site) == {"overflow"}
