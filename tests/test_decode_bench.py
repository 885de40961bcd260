"""The decode_attention and kv_append benchmarks without a GPU: which problems the rows run (the
seeded length set, its capacity, the page tables), the bytes each figure counts, which peers a
row names and how a failing one becomes a note, where the NaN padding goes and that the peers'
caches stay finite, the torch peer's result against float64, the cuDNN paged graph as the
frontend is told it, and where kv_append's tokens land."""

from __future__ import annotations

import inspect
import math
import types

import numpy as np
import pytest

from opfacade._bench import decode_attention as decode
from opfacade._bench import decode_peers as peers
from opfacade._bench import kv_append as append
from opfacade._bench.common import BenchRow, Timings

GIB = 1 << 30


# -- the problems ---------------------------------------------------------------------------------

def test_the_varied_lengths_are_the_seeded_draw_within_capacity():
    lengths = decode.varied_lengths()
    expected = np.random.default_rng(13).integers(1, 8192, 64, endpoint=True)
    assert np.array_equal(lengths, expected) and np.array_equal(lengths, decode.varied_lengths())
    assert lengths.shape == (64,) and lengths.min() >= 1 and lengths.max() <= 8192
    assert len(set(lengths.tolist())) > 32  # a spread, not one length repeated


def test_the_full_decode_rows_are_the_issues_problems():
    found = {(c.batch, c.capacity, c.cache, c.page_size, c.q_len, c.varied)
             for c in decode.cases()}
    expected = {(b, s, "contiguous", None, 1, False) for b, s in decode.FULL_SHAPES}
    expected |= {(b, s, "paged", ps, 1, False) for b, s in decode.FULL_SHAPES for ps in (16, 64)}
    expected |= {(64, 8192, "contiguous", None, 1, True), (64, 8192, "paged", 16, 1, True),
                 (64, 8192, "paged", 64, 1, True), (64, 4096, "contiguous", None, 4, False),
                 (64, 4096, "paged", 16, 4, False)}
    assert found == expected and len(decode.cases()) == len(expected)
    assert {(64, 4096), (8, 32768), (256, 1024), (1, 32768)} == set(decode.FULL_SHAPES)


@pytest.mark.parametrize("quick", [False, True])
def test_every_decode_case_fits_its_descriptor(quick):
    rows = decode.cases(quick)
    assert len(rows) <= 3 if quick else len(rows) == 17
    for case in rows:
        desc = case.descriptor()
        lengths = case.lengths()
        assert desc.capacity == case.capacity and desc.q_len == case.q_len
        assert (desc.heads_q, desc.heads_kv, desc.head_dim, desc.element.value) == (
            32, 8, 128, "bf16")
        assert lengths.shape == (case.batch,)
        assert lengths.min() >= case.q_len and lengths.max() <= case.capacity
        if not case.varied:
            assert (lengths == case.capacity).all()
        if case.paged:
            assert case.max_pages * case.page_size == case.capacity


def test_page_tables_are_a_seeded_permutation_of_the_pool():
    table = decode.page_order(64, 256)
    assert table.dtype == np.int32 and table.shape == (64, 256)
    assert np.array_equal(np.sort(table.ravel()), np.arange(64 * 256))
    assert np.array_equal(table, decode.page_order(64, 256))
    assert not np.array_equal(table.ravel(), np.arange(64 * 256))  # scattered, not in order


def test_every_kv_append_case_fits_its_descriptor():
    found = {(c.batch, c.cache, c.q_len, c.capacity, c.page_size) for c in append.cases()}
    assert found == {(64, "contiguous", 1, 4096, None), (64, "paged", 1, 4096, 16),
                     (256, "contiguous", 1, 4096, None), (256, "paged", 1, 4096, 16),
                     (64, "contiguous", 4, 4096, None), (64, "paged", 4, 4096, 16)}
    for case in append.cases() + append.cases(quick=True):
        desc = case.descriptor()
        lengths = case.lengths()
        assert desc.capacity == case.capacity and desc.heads_kv == 8 and desc.head_dim == 128
        assert np.array_equal(lengths, case.lengths())
        assert lengths.min() >= case.q_len and lengths.max() <= case.capacity


# -- the figures ----------------------------------------------------------------------------------

def test_the_kv_bytes_are_every_sequences_tokens_in_k_and_v():
    full = decode.DecodeCase(64, 4096)
    assert decode.kv_bytes(full.lengths()) == 64 * 4096 * 8 * 128 * 2 * 2 == GIB
    assert decode.kv_bytes(decode.DecodeCase(1, 32768, "paged", 64).lengths()) == GIB // 8
    varied = decode.varied_lengths()
    assert decode.kv_bytes(varied) == int(varied.sum()) * 8 * 128 * 4
    # q_len new tokens are already counted in seq_lens: the step reads no more than its lengths
    assert decode.kv_bytes(decode.DecodeCase(64, 4096, q_len=4).lengths()) == GIB


