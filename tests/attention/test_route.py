"""The route of a call (`mmpe.attention.route`) over every branch of its rule, on a described
CUDA device (no GPU needed: `which_route` takes the device, its name, the dtype and the grad
mode), with a stated fake cost table; forcing by argument and environment variable; the budget
by argument and environment variable; the route log."""

from __future__ import annotations

import json

import pytest
import torch

import mmpe
from mmpe import flex_compile
from mmpe.attention import MultiHeadAttention, log_routes, record_attention, which_route
from mmpe.attention.route import (
    DENSE_BIAS_BYTES,
    FREE_FRACTION,
    CostTable,
    load_costs,
    route_inputs,
    structure_key,
)
from mmpe.results.store import make_record

GPU = "Described GPU 80GB"
GRID = mmpe.Grid((8, 8), prefix_tokens=1)  # 65 tokens: 4 heads · 65² · 4 B = 67,600 B
GRID_BYTES = 4 * 65 * 65 * 4
#: what the dense route allocates for a learned term's bias there, with gradients in bf16 at
#: batch 1: the float32 bias, its bf16 copy padded to 72 keys, the bf16 gradient SDPA writes
#: and its float32 copy
GRID_DENSE = GRID_BYTES + 4 * 65 * 72 * 2 + 4 * 65 * 72 * 2 + GRID_BYTES


def _layer(*names: str, route: str = "auto", budget: int | None = None,
           **options) -> MultiHeadAttention:
    context = {"num_heads": 4, "head_dim": 8, "d_model": 32}
    encs = [mmpe.build(n, context=context, **options.get(n, {})) for n in names]
    return MultiHeadAttention(32, 4, encs, route=route, dense_bias_bytes=budget)


def _cuda(layer, coords=GRID, **kw) -> str:
    kw.setdefault("costs", CostTable())
    return which_route(layer, coords, device="cuda", device_name=GPU, **kw)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MMPE_ATTENTION_ROUTE", "MMPE_DENSE_BIAS_BYTES", "MMPE_ROUTE_COSTS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def flex_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flex_compile, "available", lambda: True)


def test_the_rule_on_cuda(flex_on: None) -> None:
    swin = {"swin": {"grid_shape": (8, 8)}}
    assert _cuda(_layer()) == "sdpa"  # no term: cuDNN / flash SDPA
    assert _cuda(_layer("rope_axial")) == "sdpa"  # rotary only
    assert _cuda(_layer("alibi")) == "flex"  # content-free, nothing learned
    for name in ("t5", "kerple_log", "fire"):  # learned tensors: the dense bias
        assert _cuda(_layer(name)) == "dense", name
    assert _cuda(_layer("swin", **swin)) == "dense"
    assert _cuda(_layer("alibi", "t5")) == "dense"  # one learned term takes the sum dense
    seq = mmpe.Sequence(16, causal=True)
    assert _cuda(_layer("shaw"), seq) == "dense"  # reads the content
    frozen = _layer("t5")
    frozen.scores[0].requires_grad_(False)  # a frozen table: fixed, like ALiBi's slopes
    assert _cuda(frozen) == "flex"
    assert _cuda(_layer("da_transformer")) == "flex"  # rescales: SDPA adds masks only
    sticks = MultiHeadAttention(32, 4, [mmpe.build("stick_breaking")])
    assert _cuda(sticks, seq) == "math"  # not a softmax
    with record_attention():
        assert _cuda(_layer("t5")) == "math"


def test_the_budget_by_argument_and_environment(flex_on: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert _cuda(_layer("t5", budget=GRID_DENSE)) == "dense"  # the budget is inclusive
    assert _cuda(_layer("t5", budget=GRID_DENSE - 1)) == "flex"  # past it: the peer's OOM
    monkeypatch.setenv("MMPE_DENSE_BIAS_BYTES", str(GRID_DENSE - 1))
    assert _cuda(_layer("t5")) == "flex"
    assert _cuda(_layer("t5", budget=GRID_DENSE)) == "dense"  # the argument wins
    monkeypatch.setenv("MMPE_DENSE_BIAS_BYTES", "lots")
    with pytest.raises(ValueError, match="MMPE_DENSE_BIAS_BYTES must be a positive integer"):
        _cuda(_layer("t5"))
    with pytest.raises(ValueError, match="dense_bias_bytes must be a positive integer"):
        _layer("t5", budget=0)
    assert DENSE_BIAS_BYTES == 1 << 30


def test_the_bias_counts_the_batch_only_where_it_depends_on_the_example() -> None:
    t5 = _layer("t5")
    shared = route_inputs(t5.scores, GRID, 4, 32, torch.device("cuda"), torch.bfloat16, True,
                     name=GPU)
    assert shared.bias_bytes == GRID_BYTES  # one bias broadcast over a batch of 32
    pts = mmpe.Points(torch.rand(3, 10, 3))  # per-example positions
    assert route_inputs(t5.scores, pts, 4, 3, torch.device("cuda"), torch.bfloat16, True,
                   name=GPU).bias_bytes == 3 * 4 * 10 * 10 * 4
    shaw = _layer("shaw")
    seq = mmpe.Sequence(10)
    assert route_inputs(shaw.scores, seq, 4, 5, torch.device("cuda"), torch.bfloat16, True,
                   name=GPU).bias_bytes == 5 * 4 * 10 * 10 * 4  # reads the content


def test_without_flex_the_dense_route_or_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flex_compile, "available", lambda: False)
    assert _cuda(_layer("alibi")) == "dense"
    assert _cuda(_layer("alibi", budget=GRID_BYTES - 1)) == "sdpa"  # the sdpa route's blocks
    assert _cuda(_layer("da_transformer")) == "math"


