"""The ``mmpe`` command line.

    mmpe list [--hook H] [--coords C]          registered encodings: hook, the coordinate
                                               capabilities they need, the shipped coordinate
                                               types that provide them, and their papers
    mmpe compare RECIPE [--encodings a,b|all] [--family F] [--out DIR] [--seed S] [-- LIGHTNING ARGS]

Arguments after ``--`` go to the recipe's LightningCLI (e.g. ``--trainer.max_steps 200``).
"""

from __future__ import annotations

import argparse
import sys

from mmpe import registry


def _list(args: argparse.Namespace) -> int:
    entries = registry.available(hook=args.hook, coords=args.coords)
    width = max((len(e.name) for e in entries), default=4)
    for e in entries:
        kind = "learned" if e.learnable else "fixed"
        needs = "+".join(c.__name__ for c in e.needs) or "any"
        print(f"{e.name:<{width}}  {e.hook:<6}  {kind:<7}  {needs:<22}  "
              f"{','.join(e.coords):<40}  {e.paper}")
    return 0


def _compare(args: argparse.Namespace, rest: list[str]) -> int:
    from mmpe.compare import compare

    table = compare(args.recipe, encodings=args.encodings, family=args.family,
                    out_dir=args.out, seed=args.seed, cli_args=rest)
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="mmpe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="registered encodings")
    p_list.add_argument("--hook", choices=registry.HOOKS)
    p_list.add_argument("--coords")
    p_cmp = sub.add_parser("compare", help="train a recipe with several encodings")
    p_cmp.add_argument("recipe", help="text, vision, video, audio, graph, tabular, sphere")
    p_cmp.add_argument("--encodings", help="comma-separated registry names, or 'all'")
    p_cmp.add_argument("--family", help="every encoding of one family (e.g. rotary, bias)")
    p_cmp.add_argument("--out", help="output folder (default runs/compare/RECIPE)")
    p_cmp.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return _list(args)
        return _compare(args, rest)
    except (KeyError, ValueError) as err:
        print(f"mmpe: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
