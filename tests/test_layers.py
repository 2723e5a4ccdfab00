"""The tree reads as the data flow: every import points down it (files → parsers → tables → analysis → views
→ the API, TUI and CLI on top) and no module imports itself back through others. Read with ``ast`` from the
source, so a lazy import inside a function counts as much as one at the top; imports under
``if TYPE_CHECKING:`` (annotations only, never run) do not."""

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
    ("model", ("tracekit.model",)),
    ("parsers", ("tracekit.parsers",)),
    ("loading", ("tracekit.loading",)),
    ("analysis", ("tracekit.analysis",)),
    ("scale", ("tracekit.scale",)),
    ("views", ("tracekit.views",)),
    ("capture", ("tracekit.capture",)),
    ("api", ("tracekit.api", "tracekit.diff", "tracekit.results_cache", "tracekit.torch", "tracekit")),
    ("tui", ("tracekit.tui",)),
    ("cli", ("tracekit.cli", "tracekit.__main__")),
]


def _modules() -> dict[str, Path]:
    out = {}
    for prefix, folder in SOURCES.items():
        for f in folder.rglob("*.py"):
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


def imports(module: str) -> list[tuple[str, int, bool]]:
    """``(imported tracekit module, line, at module level)`` of everything ``module`` imports at run time."""
    tree = ast.parse(MODULES[module].read_text())
    skip = _type_checking_lines(tree)
    top = {id(n) for n in tree.body} | {id(s) for n in tree.body if isinstance(n, ast.Try)
                                         for s in [*n.body, *[h for x in n.handlers for h in x.body]]}
    out = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tracekit" and all(a.name == "__version__" for a in node.names):
                continue  # the version string of the package root: a constant, not a dependency
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                     for a in node.names]
        for n in names:
            if n == "tracekit" or n.startswith("tracekit."):
                while n not in MODULES and "." in n:
                    n = n.rsplit(".", 1)[0]
                out.append((n, node.lineno, id(node) in top))
    return out


def test_every_module_is_in_a_layer() -> None:
    for m in MODULES:
        layer(m)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_flow(module: str) -> None:
    mine = layer(module)
    up = [f"{n} (line {line}, layer {LAYERS[layer(n)][0]})" for n, line, _ in imports(module) if layer(n) > mine]
    assert not up, f"{module} (layer {LAYERS[mine][0]}) imports up the flow: {', '.join(up)}"


def test_no_import_cycle() -> None:
    """No module reaches itself through the imports that run when it is loaded (module level)."""
    graph = {m: sorted({n for n, _, top in imports(m) if top and n != m}) for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph.get(m, []):
            if state.get(n) == 1:
                cycle = [*stack[stack.index(n):], n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_layer_test_catches_an_upward_import(tmp_path: Path) -> None:
    """A view importing the CLI would be refused (so the test above can fail)."""
    assert layer("tracekit.cli") > layer("tracekit.views.report") > layer("tracekit.analysis.dag")
    assert layer("tracekit.parsers.kineto") < layer("tracekit.loading.traceset")


#: what the NCCL-log package may import of tracekit: the data model, itself and the parsers' shared readers
NCCL_MAY_IMPORT = ("tracekit.model", "tracekit.parsers.nccl", "tracekit.parsers.source")


def test_the_nccl_parser_imports_no_other_format() -> None:
    """``tracekit.parsers.nccl`` stands alone (relative imports resolved): no Kineto or Horovod module, nothing
    above the parsers."""
    bad = []
    for module, path in MODULES.items():
        if not (module == "tracekit.parsers.nccl" or module.startswith("tracekit.parsers.nccl.")):
            continue
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names = [f"{base}.{node.module}" if node.module else base] if node.level else [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for n in names:
                if n.startswith("tracekit") and not any(n == p or n.startswith(p + ".") for p in NCCL_MAY_IMPORT):
                    bad.append(f"{module} imports {n} (line {node.lineno})")
    assert not bad, bad
