"""Acting on the simulated cloud behind the gateway's back (drift, faults): admins only.

These stand for people outside the gateway (a console user, a failing provider); the sandbox engine
is a simulator, and nothing here touches real infrastructure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.domain.errors import InputError
from gateway.domain.permissions import Action, require
from gateway.domain.principals import Principal
from gateway.services.workspace import Workspace


def _require_admin(actor: Principal) -> None:
    require(actor, Action.EDIT_SIMULATOR)


def edit_live_object(ws: Workspace, actor: Principal, stack: str, address: str, changes: Mapping[str, Any]) -> None:
    """Change a live object as someone in a console would; the next plan shows it as drift."""
    _require_admin(actor)
    ws.simulator.edit_object(stack, address, changes)


def inject_fault(ws: Workspace, actor: Principal, stack: str, address: str, message: str) -> None:
    """Make the next apply of `address` fail, leaving that apply half done."""
    _require_admin(actor)
    ws.simulator.inject_fault(stack, address, message)


def inject_delay(ws: Workspace, actor: Principal, stack: str, address: str, seconds: float) -> None:
    """Make the next apply of `address` take `seconds` longer, as a slow provider would."""
    _require_admin(actor)
    if not 0 < seconds <= 3600:
        raise InputError("a delay is between 0 and 3600 seconds")
    ws.simulator.inject_delay(stack, address, seconds)
