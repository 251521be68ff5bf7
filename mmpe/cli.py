"""The `mmpe` command line.

    mmpe show NAME                             one encoding: paper, hook, capabilities, options
    mmpe show PRESET|CHECKPOINT [--depth N] [--option K=V]
                                               a layer schedule (llama4, gemma3 …) layer by layer
    mmpe --version                             mmpe's version (and torch's, Python's)
    mmpe list [--hook H] [--coords KIND] [--matrix] [--width N]
                                               registered encodings under a header: hook, the
                                               coordinate capabilities they need, how many
                                               shipped coordinate types run them, their papers;
                                               --matrix: a column per coordinate type
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
Every error is one line on stderr naming the argument or file, exit code 2 (MMPE_DEBUG=1
shows the traceback of an unexpected one). An argument the command does not read for what it
was asked (`mmpe show rope --depth 3`: an encoding's card has no layers) is refused by name,
never ignored; a misspelt command gets its close match (`mmpe lst`: did you mean 'list'?).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap

# Nothing of mmpe beyond the package's name is imported here: `mmpe --version` and
# `mmpe --help` answer without torch (issue 52); each command imports what it runs.


def _list(args: argparse.Namespace) -> int:
    from mmpe import registry

    if args.coords is not None:
        registry.get("alibi").supports(args.coords)  # an unknown kind: did you mean …
    entries = registry.available(hook=args.hook, coords=args.coords)
    width = args.width or shutil.get_terminal_size((100, 24)).columns
    if args.matrix:
        print(matrix_table(entries, width))
    else:
        print(list_table(entries, width))
    return 0


def _fit(cells: list[list[str]], width: int, last_min: int = 12) -> list[str]:
    """Rows of left-aligned columns two spaces apart; the last column is cut with '…' so that
    each line is at most `width` characters (never below `last_min` characters for it)."""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    lead = sum(widths) + 2 * len(widths)
    room = max(width - lead, last_min)
    lines = []
    for row in cells:
        last = row[-1] if len(row[-1]) <= room else row[-1][: room - 1] + "…"
        lines.append("".join(f"{c:<{w}}  " for c, w in zip(row[:-1], widths, strict=True)) + last)
    return [line.rstrip() for line in lines]


def list_table(entries: list, width: int = 100) -> str:
    """The table `mmpe list` prints: one row per encoding.

    `mmpe list`: one row per encoding (name, hook, fixed/learned, the capabilities it
    needs, how many of the shipped coordinate types run it, its paper) under a header, each
    line at most `width` characters."""
    from mmpe import registry

    kinds = registry.shipped_coordinate_types()
    cells = [["NAME", "HOOK", "PARAMS", "NEEDS", "RUNS ON", "PAPER"]]
    for e in entries:
        runs = set(e.coords).intersection(kinds)  # (e.coords checks every type)
        on = ("all " if len(runs) == len(kinds) else "") + f"{len(runs)}/{len(kinds)}"
        cells.append([e.name, e.hook, "learned" if e.learnable else "fixed",
                      "+".join(c.__name__ for c in e.needs) or "any", on, e.paper])
    foot = (f"{len(entries)} encodings. --matrix: which coordinate types run each; "
            "`mmpe show NAME`: one in full.")
    return "\n".join(_fit(cells, width)) + "\n" + textwrap.fill(foot, max(width, 20))


def matrix_table(entries: list, width: int = 100) -> str:
    """The table `mmpe list --matrix` prints: encodings × shipped coordinate types.

    `mmpe list --matrix`: encodings × shipped coordinate types, `✓` where it runs, `·`
    where the coordinates lack a capability it needs (docs/matrix.md names which).

    Every column is headed by the type's whole name; when the types do not fit in `width`
    characters beside the names, they are split over several tables, each repeating the
    names, so that no line is longer than `width` (unless one type alone does not fit)."""
    from mmpe import registry

    kinds = list(registry.shipped_coordinate_types())
    # the name and hook columns, two spaces after each, then the types' columns
    lead = sum(max(len(c) for c in (head, *cells)) + 2 for head, cells in
               (("NAME", [e.name for e in entries]), ("HOOK", [e.hook for e in entries])))
    runs = {e.name: set(e.coords) for e in entries}  # (a property that checks every type)
    groups: list[list[str]] = [[]]
    for kind in kinds:
        if groups[-1] and lead + sum(len(k) + 2 for k in groups[-1]) + len(kind) > width:
            groups.append([])
        groups[-1].append(kind)
    tables = []
    for group in groups:
        cells = [["NAME", "HOOK", *group]]
        cells += [[e.name, e.hook, *("✓" if k in runs[e.name] else "·" for k in group)]
                  for e in entries]
        tables.append("\n".join(_fit(cells, width, last_min=len(group[-1]))))
    legend = (f"{len(entries)} encodings × {len(kinds)} coordinate types: ✓ runs, · refused "
              "(the coordinates lack a capability it needs; `mmpe show NAME` lists them).")
    return "\n\n".join(tables) + "\n" + textwrap.fill(legend, max(width, 20))


def _compare(args: argparse.Namespace, rest: list[str]) -> int:
    try:
        from mmpe.recipes.compare import compare
    except ImportError as err:
        # The recipes are an extra: say which install brings the missing package.
        print(f"mmpe compare: {err}; the recipes need `pip install 'mmpe[recipes,data]'`",
              file=sys.stderr)
        return 2

    _check_recipe(args.recipe)
    _check_encoding_list(args.encodings)
    _read_store(args.store, args.recipe)  # a malformed store fails before any training
    table = compare(args.recipe, encodings=args.encodings, family=args.family,
                    out_dir=args.out, seed=args.seed, cli_args=rest, seeds=args.seeds,
                    store=args.store, setting=args.setting, rerun=args.rerun, jobs=args.jobs,
                    allow_dirty=args.allow_dirty)
    print(table)
    return 0


def _report(args: argparse.Namespace) -> int:
    from mmpe.results import report

    try:
        # A block's columns and their direction are its recipe's (`CompareSpec`).
        from mmpe.recipes.compare import recipe_spec
    except ImportError as err:
        print(f"mmpe report: {err}; the recipes need `pip install 'mmpe[recipes,data]'`",
              file=sys.stderr)
        return 2
    if args.check or args.write:
        flag = "--check" if args.check else "--write"
        _refuse_unread("report", f"{flag} FILES", {"RECIPE": args.recipe is not None,
                                        "--setting": args.setting is not None,
                                        "--plot": args.plot is not None,
                                        "--no-plots": args.no_plots and bool(args.check)},
                       " (every marked block of the files, each with the recipe it names)")
        pages = {path: _read_page(path, flag) for path in (args.check or args.write)}
        count = _check_page_stores(pages, args.store)
    if args.check:
        bad = report.stale(args.check, args.store, specs=recipe_spec)
        for line in bad:
            print(f"stale: {line}", file=sys.stderr)
        if not bad:
            files = f"{len(pages)} file" + ("s" if len(pages) != 1 else "")
            print(f"report --check: all {count} blocks of {files} match the store {args.store}")
        return 1 if bad else 0
    if args.write:
        for path, text in pages.items():
            new = report.rewrite(text, args.store, plots=not args.no_plots, specs=recipe_spec)
            if new != text:
                open(path, "w", encoding="utf-8").write(new)
                print(f"rewrote {path}")
        return 0
    if not args.recipe:
        raise ValueError("mmpe report: give a RECIPE, or --write / --check FILES")
    _refuse_unread("report", args.recipe, {"--no-plots": args.no_plots},
                   " (--no-plots is read with --write only)")
    _check_recipe(args.recipe, measurements=True)
    spec = recipe_spec(args.recipe)
    records = _read_store(args.store, args.recipe)
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


def _refuse_unread(command: str, form: str, given: dict[str, bool], why: str = "") -> None:
    """An argument the command reads in none of what it does with the others is refused,
    naming it (as `mmpe plot` refuses figure options its figures do not read), never ignored.

    Raises:
        ValueError: a flag of `given` (flag -> whether it was given).
    """
    for flag, was_given in given.items():
        if was_given:
            raise ValueError(f"{flag} does not change `mmpe {command} {form}`{why}; leave it out")


def _check_recipe(name: str, measurements: bool = False) -> None:
    """An unknown recipe fails with at most five close names (before any import of it);
    `measurements`: the stored measurements (`mmpe.recipes.MEASUREMENTS`) count too."""
    from mmpe import registry
    from mmpe.recipes import MEASUREMENTS, RECIPES

    known = {**RECIPES, **(MEASUREMENTS if measurements else {})}
    if name not in known:
        raise ValueError(f"unknown recipe {name!r}.{registry.did_you_mean(name, known)} "
                         f"known recipes: {', '.join(sorted(known))}")


def _check_encoding_list(encodings: str | None) -> None:
    """`--encodings` names at least one encoding, with no empty name between its commas."""
    if encodings is None:
        return
    names = [n.strip() for n in encodings.split(",")]
    if not any(names):
        raise ValueError(f"--encodings {encodings!r} names no encoding; give registry names "
                         "separated by commas (e.g. rope,alibi), or 'all'")
    if not all(names):
        raise ValueError(f"--encodings {encodings!r} has an empty name (position "
                         f"{names.index('') + 1}); give names separated by single commas")


def _read_text(path: str, what: str) -> str:
    """A UTF-8 text file, or one error line naming it and the argument it came from."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ValueError(f"{what}: no such file {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{what}: {path} is a folder, not a file") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{what}: {path} is not UTF-8 text (byte {err.start}: "
                         f"{err.reason})") from None
    except OSError as err:
        raise ValueError(f"{what}: cannot read {path} ({err.strerror})") from None


