"""The control plane's runs: each reads the registry and the cloud, lets jobplane.decide decide, and applies.

launcher.py   queue/ drops become job records, and attempts become VMs: claim, snapshot, decide each step, apply
reconcile.py  the check, rerun and uptime cap: snapshot, decide, apply each action's effects
(the sweep reconcile is jobplane.sweeps.run; the functions in functions/ call these)
"""