def test_the_decode_figure_is_a_fraction_of_the_copy_counting_read_and_write():
    """A copy of 1 GiB in 1 ms reads and writes 2 GiB: 2.15 TB/s. Reading 1 GiB of K and V in
    0.5 ms is the same rate, and in 1 ms half of it."""
    rate = decode.copy_tbps(GIB, 1.0)
    assert rate == pytest.approx(2 * GIB / 1e-3 / 1e12)
    assert decode._figure(GIB, rate)(0.5) == "2.15 TB/s, 100.0% of copy"
    assert decode._figure(GIB, rate)(1.0) == "1.07 TB/s, 50.0% of copy"


def test_kv_append_writes_k_and_v_of_the_new_tokens():
    assert append.AppendCase(64).written_bytes() == 64 * 1 * 8 * 128 * 2 * 2 == 262144
    assert append.AppendCase(256, "paged", page_size=16).written_bytes() == 4 * 262144
    assert append.AppendCase(64, q_len=4).written_bytes() == 4 * 262144


# -- the peers ------------------------------------------------------------------------------------

def test_each_row_names_its_peers():
    assert decode.PEER_NAMES == ("torch sdpa", "cudnn paged")
    assert append.PEER_NAMES == ("torch index_put",)
    for case in decode.cases():
        if not case.paged:
            assert case.peers == ("torch sdpa",)  # several new tokens through its mask
        else:
            assert case.peers == (("cudnn paged",) if case.q_len == 1 else ())


def test_the_torch_peers_mask_is_the_decode_contracts_causal_rule():
    torch = pytest.importorskip("torch")
    seq_lens = torch.tensor([5, 2, 3], dtype=torch.int32)
    mask = peers.new_token_mask(torch, seq_lens, 3, 6)
    assert tuple(mask.shape) == (3, 1, 3, 6)
    for s, n in enumerate((5, 2, 3)):
        for t in range(3):
            pos = n - 3 + t  # where new token t sits; a negative position sees no key
            assert mask[s, 0, t].tolist() == [key <= pos for key in range(6)]


def test_a_row_builds_the_peers_it_names_and_a_failing_one_is_a_note(monkeypatch):
    made = []

    def fake(name):
        def build(*args):
            made.append(name)
            return peers.Peer(lambda: None, None)
        return build

    def declines(*args):
        raise RuntimeError("cuDNN says no\nand a long tail")

    monkeypatch.setattr(decode, "torch_sdpa", fake("torch sdpa"))
    monkeypatch.setattr(decode, "cudnn_paged", declines)
    contiguous = types.SimpleNamespace(case=decode.DecodeCase(8, 1024))
    paged = types.SimpleNamespace(case=decode.DecodeCase(8, 1024, "paged", 16))
    speculative = types.SimpleNamespace(case=decode.DecodeCase(8, 1024, "paged", 16, q_len=4))
    for p in (contiguous, paged, speculative):
        for name in ("q", "peer_k", "peer_v", "lengths", "seq_lens", "table"):
            setattr(p, name, None)
    notes: list[str] = []
    assert list(decode._peers(None, None, contiguous, notes)) == ["torch sdpa"]
    assert decode._peers(None, None, paged, notes) == {}
    assert decode._peers(None, None, speculative, notes) == {}
    assert made == ["torch sdpa"]
    assert notes == ["cudnn paged: cuDNN says no", "no peer at q_len 4 on a paged cache: cudnn "
                     "paged runs one query per sequence here"]


def test_a_row_without_ours_keeps_the_peers_and_says_so(monkeypatch):
    timings = Timings({"torch sdpa": 2.0}, {"torch sdpa": 0.01}, {}, [], "", "torch sdpa")
    monkeypatch.setattr(decode, "time_contestants", lambda fns, reps, ours, settle=None: timings)
    row = decode.peers_only_row("decode_attention", "c", {"torch sdpa": None}, 3,
                                lambda ms: f"{ms:.1f} ms", ["ours: no SKU: x"])
    assert isinstance(row, BenchRow) and math.isnan(row.ours_ms)
    assert row.figure == "no ours; torch sdpa 2.0 ms" and row.peers_ms == {"torch sdpa": 2.0}
    assert row.notes == "ours: no SKU: x"
    empty = decode.peers_only_row("kv_append", "c", {}, 3, str, ["a"])
    assert empty.figure == "nothing ran" and empty.notes == "a"


