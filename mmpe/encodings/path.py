"""PaTH attention (Yang et al. 2025): position as accumulated data-dependent Householder transforms."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpe.coords.capabilities import Causal
from mmpe.encodings._content import require_causal
from mmpe.encodings._precision import float32, full_precision
from mmpe.encodings.base import AttentionCall, KernelEncoding
from mmpe.encodings.fox import ForgettingGate
from mmpe.registry import register
from mmpe.validation import check_positive_int

#: tokens per block of the blockwise algorithm: the Python loops run `3·C + n/C` steps and the
#: blocks' transforms are `d × d` matrices. Measured on one CPU thread (b 2, 4 heads of 32,
#: forward + backward): 8/16/32/64 took 397/184/123/438 ms at 256 tokens, 6042/1947/490/885 ms
#: at 1,024 tokens
CHUNK_SIZE = 32
#: the rank of the low-rank `w` projection in the authors' layer (fla `PaTHAttention`)
W_RANK = 32


def householder_rows(x: Tensor, w: Tensor, beta: Tensor, rows: Tensor | None = None) -> Tensor:
    """A Householder-like transform applied to every row of `x`.

    `H x = x − β (wᵀx) w` applied to every row of `x [..., m, d]` (or only to the rows where
    `rows [m]` is True), for one transform per leading index: `w [..., d]`, `beta [...]`."""
    coef = beta.unsqueeze(-1) * (x @ w.unsqueeze(-1)).squeeze(-1)  # [..., m]
    if rows is not None:
        coef = coef * rows.to(coef.dtype)
    return x - coef.unsqueeze(-1) * w.unsqueeze(-2)


def _within_block(q: Tensor, k: Tensor, w: Tensor, beta: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """For blocks of `C` tokens (`[..., C, d]`, `beta [..., C]`), in `3C` vectorised steps:

    * logits `[..., C, C]`: `q_iᵀ H_i ⋯ H_{j+1} k_j` for `j ≤ i`, 0 above the diagonal;
    * keys carried to the block's end, `H_{C−1} ⋯ H_{j+1} k_j`;
    * queries carried to the block's start, `H_0 ⋯ H_i q_i` (so `q_iᵀ H_i ⋯ H_0 = (that)ᵀ`);
    * the block's product `G = H_{C−1} ⋯ H_0` `[..., d, d]`.
    """
    n = q.shape[-2]
    idx = torch.arange(n, device=q.device)
    keys, rows = k, []
    for t in range(n):  # H_t reaches every earlier key; query t then reads them all
        keys = householder_rows(keys, w[..., t, :], beta[..., t], idx < t)
        rows.append((keys @ q[..., t, :].unsqueeze(-1)).squeeze(-1))
    logits = torch.stack(rows, dim=-2) * torch.ones(n, n, dtype=torch.bool,
                                                     device=q.device).tril()
    queries = q
    for t in reversed(range(n)):  # H_t acts on the queries at or after it, nearest first
        queries = householder_rows(queries, w[..., t, :], beta[..., t], idx >= t)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    product = eye.expand(*q.shape[:-2], -1, -1)
    for t in range(n):  # G ← H_t G: the columns of G are rows of Gᵀ
        product = householder_rows(product.transpose(-1, -2), w[..., t, :],
                                   beta[..., t]).transpose(-1, -2)
    return logits, keys, queries, product


def path_logits(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, *,
                chunk_size: int = CHUNK_SIZE, states: bool = False
                ) -> Tensor | tuple[Tensor, Tensor, Tensor, Tensor]:
    """PaTH's bilinear form of queries and keys.

    PaTH's bilinear form `L_ij = k_jᵀ (H_{j+1} ⋯ H_i) q_i = q_iᵀ H_i ⋯ H_{j+1} k_j`
    (`j ≤ i`; `H_t = I − β_t w_t w_tᵀ`; the empty product for `j = i`), unscaled, by the
    blockwise algorithm: O(n²·d + n·d²) time, no `d × d` matrix per pair.

    Within a block of `C` tokens the transforms are applied as rank-1 updates; across blocks a
    query carried to its block's start meets the earlier blocks' keys carried to their block's
    end, passing through one `d × d` product per block in between. Rows `w_t` should have unit
    norm (then `β_t = 2` makes `H_t` a reflection, and `β_t ∈ (0, 2)` keeps `‖H_t‖ ≤ 1`).

    With `states`, what a cache continues from comes too: the queries carried to the first
    token, `starts_i = H_0 ⋯ H_i q_i` `[..., n, d]`; the keys carried through the last,
    `ends_j = H_{n−1} ⋯ H_{j+1} k_j` `[..., n, d]`; and the product `H_{n−1} ⋯ H_0` `[..., d, d]`.

    Args:
        q, k, w: `[..., n, d]` (one self-attention block: query `i` is key `i`).
        beta: `[..., n]`.
        chunk_size: `C`, tokens per block (any value gives the same numbers up to rounding).
        states: also return what a key/value cache continues from.

    Returns:
        The logits `L [..., n, n]` (0 above the diagonal), or with `states` the tuple
            `(L, starts, ends, product)`.

    Raises:
        ValueError: shapes that do not match, or a non-positive `chunk_size`.
    """
    check_positive_int("path", "chunk_size", chunk_size)
    if q.shape != k.shape or q.shape != w.shape or beta.shape != q.shape[:-1]:
        raise ValueError(f"path: q, k, w must be [..., n, d] and beta [..., n], got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, w {tuple(w.shape)}, beta "
                         f"{tuple(beta.shape)}")
    n, d = q.shape[-2:]
    size = min(chunk_size, n)
    pad = -n % size
    if pad:  # padded tokens are identity transforms with zero queries and keys
        q, k, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, w))
        beta = F.pad(beta, (0, pad))
    m = (n + pad) // size
    lead = q.shape[:-2]
    blocks = [t.reshape(*lead, m, size, *t.shape[-1:]) for t in (q, k, w)]
    local, keys, queries, product = _within_block(*blocks, beta.reshape(*lead, m, size))
    out = q.new_zeros(*lead, m, size, m, size)
    out.diagonal(dim1=-4, dim2=-2).copy_(local.movedim(-3, -1))
    carried = queries[..., 1:, :, :]  # query block c, carried back to block c − δ
    starts = [queries[..., 0, :, :]]
    for delta in range(1, m):
        scores = carried @ keys[..., : m - delta, :, :].transpose(-1, -2)
        out.diagonal(offset=-delta, dim1=-4, dim2=-2).copy_(scores.movedim(-3, -1))
        carried = carried @ product[..., : m - delta, :, :]  # through key block c − δ
        starts.append(carried[..., 0, :, :])  # block δ has reached the first token
        carried = carried[..., 1:, :, :]
    logits = out.reshape(*lead, m * size, m * size)[..., :n, :n]
    if not states:
        return logits
    total = torch.eye(d, dtype=q.dtype, device=q.device).expand(*lead, d, d)
    ends = []
    for c in reversed(range(m)):  # keys of block c pass the later blocks' products
        ends.append(keys[..., c, :, :] @ total.transpose(-1, -2))
        total = total @ product[..., c, :, :]
    ends = torch.stack(ends[::-1], dim=-3).reshape(*lead, m * size, d)[..., :n, :]
    starts = torch.stack(starts, dim=-3).reshape(*lead, m * size, d)[..., :n, :]
    return logits, starts, ends, total


def _check_in_order(name: str, scores: Tensor, ctx: AttentionCall) -> None:
    """Refuse a mask that lets a query see a token after its own: the transforms accumulate in
    token order, so "the tokens between key and query" must be the ones between their slots."""
    coords = ctx.coords
    docs = getattr(coords, "document_ids", None)
    if docs is not None:
        rows = docs.reshape(-1, docs.shape[-1])
        runs = (rows[:, 1:] != rows[:, :-1]).sum(-1) + 1
        distinct = torch.stack([row.unique().numel() * torch.ones((), dtype=runs.dtype)
                                for row in rows.cpu()])
        if bool((runs.cpu() != distinct).any()):
            raise ValueError(f"{name}: document_ids must give each document one run of "
                             "consecutive tokens (packed documents); a document that resumes "
                             "after another would accumulate the other's transforms")
    first = coords.num_keys - coords.num_queries
    slot = torch.arange(coords.num_queries, device=scores.device).unsqueeze(-1) + first
    later = torch.arange(coords.num_keys, device=scores.device) > slot
    real = getattr(coords, "key_mask", None)
    if real is not None:  # a pad's own row is not read (padding renumbers it like a later token)
        later = later & real.to(scores.device)[..., first:, None].unsqueeze(-3)
    bad = (torch.isfinite(scores) & later).any()
    message = (f"{name}: a query attends to a key after it in token order; the transforms "
               "accumulate over the tokens between key and query, so the coordinates must be "
               "causal in token order (explicit position_ids that go backwards are not "
               "supported)")
    if torch.compiler.is_compiling():  # a traced graph cannot branch on data: it asserts
        torch._assert_async(~bad, message)
    elif bool(bad):
        raise ValueError(message)


@register(
    "path", hook="kernel", needs=(Causal,), learnable=True, family="kernel",
    paper="Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim 2025, PaTH Attention: Position "
          "Encoding via Accumulating Householder Transformations (NeurIPS; arXiv:2505.16381)",
    context=("d_model", "num_heads", "head_dim"))
class PaTH(KernelEncoding):
    """PaTH attention: data-dependent Householder-like transforms.

    PaTH attention (Yang et al. 2025): data-dependent Householder-like transforms between
    key and query in place of RoPE's fixed rotations.

    `A_ij ∝ exp(k_jᵀ (H_{j+1} H_{j+2} ⋯ H_i) q_i / √h_d)` for `j ≤ i` (the paper's eq.; for
    symmetric `H` it is `q_iᵀ H_i ⋯ H_{j+1} k_j`, the transform of the query's own token
    nearest the query), with `H_t = I − β_t w_t w_tᵀ` per head. As in the authors' layer
    (flash-linear-attention `PaTHAttention`): `w_t` is a low-rank projection of the layer
    input `x_t` (rank 32), through a causal depthwise convolution over the last `conv_size`
    tokens and SiLU, L2-normalised per head; `β_t = 2·σ(uᵀx_t + b) ∈ (0, 2)` per head (a
    negative eigenvalue `1 − β_t` allowed). The logits come from
    [`path_logits`][mmpe.encodings.path.path_logits], O(n²·h_d). `β → 0` is causal attention
    without a position encoding; `β = 2` makes every `H_t` a reflection.

    Causal attention in token order only; packed documents (`document_ids`, one run of tokens
    each: the convolution does not reach across a document start) and padding (`padding_mask`:
    a padded token's transform is the identity and the convolution skips it) are supported.
    Cached decoding is exact: the layer's cache keeps every key carried through the latest
    token (the running product applied, as the authors' decoder does), the convolution's last
    inputs and, for `path_fox`, the gate sums. Other score terms of the layer add to the
    logits as they do to softmax's (read as `scores − q·kᵀ/√h_d`, so they must not change the
    softmax scale); context parallelism is refused (`shard_refusal`).

    Args:
        d_model: width of `x`.
        num_heads: `n_h` (one `w`, `β` per head).
        head_dim: `h_d`; default `d_model // num_heads`.
        w_rank: rank of the `w` projection (`d_model → w_rank → n_h·h_d`); None: one full
            `d_model → n_h·h_d` layer (the authors' choice with shared key heads).
        conv_size: taps of the short convolution on `w` (the token and the `conv_size − 1`
            before it); None: no convolution (and no SiLU).

    Shapes: `attend(scores [b, n_h, n_q, n_k] (masked at −inf), v [b, n_h, n_k, h_d], ctx)`
    reads `ctx.q [b, n_h, n_q, h_d]`, `ctx.k [b, n_h, n_k, h_d]`, `ctx.x [b, n_q, d_model]`.

    Raises:
        ValueError: non-positive sizes; coordinates that are not
            causal, a mask that is not causal in token order, documents that are not runs;
            a missing `x`, `q` or `k`, or heads / head dim other than built for; a cache that
            holds keys this encoding did not see.
        TypeError: coordinates without a direction (`Causal` capability; grids, graphs …).
    """

    is_softmax = False
    shard_refusal = ("its transforms accumulate over every token from the key to the query, "
                     "computed from each token's layer input x; a rank holds only its own "
                     "tokens' x")
    #: tokens per block of [`path_logits`][mmpe.encodings.path.path_logits] (speed only)
    chunk_size: int = CHUNK_SIZE

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None,
                 w_rank: int | None = W_RANK, conv_size: int | None = 3) -> None:
        super().__init__()
        check_positive_int(self._name, "d_model", d_model)
        check_positive_int(self._name, "num_heads", num_heads)
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"{self._name}: d_model={d_model} is not divisible by "
                                 f"num_heads={num_heads}; give head_dim")
            head_dim = d_model // num_heads
        check_positive_int(self._name, "head_dim", head_dim)
        if w_rank is not None:
            check_positive_int(self._name, "w_rank", w_rank)
        if conv_size is not None:
            check_positive_int(self._name, "conv_size", conv_size)
        self.num_heads, self.head_dim, self.conv_size = num_heads, head_dim, conv_size
        width = num_heads * head_dim
        self.w_proj = nn.Linear(d_model, width, bias=False) if w_rank is None else \
            nn.Sequential(nn.Linear(d_model, w_rank, bias=False),
                          nn.Linear(w_rank, width, bias=False))
        # Tap conv_size − 1 reads the token itself, tap 0 the farthest (torch's Conv1d order).
        self.w_conv = nn.Parameter(torch.empty(width, conv_size)) if conv_size else None
        self.beta_proj = nn.Linear(d_model, num_heads)
        self._init_conv()

    @property
    def _name(self) -> str:
        return getattr(self, "registry_name", "path")

    def _init_conv(self) -> None:
        if self.w_conv is not None:  # Conv1d's default: uniform in ±1/√fan_in
            bound = 1.0 / math.sqrt(self.conv_size)
            nn.init.uniform_(self.w_conv, -bound, bound)

    # ------------------------------------------------------------------ the transforms
    def transforms(self, x: Tensor, ctx: AttentionCall, tail: tuple | None = None
                   ) -> tuple[Tensor, Tensor, tuple | None]:
        """The transforms' directions and strengths for the layer input `x`.

        `w [b, n_h, s, h_d]` (unit rows), `β [b, n_h, s]` (0 at padded tokens) for the
        layer input `x [b, s, d_model]` of the last `s` keys, float32 (float64 stays), and what
        the convolution of the next cached step continues from (`tail`: the previous one).

        The convolution reads the token and the `conv_size − 1` real tokens before it in its
        document: the same numbers as the unpadded, unpacked sequence."""
        coords, b, s = ctx.coords, x.shape[0], x.shape[1]
        n_k = coords.num_keys
        first = n_k - s  # key slot of x's first token
        dtype = float32(x).dtype
        with full_precision(x.device):
            u = self._project(x.to(dtype))  # [b, s, n_h·h_d]
            real = _per_key(getattr(coords, "key_mask", None), b, n_k, x.device)
            docs = _per_key(getattr(coords, "document_ids", None), b, n_k, x.device)
            new_real = torch.ones(b, s, dtype=torch.bool, device=x.device) if real is None \
                else real[:, first:]
            new_docs = torch.zeros(b, s, dtype=torch.long, device=x.device) if docs is None \
                else docs[:, first:].long()
            new_tail = None
            if self.w_conv is not None:
                u, new_tail = self._convolve(u, new_real, new_docs, tail)
            w = F.normalize(u.unflatten(-1, (self.num_heads, self.head_dim)), dim=-1, eps=1e-6)
            lin = self.beta_proj
            beta = 2.0 * torch.sigmoid(F.linear(x.to(dtype), lin.weight.to(dtype),
                                                lin.bias.to(dtype)))  # [b, s, n_h]
            beta = beta * new_real.unsqueeze(-1).to(dtype)  # a pad is no step on the path
        return w.transpose(1, 2), beta.transpose(1, 2), new_tail

    def _convolve(self, u: Tensor, real: Tensor, docs: Tensor, tail: tuple | None
                  ) -> tuple[Tensor, tuple]:
        """Causal depthwise convolution and SiLU over the real tokens of each document.

        `tail` = (inputs `[b, K−1, c]`, real `[b, K−1]`, documents `[b, K−1]`) of the last
        `K − 1` real tokens before `u`; the returned tail is the same for the end of `u`."""
        b, s, width = u.shape
        span = self.conv_size - 1
        if tail is None:
            tail = (u.new_zeros(b, span, width),
                    torch.zeros(b, span, dtype=torch.bool, device=u.device),
                    torch.zeros(b, span, dtype=torch.long, device=u.device))
        inputs = torch.cat((tail[0].to(u.dtype), u), dim=1)  # [b, span + s, c]
        valid = torch.cat((tail[1], real), dim=1)
        ids = torch.cat((tail[2], docs), dim=1)
        # The r-th real entry sits at index where[b, r]: taps count real tokens, not slots.
        rank = valid.long().cumsum(-1) - 1  # [b, span + s]
        size = valid.shape[1]
        where = torch.zeros(b, size + 1, dtype=torch.long, device=u.device)
        where.scatter_(1, torch.where(valid, rank, size), torch.arange(size, device=u.device)
                       .expand(b, size))
        own = rank[:, span:]
        weight = self.w_conv.to(u.dtype)
        mixed = torch.zeros_like(u)
        for lag in range(self.conv_size):
            src = where.gather(1, (own - lag).clamp(min=0))  # [b, s]
            ok = (own - lag >= 0) & ids.gather(1, src).eq(docs) & valid.gather(1, src)
            if lag:  # a pad's own tap reads itself (its w is never used: β = 0)
                ok = ok & real
            else:
                src, ok = torch.arange(span, span + s, device=u.device).expand(b, s), \
                    torch.ones_like(real)
            picked = inputs.gather(1, src.unsqueeze(-1).expand(b, s, width))
            mixed = mixed + picked * ok.unsqueeze(-1) * weight[:, span - lag]
        total = valid.long().sum(-1, keepdim=True)  # real entries so far
        keep = total - span + torch.arange(span, device=u.device)  # ranks of the new tail
        at = where.gather(1, keep.clamp(min=0))
        new_tail = (inputs.gather(1, at.unsqueeze(-1).expand(b, span, width)),
                    (keep >= 0) & valid.gather(1, at), ids.gather(1, at))
        return F.silu(mixed), new_tail

    def _project(self, x: Tensor) -> Tensor:
        layers = [self.w_proj] if isinstance(self.w_proj, nn.Linear) else list(self.w_proj)
        for layer in layers:
            x = F.linear(x, layer.weight.to(x.dtype))
        return x

    def gate_sums(self, x: Tensor, start: Tensor | None) -> Tensor | None:
        """Running sums of the log forget gates `[b, n_h, s]` (None without a gate)."""
        return None

    # ------------------------------------------------------------------ attention
    def logits(self, ctx: AttentionCall) -> Tensor:
        """Scaled PaTH logits of the context's queries and keys.

        Scaled PaTH logits `[b, n_h, n_q, n_k]` (float32, float64 kept) of the context's
        queries and keys, the gate decay added for `path_fox`; entries the mask removes are
        unspecified. With a cache, extends the cache's state by this step."""
        q, k, x, cache = ctx.q, ctx.k, ctx.x, ctx.cache
        dtype = torch.promote_types(float32(q).dtype, float32(k).dtype)
        scale = 1.0 / math.sqrt(self.head_dim)
        with full_precision(q.device):
            q, k = q.to(dtype), k.to(dtype)
            if cache is None:
                w, beta, _ = self.transforms(x, ctx)
                out = path_logits(q, k, w, beta, chunk_size=self.chunk_size) * scale
                c = self.gate_sums(x, None)
            else:
                out, c = self._cached_logits(q, k, ctx, scale)
        if c is not None:
            first = ctx.coords.num_keys - ctx.coords.num_queries
            out = out + (c[..., first:].unsqueeze(-1) - c.unsqueeze(-2))
        return out

    def _cached_logits(self, q: Tensor, k: Tensor, ctx: AttentionCall, scale: float
                       ) -> tuple[Tensor, Tensor | None]:
        cache, coords, x = ctx.cache, ctx.coords, ctx.x
        n_q, n_k = coords.num_queries, coords.num_keys
        key = (self._name, id(self))
        state = cache.state.get(key)
        if state is not None and state["length"] == n_k:
            state = state["before"]  # a second call in one forward: this step is already in
        past = 0 if state is None else state["length"]
        if past != n_k - n_q:
            raise ValueError(f"{self._name}: the cache holds {n_k - n_q} keys but PaTH state "
                             f"for {past}; fill the cache through this model from its first "
                             "token")
        w, beta, tail = self.transforms(x, ctx, None if state is None else state["tail"])
        new, starts, ends, total = path_logits(q, k[..., past:, :], w, beta,
                                               chunk_size=self.chunk_size, states=True)
        c_past = None if state is None else state["gates"]
        c_new = self.gate_sums(x, None if c_past is None else c_past[..., -1])
        c = c_new if c_past is None else torch.cat((c_past, c_new), dim=-1)
        if state is None:
            keys, out = ends, new * scale
        else:
            carried = state["keys"]  # every cached key carried through the latest token
            out = torch.cat((starts @ carried.transpose(-1, -2), new), dim=-1) * scale
            keys = torch.cat((carried @ total.transpose(-1, -2), ends), dim=-2)
        cache.state[key] = {"length": n_k, "keys": keys, "tail": tail, "gates": c,
                            "before": state}
        if state is not None:
            state["before"] = None  # keep one step of history, not the whole chain
        return out, c

    def check(self, ctx: AttentionCall) -> None:
        """Raise unless `ctx` is a call PaTH can run (see the class's Raises)."""
        name = self._name
        self.check_coords(ctx.coords)
        require_causal(name, ctx)
        for field in ("q", "k", "x"):
            if getattr(ctx, field) is None:
                raise ValueError(f"{name}: needs the layer's {field} in the AttentionCall "
                                 "(x: the layer input the transforms are computed from)")
        coords = ctx.coords
        if ctx.num_heads != self.num_heads or ctx.head_dim != self.head_dim:
            raise ValueError(f"{name}: built for num_heads={self.num_heads}, head_dim="
                             f"{self.head_dim}; the attention has {ctx.num_heads}, "
                             f"{ctx.head_dim}")
        if ctx.q.shape[-2] != coords.num_queries or ctx.k.shape[-2] != coords.num_keys:
            raise ValueError(f"{name}: q/k hold {ctx.q.shape[-2]}/{ctx.k.shape[-2]} tokens but "
                             f"the coordinates have {coords.num_queries}/{coords.num_keys}")
        tokens = coords.num_queries if ctx.cache is not None else coords.num_keys
        if ctx.x.shape[1] != tokens:
            raise ValueError(f"{name}: x has {ctx.x.shape[1]} tokens; the transforms need the "
                             f"layer input of every {'new token' if ctx.cache else 'key'} "
                             f"({tokens})")

    def weights(self, scores: Tensor, ctx: AttentionCall) -> Tensor:
        """Attention probabilities for the math route's masked logits.

        Attention probabilities `[b, n_h, n_q, n_k]` (float32) for the math route's masked
        logits `scores` (which carry the mask and the layer's other score terms)."""
        self.check(ctx)
        _check_in_order(self._name, scores, ctx)
        # What the math route added to q·kᵀ/√h_d: the mask (−inf) and other score terms; the
        # same expression as the path's, so with no other term it is exactly 0.
        plain = (ctx.q @ ctx.k.transpose(-2, -1)).float() * (1.0 / math.sqrt(self.head_dim))
        z = self.logits(ctx) + (scores - plain)
        return z.softmax(dim=-1)

    def attend(self, scores: Tensor, v: Tensor, ctx: AttentionCall) -> Tensor:
        probs = self.weights(scores, ctx)
        return probs @ v.to(probs.dtype)


def _per_key(t: Tensor | None, b: int, n_k: int, device: torch.device) -> Tensor | None:
    """A `[n_k]` or `[b, n_k]` per-key tensor of the coordinates as `[b, n_k]` (or None)."""
    if t is None:
        return None
    return t.to(device).reshape(-1, n_k).expand(b, n_k)


@register(
    "path_fox", hook="kernel", needs=(Causal,), learnable=True, family="kernel",
    paper="Yang, Shen, Wen, Tan, Mishra, Ren, Panda & Kim 2025, PaTH Attention (NeurIPS; "
          "arXiv:2505.16381), PaTH-FoX: PaTH with the forget gates of Lin et al. 2025 (FoX)",
    context=("d_model", "num_heads", "head_dim"))
class PaTHFoX(PaTH):
    """PaTH-FoX (Yang et al. 2025): PaTH's logits plus FoX's data-dependent decay.

    `z_ij = k_jᵀ (H_{j+1} ⋯ H_i) q_i / √h_d + Σ_{l=j+1}^{i} log f_l`, `f_l = σ(w_hᵀ x_l + b_h)`
    per head: the gate of [`fox`][mmpe.encodings.fox.ForgettingGate] (its module, so its
    maths, running sums in float32 and initialisation, are FoX's own), added unscaled as FoX
    adds it. (flash-linear-attention's PaTH kernel multiplies the gate sums by the softmax scale
    too: its `g` is this gate's `log f · √h_d`.) With all gates 1 it is `path`.

    Args, shapes and errors: as [`path`][mmpe.encodings.path.PaTH].
    """

    def __init__(self, d_model: int, num_heads: int, head_dim: int | None = None,
                 w_rank: int | None = W_RANK, conv_size: int | None = 3) -> None:
        super().__init__(d_model, num_heads, head_dim, w_rank, conv_size)
        self.forget = ForgettingGate(d_model, num_heads)

    def gate_sums(self, x: Tensor, start: Tensor | None) -> Tensor:
        return self.forget.cumulative_log_forget(x, start)
