"""Sweeps: a hyperparameter search whose trials are jobs (docs/architecture.md, "Sweeps").

record.py   sweeps/<id>/sweep.json's model (SweepRecord) and how one reconcile plan advances it (pure)
store.py    the record in the registry: created create-only, changed by compare-and-swap, active-sweeps/ markers
run.py      the sweep reconcile: read each live sweep and its trials, decide (jobplane.decide.trials), apply
curves.py   a trial's objective curve, read from its metric chunks incrementally
ops.py      what the SDK offers over them: list, describe (trials, objective, cost), cancel
"""
