"""Remote module sources resolved as `terraform init` resolves them, offline: a module registry served on
loopback over HTTPS (tests/module_registry.py, its CA trusted through the settings), git sources from a local
bare repository, HTTP archives; and a corpus of public root configurations that call registry modules, planned
through `gateway plan` (tests/fixtures/corpus_remote, origins in its SOURCES.md).
"""

from __future__ import annotations

import html
import io
import ipaddress
import json
import posixpath
import re
import shlex
import shutil
import ssl
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import git
import pytest
import yaml
from click.testing import CliRunner

from gateway.adapters.engines.router import EngineByStack
from gateway.adapters.engines.sandbox.engine import SandboxEngine
from gateway.adapters.modules.access import ModuleAccess, ModuleUnreachable
from gateway.adapters.modules.fetch import ModuleFetcher, PackageSource, RegistrySource, parse_source
from gateway.adapters.modules.installer import PINS_KEY, ModuleInstaller, pins_of
from gateway.adapters.modules.versions import Constraint
from gateway.cli import cli
from gateway.composition import create_workspace
from gateway.config import Settings
from gateway.domain.errors import ConfigError
from gateway.domain.plan import ChangeKind, load_plan
from gateway.ports import StackInputs

from .conftest import add_people, run_cli
from .fakes import FakeSandboxStore
from .module_registry import Registry, make_tls_files, pack, serve_registry

CORPUS = Path(__file__).parent / "fixtures" / "corpus_remote"
EXPECTED = yaml.safe_load((CORPUS / "expectations.yaml").read_text())


# --- version constraints, as Terraform documents them ------------------------------------------

LISTED = ["1.0.0", "1.2.0", "1.2.9", "1.3.0", "2.0.0-beta1", "1.10.1", "2.0.0", "2.1.0", "3.0.0-rc.1"]


@pytest.mark.parametrize(("constraint", "chosen"), [
    (None, "2.1.0"),  # no constraint: the newest release, never a prerelease
    ("1.2.0", "1.2.0"),  # a bare version is `=`
    ("= 1.2.9", "1.2.9"),
    ("~> 1.2", "1.10.1"),  # ~> 1.2: >= 1.2, < 2.0 (numeric, not string, order: 1.10 > 1.3)
    ("~> 1.2.0", "1.2.9"),  # ~> 1.2.0: >= 1.2.0, < 1.3.0
    ("~> 1", "2.1.0"),  # one segment: >= 1 (go-version, which Terraform reads module constraints with), not < 2
    ("~> 2", "2.1.0"),
    ("~> 2.0, < 3", "2.1.0"),
    (">= 1.2, < 2.0", "1.10.1"),
    (">= 1.2, != 1.10.1, < 2.0.0", "1.3.0"),  # comma lists: every term holds
    ("> 2.0.0", "2.1.0"),
    ("<= 1.2.0", "1.2.0"),
    ("= 2.0.0-beta1", "2.0.0-beta1"),  # a prerelease only when named exactly
    (">= 2.0.0-beta1", "2.1.0"),
    ("~> 3.0", None),  # only a prerelease matches: nothing is chosen
])
def test_version_constraints_pick_the_newest_matching_release(constraint: str | None, chosen: str | None) -> None:
    assert Constraint.parse(constraint).newest(LISTED) == chosen


@pytest.mark.parametrize("bad", ["~>", ">= 1.x", "1.0,,2.0", "=> 1.0"])
def test_a_malformed_constraint_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="version constraint"):
        Constraint.parse(bad)


@pytest.mark.parametrize(("source", "parsed"), [
    ("terraform-aws-modules/vpc/aws", RegistrySource("registry.terraform.io", "terraform-aws-modules", "vpc", "aws")),
    ("terraform-aws-modules/s3-bucket/aws//modules/object",
     RegistrySource("registry.terraform.io", "terraform-aws-modules", "s3-bucket", "aws", "modules/object")),
    ("app.terraform.io/acme/vpc/aws", RegistrySource("app.terraform.io", "acme", "vpc", "aws")),
    ("git::https://example.com/net.git//modules/vpc?ref=v1.2.0",
     PackageSource("git::https://example.com/net.git?ref=v1.2.0", "modules/vpc")),
    ("github.com/acme/net?ref=v2", PackageSource("git::https://github.com/acme/net.git?ref=v2")),
    ("git@github.com:acme/net.git", PackageSource("git::ssh://git@github.com/acme/net.git")),
    ("https://example.com/vpc.zip//modules/a", PackageSource("https://example.com/vpc.zip", "modules/a")),
])
def test_source_addresses_are_read_as_terraform_reads_them(source: str, parsed: object) -> None:
    assert parse_source(source) == parsed


# --- a registry on loopback, and the installer -----------------------------------------------

@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    served, server = serve_registry(tmp_path_factory.mktemp("registry"))
    yield served
    server.shutdown()


def access(registry: Registry, **overrides: object) -> ModuleAccess:
    values: dict[str, object] = {"hosts": {"registry.terraform.io": registry.url}, "ca_bundle": registry.ca_bundle,
                                 "allowed_hosts": (listed(registry),)}  # loopback only when the settings list it
    values.update(overrides)
    return ModuleAccess(**values)  # type: ignore[arg-type]


def listed(registry: Registry) -> str:
    """The registry's endpoint as GATEWAY_MODULE_ALLOWED_HOSTS lists it: 127.0.0.1 at its port."""
    return f"127.0.0.1:{urlsplit(registry.url).port}"


def installer(registry: Registry, cache: Path, **overrides: object) -> ModuleInstaller:
    return ModuleInstaller(cache, ModuleFetcher(access(registry, **overrides)))


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def stack_repo(tmp_path: Path, files: dict[str, str]) -> Path:
    """A repository holding one stack at stacks/app (marked as a checkout, as the gateway exports it)."""
    repo = write(tmp_path / "repo", {"gateway.yaml": "", **{f"stacks/app/{k}": v for k, v in files.items()}})
    return repo / "stacks" / "app"


KMS_CALL = '''
module "key" {
  source  = "terraform-aws-modules/kms/aws"
  version = "~> 2.0"

  aliases = ["app"]
}
'''


