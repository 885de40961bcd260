"""The kq decode tile's fragment layouts, modelled lane by lane in NumPy
(scripts/decode_kq_tile_model.py, float64): the 8-row build's and the 4-row build's, whose lanes
read K in whole 128-byte lines and add each score's two halves of D across lanes
(native/decode_kq.cuh's pair_scores). No GPU: the model checks the index mappings the kernel
is written from, not its rounding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _model():
    path = Path(__file__).parents[1] / "scripts" / "decode_kq_tile_model.py"
    spec = importlib.util.spec_from_file_location("decode_kq_tile_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODEL = _model()


@pytest.mark.parametrize(("rows", "paired"), [(8, False), (4, False), (1, False), (4, True),
                                              (3, True), (1, True)])
def test_the_kq_layouts_give_k_q_and_v_p_products(rows, paired):
    MODEL.check(rows, seed=rows + 10 * paired, paired=paired)


def test_the_paired_scores_fail_with_a_wrong_lane_for_the_second_key(monkeypatch):
    """The model can fail: the second key's move from lane ^ 16 taken from lane ^ 8 instead."""
    real = MODEL.shfl_xor
    monkeypatch.setattr(MODEL, "shfl_xor",
                        lambda values, mask: real(values, 8 if mask == 16 else mask))
    with pytest.raises(AssertionError):
        MODEL.check(4, seed=3, paired=True)


def test_the_paired_layout_reads_four_keys_of_whole_lines_an_instruction():
    """Each load instruction (block, h, p) of the 4-row build: 4 keys, each read by 8 lanes as
    128 contiguous bytes starting on a line."""
    for block in range(2):
        for h in range(2):
            for p in range(2):
                reads = {}
                for lane in range(32):
                    key, vector = MODEL.paired_load(lane, block, h, p)
                    reads.setdefault(key, []).append(16 * vector)
                assert len(reads) == 4
                for offsets in reads.values():
                    start = min(offsets)
                    assert start % 128 == 0 and sorted(offsets) == list(range(start, start + 128,
                                                                               16))
