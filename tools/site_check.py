"""Read the built site in a real browser and fail on what a reader would see broken.

Usage::

    python tools/site_check.py docs/_build/html                 # check every page
    python tools/site_check.py docs/_build/html --screenshots shots/ --pages "series/*"

The site is served on 127.0.0.1 by a thread of this process and read by Debian's
Chromium through Playwright (``executable_path=shutil.which("chromium")``; no browser
is downloaded). Every request that leaves 127.0.0.1 is blocked and reported, so the
check proves the site works offline. Problems, one kind each:

``console``        a console error or an uncaught exception in the page (also while
                   every option of an explorer's controls is selected in turn)
``request``        a request that failed, answered >= 400, or left 127.0.0.1
``image``          an ``<img>`` that did not load (``naturalWidth == 0``)
``tex``            raw TeX or MyST roles left in the text (``\\(``, ``$$``, ``\\frac``),
                   a MathJax error, or math shown as inline code (``e^{i theta}``)
``link``           an internal link to a missing page or a missing anchor
``overflow``       a figure, plotly chart or display equation wider than its column,
                   checked at 1280 px and again after resizing to 1440 px
``code-overflow``  a code or output block that scrolls sideways (series and gallery)
``search``         the search page finds nothing for "rotary", or lists a page twice

Exit status 1 when any problem is found. ``tests/test_site_check.py`` builds a tiny
broken page for each kind and checks that it is caught.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import html.parser
import http.server
import posixpath
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDTHS = (1280, 1440)
# Pages whose code blocks must not scroll sideways (there, a hidden output is a hidden claim).
CODE_PAGES = ("series/*", "auto_examples/*", "architecture.html", "explorer.html")
SKIP_PAGES = ("_static/*", "_downloads/*", "_sources/*", "_images/*")
# Pages a reader never reaches by a link but a hosting service serves (404 uses absolute URLs).
NO_BROWSER_PAGES = ("404.html",)


@dataclass(frozen=True)
class Problem:
    kind: str
    page: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.page}: {self.detail}"


# -- static pass: links and anchors ------------------------------------------------------


class _Collector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])


@functools.cache
def _parse(path: Path) -> _Collector:
    collector = _Collector()
    collector.feed(path.read_text(encoding="utf-8", errors="replace"))
    return collector


def _is_external(href: str) -> bool:
    scheme = urlsplit(href).scheme
    return bool(scheme) or href.startswith("//")


def check_links(root: Path, pages: list[str]) -> list[Problem]:
    """Every internal link resolves to a file, and every ``#anchor`` to an id in it."""
    problems = []
    for page in pages:
        for href in _parse(root / page).links:
            if _is_external(href) or href.startswith("javascript:"):
                continue
            target, fragment = urldefrag(href)
            target = unquote(urlsplit(target).path)
            if target.startswith("/"):  # root-relative (the 404 page): the site is served at /
                resolved = posixpath.normpath(target.lstrip("/") or "index.html")
                path = root / resolved
                if path.is_dir():
                    path = path / "index.html"
            elif target:
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
                path = root / resolved
                if path.is_dir():
                    path = path / "index.html"
            else:
                path = root / page
            if resolved_outside(root, path):
                problems.append(Problem("link", page, f"{href} points outside the site"))
            elif not path.is_file():
                problems.append(Problem("link", page, f"{href}: no such page"))
            elif fragment and path.suffix == ".html" and unquote(fragment) not in _parse(path).ids:
                problems.append(Problem("link", page, f"{href}: no anchor #{fragment}"))
    return problems