def test_registry_modules_are_laid_out_as_terraform_init_lays_them_out(registry: Registry, tmp_path: Path) -> None:
    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL + '''
module "object" {
  source  = "terraform-aws-modules/s3-bucket/aws//modules/object"
  version = ">= 3.15, < 6.0"

  bucket = "b"
  key    = "k"
}
'''})
    with installer(registry, tmp_path / "cache").installed(stack) as (work, pins):
        manifest = json.loads((work / ".terraform" / "modules" / "modules.json").read_text())
        assert manifest["Modules"] == [
            {"Key": "", "Source": "", "Dir": "."},
            {"Key": "key", "Source": "registry.terraform.io/terraform-aws-modules/kms/aws", "Version": "2.2.1",
             "Dir": ".terraform/modules/key"},
            {"Key": "object", "Source": "registry.terraform.io/terraform-aws-modules/s3-bucket/aws//modules/object",
             "Version": "5.15.4", "Dir": ".terraform/modules/object/modules/object"},
        ]
        assert (work / ".terraform" / "modules" / "object" / "modules" / "object" / "main.tf").is_file()
        assert (work / ".terraform" / "modules" / "key" / "main.tf").is_file()
    assert [(p.key, p.version) for p in pins] == [("key", "2.2.1"), ("object", "5.15.4")]
    assert all(p.digest.startswith("sha256:") for p in pins)
    assert not (stack / ".terraform").exists()  # the caller's directory (maybe the agent's copy) is never written


def test_packages_are_fetched_once_per_source_and_version_and_shared(registry: Registry, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = stack_repo(tmp_path / "one", {"main.tf": KMS_CALL})
    second = stack_repo(tmp_path / "two", {"main.tf": KMS_CALL.replace('"key"', '"other"')})
    before = len(registry.downloads())
    for stack in (first, second, first):
        with installer(registry, cache).installed(stack):
            pass
    assert len(registry.downloads()) == before + 1


def test_a_branchs_own_dot_terraform_is_not_used(registry: Registry, tmp_path: Path) -> None:
    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL, ".terraform/modules/modules.json": json.dumps(
        {"Modules": [{"Key": "key", "Source": "x", "Dir": ".terraform/modules/key"}]}),
        ".terraform/modules/key/main.tf": 'resource "aws_s3_bucket" "planted" {}\n'})
    with installer(registry, tmp_path / "cache").installed(stack) as (work, _):
        assert "planted" not in (work / ".terraform" / "modules" / "key" / "main.tf").read_text()


def test_a_private_registry_takes_its_token_from_the_settings(registry: Registry, tmp_path: Path) -> None:
    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL.replace("~> 2.0", "~> 3.0")})
    registry.token = "s3cr3t-registry-token"
    try:
        with pytest.raises(ConfigError) as refused:
            with installer(registry, tmp_path / "cache").installed(stack):
                pass
        assert "GATEWAY_MODULE_REGISTRY_TOKENS" in str(refused.value)
        tokens = {"registry.terraform.io": "s3cr3t-registry-token"}
        with installer(registry, tmp_path / "cache", tokens=tokens).installed(stack) as (_, pins):
            assert pins[0].version == "3.1.1"
    finally:
        registry.token = None


def test_a_registry_whose_certificate_is_not_trusted_is_refused(registry: Registry, tmp_path: Path) -> None:
    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL})
    with pytest.raises(ConfigError) as refused:
        with installer(registry, tmp_path / "cache", ca_bundle=None).installed(stack):
            pass
    message = str(refused.value)
    assert message.startswith('stacks/app/main.tf:2: module "key": source "terraform-aws-modules/kms/aws" cannot be '
                              "reached: ") and "CERTIFICATE_VERIFY_FAILED" in message
    assert "\n" not in message


def test_no_matching_version_names_what_the_registry_lists(registry: Registry, tmp_path: Path) -> None:
    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL.replace("~> 2.0", "~> 9.0")})
    with pytest.raises(ConfigError, match=r"no version matching '~> 9.0' \(the registry lists 1.5.0, 2.2.1"):
        with installer(registry, tmp_path / "cache").installed(stack):
            pass


# --- which hosts a branch's sources may make the gateway reach ---------------------------------

def refusal(modules: ModuleInstaller, stack: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        with modules.installed(stack):
            pass
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_loopback_registry_is_reached_only_when_the_settings_list_it(registry: Registry, tmp_path: Path) -> None:
    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL})
    asked = len(registry.requests)
    port = urlsplit(registry.url).port
    message = refusal(installer(registry, tmp_path / "cache", allowed_hosts=None), stack)
    assert message == ('stacks/app/main.tf:2: module "key": source "terraform-aws-modules/kms/aws" cannot be reached: '
                       f"127.0.0.1:{port} is a loopback address, which module sources may not reach unless "
                       "GATEWAY_MODULE_ALLOWED_HOSTS lists it")
    # the name the registry is served at is checked on the address it resolves to
    served = {"registry.terraform.io": registry.url.replace("127.0.0.1", "localhost")}
    message = refusal(installer(registry, tmp_path / "cache", hosts=served, allowed_hosts=None), stack)
    assert f"cannot be reached: localhost:{port} is at 127.0.0.1, a loopback address, which" in message
    # listed, but not at the registry's port (an entry without one names 443)
    message = refusal(installer(registry, tmp_path / "cache", hosts=served, allowed_hosts=("127.0.0.0/8",)), stack)
    assert f"cannot be reached: localhost:{port} is at 127.0.0.1, a loopback address, which" in message
    assert len(registry.requests) == asked  # refused before anything was sent
    with installer(registry, tmp_path / "cache", hosts=served, allowed_hosts=(f"127.0.0.0/8:{port}",)).installed(
            stack) as (_, pins):
        assert [p.version for p in pins] == ["2.2.1"]


