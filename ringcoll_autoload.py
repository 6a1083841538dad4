"""Registers the ``"ringcoll"`` torch.distributed backend; run by torch itself.

pyproject.toml declares :func:`register` as a ``torch.backends`` entry point, which
``import torch`` calls, so a script that never imports ringcoll can still
``dist.init_process_group("ringcoll")``. It must stay cheap and must never break
``import torch``: it imports only torch.distributed and registers a creator that imports
ringcoll when the first ringcoll group is built. ``import ringcoll`` registers too.
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` switches every such entry point off.)

This is a top-level module, not part of the ``ringcoll`` package, because importing
anything inside the package first imports the whole package.
"""

NAME = "ringcoll"


def _create(opts, pg_options=None):
    from ringcoll.backend import create

    return create(opts, pg_options)


def register() -> None:
    """Register the backend name with torch.distributed once; never raises."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
            return
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    except Exception as error:  # noqa: BLE001 - import torch must survive anything here
        import warnings

        warnings.warn(f"ringcoll: could not register the 'ringcoll' torch.distributed backend: {error}",
                      RuntimeWarning, stacklevel=2)
