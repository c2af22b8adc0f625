"""`labkit.memory`, the one memory meter (the smoke's stages, the KL benchmark)."""

import sys

import pytest

from labkit import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_the_peak_above_now_sees_a_50_mb_buffer_and_resets():
    grown = memory.peak_rss_delta_bytes(lambda: bytearray(50_000_000).__setitem__(slice(None), b"x" * 50_000_000))
    assert grown is not None and 45_000_000 <= grown <= 200_000_000  # the buffer, and the bytes object filling it
    assert memory.peak_rss_delta_bytes(lambda: None) < 10_000_000  # reset: an idle call grows by ~nothing
    assert memory.host_peak_bytes() >= memory.status_kib("VmRSS") * 1024


def test_a_field_that_does_not_exist_is_none():
    assert memory.status_kib("NoSuchField") is None and memory.meminfo_bytes("NoSuchField") is None
