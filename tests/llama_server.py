"""llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`), as it ships, with one change:
every model loads with `use_extra_bufts=False`.

Run by tests/model_server.py with the server's own Python (.tools/model-server/venv), never imported by the
tests. With llama.cpp's extra buffer types (weight repacking for the CPU it was built on) the stock server
crashed on its first completion on these machines' CPUs; the server has no setting for it, so the default
model parameters it starts from are changed here, before it loads anything.

    .tools/model-server/venv/bin/python tests/llama_server.py --config_file CONFIG.json
"""

from __future__ import annotations

import llama_cpp.llama_cpp as native
from llama_cpp.server.__main__ import main

_default_params = native.llama_model_default_params


def _params_without_extra_buffers() -> native.llama_model_params:
    params = _default_params()
    params.use_extra_bufts = False
    return params


native.llama_model_default_params = _params_without_extra_buffers

if __name__ == "__main__":
    main()
