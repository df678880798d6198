"""User-facing validation errors: every problem names the field path and what is allowed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what it turns into FieldErrors; YAML input's errors need no pydantic
    from pydantic import ValidationError


@dataclass(frozen=True)
class FieldError:
    path: str  # field path, e.g. "inputs.train.uri", "metrics[1].regex"; "(spec)" for the document as a whole
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return {"field": self.path, "message": self.message}


class SpecError(ValueError):
    """A document that cannot be accepted, with every problem found."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _path(loc: tuple[int | str, ...]) -> str:
    # pydantic adds the union member's name ("str", "list[str]", "function-after[...]") to the location:
    # users never see those, so keep only real field names and list indexes. A list index is written [i], so
    # it never reads as a mapping key (env.1 is a variable named "1"; instance_type[1] the second type).
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not any(c in part for c in "[]()-") and part not in ("str", "int", "float", "bool", "list", "dict"):
            path += f".{part}" if path else part
    return path or "(spec)"


def from_validation_error(exc: ValidationError, allowed_fields: dict[str, list[str]]) -> list[FieldError]:
    """Turn pydantic's errors into FieldErrors with messages a user can act on.

    allowed_fields maps a model path ("" for the top level, "inputs.*" for nested) to its field names,
    so an unknown field can say which fields exist.
    """
    out: list[FieldError] = []
    seen: set[str] = set()
    raw = [(_path(err["loc"]), err) for err in exc.errors()]
    for path, err in raw:
        kind = err["type"]
        if kind.endswith("_type") and any(
            p.startswith((path + ".", path + "[")) or (p == path and e is not err and not e["type"].endswith("_type"))
            for p, e in raw
        ):
            continue  # a union member that did not apply; the member that did reports the real problem
        if kind.endswith("_type") and any(p == path for p in seen_paths(out)):
            continue
        if kind == "extra_forbidden":
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            allowed = allowed_fields.get(parent) or allowed_fields.get(_wildcard(parent)) or []
            msg = "unknown field" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
        elif kind == "missing":
            msg = "required field is missing"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        line = f"{path}: {msg}"
        if line not in seen:  # a union reports the same problem once per member
            seen.add(line)
            out.append(FieldError(path, msg))
    return out


def seen_paths(errors: list[FieldError]) -> set[str]:
    return {e.path for e in errors}


def _wildcard(path: str) -> str:
    # "inputs.train" -> "inputs.*", "metrics[1]" -> "metrics[*]": the models in a dict or list share one field list
    if path.endswith("]"):
        return re.sub(r"\[\d+\]$", "[*]", path)
    head, _, _ = path.rpartition(".")
    return f"{head}.*" if head else path
