"""What the spawned ranks of `test_recipe_context_parallel.py` run: every registered encoding on
causal and bidirectional sequences (and 2D grids) sharded over the group, against the unsharded
layer on the same inputs. Each rank writes its results; the test reads them.

A case builds the whole sequence's coordinates, a layer and inputs from fixed seeds (the same on
every rank), runs the unsharded layer on the whole input, then `shard` + the layer on this
rank's tokens. Compared: the output rows, the input gradient rows, and every parameter's
gradient summed over the ranks (the loss is `Σ out·w` over all tokens, so the ranks' losses
add up to it).
"""

from __future__ import annotations

import copy
import json
import math
import os
import traceback

import torch
import torch.distributed as dist

import mmpe
from mmpe.context import coords_context
from mmpe.encodings.base import InputEncoding
from mmpe.parallel import ContextParallelError, shard
from mmpe.testing import TOLERANCES

D_MODEL, HEADS = 48, 4
N = 16  # tokens: a multiple of 2W for W = 2 and 4


def sequences() -> dict:
    """The whole-sequence coordinates of the cases, by name."""
    pad = torch.ones(2, N, dtype=torch.bool)
    pad[0, :3] = False  # left padding, as for generation
    pad[1, -5:] = False  # right padding
    docs = torch.tensor([0] * 5 + [1] * 7 + [2] * 4)
    return {
        "causal": mmpe.Sequence(N, causal=True),
        "bidirectional": mmpe.Sequence(N),
        "causal_padding": mmpe.Sequence(N, causal=True, padding_mask=pad),
        "bidirectional_padding": mmpe.Sequence(N, padding_mask=pad),
        "causal_documents": mmpe.Sequence(N, causal=True, document_ids=docs),
        "grid_rows": mmpe.Grid((8, 4)),  # 32 tokens, row-major: a shard holds whole rows
    }


def _context(coords) -> dict:
    return {"d_model": D_MODEL, "num_heads": HEADS, "head_dim": D_MODEL // HEADS, "max_len": 64,
            "original_max_position_embeddings": 4, **coords_context(coords)}


def _max_err(got: torch.Tensor, want: torch.Tensor, kind: str) -> tuple[float, bool]:
    atol, rtol = TOLERANCES[torch.float32][kind]
    err = float((got - want).abs().max().detach()) if got.numel() else 0.0
    return err, bool(torch.allclose(got, want, atol=atol, rtol=rtol))


def run_input(enc, full, sharded) -> dict:
    x = torch.randn(full.batch_size or 2, full.num_queries, D_MODEL,
                    generator=torch.Generator().manual_seed(1))
    from mmpe.transformer import input_term

    want = sharded.take(input_term(enc, x, full).expand(x.shape[0], -1, -1), dim=1)
    got = input_term(enc, sharded.take(x), sharded).expand(x.shape[0], -1, -1)
    err, ok = _max_err(got, want, "output")
    return {"ok": ok, "errors": {"output": err}}


def _reference(layer, full, x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor] | str:
    """The unsharded layer's output, input gradient and parameter gradients (zeros where
    None), or the error message where it refuses the case itself (rope_mixed without GQA)."""
    xf = x.clone().requires_grad_(True)
    try:
        out = layer(xf, full)
    except ValueError as err:
        return str(err)
    (out * w).sum().backward()
    return [out.detach(), xf.grad, *(p.grad if p.grad is not None else torch.zeros_like(p)
                                     for p in layer.parameters())]


def run_layer(enc, full, sharded, kv_heads: int | None, local=None) -> dict:
    """Rank 0 computes the unsharded reference and broadcasts it (the other ranks would only
    repeat it); every rank compares its shard. `local`: attend on these coordinates instead of
    the shard's (the control: a shard numbered from 0 must differ)."""
    torch.manual_seed(0)
    layer = mmpe.MultiHeadAttention(D_MODEL, HEADS, [enc], num_kv_heads=kv_heads)
    twin = copy.deepcopy(layer)
    gen = torch.Generator().manual_seed(1)
    batch = full.batch_size or 2
    x = torch.randn(batch, full.num_queries, D_MODEL, generator=gen)
    w = torch.randn(batch, full.num_queries, D_MODEL, generator=gen)
    ref = _reference(layer, full, x, w) if dist.get_rank() == 0 else None
    refused = [ref if isinstance(ref, str) else None]
    dist.broadcast_object_list(refused, src=0)
    if refused[0] is not None:
        return {"unsharded_refuses": refused[0]}
    shapes = [x.shape, x.shape, *(p.shape for p in layer.parameters())]
    flat = torch.cat([t.reshape(-1) for t in ref]) if ref is not None else \
        torch.empty(sum(math.prod(s) for s in shapes))
    dist.broadcast(flat, src=0)
    want = [t.view(s) for t, s in zip(flat.split([math.prod(s) for s in shapes]), shapes,
                                      strict=True)]
    xl = sharded.take(x).requires_grad_(True)
    if local is None:
        outl = twin(xl, sharded)
    else:  # the control: this rank's tokens alone, numbered from 0 (no gathered keys)
        outl = twin(xl, local)
    (outl * sharded.take(w)).sum().backward()
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in twin.parameters()]
    summed = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(summed)  # the context group's gradient: the sum of the ranks'
    grads = summed.split([g.numel() for g in grads])
    names = ["output", "input gradient", *(n for n, _ in twin.named_parameters())]
    got = [outl.detach(), xl.grad, *grads]
    errors, ok = {}, True
    for i, (name, g, r) in enumerate(zip(names, got, want, strict=True)):
        r = sharded.take(r) if i < 2 else r.reshape(g.shape)
        errors[name], good = _max_err(g, r, "output" if i == 0 else "gradient")
        ok &= good
    return {"ok": ok, "errors": errors}


