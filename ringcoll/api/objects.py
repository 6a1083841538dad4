"""The object collectives: picklable Python objects moved by ringcoll's own collectives.

Each object is pickled into a byte tensor; the ranks first exchange the sizes (one int64 per
object), then the bytes, padded to the largest where the collective needs equal sizes, and
unpickle. The semantics are torch 2.13's (``torch.distributed.all_gather_object`` ...): the
lists are filled in place, nothing is returned, a rank outside ``group`` returns at once with
its lists untouched, the root is ``src``/``dst`` (a global rank, default 0) or
``group_src``/``group_dst`` (a rank of ``group``), and the bytes travel on the group's object
device (CPU on gloo, the current CUDA device on NCCL) unless ``device`` says otherwise.

Where torch fails late (an ``IndexError`` from a too-short output list, after the
communication), ringcoll checks first: an :class:`ObjectListError`, which is a ``ValueError``
and an ``IndexError`` both, so code written against torch's error still catches it.

``send_object_list`` and ``recv_object_list`` are torch.distributed's own, re-exported (as
``send`` and ``recv`` are: point-to-point is torch's). Unpickling runs arbitrary code: only
exchange objects you trust, as with torch's.
"""
from __future__ import annotations

__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "recv_object_list",
           "scatter_object_list", "send_object_list"]

import pickle
from typing import Any, List, Tuple

import torch
import torch.distributed as dist
from torch.distributed import recv_object_list, send_object_list

from .all_gather import all_gather_single
from .broadcast import broadcast
from .gather_scatter import gather, scatter
from .common import Context, group_context
from ._checks import group_root


class ObjectListError(ValueError, IndexError):
    """An object list too short for the call (torch raises the ``IndexError`` only after the
    communication)."""


def _to_bytes(obj: Any, device) -> torch.Tensor:
    """``obj`` pickled, as a uint8 tensor on ``device``."""
    data = pickle.dumps(obj)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _from_bytes(tensor: torch.Tensor, size: int) -> Any:
    return pickle.loads(tensor[:size].cpu().numpy().tobytes())


def _object_device(group, device=None) -> torch.device:
    """``device``, else torch's choice for ``group``'s object collectives (CPU on gloo, the
    current CUDA device on NCCL)."""
    if device is not None:
        return torch.device(device)
    kind = dist.distributed_c10d._get_object_coll_device(group)
    if kind == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(kind)


def _check_list(param: str, objects, needed: int) -> None:
    if not isinstance(objects, list):
        raise TypeError(f"{param} must be a list, got {type(objects).__name__}")
    if len(objects) < needed:
        raise ObjectListError(f"{param} must hold at least {needed} entries (one per rank of the group), "
                              f"got {len(objects)}")


def _padded(tensors: List[torch.Tensor], size: int, device) -> torch.Tensor:
    """The tensors back to back, each padded to ``size`` bytes."""
    out = torch.zeros(len(tensors) * size, dtype=torch.uint8, device=device)
    for index, tensor in enumerate(tensors):
        out[index * size:index * size + tensor.numel()] = tensor
    return out


def _sizes_everywhere(ctx: Context, data: torch.Tensor, group, device) -> Tuple[List[int], int]:
    """Every rank's byte count (an all-gather of one int64 each) and the largest."""
    sizes = torch.zeros(ctx.world, dtype=torch.int64, device=device)
    all_gather_single(sizes, torch.tensor([data.numel()], dtype=torch.int64, device=device), group=group)
    sizes = sizes.tolist()
    return sizes, max(sizes)


