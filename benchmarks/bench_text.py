"""1D encodings: mmpe against peer libraries, timed in the same run, reported as ratios.

    python benchmarks/bench_text.py [--quick] [--store results/bench]

Rows:
* RoPE apply (q and k, [b, h, s, d]): mmpe vs HF transformers (Llama) in float32 and bfloat16
  (both rotate bf16 in bf16), and interleaved vs rotary-embedding-torch.
* ALiBi bias + attention: mmpe (SDPA with the bias from its score_mod) vs x-transformers'
  AlibiPositionalBias + SDPA.
* T5 bias: mmpe vs HF transformers' T5Attention.compute_bias.
* Attention paths: mmpe flex (uncompiled on CPU, compiled on CUDA) vs SDPA, same encoding.
* RoPE precision: max score error at positions shifted by 10⁷ (float32 inputs), per library.
* RoPE rotation error per input dtype: max |rotated − float64 rotation| / (eps · max |x|), the
  error mmpe accepts by rotating bf16/fp16 in their own dtype (bounded in
  tests/encodings/test_rope_dtype.py), with HF's for comparison.

mmpe and the peer are timed alternately, round after round (``paired``), so load from other
jobs on the machine hits both alike; times are medians, the ratio is the median of the
per-round ratios peer time / mmpe time (> 1: mmpe faster). ``--store DIR`` also appends the
three tables (``peers``, ``rope_shift``, ``rope_dtype``) to ``DIR/bench_text.jsonl``
(``benchmarks/_store.py``).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import torch
from _store import Table, write
from _timing import paired

import mmpe
from mmpe import MultiHeadAttention, Sequence
from mmpe.attention import dense_bias
from mmpe.encodings.base import AttentionCall

warnings.filterwarnings("ignore")


def rope_rows(b: int, h: int, s: int, d: int, repeat: int) -> list[tuple]:
    from rotary_embedding_torch import RotaryEmbedding
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    coords = Sequence(s)
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=h * d, num_attention_heads=h,
                                          num_key_value_heads=h))
    pos = torch.arange(s).expand(b, s)
    ours = mmpe.build("rope", head_dim=d)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        q, k = torch.randn(b, h, s, d, dtype=dtype), torch.randn(b, h, s, d, dtype=dtype)

        def hf_apply(q=q, k=k):  # HF casts its float32 cos/sin to q's dtype and rotates in it
            cos, sin = hf(q, pos)
            return apply_rotary_pos_emb(q, k, cos, sin)

        name = "RoPE apply (half layout)" + ("" if dtype == torch.float32 else ", bfloat16")
        rows.append((name, "HF transformers",
                     *paired(lambda q=q, k=k: ours(q, k, coords), hf_apply, repeat)))

    q, k = torch.randn(b, h, s, d), torch.randn(b, h, s, d)
    ret = RotaryEmbedding(dim=d, cache_if_possible=False)
    ours_inter = mmpe.build("rope", head_dim=d, interleaved=True)
    rows.append(("RoPE apply (interleaved)", "rotary-embedding-torch",
                 *paired(lambda: ours_inter(q, k, coords),
                         lambda: (ret.rotate_queries_or_keys(q), ret.rotate_queries_or_keys(k)),
                         repeat)))
    return rows


def rotation_error_rows(b: int, h: int, s: int, d: int) -> list[tuple[str, float, float]]:
    """max |rotated q − float64 rotation of the same q| / (eps · max |q|), positions 0 … s−1.

    The reference rotates the input's own values (converted to float64) with float64 cos/sin,
    so the number is the rotation's error alone, in units of the dtype's eps.
    """
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from mmpe.encodings.rope import apply_rotary, rope_inv_freq

    coords = Sequence(s)
    phase = torch.arange(s, dtype=torch.float64)[:, None] * rope_inv_freq(d)
    cos64, sin64 = phase.cos(), phase.sin()
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=h * d, num_attention_heads=h,
                                          num_key_value_heads=h))
    pos = torch.arange(s).expand(b, s)
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(b, h, s, d, generator=torch.Generator().manual_seed(3)).to(dtype)
        ref = apply_rotary(q.double(), cos64, sin64)
        unit = torch.finfo(dtype).eps * float(q.abs().max())
        ours, _ = mmpe.build("rope", head_dim=d)(q, q, coords)
        cos, sin = hf(q, pos)
        theirs, _ = apply_rotary_pos_emb(q, q, cos, sin)
        rows.append((str(dtype).removeprefix("torch."),
                     float((ours.double() - ref).abs().max()) / unit,
                     float((theirs.double() - ref).abs().max()) / unit))
    return rows


def alibi_row(b: int, h: int, s: int, d: int, repeat: int) -> tuple[str, str, float, float]:
    from x_transformers.x_transformers import AlibiPositionalBias

    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    ours = MultiHeadAttention(h * d, h, [mmpe.build("alibi", num_heads=h)], route="sdpa")
    coords = Sequence(s, causal=True)
    ctx = AttentionCall(coords, h, d, b, None, q, k, v)
    peer = AlibiPositionalBias(heads=h, total_heads=h)
    causal = torch.ones(s, s, dtype=torch.bool).tril()

    def peer_attend():
        bias = peer(s, s).masked_fill(~causal, float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    return ("ALiBi bias + causal attention", "x-transformers",
            *paired(lambda: ours.attend(ctx), peer_attend, repeat))


def t5_row(h: int, s: int, repeat: int) -> tuple[str, str, float, float]:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    peer = T5Attention(T5Config(num_heads=h, d_model=64 * h, d_kv=64), has_relative_attention_bias=True)
    ours = mmpe.build("t5", num_heads=h)
    ctx = AttentionCall(Sequence(s), h, 64, 1)
    with torch.no_grad():
        return ("T5 relative bias (bidirectional)", "HF transformers",
                *paired(lambda: dense_bias([ours], ctx), lambda: peer.compute_bias(s, s), repeat))


def paths_row(b: int, h: int, s: int, d: int, repeat: int) -> tuple[str, str, float, float]:
    x = torch.randn(b, s, h * d)
    mha = MultiHeadAttention(h * d, h, [mmpe.build("alibi", num_heads=h)])
    coords = Sequence(s, causal=True)

    def run(route: str) -> Callable[[], object]:
        def f():
            mha.route = route
            with torch.no_grad():
                return mha(x, coords)
        return f

    return ("mmpe SDPA path (row) vs flex path (peer column)", "mmpe flex",
            *paired(run("sdpa"), run("flex"), max(1, repeat // 3)))


def precision_rows() -> list[tuple[str, float]]:
    """Score error between positions (m, n) and (m + 1e7, n + 1e7), float32 inputs."""
    from rotary_embedding_torch import RotaryEmbedding
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    d, delta = 64, 10**7
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
    norm = float(q.norm() * k.norm())

    def score_ours(m: int, n: int) -> float:
        rope = mmpe.build("rope", head_dim=d)
        rq, _ = rope(q, q, Sequence(position_ids=torch.tensor([m])))
        rk, _ = rope(k, k, Sequence(position_ids=torch.tensor([n])))
        return float((rq * rk).sum())

    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=d, num_attention_heads=1, num_key_value_heads=1))

    def score_hf(m: int, n: int) -> float:
        cq, sq = hf(q, torch.tensor([[m]]))
        ck, sk = hf(k, torch.tensor([[n]]))
        rq, _ = apply_rotary_pos_emb(q, q, cq, sq)
        _, rk = apply_rotary_pos_emb(k, k, ck, sk)
        return float((rq * rk).sum())

    ret = RotaryEmbedding(dim=d, cache_if_possible=False, interpolate_factor=1.0)

    def score_ret(m: int, n: int) -> float:
        fq = ret.forward(torch.tensor([float(m)]))
        fk = ret.forward(torch.tensor([float(n)]))
        from rotary_embedding_torch import apply_rotary_emb
        return float((apply_rotary_emb(fq, q) * apply_rotary_emb(fk, k)).sum())

    rows = []
    for name, f in (("mmpe", score_ours), ("HF transformers", score_hf), ("rotary-embedding-torch", score_ret)):
        err = abs(f(12 + delta, 5 + delta) - f(12, 5)) / norm
        rows.append((name, err))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--store", metavar="DIR",
                        help="also append the tables to DIR/bench_text.jsonl")
    args = parser.parse_args()
    torch.manual_seed(0)
    b, h, s, d, rep = (2, 4, 256, 32, 5) if args.quick else (4, 8, 1024, 64, 10)
    rows = [*rope_rows(b, h, s, d, rep), alibi_row(b, h, s, d, rep), t5_row(h, s, rep),
            paths_row(1, h, min(s, 512), d, rep)]
    errors = rotation_error_rows(b, h, s, d)
    device = "CUDA" if torch.cuda.is_available() else "CPU"
    threads = torch.get_num_threads()
    peers = Table("peers", f"1D encodings on {device}, b={b} h={h} s={s} d={d}",
                  ["operation", "peer", "mmpe ms", "peer ms", "peer / mmpe"],
                  [None, None, "{:.2f}", "{:.2f}", "{:.2f}"])
    print(f"## 1D encodings on {device}, "
          f"torch {torch.__version__}, {threads} threads, b={b} h={h} s={s} d={d}\n")
    print("| operation | peer | mmpe ms | peer ms | peer / mmpe |")
    print("|---|---|---|---|---|")
    for op, peer, t_ours, t_peer, ratio in rows:
        peers.add(op, peer, t_ours * 1e3, t_peer * 1e3, ratio)
        print(f"| {op} | {peer} | {t_ours * 1e3:.2f} | {t_peer * 1e3:.2f} | {ratio:.2f} |")
    shift = Table("rope_shift", "RoPE score error at positions shifted by 10⁷: "
                  "|score(m+1e7, n+1e7) − score(m, n)| / (|q||k|), float32 inputs",
                  ["library", "relative error"], [None, "{:.1e}"])
    print("\n## RoPE precision: |score(m+1e7, n+1e7) - score(m, n)| / (|q||k|), float32 inputs\n")
    print("| library | relative error |")
    print("|---|---|")
    for name, err in precision_rows():
        shift.add(name, err)
        print(f"| {name} | {err:.2e} |")
    dtypes = Table("rope_dtype", "RoPE rotation error per input dtype: max |out − float64 "
                   f"rotation| / (eps · max|q|), positions 0…{s - 1}",
                   ["input dtype", "mmpe", "HF transformers"], [None, "{:.2f}", "{:.2f}"])
    print("\n## RoPE rotation error per input dtype: max |out - float64 rotation| / (eps * max|q|),"
          f" positions 0..{s - 1}\n")
    print("mmpe rotates bf16/fp16 in their own dtype with cos/sin rounded once from float64 "
          "phases (tests/encodings/test_rope_dtype.py bounds it by 1.0); HF's float32 phases add "
          "phase error in float32.\n")
    print("| dtype | mmpe | HF transformers |")
    print("|---|---|---|")
    for dtype, ours, theirs in errors:
        dtypes.add(dtype, ours, theirs)
        print(f"| {dtype} | {ours:.2f} | {theirs:.2f} |")
    write(args.store, __file__, [peers, shift, dtypes], threads=threads,
          cuda=device == "CUDA", config={"b": b, "h": h, "s": s, "d": d, "repeat": rep})


if __name__ == "__main__":
    main()
