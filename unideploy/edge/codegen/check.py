"""Syntax checks of generated Kotlin and Swift with tree-sitter grammars (the ``bundle`` extra).

No Kotlin or Swift compiler with the Android and iOS libraries installs on a Linux host, so the
parsers are what can prove here that every generated file is well-formed source.
"""

from __future__ import annotations

from typing import Any

from unideploy.registry import ExtraModules

GRAMMARS = {"kotlin": "tree_sitter_kotlin", "swift": "tree_sitter_swift"}
PARSERS = {language: ExtraModules("bundle", ("tree_sitter", grammar)) for language, grammar in GRAMMARS.items()}


def syntax_errors(source: str, language: str) -> list[str]:
    """``line:column`` of each syntax error or missing token; empty when the source parses cleanly."""
    import importlib

    import tree_sitter

    grammar = importlib.import_module(GRAMMARS[language])
    parser = tree_sitter.Parser(tree_sitter.Language(grammar.language()))
    tree = parser.parse(source.encode("utf-8"))
    found: list[str] = []
    _collect(tree.root_node, found)
    return found


def _collect(node: Any, found: list[str]) -> None:
    if node.is_error or node.is_missing:
        row, column = node.start_point
        found.append(f"{row + 1}:{column + 1} {'missing ' + node.type if node.is_missing else 'unexpected text'}")
        return
    if node.has_error:
        for child in node.children:
            _collect(child, found)