def all_gather_object(object_list, obj, group=None):
    """Gathers picklable objects from the whole group into a list.

    Similar to :func:`all_gather`, but Python objects can be passed in. After the call
    ``object_list[r]`` is (an unpickled copy of) rank r's ``obj`` on every rank of the group.

    Args:
        object_list (list[Any]): Output list. It should be correctly sized as the size of
            the group for this collective and will contain the output.
        obj (Any): Picklable Python object to be broadcast from current process.
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used. Default is ``None``.

    Returns:
        None. If the calling rank is part of this group, the output of the collective will
        be populated into the input ``object_list``. If the calling rank is not part of the
        group, the passed in ``object_list`` will be unmodified.

    Examples:
        >>> # Assumes world_size of 3.
        >>> gather_objects = ["foo", 12, {1: 2}]  # any picklable object
        >>> output = [None for _ in gather_objects]
        >>> ringcoll.all_gather_object(output, gather_objects[rank])
        >>> output
        ['foo', 12, {1: 2}]  # Rank 0, 1 and 2
    """
    ctx = group_context(group)
    if ctx.rank is None:
        return None
    _check_list("object_list", object_list, ctx.world)
    device = _object_device(group)
    data = _to_bytes(obj, device)
    sizes, largest = _sizes_everywhere(ctx, data, group, device)
    gathered = torch.empty(ctx.world * largest, dtype=torch.uint8, device=device)
    all_gather_single(gathered, _padded([data], largest, device), group=group)
    for rank, size in enumerate(sizes):
        object_list[rank] = _from_bytes(gathered[rank * largest:], size)
    return None


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Gathers picklable objects from the whole group in a single process.

    Similar to :func:`gather`, but Python objects can be passed in. On the destination,
    ``object_gather_list[r]`` ends as (an unpickled copy of) rank r's ``obj``.

    Args:
        obj (Any): Input object. Must be picklable.
        object_gather_list (list[Any]): Output list. On the ``dst`` rank, it should be
            correctly sized as the size of the group for this collective and will contain the
            output. Must be ``None`` on non-dst ranks. (default is ``None``)
        dst (int, optional): Destination rank on global process group (regardless of
            ``group`` argument). (If both ``dst`` and ``group_dst`` are None, default is
            global rank 0)
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used. Default is ``None``.
        group_dst (int, optional): Destination rank on ``group``. Invalid to specify both
            ``dst`` and ``group_dst``.

    Returns:
        None. On the ``dst`` rank, ``object_gather_list`` will contain the output of the
        collective.

    Examples:
        >>> # Assumes world_size of 3.
        >>> gather_objects = ["foo", 12, {1: 2}]  # any picklable object
        >>> output = [None for _ in gather_objects]
        >>> ringcoll.gather_object(gather_objects[rank], output if rank == 0 else None, dst=0)
        >>> output
        ['foo', 12, {1: 2}]  # Rank 0
    """
    ctx = group_context(group)
    root = group_root(ctx, "dst", dst, "group_dst", group_dst, default=0)
    if ctx.rank is None:
        return None
    if ctx.rank == root:
        if not object_gather_list:       # torch: "must be specified on destination rank"
            raise ValueError(f"object_gather_list must be given on the destination rank (group rank "
                             f"{root}), got {object_gather_list!r}")
        _check_list("object_gather_list", object_gather_list, ctx.world)
    elif object_gather_list:
        raise ValueError(f"object_gather_list must NOT be given on ranks other than the destination "
                         f"(group rank {root}), got a list of {len(object_gather_list)} on group rank {ctx.rank}")
    device = _object_device(group)
    data = _to_bytes(obj, device)
    # every rank learns every size: the gather needs equal-sized (the largest) blocks
    sizes, largest = _sizes_everywhere(ctx, data, group, device)
    gathered = torch.empty(ctx.world * largest, dtype=torch.uint8, device=device) if ctx.rank == root else None
    blocks = list(gathered.split(largest)) if gathered is not None and largest else None
    gather(_padded([data], largest, device), blocks, group=group, group_dst=root)
    if ctx.rank == root:
        for rank, size in enumerate(sizes):
            object_gather_list[rank] = _from_bytes(gathered[rank * largest:], size)
    return None


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Broadcasts picklable objects in ``object_list`` to the whole group.

    Similar to :func:`broadcast`, but Python objects can be passed in. After the call every
    rank's ``object_list`` holds (unpickled copies of) the source's objects; the source's list
    is left as it is.

    Args:
        object_list (List[Any]): List of input objects to broadcast. Each object must be
            picklable. Only objects on the ``src`` rank will be broadcast, but each rank must
            provide lists of equal sizes.
        src (int): Source rank from which to broadcast ``object_list``. Source rank is based
            on global process group (regardless of ``group`` argument). (If both ``src`` and
            ``group_src`` are None, default is global rank 0)
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used. Default is ``None``.
        device (``torch.device``, optional): If not None, the objects are serialized and
            converted to tensors which are moved to the ``device`` before broadcasting.
            Default is ``None``.
        group_src (int): Source rank on ``group``. Must not specify one of ``group_src`` and
            ``src`` but not both.

    Returns:
        ``None``. If rank is part of the group, ``object_list`` will contain the broadcasted
        objects from ``src`` rank.

    Examples:
        >>> # Assumes world_size of 3.
        >>> objects = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
        >>> ringcoll.broadcast_object_list(objects, src=0)
        >>> objects
        ['foo', 12, {1: 2}]  # Rank 0, 1 and 2
    """
    ctx = group_context(group)
    root = group_root(ctx, "src", src, "group_src", group_src, default=0)
    if ctx.rank is None:
        return None
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list, got {type(object_list).__name__}")
    if not object_list:
        if ctx.rank == root:      # torch's source fails so too (unpacking no objects)
            raise ValueError("object_list must not be empty on the source rank")
        return None               # nothing to receive (torch's 0-byte broadcasts do nothing)
    device = _object_device(group, device)
    if ctx.rank == root:
        pieces = [_to_bytes(obj, device) for obj in object_list]
        sizes = torch.tensor([piece.numel() for piece in pieces], dtype=torch.int64, device=device)
    else:
        sizes = torch.empty(len(object_list), dtype=torch.int64, device=device)
    broadcast(sizes, group=group, group_src=root)
    if ctx.rank == root:
        data = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    else:
        data = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
    broadcast(data, group=group, group_src=root)
    if ctx.rank != root:
        offset = 0
        for index, size in enumerate(sizes.tolist()):
            object_list[index] = _from_bytes(data[offset:], size)
            offset += size
    return None


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None, group=None,
                        group_src=None):
    """Scatters picklable objects in ``scatter_object_input_list`` to the whole group.

    Similar to :func:`scatter`, but Python objects can be passed in. On each rank, the
    scattered object (an unpickled copy of the source's ``scatter_object_input_list[rank]``)
    will be stored as the first element of ``scatter_object_output_list``.

    Args:
        scatter_object_output_list (List[Any]): Non-empty list whose first element will
            store the object scattered to this rank.
        scatter_object_input_list (List[Any], optional): List of input objects to scatter,
            one per rank of the group. Each object must be picklable. Only objects on the
            ``src`` rank will be scattered, and the argument can be ``None`` for non-src ranks.
        src (int): Source rank from which to scatter ``scatter_object_input_list``. Source
            rank is based on global process group (regardless of ``group`` argument). (If
            both ``src`` and ``group_src`` are None, default is global rank 0)
        group (ProcessGroup, optional): The process group to work on. If None, the default
            process group will be used. Default is ``None``.
        group_src (int, optional): Source rank on ``group``. Invalid to specify both ``src``
            and ``group_src``.

    Returns:
        ``None``. If rank is part of the group, ``scatter_object_output_list`` will have its
        first element set to the scattered object for this rank.

    Examples:
        >>> # Assumes world_size of 3.
        >>> objects = ["foo", 12, {1: 2}] if rank == 0 else [None, None, None]
        >>> output_list = [None]
        >>> ringcoll.scatter_object_list(output_list, objects, src=0)
        >>> output_list
        ['foo']     # Rank 0
        [12]        # Rank 1
        [{1: 2}]    # Rank 2
    """
    ctx = group_context(group)
    root = group_root(ctx, "src", src, "group_src", group_src, default=0)
    if ctx.rank is None:
        return None
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_output_list must be a list of size at least 1, got "
                         f"{scatter_object_output_list!r}")
    device = _object_device(group)
    if ctx.rank == root:
        if scatter_object_input_list is None:
            raise ValueError("scatter_object_input_list must be given (not None) on the source rank "
                             f"(group rank {root})")
        if not isinstance(scatter_object_input_list, list) or len(scatter_object_input_list) != ctx.world:
            raise ValueError(f"scatter_object_input_list must be a list of one object per rank of the group "
                             f"({ctx.world}), got {scatter_object_input_list!r:.80}")
        pieces = [_to_bytes(obj, device) for obj in scatter_object_input_list]
        sizes = torch.tensor([piece.numel() for piece in pieces], dtype=torch.int64, device=device)
    else:
        sizes = torch.empty(ctx.world, dtype=torch.int64, device=device)
    # every rank learns every size: its own (to unpickle) and the largest (the scatter's blocks)
    broadcast(sizes, group=group, group_src=root)
    largest = int(sizes.max())
    blocks = list(_padded(pieces, largest, device).split(largest)) if ctx.rank == root else None
    mine = torch.empty(largest, dtype=torch.uint8, device=device)
    scatter(mine, blocks, group=group, group_src=root)
    scatter_object_output_list[0] = _from_bytes(mine, int(sizes[ctx.rank]))
    return None
