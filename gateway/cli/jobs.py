"""The processes that run jobs and serve people: read a job, run a worker, serve the API and the pages."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

import click

from gateway.cli.context import Context, echo_job_result, pass_ctx
from gateway.domain.jobs import JobKind
from gateway.logs import get_logger

group = click.Group("jobs")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.argument("job_id", type=int)
@click.option("--wait", is_flag=True, help="follow the job to its end, printing its progress")
@pass_ctx
def job(ctx: Context, job_id: int, wait: bool) -> None:
    """Show a job: kind, status, progress, and its result once finished."""
    from gateway.services.change.jobs import follow_on_workers

    ctx.actor()
    found = ctx.ws.store.queue.get(job_id)
    subject = (f"request {found.args.get('run')}" if found.kind == JobKind.AGENT_TURN
               else f"notification {found.args.get('notification')}" if found.kind == JobKind.NOTIFY
               else f"proposal {found.proposal_id}")
    click.echo(f"job {found.id}: {found.kind.value} of {subject} [{found.status.value}]"
               + (f" on {found.runner}" if found.runner else ""))
    if wait and not found.finished:
        found = follow_on_workers(ctx.ws, found, lambda line: click.echo(f"  {line}", err=True))
        if not found.finished:
            click.echo(f"error: job {job_id} is still queued and no worker is live to take it: it runs when one "
                       "starts (`gateway worker`)", err=True)
            sys.exit(1)
    else:
        for line in found.progress:
            click.echo(f"  {line}")
    if found.finished:
        echo_job_result(found)


@group.command()
@click.option("--loops", default=2, show_default=True, type=click.IntRange(1, 64), help="jobs run at once")
@click.option("--poll", "poll_seconds", default=0.5, show_default=True, type=float, help="seconds between claims")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="serve Prometheus metrics on this port (GET /metrics)")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, help="address the metrics port listens on")
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a file kept while the worker is ready (database answering, schema current); gone when it stops")
@click.option("--grace", "grace_seconds", default=540.0, show_default=True, type=click.FloatRange(0),
              help="on SIGTERM, seconds to let jobs in hand finish before re-plans and publishes are handed back "
                   "(an apply always runs to its recorded end)")
@pass_ctx
def worker(ctx: Context, loops: int, poll_seconds: float, metrics_port: int | None, metrics_host: str,
           ready_file: Path | None, grace_seconds: float) -> None:
    """Run plan and apply jobs from the database until stopped (SIGTERM or Ctrl-C finish the jobs in hand).

    It starts whatever the database is doing: the loops begin when it answers (brought to this gateway's schema),
    and the ready file is there only while it does."""
    from gateway.logs import configure_service_logging
    from gateway.services.admin.startup import log_start
    from gateway.worker import Worker

    configure_service_logging()
    ws = ctx.open_service()
    if metrics_port is not None:
        from gateway.composition import install_prometheus

        install_prometheus(ws).serve(metrics_port, metrics_host)
    running = Worker(ws, loops, poll_seconds, ready_file=ready_file)
    stopping = threading.Event()
    log = get_logger(__name__)

    def stop(*_: object) -> None:
        if not stopping.is_set():
            stopping.set()
            log.info("worker.stopping", worker=running.name, in_hand=[job.id for job in running.in_hand()],
                     grace_seconds=grace_seconds)
            threading.Thread(target=running.stop, args=(grace_seconds,), daemon=True).start()

    signal.signal(signal.SIGTERM, stop)  # before the loops start: a stop never lands on the default handler
    log_start(ws, "worker", worker=running.name, loops=loops, metrics_port=metrics_port, grace_seconds=grace_seconds)
    running.start()
    try:
        running.wait()
    except KeyboardInterrupt:
        stop()
        running.wait()


@group.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(0, 64),
              help="job loops in this process (0 when separate `gateway worker` processes run the jobs)")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 64),
              help="API processes (uvicorn workers); each is stateless")
@pass_ctx
def serve(ctx: Context, host: str, port: int, workers: int, processes: int) -> None:
    """Run the HTTP API and the review pages.

    HTTPS when GATEWAY_TLS_CERT_FILE and GATEWAY_TLS_KEY_FILE are set. It starts whatever the database is doing and says so on /api/v1/ready; it exits non-zero when any API process
    cannot start (a bad setting, a port taken), so an orchestrator restarts it or shows why."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from gateway.logs import configure_service_logging

    configure_service_logging()
    settings = ctx.settings
    tls = {"ssl_certfile": settings.tls_cert_file, "ssl_keyfile": settings.tls_key_file}
    options = {"host": host, "port": port, "log_config": None, "access_log": False, "log_level": None, **tls}
    if processes == 1:
        from gateway.api.app import create_app

        uvicorn.run(create_app(settings, workers), **options)  # exits with STARTUP_FAILURE if it cannot start
        return
    # uvicorn imports the app in each process: the settings come from the environment
    os.environ["GATEWAY_SERVE_WORKERS"] = str(workers)
    made = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # each process's counters in files, summed by a scrape
        made = tempfile.mkdtemp(prefix="gateway-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = made
    try:
        config = uvicorn.Config("gateway.api.app:app_from_environment", factory=True, workers=processes, **options)
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        supervisor.run()
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    failed = [p.pid for p in supervisor.processes if p.exitcode == STARTUP_FAILURE]
    if failed:  # uvicorn stops the others, then returns as if all were well: the exit says it was not
        get_logger(__name__).error("serve.failed", processes=failed,
                                   reason="API process(es) could not start (see their lines); the others were stopped")
        sys.exit(STARTUP_FAILURE)
