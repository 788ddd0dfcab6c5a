"""Expert streaming: GGUF offsets, arch registry, expert reader, expert cache, the streamer.

Pure Python + numpy + os: nothing here imports llama_cpp or ctypes (bmoe.llama drives it).
"""
from .archs import ArchEntry, NothingToStreamError, UnsupportedArchError, format_archs, list_archs, lookup
from .cache import ExpertKey
from .layout import ExpertTensor, LayoutError, ModelLayout, read_layout
from .budget import Budget, CacheBudgetError, StreamSettings, resolve_budget
from .reader import FileChangedError, StreamIOError
from .stats import StreamStats
from .streamer import Binding, RouteError, Streamer
from .twin import TwinError, dense_twin

__all__ = [
    "ArchEntry", "Binding", "Budget", "CacheBudgetError", "ExpertKey", "ExpertTensor", "FileChangedError",
    "LayoutError", "ModelLayout", "NothingToStreamError", "RouteError", "StreamIOError", "StreamSettings",
    "StreamStats", "Streamer", "TwinError", "UnsupportedArchError", "dense_twin", "format_archs", "list_archs", "lookup",
    "read_layout", "resolve_budget",
]
