"""The algorithms, one module per collective; each registers its schedules in
:mod:`ringcoll.registry` when imported."""
