"""The linear SKUs' one recipe cache: what a run needs besides its pointers, built once.

A recipe is one SKU's prepared work for one problem: the cublasLtMatmul(s) (descriptor, layouts,
the heuristic's algorithm) and the NVRTC launches around them, with the workspace split between
them. ``RECIPES`` holds every SKU's, keyed by (SKU id, descriptor, (device, layout), workspace);
``opfacade.clear_caches`` clears it, and with it every SKU's shortcut to its last recipe;
``Plan.free`` drops its problem's entries through ``SkuImpl.release``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple, Protocol

from ..._internal.log import LOG, timed
from ..._internal.lru import BuildOnceLRU
from ..._internal.sku import Workspace
from ...errors import BufferTooSmall

__all__ = ["RECIPES", "Recipe", "RecipeCache", "Recipes", "check_workspace"]

_CAPACITY = 1024


class Recipe(Protocol):
    """What the forward's and the backward's recipes share."""

    workspace_size: int
    algorithms: Any

    def describe(self) -> str: ...

    def bind(self, lt_handle: int, views: dict, workspace: Workspace,
             stream: int | None) -> Callable[[], None]: ...


class RecipeCache(BuildOnceLRU[Recipe]):
    """A BuildOnceLRU whose ``clear`` also retires every SKU's shortcut to its last recipe
    (``generation`` counts the clears; a shortcut taken before the last one is not used)."""

    def __init__(self, name: str, capacity: int):
        super().__init__(name, capacity)
        self.generation = 0

    def clear(self) -> None:
        self.generation += 1  # first: a shortcut taken while clearing is already stale
        super().clear()


RECIPES = RecipeCache("cuBLASLt recipe", _CAPACITY)


class _Last(NamedTuple):
    """A SKU's last recipe: a run of the same descriptor object on the same layout skips the
    hashing of RECIPES' key."""

    generation: int
    desc: Hashable
    key: tuple | None
    recipe: Recipe | None


_NOTHING = _Last(-1, None, None, None)


class Recipes:
    """One SKU's view of RECIPES: its recipes per (descriptor, device, layout, workspace), built
    once by ``build(desc, device, layout, available)``; the layout is the tensors' strides and
    the alignment their pointers share, ``available`` None for the default workspace limit."""

    def __init__(self, build: Callable[[Any, int, tuple, int | None], Recipe], owner: str):
        self._build = build
        self._owner = owner
        self._last = _NOTHING

    def get(self, desc: Hashable, device: int, layout: tuple, available: int) -> Recipe:
        """The recipe for a run given ``available`` bytes of workspace: the default one, or when
        that needs more, the best within what was given."""
        key = (device, layout)
        last = self._last
        if (last.generation != RECIPES.generation or last.desc is not desc
                or last.key != key):
            generation = RECIPES.generation  # read before the look-up: a clear during it wins
            recipe = RECIPES.get((self._owner, desc, key, None),
                                 lambda: self._timed_build(desc, device, layout, None))
            last = self._last = _Last(generation, desc, key, recipe)
        recipe = last.recipe
        if recipe.workspace_size > available:
            LOG.debug("%s: the run gives %d bytes of workspace, less than the %d the chosen "
                      "algorithm needs: using the best algorithm within it", self._owner,
                      available, recipe.workspace_size)
            recipe = RECIPES.get((self._owner, desc, key, available),
                                 lambda: self._timed_build(desc, device, layout, available))
        return recipe

    def _timed_build(self, desc: Hashable, device: int, layout: tuple,
                     available: int | None) -> Recipe:
        limit = "the default workspace limit" if available is None else f"{available} bytes"
        with timed("cuBLASLt recipe %s on cuda:%d within %s", self._owner, device, limit):
            return self._build(desc, device, layout, available)

    def release(self, desc: Hashable) -> None:
        """Drops this SKU's recipes for ``desc`` (and the shortcut)."""
        self._last = _NOTHING
        RECIPES.discard(lambda key: key[0] == self._owner and key[1] == desc)


def check_workspace(workspace: Workspace, need: int) -> None:
    if workspace.size < need:
        raise BufferTooSmall(f"workspace has {workspace.size} bytes; this problem needs {need}",
                             argument="workspace")
