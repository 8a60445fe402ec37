"""Docs sources that only a clean build reads: API summaries and notebook cell headers.

The API index's one-line summaries must be valid reStructuredText.

Sphinx's autosummary cuts each docstring at its first sentence end (a period followed by
white space). A period inside an inline literal (``start .. stop``) cuts the literal in
two, and the clean docs build fails under ``-W`` ("Inline literal start-string without
end-string"); the incremental build does not re-read the page and stays green.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

INDEX = Path(__file__).resolve().parents[1] / "docs" / "api" / "index.rst"


def _listed():
    """``(qualified name, object)`` of every entry of the index's autosummary tables."""
    module, out = None, []
    for line in INDEX.read_text().splitlines():
        m = re.match(r"\.\. (?:module|currentmodule):: (\S+)", line)
        if m:
            module = importlib.import_module(m.group(1))
            continue
        m = re.match(r" {3}([A-Za-z_][\w.]*)\s*$", line)
        if m and module is not None:
            obj = module
            for part in m.group(1).split("."):
                obj = getattr(obj, part, None)
            if obj is not None:
                out.append((f"{module.__name__}.{m.group(1)}", obj))
    return out


def _first_sentence(doc: str) -> str:
    para = inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ")
    m = re.search(r"\.\s", para + " ")
    return para[: m.start() + 1] if m else para


def test_the_index_lists_what_it_documents():
    assert len(_listed()) >= 90  # the tables were read, not skipped


def test_no_summary_cuts_an_inline_literal():
    bad = [(name, _first_sentence(obj.__doc__)) for name, obj in _listed()
           if obj.__doc__ and _first_sentence(obj.__doc__).count("``") % 2]  # fmt: skip
    assert not bad, bad


def test_the_check_sees_a_cut_literal():
    assert _first_sentence("Acts on ``start .. stop`` only.").count("``") % 2 == 1


def _cell_options():
    """``(page, line, options text)`` of every notebook code cell with a YAML header."""
    docs = INDEX.parents[1]
    for page in sorted(docs.rglob("*.md")):
        if "_build" in page.parts:
            continue
        text = page.read_text()
        for m in re.finditer(r"```\{code-cell\}[^\n]*\n---\n(.*?)\n---\n", text, flags=re.S):
            yield page.relative_to(docs), text[: m.start()].count("\n") + 1, m.group(1)


def test_every_notebook_cell_header_is_yaml():
    # a caption with ": " in it is a YAML error that stops the docs build (myst-nb)
    yaml = pytest.importorskip("yaml")
    cells = list(_cell_options())
    assert len(cells) >= 20
    for page, line, options in cells:
        try:
            yaml.safe_load(options)
        except yaml.YAMLError as err:
            pytest.fail(f"{page}:{line}: {err}")
