"""The base of every part of the settings body."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A part of the settings body: unknown keys are refused rather than dropped, so a typo is seen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
