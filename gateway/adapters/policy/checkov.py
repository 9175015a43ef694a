"""checkov's Terraform-plan checks, where checkov is installed: an optional extra, run as a subprocess.

Its failed checks become findings in the same list as the built-in rules, as warnings or denies
per gateway.yaml (`policy.checkov`). The built-in rules never depend on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway.domain.plan import canonical_json
from gateway.domain.policy import Finding, PolicyContext, Severity
from gateway.logs import get_logger

log = get_logger(__name__)
TIMEOUT_SECONDS = 120


def run_checkov(document: Mapping[str, Any], context: PolicyContext, executable: str | None = None) -> list[Finding]:
    """Findings from checkov's failed checks; empty when it is off. With `checkov: warn` a checkov that is absent
    or fails adds nothing; with `checkov: deny` that is itself a deny finding (it fails closed)."""
    if context.settings.checkov == "off":
        return []
    deny = context.settings.checkov == "deny"
    binary = executable or shutil.which("checkov")
    if binary is None:
        return [_unavailable(context, "checkov is not installed")] if deny else []
    severity = Severity.DENY if deny else Severity.WARN
    with tempfile.TemporaryDirectory(prefix="gw-checkov-") as tmp:
        plan_file = Path(tmp) / "tfplan.json"
        fd = os.open(plan_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the plan holds secrets: owner only
        with os.fdopen(fd, "wb") as out:
            out.write(canonical_json(document))
        try:
            completed = subprocess.run(
                [binary, "-f", str(plan_file), "--framework", "terraform_plan", "-o", "json", "--compact",
                 "--quiet", "--skip-download"],
                capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("checkov.failed", error=str(exc))
            return [_unavailable(context, f"checkov did not finish: {type(exc).__name__}")] if deny else []
    findings = parse_checkov_report(completed.stdout, context.stack, severity)
    if findings is None:
        return [_unavailable(context, "checkov's output could not be read")] if deny else []
    return findings


def _unavailable(context: PolicyContext, why: str) -> Finding:
    return Finding("checkov-unavailable", Severity.DENY, "(plan)",
                   f"{why}; gateway.yaml sets policy.checkov: deny, so the plan is not judged passed", context.stack)


def parse_checkov_report(output: str, stack: str, severity: Severity) -> list[Finding] | None:
    """Read `checkov -o json` output: one report, a list of reports, or a bare summary (None: unreadable)."""
    try:
        data = json.loads(output) if output.strip() else {}
    except json.JSONDecodeError:
        log.warning("checkov.unreadable_output", head=output[:200])
        return None
    if not isinstance(data, (dict, list)):
        return None
    reports = data if isinstance(data, list) else [data]
    findings = []
    for report in reports:
        for check in (report.get("results") or {}).get("failed_checks") or []:
            findings.append(Finding(
                rule=f"checkov:{check.get('check_id')}", severity=severity, address=str(check.get("resource", "")),
                message=str(check.get("check_name", "")), stack=stack))
    return findings
