"""The algorithms, one module per collective; each registers its schedules in
:mod:`ringcoll.schedules.registry` when imported."""
