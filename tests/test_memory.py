"""`labkit.lab.memory`, the one memory meter (the smoke's stages, the KL benchmark)."""

import sys

import pytest

from labkit.lab import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_the_peak_above_now_sees_a_50_mb_buffer_and_resets():
    """A fresh anonymous mapping, every page touched, kept until the peak is read: malloc could hand
    back memory an earlier test freed and left resident (no growth to see), and Linux updates VmHWM
    lazily once memory is unmapped again."""
    import mmap

    kept = []

    def work():
        buffer = mmap.mmap(-1, 50_000_000)
        for offset in range(0, len(buffer), mmap.PAGESIZE):
            buffer[offset] = 1
        kept.append(buffer)

    grown = memory.peak_rss_delta_bytes(work)
    assert grown is not None and 45_000_000 <= grown <= 200_000_000
    kept.pop().close()
    assert memory.host_peak_bytes() >= memory.status_kib("VmRSS") * 1024


def test_a_field_that_does_not_exist_is_none():
    assert memory.status_kib("NoSuchField") is None and memory.meminfo_bytes("NoSuchField") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux's")
def test_the_evaluations_cpu_peak_counts_from_its_reset():
    """What evaluate records per decoding mode: the peak since `reset_peak`, said so in its kind."""
    was_reset = memory.reset_peak("cpu")
    peak, kind = memory.peak("cpu", was_reset)
    assert was_reset and kind == "peak RSS of the process (VmHWM), reset per mode (CPU)"
    assert peak >= memory.status_kib("VmRSS") * 1024 * 0.9  # VmHWM >= VmRSS, read a moment apart
    assert memory.peak("cpu", False)[1] == "peak RSS of the process so far (CPU; not reset per mode)"
