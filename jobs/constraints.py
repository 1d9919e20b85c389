"""Slurm's ``--constraint`` expressions, read far enough to tell when one certainly cannot match
the nodes of a partition. Pure: no Django.

The syntax (sbatch(1), ``--constraint``): feature names joined by ``&`` (AND) and ``|`` (OR),
``name*N`` (N nodes with the feature), ``[...]`` (matching OR / several counts, e.g. ``[a*2&b*4]``)
and ``(...)`` (grouping). ``,`` is read as AND.

What is refused: an expression every reading of which needs a feature no node of the partition has,
or more nodes with a feature than the partition has. Names are compared case-insensitively (a
refusal must be certain). A term is judged against the union of the
partition's features (``[a*2&b*4]`` asks different nodes for different features, so a per-node
reading would refuse what Slurm runs). What this module cannot read (another character, unbalanced
brackets) is left to Slurm: ``unmatched`` answers None, never a false refusal.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_TOKEN_RE = re.compile(r"\s*(?:(?P<name>[A-Za-z0-9_.:+-]+)(?:\*(?P<count>\d+))?|(?P<op>[&|,\[\]()]))")


class _Unreadable(Exception):
    pass


def _tokens(expression: str) -> list[tuple[str, str, int]]:
    """[(kind, text, count)]: kind "name" or "op"."""
    out, position = [], 0
    expression = expression.strip()
    while position < len(expression):
        match = _TOKEN_RE.match(expression, position)
        if not match or match.end() == position:
            raise _Unreadable(expression[position:])
        if match.group("name"):
            out.append(("name", match.group("name"), int(match.group("count") or 1)))
        else:
            out.append(("op", match.group("op"), 0))
        position = match.end()
    return out


class _Parser:
    """expr := and ("|" and)* ; and := term (("&"|",") term)* ; term := name[*N] | "[" expr "]" | "(" expr ")".
    Each node answers the terms that cannot be met (empty: it can), or for an OR every branch's."""

    def __init__(self, tokens: list[tuple[str, str, int]], features: Mapping[str, int]):
        self.tokens, self.index, self.features = tokens, 0, features

    def peek(self) -> str:
        return self.tokens[self.index][1] if self.index < len(self.tokens) and self.tokens[self.index][0] == "op" else ""

    def expr(self) -> list[str]:
        missing = self.conjunction()
        while self.peek() == "|":
            self.index += 1
            other = self.conjunction()
            missing = [] if not missing or not other else missing + [m for m in other if m not in missing]
        return missing

    def conjunction(self) -> list[str]:
        missing = self.term()
        while self.peek() in ("&", ","):
            self.index += 1
            missing = missing + [m for m in self.term() if m not in missing]
        return missing

    def term(self) -> list[str]:
        if self.index >= len(self.tokens):
            raise _Unreadable("end")
        kind, text, count = self.tokens[self.index]
        self.index += 1
        if kind == "name":
            have = self.features.get(text.lower(), 0)
            if not have:
                return [text]
            return [f"{text}*{count}"] if count > have else []
        closing = {"[": "]", "(": ")"}.get(text)
        if closing is None:
            raise _Unreadable(text)
        missing = self.expr()
        if self.peek() != closing:
            raise _Unreadable(text)
        self.index += 1
        return missing


def unmatched(expression: str, node_features: Sequence[Sequence[str]]) -> list[str] | None:
    """The terms of ``expression`` that no node can meet, when the expression certainly cannot
    match nodes with these features (one sequence per node); [] when it may match; None when this
    module cannot read it (Slurm decides). ``name*N`` cannot be met by fewer than N such nodes."""
    counts: dict[str, int] = {}
    for features in node_features:
        for name in {f.lower() for f in features}:
            counts[name] = counts.get(name, 0) + 1
    try:
        tokens = _tokens(expression)
        if not tokens:
            return None
        parser = _Parser(tokens, counts)
        missing = parser.expr()
        if parser.index != len(tokens):
            return None
    except _Unreadable:
        return None
    return missing
