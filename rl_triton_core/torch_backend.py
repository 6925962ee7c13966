"""Vectorised PyTorch backend (any device; the default on the CPU).

Every estimator is the first-order linear recurrence ``x_t = a_t x_{t∓1} + b_t`` with its own
coefficients. Each estimator below supplies two small closures and hands them to the one scan
engine, :func:`scan`:

* ``coefficients(rows, guard)`` builds fresh ``(a, b)`` for a range of time steps from the
  canonical inputs with a handful of whole-tensor ops, the flags turned into float 0/1 masks;
* ``finish(rows, x, carry)`` writes the outputs of those steps from the scan result ``x``
  (e.g. ``returns = A + v``).

How the engine runs, and why (measured on a 2-core CPU against Stable-Baselines3's numpy loop,
``benchmarks/harness.py --device cpu``: a torch op costs 4-8 µs there however small its tensors,
and DRAM streams about 8 GB/s):

* **Chunks that fit in cache.** On the CPU the time axis is cut into chunks of about
  ``CHUNK_ELEMENTS`` elements, visited in scan order with the state carried from one chunk to
  the next. A chunk's coefficients, scan and outputs are computed while its temporaries are
  still in L2, so each input is read from DRAM about once and each output written once;
  whole-array temporaries at [2048, 4096] would be streamed through DRAM by every op.
* **Four ways to scan a chunk** of ``n`` steps of ``m`` sequences, with the same result:

  - *dense* (``n * n * m`` small, CPU): one transfer-matrix product
    ``x_t = b_t + Σ_{s>t} (Π_{k=t}^{s-1} a_k) b_s`` whose matrix comes from a single
    ``cumprod``: about ten ops whatever ``n``, where tiny problems pay per op;
  - *blocked* (long chunks of few sequences): the steps are cut into blocks of ``K``; one
    sweep over the ``K`` positions scans all blocks at once, the blocks' composite maps
    ``(Π a, local result)`` are scanned recursively (by this same dispatch), and a second
    sweep applies the carries: about ``2K + n / K`` ops instead of ``n``;
  - *sequential* (what the others leave: wide chunks on a GPU, rows of more than 16384
    sequences, guarded re-runs): one fused ``addcmul`` per step over a row of the batch, which
    moves the fewest bytes;
  - *numpy* (CPU, when numpy is installed: short chunks of 64 or more sequences, and long
    chunks too wide for the blocked scan): the same loop through numpy views of the tensors,
    where a step's two numpy ops cost less than one torch op (e.g. [16, 64]: 10 µs less than
    the dense scan, [16, 4096]: 41 µs less than the sequential one).

* **Short GAE calls skip the engine** (:func:`_gae_small`: at most ``SMALL_GAE_MAX_STEPS``
  steps and ``SMALL_GAE_MAX_ELEMENTS`` elements, float32/float64 outputs, Python-float
  ``gamma``/``lmbda``). Through the engine a [16, 64] GAE pays about 15 torch ops of 3-5 µs
  besides its scan, which left T = 16 level with SB3's loop (0.88-1.24x its full-call time).
  In numpy the same call is about 8 whole-array ops of 1-3 µs and one scan: by recursive
  doubling (``ceil(log2 T)`` passes of 3 ops) where rows are contiguous (time-major) and at
  most ``SMALL_GAE_DOUBLING_MAX_WIDTH`` wide, else the row loop of the *numpy* scan (doubling
  on [16, 1]: 25 µs against 63; from 1024 sequences on, or on batch-major rows, the loop is
  faster). Measured full calls: 0.40-0.96x the engine's time at T <= 23 in time-major,
  batch-major and TorchRL layouts; 0.60-0.76x SB3's loop at T = 16, N = 1 to 4096, in three
  harness runs. At 2^17 elements ([16, 8192] with next values and truncation) it drew level
  with the engine (its temporaries leave L2), hence the limit of 2^16. It computes unguarded,
  like the engine's first pass (numpy's floating-point warnings off), and leaves a non-finite
  result to the engine, which redoes the call.
* **Guards.** A zero coefficient is a hard cut (``x_t = b_t`` even where the carry is NaN or
  infinite), and a term the formulas switch off (e.g. the next value at a terminated step)
  must pass no NaN on. Exact zeros need ``torch.where``, which costs ops per step in the scan
  and is slow on the CPU (about 2 ns an element, against 0.4 for a multiplication by a float
  mask), so on the CPU each chunk is first computed *unguarded* (masks multiplied in, one
  fused ``addcmul`` a step) and redone *guarded* only when its result has a non-finite value:
  the two agree wherever everything is finite, and whatever an unguarded op gets wrong
  (``0 · NaN``, ``0 · inf``) is a NaN, which every later op keeps and the check sees. On
  other devices the check would cost a host sync, so everything runs guarded there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from ._dispatch import accumulates_in_float64

try:  # optional: the small-problem scan below uses it when it is there
    import numpy
except ImportError:  # pragma: no cover (the test stack installs numpy)
    numpy = None

# Tuned on a 2-core CPU (512 KB of L2 a core) against Stable-Baselines3's loop.
CHUNK_ELEMENTS = 1 << 18  # CPU: a time chunk of about this many elements (1 MB in fp32, in L3)
DENSE_MAX_ELEMENTS = 1 << 14  # CPU: transfer matrix when n * n * m is at most this
BLOCKED_MIN_STEPS = 24  # blocked scan for chunks of at least this many steps ...
BLOCKED_MAX_WIDTH = 256  # ... of at most this many sequences (CPU; any width elsewhere)
NUMPY_MIN_WIDTH = 64  # CPU: chunks of at least this many sequences scan through numpy ...
NUMPY_MAX_ELEMENTS = 1 << 14  # ... when they are short and hold at most this many elements,
NUMPY_MAX_WIDTH = 1 << 14  # or long with rows too wide for the blocked scan, up to this wide
# (two numpy ops a step beat one torch op to about there: 123 vs 150 µs for 16 steps of 16384
# sequences, 843 vs 685 µs of 65536; [2048, 4096] GAE 1.14x -> 1.54x of SB3's loop)
SMALL_ELEMENTS = 4096  # below this a torch op costs its fixed µs whatever it does
SMALL_GAE_MAX_STEPS = 23  # CPU: GAE of at most this many steps ...
SMALL_GAE_MAX_ELEMENTS = 1 << 16  # ... and elements runs in numpy (_gae_small),
SMALL_GAE_DOUBLING_MAX_WIDTH = 512  # scanned by recursive doubling up to this many sequences

Coefficients = Callable[[slice, bool], tuple[Tensor, Tensor]]
Finish = Callable[[slice, Tensor, "Tensor | None"], None]


def compute_dtype(out: Tensor, factors: tuple = (), others: tuple = ()) -> torch.dtype:
    """float32 arithmetic for 16/32-bit outputs, float64 for float64 and for float32 calls with
    long horizons (``_dispatch.accumulates_in_float64``; ``factors``: those of the factor of
    ``a_t`` that repeats step after step, ``others``: the call's other coefficients); ``out``:
    a time-first output."""
    acc64 = accumulates_in_float64(out.dtype, out.shape[0], factors, others)
    return torch.float64 if acc64 else torch.float32


# -- the scan engine ---------------------------------------------------------------------------


def _apply(a: Tensor, x: Tensor, b: Tensor, guard: bool, out: Tensor | None = None) -> Tensor:
    """a * x + b in one fused op; guarded, ``a == 0`` gives exactly ``b``."""
    if not guard:
        return torch.addcmul(b, a, x, out=out)
    return torch.where(a == 0, b, torch.addcmul(b, a, x), out=out)


def _scan_sequential(a: Tensor, b: Tensor, carry: Tensor | None, reverse: bool, guard: bool):
    """One ``addcmul`` per step, in place in ``b``: fewest bytes, one op per step."""
    a_rows, b_rows = a.unbind(0), b.unbind(0)  # one call instead of an indexing op per step
    for t in range(len(b_rows) - 1, -1, -1) if reverse else range(len(b_rows)):
        if carry is not None:
            _apply(a_rows[t], carry, b_rows[t], guard, out=b_rows[t])
        carry = b_rows[t]
    return b


def _scan_numpy(a: Tensor, b: Tensor, carry: Tensor | None, reverse: bool):
    """Unguarded sequential scan through numpy views of the CPU tensors (no copies), in place
    in ``b``: two numpy ops a step cost less than one torch op on a small row."""
    _scan_rows(a.numpy(), b.numpy(), None if carry is None else carry.numpy(), reverse)
    return b


def _scan_rows(a, b, carry, reverse: bool) -> None:
    """The unguarded sequential scan of numpy arrays, in place in ``b`` (two ops a step)."""
    a_rows, b_rows = list(a), list(b)  # row views, made once
    if reverse:
        a_rows.reverse()
        b_rows.reverse()
    prev = carry
    tmp = numpy.empty_like(b_rows[0])
    for a_t, b_t in zip(a_rows, b_rows, strict=True):
        if prev is not None:
            numpy.multiply(a_t, prev, out=tmp)
            numpy.add(b_t, tmp, out=b_t)
        prev = b_t


def _scan_doubling(a, x) -> None:
    """Unguarded reverse scan of numpy arrays by recursive doubling, in place in ``x`` (``a``
    is overwritten): the pass for k adds ``(a_t ... a_{t+k-1}) x_{t+k}`` to every ``x_t`` at
    once, so ``ceil(log2 n)`` passes of 2-3 whole-array ops replace 2 ops a step. Each op
    touches up to ``n`` rows, so this pays on narrow problems laid out time-major (a row one
    contiguous run); batch-major views would make numpy's inner loops ``n`` elements short."""
    n, k = len(x), 1
    while k < n:
        x[:-k] += a[:-k] * x[k:]
        if 2 * k < n:
            a[:-k] *= a[k:]
        k *= 2


def _block_product(A: Tensor, guard: bool) -> Tensor:
    """Π a over each block (dim 1); guarded, exactly 0 for a block holding a cut."""
    p = A.prod(1)
    return torch.where((A == 0).any(1), 0.0, p) if guard else p


def _scan_blocked(a: Tensor, b: Tensor, carry: Tensor | None, reverse: bool, guard: bool):
    """Blocks of K steps: sweep all blocks at once, scan their composite maps, sweep again.

    The ``n mod K`` steps the scan visits first run sequentially, so nothing is padded.
    """
    n = b.shape[0]
    K = max(2, min(32, round(math.sqrt(n / 2))))
    nb = n // K
    r = n - nb * K
    head, body = (slice(nb * K, n), slice(0, nb * K)) if reverse else (slice(0, r), slice(r, n))
    if r:
        carry = _scan_sequential(a[head], b[head], carry, reverse, guard)[0 if reverse else -1]
    A, B = a[body].unflatten(0, (nb, K)), b[body].unflatten(0, (nb, K))
    a_cols, b_cols = A.unbind(1), B.unbind(1)
    order = range(K - 1, -1, -1) if reverse else range(K)
    entry = order[0]
    # 1. each block's result at its exit step when entered with state 0 (B stays intact)
    local = b_cols[entry]
    for k in order[1:]:
        local = _apply(a_cols[k], local, b_cols[k], guard)
    # 2. the state after each block: a scan of the blocks' composite maps (Π a, local)
    after = _scan_chunk(_block_product(A, guard), local, carry, reverse, guard, b.is_cpu)
    # 3. the final sweep, in place, entering each block with the state after the one before
    if reverse:
        _apply(A[:-1, entry], after[1:], B[:-1, entry], guard, out=B[:-1, entry])
        first = -1  # the block the scan enters first gets `carry`
    else:
        _apply(A[1:, entry], after[:-1], B[1:, entry], guard, out=B[1:, entry])
        first = 0
    if carry is not None:
        _apply(A[first, entry], carry, B[first, entry], guard, out=B[first, entry])
    prev = b_cols[entry]
    for k in order[1:]:
        prev = _apply(a_cols[k], prev, b_cols[k], guard, out=b_cols[k])
    return b


def _scan_dense(a: Tensor, b: Tensor, carry: Tensor | None, reverse: bool, n: int, m: int):
    """Unguarded transfer-matrix scan, in place in ``b``.

    Reverse order: ``x_t = b_t + Σ_j C[t, j] b_{t+j+1}`` with ``C[t, j] = Π_{k=t}^{t+j} a_k``
    (``b_n`` is the carry; both zero further on), ``C`` from one cumprod over a skewed
    (``as_strided``) view of zero-padded ``a``. A forward scan runs on flipped copies.
    """
    x, a = (b, a) if reverse else (b.flip(0), a.flip(0))
    flat = b.dim() == 2  # [n, m] already: skip the reshapes (each op costs µs here)
    skew = ((n, n, m), (m, m, 1))  # [t, j] -> row t + j of a padded [2n - 1, m] buffer
    a = a if flat else a.reshape(n, m)
    C = torch.constant_pad_nd(a, (0, 0, 0, n - 1)).as_strided(*skew).cumprod(1)
    after = x if flat else x.reshape(n, m)  # row t + 1 holds b_{t+1}: the view starts at row 1
    if carry is not None:
        after = torch.cat((after, carry.reshape(1, m)))
    after = torch.constant_pad_nd(after, (0, 0, 0, 2 * n - after.shape[0]))
    y = torch.linalg.vecdot(C, after.as_strided(*skew, m), dim=1)
    x += y if flat else y.view(x.shape)
    return b if reverse else b.copy_(x.flip(0))


def _scan_chunk(a: Tensor, b: Tensor, carry: Tensor | None, reverse: bool, guard: bool, cpu: bool):
    """Scan ``n`` steps in place in ``b`` (``[n, *batch]``, ours) entering with ``carry``."""
    shape = b.shape
    n = shape[0]
    width = b.numel() // n if n else 0
    if a.shape != shape:
        a = a.expand(shape)
    if (
        cpu
        and not guard
        and numpy is not None
        and NUMPY_MIN_WIDTH <= width
        and (
            n * width <= NUMPY_MAX_ELEMENTS
            if n < BLOCKED_MIN_STEPS
            else BLOCKED_MAX_WIDTH < width <= NUMPY_MAX_WIDTH
        )
    ):
        return _scan_numpy(a, b, carry, reverse)
    if cpu and not guard and n > 1 and n * n * width <= DENSE_MAX_ELEMENTS:
        return _scan_dense(a, b, carry, reverse, n, width)
    if n >= BLOCKED_MIN_STEPS and (width <= BLOCKED_MAX_WIDTH or not cpu):
        return _scan_blocked(a, b, carry, reverse, guard)
    return _scan_sequential(a, b, carry, reverse, guard)


def _finite(x: Tensor) -> bool:
    """Whether every element is finite: one sum (a NaN/inf makes the sum non-finite; an
    overflowing sum of finite values only costs a needless guarded re-run)."""
    return math.isfinite(x.sum())


def scan(
    coefficients: Coefficients,
    finish: Finish,
    like: Tensor,
    *,
    reverse: bool = False,
    initial: Tensor | None = None,
) -> None:
    """x_t = a_t x_{t-1} + b_t (``reverse``: x_t = a_t x_{t+1} + b_t) along dim 0 of ``like``
    (an output: its shape and device).

    Visits the steps in chunks, in scan order. For each chunk ``rows`` (a slice of steps;
    :data:`ALL` when one chunk holds every step, the common case: the per-step tensors are
    then used as they are, without an indexing op), ``coefficients(rows, guard)`` returns
    fresh ``(a, b)``: ``b`` a ``[n, *batch]`` tensor of the compute dtype that the engine
    overwrites with the result (it may be a view of an output), ``a`` broadcastable to it
    (e.g. a 0-dim tensor). With ``guard`` every term the formulas switch off must be an exact
    0 (:func:`_keep`); it is called that way when the unguarded result has a non-finite value.
    Then ``finish(rows, x, carry)`` gets the chunk's result ``x`` (read only: it carries on)
    and the state it was entered with (None for the first chunk when there is no
    ``initial``). ``initial``: ``[*batch]``.
    """
    # Tensor attribute reads and ops cost µs each on the CPU, the Python around them far less:
    # the one-chunk path reads the shape and device once and indexes nothing.
    shape = like.shape
    T = shape[0]
    cpu = like.is_cpu
    guard = not cpu
    step = max(1, CHUNK_ELEMENTS // max(shape.numel() // T, 1)) if cpu else T
    if step >= T:
        chunks = (ALL,)
    else:
        starts = range(0, T, step)
        chunks = [slice(lo, min(lo + step, T)) for lo in (reversed(starts) if reverse else starts)]
    carry = initial
    for i, rows in enumerate(chunks):
        x = _scan_chunk(*coefficients(rows, guard), carry, reverse, guard, cpu)
        if not guard and not _finite(x):
            x = _scan_chunk(*coefficients(rows, True), carry, reverse, True, cpu)
        finish(rows, x, carry)
        if i + 1 < len(chunks):  # (the last chunk's carry is never selected: an op)
            carry = x[0] if reverse else x[-1]


# -- coefficient helpers -----------------------------------------------------------------------
# Per-step inputs are canonical ``[T, *batch]`` views; coefficient tensors (gamma, lmbda, the
# thresholds) are broadcast views of that shape or Python floats; flags have any dtype and
# become float 0/1 "keep" masks (multiplying by one is 7x cheaper on the CPU than a where or a
# bool mask).


ALL = slice(None)  # the steps of a problem scanned in one chunk: every step


def _rows(x, rows: slice):
    """Steps ``rows`` of a per-step tensor (no op for ALL); floats and None pass."""
    if rows is ALL or not isinstance(x, Tensor):
        return x
    return x[rows]


def _bounds(rows: slice, T: int) -> tuple[int, int]:
    """``(first, stop)`` of the steps ``rows`` of ``T``."""
    return (0, T) if rows is ALL else (rows.start, rows.stop)


def _next_rows(x: Tensor, rows: slice, last: Tensor | None = None) -> Tensor:
    """``x[t + 1]`` for the steps ``rows``; ``last`` (default 0) stands for ``x[T]``."""
    if rows is not ALL and rows.stop < x.shape[0]:
        return x[rows.start + 1 : rows.stop + 1]
    lo = 0 if rows is ALL else rows.start
    if last is None:
        return torch.constant_pad_nd(x[lo + 1 :], (0, 0) * (x.dim() - 1) + (0, 1))
    return torch.cat((x[lo + 1 :], last[None]))


def _previous_rows(x: Tensor, rows: slice) -> Tensor:
    """``x[t - 1]`` for the steps ``rows``; 0 stands for ``x[-1]``."""
    lo, hi = _bounds(rows, x.shape[0])
    if lo > 0:
        return x[lo - 1 : hi - 1]
    return torch.constant_pad_nd(x[: hi - 1], (0, 0) * (x.dim() - 1) + (1, 0))


def _to(x, dtype: torch.dtype):
    """A tensor in the compute dtype (no op when it already is); floats and None pass."""
    return x if not isinstance(x, Tensor) or x.dtype == dtype else x.to(dtype)


@functools.lru_cache(maxsize=512)
def _scalar(value: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A cached 0-dim tensor: ops with it skip wrapping a Python scalar (µs each), and a
    product with a mask has the compute dtype. Never written to."""
    with torch.inference_mode(False):
        return torch.tensor(value, dtype=dtype, device=device)


def _coef(x, rows: slice, dtype: torch.dtype, device: torch.device) -> Tensor:
    """gamma / lmbda / a threshold for the steps ``rows``, as a tensor of the compute dtype."""
    return _scalar(x, dtype, device) if isinstance(x, float) else _to(_rows(x, rows), dtype)


def _product(x, y, rows: slice, dtype: torch.dtype, device: torch.device) -> Tensor:
    """x * y for two coefficients (Python floats multiply in Python)."""
    if isinstance(x, float) and isinstance(y, float):
        return _scalar(x * y, dtype, device)
    return _coef(x, rows, dtype, device) * _coef(y, rows, dtype, device)


_NO_LOGICAL_NOT = (torch.uint16, torch.uint32, torch.uint64)  # (torch has no CPU kernel)


def _keep_mask(flag: Tensor | None, rows: slice, dtype: torch.dtype) -> Tensor | None:
    """``1 - flag_t`` for the steps ``rows`` as a float 0/1 mask (non-zero flags are true);
    None for no flags. One ``logical_not`` written straight into the compute dtype."""
    if flag is None:
        return None
    flag = _rows(flag, rows)
    out = torch.empty_like(flag, dtype=dtype)  # (torch.empty(shape) costs twice as much)
    if flag.numel() <= SMALL_ELEMENTS and flag.dtype not in _NO_LOGICAL_NOT:  # no Python 0 to
        return torch.logical_not(flag, out=out)  # wrap: 3x cheaper on tiny tensors
    if flag.dtype == torch.bool:  # logical_not and bool compares are not vectorised:
        flag = flag.view(torch.uint8)  # comparing bytes is 3x faster on big tensors
    return torch.eq(flag, 0, out=out)


def _both(x: Tensor | None, y: Tensor | None) -> Tensor | None:
    """The product of two keep masks (None: all ones)."""
    return y if x is None else (x if y is None else x * y)


def _continues(live, truncated, rows: slice, like: Tensor, dtype, *, edge: bool):
    """``c_t = 1 - done_t`` for the steps ``rows`` as a keep mask of the compute ``dtype``
    (None: all ones), from ``live = 1 - terminated``. ``edge``: also ``c_{T-1} = 0`` (the window
    edge; ``like`` is a ``[T, *batch]`` tensor). A reverse scan without ``initial`` never reads
    ``a_{T-1}``, so a mask used only in ``a`` can skip the edge.
    """
    c = _both(live, _keep_mask(truncated, rows, dtype))
    if not edge:
        return c
    T = like.shape[0]
    lo, hi = _bounds(rows, T)
    if hi == T:
        if c is None:  # [n, 1, ...]: broadcasts
            shape = (hi - lo,) + (1,) * (like.dim() - 1)
            c = torch.ones(shape, dtype=dtype, device=like.device)
        elif c is live:
            c = c.clone()  # `live` is used on its own
        c[-1] = 0
    return c


def _keep(mask: Tensor | None, x: Tensor, guard: bool) -> Tensor:
    """x where the keep mask is 1, else 0. Guarded an exact ``torch.where`` (no NaN passes);
    unguarded one multiplication (``0 · NaN`` stays NaN and sends the chunk to the guarded
    re-run)."""
    if mask is None:
        return x
    if guard:
        return torch.where(mask != 0, x, _scalar(0.0, x.dtype, x.device))
    return x * mask


def _add_kept(b: Tensor, coef, mask: Tensor | None, x: Tensor, guard: bool) -> Tensor:
    """b += keep(mask, coef * x) in place (``coef``: a Python float or a tensor of b's rows;
    guarded, a NaN coefficient at a masked step adds nothing either); unguarded with a float
    coefficient one fused ``addcmul``."""
    if isinstance(coef, float):
        if mask is not None and not guard:
            return b.addcmul_(x, mask, value=coef)
        return b.add_(_keep(mask, x, guard), alpha=coef)
    if guard and mask is not None:
        return b.add_(_keep(mask, _to(coef, b.dtype) * x, guard))
    return b.addcmul_(_to(coef, b.dtype), _keep(mask, x, guard))


def _min(w: Tensor, bound) -> Tensor:
    """min(w, bound) (``bound``: a Python float or a tensor of w's rows)."""
    if isinstance(bound, float):
        return torch.clamp_max(w, bound)
    return torch.minimum(w, _to(bound, w.dtype))


def _next_state_values(values, next_values, bootstrap_value, rows: slice, dtype) -> Tensor:
    """nv_t for the steps ``rows``: next_values[t], else values[t+1] (bootstrap_value at T-1)."""
    if next_values is not None:
        return _to(_rows(next_values, rows), dtype)
    return _to(_next_rows(values, rows, bootstrap_value), dtype)


def _td_error(rewards, values, nv, live, gamma, rows, dtype, guard, out=None) -> Tensor:
    """``r_t + γ_t (1 - terminated_t) nv_t - v_t`` for the steps ``rows`` (a new tensor, or
    ``out``); ``live``: the rows' keep mask of terminated."""
    b = torch.sub(_to(_rows(rewards, rows), dtype), _to(_rows(values, rows), dtype), out=out)
    return _add_kept(b, _rows(gamma, rows), live, nv, guard)


def _scratch(out: Tensor, rows: slice, dtype: torch.dtype) -> Tensor | None:
    """The output's rows when they can hold the scan (compute dtype), else None (allocate)."""
    return _rows(out, rows) if out.dtype == dtype else None


def _fresh_copy(x: Tensor, out: Tensor, rows: slice, dtype: torch.dtype) -> Tensor:
    """The steps ``rows`` of ``x`` copied into the output's rows (or a new tensor)."""
    target = _scratch(out, rows, dtype)
    return _rows(x, rows).to(dtype, copy=True) if target is None else target.copy_(_rows(x, rows))


def _copy_out(out: Tensor) -> Finish:
    """The ``finish`` of estimators whose output is the scan result itself."""

    def finish(rows: slice, x: Tensor, carry: Tensor | None) -> None:
        target = _rows(out, rows)
        if target.data_ptr() != x.data_ptr():
            target.copy_(x)

    return finish


# -- the estimators (canonical arguments: see rl_triton_core._dispatch) -------------------------


def _entry(fn):
    """A backend entry point, run in inference mode: no autograd bookkeeping, about 1 µs less
    per op on the CPU (a tenth of a small call). The outputs are the caller's own tensors,
    written in place, so they stay ordinary tensors; the backend never supported autograd."""

    @functools.wraps(fn)
    def entry(*args):
        # (the C guard that torch.inference_mode() enters: the wrapper adds ~3 µs a call)
        with torch._C._InferenceMode(True):
            return fn(*args)

    return entry


@_entry
def linear_scan(a, b, initial, reverse, out):
    dtype = compute_dtype(out)

    def coefficients(rows, guard):
        return _to(_rows(a, rows), dtype), _fresh_copy(b, out, rows, dtype)

    scan(coefficients, _copy_out(out), out, reverse=reverse, initial=_to(initial, dtype))


def _numpy_views(*tensors):
    """numpy views of CPU tensors (no copies; None stays None), or None when one has none
    (bfloat16, float8, a negative-bit view ...)."""
    try:
        return [None if x is None else x.numpy() for x in tensors]
    except (TypeError, RuntimeError):
        return None


def _numpy_not(flag):
    """Where a flag array is false (zero), as a bool array: ``logical_not`` for bool flags, a
    comparison with 0 for the others (4x faster than ``logical_not`` on float32 flags)."""
    return numpy.logical_not(flag) if flag.dtype == numpy.bool_ else numpy.equal(flag, 0)


def _gae_small(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out
) -> bool:
    """GAE of a short CPU problem in numpy, computed unguarded like the engine's first pass;
    False (nothing is kept: the engine runs instead) where it does not apply or the
    advantages come out non-finite.

    The coefficients and TD errors take about 8 whole-array numpy ops (1-3 µs each on small
    arrays, where the engine's torch ops cost 3-5 µs), the scan :func:`_scan_doubling`
    (narrow time-major rows) or :func:`_scan_rows`. Both scans add every later step into the
    first row of the advantages, and ``a · NaN`` is NaN even for ``a = 0``, so a non-finite
    value anywhere leaves that row non-finite: checking it is enough. Applies to
    float32/float64 outputs and Python-float ``gamma``/``lmbda``.
    """
    adv_out, ret_out = out
    if (
        numpy is None
        or adv_out.shape[0] > SMALL_GAE_MAX_STEPS
        or adv_out.numel() > SMALL_GAE_MAX_ELEMENTS
        or not adv_out.is_cpu
        or adv_out.dtype not in (torch.float32, torch.float64)
        or gamma.__class__ is not float
        or lmbda.__class__ is not float
        # (long horizons accumulate in float64: the engine; never at the default step limit)
        or (adv_out.shape[0] > 128 and compute_dtype(adv_out, (gamma, lmbda)) != adv_out.dtype)
    ):
        return False
    views = _numpy_views(
        rewards, values, terminated, truncated, next_values, bootstrap_value, adv_out, ret_out
    )
    if views is None:
        return False
    r, v, term, trunc, nv, boot, adv, ret = views
    if adv.ndim == 1:  # one sequence: its rows must be arrays, not numpy scalars
        r, v, term, trunc, nv, adv, ret = (
            None if x is None else x[:, None] for x in (r, v, term, trunc, nv, adv, ret)
        )
    shape, dtype = adv.shape, adv.dtype
    with numpy.errstate(all="ignore"):  # non-finite values are checked below, not warned of
        if term is None:
            live = numpy.ones(shape, dtype)
        else:
            live = _numpy_not(term).astype(dtype)  # 1 - terminated
        a = numpy.multiply(live, gamma * lmbda)  # γ λ c_t (a_{T-1} is never read)
        if trunc is not None:
            a *= _numpy_not(trunc)
        if nv is None:  # nv_t = values[t+1], bootstrap_value at T-1
            numpy.multiply(live[:-1], v[1:], out=live[:-1])
            numpy.multiply(live[-1], boot, out=live[-1])
        else:
            live *= nv
        live *= gamma
        numpy.subtract(r, v, out=adv, dtype=dtype)
        adv += live  # δ = r - v + γ (1 - terminated) nv
        row = adv[0]
        if row.size <= SMALL_GAE_DOUBLING_MAX_WIDTH and row.flags.c_contiguous:
            _scan_doubling(a, adv)
        else:
            _scan_rows(a, adv, None, reverse=True)
        # x·x of the first row: non-finite with a NaN or inf (or, needlessly, |x| > 1e19 in
        # float32); one BLAS call, cheaper than a numpy sum
        if not math.isfinite(numpy.vdot(adv[0], adv[0])):
            return False
        numpy.add(adv, v, out=ret)
    return True


@_entry
def gae(rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out):
    if _gae_small(
        rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out
    ):
        return
    adv_out, ret_out = out
    dtype, device = compute_dtype(adv_out, (gamma, lmbda)), adv_out.device
    copy_advantages = _copy_out(adv_out)

    def coefficients(rows, guard):
        live = _keep_mask(terminated, rows, dtype)
        nv = _next_state_values(values, next_values, bootstrap_value, rows, dtype)
        scratch = _scratch(adv_out, rows, dtype)  # the advantages' rows hold δ and the scan
        delta = _td_error(rewards, values, nv, live, gamma, rows, dtype, guard, scratch)
        c = _continues(live, truncated, rows, adv_out, dtype, edge=False)
        return _keep(c, _product(gamma, lmbda, rows, dtype, device), guard), delta

    def finish(rows, advantages, carry):
        copy_advantages(rows, advantages, carry)
        torch.add(advantages, _to(_rows(values, rows), dtype), out=_rows(ret_out, rows))

    scan(coefficients, finish, adv_out, reverse=True)


@_entry
def lambda_returns(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out
):
    dtype, device = compute_dtype(out, (gamma, lmbda)), out.device

    def coefficients(rows, guard):
        live = _keep_mask(terminated, rows, dtype)
        c = _continues(live, truncated, rows, out, dtype, edge=True)
        trace = _keep(c, _coef(lmbda, rows, dtype, device), guard)  # λ_t c_t
        nv = _next_state_values(values, next_values, bootstrap_value, rows, dtype)
        # b = r + γ (1 - terminated) (1 - λ c) nv;  a = γ λ c (c_t = 1 implies not terminated)
        weight = 1 - trace  # of nv_t; exactly 0 where λ_t = 1 and the trace goes on
        bootstrap = weight * nv
        if guard:  # a NaN nv_t with weight 0 is unused
            bootstrap = torch.where(weight == 0, _scalar(0.0, dtype, device), bootstrap)
        b = _fresh_copy(rewards, out, rows, dtype)
        _add_kept(b, _rows(gamma, rows), live, bootstrap, guard)
        a = trace * _coef(gamma, rows, dtype, device)  # γ λ c
        return (_keep(c, a, guard) if guard else a), b  # (guarded: a NaN γ at a cut unread)

    scan(coefficients, _copy_out(out), out, reverse=True)


@_entry
def discounted_returns(rewards, terminated, truncated, next_values, bootstrap_value, gamma, out):
    dtype, device = compute_dtype(out, (gamma,)), out.device
    T = out.shape[0]

    def coefficients(rows, guard):
        live = _keep_mask(terminated, rows, dtype)
        c = _continues(live, truncated, rows, out, dtype, edge=True)
        b = _fresh_copy(rewards, out, rows, dtype)
        if next_values is not None:  # bootstrap wherever the trace is cut and not terminated
            if c is not None:
                cut = 1 - c if live is None else live - c  # (1 - c) (1 - terminated)
                nv = _to(_rows(next_values, rows), dtype)
                _add_kept(b, _rows(gamma, rows), cut, nv, guard)
        elif bootstrap_value is not None and _bounds(rows, T)[1] == T:
            # elsewhere a cut means terminated, which gets no bootstrap: only t = T-1
            g = gamma if isinstance(gamma, float) else gamma[-1]
            live_last = None if live is None else live[-1]
            _add_kept(b[-1], g, live_last, _to(bootstrap_value, dtype), guard)
        return _keep(c, _coef(gamma, rows, dtype, device), guard), b

    scan(coefficients, _copy_out(out), out, reverse=True)


@_entry
def vtrace(
    rewards,
    values,
    target_log_probs,
    behavior_log_probs,
    terminated,
    truncated,
    next_values,
    bootstrap_value,
    gamma,
    lmbda,
    rho_bar,
    c_bar,
    pg_rho_bar,
    out,
):
    vs_out, pg_out = out
    dtype = compute_dtype(vs_out, (gamma, lmbda), (rho_bar, c_bar, pg_rho_bar))
    device = vs_out.device
    chunk = {}  # what coefficients() computed for the chunk, reused by finish()

    def coefficients(rows, guard):
        tlp = _to(_rows(target_log_probs, rows), dtype)
        w = torch.exp(tlp - _to(_rows(behavior_log_probs, rows), dtype))
        live = _keep_mask(terminated, rows, dtype)
        c = _continues(live, truncated, rows, vs_out, dtype, edge=True)
        nv = _next_state_values(values, next_values, bootstrap_value, rows, dtype)
        delta = _td_error(rewards, values, nv, live, gamma, rows, dtype, guard)
        delta *= _min(w, _rows(rho_bar, rows))
        kappa = _min(w, _rows(c_bar, rows)) * _product(gamma, lmbda, rows, dtype, device)
        chunk.update(w=w, live=live, c=c, nv=nv)
        return _keep(c, kappa, guard), delta

    def finish(rows, x, carry):
        vs = x + _to(_rows(values, rows), dtype)
        _rows(vs_out, rows).copy_(vs)
        # u_t = vs_{t+1} where c_t = 1, else nv_t (c_{T-1} = 0: the last row's filler is unread)
        after = chunk.get("vs_first", vs[-1])  # vs of the step after the chunk
        vs_next = torch.cat((vs[1:], after[None]))
        chunk["vs_first"] = vs[0]
        c = chunk["c"]  # (None: no step of the chunk is cut)
        u = vs_next if c is None else torch.where(c != 0, vs_next, chunk["nv"])
        pg = _td_error(rewards, values, u, chunk["live"], gamma, rows, dtype, guard=True)
        torch.mul(pg, _min(chunk["w"], _rows(pg_rho_bar, rows)), out=_rows(pg_out, rows))

    scan(coefficients, finish, vs_out, reverse=True)


def trace_coefficient(trace: str, lmbda, w: Tensor, target_log_probs: Tensor, c_bar) -> Tensor:
    """kappa_t of Retrace(lambda) and its relatives (Munos et al. 2016, Table 1)."""
    if trace == "retrace":
        return lmbda * _min(w, c_bar)
    if trace == "tree_backup":
        return lmbda * torch.exp(target_log_probs)
    if trace == "q_lambda":
        return lmbda * torch.ones_like(w)
    return lmbda * w  # importance_sampling


@_entry
def retrace(
    rewards,
    q_values,
    next_expected_q,
    target_log_probs,
    behavior_log_probs,
    terminated,
    truncated,
    gamma,
    lmbda,
    c_bar,
    trace,
    out,
):
    dtype, device = compute_dtype(out, (gamma, lmbda), (c_bar,)), out.device

    def after(x, rows):  # x_{t+1} in the compute dtype (0 past the end, where c_t = 0)
        return x if isinstance(x, float) else _to(_next_rows(x, rows), dtype)

    def coefficients(rows, guard):
        tlp = after(target_log_probs, rows)
        w = torch.exp(tlp - after(behavior_log_probs, rows))
        kappa = trace_coefficient(trace, after(lmbda, rows), w, tlp, after(c_bar, rows))
        live = _keep_mask(terminated, rows, dtype)
        c = _continues(live, truncated, rows, out, dtype, edge=True)
        a = _keep(c, kappa * _coef(gamma, rows, dtype, device), guard)  # γ_t c_t κ_{t+1}
        # b = r + γ (1 - terminated) E - a q_{t+1}
        b = _fresh_copy(rewards, out, rows, dtype)
        expected = _to(_rows(next_expected_q, rows), dtype)
        _add_kept(b, _rows(gamma, rows), live, expected, guard)
        a_q = a * after(q_values, rows)  # a = 0 (a cut, or a zero trace) drops q_{t+1}
        b -= torch.where(a != 0, a_q, _scalar(0.0, dtype, device)) if guard else a_q
        return a, b

    scan(coefficients, _copy_out(out), out, reverse=True)


@_entry
def eligibility_traces(x, done, gamma, lmbda, initial, out):
    dtype, device = compute_dtype(out, (gamma, lmbda)), out.device

    def coefficients(rows, guard):
        b = _fresh_copy(x, out, rows, dtype)
        ended = None if done is None else _previous_rows(done, rows)  # done_{t-1}
        carries = _keep_mask(ended, ALL, dtype)
        return _keep(carries, _product(gamma, lmbda, rows, dtype, device), guard), b

    scan(coefficients, _copy_out(out), out, initial=_to(initial, dtype))
