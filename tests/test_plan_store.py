"""cuDNN's plan store without a GPU (a stand-in frontend graph): an entry written for one setup
comes back only for that setup; torn, foreign or refused entries are misses; the cache CLI lists
and clears it. The real serialize/deserialize round trip and the warm start's speed are
test_torch_gpu.py's."""

from __future__ import annotations

import contextlib

import pytest

from opfacade._backends.cudnn import graphs, plan_store, runtime
from opfacade.caches import clear_disk_caches, disk_caches
from opfacade.cli import main
from opfacade.ops.sdpa import SdpaDescriptor


class Graph:
    """What the store uses of a frontend graph."""

    refuse = False

    def __init__(self, handle=None, plan=b""):
        self.plan = plan

    def serialize(self):
        return list(b"plan:" + self.plan)

    def deserialize(self, handle, data):
        if Graph.refuse:
            raise RuntimeError("not a plan for this cuDNN")
        self.plan = bytes(data)

    def get_workspace_size(self):
        return 0


@pytest.fixture
def store(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFACADE_CACHE_DIR", str(tmp_path))  # this test's own, empty
    class Cudnn:
        __version__ = "1.32.0"
        pygraph = Graph

    monkeypatch.setattr(plan_store.runtime, "cudnn_module", lambda: Cudnn)
    monkeypatch.setattr(plan_store.runtime, "backend_version", lambda: 91900)
    monkeypatch.setattr(plan_store, "device_name", lambda device: "H100")
    monkeypatch.setattr(plan_store, "device_sm_count", lambda device: 132)
    Graph.refuse = False
    monkeypatch.setattr(plan_store, "_LOADED", set())
    return plan_store


def key(seq=64, device=0):
    desc = SdpaDescriptor(batch=1, heads_q=2, heads_kv=2, seq_q=seq, seq_kv=seq, head_dim=64,
                          element="bf16")
    return graphs.GraphKey("forward", desc, device, False)


def test_a_stored_plan_comes_back_for_its_key_only(store):
    store.store(key(), Graph(plan=b"one"))
    assert store.loaded_count() == 0
    # The process that stored it loads it too (a selection after its plan was freed), and as
    # often as it asks; loaded_count counts distinct graphs.
    assert store.load(key(), None).plan == b"plan:one"
    assert store.load(key(), None).plan == b"plan:one"
    assert store.loaded_count() == 1
    assert store.load(key(seq=128), None) is None
    entry = next(store.directory().glob("*.plan"))
    other = key(seq=128)
    entry.rename(store._path(store._identity(other)))  # a file under another key's name
    assert store.load(other, None) is None


def test_an_entry_serves_every_device_of_the_model_it_names(store):
    """The identity holds the device's model and multiprocessor count, not its index: an entry
    stored for cuda:0 loads for cuda:1 of the same model, in the same process too
    (tests/test_plan_store_gpu.py runs that on two GPUs), and never for another model."""
    store.store(key(device=0), Graph(plan=b"one"))
    assert store.load(key(device=1), None).plan == b"plan:one"
    assert store.load(key(device=0), None).plan == b"plan:one"
    store.device_name = lambda device: "H100" if device == 0 else "H200"
    assert store.load(key(device=1), None) is None
    assert store.load(key(device=0), None).plan == b"plan:one"


def test_torn_refused_and_disabled_entries_are_misses(store, monkeypatch):
    store.store(key(), Graph(plan=b"one"))
    entry = next(store.directory().glob("*.plan"))
    Graph.refuse = True
    assert store.load(key(), None) is None
    Graph.refuse = False
    entry.write_bytes(entry.read_bytes()[:-2])
    assert store.load(key(), None) is None
    store.store(key(), Graph(plan=b"two"))
    monkeypatch.setenv(store.SWITCH_VARIABLE, "0")
    assert store.load(key(), None) is None


def test_ragged_and_paged_graphs_are_stored_under_their_layout(store):
    from opfacade._backends.cudnn.decode import CacheLayout, DecodeKey
    from opfacade._backends.cudnn.ragged import RaggedKey, RaggedLayout
    from opfacade.contracts.decode_attention import DecodeAttentionDescriptor
    from opfacade.contracts.varlen_attention import VarlenAttentionDescriptor

    varlen = VarlenAttentionDescriptor(batch=4, heads_q=4, heads_kv=2, head_dim=64,
                                       max_seqlen_q=256, max_seqlen_kv=256, element="bf16")
    ragged = [RaggedKey("forward", varlen, 0, False,
                        RaggedLayout((("q", stride, 64), ("k", 128, 64)))) for stride in (256, 512)]
    decode = DecodeAttentionDescriptor(batch=4, element="bf16", cache="paged", page_size=16,
                                       max_pages=8, heads_q=8, heads_kv=2, head_dim=128)
    paged = [DecodeKey("paged_decode", decode, 0, False, CacheLayout.compact(decode)),
             DecodeKey("paged_decode", decode, 0, False,
                       CacheLayout((1024, 128), (1024, 128), 64))]
    for one, other in (ragged, paged):
        store.store(one, Graph(plan=b"one"))
        assert store.load(other, None) is None  # another layout: another graph
        assert store.load(one, None).plan == b"plan:one"


def test_the_cache_command_lists_and_clears(store, capsys):
    store.store(key(), Graph(plan=b"one"))
    assert main(["cache"]) == 0
    assert "cuDNN plans         1 entries" in capsys.readouterr().out
    assert main(["cache", "--clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert [cache.size() for cache in disk_caches()][1] == (0, 0)
    assert clear_disk_caches() == 0


def test_a_build_binds_the_handle_to_a_stream_that_exists_before_it_deserializes(monkeypatch):
    """A handle keeps its last run's stream, which the caller may have destroyed since; the
    frontend's deserialize asked that stream whether it was capturing and failed or segfaulted
    (H200, forty-fifth session: tests/test_plan_store_gpu.py has the GPU case). So a build binds
    the handle to runtime.BUILD_STREAM before it loads or builds anything."""
    events = []
    monkeypatch.setattr(graphs, "on_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "available", lambda: None)
    monkeypatch.setattr(runtime, "backend_version", lambda: 91900)
    monkeypatch.setattr(runtime, "not_supported_types", lambda: (NotImplementedError,))
    monkeypatch.setattr(runtime, "handle_for", lambda device: "handle")
    monkeypatch.setattr(runtime, "set_stream",
                        lambda handle, stream: events.append(("bind", handle, stream)))

    def load(key, handle):
        events.append(("load", handle))
        return "stored graph"

    monkeypatch.setattr(graphs.plan_store, "load", load)

    class Declared:
        def adopt(self, stored, how):
            events.append(("adopt", stored))
            return "built"

    class Key:
        device = 0
        direction = "forward"

        def declare(self, handle):
            events.append(("declare", handle))
            return Declared()

    assert graphs._build(Key()) == "built"
    assert events == [("bind", "handle", runtime.BUILD_STREAM), ("declare", "handle"),
                      ("load", "handle"), ("adopt", "stored graph")]
