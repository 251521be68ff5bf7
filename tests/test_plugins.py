"""Extending mmpe from outside the repository: entry points, `mmpe show`, helpful errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
            self.check_context(ctx)
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
