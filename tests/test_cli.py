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


@pytest.mark.parametrize("argv", [["catalog", "--op", "nope"], ["explain", "nope"],
                                  ["verify", "--op", "nope"]])
def test_an_unknown_op_is_a_usage_error_listing_the_ops(argv):
    code, out, err = run(argv)
    assert code == 2 and not out
    assert "invalid choice: 'nope'" in err and all(name in err for name in OPS)


@pytest.mark.parametrize("device", ["gpu0", "cuda", "-1", "0x1", "cuda:-1", ""])
def test_explain_device_is_a_usage_error_not_a_traceback(device):
    code, _, err = run([*ALIBI, "--arch", "sm90", "--device", device])
    assert code == 2 and "argument --device: expected a CUDA device ordinal" in err


@pytest.mark.parametrize("fields, message", [
    (["batch=2", "batch=3"], "batch more than once"),
    (["batch=0"], "batch"),
    (["colour=red"], "colour"),
])
def test_invalid_problems_exit_2_in_one_line(fields, message):
    code, out, err = run(["explain", "alibi_forward", "heads=1", "query_len=1", "key_len=1",
                          "element=f32", *fields, "--arch", "sm90"])
    assert code == 2 and not out
    assert err.startswith("opfacade explain: InvalidProblem: ") and err.count("\n") == 1
    assert message in err


def test_explain_exit_codes_served_and_not():
    assert run([*ALIBI, "--arch", "sm90"])[0] == 0
    assert run([*ALIBI, "--device", "cpu"])[0] == 0
    code, out, _ = run([*ALIBI, "--arch", "sm90", "--backend", "cudnn"])
    assert code == 1 and "backend_not_allowed" in out


@pytest.mark.parametrize("error, code", [
    (InvalidProblem("bad field"), 2), (InvalidArgument("bad tensor"), 2),
    (ShapeMismatch("bad shape"), 2), (BackendUnavailable("no cupy"), 3),
    (NoKernelSku("none serves"), 1), (Unsupported("declined"), 1),
    (LaunchFailed("launch failed"), 4), (CompileError("k", "src", ("-O3",), "line 1: x"), 4),
])
def test_each_error_type_has_its_exit_code(monkeypatch, error, code):
    def fail(args):
        raise error

    monkeypatch.setattr(cli, "_catalog", fail)
    got, _, err = run(["catalog"])
    assert got == code and err.startswith(f"opfacade catalog: {type(error).__name__}: ")


class _Runtime:
    """A CUDA runtime that answers getDeviceCount with ``answer`` (raised when an exception)."""

    def __init__(self, answer):
        self.answer = answer

    def getDeviceCount(self):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer, says", [
    (RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"),
     "needs an NVIDIA GPU with a driver for CUDA 13 or newer"),
    (0, "needs an NVIDIA GPU; the CUDA runtime sees none"),
])
@pytest.mark.parametrize("command", [["verify"], ["bench", "--quick"]])
def test_gpu_commands_without_a_gpu_end_in_one_line(monkeypatch, answer, says, command):
    monkeypatch.setattr(verify, "DEVICES", Devices(_Runtime(answer)))
    code, out, err = run(command)
    assert code == 3 and err.count("\n") == 1 and says in err and "Traceback" not in err


# -- any argv: main returns or exits with a documented code, and raises nothing else ----------

_junk = st.text(min_size=0, max_size=12)
_number = st.one_of(st.integers(min_value=-(10**30), max_value=10**30).map(str),
                    st.sampled_from(["1e309", "-0", "nan", "inf", "0x10", "1_000", "٣", "²"]))
