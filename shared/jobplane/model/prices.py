"""What an instance-hour costs: the on-demand list prices jobplane ships (USD per instance-hour) and the pure rules
that price one launch, and every type and market a spec may get. No I/O.

Source: the clouds' public list prices for Linux on-demand instances (EC2 us-east-1, after the June 2025 reduction
of P4/P5 prices; Compute Engine us-central1, accelerator-optimized machine types with their GPUs included, and the
GPUs an N1 type takes priced per GPU), written down by hand from the clouds' pricing pages as they read in 2025, not
fetched at run time. They are estimates: other regions cost more or less (typically 0-30 % more), list prices
change, discounts (Savings Plans, committed use, negotiated rates) are not applied, and a few (marked below) are
listed by the cloud only through reservations, so their figure is our estimate. A platform team sets its own prices
in config/policy.yaml (`prices:` for on-demand, `spot_prices:` for Spot, each by type; an N1 type's GPUs by their
GCE name, `nvidia-tesla-t4`), which win over this table. The table covers every type jobplane.model.accelerators
knows (tests/model/test_prices.py holds it to that) and the common CPU families.

EC2 Spot prices come from the cloud at launch (DescribeSpotPriceHistory); when that fails and the policy names no
Spot price, the on-demand price stands in, which EC2 never bills a Spot VM above. Compute Engine has no per-VM Spot
price API the functions can call cheaply, so a GCE Spot VM is estimated at GCE_SPOT_FACTOR of its on-demand price
(Google advertises 60-91 % off; the factor takes the low end of the discount), unless the policy's spot_prices
names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: pricing builds no spec model
    from jobplane.model.spec import JobSpec


def _sizes(family: str, sizes: Mapping[str, float], sep: str = ".") -> dict[str, float]:
    return {f"{family}{sep}{size}": price for size, price in sizes.items()}


# EC2, us-east-1, Linux, on-demand. General purpose sizes double in price with each size up (large = 2 vCPUs).
def _doubling(family: str, large: float, sizes: tuple[str, ...]) -> dict[str, float]:
    per_vcpu_pair = {"medium": 0.5, "large": 1, "xlarge": 2, "2xlarge": 4, "4xlarge": 8, "8xlarge": 16,
                     "9xlarge": 18, "12xlarge": 24, "16xlarge": 32, "18xlarge": 36, "24xlarge": 48, "32xlarge": 64,
                     "48xlarge": 96}
    return {f"{family}.{size}": round(large * per_vcpu_pair[size], 6) for size in sizes}


_UP_TO_24 = ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge")
AWS: dict[str, float] = {
    # burstable (demo, CPU jobs, data preparation)
    **_sizes("t3", {"nano": 0.0052, "micro": 0.0104, "small": 0.0208, "medium": 0.0416, "large": 0.0832,
                    "xlarge": 0.1664, "2xlarge": 0.3328}),
    **_sizes("t3a", {"nano": 0.0047, "micro": 0.0094, "small": 0.0188, "medium": 0.0376, "large": 0.0752,
                     "xlarge": 0.1504, "2xlarge": 0.3008}),
    # general purpose, compute and memory optimized
    **_doubling("m5", 0.096, _UP_TO_24), **_doubling("m6i", 0.096, (*_UP_TO_24, "32xlarge")),
    **_doubling("m6a", 0.0864, (*_UP_TO_24, "32xlarge", "48xlarge")),
    **_doubling("m7i", 0.1008, (*_UP_TO_24, "48xlarge")),
    **_doubling("m7g", 0.0816, ("medium", *_UP_TO_24[:-1])),
    **_doubling("c5", 0.085, ("large", "xlarge", "2xlarge", "4xlarge", "9xlarge", "12xlarge", "18xlarge", "24xlarge")),
    **_doubling("c6i", 0.085, (*_UP_TO_24, "32xlarge")),
    **_doubling("c7i", 0.08925, (*_UP_TO_24, "48xlarge")),
    **_doubling("c7g", 0.0725, ("medium", *_UP_TO_24[:-1])),
    **_doubling("r5", 0.126, _UP_TO_24), **_doubling("r6i", 0.126, (*_UP_TO_24, "32xlarge")),
    **_doubling("r7i", 0.1323, (*_UP_TO_24, "48xlarge")),
    # GPU: K80, V100, T4, A10G, L4, L40S, A100, H100
    **_sizes("p2", {"xlarge": 0.9, "8xlarge": 7.2, "16xlarge": 14.4}),
    **_sizes("p3", {"2xlarge": 3.06, "8xlarge": 12.24, "16xlarge": 24.48}),
    "p3dn.24xlarge": 31.212,
    **_sizes("g4dn", {"xlarge": 0.526, "2xlarge": 0.752, "4xlarge": 1.204, "8xlarge": 2.176, "12xlarge": 3.912,
                      "16xlarge": 4.352, "metal": 7.824}),
    **_sizes("g5", {"xlarge": 1.006, "2xlarge": 1.212, "4xlarge": 1.624, "8xlarge": 2.448, "12xlarge": 5.672,
                    "16xlarge": 4.096, "24xlarge": 8.144, "48xlarge": 16.288}),
    "g5g.xlarge": 0.42, "g5g.2xlarge": 0.556,
    **_sizes("g6", {"xlarge": 0.8048, "2xlarge": 0.9776, "4xlarge": 1.3232, "8xlarge": 2.0144, "12xlarge": 4.6016,
                    "16xlarge": 3.3968, "24xlarge": 6.6752, "48xlarge": 13.3504}),
    **_sizes("g6e", {"xlarge": 1.861, "2xlarge": 2.24208, "4xlarge": 3.00424, "8xlarge": 4.52856,
                     "12xlarge": 10.49264, "16xlarge": 7.57719, "24xlarge": 15.06559, "48xlarge": 30.13118}),
    "p4d.24xlarge": 21.96, "p4de.24xlarge": 27.447,  # p4de: its pre-2025 price cut as p4d's was (an estimate)
    "p5.4xlarge": 6.88, "p5.48xlarge": 55.04,
    "p5e.48xlarge": 60.0, "p5en.48xlarge": 63.296,  # listed mostly through Capacity Blocks: estimates
    # Trainium, Inferentia
    "trn1.2xlarge": 1.34375, "trn1.32xlarge": 21.5, "inf2.xlarge": 0.7582,
}

# Compute Engine, us-central1, on-demand (accelerator-optimized types include their GPUs).
GCP: dict[str, float] = {
    "e2-micro": 0.008376, "e2-small": 0.016752, "e2-medium": 0.033503,
    **_sizes("e2-standard", {"2": 0.067006, "4": 0.134012, "8": 0.268024, "16": 0.536048, "32": 1.072096}, "-"),
    **_sizes("n1-standard", {"1": 0.0475, "2": 0.095, "4": 0.19, "8": 0.38, "16": 0.76, "32": 1.52, "64": 3.04,
                             "96": 4.56}, "-"),
    **_sizes("n1-highmem", {"2": 0.1184, "4": 0.2368, "8": 0.4736, "16": 0.9472, "32": 1.8944, "64": 3.7888,
                            "96": 5.6832}, "-"),
    **_sizes("n2-standard", {"2": 0.097118, "4": 0.194236, "8": 0.388472, "16": 0.776944, "32": 1.553888,
                             "48": 2.330832, "64": 3.107776, "80": 3.88472, "96": 4.661664, "128": 6.215552}, "-"),
    **_sizes("n2d-standard", {"2": 0.084492, "4": 0.168984, "8": 0.337968, "16": 0.675936, "32": 1.351872,
                              "48": 2.027808, "64": 2.703744, "96": 4.055616}, "-"),
    **_sizes("c2-standard", {"4": 0.2088, "8": 0.4176, "16": 0.8352, "30": 1.566, "60": 3.132}, "-"),
    **_sizes("c3-standard", {"4": 0.201608, "8": 0.403216, "22": 1.108844, "44": 2.217688, "88": 4.435376,
                             "176": 8.870752}, "-"),
    # L4
    **_sizes("g2-standard", {"4": 0.70683, "8": 0.85362, "12": 1.00041, "16": 1.1472, "24": 2.00082, "32": 1.73437,
                             "48": 4.00164, "96": 8.00328}, "-"),
    # A100 40 GB, A100 80 GB, H100
    **_sizes("a2-highgpu", {"1g": 3.673385, "2g": 7.34677, "4g": 14.69354, "8g": 29.38708}, "-"),
    "a2-megagpu-16g": 55.739504,
    **_sizes("a2-ultragpu", {"1g": 5.0688, "2g": 10.1376, "4g": 20.2752, "8g": 40.5504}, "-"),
    **_sizes("a3-highgpu", {"1g": 11.031723, "2g": 22.063446, "4g": 44.126892, "8g": 88.253784}, "-"),  # 1-4g: an
    # eighth of 8g's per GPU (an estimate)
    "a3-megagpu-8g": 92.0, "a3-edgegpu-8g": 88.253784,  # estimates
}

# The GPUs an N1 machine type takes (guestAccelerators), us-central1, on-demand, per GPU-hour: added to the
# machine type's price (jobplane.model.accelerators.guest_accelerator names them).
GCE_GPUS: dict[str, float] = {"nvidia-tesla-t4": 0.35, "nvidia-tesla-v100": 2.48, "nvidia-tesla-p100": 1.46,
                              "nvidia-tesla-p4": 0.6, "nvidia-tesla-k80": 0.45}

ON_DEMAND: dict[str, dict[str, float]] = {"aws": AWS, "gcp": GCP}
GCE_SPOT_FACTOR = 0.4

# Where an attempt's hourly price came from (AttemptUsage.price_source; jobplane.views.cost shows it).
SPOT_HISTORY = "spot price history"
TABLE = "price table"
POLICY = "policy"
SPOT_CEILING = "on-demand price, Spot's ceiling"  # an EC2 Spot price nobody told us: the most it bills
UNKNOWN = "unknown"


class Book(Protocol):
    """The policy's own prices (jobplane.model.policy.Policy is one): USD per instance-hour by type, each winning
    over the table."""

    @property
    def prices(self) -> Mapping[str, float]: ...

    @property
    def spot_prices(self) -> Mapping[str, float]: ...


def listed(cloud: str, name: str, book: Book) -> tuple[float, str] | None:
    """The on-demand price of a type (or a GCE GPU), the policy's first."""
    if name in book.prices:
        return book.prices[name], POLICY
    table = GCE_GPUS if cloud == "gcp" and name in GCE_GPUS else ON_DEMAND.get(cloud, {})
    return (table[name], TABLE) if name in table else None


