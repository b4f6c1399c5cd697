"""Commands a worker runs to install something an operator asked for: a release of opod, an engine build.

The command is the operator's (an ``OPOD_*_COMMAND`` variable) or a pip default: a line split as a
shell would split it, run without one, with ``{name}`` placeholders filled in. It runs in the
background with its output in the agent's log (and a file, where given); what a failure says is
its last line of output.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opod import config
from opod.http import cpu

log = logging.getLogger("opod.worker")


def command(
    variable: str, default: str, fill: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> list[str]:
    """``variable``'s command (else ``default``) as argv, placeholders filled; ValueError naming the variable when malformed."""
    text = config.read(variable, environ) or default
    try:
        argv = [word.format_map(fill) for word in shlex.split(text)]
    except (ValueError, KeyError, IndexError) as err:
        braced = ["{" + name + "}" for name in fill]
        names = " and ".join([", ".join(braced[:-1]), braced[-1]] if len(braced) > 1 else braced)
        raise ValueError(
            f"{variable}={text!r} cannot be used ({err}); write a command with only {names} in braces"
        ) from None
    if not argv:
        raise ValueError(f"{variable} is empty; unset it for the default, {default}")
    return argv


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    """The exit status; -1 when the command could not be started."""
    last: str
    """Its last line of output, or why it could not be started."""

    @property
    def ok(self) -> bool:
        return self.code == 0


async def run(argv: list[str], *, label: str, log_file: Path | None = None) -> Outcome:
    """Run ``argv`` to its end, each line of its output logged as ``label: …``; killed when cancelled."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=cpu.free_child,  # started from the event loop's thread: not on its CPU alone
        )
    except OSError as err:
        return Outcome(-1, f"{argv[0]} could not be started: {err.strerror or err}")
    assert process.stdout is not None
    last = ""
    kept = log_file.open("a", encoding="utf-8") if log_file is not None else None
    try:
        if kept is not None:
            kept.write(f"--- {shlex.join(argv)}\n")
        async for raw in process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.strip():
                last = line.strip()
            if kept is not None:
                kept.write(line + "\n")
            log.info("%s: %s", label, line)
        code = await process.wait()
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    finally:
        if kept is not None:
            kept.close()
    return Outcome(code, last or f"exit status {code}")