def cases(gqa: bool = True) -> list[tuple[str, str, str, int | None]]:
    """(encoding, coordinates, layout, kv heads) of every registered encoding the coordinates
    support; GQA (2 kv heads for 4 query heads) on the causal sequence."""
    out = []
    seqs = sequences()
    for entry in mmpe.available():
        for cname, coords in seqs.items():
            if not entry.supports(coords):
                continue
            layouts = ["contiguous"] if cname == "grid_rows" else ["contiguous", "balanced"]
            for layout in layouts:
                out.append((entry.name, cname, layout, None))
            if gqa and cname == "causal" and entry.hook != "input":
                out.append((entry.name, cname, "balanced", 2))
    return out


def run_case(name: str, cname: str, layout: str, kv_heads: int | None) -> dict:
    full = sequences()[cname]
    torch.manual_seed(0)
    enc = mmpe.build(name, context=_context(full))
    sharded = shard(full, layout=layout)
    try:
        if isinstance(enc, InputEncoding):
            sharded.check_encodings([enc])  # what Transformer.forward asks of a shard
            return run_input(enc, full, sharded)
        return run_layer(enc, full, sharded, kv_heads)
    except ContextParallelError as err:
        return {"refused": str(err)}


def worker(rank: int, world: int, port: int, out_dir: str, only: tuple = (),
           kinds: tuple = (), train: bool = False, gqa: bool = True,
           block_bytes: int | None = None) -> None:
    """Run the cases (`only`: these encodings, `kinds`: these coordinates) and, with `train`,
    the sharded training run; write `rank<r>.json` (and `train_rank<r>.json`)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if block_bytes is not None:  # small blocks: the causal chunks are cut into checkpointed rows
        os.environ["MMPE_ATTN_BLOCK_BYTES"] = str(block_bytes)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    results = []
    try:
        for case in cases(gqa):
            if (only and case[0] not in only) or (kinds and case[1] not in kinds):
                continue
            try:
                res = run_case(*case)
            except Exception as err:  # recorded for the test to name
                res = {"error": f"{type(err).__name__}: {err}",
                       "trace": traceback.format_exc()[-1500:]}
            results.append({"case": list(case), **res})
        # the control: positions local to the shard (what a sharded model without global
        # positions computes) must fail the same comparison
        full = sequences()["causal"]
        for name in ("rope", "alibi"):
            torch.manual_seed(0)
            enc = mmpe.build(name, context=_context(full))
            local = mmpe.Sequence(N // world, causal=True)
            res = run_layer(enc, full, shard(full, layout="contiguous"), None, local=local)
            results.append({"case": [name, "control-local-positions", "contiguous", None], **res})
        if train:
            losses = train_sharded()
            with open(os.path.join(out_dir, f"train_rank{rank}.json"), "w") as fh:
                json.dump(losses, fh)
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(results, fh)
        dist.destroy_process_group()


def spawn(world: int, out_dir: str, target=worker, *args) -> None:
    """Run `target(rank, world, port, out_dir, *args)` on `world` spawned processes (gloo)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(target, args=(world, port, out_dir, *args), nprocs=world, join=True)


TRAIN_STEPS = 50
_TRAIN = {"encoding": "alibi", "vocab_size": 11, "max_len": 32, "d_model": 32, "num_heads": 2,
          "depth": 2, "context_parallel": "balanced"}


def _train_setup():
    from mmpe.recipes.text import CharLM

    torch.manual_seed(0)
    model = CharLM(**_TRAIN)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    # a learnable stream: each symbol follows from the one two places back
    cols = list(torch.randint(0, _TRAIN["vocab_size"], (2, TRAIN_STEPS, 4), generator=gen))
    for _ in range(31):
        cols.append((cols[-2] * 3 + cols[-1]) % _TRAIN["vocab_size"])
    data = torch.stack(cols, dim=-1)  # [steps, b, 33]
    return model, opt, data


def train_single() -> list[float]:
    """The unsharded run's losses (nats per character), step by step."""
    import torch.nn.functional as F

    model, opt, data = _train_setup()
    losses = []
    for batch in data:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def train_sharded() -> list[float]:
    """The same run with each sequence sharded over the default group
    (`CharLM.context_loss`): the whole batch's loss at every step."""
    from mmpe.parallel import reduce_gradients

    model, opt, data = _train_setup()
    losses = []
    for batch in data:
        local, total = model.context_loss(batch)
        opt.zero_grad()
        local.backward()
        reduce_gradients(model, None)
        opt.step()
        losses.append(float(total))
    return losses
