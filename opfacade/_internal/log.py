"""opfacade's logger, and timing of the builds it reports.

Everything goes to ``logging.getLogger("opfacade")`` at DEBUG: selection (the chosen SKU and
every rejection), builds with their milliseconds (cuDNN graphs, cuBLASLt recipes, NVRTC
compiles and module loads), cache hits and misses, and every fallback taken. Turn it on with
``logging.getLogger("opfacade").setLevel(logging.DEBUG)`` and a handler.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

__all__ = ["LOG", "timed"]

LOG = logging.getLogger("opfacade")


@contextlib.contextmanager
def timed(what: str, *args: object) -> Iterator[None]:
    """Logs ``what % args`` with the block's milliseconds at DEBUG (and that it failed, if so)."""
    if not LOG.isEnabledFor(logging.DEBUG):
        yield
        return
    start = time.perf_counter()
    try:
        yield
    except BaseException as error:
        LOG.debug("build failed after %.1f ms: " + what + ": %s: %s",
                  (time.perf_counter() - start) * 1e3, *args, type(error).__name__, error)
        raise
    LOG.debug("built in %.1f ms: " + what, (time.perf_counter() - start) * 1e3, *args)
