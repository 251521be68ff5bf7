"""Scratch blocks reused across the tiles plan's blocks (``mmpe._scratch``): a call site gets
its previous block's storage back only inside ``reuse_blocks()``, on the CPU, and only where
nothing else still holds it (a view, an autograd saved tensor) — so a number someone kept is
never overwritten."""

from __future__ import annotations

import pytest
import torch

import mmpe._scratch as scratch
from mmpe._scratch import block_empty, reuse_blocks

CPU = torch.device("cpu")


OWNER, OTHER = object(), object()


def _block(name="k", shape=(4, 8), dtype=torch.float32, owner=OWNER):
    return block_empty(owner, name, shape, dtype, CPU)


def test_outside_the_context_every_block_is_new():
    b = _block()
    assert b.shape == (4, 8) and b.dtype == torch.float32
    c = _block()
    assert b.data_ptr() != c.data_ptr()
    assert getattr(scratch._local, "pools", []) == []


def test_a_released_block_is_reused_and_a_held_one_is_not():
    with reuse_blocks():
        a = _block()
        a.fill_(1.0)
        held = a[1:]  # a view someone kept
        ptr = a.data_ptr()
        del a
        b = _block()
        assert b.data_ptr() != ptr  # still held through the view
        b.fill_(2.0)
        assert torch.equal(held, torch.ones(3, 8))
        b_ptr = b.data_ptr()
        del b, held
        c = _block()
        assert c.data_ptr() == b_ptr  # released: the pool's (b's) storage again
        c_ptr = c.data_ptr()
        del c
        assert _block().data_ptr() == c_ptr
        # another name or owner, dtype or a larger shape never takes it
        assert _block(name="other").data_ptr() != c_ptr
        assert _block(owner=OTHER).data_ptr() != c_ptr
        assert _block(dtype=torch.float64).data_ptr() != c_ptr
        assert _block(shape=(4, 8)).data_ptr() != c_ptr  # the float64 one replaced it
        big = _block(shape=(64, 64))
        big_ptr = big.data_ptr()
        del big
        small = _block(shape=(2, 3))  # a smaller block within the larger storage
        assert small.shape == (2, 3) and small.is_contiguous()
        assert small.data_ptr() == big_ptr


def test_an_autograd_saved_block_is_not_reused():
    w = torch.ones(3, requires_grad=True)
    with reuse_blocks():
        a = _block(shape=(3,))
        a.copy_(torch.tensor([1.0, 2.0, 3.0]))
        y = (a * w).sum()  # saves a for w's gradient
        ptr = a.data_ptr()
        del a
        b = _block(shape=(3,))
        assert b.data_ptr() != ptr
        b.fill_(9.0)
        y.backward()
    assert torch.equal(w.grad, torch.tensor([1.0, 2.0, 3.0]))


def test_contexts_nest_and_release_on_exit():
    with reuse_blocks():
        outer = _block()
        outer_ptr = outer.data_ptr()
        del outer
        with reuse_blocks():
            inner = _block()  # the inner context has its own pool
            assert inner.data_ptr() != outer_ptr
            del inner
        assert _block().data_ptr() == outer_ptr
    assert getattr(scratch._local, "pools", []) == []


def test_without_torchs_use_count_nothing_is_reused(monkeypatch):
    monkeypatch.setattr(scratch, "_use_count", None)
    with reuse_blocks():
        _block()
        _block()
        assert scratch._local.pools[-1] == {}  # nothing pooled: torch.empty each time


@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 0, 3)])
def test_any_shape(shape):
    with reuse_blocks():
        assert _block(shape=shape).shape == shape
