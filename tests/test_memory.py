"""`labkit.memory`, the one memory meter (the smoke's stages, the KL benchmark)."""

import sys

import pytest

from labkit import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_the_peak_above_now_sees_a_50_mb_buffer_and_resets():
    """The buffer stays alive until the peak is read: Linux updates VmHWM lazily, so memory already
    unmapped again may not show in it (the smoke's stages and the bench measure work that holds its
    memory to the end)."""
    kept = []

    def work():
        buffer = bytearray(50_000_000)
        buffer[::4096] = b"x" * len(buffer[::4096])  # touch every page
        kept.append(buffer)

    grown = memory.peak_rss_delta_bytes(work)
    assert grown is not None and 45_000_000 <= grown <= 200_000_000
    kept.clear()
    assert memory.host_peak_bytes() >= memory.status_kib("VmRSS") * 1024


def test_a_field_that_does_not_exist_is_none():
    assert memory.status_kib("NoSuchField") is None and memory.meminfo_bytes("NoSuchField") is None
