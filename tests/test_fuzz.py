"""Property-based: random descriptors, preferences and arguments fed to select, explain and
can_implement produce valid plans or opfacade's typed errors, never anything else."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfacade import (
    AlibiBackwardArgs,
    AlibiBackwardDescriptor,
    AlibiForwardArgs,
    AlibiForwardDescriptor,
    OpFacadeError,
    Plan,
)
from opfacade.plan import ExplainReport

extent = st.one_of(st.integers(-3, 9), st.sampled_from([0, 1 << 24, "3", 2.5, None, True]))
element = st.one_of(st.sampled_from(["f64", "f32", "f16", "bf16", "fp8_e4m3", "i32", "tf32"]),
                    st.text(max_size=4))
fields = st.fixed_dictionaries(
    {"batch": extent, "heads": extent, "query_len": extent, "key_len": extent,
     "element": element},
    optional={"in_place": st.booleans(), "need_input_grad": st.booleans(),
              "need_slope_grad": st.booleans(), "bogus": st.integers()})
preference = st.one_of(st.none(), st.fixed_dictionaries({}, optional={
    "deterministic": st.booleans(), "workspace_limit": st.integers(-5, 1 << 20),
    "backends": st.lists(st.sampled_from(["nvrtc", "reference", "cudnn", "bogus"]), max_size=2),
    "objective": st.sampled_from(["speed", "memory", "fast"]),
    "max_rel_error": st.floats(-1, 1e-2),
}))
target = st.sampled_from([{"arch": "sm90"}, {"arch": "sm80"}, {"arch": "sm_100"},
                          {"device": "cpu"}, {"arch": "sm7"}])
host_dtype = st.sampled_from([np.float64, np.float32, np.float16, np.int32])


def _descriptor(kind, raw):
    cls = AlibiForwardDescriptor if kind == "forward" else AlibiBackwardDescriptor
    keep = {"in_place"} if kind == "forward" else {"need_input_grad", "need_slope_grad"}
    data = {k: v for k, v in raw.items()
            if k not in {"in_place", "need_input_grad", "need_slope_grad"} or k in keep}
    return cls(**data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["forward", "backward"]), raw=fields, pref=preference, where=target,
       shape_jitter=st.lists(st.integers(-1, 1), min_size=4, max_size=4), dtype=host_dtype,
       drop=st.sampled_from([None, 1, 2]))
def test_selection_and_checks_only_raise_typed_errors(kind, raw, pref, where, shape_jitter,
                                                      dtype, drop):
    try:
        desc = _descriptor(kind, raw)
        report = Plan.explain(desc, pref, **where)
        assert isinstance(report, ExplainReport) and len(report.verdicts) >= 1
        plan = Plan.select(desc, pref, **where)
    except OpFacadeError:
        return
    assert plan.sku.id == report.chosen.sku.id
    assert plan.workspace_size >= 0
    if desc.batch * desc.heads * desc.query_len * desc.key_len > 4096:
        return  # keep host arrays small
    shape = tuple(max(0, s + j) for s, j in zip(desc.shape, shape_jitter, strict=True))
    slope_shape = (max(0, desc.heads + shape_jitter[0]),)
    tensors = [np.ones(shape, dtype), np.ones(slope_shape, dtype), np.ones(shape, dtype)]
    if drop is not None:
        tensors[drop] = None
    args = (AlibiForwardArgs(*tensors) if kind == "forward" else AlibiBackwardArgs(*tensors))
    try:
        plan.can_implement(args)
    except OpFacadeError:
        return
    # Accepted: on the host it must also run and write finite numbers.
    if plan.target.is_host:
        plan.run(args)
