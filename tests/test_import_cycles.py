"""No import circles anywhere in the project's packages, at any length (import-linter's
`acyclic_siblings` contract in `make lint` checks siblings; this checks every module,
a package and its own modules included)."""

from __future__ import annotations

import grimp

PACKAGES = ("gateway", "protocols", "gateway_bench")


def circles(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Each direct import `a -> b` where `b` leads back to `a` (a circle through both)."""
    return [
        (importer, imported)
        for importer in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(importer))
        if graph.chain_exists(importer=imported, imported=importer)
    ]


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert circles(graph) == []


def test_the_check_finds_a_circle() -> None:
    graph = grimp.build_graph(*PACKAGES)
    graph.add_import(importer="gateway.config.settings", imported="gateway.app")
    assert ("gateway.config.settings", "gateway.app") in circles(graph)
