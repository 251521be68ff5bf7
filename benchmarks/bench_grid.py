"""Grid encodings: mmpe against timm, timed in the same run, reported as ratios.

    python benchmarks/bench_grid.py [--quick] [--store results/bench]

Rows (ViT-B/16-like shapes: b=8, 12 heads, head_dim 64, a 14x14 patch grid + cls token; and a
28x28 grid for the resolution change):
* 2D sin-cos: building ``[n, 768]`` — mmpe ``sincos`` with its per-grid cache emptied before
  every call (float64 phases, per-axis tables broadcast into place) vs
  ``timm.layers.build_sincos2d_pos_embed`` (float32). A model reuses mmpe's cached table across
  forwards; timm models keep theirs as a fixed parameter.
* Learned APE resampled 14x14 -> 28x28 — mmpe ``learned_grid`` vs ``timm.layers.resample_abs_pos_embed``.
* Axial RoPE build + apply to q and k — mmpe ``rope_axial`` with its table cache emptied before
  every call (float64 phases) vs timm ``RotaryEmbeddingCat.get_embed(shape)`` +
  ``apply_rot_embed_cat``; then both with their tables cached.
* Mixed RoPE build + apply — mmpe ``rope_mixed`` vs timm ``RotaryEmbeddingMixed``.
* Swin/BEiT relative position bias: gathering ``[h, n, n]`` and adding to the scores — mmpe
  ``swin`` (its eager ``bias``) vs timm ``RelPosBias``.
* SwinV2 CPB bias — mmpe ``swinv2_cpb`` vs timm ``RelPosMlp(mode="swin")``.

mmpe and timm are timed alternately, round after round (``paired``), so load from other jobs
hits both alike; times are medians, the ratio is the median of the per-round ratios timm time /
mmpe time (> 1: mmpe faster). ``--store DIR`` also appends the table (``peers``) to
``DIR/bench_grid.jsonl`` (``benchmarks/_store.py``).
"""

from __future__ import annotations

import argparse
import warnings

import torch
from _store import Table, write
from _timing import paired
from timm.layers import resample_abs_pos_embed
from timm.layers.pos_embed_rel import RelPosBias, RelPosMlp
from timm.layers.pos_embed_sincos import (
    RotaryEmbeddingCat,
    RotaryEmbeddingMixed,
    apply_rot_embed_cat,
    build_sincos2d_pos_embed,
)

import mmpe
from mmpe.attention import dense_bias
from mmpe.coords import Grid
from mmpe.encodings.base import AttentionCall

warnings.filterwarnings("ignore")


def _forget(enc: torch.nn.Module) -> None:
    """Empty an encoding's table cache, so the next call builds its tables from scratch."""
    cache = getattr(enc, "_cache", None)
    if isinstance(cache, dict):
        cache.clear()
    else:  # mmpe versions with a one-entry cache (or none): same effect
        enc._cache = None