def _one(cloud: str, name: str, *, spot: bool, book: Book, observed_spot: float | None = None,
         ) -> tuple[float | None, str]:
    if not spot:
        return listed(cloud, name, book) or (None, UNKNOWN)
    if observed_spot is not None:
        return observed_spot, SPOT_HISTORY
    if name in book.spot_prices:
        return book.spot_prices[name], POLICY
    found = listed(cloud, name, book)
    if found is None:
        return None, UNKNOWN
    if cloud == "gcp":
        return round(found[0] * GCE_SPOT_FACTOR, 6), found[1]
    return found[0], SPOT_CEILING


def hourly(cloud: str, instance_type: str, *, spot: bool, book: Book, observed_spot: float | None = None,
           gpus: tuple[str, int] | None = None) -> tuple[float | None, str]:
    """(USD per instance-hour, where it came from) for one launch; (None, unknown) when nobody knows it.

    Spot: the cloud's price at launch, else the policy's spot_prices, else (GCE) the on-demand price times
    GCE_SPOT_FACTOR, else (EC2) the on-demand price, Spot's ceiling. On-demand: the policy's prices, else the
    table. `gpus`: the GCE accelerator type and count an N1 type takes, priced the same way and added."""
    price, source = _one(cloud, instance_type, spot=spot, book=book, observed_spot=observed_spot)
    if price is None or gpus is None:
        return price, source
    gpu, count = gpus
    each = _one(cloud, gpu, spot=spot, book=book)[0]
    return (None, UNKNOWN) if each is None else (round(price + each * count, 6), source)


