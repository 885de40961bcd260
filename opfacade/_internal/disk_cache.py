"""Files of the on-disk caches (NVRTC cubins, cuDNN plans): written whole or not at all, and
read back only when their checksum holds, so a torn, truncated or corrupted entry is a miss.

    <sha256 of the payload, 32 bytes> <payload>
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .log import LOG

__all__ = ["read_checked", "write_atomically"]

_DIGEST_BYTES = 32


def read_checked(path: Path) -> bytes | None:
    """The payload stored at ``path``, or None when it is missing, unreadable or corrupted."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    digest, payload = blob[:_DIGEST_BYTES], blob[_DIGEST_BYTES:]
    if len(digest) != _DIGEST_BYTES or hashlib.sha256(payload).digest() != digest:
        LOG.debug("disk cache: %s is torn or corrupted; treated as a miss", path)
        return None
    return payload


def write_atomically(path: Path, payload: bytes) -> None:
    """A temp file in the same directory, then os.replace: readers see all of it or none. A
    read-only or full cache directory costs the next process a rebuild, never a failure."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(hashlib.sha256(payload).digest())
                out.write(payload)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as error:
        LOG.debug("disk cache: cannot store %s (%s); the next process builds again", path, error)
