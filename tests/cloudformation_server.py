"""moto's server mode, and a front in a thread that answers what real CloudFormation answers where moto 5.2.5 does not.

boto3 reaches the front through AWS_ENDPOINT_URL, as it would reach AWS; the front passes every request to moto and
changes only what AWS documents differently:

- DescribeStacks gives `****` for a NoEcho parameter's value (moto gives the value);
- a template declaring a transform (`Transform: AWS::LanguageExtensions`) is processed before it is planned
  (moto answers such a CreateChangeSet with 500): a test registers the processed template CloudFormation makes of
  it (`processed`), and the front hands moto that one;
- GetTemplate names the template of a change set (`ChangeSetName`) and the stage asked for (`TemplateStage`),
  where moto gives the stack's current template whatever is asked.

A test can also make an action answer as AWS does when it refuses (`fail`): throttled, access denied.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape

NAMESPACE = "http://cloudformation.amazonaws.com/doc/2010-05-15/"
ET.register_namespace("", NAMESPACE)


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's server mode on a free loopback port; its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@dataclass
class _ChangeSet:
    stack: str
    body: str  # as submitted
    processed: str  # what CloudFormation planned: the body itself when it declares no transform


@dataclass
class CloudFormationFront:
    """The front: `url` for AWS_ENDPOINT_URL; `processed` maps a submitted template to CloudFormation's processing."""

    moto: str
    processed: dict[str, str] = field(default_factory=dict)  # sha256 of a submitted body -> the processed template
    _change_sets: dict[str, _ChangeSet] = field(default_factory=dict)  # by name and by ARN
    _no_echo: dict[str, frozenset[str]] = field(default_factory=dict)  # stack -> its NoEcho parameters
    _deployed: dict[str, _ChangeSet] = field(default_factory=dict)  # stack -> the change set it last executed
    _faults: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # action -> (status, code, message)

    def __post_init__(self) -> None:
        front = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                front._handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any  # noqa: N815 - http.server's names

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def process(self, submitted: str, processed: dict[str, Any]) -> None:
        """CloudFormation's processed template of `submitted` (a template declaring a transform)."""
        self.processed[_sha(submitted)] = json.dumps(processed, indent=2)

    def fail(self, action: str, status: int, code: str, message: str) -> None:
        """Every `action` from now on is refused as AWS refuses: an error response with this code."""
        self._faults[action] = (status, code, message)

    def reset(self) -> None:
        self.processed.clear()
        self._change_sets.clear()
        self._no_echo.clear()
        self._deployed.clear()
        self._faults.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- one request ---------------------------------------------------------------------------

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        form = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True)) \
            if "x-www-form-urlencoded" in (request.headers.get("Content-Type") or "") else {}
        action = form.get("Action")
        if action in self._faults:
            self._reply(request, self._faults[action][0], _error_response(*self._faults[action][1:]))
            return
        if action == "GetTemplate":
            change_set = self._change_sets.get(form.get("ChangeSetName") or "") \
                or self._deployed.get(form.get("StackName") or "")
            if change_set is not None:  # the stage asked for; AWS gives the original unless told otherwise
                stage = form.get("TemplateStage") or "Original"
                self._reply(request, 200, _get_template_response(
                    change_set.body if stage == "Original" else change_set.processed))
                return
        if action == "CreateChangeSet":
            submitted = form.get("TemplateBody", "")
            processed = self.processed.get(_sha(submitted), submitted)
            form["TemplateBody"] = processed
            body = urllib.parse.urlencode(form).encode()
        status, headers, answer = self._forward(request, body)
        if action == "CreateChangeSet" and status == 200:
            change_set = _ChangeSet(form["StackName"], submitted, processed)
            self._change_sets[form["ChangeSetName"]] = change_set
            self._change_sets[_text(answer, "Id")] = change_set
        if action == "ExecuteChangeSet" and status == 200 and form.get("ChangeSetName") in self._change_sets:
            change_set = self._change_sets[form["ChangeSetName"]]
            self._deployed[change_set.stack] = change_set
            self._no_echo[change_set.stack] = _no_echo_parameters(change_set.processed)
        if action == "DescribeStacks" and status == 200:
            answer = self._masked(answer)
        self._reply(request, status, answer, headers)

    def _forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        target = urllib.parse.urlsplit(self.moto)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        connection.request(request.command, request.path, body=body if body or request.command != "GET" else None,
                           headers={**headers, "Content-Length": str(len(body))})
        response = connection.getresponse()
        answer = response.read()
        kept = [(k, v) for k, v in response.getheaders()
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date")]
        connection.close()
        return response.status, kept, answer

    def _masked(self, answer: bytes) -> bytes:
        """DescribeStacks as AWS answers it: a NoEcho parameter's value is `****`."""
        root = ET.fromstring(answer)
        for stack in root.iter(f"{{{NAMESPACE}}}member"):
            name = stack.find(f"{{{NAMESPACE}}}StackName")
            if name is None or name.text not in self._no_echo:
                continue
            for parameter in stack.iterfind(f"{{{NAMESPACE}}}Parameters/{{{NAMESPACE}}}member"):
                key, value = (parameter.find(f"{{{NAMESPACE}}}{tag}") for tag in ("ParameterKey", "ParameterValue"))
                if key is not None and value is not None and key.text in self._no_echo[name.text]:
                    value.text = "****"
        return ET.tostring(root, encoding="utf-8")

    @staticmethod
    def _reply(request: BaseHTTPRequestHandler, status: int, answer: bytes,
               headers: list[tuple[str, str]] | None = None) -> None:
        request.send_response(status)
        for key, value in headers or [("Content-Type", "text/xml")]:
            request.send_header(key, value)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        if request.command != "HEAD":
            request.wfile.write(answer)


@contextmanager
def cloudformation_front(moto: str) -> Iterator[CloudFormationFront]:
    front = CloudFormationFront(moto)
    try:
        yield front
    finally:
        front.close()


def reset_moto(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10)


def _get_template_response(template: str) -> bytes:
    return (f'<GetTemplateResponse xmlns="{NAMESPACE}"><GetTemplateResult>'
            f"<TemplateBody>{escape(template)}</TemplateBody>"
            "<StagesAvailable><member>Original</member><member>Processed</member></StagesAvailable>"
            "</GetTemplateResult><ResponseMetadata><RequestId>front</RequestId></ResponseMetadata>"
            "</GetTemplateResponse>").encode()


def _error_response(code: str, message: str) -> bytes:
    return (f'<ErrorResponse xmlns="{NAMESPACE}"><Error><Type>Sender</Type><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error><RequestId>front</RequestId></ErrorResponse>").encode()


def _no_echo_parameters(template: str) -> frozenset[str]:
    from cfnlint.decode import cfn_yaml

    try:
        document = json.loads(template)
    except json.JSONDecodeError:
        document = cfn_yaml.loads(template)
    parameters = document.get("Parameters") or {}
    return frozenset(str(name) for name, p in parameters.items() if str(p.get("NoEcho", "")).lower() == "true")


def _text(answer: bytes, tag: str) -> str:
    found = ET.fromstring(answer).find(f".//{{{NAMESPACE}}}{tag}")
    return found.text or "" if found is not None else ""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
