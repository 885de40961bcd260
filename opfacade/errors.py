"""The error hierarchy: every failure opfacade raises on purpose is an ``OpFacadeError``.

Invalid input (the caller's problem) and valid-but-unsupported (ours) are different types, so that
a framework integration can fall back on ``Unsupported``/``NoKernelSku`` and surface the rest.
Messages name the argument, the expected and the actual value in one sentence.
"""

from __future__ import annotations

__all__ = [
    "OpFacadeError",
    "InvalidProblem",
    "InvalidArgument",
    "ShapeMismatch",
    "DTypeMismatch",
    "LayoutMismatch",
    "DeviceMismatch",
    "BufferTooSmall",
    "Unsupported",
    "NoKernelSku",
    "BackendUnavailable",
    "LaunchFailed",
    "PlanFreed",
    "CompileError",
]


class OpFacadeError(Exception):
    """Root of every error opfacade raises on purpose."""


class InvalidProblem(OpFacadeError, ValueError):
    """A descriptor or preference describes an impossible problem (names the field).

    ``field`` is the path of the first field at fault ("window.left"), None for the model as a
    whole. Raised in place of pydantic's ``ValidationError``, whose error list ``errors()``
    returns.
    """

    def __init__(self, message: str, *, field: str | None = None,
                 errors: list[dict] | None = None):
        super().__init__(message)
        self.field = field
        self._errors = errors

    def errors(self) -> list[dict]:
        """pydantic's error dicts (``type``, ``loc``, ``msg``, ``input``, ...) when validation
        failed, else one dict in the same form for this error."""
        if self._errors is not None:
            return [dict(error) for error in self._errors]
        loc = tuple(self.field.split(".")) if self.field else ()
        return [{"type": "invalid_problem", "loc": loc, "msg": str(self)}]


class InvalidArgument(OpFacadeError, ValueError):
    """A tensor, stream or workspace handed to a plan does not fit it (names the argument)."""

    def __init__(self, message: str, *, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


class ShapeMismatch(InvalidArgument):
    """A tensor's shape does not match the descriptor."""


class DTypeMismatch(InvalidArgument):
    """A tensor's element type does not match the descriptor."""


class LayoutMismatch(InvalidArgument):
    """A tensor's strides, alignment or aliasing is not one the plan accepts."""


class DeviceMismatch(InvalidArgument):
    """A tensor lives on the host or on another device than the plan's."""


class BufferTooSmall(InvalidArgument):
    """A workspace buffer is smaller than ``plan.workspace_size``."""


class Unsupported(OpFacadeError, NotImplementedError):
    """A valid problem that this build, backend or device cannot serve; ``argument`` names the
    argument it turns on where there is one (a tensor that requires grad, say), else None."""

    def __init__(self, message: str, *, argument: str | None = None):
        super().__init__(message)
        self.argument = argument


class NoKernelSku(Unsupported):
    """Selection rejected every candidate SKU; ``report`` holds the explain table."""

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class BackendUnavailable(Unsupported):
    """A backend's library is missing or failed to load."""


class LaunchFailed(OpFacadeError, RuntimeError):
    """A kernel launch or library call returned an error."""


class PlanFreed(OpFacadeError, RuntimeError):
    """A plan was used after ``free()``."""


class CompileError(OpFacadeError, RuntimeError):
    """NVRTC rejected a kernel source; carries the source, the options and the log."""

    def __init__(self, name: str, source: str, options: tuple[str, ...], log: str):
        self.name = name
        self.source = source
        self.options = tuple(options)
        self.log = log
        super().__init__(
            f"NVRTC failed to compile {name} with options {' '.join(options)}:\n{log.strip()}"
        )

    def numbered_source(self) -> str:
        """The source with line numbers, to read beside the log's line references."""
        lines = self.source.splitlines()
        width = len(str(len(lines)))
        return "\n".join(f"{n:>{width}} | {line}" for n, line in enumerate(lines, start=1))
