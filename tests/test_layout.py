"""The layout of src/posenc shows the architecture, and the public API does not move.

* every public name of 0.1.0 (``posenc``, ``posenc.torch``, ``posenc.scaling``) still imports
  from where it did;
* no import circle anywhere in ``src/posenc`` (module-level and function-level imports);
* in ``posenc.torch`` the arrows point down the layers: positions and kernels, then the
  encodings, the attention core, the caches, the model; the NumPy side never imports torch;
* no file over 300 lines; at most three modules directly in ``posenc/torch``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "posenc"

# Every public name of posenc 0.1.0 before the layout change (commit 8a16018), by module.
PUBLIC = {
    "posenc": [
        "alibi_bias", "alibi_slopes", "attention", "axial_frequencies", "causal_mask",
        "fire_bias", "frequencies", "grid_positions", "kerple_bias", "mrope_frequencies",
        "mrope_positions", "permutation_matrix", "pope_frequencies", "pope_scores", "rope",
        "rope_frequencies", "rope_nd", "scaling", "shift_operator", "sinusoidal",
        "sinusoidal_2d", "sinusoidal_dot", "t5_buckets", "wavelengths", "xpos", "xpos_decay",
    ],
    "posenc.torch": [
        "ALiBi", "AxialRotaryEmbedding", "FIRE", "KERPLE", "T5RelativeBias", "KVCache",
        "LearnedEncoding", "MRoPE", "MultiHeadAttention", "NoPE", "PoPE", "PositionalEncoding",
        "RotaryEmbedding", "SinusoidalEncoding", "SinusoidalEncoding2D", "StaticKVCache",
        "TransformerLM", "XPos", "apply_rope", "as_positions", "attend", "attention_mask",
        "half_to_interleaved", "interleaved_to_half", "position_tensor", "kernels",
    ],
    "posenc.scaling": [
        "Scaling", "Linear", "NTK", "DynamicNTK", "YaRN", "Llama3", "LongRoPE", "Proportional",
        "from_hf",
    ],
}  # fmt: skip

# posenc.torch's layers, bottom up: a module may import its own layer and those below.
LAYERS = {"positions": 0, "kernels": 0, "encodings": 1, "attention": 2, "cache": 3, "model": 4,
          "hf": 5}  # fmt: skip
# The one import that points the other way, on purpose: posenc.scaling.from_hf, kept for
# 0.1.0's API, resolves the bridge's function when first asked for (never at import).
# posenc.hf.use, to_hf and from_pretrained resolve posenc.torch.hf the same way.
LAZY_ALIASES = {("posenc.scaling", "posenc.hf"), ("posenc.hf", "posenc.torch.hf")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known) -> set[str]:
    """posenc modules that ``name`` imports anywhere in its file (``from a import b``
    counts ``a.b`` when that is a module, else ``a``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m in known and m != name}


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_of_0_1_0_still_imports_from_where_it_did(module):
    mod = importlib.import_module(module)
    missing = [n for n in PUBLIC[module] if not hasattr(mod, n)]
    assert missing == []
    for n in PUBLIC[module]:  # and by a from-import, as users write it
        exec(f"from {module} import {n}", {})


def _cycles(edges) -> list:
    """Every back edge of a depth-first walk, as the circle it closes."""
    state, found = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_circle_anywhere_in_posenc(graph):
    edges = {a: {b for b in bs if (a, b) not in LAZY_ALIASES} for a, bs in graph.items()}
    assert _cycles(edges) == []
    with_alias = _cycles(graph)  # an alias alone would close one through the bridge
    assert with_alias and all(set(zip(c, c[1:], strict=False)) & LAZY_ALIASES for c in with_alias)


def test_the_circle_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def _layer(name: str):
    parts = name.split(".")
    if parts[:2] != ["posenc", "torch"] or len(parts) < 3:
        return None
    return LAYERS.get(parts[2])


def test_arrows_point_down_the_layers_of_posenc_torch(graph):
    up = [
        (a, b)
        for a, bs in graph.items()
        for b in bs
        if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)
    ]
    assert up == []
    assert set(LAYERS) <= {p.stem for p in (PACKAGE / "torch").iterdir()}  # names still exist


def test_the_numpy_side_never_imports_torch_and_scaling_never_the_bridge(graph):
    numpy_side = [n for n in graph if not n.startswith(("posenc.torch", "posenc.experiments"))]
    into_torch = [(a, b) for a in numpy_side for b in graph[a] if b.startswith("posenc.torch")]
    assert into_torch == [("posenc.hf", "posenc.torch.hf")]  # the lazy alias only
    source = (PACKAGE / "hf" / "__init__.py").read_text()
    top = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom | ast.Import)]
    assert all("torch" not in ast.unparse(n) for n in top)  # not imported at import time
    scaling = [a for a in graph if a.startswith("posenc.scaling") or a.startswith("posenc.enc")]
    bridge = [(a, b) for a in scaling for b in graph[a] if b.startswith("posenc.hf")]
    assert bridge == [("posenc.scaling", "posenc.hf")]  # the lazy alias only
    source = (PACKAGE / "scaling" / "__init__.py").read_text()
    top = [n for n in ast.parse(source).body if isinstance(n, ast.ImportFrom | ast.Import)]
    assert all("hf" not in ast.unparse(n) for n in top)  # not imported at import time


def test_the_numpy_reference_mirrors_the_torch_encodings():
    # an encoding's formula and its torch module are found by the same name
    def files(root):
        return {p.relative_to(root) for p in root.rglob("*.py") if p.parent != root}

    numpy_side = files(PACKAGE / "encodings")
    torch_side = files(PACKAGE / "torch" / "encodings")
    assert {p.parent.name for p in numpy_side} == {"input", "qk", "scores"}  # the places
    assert {p.parent.name for p in torch_side} == {"input", "qk", "scores"}
    assert numpy_side - torch_side == set()  # every formula has its torch module


def test_no_file_over_300_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 300
    }
    assert long == {}


def test_posenc_torch_shows_its_roles_with_at_most_three_modules_at_the_top():
    top = sorted(p.name for p in (PACKAGE / "torch").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 3, top
    folders = {p.name for p in (PACKAGE / "torch").iterdir() if (p / "__init__.py").exists()}
    assert folders == {"encodings", "attention", "cache", "kernels", "model", "hf"}
    for folder in folders:  # each says what lives there and what it may import
        doc = ast.get_docstring(ast.parse((PACKAGE / "torch" / folder / "__init__.py").read_text()))
        assert doc and doc.strip(), folder