def rows(b: int, h: int, side: int, d: int, repeat: int) -> list[tuple[str, float, float, float]]:
    out = []
    grid = Grid((side, side), prefix_tokens=1)
    n = grid.num_tokens
    dm = h * d

    sincos = mmpe.build("sincos", d_model=dm, layout="timm")
    plain = Grid((side, side))

    def ours_sincos():
        _forget(sincos)  # build every call, as timm's function does
        return sincos(plain)

    out.append((f"2D sincos build [{n - 1}, {dm}]",
                *paired(ours_sincos, lambda: build_sincos2d_pos_embed([side, side], dm), repeat)))

    learned = mmpe.build("learned_grid", d_model=dm, grid_shape=(side, side), prefix_tokens=1)
    big = grid.with_shape((2 * side, 2 * side))
    posemb = torch.cat((learned.prefix, learned.table))[None].detach()
    with torch.no_grad():
        out.append((f"learned APE resample {side}->{2 * side}",
                    *paired(lambda: learned(big),
                            lambda: resample_abs_pos_embed(posemb, [2 * side] * 2,
                                                           old_size=[side] * 2,
                                                           num_prefix_tokens=1), repeat)))

    q, k = torch.randn(b, h, n, d), torch.randn(b, h, n, d)
    axial = mmpe.build("rope_axial", head_dim=d, interleaved=True)
    timm_rope = RotaryEmbeddingCat(d, in_pixels=False)

    def ours_axial():
        _forget(axial)  # build the phases every call, as timm's get_embed(shape)
        return axial(q, k, grid)

    def timm_axial():
        emb = timm_rope.get_embed([side, side])
        return (torch.cat((q[:, :, :1], apply_rot_embed_cat(q[:, :, 1:], emb)), 2),
                torch.cat((k[:, :, :1], apply_rot_embed_cat(k[:, :, 1:], emb)), 2))

    out.append((f"axial RoPE build+apply q,k [{b},{h},{n},{d}]",
                *paired(ours_axial, timm_axial, repeat)))
    cached = RotaryEmbeddingCat(d, in_pixels=False, feat_shape=[side, side])
    emb = cached.get_embed()
    out.append(("axial RoPE apply q,k (tables cached)",
                *paired(lambda: axial(q, k, grid),
                        lambda: (torch.cat((q[:, :, :1], apply_rot_embed_cat(q[:, :, 1:], emb)), 2),
                                 torch.cat((k[:, :, :1], apply_rot_embed_cat(k[:, :, 1:], emb)), 2)),
                        repeat)))

    mixed = mmpe.build("rope_mixed", head_dim=d, num_heads=h)
    timm_mixed = RotaryEmbeddingMixed(dm, depth=1, num_heads=h)

    def timm_mixed_fn():
        emb = timm_mixed.get_embed([side, side])[0]
        return (torch.cat((q[:, :, :1], apply_rot_embed_cat(q[:, :, 1:], emb)), 2),
                torch.cat((k[:, :, :1], apply_rot_embed_cat(k[:, :, 1:], emb)), 2))

    with torch.no_grad():
        out.append(("mixed RoPE build+apply q,k",
                    *paired(lambda: mixed(q, k, grid), timm_mixed_fn, repeat)))

    scores = torch.randn(b, h, n, n)
    swin = mmpe.build("swin", num_heads=h, grid_shape=(side, side))
    timm_swin = RelPosBias((side, side), h, prefix_tokens=1)
    ctx = AttentionCall(grid, h, d, b)
    with torch.no_grad():
        out.append((f"Swin/BEiT rel-pos bias + scores [{b},{h},{n},{n}]",
                    *paired(lambda: scores + dense_bias([swin], ctx), lambda: timm_swin(scores), repeat)))

    cpb = mmpe.build("swinv2_cpb", num_heads=h, grid_shape=(side, side))
    timm_cpb = RelPosMlp((side, side), h, hidden_dim=512, prefix_tokens=1, mode="swin").eval()
    with torch.no_grad():
        out.append(("SwinV2 CPB bias + scores",
                    *paired(lambda: scores + dense_bias([cpb], ctx), lambda: timm_cpb(scores), repeat)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer repeats")
    parser.add_argument("--store", metavar="DIR",
                        help="also append the table to DIR/bench_grid.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(1)
    b, h, side, d, rep = (2, 4, 8, 32, 5) if args.quick else (8, 12, 14, 64, 15)
    table = rows(b, h, side, d, rep)
    print(f"## Grid encodings on CPU (1 thread), b={b}, heads={h}, head_dim={d}, grid {side}x{side}+cls\n")
    stored = Table("peers", f"Grid encodings on CPU, b={b}, heads={h}, head_dim={d}, "
                   f"grid {side}x{side}+cls", ["operation", "mmpe ms", "timm ms", "timm / mmpe"],
                   [None, "{:.2f}", "{:.2f}", "{:.2f}"])
    print("| operation | mmpe ms | timm ms | timm / mmpe |")
    print("|---|---|---|---|")
    for op, t_ours, t_peer, ratio in table:
        stored.add(op, t_ours * 1e3, t_peer * 1e3, ratio)
        print(f"| {op} | {t_ours * 1e3:.2f} | {t_peer * 1e3:.2f} | {ratio:.2f} |")
    print("\nsincos and axial RoPE 'build' rows empty mmpe's table cache before every call "
          "(float64 phases each time); in a model the cached table is reused across forwards.")
    print("learned APE resample: mmpe and timm spend their time in the same call, "
          "F.interpolate(bicubic, antialias=True) on the same channels-last [1, 768, 14, 14] "
          "view, so the ratio is 1.0 up to noise; nothing is left to remove without changing "
          "the numbers (the plain bicubic kernel differs from the antialiased one even when "
          "upsampling).")
    write(args.store, __file__, [stored], threads=1,
          config={"b": b, "h": h, "side": side, "d": d, "repeat": rep})


if __name__ == "__main__":
    main()
