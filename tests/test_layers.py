"""The tree reads as the data flow: every import points down it (files → parsers → tables → analysis → views
→ the API, TUI and CLI on top), no module reaches itself back through others, each input format is a package of
its own under ``parsers/`` that imports no other format, and no source file outgrows what a reader holds in mind.

Read with ``ast`` from the source, relative imports resolved, so every import counts wherever it is written: at the
top of a module, inside a function (run late, but still a dependency a reader must follow) or under
``if TYPE_CHECKING:`` (never run, but an annotation names what it depends on all the same)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: where each part of the package lives on disk, and its module prefix
SOURCES = {"tracekit": ROOT / "tracekit", "tracekit.parsers": ROOT / "parsers", "tracekit.tui": ROOT / "tui"}
#: layers, lowest first: a module may import its own layer and those below it
LAYERS = [
    ("process", ("tracekit.allocators",)),  # how the process allocates: below everything, imports nothing of ours
    ("engine", ("tracekit.engine",)),  # the graph engine in C: arrays in, arrays out (numpy only)
    ("model", ("tracekit.model",)),
    ("parsers", ("tracekit.parsers",)),
    ("loading", ("tracekit.loading",)),
    ("analysis", ("tracekit.analysis",)),
    ("scale", ("tracekit.scale",)),
    ("views", ("tracekit.views",)),
    ("capture", ("tracekit.capture",)),
    ("api", ("tracekit.api", "tracekit.diff", "tracekit.results_cache", "tracekit.torch", "tracekit")),
    ("integrations", ("tracekit.integrations",)),  # the frameworks' callbacks and the trackers: clients of the API
    ("tui", ("tracekit.tui",)),
    ("cli", ("tracekit.cli", "tracekit.__main__")),
]
#: annotations that name a type of a higher layer (under ``if TYPE_CHECKING:``, never run, no cycle): the only
#: imports that may point up. ``Analysis.dataset`` is the rank-by-rank dataset of :mod:`tracekit.scale.dataset`
ANNOTATIONS_UP = {("tracekit.analysis.pipeline", "tracekit.scale.dataset")}
#: the longest a source file may be (lines)
MAX_LINES = 800
PARSERS = "tracekit.parsers"
#: registered formats that are still modules beside the packages, with the prefix of their stage modules (none now;
#: the test below fails on an entry left behind)
NOT_YET_PACKAGES: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    """Every module of ours by its dotted name: the Python files, and the C extensions (``x.c`` builds the
    module ``x`` beside it; it imports nothing of ours)."""
    out = {}
    for prefix, folder in SOURCES.items():
        for f in [*folder.rglob("*.py"), *folder.rglob("*.c")]:
            rel = f.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = f
    return out


MODULES = _modules()


def layer(module: str) -> int:
    """The layer of a tracekit module (the longest matching prefix wins)."""
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = i, len(p)
    assert best >= 0, f"{module} is in no layer: add its package to LAYERS"
    return best


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def _ours(name: str, modules: dict[str, Path] | set[str]) -> str | None:
    """The module of ours that importing ``name`` reaches (the longest known prefix), or None."""
    if name != "tracekit" and not name.startswith("tracekit."):
        return None
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in modules else None


def imports_in(source: str, module: str, *, package: bool, modules: dict[str, Path] | set[str] = MODULES,
               ) -> list[tuple[str, int, str]]:
    """``(imported module of ours, line, where)`` of every import in ``source`` (the text of ``module``; ``package``:
    it is a package's ``__init__``), ``where`` one of ``top`` (run when the module is loaded), ``function``
    (run when called) and ``type-checking`` (under ``if TYPE_CHECKING:``). Relative imports are resolved;
    ``from P import x`` reaches the module ``P.x`` where there is one, else ``P`` itself."""
    tree = ast.parse(source)
    checking = _type_checking_lines(tree)
    top = {id(n) for n in tree.body} | {id(s) for n in tree.body if isinstance(n, ast.Try)
                                         for s in [*n.body, *[h for x in n.handlers for h in x.body]]}
    here = module if package else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                parent = ".".join([*base, *([node.module] if node.module else [])])
            else:
                parent = node.module or ""
            if parent == "tracekit" and all(a.name == "__version__" for a in node.names):
                continue  # the version string of the package root: a constant, not a dependency
            names = [f"{parent}.{a.name}" if f"{parent}.{a.name}" in modules else parent for a in node.names]
        if not names:
            continue
        where = "type-checking" if node.lineno in checking else "top" if id(node) in top else "function"
        for n in names:
            mod = _ours(n, modules)
            if mod is not None:
                out.append((mod, node.lineno, where))
    return out


def imports(module: str) -> list[tuple[str, int, str]]:
    """:func:`imports_in` of one of our modules (nothing for a C extension)."""
    path = MODULES[module]
    if path.suffix != ".py":
        return []
    return imports_in(path.read_text(), module, package=path.name == "__init__.py")


GRAPH = {m: sorted({n for n, _, _ in imports(m) if n != m}) for m in MODULES}


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every set of modules that reach each other (Tarjan's strongly connected components of more than one
    module), each as one loop through it, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(_loop(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def _loop(graph: dict[str, list[str]], comp: set[str]) -> list[str]:
    """One path that starts at the component's first module and comes back to it (breadth first: the shortest)."""
    start = min(comp)
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        nxt = []
        for v in todo:
            for w in graph.get(v, []):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in comp and w not in prev:
                    prev[w] = v
                    nxt.append(w)
        todo = nxt
    raise AssertionError(f"no loop through {start}")


def formats() -> set[str]:
    """The format packages: each folder of ``parsers/`` with an ``__init__.py`` (``tracekit.parsers.<format>``)."""
    return {f"{PARSERS}.{d.name}" for d in SOURCES[PARSERS].iterdir() if (d / "__init__.py").is_file()}


def format_of(module: str, packages: set[str]) -> str | None:
    """The format package ``module`` belongs to; None for the registry and the shared pieces beside the formats."""
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def cross_format(module: str, imported: list[str], packages: set[str]) -> list[str]:
    """What ``module`` (of ``tracekit.parsers``) imports that it must not: a format package imports only itself,
    the shared pieces beside the formats (``json_stream``, ``source``, ...) and the model; it never imports
    another format nor the registry (``tracekit.parsers`` itself, which imports every format); a shared piece
    imports no format."""
    mine = format_of(module, packages)
    bad = []
    for n in imported:
        other = format_of(n, packages)
        if (other is not None and other != mine) or (mine is not None and n == PARSERS):
            bad.append(n)
    return bad


def test_every_module_is_in_a_layer() -> None:
    for m in MODULES:
        layer(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_flow(module: str) -> None:
    mine = layer(module)
    up = [f"{n} (line {line}, {where}, layer {LAYERS[layer(n)][0]})" for n, line, where in imports(module)
          if layer(n) > mine and not (where == "type-checking" and (module, n) in ANNOTATIONS_UP)]
    assert not up, f"{module} (layer {LAYERS[mine][0]}) imports up the flow: {', '.join(up)}"


def test_no_import_cycle() -> None:
    """No module reaches itself through the imports of any kind: at the top, in functions, for type checking."""
    found = cycles(GRAPH)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_parsers_has_one_package_per_format() -> None:
    """Every registered format is a package of its own, and every module of a format lives in its package."""
    import tracekit.parsers as registry

    packages = formats()
    registered = [module for _, module in registry._REGISTERED]
    assert packages, "no format package under parsers/"
    for module in registered:
        if module not in NOT_YET_PACKAGES:
            assert f"{PARSERS}.{module}" in packages, f"the format module {module!r} is not a package under parsers/"
    for module in NOT_YET_PACKAGES:
        assert module in registered and f"{PARSERS}.{module}" not in packages, \
            f"{module!r} is a package now (or gone): remove it from NOT_YET_PACKAGES"
    loose = [p.name for p in SOURCES[PARSERS].glob("_*.py")
             if p.name != "__init__.py" and not p.name.startswith(tuple(NOT_YET_PACKAGES.values()))]
    assert not loose, f"private stage modules beside the formats (move them into their format's package): {loose}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(PARSERS + ".")))
def test_a_parser_imports_no_other_format(module: str) -> None:
    bad = cross_format(module, GRAPH[module], formats())
    assert not bad, f"{module} imports another format's package or the registry: {', '.join(bad)}"


def test_no_source_file_is_too_long() -> None:
    long = {str(p.relative_to(ROOT)): n for folder in SOURCES.values() for p in sorted(folder.rglob("*"))
            if p.suffix in (".py", ".c", ".h", ".tcss") and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"source files over {MAX_LINES} lines (split them by job): {long}"


# --- the checks above can fail -------------------------------------------------------------------------------


def test_the_layer_test_catches_an_upward_import() -> None:
    """A view importing the CLI would be refused (so the test above can fail)."""
    assert layer("tracekit.cli") > layer("tracekit.views.report") > layer("tracekit.analysis.graph.dag")
    assert layer("tracekit.parsers.kineto") < layer("tracekit.loading.traceset")


def test_every_kind_of_import_is_seen() -> None:
    """Top-level, function-level, TYPE_CHECKING and relative imports all count, each where it is written."""
    mods = {"tracekit.parsers", "tracekit.parsers.kineto", "tracekit.parsers.kineto.reader",
            "tracekit.parsers.kineto.scan", "tracekit.parsers.kineto.tables", "tracekit.parsers.json_stream",
            "tracekit.views.report", "tracekit.api"}
    src = ("from typing import TYPE_CHECKING\n"
           "from ..json_stream import Batch\n"
           "from . import scan, tables\n"
           "if TYPE_CHECKING:\n"
           "    from tracekit.api import Job\n"
           "def f():\n"
           "    import tracekit.views.report\n")
    got = imports_in(src, "tracekit.parsers.kineto.reader", package=False, modules=mods)
    assert got == [("tracekit.parsers.json_stream", 2, "top"), ("tracekit.parsers.kineto.scan", 3, "top"),
                   ("tracekit.parsers.kineto.tables", 3, "top"), ("tracekit.api", 5, "type-checking"),
                   ("tracekit.views.report", 7, "function")]
    # in a package's __init__, "." is the package itself
    assert imports_in("from .reader import parse\n", "tracekit.parsers.kineto", package=True, modules=mods) == \
        [("tracekit.parsers.kineto.reader", 1, "top")]


def test_the_cycle_test_catches_every_kind_of_cycle() -> None:
    """A loop through a function-level or a TYPE_CHECKING import is a cycle too; each loop is named once."""
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "x": ["y"], "y": ["x"]}
    assert cycles(graph) == [["a", "b", "c", "a"], ["x", "y", "x"]]
    assert cycles({"a": ["b"], "b": []}) == []
    mods = {"tracekit.api", "tracekit.diff"}
    api = imports_in("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tracekit.diff import Diff\n",
                     "tracekit.api", package=False, modules=mods)
    diff = imports_in("def f():\n    from tracekit.api import load\n", "tracekit.diff", package=False, modules=mods)
    graph = {"tracekit.api": [n for n, _, _ in api], "tracekit.diff": [n for n, _, _ in diff]}
    assert cycles(graph) == [["tracekit.api", "tracekit.diff", "tracekit.api"]]


def test_the_format_test_catches_a_cross_format_import() -> None:
    packages = {"tracekit.parsers.kineto", "tracekit.parsers.horovod", "tracekit.parsers.nccl"}
    assert cross_format("tracekit.parsers.kineto.tables", ["tracekit.parsers.horovod.phases"], packages) == \
        ["tracekit.parsers.horovod.phases"]
    assert cross_format("tracekit.parsers.kineto.tables", ["tracekit.parsers"], packages) == ["tracekit.parsers"]
    assert cross_format("tracekit.parsers.json_stream", ["tracekit.parsers.nccl"], packages) == \
        ["tracekit.parsers.nccl"]
    fine = ["tracekit.parsers.kineto.records", "tracekit.parsers.json_stream", "tracekit.model.schema"]
    assert cross_format("tracekit.parsers.kineto.tables", fine, packages) == []
    assert cross_format("tracekit.parsers", ["tracekit.parsers.source"], packages) == []


def test_every_package_is_installed() -> None:
    """Every folder of ours with an ``__init__.py`` is in ``pyproject.toml``'s package list: a wheel (not an editable
    install, which finds them by path) leaves out a package that is not listed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join([prefix, *f.parent.relative_to(folder).parts])
             for prefix, folder in SOURCES.items() for f in folder.rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
