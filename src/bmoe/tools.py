"""The edges' utilities that need no session: what the CLI's listing and cleaning flags, the plan
preview and the Ray sizing print or compute. The session (bmoe.session) is the door for requests;
this module is the door for these, so that neither carries the other's names (docs/architecture.md
"The public door")."""

from __future__ import annotations

from bmoe.llama.devices import format_devices, list_devices
from bmoe.runtime.footprint import Footprint, footprint
from bmoe.runtime.plan import Plan, checked_plan, make_plan
from bmoe.stream import format_archs
from bmoe.stream.twin import default_twin_dir, gc_twins

__all__ = [
    "Footprint",
    "Plan",
    "checked_plan",
    "default_twin_dir",
    "footprint",
    "format_archs",
    "format_devices",
    "gc_twins",
    "list_devices",
    "make_plan",
]
