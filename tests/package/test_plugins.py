"""Extending mmpe from outside the repository: entry points, `mmpe show`, helpful errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import mmpe
from mmpe.cli import main

PLUGIN = textwrap.dedent('''
    import torch
    from torch import nn
    import mmpe
    from mmpe.encodings.base import ScoreEncoding


    @mmpe.register("ring_bias", hook="score", needs=(mmpe.Metric,), context=("num_heads",),
                   learnable=True, paper="a test plugin")
    class RingBias(ScoreEncoding):
        """A learned penalty per head times the distance (a plugin)."""

        def __init__(self, num_heads: int, scale: float = 1.0) -> None:
            super().__init__()
            self.num_heads = num_heads
            self.w = nn.Parameter(torch.full((num_heads,), scale))

        def score_mod(self, ctx):
            self.check_call(ctx)
            coords, w = ctx.coords, self.w

            def mod(score, b, h, q_idx, kv_idx):
                return score - w[h] * coords.distance(q_idx, kv_idx, b)

            return mod
''')


def _install_plugin(root: Path) -> None:
    (root / "my_pe_plugin.py").write_text(PLUGIN)
    dist = root / "my_pe_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pe-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mmpe.encodings]\nring_bias = my_pe_plugin\n")


def test_entry_point_plugin_is_known_everywhere(tmp_path: Path) -> None:
    _install_plugin(tmp_path)
    script = textwrap.dedent('''
        import torch, mmpe
        from mmpe.cli import main
        assert "ring_bias" in {e.name for e in mmpe.available()}
        model = mmpe.Transformer(16, 2, 1, ["ring_bias"])        # by name, context filled
        assert model(torch.randn(1, 5, 16), mmpe.Sequence(5)).shape == (1, 5, 16)
        assert main(["show", "ring_bias"]) == 0
        assert main(["list", "--hook", "score"]) == 0
    ''')
    env_path = f"{tmp_path}:{Path(mmpe.__file__).resolve().parents[1]}"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ring_bias: A learned penalty per head" in run.stdout
    assert "scale = 1.0" in run.stdout and "num_heads  (from the model's context)" in run.stdout


def test_broken_plugin_names_itself(tmp_path: Path) -> None:
    _install_plugin(tmp_path)
    (tmp_path / "my_pe_plugin.py").write_text("raise RuntimeError('boom')\n")
    script = "import mmpe\nmmpe.available()\n"
    env_path = f"{tmp_path}:{Path(mmpe.__file__).resolve().parents[1]}"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode != 0 and "plugin 'ring_bias'" in run.stderr and "boom" in run.stderr


def test_a_broken_plugin_skips_no_other_and_is_reported_every_call(tmp_path: Path) -> None:
    """The broken entry point sorts first; the good one after it still loads, and every
    registry call raises again (no flag set by the failed load hides it)."""
    _install_plugin(tmp_path)
    (tmp_path / "aaa_broken.py").write_text("raise RuntimeError('boom')\n")
    dist = tmp_path / "aaa_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: aaa-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[mmpe.encodings]\naaa_broken = aaa_broken\n")
    script = textwrap.dedent('''
        import mmpe
        for _ in range(2):
            try:
                mmpe.available()
            except ImportError as err:
                print("RAISED", err)
        from mmpe.registry import _REGISTRY
        print("GOOD LOADED", "ring_bias" in _REGISTRY)
    ''')
    env_path = f"{tmp_path}:{Path(mmpe.__file__).resolve().parents[1]}"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("RAISED") == 2 and "plugin 'aaa_broken'" in run.stdout
    assert "boom" in run.stdout and "GOOD LOADED True" in run.stdout


def test_show_and_did_you_mean(capsys) -> None:
    assert main(["show", "rope_yarn"]) == 0
    out = capsys.readouterr().out
    assert "Peng" in out and "Positioned1D" in out and "original_max_position_embeddings" in out
    assert main(["show", "ropee"]) == 2
    assert "Did you mean 'rope'" in capsys.readouterr().err


def test_duplicate_rotary_or_input_encodings_warn() -> None:
    with pytest.warns(UserWarning, match="2 rotary encodings 'rope'"):
        mmpe.Transformer(32, 4, 1, ["rope", "rope"])
    with pytest.warns(UserWarning, match="2 input encodings 'sinusoidal'"):
        mmpe.Transformer(32, 4, 1, ["sinusoidal", "sinusoidal"])


# --- A plugin that raises is named in the error (issue 21) ----------------------------------
# Every place mmpe calls into a plugin — its constructor, its hook method, the score function
# it returns (called later, deep inside attention, on each path) — adds the note
# "in plugin encoding '<name>' from <module>" to the exception; type and message are the
# plugin's own.

FAILING = ("init", "forward", "score_mod", "closure")


def _failing_plugin(hook: str, where: str):
    from mmpe.encodings.base import InputEncoding, RotaryEncoding, ScoreEncoding

    def fail(point: str) -> None:
        if where == point:
            raise RuntimeError(f"plugin failed in {point}")

    class Input(InputEncoding):
        def __init__(self, d_model: int) -> None:
            super().__init__()
            fail("init")
            self.d_model = d_model

        def forward(self, coords):
            fail("forward")
            return torch.zeros(coords.num_queries, self.d_model)

    class Rotary(RotaryEncoding):
        def __init__(self) -> None:
            super().__init__()
            fail("init")

        def forward(self, q, k, coords):
            fail("forward")
            return q, k

    class Score(ScoreEncoding):
        def __init__(self, num_heads: int) -> None:
            super().__init__()
            fail("init")
            self.num_heads = num_heads

        def score_mod(self, ctx):
            fail("score_mod")
            coords = ctx.coords

            def mod(score, b, h, q_idx, kv_idx):
                fail("closure")
                return score - coords.distance(q_idx, kv_idx, b)

            return mod

    # the hook's class, its capabilities and its context keys
    cls, needs, context = {"input": (Input, (), ("d_model",)), "rotary": (Rotary, (), ()),
                           "score": (Score, (mmpe.Metric,), ("num_heads",))}[hook]
    name = f"failing_{hook}_{where}"
    mmpe.register(name, hook=hook, needs=needs, context=context, learnable=False,
                  paper="a test plugin that raises")(cls)
    return name


@pytest.fixture
def forget_plugins():
    from mmpe import registry

    before = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)


CASES = [(hook, where) for hook in ("input", "rotary", "score") for where in FAILING
         if (hook == "score") == (where != "forward")]  # a score encoding has no forward


@pytest.mark.parametrize("route", ["flex", "sdpa", "math"])
@pytest.mark.parametrize(("hook", "where"), CASES, ids=[f"{h}-{w}" for h, w in CASES])
def test_a_plugin_that_raises_is_named(forget_plugins, hook: str, where: str, route: str):
    # (closure, flex): FlexAttention traces the score function and re-raises its error from
    # the flex_attention call; mmpe.attention.dispatch.run_flex adds the note there.
    name = _failing_plugin(hook, where)
    with pytest.raises(RuntimeError, match=f"plugin failed in {where}") as info:
        model = mmpe.Transformer(16, 2, 1, [name])
        for block in model.modules():
            if isinstance(block, mmpe.MultiHeadAttention):
                block.route = route
        with torch.no_grad():  # FlexAttention has no CPU backward
            model(torch.randn(1, 5, 16), mmpe.Sequence(5))
    notes = getattr(info.value, "__notes__", [])
    assert notes == [f"in plugin encoding {name!r} from {__name__}"], notes


def test_builtin_encodings_are_not_wrapped() -> None:
    """mmpe's own encodings keep their methods (no per-call try/except on the hot path)."""
    from mmpe.registry import PLUGIN_METHODS

    for entry in mmpe.available():
        for attr in PLUGIN_METHODS:
            assert not hasattr(getattr(entry.cls, attr, None), "_mmpe_plugin_note"), (entry, attr)


def test_an_entry_point_plugin_that_raises_names_its_distribution(tmp_path: Path) -> None:
    _install_plugin(tmp_path)
    source = PLUGIN.replace("return score - w[h]", "raise ValueError('bad distance')\n"
                            "            return score - w[h]")
    (tmp_path / "my_pe_plugin.py").write_text(source)
    script = textwrap.dedent('''
        import torch, mmpe
        model = mmpe.Transformer(16, 2, 1, ["ring_bias"])
        model(torch.randn(1, 5, 16), mmpe.Sequence(5))
    ''')
    env_path = f"{tmp_path}:{Path(mmpe.__file__).resolve().parents[1]}"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode != 0 and "ValueError: bad distance" in run.stderr
    assert ("in plugin encoding 'ring_bias' from my_pe_plugin (entry point 'ring_bias' of "
            "my-pe-plugin)") in run.stderr, run.stderr[-2000:]
