"""The web dashboard `jobplane ui` serves: jobs, a job's logs, metrics, history and cost, live (docs/ui.md).

server.py is the Starlette app, data.py what its pages read from the registry; templates/ and static/ (htmx and
uPlot vendored in static/vendor/ with their licences: no CDN, no build step).
"""
