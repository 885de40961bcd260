"""The catalog is generated from the code and must not drift; the CLI works without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opfacade.catalog import all_skus, generated_files
from opfacade.cli import main

CATALOG = Path(__file__).resolve().parents[1] / "catalog"
REQUIRED = {"id", "category", "op", "element", "backend", "arch", "precision_guarantee"}
GUARANTEE = {"math_precision", "accumulator", "deterministic", "bit_stable", "max_rel_error"}


@pytest.mark.parametrize("name", sorted(generated_files()))
def test_committed_catalog_matches_the_code(name):
    committed = (CATALOG / name).read_text()
    assert committed == generated_files()[name], (
        f"catalog/{name} drifted from the code: run `python -m opfacade.catalog --write catalog`")


def test_sku_ids_are_unique():
    ids = [sku.id for sku in all_skus()]
    assert len(ids) == len(set(ids))


def test_catalog_json_lists_sku_objects(capsys):
    assert main(["catalog", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(row.keys() >= REQUIRED for row in rows)
    assert all(row["precision_guarantee"].keys() >= GUARANTEE for row in rows)
    ours = {row["id"] for row in rows}
    assert {"alibi_forward.nvrtc.bf16", "alibi_backward.nvrtc.f64"} <= ours


def test_catalog_table_and_op_filter(capsys):
    assert main(["catalog", "--op", "alibi_backward"]) == 0
    out = capsys.readouterr().out
    assert "alibi_backward.nvrtc.f16" in out and "alibi_forward" not in out


def test_explain_without_a_gpu(capsys):
    code = main(["explain", "alibi_backward", "batch=2", "heads=4", "query_len=16",
                 "key_len=16", "element=f32", "--arch", "sm90"])
    out = capsys.readouterr().out
    assert code == 0
    assert "alibi_backward.nvrtc.f32" in out and "chosen" in out
    assert "reference_is_oracle" in out


def test_explain_json_and_bad_fields(capsys):
    assert main(["explain", "alibi_forward", "batch=1", "heads=1", "query_len=1", "key_len=1",
                 "element=fp8_e5m2", "--arch", "sm90", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {c["code"] for c in report["candidates"]} >= {"element_unsupported"}
    assert main(["explain", "alibi_forward", "batch=0", "heads=1", "query_len=1", "key_len=1",
                 "element=f32", "--arch", "sm90"]) == 2
    assert "batch" in capsys.readouterr().err
