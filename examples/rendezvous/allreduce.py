"""Every node adds its number to everyone else's through torch.distributed, then prints the sum.

The ranks find each other the way multi-node training does: rank 0 listens on MASTER_ADDR:MASTER_PORT and
the others connect there (torch's env:// rendezvous); jobplane sets those, NODE_RANK and NNODES on each
node. The gloo backend needs no GPU. Exits 1 if the sum is not 1 + 2 + ... + NNODES.

    NODE_RANK=0 NNODES=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 allreduce.py
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    rank, world = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    print(f"rank {rank}/{world}: meeting the others at {where}", flush=True)
    started = time.monotonic()
    # Nodes boot at different times: the first ones wait up to the timeout for the rest.
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timedelta(minutes=5))
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    total, expected = value.item(), world * (world + 1) / 2
    print(f"rank {rank}/{world}: all_reduce sum {total:g} (expected {expected:g}) after "
          f"{time.monotonic() - started:.1f}s", flush=True)
    dist.barrier()  # nobody leaves while another rank still talks to it
    dist.destroy_process_group()
    return 0 if total == expected else 1


if __name__ == "__main__":
    sys.exit(main())