def _read_page(path: str, flag: str) -> str:
    return _read_text(path, f"report {flag}")


def _read_store(store_dir: str, recipe: str) -> list[dict]:
    """The stored runs of `recipe`, every line checked first: a file that is not UTF-8, a line
    that is not JSON, or a record whose `metrics` is not an object of numbers fails with one
    line naming the file and the line."""
    import json

    from mmpe.results import store

    path = store.store_file(store_dir, recipe)
    if not path.exists():
        return []
    text = _read_text(str(path), f"--store {store_dir}")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--store {store_dir}: {path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: a {type(record).__name__}, not a run record (object)")
        metrics = record.get("metrics")
        if not isinstance(metrics, dict) or not all(
                isinstance(k, str) and (v is None or isinstance(v, (int, float))
                                        and not isinstance(v, bool)) for k, v in metrics.items()):
            raise ValueError(f"{where}: 'metrics' must be an object of numbers (or null), got "
                             f"{json.dumps(metrics)[:60]}")
    return store.read(store_dir, recipe)


def _check_page_stores(pages: dict[str, str], store_dir: str) -> int:
    """Reads (and so checks) the store of every recipe the pages' report blocks name; the
    number of report and bench blocks."""
    from mmpe.results import bench_report, report

    count = 0
    for text in pages.values():
        found = report.blocks(text)
        for block, _ in found:
            _check_recipe(block.recipe, measurements=True)
            _read_store(store_dir, block.recipe)
        count += len(found) + len(bench_report.blocks(text))
    return count


def _version() -> str:
    """mmpe's version, and torch's as installed (read from its metadata: importing torch takes
    seconds)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import mmpe

    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    return f"mmpe {mmpe.__version__} (torch {torch}, Python {platform.python_version()})"


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (the usage is one `--help` away)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


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
    parser = _Parser(prog="mmpe", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version(),
                        help="mmpe's version (and torch's, Python's), then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    # the command is the first word (mmpe's own options take no value); only its arguments are
    # added, since some read the registry or the plot kinds (torch, seconds to import)
    given = next((a for a in argv if not a.startswith("-")), None)
    if given is not None and given not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(given, list(COMMANDS), n=1)
        parser.error(f"unknown command {given!r}" + (f"; did you mean {close[0]!r}?" if close
                                                      else "")
                     + f" (commands: {', '.join(COMMANDS)})")
    for name, (about, add_arguments) in COMMANDS.items():
        command = sub.add_parser(name, **about)
        if name == given:
            add_arguments(command)
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
    except BrokenPipeError:
        raise  # `mmpe list | head`: main() exits quietly
    except (KeyError, ValueError, LookupError, OSError, TypeError) as err:
        return _error(args.command, err)
    except Exception as err:  # one line, never a traceback; MMPE_DEBUG=1 shows it
        if os.environ.get("MMPE_DEBUG"):
            raise
        return _error(args.command, err, unexpected=True)


def _error(command: str, err: BaseException, unexpected: bool = False) -> int:
    """Prints `mmpe COMMAND: error: …` as one line to stderr; the exit code 2."""
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    if unexpected:
        text = f"{type(err).__name__}: {text} (MMPE_DEBUG=1 shows the traceback)"
    text = " ".join(str(text).split()) or type(err).__name__
    for prefix in (f"mmpe {command}: ", f"mmpe: {command}: ", f"{command}: "):
        text = text.removeprefix(prefix)
    print(f"mmpe {command}: error: {text}", file=sys.stderr)
    return 2


def _show(args: argparse.Namespace) -> str:
    """What `mmpe show NAME` prints: a schedule preset layer by layer, the schedule a checkpoint
    holds, or an encoding's description."""
    import json
    import os

    from mmpe import registry
    from mmpe.schedule import PRESETS, LayerSchedule

    unread = {"--depth": args.depth is not None, "--option": bool(args.option)}
    if args.name in PRESETS:
        depth = DEFAULT_SHOW_DEPTH if args.depth is None else args.depth
        options = {}
        for item in args.option:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"show: --option must be KEY=VALUE, got {item!r}")
            try:
                options[key] = json.loads(value)
            except json.JSONDecodeError:
                options[key] = value
        if not 1 <= depth <= MAX_SHOW_DEPTH:
            raise ValueError(f"show: --depth must be 1 to {MAX_SHOW_DEPTH} layers (a line each), "
                             f"got {depth}")
        schedule = LayerSchedule.parse({"preset": args.name, **options}, depth)
        _check_schedule_encodings(schedule, f"show {args.name} --option "
                                  + " --option ".join(args.option) if args.option else "")
        return schedule.describe()
    if os.path.isfile(args.name):
        _refuse_unread("show", args.name, unread, " (the layer schedule the checkpoint holds, "
                       "as stored)")
        from mmpe.checkpoints import read_checkpoint

        state, _ = read_checkpoint(args.name, "show")  # one ValueError for a corrupt file
        if not isinstance(state, dict):
            raise ValueError(f"show: {args.name} holds no state dict")
        try:
            schedule = LayerSchedule.from_state_dict(state)
        except Exception as err:
            raise ValueError(f"show: {args.name}: its layer schedule does not read "
                             f"({type(err).__name__}: {' '.join(str(err).split())[:80]})") from None
        if schedule is None:
            raise ValueError(f"show: {args.name} holds no layer schedule "
                             "(no '...layer_schedule.settings.config' entry)")
        return schedule.describe()
    try:
        card = registry.describe(args.name)
    except KeyError as err:
        raise KeyError(f"{err.args[0]}; schedule presets: {', '.join(sorted(PRESETS))}") from None
    # an encoding's card lists its options with their defaults; --depth and --option shape a
    # preset's schedule (llama4, gemma3 …)
    _refuse_unread("show", args.name, unread, " (an encoding's card; --depth and --option "
                   f"shape a schedule preset: {', '.join(sorted(PRESETS))})")
    return card


