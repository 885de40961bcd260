"""The house every family lives in: one registry table, contracts that backends import, SKU ids
from one scheme, owned caches with one clear, plans that release what they hold, and logging."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import types

import numpy as np
import pytest

import opfacade
from opfacade import _registry as registry
from opfacade import contracts
from opfacade._internal.contract import OpContract
from opfacade._internal.sku import SkuImpl
from opfacade.contracts import alibi
from opfacade.plan import PLAN_CACHE, Plan, plan_class
from opfacade.types import BackendKind

SHAPE = dict(batch=2, heads=4, query_len=16, key_len=16, element="f32")


def contract_modules() -> list[types.ModuleType]:
    return [importlib.import_module(f"opfacade.contracts.{info.name}")
            for info in pkgutil.iter_modules(contracts.__path__)
            if hasattr(importlib.import_module(f"opfacade.contracts.{info.name}"), "OPS")]


def test_every_contract_module_is_a_family_in_the_table():
    in_table = {family.contract for family in registry.FAMILIES}
    assert set(contract_modules()) == in_table
    assert [f.name for f in registry.FAMILIES] == [m.__name__.rsplit(".", 1)[1]
                                                   for m in (f.contract for f in registry.FAMILIES)]


def test_each_family_has_one_name_everywhere():
    """Module, ops, SKU ids, plans, tests and bench rows all start with the family's name (an op
    is the family's name, or the name and a suffix: decode_attention, sdpa_forward)."""
    for family in registry.FAMILIES:
        ops = family.ops()
        assert all(op.name == family.name or op.name.startswith(family.name + "_")
                   for op in ops)
        for op in ops:
            assert all(impl.sku.id.startswith(op.name + ".") for impl in op.skus)
            assert plan_class(op.name).__name__.lower().startswith(family.name.replace("_", ""))
        importlib.import_module(f"opfacade.ops.{family.name}")
        importlib.import_module(f"opfacade._bench.{family.name}")


def test_sku_ids_follow_the_one_scheme():
    for op in registry.all_ops():
        for impl in op.skus:
            sku = impl.sku
            if sku.backend is BackendKind.reference:
                assert sku.id == f"{op.name}.reference"
                continue
            parts = sku.id.split(".")
            assert parts[0] == op.name and parts[1].split("+")[0] == sku.backend.value
            assert parts[2] == sku.element.value and len(parts) <= 4


def test_a_family_whose_tables_disagree_with_its_contract_is_an_import_error():
    impl = registry.op_named("alibi_forward").skus[0]
    stray = registry.Family("alibi", alibi, ({"alibi_sideways": (impl,)},))
    with pytest.raises(ImportError, match="alibi_sideways"):
        stray.ops()
    empty = registry.Family("alibi", alibi, ({"alibi_forward": (impl,)},))
    with pytest.raises(ImportError, match="alibi_backward has no SKU"):
        empty.ops()
    misfiled = registry.Family("alibi", alibi, ({"alibi_forward": (impl,),
                                                "alibi_backward": (impl,)},))
    with pytest.raises(ImportError, match="listed under alibi_backward"):
        misfiled.ops()


def test_an_op_missing_from_the_table_is_an_import_error():
    with pytest.raises(ImportError, match="FAMILIES"):
        plan_class("no_such_family_forward")


def test_plan_classes_are_made_once_per_op():
    assert plan_class("alibi_forward") is opfacade.AlibiForwardPlan
    plan = Plan.select(alibi.AlibiForwardDescriptor(**SHAPE), arch="sm90")
    assert type(plan) is opfacade.AlibiForwardPlan


def test_backends_take_their_family_contract_types():
    """Each SKU class is parametrised by its family's descriptor (SkuImpl[Descriptor])."""
    for op in registry.all_ops():
        for impl in op.skus:
            assert isinstance(impl, SkuImpl)
            assert isinstance(op, OpContract) and op.descriptor.__module__.startswith(
                "opfacade.contracts.")


def test_old_sdpa_names_warn_and_resolve():
    with pytest.warns(DeprecationWarning, match="opfacade.sdpa"):
        assert opfacade.attention is opfacade.sdpa
    with pytest.warns(DeprecationWarning):
        assert opfacade.AttentionDescriptor is opfacade.SdpaDescriptor
    with pytest.raises(AttributeError):
        opfacade.no_such_name  # noqa: B018


# -- caches and lifetime --------------------------------------------------------------------------

def test_clear_caches_empties_the_plan_cache():
    desc = alibi.AlibiForwardDescriptor(**SHAPE)
    first = Plan.cached(desc, device="cpu")
    assert Plan.cached(desc, device="cpu") is first and len(PLAN_CACHE) >= 1
    opfacade.clear_caches()
    assert len(PLAN_CACHE) == 0
    assert Plan.cached(desc, device="cpu") is not first


def test_free_releases_what_the_sku_built_for_its_problem(monkeypatch):
    desc = alibi.AlibiForwardDescriptor(**SHAPE)
    plan = Plan.select(desc, arch="sm90")
    released = []
    monkeypatch.setattr(type(plan._impl), "release", lambda self, d: released.append(d))
    plan.free()
    plan.free()  # safe twice, releases once
    assert released == [desc]
    with pytest.raises(opfacade.PlanFreed):
        plan.can_implement(None)


# -- logging --------------------------------------------------------------------------------------

def test_selection_and_the_plan_cache_log_at_debug(caplog):
    opfacade.clear_caches()
    desc = alibi.AlibiBackwardDescriptor(**SHAPE)
    with caplog.at_level(logging.DEBUG, logger="opfacade"):
        Plan.cached(desc, device="cpu")
        Plan.cached(desc, device="cpu")
        Plan.explain(desc, arch="sm90")
    text = caplog.text
    assert "plan cache miss" in text and "plan cache hit" in text
    assert "select alibi_backward on host: chose alibi_backward.reference" in text
    assert "alibi_backward.nvrtc.f32: needs_gpu" in text
    assert "select alibi_backward on sm90: chose alibi_backward.nvrtc.f32" in text


def test_host_plans_run_through_the_prepared_path():
    desc = alibi.AlibiForwardDescriptor(**SHAPE)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 4, 16, 16)).astype(np.float32)
    out = np.empty_like(x)
    slopes = np.linspace(0.1, 0.5, 4).astype(np.float32)
    plan = Plan.select(desc, device="cpu")
    plan.run(opfacade.AlibiForwardArgs(x, slopes, out))
    prepared_out = np.empty_like(x)
    plan.prepare(opfacade.AlibiForwardArgs(x, slopes, prepared_out))()
    np.testing.assert_array_equal(out, prepared_out)
