"""Resolving the NAME of ``%whereis NAME`` without evaluating code: a name, attributes and constant
indices, with close matches when the name is not there.
"""
from __future__ import annotations

import ast
from typing import Any, Mapping

from ..errors import MagicInputError
from .walk import Walk, static_attr

_INDEXABLE = ("ModuleList", "Sequential", "ModuleDict", "ParameterList", "ParameterDict")

_NAME_FORMS = "use NAME, NAME.attr, NAME[0] or NAME['key']"
_CONSTANT_INDEX = "only constant indices (0, -1, 'key') are allowed"


def resolve(expr: str, ns: Mapping[str, Any]) -> Any:
    """The object ``expr`` names in ``ns``: a name, attributes (``model.encoder``) and constant
    indices (``batch[0]``, ``d['w']``, ``model.layers[-1]``). Never evaluates code; raises
    MagicInputError (with close matches) for anything else."""
    try:
        tree = ast.parse(expr.strip(), mode="eval").body
    except SyntaxError:
        raise MagicInputError(f"{expr!r} is not a name; {_NAME_FORMS}") from None

    def walk(node: Any) -> Any:
        if isinstance(node, ast.Name):
            if node.id not in ns:
                raise MagicInputError(f"name {node.id!r} is not defined{_did_you_mean(node.id, ns)}")
            return ns[node.id]
        if isinstance(node, ast.Attribute):
            base = walk(node.value)
            try:
                return static_attr(base, node.attr)
            except AttributeError as exc:
                missing = f"{type(base).__name__} has no such attribute"
                detail = str(exc) if "run code" in str(exc) else missing
                raise MagicInputError(f"{ast.unparse(node)}: {detail}") from None
        if isinstance(node, ast.Subscript):
            base = walk(node.value)
            where = ast.unparse(node)
            try:
                key = ast.literal_eval(node.slice)
            except ValueError:
                raise MagicInputError(f"{where}: {_CONSTANT_INDEX}") from None
            if not isinstance(key, (int, str)) or isinstance(key, bool):
                raise MagicInputError(f"{where}: {_CONSTANT_INDEX}")
            if not isinstance(base, (list, tuple, dict)) and type(base).__name__ not in _INDEXABLE:
                raise MagicInputError(
                    f"{where}: %whereis indexes lists, tuples, dicts and module containers, "
                    f"not {type(base).__name__}"
                )
            try:
                return base[key]
            except (IndexError, KeyError, TypeError) as exc:
                raise MagicInputError(f"{where}: no such item ({type(exc).__name__})") from None
        raise MagicInputError(f"{expr!r} is not a name; {_NAME_FORMS}")

    return walk(tree)


def _did_you_mean(name: str, ns: Mapping[str, Any]) -> str:
    import difflib

    candidates = [n for n, _, _ in Walk(ns) if "[" not in n and "." not in n]
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    if close:
        return "; did you mean " + ", ".join(close) + "?"
    if candidates:
        return "; tensors/modules/optimizers here: " + ", ".join(sorted(candidates)[:8])
    return "; no tensors, modules or optimizers are defined yet"

