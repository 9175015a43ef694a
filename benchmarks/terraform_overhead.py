"""The gateway's overhead around Terraform, and `gateway preview` against `terraform show`.

1. A stack of N null_resource (default 500), applied once; then a change to every one. Times, in the
   same run: Terraform's own `init` + `plan -out` + `show -json`, and the gateway's propose of the same
   change (merge preview, engine plan, policy, risk, preview rendered and stored). Prints the ratio.
2. `gateway preview PLAN.json` (the CLI process, end to end) against `terraform show -json PLANFILE` on
   the plan of 2,000 creates.

Needs `make terraform`. It is not a test. Usage: python benchmarks/terraform_overhead.py [N]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git

from gateway.adapters.git_repo import committer_env
from gateway.composition import create_workspace, terraform_setup
from gateway.config import Settings
from gateway.domain.principals import PrincipalKind, Role
from gateway.logs import configure_logging
from gateway.services.admin.bootstrap import bootstrap_simulator
from gateway.services.admin.users import add_principal
from gateway.services.change.proposals import open_proposal

HEADER = 'terraform {\n  required_providers {\n    null = {\n      source  = "hashicorp/null"\n      version = "2.1.2"\n    }\n  }\n}\n'


def nulls(count: int, release: str) -> str:
    return HEADER + "".join(f'resource "null_resource" "n{i}" {{\n  triggers = {{ release = "{release}" }}\n}}\n'
                            for i in range(count))


def repo_content(directory: Path, count: int) -> Path:
    (directory / "stacks" / "many").mkdir(parents=True)
    (directory / "stacks" / "many" / "main.tf").write_text(nulls(count, "1"))
    (directory / "gateway.yaml").write_text("engine: terraform\nstacks:\n  many:\n    path: stacks/many\n"
                                            "    approvers: [platform]\npolicy:\n  required_tags: []\n  checkov: \"off\"\n"
                                            "  max_deletes: 100000\n")
    return directory


def timed(run) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    configure_logging("warning")
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = create_workspace(Settings(home=root / "home"), repo_content(root / "content", count))
        bootstrap_simulator(ws)  # main applied by Terraform
        admin, _ = add_principal(ws, None, "admin", frozenset({Role.ADMIN}), frozenset(), PrincipalKind.PERSON)
        alice, _ = add_principal(ws, admin, "alice", frozenset({Role.REQUESTER}), frozenset(), PrincipalKind.PERSON)
        clone = git.Repo.clone_from(str(ws.settings.repo_path), root / "clone")
        clone.git.checkout("-q", "-b", "release-2")
        Path(clone.working_dir, "stacks/many/main.tf").write_text(nulls(count, "2"))
        clone.git.add("-A")
        clone.git.execute(["git", "commit", "-qm", "release 2"], env=committer_env())
        clone.git.push("-q", "origin", "release-2")

        setup = terraform_setup(ws.settings)
        env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
        if setup.cli_config:
            env["TF_CLI_CONFIG_FILE"] = str(setup.cli_config)
        bare = root / "bare"
        bare.mkdir()
        (bare / "main.tf").write_text(nulls(count, "2"))
        (bare / "backend_override.tf").write_text(
            f'terraform {{\n  backend "local" {{\n    path = "{ws.settings.terraform_dir / "many" / "terraform.tfstate"}"\n  }}\n}}\n')

        def terraform(*args: str) -> None:
            subprocess.run([str(setup.binary), *args], cwd=bare, env=env, check=True, capture_output=True)

        def terraform_alone() -> None:
            terraform("init", "-input=false", "-no-color")
            terraform("plan", "-input=false", "-no-color", "-out=p.tfplan")
            terraform("show", "-json", "p.tfplan")

        engine_time = timed(terraform_alone)
        proposal: list = []
        gateway_time = timed(lambda: proposal.append(open_proposal(ws, alice, "release-2", "release 2")))
        print(f"{count} null_resource replacements: terraform init+plan+show {engine_time:.2f} s; gateway propose "
              f"{gateway_time:.2f} s; ratio {gateway_time / engine_time:.2f} "
              f"({proposal[0].plans['many'].counts})")

        big = root / "big"
        big.mkdir()
        (big / "main.tf").write_text(nulls(2000, "1"))
        subprocess.run([str(setup.binary), "init", "-input=false"], cwd=big, env=env, check=True, capture_output=True)
        subprocess.run([str(setup.binary), "plan", "-input=false", "-out=big.tfplan"], cwd=big, env=env, check=True,
                       capture_output=True)
        plan_json = big / "big.json"
        show = timed(lambda: plan_json.write_bytes(subprocess.run(
            [str(setup.binary), "show", "-json", "big.tfplan"], cwd=big, env=env, check=True,
            capture_output=True).stdout))
        preview = timed(lambda: subprocess.run([sys.executable, "-m", "gateway.cli", "preview", str(plan_json)],
                                               check=True, capture_output=True))
        print(f"2,000 creates: terraform show -json {show:.2f} s; gateway preview (whole CLI process) {preview:.2f} s; "
              f"ratio {preview / show:.2f}")
        ws.close()


if __name__ == "__main__":
    main()
