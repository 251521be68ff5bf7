"""The locks: one exact version of every package for development and CI (requirements/lock.txt)
and for the floor environment (requirements/floor-lock.txt); every install step reads them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ("requirements/lock.txt", "requirements/floor-lock.txt")


def _load_freeze():
    """requirements/freeze.py, whose `pins` reads a lock for `make lock` and for these tests."""
    spec = importlib.util.spec_from_file_location("freeze", ROOT / "requirements/freeze.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FREEZE = _load_freeze()


def _pins(path: str) -> dict[str, str]:
    """`name -> version` of a lock or requirements file; every non-comment line an exact pin."""
    return FREEZE.pins((ROOT / path).read_text(), path)


def _makefile_recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n|\s*\n)*)", text, flags=re.M)
    assert m, f"Makefile has no target {target}"
    return m[1]


@pytest.mark.parametrize("lock", LOCKS)
def test_lock_pins_the_torch_family_to_one_release(lock: str) -> None:
    """torch X.Y.Z, torchaudio X.Y.Z (its compiled library is built against one torch release)
    and torchvision 0.(Y+15).*, torchvision's numbering of the same release."""
    pins = _pins(lock)
    torch, audio, vision = (Version(pins[n]) for n in ("torch", "torchaudio", "torchvision"))
    assert audio.release == torch.release, (lock, torch, audio)
    assert (vision.major, vision.minor) == (0, torch.minor + 15), (lock, torch, vision)


@pytest.mark.parametrize("lock", LOCKS)
def test_lock_satisfies_pyproject(lock: str) -> None:
    """Every dependency of the core and of each extra the environment installs is locked, at a
    version its range in pyproject.toml admits; nodeps.txt's data packages as listed."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = ["recipes", "timm", "pyg", "hf", "data", "dev"] + (["docs"] if "floor" not in lock
                                                               else [])
    pins = _pins(lock)
    for dep in project["dependencies"] + sum((project["optional-dependencies"][e]
                                              for e in extras), []):
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock} lacks {req.name} ({dep})"
        assert req.specifier.contains(pins[name], prereleases=True), (lock, dep, pins[name])
    for name, version in _pins("requirements/nodeps.txt").items():
        assert pins.get(name) == version, (lock, name, version)


def test_floor_lock_holds_the_floors() -> None:
    """The floor environment's lock pins what requirements/floor.txt declares."""
    pins = _pins("requirements/floor-lock.txt")
    for name, version in _pins("requirements/floor.txt").items():
        assert pins.get(name) == version, (name, version)


def test_every_install_step_reads_a_lock() -> None:
    """`make setup` (so `make test`, `make run`, `make docs` and .ci/run) and `make test-floor`
    install from the locks; no other Makefile line installs a package, except `make lock`,
    which refreshes them; the wheel test installs under the lock's constraints."""
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^LOCK\s*:=\s*requirements/lock\.txt$", text, flags=re.M)
    assert re.search(r"^FLOOR_LOCK\s*:=\s*requirements/floor-lock\.txt$", text, flags=re.M)
    assert "$(call install_locked,$(VENV),$(LOCK))" in _makefile_recipe("$(STAMP)")
    assert "$(call install_locked,$(FLOOR),$(FLOOR_LOCK))" in _makefile_recipe(
        "$(FLOOR)/.installed")
    define = re.search(r"^define install_locked\n(.*?)^endef", text, flags=re.M | re.S)[1]
    assert "--no-deps -r $(2)" in define
    lock_recipe = _makefile_recipe("lock")
    outside = text.replace(define, "").replace(lock_recipe, "")
    steps = [ln for ln in outside.splitlines() if ln.startswith("\t") and "pip install" in ln]
    assert not steps, f"Makefile install steps that bypass the lock: {steps}"
    for target in ("run", "test", "test-train", "test-core", "docs", "report"):
        assert re.search(rf"^{re.escape(target)}: setup\b", text, flags=re.M), target
    wheel_test = (ROOT / "tests/package/test_packaging.py").read_text()
    assert '"-c", str(LOCK)' in wheel_test


def test_environment_is_a_locked_one() -> None:
    """The running environment is one of the locks, package for package (a fresh machine gets
    what CI tested), and imports the torch family with transformers together."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    torch = Version(installed["torch"]).base_version
    matching = [lock for lock in LOCKS if _pins(lock)["torch"] == torch]
    assert matching, f"torch {torch} is in no lock"
    pins = _pins(matching[0])
    # the version imports see (a vendored copy, e.g. setuptools/_vendor, may be listed too)
    seen = {name: importlib.metadata.version(name) for name in pins if name in installed}
    moved = {name: (version, seen[name]) for name, version in pins.items()
             if name in seen and Version(seen[name]) != Version(version)}
    assert not moved, f"installed versions differ from {matching[0]}: {moved}"
    if all(importlib.util.find_spec(m) for m in ("torchaudio", "transformers", "torchvision")):
        import torchaudio  # noqa: F401  (an OSError here is the broken pairing the lock prevents)
        import torchvision  # noqa: F401
        import transformers  # noqa: F401


def test_a_torchaudio_of_another_torch_is_named_in_one_line(monkeypatch) -> None:
    """A torchaudio whose library does not load against torch (as 2.11.1 on 2.11.0) is reported
    by whatever of mmpe's needs it, naming both versions and the fix, not as an OSError."""
    import importlib

    import torch

    from mmpe import _optional

    if importlib.util.find_spec("torchaudio") is None:
        pytest.skip("torchaudio is not installed")
    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name.split(".")[0] == "torchaudio":
            raise OSError("libtorchaudio.so: undefined symbol: "
                          "torch_exception_get_what_without_backtrace")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "2.11.1" if name == "torchaudio" else "0")
    for module, purpose in (("torchaudio", "the audio recipe"),
                            ("transformers", "mmpe.integrations.transformers")):
        with pytest.raises(_optional.TorchaudioMismatchError) as err:
            _optional.require(module, purpose)
        message = str(err.value)
        assert "\n" not in message and purpose in message
        assert "torchaudio 2.11.1" in message and f"torch {torch.__version__}" in message
        release = torch.__version__.split("+")[0]
        assert f"pip install 'torchaudio=={release}'" in message
    monkeypatch.setattr(importlib, "import_module", real)
    _optional.check_torchaudio("control: a torchaudio that loads passes")


@pytest.mark.parametrize("text", ["torch>=2.5\n", "torch==2.5.1\nTorch==2.5.1\n", "torch\n"])
def test_a_lock_line_that_is_not_one_exact_pin_is_refused(text: str) -> None:
    """A range, a bare name or a package pinned twice (names compared as pip does) is named."""
    with pytest.raises(ValueError, match="lock.txt: .*(not an exact pin|pinned twice)"):
        FREEZE.pins(text, "lock.txt")