def test_a_download_or_redirect_to_an_unlisted_host_is_refused(registry: Registry, tmp_path: Path) -> None:
    registry.extra_versions["acme/metadata/aws"] = ["1.0.0", "2.0.0"]
    registry.locations[("acme/metadata/aws", "1.0.0")] = "http://169.254.169.254/latest/meta-data/iam.tar.gz"
    registry.locations[("acme/metadata/aws", "2.0.0")] = "git::https://git.internal.example/secrets.git"
    stack = stack_repo(tmp_path, {"main.tf": 'module "m" {\n  source  = "acme/metadata/aws"\n  version = "1.0.0"\n}\n'})
    message = refusal(installer(registry, tmp_path / "cache"), stack)
    assert message == ('stacks/app/main.tf:1: module "m": source "acme/metadata/aws" cannot be reached: '
                       "169.254.169.254:80 is a link-local address, which module sources may not reach "
                       "unless GATEWAY_MODULE_ALLOWED_HOSTS lists it")
    (stack / "main.tf").write_text((stack / "main.tf").read_text().replace("1.0.0", "2.0.0"))
    assert refusal(installer(registry, tmp_path / "cache"), stack).endswith(
        "cannot be reached: git.internal.example is not a host module sources may reach "
        "(GATEWAY_MODULE_ALLOWED_HOSTS admits it)")
    # an HTTP archive whose server redirects elsewhere: the redirect's target is checked before it is followed
    registry.redirects["/moved/net.tar.gz"] = "http://10.0.0.7/net.tar.gz"
    stack = stack_repo(tmp_path / "r", {"main.tf": f'module "net" {{\n  source = "{registry.url}/moved/net.tar.gz"\n}}\n'})
    assert refusal(installer(registry, tmp_path / "cache"), stack).endswith(
        "cannot be reached: 10.0.0.7:80 is a private address, which module sources may not reach unless "
        "GATEWAY_MODULE_ALLOWED_HOSTS lists it")
    assert registry.requests[-1] == "/moved/net.tar.gz"


@pytest.mark.parametrize(("location", "why"), [
    ("file:///etc/passwd", "X-Terraform-Get file:///etc/passwd: not a source address the gateway understands"),
    ("s3::https://s3.amazonaws.com/bucket/vpc.zip?X-Amz-Signature=s3cr3t",
     "X-Terraform-Get s3::https://s3.amazonaws.com/bucket/vpc.zip: s3:: sources are not fetched by the gateway"),
    ("https://github.com/acme/vpc.tar.gz//../..", "the subdirectory '../..' leaves its package"),
    ("git::https://github.com/acme/net.git//modules/../../..", "the subdirectory 'modules/../../..' leaves its"),
])
def test_a_download_location_the_source_parser_refuses_is_the_one_line_refusal(
        registry: Registry, tmp_path: Path, location: str, why: str) -> None:
    # what a registry (or any URL a branch names) answers in X-Terraform-Get is the server's to choose
    version = f"1.0.{len(registry.extra_versions.get('acme/located/aws', []))}"
    registry.extra_versions.setdefault("acme/located/aws", []).append(version)
    registry.locations[("acme/located/aws", version)] = location
    stack = stack_repo(tmp_path, {"main.tf": f'module "m" {{\n  source  = "acme/located/aws"\n  version = "{version}"\n}}\n'})
    message = refusal(installer(registry, tmp_path / "cache"), stack)
    assert message.startswith('stacks/app/main.tf:1: module "m": source "acme/located/aws" cannot be reached: '
                              f"{registry.url}/v1/modules/acme/located/aws/{version}/download")
    assert why in message and "s3cr3t" not in message
    # the same answer to a plain HTTP source (go-getter's form: a URL that answers where the package is)
    direct = stack_repo(tmp_path / "direct", {"main.tf": f'module "m" {{\n  source = "{registry.url}/v1/modules/'
                                                           f'acme/located/aws/{version}/download"\n}}\n'})
    assert why in refusal(installer(registry, tmp_path / "cache"), direct)


def test_the_default_hosts_are_the_public_registry_github_and_the_configured_registries() -> None:
    access = ModuleAccess.from_settings("tfe.example.com=t", "registry.terraform.io=https://mirror.example.com",
                                        None, False)
    for host in ("gitlab.com", "metadata.google.internal", "localhost", "8.8.8.8"):
        with pytest.raises(ModuleUnreachable, match=f"^{host} is not a host module sources may reach"):
            access.admit(host, 443)
    with pytest.raises(ModuleUnreachable, match="^169.254.169.254:80 is a link-local address"):
        access.admit("169.254.169.254", 80)
    for host, port in (("registry.terraform.io", 443), ("github.com", 443), ("github.com", 22),
                       ("tfe.example.com", 443), ("mirror.example.com", 443)):
        access.admit_name(host, port)  # HTTPS, git over ssh to github.com, and the configured registries
    for host, port in (("github.com", 80), ("registry.terraform.io", 22), ("tfe.example.com", 8443)):
        with pytest.raises(ModuleUnreachable, match=f"^{host}:{port} is not a host module sources may reach"):
            access.admit_name(host, port)
    listed = ModuleAccess.from_settings(None, None, None, False, allowed_hosts="git.internal, 10.1.0.0/16")
    listed.admit("10.1.2.3", 443)
    listed.admit("git.internal", 443)  # listed by name: whatever it resolves to
    with pytest.raises(ModuleUnreachable, match="^github.com is not a host"):  # the setting replaces the defaults
        listed.admit("github.com", 443)


def test_an_allowed_host_is_admitted_at_the_port_its_entry_names(tmp_path: Path) -> None:
    access = ModuleAccess.from_settings(None, "registry.example=https://mirror.internal:8443", None, False,
                                        allowed_hosts="127.0.0.1:8443, [::1]:9443, 10.1.0.0/16:22, git.internal, "
                                                      "fd00::/8, [fd01::/16]:80")
    for host, port in (("127.0.0.1", 8443), ("::1", 9443), ("10.1.2.3", 22), ("git.internal", 443),
                       ("fd00::7", 443), ("fd01::7", 80), ("mirror.internal", 8443)):
        access.admit_name(host, port)
    for host, port, shown in (("127.0.0.1", 443, "127.0.0.1"), ("127.0.0.1", 5432, "127.0.0.1:5432"),
                              ("::1", 8443, "[::1]:8443"), ("10.1.2.3", 443, "10.1.2.3"),
                              ("fd00::7", 80, "[fd00::7]:80")):
        with pytest.raises(ModuleUnreachable, match=rf"^{re.escape(shown)} is a (loopback|private) address"):
            access.admit_name(host, port)
    for host, port in (("git.internal", 22), ("mirror.internal", 443)):
        with pytest.raises(ModuleUnreachable, match="is not a host module sources may reach"):
            access.admit_name(host, port)
    for bad in ("git.internal:https", "127.0.0.1:0", "[::1]x", "a b"):
        with pytest.raises(ConfigError, match=f"^GATEWAY_MODULE_ALLOWED_HOSTS: .*{re.escape(bad)}"):
            ModuleAccess.from_settings(None, None, None, False, allowed_hosts=f"github.com, {bad}")


