"""``python -m bench stages``: a ``/v1`` request's cost by stage, and what each governance area adds."""

from bench.stages.command import command

__all__ = ["command"]
