"""The module paths of ringcoll before its layout split (0.1.0), kept as deprecated aliases.

``import ringcoll.executor`` (or ``from ringcoll.schedule import Step``, ...) still works: it
warns with a DeprecationWarning naming the new path and returns the very module object at the
new path, so patches and ``isinstance`` checks see one module. Only imports through these old
names go through here; nothing inside ringcoll uses them."""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module path -> new module path; a package's children follow it.
MOVED = {
    "ringcoll.schedule": "ringcoll.schedules.vocabulary",
    "ringcoll.registry": "ringcoll.schedules.registry",
    "ringcoll.plan": "ringcoll.runtime.plan",
    "ringcoll.executor": "ringcoll.runtime.executor",
    "ringcoll.work": "ringcoll.runtime.work",
    "ringcoll.local": "ringcoll.runtime.local",
    "ringcoll.transport": "ringcoll.runtime.transport",
    "ringcoll.topology": "ringcoll.runtime.nodes",
    "ringcoll.collectives": "ringcoll.api",
    "ringcoll.hooks": "ringcoll.backend.hooks",
    "ringcoll.simulator": "ringcoll.sim.engine",
    "ringcoll.machine": "ringcoll.sim.machine",
    "ringcoll.study": "ringcoll.sim",
}


def new_path(name: str):
    """The current path of the old module ``name``, or None if it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        target_name = new_path(fullname)
        if target_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self):
        self._real_specs = {}

    def create_module(self, spec):
        target_name = new_path(spec.name)
        warnings.warn(f"{spec.name} moved to {target_name}; the old path will be removed in a later "
                      f"release", DeprecationWarning, stacklevel=3)
        module = importlib.import_module(target_name)
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the module at the new path is already executed; the import system has just set its
        # __spec__ to the alias's: give it back its own (its name, for pickling and reloads)
        module.__spec__ = self._real_specs.pop(module.__spec__.name)


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())     # before PathFinder, which would load a second copy
