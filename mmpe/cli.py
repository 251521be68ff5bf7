"""The `mmpe` command line.

    mmpe show NAME                             one encoding: paper, hook, capabilities, options
    mmpe show PRESET|CHECKPOINT [--depth N] [--option K=V]
                                               a layer schedule (llama4, gemma3 …) layer by layer
    mmpe list [--hook H] [--coords C]          registered encodings: hook, the coordinate
                                               capabilities they need, the shipped coordinate
                                               types that provide them, and their papers
    mmpe compare RECIPE [--encodings a,b|all] [--family F] [--out DIR] [--seed S] [--seeds N]
                 [--store DIR] [--setting NAME] [--rerun] [--jobs J] [--allow-dirty]
                 [-- LIGHTNING ARGS]
                                               train each (encoding, seed) not yet stored; one
                                               JSON line per run in DIR/RECIPE.jsonl
    mmpe report [RECIPE] [--setting NAME] [--store DIR] [--plot PNG] [--write FILES] [--check FILES]
                                               mean ± sd tables (and plots) from stored runs;
                                               --write rewrites the marked blocks of FILES
    mmpe plot NAME[,NAME...] [--kind auto|matrix|similarity|bias|row|decay|sphere|graph]
              [--length N] [--grid H W] [--d-model D] [--heads H] [--head-dim D]
              [--option key=value ...] [--checkpoint PATH [--prefix P] [--query Q]]
              [--smiles S] [--features] [--out DIR] [--stem S] [--show]
                                               PNG figures of an encoding (docs/plot.md)

Arguments after `--` go to the recipe's LightningCLI (e.g. `--trainer.max_steps 200`).
"""

from __future__ import annotations

import argparse
import os
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
    try:
        from mmpe.recipes.compare import compare
    except ImportError as err:
        # The recipes are an extra: say which install brings the missing package.
        print(f"mmpe compare: {err}; the recipes need `pip install 'mmpe[recipes,data]'`",
              file=sys.stderr)
        return 2

    table = compare(args.recipe, encodings=args.encodings, family=args.family,
                    out_dir=args.out, seed=args.seed, cli_args=rest, seeds=args.seeds,
                    store=args.store, setting=args.setting, rerun=args.rerun, jobs=args.jobs,
                    allow_dirty=args.allow_dirty)
    print(table)
    return 0


