"""Key/value caches for cached (incremental) decoding, in the style of HF and torchtune.

A decoder that generates token by token keeps each layer's keys and values of the tokens seen
so far, so a step costs O(n) instead of recomputing O(n²). The coordinates of a step say where
its tokens sit: `Sequence(s_new, offset=cache.length, causal=True)` — queries at ``offset …
offset + s_new − 1`, keys `0 … offset + s_new − 1` — optionally with a `padding_mask``
covering every key for a left-padded batch.

    >>> import torch, mmpe
    >>> model = mmpe.Transformer(32, 4, 2, ["rope", "alibi"])
    >>> cache = model.make_cache()
    >>> x = torch.randn(1, 5, 32)
    >>> y = model(x, mmpe.Sequence(5, causal=True), cache=cache)             # prompt
    >>> y1 = model(torch.randn(1, 1, 32), mmpe.Sequence(1, offset=5, causal=True), cache=cache)
    >>> cache.length
    6
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor


class KVCache:
    """One attention layer's cached keys and values, `[b, n_kv, s, h_d]` each.

    Attributes:
        k: the cached keys `[b, n_kv, s, h_d]` (None before the first step).
        v: the cached values, shaped as `k` (None before the first step).
        state: per-encoding incremental state, keyed by the encoding (e.g. FoX's cumulative
            log forget gates of every cached token); an encoding that needs more than the
            keys and values keeps it here.
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.state: dict[Any, Any] = {}
        self._owner: weakref.ref | None = None  # the attention layer that filled it
        self._causal: bool | None = None
        self._key_mask: Tensor | None = None  # [b, n] True at real cached keys; None: no pads

    @property
    def length(self) -> int:
        """Tokens cached so far."""
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: Tensor, v: Tensor, owner: object | None = None,
               causal: bool | None = None, key_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Append this step's `k`, `v` `[b, n_kv, s_new, h_d]`; return all of them.

        `owner` (the attention layer calling) and `causal` (its coordinates' mask) are
        remembered at the first step and checked at every later one. `key_mask` (the step's
        coordinates' `key_mask`, `[n_k]` or `[b, n_k]` over the cached and the new keys, True at
        real tokens) is remembered too: once a step has padding, every later step must give a
        mask that agrees with it on the cached keys, since a step without one would attend to
        the pads again and count them as positions.

        Raises:
            ValueError: a batch, head count or head dimension that differs from the cache's;
                another attention layer than the one that filled the cache (one cache per
                model: `model.make_cache()`); a causal step after a bidirectional one or the
                reverse; a step without `padding_mask` (or with another one) after padded
                cached tokens.
        """
        if self.k is None:
            self._remember_mask(key_mask, k.shape[0], k.shape[-2])
            self.k, self.v = k, v
            self._owner = None if owner is None else weakref.ref(owner)
            self._causal = causal
            return k, v
        if owner is not None and self._owner is not None and self._owner() is not owner:
            raise ValueError("KVCache: this cache holds the keys of another attention layer; "
                             "give each model its own cache (model.make_cache())")
        if causal is not None and self._causal is not None and causal != self._causal:
            raise ValueError(f"KVCache: a {'causal' if causal else 'bidirectional'} step after "
                             f"{'causal' if self._causal else 'bidirectional'} cached tokens; "
                             "decode with the mask the cache was filled with")
        if k.shape[:2] != self.k.shape[:2] or k.shape[-1] != self.k.shape[-1]:
            raise ValueError(f"KVCache: new keys {tuple(k.shape)} do not continue the cached "
                             f"{tuple(self.k.shape)} (batch, heads and head dim must match)")
        self._check_mask(key_mask, k.shape[0])
        self._remember_mask(key_mask, k.shape[0], self.length + k.shape[-2])
        self.k = torch.cat((self.k, k), dim=-2)
        self.v = torch.cat((self.v, v), dim=-2)
        return self.k, self.v

    def _remember_mask(self, key_mask: Tensor | None, batch: int, n: int) -> None:
        if key_mask is None or bool(key_mask.all()):
            self._key_mask = None
            return
        self._key_mask = key_mask.detach().to(torch.bool).expand(batch, n).clone()

    def _check_mask(self, key_mask: Tensor | None, batch: int) -> None:
        """The step's mask over the cached keys must be the cached tokens' padding."""
        past = self.length
        if key_mask is None:
            if self._key_mask is not None:
                raise ValueError(
                    "KVCache: the cached tokens include padding; give this step's coordinates "
                    f"the padding_mask of all {past} cached keys and the new ones "
                    f"(padding_mask [b, {past} + s_new], cached part as before), or the step "
                    "attends to the pads and counts them as positions")
            return
        seen = key_mask.detach().to(torch.bool).expand(batch, key_mask.shape[-1])[:, :past]
        cached = (torch.ones_like(seen) if self._key_mask is None
                  else self._key_mask.to(seen.device))
        if not torch.equal(seen, cached):
            raise ValueError("KVCache: this step's padding_mask disagrees with the cached "
                             "tokens' padding on the cached keys (its first "
                             f"{past} columns must repeat the earlier steps' masks)")

    def reset(self) -> None:
        """Forget every cached token and encoding state."""
        self.k = self.v = None
        self.state.clear()
        self._owner = self._causal = self._key_mask = None


class ModelCache:
    """The caches of every layer of a model (`Transformer.make_cache()`).

    Index it by layer; [`length`][mmpe.cache.ModelCache.length] is the number of tokens cached (the `offset` of the
    next step's coordinates).
    """

    def __init__(self, num_layers: int) -> None:
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"ModelCache: num_layers must be an int >= 1, got {num_layers!r}")
        self.layers = [KVCache() for _ in range(num_layers)]

    def __getitem__(self, i: int) -> KVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def length(self) -> int:
        """Tokens cached so far (the next step's `offset`)."""
        return self.layers[0].length

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
