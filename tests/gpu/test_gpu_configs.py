"""The larger GPU configs of the length-generalisation, context-extension and genomics recipes
compose with their CPU defaults (a config key a recipe does not know fails here, not on a GPU)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = [("lengthgen", "lengthgen/default.yaml", "lengthgen/gpu.yaml"),
         ("text", "text/default.yaml", "context/gpu.yaml"),
         ("genomics", "genomics/default.yaml", "genomics/gpu.yaml")]


@pytest.mark.parametrize(("module", "default", "gpu"), CASES, ids=[c[2] for c in CASES])
def test_gpu_config_composes_with_the_default(module, default, gpu):
    pytest.importorskip("lightning")
    out = subprocess.run(
        [sys.executable, "-m", f"mmpe.recipes.{module}", "fit", "--config",
         str(ROOT / "configs" / default), "--config", str(ROOT / "configs" / gpu),
         "--print_config"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "precision: bf16-mixed" in out.stdout and "accelerator: gpu" in out.stdout


def test_a_wrong_key_in_a_gpu_config_fails(tmp_path):
    pytest.importorskip("lightning")
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "configs/lengthgen/gpu.yaml").read_text()
                   .replace("d_model: 256", "d_modle: 256"))
    out = subprocess.run(
        [sys.executable, "-m", "mmpe.recipes.lengthgen", "fit", "--config",
         str(ROOT / "configs/lengthgen/default.yaml"), "--config", str(bad), "--print_config"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode != 0 and "d_modle" in out.stderr
