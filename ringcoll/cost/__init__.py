"""The cost model: what a message, a step and a reduction cost on a machine.

:mod:`ringcoll.cost.machine` (:class:`~ringcoll.cost.machine.Machine`: α-β-γ links, ports per
rank, nodes with NICs) and :mod:`ringcoll.cost.network` (hosts, switches and directed links, with
routes). Everything that prices a schedule reads them: the simulator's clock (:mod:`ringcoll.sim`),
``auto``'s model (:mod:`ringcoll.selection`), the settings and the drop-ins' machine, MSCCL's
check. They import nothing of ringcoll, so they sit at the bottom of the layers
(tests/test_layers.py)."""
