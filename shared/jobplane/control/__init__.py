"""The control plane's runs: each reads the registry and the cloud, lets jobplane.decide decide, and applies.

launcher.py   queue/ drops become job records, and attempts become VMs: claim, snapshot, decide each step, apply
reconcile.py  the check, rerun and uptime cap: snapshot, decide, apply each action's effects
scheduled.py  the sweeper's pass: the check, then the sweep reconcile (jobplane.sweeps.run), then its early stops
(the functions in functions/ call these)
"""