@pytest.mark.parametrize(("signature", "expected"), [
    ("def sdpa(q, k, v, generate_stats=None, is_inference=None): pass",
     {"generate_stats": False}),
    ("def sdpa(q, k, v, is_inference=True, attn_scale=None): pass", {"is_inference": True}),
    ("def sdpa(*args, name='', **kwargs): pass", {"generate_stats": False}),  # frontend 1.32
    ("def sdpa(q, k, v): pass", {"is_inference": True}),
])
def test_the_stats_switch_is_read_off_the_signature(signature, expected):
    scope: dict = {}
    exec(signature, scope)
    assert peers.stats_option(scope["sdpa"]) == expected


def test_a_compiled_sdpa_without_a_signature_is_read_from_its_docstring():
    class Compiled:
        __doc__ = "generate_stats (Optional[bool]): ..."

        @property
        def __signature__(self):
            raise ValueError("no signature found for builtin")

        def __call__(self, *args, **kwargs):
            raise AssertionError("never called")

    with pytest.raises(ValueError):
        inspect.signature(Compiled())
    assert peers.stats_option(Compiled()) == {"generate_stats": False}


class _RecordingGraph:
    """What describe_paged tells a frontend graph, recorded."""

    def __init__(self):
        self.tensors, self.sdpa_kwargs = {}, None

    def tensor(self, name, dim, stride, data_type):
        self.tensors[name] = (list(dim), list(stride), data_type)
        return name

    def sdpa(self, q, k, v, name="", generate_stats=None, **kwargs):
        self.sdpa_kwargs = dict(q=q, k=k, v=v, generate_stats=generate_stats, **kwargs)
        out = types.SimpleNamespace(calls=[])
        for setter in ("set_output", "set_dim", "set_stride", "set_data_type"):
            setattr(out, setter, lambda value, s=setter, o=out: (o.calls.append((s, value)), o)[1])
        return out, None


def test_the_cudnn_paged_graph_describes_nhd_pools_and_page_tables():
    dims = peers.PagedDims(batch=64, heads_q=32, heads_kv=8, head_dim=128, pages=64 * 256,
                           page_size=16, max_pages=256)
    fake_cudnn = types.SimpleNamespace(data_type=types.SimpleNamespace(BFLOAT16="bf16",
                                                                       INT32="i32"))
    g = _RecordingGraph()
    t = peers.describe_paged(g, fake_cudnn, dims)
    assert g.tensors["q"] == ([64, 32, 1, 128], [32 * 128, 128, 32 * 128, 1], "bf16")
    assert g.tensors["k_pool"] == ([64 * 256, 8, 16, 128], [16 * 8 * 128, 128, 8 * 128, 1],
                                   "bf16")
    assert g.tensors["v_pool"] == g.tensors["k_pool"]
    assert g.tensors["page_table_k"] == ([64, 1, 256, 1], [256, 256, 1, 1], "i32")
    assert g.tensors["seq_len_kv"] == ([64, 1, 1, 1], [1, 1, 1, 1], "i32")
    kw = g.sdpa_kwargs
    assert kw["paged_attention_k_table"] == "page_table_k"
    assert kw["paged_attention_v_table"] == "page_table_v"
    assert kw["paged_attention_max_seq_len_kv"] == 4096 and kw["use_padding_mask"] is True
    assert kw["seq_len_q"] == "seq_len_q" and kw["seq_len_kv"] == "seq_len_kv"
    assert kw["generate_stats"] is False and kw["attn_scale"] == pytest.approx(128 ** -0.5)
    assert not any("causal" in key or "diagonal" in key for key in kw)
    assert ("set_dim", [64, 32, 1, 128]) in t["out"].calls


def test_the_cudnn_paged_graph_passes_the_installed_frontends_own_checks():
    cudnn = pytest.importorskip("cudnn")
    if not hasattr(cudnn, "pygraph"):
        pytest.skip("this cudnn frontend has no pygraph")
    types_ = cudnn.data_type
    g = cudnn.pygraph(io_data_type=types_.BFLOAT16, intermediate_data_type=types_.FLOAT,
                      compute_data_type=types_.FLOAT)
    peers.describe_paged(g, cudnn, peers.PagedDims(4, 32, 8, 128, 4 * 8, 16, 8))
    g.validate()  # the frontend's paged rules: lengths on both sides, the max kv length


# -- tensors, on torch's CPU build ----------------------------------------------------------------

