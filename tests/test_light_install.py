"""The base install (numpy and pydantic, no `opfacade[cu13]`) serves the catalog, explain and the
float64 host reference, and says what to install for the rest.

A child process imports opfacade with CuPy, cuda-python, nvmath, the cuDNN frontend, the
nvidia-* wheels, torch and JAX made unimportable, as on a machine with only the base install;
it needs no GPU and runs wherever the rest of the CPU suite runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opfacade

HINT = "pip install 'opfacade[cu13]'"
BLOCKED = ("cupy", "cupyx", "cupy_backends", "fastrlock", "cuda", "nvmath", "cudnn", "nvidia",
           "torch", "jax", "jaxlib", "ml_dtypes")

CHILD = r"""
import contextlib, importlib.abc, io, json, sys

BLOCKED = set(sys.argv[1].split(","))


class Unimportable(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Unimportable())

import numpy as np

import opfacade
from opfacade import AlibiBackwardArgs, AlibiBackwardDescriptor, NoKernelSku, Plan
from opfacade.cli import main

found = {}


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit:
            code = exit.code
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


found["catalog"] = cli("catalog")
found["explain"] = {
    "alibi": cli("explain", "alibi_backward", "batch=2", "heads=4", "query_len=16",
                 "key_len=16", "element=f32", "--arch", "sm90", "--json"),
    "linear": cli("explain", "linear_forward", "m=16", "n=16", "k=16", "element=bf16",
                  "--arch", "sm90", "--json"),
    "sdpa": cli("explain", "sdpa_forward", "batch=1", "heads_q=2", "heads_kv=2", "seq_q=16",
                "seq_kv=16", "head_dim=64", "element=f16", "--arch", "sm90", "--json"),
    "host": cli("explain", "alibi_backward", "batch=2", "heads=4", "query_len=16", "key_len=16",
                "element=f32", "--device", "cpu"),
}
found["verify"] = cli("verify")
found["bench"] = cli("bench", "--quick")
found["device0"] = cli("explain", "alibi_forward", "batch=1", "heads=1", "query_len=1",
                       "key_len=1", "element=f32", "--device", "0")

desc = AlibiBackwardDescriptor(batch=2, heads=3, query_len=5, key_len=7, element="f64")
rng = np.random.default_rng(0)
dy = rng.standard_normal((2, 3, 5, 7))
d_in, d_slopes = np.empty_like(dy), np.empty(3)
with Plan.select(desc, device="cpu") as plan:
    plan.run(AlibiBackwardArgs(grad_output=dy, grad_input=d_in, grad_slopes=d_slopes))
    found["host_sku"] = plan.sku.id
distance = np.arange(7)[None, :] - np.arange(5)[:, None]
found["host_ok"] = bool(np.array_equal(d_in, dy)
                        and np.allclose(d_slopes, (dy * distance).sum(axis=(0, 2, 3))))
functional_in, functional_slopes = opfacade.alibi_backward(dy)
found["functional_ok"] = bool(np.array_equal(functional_in, d_in)
                              and np.allclose(functional_slopes, d_slopes))
try:
    Plan.select(desc, arch="sm90")
    found["gpu_select"] = "selected"
except NoKernelSku as error:
    found["gpu_select"] = str(error)
found["imported"] = sorted({name.partition(".")[0] for name in sys.modules} & BLOCKED)
print(json.dumps(found))
"""


@pytest.fixture(scope="module", params=["as found", "libcuda stand-in"])
def light(request):
    """What the child process saw, run once for this module: with libcuda as the machine has it
    (none on a CPU machine), and with a stand-in that answers as a GPU machine's driver does
    (tests/data/libcuda_stand_in.c, found by its name first), since the device questions go to
    libcuda before anything of the GPU stack."""
    root = str(Path(opfacade.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    if request.param == "libcuda stand-in":
        folder = str(request.getfixturevalue("libcuda_stand_in").parent)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (folder, os.environ.get("LD_LIBRARY_PATH")) if p)
    done = subprocess.run([sys.executable, "-c", CHILD, ",".join(BLOCKED)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_nothing_of_the_gpu_stack_is_imported(light):
    assert light["imported"] == []


def test_the_catalog_lists_every_sku(light):
    assert light["catalog"]["code"] == 0
    assert "alibi_forward.nvrtc.bf16" in light["catalog"]["out"]
    assert "sdpa_backward.cudnn.f16" in light["catalog"]["out"]


@pytest.mark.parametrize("op, sku", [("alibi", "alibi_backward.nvrtc.f32"),
                                     ("linear", "linear_forward.cublaslt.bf16"),
                                     ("sdpa", "sdpa_forward.cudnn.f16")])
def test_gpu_skus_are_backend_unavailable_with_the_install_command(light, op, sku):
    explained = light["explain"][op]
    assert explained["code"] == 1, explained["err"]  # no SKU serves it here
    verdicts = {c["sku"]: c for c in json.loads(explained["out"])["candidates"]}
    assert verdicts[sku]["code"] == "backend_unavailable"
    assert HINT in verdicts[sku]["detail"]


def test_the_host_reference_runs(light):
    assert light["explain"]["host"]["code"] == 0
    assert light["host_sku"] == "alibi_backward.reference"
    assert light["host_ok"] and light["functional_ok"]


def test_selecting_for_a_gpu_says_what_to_install(light):
    assert HINT in light["gpu_select"]


@pytest.mark.parametrize("command", ["verify", "bench", "device0"])
def test_gpu_commands_end_in_one_line_and_exit_3(light, command):
    ran = light[command]
    assert ran["code"] == 3
    assert ran["err"].count("\n") == 1 and "Traceback" not in ran["err"]
    assert "BackendUnavailable" in ran["err"] and HINT in ran["err"]

