"""Terraform test provider ``example.local/gateway/sim`` 0.1.0, built on the PyPI ``tf`` package.

It has one resource type, ``sim_object``, whose remote objects are JSON files
``$SIM_PROVIDER_DIR/<id>.json``. Editing or deleting such a file behind Terraform's
back is real drift: ``read`` returns what is in the file, or "gone" if it is missing.

Attributes: ``name`` (required, changing it forces replacement), ``content`` (optional,
updated in place), ``secret`` (optional, sensitive) and ``id`` (computed).
``terraform import sim_object.x <id>`` adopts an existing ``<id>.json``.

Run by Terraform as a plugin (protocol 6); ``python sim_provider.py install MIRROR_DIR``
installs it into a filesystem mirror (see README.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Optional, Type

from tf import provider, schema, types
from tf.iface import (
    Config,
    CreateContext,
    DeleteContext,
    ImportContext,
    ReadContext,
    State,
    UpdateContext,
)
from tf.runner import run_provider
from tf.utils import Diagnostics

HOST, NAMESPACE, NAME, VERSION = "example.local", "gateway", "sim", "0.1.0"
FIELDS = ("id", "name", "content", "secret")


def _slow_down() -> None:
    """A slow provider when SIM_PROVIDER_DELAY_SECONDS is set: to watch locks, timeouts and killed workers."""
    delay = float(os.environ.get("SIM_PROVIDER_DELAY_SECONDS") or 0)
    if delay > 0:
        time.sleep(delay)


def _store(diags: Diagnostics) -> Optional[Path]:
    """The directory holding the objects, or None (with an error) if SIM_PROVIDER_DIR is unset."""
    d = os.environ.get("SIM_PROVIDER_DIR")
    if not d:
        diags.add_error("SIM_PROVIDER_DIR is not set", "Set it to the directory that holds sim_object files.")
        return None
    path = Path(d)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load(diags: Diagnostics, obj_id: str) -> Optional[State]:
    """The object stored under obj_id, or None if its file is missing."""
    store = _store(diags)
    if store is None:
        return None
    try:
        data = json.loads((store / f"{obj_id}.json").read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        diags.add_error(f"Cannot read sim_object {obj_id}", str(exc))
        return None
    if not isinstance(data, dict):
        diags.add_error(f"Cannot read sim_object {obj_id}", "The file does not hold a JSON object.")
        return None
    state = {k: data.get(k) for k in FIELDS}
    state["id"] = obj_id
    return state


def _save(diags: Diagnostics, state: State) -> Optional[State]:
    """Write the object's file atomically and return its state."""
    store = _store(diags)
    if store is None:
        return None
    state = {k: state.get(k) for k in FIELDS}
    tmp = store / f".{state['id']}.json.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    tmp.replace(store / f"{state['id']}.json")
    return state


class SimObject(provider.Resource):
    """A JSON file standing for one remote object."""

    def __init__(self, prov: SimProvider) -> None:
        self.provider = prov

    @classmethod
    def get_name(cls) -> str:
        return "object"

    @classmethod
    def get_schema(cls) -> schema.Schema:
        return schema.Schema(
            version=0,
            attributes=[
                schema.Attribute("id", types.String(), computed=True),
                schema.Attribute("name", types.String(), required=True, requires_replace=True),
                schema.Attribute("content", types.String(), optional=True),
                schema.Attribute("secret", types.String(), optional=True, sensitive=True),
            ],
        )

    def create(self, ctx: CreateContext, planned: State) -> Optional[State]:
        _slow_down()
        return _save(ctx.diagnostics, {**planned, "id": uuid.uuid4().hex[:16]})

    def read(self, ctx: ReadContext, current: State) -> Optional[State]:
        return _load(ctx.diagnostics, current["id"])

    def update(self, ctx: UpdateContext, current: State, planned: State) -> Optional[State]:
        _slow_down()
        return _save(ctx.diagnostics, {**planned, "id": current["id"]})

    def delete(self, ctx: DeleteContext, current: State) -> None:
        store = _store(ctx.diagnostics)
        if store is not None:
            (store / f"{current['id']}.json").unlink(missing_ok=True)

    def import_(self, ctx: ImportContext, id: str) -> Optional[State]:
        if not id or "/" in id or id.startswith("."):
            ctx.diagnostics.add_error(f"Invalid sim_object id {id!r}", "An id is a plain file name without '.json'.")
            return None
        state = _load(ctx.diagnostics, id)
        if state is None and not ctx.diagnostics.has_errors():
            ctx.diagnostics.add_error(f"No sim_object with id {id!r}", f"There is no file {id}.json to import.")
        return state


class SimProvider(provider.Provider):
    """The provider: no configuration, one resource type."""

    def full_name(self) -> str:
        return f"{HOST}/{NAMESPACE}/{NAME}"

    def get_model_prefix(self) -> str:
        return f"{NAME}_"

    def get_provider_schema(self, diags: Diagnostics) -> schema.Schema:
        return schema.Schema(version=0, attributes=[])

    def validate_config(self, diags: Diagnostics, config: Config) -> None:
        pass

    def configure_provider(self, diags: Diagnostics, config: Config) -> None:
        pass

    def get_data_sources(self) -> list[Type[provider.DataSource]]:
        return []

    def get_resources(self) -> list[Type[provider.Resource]]:
        return [SimObject]


def install(mirror: Path, python: str = sys.executable) -> Path:
    """Install into an unpacked filesystem mirror: a copy of this script plus a wrapper that runs it."""
    pkg = mirror / HOST / NAMESPACE / NAME / VERSION / "linux_amd64"
    pkg.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(__file__, pkg / "sim_provider.py")
    exe = pkg / f"terraform-provider-{NAME}_v{VERSION}"
    exe.write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$(dirname "$0")/sim_provider.py" "$@"\n')
    exe.chmod(0o755)
    return exe


def lock_hash(pkg: Path) -> str:
    """The "h1:" hash that `terraform init` records in .terraform.lock.hcl for an unpacked package dir."""
    files = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file())
    lines = "".join(f"{hashlib.sha256((pkg / f).read_bytes()).hexdigest()}  {f}\n" for f in files)
    return "h1:" + base64.b64encode(hashlib.sha256(lines.encode()).digest()).decode()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "install":
        exe = install(Path(sys.argv[2]).resolve())
        print(exe, lock_hash(exe.parent))
    else:
        run_provider(SimProvider(), sys.argv)
