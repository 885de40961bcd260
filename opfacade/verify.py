"""`opfacade verify`: every GPU SKU against the float64 reference on every input distribution
(testing.DISTRIBUTIONS), recorded per GPU model."""

from __future__ import annotations

import datetime
import json
import platform
import re
from pathlib import Path

from ._internal.device import DEVICES, current_device, device_arch, device_name
from ._registry import all_ops
from .errors import BackendUnavailable, NoKernelSku
from .testing import verify_sku
from .types import BackendKind

__all__ = ["require_gpu", "verify_all"]


def require_gpu(what: str) -> int:
    """The current CUDA device, or BackendUnavailable saying in one sentence why ``what`` cannot
    run here: the GPU stack is not installed (and how to install it), the driver is too old for
    it, or no GPU is visible."""
    runtime = DEVICES.runtime()  # BackendUnavailable with the install command without CuPy
    try:
        count = int(runtime.getDeviceCount())
    except Exception as error:  # no driver, or one older than the CUDA 13 runtime
        raise BackendUnavailable(
            f"{what} needs an NVIDIA GPU with a driver for CUDA 13 or newer; the CUDA runtime "
            f"answers: {error}") from None
    if count == 0:
        raise BackendUnavailable(f"{what} needs an NVIDIA GPU; the CUDA runtime sees none")
    return current_device()


def _versions() -> dict[str, str]:
    import cupy

    from . import __version__
    from ._backends.nvrtc.compiler import nvrtc_version

    runtime = cupy.cuda.runtime
    return {
        "opfacade": __version__,
        "python": platform.python_version(),
        "cupy": cupy.__version__,
        "cuda_driver": str(runtime.driverGetVersion()),
        "cuda_runtime": str(runtime.runtimeGetVersion()),
        "nvrtc": "{}.{}".format(*nvrtc_version()),
        **_cudnn_versions(),
    }


def _cudnn_versions() -> dict[str, str]:
    """The cuDNN library and frontend the cuDNN SKUs ran on: pip's pick for the cu13 extra may
    be newer than the one a record was made with (README), so each record names its own."""
    from ._backends.cudnn import runtime
    from ._backends.cudnn.limits import format_version

    version = runtime.backend_version()
    if version is None:
        return {"cudnn": "absent", "cudnn_frontend": "absent"}
    return {"cudnn": format_version(version),
            "cudnn_frontend": str(getattr(runtime.cudnn_module(), "__version__", "unknown"))}


def record_path(out_dir: str | Path, gpu: str) -> Path:
    return Path(out_dir) / (re.sub(r"[^A-Za-z0-9._-]+", "_", gpu).strip("_") + ".json")


def verify_all(*, op: str | None = None, runs: int = 3, out_dir: str | Path | None = None,
               seed: int | None = None, echo=print) -> dict:
    """Verifies every GPU SKU (of ``op``) on the current device; writes and returns the record.

    Raises:
        BackendUnavailable: no GPU, no driver for CUDA 13, or the GPU stack is not installed.
    """
    device = require_gpu("verifying the SKUs")
    gpu = device_name(device)
    entries, passed = [], True
    for spec in all_ops():
        if op not in (None, spec.name):
            continue
        for impl in spec.skus:
            if impl.sku.backend is BackendKind.reference:
                continue  # the oracle itself
            try:
                results = verify_sku(impl.sku.id, runs=runs, seed=seed, device=device)
            except NoKernelSku as error:  # e.g. arch too old for this SKU
                entries.append({"sku": impl.sku.id, "skipped": str(error).splitlines()[0]})
                echo(f"SKIP {impl.sku.id}: not servable on {gpu}")
                continue
            worst = max((max(r.rel_errors.values(), default=0.0) for r in results), default=0.0)
            by_distribution = {
                d: max((max(r.rel_errors.values(), default=0.0) for r in results
                        if r.distribution == d), default=0.0)
                for d in dict.fromkeys(r.distribution for r in results)}
            ok = all(r.passed for r in results)
            passed &= ok
            entries.append({
                "sku": impl.sku.id,
                "passed": ok,
                "problems": len({json.dumps(r.descriptor, sort_keys=True) for r in results}),
                "checks": len(results),  # problems x distributions
                "declared_max_rel_error": impl.sku.precision_guarantee.max_rel_error,
                "measured_max_rel_error": worst,
                "measured_max_rel_error_by_distribution": by_distribution,
                "declared_deterministic": impl.sku.precision_guarantee.deterministic,
                "bitwise_repeatable": all(r.bitwise_equal for r in results),
                "runs_per_problem": runs,
                "results": [r.to_dict() for r in results],
            })
            spread = ", ".join(f"{d} {e:.2g}" for d, e in by_distribution.items())
            echo(f"{'PASS' if ok else 'FAIL'} {impl.sku.id}: {entries[-1]['problems']} "
                 f"problems x {len(by_distribution)} distributions, worst rel error "
                 f"{worst:.3g} (bound "
                 f"{impl.sku.precision_guarantee.max_rel_error:.3g}; {spread}), bitwise "
                 f"{entries[-1]['bitwise_repeatable']}")
            for r in results:
                if not r.passed:
                    echo("  " + r.summary())
    record = {
        "gpu": gpu,
        "arch": device_arch(device).value,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": _versions(),
        "passed": passed,
        "skus": entries,
    }
    if out_dir is not None:
        path = record_path(out_dir, gpu)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        echo(f"wrote {path}")
    return record
