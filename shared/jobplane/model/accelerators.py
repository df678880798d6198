"""GPUs by name: what a spec's `accelerators` asks for, whether its instance types carry it, and what GCE's
insert takes. Pure: no cloud calls here.

A GPU is named by a short name (T4, V100, A100...; any case) or by its Compute Engine accelerator type
(nvidia-tesla-t4). On Compute Engine, N1 machine types take GPUs as guestAccelerators (T4, V100, P100, P4,
in the counts GCE allows); the accelerator-optimized types come with theirs (A100 on a2, H100 on a3, L4
on g2), so `accelerators` only checks the type carries that GPU. On EC2 a GPU comes with the instance
type: `accelerators` checks each listed type is of a family with that GPU (and, for the sizes listed
here, that many). K80s are refused on GCE: Compute Engine retired them in 2024 (EC2's p2 still has them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    model: str  # the short name: T4
    gce: str | None  # GCE accelerator type (guestAccelerators, or what an accelerator-optimized type has)
    n1_counts: tuple[int, ...] = ()  # counts GCE attaches to an N1 VM; () = not on N1


GPUS: dict[str, Gpu] = {g.model: g for g in (
    Gpu("T4", "nvidia-tesla-t4", (1, 2, 4)),
    Gpu("V100", "nvidia-tesla-v100", (1, 2, 4, 8)),
    Gpu("P100", "nvidia-tesla-p100", (1, 2, 4)),
    Gpu("P4", "nvidia-tesla-p4", (1, 2, 4)),
    Gpu("K80", "nvidia-tesla-k80"),  # retired on GCE (see the module doc); EC2 p2 only
    Gpu("L4", "nvidia-l4"),  # g2 types (GCE), g6 (EC2)
    Gpu("A100", "nvidia-tesla-a100"),  # a2 types (GCE), p4d (EC2)
    Gpu("H100", "nvidia-h100-80gb"),  # a3 types (GCE), p5 (EC2)
    Gpu("A10G", None),  # EC2 g5 only
    Gpu("L40S", None),  # EC2 g6e only
)}
# GCE names that are not a model's main one
_GCE_ALIASES = {"nvidia-a100-80gb": "A100", "nvidia-h100-mega-80gb": "H100"}
SHORT_FORM = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9-]{0,62})\s*(?::\s*(\d+)\s*)?$")

# EC2 families by GPU, and the GPU count of the sizes that have more than one (other sizes: one)
_EC2: dict[str, tuple[str, dict[str, int]]] = {
    "p2": ("K80", {"8xlarge": 8, "16xlarge": 16}),
    "p3": ("V100", {"8xlarge": 4, "16xlarge": 8}),
    "p3dn": ("V100", {"24xlarge": 8}),
    "g4dn": ("T4", {"12xlarge": 4, "metal": 8}),
    "g5": ("A10G", {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    "g6": ("L4", {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    "g6e": ("L40S", {"12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    "p4d": ("A100", {"24xlarge": 8}),
    "p4de": ("A100", {"24xlarge": 8}),
    "p5": ("H100", {"48xlarge": 8}),
    "p5e": ("H100", {"48xlarge": 8}),
    "p5en": ("H100", {"48xlarge": 8}),
}
# GCE accelerator-optimized families and their GPU; a2/a3 types end in -<count>g, g2's count is by size
_GCE_BUILT_IN = {"a2": "A100", "a3": "H100", "g2": "L4"}
_G2_COUNTS = {"24": 2, "48": 4, "96": 8}  # g2-standard-<vCPUs>; the others have one


def model_of(name: str) -> str | None:
    """The short name of a GPU named by its short name (any case) or GCE type; None if unknown."""
    key = name.strip()
    if key.upper() in GPUS:
        return key.upper()
    lowered = key.lower()
    return _GCE_ALIASES.get(lowered) or next((g.model for g in GPUS.values() if g.gce == lowered), None)


def known() -> str:
    return ", ".join(GPUS)


def parse_short(value: object) -> object:
    """"T4:2" -> {"type": "T4", "count": 2}; "T4" -> {"type": "T4"}; anything else unchanged (the model says)."""
    if not isinstance(value, str):
        return value
    m = SHORT_FORM.match(value)
    if m is None:
        raise ValueError(f"{value!r} is not a GPU and count: write TYPE:COUNT (e.g. T4:1) or "
                         "{type: nvidia-tesla-t4, count: 1}")
    return {"type": m.group(1)} | ({"count": int(m.group(2))} if m.group(2) is not None else {})


def _n1(instance_type: str) -> bool:
    return instance_type.startswith("n1-")


def family(cloud: str, instance_type: str) -> str:
    """An instance type's family: EC2's before the dot (p4d.24xlarge: p4d), GCE's before the first dash
    (a2-highgpu-1g: a2)."""
    return instance_type.split("-")[0] if cloud == "gcp" else instance_type.partition(".")[0]


def _built_in(cloud: str, instance_type: str) -> tuple[str, int | None] | None:
    """(GPU, count or None if unknown) an instance type comes with; None if it has none known here."""
    if cloud == "gcp":
        kind = family(cloud, instance_type)
        if kind not in _GCE_BUILT_IN:
            return None
        if kind == "g2":
            return "L4", _G2_COUNTS.get(instance_type.rsplit("-", 1)[-1], 1)
        m = re.search(r"-(\d+)g$", instance_type)
        return _GCE_BUILT_IN[kind], int(m.group(1)) if m else None
    kind, _, size = instance_type.partition(".")
    if kind not in _EC2:
        return None
    model, counts = _EC2[kind]
    return model, counts.get(size, 1)


def problem(cloud: str, model: str, count: int, instance_type: str) -> str | None:
    """Why `count` x `model` cannot run on this instance type, or None."""
    gpu = GPUS[model]
    if cloud == "gcp" and _n1(instance_type):
        if not gpu.n1_counts:
            why = f"{model} GPUs do not attach to N1 types like {instance_type}"
            fits = [f for f, m in _GCE_BUILT_IN.items() if m == model]
            return (f"{why}: " + (f"use a {'/'.join(fits)} type, which comes with them" if fits
                                  else f"N1 takes {', '.join(g.model for g in GPUS.values() if g.n1_counts)}"))
        if count not in gpu.n1_counts:
            *most, last = map(str, gpu.n1_counts)
            return f"{instance_type} takes {', '.join(most)} or {last} {model} GPUs (an N1 type on GCE), not {count}"
        return None
    has = _built_in(cloud, instance_type)
    if has is None:
        if cloud == "gcp":
            return (f"{instance_type} takes no GPUs: use an N1 type (e.g. n1-standard-8) for T4, V100, P100 or P4, "
                    "or a type that comes with GPUs (a2: A100, a3: H100, g2: L4)")
        families = sorted(f for f, (m, _) in _EC2.items() if m == model)
        return (f"{instance_type} has no {model} GPUs"
                + (f" (EC2 types with them: {', '.join(f + '.*' for f in families)})" if families else ""))
    built_model, built_count = has
    if built_model != model:
        return f"{instance_type} comes with {built_model} GPUs, not {model}"
    if built_count is not None and built_count != count:
        return f"{instance_type} comes with {built_count} {model} GPUs, not {count}"
    return None


def check(cloud: str, value: object, instance_types: list[str]) -> list[tuple[str, str]]:
    """(field, message) for a raw spec's `accelerators` against its cloud and instance types. A value that does
    not parse is left to the model's own errors."""
    try:
        raw = parse_short(value)
    except ValueError:
        return []
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        return []
    count = raw.get("count", 1)
    model = model_of(raw["type"])
    if model is None or not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return []
    if cloud == "gcp" and model == "K80":
        return [("accelerators.type", "Compute Engine retired K80 GPUs in 2024: use T4 (or V100) on an N1 type")]
    if cloud == "gcp" and GPUS[model].gce is None:
        return [("accelerators.type", f"{model} GPUs are EC2 only; on Compute Engine use one of "
                                      f"{', '.join(m for m, g in GPUS.items() if g.gce and m != 'K80')}")]
    return [("accelerators", why) for itype in instance_types
            if (why := problem(cloud, model, count, itype)) is not None]


def guest_accelerator(cloud: str, model: str | None, count: int, instance_type: str) -> tuple[str, int] | None:
    """(GCE accelerator type, count) to attach as guestAccelerators: only to a GCE N1 type; every other type's
    GPUs come with it."""
    if cloud != "gcp" or model is None or not _n1(instance_type):
        return None
    gce = GPUS[model].gce
    return (gce, count) if gce else None
