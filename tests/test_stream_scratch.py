"""StreamScratch (``_internal/memory.py``): one scratch block per (device, stream) for runs given
no workspace, grown in stream order, never handed out while its stream is being captured. These
tests drive it with a fake stream-ordered allocator; tests/test_call_memo_gpu.py runs it on a GPU.
"""

from __future__ import annotations

from opfacade._internal.memory import StreamScratch


class FakeMemory:
    """Records what StreamScratch asks of the driver; hands out increasing addresses."""

    def __init__(self) -> None:
        self.capturing_streams: set[int] = set()
        self.events: list[tuple] = []
        self.next_ptr = 1 << 20
        self.fail = False

    def capturing_reader(self):
        return lambda stream: stream in self.capturing_streams

    def replace(self, old, size: int, device: int, stream: int) -> int:
        if self.fail:
            raise MemoryError("out of memory")
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + size
        self.events.append(("replace", old, size, device, stream, ptr))
        return ptr

    def free_when_idle(self, ptr: int, device: int) -> None:
        self.events.append(("free", ptr, device))


def test_one_block_per_device_and_stream_reused_call_after_call():
    memory = FakeMemory()
    scratch = StreamScratch(memory)
    first = scratch.pointer(256, 0, 7)
    assert scratch.pointer(256, 0, 7) == first
    assert scratch.pointer(1000, 0, 7) == first  # still fits the smallest block
    other_stream, other_device = scratch.pointer(256, 0, 8), scratch.pointer(256, 1, 7)
    assert len({first, other_stream, other_device}) == 3
    assert len(scratch) == 3
    assert [e[2] for e in memory.events] == [StreamScratch.SMALLEST] * 3


def test_a_bigger_request_replaces_the_block_in_stream_order():
    memory = FakeMemory()
    scratch = StreamScratch(memory)
    small = scratch.pointer(256, 0, 7)
    big = scratch.pointer(StreamScratch.SMALLEST + 1, 0, 7)
    assert big != small
    # The old block goes back on the same stream, after the work that used it.
    assert memory.events[-1] == ("replace", small, 2 * StreamScratch.SMALLEST, 0, 7, big)
    assert scratch.pointer(256, 0, 7) == big


def test_not_served_while_capturing_over_the_limit_or_when_the_driver_refuses():
    memory = FakeMemory()
    scratch = StreamScratch(memory)
    memory.capturing_streams.add(7)
    assert scratch.pointer(256, 0, 7) is None
    assert scratch.pointer(StreamScratch.LIMIT + 1, 0, 8) is None
    memory.fail = True
    assert scratch.pointer(256, 0, 9) is None
    assert memory.events == [] and len(scratch) == 0
    assert scratch.pointer(0, 0, 7) == 0  # nothing to hold


def test_a_block_known_before_capture_is_not_handed_to_the_capture():
    memory = FakeMemory()
    scratch = StreamScratch(memory)
    assert scratch.pointer(256, 0, 7) is not None
    memory.capturing_streams.add(7)
    assert scratch.pointer(256, 0, 7) is None


def test_clear_frees_every_block():
    memory = FakeMemory()
    scratch = StreamScratch(memory)
    a, b = scratch.pointer(256, 0, 7), scratch.pointer(256, 1, 7)
    scratch.clear()
    assert len(scratch) == 0
    assert sorted(e for e in memory.events if e[0] == "free") == [("free", a, 0), ("free", b, 1)]
    assert scratch.pointer(256, 0, 7) not in (None, a)