def test_a_host_listed_for_a_mirror_is_reached_at_that_port_only(registry: Registry, tmp_path: Path) -> None:
    # 127.0.0.1 listed (port 443) and the mirror's port: another service on the host hears nothing, whichever way a
    # branch names it (a source, an X-Terraform-Get, a redirect, git)
    other = serve_at("127.0.0.1", 0, tmp_path)
    port = other.server_address[1]
    try:
        elsewhere = f"http://127.0.0.1:{port}/net.tar.gz"
        registry.extra_versions["acme/elsewhere/aws"] = ["1.0.0"]
        registry.locations[("acme/elsewhere/aws", "1.0.0")] = elsewhere
        registry.redirects["/elsewhere/net.tar.gz"] = elsewhere
        sources = {"direct": elsewhere, "x-terraform-get": "acme/elsewhere/aws",
                   "redirect": f"{registry.url}/elsewhere/net.tar.gz", "git": f"git::http://127.0.0.1:{port}/net.git"}
        for name, source in sources.items():
            stack = stack_repo(tmp_path / name, {"main.tf": f'module "m" {{\n  source = "{source}"\n}}\n'})
            modules = installer(registry, tmp_path / "cache", allowed_hosts=("127.0.0.1", listed(registry)))
            assert refusal(modules, stack).endswith(
                f"cannot be reached: 127.0.0.1:{port} is a loopback address, which module sources may not reach "
                "unless GATEWAY_MODULE_ALLOWED_HOSTS lists it"), name
        assert other.hits == []  # type: ignore[attr-defined]
        modules = installer(registry, tmp_path / "cache", allowed_hosts=(listed(registry), f"127.0.0.1:{port}"))
        with modules.installed(stack_repo(tmp_path / "listed", {"main.tf": f'module "m" {{\n  source = "{elsewhere}"\n}}\n'})):
            assert other.hits == ["/net.tar.gz"]  # type: ignore[attr-defined]
    finally:
        other.shutdown()
        other.server_close()


# --- git and HTTP archives -------------------------------------------------------------------

def bare_repository(tmp_path: Path, files: dict[str, str], tag: str) -> Path:
    """A module's repository as a git host keeps it: a bare repository with a tagged commit."""
    work = write(tmp_path / "module-work", files)
    repo = git.Repo.init(work)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "v1"])
    repo.create_tag(tag)
    bare = tmp_path / "network.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    return bare


NETWORK = {
    "modules/vpc/main.tf": '''
variable "cidr" {
  type = string
}
resource "aws_vpc" "this" {
  cidr_block = var.cidr
}
module "flow_logs" {
  source = "../logs"
  vpc_id = aws_vpc.this.id
}
module "key" {
  source  = "terraform-aws-modules/kms/aws"
  version = "~> 4.0"
}
output "id" {
  value = aws_vpc.this.id
}
''',
    "modules/logs/main.tf": '''
variable "vpc_id" {
  type = string
}
resource "aws_cloudwatch_log_group" "this" {
  name = "flow-${var.vpc_id}"
}
''',
}


def test_git_sources_with_ref_and_subdir_nest_registry_and_local_modules(registry: Registry, tmp_path: Path) -> None:
    bare = bare_repository(tmp_path, NETWORK, "v1.0.0")
    source = f"git::file://{bare}//modules/vpc?ref=v1.0.0"
    stack = stack_repo(tmp_path, {"main.tf": f'''
module "network" {{
  source = "{source}"
  cidr   = "10.0.0.0/16"
}}
'''})
    with pytest.raises(ConfigError, match="file:// git sources are refused"):
        with installer(registry, tmp_path / "cache").installed(stack):
            pass
    modules = installer(registry, tmp_path / "cache", allow_file_urls=True)
    with modules.installed(stack) as (work, pins):
        manifest = {m["Key"]: m for m in json.loads((work / ".terraform/modules/modules.json").read_text())["Modules"]}
        assert manifest["network"]["Dir"] == ".terraform/modules/network/modules/vpc"
        assert manifest["network.flow_logs"] == {"Key": "network.flow_logs", "Source": "../logs",
                                                 "Dir": ".terraform/modules/network/modules/logs"}
        assert manifest["network.key"]["Version"] == "4.2.0"
        assert manifest["network.key"]["Dir"] == ".terraform/modules/network.key"
        plan = load_plan(sandbox().plan("app", work, StackInputs()).document)
    commit = git.Repo(bare).commit("v1.0.0").hexsha
    assert [(p.key, p.version) for p in pins] == [("network", commit), ("network.key", "4.2.0")]
    created = {rc.address for rc in plan.resource_changes if rc.kind == ChangeKind.CREATE}
    assert {"module.network.aws_vpc.this", "module.network.module.flow_logs.aws_cloudwatch_log_group.this",
            "module.network.module.key.aws_kms_key.this[0]"} <= created


@pytest.mark.parametrize("source", ["git::https://github.com/acme/net//../../../../etc",
                                    "terraform-aws-modules/vpc/aws//modules/../../..",
                                    "https://example.com/vpc.zip//a/..\\..\\b"])
def test_a_subdir_that_leaves_its_package_is_refused(source: str) -> None:
    with pytest.raises(ValueError, match="leaves its package"):
        parse_source(source)


def test_a_link_in_a_git_module_never_brings_a_host_file_into_the_stack(registry: Registry, tmp_path: Path) -> None:
    outside = tmp_path / "host-secret.env"
    outside.write_text("AWS_SECRET_ACCESS_KEY=hunter2\n")
    work = write(tmp_path / "module-work", {"main.tf": 'resource "aws_sqs_queue" "q" {\n  name = "q"\n}\n'})
    (work / "stolen.txt").symlink_to(outside)
    (tmp_path / "host-dir").mkdir()
    (tmp_path / "host-dir" / "id_rsa").write_text("hunter2\n")
    (work / "root").symlink_to(tmp_path / "host-dir")  # a folder outside the package (a regression copies it, no more)
    repo = git.Repo.init(work)
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "v1"])
    bare = tmp_path / "linky.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    stack = stack_repo(tmp_path, {"main.tf": f'module "q" {{\n  source = "git::file://{bare}"\n}}\n'})
    with installer(registry, tmp_path / "cache", allow_file_urls=True).installed(stack) as (installed, _pins):
        module = installed / ".terraform" / "modules" / "q"
        assert (module / "main.tf").is_file()
        assert not (module / "stolen.txt").exists() and not (module / "stolen.txt").is_symlink()
        assert not (module / "root").exists() and not (module / "root").is_symlink()
        assert not any("hunter2" in p.read_text(errors="replace") for p in installed.rglob("*") if p.is_file())


