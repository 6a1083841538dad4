"""The drop-in collectives, one module each. Every module lists its public functions in
``__all__`` and registers its plan builder (for the simulator) with ``@builder``."""
import importlib
import pkgutil

from .common import BUILDERS as BUILDERS  # the builders by torch name, for the simulator and tests

__all__ = []
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    _mod = importlib.import_module(f"{__name__}.{_module}")
    for _name in getattr(_mod, "__all__", ()):
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)

from . import _calls  # noqa: E402,F401 - gives auto's model its pricer (plans are built here)
