"""Every results table in README.md and docs/ is what `mmpe report` renders from the committed
store (results/): a typed or stale number fails here."""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from mmpe.recipes.compare import recipe_spec  # noqa: E402

from mmpe.results import report, store  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STORE = ROOT / "results"


def _blocks():
    return [(page, block) for page in PAGES for block, _ in report.blocks(page.read_text())]


def test_every_block_matches_the_committed_store():
    assert _blocks(), "README.md and docs/ have no mmpe:report blocks"
    assert report.stale(PAGES, STORE, specs=recipe_spec) == []


def test_every_plot_a_block_names_exists():
    """`make report` draws them; a page must not point at a figure that was never rendered."""
    missing = [block.plot for _, block in _blocks() if block.plot and not (ROOT / block.plot).is_file()]
    assert not missing, f"run `make report`: {missing}"


def test_every_block_has_three_seeds_per_row():
    """A table stands on 3 seeds per row; one with fewer must say it is preliminary (visibly),
    and the mark must go once every row has its seeds."""
    for page, block in _blocks():
        seeds = report.seeds_per_row(block, store.read(STORE, block.recipe))
        short = {enc: n for enc, n in seeds.items() if n < report.MIN_SEEDS}
        if block.preliminary:
            assert short, f"{page.name} {block.recipe}: every row has its seeds; drop 'preliminary'"
        else:
            assert not short, f"{page.name} {block.recipe}: rows with fewer than 3 seeds: {short}"


def test_a_preliminary_block_says_so_where_it_is_read():
    for page, block in _blocks():
        if block.preliminary:
            body = report.render_block(block, STORE, specs=recipe_spec)
            assert body.rstrip().splitlines()[-1].startswith("*Preliminary:"), page.name


def test_editing_a_committed_result_is_caught(tmp_path):
    # a full table (a summary line names only winners, which one edited cell may not change)
    page, block = next((page, block) for page, block in _blocks() if not block.summary)
    copy = tmp_path / "results"
    shutil.copytree(STORE, copy)
    path = store.store_file(copy, block.recipe)
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        record = json.loads(line)
        if record["setting"] in block.settings and (not block.rows or record["encoding"] in block.rows):
            column = next(c for c, v in record["metrics"].items() if v is not None)
            record["metrics"][column] += 0.5
            lines[i] = json.dumps(record)
            break
    path.write_text("\n".join(lines) + "\n")
    assert report.stale([page], copy, specs=recipe_spec), "an edited result went unnoticed"


@pytest.mark.slow
def test_a_stored_text_run_reproduces(tmp_path, monkeypatch):
    """`make run` prints the README's table: one stored run (sinusoidal, seed 0), trained again
    as `make run` trains it (one thread, a spawned worker), gives the stored metrics to the
    README's three decimals (bit for bit on the machine class that stored them)."""
    from mmpe.recipes.compare import compare

    monkeypatch.setenv("MMPE_THREADS", "1")
    compare("text", "sinusoidal,learned", out_dir=tmp_path / "out", seeds=1, store=tmp_path / "s",
            jobs=2)
    stored = {(r["encoding"], r["seed"]): r["metrics"] for r in store.read(STORE, "text")
              if r["setting"] == "default"}
    for again in store.read(tmp_path / "s", "text"):
        want = stored[(again["encoding"], again["seed"])]
        for column, value in again["metrics"].items():
            if value is None:
                assert want[column] is None
            else:
                assert f"{value:.3f}" == f"{want[column]:.3f}", (again["encoding"], column)
