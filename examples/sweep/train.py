"""A training run whose loss is a known function of the learning rate, for examples/sweep/sweep.yaml: the final
loss is (log10(lr) + 2)^2 + 0.05, best at lr = 0.01, and the curve falls towards it from one above, so a bad
learning rate shows early (what the median rule stops). It reads lr as a SageMaker script does (SM_HP_LR, which
`hyperparameters: {lr: ...}` and each sweep trial set) and prints `step N loss X`, which jobplane reads as metrics.
"""

import math
import os
import time

STEPS = int(os.environ.get("STEPS", "40"))
PAUSE = float(os.environ.get("PAUSE", "0.25"))  # seconds per step: a trial lasts about STEPS * PAUSE


def final_loss(lr: float) -> float:
    return (math.log10(lr) + 2) ** 2 + 0.05


def main() -> None:
    lr = float(os.environ.get("SM_HP_LR", "0.01"))
    final = final_loss(lr)
    print(f"lr {lr:.6g}: training {STEPS} steps", flush=True)
    for step in range(1, STEPS + 1):
        time.sleep(PAUSE)
        loss = final + (math.exp(-step / 5) if step < STEPS else 0.0)
        print(f"step {step} loss {loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