def test_an_unknown_git_ref_names_the_module_and_the_ref(registry: Registry, tmp_path: Path) -> None:
    bare = bare_repository(tmp_path, NETWORK, "v1.0.0")
    stack = stack_repo(tmp_path, {"main.tf": f'module "network" {{\n  source = "git::file://{bare}?ref=v9"\n}}\n'})
    with pytest.raises(ConfigError, match=r"^stacks/app/main.tf:1: module \"network\": source .* cannot be reached: "
                                          r"git file://.*network.git: has no ref 'v9'$"):
        with installer(registry, tmp_path / "cache", allow_file_urls=True).installed(stack):
            pass


def traced_git(trace: Path) -> list[list[str]]:
    """The argument lists of the git commands GIT_TRACE recorded."""
    if not trace.exists():
        return []
    return [shlex.split(line.split("trace: built-in: ", 1)[1]) for line in trace.read_text().splitlines()
            if "trace: built-in: " in line]


@pytest.mark.parametrize("ref", ["--recurse-submodules", "-b", "--upload-pack=touch /tmp/pwned"])
def test_a_ref_that_git_would_read_as_an_option_is_refused_before_git_runs(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ref: str) -> None:
    bare = bare_repository(tmp_path, NETWORK, "v1.0.0")
    trace = tmp_path / "git-trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))  # git writes every command it runs, with its arguments
    stack = stack_repo(tmp_path, {"main.tf": f'module "network" {{\n  source = "git::file://{bare}?ref={ref}"\n}}\n'})
    message = refusal(installer(registry, tmp_path / "cache", allow_file_urls=True), stack)
    assert message == (f'stacks/app/main.tf:1: module "network": source "git::file://{bare}?ref={ref}": the ref '
                       f"{ref!r} begins with '-' (git would read it as an option)")
    assert traced_git(trace) == []


