"""``forked`` (``_internal/stream_fork.py``): one side stream and its events per (device, caller's
stream), reused by every fork from that stream. Driven here by a fake CuPy that records the
runtime calls; tests/test_decode_attention_gpu.py runs the split batch through it on a GPU."""

from __future__ import annotations

import contextlib
import itertools
import sys
import types

import pytest

from opfacade._internal import stream_fork


@pytest.fixture
def fake_cupy(monkeypatch):
    handles, calls = itertools.count(0x100), []

    def handle(kind):
        return types.SimpleNamespace(ptr=next(handles), kind=kind)

    runtime = types.SimpleNamespace(
        eventRecord=lambda event, stream: calls.append(("record", event, stream)),
        streamWaitEvent=lambda stream, event, flags: calls.append(("wait", stream, event)))
    cuda = types.SimpleNamespace(
        runtime=runtime, Device=lambda device: contextlib.nullcontext(),
        Stream=lambda non_blocking: handle("stream"),
        Event=lambda disable_timing: handle("event"))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(stream_fork, "SIDE_STREAMS", stream_fork.BuildOnceLRU("test sides", 2))
    return calls


def test_forks_from_one_stream_share_a_side_stream_and_other_streams_get_their_own(fake_cupy):
    side, fork, join = stream_fork.forked(7, 0)
    assert stream_fork.forked(7, 0)[0] == side  # a call prepared again: no new stream
    assert stream_fork.forked(8, 0)[0] != side  # another caller's stream
    assert stream_fork.forked(7, 1)[0] not in (side, stream_fork.forked(8, 0)[0])  # device 1
    fork[0](), join[0]()
    record_fork, wait_fork, record_join, wait_join = fake_cupy
    assert record_fork[0] == "record" and record_fork[2] == 7  # on the caller's stream
    assert wait_fork == ("wait", side, record_fork[1])  # the side waits for it
    assert record_join[0] == "record" and record_join[2] == side
    assert wait_join == ("wait", 7, record_join[1])  # the caller waits for the side


def test_a_fork_keeps_working_after_its_side_stream_leaves_the_cache(fake_cupy):
    side, fork, join = stream_fork.forked(7, 0)
    for stream in (8, 9, 10):  # the cache holds 2: stream 7's entry goes
        stream_fork.forked(stream, 0)
    assert stream_fork.forked(7, 0)[0] != side  # made again
    fork[0](), join[0]()  # the first fork's calls still name their own stream and events
    assert fake_cupy[1] == ("wait", side, fake_cupy[0][1])


def test_clear_caches_drops_the_side_streams(fake_cupy):
    import opfacade

    side = stream_fork.forked(7, 0)[0]
    opfacade.clear_caches()
    assert stream_fork.SIDE_STREAMS.peek((0, 7)) is None
    assert stream_fork.forked(7, 0)[0] != side  # made again


def test_threads_forking_from_one_stream_at_once_make_one_side_stream(fake_cupy, monkeypatch):
    """Two threads that prepare split calls on one caller's stream at the same moment (each
    thread's first call, so the entry is missing for both) get the same side stream. The cache
    builds outside its lock, so both may build one, but the first stored wins for both and the
    other is dropped unused: one side stream per caller's stream, as single-threaded."""
    import threading

    made, release = [], threading.Event()
    side = stream_fork._side

    def slow_side(device):  # holds the first builder inside the build until both have asked
        made.append(device)
        release.wait(5)
        return side(device)

    monkeypatch.setattr(stream_fork, "_side", slow_side)
    sides, start = [], threading.Barrier(2)

    def prepare():
        start.wait(5)
        sides.append(stream_fork.forked(7, 0)[0])

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    for thread in threads:
        thread.start()
    threading.Timer(0.2, release.set).start()
    for thread in threads:
        thread.join(10)
    assert len(sides) == 2 and sides[0] == sides[1]
    assert made in ([0], [0, 0])  # each thread may build; one side stream is kept
    assert stream_fork.forked(7, 0)[0] == sides[0]
