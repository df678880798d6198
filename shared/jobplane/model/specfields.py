"""Field types the spec's models share (spec.py's job, sweepspec.py's sweep section, metrics.py's defaults): the
strict base model, patterned strings and regular expressions, hyperparameter names and values, metric names, and the
models of a metric and of the stop rules."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    JsonValue,
    ValidationInfo,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from jobplane.model import secrets
from jobplane.model.bounds import format_duration, parse_duration


class SpecModel(BaseModel):
    """Unknown fields are errors; a parsed spec never changes."""

    model_config = ConfigDict(defer_build=True, extra="forbid", frozen=True, str_strip_whitespace=True)


# A duration: seconds, or a number with a unit (jobplane.model.bounds parses it); its ceiling is AtMost's.
def _stored(info: ValidationInfo) -> bool:
    return isinstance(info.context, Mapping) and bool(info.context.get("stored"))


Duration = Annotated[
    int,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^\s*\d+\s*[smhd]?\s*$"},
            ],
            "description": "seconds, or a number with unit s, m, h or d",
        }
    ),
]


@dataclass(frozen=True)
class AtMost:
    """A duration's ceiling, as `Annotated[Duration, AtMost(MAX_WAIT)]`: a new spec (or policy) over it is refused
    naming the field; a spec read back from a record (context STORED) is read as it was accepted, so a job recorded
    before a ceiling stays readable, and the decisions bound what they take from it."""

    seconds: int

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = dict(handler(schema))
        seconds, text = out["anyOf"]
        out["anyOf"] = [{**seconds, "maximum": self.seconds}, text]
        out["description"] = f"{out['description']}; at most {format_duration(self.seconds)}"
        return out

    def _check(self, value: int, info: ValidationInfo) -> int:
        if value > self.seconds and not _stored(info):
            raise ValueError(f"{format_duration(value)} is more than the ceiling of {format_duration(self.seconds)}")
        return value


def pattern_str(pattern: str, what: str) -> Any:
    compiled = re.compile(pattern)

    def check(value: object) -> object:
        if isinstance(value, str) and not compiled.match(value):
            raise ValueError(f"{value!r} is not a valid {what}")
        return value

    return BeforeValidator(check)


# An entry of `after:`: a job's or an array's id, as Slurm's --dependency takes one: afterok (the default), afterany
# or afternotok, then a colon (no job id has one).
AFTER_KINDS = ("afterok", "afterany", "afternotok")
AFTER_ENTRY = rf"^(({'|'.join(AFTER_KINDS)}):)?[a-z]([a-z0-9-]{{0,61}}[a-z0-9])?$"
AfterEntry = Annotated[
    str, pattern_str(AFTER_ENTRY, "dependency (a job's or an array's id, or afterok:ID, afterany:ID, afternotok:ID)"),
    Field(json_schema_extra={"pattern": AFTER_ENTRY}),
]
# SageMaker's MetricDefinition: a name of 1-255 characters (its pattern is `.+`; control characters, which would
# break one-line output, are refused here) and a regex of 1-500 characters whose one capture group is the value.
METRIC_NAME = r"^[^\x00-\x1f\x7f]{1,255}$"
MetricName = Annotated[
    str, pattern_str(METRIC_NAME, "metric name (1-255 characters, no control characters; e.g. train:loss)"),
    Field(json_schema_extra={"pattern": METRIC_NAME}),
]
# Hyperparameter names become SM_HP_<NAME> (upper-cased, as SageMaker does) and keys of hyperparameters.json.
HP_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,255}$"
HpName = Annotated[
    str, pattern_str(HP_NAME, "hyperparameter name (a letter or _, then letters, digits, _ . -; at most 256)"),
    Field(json_schema_extra={"pattern": HP_NAME}),
]
HP_VALUE_MAX = 2500  # SageMaker's limit on a hyperparameter's value, as a string


def hp_string(value: JsonValue) -> str:
    """A hyperparameter's value as SageMaker hands it over (hyperparameters.json, SM_HP_*): a string as it is,
    anything else as JSON (10 -> "10", 0.01 -> "0.01", true -> "true", [64, 32] -> "[64,32]")."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _hp_value(value: JsonValue) -> JsonValue:
    if len(hp_string(value)) > HP_VALUE_MAX:
        raise ValueError(f"the value is {len(hp_string(value))} characters as a string; at most {HP_VALUE_MAX}")
    return value


HpValue = Annotated[JsonValue, AfterValidator(_hp_value)]


def hp_variable(name: str) -> str:
    """The environment variable a hyperparameter becomes: two names with one variable clash."""
    return f"SM_HP_{name}".upper()


def regex(groups: int | None) -> AfterValidator:
    """A regular expression that compiles (Python's re, as the agent uses it); with groups, it must have exactly
    that many capture groups."""
    def check(value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"'{value}' is not a valid regular expression: {exc}") from None
        if groups is not None and compiled.groups != groups:  # quoted as written: repr would double each backslash
            raise ValueError(f"'{value}' has {compiled.groups} capture groups; it needs exactly {groups}, around the "
                             "value (write other groups as (?:...))")
        return value

    return AfterValidator(check)


MetricRegex = Annotated[str, Field(min_length=1, max_length=500), regex(1)]
StopPattern = Annotated[str, Field(min_length=1, max_length=500), regex(None)]


class MetricDefinition(SpecModel):
    """One metric read from the job's output, in SageMaker's MetricDefinitions shape."""

    name: MetricName = Field(description="e.g. train:loss")
    regex: MetricRegex = Field(description="searched in every output line; its one capture group is the value, "
                                           "e.g. 'loss ([0-9.eE+-]+|nan|inf)'")


class StopOn(SpecModel):
    """Rules that end a diverging job early: FAILED, with the line that matched, and no rerun."""

    patterns: list[StopPattern] = Field(default_factory=list, max_length=20,
                                        description="stop when an output line matches one of these")
    nan: bool = Field(False, description="stop when any metric's value becomes NaN or Inf")


SecretName = Annotated[
    str, pattern_str(secrets.NAME_PATTERN, "secret name (1-32 of a-z 0-9 -, not starting or ending with -)"),
    Field(json_schema_extra={"pattern": secrets.NAME_PATTERN}),
]


class SecretRef(SpecModel):
    """One secret a job reads: its name among its owner's secrets; with file, a 0400 file on a tmpfs whose path the
    variable holds, instead of the value itself."""

    name: SecretName
    file: bool = Field(False, description="true: a 0400 file on a tmpfs, its path in the variable")


def _ref_form(value: object) -> object:
    return {"name": value} if isinstance(value, str) else value


SecretField = Annotated[SecretRef, BeforeValidator(_ref_form)]
