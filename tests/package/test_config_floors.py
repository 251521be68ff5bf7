"""Recipe configs leave the device to Lightning, and declared dependency floors are the
versions whose APIs mmpe calls."""

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: p.parent.name + "/" + p.name)
def test_no_config_pins_the_cpu(path):
    """A user with a GPU gets it: `accelerator: auto` (or unset), never `cpu`."""
    yaml = pytest.importorskip("yaml")
    trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
    assert trainer.get("accelerator", "auto") != "cpu", f"{path} pins the CPU"


def _floor(package: str) -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text()
    floors = set(re.findall(rf'"{package}>=([0-9.]+)"', text))
    assert len(floors) == 1, f"{package}: one floor everywhere in pyproject.toml, got {floors}"
    return tuple(int(x) for x in floors.pop().split("."))


def test_timm_floor_has_the_resize_keyword_swin_uses():
    """swin resizes its 2D table with `old_window_size=`, first released in timm 1.0.31."""
    assert _floor("timm") >= (1, 0, 31)
    layers = pytest.importorskip("timm.layers")
    assert "old_window_size" in inspect.signature(layers.resize_rel_pos_bias_table).parameters


@pytest.mark.parametrize(("package", "pin"), [
    ("torch", "torch"), ("timm", "timm"), ("torch-geometric", "torch-geometric"),
    ("transformers", "transformers"), ("lightning", "lightning"),
    ("jsonargparse\\[signatures\\]", "jsonargparse")])
def test_make_test_floor_installs_the_declared_floors(package, pin):
    """`make test-floor` pins (requirements/floor.txt) are pyproject.toml's floors, so it tests
    what the package declares it supports."""
    text = (ROOT / "requirements" / "floor.txt").read_text()
    pinned = re.search(rf"^{pin}==([0-9.]+)$", text, re.M)
    assert pinned, f"{pin} is not pinned in requirements/floor.txt"
    got = tuple(int(x) for x in pinned.group(1).split("."))
    want = _floor(package)
    assert got[:len(want)] == want, (pin, got, want)
