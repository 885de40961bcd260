"""`opfacade verify`'s record without a GPU (the device and each SKU's verification faked): a run
merges into the record already at its path (the SKUs it verified replaced, the others kept, the
run added to ``updates``), and writes after every SKU, so a run cut short keeps what it
finished. A device call once lost a whole-catalog run to its time limit (forty-fifth session)."""

from __future__ import annotations

import json

import pytest

from opfacade import verify
from opfacade.testing import VerificationResult
from opfacade.types import ArchSku

GPU = "NVIDIA Test GPU"
KV_APPEND = ["kv_append.nvrtc.f32", "kv_append.nvrtc.f16", "kv_append.nvrtc.bf16"]


def _result(sku: str, error: float) -> VerificationResult:
    return VerificationResult(sku=sku, descriptor={"batch": 1}, runs=3, max_rel_error=1e-12,
                              rel_errors={"k_cache": error}, bitwise_equal=True,
                              deterministic_declared=True, seconds=0.1)


@pytest.fixture
def device(monkeypatch):
    """A GPU that verifies kv_append's SKUs, each with an error of 0 unless ``errors`` says."""
    errors: dict[str, object] = {}

    def verify_sku(sku_id, *, runs, seed, device):
        outcome = errors.get(sku_id, 0.0)
        if isinstance(outcome, BaseException):
            raise outcome
        return [_result(sku_id, outcome)]

    monkeypatch.setattr(verify, "require_gpu", lambda what: 0)
    monkeypatch.setattr(verify, "device_name", lambda device: GPU)
    monkeypatch.setattr(verify, "device_arch", lambda device: ArchSku.sm90)
    monkeypatch.setattr(verify, "_versions", lambda: {"opfacade": "test"})
    monkeypatch.setattr(verify, "verify_sku", verify_sku)
    return errors


def _file(tmp_path) -> dict:
    return json.loads(verify.record_path(tmp_path, GPU).read_text())


def test_a_run_replaces_its_skus_and_keeps_the_others(device, tmp_path):
    earlier = {"gpu": GPU, "arch": "sm90", "date": "then", "versions": {}, "passed": True,
               "skus": [{"sku": "linear_forward.cublaslt.bf16", "passed": True},
                        {"sku": "kv_append.nvrtc.f16", "passed": True, "stale": True}],
               "updates": [{"date": "then", "skus": ["linear_forward.cublaslt.bf16"]}]}
    verify.record_path(tmp_path, GPU).write_text(json.dumps(earlier))
    device["kv_append.nvrtc.bf16"] = 1.0  # past its bound: this run fails
    record = verify.verify_all(op="kv_append", out_dir=tmp_path, echo=lambda line: None)
    assert [entry["sku"] for entry in record["skus"]] == KV_APPEND
    assert record["passed"] is False
    written = _file(tmp_path)
    assert [entry["sku"] for entry in written["skus"]] == [
        "linear_forward.cublaslt.bf16", "kv_append.nvrtc.f16", "kv_append.nvrtc.f32",
        "kv_append.nvrtc.bf16"]
    assert "stale" not in written["skus"][1]  # replaced by this run's entry
    assert written["passed"] is False
    assert written["updates"][0] == earlier["updates"][0]
    assert written["updates"][1]["skus"] == KV_APPEND
    assert written["updates"][1]["how"] == "opfacade verify --op kv_append --runs 3"


def test_a_run_cut_short_keeps_the_skus_it_finished(device, tmp_path):
    device["kv_append.nvrtc.f16"] = KeyboardInterrupt()  # the device call's time limit, say
    with pytest.raises(KeyboardInterrupt):
        verify.verify_all(op="kv_append", out_dir=tmp_path, echo=lambda line: None)
    written = _file(tmp_path)
    assert [entry["sku"] for entry in written["skus"]] == ["kv_append.nvrtc.f32"]
    assert written["passed"] is True
    assert written["updates"][-1]["skus"] == ["kv_append.nvrtc.f32"]


def test_another_gpus_or_an_unreadable_record_is_replaced_and_said_so(device, tmp_path):
    path = verify.record_path(tmp_path, GPU)
    lines: list[str] = []
    for content in ('{"gpu": "NVIDIA Other", "skus": []}', "{torn"):
        path.write_text(content)
        verify.verify_all(op="kv_append", out_dir=tmp_path, echo=lines.append)
        assert [entry["sku"] for entry in _file(tmp_path)["skus"]] == KV_APPEND
        assert len(_file(tmp_path)["updates"]) == 1
    assert any("not a record of" in line for line in lines)
    assert any("does not parse" in line for line in lines)
