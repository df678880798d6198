"""YAML from users (job specs, the policy), parsed within bounds before anything validates it.

A few hundred bytes of YAML can expand to gigabytes through anchors and aliases (an "alias bomb"), and a
drop that kills the launcher is read again by every backstop run. So aliases are refused outright (a spec
has no use for them), and the document's size, nesting depth and node count are capped while it is
composed, before any Python object is built.

Values are read as YAML 1.2's core schema reads them, not PyYAML's 1.1: `8:00` is a string, not 480 (sexagesimal),
`010` is ten, not eight, `yes`/`on` are strings and `2026-02-30` is not a date. A value that cannot be built (an
integer over Python's 4,300 digits, a `!!timestamp` that is no date, an unknown tag) is refused naming its field,
like every other bad value, instead of escaping as a plain ValueError.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from jobplane.model.errors import FieldError, SpecError

MAX_BYTES = 256 * 1024  # a spec with a 64 KiB `run:` and every other field at its maximum fits
MAX_DEPTH = 32
MAX_NODES = 20_000


class YamlRefused(ValueError):
    """The document is not parsed: `field` is the top-level field at fault, or "(spec)"."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _field_at(text: str, line: int) -> str:
    """The top-level key whose block holds this (0-based) line: the nearest unindented `key:` above it."""
    lines = text.splitlines()
    for candidate in reversed(lines[: line + 1]):
        if candidate and not candidate[0].isspace() and ":" in candidate and not candidate.startswith("#"):
            return candidate.split(":", 1)[0].strip().strip("'\"") or "(spec)"
    return "(spec)"


# YAML 1.2 core schema: the plain scalars that are not strings (https://yaml.org/spec/1.2.2/#1032-tag-resolution)
_CORE = (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", [*"~nN", ""]),  # "": an empty value
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", [*"tTfF"]),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", [*"-+0123456789"]),
    ("tag:yaml.org,2002:float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", [*"-+.0123456789"]),
)
MAX_INT_DIGITS = 100  # far past any bound a field has; Python itself refuses past 4,300


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    digits = text.lstrip("+-")
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits (at most {MAX_INT_DIGITS})")
    if digits.startswith(("0o", "0x")):
        return int(digits[2:], 8 if digits[1] == "o" else 16)
    return int(text, 10)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2's core schema that refuses aliases, stops at MAX_DEPTH levels or MAX_NODES nodes,
    and names the field of a value it cannot build."""

    yaml_implicit_resolvers: dict[Any, Any] = {}  # only _CORE's, added below: none of YAML 1.1's

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.text, self.depth, self.nodes = stream, 0, 0

    def _mark(self) -> Any:
        return self.peek_event().start_mark  # type: ignore[no-untyped-call]

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self._mark()
            raise YamlRefused(_field_at(self.text, mark.line), f"YAML aliases (*name) are not accepted (line "
                                                               f"{mark.line + 1}): write the value out")
        self.nodes += 1
        if self.nodes > MAX_NODES:
            mark = self._mark()
            raise YamlRefused(_field_at(self.text, mark.line), f"more than {MAX_NODES} YAML nodes")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self._mark()
                raise YamlRefused(_field_at(self.text, mark.line), f"nested deeper than {MAX_DEPTH} levels "
                                                                   f"(line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except YamlRefused:
            raise
        except (ValueError, OverflowError, TypeError, yaml.constructor.ConstructorError) as exc:
            line = node.start_mark.line
            what = getattr(exc, "problem", None) or str(exc)
            raise YamlRefused(_field_at(self.text, line), f"a value that cannot be read (line {line + 1}): "
                                                          f"{what}".replace("\n", " ")) from None


for _tag, _pattern, _first in _CORE:
    _BoundedLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)
_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _core_int)


def load(data: str | bytes, max_bytes: int = MAX_BYTES) -> Any:
    """The document, or YamlRefused (too large, an alias, too deep, too many nodes) or yaml.YAMLError."""
    if len(data) > max_bytes:
        raise YamlRefused("(spec)", f"{len(data)} bytes: at most {max_bytes} are accepted")
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_document(text: str | bytes, source: str = "spec") -> dict[str, Any]:
    """Parse YAML or JSON (JSON is YAML) into a mapping, or raise SpecError."""
    try:
        data = load(text)
    except YamlRefused as exc:
        raise SpecError([FieldError(exc.field, str(exc))]) from None
    except yaml.YAMLError as exc:
        raise SpecError([FieldError("(spec)", f"not valid YAML or JSON: {exc}".replace("\n", " "))]) from None
    if not isinstance(data, dict):
        raise SpecError([FieldError("(spec)", f"{source} must be a mapping of fields, got {type(data).__name__}")])
    return data
