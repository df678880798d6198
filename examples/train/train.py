"""Linear regression on synthetic data with numpy: the jobplane demo's training job.

Prints step and loss, checkpoints every N steps into $JOBPLANE_CHECKPOINT_DIR (atomically: write a .tmp
file, then rename it), and resumes from the newest checkpoint there. On SIGTERM (a Spot notice, a stop
request, the VM shutting down) it saves the current step and exits, so a preemption loses nothing.
--diverge-at S blows the weights up at step S (the loss is NaN from there on, as after an overflow) to try
a spec's stop_on. The learning rate is --lr, else the spec's hyperparameter lr (SM_HP_LR, as jobplane and
SageMaker set it; `hyperparameters={"lr": ...}` in the SDK, `--hp lr=...` on the command line), else
$LEARNING_RATE, else 0.05.

    python3 train.py --steps 300 --checkpoint-every 25 --sleep 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import numpy as np

FEATURES = 8
SAMPLES = 2048


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=FEATURES)
    x = rng.normal(size=(SAMPLES, FEATURES))
    y = x @ true_w + 0.1 * rng.normal(size=SAMPLES)
    return x, y, true_w


def newest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("ckpt-*.npz"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def save(directory: Path, step: int, w: np.ndarray) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".ckpt-{step}.tmp.npz"
    np.savez(tmp, w=w, step=step)
    tmp.replace(directory / f"ckpt-{step}.npz")  # a reader never sees a half-written checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument("--lr", type=float,
                        default=float(os.environ.get("SM_HP_LR") or os.environ.get("LEARNING_RATE") or "0.05"))
    parser.add_argument("--sleep", type=float, default=0.05, help="seconds per step, so a demo can preempt")
    parser.add_argument("--diverge-at", type=int, default=0, help="make the loss NaN from this step on")
    args = parser.parse_args()

    ckpt_dir = Path(os.environ.get("JOBPLANE_CHECKPOINT_DIR", "checkpoints"))
    print(f"learning rate {args.lr:g}", flush=True)
    x, y, true_w = data()
    w, start = np.zeros(FEATURES), 0
    latest = newest_checkpoint(ckpt_dir)
    if latest is not None:
        saved = np.load(latest)
        w, start = saved["w"], int(saved["step"])
        print(f"resuming from step {start} ({latest.name})", flush=True)
    else:
        print("starting from step 0", flush=True)

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))

    loss = float("nan")
    for step in range(start + 1, args.steps + 1):
        if step == args.diverge_at:
            w = np.full_like(w, np.nan)
        err = x @ w - y
        loss = float(np.mean(err**2))
        w = w - args.lr * (2 / SAMPLES) * (x.T @ err)
        if step % 10 == 0 or step == start + 1:
            print(f"step {step} loss {loss:.6f}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save(ckpt_dir, step, w)
        if stopping:
            save(ckpt_dir, step, w)
            print(f"SIGTERM: saved step {step}; exiting", flush=True)
            return
        time.sleep(args.sleep)

    out = Path(os.environ.get("JOBPLANE_ARTIFACTS_DIR", "model"))
    out.mkdir(parents=True, exist_ok=True)
    result = {"steps": args.steps, "loss": loss, "weight_error": float(np.linalg.norm(w - true_w))}
    (out / "result.json").write_text(json.dumps(result))
    print(f"done: {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
