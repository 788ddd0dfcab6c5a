"""G18g without a device: the rules that hold on any llama-cpp-python build, RPC or not.

A session without --prefill-device hands llama.cpp an empty device list (never NULL, which would
mean every GPU found), so it runs all on the CPU even on a GPU build; a missing device is refused
by name before anything loads; the ubatch split the count relies on is llama.cpp's.
"""

from __future__ import annotations

import pytest

from bmoe.config import SessionConfig
from bmoe.errors import ConfigError
from bmoe.llama.devices import (
    PrefillDeviceError,
    device_list,
    format_devices,
    list_devices,
    ubatch_widths,
)
from bmoe.session import Session


def test_ubatch_widths() -> None:
    assert ubatch_widths(71, 512, 16) == [16, 16, 16, 16, 7]
    assert ubatch_widths(40, 16, 16) == [16, 16, 8]
    assert ubatch_widths(40, 20, 16) == [16, 4, 16, 4]  # each llama_decode call is cut on its own
    assert ubatch_widths(1, 512, 16) == [1] and ubatch_widths(0, 512, 16) == []


def test_no_device_means_an_empty_list_not_null() -> None:
    arr = device_list(None)
    assert len(arr) == 2 and arr[0] is None and arr[1] is None


def test_cpu_session_uses_no_device(tiny_models) -> None:
    with Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), n_ctx=128, n_threads=2)) as s:
        assert s.runtime.prefill_device is None and s.runtime.ctx.n_dev_tokens == 0


def test_missing_device_refused_by_name(tiny_models) -> None:
    names = ", ".join(d.name for d in list_devices())
    with pytest.raises(
        PrefillDeviceError, match=rf"no device named 'NoSuchGPU0' in this llama-cpp-python \(it has: {names}\)"
    ):
        Session(SessionConfig(model=tiny_models("qwen3moe", "q8_0"), prefill_device="NoSuchGPU0"))


def test_config_rules(tiny_models) -> None:
    model = tiny_models("qwen3moe", "q8_0")
    assert SessionConfig(model=model).prefill_min_tokens == 32
    with pytest.raises(ConfigError, match="prefill_device: must be a device name"):
        SessionConfig(model=model, prefill_device="")
    with pytest.raises(ConfigError, match="prefill_min_tokens: must be an integer >= 2, got 1"):
        SessionConfig(model=model, prefill_min_tokens=1)
    for mode in ("on", "off", "auto"):  # on is allowed with a device: a restored state is exact (G18g)
        assert SessionConfig(model=model, prefill_device="X", decide_prefix_cache=mode).decide_prefix_cache == mode


def test_list_devices_names_the_cpu() -> None:
    devices = list_devices()
    assert any(d.kind == "cpu" for d in devices)
    text = format_devices(devices)
    assert text.splitlines()[0].startswith("name") and "CPU" in text
