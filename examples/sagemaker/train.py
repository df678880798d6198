"""A SageMaker script-mode training script that jobplane runs unchanged: logistic regression in plain Python.

It takes what SageMaker hands a training script, and nothing jobplane-specific:
  hyperparameters  --epochs / --lr / --batch-size as SageMaker passes them to an entry point, defaulting to
                   SM_HP_EPOCHS, SM_HP_LR, SM_HP_BATCH_SIZE (set by SageMaker's toolkit, and by jobplane);
                   all of them, values as strings, in /opt/ml/input/config/hyperparameters.json
  data             SM_CHANNEL_TRAIN: the files of the `train` input channel (CSV rows: x1, x2, label)
  model            SM_MODEL_DIR: what is saved there is uploaded as the job's model artifacts
and prints one `epoch N step S train_loss=L train_accuracy=A` line per epoch for metric definitions to read.

    python3 train.py --epochs 20 --lr 0.5
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
from pathlib import Path


def hyperparameter(name: str, default: str) -> str:
    return os.environ.get(f"SM_HP_{name.upper()}", default)


def load(channel: Path) -> list[tuple[list[float], int]]:
    rows = []
    for path in sorted(channel.glob("*.csv")):
        with path.open() as f:
            rows += [([float(a), float(b)], int(label)) for a, b, label in csv.reader(f)]
    if not rows:
        raise SystemExit(f"no CSV files in {channel}")
    return rows


def predict(w: list[float], x: list[float]) -> float:
    z = w[0] + w[1] * x[0] + w[2] * x[1]
    return 1 / (1 + math.exp(-max(-30.0, min(30.0, z))))


def evaluate(w: list[float], rows: list[tuple[list[float], int]]) -> tuple[float, float]:
    loss = correct = 0.0
    for x, label in rows:
        p = min(max(predict(w, x), 1e-12), 1 - 1e-12)
        loss -= label * math.log(p) + (1 - label) * math.log(1 - p)
        correct += (p >= 0.5) == bool(label)
    return loss / len(rows), correct / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=int(hyperparameter("epochs", "10")))
    parser.add_argument("--lr", type=float, default=float(hyperparameter("lr", "0.1")))
    parser.add_argument("--batch-size", type=int, default=int(hyperparameter("batch_size", "16")))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"))
    args = parser.parse_args()

    config = Path(os.environ.get("SM_INPUT_CONFIG_DIR", "/opt/ml/input/config"))
    print("hyperparameters.json:", (config / "hyperparameters.json").read_text().replace("\n", ""), flush=True)
    print(f"training: epochs={args.epochs} lr={args.lr} batch_size={args.batch_size} data={args.train}", flush=True)
    rows = load(Path(args.train))
    rng = random.Random(0)
    w, step = [0.0, 0.0, 0.0], 0
    for epoch in range(1, args.epochs + 1):
        rng.shuffle(rows)
        for start in range(0, len(rows), args.batch_size):
            batch = rows[start:start + args.batch_size]
            grad = [0.0, 0.0, 0.0]
            for x, label in batch:
                err = predict(w, x) - label
                grad = [grad[0] + err, grad[1] + err * x[0], grad[2] + err * x[1]]
            w = [wi - args.lr * g / len(batch) for wi, g in zip(w, grad, strict=True)]
            step += 1
        loss, accuracy = evaluate(w, rows)
        print(f"epoch {epoch} step {step} train_loss={loss:.5f} train_accuracy={accuracy:.4f}", flush=True)

    model_dir = Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "model.json").write_text(json.dumps({"weights": w, "epochs": args.epochs, "accuracy": accuracy}))
    print(f"saved {model_dir / 'model.json'}", flush=True)


if __name__ == "__main__":
    main()
