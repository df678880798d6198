"""The dashboard's web app (Starlette): server-rendered pages (Jinja2, autoescaped), htmx fragments that poll for
live updates, JSON for the charts and the log follower, and one write: cancel (POST + the process's CSRF token).

Every page is read through the SDK (jobplane.sdk.Client: a Watch for the jobs table and the output, Job and
Client for the rest) and formatted as the CLI formats it (jobview, cost, metricview); nothing is written but a
cancel. Served on loopback by `jobplane ui` (cli/ui.py).
"""

from __future__ import annotations

import gc
import hmac
import secrets
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobplane import sdk
from jobplane.model.clock import utcnow
from jobplane.model.spec import job_id_problem, spec_to_json
from jobplane.ui import compare, data, sweeps
from jobplane.views import cost, jobview

HERE = Path(__file__).parent
SORTABLE = ("id", "state", "attempt", "nodes", "instance_type", "age", "runtime", "cost", "restarts")
PERIODS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30), "all": None}
COST_GROUPS = ("owner", "type", "market", "job")
PAGE_ROWS = 500  # rows a jobs page renders (the counts cover them all): filters narrow, ?limit= shows more
# Scripts and styles only from the app itself: a `<script>` that escaped escaping would still not run.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


T = TypeVar("T")


def readable(read: Callable[[], T]) -> T | None:
    """What read() returns, or None for a job of another team (its data is not the viewer's to read)."""
    try:
        return read()
    except sdk.NotYours:
        return None


def templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    env.filters["duration"] = jobview.human_duration
    env.filters["money"] = lambda usd: cost.money(cost.Cost(usd=usd)) if usd is not None else "-"
    env.filters["size"] = jobview.human_size
    return env


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")



