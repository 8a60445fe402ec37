"""Sphinx configuration for the posenc site.

Offline by default: intersphinx reads a local Python inventory, MathJax 3 is served
from ``_static/mathjax`` and plotly.js is copied from the installed plotly package.
Set ``POSENC_DOCS_ONLINE=1`` (a hosted docs service) to link numpy/torch/matplotlib
and load MathJax from its CDN. Facts behind these choices: docs/developers.md.

``POSENC_SITE_URL`` (e.g. ``https://example.org/posenc/``) sets the canonical URL used by
the OpenGraph tags and the 404 page; Read the Docs provides its own.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import posenc

HERE = Path(__file__).parent
ROOT = HERE.parent
ONLINE = os.environ.get("POSENC_DOCS_ONLINE") == "1" or os.environ.get("READTHEDOCS") == "True"
SITE_URL = os.environ.get("READTHEDOCS_CANONICAL_URL") or os.environ.get("POSENC_SITE_URL", "")

# Notebook kernels get an IPython profile inside the build directory that draws figures
# as 2x ("retina") PNGs displayed at 1x size. Set before myst-nb starts any kernel; the
# code on the pages is unchanged, so readers' copies draw at their own defaults.
_IPYTHONDIR = HERE / "_build" / "ipython"
(_IPYTHONDIR / "profile_default").mkdir(parents=True, exist_ok=True)
(_IPYTHONDIR / "profile_default" / "ipython_kernel_config.py").write_text(
    'c.InlineBackend.figure_formats = {"retina"}\n'
    # The kernel logs a warning about unencrypted TCP at every start (ipykernel >= 7.4):
    # myst-nb starts its kernels on localhost and offers no setting to provision CurveZMQ
    # keys or IPC transport, so the kernel's own log is kept to errors (cell output and
    # tracebacks are messages to the notebook, not this log, and are unaffected).
    'c.IPKernelApp.log_level = "ERROR"\n'
)
os.environ["IPYTHONDIR"] = str(_IPYTHONDIR)

project = "posenc"
author = "The posenc developers"
copyright = "2026, the posenc developers"
release = version = posenc.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
    "sphinx_gallery.gen_gallery",
    "sphinx_design",
    "sphinx_copybutton",
    "sphinx.ext.viewcode",
    "sphinxcontrib.bibtex",
    "sphinxext.opengraph",
    "notfound.extension",
]

templates_path = ["_templates"]
exclude_patterns = [
    "_build",
    "**.ipynb_checkpoints",
    # sphinx-gallery writes a notebook beside each example page; myst-nb would read it
    # as a second source of the same document (MyST-NB issue 363).
    "auto_examples/**/*.ipynb",
    "auto_examples/*.ipynb",
    "sg_execution_times.rst",
    "series/*.json",
    "series/*.jsonl",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}
nitpicky = True

# -- References to other projects -------------------------------------------------------
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", (str(HERE / "_intersphinx" / "python.inv"), None)),
}
if ONLINE:
    intersphinx_mapping |= {
        "numpy": ("https://numpy.org/doc/stable", None),
        "torch": ("https://docs.pytorch.org/docs/stable", None),
        "matplotlib": ("https://matplotlib.org/stable", None),
    }
    nitpick_ignore_regex = []
else:
    # No offline inventories exist for these projects: their names render as code.
    nitpick_ignore_regex = [
        (r"py:.*", r"(numpy|np|torch|nn|matplotlib)(\..*)?"),
        (r"py:.*", r"(array_like|Tensor|Module|Parameter)"),
    ]
nitpick_ignore_regex += [(r"py:.*", r"transformers(\..*)?")]  # no inventory mapped: code

# -- Bibliography (docs/references.bib) ------------------------------------------------
bibtex_bibfiles = ["references.bib"]
bibtex_default_style = "unsrt"
bibtex_reference_style = "author_year"

# -- API reference (autosummary + numpydoc) -----------------------------------------
autosummary_generate = True
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_xref_param_type = True
numpydoc_xref_aliases = {
    "ndarray": "numpy.ndarray",
    "Tensor": "torch.Tensor",
    "array_like": "array_like",
    "Path": "pathlib.Path",
    "TransformerLM": "posenc.torch.TransformerLM",
    "PositionalEncoding": "posenc.torch.PositionalEncoding",
    "Schedule": "posenc.torch.Schedule",
    "RotaryEmbedding": "posenc.torch.RotaryEmbedding",
    "Task": "posenc.experiments.Task",
    "Job": "posenc.experiments.Job",
    "TextConfig": "posenc.experiments.text_study.TextConfig",
}
numpydoc_xref_ignore = {"of", "or", "optional", "default", "shape", "array_like"}
numpydoc_validation_checks = {"PR01", "PR02", "PR10", "RT02"}

# -- Gallery ---------------------------------------------------------------------------
sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "backreferences_dir": "api/generated/backreferences",
    "doc_module": ("posenc",),
    "download_all_examples": True,
    "remove_config_comments": True,
    # Teaching order: sections as listed here, scripts by their number (plot_NN_*.py).
    "subsection_order": [
        "../examples/order",
        "../examples/sinusoidal",
        "../examples/learned",
        "../examples/rope",
        "../examples/scores",
        "../examples/pope",
        "../examples/grids",
        "../examples/today",
        "../examples/packing",
        "../examples/hf",
    ],
    "within_subsection_order": "FileNameSortKey",
    "image_srcset": ["2x"],
    "write_computation_times": False,
    "matplotlib_animations": False,
    "show_memory": False,
    "min_reported_time": 1,
    "capture_repr": ("_repr_html_", "__repr__"),
    "first_notebook_cell": "# Run `pip install posenc matplotlib` first if needed.",
}

# -- Executed MyST notebooks -----------------------------------------------------------
nb_execution_mode = "cache"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_dmath_double_inline = True

# -- Math --------------------------------------------------------------------------------
if not ONLINE:
    mathjax_path = "mathjax/tex-svg-full.js"  # vendored MathJax 3.2.2 (Apache-2.0)

# -- HTML ------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "posenc"
html_logo = "_static/logo.svg"
html_favicon = "_static/favicon.svg"
html_static_path = ["_static"]
html_css_files = ["posenc.css"]
html_context = {"default_mode": "auto"}  # without it the theme logs an error on a first visit
html_theme_options = {
    "navbar_align": "left",
    "logo": {"text": "posenc", "alt_text": "posenc: home"},
    "show_toc_level": 2,
    "check_switcher": False,
    "footer_start": ["copyright", "posenc-version"],
    "footer_end": ["sphinx-version"],
    "secondary_sidebar_items": {
        "series/part*": ["notebook-download", "page-toc"],
        "explorer": ["notebook-download", "page-toc"],
    },
}
# Long pages with figures get the whole width: no left navigation on them (the series
# overview and the top bar lead there), so the text column is ~800 px at 1280 px.
html_sidebars = {
    "series/part*": [],
    "explorer": [],
    "architecture": [],
    "notation": [],
    "auto_examples/*/*": [],
}
html_show_sourcelink = False
html_baseurl = SITE_URL

# OpenGraph tags (title, description, image) for links shared on social sites.
ogp_site_url = SITE_URL
ogp_site_name = "posenc"
ogp_image = "_static/logo.png"
ogp_image_alt = "posenc logo: two clock hands turning at different speeds"
ogp_description_length = 200
ogp_social_cards = {"enable": False}  # would draw a card per page with matplotlib
ogp_type = "website"

# The 404 page uses absolute URLs: a host serves it at any missing path.
notfound_urls_prefix = (urlsplit(SITE_URL).path or "/") if SITE_URL else "/"
notfound_context = {
    "title": "Page not found",
    "body": (
        "<h1>Page not found</h1><p>There is no page at this address. Start again from "
        f'the <a href="{notfound_urls_prefix}index.html">home page</a> or '
        f'<a href="{notfound_urls_prefix}series/index.html">the series</a>, '
        "or use the search box above.</p>"
    ),
}
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

# Interactive plotly figures: serve plotly.js from the installed package (no CDN) and
# load it only on pages that need it.
PLOTLY_PAGES = {"auto_examples/sinusoidal/plot_05_wavelength_fan", "explorer"}
# Executed notebooks offered for download: myst-nb writes them beside the build.
NOTEBOOK_PAGES = ("series/part", "explorer")


def _page_context(app, pagename, templatename, context, doctree):
    if pagename in PLOTLY_PAGES:
        app.add_js_file("plotly.min.js")
    if pagename.startswith(NOTEBOOK_PAGES):
        context["notebook_download"] = f"_downloads/notebooks/{pagename.split('/')[-1]}.ipynb"


def _copy_build_files(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    import plotly

    out = Path(app.outdir)
    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    shutil.copy2(src, out / "_static" / "plotly.min.js")
    notebooks = out / "_downloads" / "notebooks"
    notebooks.mkdir(parents=True, exist_ok=True)
    executed = Path(app.outdir).parent / "jupyter_execute"
    for docname in app.env.found_docs:
        if docname.startswith(NOTEBOOK_PAGES):
            nb = executed / f"{docname}.ipynb"
            if not nb.is_file():  # a --no-exec build: offer the notebook without outputs
                nb = _unexecuted_notebook(app, docname, notebooks)
            shutil.copy2(nb, notebooks / nb.name)


def _unexecuted_notebook(app, docname, out_dir):
    import nbformat
    from myst_nb.core.read import read_myst_markdown_notebook

    text = Path(app.env.doc2path(docname)).read_text(encoding="utf-8")
    path = out_dir / f"{docname.split('/')[-1]}.ipynb"
    nbformat.write(read_myst_markdown_notebook(text), path)
    return path


BENCH_RESULTS = ["rope.json", "alibi.json", "decode.json", "pope.json", "atlas.json",
                 "atlas_use.json", "hf_use.json",
                 "packing.json", "gpu.json",
                 "length_generalisation.jsonl", "length_generalisation_heldout.jsonl",
                 "text_study.jsonl", "text_extend.jsonl", "text_passkey.jsonl",
                 "text_today.jsonl"]  # fmt: skip


_CHANGED_RESULTS = set()  # results files whose copy beside the pages was out of date


def _copy_bench_results(app, config):
    # Series pages draw committed benchmark and study results; each page reads them from
    # beside itself (and offers them for download), a path a reader of the notebook has.
    for name in BENCH_RESULTS:
        src, dst = ROOT / "benchmarks" / "results" / name, HERE / "series" / name
        if src.exists():
            if not dst.exists() or dst.read_bytes() != src.read_bytes():
                _CHANGED_RESULTS.add(name)
            shutil.copy2(src, dst)


def _readers_of_changed_results(app, env, added, changed, removed):
    # jupyter-cache keys a page on its code cells, not on the files they read: a page that
    # names a results file which changed (pages spell the names out) is read again, its
    # cached outputs dropped, so an incremental build does not print the old rows
    if not _CHANGED_RESULTS:  # the usual build: read no page for this
        return []

    def reads_changed(doc):
        text = Path(env.doc2path(doc)).read_text(encoding="utf-8")
        return any(name in text for name in _CHANGED_RESULTS)

    readers = [d for d in env.found_docs if reads_changed(d)]  # also those Sphinx re-reads
    # (a {download} of the file makes it a dependency): their cached outputs go too
    cache_dir = Path(app.outdir).parent / ".jupyter_cache"
    if readers and cache_dir.exists():
        from jupyter_cache import get_cache

        cache, paths = get_cache(str(cache_dir)), {str(Path(env.doc2path(d))) for d in readers}
        for record in cache.list_cache_records():
            if record.uri in paths:
                cache.remove_cache(record.pk)
    return [d for d in readers if d not in changed]


def _prose_only(app, config):
    # A build that executes nothing (nox -s docs -- --no-exec) has no glued values: the
    # sentences that print numbers computed by a page's cells ({glue:text} roles) are left
    # empty there instead of failing the -W build.
    if config.nb_execution_mode == "off":
        config.suppress_warnings = [*config.suppress_warnings, "mystnb.glue"]


def setup(app):
    app.connect("config-inited", _copy_bench_results)
    app.connect("env-get-outdated", _readers_of_changed_results)
    app.connect("config-inited", _prose_only)
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _copy_build_files)
