"""Documents validated without pydantic: frozen dataclasses whose fields carry their own check.

The policy is read by every run of every control function, so it is checked by these few plain functions instead
of pydantic models (importing pydantic and building the models cost a cold start more than the rest of a handler).
A check takes the value and its field path and returns the value to keep; it raises ValueError (a problem with that
value) or SpecError (the problems a nested document found, each naming its own path). Numbers and flags are read
as pydantic's lax mode read them before: a number may be written as a string (PyYAML, a YAML 1.1 reader, gives `1e6`
as one), a whole number as a float without a fraction, a flag as yes/no, true/false, on/off or 1/0; a boolean is
never a number.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from jobplane.model.bounds import format_duration, parse_duration
from jobplane.model.errors import FieldError, SpecError

T = TypeVar("T")
N = TypeVar("N", int, float)
Check = Callable[[Any, str], Any]


def checked(check: Check, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field read through `check`: `cap: int = checked(whole(1, 100), 16)`."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"check": check})


def build(cls: type[T], raw: object, path: str = "", *, ignore_unknown: bool = False) -> T:
    """An instance of the dataclass `cls` from a mapping: every field checked, unknown (unless ignore_unknown: a
    record read for a few of its fields) and missing fields named; SpecError with every problem found."""
    if not isinstance(raw, Mapping):
        raise SpecError([FieldError(path or "(document)", f"should be a mapping of fields, got {_kind(raw)}")])
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    names = [f.name for f in fields]
    errors = [FieldError(_at(path, str(key)), f"unknown field (allowed: {', '.join(names)})")
              for key in raw if key not in names and not ignore_unknown]
    errors += [FieldError(_at(path, f.name), "required field is missing") for f in fields if f.name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    given = [f for f in fields if f.name in raw]
    values, problems = _each([(_at(path, f.name), f.metadata["check"], raw[f.name]) for f in given])
    if errors or problems:
        raise SpecError(errors + problems)
    return cls(**{f.name: value for f, value in zip(given, values, strict=True)})


def nested(cls: type[T], *, ignore_unknown: bool = False) -> Check:
    return lambda value, path: build(cls, value, path, ignore_unknown=ignore_unknown)


def whole(least: int, most: int) -> Check:
    def check(value: Any, path: str) -> int:
        found = _number(value)
        if found is None or found != int(found):  # (a finite float converts)
            raise ValueError(f"should be a whole number, got {_kind(value)} {value!r}")
        return _within(int(found), least, most)
    return check


def number(least: float, most: float, above: bool = False) -> Check:
    """A float in [least, most], or (least, most] with above."""
    def check(value: Any, path: str) -> float:
        found = _number(value)
        if found is None:
            raise ValueError(f"should be a number, got {_kind(value)} {value!r}")
        if above and found <= least:
            raise ValueError(f"should be more than {least:g}, got {_show(found)}")
        return float(_within(found, least, most))
    return check


_FLAGS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def flag(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | str) and str(value).strip().lower() in _FLAGS:
        return _FLAGS[str(value).strip().lower()]
    raise ValueError(f"should be true or false, got {_kind(value)} {value!r}")


def text(most: int) -> Check:
    def check(value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise ValueError(f"should be a string, got {_kind(value)}")
        if len(value) > most:
            raise ValueError(f"should have at most {most} characters, got {len(value)}")
        return value
    return check


def one_of(*choices: str) -> Check:
    def check(value: Any, path: str) -> str:
        if value not in choices or not isinstance(value, str):
            raise ValueError(f"should be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
        return value
    return check


def optional(inner: Check) -> Check:
    return lambda value, path: None if value is None else inner(value, path)


def duration(ceiling: int) -> Check:
    """Seconds, or a number with unit s, m, h or d, at most `ceiling` (the check's `ceiling`, which tests read)."""
    def check(value: Any, path: str) -> int:
        seconds = parse_duration(value)
        if seconds > ceiling:
            raise ValueError(f"{format_duration(seconds)} is more than the ceiling of {format_duration(ceiling)}")
        return seconds
    check.ceiling = ceiling  # type: ignore[attr-defined]
    return check


def items(inner: Check, most: int) -> Check:
    """A list of at most `most` values, each through `inner` (named field[i])."""
    def check(value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise ValueError(f"should be a list, got {_kind(value)}")
        if len(value) > most:
            raise ValueError(f"should have at most {most} items, got {len(value)}")
        out, errors = _each([(f"{path}[{i}]", inner, v) for i, v in enumerate(value)])
        if errors:
            raise SpecError(errors)
        return out
    return check


def mapping(key: str, inner: Check, most: int) -> Check:
    """A mapping of at most `most` entries whose keys match the regular expression `key` (named field.key)."""
    pattern = re.compile(key)

    def check(value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ValueError(f"should be a mapping, got {_kind(value)}")
        if len(value) > most:
            raise ValueError(f"should have at most {most} entries, got {len(value)}")
        errors = [FieldError(f"{path}.{k}", f"{k!r} is not a valid name (it should match {key})")
                  for k in value if not isinstance(k, str) or not pattern.match(k)]
        values, problems = _each([(f"{path}.{k}", inner, v) for k, v in value.items()])
        if errors or problems:
            raise SpecError(errors + problems)
        return dict(zip(value, values, strict=True))
    return check


def _each(entries: list[tuple[str, Check, Any]]) -> tuple[list[Any], list[FieldError]]:
    """Each value through its check, at its path: the values kept, and the problems of all of them."""
    out: list[Any] = []
    errors: list[FieldError] = []
    for where, check, value in entries:
        try:
            out.append(check(value, where))
        except SpecError as exc:
            errors += exc.errors
        except ValueError as exc:
            errors.append(FieldError(where, str(exc)))
    return out, errors


def _number(value: object) -> int | float | None:
    """A finite number, from a number or its text; None for anything else (a boolean, NaN, infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, int):
        return value  # exact, however large: the bounds refuse what is too large
    try:
        found = float(value)
    except ValueError:
        return None
    return found if math.isfinite(found) else None


def _within(value: N, least: float, most: float) -> N:
    if value < least:
        raise ValueError(f"should be at least {least:g}, got {_show(value)}")
    if value > most:
        raise ValueError(f"should be at most {most:g}, got {_show(value)}")
    return value


def _show(value: float) -> str:
    text = str(value) if isinstance(value, int) else f"{value:g}"
    return text if len(text) <= 24 else text[:21] + "..."


def _at(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _kind(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "a number out of range:"  # YAML reads 1e400 as infinity, .nan as NaN
    return {type(None): "nothing (null)", bool: "true/false", int: "a whole number", float: "a number",
            str: "a string", list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)
