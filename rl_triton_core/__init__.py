"""rl_triton_core: RL credit assignment as one associative scan.

GAE, TD(λ) returns, discounted returns, V-trace, Retrace(λ), eligibility traces and episodic
running sums are all the first-order linear recurrence ``x_t = a_t x_{t±1} + b_t``; this
package solves them with fused Triton kernels on CUDA, a vectorised PyTorch path elsewhere,
and a float64 reference loop. The contract is documented in docs/semantics.md.
"""

from ._dispatch import BACKENDS, available_backends
from .estimators import (
    TRACES,
    discounted_returns,
    eligibility_traces,
    episodic_cumsum,
    gae,
    lambda_returns,
    linear_scan,
    retrace,
    vtrace,
)

__all__ = [
    "BACKENDS",
    "TRACES",
    "available_backends",
    "discounted_returns",
    "eligibility_traces",
    "episodic_cumsum",
    "gae",
    "lambda_returns",
    "linear_scan",
    "retrace",
    "vtrace",
]
__version__ = "0.1.0"
