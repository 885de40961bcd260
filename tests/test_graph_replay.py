"""GraphedLaunches (opfacade/_internal/graph_replay.py) without a GPU: the first call launches
directly, the second captures the launches on a private stream and replays the graph on the
caller's stream, a caller's own capture gets the launches directly, and a refused capture leaves
them direct for good. The driver and CuPy's runtime are recorded fakes."""

from __future__ import annotations

import pytest


class _FakeRuntime:
    """cupy.cuda.runtime's capture calls, recorded; ``fail_capture`` makes the capture refuse."""

    streamCaptureModeRelaxed = 2

    def __init__(self, fail_capture: bool = False):
        self.fail_capture, self.calls = fail_capture, []

    def streamBeginCapture(self, stream, mode):
        self.calls.append("begin")
        if self.fail_capture:
            raise RuntimeError("capture refused")

    def streamEndCapture(self, stream):
        self.calls.append("end")
        return 0x6A

    def graphInstantiate(self, graph):
        self.calls.append("instantiate")
        return 0xE0

    def graphExecDestroy(self, exec_):
        self.calls.append("destroy exec")

    def graphDestroy(self, graph):
        self.calls.append("destroy graph")


class _FakeLibcuda:
    """libcuda's two entry points GraphedLaunches calls; ``capturing`` says the caller's stream
    is being captured."""

    def __init__(self, capturing: bool = False):
        self.capturing, self.replays = capturing, []

    def cuStreamIsCapturing(self, stream, status):
        status._obj.value = int(self.capturing)
        return 0

    def cuGraphLaunch(self, exec_, stream):
        self.replays.append((exec_.value, stream.value))
        return 0


def _graphed(monkeypatch, runtime: _FakeRuntime, libcuda: _FakeLibcuda, capture_at: int = 2):
    import contextlib

    from opfacade._internal import graph_replay

    monkeypatch.setattr(graph_replay, "bare_function", lambda name: getattr(libcuda, name))
    monkeypatch.setattr("cupy.cuda.runtime", runtime, raising=False)
    monkeypatch.setattr("cupy.cuda.Device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr("cupy.cuda.Stream", lambda non_blocking: type("S", (), {"ptr": 0x77})())
    direct = []

    def make(stream):
        return [lambda: direct.append(("partial", stream)),
                lambda: direct.append(("merge", stream))]

    return graph_replay.GraphedLaunches(make, 0x55, 0, capture_at), direct


def test_a_graphed_step_launches_directly_once_then_replays_one_graph(monkeypatch):
    pytest.importorskip("cupy")
    runtime, libcuda = _FakeRuntime(), _FakeLibcuda()
    step, direct = _graphed(monkeypatch, runtime, libcuda)
    step()
    assert direct == [("partial", 0x55), ("merge", 0x55)] and not runtime.calls
    step()  # captured on the private stream, then replayed on the caller's
    assert direct[2:] == [("partial", 0x77), ("merge", 0x77)]
    assert runtime.calls == ["begin", "end", "instantiate"] and libcuda.replays == [(0xE0, 0x55)]
    step()
    assert len(direct) == 4 and libcuda.replays == [(0xE0, 0x55)] * 2


def test_a_graph_is_destroyed_with_its_owner_but_not_at_interpreter_exit(monkeypatch):
    """At interpreter exit CuPy may be half torn down (a GPU test process once aborted in
    glibc after pytest's summary); the process's end frees the graph with its context."""
    pytest.importorskip("cupy")
    runtime, libcuda = _FakeRuntime(), _FakeLibcuda()
    step, _ = _graphed(monkeypatch, runtime, libcuda)
    step()
    step()
    del runtime.calls[:]
    step.__del__(_finalizing=lambda: True)
    assert runtime.calls == []
    step.__del__()
    assert runtime.calls == ["destroy exec", "destroy graph"]


def test_a_graphed_step_launches_directly_into_a_callers_capture(monkeypatch):
    pytest.importorskip("cupy")
    runtime, libcuda = _FakeRuntime(), _FakeLibcuda(capturing=True)
    step, direct = _graphed(monkeypatch, runtime, libcuda)
    for _ in range(3):
        step()
    assert direct == [("partial", 0x55), ("merge", 0x55)] * 3
    assert not runtime.calls and not libcuda.replays


def test_a_refused_graph_leaves_the_launches_direct_for_good(monkeypatch):
    pytest.importorskip("cupy")
    runtime, libcuda = _FakeRuntime(fail_capture=True), _FakeLibcuda()
    step, direct = _graphed(monkeypatch, runtime, libcuda)
    for _ in range(3):
        step()
    assert runtime.calls == ["begin"]  # tried once
    assert [where for _, where in direct] == [0x55] * 6 and not libcuda.replays


def test_with_replays_off_every_call_launches_directly(monkeypatch):
    pytest.importorskip("cupy")
    from opfacade._internal import graph_replay

    runtime, libcuda = _FakeRuntime(), _FakeLibcuda()
    step, direct = _graphed(monkeypatch, runtime, libcuda)
    monkeypatch.setattr(graph_replay, "REPLAY", False)
    for _ in range(3):
        step()
    assert [where for _, where in direct] == [0x55] * 6
    assert not runtime.calls and not libcuda.replays


def test_a_library_call_is_captured_at_its_library_capture_at_th_call(monkeypatch):
    pytest.importorskip("cupy")
    from opfacade._internal import graph_replay

    monkeypatch.setattr(graph_replay, "LIBRARY_CAPTURE_AT", 3)
    runtime, libcuda = _FakeRuntime(), _FakeLibcuda()
    _graphed(monkeypatch, runtime, libcuda)  # installs the fakes
    direct = []
    step = graph_replay.library_call(lambda on: [lambda: direct.append(on)], 0x55, 0)
    step()
    step()
    assert direct == [0x55, 0x55] and not runtime.calls
    step()  # the third: captured on the private stream, replayed on the caller's
    assert direct[2:] == [0x77] and libcuda.replays == [(0xE0, 0x55)]
