"""`opfacade catalog | explain | verify | bench | cache`.

    opfacade catalog [--op OP] [--json]
    opfacade explain alibi_backward batch=2 heads=4 query_len=16 key_len=16 element=f32 --arch sm90
    opfacade verify [--op OP] [--runs N] [--out catalog/verified]      (GPU)
    opfacade bench [--json FILE] [--quick]                               (GPU)
    opfacade cache [--clear]                   (the on-disk caches: NVRTC cubins, cuDNN plans)
    opfacade explain --help                    (every op and its descriptor fields)
    opfacade --version

Exit codes:
    0  done (explain: a SKU serves the problem; verify: every SKU it verified within its guarantee)
    1  explain: no SKU serves the problem; verify: a SKU failed its guarantee
    2  bad input: a usage error, an unknown op or field, an invalid problem or argument
    3  needs what is not here: a GPU, a driver for CUDA 13, or the GPU stack
       (pip install 'opfacade[cu13]')
    4  a GPU library, kernel compilation or launch failed
"""

from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from enum import Enum

from . import __version__
from .errors import (
    BackendUnavailable,
    InvalidArgument,
    InvalidProblem,
    OpFacadeError,
    Unsupported,
)

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_NEEDS_GPU", "EXIT_NOT_SERVED", "EXIT_OK",
           "build_parser", "main"]

EXIT_OK = 0
EXIT_NOT_SERVED = 1  # no SKU serves it, or a SKU failed verification
EXIT_BAD_INPUT = 2  # argparse's own code for usage errors, and InvalidProblem/InvalidArgument
EXIT_NEEDS_GPU = 3  # BackendUnavailable: no GPU, no driver, or the GPU stack not installed
EXIT_FAILED = 4  # any other OpFacadeError: LaunchFailed, CompileError, ...


def _exit_code(error: OpFacadeError) -> int:
    if isinstance(error, InvalidProblem | InvalidArgument):
        return EXIT_BAD_INPUT
    if isinstance(error, BackendUnavailable):
        return EXIT_NEEDS_GPU
    if isinstance(error, Unsupported):  # NoKernelSku, or a library declining a configuration
        return EXIT_NOT_SERVED
    return EXIT_FAILED


# -- the commands ---------------------------------------------------------------------------

def _catalog(args: argparse.Namespace) -> int:
    from .catalog import catalog_json, catalog_table

    print(catalog_json(args.op) if args.json else catalog_table(args.op, markdown=False), end="")
    return EXIT_OK


def _explain(args: argparse.Namespace) -> int:
    from ._internal.device import device_count
    from ._registry import op_named
    from .plan import Plan

    fields = dict(args.fields)
    if len(fields) != len(args.fields):
        keys = [key for key, _ in args.fields]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        raise InvalidProblem(f"each field may be given once, got {', '.join(twice)} more than "
                             f"once", field=twice[0])
    desc = op_named(args.op).descriptor(**fields)
    pref = {"deterministic": args.deterministic, "batch_invariant": args.batch_invariant,
            "objective": args.objective}
    if args.backend:
        pref["backends"] = args.backend
    if args.workspace_limit is not None:
        pref["workspace_limit"] = args.workspace_limit
    if isinstance(args.device, int) and device_count() == 0:
        from .verify import require_gpu

        require_gpu(f"--device {args.device}")  # raises, saying what is missing
    report = Plan.explain(desc, pref, device=args.device, arch=args.arch)
    print(report.to_json() if args.json else report.table())
    return EXIT_OK if report.chosen else EXIT_NOT_SERVED


def _verify(args: argparse.Namespace) -> int:
    from .verify import verify_all

    record = verify_all(op=args.op, runs=args.runs, out_dir=args.out, seed=args.seed)
    return EXIT_OK if record["passed"] else EXIT_NOT_SERVED


def _bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    run_bench(json_path=args.json, quick=args.quick, ops=args.op, graphs=args.graphs)
    return EXIT_OK


def _cache(args: argparse.Namespace) -> int:
    from .caches import clear_disk_caches, disk_caches

    if args.clear:
        print(f"removed {clear_disk_caches()} entries")
    for cache in disk_caches():
        count, size = cache.size()
        print(f"{cache.name:14} {count:6} entries {size / 1e6:10.2f} MB  {cache.path}")
    return EXIT_OK


# -- argument types: a bad value is argparse's usage error (exit 2) --------------------------

def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected a descriptor field as key=value, got {text!r}")
    return key, value


