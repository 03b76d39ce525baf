"""The import structure of swax, checked: no import circles, and the layering contract.

    python tools/check_imports.py [PACKAGE_DIR]     (default: swax and experiments; exit 1 on
                                                     any violation)

Every ``import``/``from … import`` of the package's own modules counts: at the top of a file,
inside a function (a circle through a function-level import is still a circle: it only fails
later) and under ``if TYPE_CHECKING:`` (an import for annotations never runs, but a reader still
meets the circle).

The contract (``CONTRACT`` and ``FORBIDDEN`` below; docs/design.md draws it), from the bottom:
``core`` (infrastructure) imports nothing else from swax; the ops import nothing but the ops;
the layers only the ops; ``config`` only core; the data code never imports the model,
generation, probes, training or evaluation; nothing below training and evaluation (config,
state, model, decode, generation, data, probes, export) imports them, the sweeps or the command
line; training and evaluation stand side by side (neither imports the other); the sweeps sit
above both; the command line is on top and nothing else imports it. ``make lint`` runs this
script; ``tests/core/test_imports.py`` checks that it catches what it should.

The studies (``experiments``, docs/studies.md) have their own contract (``STUDY_READS``): the
shared study code ``lab`` imports no study; a study imports ``lab`` and itself, and another study
only where it reads that study's results (declared in STUDY_READS); tests are outside the
contract (they may import any study), and no import circle anywhere.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

CONTRACT: list[tuple[str, tuple[str, ...], str]] = [
    # (importer prefix, prefixes it may import from the package, what the rule says)
    ("core", ("core",), "core imports nothing else from swax"),
    ("ops", ("ops",), "ops import nothing else from swax"),
    ("layers", ("layers", "ops"), "layers import only the ops"),
    ("config", ("config", "core", "version"), "config imports only core (not the ops)"),
]
BELOW_TRAIN_AND_EVAL = (
    "config",
    "state",
    "model",
    "init",
    "generate",
    "decode",
    "data",
    "probes",
    "export",
)
"""The modules under training and evaluation in the data flow (data -> train -> model, eval ->
probes -> model): they never import train, eval, the sweeps or the command line."""
FORBIDDEN: list[tuple[str, tuple[str, ...], str]] = [
    # (importer prefix, prefixes it must not import, what the rule says)
    (
        "data",
        (
            "model",
            "init",
            "decode",
            "generate",
            "probes",
            "export",
            "train",
            "eval",
            "sweep",
            "cli",
        ),
        "data never imports model, generation, probes, train or eval",
    ),
    *(
        (low, ("train", "eval", "sweep", "cli"), "nothing below train or eval imports them")
        for low in BELOW_TRAIN_AND_EVAL
    ),
    ("train", ("eval", "sweep", "cli"), "train and eval side by side: neither imports the other"),
    ("eval", ("train", "sweep", "cli"), "train and eval side by side: neither imports the other"),
    ("sweep", ("cli",), "the command line is on top: nothing else imports it"),
]


STUDY_READS: dict[str, tuple[str, ...]] = {
    # study: the studies whose committed results it reads through their modules
    "text_study": ("laziness_map", "far_share"),
    "regime_study": ("laziness_map", "claims", "far_share", "text_only", "text_study"),
    "depth_study": ("text_study", "laziness_map", "far_share"),  # the 2-layer verdicts beside it
}


def study_rule(importer: str, target: str) -> str | None:
    """The rule of the studies' contract that ``importer`` importing ``target`` breaks, if any
    (names relative to the experiments package; "" is the package itself)."""
    parts = importer.split(".")
    if not importer or "tests" in parts or parts[-1] == "conftest" or not target:
        return None
    top, other = parts[0], target.split(".")[0]
    if top == "lab":
        return None if other == "lab" else "lab imports no study"
    if other in {"lab", top, *STUDY_READS.get(top, ())}:
        return None
    return (
        f"a study imports lab and the studies it reads (STUDY_READS: {top} reads none of {other})"
    )


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name (relative to the package, "" for its __init__) -> file."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node of ``tree``, at any depth: in a function, and under ``if
    TYPE_CHECKING:`` too (an import for annotations still makes the reader meet a circle)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imports_of(name: str, path: Path, package: str, modules: dict[str, Path]) -> set[str]:
    """The package modules that module ``name`` imports (as names relative to the package)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if name else []
    base_pkg = here if is_pkg else here[:-1]
    found: set[str] = set()

    def add(dotted: list[str]) -> None:
        while dotted and ".".join(dotted) not in modules:  # a name imported from a module
            dotted = dotted[:-1]
        found.add(".".join(dotted))
        # importing a.b.c runs the __init__ of a.b first: an edge to each package on the way,
        # except the importer's own packages (already being imported) and the root package
        for i in range(1, len(dotted)):
            parent = dotted[:i]
            if parent != here[:i]:
                found.add(".".join(parent))

    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == package:
                    add(parts[1:])
            continue
        if node.level:
            target = base_pkg[: len(base_pkg) - (node.level - 1)]
            target = target + (node.module.split(".") if node.module else [])
        elif node.module and node.module.split(".")[0] == package:
            target = node.module.split(".")[1:]
        else:
            continue
        for alias in node.names:
            add(target + [alias.name])
    found.discard(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    return {n: imports_of(n, p, root.name, modules) for n, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def contract_violations(graph: dict[str, set[str]], broken_rule=None) -> list[str]:
    """One line per module that breaks a rule (the first rule it breaks): by a direct import,
    or through the modules it imports (``a imports c (via b)``). ``broken_rule``: the package's
    contract (default: swax's)."""
    broken_rule = broken_rule or _broken_rule
    problems = []
    for importer in sorted(graph):
        broken = {
            target: (via, rule)
            for target, via in _reachable(graph, importer, broken_rule).items()
            if (rule := broken_rule(importer, target))
        }
        for target, (via, rule) in sorted(broken.items()):
            if any(other.startswith(target + ".") for other in broken):
                continue  # a package whose module is named: one line for the import
            how = f" (via {via})" if via else ""
            problems.append(f"{importer} imports {target or '(package)'}{how}: {rule}")
    return problems


def _reachable(graph: dict[str, set[str]], start: str, broken_rule=None) -> dict[str, str | None]:
    """Every module ``start`` imports, directly (None) or through others (the first module on
    the way), in breadth-first order; imports of a broken direct import are not followed, so
    that each break is reported once, where it is."""
    seen: dict[str, str | None] = {}
    queue = [(t, None) for t in sorted(graph.get(start, ()))]
    while queue:
        target, via = queue.pop(0)
        if target in seen or target == start:
            continue
        seen[target] = via
        if (broken_rule or _broken_rule)(start, target) is None:
            queue += [(t, via or target) for t in sorted(graph.get(target, ()))]
    return seen


def _broken_rule(importer: str, target: str) -> str | None:
    for prefix, allowed, rule in CONTRACT:
        if _under(importer, prefix) and not any(_under(target, a) for a in allowed):
            return rule
    for prefix, banned, rule in FORBIDDEN:
        if _under(importer, prefix) and any(_under(target, b) for b in banned):
            return rule
    return None


def check(root: Path) -> list[str]:
    """Every problem found in the package folder ``root``, one line each (empty: all good)."""
    graph = import_graph(root)
    name = root.name
    problems = [
        "import circle: " + " <-> ".join(f"{name}.{m}" if m else name for m in comp)
        for comp in circles(graph)
    ]
    rule = study_rule if name == "experiments" else _broken_rule
    return problems + [f"{name}.{p}" for p in contract_violations(graph, rule)]


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parents[1]
    roots = [Path(a) for a in argv[1:]] or [here / "swax", here / "experiments"]
    found = 0
    for root in roots:
        if not root.is_dir():
            print(f"check_imports: {root} is not a folder", file=sys.stderr)
            return 2
        problems = check(root)
        for p in problems:
            print(p, file=sys.stderr)
        found += len(problems)
        n = len(module_names(root))
        print(f"check_imports: {root.name}: {n} modules, {len(problems)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
