"""How every cuDNN graph SKU is selected (the sdpa and varlen SKUs alike).

First the limits stated as data, which need no GPU. Then, when a GPU is the target, the graph
itself is built (and cached): cuDNN's own verdict and the exact workspace are known before
anything runs. Without a device, a problem that passes the data limits is viable pending graph
support, with an estimated workspace.

A SKU supplies four hooks: ``_data_unfit`` (the limits), ``_selection_key`` (the graph selection
builds, for compact tensors), ``_workspace`` (the plan's bytes given the graph's) and
``_estimate`` (the graph's bytes without a GPU). ``WORKSPACE`` is its size limit.
"""

from __future__ import annotations

from ..._internal.device import current_device, device_arch, device_count
from ..._internal.limits import Limit
from ..._internal.selection import Target
from ..._internal.sku import ReasonCode, Unfit
from ...types import ArchSku
from . import graphs, limits, runtime

__all__ = ["GraphSelection", "placement"]


def placement(target: Target | None) -> tuple[int | None, ArchSku | None]:
    """(device to build on or None, arch or None) for a selection."""
    if target is not None:
        return target.device, target.arch
    if runtime.available() is not None or device_count() == 0:
        return None, None
    device = current_device()
    return device, device_arch(device)


class GraphSelection:
    """``unfit``/``unfit_on`` and ``workspace_size``/``workspace_size_on`` of a cuDNN graph SKU
    (a mixin beside SkuImpl; the module docstring names the hooks)."""

    WORKSPACE: Limit

    def _data_unfit(self, desc, ctx: limits.Context) -> Unfit | None:
        raise NotImplementedError

    def _selection_key(self, desc, device: int):
        raise NotImplementedError

    def _workspace(self, desc, graph_bytes: int) -> int:
        return graph_bytes

    def _estimate(self, desc) -> int:
        raise NotImplementedError

    def unfit(self, desc) -> Unfit | None:
        return self.unfit_on(desc, None)

    def builds_to_screen(self, target: Target | None) -> bool:
        return placement(target)[0] is not None

    def data_unfit_on(self, desc, target: Target | None) -> Unfit | None:
        if desc.element is not self.sku.element:
            return Unfit(ReasonCode.element_unsupported,
                         f"serves {self.sku.element.value}, problem is {desc.element.value}")
        _, arch = placement(target)
        return self._data_unfit(desc, limits.Context(arch, runtime.backend_version()))

    def unfit_on(self, desc, target: Target | None) -> Unfit | None:
        return self.data_unfit_on(desc, target) or self.built_unfit_on(desc, target)

    def built_unfit_on(self, desc, target: Target | None) -> Unfit | None:
        device, _ = placement(target)
        if device is None:
            return None  # without a device: viable pending graph support
        built = graphs.built_or_unfit(self._selection_key(desc, device))
        if isinstance(built, Unfit):
            return built
        # The graph's own figure, not the estimate.
        return self.WORKSPACE.check(self._workspace(desc, built.workspace_size))

    def workspace_size(self, desc) -> int:
        return self.workspace_size_on(desc, None)

    def workspace_size_on(self, desc, target: Target | None) -> int:
        device, _ = placement(target)
        if device is not None:
            built = graphs.GRAPHS.get(self._selection_key(desc, device))
            if isinstance(built, graphs.BuiltGraph):
                return self._workspace(desc, built.workspace_size)
        return self._workspace(desc, self._estimate(desc))