def _device(text: str) -> int | str:
    """'cpu' (the float64 reference), a CUDA ordinal, or cuda:N."""
    if text.strip().lower() == "cpu":
        return "cpu"
    found = re.fullmatch(r"(?:cuda:)?([0-9]{1,9})", text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(
            f"expected a CUDA device ordinal (0, cuda:0) or 'cpu', got {text!r}")
    return int(found.group(1))


def _count(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


# -- explain --help: every op and its descriptor fields, from the registry -------------------

def _type_text(annotation) -> str:
    """A field's type as a user types it: enum and literal values spelled out."""
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "|".join(str(member.value) for member in annotation)
    if isinstance(annotation, type):  # int, float, bool, a model (SlidingWindow)
        return annotation.__name__
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(value) for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        parts = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return "|".join(_type_text(arg) for arg in parts)
    return str(annotation)


def _field_text(name: str, field, accepted_elements: tuple | None = None) -> str:
    kind = _type_text(field.annotation)
    if name == "element" and accepted_elements:  # the contract's accepted set, not the enum
        kind = "|".join(element.value for element in accepted_elements)
    if field.is_required():
        return f"{name}: {kind}"
    default = field.get_default(call_default_factory=True)
    default = default.value if isinstance(default, Enum) else default
    return f"[{name}: {kind} = {default}]"


def ops_help() -> str:
    """Every op in the registry with its descriptor's fields: required ones bare, optional ones
    in brackets with their default."""
    from ._registry import all_ops

    lines = ["ops and their descriptor fields (give them as key=value; [optional = default]):"]
    for op in all_ops():
        lines.append(f"  {op.name} ({op.descriptor.__name__})")
        accepted = getattr(sys.modules[op.descriptor.__module__], "ELEMENTS", None)
        line = ""
        for name, field in op.descriptor.model_fields.items():
            text = _field_text(name, field, accepted)
            if line and len(line) + 2 + len(text) > 90:  # wrap between fields, never inside one
                lines.append("      " + line)
                line = ""
            line = f"{line}  {text}" if line else text
        lines.append("      " + line)
    lines.append("  a SlidingWindow is given as window=left,right (either side may be 'none')")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from ._registry import FAMILIES, all_ops
    from .types import BackendKind

    op_names = [op.name for op in all_ops()]
    parser = argparse.ArgumentParser(prog="opfacade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"opfacade {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    catalog = sub.add_parser("catalog", help="list every kernel SKU and its guarantee")
    catalog.add_argument("--op", choices=op_names, metavar="OP", help="only this op")
    catalog.add_argument("--json", action="store_true", help="a JSON list of SKU objects")
    catalog.set_defaults(run=_catalog)

    explain = sub.add_parser("explain", help="why each candidate SKU was chosen or rejected",
                             epilog=ops_help(),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    explain.add_argument("op", choices=op_names, metavar="op", help="one of the ops below")
    explain.add_argument("fields", nargs="*", type=_key_value, metavar="key=value",
                         help="descriptor fields (below)")
    explain.add_argument("--arch", help="select for this arch without a GPU, e.g. sm90")
    explain.add_argument("--device", type=_device,
                         help="CUDA ordinal (0 or cuda:0), or 'cpu' for the float64 reference")
    explain.add_argument("--deterministic", action="store_true")
    explain.add_argument("--batch-invariant", action="store_true",
                         help="only SKUs whose results for an item do not depend on its batch")
    explain.add_argument("--backend", action="append", choices=[b.value for b in BackendKind],
                         help="allowed backend (repeatable)")
    explain.add_argument("--workspace-limit", type=_count(0), help="bytes")
    explain.add_argument("--objective", choices=("speed", "memory"), default="speed")
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(run=_explain)

    verify = sub.add_parser("verify", help="GPU: every SKU against the float64 reference")
    verify.add_argument("--op", choices=op_names, metavar="OP", help="only this op")
    verify.add_argument("--runs", type=_count(1), default=3)
    verify.add_argument("--seed", type=_count(0))
    verify.add_argument("--out", default="catalog/verified", help="where <gpu>.json goes")
    verify.set_defaults(run=_verify)

    cache = sub.add_parser("cache", help="the on-disk caches (cubins, cuDNN plans); --clear")
    cache.add_argument("--clear", action="store_true", help="delete their entries first")
    cache.set_defaults(run=_cache)

    bench = sub.add_parser("bench", help="GPU: each op against its peers, as ratios")
    bench.add_argument("--json", help="also write the results here")
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    bench.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                       help="time rows with a possibly host-bound contestant again from CUDA "
                            "graphs (--no-graphs: only mark them)")
    from .bench import EXTRA_BENCHES

    benches = [family.name for family in FAMILIES] + list(EXTRA_BENCHES)
    bench.add_argument("--op", action="append", choices=benches, metavar="FAMILY",
                       help="only this family (repeatable): " + ", ".join(benches))
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns its exit code (see the module docstring). Usage errors,
    ``--help`` and ``--version`` end in argparse's SystemExit (2, 0, 0)."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except OpFacadeError as error:
        code = _exit_code(error)
        message = str(error)
        if code in (EXIT_BAD_INPUT, EXIT_NEEDS_GPU):  # one line; a compile log keeps its lines
            message = " ".join(message.split())
        print(f"opfacade {args.command}: {type(error).__name__}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
