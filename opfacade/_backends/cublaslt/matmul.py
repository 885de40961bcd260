"""One cublasLtMatmul, prepared once: descriptor, layouts, and the heuristic's best algorithm.

Everything that does not change between runs is built here: the matmul descriptor with its
transposes, epilogue, leading dimension and batch stride of the aux; the four matrix layouts; the
heuristic query under a workspace limit and a reduction-scheme mask. ``bind`` is the one way to
run it: a call with every argument fixed, which (when the epilogue reads or writes a bias or aux
pointer) has a descriptor of its own pointing at them, so no call ever changes the shared
descriptor and none needs a lock.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..._internal.device import on_device
from ..._internal.log import LOG
from ...errors import LaunchFailed, Unsupported
from .epilogues import Epilogue
from .layouts import Gemm, Matrix
from .library import NotSupportedStatus, Types, binding, checked, handle

__all__ = [
    "ALL_SCHEMES", "AlgoInfo", "Aux", "DETERMINISTIC_SCHEMES", "MAX_ALIGNMENT", "Matmul",
    "NoAlgorithm", "OwnedDesc", "POINTER_ALIGNMENT", "round_workspace",
]

# cublasLtReductionScheme_t. INPLACE adds the split-K partial sums into the output, in the
# output's type, in an order serialised by counters; COMPUTE_TYPE and OUTPUT_TYPE write each
# split's partial to its own workspace slot and reduce the slots in a separate step.
NONE, INPLACE, COMPUTE_TYPE, OUTPUT_TYPE = 0, 1, 2, 4
ALL_SCHEMES = NONE | INPLACE | COMPUTE_TYPE | OUTPUT_TYPE
DETERMINISTIC_SCHEMES = NONE | COMPUTE_TYPE | OUTPUT_TYPE
# Every pointer is checked to be at least 16-byte aligned. The heuristic is told the alignment the
# run's pointers actually have (16 to 256 bytes), as torch and nvmath do: a 256-byte aligned
# tensor gets every algorithm, a 16-byte aligned slice those that work with it.
POINTER_ALIGNMENT = 16
MAX_ALIGNMENT = 256
_CANDIDATES = 8
# Epilogue descriptors a matmul keeps by (bias, aux) pointer pair (own_desc).
OWN_DESCS = 64
_HEURISTIC_RESULT_BYTES = 96  # sizeof(cublasLtMatmulHeuristicResult_t); its algo comes first
_ALGO_BYTES = 64


class NoAlgorithm(Unsupported):
    """cuBLASLt's heuristic offered no algorithm for a configuration."""


