"""`benchmarks/gpu/bench_peers.py` (mmpe against the peers in one process) and
`benchmarks/gpu/route_costs.py` (the route cost table) at tiny sizes on the CPU: every row runs,
the stored record names the device, torch version, commit and the route of every row, the cost
rows load as the decision's table, and the docs' block renders a stored GPU run (or says that
none is stored yet)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from mmpe.attention.route import ROUTES, load_costs
from mmpe.results import bench_report

ROOT = Path(__file__).resolve().parents[2]
GPU_DIR = ROOT / "benchmarks" / "gpu"


def _script(name: str):
    sys.path[:0] = [str(GPU_DIR), str(ROOT / "benchmarks")]
    try:
        spec = importlib.util.spec_from_file_location(name, GPU_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses read their module from sys.modules
        spec.loader.exec_module(module)
    finally:
        del sys.path[:2]
    return module


def _peers_run(tmp_path: Path, *only: str) -> dict:
    bench = _script("bench_peers")
    args = ["--tiny", "--repeat", "1", "--device", "cpu", "--store", str(tmp_path)]
    bench.main(args + (["--only", only[0]] if only else []))
    lines = (tmp_path / "bench_peers.jsonl").read_text().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def _check_record(record: dict, peers: set[str]) -> None:
    assert record["bench"] == "bench_peers" and record["table"] == "peers"
    assert record["torch"] == torch.__version__ and record["git"]["commit"]
    assert record["host"] and record["config"]["tiny"] is True
    route = record["columns"].index("route")
    assert {r[2] for r in record["rows"]} == peers
    for row in record["rows"]:
        assert row[route] in ROUTES, row
        mmpe_ms, peer_ms, ratio = row[4:7]
        assert mmpe_ms > 0 and peer_ms > 0 and ratio == pytest.approx(peer_ms / mmpe_ms)


@pytest.mark.slow
def test_every_shape_and_peer_runs_tiny(tmp_path: Path) -> None:
    record = _peers_run(tmp_path)
    _check_record(record, {"timm beit.Attention", "HF T5Attention",
                           "x-transformers RelativePositionBias", "x-transformers ALiBi",
                           "dense distance bias", "Graphormer dense bias", "HF Llama rotary"})
    assert len(record["rows"]) == 14


@pytest.mark.slow
def test_the_cost_rows_load_as_the_decisions_table(tmp_path: Path) -> None:
    costs = _script("route_costs")
    path = tmp_path / "routes.jsonl"
    rows = costs.main(["--tiny", "--repeat", "1", "--device", "cpu", "--store", str(path)])
    table = load_costs(path)
    assert len(table.rows) == len(rows) > 0
    assert all(set(r["ms"]) <= set(ROUTES) for r in rows)


def test_the_sequence_peers_run_store_the_route_and_render(tmp_path: Path) -> None:
    block = bench_report.BenchBlock.parse('bench_peers table=peers host="NVIDIA" pending')
    note = bench_report.render_block(block, tmp_path)
    assert "Not measured yet" in note and "benchmarks/gpu/run.sh" in note
    strict = bench_report.BenchBlock.parse('bench_peers table=peers host="NVIDIA"')
    with pytest.raises(ValueError, match="no stored runs of 'bench_peers'"):
        bench_report.render_block(strict, tmp_path)
    store = tmp_path / "bench"
    record = _peers_run(store, "seq 4k")
    _check_record(record, {"HF T5Attention", "x-transformers RelativePositionBias",
                           "x-transformers ALiBi", "HF Llama rotary"})
    record["host"] = "NVIDIA H200"  # as a GPU run stores it
    (store / "bench_peers.jsonl").write_text(json.dumps(record) + "\n")
    text = bench_report.render_block(block, tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("| shape"))
    assert "| route |" in header and "NVIDIA H200" in text and "Not measured yet" not in text


def test_every_sequence_and_grid_peer_follows_its_layer_to_the_device() -> None:
    """Each peer moved to `meta` (a device that is not the CPU) returns a tensor there: no
    tensor of its own stays behind on the CPU (x-transformers' ALiBi slopes did, and CUDA
    SDPA refused the CPU mask), and its bias reaches SDPA contiguous (a strided mask sends
    CUDA SDPA to its math kernel)."""
    bench = _script("bench_peers")
    seen = []
    real = bench.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kw)

    bench.F.scaled_dot_product_attention = spy
    try:
        for shape in bench.shapes(tiny=True, device="cpu"):
            if not isinstance(shape.coords, (bench.mmpe.Sequence, bench.mmpe.Grid)) or \
                    shape.grid is None and not isinstance(shape.coords, bench.mmpe.Sequence):
                continue
            for _, make_peer, peer_name in bench.peers(shape):
                peer = make_peer().to("meta")
                x = torch.empty(shape.batch, shape.coords.num_queries, bench.D_MODEL,
                                device="meta")
                seen.clear()
                out = peer(x)
                assert out.device.type == "meta", (shape.name, peer_name)
                for mask in seen:
                    assert mask is None or mask.stride(-1) == 1, (shape.name, peer_name)
    finally:
        bench.F.scaled_dot_product_attention = real


def test_a_failing_case_is_stored_with_its_error(tmp_path: Path, monkeypatch) -> None:
    """One case that raises keeps the other rows: its row holds the error, the run goes on."""
    bench = _script("bench_peers")
    real = bench._row

    def flaky(shape, name, *rest):
        if name == "alibi":
            raise RuntimeError("CUDA error: an illustrative failure")
        return real(shape, name, *rest)

    monkeypatch.setattr(bench, "_row", flaky)
    table = bench.run(tiny=True, repeat=1, device="cpu", dtype=torch.float32, only="seq 4k")
    routes = {row[1] + " " + row[2]: row[3] for row in table.rows}
    assert routes["alibi x-transformers ALiBi"] == "error: RuntimeError"
    assert routes["t5 HF T5Attention"] in ROUTES