def resolved_outside(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return True
    return False


# -- the browser pass --------------------------------------------------------------------

_WAIT_JS = """async () => {
  for (const img of document.images) { img.loading = "eager"; }
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await Promise.all([...document.images].map(img =>
    img.complete ? null : new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 5000); })));
  if (document.fonts) { await document.fonts.ready; }
}"""

_IMAGES_JS = """() => [...document.images]
  .filter(img => !(img.complete && img.naturalWidth > 0))
  .map(img => img.getAttribute("src") || "(no src)")"""

# Text outside code, scripts and typeset math that still looks like TeX or a MyST role.
_TEX_JS = r"""() => {
  const root = document.querySelector("article") || document.body;
  const skip = "script, style, pre, code, kbd, samp, textarea, mjx-container, .MathJax, .highlight";
  const tex = /\\\(|\\\)|\\\[|\\\]|\$\$|\\(frac|sqrt|sum|cdot|theta|omega|alpha|mathrm|mathbb|text|left|right|begin|end|lVert|rVert|le|ge|pi)\b|\{(eq|ref|doc|numref|math|cite|footcite|func|class)\}`/;
  const found = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && n.parentElement.closest(skip)) continue;
    const m = n.textContent.match(tex);
    if (m) found.push("raw TeX " + JSON.stringify(n.textContent.trim().slice(0, 80)));
  }
  for (const e of root.querySelectorAll("mjx-merror, .MathJax_Error")) {
    found.push("MathJax error " + JSON.stringify(e.textContent.slice(0, 80)));
  }
  // Inline code (not a code block) holding math: ``e^{i theta_j}`` instead of :math:
  const mathy = /\^\{|_\{|\\[a-zA-Z]{2,}\{?/;
  for (const c of root.querySelectorAll("code")) {
    if (c.closest("pre, .highlight, a, dt, .sig")) continue;
    if (mathy.test(c.textContent)) found.push("math shown as code " + JSON.stringify(c.textContent.slice(0, 80)));
  }
  return found;
}"""

# Elements wider than the column they sit in. The column is the article's content box;
# each element is also compared with its nearest block ancestor.
_OVERFLOW_JS = r"""() => {
  const root = document.querySelector("article") || document.body;
  const col = root.getBoundingClientRect();
  const found = [];
  const blockParent = el => {
    let p = el.parentElement;
    while (p && getComputedStyle(p).display.startsWith("inline")) p = p.parentElement;
    return p;
  };
  const name = el => el.getAttribute("alt") || el.getAttribute("src") || el.id ||
    (el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className) || el.tagName;
  const check = (el, what) => {
    const r = el.getBoundingClientRect();
    if (r.width === 0) return;
    const p = blockParent(el);
    const pw = p ? p.clientWidth : col.width;
    if (r.width > pw + 1 || r.right > col.right + 1 || r.left < col.left - 1) {
      found.push(`${what} ${JSON.stringify(String(name(el)).slice(0, 60))} is ${Math.round(r.width)} px wide in a ${Math.round(Math.min(pw, col.width))} px column`);
    }
  };
  for (const img of root.querySelectorAll("img")) check(img, "image");
  for (const svg of root.querySelectorAll(".js-plotly-plot svg.main-svg")) check(svg, "plotly chart");
  for (const m of root.querySelectorAll("mjx-container[display='true']")) {
    const inner = m.firstElementChild;
    const w = inner ? inner.getBoundingClientRect().width : 0;
    const avail = m.clientWidth || m.getBoundingClientRect().width;
    if (w > avail + 1 || m.scrollWidth > m.clientWidth + 1) {
      found.push(`display equation ${JSON.stringify(m.textContent.slice(0, 40))} is ${Math.round(w)} px wide in ${Math.round(avail)} px`);
    }
  }
  return found;
}"""

_CODE_JS = r"""() => {
  const root = document.querySelector("article") || document.body;
  return [...root.querySelectorAll("pre")]
    .filter(p => p.scrollWidth > p.clientWidth + 1)
    .map(p => `${p.scrollWidth - p.clientWidth} px hidden: ` +
      JSON.stringify(p.textContent.split("\n").reduce((a, b) => b.length > a.length ? b : a, "").slice(0, 100)));
}"""


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 -- the base class's name
        pass


class _Server:
    """Serve ``root`` on 127.0.0.1 from a daemon thread."""

    def __init__(self, root: Path):
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()  # returns within serve_forever's poll interval
        self.httpd.server_close()


def _launch(playwright):
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("site-check: no chromium on PATH (apt-get install -y chromium)")
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)


def _matches(page: str, patterns) -> bool:
    return any(fnmatch.fnmatch(page, p) for p in patterns)


def list_pages(root: Path, patterns=None) -> list[str]:
    pages = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html"))
    pages = [p for p in pages if not _matches(p, SKIP_PAGES)]
    if patterns:
        pages = [p for p in pages if _matches(p, patterns)]
    return pages


def _check_page(context, base: str, page: str) -> list[Problem]:
    problems: list[Problem] = []
    tab = context.new_page()
    tab.set_viewport_size({"width": WIDTHS[0], "height": 900})
    tab.on(
        "console",
        lambda msg: msg.type == "error" and problems.append(Problem("console", page, msg.text)),
    )
    tab.on("pageerror", lambda err: problems.append(Problem("console", page, str(err))))
    tab.on(
        "requestfailed",
        lambda req: problems.append(
            Problem("request", page, f"{req.url} failed: {req.failure or 'blocked'}")
        ),
    )
    tab.on(
        "response",
        lambda resp: (
            resp.status >= 400
            and problems.append(Problem("request", page, f"{resp.url} answered {resp.status}"))
        ),
    )
    tab.goto(base + page, wait_until="load")
    tab.evaluate(_WAIT_JS)
    tab.wait_for_timeout(100)
    _exercise_controls(tab)  # an explorer that breaks on a change shows up as "console"
    for src in tab.evaluate(_IMAGES_JS):
        problems.append(Problem("image", page, f"{src} did not load"))
    for text in tab.evaluate(_TEX_JS):
        problems.append(Problem("tex", page, text))
    for width in WIDTHS:
        if width != WIDTHS[0]:
            tab.set_viewport_size({"width": width, "height": 900})
            tab.wait_for_timeout(400)  # plotly redraws on resize after a debounce
        for text in tab.evaluate(_OVERFLOW_JS):
            problems.append(Problem("overflow", page, f"at {width} px: {text}"))
        if width == WIDTHS[0] and _matches(page, CODE_PAGES):
            for text in tab.evaluate(_CODE_JS):
                problems.append(Problem("code-overflow", page, f"at {width} px: {text}"))
    tab.close()
    return problems


