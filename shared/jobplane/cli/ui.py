"""`jobplane ui`: the web dashboard (jobplane.ui) on loopback, over the registry the other commands use (an SDK
Client of it), with the user's own credentials."""

from __future__ import annotations

import secrets
import socket
import webbrowser

import click

from jobplane.cli.connect import UserError, client, cloud_errors, registry_options

LOOPBACK = "127.0.0.1"


@click.command()
@click.option("--port", type=int, default=8765, show_default=True, help="Port to serve on (0: any free port).")
@click.option("--host", default=None,
              help=f"Interface to serve on (default {LOOPBACK}). Anything else exposes your registry to that "
                   "network with your credentials: only behind your own access control.")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in your web browser.")
@click.option("--fd", type=int, default=None, hidden=True,
              help="Serve on this inherited listening socket (`jobplane local up`'s dashboard: the port it bound).")
@registry_options
@cloud_errors
def ui(port: int, host: str | None, open_browser: bool, fd: int | None, **conn: str | None) -> None:
    """Serve the web dashboard: jobs, their logs, metrics and cost, live.

    \b
    Reads the same registry as the other commands, with your credentials; the only write it makes is a
    cancel (a POST carrying the server's CSRF token). Served on 127.0.0.1 unless --host says otherwise.
    Example:
      jobplane ui --open
    """
    try:
        import uvicorn

        from jobplane.ui.server import LOOPBACK_NAMES, create_app
    except ImportError as exc:
        raise UserError(f"the dashboard needs the ui extra: pip install 'jobplane[ui]' ({exc.name} is missing)") \
            from None
    if host is not None and host != LOOPBACK:
        click.echo(f"warning: serving on {host}, not loopback: anyone who reaches it reads your registry and can "
                   "cancel jobs with your credentials", err=True)
    host = host or LOOPBACK
    # on loopback, only requests naming loopback (no DNS rebinding); elsewhere the names it is reached by are unknown
    app = create_app(client(**conn), csrf_token=secrets.token_urlsafe(32),
                     allowed_hosts=LOOPBACK_NAMES if host in LOOPBACK_NAMES else ("*",))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if fd is not None:
        sock = socket.socket(fileno=fd)  # bound and listening already
    else:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror} (--port 0 picks a free port)") from None
    url = f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{sock.getsockname()[1]}/"
    click.echo(f"jobplane ui: {url} (Ctrl-C stops it)", err=True)
    if open_browser:
        webbrowser.open(url)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])