#: The deepest preset schedule `mmpe show PRESET --depth N` prints (one line per layer).
MAX_SHOW_DEPTH = 4096
#: The layers `mmpe show PRESET` prints without `--depth`.
DEFAULT_SHOW_DEPTH = 12


def _check_schedule_encodings(schedule, where: str) -> None:
    """Builds each distinct encoding config of a schedule once (at a small head size), so that
    an option value the encoding refuses (`local_base=-5`) fails here, naming the option."""
    import json

    from mmpe import registry

    seen = set()
    for layer in schedule:
        for spec in layer.encodings or ():
            key = json.dumps(spec, sort_keys=True, default=str)
            if key in seen:
                continue
            seen.add(key)
            try:
                registry.build(spec, context={"head_dim": 64, "num_heads": 4, "d_model": 256})
            except (ValueError, TypeError, KeyError) as err:
                text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
                raise ValueError(f"{where or 'show'}: {text}") from None


def _list_arguments(p: argparse.ArgumentParser) -> None:
    from mmpe.registry import HOOKS

    p.add_argument("--hook", choices=HOOKS, help="only encodings of this hook")
    p.add_argument("--coords", metavar="KIND",
                   help="only encodings that run on this coordinate type (grid, sphere, graph …)")
    p.add_argument("--matrix", action="store_true",
                   help="encodings x coordinate types: ✓ runs, · refused")
    p.add_argument("--width", type=int, help="line width (default: the terminal's, or $COLUMNS)")


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="text, vision, video, audio, graph, tabular, sphere, multimodal")
    p.add_argument("--encodings", help="comma-separated registry names, or 'all'")
    p.add_argument("--family", help="every encoding of one family (e.g. rotary, bias)")
    p.add_argument("--out", help="output folder (default runs/compare/RECIPE)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--seeds", type=int, help="seeds per encoding (default: the recipe's, 3)")
    p.add_argument("--store", default="runs/results",
                   help="results store: one JSON line per run in STORE/RECIPE.jsonl")
    p.add_argument("--setting", help="name the runs are stored under (default: 'default', "
                   "or custom-<hash> with extra Lightning arguments)")
    p.add_argument("--rerun", action="store_true", help="train runs already stored again")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs trained at once, one process each (MMPE_THREADS threads each)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="store runs from a tree with uncommitted changes in a committed store "
                   "(results/); the records say so and tables flag their rows")


