"""Finding logits-processor classes: given as classes, as "package.module:Class" or
"package.module.Class" names, or installed under the entry-point group
`pagedllm.logits_processors`."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from pagedllm.logits_processor.interface import LogitsProcessor

ENTRY_POINT_GROUP = "pagedllm.logits_processors"


def load_logits_processors(specs: Sequence[Any] | None) -> tuple[type[LogitsProcessor], ...]:
    """The installed plugins' classes, then `specs`' (ValueError naming a bad one)."""
    classes = [_check(entry.load(), entry.value)
               for entry in entry_points(group=ENTRY_POINT_GROUP)]
    for spec in specs or ():
        classes.append(_check(_resolve(spec), spec))
    return tuple(classes)


def _resolve(spec: Any) -> Any:
    if isinstance(spec, type):
        return spec
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"logits_processors entries must be classes or 'module:Class' names, "
                         f"got {spec!r}.")
    module_name, _, attribute = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"logits_processors entry {spec!r} must name a module and a class.")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"logits_processors entry {spec!r}: cannot import {module_name!r} "
                         f"({error}).") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"logits_processors entry {spec!r}: {module_name!r} has no "
                             f"{attribute!r}.")
        target = getattr(target, part)
    return target


def _check(cls: Any, spec: Any) -> type[LogitsProcessor]:
    if not (isinstance(cls, type) and issubclass(cls, LogitsProcessor)):
        raise ValueError(f"logits_processors entry {spec!r} is not a subclass of "
                         "pagedllm.logits_processor.LogitsProcessor.")
    return cls
