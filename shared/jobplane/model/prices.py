"""The on-demand list prices jobplane ships, in USD per instance-hour, for the common training types.

Source: the clouds' public list prices for Linux on-demand instances, as published in 2025 (EC2 us-east-1,
after the June 2025 reduction of P4/P5 prices; Compute Engine us-central1, machine types with their GPUs
included), written down by hand when this table was made (2026-11), not fetched at run time. Other regions
cost more or less (typically 0-30 % more), list prices change, and discounts (Savings Plans, committed use,
negotiated rates) are not applied: every cost jobplane shows is an estimate, and a platform team sets its
own prices in config/policy.yaml (`prices:` for on-demand, `spot_prices:` for Spot), which win over this
table.

EC2 Spot prices come from the cloud at launch (DescribeSpotPriceHistory). Compute Engine has no per-VM
Spot price API the functions can call cheaply, so a GCE Spot VM is estimated at GCE_SPOT_FACTOR of its
on-demand price (Google advertises 60-91 % off; the factor takes the low end of the discount), unless the
policy's spot_prices names it.
"""

from __future__ import annotations

# EC2, us-east-1, Linux, on-demand.
AWS: dict[str, float] = {
    # burstable and general purpose (demo, CPU jobs, data preparation)
    "t3.micro": 0.0104, "t3.small": 0.0208, "t3.medium": 0.0416, "t3.large": 0.0832, "t3.xlarge": 0.1664,
    "t3.2xlarge": 0.3328,
    "m5.large": 0.096, "m5.xlarge": 0.192, "m5.2xlarge": 0.384, "m5.4xlarge": 0.768,
    "m6i.large": 0.096, "m6i.xlarge": 0.192, "m6i.2xlarge": 0.384, "m6i.4xlarge": 0.768,
    "m7i.large": 0.1008, "m7i.xlarge": 0.2016, "m7i.2xlarge": 0.4032,
    "m7g.large": 0.0816, "m7g.xlarge": 0.1632,
    # compute optimized
    "c5.large": 0.085, "c5.xlarge": 0.17, "c5.2xlarge": 0.34, "c5.4xlarge": 0.68, "c5.9xlarge": 1.53,
    "c6i.large": 0.085, "c6i.xlarge": 0.17, "c6i.2xlarge": 0.34, "c6i.4xlarge": 0.68,
    "c7i.large": 0.08925, "c7i.xlarge": 0.1785, "c7i.2xlarge": 0.357,
    "c7g.large": 0.0725, "c7g.xlarge": 0.145, "c7g.2xlarge": 0.29,
    # GPU: T4, A10G, L4, V100, A100, H100
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448, "g5.12xlarge": 5.672,
    "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g5g.xlarge": 0.42, "g5g.2xlarge": 0.556,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144, "g6.12xlarge": 4.6016,
    "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "p4d.24xlarge": 21.96, "p5.48xlarge": 55.04,
    # Trainium, Inferentia
    "trn1.2xlarge": 1.34375, "trn1.32xlarge": 21.5, "inf2.xlarge": 0.7582,
}

# Compute Engine, us-central1, on-demand (accelerator-optimized types include their GPUs).
GCP: dict[str, float] = {
    "e2-small": 0.016752, "e2-medium": 0.033503, "e2-standard-2": 0.067006, "e2-standard-4": 0.134012,
    "e2-standard-8": 0.268024,
    "n1-standard-1": 0.0475, "n1-standard-2": 0.095, "n1-standard-4": 0.19, "n1-standard-8": 0.38,
    "n1-standard-16": 0.76,
    "n2-standard-2": 0.097118, "n2-standard-4": 0.194236, "n2-standard-8": 0.388472, "n2-standard-16": 0.776944,
    "n2-standard-32": 1.553888,
    # L4
    "g2-standard-4": 0.70683, "g2-standard-8": 0.85362, "g2-standard-12": 1.00041, "g2-standard-16": 1.1472,
    "g2-standard-24": 2.00082, "g2-standard-32": 1.73437, "g2-standard-48": 4.00164, "g2-standard-96": 8.00328,
    # A100 40 GB, A100 80 GB, H100
    "a2-highgpu-1g": 3.673385, "a2-highgpu-2g": 7.34677, "a2-highgpu-4g": 14.69354, "a2-highgpu-8g": 29.38708,
    "a2-megagpu-16g": 55.739504,
    "a2-ultragpu-1g": 5.0688, "a2-ultragpu-2g": 10.1376, "a2-ultragpu-4g": 20.2752, "a2-ultragpu-8g": 40.5504,
    "a3-highgpu-8g": 88.253784,
}

ON_DEMAND: dict[str, dict[str, float]] = {"aws": AWS, "gcp": GCP}
GCE_SPOT_FACTOR = 0.4
