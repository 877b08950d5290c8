"""No import circles anywhere in the project's packages, at any length (import-linter's
`acyclic_siblings` contract in `make lint` checks siblings; this checks every module,
a package and its own modules included)."""

from __future__ import annotations

import grimp

PACKAGES = ("gateway", "protocols", "gateway_bench")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert cycles(graph) == []


def test_the_check_finds_a_circle() -> None:
    graph = grimp.build_graph(*PACKAGES)
    graph.add_import(importer="gateway.config.settings", imported="gateway.app")
    assert any("gateway.app" in group for group in cycles(graph))
