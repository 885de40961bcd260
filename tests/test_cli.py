"""The command line: --version, explain --help from the registry, and its exit codes (0 done,
1 not served, 2 bad input, 3 needs a GPU, 4 a library failed), whatever argv it is handed."""

from __future__ import annotations

import contextlib
import io
import sys
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opfacade
from opfacade import cli, verify
from opfacade._internal.device import Devices
from opfacade._registry import all_ops
from opfacade.errors import (
    BackendUnavailable,
    CompileError,
    InvalidArgument,
    InvalidProblem,
    LaunchFailed,
    NoKernelSku,
    ShapeMismatch,
    Unsupported,
)

DOCUMENTED = {cli.EXIT_OK, cli.EXIT_NOT_SERVED, cli.EXIT_BAD_INPUT, cli.EXIT_NEEDS_GPU,
              cli.EXIT_FAILED}
OPS = [op.name for op in all_ops()]
FIELDS = sorted({name for op in all_ops() for name in op.descriptor.model_fields})
ALIBI = ["explain", "alibi_backward", "batch=2", "heads=4", "query_len=16", "key_len=16",
         "element=f32"]


def run(argv: list[str]) -> tuple[int, str, str]:
    """main(argv)'s exit code (argparse's SystemExit included), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit:
            code = exit.code
    return code, out.getvalue(), err.getvalue()


def test_the_documented_codes_are_distinct_and_in_the_docstring():
    assert len(DOCUMENTED) == 5
    for code in DOCUMENTED:
        assert f"\n    {code}  " in cli.__doc__


def test_version():
    assert run(["--version"]) == (0, f"opfacade {opfacade.__version__}\n", "")


def test_explain_help_lists_every_op_and_its_fields():
    code, out, _ = run(["explain", "--help"])
    assert code == 0
    for op in all_ops():
        assert f"  {op.name} ({op.descriptor.__name__})" in out
        for name, field in op.descriptor.model_fields.items():
            assert f"{name}: " in out
            if not field.is_required():
                assert f"[{name}: " in out
    assert "element: f64|f32|" in out and "[activation: none|relu|" in out
    assert "[dropout_p: float = 0.0]" in out and "[weight_layout: kn|nk = nk]" in out


def test_explain_help_lists_the_elements_each_descriptor_accepts():
    """Each op's element list is its contract's ELEMENTS, which its validator enforces."""
    _, out, _ = run(["explain", "--help"])
    fields: dict[str, str] = {}
    header = None
    for line in out.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            header = line.split()[0]
        elif header is not None and line.startswith("      "):
            fields[header] = fields.get(header, "") + line + " "
    for op in all_ops():
        accepted = sys.modules[op.descriptor.__module__].ELEMENTS
        assert f"element: {'|'.join(e.value for e in accepted)} " in fields[op.name], op.name