def test_the_cpu_keeps_the_sdpa_plans() -> None:
    assert which_route(_layer("t5"), GRID, device="cpu") == "sdpa"
    assert which_route(_layer("da_transformer"), GRID, device="cpu") == "math"


def test_forcing_by_argument_and_environment(flex_on: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for route in ("flex", "dense", "sdpa", "math"):
        assert _cuda(_layer("t5", route=route)) == route
        assert which_route(_layer("t5", route=route), GRID, device="cpu") == route
    monkeypatch.setenv("MMPE_ATTENTION_ROUTE", "dense")
    assert _cuda(_layer("alibi")) == "dense"
    assert which_route(_layer("alibi"), GRID, device="cpu") == "dense"
    assert _cuda(_layer("alibi", route="flex")) == "flex"  # the argument wins
    monkeypatch.setenv("MMPE_ATTENTION_ROUTE", "fast")
    with pytest.raises(ValueError, match="MMPE_ATTENTION_ROUTE must be one of"):
        _cuda(_layer("alibi"))
    with pytest.raises(ValueError, match="route must be one of"):
        _layer("alibi", route="fast")


def test_a_forced_route_that_cannot_run_the_call_is_refused() -> None:
    with pytest.raises(ValueError, match="route='dense' needs additive score terms"):
        _cuda(_layer("da_transformer", route="dense"))
    sticks = MultiHeadAttention(32, 4, [mmpe.build("stick_breaking")], route="dense")
    with pytest.raises(ValueError, match="route='dense' cannot run a non-softmax kernel"):
        _cuda(sticks, mmpe.Sequence(8, causal=True))


def _row(structure: str, ms: dict, device: str = GPU, version: str | None = None,
         bucket: int = 13, dtype: str = "bfloat16", grad: bool = True, batch: int = 1,
         causal: bool = False) -> dict:
    return {"device": device, "torch": version or torch.__version__, "structure": structure,
            "bucket": bucket, "dtype": dtype, "grad": grad, "batch": batch, "causal": causal,
            "ms": ms}


def test_a_cost_table_row_overrides_the_rule(flex_on: None) -> None:
    # GRID: 65² = 4,225 pairs, bucket ceil(log2 4225) = 13
    assert route_inputs([], GRID, 4, 1, torch.device("cuda"), torch.bfloat16, True, name=GPU).bucket == 13
    t5, alibi = _layer("t5"), _layer("alibi")
    assert structure_key(t5.scores) == "relation:learned"
    assert structure_key(alibi.scores) == "distance"
    table = CostTable()
    table.add(_row("relation:learned", {"dense": 3.0, "flex": 1.0}))
    table.add(_row("distance", {"dense": 1.0, "flex": 2.0}))
    assert _cuda(t5, costs=table) == "flex"
    assert _cuda(alibi, costs=table) == "dense"
    # no row for this dtype, grad mode, size bucket, device or torch version: the rule
    assert _cuda(t5, costs=table, dtype=torch.float32) == "dense"
    assert _cuda(t5, costs=table, grad=False) == "dense"
    assert _cuda(t5, mmpe.Grid((16, 16)), costs=table) == "dense"
    assert which_route(t5, GRID, device="cuda", device_name="Other GPU", costs=table) == "dense"
    other = CostTable()
    other.add(_row("relation:learned", {"flex": 1.0}, version="0.0.1"))
    assert _cuda(t5, costs=other) == "dense"
    # a row cannot take the dense route past the budget
    assert _cuda(_layer("alibi", budget=GRID_BYTES - 1), costs=table) == "flex"
    # forcing beats the table; the CPU never reads it
    assert _cuda(_layer("t5", route="dense"), costs=table) == "dense"
    assert which_route(t5, GRID, device="cpu", costs=table) == "sdpa"


def test_the_cost_table_file(tmp_path, flex_on: None, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "routes.jsonl"
    path.write_text(json.dumps(_row("relation:learned", {"dense": 3.0, "flex": 1.0})) + "\n\n")
    assert len(load_costs(path).rows) == 1
    assert load_costs(tmp_path / "absent.jsonl").rows == {}
    monkeypatch.setenv("MMPE_ROUTE_COSTS", str(path))
    assert which_route(_layer("t5"), GRID, device="cuda", device_name=GPU) == "flex"
    path.write_text('{"device": "x"}\n')
    with pytest.raises(ValueError, match=r"routes.jsonl:1: not a cost-table row.*lacks"):
        load_costs(path)
    bad = _row("relation", {"fast": 1.0})
    with pytest.raises(ValueError, match="ms must map routes"):
        CostTable().add(bad)


def test_every_call_logs_its_route(tmp_path) -> None:
    model = mmpe.Transformer(32, 4, 2, ["t5"])
    x = torch.randn(2, 10, 32)
    with log_routes() as routes:
        model(x, mmpe.Sequence(10))
        with torch.no_grad():
            model(x, mmpe.Sequence(10))
    assert routes == {"0 MultiHeadAttention": ["sdpa"], "1 MultiHeadAttention": ["sdpa"]}
    model.blocks[0].attn.route = "dense"
    with log_routes() as routes:
        model(x, mmpe.Sequence(10))
    assert routes == {"0 MultiHeadAttention": ["dense"], "1 MultiHeadAttention": ["sdpa"]}
    record = make_record("text", "default", "t5", 0, {"bpc": 1.0}, wall_s=1.0, cli_args=[],
                         out_dir=tmp_path, env={}, routes=routes)
    assert record["routes"] == routes  # a stored run keeps them


def test_causal_offset_terms_stay_on_flex_until_a_row_says_dense(flex_on: None) -> None:
    """Rule 3's exception: T5 and KERPLE on a causal sequence take FlexAttention (its block
    skipping), bidirectional T5 and grids keep the dense route, and a cost-table row for the
    call's batch and causality can send it to the dense route."""
    causal = mmpe.Sequence(1024, causal=True)
    for name in ("t5", "kerple_log"):
        assert _cuda(_layer(name), causal) == "flex", name
    assert _cuda(_layer("t5"), mmpe.Sequence(1024)) == "dense"
    assert _cuda(_layer("swin", swin={"grid_shape": (8, 8)}), GRID) == "dense"
    bucket = route_inputs([], causal, 4, 1, torch.device("cuda"), torch.bfloat16, True).bucket
    table = CostTable()
    table.add(_row("relation:learned", {"dense": 1.0, "flex": 3.0}, bucket=bucket, causal=True))
    assert _cuda(_layer("t5"), causal, costs=table) == "dense"
    # a row for another batch or for bidirectional calls does not apply
    other = CostTable()
    other.add(_row("relation:learned", {"dense": 1.0, "flex": 3.0}, bucket=bucket, causal=True,
                   batch=8))
    other.add(_row("relation:learned", {"dense": 1.0, "flex": 3.0}, bucket=bucket))
    assert _cuda(_layer("t5"), causal, costs=other) == "flex"


def test_the_budget_counts_what_the_dense_route_allocates() -> None:
    """The float32 bias, its padded copy in q's dtype, and with gradients of a learned term
    the gradient SDPA writes at the whole batch (and its float32 copy); without gradients the
    forward only; a fixed term takes no gradient."""
    t5, alibi = _layer("t5"), _layer("alibi")

    def count(layer, batch=1, grad=True, dtype=torch.bfloat16):
        return route_inputs(layer.scores, GRID, 4, batch, torch.device("cuda"), dtype, grad,
                            name=GPU).dense_bytes

    assert count(t5) == GRID_DENSE
    assert count(t5, grad=False) == GRID_BYTES + 4 * 65 * 72 * 2
    assert count(t5, batch=32) == GRID_DENSE + 31 * 4 * 65 * 72 * 2  # the gradient per example
    assert count(alibi) == GRID_BYTES + 4 * 65 * 72 * 2  # nothing learned: no bias gradient
    assert count(t5, dtype=torch.float32) == 2 * GRID_BYTES + 2 * 4 * 65 * 72 * 4


def test_the_default_budget_is_a_share_of_the_devices_free_memory(flex_on: None) -> None:
    t5 = _layer("t5")
    room = int(GRID_DENSE / FREE_FRACTION)
    assert which_route(t5, GRID, device="cuda", device_name=GPU, costs=CostTable(),
                       free_bytes=room) == "dense"
    assert which_route(t5, GRID, device="cuda", device_name=GPU, costs=CostTable(),
                       free_bytes=room - 8) == "flex"
    # a layer's own budget wins over the device's
    big = _layer("t5", budget=GRID_DENSE)
    assert which_route(big, GRID, device="cuda", device_name=GPU, costs=CostTable(),
                       free_bytes=room - 8) == "dense"