def test_every_value_a_branch_writes_reaches_git_after_end_of_options(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = bare_repository(tmp_path, NETWORK, "v1.0.0")
    repo = git.Repo(bare)
    repo.git.branch("release", "v1.0.0")  # a branch of the remote (not its default): a ref as go-getter takes one
    trace = tmp_path / "git-trace"
    monkeypatch.setenv("GIT_TRACE", str(trace))
    for ref in ("v1.0.0", "release"):
        source = f"git::file://{bare}//modules/logs?ref={ref}"
        stack = stack_repo(tmp_path / ref, {"main.tf": f'module "logs" {{\n  source = "{source}"\n  vpc_id = "v"\n}}\n'})
        with installer(registry, tmp_path / "cache", allow_file_urls=True).installed(stack) as (work, pins):
            assert (work / ".terraform/modules/logs/modules/logs/main.tf").is_file()
        assert [p.version for p in pins] == [repo.commit("v1.0.0").hexsha]
    commands = traced_git(trace)
    assert commands, "git ran"
    for args in commands:
        from_branch = [i for i, arg in enumerate(args) if f"file://{bare}" in arg or arg.startswith(("v1.0.0", "release",
                                                                                                       "refs/remotes"))]
        for i in from_branch:
            assert "--end-of-options" in args[:i], args


def test_http_archives_with_a_subdir(registry: Registry, tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in NETWORK.items():
            archive.writestr(name, text.replace('module "key" {', 'module "key" {\n  count = 0'))
    folder = tmp_path / "zip-package"
    zipfile.ZipFile(io.BytesIO(buffer.getvalue())).extractall(folder)
    registry.packages[("acme/zipped/aws", "1.0.0")] = folder
    url = f"{registry.url}/archives/acme/zipped/aws/1.0.0.tar.gz//modules/vpc"
    stack = stack_repo(tmp_path, {"main.tf": f'module "network" {{\n  source = "{url}"\n  cidr = "10.1.0.0/16"\n}}\n'})
    with installer(registry, tmp_path / "cache").installed(stack) as (work, pins):
        assert (work / ".terraform/modules/network/modules/vpc/main.tf").is_file()
        assert (work / ".terraform/modules/network/modules/logs/main.tf").is_file()
    assert [p.key for p in pins] == ["network", "network.key"]


# --- plan-bound: the apply installs what was planned ----------------------------------------

def sandbox() -> SandboxEngine:
    return SandboxEngine(FakeSandboxStore())  # its store in memory: what is planned and applied, not how it is kept


def test_the_plan_records_the_pins_and_the_apply_refuses_a_changed_package(registry: Registry, tmp_path: Path) -> None:
    folder = tmp_path / "pkg"
    shutil.copytree(Path(__file__).parent / "fixtures/registry/terraform-aws-modules/kms/aws/1.5.0", folder)
    registry.packages[("acme/key/aws", "1.0.0")] = folder
    stack = stack_repo(tmp_path, {"main.tf": 'module "key" {\n  source  = "acme/key/aws"\n  version = "1.0.0"\n}\n'})
    simulator = sandbox()
    engine = EngineByStack({"sandbox": lambda: simulator}, lambda _: "sandbox", installer(registry, tmp_path / "c"))
    planned = engine.plan("app", stack, StackInputs())
    pins = pins_of(planned.document)
    assert pins is not None and pins["key"].version == "1.0.0"
    assert planned.document[PINS_KEY] == [pins["key"].to_json()]
    # the registry now serves other files under the same version: a fresh gateway (empty cache) refuses them
    (folder / "main.tf").write_text((folder / "main.tf").read_text() + '\nresource "aws_s3_bucket" "extra" {}\n')
    registry._archives.clear()
    other = EngineByStack({"sandbox": lambda: simulator}, lambda _: "sandbox", installer(registry, tmp_path / "c2"))
    refused = other.apply("app", stack, planned.document, planned.state_serial, StackInputs())
    assert not refused.succeeded and refused.applied == ()
    assert refused.error == ('nothing applied: stacks/app/main.tf:1: module "key": source "acme/key/aws" at 1.0.0 '
                             "is not the package that was planned (its files changed); plan again")
    outcome = engine.apply("app", stack, planned.document, planned.state_serial, StackInputs())  # its cache: planned
    assert outcome.succeeded, outcome.error
    assert "module.key.aws_kms_key.this[0]" in outcome.applied


# --- through the gateway: the corpus, and an unreachable source --------------------------------

def corpus_repository(tmp_path: Path) -> Path:
    """A declaration repo holding every corpus entry as a stack, each entry at corpus/<name>/ as upstream lays
    it out."""
    content = tmp_path / "content"
    stacks = {}
    for name, spec in EXPECTED.items():
        shutil.copytree(CORPUS / name, content / "corpus" / name)
        stacks[name] = {"path": posixpath.normpath(f"corpus/{name}/{spec['root']}"), "approvers": ["platform"]}
    stacks["unreachable"] = {"path": "stacks/unreachable", "approvers": ["platform"]}
    stacks["metadata"] = {"path": "stacks/metadata", "approvers": ["platform"]}
    write(content, {"stacks/unreachable/main.tf": 'resource "aws_sqs_queue" "q" {}\n\nmodule "queue" {\n'
                    '  source  = "acme/queue/aws"\n  version = "~> 1.0"\n}\n',
                    "stacks/metadata/main.tf": 'module "creds" {\n'
                    '  source = "http://169.254.169.254/latest/meta-data/iam.zip"\n}\n'})
    (content / "gateway.yaml").write_text(yaml.safe_dump({
        "engine": "sandbox", "approvals": {"required": 1, "config_approvers": ["platform"]}, "stacks": stacks}))
    return content


@pytest.fixture(scope="module")
def corpus_gateway(registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("corpus")
    ws = create_workspace(Settings(home=tmp / "home"), content=corpus_repository(tmp))
    token = add_people(ws).tokens["alice"]
    ws.close()
    env = {"GATEWAY_MODULE_REGISTRY_HOSTS": f"registry.terraform.io={registry.url}",
           "GATEWAY_MODULE_ALLOWED_HOSTS": listed(registry),
           "GATEWAY_MODULE_CA_BUNDLE": str(registry.ca_bundle), "GATEWAY_TOKEN": token}
    yield tmp / "home", env


def test_the_corpus_is_big_enough_and_every_entry_is_sourced() -> None:
    sources = (CORPUS / "SOURCES.md").read_text()
    assert len(EXPECTED) >= 12
    assert [name for name in EXPECTED if f"`{name}`" not in sources] == []
    assert [name for name in EXPECTED if any((CORPUS / name).rglob(".terraform"))] == []  # as upstream commits them
    assert [name for name in EXPECTED if not EXPECTED[name].get("derived")] == []  # each count says how it follows


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gateway_plan_plans_the_corpus_with_modules_from_the_registry(
        name: str, corpus_gateway: tuple[Path, dict[str, str]]) -> None:
    home, env = corpus_gateway  # the `gateway plan` command in this process: its parse caches stay warm
    done = CliRunner().invoke(cli, ["plan", "--stack", name, "--format", "json"], env={"GATEWAY_HOME": str(home), **env})
    assert done.exit_code == 0, done.output
    preview = json.loads(done.stdout)
    expected = EXPECTED[name]
    assert preview["counts"] == {"create": expected["creates"]}
    created = {c["address"] for c in preview["changes"] if c["kind"] == "create"}
    assert [a for a in expected["addresses"] if a not in created] == []


def test_an_unreachable_module_source_is_one_line_naming_module_source_and_line(
        corpus_gateway: tuple[Path, dict[str, str]]) -> None:
    home, env = corpus_gateway
    done = run_cli(["plan", "--stack", "unreachable"], home, **env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert 'unreachable/main.tf:3: module "queue": source "acme/queue/aws" cannot be reached: the registry ' \
           "registry.terraform.io has no module registry.terraform.io/acme/queue/aws" in lines[0]


def test_a_source_on_a_host_the_settings_do_not_admit_is_one_line_naming_the_setting(
        corpus_gateway: tuple[Path, dict[str, str]]) -> None:
    home, env = corpus_gateway
    done = run_cli(["plan", "--stack", "metadata"], home, **env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert ('metadata/main.tf:1: module "creds": source "http://169.254.169.254/latest/meta-data/iam.zip" cannot be '
            "reached: 169.254.169.254:80 is a link-local address, which module sources may not reach unless "
            "GATEWAY_MODULE_ALLOWED_HOSTS lists it") in lines[0]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_corpus_call_gets_the_newest_version_its_constraint_allows(name: str, registry: Registry,
                                                                       tmp_path: Path) -> None:
    copy = tmp_path / name
    shutil.copytree(CORPUS / name, copy)
    (copy / "gateway.yaml").write_text("")
    with installer(registry, tmp_path.parent / "shared-cache").installed(copy / EXPECTED[name]["root"]) as (_, pins):
        assert {p.key: p.version for p in pins} == EXPECTED[name]["modules"]


def terraform_binary() -> Path | None:
    installed = Path(__file__).resolve().parent.parent / ".tools" / "terraform" / "bin" / "terraform"
    try:
        return installed if installed.is_file() else (Path(found) if (found := shutil.which("terraform")) else None)
    except OSError:  # a broken link in .tools
        return Path(found) if (found := shutil.which("terraform")) else None


def test_the_terraform_engine_plans_with_the_laid_out_modules_without_reaching_a_registry(
        registry: Registry, tmp_path: Path) -> None:
    binary = terraform_binary()
    if binary is None:
        pytest.skip("no Terraform here: run `make terraform`")
    from gateway.adapters.engines.terraform.engine import TerraformEngine, TerraformSetup

    folder = write(tmp_path / "marker", {"main.tf": 'variable "name" {\n  type = string\n}\n'
                                         'output "greeting" {\n  value = "hello ${var.name}"\n}\n'})
    registry.packages[("acme/marker/null", "1.4.0")] = folder
    # a registry host that does not exist: Terraform must use what the gateway laid out
    stack = stack_repo(tmp_path, {"main.tf": 'module "marker" {\n  source  = "gateway.invalid/acme/marker/null"\n'
                                  '  version = "~> 1.0"\n  name    = "world"\n}\n'
                                  'output "greeting" {\n  value = module.marker.greeting\n}\n'})
    modules = installer(registry, tmp_path / "cache", hosts={"gateway.invalid": registry.url})
    engine = EngineByStack({"terraform": lambda: TerraformEngine(TerraformSetup(binary, None, tmp_path / "state", 300))},
                           lambda _: "terraform", modules)
    planned = engine.plan("app", stack, StackInputs())
    assert planned.document["planned_values"]["outputs"]["greeting"]["value"] == "hello world"
    assert [p["version"] for p in planned.document[PINS_KEY]] == ["1.4.0"]


def test_the_agent_reads_resolved_modules_and_cannot_write_them(registry: Registry, tmp_path: Path) -> None:
    from agents.tools import PreviewReport, RepoTools

    stack = stack_repo(tmp_path, {"main.tf": KMS_CALL})
    root = stack.parent.parent
    tools = RepoTools(root, (), lambda _s, _p: PreviewReport(""), {"app": "stacks/app"},
                      installer(registry, tmp_path / "cache").installed)
    listing = tools.call("read_module", json.dumps({"stack": "app", "path": None}))
    assert listing.splitlines()[0] == "modules: key: registry.terraform.io/terraform-aws-modules/kms/aws 2.2.1"
    assert ".terraform/modules/key/variables.tf" in listing
    text = tools.call("read_module", json.dumps({"stack": "app", "path": ".terraform/modules/key/variables.tf"}))
    assert text.startswith("1| ") and 'variable "aliases"' in text
    assert tools.call("read_module", json.dumps({"stack": "app", "path": "../secrets"})).startswith("refused:")
    written = tools.call("write_file", json.dumps({"path": "stacks/app/.terraform/modules/key/main.tf", "content": ""}))
    assert written.startswith("refused: stacks/app/.terraform/modules/key/main.tf: .terraform/ is what")
    assert not (stack / ".terraform").exists()


def test_registry_tokens_are_scrubbed_like_the_workspaces_secrets(tmp_path: Path) -> None:
    from gateway.composition import known_secret_values

    settings = Settings(home=tmp_path, module_registry_tokens="registry.example.com=tok-1a2b3c, tfe.example.com=tok-9z")
    assert {"tok-1a2b3c", "tok-9z"} <= set(known_secret_values(settings))


def test_a_proposal_calling_a_registry_module_is_planned_approved_and_applied_as_planned(
        registry: Registry, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from gateway.api.app import create_app
    from gateway.domain.jobs import JobKind, JobStatus
    from gateway.domain.plan import decode_plan_bytes
    from gateway.domain.proposal import Decision, ProposalStatus
    from gateway.services.admin.bootstrap import bootstrap_simulator
    from gateway.services.change.jobs import enqueue_job, run_now_or_follow
    from gateway.services.change.proposals import decide, get_proposal, open_proposal

    from .conftest import Clone, sign_in_client

    ws = create_workspace(Settings(home=tmp_path / "home", lock_wait_seconds=5,
                                   module_registry_hosts=f"registry.terraform.io={registry.url}",
                                   module_ca_bundle=registry.ca_bundle, module_allowed_hosts=listed(registry)))
    try:
        bootstrap_simulator(ws)
        people = add_people(ws)
        Clone(ws, tmp_path / "clone").branch("queue").write("stacks/app-staging/queue.tf", """
module "jobs" {
  source  = "terraform-aws-modules/sqs/aws"
  version = "~> 5.0"

  name = "staging-jobs"
  tags = {
    owner         = "app"
    "cost-centre" = "cc-42"
  }
}
""").push()
        proposal = open_proposal(ws, people.alice, "queue", "a job queue for staging")
        assert proposal.plans["app-staging"].counts == {"create": 1}
        with ws.store.session(readonly=True) as session:
            saved = decode_plan_bytes(session.proposals.plan_document(proposal.plans["app-staging"].plan_id).encode())
        assert [(p["key"], p["version"]) for p in saved[PINS_KEY]] == [("jobs", "5.2.1")]
        # the approver sees which module versions the plan was made with: `gateway show` and the review page
        pinned = "jobs registry.terraform.io/terraform-aws-modules/sqs/aws 5.2.1"
        shown = CliRunner().invoke(cli, ["show", str(proposal.id)], env={
            "GATEWAY_HOME": str(tmp_path / "home"), "GATEWAY_TOKEN": people.tokens["bob"]})
        assert shown.exit_code == 0, shown.output
        assert f"Modules: {pinned}" in shown.stdout.splitlines()
        with TestClient(create_app(ws.settings, workers=0)) as client:
            sign_in_client(client, people.tokens["bob"])
            page = html.unescape(client.get(f"/proposals/{proposal.id}").text)
        assert f"Modules: <code>{pinned}</code>" in page
        decide(ws, people.bob, proposal.id, Decision.APPROVE, "ok")
        done = run_now_or_follow(ws, enqueue_job(ws, people.alice, JobKind.APPLY, proposal.id), "test", lambda _: None)
        assert done.status == JobStatus.SUCCEEDED, done.error
        assert get_proposal(ws, proposal.id).status == ProposalStatus.APPLIED
        assert any((tmp_path / "home" / "modules").iterdir())  # the workspace's cache
    finally:
        ws.close()


# --- the address checked is the address connected to (DNS rebinding) -------------------------

class Hits(BaseHTTPRequestHandler):
    """Serves a registry's three answers and a package; every request is recorded by the server it reached."""

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        server = self.server
        server.hits.append(self.path)  # type: ignore[attr-defined]
        if self.path == "/.well-known/terraform.json":
            self._send(200, json.dumps({"modules.v1": "/v1/modules/"}).encode())
        elif self.path.endswith("/versions"):
            self._send(200, json.dumps({"modules": [{"versions": [{"version": "1.0.0"}]}]}).encode())
        elif self.path.endswith("/download"):
            self.send_response(204)
            self.send_header("X-Terraform-Get", "/net.tar.gz")
            self.end_headers()
        elif self.path == "/net.tar.gz":
            self._send(200, pack(write(Path(server.root) / "pkg", {"main.tf": "# the checked server's\n"})))  # type: ignore[attr-defined]
        else:
            self._send(404, b"{}")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_at(address: str, port: int, root: Path, tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((address, port), Hits)
    server.hits, server.root = [], root  # type: ignore[attr-defined]
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Answers:
    """A resolver the test controls: the answers in turn (the last one again and again), each name it was asked."""

    def __init__(self, *answers: str):
        self.answers = [[ipaddress.ip_address(a) for a in answer.split(",")] for answer in answers]
        self.asked: list[str] = []

    def __call__(self, host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        self.asked.append(host)
        return self.answers[min(len(self.asked), len(self.answers)) - 1]


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, ThreadingHTTPServer, int]]:
    """On one port: the server the guard admits (127.0.0.2, which the settings list) and the one a rebinding name
    would lead to (127.0.0.1, loopback, which they do not; and what the system resolves `localhost` to)."""
    checked = serve_at("127.0.0.2", 0, tmp_path)
    port = checked.server_address[1]
    other = serve_at("127.0.0.1", port, tmp_path)
    yield checked, other, port
    for server in (checked, other):
        server.shutdown()
        server.server_close()


def rebinding_access(port: int, resolve: Answers, scheme: str = "http", **overrides: object) -> ModuleAccess:
    values: dict[str, object] = {"hosts": {"registry.example": f"{scheme}://localhost:{port}"},
                                 "allowed_hosts": (f"127.0.0.2/32:{port}",), "resolve": resolve, "timeout": 10.0}
    return ModuleAccess(**{**values, **overrides})  # type: ignore[arg-type]


SOURCE = RegistrySource("registry.example", "acme", "net", "aws")


def test_every_http_request_goes_to_the_address_the_guard_checked(two_servers: tuple[ThreadingHTTPServer, ...],
                                                                  tmp_path: Path) -> None:
    checked, other, port = two_servers
    resolve = Answers("127.0.0.2")
    fetcher = ModuleFetcher(rebinding_access(port, resolve))
    assert fetcher.versions(SOURCE) == ["1.0.0"]  # discovery, versions
    location = fetcher.download_address(SOURCE, "1.0.0")
    assert location == PackageSource(f"http://localhost:{port}/net.tar.gz")
    fetcher.fetch_package(location, tmp_path / "out")
    assert (tmp_path / "out" / "main.tf").read_text() == "# the checked server's\n"
    assert checked.hits == ["/.well-known/terraform.json", "/v1/modules/acme/net/aws/versions",  # type: ignore[attr-defined]
                            "/v1/modules/acme/net/aws/1.0.0/download", "/net.tar.gz"]
    assert other.hits == []  # type: ignore[attr-defined]
    assert set(resolve.asked) == {"localhost"}


@pytest.mark.parametrize(("step", "before"), [("discovery", 0), ("versions", 1), ("download", 1), ("archive", 2)])
def test_a_name_that_answers_a_loopback_address_after_the_check_never_reaches_it(
        two_servers: tuple[ThreadingHTTPServer, ...], tmp_path: Path, step: str, before: int) -> None:
    checked, other, port = two_servers
    # the name answers the checked address for `before` connections (one per request: the server closes each),
    # then loopback: the step's own request is refused, and the loopback server hears nothing
    resolve = Answers(*(["127.0.0.2"] * before), "127.0.0.1")
    fetcher = ModuleFetcher(rebinding_access(port, resolve))
    with pytest.raises(ModuleUnreachable, match=f"^localhost:{port} is at 127.0.0.1, a loopback address, which module sources may "
                                          "not reach unless GATEWAY_MODULE_ALLOWED_HOSTS lists it$"):
        if step in ("discovery", "versions"):
            fetcher.versions(SOURCE)
        elif step == "download":
            fetcher.download_address(SOURCE, "1.0.0")
        else:
            fetcher.fetch_package(fetcher.download_address(SOURCE, "1.0.0"), tmp_path / "out")
    assert len(checked.hits) == before  # type: ignore[attr-defined]
    assert other.hits == []  # type: ignore[attr-defined]


def test_an_egress_proxy_from_the_environment_is_used_and_the_host_still_checked(
        two_servers: tuple[ThreadingHTTPServer, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    checked, proxy, port = two_servers  # 127.0.0.1 plays the operator's proxy: it hears absolute URLs
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    fetcher = ModuleFetcher(rebinding_access(port, Answers("127.0.0.2")))
    with pytest.raises(ModuleUnreachable):  # the stand-in proxy answers 404 to everything
        fetcher.versions(SOURCE)
    assert proxy.hits == [f"http://localhost:{port}/.well-known/terraform.json"]  # type: ignore[attr-defined]
    refused = ModuleFetcher(rebinding_access(port, Answers("127.0.0.1")))  # a host the guard refuses
    with pytest.raises(ModuleUnreachable, match="a loopback address"):
        refused.versions(SOURCE)
    assert len(proxy.hits) == 1 and checked.hits == []  # type: ignore[attr-defined]


def test_a_pinned_https_connection_names_the_host_and_verifies_its_certificate(tmp_path: Path) -> None:
    ca, cert, key = make_tls_files(tmp_path)  # a certificate for localhost (and 127.0.0.1)
    names: list[str | None] = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    tls.sni_callback = lambda sock, name, context: names.append(name)  # type: ignore[assignment,misc,return-value]
    server = serve_at("127.0.0.2", 0, tmp_path, tls)
    port = server.server_address[1]
    try:
        fetcher = ModuleFetcher(rebinding_access(port, Answers("127.0.0.2"), "https", ca_bundle=ca))
        assert fetcher.versions(SOURCE) == ["1.0.0"]
        assert names == ["localhost", "localhost"]  # SNI: the host's name, not the address connected to
        served_as = {"registry.example": f"https://127.0.0.2.nip.example:{port}"}  # a name the certificate lacks
        wrong = ModuleFetcher(rebinding_access(port, Answers("127.0.0.2"), "https", ca_bundle=ca, hosts=served_as))
        with pytest.raises(ModuleUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            wrong.versions(SOURCE)
    finally:
        server.shutdown()
        server.server_close()


def test_git_over_http_clones_from_the_address_the_guard_checked(tmp_path: Path) -> None:
    bare = bare_repository(tmp_path, {"main.tf": "# the checked server's\n"}, "v1")
    subprocess.run(["git", "-C", str(bare), "update-server-info"], check=True)  # git's dumb HTTP: static files

    def files_of(directory: Path) -> type[SimpleHTTPRequestHandler]:
        class Files(SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(directory), **kwargs)  # type: ignore[arg-type]

            def log_message(self, format: str, *args: object) -> None:
                self.server.hits.append(self.path)  # type: ignore[attr-defined]
        return Files

    decoy = tmp_path / "decoy"
    shutil.copytree(bare, decoy / "network.git")
    servers = []
    checked = ThreadingHTTPServer(("127.0.0.2", 0), files_of(tmp_path))
    port = checked.server_address[1]
    other = ThreadingHTTPServer(("127.0.0.1", port), files_of(decoy))
    for server in (checked, other):
        server.hits = []  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        resolve = Answers("127.0.0.2")
        fetcher = ModuleFetcher(rebinding_access(port, resolve))
        commit = fetcher.fetch_package(PackageSource(f"git::http://localhost:{port}/network.git?ref=v1"),
                                       tmp_path / "out")
        assert commit == git.Repo(bare).commit("v1").hexsha
        assert checked.hits and other.hits == []  # type: ignore[attr-defined]
        assert resolve.asked == ["localhost"]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