def create_app(client: sdk.Client, *, csrf_token: str | None = None,
               allowed_hosts: Sequence[str] = LOOPBACK_NAMES) -> Starlette:
    """The app over the registry of one client. csrf_token: the token a cancel must carry (a new random one by default).
    allowed_hosts: the names a request's Host header may carry; any other is refused (400), so a web page whose
    name was rebound to 127.0.0.1 (DNS rebinding) cannot read the dashboard. ("*",): any, for --host."""
    token = csrf_token or secrets.token_urlsafe(32)
    env = templates()
    watch = client.watch()
    frozen: list[bool] = []  # whether the heap is frozen yet (once per server)

    def page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(csrf=token, **context)
        return HTMLResponse(html, status_code, headers={"Content-Security-Policy": CSP,
                                                        "X-Content-Type-Options": "nosniff",
                                                        "Referrer-Policy": "same-origin"})

    def filters(request: Request) -> dict[str, Any]:
        q = request.query_params
        sort = q.get("sort", "age")
        return {"state": q.get("state", ""), "owner": q.get("owner", ""), "label": q.get("label", ""),
                "text": q.get("q", ""), "all": q.get("all", "") in ("1", "on", "true"),
                "sort": sort if sort in SORTABLE else "age", "desc": q.get("desc", "") in ("1", "true"),
                "limit": int(q["limit"]) if q.get("limit", "").isdigit() else PAGE_ROWS}

    def table(f: dict[str, Any]) -> dict[str, Any]:
        look = watch.look(include_finished=True)  # the first page shows recently ended jobs too
        if not frozen:  # the first look read every record: the watch keeps them as long as the server runs
            frozen.append(True)
            gc.freeze()  # out of the collector's walks: at 10,000 jobs a full collection every view or two took 200 ms
        rows = data.rows(look.jobs, f["all"], utcnow(), data.RECENT)
        asked = (f["state"], f["owner"], f["label"], f["text"])
        shown = [r for r in rows if r.matches(*asked)] if any(asked) else rows
        shown = data.sort_rows(shown, f["sort"], f["desc"])
        counts = {str(state): n for state, n in look.counts.items()}
        return {"rows": shown[:f["limit"]], "matched": len(shown), "total": len(rows), "counts": counts, "f": f,
                "owners": sorted({r.owner for r in rows}), "columns": jobview.COLUMNS, "header": jobview.header,
                "display": jobview.display, "sortable": SORTABLE,
                "recent": f"{data.RECENT // timedelta(hours=1)} h"}

    async def jobs_page(request: Request) -> Response:
        return page("jobs.html", **await run_in_threadpool(table, filters(request)))

    async def jobs_fragment(request: Request) -> Response:
        return page("_jobs_table.html", **await run_in_threadpool(table, filters(request)))

    def job_context(job_id: str) -> dict[str, Any]:
        job = client.get(job_id)
        view = job.view
        now = utcnow()
        record = view.record
        spec = data.spec_json(view)
        context: dict[str, Any] = {
            "view": view, "row": dict(zip(jobview.COLUMNS, jobview.display(jobview.view_row(view, now)), strict=True)),
            "status": data.status_line(view, now), "live": not view.terminal,
            "spec_yaml": yaml.safe_dump(spec, sort_keys=False) if spec else "",
            "attempts": data.attempts(record, now) if record else [],
            "events": data.timeline(job.events()) if record else [],
            "total_cost": cost.money(cost.job_cost(record, now)) if record else "-",
            "nodes": view.num_nodes, "current_attempt": view.attempt,
            "right_sizing": readable(job.right_sizing) if record else None,
            "tensorboard": bool(view.spec and view.spec.tensorboard),
            "belongs_to": view.spec.belongs_to if view.spec else None}
        return context

    def files_context(job_id: str) -> dict[str, sdk.Stored]:
        job = client.get(job_id)
        return {"checkpoints": job.stored("checkpoints"), "artifacts": job.stored("artifacts")}

    async def job_page(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            context = await run_in_threadpool(job_context, job_id)
            files = await run_in_threadpool(files_context, job_id)
        except sdk.JobNotFound:
            return page("missing.html", 404, job_id=job_id)
        return page("job.html", files=files, **context)

    async def job_status(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        try:
            context = await run_in_threadpool(job_context, job_id)
        except sdk.JobNotFound:
            return page("missing.html", 404, job_id=job_id)
        return page("_job_status.html", **context)

    async def job_files(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        if job_id_problem(job_id):
            return PlainTextResponse("no such job", 404)
        try:
            view = (await run_in_threadpool(client.get, job_id)).view
            files = await run_in_threadpool(files_context, job_id)
        except sdk.JobNotFound:
            return page("missing.html", 404, job_id=job_id)
        return page("_job_files.html", view=view, live=not view.terminal, files=files)

    async def job_file(request: Request) -> Response:
        """One object of a job's checkpoints/ or artifacts/, as a download: Job.fetch refuses any path that is not
        one of them. Always an attachment of bytes, never a page: a job's HTML must not run as this origin's."""
        job_id, area, path = (request.path_params[k] for k in ("job_id", "area", "path"))
        if job_id_problem(job_id) or area not in ("checkpoints", "artifacts"):
            return PlainTextResponse("no such job or area", 404)
        folder = tempfile.mkdtemp(prefix="jobplane-ui-")  # the store streams it here in parts; then to the browser
        try:
            job = await run_in_threadpool(client.get, job_id)
            got = await run_in_threadpool(job.fetch, area, path, Path(folder) / "object")
        except sdk.JobNotFound:
            shutil.rmtree(folder)
            return PlainTextResponse("no such job", 404)
        except sdk.NotYours as theirs:
            shutil.rmtree(folder)
            return PlainTextResponse(str(theirs), 403)
        except sdk.Refused as exc:
            shutil.rmtree(folder)
            return PlainTextResponse(str(exc), 404)
        return FileResponse(got, media_type="application/octet-stream", filename=path.rsplit("/", 1)[-1],
                            headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"},
                            background=BackgroundTask(shutil.rmtree, folder, True))

    async def job_logs(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        q = request.query_params
        try:
            attempt, rank = int(q.get("attempt", "1")), int(q.get("rank", "0"))
            cursor = int(q["cursor"]) if q.get("cursor") not in (None, "") else None
        except ValueError:
            return PlainTextResponse("attempt, rank and cursor are numbers", 400)
        if job_id_problem(job_id):
            return PlainTextResponse("no such job", 404)
        try:
            job = await run_in_threadpool(client.get, job_id)
        except sdk.JobNotFound:
            return JSONResponse({"text": "", "cursor": 0, "skipped": 0, "live": False})
        try:
            out = await run_in_threadpool(watch.output, job, attempt, rank, cursor)
        except sdk.NotYours as theirs:  # the page says so where the output would be
            return JSONResponse({"text": "", "cursor": 0, "skipped": 0, "live": False, "refused": str(theirs)})
        live = not job.view.terminal
        return JSONResponse({"text": out.text, "cursor": out.cursor, "skipped": out.skipped, "live": live})

    def job_json(render: Callable[[sdk.Job], object]) -> Callable[[Request], Awaitable[Response]]:
        """A job's chart data as JSON: its training metrics (data.metric_data) or system metrics (system_data)."""
        async def endpoint(request: Request) -> Response:
            job_id = request.path_params["job_id"]
            if job_id_problem(job_id):
                return PlainTextResponse("no such job", 404)
            try:
                job = await run_in_threadpool(client.get, job_id)
                return JSONResponse(await run_in_threadpool(render, job))
            except sdk.JobNotFound:
                return PlainTextResponse("no such job", 404)
            except sdk.NotYours as theirs:
                return JSONResponse({"refused": str(theirs)}, 403)
        return endpoint

    async def job_cancel(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        form = await request.form()
        sent = str(form.get("csrf", ""))
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return PlainTextResponse("the form's CSRF token is missing or wrong: reload the page", 403)
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("host"):
            return PlainTextResponse("a cancel must come from this dashboard's own pages", 403)
        try:
            await run_in_threadpool(lambda: client.get(job_id).cancel())
        except sdk.JobNotFound:
            return page("missing.html", 404, job_id=job_id)
        except sdk.Refused as exc:
            return PlainTextResponse(str(exc), 409)
        return RedirectResponse(f"/jobs/{job_id}", 303)

    def compare_context(q: Any) -> dict[str, Any]:
        ids = list(dict.fromkeys(i for i in q.getlist("id") if i and not job_id_problem(i)))[:compare.MAX_CHOSEN]
        f = {k: q.get(k, "") for k in ("q", "sweep", "array", "label")}
        found = compare.find(data.rows(watch.jobs(True), True, utcnow()), f["q"], f["sweep"], f["array"], f["label"])
        if q.get("add") == "all":  # "compare all shown": the matches after those chosen, up to the chart's limit
            ids += [r.id for r in found.shown if r.id not in ids][:compare.MAX_CHOSEN - len(ids)]
        chosen = compare.overlay(client, ids, q.get("metric", "")) if ids else None
        return {"ids": ids, "f": f, "found": found, "chosen": chosen, "max": compare.MAX_CHOSEN,
                "metric": chosen["metric"] if chosen else ""}

    async def compare_page(request: Request) -> Response:
        return page("compare.html", **await run_in_threadpool(compare_context, request.query_params))

    async def tensorboard_page(request: Request) -> Response:
        """How to open jobs' TensorBoard runs: `jobplane tensorboard` serves them on the viewer's own loopback (a
        TensorBoard served from here would need its package, a process and a copy per job, and its scripts)."""
        ids = [i for i in request.query_params.getlist("id") if i and not job_id_problem(i)]
        return page("tensorboard.html", ids=ids or ["ID"])

    async def sweeps_page(request: Request) -> Response:
        everything = request.query_params.get("all", "") in ("1", "on", "true")
        now = utcnow()
        found = await run_in_threadpool(client.sweeps, include_finished=everything)
        return page("sweeps.html", rows=[sweeps.sweep_row(s, now) for s in found], all=everything)

    def sweep_context(sweep_id: str) -> dict[str, Any]:
        found = client.sweep(sweep_id)
        detail = found.describe()
        record = detail.record
        live = record.live or detail.live > 0
        spec_yaml = yaml.safe_dump(data.mask_env(spec_to_json(record.spec)), sort_keys=False)
        best = {k: sweeps.value_text(v) for k, v in record.best.params.items()} if record.best else {}
        return {"sweep": found, "record": record, "spec": record.sweep, "live": live, "total": detail.cost,
                "spec_yaml": spec_yaml, "best_params": best,
                "names": list(record.sweep.parameters), "trials": sweeps.trial_rows(record, detail.trials),
                "charts": sweeps.scatters(record, detail.trials), "pending": detail.live}

    async def sweep_page(request: Request) -> Response:
        sweep_id = request.path_params["sweep_id"]
        if job_id_problem(sweep_id):
            return page("missing.html", 404, sweep_id=sweep_id)
        try:
            context = await run_in_threadpool(sweep_context, sweep_id)
        except sdk.SweepNotFound:
            return page("missing.html", 404, sweep_id=sweep_id)
        name = "_sweep_body.html" if request.url.path.endswith("/body") else "sweep.html"
        return page(name, **context)

    async def queue_page(request: Request) -> Response:
        owner = request.query_params.get("owner", "") or None
        found = await run_in_threadpool(client.queue, owner=owner)
        used = await run_in_threadpool(client.usage, owner=owner)
        return page("queue.html", rows=found, usage=used, owner=owner or "", now=utcnow())

    async def cost_page(request: Request) -> Response:
        by = request.query_params.get("by", "owner")
        label = request.query_params.get("label", "")
        group = f"label:{label}" if by == "label" and label else (by if by in COST_GROUPS else "owner")
        period = request.query_params.get("period", "7d")
        span = PERIODS.get(period, PERIODS["7d"])
        now = utcnow()
        rows = await run_in_threadpool(lambda: client.cost(by=group, since=now - span if span else None, now=now))
        budgets = await run_in_threadpool(client.budgets, now=now)
        top = max((r.cost.usd for r in rows), default=0.0)
        return page("cost.html", rows=rows, by=by, label=label, period=period, periods=list(PERIODS),
                    groups=(*COST_GROUPS, "label"), top=top or 1.0,
                    total=sum((r.cost for r in rows), cost.Cost()), budgets=budgets, usd=cost.usd,
                    scale=max([100.0, *(b.percent for b in budgets)]))

    return Starlette(middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts),
                                            www_redirect=False)], routes=[
        Route("/", jobs_page),
        Route("/fragments/jobs", jobs_fragment),
        Route("/jobs/{job_id}", job_page),
        Route("/jobs/{job_id}/status", job_status),
        Route("/jobs/{job_id}/files", job_files),
        Route("/jobs/{job_id}/logs", job_logs),
        Route("/jobs/{job_id}/files/{area}/{path:path}", job_file),
        Route("/jobs/{job_id}/metrics.json", job_json(data.metric_data)),
        Route("/jobs/{job_id}/system.json", job_json(data.system_data)),
        Route("/jobs/{job_id}/cancel", job_cancel, methods=["POST"]),
        Route("/compare", compare_page),
        Route("/tensorboard", tensorboard_page),
        Route("/cost", cost_page),
        Route("/queue", queue_page),
        Route("/sweeps", sweeps_page),
        Route("/sweeps/{sweep_id}", sweep_page),
        Route("/sweeps/{sweep_id}/body", sweep_page),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ])
