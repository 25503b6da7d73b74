"""Backend discovery: the only module that talks to stevedore.

``load_backend(name=None)`` picks, in order: an explicit name, the ``SPEC_BACKEND`` environment
variable, the single available accelerator backend (a device other than the CPU), else ``cpu`` where its
native kernels build and run here, else ``reference`` (pure torch, always available). Errors are raised, never
swallowed: an unknown name lists the installed backends, a plugin that fails to import is named with
its cause, two plugins registered under one name are rejected, and a plugin whose class overrides a
contract method with other parameters than ``Backend``'s is rejected when it loads (``check_contract``).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from stevedore import ExtensionManager, NamedExtensionManager

from spec_backend.backends.base import Backend, BackendError

NAMESPACE = "spec_backend.backends"
ENV_VAR = "SPEC_BACKEND"
REFERENCE = "reference"
#: the fast CPU backend, preferred to the reference where it is available
CPU = "cpu"


@dataclass(frozen=True)
class BackendInfo:
    """An installed backend and whether it can run here."""

    name: str
    device_type: str
    available: bool
    reason: str
    backend: Backend


def _check_unique_names() -> None:
    names = [ep.name for ep in entry_points(group=NAMESPACE)]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BackendError(
            f"two or more installed plugins register the backend name(s) {dupes} in entry-point group "
            f"{NAMESPACE!r}; uninstall one of them"
        )


def _raise_load_failure(
    manager: ExtensionManager[Backend], entrypoint: EntryPoint, exc: BaseException
) -> None:
    raise BackendError(
        f"backend plugin {entrypoint.name!r} ({entrypoint.value}) failed to load: {type(exc).__name__}: {exc}"
    ) from exc


def _manager(names: list[str] | None = None) -> ExtensionManager[Backend]:
    _check_unique_names()
    # stevedore memoises entry points per namespace for the process; drop that so a plugin installed
    # (or removed) after the first scan is seen, and so it agrees with importlib.metadata above.
    ExtensionManager.ENTRY_POINT_CACHE.pop(NAMESPACE, None)
    if names is None:
        return ExtensionManager(NAMESPACE, invoke_on_load=True, on_load_failure_callback=_raise_load_failure)

    return NamedExtensionManager(
        NAMESPACE,
        names=names,
        invoke_on_load=True,
        on_load_failure_callback=_raise_load_failure,
        name_order=True,
    )


def installed_backend_names() -> list[str]:
    """Names registered under the entry-point group, without importing any plugin."""
    return sorted({ep.name for ep in entry_points(group=NAMESPACE)})


def list_backends() -> list[BackendInfo]:
    """Every installed backend (each plugin imported and probed), sorted by name."""
    infos = []
    for ext in _manager():
        backend = _instance(ext.obj, ext.name)
        status = backend.probe()
        infos.append(BackendInfo(ext.name, backend.device_type, status.available, status.reason, backend))
    return sorted(infos, key=lambda i: i.name)


def _load_named(name: str) -> Backend:
    installed = installed_backend_names()
    if name not in installed:
        raise BackendError(f"unknown backend {name!r}; installed backends: {', '.join(installed) or 'none'}")
    extensions = list(_manager([name]))
    if not extensions:
        raise BackendError(f"backend plugin {name!r} is registered but stevedore could not load it")
    return _instance(extensions[0].obj, name)


def _instance(obj: object, name: str) -> Backend:
    if not isinstance(obj, Backend):
        raise BackendError(
            f"backend plugin {name!r} must provide a spec_backend.backends.base.Backend subclass, "
            f"got {type(obj).__name__}"
        )
    check_contract(type(obj), name)
    return obj


#: The public methods of the Backend contract: an override must keep their parameters.
CONTRACT_METHODS: tuple[str, ...] = tuple(
    name for name, member in vars(Backend).items() if callable(member) and not name.startswith("_")
)


def _bare(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` without annotations (what is compared and shown)."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]
    return signature.replace(parameters=params, return_annotation=inspect.Signature.empty)


def check_contract(cls: type[Backend], plugin: str) -> None:
    """Raise ``BackendError`` when ``cls`` overrides a ``CONTRACT_METHODS`` method with parameters (names,
    kinds, defaults) other than ``Backend``'s: callers use the base's signature on every backend."""
    for method in CONTRACT_METHODS:
        override = getattr(cls, method, None)
        base = getattr(Backend, method)
        if override is base:
            continue
        expected = _bare(inspect.signature(base))
        try:
            received = _bare(inspect.signature(override))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            received = None
        if received != expected:
            shown = f"{method}{received}" if received is not None else f"{method} = {override!r}"
            raise BackendError(
                f"backend plugin {plugin!r} ({cls.__module__}.{cls.__qualname__}) overrides {shown}, "
                f"but the Backend contract is {method}{expected}; every backend takes exactly the base's "
                "parameters (put device options on the backend instance, e.g. constructor arguments)"
            )


def load_backend(name: str | None = None) -> Backend:
    """Return the backend to use (see module docstring for the order of preference)."""
    chosen = name or os.environ.get(ENV_VAR) or None
    if chosen is not None:
        return _load_named(chosen)
    infos = list_backends()
    hardware = [i for i in infos if i.available and i.device_type != "cpu"]
    if len(hardware) == 1:
        return hardware[0].backend
    if len(hardware) > 1:
        names = ", ".join(i.name for i in hardware)
        raise BackendError(
            f"several hardware backends are available ({names}); choose one with backend=... or {ENV_VAR}"
        )
    cpu = [i for i in infos if i.name == CPU and i.available]
    return cpu[0].backend if cpu else _load_named(REFERENCE)
