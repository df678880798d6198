"""What a deployment's function invocations work with.

context.py    the Deployment an invocation builds from its Settings and its cloud's adapters (the registry, the
              policy, the Compute adapter, the notifier), and the Context a launcher, check or sweep reconcile run takes
notify.py     publishes a job's end and idle-GPU flags on the deployment's topic
telemetry.py  the metrics seam: core code counts what it does, each entry point says where the numbers go
"""
