"""What context parallelism refuses, by name and with the reason."""

from __future__ import annotations

from typing import Any

#: registered encodings that cannot run on a shard, with the reason (registry name -> why)
REFUSED: dict[str, str] = {
    "fox": "its forget gates are a running sum over every token from the key to the query, "
           "computed from each token's layer input x; a rank holds only its own tokens' x",
    "conv_pe": "its convolution reads the inputs of neighbouring tokens, which lie on other "
               "ranks at a shard's edges (it would need a halo exchange)",
}


class ContextParallelError(ValueError):
    """An encoding or a layer setting that context parallelism cannot run (names it and why)."""


def check_encodings(encodings: Any, coords: Any) -> None:
    """Refuse, by name and with the reason, encodings that cannot run on `coords`: those of
    `REFUSED`, and those whose needs a shard does not offer (per-token layout tables).

    Raises:
        ContextParallelError: naming the encoding and why.
    """
    for enc in encodings:
        name = getattr(enc, "registry_name", type(enc).__name__)
        if name in REFUSED:
            raise ContextParallelError(f"context parallel: {name} is refused: {REFUSED[name]}")
        try:
            enc.check_coords(coords)
        except (TypeError, ValueError) as err:
            raise ContextParallelError(f"context parallel: {name} cannot run on a shard: "
                                       f"{err}") from err
