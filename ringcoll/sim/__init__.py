"""Algorithm study: result checks, lower bounds, pictures, fitted machines and sweeps on the
simulator's port-limited clock (:mod:`ringcoll.sim.clock`)."""
