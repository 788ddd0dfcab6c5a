"""Expert streaming: GGUF offsets, arch registry, expert reader, expert cache, the streamer.

Pure Python + numpy + os: nothing here imports llama_cpp or ctypes (bmoe.llama drives it).
"""

from bmoe.stream.archs import ArchEntry, NothingToStreamError, UnsupportedArchError, format_archs, list_archs, lookup
from bmoe.stream.budget import Budget, CacheBudgetError, StreamSettings, resolve_budget
from bmoe.stream.cache import ExpertKey
from bmoe.stream.layout import ExpertTensor, LayoutError, ModelLayout, read_layout
from bmoe.stream.reader import FileChangedError, StreamIOError
from bmoe.stream.stats import StreamStats
from bmoe.stream.streamer import Binding, RouteError, Streamer
from bmoe.stream.twin import TwinError, dense_twin

__all__ = [
    "ArchEntry",
    "Binding",
    "Budget",
    "CacheBudgetError",
    "ExpertKey",
    "ExpertTensor",
    "FileChangedError",
    "LayoutError",
    "ModelLayout",
    "NothingToStreamError",
    "RouteError",
    "StreamIOError",
    "StreamSettings",
    "StreamStats",
    "Streamer",
    "TwinError",
    "UnsupportedArchError",
    "dense_twin",
    "format_archs",
    "list_archs",
    "lookup",
    "read_layout",
    "resolve_budget",
]
