"""Fixtures, Hypothesis profiles and the tolerance-aware comparison of the test suite.

* ``device``: "cpu" always; "cuda" marked ``gpu`` and skipped without CUDA.
* ``backend``: "reference", "torch", "triton", each skipped where
  ``rtc.available_backends(device)`` does not list it (Triton on CPU needs
  ``TRITON_INTERPRET=1`` set before the import).
* Hypothesis profiles (``HYPOTHESIS_PROFILE=default|quick|thorough``): example counts are
  scaled down for ``backend="triton"`` by ``n_examples`` because every kernel launch costs
  ~0.1 s under the Triton CPU interpreter.
* ``assert_close(actual, expected, dtype)``: per-dtype, scale-aware tolerance; NaN (and inf)
  positions must match exactly; a readable report on mismatch.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

import rl_triton_core as rtc


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (skipped when torch.cuda.is_available() is False)"
    )


_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
settings.register_profile("default", max_examples=10, **_COMMON)
settings.register_profile("quick", max_examples=3, **_COMMON)
settings.register_profile("thorough", max_examples=60, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

BACKENDS = ("reference", "torch", "triton")
HAS_CUDA = torch.cuda.is_available()
TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreted(backend: str) -> bool:
    """Triton kernels running under the CPU interpreter (every launch is slow)."""
    return backend == "triton" and TRITON_INTERPRET


def n_examples(backend: str, weight: float = 1.0) -> int:
    """Examples for one Hypothesis test: the profile's count x weight, a quarter under the
    Triton interpreter."""
    n = settings.default.max_examples * weight
    if interpreted(backend):
        n = n / 4
    return max(2, round(n))


def max_T(backend: str, T: int) -> int:
    """Longest window a Hypothesis test draws: capped at 10 under the Triton interpreter, where
    a launch costs tens of milliseconds per time step."""
    return min(T, 10) if interpreted(backend) else T


def hyp_settings(backend: str, weight: float = 1.0) -> settings:
    """Settings for one Hypothesis test on ``backend``. Under the Triton interpreter a failing
    example is reported without shrinking (each shrink step re-runs interpreted kernels)."""
    kwargs = {"max_examples": n_examples(backend, weight)}
    if interpreted(backend):
        kwargs["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    return settings(**kwargs)


DEVICES = (
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")],
    ),
)


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=BACKENDS)
def backend(request, device) -> str:
    if request.param not in rtc.available_backends(device):
        pytest.skip(f"backend {request.param!r} is not available on {device}")
    return request.param


# ----------------------------------------------------------------------------------------------
# Tolerance-aware comparison
# ----------------------------------------------------------------------------------------------

# Relative to max(max |expected|, floor): the error budget of one rounding of the output in the
# dtype plus float32 accumulation (float64 inputs are computed in float64).
RTOL = {
    torch.float64: 1e-9,
    torch.float32: 1e-5,
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
}


def _fmt_index(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype | None = None,
    *,
    floor: float = 1.0,
    rtol: float | None = None,
    name: str = "output",
) -> None:
    """``|actual - expected| <= RTOL[dtype] * max(max|expected|, floor)`` elementwise.

    NaN positions must be identical, and so must infinities (same sign). ``floor`` keeps the
    tolerance from collapsing when every expected value is tiny while the inputs were O(1).
    """
    assert isinstance(actual, torch.Tensor), f"{name}: expected a tensor, got {type(actual)}"
    dtype = actual.dtype if dtype is None else dtype
    rtol = RTOL[dtype] if rtol is None else rtol
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if e.numel() == 0:
        return
    a_nan, e_nan = torch.isnan(a), torch.isnan(e)
    if not torch.equal(a_nan, e_nan):
        spurious = torch.nonzero(a_nan & ~e_nan)
        missing = torch.nonzero(e_nan & ~a_nan)
        lines = [f"{name}: NaN positions differ (shape {tuple(e.shape)})"]
        if len(spurious):
            lines.append(
                f"  {len(spurious)} unexpected NaN, e.g. at "
                + ", ".join(_fmt_index(i) for i in spurious[:8])
            )
        if len(missing):
            lines.append(
                f"  {len(missing)} NaN expected but finite, e.g. at "
                + ", ".join(f"{_fmt_index(i)} (got {a[tuple(i)].item():.6g})" for i in missing[:8])
            )
        raise AssertionError("\n".join(lines))
    inf_mismatch = (torch.isinf(a) | torch.isinf(e)) & (a != e) & ~e_nan
    if inf_mismatch.any():
        idx = torch.nonzero(inf_mismatch)[:8]
        raise AssertionError(
            f"{name}: infinities differ at "
            + ", ".join(
                f"{_fmt_index(i)} (got {a[tuple(i)].item()}, expected {e[tuple(i)].item()})"
                for i in idx
            )
        )
    finite = torch.isfinite(e) & torch.isfinite(a)
    if not finite.any():
        return
    scale = max(e[finite].abs().max().item(), floor)
    tol = rtol * scale
    err = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
    worst = err.max().item()
    if worst > tol:
        bad = torch.nonzero(err > tol)
        order = torch.argsort(err[tuple(bad.T)], descending=True)[:8]
        lines = [
            f"{name}: {len(bad)} of {e.numel()} elements exceed tol={tol:.3g} "
            f"(rtol {rtol:g} x scale {scale:.4g}, dtype {dtype}); max abs error {worst:.4g}",
            "  index: actual vs expected (abs error)",
        ]
        for j in order:
            i = tuple(bad[j].tolist())
            lines.append(
                f"  {_fmt_index(i)}: {a[i].item():.8g} vs {e[i].item():.8g} ({err[i].item():.3g})"
            )
        raise AssertionError("\n".join(lines))


def assert_all_written(t: torch.Tensor, name: str = "out") -> None:
    """After poisoning ``out=`` with NaN: no NaN is left (for inputs without NaN)."""
    n = int(torch.isnan(t).sum())
    assert n == 0, f"{name}: {n} of {t.numel()} elements still NaN (not written by the kernel)"
