"""The option types of the commands: durations (90s, 10m, 7d) and NAME=VALUE hyperparameters."""

from __future__ import annotations

from typing import Any

import click
import yaml

from jobplane.model import yaml_input


class HyperparameterType(click.ParamType):  # type: ignore[type-arg]
    """NAME=VALUE, the value read as YAML like the spec's (10 an integer, 0.02 a number, adam a string)."""

    name = "name=value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, Any]:
        if isinstance(value, tuple):
            return value
        name, sep, text = str(value).partition("=")
        if not sep or not name.strip() or not text.strip():
            self.fail(f"{value!r} is not NAME=VALUE (e.g. --hp lr=0.02)", param, ctx)
        try:
            return name.strip(), yaml_input.load(text)
        except (yaml.YAMLError, ValueError):
            return name.strip(), text


class DurationType(click.ParamType):  # type: ignore[type-arg]
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from jobplane.model.bounds import parse_duration  # with the spec's field types: for an option given only

        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
