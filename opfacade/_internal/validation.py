"""opfacade's pydantic models raise ``InvalidProblem`` naming the field, never pydantic's error.

``CheckedModel`` is the base of every public model (descriptors, ``PlanPreference``,
``SlidingWindow``, ``KernelSku``, ``PrecisionGuarantee``): frozen, no extra fields, and each way
of making one (the constructor, ``model_validate``, ``model_validate_json``,
``model_validate_strings``, ``model_copy(update=...)``) validates and turns a failure into an
``InvalidProblem`` that keeps the field path and pydantic's error list. The constructor is
wrapped in the metaclass rather than in ``__init__``, so that pydantic validates nested models
itself (an error deep in a ``window`` keeps its path, ``window.left``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InvalidProblem

__all__ = ["CheckedModel", "invalid_problem", "one_of", "validated"]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def invalid_problem(model: type[BaseModel], error: ValidationError) -> InvalidProblem:
    """One sentence per failed field: '<Model>.<field>: <what was wrong> (got <value>)'."""
    items = error.errors(include_url=False)
    first = items[0] if items else {"loc": ()}
    field = ".".join(str(part) for part in first["loc"]) or None
    parts = []
    for item in items:
        loc = ".".join(str(part) for part in item["loc"]) or "(model)"
        message = item["msg"].removeprefix("Value error, ")
        got = (f" (got {_short(item.get('input'))})"
               if item["type"] != "missing" and loc != "(model)" else "")
        parts.append(f"{model.__name__}.{loc}: {message}{got}")
    return InvalidProblem("; ".join(parts) or f"{model.__name__} is invalid", field=field,
                          errors=items)


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: a fuzzer's megabyte string stays readable."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_of(values) -> str:
    """'f64, f32, f16 or bf16': the accepted values of a field, for its error message."""
    names = [getattr(v, "value", str(v)) for v in values]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _checked(model: type[BaseModel], call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return call(*args, **kwargs)
    except ValidationError as error:
        raise invalid_problem(model, error) from None


class _CheckedMeta(type(BaseModel)):
    """Wraps the constructor: keyword arguments only, a failure is InvalidProblem."""

    def __call__(cls, /, *args: Any, **kwargs: Any):
        if args:
            raise InvalidProblem(f"{cls.__name__} takes keyword arguments only, got {len(args)} "
                                 "positional")
        return _checked(cls, super().__call__, **kwargs)


class CheckedModel(BaseModel, metaclass=_CheckedMeta):
    """A frozen pydantic model whose every constructor raises InvalidProblem (see the module)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any):
        return _checked(cls, super().model_validate, *args, **kwargs)

    @classmethod
    def model_validate_json(cls, *args: Any, **kwargs: Any):
        return _checked(cls, super().model_validate_json, *args, **kwargs)

    @classmethod
    def model_validate_strings(cls, *args: Any, **kwargs: Any):
        return _checked(cls, super().model_validate_strings, *args, **kwargs)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):
        """A copy with ``update`` applied, validated like a new model (pydantic's own skips
        validation, which would let an invalid descriptor reach selection)."""
        if update is None:
            return super().model_copy(deep=deep)
        if not isinstance(update, dict):
            raise InvalidProblem(f"{type(self).__name__}.model_copy: update must be a dict, got "
                                 f"{type(update).__name__}", field="update")
        if not update:
            return super().model_copy(deep=deep)
        return type(self).model_validate({**self.model_dump(exclude_unset=True), **update})


def validated(model: type[M], data: dict) -> M:
    """Builds ``model`` from ``data``, raising InvalidProblem instead of ValidationError."""
    return _checked(model, model.model_validate, data)
