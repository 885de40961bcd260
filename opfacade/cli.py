"""`opfacade catalog | explain | verify | bench`.

    opfacade catalog [--op OP] [--json]
    opfacade explain alibi_backward batch=2 heads=4 query_len=16 key_len=16 element=f32 --arch sm90
    opfacade verify [--op OP] [--runs N] [--out catalog/verified]      (GPU)
    opfacade bench [--json FILE] [--quick]                               (GPU)
"""

from __future__ import annotations

import argparse
import sys

from .errors import OpFacadeError

__all__ = ["main"]


def _catalog(args: argparse.Namespace) -> int:
    from .catalog import catalog_json, catalog_table

    print(catalog_json(args.op) if args.json else catalog_table(args.op, markdown=False), end="")
    return 0


def _parse_fields(pairs: list[str]) -> dict[str, str]:
    fields = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"opfacade explain: expected key=value, got {pair!r}")
        fields[key] = value
    return fields


def _explain(args: argparse.Namespace) -> int:
    from ._registry import op_named
    from .plan import Plan

    op = op_named(args.op)
    desc = op.descriptor(**_parse_fields(args.fields))
    pref = {"deterministic": args.deterministic, "objective": args.objective}
    if args.backend:
        pref["backends"] = args.backend
    if args.workspace_limit is not None:
        pref["workspace_limit"] = args.workspace_limit
    device = "cpu" if args.device == "cpu" else (int(args.device) if args.device else None)
    report = Plan.explain(desc, pref, device=device, arch=args.arch)
    print(report.to_json() if args.json else report.table())
    return 0 if report.chosen else 1


def _verify(args: argparse.Namespace) -> int:
    from .verify import verify_all

    record = verify_all(op=args.op, runs=args.runs, out_dir=args.out, seed=args.seed)
    return 0 if record["passed"] else 1


def _bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    run_bench(json_path=args.json, quick=args.quick, ops=args.op)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opfacade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    catalog = sub.add_parser("catalog", help="list every kernel SKU and its guarantee")
    catalog.add_argument("--op", help="only this op (e.g. alibi_forward)")
    catalog.add_argument("--json", action="store_true", help="a JSON list of SKU objects")
    catalog.set_defaults(run=_catalog)

    explain = sub.add_parser("explain", help="why each candidate SKU was chosen or rejected")
    explain.add_argument("op")
    explain.add_argument("fields", nargs="*", help="descriptor fields as key=value")
    explain.add_argument("--arch", help="select for this arch without a GPU, e.g. sm90")
    explain.add_argument("--device", help="CUDA ordinal, or 'cpu' for the reference")
    explain.add_argument("--deterministic", action="store_true")
    explain.add_argument("--backend", action="append", help="allowed backend (repeatable)")
    explain.add_argument("--workspace-limit", type=int)
    explain.add_argument("--objective", choices=("speed", "memory"), default="speed")
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(run=_explain)

    verify = sub.add_parser("verify", help="GPU: every SKU against the float64 reference")
    verify.add_argument("--op")
    verify.add_argument("--runs", type=int, default=3)
    verify.add_argument("--seed", type=int)
    verify.add_argument("--out", default="catalog/verified", help="where <gpu>.json goes")
    verify.set_defaults(run=_verify)

    bench = sub.add_parser("bench", help="GPU: each op against its peers, as ratios")
    bench.add_argument("--json", help="also write the results here")
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    bench.add_argument("--op", action="append", help="only this family (alibi, linear, sdpa)")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except OpFacadeError as error:
        print(f"opfacade {args.command}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
