"""The runtime: what runs a plan on a real process group.

:mod:`~ringcoll.runtime.plan` (a call's schedule on its buffers), :mod:`~ringcoll.runtime.executor`
(runs a plan step by step), :mod:`~ringcoll.runtime.work` (the Work handle of an async call),
:mod:`~ringcoll.runtime.local` (a rank's own copies and reductions),
:mod:`~ringcoll.runtime.transport` (sends and receives) and :mod:`~ringcoll.runtime.nodes` (the
group's placement, agreed once per group by exchange)."""
