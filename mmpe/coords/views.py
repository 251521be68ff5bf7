"""View classes: coordinates seen through a wrapper that changes a few members.

A local attention window ([`LocalWindow`][mmpe.attention.masks.LocalWindow]) and a rank's
shard of a sequence ([`ShardedCoords`][mmpe.parallel.coords.ShardedCoords]) each wrap
coordinates of some class and change a few of its members. Encodings check what coordinates
offer by their class (`mmpe.coords.capabilities.defines`), so the wrapper of `Sequence` must be
a class that defines what `Sequence` defines: [`view_class`][mmpe.coords.views.view_class] makes
it once per (wrapper, coordinate class), in one cache for every kind of view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mmpe.coords.base import Coordinates

#: view classes by (mixin, coordinate class); a plain dict, which Dynamo reads while tracing
_VIEWS: dict[tuple[type, type], type] = {}


def view_class(mixin: type, cls: type,
               members: Callable[[type], dict[str, Any]] | None = None,
               inherit: bool = True) -> type:
    """The class of `mixin`'s views of coordinates of class `cls`, made once.

    The class of `mixin`'s views of coordinates of class `cls` (named `mixin.view_prefix` +
    the class name, e.g. `LocalSequence`), made once.

    Args:
        mixin: the wrapper's own class (its members come first).
        cls: the wrapped coordinates' class.
        members: extra members of the view class made from `cls` (e.g. forwarding exactly the
            pairwise members `cls` defines), or None.
        inherit: the view subclasses `cls` too (every member of `cls` runs on the view), or
            only `mixin` (the view offers `members` and nothing else of `cls`).

    Under `torch.compile` a class made before tracing (an eager call,
    [`prepare_views`][mmpe.coords.views.prepare_views]) traces without a graph break.
    """
    view = _VIEWS.get((mixin, cls))
    return view if view is not None else _make(mixin, cls, members, inherit)


def prepare_views(mixin: type, members: Callable[[type], dict[str, Any]] | None = None,
                  inherit: bool = True) -> None:
    """Make `mixin`'s view class of every coordinate class defined so far.

    Make `mixin`'s view class of every coordinate class defined so far (outside any
    compiled graph, so compiled forwards find them ready)."""
    stack = list(Coordinates.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if (mixin, cls) not in _VIEWS and not issubclass(cls, mixin):
            _make(mixin, cls, members, inherit)


# torch._disable_dynamo: `torch.compiler.disable` at import time would import torch._dynamo
# (about 2 s, most of `import mmpe`); this form imports it on the first call.
@torch._disable_dynamo
def _make(mixin: type, cls: type, members: Callable[[type], dict[str, Any]] | None,
          inherit: bool) -> type:
    if issubclass(cls, mixin):
        return cls
    body = {"__module__": mixin.__module__, "__doc__": mixin.__doc__,
            **(members(cls) if members is not None else {})}
    bases = (mixin, cls) if inherit else (mixin,)
    name = f"{getattr(mixin, 'view_prefix', mixin.__name__)}{cls.__name__}"
    view = _VIEWS[(mixin, cls)] = type(name, bases, body)
    return view
