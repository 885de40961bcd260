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


def _earlier_record(path: Path, gpu: str, echo) -> dict | None:
    """The record already at ``path`` for this GPU model, or None (none, another GPU's, or one
    that does not parse: it is then replaced, and said so)."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        echo(f"replacing {path}: it does not parse ({type(error).__name__}: {error})")
        return None
    if not isinstance(record, dict) or record.get("gpu") != gpu or not isinstance(
            record.get("skus"), list):
        echo(f"replacing {path}: it is not a record of {gpu}")
        return None
    return record


def _merged(earlier: dict | None, this_run: dict, update: dict) -> dict:
    """What the file holds after this run's entries so far: the SKUs of earlier runs that this
    one did not verify, as they were; this run's in their place (or after them); this run
    added to ``updates`` (when, what, on which versions)."""
    entries = {entry["sku"]: entry for entry in (earlier or {}).get("skus", [])}
    entries.update({entry["sku"]: entry for entry in this_run["skus"]})
    skus = list(entries.values())
    return {**(earlier or {}), **{key: this_run[key] for key in ("gpu", "arch", "date",
                                                                 "versions")},
            "passed": all(entry.get("passed", True) for entry in skus),  # skips have none
            "skus": skus, "updates": [*(earlier or {}).get("updates", []), update]}


def _write(path: Path, record: dict) -> None:
    """Atomically (a temp file, then a rename), so that a run killed mid-write leaves the last
    complete record; indented by one and without a final newline, as catalog/verified keeps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def verify_all(*, op: str | None = None, runs: int = 3, out_dir: str | Path | None = None,
               seed: int | None = None, echo=print) -> dict:
    """Verifies every GPU SKU (of ``op``) on the current device and returns this run's record.

    With ``out_dir`` the run is merged into ``<out_dir>/<gpu>.json`` after every SKU: the
    SKUs this run verified replace their earlier entries, the others stay, and ``updates``
    gains this run. So ``--op`` refreshes one op's SKUs in the catalog's record, and a run cut
    short keeps every SKU it finished.

    Raises:
        BackendUnavailable: no GPU, no driver for CUDA 13, or the GPU stack is not installed.
    """
    device = require_gpu("verifying the SKUs")
    gpu = device_name(device)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    record = {"gpu": gpu, "arch": device_arch(device).value, "date": date,
              "versions": _versions(), "passed": True, "skus": []}
    path = None if out_dir is None else record_path(out_dir, gpu)
    earlier = None if path is None else _earlier_record(path, gpu, echo)
    how = " ".join(["opfacade verify", *([f"--op {op}"] if op else []), f"--runs {runs}",
                    *([f"--seed {seed}"] if seed is not None else [])])
    update = {"date": date, "skus": [], "versions": record["versions"], "how": how}
    entries = record["skus"]
    for spec in all_ops():
        if op not in (None, spec.name):
            continue
        for impl in spec.skus:
            if impl.sku.backend is BackendKind.reference:
                continue  # the oracle itself
            try:
                results = verify_sku(impl.sku.id, runs=runs, seed=seed, device=device)
            except NoKernelSku as error:  # e.g. arch too old for this SKU
                entries.append({"sku": impl.sku.id, "skipped": str(error).splitlines()[0],
                                "date": date})
                echo(f"SKIP {impl.sku.id}: not servable on {gpu}")
            else:
                entries.append(_entry(impl, results, runs, date))
                _echo_entry(entries[-1], impl, results, echo)
                record["passed"] &= entries[-1]["passed"]
            update["skus"].append(impl.sku.id)
            if path is not None:
                _write(path, _merged(earlier, record, update))
    if path is not None:
        if not update["skus"]:  # nothing verified, so nothing written above
            _write(path, _merged(earlier, record, update))
        echo(f"wrote {path}")
    return record


def _entry(impl, results: list, runs: int, date: str) -> dict:
    """One SKU's line of the record: its results, the worst error (overall and by input
    distribution) against its declared bound, and whether its runs repeated bitwise."""
    worst = max((max(r.rel_errors.values(), default=0.0) for r in results), default=0.0)
    by_distribution = {
        d: max((max(r.rel_errors.values(), default=0.0) for r in results
                if r.distribution == d), default=0.0)
        for d in dict.fromkeys(r.distribution for r in results)}
    return {
        "sku": impl.sku.id,
        "passed": all(r.passed for r in results),
        "date": date,
        "problems": len({json.dumps(r.descriptor, sort_keys=True) for r in results}),
        "checks": len(results),  # problems x distributions
        "declared_max_rel_error": impl.sku.precision_guarantee.max_rel_error,
        "measured_max_rel_error": worst,
        "measured_max_rel_error_by_distribution": by_distribution,
        "declared_deterministic": impl.sku.precision_guarantee.deterministic,
        "bitwise_repeatable": all(r.bitwise_equal for r in results),
        "runs_per_problem": runs,
        "results": [r.to_dict() for r in results],
    }


def _echo_entry(entry: dict, impl, results: list, echo) -> None:
    spread = ", ".join(f"{d} {e:.2g}"
                       for d, e in entry["measured_max_rel_error_by_distribution"].items())
    echo(f"{'PASS' if entry['passed'] else 'FAIL'} {impl.sku.id}: {entry['problems']} "
         f"problems x {len(entry['measured_max_rel_error_by_distribution'])} distributions, "
         f"worst rel error {entry['measured_max_rel_error']:.3g} (bound "
         f"{impl.sku.precision_guarantee.max_rel_error:.3g}; {spread}), bitwise "
         f"{entry['bitwise_repeatable']}")
    for r in results:
        if not r.passed:
            echo("  " + r.summary())
