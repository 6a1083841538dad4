"""The drop-ins' docstrings mirror c10d's: the entries every collective shares (``group``,
``async_op``, ``op``, ``group_src``/``group_dst``, ``algorithm`` and the plain ``Returns``
section, header included) are written once here. :func:`c10d_doc` puts them in place of a
docstring line such as ``{group, async_op, algorithm}`` (those entries, in that order);
``{algorithm}`` lists the collective's built-in algorithms as the registry has them, so it
cannot go stale."""
from __future__ import annotations

import re
import textwrap
from typing import Optional

from ..schedules import registry

#: entry -> its text (the parameter's c10d wording; ringcoll's additions after it)
ENTRIES = {
    "group": "group (ProcessGroup, optional): The process group to work on. If None, the "
             "default process group will be used.",
    "async_op": "async_op (bool, optional): Whether this op should be an async op.",
    "op": "op (optional): One of the values from ``torch.distributed.ReduceOp`` enum, or a "
          "``torch.distributed._make_nccl_premul_sum(factor)``. Specifies an operation used for "
          "element-wise reductions.",
    "group_src": "group_src (int): Source rank on ``group``. Must specify one of ``group_src`` and "
                 "``src`` but not both.",
    "group_dst": "group_dst (int): Destination rank on ``group``. Must specify one of ``group_dst`` and "
                 "``dst`` but not both.",
    "returns": "Async work handle, if async_op is set to True. None, if not async_op or if not "
               "part of the group.",
}

_PLACE = re.compile(r"^( *)\{(\w+(?:, \w+)*)\}$", re.MULTILINE)
WIDTH = 96


def algorithm_entry(collective: str) -> str:
    names = ", ".join(f"``{name}``" for name in registry.algorithms(collective))
    return (f"algorithm (str, keyword-only): ``\"auto\"`` (the selection table, or ``RINGCOLL_ALGO``) "
            f"or one of ``ringcoll.algorithms(\"{collective}\")``; built in: {names}.")


def c10d_doc(collective: Optional[str] = None):
    """Fill the shared entries of the decorated drop-in's docstring (``collective``: whose
    algorithms ``{algorithm}`` lists)."""
    def fill(match: "re.Match") -> str:
        indent = match.group(1)
        return "\n".join(entry(indent, name) for name in match.group(2).split(", "))

    def entry(indent: str, name: str) -> str:
        text = algorithm_entry(collective) if name == "algorithm" else ENTRIES[name]
        if name == "returns":           # the whole section: its header and its text
            body = indent + "    "
            return indent + "Returns:\n" + textwrap.fill(text, WIDTH, initial_indent=body, subsequent_indent=body,
                                                         break_on_hyphens=False, break_long_words=False)
        return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=indent + "    ",
                             break_on_hyphens=False, break_long_words=False)

    def decorate(fn):
        fn.__doc__ = _PLACE.sub(fill, fn.__doc__)
        return fn
    return decorate
