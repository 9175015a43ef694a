"""The cloudformation engine: a stack's plan is a change set, its apply executes exactly that change set.

boto3 is the client (the AWS SDK: signing, retries, endpoints); credentials and the endpoint come from the
worker's environment as for any AWS tool (`AWS_PROFILE`, `AWS_ACCESS_KEY_ID`..., `AWS_ENDPOINT_URL`), never from
the declaration repo. The CloudFormation stack name and region are main's settings for the stack.

The saved artifact names the change set and the template and parameters it was made from; the approval binds
to it. An apply refuses when the stack moved since the plan (its last update time or status, the serial the
gateway compares) or when the change set is no longer executable, waits on the stack's events with a line per
resource, and records a rolled-back update as the failure it is. A change set CloudFormation refuses to run is a
failed apply with CloudFormation's reason, as is one it can no longer find.

Every call goes through `_call`, which maps botocore's errors once, by their codes, into the gateway's: a refusal
(`CloudRefused`, with AWS's code), throttling and 5xx (`Unavailable`), credentials AWS refuses or the worker lacks
(`BackendError`). The one thing CloudFormation says only in words is that a change set has nothing to change
("No updates are to be performed", "didn't contain changes"): an empty plan wherever it is said.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.adapters.engines.cloudformation.plan import change_set_plan
from gateway.adapters.engines.cloudformation.template import (
    UNKNOWN,
    Resolver,
    Template,
    parse_template,
    read_stack_files,
)
from gateway.domain.errors import (
    ApplyError,
    BackendError,
    CloudRefused,
    ConfigError,
    GatewayError,
    PlanError,
    Unavailable,
)
from gateway.domain.repo_settings import CloudFormationSettings
from gateway.logs import get_logger
from gateway.ports import ApplyOutcome, EnginePlan, StackInputs

log = get_logger(__name__)

POLL_SECONDS = 0.5
WAIT_SECONDS = 900.0
DRIFT_WAIT_SECONDS = 120.0
NO_CHANGES = ("didn't contain changes", "No updates are to be performed", "The submitted information didn't contain")
HIDDEN = "****"  # DescribeStacks' value of every NoEcho parameter
TRANSIENT = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                       "ServiceUnavailable", "InternalFailure", "InternalError", "RequestTimeout",
                       "RequestTimeoutException"})
CREDENTIALS = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
                         "ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "SignatureDoesNotMatch",
                         "UnrecognizedClientException", "InvalidAccessKeyId", "MissingAuthenticationToken"})
Settings = Callable[[str], CloudFormationSettings]


class CloudFormationEngine:
    name = "cloudformation"

    def __init__(self, settings_of: Settings, client_for: Callable[[str], Any] | None = None,
                 poll_seconds: float = POLL_SECONDS):
        self.settings_of = settings_of
        self._client_for = client_for or _boto3_client
        self.poll_seconds = poll_seconds

    # --- the port ------------------------------------------------------------------------------

    def masks_by_origin(self, stack: str) -> bool:
        return True  # the gateway marks by origin; CloudFormation has no nonsensitive()

    def sensitive_attributes(self, stack: str, resource_type: str) -> frozenset[str]:
        return frozenset()  # write-only properties come from NoEcho parameters, which are secret by origin

    def state_serial(self, stack: str) -> int:
        """Two CloudFormation calls: only workers ask (reads show what a worker recorded)."""
        settings = self.settings_of(stack)
        client = self._client(settings)
        return self._serial(client, settings.stack_name, self._describe(client, settings.stack_name))

    def plan(self, stack: str, directory: Path, inputs: StackInputs) -> EnginePlan:
        settings = self.settings_of(stack)
        client = self._client(settings)
        template, parameters = read_stack_files(directory)
        parameters = {**parameters, **{k: str(v) for k, v in inputs.values.items()}}
        declared = template.parameters
        unknown = sorted(set(parameters) - set(declared))
        if unknown:
            raise ConfigError(f"stack {stack}: parameter(s) {', '.join(unknown)} are not declared in {template.file}")
        secret = (template.no_echo() | inputs.secret) & set(declared) | frozenset(inputs.values)
        described = self._describe(client, settings.stack_name)
        serial = self._serial(client, settings.stack_name, described)
        current = None
        if described is not None and not described["StackStatus"].startswith("REVIEW_IN_PROGRESS"):
            current = self._current(client, settings, described, secret)
        changes, change_set = self._change_set(client, settings, template.body, parameters, described)
        drift, notices = self._drift(client, settings) if current is not None else ([], [])
        planned = self._processed(client, settings, template, change_set, current)
        proposed = Resolver(planned, parameters, settings.region, stack_name=settings.stack_name, secret=secret)
        about = {"stack_name": settings.stack_name, "region": settings.region, "change_set": change_set,
                 "template_sha256": template.digest}
        document = change_set_plan(changes, current, proposed, secret, _create_only(settings.region), drift,
                                   notices, about)
        artifact = json.dumps({"change_set": change_set, "template_sha256": template.digest,
                               "parameters_sha256": _digest(parameters), "serial": serial},
                              sort_keys=True).encode()
        log.info("cloudformation.plan", stack=stack, changes=len(changes), change_set=change_set)
        return EnginePlan(document, serial, str(described["StackId"]) if described else "", artifact)

    def apply(self, stack: str, directory: Path, document: Mapping[str, Any], expected_serial: int,
              inputs: StackInputs, artifact: bytes | None = None,
              progress: Callable[[str], None] | None = None) -> ApplyOutcome:
        if artifact is None:
            raise ApplyError(f"stack {stack}: no saved change set to execute; re-plan")
        saved = json.loads(artifact)
        settings = self.settings_of(stack)
        client = self._client(settings)
        described = self._describe(client, settings.stack_name)
        serial = self._serial(client, settings.stack_name, described)
        if serial != expected_serial:
            return _not_run(serial, f"CloudFormation stack {settings.stack_name} moved since the plan (it was updated "
                            f"or its status changed: serial {expected_serial} -> {serial}); re-plan")
        if saved["change_set"] is None:  # the plan found nothing to change
            return ApplyOutcome(True, (), None, None, serial)
        try:
            change_set = _call(client, "describe_change_set", ChangeSetName=saved["change_set"],
                               StackName=settings.stack_name)
        except CloudRefused as exc:
            return _not_run(serial, f"stack {stack}: the planned change set can no longer be read ({exc.code}: "
                            f"{exc.detail}); re-plan")
        if change_set.get("ExecutionStatus") != "AVAILABLE" or change_set.get("Status") != "CREATE_COMPLETE":
            return _not_run(serial, f"stack {stack}: the planned change set is {change_set.get('ExecutionStatus')} "
                            f"({change_set.get('StatusReason') or change_set.get('Status')}), not executable; re-plan")
        started = time.time()
        try:
            _call(client, "execute_change_set", ChangeSetName=saved["change_set"], StackName=settings.stack_name)
        except CloudRefused as exc:
            after = self._serial(client, settings.stack_name, self._describe(client, settings.stack_name))
            return ApplyOutcome(False, (), None, f"CloudFormation refused to execute the change set: {exc.code}: "
                                f"{exc.detail}", after)
        planned = [rc["address"] for rc in document.get("resource_changes") or ()
                   if rc.get("change", {}).get("actions") != ["no-op"]]
        return self._follow(client, settings, started, planned, progress)

    # --- CloudFormation calls --------------------------------------------------------------------

    def _client(self, settings: CloudFormationSettings) -> Any:
        return self._client_for(settings.region)

    def _describe(self, client: Any, name: str) -> dict[str, Any] | None:
        """The stack, or None when there is none: the name is valid (main's settings check it), so the one
        ValidationError DescribeStacks gives for it is that no such stack exists."""
        try:
            stacks = _call(client, "describe_stacks", StackName=name)["Stacks"]
        except CloudRefused as exc:
            if exc.code == "ValidationError":
                return None
            raise
        return stacks[0] if stacks else None

    def _current(self, client: Any, settings: CloudFormationSettings, described: Mapping[str, Any],
                 secret: frozenset[str]) -> Resolver:
        """The deployed stack: its processed template, and its parameters as DescribeStacks gives them (a NoEcho
        parameter's value is `****` there, so it is unknown here)."""
        template = self._template(client, settings, None)
        hidden = template.no_echo()
        parameters = {p["ParameterKey"]: UNKNOWN if p["ParameterKey"] in hidden and p.get("ParameterValue") == HIDDEN
                      else p.get("ParameterValue", "") for p in described.get("Parameters") or ()}
        return Resolver(template, parameters, settings.region, stack_name=settings.stack_name, secret=secret)

    def _processed(self, client: Any, settings: CloudFormationSettings, template: Template, change_set: str | None,
                   current: Resolver | None) -> Template:
        """The template CloudFormation planned: the file itself, or, when it declares a transform (macros,
        Fn::ForEach), what CloudFormation made of it for the change set (GetTemplate, stage Processed)."""
        if not template.transforms:
            return template
        if change_set is not None:
            return self._template(client, settings, change_set)
        return current.template if current is not None else template

    def _template(self, client: Any, settings: CloudFormationSettings, change_set: str | None) -> Template:
        """The processed template of the deployed stack, or of a change set."""
        named = {"ChangeSetName": change_set} if change_set else {}
        body = _call(client, "get_template", StackName=settings.stack_name, TemplateStage="Processed",
                     **named)["TemplateBody"]
        text = body if isinstance(body, str) else json.dumps(body)
        return parse_template(text, f"{settings.stack_name} ({'planned' if change_set else 'deployed'}, processed)")

    def _change_set(self, client: Any, settings: CloudFormationSettings, body: str, parameters: Mapping[str, str],
                    described: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], str | None]:
        creating = described is None or described["StackStatus"] == "REVIEW_IN_PROGRESS"
        name = f"gateway-{hashlib.sha256(body.encode()).hexdigest()[:12]}-{uuid.uuid4().hex[:8]}"
        try:
            created = _call(
                client, "create_change_set",
                StackName=settings.stack_name, ChangeSetName=name, TemplateBody=body,
                ChangeSetType="CREATE" if creating else "UPDATE",
                Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in sorted(parameters.items())],
                Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
                Description="planned by the change gateway")
        except CloudRefused as exc:
            if exc.code == "ValidationError" and _no_changes(exc.detail):  # moto says so here
                return [], None
            raise PlanError(f"CloudFormation refused the change set for stack {settings.stack_name}: "
                            f"{exc.code}: {exc.detail}") from exc
        arn = created["Id"]
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            page = _call(client, "describe_change_set", ChangeSetName=arn, StackName=settings.stack_name)
            status = page.get("Status")
            if status == "CREATE_COMPLETE":
                break
            if status == "FAILED":
                reason = str(page.get("StatusReason") or "")
                if _no_changes(reason):  # CloudFormation says so here
                    _call(client, "delete_change_set", ChangeSetName=arn, StackName=settings.stack_name)
                    return [], None
                raise PlanError(f"the change set for stack {settings.stack_name} failed: {reason}")
            if time.monotonic() > deadline:
                raise PlanError(f"the change set for stack {settings.stack_name} was not ready in {WAIT_SECONDS:.0f} s")
            time.sleep(self.poll_seconds)
        changes = list(page.get("Changes") or ())
        while page.get("NextToken"):
            page = _call(client, "describe_change_set", ChangeSetName=arn, StackName=settings.stack_name,
                         NextToken=page["NextToken"])
            changes += page.get("Changes") or ()
        return changes, arn

    def _drift(self, client: Any, settings: CloudFormationSettings) -> tuple[list[dict[str, Any]], list[str]]:
        """CloudFormation's drift detection of the deployed stack; when it cannot run, the preview says so."""
        try:
            detection = _call(client, "detect_stack_drift", StackName=settings.stack_name)["StackDriftDetectionId"]
            deadline = time.monotonic() + DRIFT_WAIT_SECONDS
            while True:
                status = _call(client, "describe_stack_drift_detection_status", StackDriftDetectionId=detection)
                if status["DetectionStatus"] != "DETECTION_IN_PROGRESS":
                    break
                if time.monotonic() > deadline:
                    return [], [f"drift was not checked: CloudFormation's drift detection took over "
                                f"{DRIFT_WAIT_SECONDS:.0f} s"]
                time.sleep(self.poll_seconds)
            drifts: list[dict[str, Any]] = []
            kwargs: dict[str, Any] = {"StackName": settings.stack_name}
            while True:
                page = _call(client, "describe_stack_resource_drifts", **kwargs)
                drifts += page.get("StackResourceDrifts") or ()
                if not page.get("NextToken"):
                    return drifts, []
                kwargs["NextToken"] = page["NextToken"]
        except GatewayError as exc:
            return [], [f"drift was not checked: CloudFormation's drift detection failed ({exc}); "
                        "changes made outside the gateway are not shown"]

    def _serial(self, client: Any, name: str, described: Mapping[str, Any] | None) -> int:
        if described is None:
            return 0
        events = _call(client, "describe_stack_events", StackName=name).get("StackEvents") or ()
        return _serial(described, max((e["Timestamp"] for e in events), default=None))

    def _follow(self, client: Any, settings: CloudFormationSettings, started: float, planned: Sequence[str],
                progress: Callable[[str], None] | None) -> ApplyOutcome:
        """Wait for the stack to settle, a line per resource event; what completed, and how it ended."""
        seen: set[str] = set()
        applied: list[str] = []
        failed: str | None = None
        reasons: list[str] = []
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            described = self._describe(client, settings.stack_name)
            for event in reversed(self._events(client, settings.stack_name, started)):
                if event["EventId"] in seen:
                    continue
                seen.add(event["EventId"])
                status = str(event.get("ResourceStatus", ""))
                address = f"{event.get('ResourceType')}.{event.get('LogicalResourceId')}"
                if event.get("ResourceType") == "AWS::CloudFormation::Stack":
                    continue
                line = f"{address}: {status}" + (f" ({event['ResourceStatusReason']})"
                                                  if event.get("ResourceStatusReason") else "")
                if progress is not None:
                    progress(line)
                if status.endswith("_COMPLETE") and "ROLLBACK" not in status and address not in applied:
                    applied.append(address)
                if status.endswith("_FAILED"):
                    failed = failed or address
                    reasons.append(f"{address}: {event.get('ResourceStatusReason') or status}")
            status = str((described or {}).get("StackStatus", "DELETE_COMPLETE"))
            if not status.endswith("_IN_PROGRESS"):
                break
            if time.monotonic() > deadline:
                raise ApplyError(f"stack {settings.stack_name} was still {status} after {WAIT_SECONDS:.0f} s")
            time.sleep(self.poll_seconds)
        serial = self._serial(client, settings.stack_name, described)
        if "ROLLBACK" in status or status.endswith("_FAILED"):
            why = "; ".join(reasons) or str((described or {}).get("StackStatusReason") or status)
            return ApplyOutcome(False, tuple(applied), failed, f"CloudFormation rolled the update back ({status}): "
                                f"{why}", serial)
        if not applied:  # an emulator that writes no resource events: the change set ran whole
            applied = list(planned)
        return ApplyOutcome(True, tuple(applied), None, None, serial)

    def _events(self, client: Any, name: str, since: float) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"StackName": name}
        while True:
            page = _call(client, "describe_stack_events", **kwargs)
            for event in page.get("StackEvents") or ():
                if event["Timestamp"].timestamp() < since - 1:
                    return events
                events.append(event)
            if not page.get("NextToken"):
                return events
            kwargs["NextToken"] = page["NextToken"]