def _report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="?", help="print this recipe's table")
    p.add_argument("--setting", help="stored setting(s), comma-separated (default: default)")
    p.add_argument("--store", default="runs/results", help="results store (default runs/results)")
    p.add_argument("--plot", help="also draw the metric per column to this PNG")
    p.add_argument("--write", nargs="+", metavar="FILE",
                   help="rewrite every <!-- mmpe:report ... --> block (and its plot) of FILES, "
                   "and every <!-- mmpe:bench ... --> block (from STORE/bench)")
    p.add_argument("--no-plots", action="store_true", help="with --write: tables only")
    p.add_argument("--check", nargs="+", metavar="FILE",
                   help="exit 1 naming every block of FILES that differs from the store")


def _show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="registry name, schedule preset (llama4, gemma3, gemma2, "
                   "cohere2, smollm3) or a checkpoint file")
    p.add_argument("--depth", type=int,
                   help=f"layers of a preset schedule (default {DEFAULT_SHOW_DEPTH}, at most "
                        f"{MAX_SHOW_DEPTH}); refused for an encoding or a checkpoint")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a preset option, e.g. sliding_window=512 (repeatable); refused for an "
                        "encoding or a checkpoint")


def _plot_arguments(p: argparse.ArgumentParser) -> None:
    from mmpe.plot import DEFAULT_SMILES, KINDS

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
                   "transformer.shared_encodings.0 (default: found by parameter names)")
    p.add_argument("--query", type=int, help="the query of the bias row (default 128)")
    p.add_argument("--smiles", default=DEFAULT_SMILES,
                   help="molecule for graph encodings (default: caffeine)")
    p.add_argument("--features", action="store_true",
                   help="sphere: map the raw features (e.g. the harmonics Y_l^m)")
    p.add_argument("--out", default="plots", help="output folder (default ./plots)")
    p.add_argument("--stem", help="file names OUT/STEM_KIND.png (default: the names, '+'-joined)")
    p.add_argument("--show", action="store_true", help="also open the figures on a display")


#: Each command: its `add_parser` keywords (the help `mmpe --help` lists) and the function that
#: adds its arguments.
COMMANDS = {
    "list": ({"help": "registered encodings (a table; --matrix: per coordinate type)",
              "description": "Every registered encoding, one row each under a header: its hook, "
              "whether it has parameters, the coordinate capabilities it needs, how many shipped "
              "coordinate types run it, its paper. --matrix: one column per coordinate type "
              "(the docs' matrix page names what a refused one lacks)."}, _list_arguments),
    "compare": ({"help": "train a recipe with several encodings"}, _compare_arguments),
    "report": ({"help": "tables and plots from stored runs"}, _report_arguments),
    "show": ({"help": "one encoding: paper, hook, capabilities, options; or a layer schedule (a "
              "preset name, or a checkpoint that holds one)"}, _show_arguments),
    "plot": ({"help": "PNG figures of an encoding",
              "description": "Draw an encoding: matrix and similarity (input), bias against "
              "distance or one query's bias row (score), q.k decay (rotary), world map (sphere), "
              "molecule coloured by Laplacian eigenvectors (graph). Prints the paths."},
             _plot_arguments),
}


if __name__ == "__main__":
    raise SystemExit(main())
