"""Developer sessions: ``nox -s tests``, ``nox -s docs``, ``nox -s site-check``, ``nox -s lint``.

Every session installs through pip with ``constraints.txt`` so torch resolves to the
local CPU wheel (uv ignores this machine's pip configuration; see docs/developers.md).

``nox -s docs`` options (after ``--``):

* ``--clean``    delete the build, the generated gallery and API pages and the
  execution cache first, so every example and notebook runs again;
* ``--no-exec``  skip running examples and notebooks (quick prose edits); writes to
  ``docs/_build/html-noexec`` so the executed site and its caches stay intact.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "docs"]

ROOT = Path(__file__).parent
DOCS = ROOT / "docs"
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
PYTHON = "3.11"
GENERATED = [
    DOCS / "_build",
    DOCS / "auto_examples",
    DOCS / "api" / "generated",
    DOCS / "jupyter_execute",
]


def _install(session: nox.Session, extra: str) -> None:
    session.install("-e", f".[{extra}]", *CONSTRAINTS)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite and the docstring examples of src/posenc.

    Two pytest-xdist workers, one test file each at a time (``--dist loadfile``: a file's
    tests share the graphs they compile); ``nox -s tests -- -n 0`` runs in one process.
    """
    _install(session, "test")
    session.run("pytest", "-n", "2", "--dist", "loadfile", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the HTML site, executing the gallery and the notebooks."""
    args = list(session.posargs)
    clean = "--clean" in args
    no_exec = "--no-exec" in args
    _install(session, "docs")
    if clean:
        for path in GENERATED:
            shutil.rmtree(path, ignore_errors=True)
    out = DOCS / "_build" / ("html-noexec" if no_exec else "html")
    cmd = ["sphinx-build", "-W", "--keep-going", "-n", "-b", "html"]
    if no_exec:
        cmd += ["-D", "plot_gallery=0", "-D", "nb_execution_mode=off"]
        cmd += ["-d", str(DOCS / "_build" / "doctrees-noexec")]
    else:
        cmd += ["-d", str(DOCS / "_build" / "doctrees")]
    # An inherited MPLBACKEND=agg makes notebook figures vanish silently.
    os.environ.pop("MPLBACKEND", None)
    session.run(*cmd, str(DOCS), str(out))
    session.log(f"Site built: {out / 'index.html'}")


@nox.session(name="site-check", python=PYTHON)
def site_check(session: nox.Session) -> None:
    """Read the built site in Chromium (Playwright) and fail on what a reader would see broken.

    First the checker's own tests (tiny broken pages, one per kind of problem), then the
    site in docs/_build/html. Needs Debian's chromium (``apt-get install -y chromium``);
    Playwright never downloads a browser here. Posargs go to tools/site_check.py, e.g.
    ``nox -s site-check -- --pages "series/*" --screenshots shots/``.
    """
    if shutil.which("chromium") is None:
        session.error("site-check needs chromium: apt-get install -y chromium")
    session.install("-e", ".[sitecheck]", *CONSTRAINTS)
    if not session.posargs:
        session.run("pytest", "-q", "-o", "addopts=", "tests/test_site_check.py")
    session.run("python", "tools/site_check.py", str(DOCS / "_build" / "html"), *session.posargs)


@nox.session(name="docs-live", python=PYTHON)
def docs_live(session: nox.Session) -> None:
    """Serve the site with live reload while you write (sphinx-autobuild)."""
    _install(session, "docs")
    session.install("sphinx-autobuild", *CONSTRAINTS)
    session.run(
        "sphinx-autobuild",
        "-n",
        "--watch",
        str(ROOT / "src"),
        "--watch",
        str(ROOT / "examples"),
        "--ignore",
        "*/auto_examples/*",
        "--ignore",
        "*/api/generated/*",
        str(DOCS),
        str(DOCS / "_build" / "live"),
        *session.posargs,
    )


@nox.session(python=PYTHON)
def experiments(session: nox.Session) -> None:
    """The length-generalisation study of Part 6 (python -m posenc.experiments run).

    ``nox -s experiments`` runs (or resumes) the full grid, 10 encodings x 4 tasks x 5 seeds
    (seeds 0..4; ~100 min of 2-core CPU), with two processes into
    benchmarks/results/length_generalisation.jsonl; a results file is resumed only if its
    rows have the same config and commit, else refused before any training (run a grid
    from a fixed commit into ``--out build/...`` shards and merge them, see
    docs/developers.md). ``nox -s experiments -- --quick`` runs the miniature (under 3
    minutes) into a temporary file and prints its table. Other arguments go to ``run``
    (``--shard 1/4``, ``--out``, ``--device cuda``, ``--steps``...).

    ``nox -s experiments -- text`` runs (or resumes) the text study of Part 6 instead: 12
    encodings x 5 seeds of byte-level models on the standard library's source, RoPE's
    extensions included, into benchmarks/results/text_study.jsonl (about 2 hours of
    2-core CPU); ``-- text --quick`` a miniature in a temporary file. ``-- text --study
    extend`` extends the study's RoPE model to 4 and 8 times its length, every method at
    the factor that target needs, untrained and after the same short training, into
    benchmarks/results/text_extend.jsonl (5 seeds, about an hour of 2-core CPU); ``-- text
    --study passkey`` follows passkey retrieval through training (RoPE, ALiBi, NoPE at 1, 2
    and 4 times the steps, and Hugging Face's Llama on the same batches; seeds 0-2, about
    5.5 CPU-hours: 3 hours with two processes) into benchmarks/results/text_passkey.jsonl.
    """
    _install(session, "experiments")
    args = list(session.posargs)
    command = "run"
    if args[:1] == ["text"]:  # the text study: nox -s experiments -- text [--quick ...]
        command, args = "text", args[1:]
    if "--jobs" not in args:
        args += ["--jobs", "2"]
    session.run("python", "-m", "posenc.experiments", command, *args)


@nox.session(python=PYTHON)
def atlas(session: nox.Session) -> None:
    """The model atlas: every position scheme of the pinned transformers against posenc.

    Runs tools/atlas.py (HF's own rotary classes and apply functions, BLOOM's and MPT's
    ALiBi, T5's buckets, on each config class's defaults; M-RoPE also on image and video
    positions; and, for every model type with a per-layer scheme and a sample of others,
    HF's own attention per layer of a tiny float64 model in both config layouts against
    posenc's ``attend``: tools/atlas_e2e.py) into benchmarks/results/atlas.json, which the
    "Model atlas" page renders (that page does not import transformers); then
    tools/atlas_use.py (``posenc.hf.use`` end to end per model type) into
    benchmarks/results/atlas_use.json, which the "posenc inside Hugging Face models" page
    renders. About six minutes on 2 cores. ``-- --only llama gemma3`` runs some model directories only;
    ``-- --no-e2e`` skips the end-to-end check (about 20 s).
    """
    _install(session, "test")
    args = list(session.posargs) or []
    session.run("python", "tools/atlas.py", *args)
    if not args:  # posenc.hf.use end to end per model type (about a minute)
        session.run("python", "tools/atlas_use.py")


@nox.session(python=PYTHON)
def mutation(session: nox.Session) -> None:
    """Mutation testing of src/posenc with mutmut (slow: hours on 2 cores; not run in CI).

    Configuration in pyproject.toml ([tool.mutmut]): every test except the torch.compile
    ones. Arguments go to ``mutmut run``: ``-- --max-children 2``, and mutant-name patterns
    to mutate some modules only (``-- --max-children 2 "posenc.torch.cache.*"``); the
    score and the surviving mutants are printed at the end. ``mutmut show <name>`` shows one.
    Per-module scores accumulate in ``benchmarks/results/mutation.json`` (run module by
    module; survivors judged equivalent go in ``tools/mutation_equivalent.json``). For code
    changed since the last complete record, ``tools/mutation_sample.py draw`` (from the
    ``mutants/`` folder's parent, after any run) names a seeded random sample, ``mutmut run``
    those names, then ``tools/mutation_sample.py score`` writes its score and interval
    (``benchmarks/results/mutation_sample.json``).
    """
    _install(session, "test")
    session.install("mutmut==3.8.1", *CONSTRAINTS)
    session.run("mutmut", "run", *session.posargs)
    session.run("python", "tools/mutation_score.py", "--json", "benchmarks/results/mutation.json")


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


BENCH_PEERS = ["torchtune", "torchao", "rotary-embedding-torch", "transformers", "x-transformers"]
BENCHES = {  # name -> script; each writes benchmarks/results/<name>.json
    "rope": "benchmarks/bench_rope.py",
    "decode": "benchmarks/bench_decode.py",
    "alibi": "benchmarks/bench_alibi.py",
    "pope": "benchmarks/bench_pope.py",
    "packing": "benchmarks/bench_packing.py",
    "host": "benchmarks/bench_host.py",  # host time per call at a decode shape, vs HF / SDPA
    "gpu": "benchmarks/bench_gpu.py",  # CUDA only: says so and exits 0 elsewhere
    "gpu_scores": "benchmarks/bench_gpu_scores.py",  # CUDA only, as above
}


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against peers, measured in one run each; JSON in benchmarks/results/.

    ``nox -s bench`` runs them all; ``nox -s bench -- decode`` (``rope``, ``alibi``,
    ``pope``, ``packing``, ``host``, ``gpu``, ``gpu_scores``) one of them. ``--no-compile``
    skips RoPE's torch.compile rows. ``gpu`` (the rotation family, ``benchmarks/results/gpu.json``;
    liger-kernel's RoPE joins if installed) and ``gpu_scores`` (score biases, compiled
    decoding, ``gpu_scores.json``) measure on a CUDA GPU and write nothing without one. Peers
    (transformers, torchtune with torchao, rotary-embedding-torch, x-transformers) are
    installed into this session only.
    """
    _install(session, "test")
    session.install(*BENCH_PEERS, *CONSTRAINTS)
    names = [a for a in session.posargs if a in BENCHES] or list(BENCHES)
    extra = [a for a in session.posargs if a not in BENCHES]
    for name in names:
        args = [a for a in extra if a != "--no-compile" or name == "rope"]
        session.run("python", BENCHES[name], *args)
