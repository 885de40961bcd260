"""The kernel that does nothing, for the probes of this folder that time launch floors: the
bench's own (opfacade/_bench/host_floor.py), re-exported so that a probe run as
``python3 scripts/<probe>.py`` finds it beside it."""

from opfacade._bench.host_floor import noop_kernel

__all__ = ["noop_kernel"]
