"""What the spawned ranks of `test_meshes.py` run: context groups that are subgroups of the
world (a data × context mesh; uneven groups on 3 ranks), each against the unsharded model on
the same inputs. Each rank writes its errors; the test reads them.

A case: every rank builds the same model (fixed seed) and its data group's batch; the rank
runs the unsharded model on the whole sequence, then `shard` + the model on its tokens over
its context group. Compared: the output rows, the input-gradient rows and every parameter's
gradient summed over the context group (the loss is `Σ out·w` over the tokens, so the ranks'
losses add up to it).
"""

from __future__ import annotations

import copy
import json
import os
import traceback

import torch
import torch.distributed as dist

import mmpe
from mmpe.parallel import reduce_gradients, shard, unshard, unshard_for_loss
from mmpe.testing import TOLERANCES

N, D_MODEL, HEADS = 16, 32, 4
ENCODINGS = ["rope", "alibi", "t5"]


def _model() -> mmpe.Transformer:
    torch.manual_seed(0)
    return mmpe.Transformer(D_MODEL, HEADS, 2, ENCODINGS)


def compare(group: dist.ProcessGroup, data_seed: int, layout: str) -> dict:
    """The sharded model on `group` against the unsharded one, on data drawn from `data_seed`."""
    full = mmpe.Sequence(N, causal=True)
    model = _model()
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(data_seed)
    x = torch.randn(2, N, D_MODEL, generator=gen)
    w = torch.randn(2, N, D_MODEL, generator=gen)
    xf = x.clone().requires_grad_(True)
    (model(xf, full) * w).sum().backward()
    want_out = model(x, full).detach()
    sharded = shard(full, group, layout)
    xl = sharded.take(x).requires_grad_(True)
    out = twin(xl, sharded)
    (out * sharded.take(w)).sum().backward()
    reduce_gradients(twin, group)
    errors = {"output": float((out - sharded.take(want_out)).abs().max()),
              "input gradient": float((xl.grad - sharded.take(xf.grad)).abs().max())}
    for (name, p), ref in zip(twin.named_parameters(), model.parameters(), strict=True):
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        r = ref.grad if ref.grad is not None else torch.zeros_like(ref)
        errors[name] = float((g - r).abs().max())
    atol = TOLERANCES[torch.float32]["gradient"][0]
    return {"ok": all(e <= atol for e in errors.values()), "errors": errors,
            "world": dist.get_world_size(group)}


def whole_sequence_loss(group: dist.ProcessGroup, gather) -> float:
    """The largest |gradient − unsharded gradient| / |unsharded| when every rank computes a
    loss over the whole sequence, gathered with `gather` (`unshard_for_loss`: 0; `unshard`:
    W − 1, the loss counted W times)."""
    full = mmpe.Sequence(N, causal=True)
    model = _model()
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, N, D_MODEL, generator=gen)
    (model(x, full).logsumexp(dim=1) ** 2).sum().backward()  # not a sum over tokens
    sharded = shard(full, group, "balanced")
    out = gather(twin(sharded.take(x), sharded), sharded)
    (out.logsumexp(dim=1) ** 2).sum().backward()
    reduce_gradients(twin, group)
    return max(float((p.grad - r.grad).norm() / r.grad.norm())
               for p, r in zip(twin.parameters(), model.parameters(), strict=True)
               if r.grad is not None and r.grad.norm() > 0)


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Run the cases of a `world`-rank job and write `rank<r>.json`."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results = []
    try:
        if world == 4:  # a 2 × 2 mesh: the second dimension's groups are the context groups
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "context"))
            group = mesh.get_group("context")
            data_rank = mesh.get_local_rank("data")
            for layout in ("contiguous", "balanced"):
                results.append({"case": ["mesh 2x2", layout],
                                **compare(group, 10 + data_rank, layout)})
            results.append({"case": ["whole-sequence loss"], "ok": True, "world": 2,
                            "unshard_for_loss": whole_sequence_loss(group, unshard_for_loss),
                            "unshard": whole_sequence_loss(group, unshard)})
        else:  # 3 ranks: {0, 1} and {2}, then {0} and {1, 2} (every rank makes every group)
            groups = {k: dist.new_group(list(k)) for k in ((0, 1), (2,), (0,), (1, 2))}
            for split in (((0, 1), (2,)), ((0,), (1, 2))):
                mine = next(k for k in split if rank in k)
                for layout in ("contiguous", "balanced"):
                    try:
                        res = compare(groups[mine], 20 + mine[0], layout)
                    except Exception as err:
                        res = {"ok": False, "error": f"{type(err).__name__}: {err}"}
                    results.append({"case": [f"groups {split}", layout], **res})
    except Exception as err:  # recorded for the test to name
        results.append({"case": ["setup"], "ok": False,
                        "error": f"{type(err).__name__}: {err}",
                        "trace": traceback.format_exc()[-1500:]})
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(results, fh)
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()


