"""One-off studies, run from the checkout and not installed (``python -m experiments.x`` or
``python experiments/x.py``); each writes under bench/results/, where its committed result lives."""