def _serial(described: Mapping[str, Any] | None, newest_event: datetime | None = None) -> int:
    """What the apply compares: the moment of the stack's last change (its last update, its creation, or its newest
    event: a status change) in microseconds; 0 when there is no stack (or only one a CREATE change set made, awaiting
    its first execution). An update by anyone, through the gateway or not, moves it."""
    if described is None or described.get("StackStatus") == "REVIEW_IN_PROGRESS":
        return 0
    moments = [m for m in (described.get("LastUpdatedTime"), described.get("CreationTime"), newest_event) if m]
    return int(max(m.timestamp() for m in moments) * 1_000_000) if moments else 0


def _create_only(region: str) -> Callable[[str], frozenset[str]]:
    """The top-level properties a type's resource schema says cannot change without a replacement."""
    def create_only(resource_type: str) -> frozenset[str]:
        from cfnlint.schema import PROVIDER_SCHEMA_MANAGER, ResourceNotFoundError  # the resource schemas AWS keeps

        try:
            schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type).schema
        except ResourceNotFoundError:  # a type cfn-lint does not know: only CloudFormation's own Replacement counts
            return frozenset()
        return frozenset(p.split("/")[2] for p in schema.get("createOnlyProperties") or ()
                         if p.startswith("/properties/") and p.count("/") == 2)
    return create_only


