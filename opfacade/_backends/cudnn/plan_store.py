"""cuDNN's built plans on disk, so that a new process deserializes in milliseconds what took the
first one a build of hundreds (the frontend's ``serialize``/``deserialize``).

An entry is the serialized graph behind its key's JSON: the cuDNN and frontend versions,
opfacade's version, the device's name and multiprocessor count, and every field of the graph's
key (direction, variant (the deterministic backward), the descriptor, whose bucket fields are
part of it, and a paged or ragged graph's layout). The file is named by the key's
hash and written atomically with a checksum (``_internal/disk_cache.py``); a torn entry, one
whose key differs (a foreign or stale file), or one the frontend refuses to deserialize is a
miss, and the graph is built and stored again. ``OPFACADE_CUDNN_PLAN_CACHE=0`` turns it off.

Entries live in ``$OPFACADE_CACHE_DIR/cudnn-plans``; ``opfacade cache`` lists and clears them.
Every graph the graph cache builds is stored: dense SDPA, ragged (varlen) and paged (decode).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

from ..._internal.config import cache_dir
from ..._internal.device import device_name, device_sm_count
from ..._internal.disk_cache import read_checked, write_atomically
from ..._internal.log import LOG
from . import runtime

__all__ = ["ENTRY_SUFFIX", "SWITCH_VARIABLE", "directory", "load", "loaded_count", "store"]

SWITCH_VARIABLE = "OPFACADE_CUDNN_PLAN_CACHE"
ENTRY_SUFFIX = ".plan"
_LENGTH = struct.Struct("<I")
_COMMON_FIELDS = ("direction", "desc", "device", "variant")
# The identities this process has loaded (loaded_count).
_LOADED: set[bytes] = set()


def directory() -> Path:
    return cache_dir() / "cudnn-plans"


def _enabled() -> bool:
    return os.environ.get(SWITCH_VARIABLE, "1") != "0"


def _identity(key) -> bytes | None:
    """Everything a plan depends on, as canonical JSON; None when it cannot be read (the device
    cannot be asked): the store then stays out of the way."""
    try:
        return _read_identity(key)
    except Exception as error:
        LOG.debug("cuDNN plan store: no key for %s: %s: %s", key, type(error).__name__, error)
        return None


def _read_identity(key) -> bytes:
    from ... import __version__

    cudnn = runtime.cudnn_module()
    return json.dumps({
        "cudnn": runtime.backend_version(),
        "frontend": getattr(cudnn, "__version__", "?"),
        "opfacade": __version__,
        "device": device_name(key.device),
        "sm_count": device_sm_count(key.device),
        "key": type(key).__name__,
        "direction": key.direction,
        "variant": bool(key.variant),
        "descriptor": type(key.desc).__name__,
        "fields": json.loads(key.desc.model_dump_json()),
        # What some keys add (a paged or ragged graph's layout): frozen dataclasses, whose
        # repr names every field.
        "extra": {name: repr(getattr(key, name)) for name in key._fields
                  if name not in _COMMON_FIELDS},
    }, sort_keys=True).encode()


def _path(identity: bytes) -> Path:
    return directory() / f"{hashlib.sha256(identity).hexdigest()[:40]}{ENTRY_SUFFIX}"


def load(key, handle):
    """The graph for ``key`` deserialized from disk, or None (a miss, logged at DEBUG).

    Asked on every graph-cache miss: a new process's first selection, or a selection after the
    plan that held the graph was freed, this process's own entries included. (Until the
    forty-seventh session a process loaded each entry at most once and never its own, after an
    H100 segfault in frontend 1.32's deserialize following a free in the building process. An
    H200 segfault in the same call was later traced to the handle naming a stream the caller
    had destroyed, which ``runtime.bind_build_stream`` fixed. With the rule lifted, own entries
    loaded after a free and one entry loaded three times, also after runs on destroyed streams,
    gave the first build's bits on an H200: scripts/plan_store_free_probe.py's "again"
    scenarios. The H100 case has not been run again.)

    The identity names the device's model, not its index, so one process's entry also serves
    the same problem on its other devices of that model (2x H200, forty-eighth session:
    tests/test_plan_store_gpu.py's "devices" child, the same bits on both)."""
    if not _enabled():
        return None
    identity = _identity(key)
    if identity is None:
        return None
    payload = read_checked(_path(identity))
    if payload is None:
        return None
    (length,) = _LENGTH.unpack_from(payload) if len(payload) >= _LENGTH.size else (-1,)
    stored, plan = payload[_LENGTH.size:_LENGTH.size + length], payload[_LENGTH.size + length:]
    if length < 0 or stored != identity:
        LOG.debug("cuDNN plan store: the entry for %s was written for another setup", key)
        return None
    cudnn = runtime.cudnn_module()
    try:
        graph = cudnn.pygraph(handle=handle)
        try:
            graph.deserialize(handle, list(plan))
        except TypeError:  # frontends whose deserialize takes the data alone
            graph.deserialize(list(plan))
        graph.get_workspace_size()  # a graph that cannot answer this cannot run
    except Exception as error:  # the frontend refused it: build again
        LOG.debug("cuDNN plan store: cannot deserialize %s: %s: %s", key, type(error).__name__,
                  error)
        return None
    _LOADED.add(identity)
    LOG.debug("cuDNN plan store: loaded %s", key)
    return graph


def loaded_count() -> int:
    """How many distinct graphs this process has deserialized from the store (the warm-start
    bench and the GPU tests ask a fresh process)."""
    return len(_LOADED)


def store(key, graph) -> None:
    """Serializes a built graph for ``key``; a graph the frontend cannot serialize is skipped."""
    if not _enabled():
        return
    try:
        plan = bytes(graph.serialize())
    except Exception as error:
        LOG.debug("cuDNN plan store: cannot serialize %s: %s: %s", key, type(error).__name__,
                  error)
        return
    identity = _identity(key)
    if identity is None:
        return
    write_atomically(_path(identity), _LENGTH.pack(len(identity)) + identity + plan)