_value = st.one_of(_number, _junk, st.sampled_from(["f32", "bf16", "true", "none", "1,2", "{}"]))
_token = st.one_of(
    st.sampled_from(OPS + ["catalog", "explain", "verify", "bench", "alibi", "linear", "sdpa"]),
    st.sampled_from(["--op", "--json", "--arch", "--device", "--deterministic", "--backend",
                     "--workspace-limit", "--objective", "--runs", "--seed", "--out", "--quick",
                     "--help", "-h", "--version", "--", "-", "--nope", "-x", "--json=1"]),
    st.builds(lambda key, value: f"{key}={value}", st.sampled_from(FIELDS) | _junk, _value),
    _number,
    _value,
    st.sampled_from(["sm90", "sm_80", "9.0", "sm1000", "cpu", "cuda:0", "0", "speed", "memory",
                     "cudnn", "reference", "ü", "名前", "\u202e", "a\nb", " "]),
)
_VALID = {"alibi": ["batch=2", "heads=4", "query_len=16", "key_len=16", "element=f32"],
          "linear": ["m=16", "n=16", "k=16", "element=bf16"],
          "sdpa": ["batch=1", "heads_q=2", "heads_kv=2", "seq_q=16", "seq_kv=16", "head_dim=64",
                   "element=f16"],
          "varlen": ["batch=2", "heads_q=2", "heads_kv=2", "head_dim=64", "max_seqlen_q=16",
                     "max_seqlen_kv=16", "element=f32"],
          "decode": ["batch=2", "heads_q=4", "heads_kv=2", "head_dim=64", "element=bf16",
                     "cache=paged", "page_size=16", "max_pages=8"],
          "kv": ["batch=2", "heads_kv=2", "head_dim=64", "element=bf16", "cache=contiguous",
                 "max_seq=64"]}


@st.composite
def _explain_argv(draw) -> list[str]:
    """A well-formed explain call whose values are hostile: a valid problem of a random op
    with some fields replaced or added, a host or arch target (so no GPU is ever asked), and
    random options, so that descriptor and preference validation is what gets exercised."""
    op = draw(st.sampled_from(all_ops()))
    fields = dict(pair.split("=") for pair in _VALID[op.name.partition("_")[0]])
    names = st.sampled_from(sorted(op.descriptor.model_fields)) | _junk.filter(
        lambda key: key and "=" not in key)
    fields.update(draw(st.dictionaries(names, _value, max_size=4)))
    argv = ["explain", op.name, *(f"{key}={value}" for key, value in fields.items())]
    argv += draw(st.sampled_from([["--arch", "sm90"], ["--arch", "sm80"], ["--arch", "sm120"],
                                  ["--device", "cpu"]]))
    for flag, values in draw(st.lists(st.sampled_from([
            ("--deterministic", None), ("--json", None),
            ("--objective", st.sampled_from(["speed", "memory"])),
            ("--workspace-limit", _number), ("--backend", st.sampled_from(
                ["cudnn", "cublaslt", "nvrtc", "reference"]))]), max_size=3)):
        argv += [flag] if values is None else [flag, draw(values)]
    return argv


_argv = st.one_of(
    _explain_argv(),
    _explain_argv(),
    st.lists(_token, max_size=10),
    st.builds(lambda command, rest: [command, *rest],
              st.sampled_from(["catalog", "explain", "verify", "bench"]),
              st.lists(_token, max_size=10)),
    st.builds(lambda rest: [*ALIBI, *rest], st.lists(_token, max_size=6)),
)


def _no_gpu(what):
    raise BackendUnavailable(f"{what}: the fuzz test never touches a GPU")


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(argv=_argv)
def test_any_argv_ends_in_a_documented_exit_code(argv):
    with mock.patch.object(verify, "require_gpu", _no_gpu):
        code, _, err = run(argv)
    assert code in DOCUMENTED, (argv, code, err)
    assert "Traceback" not in err
    if err.startswith("opfacade ") and ": error: " not in err.splitlines()[-1]:
        assert err.count("\n") == 1, err  # a typed error: one line


def test_a_verify_record_names_the_cudnn_it_ran_on(monkeypatch):
    from opfacade._backends.cudnn import runtime

    monkeypatch.setattr(runtime, "backend_version", lambda: 92801)
    monkeypatch.setattr(runtime, "cudnn_module", lambda: mock.Mock(__version__="1.32.0"))
    assert verify._cudnn_versions() == {"cudnn": "9.28.1", "cudnn_frontend": "1.32.0"}
    monkeypatch.setattr(runtime, "backend_version", lambda: None)
    assert verify._cudnn_versions() == {"cudnn": "absent", "cudnn_frontend": "absent"}
