"""How fast the disk under a model file reads experts: a short probe with bmoe's own reader,
remembered per file system, so a plan made again (``--plan-only``, the next open) reads nothing.

The probe reads expert slices of the model itself, spread over its experts as routes spread them,
with the reader the session streams with (O_DIRECT where the file system allows it, so the page
cache does not flatter the figure), ``PROBE_BYTES`` in all, and times the whole batch.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bmoe.stream.layout import ModelLayout
from bmoe.stream.reader import ALIGN, ExpertReader, ReadOp, Window

MIB = 1 << 20
PROBE_BYTES = 64 * MIB
RATES_FILE = "disk-rates.json"


@dataclass(frozen=True, slots=True)
class DiskRate:
    mib_s: float  # MiB read per second
    source: str  # "probed" (just now) or "remembered" (an earlier probe on this file system)
    file_system: str  # the key it is remembered under: device and mount point
    probe_mib: float  # what the probe read
    odirect: bool  # whether it read around the page cache


def _mount_point(path: Path) -> str:
    """The mount point the file lies under (the longest mount path that is a prefix of it)."""
    real = os.path.realpath(path)
    best = "/"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) > 4:
            mnt = parts[4]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                best = mnt
    return best


def file_system_key(path: Path) -> str:
    st = os.stat(path)
    return f"{os.major(st.st_dev)}:{os.minor(st.st_dev)} {_mount_point(path)}"


def _load(store: Path) -> dict:
    try:
        data = json.loads(store.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered(layout: ModelLayout, cache_dir: Path) -> DiskRate | None:
    """The rate an earlier probe measured on the file system of ``layout``'s first shard."""
    key = file_system_key(layout.files[0].path)
    entry = _load(cache_dir / RATES_FILE).get(key)
    if entry is None:
        return None
    try:
        return DiskRate(float(entry["mib_s"]), "remembered", key, float(entry["probe_mib"]), bool(entry["odirect"]))
    except (TypeError, KeyError, ValueError):
        return None


def probe(
    layout: ModelLayout, *, odirect: bool = True, io_threads: int = 4, nbytes: int = PROBE_BYTES, seed: int = 0
) -> DiskRate:
    """Read about ``nbytes`` of expert slices (seeded choice of layer, projection and expert) and time it."""
    rng = random.Random(seed)
    biggest = max(t.slice_nbytes for t in layout.experts)
    buf = mmap.mmap(-1, biggest + 2 * ALIGN)  # anonymous: page aligned, as O_DIRECT wants
    window = Window.over(buf)
    ops, total = [], 0
    budget = min(nbytes, layout.expert_nbytes)
    while total < budget:
        t = rng.choice(layout.experts)
        off = t.slice_offset(rng.randrange(t.n_expert))
        ops.append(ReadOp(t.file_index, off, t.slice_nbytes, window, ALIGN + off % ALIGN))
        total += t.slice_nbytes
    reader = ExpertReader(layout.files, odirect=odirect, io_threads=io_threads, warn=lambda m: None)
    try:
        t0 = time.perf_counter()
        reader.read(ops)
        seconds = max(time.perf_counter() - t0, 1e-6)
        direct = reader.odirect
    finally:
        reader.close()
        window.view.release()
        buf.close()
    return DiskRate(total / MIB / seconds, "probed", file_system_key(layout.files[0].path), total / MIB, direct)


def read_rate(layout: ModelLayout, cache_dir: Path, *, odirect: bool = True, io_threads: int = 4) -> DiskRate:
    """The remembered rate of this file system, or a probe's, remembered for next time (a store
    that cannot be written only means the next plan probes again)."""
    known = remembered(layout, cache_dir)
    if known is not None:
        return known
    rate = probe(layout, odirect=odirect, io_threads=io_threads)
    store = cache_dir / RATES_FILE
    data = _load(store)
    data[rate.file_system] = {k: v for k, v in asdict(rate).items() if k not in ("source", "file_system")}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f"{store.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(store)
    except OSError:
        pass
    return rate
