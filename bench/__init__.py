"""ringcoll.bench: an nccl-tests-style benchmark of every ringcoll algorithm against the
torch.distributed built-in, side by side in one run (``ringcoll-bench``, :mod:`.cli`).

- :mod:`.specs`: the facts of each collective (bytes, bus factor, data, call, variants);
- :mod:`.harness`: the one timing loop, run on every rank, and the summary of its timings;
- :mod:`.report`: tables, JSON, CSV and plots.
"""
