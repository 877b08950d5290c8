"""Private names of other packages (vLLM's, Ray's) used outside the seams: `make lint` runs
`python tests/private_names.py gateway protocols gateway_bench tests`, which prints each and
exits 1 if any.

The seams (SEAMS) are the only modules that may touch another package's private names: a vLLM or
Ray upgrade then looks there first (docs/ARCHITECTURE.md, "The seam to vLLM"). Without types,
"private and someone else's" is read from the names:
- an import from `vllm` or `ray` of an underscore name, or any import through an underscore
  module (`ray.serve._private.common`, `vllm._C`);
- `anything._name`, read or written, where the project itself defines no `_name` (no function,
  class or module-level name of that spelling, no `self._name` or class attribute of it): the
  project's own private names may be used across its modules (tests reading a helper's state),
  a library's may not;
- a call's `_keyword=` argument, where no function of the project has that parameter.
A library private that happens to share its spelling with one of the project's goes unseen.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

SEAMS = frozenset({"gateway/engine/vllm_seam.py", "gateway/engine/ray_seam.py"})
PRIVATE_PACKAGES = ("vllm", "ray")
# Underscore names that are public by convention: namedtuple's API.
CONVENTIONAL = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in CONVENTIONAL


def own_names(trees: Iterable[ast.Module]) -> set[str]:
    """The private names the project defines: its functions, classes and parameters, names it
    assigns, and attributes it sets on `self` / `cls` or in a class body."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            match node:
                case ast.FunctionDef(name=name) | ast.AsyncFunctionDef(name=name):
                    own.add(name)
                case ast.ClassDef(name=name):
                    own.add(name)
                case ast.arg(arg=name):
                    own.add(name)
                case ast.Name(id=name, ctx=ast.Store()):
                    own.add(name)
                case ast.Attribute(value=ast.Name(id="self" | "cls"), attr=name, ctx=ast.Store()):
                    own.add(name)
                case ast.alias(asname=str(name)):
                    own.add(name)
    return own


def _private_import(node: ast.Import | ast.ImportFrom) -> str | None:
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
        names: list[str] = []
    else:
        modules = [node.module or ""]
        names = [alias.name for alias in node.names]
    for module in modules:
        parts = module.split(".")
        if any(_private(p) for p in parts):
            return f"import through a private module: {module}"
        if parts[0] in PRIVATE_PACKAGES:
            hidden = [n for n in names if _private(n)]
            if hidden:
                return f"private name imported from {module}: {', '.join(hidden)}"
    return None


def findings(tree: ast.Module, own: set[str]) -> Iterator[tuple[int, str]]:
    """(line, what) for each private name of another package that `tree` uses."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found = _private_import(node)
            if found:
                yield node.lineno, found
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            yield node.lineno, f"private attribute of another package: {ast.unparse(node)}"
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg and _private(keyword.arg) and keyword.arg not in own:
                    yield node.lineno, f"private parameter of another package: {keyword.arg}="


def check(root: Path, folders: Iterable[str]) -> list[str]:
    """Each use of another package's private name outside SEAMS, as `path:line: what`."""
    files = sorted(p for folder in folders for p in (root / folder).rglob("*.py"))
    trees = {p.relative_to(root).as_posix(): ast.parse(p.read_text(), str(p)) for p in files}
    own = own_names(trees.values())
    return [
        f"{path}:{line}: {what}"
        for path, tree in trees.items()
        if path not in SEAMS
        for line, what in sorted(findings(tree, own))
    ]


def main(argv: list[str]) -> int:
    found = check(Path.cwd(), argv or ["gateway", "protocols", "gateway_bench", "tests"])
    for line in found:
        print(line)
    if found:
        print(
            f"{len(found)} private name(s) of vLLM or Ray (or another package) outside "
            f"{', '.join(sorted(SEAMS))}: reach them through a seam",
            file=sys.stderr,
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
