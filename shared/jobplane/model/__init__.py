"""The job's model: what a job is, plain values and their rules, no I/O (the lowest layer; it imports no other
folder of jobplane).

spec.py, sweepspec.py, specfields.py  the job spec (a `sweep:` section's too) and the field types they share
policy.py                             the platform policy: caps, quotas, images, prices, safety limits
states.py, jobrecord.py, history.py   the transition table, job.json's model, a job's events
records.py                            the objects agents and functions exchange (exit report, markers, ...)
keys.py, listings.py                  the registry's key layout, and what a listing of it hands back
usage.py, prices.py                   what each attempt ran on, and the on-demand list prices
images.py, accelerators.py,           boot images by name, GPUs by name, a job's container
containers.py
metrics.py                            the training metrics read from a job's output, and its stop rules
drops.py, yaml_input.py, errors.py    a queue/ drop's spec, user YAML within bounds, errors naming the field
"""

# Import what you use (from jobplane.model import keys): the package imports none of its modules.
