"""Campaigns run from the checkout, not installed: ``python -m tools.fuzz`` (the randomized
differential tester), ``tools.faults`` (a rank killed or stalled mid-collective), ``tools.long_run``
(thousands of calls on one group) and ``tools/gpu_check.py`` (the first script to run when a GPU is
lent). Each writes its result under bench/results/ by default."""