@dataclass(frozen=True)
class Offer:
    """One instance type and market a spec may get, and what an instance of it costs an hour (None: unknown)."""

    instance_type: str
    spot: bool
    price: float | None
    source: str

    @property
    def market(self) -> str:
        return "spot" if self.spot else "on-demand"

    def __str__(self) -> str:
        return f"{self.instance_type} {self.market}"


def markets(spec: JobSpec) -> list[bool]:
    """Whether each market a spec's attempts may launch in is Spot: Spot first for a Spot spec, on-demand too with
    its fallback."""
    return [True, False] if spec.spot_fallback_after is not None else [spec.uses_spot]


def gpus_of(spec: JobSpec, instance_type: str) -> tuple[str, int] | None:
    """The GPUs a launch attaches to this type of the spec (a GCE N1 type's guestAccelerators), as priced."""
    from jobplane.model import accelerators

    gpu = spec.accelerators
    return accelerators.guest_accelerator(spec.cloud, gpu.model, gpu.count, instance_type) if gpu else None


def offers(spec: JobSpec, book: Book) -> list[Offer]:
    """Every instance type and market the spec's attempts may get, in the order they are tried, with its price as
    known before a launch (an EC2 Spot price is the cloud's at launch: its ceiling, on-demand, stands in)."""
    return [Offer(t, spot, *hourly(spec.cloud, t, spot=spot, book=book, gpus=gpus_of(spec, t)))
            for spot in markets(spec) for t in spec.instance_types]


def held_by_cloud(offer: Offer, max_price: float | None) -> bool:
    """Whether the cloud holds this offer to max_price itself: an EC2 Spot price, known only at launch, is bid at most
    max_price (SpotOptions.MaxPrice; a Spot price above it is no capacity, and the next type is tried)."""
    return max_price is not None and offer.spot and offer.source == SPOT_CEILING


def dearest(spec: JobSpec, book: Book) -> float | None:
    """USD an instance-hour of the dearest type and market the spec may get, the most an attempt of it may cost an
    instance-hour (an EC2 Spot price counts at its ceiling, the on-demand price, or the spec's max_price, which EC2
    holds it to); None when none is priced."""
    return max((min(o.price, spec.max_price) if held_by_cloud(o, spec.max_price) and spec.max_price is not None
                else o.price for o in offers(spec, book) if o.price is not None), default=None)