def round_workspace(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


@dataclass(frozen=True)
class Aux:
    """The epilogue's aux matrix: leading dimension and batch stride, in elements (bits for the
    ReLU mask)."""

    ld: int
    batch_stride: int = 0


@dataclass(frozen=True)
class AlgoInfo:
    """What the heuristic chose, as cuBLASLt's algorithm configuration describes it."""

    algo_id: int
    tile: str
    stages: str
    split_k: int
    reduction_scheme: str
    cta_swizzling: int
    custom_option: int
    cluster_shape: str
    workspace_size: int
    waves_count: float

    @property
    def bitwise_repeatable(self) -> bool:
        """True unless split-K partials are added in place (see DETERMINISTIC_SCHEMES)."""
        return self.split_k <= 1 or self.reduction_scheme != "INPLACE"

    def __str__(self) -> str:
        return (f"algo {self.algo_id} tile {self.tile} stages {self.stages} split-K "
                f"{self.split_k} ({self.reduction_scheme}) cluster {self.cluster_shape} "
                f"workspace {self.workspace_size} B")


def _enum_name(enum_type, value: int, prefix: str) -> str:
    try:
        return enum_type(value).name.removeprefix(prefix)
    except ValueError:
        return str(value)


class Matmul:
    """A prepared ``D = epilogue(op(A) @ op(B) [+ C])`` on one device."""

    def __init__(self, gemm: Gemm, types: Types, epilogue: Epilogue, *, device: int,
                 workspace_limit: int, schemes: int, c: Matrix | None = None,
                 aux: Aux | None = None, alignment: int = MAX_ALIGNMENT,
                 what: str = "cublasLtMatmul"):
        self._lt = binding()
        self.gemm, self.epilogue, self.device, self.what = gemm, epilogue, device, what
        self._owner = True
        self._layouts: list[int] = []
        self._types = types
        self._aux = aux
        self._own_descs: dict[tuple[int, int], OwnedDesc] = {}  # own_desc's, by (bias, aux)
        # The shared descriptor's bias and aux pointers are stand-ins with the run's alignment,
        # which the heuristic reads; runs point descriptors of their own at theirs (bind).
        self.desc = self._new_desc(alignment, alignment)
        self.a_layout = self._layout(types.data, gemm.a, gemm.batch)
        self.b_layout = self._layout(types.data, gemm.b, gemm.batch)
        self.d_layout = self._layout(types.data, gemm.d, gemm.batch)
        self.c_layout = self.d_layout if c is None else self._layout(types.data, c, gemm.batch)
        self._scalars = np.array([1.0, 1.0 if c is not None else 0.0], dtype=np.float32)
        self.alpha_ptr = self._scalars.ctypes.data
        self.beta_ptr = self.alpha_ptr + 4
        self._choose(workspace_limit, schemes, alignment)

    # -- building ------------------------------------------------------------------------------
    def _new_desc(self, bias: int, aux: int) -> int:
        """A matmul descriptor with this problem's transposes and epilogue, pointing the
        epilogue at ``bias`` and ``aux`` (where it has them); the caller destroys it."""
        lt, gemm, epilogue = self._lt, self.gemm, self.epilogue
        attrs = lt.MatmulDescAttribute
        desc = checked("cublasLtMatmulDescCreate", lt.matmul_desc_create, self._types.compute,
                       self._types.scale)
        settings = [(attrs.TRANSA, gemm.transa), (attrs.TRANSB, gemm.transb)]
        if epilogue.value != 1:
            settings.append((attrs.EPILOGUE, epilogue.value))
        if epilogue.bias:
            settings.append((attrs.BIAS_POINTER, bias))
        if epilogue.aux:
            settings += [(attrs.EPILOGUE_AUX_LD, self._aux.ld),
                         (attrs.EPILOGUE_AUX_BATCH_STRIDE, self._aux.batch_stride),
                         (attrs.EPILOGUE_AUX_POINTER, aux)]
        try:
            for attr, value in settings:
                buf = np.array([value], dtype=lt.get_matmul_desc_attribute_dtype(attr))
                checked(f"{self.what}: setting {attr.name}", lt.matmul_desc_set_attribute, desc,
                        attr, buf.ctypes.data, buf.itemsize)
        except Exception:
            lt.matmul_desc_destroy(desc)
            raise
        return desc

    def _layout(self, data_type: int, matrix: Matrix, batch: int) -> int:
        lt = self._lt
        layout = checked(f"{self.what}: cublasLtMatrixLayoutCreate", lt.matrix_layout_create,
                         data_type, matrix.rows, matrix.cols, matrix.ld)
        self._layouts.append(layout)
        if batch > 1:
            attrs = lt.MatrixLayoutAttribute
            for attr, value in ((attrs.BATCH_COUNT, batch),
                                (attrs.STRIDED_BATCH_OFFSET, matrix.batch_stride)):
                buf = np.array([value], dtype=lt.get_matrix_layout_attribute_dtype(attr))
                checked(f"{self.what}: setting layout {attr.name}",
                        lt.matrix_layout_set_attribute, layout, attr, buf.ctypes.data,
                        buf.itemsize)
        return layout

    def _choose(self, workspace_limit: int, schemes: int, alignment: int) -> None:
        lt = self._lt
        attrs = lt.MatmulPreferenceAttribute
        preference = checked("cublasLtMatmulPreferenceCreate", lt.matmul_preference_create)
        try:
            for attr, value in ((attrs.MAX_WORKSPACE_BYTES, workspace_limit),
                                (attrs.REDUCTION_SCHEME_MASK, schemes),
                                (attrs.MIN_ALIGNMENT_A_BYTES, alignment),
                                (attrs.MIN_ALIGNMENT_B_BYTES, alignment),
                                (attrs.MIN_ALIGNMENT_C_BYTES, alignment),
                                (attrs.MIN_ALIGNMENT_D_BYTES, alignment)):
                buf = np.array([value], dtype=lt.get_matmul_preference_attribute_dtype(attr))
                checked(f"{self.what}: setting preference {attr.name}",
                        lt.matmul_preference_set_attribute, preference, attr, buf.ctypes.data,
                        buf.itemsize)
            self.candidates = lt.MatmulHeuristicResult(_CANDIDATES)
            count = np.zeros(1, dtype=np.int32)
            try:
                with on_device(self.device):
                    checked(f"{self.what}: cublasLtMatmulAlgoGetHeuristic",
                            lt.matmul_algo_get_heuristic, handle(self.device), self.desc,
                            self.a_layout, self.b_layout, self.c_layout, self.d_layout,
                            preference, _CANDIDATES, self.candidates.ptr, count.ctypes.data)
            except NotSupportedStatus as error:
                LOG.debug("%s: cuBLASLt's heuristic declines the configuration: %s", self.what,
                          error)
                raise NoAlgorithm(str(error)) from error
        finally:
            lt.matmul_preference_destroy(preference)
        self.count = int(count[0])
        if self.count == 0 or int(self.candidates[0].state) != 0:
            message = (f"{self.what}: cuBLASLt's heuristic found no algorithm for the "
                       f"{self.epilogue.name} epilogue on m={self.gemm.m} n={self.gemm.n} "
                       f"k={self.gemm.k} (batch {self.gemm.batch}) within {workspace_limit} "
                       f"bytes of workspace")
            LOG.debug("%s (alignment %d, reduction schemes %#x)", message, alignment, schemes)
            raise NoAlgorithm(message)
        self._algo_ptr = self.candidates.ptr
        self.workspace_size = int(self.candidates[0].workspace_size)
        self.info = self._read_info(self._algo_ptr, self.workspace_size,
                                    float(self.candidates[0].waves_count))

    def _read_info(self, algo_ptr: int, workspace: int, waves: float) -> AlgoInfo:
        lt = self._lt
        attrs = lt.MatmulAlgoConfigAttribute
        written = np.zeros(1, dtype=np.uint64)

        def config(attr) -> int:
            buf = np.zeros(1, dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
            checked(f"{self.what}: reading algo {attr.name}", lt.matmul_algo_config_get_attribute,
                    algo_ptr, attr, buf.ctypes.data, buf.itemsize, written.ctypes.data)
            return int(buf[0])

        split_k = config(attrs.SPLITK_NUM)
        return AlgoInfo(
            algo_id=config(attrs.ID),
            tile=_enum_name(lt.MatmulTile, config(attrs.TILE_ID), "TILE_"),
            stages=_enum_name(lt.MatmulStages, config(attrs.STAGES_ID), "STAGES_"),
            split_k=split_k,
            reduction_scheme=(_enum_name(lt.ReductionScheme, config(attrs.REDUCTION_SCHEME), "")
                              if split_k > 1 else "NONE"),
            cta_swizzling=config(attrs.CTA_SWIZZLING),
            custom_option=config(attrs.CUSTOM_OPTION),
            cluster_shape=_enum_name(lt.ClusterShape, config(attrs.CLUSTER_SHAPE_ID), "SHAPE_"),
            workspace_size=workspace, waves_count=waves)

    def split_k_variant(self, splits: int, scheme: int) -> Matmul | None:
        """A copy running one of the heuristic's algorithms with ``splits`` K-splits reduced by
        ``scheme`` (for the determinism tests), or None when no candidate supports it."""
        lt = self._lt
        caps = lt.MatmulAlgoCapAttribute
        configs = lt.MatmulAlgoConfigAttribute
        written = np.zeros(1, dtype=np.uint64)
        for i in range(self.count):
            source = self.candidates.ptr + i * _HEURISTIC_RESULT_BYTES
            support = np.zeros(1, dtype=np.int32)
            mask = np.zeros(1, dtype=np.uint32)
            for attr, buf in ((caps.SPLITK_SUPPORT, support), (caps.REDUCTION_SCHEME_MASK, mask)):
                checked("reading algo capability", lt.matmul_algo_cap_get_attribute, source,
                        attr, buf.ctypes.data, buf.itemsize, written.ctypes.data)
            if not support[0] or not int(mask[0]) & scheme:
                continue
            algo = lt.MatmulAlgo()
            ctypes.memmove(algo.ptr, source, _ALGO_BYTES)
            for attr, value in ((configs.SPLITK_NUM, splits), (configs.REDUCTION_SCHEME, scheme)):
                buf = np.array([value], dtype=lt.get_matmul_algo_config_attribute_dtype(attr))
                checked("setting algo config", lt.matmul_algo_config_set_attribute, algo.ptr,
                        attr, buf.ctypes.data, buf.itemsize)
            result = lt.MatmulHeuristicResult(1)
            try:
                with on_device(self.device):
                    checked("cublasLtMatmulAlgoCheck", lt.matmul_algo_check, handle(self.device),
                            self.desc, self.a_layout, self.b_layout, self.c_layout,
                            self.d_layout, algo.ptr, result.ptr)
            except (Unsupported, LaunchFailed):  # this algorithm cannot split that way
                continue
            variant = copy.copy(self)
            variant._owner = False  # the descriptors stay this object's to destroy
            variant._keep_algo = algo
            variant._algo_ptr = algo.ptr
            variant.workspace_size = int(result.workspace_size)
            variant.info = self._read_info(algo.ptr, variant.workspace_size,
                                           float(result.waves_count))
            return variant
        return None

    # -- running -------------------------------------------------------------------------------
    def own_desc(self, bias: int = 0, aux: int = 0) -> OwnedDesc | None:
        """A descriptor of this problem pointing the epilogue at ``bias`` and ``aux``, destroyed
        when the last call holding it goes; None when the epilogue has no pointers (the shared
        one then serves every call: nothing on it changes).

        Descriptors are kept by pointer pair (``OWN_DESCS`` of them; then the table starts
        over): nothing sets an attribute on one after it is made, so calls at the same bias and
        aux share it. A training loop's activations and gradients recur at a few addresses, and
        creating a descriptor for each re-pointed call was the largest cuBLASLt host cost in a
        profile of examples/gpt.py."""
        if not (self.epilogue.bias or self.epilogue.aux):
            return None
        key = (bias if self.epilogue.bias else 0, aux if self.epilogue.aux else 0)
        owned = self._own_descs.get(key)
        if owned is None:
            if len(self._own_descs) >= OWN_DESCS:
                self._own_descs.clear()  # calls holding a descriptor keep it alive
            owned = self._own_descs[key] = OwnedDesc(self._lt, self._new_desc(*key))
        return owned

    def _arguments(self, desc: int, lt_handle: int, a: int, b: int, c: int, d: int,
                   workspace: int, workspace_size: int, stream: int | None) -> tuple:
        """cublasLtMatmul's arguments, in its order, on descriptor ``desc``."""
        return (lt_handle, desc, self.alpha_ptr, a, self.a_layout, b, self.b_layout,
                self.beta_ptr, c, self.c_layout, d, self.d_layout, self._algo_ptr, workspace,
                workspace_size, stream)

    def _failed(self, error: Exception) -> LaunchFailed:
        return LaunchFailed(f"{self.what} ({self.info}) failed on cuda:{self.device}: {error}")

    def bind(self, lt_handle: int, a: int, b: int, c: int, d: int, workspace: int,
             workspace_size: int, stream: int | None, bias: int = 0,
             aux: int = 0) -> Callable[[], None]:
        """The matmul with every argument fixed: enqueues ``D = epilogue(A @ B [+ C])`` on
        ``stream`` when called (``c`` is D's own pointer when there is no C).

        An epilogue with pointers gets a descriptor of its own (``own_desc``), pointing at this
        call's bias and aux, so the bound call shares no mutable state: it takes no lock and sets
        nothing.
        """
        own = self.own_desc(bias, aux)
        desc = self.desc if own is None else own.desc
        arguments = self._arguments(desc, lt_handle, a, b, c, d, workspace, workspace_size,
                                    stream)
        matmul, failed = self._lt.matmul, self._failed  # holds self: layouts and algo live on

        def enqueue() -> None:
            try:
                matmul(*arguments)
            except Exception as error:
                raise failed(error) from error
            own  # noqa: B018 - the closure keeps the call's own descriptor alive

        return enqueue

    def __del__(self, _finalizing=sys.is_finalizing):
        # Not at interpreter exit (nvmath's bindings and cuBLASLt may be torn down; the
        # process's end frees the descriptors anyway).
        if not getattr(self, "_owner", False) or _finalizing():
            return
        lt = self._lt
        try:
            for layout in self._layouts:
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(self.desc)
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class OwnedDesc:
    """A bound call's own matmul descriptor, destroyed with the call."""

    __slots__ = ("_lt", "desc")

    def __init__(self, lt, desc: int):
        self._lt, self.desc = lt, desc

    def __del__(self, _finalizing=sys.is_finalizing):
        # Not at interpreter exit, as Matmul's descriptors.
        if _finalizing():
            return
        with contextlib.suppress(Exception):
            self._lt.matmul_desc_destroy(self.desc)
