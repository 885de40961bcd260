"""Turning pydantic's validation errors into opfacade's typed errors that name the field."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import InvalidProblem

M = TypeVar("M", bound=BaseModel)


def invalid_problem(model: type[BaseModel], error: ValidationError) -> InvalidProblem:
    """One sentence per failed field: '<Model>.<field>: <what was wrong> (got <value>)'."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    parts = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"]) or "(model)"
        message = item["msg"].removeprefix("Value error, ")
        got = f" (got {item['input']!r})" if item["type"] != "missing" and loc != "(model)" else ""
        parts.append(f"{model.__name__}.{loc}: {message}{got}")
    return InvalidProblem("; ".join(parts), field=field)


def validated(model: type[M], data: dict) -> M:
    """Builds ``model`` from ``data``, raising InvalidProblem instead of ValidationError."""
    try:
        return model(**data)
    except ValidationError as error:
        raise invalid_problem(model, error) from None
