"""YAML from users (job specs, the policy), parsed within bounds before anything validates it.

A few hundred bytes of YAML can expand to gigabytes through anchors and aliases (an "alias bomb"), and a
drop that kills the launcher is read again by every backstop run. So aliases are refused outright (a spec
has no use for them), and the document's size, nesting depth and node count are capped while it is
composed, before any Python object is built.
"""

from __future__ import annotations

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


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and stops at MAX_DEPTH levels or MAX_NODES nodes."""

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
