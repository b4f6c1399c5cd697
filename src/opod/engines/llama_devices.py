"""Whether the llama-server a worker starts can use the machine's GPUs.

A machine can have cards that NVML sees while llama.cpp sees none: the bundled
llama-server reaches NVIDIA cards through Vulkan, which needs the driver's
Vulkan ICD and libglvnd, and the portable route (xllamacpp) is built for the
CPU only. llama.cpp then runs every model on the CPU, an order of magnitude
slower, without an error. The worker asks the binary it will start
(``--list-devices``) once at start-up and says so, with the fix.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from opod.contract import nodeapi

LIST_TIMEOUT_S = 20.0


def parse_devices(text: str) -> list[str] | None:
    """The device lines of ``--list-devices``'s output (``Vulkan0: NVIDIA H200 (143771 MiB, 143139 MiB free)``);
    ``[]`` for ``(none)``, None when the text is not such a list."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Available devices:")
    except StopIteration:
        return None
    found = []
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "\t")) or not line.strip():
            break
        if line.strip() != "(none)":
            found.append(line.strip())
    return found


def list_devices(argv: Sequence[str], timeout: float = LIST_TIMEOUT_S) -> list[str] | None:
    """Ask a llama-server command (a route's ``argv``) which devices it can use; None when it cannot say."""
    try:
        done = subprocess.run(
            [*argv, "--list-devices"], capture_output=True, text=True, timeout=timeout, errors="replace"
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_devices(done.stdout + "\n" + done.stderr)


def unused_gpus_warning(gpus: Sequence[nodeapi.GPU], devices: list[str] | None, route_why: str) -> str | None:
    """What to tell the operator when the machine has GPUs and llama.cpp lists none; None when all is well or unknown."""
    if not gpus or devices is None or devices:
        return None
    names = ", ".join(sorted({g.name or "GPU" for g in gpus}))
    return (
        f"this machine has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({names}) but llama.cpp ({route_why}) sees none, "
        "so llama.cpp models will run on the CPU, many times slower. The bundled llama-server reaches NVIDIA cards through "
        "Vulkan: install the driver's Vulkan ICD and libglvnd (Debian/Ubuntu: libvulkan1 libglvnd0 libegl1), then check with "
        "`llama-server --list-devices`; or set OPOD_LLAMA_SERVER to a CUDA build of llama-server."
    )