def _report(args: argparse.Namespace) -> int:
    from mmpe.results import report, store

    try:
        # A block's columns and their direction are its recipe's (`CompareSpec`).
        from mmpe.recipes.compare import recipe_spec
    except ImportError as err:
        print(f"mmpe report: {err}; the recipes need `pip install 'mmpe[recipes,data]'`",
              file=sys.stderr)
        return 2
    if args.check:
        bad = report.stale(args.check, args.store, specs=recipe_spec)
        for line in bad:
            print(f"stale: {line}", file=sys.stderr)
        return 1 if bad else 0
    if args.write:
        for path in args.write:
            text = open(path, encoding="utf-8").read()
            new = report.rewrite(text, args.store, plots=not args.no_plots, specs=recipe_spec)
            if new != text:
                open(path, "w", encoding="utf-8").write(new)
                print(f"rewrote {path}")
        return 0
    if not args.recipe:
        raise ValueError("mmpe report: give a RECIPE, or --write / --check FILES")
    spec = recipe_spec(args.recipe)
    records = store.read(args.store, args.recipe)
    if not records:
        raise ValueError(f"no stored runs of {args.recipe!r} in {args.store}: "
                         f"run `mmpe compare {args.recipe} --store {args.store}` first")
    settings = args.setting.split(",") if args.setting else ["default"]
    print(report.render_table(spec, records, settings=settings))
    if args.plot:
        print(report.plot(spec, records, args.plot, settings[0]))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from mmpe.plot import plot_command, show

    paths = plot_command(args.name, args.kind, length=args.length, grid=args.grid,
                         d_model=args.d_model, heads=args.heads, head_dim=args.head_dim,
                         options=args.option, checkpoint=args.checkpoint, prefix=args.prefix,
                         query=args.query, smiles=args.smiles, features=args.features,
                         out=args.out, stem=args.stem)
    for path in paths:
        print(path)
    if args.show and not show(paths):
        print("mmpe plot: no display; --show ignored (the PNGs are written)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the try: a closed pipe raises here, not at exit
        return code
    except BrokenPipeError:
        # `mmpe list | head`: the reader left; exit quietly as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None = None) -> int:
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
    p_cmp.add_argument("recipe", help="text, vision, video, audio, graph, tabular, sphere, multimodal")
    p_cmp.add_argument("--encodings", help="comma-separated registry names, or 'all'")
    p_cmp.add_argument("--family", help="every encoding of one family (e.g. rotary, bias)")
    p_cmp.add_argument("--out", help="output folder (default runs/compare/RECIPE)")
    p_cmp.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p_cmp.add_argument("--seeds", type=int, help="seeds per encoding (default: the recipe's, 3)")
    p_cmp.add_argument("--store", default="runs/results",
                       help="results store: one JSON line per run in STORE/RECIPE.jsonl")
    p_cmp.add_argument("--setting", help="name the runs are stored under (default: 'default', "
                       "or custom-<hash> with extra Lightning arguments)")
    p_cmp.add_argument("--rerun", action="store_true", help="train runs already stored again")
    p_cmp.add_argument("--jobs", type=int, default=1,
                       help="runs trained at once, one process each (MMPE_THREADS threads each)")
    p_cmp.add_argument("--allow-dirty", action="store_true",
                       help="store runs from a tree with uncommitted changes in a committed store "
                       "(results/); the records say so and tables flag their rows")
    p_rep = sub.add_parser("report", help="tables and plots from stored runs")
    p_rep.add_argument("recipe", nargs="?", help="print this recipe's table")
    p_rep.add_argument("--setting", help="stored setting(s), comma-separated (default: default)")
    p_rep.add_argument("--store", default="runs/results", help="results store (default runs/results)")
    p_rep.add_argument("--plot", help="also draw the metric per column to this PNG")
    p_rep.add_argument("--write", nargs="+", metavar="FILE",
                       help="rewrite every <!-- mmpe:report ... --> block (and its plot) of FILES, "
                       "and every <!-- mmpe:bench ... --> block (from STORE/bench)")
    p_rep.add_argument("--no-plots", action="store_true", help="with --write: tables only")
    p_rep.add_argument("--check", nargs="+", metavar="FILE",
                       help="exit 1 naming every block of FILES that differs from the store")
    p_show = sub.add_parser("show", help="one encoding: paper, hook, capabilities, options; or "
                            "a layer schedule (a preset name, or a checkpoint that holds one)")
    p_show.add_argument("name", help="registry name, schedule preset (llama4, gemma3, gemma2, "
                        "cohere2, smollm3) or a checkpoint file")
    p_show.add_argument("--depth", type=int, default=12,
                        help="layers of a preset schedule (default 12)")
    p_show.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a preset option, e.g. sliding_window=512 (repeatable)")
    _add_plot_parser(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return _list(args)
        if args.command == "show":
            print(_show(args))
            return 0
        if args.command == "plot":
            return _plot(args)
        if args.command == "report":
            return _report(args)
        return _compare(args, rest)
    except (KeyError, ValueError, LookupError) as err:
        print(f"mmpe: error: {err}", file=sys.stderr)
        return 2


def _show(args: argparse.Namespace) -> str:
    """What `mmpe show NAME` prints: a schedule preset layer by layer, the schedule a checkpoint
    holds, or an encoding's description."""
    import json
    import os

    from mmpe.schedule import PRESETS, LayerSchedule

    if args.name in PRESETS:
        options = {}
        for item in args.option:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"show: --option must be KEY=VALUE, got {item!r}")
            try:
                options[key] = json.loads(value)
            except json.JSONDecodeError:
                options[key] = value
        return LayerSchedule.parse({"preset": args.name, **options}, args.depth).describe()
    if os.path.isfile(args.name):
        from mmpe.checkpoints import read_checkpoint

        state, _ = read_checkpoint(args.name, "show")
        schedule = LayerSchedule.from_state_dict(state)
        if schedule is None:
            raise ValueError(f"show: {args.name} holds no layer schedule "
                             "(no '...layer_schedule.settings.config' entry)")
        return schedule.describe()
    try:
        return registry.describe(args.name)
    except KeyError as err:
        raise KeyError(f"{err.args[0]}; schedule presets: {', '.join(sorted(PRESETS))}") from None


def _add_plot_parser(sub: argparse._SubParsersAction) -> None:
    from mmpe.plot import DEFAULT_SMILES, KINDS

    p = sub.add_parser(
        "plot", help="PNG figures of an encoding",
        description="Draw an encoding: matrix and similarity (input), bias against distance or "
                    "one query's bias row (score), q.k decay (rotary), world map (sphere), "
                    "molecule coloured by Laplacian eigenvectors (graph). Prints the paths.")
    p.add_argument("name", help="registry name; comma-separated rotary names are overlaid")
    p.add_argument("--kind", choices=KINDS, default="auto",
                   help="figure kind (auto: by the encoding's hook and capabilities)")
    p.add_argument("--length", type=int, help="tokens of the sequence (128; a bias row: "
                   "query + 1); decay: the largest distance (1024)")
    p.add_argument("--grid", type=int, nargs="+", metavar="N",
                   help="draw on a grid of this shape, e.g. --grid 14 14")
    p.add_argument("--d-model", type=int, help="d_model of input encodings (64, or the "
                   "checkpoint's)")
    p.add_argument("--heads", type=int, help="heads of score encodings (8, or the checkpoint's)")
    p.add_argument("--head-dim", type=int, help="head_dim (rotary: 128)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an encoding option, or a context key such as "
                        "original_max_position_embeddings=256 (repeatable)")
    p.add_argument("--checkpoint", help="read the encoding's parameters from this "
                   "checkpoint (torch.load(PATH)['state_dict'])")
    p.add_argument("--prefix", help="its module in the state dict, e.g. "
                   "transformer.blocks.0.attn.scores.0 (default: found by parameter names)")
    p.add_argument("--query", type=int, help="the query of the bias row (default 128)")
    p.add_argument("--smiles", default=DEFAULT_SMILES,
                   help="molecule for graph encodings (default: caffeine)")
    p.add_argument("--features", action="store_true",
                   help="sphere: map the raw features (e.g. the harmonics Y_l^m)")
    p.add_argument("--out", default="plots", help="output folder (default ./plots)")
    p.add_argument("--stem", help="file names OUT/STEM_KIND.png (default: the names, '+'-joined)")
    p.add_argument("--show", action="store_true", help="also open the figures on a display")


if __name__ == "__main__":
    raise SystemExit(main())