@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_nan_fills_exactly_the_positions_past_each_length_and_the_peers_stay_finite(cache):
    torch = pytest.importorskip("torch")
    case = decode.DecodeCase(5, 64, cache, 16 if cache == "paged" else None, varied=True)
    p = decode.decode_problem(torch, case, device="cpu")
    assert p.lengths == decode.varied_lengths(5, 64).tolist()
    assert bool(torch.isfinite(p.peer_k).all()) and bool(torch.isfinite(p.peer_v).all())
    table = None if p.table is None else p.table.numpy()
    for s, n in enumerate(p.lengths):
        for pos in range(case.capacity):
            where = (s, pos) if table is None else (table[s, pos // 16], pos % 16)
            for ours, theirs in ((p.k, p.peer_k), (p.v, p.peer_v)):
                if pos >= n:
                    assert bool(torch.isnan(ours[where]).all())
                else:
                    assert torch.equal(ours[where], theirs[where])
    full = decode.decode_problem(torch, decode.DecodeCase(2, 32), device="cpu")
    assert full.peer_k is full.k and not bool(torch.isnan(full.k).any())


@pytest.mark.parametrize("varied", [False, True])
def test_the_torch_peer_is_attention_over_each_sequences_tokens(varied):
    torch = pytest.importorskip("torch")
    p = decode.decode_problem(torch, decode.DecodeCase(4, 48, varied=varied), device="cpu")
    peer = peers.torch_sdpa(torch, p.q, p.peer_k, p.peer_v, p.lengths, p.seq_lens)
    assert peer.out.shape == p.q.shape
    for s, n in enumerate(p.lengths):
        q = p.q[s, 0].double()  # [Hq, D]
        k, v = (x[s, :n].double().repeat_interleave(4, dim=1) for x in (p.peer_k, p.peer_v))
        weights = (torch.einsum("hd,nhd->hn", q, k) / math.sqrt(128)).softmax(-1)
        expected = torch.einsum("hn,nhd->hd", weights, v)
        assert (peer.out[s, 0].double() - expected).abs().max() < 1e-2  # bf16 output
    assert torch.equal(peer.call().transpose(1, 2), peer.out)


@pytest.mark.parametrize("case", append.cases(quick=True) + [
    append.AppendCase(6, "paged", q_len=4, capacity=64, page_size=16),
    append.AppendCase(6, q_len=4, capacity=64)])
def test_kv_append_tokens_land_at_seq_len_minus_q_len_plus_t(case):
    lengths = case.lengths()
    table = decode.page_order(case.batch, case.max_pages) if case.paged else None
    rows, tokens = append.destinations(case, lengths, table)
    for s in range(case.batch):
        for t in range(case.q_len):
            position = lengths[s] - case.q_len + t
            expected = (table[s, position // 16], position % 16) if case.paged else (s, position)
            assert (rows[s, t], tokens[s, t]) == expected
    torch = pytest.importorskip("torch")
    p = append.append_problem(torch, case, device="cpu")
    append.torch_index_put(p)
    assert append.wrote_every_token(torch, p)
    p.k_cache[p.index[0][0, 0], p.index[1][0, 0]] += 1
    assert not append.wrote_every_token(torch, p)


def test_kv_append_rows_take_their_copy_out_of_the_contestants():
    """The copy each kv_append row divides by is timed among the contestants (the same rounds and
    graph replays), then leaves the row: not a peer, and its time is the figure's yardstick."""
    timings = Timings({"ours": 2.0e-3, "torch index_put": 7.0e-3, append.COPY: 1.3e-3},
                      {"ours": 9e-3, "torch index_put": 2e-2, append.COPY: 8e-3},
                      {"ours": 1.5e-3, "torch index_put": 6.9e-3, append.COPY: 1.2e-3},
                      ["ours", append.COPY, "torch index_put"], "", "ours")
    rest, copy_ms, how = append.take_out(timings, append.COPY)
    assert (copy_ms, how) == (1.2e-3, "from a CUDA graph")
    assert append.COPY not in {*rest.gpu_ms, *rest.host_ms, *rest.graph_ms, *rest.host_bound}
    row = rest.row("kv_append", "c", lambda ms: f"{copy_ms / ms:.1%} of copy")
    assert row.figure == "80.0% of copy" and set(row.peers_ms) == {"torch index_put"}
    assert row.host_bound == ["ours", "torch index_put"]
    bursts = Timings({"ours": 2.0e-3, append.COPY: 1.6e-3}, {"ours": 1e-4, append.COPY: 1e-4},
                     {}, [], "", "ours")
    assert append.take_out(bursts, append.COPY)[1:] == (1.6e-3, "in bursts")
