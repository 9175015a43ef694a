"""The processes that run jobs and serve people: read a job, run a worker, serve the API and the pages."""

from __future__ import annotations

import os
import signal
import threading

import click

from gateway.cli.context import Context, echo_job_result, pass_ctx
from gateway.domain.jobs import JobKind

group = click.Group("jobs")  # this module's commands; gateway.cli registers each by name


@group.command()
@click.argument("job_id", type=int)
@click.option("--wait", is_flag=True, help="follow the job to its end, printing its progress")
@pass_ctx
def job(ctx: Context, job_id: int, wait: bool) -> None:
    """Show a job: kind, status, progress, and its result once finished."""
    from gateway.services.change.jobs import follow_job

    ctx.actor()
    found = ctx.ws.store.queue.get(job_id)
    subject = (f"request {found.args.get('run')}" if found.kind == JobKind.AGENT_TURN
               else f"notification {found.args.get('notification')}" if found.kind == JobKind.NOTIFY
               else f"proposal {found.proposal_id}")
    click.echo(f"job {found.id}: {found.kind.value} of {subject} [{found.status.value}]"
               + (f" on {found.runner}" if found.runner else ""))
    if wait and not found.finished:
        found = follow_job(ctx.ws, job_id, lambda line: click.echo(f"  {line}", err=True))
    else:
        for line in found.progress:
            click.echo(f"  {line}")
    if found.finished:
        echo_job_result(found)


@group.command()
@click.option("--loops", default=2, show_default=True, type=click.IntRange(1, 64), help="jobs run at once")
@click.option("--poll", "poll_seconds", default=0.5, show_default=True, type=float, help="seconds between claims")
@pass_ctx
def worker(ctx: Context, loops: int, poll_seconds: float) -> None:
    """Run plan and apply jobs from the database until stopped (SIGTERM or Ctrl-C finish the jobs in hand)."""
    from gateway.worker import Worker

    running = Worker(ctx.ws, loops, poll_seconds).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=running.stop, daemon=True).start())
    click.echo(f"worker {running.name}: {loops} loop(s) on {ctx.ws.store.dialect}", err=True)
    try:
        running.wait()
    except KeyboardInterrupt:
        running.stop()


@group.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--workers", default=1, show_default=True, type=click.IntRange(0, 64),
              help="job loops in this process (0 when separate `gateway worker` processes run the jobs)")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1, 64),
              help="API processes (uvicorn workers); each is stateless")
@pass_ctx
def serve(ctx: Context, host: str, port: int, workers: int, processes: int) -> None:
    """Run the HTTP API and the review pages."""
    import uvicorn

    if processes > 1:  # uvicorn imports the app in each process: the settings come from the environment
        os.environ["GATEWAY_SERVE_WORKERS"] = str(workers)
        uvicorn.run("gateway.api.app:app_from_environment", factory=True, host=host, port=port,
                    workers=processes, log_level="warning")
        return
    from gateway.api.app import create_app

    uvicorn.run(create_app(ctx.settings, workers), host=host, port=port, log_level="warning")
