"""The switch: ``enable()`` / ``disable()`` / ``enabled()`` and the hook they install.

The hook replaces six names in ``torchrl.objectives.value.advantages`` (the module whose
estimator classes call them; patching ``functional`` would change nothing) with the functions
of :mod:`rl_triton_torchrl._functional`. Every path to TorchRL's ``GAE``, ``TD1Estimator``,
``TDLambdaEstimator`` and ``VTrace`` (and their subclasses, e.g. ``MultiAgentGAE``) ends in
those names: direct construction, ``loss.make_value_estimator(...)`` and a loss's default
estimator. Everything else, value-network calls, ``shifted``, ``skip_existing``, ``set_keys``,
``average_gae``, ``steps_to_next_obs``, stays TorchRL's code.

The hook is installed while the switch is on or an explicit estimator (``TritonGAE``...) is
computing, and removed otherwise: ``disable()`` puts TorchRL's exact function objects back.
Installing is idempotent, and a name whose TorchRL signature differs from the one the
replacement was written for is left alone (with a warning).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import warnings
from collections.abc import Iterator

from torchrl.objectives.value import advantages as _advantages

from . import _state
from ._functional import REPLACEMENTS

logger = logging.getLogger("rl_triton_torchrl")

_lock = threading.RLock()
_scoped_calls = 0  # explicit-estimator calls in flight (they need the hook installed)


_known: dict[str, object] = {}  # name -> the TorchRL function whose signature was checked


def _compatible(name: str, original) -> bool:
    """Whether ``original`` has the signature its replacement was written for (checked once)."""
    if _known.get(name) is original:
        return True

    def params(fn, follow):
        sig = inspect.signature(fn, follow_wrapped=follow)
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    try:
        ok = params(original, True) == params(REPLACEMENTS[name], False)
    except (TypeError, ValueError):
        ok = False
    if ok:
        _known[name] = original
    elif name not in _known:
        _known[name] = None
        warnings.warn(
            f"rl_triton_torchrl: torchrl.objectives.value.advantages.{name} has a signature "
            "this adapter does not know (it was written for torchrl 0.14.1); TorchRL's own "
            "code keeps serving it",
            stacklevel=4,
        )
    return ok


def _install() -> list[str]:
    """Put the replacements in place; returns the names newly replaced."""
    replaced = []
    for name, replacement in REPLACEMENTS.items():
        current = getattr(_advantages, name, None)
        if current is replacement or current is None or not _compatible(name, current):
            continue
        _state.saved[name] = current
        replacement.__wrapped__ = current  # TorchRL's function stays reachable
        setattr(_advantages, name, replacement)
        replaced.append(name)
    return replaced


def _uninstall() -> list[str]:
    """Put TorchRL's functions back; returns the names restored."""
    restored = []
    for name, replacement in REPLACEMENTS.items():
        if getattr(_advantages, name, None) is replacement:
            setattr(_advantages, name, _state.saved[name])
            restored.append(name)
    return restored


def enable(backend: str = "auto") -> None:
    """Compute TorchRL's ``GAE``, ``TD1Estimator``, ``TDLambdaEstimator`` and ``VTrace`` with
    ``rl_triton_core``, everywhere in this process, until :func:`disable`.

    Args:
        backend: ``rl_triton_core``'s ``backend=``: ``"auto"`` (Triton for CUDA tensors, the
            torch path on the CPU), ``"triton"``, ``"torch"`` or ``"reference"``.

    Calling it again only changes the backend. Calls the core cannot serve exactly (e.g.
    gradients through the estimator) run TorchRL's own code, with a warning.
    """
    backend = _state.check_backend(backend)
    with _lock:
        _state.global_backend = backend
        replaced = _install()
    if replaced:
        logger.info("rl_triton_torchrl: %s now run rl_triton_core", ", ".join(replaced))


def disable() -> None:
    """Undo :func:`enable`: TorchRL's own functions again (the same objects). A no-op when off."""
    with _lock:
        _state.global_backend = None
        restored = _uninstall() if _scoped_calls == 0 else []
    if restored:
        logger.info("rl_triton_torchrl: TorchRL's own %s restored", ", ".join(restored))


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return _state.global_backend is not None


@contextlib.contextmanager
def enabled(backend: str = "auto") -> Iterator[None]:
    """``with rl_triton_torchrl.enabled(): ...``: :func:`enable` inside the block, then the
    previous state again (on with its backend, or off). A process-wide switch: blocks must
    nest (threads whose blocks overlap should use the per-call ``Triton*`` classes instead)."""
    previous = _state.global_backend
    enable(backend)
    try:
        yield
    finally:
        if previous is None:
            disable()
        else:
            enable(previous)


@contextlib.contextmanager
def scoped(backend: str) -> Iterator[None]:
    """Route the calls made inside the block (this thread/task only) to ``rl_triton_core``
    with ``backend``, whatever the global switch says. Used by the explicit estimators."""
    global _scoped_calls
    with _lock:
        _scoped_calls += 1
        _install()
    token = _state.scoped_backend.set(backend)
    try:
        yield
    finally:
        _state.scoped_backend.reset(token)
        with _lock:
            _scoped_calls -= 1
            if _scoped_calls == 0 and _state.global_backend is None:
                _uninstall()