def _exercise_controls(tab) -> None:
    """Set every ``<select>`` of an explorer's controls (``.explorer-controls``) to each of
    its options in turn (at most 12 each), as a reader would: the page's scripts run on
    every change, and an error they raise is reported by the page's listeners."""
    selects = tab.locator(".explorer-controls select")
    for i in range(selects.count()):
        select = selects.nth(i)
        n = select.locator("option").count()
        for j in [*range(min(n, 12)), 0]:
            select.select_option(index=j)
    if selects.count():
        tab.wait_for_timeout(100)


def _check_search(context, base: str, query: str) -> list[Problem]:
    page = f"search.html?q={query}"
    tab = context.new_page()
    tab.goto(base + page, wait_until="load")
    try:
        tab.wait_for_function(
            """() => { const s = document.querySelector('#search-results .search-summary');
                       return s && !/^(Preparing|Searching)/.test(s.textContent.trim()); }""",
            timeout=20_000,
        )
    except Exception:  # noqa: BLE001 -- a timeout is the finding
        tab.close()
        return [Problem("search", page, "search never finished")]
    links = tab.eval_on_selector_all(
        "#search-results ul.search li a:first-of-type", "els => els.map(a => a.href)"
    )
    tab.close()
    if not links:
        return [Problem("search", page, f"no results for {query!r}")]
    seen, dups = set(), []
    for href in links:
        key = href.split("?")[0]
        if key in seen:
            dups.append(key)
        seen.add(key)
    return [Problem("search", page, f"listed twice: {d}") for d in dups]


def check_site(root, pages=None, search: str | None = "rotary", browser=None) -> list[Problem]:
    """All problems of the site in ``root`` (a directory of HTML files).

    ``browser``: a Playwright browser to reuse (the tests share one); by default Chromium
    is launched and closed here.
    """
    from playwright.sync_api import sync_playwright

    root = Path(root)
    pages = pages if pages is not None else list_pages(root)
    problems = check_links(root, pages)
    if browser is None:
        with sync_playwright() as pw:
            browser = _launch(pw)
            try:
                return problems + _browse(root, pages, search, browser)
            finally:
                browser.close()
    return problems + _browse(root, pages, search, browser)


def _browse(root: Path, pages: list[str], search: str | None, browser) -> list[Problem]:
    problems: list[Problem] = []
    with _Server(root) as server:
        context = browser.new_context()

        def local_only(route):
            if urlsplit(route.request.url).hostname in ("127.0.0.1", None) or (
                route.request.url.startswith(("data:", "blob:"))
            ):
                route.continue_()
            else:
                route.abort("blockedbyclient")

        context.route("**/*", local_only)
        for page in pages:
            if not _matches(page, NO_BROWSER_PAGES):
                problems += _check_page(context, server.url, page)
        if search:
            problems += _check_search(context, server.url, search)
        context.close()
    return problems


# -- screenshots -------------------------------------------------------------------------


def screenshots(root, pages, out_dir, widths=WIDTHS, modes=("light", "dark")) -> list[Path]:
    """Full-page PNGs of ``pages`` at each width and colour mode (pydata-sphinx-theme)."""
    from playwright.sync_api import sync_playwright

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with _Server(Path(root)) as server, sync_playwright() as pw:
        browser = _launch(pw)
        for mode in modes:
            context = browser.new_context()
            context.add_init_script(
                f"localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}');"
            )
            for page in pages:
                tab = context.new_page()
                for width in widths:
                    tab.set_viewport_size({"width": width, "height": 900})
                    tab.goto(server.url + page, wait_until="load")
                    tab.evaluate(_WAIT_JS)
                    tab.wait_for_timeout(300)
                    name = page.replace("/", "_").removesuffix(".html")
                    path = out_dir / f"{name}-{width}-{mode}.png"
                    tab.screenshot(path=str(path), full_page=True)
                    written.append(path)
                tab.close()
            context.close()
        browser.close()
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the built site, e.g. docs/_build/html")
    parser.add_argument("--pages", nargs="*", help="glob patterns of pages (default: all)")
    parser.add_argument("--search", default="rotary", help="query that must find a page")
    parser.add_argument("--screenshots", type=Path, help="write PNGs here instead of checking")
    args = parser.parse_args(argv)
    if not (args.root / "index.html").is_file():
        print(f"site-check: {args.root} has no index.html; build the site first", file=sys.stderr)
        return 2
    pages = list_pages(args.root, args.pages)
    start = time.perf_counter()
    if args.screenshots:
        for path in screenshots(args.root, pages, args.screenshots):
            print(path)
        return 0
    problems = check_site(args.root, pages, search=args.search)
    for problem in problems:
        print(problem)
    seconds = time.perf_counter() - start
    print(f"site-check: {len(pages)} pages, {len(problems)} problems ({seconds:.0f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