# --- FSDP2 over the data dimension, context parallelism over the other, from a meta build ---

FSDP_STEPS = 30
_FSDP_MODELS = {
    "rope_alibi_t5": (lambda: mmpe.Transformer(D_MODEL, HEADS, 2, ENCODINGS),
                      lambda: mmpe.Sequence(N, causal=True)),
    "grid": (lambda: mmpe.Transformer(D_MODEL, HEADS, 2, ["rope_axial", "alibi"],
                                      context={"grid_shape": (4, 4)}),
             lambda: mmpe.Grid((4, 4))),
    # the same model wrapped as a user writes it: torch's fully_shard per block, then the root
    # (the encodings the blocks share are the model's, so the root shards them once)
    "by_hand": (lambda: mmpe.Transformer(D_MODEL, HEADS, 2, ENCODINGS),
                lambda: mmpe.Sequence(N, causal=True)),
}


def _wrap_by_hand(model, mesh) -> None:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.5
        from torch.distributed._composable.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _fsdp_data(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return (torch.randn(steps, 4, N, D_MODEL, generator=gen),
            torch.randn(steps, 4, N, D_MODEL, generator=gen))


def train_single(name: str) -> list[float]:
    """The one-process run: 30 AdamW steps of the mean squared error over the whole batch."""
    make, coords = _FSDP_MODELS[name]
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xs, ys = _fsdp_data(FSDP_STEPS)
    losses = []
    for x, y in zip(xs, ys, strict=True):
        loss = ((model(x, coords()) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def train_fsdp(name: str) -> list[float]:
    """The same run on a 2 × 2 mesh: FSDP2 over "data" (two examples each), the sequence
    sharded over "context"; built on meta, `to_empty`, `reset_parameters`."""
    from torch.distributed.device_mesh import init_device_mesh

    from mmpe.parallel import fully_shard_transformer

    make, coords = _FSDP_MODELS[name]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("data", "context"))
    context, d = mesh.get_group("context"), mesh.get_local_rank("data")
    with torch.device("meta"):
        model = make()
    if name == "by_hand":
        _wrap_by_hand(model, mesh["data"])
    else:
        fully_shard_transformer(model, mesh["data"])
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xs, ys = _fsdp_data(FSDP_STEPS)
    sharded = shard(coords(), context, "contiguous")
    losses = []
    for x, y in zip(xs, ys, strict=True):
        x, y = x[2 * d:2 * d + 2], y[2 * d:2 * d + 2]
        out = model(sharded.take(x), sharded)
        # this rank's share of its data rank's mean (FSDP2 averages over the data ranks)
        local = ((out - sharded.take(y)) ** 2).sum() / y.numel()
        opt.zero_grad()
        local.backward()
        reduce_gradients(model, context)
        opt.step()
        total = local.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / 2)
    return losses


def fsdp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Each FSDP model's sharded losses, written to `fsdp_rank<r>.json`."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results: dict = {}
    try:
        for name in _FSDP_MODELS:
            try:
                results[name] = train_fsdp(name)
            except Exception as err:
                results[name] = f"{type(err).__name__}: {err}\n{traceback.format_exc()[-1500:]}"
    finally:
        with open(os.path.join(out_dir, f"fsdp_rank{rank}.json"), "w") as fh:
            json.dump(results, fh)
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()