def _digest(parameters: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(sorted(parameters.items()))).encode()).hexdigest()


def _no_changes(said: str) -> bool:
    return any(marker in said for marker in NO_CHANGES)


def _not_run(serial: int, why: str) -> ApplyOutcome:
    return ApplyOutcome(False, (), None, f"nothing applied: {why}", serial)


def _call(client: Any, operation: str, **kwargs: Any) -> Any:
    """One CloudFormation call, botocore's errors mapped into the gateway's by their codes (the one place)."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionClosedError,
        ConnectionError,
        CredentialRetrievalError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        ProfileNotFound,
        ReadTimeoutError,
    )
    from botocore.parsers import ResponseParserError

    what = f"CloudFormation {''.join(w.title() for w in operation.split('_'))}"
    try:
        return getattr(client, operation)(**kwargs)
    except ClientError as exc:
        raise _refusal(what, exc.response) from exc
    except (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError, NoRegionError,
            ProfileNotFound) as exc:
        raise BackendError(f"{what}: the worker has no usable AWS credentials or region ({exc})") from exc
    except (ConnectionError, ConnectionClosedError, ReadTimeoutError) as exc:
        raise Unavailable(f"{what}: AWS cannot be reached ({exc})") from exc
    except (BotoCoreError, ResponseParserError) as exc:
        raise BackendError(f"{what} failed: {_first_line(exc)}") from exc


def _refusal(what: str, response: Mapping[str, Any]) -> GatewayError:
    error = response.get("Error") if isinstance(response.get("Error"), Mapping) else {}
    code, detail = str(error.get("Code") or "UnknownError"), str(error.get("Message") or "")
    status = int((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
    said = f"{code}: {detail}" if detail else code
    if code in TRANSIENT or status >= 500:
        return Unavailable(f"{what}: AWS cannot serve it now ({said})")
    if code in CREDENTIALS:
        return BackendError(f"{what}: AWS refused the worker's credentials ({said})")
    return CloudRefused(f"{what}: {said}", code, detail)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _boto3_client(region: str) -> Any:
    import boto3  # the AWS SDK only where a CloudFormation stack is planned or applied

    return boto3.client("cloudformation", region_name=region)
