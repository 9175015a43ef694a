"""How fast the notifications outbox reads the trail and the notify jobs deliver, on SQLite.

Writes N `breaker.tripped` events into a fresh workspace's trail (each routed to one signed webhook), then times the
outbox passes that turn them into notifications and jobs (500 events a pass), a pass over N events with no route
(what every housekeeping pass costs a gateway that notifies nobody), and one worker loop delivering them all to a
receiver on loopback. It is not a test.

Usage: python benchmarks/notifications.py [N]   (default 2000)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import git

from gateway.adapters.git.repo import committer_env
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.principals import GATEWAY
from gateway.logs import configure_logging
from gateway.services.change.jobs import run_job
from gateway.services.notifications.outbox import queue_notifications
from gateway.services.workspace import Workspace

ROUTED = "\nnotifications:\n  channels: {hook: {webhook: {}}}\n  routes: [{channels: [hook]}]\n"


def receiver() -> tuple[ThreadingHTTPServer, list[int]]:
    got: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got.append(1)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def fill_trail(ws: Workspace, n: int) -> None:
    with ws.store.session() as session:
        session.audit.append_many([(GATEWAY, "breaker.tripped", {"scope": "*", "agent": f"agent-{i}",
                                                                 "reason": "benchmark", "proposal": None}, None, [])
                                   for i in range(n)])


def outbox_until_done(ws: Workspace) -> tuple[float, int]:
    started, queued = time.perf_counter(), 0
    while True:
        with ws.store.session(readonly=True) as session:
            head = session.audit.chain_head()
            place = session.main.marker("notified_seq")
        if head is None or place == str(head[0]):
            return time.perf_counter() - started, queued
        queued += len(queue_notifications(ws))


def main(n: int) -> None:
    configure_logging("warning")
    server, got = receiver()
    with tempfile.TemporaryDirectory() as tmp:
        channels = {"hook": {"url": f"http://127.0.0.1:{server.server_address[1]}/hook", "key": "k" * 16}}
        ws = create_workspace(Settings(home=Path(tmp) / "home", notification_channels=channels))
        fill_trail(ws, n)
        unrouted, _ = outbox_until_done(ws)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), Path(tmp) / "clone")
        path = Path(tmp) / "clone" / "gateway.yaml"
        path.write_text(path.read_text() + ROUTED)
        clone.git.add("-A")
        clone.git.execute(["git", "commit", "-qm", "route"], env=committer_env("admin", "a@example.com"))
        clone.git.push("-q", "origin", "HEAD:main")
        fill_trail(ws, n)
        routed, queued = outbox_until_done(ws)
        started = time.perf_counter()
        while (job := ws.store.queue.claim("bench")) is not None:
            run_job(ws, job, "bench")
        delivered = time.perf_counter() - started
        ws.close()
    server.shutdown()
    print(f"outbox, no route:   {n} events in {unrouted:.2f} s ({n / unrouted:,.0f} events/s)")
    print(f"outbox, routed:     {n} events -> {queued} notifications and jobs in {routed:.2f} s "
          f"({queued / routed:,.0f}/s)")
    print(f"delivery, 1 loop:   {len(got)} signed webhooks in {delivered:.2f} s ({len(got) / delivered:,.0f}/s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
