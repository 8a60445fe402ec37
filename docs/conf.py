"""Sphinx configuration for the posenc site.

Offline by default: intersphinx reads a local Python inventory, MathJax 3 is served
from ``_static/mathjax`` and plotly.js is copied from the installed plotly package.
Set ``POSENC_DOCS_ONLINE=1`` (a hosted docs service) to link numpy/torch/matplotlib
and load MathJax from its CDN. Facts behind these choices: docs/developers.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import posenc

HERE = Path(__file__).parent
ONLINE = os.environ.get("POSENC_DOCS_ONLINE") == "1"

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

# -- API reference (autosummary + numpydoc) -----------------------------------------
autosummary_generate = True
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_xref_param_type = True
numpydoc_xref_aliases = {
    "ndarray": "numpy.ndarray",
    "Tensor": "torch.Tensor",
    "array_like": "array_like",
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
    "reference_url": {"posenc": None},
    "download_all_examples": True,
    "remove_config_comments": True,
    "subsection_order": ["../examples/sinusoidal", "../examples/rope"],
    "within_subsection_order": "FileNameSortKey",
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
html_static_path = ["_static"]
html_css_files = ["posenc.css"]
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "check_switcher": False,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_show_sourcelink = False
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

# Interactive plotly figures: serve plotly.js from the installed package (no CDN) and
# load it only on pages that need it.
PLOTLY_PAGES = {"auto_examples/sinusoidal/plot_wavelength_fan"}


def _plotly_js(app, pagename, templatename, context, doctree):
    if pagename in PLOTLY_PAGES:
        app.add_js_file("plotly.min.js")


def _copy_plotly(app, exception):
    if exception is None and app.builder.format == "html":
        import plotly

        src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        shutil.copy2(src, Path(app.outdir) / "_static" / "plotly.min.js")


def setup(app):
    app.connect("html-page-context", _plotly_js)
    app.connect("build-finished", _copy_plotly)
