"""A placeholder for a module another rank holds (a pipeline stage's layers, an expert-parallel
rank's experts): no parameters, never called."""

from __future__ import annotations

from torch import nn


class MissingLayer(nn.Module):
    """The place of a module this rank does not hold."""
