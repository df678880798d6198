"""A training loop that logs its loss to TensorBoard with tensorboardX (no TensorFlow), and resumes from its last
checkpoint when a Spot VM is reclaimed: each attempt's scalars are a run of their own in `jobplane tensorboard`."""

import argparse
import json
import math
import os
import time
from pathlib import Path

from tensorboardX import SummaryWriter

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--checkpoint-every", type=int, default=10)
parser.add_argument("--sleep", type=float, default=0.2)
args = parser.parse_args()

checkpoint = Path(os.environ.get("JOBPLANE_CHECKPOINT_DIR", "/opt/ml/checkpoints")) / "step.json"
start = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else 0
print(f"resuming from step {start}" if start else "starting from step 0", flush=True)
# the spec's tensorboard.log_dir, as the agent tells it (SageMaker's /opt/ml/output/tensorboard otherwise)
writer = SummaryWriter(os.environ.get("JOBPLANE_TENSORBOARD_DIR", "/opt/ml/output/tensorboard"))
for step in range(start + 1, args.steps + 1):
    loss = 2.0 * math.exp(-step / 50) + 0.05
    writer.add_scalar("loss", loss, step)
    writer.flush()  # on disk for the agent's next upload
    print(f"step {step} loss {loss:.4f}", flush=True)
    if step % args.checkpoint_every == 0:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        partial = checkpoint.with_name("step.json.partial")
        partial.write_text(json.dumps({"step": step}))
        partial.replace(checkpoint)
    time.sleep(args.sleep)
writer.close()
