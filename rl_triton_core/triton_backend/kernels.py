"""Triton kernels: one generic fused scan kernel, specialised per estimator at compile time.

A program owns ``BLOCK_N`` sequences and one chunk of the time axis (or ``SEGS`` chunks of
``BLOCK_N / SEGS`` sequences, side by side in its tiles). It walks the chunk in tiles of
``BLOCK_T`` steps (against the scan direction's order), builds each tile's coefficients
``(a_t, b_t)`` in registers from the raw inputs (:func:`_coefficients`), scans the tile with
``tl.associative_scan`` and :func:`_combine` (backward one-column tiles by groups of rows a
thread holds: :func:`_tile_states`), applies the carried state, writes the estimator's outputs
and carries the state to the next tile. Nothing but the outputs is written.
With ``PREFETCH`` a tile's coefficients (its loads) are built before the previous tile is
scanned and written, so that its loads are in flight meanwhile: the compiler keeps loads
after the stores before them, as they might alias.
With ``STAGES`` > 1 Triton software-pipelines the tile loop instead: each tile's loads are
issued asynchronously into shared memory ``STAGES - 1`` iterations ahead.

When there are too few sequences to fill the GPU, the time axis is split into chunks run by
different programs, or side by side in one program (``SEGS``): a chunked two-level scan. A
first launch (``WRITE_TOTALS``) reduces each chunk to its composite map ``x_in -> x_out``; the
second (``READ_TOTALS``) folds the composites of the chunks it depends on into its carry-in,
then runs as above. With many chunks the carry-in is two-level (``GROUP`` > 1): a launch
between the two (``GROUP_PASS``, :func:`_group_prefixes`) scans each group of chunk totals into
in-group prefixes and the group's total, so that the last launch folds a few group totals and
one prefix instead of every earlier chunk's total. Where the whole split scan fits on the GPU at
once, one cooperative launch (``RESIDENT``) does it all: each program holds its chunk as one
tile in registers, publishes the tile's composite, waits at a grid barrier
(:func:`_grid_barrier`) for every program's, folds those before its own into its carry-in and
writes its outputs: one pass over memory.

Layout: element ``(t, n)`` of a per-step tensor is at ``t * stride_t + n * stride_n`` (the
batch axes collapsed by the launcher); offsets are computed in int64. 16-bit and integer
inputs are converted in registers; arithmetic is ``ACC`` (float32, or float64).
"""

import triton
import triton.language as tl

from .._dispatch import triton_interpreted

# Estimator ids (the KIND constexpr).
SCAN = tl.constexpr(0)
GAE = tl.constexpr(1)
LAMBDA = tl.constexpr(2)
DISCOUNTED = tl.constexpr(3)
VTRACE = tl.constexpr(4)
RETRACE = tl.constexpr(5)
TRACES = tl.constexpr(6)
# How a coefficient is passed (the G_T, L_T, K0_T, K1_T and K2_T constexprs): a float32 scalar
# argument; a per-step tensor (strides k_t, k_n, shared by the call's per-step coefficients); one
# value for every step (a tensor broadcast with stride 0: a scalar tensor, or the float64 scalar
# of a float64 call), read from its first element.
COEF_SCALAR = tl.constexpr(0)
COEF_STEPS = tl.constexpr(1)
COEF_ONE = tl.constexpr(2)
# Retrace trace ids (the TRACE constexpr).
TRACE_RETRACE = tl.constexpr(0)
TRACE_TREE_BACKUP = tl.constexpr(1)
TRACE_Q_LAMBDA = tl.constexpr(2)
TRACE_IMPORTANCE = tl.constexpr(3)
# The interpreter runs a launch's programs one after another: no program can wait for another.
INTERPRETED = tl.constexpr(triton_interpreted())


@triton.jit
def _combine(a1, b1, a2, b2):
    """The associative operator: apply (a1, b1), then (a2, b2). ``a2 == 0`` is a hard cut."""
    cut = a2 == 0  # the composite forgets everything before: multiplier and offset exact
    return tl.where(cut, 0, a1 * a2), tl.where(cut, b2, a2 * b1 + b2)


@triton.jit
def _apply(a, b, carry):
    """a * carry + b; exactly b where a == 0 (a NaN carry does not cross a cut)."""
    return tl.where(a == 0, b, a * carry + b)


@triton.jit
def _load(ptr, off, mask, ACC: tl.constexpr):
    return tl.load(ptr + off, mask=mask, other=0).to(ACC)


@triton.jit
def _flag(ptr, off, mask, HAS: tl.constexpr):
    """A flag tile as int1 (non-zero is true); all false when the flag tensor is absent."""
    if HAS:
        return tl.load(ptr + off, mask=mask, other=0) != 0
    else:
        return off < 0  # an all-false tile of the right shape (offsets are never negative)


@triton.jit
def _coef(k, off, mask, MODE: tl.constexpr, ACC: tl.constexpr):
    """gamma / lmbda / a threshold, passed as MODE says (see COEF_SCALAR)."""
    if MODE == COEF_STEPS:
        return tl.load(k + off, mask=mask, other=0).to(ACC)
    elif MODE == COEF_ONE:
        return tl.load(k).to(ACC)
    else:
        return k


@triton.jit
def _min(w, bound):
    # NaN-propagating like torch.minimum (Triton's default returns the non-NaN operand)
    return tl.minimum(w, bound + tl.zeros_like(w), propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _next_value(
    x1,
    x2,
    boot_v,
    t,
    off,
    nxt,
    mask,
    T,
    ACC: tl.constexpr,
    HAS_NEXT: tl.constexpr,
    HAS_VALUES: tl.constexpr,
    HAS_BOOT: tl.constexpr,
):
    """nv_t: next_values[t]; else values[t+1], and at t = T-1 bootstrap_value (0 if absent):
    ``boot_v``, the tile's columns' values, or where its type is a pointer their addresses."""
    if HAS_NEXT:
        nv = _load(x2, off, mask, ACC)
    else:
        inside = mask & (t + 1 < T)
        nv = tl.zeros_like(off).to(ACC)
        if HAS_VALUES:
            nv = _load(x1, nxt, inside, ACC)
        if HAS_BOOT:
            edge = mask & (t + 1 == T)
            if boot_v.dtype.is_ptr():
                b = tl.load(boot_v[None, :] + 0 * t, mask=edge, other=0).to(ACC)
            else:
                b = boot_v[None, :]
            nv = tl.where(edge, b, nv)
    return nv


@triton.jit
def _coefficients(
    x0,
    x1,
    x2,
    x3,
    x4,
    term,
    trunc,
    gamma,
    lmbda,
    k0,
    k1,
    boot_v,
    t,
    off,
    nxt,
    foff,
    fnxt,
    fprev,
    koff,
    knxt,
    mask,
    T,
    KIND: tl.constexpr,
    TRACE: tl.constexpr,
    ACC: tl.constexpr,
    HAS_TERM: tl.constexpr,
    HAS_TRUNC: tl.constexpr,
    HAS_NEXT: tl.constexpr,
    HAS_VALUES: tl.constexpr,
    HAS_BOOT: tl.constexpr,
    G_T: tl.constexpr,
    L_T: tl.constexpr,
    K0_T: tl.constexpr,
    K1_T: tl.constexpr,
):
    """(a_t, b_t) of one tile for estimator KIND (see the backend docstrings for the maths).

    Returns ``a, b, c, is_term, v`` (``c``: the trace continues into step t+1; ``v``: the
    values tile where GAE and V-trace read it, for their outputs, else zeros). One if/elif
    chain on constexprs, so that each specialisation compiles only its own branch.
    """
    is_term = _flag(term, foff, mask, HAS_TERM)
    zero = tl.zeros_like(off).to(ACC)
    c = ~(is_term | _flag(trunc, foff, mask, HAS_TRUNC)) & (t + 1 < T)
    if KIND == TRACES:
        # z_t = x_t + g_t l_t (1 - done_{t-1}) z_{t-1}
        g = _coef(gamma, koff, mask, G_T, ACC) * _coef(lmbda, koff, mask, L_T, ACC)
        prev_done = _flag(term, fprev, mask & (t > 0), HAS_TERM)
        a = tl.where(prev_done, zero, g + zero)
        b = _load(x0, off, mask, ACC)
    elif KIND == SCAN:
        a = _coef(k0, koff, mask, K0_T, ACC) + zero
        b = _load(x0, off, mask, ACC)
    elif KIND == RETRACE:
        # Q_t = r_t + g_t (1 - term_t) [E_t + c_t k_{t+1} (Q_{t+1} - q_{t+1})]
        g = _coef(gamma, koff, mask, G_T, ACC)
        inside = mask & (t + 1 < T)
        tlp = _load(x3, nxt, inside, ACC)
        w = tl.exp(tlp - _load(x4, nxt, inside, ACC))
        lam = _coef(lmbda, knxt, inside, L_T, ACC)
        if TRACE == TRACE_RETRACE:
            kappa = lam * _min(w, _coef(k1, knxt, inside, K1_T, ACC))
        elif TRACE == TRACE_TREE_BACKUP:
            kappa = lam * tl.exp(tlp)
        elif TRACE == TRACE_Q_LAMBDA:
            kappa = lam + zero
        else:
            kappa = lam * w
        a = tl.where(c, g * kappa, zero)
        q_next = _load(x1, nxt, inside, ACC)
        e = _load(x2, off, mask, ACC)
        b = _load(x0, off, mask, ACC) + tl.where(is_term, zero, g * e)
        b -= tl.where(a != 0, a * q_next, zero)  # a zero trace coefficient drops q_{t+1}
    else:
        g = _coef(gamma, koff, mask, G_T, ACC)
        r = _load(x0, off, mask, ACC)
        nv = _next_value(x1, x2, boot_v, t, off, nxt, mask, T, ACC, HAS_NEXT, HAS_VALUES, HAS_BOOT)
        boot_term = tl.where(is_term, zero, g * nv)
        if KIND == DISCOUNTED:
            # G_t = r_t + g_t (1 - term_t) [c_t G_{t+1} + (1 - c_t) nv_t]
            a = tl.where(c, g + zero, zero)
            b = r + tl.where(c, zero, boot_term)
        elif KIND == LAMBDA:
            # G_t = r_t + g_t (1 - term_t) [(1 - l_t c_t) nv_t + l_t c_t G_{t+1}]
            lam = _coef(lmbda, koff, mask, L_T, ACC)
            a = tl.where(c, g * lam, zero)
            weight = tl.where(c, 1 - lam, 1.0)  # of nv_t; where it is 0, nv_t is unused
            b = r + tl.where(weight == 0, zero, weight * boot_term)
        elif KIND == GAE:
            # A_t = delta_t + g_t l_t c_t A_{t+1}
            lam = _coef(lmbda, koff, mask, L_T, ACC)
            a = tl.where(c, g * lam + zero, zero)
            v = _load(x1, off, mask, ACC)
            b = r + boot_term - v
        else:  # VTRACE: D_t = rho_t delta_t + g_t kappa_t c_t D_{t+1}
            lam = _coef(lmbda, koff, mask, L_T, ACC)
            w = tl.exp(_load(x3, off, mask, ACC) - _load(x4, off, mask, ACC))
            rho = _min(w, _coef(k0, koff, mask, K0_T, ACC))
            kappa = lam * _min(w, _coef(k1, koff, mask, K1_T, ACC))
            a = tl.where(c, g * kappa, zero)
            v = _load(x1, off, mask, ACC)
            b = rho * (r + boot_term - v)
    if KIND != GAE and KIND != VTRACE:
        v = zero
    return a, b, c, is_term, v


@triton.jit
def _row(x, rows, k):
    """Row k of a [BLOCK_T, BLOCK_N] tile, as a [BLOCK_N] vector."""
    return tl.sum(tl.where(rows[:, None] == k, x, 0), axis=0)


@triton.jit
def _neighbours(x, rows, cols, NEXT: tl.constexpr, fill):
    """Row r of ``x`` (``[R, C]``, ``rows = arange(R)``, ``cols``: any int32 ``[C]``) replaced
    by row r + 1 (NEXT) or r - 1; the edge row, which has none, takes ``fill`` (``[C]``)."""
    R: tl.constexpr = x.shape[0]
    if NEXT:
        src = tl.minimum(rows + 1, R - 1)
        edge = R - 1
    else:
        src = tl.maximum(rows - 1, 0)
        edge = 0
    y = tl.gather(x, src[:, None] + 0 * cols[None, :], 0)
    return tl.where(rows[:, None] == edge, fill[None, :], y)


@triton.jit
def _fours(x):
    """Rows 4g, 4g + 1, 4g + 2, 4g + 3 of ``x`` ([4G, C]), each as a [G, C] tensor."""
    G: tl.constexpr = x.shape[0] // 4
    C: tl.constexpr = x.shape[1]
    x = tl.permute(tl.reshape(x, [G, 2, 2, C]), (0, 3, 1, 2))  # [g, c, i, j]: row 4g + 2i + j
    even, odd = tl.split(x)
    x0, x2 = tl.split(even)
    x1, x3 = tl.split(odd)
    return x0, x1, x2, x3


@triton.jit
def _unfours(x0, x1, x2, x3):
    """The inverse of :func:`_fours`."""
    x = tl.join(tl.join(x0, x2), tl.join(x1, x3))  # [g, c, i, j]
    G: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    return tl.reshape(tl.permute(x, (0, 2, 3, 1)), [4 * G, C])


@triton.jit
def _later(ga, gb):
    """The composite of the groups after each group of a backward scan, row ``g`` of ``(ga,
    gb)`` (``[G, C]``) being group ``g``'s: a reverse exclusive scan along the rows, the
    identity for the last group. Computed as a forward scan of the rows gathered in reverse
    order, gathered back shifted by one: Triton lowers a reverse scan between two lane
    reversals of five chained shuffles a register each, a gather within a warp costs one."""
    G: tl.constexpr = ga.shape[0]
    g = tl.arange(0, G)[:, None] + 0 * tl.arange(0, ga.shape[1])[None, :]
    back = G - 1 - g
    RA, RB = tl.associative_scan((tl.gather(ga, back, 0), tl.gather(gb, back, 0)), 0, _combine)
    after = tl.maximum(back - 1, 0)  # where group g + 1's inclusive composite lies in (RA, RB)
    last = g == G - 1
    later_a = tl.where(last, 1.0, tl.gather(RA, after, 0))
    return later_a, tl.where(last, 0.0, tl.gather(RB, after, 0))


@triton.jit
def _backward_scan_by_fours(a, b):
    """``tl.associative_scan((a, b), 0, _combine, reverse=True)`` of ``[4G, C]`` tiles whose
    rows a thread holds four consecutive at a time (time the contiguous axis): the four rows of
    each group are composed in registers (row 3, then 2, 1, 0), only the groups' composites are
    scanned (:func:`_later`: a quarter of the registers), and each row's composite is the later
    groups' composite applied before its own in-group one."""
    a0, a1, a2, a3 = _fours(a)
    b0, b1, b2, b3 = _fours(b)
    a2, b2 = _combine(a3, b3, a2, b2)
    a1, b1 = _combine(a2, b2, a1, b1)
    a0, b0 = _combine(a1, b1, a0, b0)
    later_a, later_b = _later(a0, b0)
    A0, B0 = _combine(later_a, later_b, a0, b0)
    A1, B1 = _combine(later_a, later_b, a1, b1)
    A2, B2 = _combine(later_a, later_b, a2, b2)
    A3, B3 = _combine(later_a, later_b, a3, b3)
    return _unfours(A0, A1, A2, A3), _unfours(B0, B1, B2, B3)


@triton.jit
def _eights(x):
    """Rows 8h + k of ``x`` ([8H, C]), k = 0 .. 7, each as an [H, C] tensor."""
    H: tl.constexpr = x.shape[0] // 8
    C: tl.constexpr = x.shape[1]
    x = tl.permute(tl.reshape(x, [H, 2, 2, 2, C]), (0, 4, 1, 2, 3))  # [h, c, i, j, k]: row
    even, odd = tl.split(x)  # 8h + 4i + 2j + k
    even0, even1 = tl.split(even)
    odd0, odd1 = tl.split(odd)
    x0, x4 = tl.split(even0)
    x2, x6 = tl.split(even1)
    x1, x5 = tl.split(odd0)
    x3, x7 = tl.split(odd1)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _uneights(x0, x1, x2, x3, x4, x5, x6, x7):
    """The inverse of :func:`_eights`."""
    even = tl.join(tl.join(x0, x4), tl.join(x2, x6))  # [h, c, i, j]
    odd = tl.join(tl.join(x1, x5), tl.join(x3, x7))
    x = tl.join(even, odd)  # [h, c, i, j, k]
    H: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    return tl.reshape(tl.permute(x, (0, 2, 3, 4, 1)), [8 * H, C])


@triton.jit
def _backward_states_by_eights(a, b, carry):
    """The states ``x`` of a backward scan over a ``[8H, C]`` tile whose rows a thread holds
    eight consecutive (a 256-step tile of one warp), entering from ``carry`` (``[C]``), and the
    state it leaves (row 0's). Each group of eight rows is composed in registers, the groups'
    composites scanned (:func:`_later`: one register a thread), and the rows' states follow
    from the state entering their group by seven applications in turn: no per-row composites
    (sweep 31: discounted returns 39 sm_90 instructions an element at [1024, 65536], 46 by
    fours with :func:`_later`, 50 with a reverse scan)."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _eights(a)
    b0, b1, b2, b3, b4, b5, b6, b7 = _eights(b)
    ga, gb = _combine(a7, b7, a6, b6)
    ga, gb = _combine(ga, gb, a5, b5)
    ga, gb = _combine(ga, gb, a4, b4)
    ga, gb = _combine(ga, gb, a3, b3)
    ga, gb = _combine(ga, gb, a2, b2)
    ga, gb = _combine(ga, gb, a1, b1)
    ga, gb = _combine(ga, gb, a0, b0)
    later_a, later_b = _later(ga, gb)
    x7 = _apply(a7, b7, _apply(later_a, later_b, carry[None, :]))
    x6 = _apply(a6, b6, x7)
    x5 = _apply(a5, b5, x6)
    x4 = _apply(a4, b4, x5)
    x3 = _apply(a3, b3, x4)
    x2 = _apply(a2, b2, x3)
    x1 = _apply(a1, b1, x2)
    x0 = _apply(a0, b0, x1)
    return _uneights(x0, x1, x2, x3, x4, x5, x6, x7), _row(x0, tl.arange(0, x0.shape[0]), 0)


@triton.jit
def _tile_offsets(t0, rows, n, n_ok, stop, s_t, s_n, f_t, f_n, k_t, k_n,
                  FLIP: tl.constexpr, IDX64: tl.constexpr, FULL: tl.constexpr,
                  BLOCK_T: tl.constexpr):  # fmt: skip
    """Steps, mask and element offsets of the tile whose first step is ``t0``: value inputs,
    flags and per-step coefficients. FLIP (a reverse scan of a tile whose rows are not
    contiguous in memory) puts the tile's steps in reverse row order, so that the scan runs
    forward along the rows: Triton lowers a reverse scan with lane shuffles even where a
    thread holds every row in its registers."""
    if FLIP:
        t = t0 + (BLOCK_T - 1 - rows)[:, None]
    else:
        t = t0 + rows[:, None]
    if FULL:  # every tile of the call inside [0, T) x [0, N): no predicates
        mask = tl.full([BLOCK_T, n_ok.shape[0]], True, tl.int1)
    else:
        mask = (t < stop) & n_ok[None, :]
    if IDX64:  # offsets past 2**31 elements
        ti = t.to(tl.int64)
        ni = n.to(tl.int64)[None, :]
    else:
        ti = t
        ni = n[None, :]
    off = ti * s_t + ni * s_n
    # (flag columns regrouped by 4: bool tiles then load 4 a thread, in the layout of the value
    # tiles, instead of 16 a thread in a layout with rows across threads)
    foff = ti * f_t + ((ni // 4) * 4 + ni % 4) * f_n
    koff = ti * k_t + ni * k_n
    return t, ti, ni, mask, off, foff, koff


@triton.jit
def _tile_coefficients(
    x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, boot_v, t0, rows, n, n_ok, stop, T,
    s_t, s_n, f_t, f_n, k_t, k_n,
    KIND: tl.constexpr, TRACE: tl.constexpr, FLIP: tl.constexpr, ACC: tl.constexpr,
    HAS_TERM: tl.constexpr, HAS_TRUNC: tl.constexpr, HAS_NEXT: tl.constexpr,
    HAS_VALUES: tl.constexpr, HAS_BOOT: tl.constexpr, G_T: tl.constexpr, L_T: tl.constexpr,
    K0_T: tl.constexpr, K1_T: tl.constexpr, IDX64: tl.constexpr, FULL: tl.constexpr,
    BLOCK_T: tl.constexpr,
):  # fmt: skip
    """``(a, b, c, is_term, v)`` of the tile whose first step is ``t0`` (see
    :func:`_coefficients`); steps from ``stop`` on are the identity map."""
    t, _, _, mask, off, foff, koff = _tile_offsets(
        t0, rows, n, n_ok, stop, s_t, s_n, f_t, f_n, k_t, k_n, FLIP, IDX64, FULL, BLOCK_T
    )
    a, b, c, is_term, v = _coefficients(
        x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, boot_v, t, off, off + s_t, foff,
        foff + f_t, foff - f_t, koff, koff + k_t, mask, T, KIND, TRACE, ACC, HAS_TERM,
        HAS_TRUNC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T, L_T, K0_T, K1_T,
    )  # fmt: skip
    return tl.where(mask, a, 1), tl.where(mask, b, 0), c, is_term, v  # (padding: the identity)


@triton.jit
def _scan_tile(a, b, BACKWARD: tl.constexpr, BY: tl.constexpr):
    """A tile's coefficients scanned along its rows (backward if BACKWARD; in one-column
    backward tiles four rows at a time if BY > 0): each row's composite map from the tile's
    first row in scan order."""
    if BY > 0:
        return _backward_scan_by_fours(a, b)
    return tl.associative_scan((a, b), 0, _combine, reverse=BACKWARD)


@triton.jit
def _tile_states(a, b, carry, rows, BACKWARD: tl.constexpr, BY: tl.constexpr, LAST: tl.constexpr):
    """The states of a tile entering from ``carry`` and the state it leaves (row LAST's, the
    one its scan reaches last). BY: 8 (one-column backward tiles whose rows a thread holds
    eight consecutive: :func:`_backward_states_by_eights`), else as :func:`_scan_tile`."""
    if BY == 8:
        return _backward_states_by_eights(a, b, carry)
    A, B = _scan_tile(a, b, BACKWARD, BY)
    x = _apply(A, B, carry[None, :])
    return x, _row(x, rows, LAST)


@triton.jit
def _fold_tile(total_a, total_b, a, b, rows, BACKWARD: tl.constexpr, BY: tl.constexpr,
               LAST: tl.constexpr, TILE_TOTALS: tl.constexpr):  # fmt: skip
    """Fold a tile's composite (row LAST of its scan) into the chunk's: as a tile of totals,
    whose row LAST is the chunk's, if TILE_TOTALS (a cross-lane extraction once a chunk, not
    once a tile), else as one row."""
    A, B = _scan_tile(a, b, BACKWARD, BY)
    if TILE_TOTALS:
        return _combine(total_a, total_b, A, B)
    return _combine(total_a, total_b, _row(A, rows, LAST), _row(B, rows, LAST))


@triton.jit
def _write_tile(
    x0, x1, x2, x3, x4, gamma, k2, boot_v, out0, out1, x, c, is_term, v, t0, rows, n, n_ok,
    carry, stop, T, s_t, s_n, f_t, f_n, k_t, k_n, o0_t, o0_n, o1_t, o1_n,
    KIND: tl.constexpr, FLIP: tl.constexpr, ACC: tl.constexpr, HAS_NEXT: tl.constexpr,
    HAS_VALUES: tl.constexpr, HAS_BOOT: tl.constexpr, G_T: tl.constexpr, K2_T: tl.constexpr,
    IDX64: tl.constexpr, FULL: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Write the outputs of one tile of BLOCK_T steps x BLOCK_N sequences from its states
    ``x`` (:func:`_tile_states`; ``carry``: the state that entered the tile)."""
    t, ti, ni, mask, off, _, koff = _tile_offsets(
        t0, rows, n, n_ok, stop, s_t, s_n, f_t, f_n, k_t, k_n, FLIP, IDX64, FULL, BLOCK_T
    )
    x_out = x
    if KIND == GAE:  # returns = advantages + values
        ret = x + v
        tl.store(out1 + ti * o1_t + ni * o1_n, ret, mask=mask)
    if KIND == VTRACE:
        # vs_t = v_t + D_t; pg_t = min(pg_rho_bar, w_t) (r_t + g_t (1 - term_t) u_t - v_t)
        # with u_t = vs_{t+1} where c_t, else nv_t. D_{t+1} of the tile's last step is the
        # carry that entered the tile (step t + 1 is the next row, the previous if FLIP).
        x_out = x + v
        d_next = _neighbours(x, rows, n, not FLIP, carry)
        inside = mask & (t + 1 < T)
        vs_next = _load(x1, off + s_t, inside, ACC) + d_next
        nv = _next_value(
            x1, x2, boot_v, t, off, off + s_t, mask, T, ACC, HAS_NEXT, HAS_VALUES, HAS_BOOT
        )
        u = tl.where(c, vs_next, nv)
        g = _coef(gamma, koff, mask, G_T, ACC)
        r = _load(x0, off, mask, ACC)
        w = tl.exp(_load(x3, off, mask, ACC) - _load(x4, off, mask, ACC))
        pg_rho = _min(w, _coef(k2, koff, mask, K2_T, ACC))
        pg = pg_rho * (r + tl.where(is_term, 0, g * u) - v)
        tl.store(out1 + ti * o1_t + ni * o1_n, pg, mask=mask)
    tl.store(out0 + ti * o0_t + ni * o0_n, x_out, mask=mask)


@triton.jit
def _fold(carry, base, n_rows, n_before, N, n64, n_ok, REVERSE: tl.constexpr, FOLD: tl.constexpr,
          L2_ONLY: tl.constexpr):  # fmt: skip
    """Apply to ``carry`` the composites of rows ``0 .. n_before-1`` (in scan order; counted
    from the end when REVERSE) of ``base``: ``[2, n_rows, N]``, A then B. FOLD rows per memory
    round trip, one tile load and one in-register scan each (a row-by-row loop would pay a
    dependent round trip per row); padding rows are the identity map. L2_ONLY: loads that bypass
    L1 (where other programs of the same launch stored the rows)."""
    fold = tl.arange(0, FOLD)
    for g in range(0, tl.cdiv(n_before, FOLD)):
        j = g * FOLD + fold
        ok = (j < n_before)[:, None] & n_ok[None, :]
        if REVERSE:
            j = n_rows - 1 - j
        A, B = _scan_composites(base, j, n_rows, N, n64, ok, L2_ONLY)
        carry = _apply(_row(A, fold, FOLD - 1), _row(B, fold, FOLD - 1), carry)
    return carry


@triton.jit
def _scan_composites(base, j, n_rows, N, n64, ok, L2_ONLY: tl.constexpr):
    """Rows ``j`` of ``base`` (``[2, n_rows, N]``: A then B) as a tile, scanned in the order of
    ``j``; rows where not ``ok`` are the identity map."""
    at = base + j.to(tl.int64)[:, None] * N + n64[None, :]
    at_b = at + n_rows.to(tl.int64) * N
    if L2_ONLY:
        a_j = tl.load(at, mask=ok, other=1, cache_modifier=".cg")
        b_j = tl.load(at_b, mask=ok, other=0, cache_modifier=".cg")
    else:
        a_j = tl.load(at, mask=ok, other=1)
        b_j = tl.load(at_b, mask=ok, other=0)
    return tl.associative_scan((a_j, b_j), 0, _combine)


@triton.jit
def _prefixes_at(totals, n_chunks, N):
    """The in-group prefixes in ``totals`` (see :func:`_group_prefixes`)."""
    return totals + 2 * n_chunks.to(tl.int64) * N


@triton.jit
def _group_totals_at(totals, n_chunks, N):
    """The group totals in ``totals`` (see :func:`_group_prefixes`)."""
    return totals + 4 * n_chunks.to(tl.int64) * N


@triton.jit
def _group_prefixes(totals, grp, n_chunks, N, n64, n_ok, REVERSE: tl.constexpr,
                    GROUP: tl.constexpr):  # fmt: skip
    """Two-level carry-in when the time axis is split in many chunks (the launch between the
    totals and the scan launches, a program per group and block of sequences): chunks form
    groups of GROUP consecutive chunks in scan order; scan group ``grp``'s chunk totals and
    write each chunk's composite from the start of its group, and the group's total. The scan
    launch then folds n_groups group totals and one prefix instead of every earlier chunk's
    total.

    ``totals`` holds ``[2, n_chunks, N]`` chunk totals by chunk, then ``[2, n_chunks, N]``
    in-group prefixes by place in scan order, then ``[2, n_groups, N]`` group totals."""
    n_groups = tl.cdiv(n_chunks, GROUP)
    first = grp * GROUP
    size = tl.minimum(GROUP, n_chunks - first)
    rows = tl.arange(0, GROUP)
    sj = first + rows
    ok = (rows < size)[:, None] & n_ok[None, :]
    cj = n_chunks - 1 - sj if REVERSE else sj
    A, B = _scan_composites(totals, cj, n_chunks, N, n64, ok, False)
    prefix = _prefixes_at(totals, n_chunks, N) + sj.to(tl.int64)[:, None] * N + n64[None, :]
    tl.store(prefix, A, mask=ok)
    tl.store(prefix + n_chunks.to(tl.int64) * N, B, mask=ok)
    group_total = _group_totals_at(totals, n_chunks, N) + grp.to(tl.int64) * N + n64
    tl.store(group_total, _row(A, rows, size - 1), mask=n_ok)
    tl.store(group_total + n_groups * N, _row(B, rows, size - 1), mask=n_ok)


@triton.jit
def _chunk_carries(carry, totals, first, n_chunks, N, col64, col_ok, REVERSE: tl.constexpr,
                   SEGS: tl.constexpr):  # fmt: skip
    """The carries entering a program's SEGS chunks ``first ..``, as its lanes (chunk-major):
    the chunks' totals scanned in scan order and applied to ``carry``, the carry entering the
    first of them in scan order."""
    segs = tl.arange(0, SEGS)
    at = totals + (first + segs).to(tl.int64)[:, None] * N + col64[None, :]
    a = tl.load(at, mask=col_ok[None, :], other=1)
    b = tl.load(at + n_chunks.to(tl.int64) * N, mask=col_ok[None, :], other=0)
    A, B = tl.associative_scan((a, b), 0, _combine, reverse=REVERSE)
    after = _apply(A, B, carry[None, :])  # the state after each chunk
    # a chunk starts from the state after the chunk before it in scan order
    entering = _neighbours(after, segs, col64.to(tl.int32), REVERSE, carry)
    return tl.reshape(entering, [SEGS * col64.shape[0]])


@triton.jit
def _grid_barrier(counter, n_programs):
    """Wait until all ``n_programs`` programs of the launch have arrived. Every program must be
    resident (a cooperative launch); ``counter`` (int32) is zero before the launch. What a
    program stored before the barrier is visible to every program after it (release and
    acquire at GPU scope). Under the interpreter, which runs the programs one after another,
    a no-op: the launch orders its programs so that each finds what it reads already stored."""
    if not INTERPRETED:
        tl.debug_barrier()  # (every thread's stores issued before the program's arrival)
        arrived = tl.atomic_add(counter, 1, sem="release", scope="gpu") + 1
        while arrived < n_programs:  # (polled with plain loads: no atomics queued meanwhile)
            arrived = tl.load(counter, volatile=True)
        tl.atomic_add(counter, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


@triton.jit
def _aligned(x, ALIGN: tl.constexpr):
    """``x``, which the launcher found a multiple of ALIGN, as the compiler can tell it is."""
    if ALIGN > 1:
        return x // ALIGN * ALIGN
    return x


# T, N and CHUNK are specialised like every integer argument (equal to 1, multiple of 16): with
# N (the row stride) a known multiple of 16, the masks are constant over a thread's contiguous
# elements and loads/stores vectorise (16 bytes a thread instead of 4); on an H200 device time
# went to 0.39-1.02x of before over 7 estimators x 8 shapes x 2 layouts (sweep 8 in
# benchmarks/results/sweep_tiles_h200.txt). The cost is at most a few compiled variants per
# launch shape. Rows whose length is a multiple of 2, 4 or 8 only get it from ALIGN_T (T, CHUNK
# and the sequence strides: batch-major rows) and ALIGN_N (N and the time strides: time-major
# rows), set by the launcher (_alignment).
@triton.jit
def scan_kernel(
    x0,
    x1,
    x2,
    x3,
    x4,  # per-step value inputs (meaning per KIND), strides s_t, s_n
    term,
    trunc,  # flags, strides f_t, f_n
    gamma,
    lmbda,
    k0,
    k1,
    k2,  # coefficients: scalars, per-step tensors with strides k_t, k_n, or one-value tensors
    boot,  # bootstrap_value / initial, stride b_n
    out0,
    out1,  # outputs, strides o0_t, o0_n / o1_t, o1_n
    totals,  # chunk composites (A, B) in ACC: see _group_prefixes for the layout (resident:
    # [2, n_chunks, N], then the grid barrier's int32 counter)
    T,
    N,
    CHUNK,
    s_t,
    s_n,
    f_t,
    f_n,
    k_t,
    k_n,
    b_n,
    o0_t,
    o0_n,
    o1_t,
    o1_n,
    KIND: tl.constexpr,
    TRACE: tl.constexpr,
    REVERSE: tl.constexpr,
    FLIP: tl.constexpr,
    ACC: tl.constexpr,
    HAS_TERM: tl.constexpr,
    HAS_TRUNC: tl.constexpr,
    HAS_NEXT: tl.constexpr,
    HAS_VALUES: tl.constexpr,
    HAS_BOOT: tl.constexpr,
    G_T: tl.constexpr,
    L_T: tl.constexpr,
    K0_T: tl.constexpr,
    K1_T: tl.constexpr,
    K2_T: tl.constexpr,
    WRITE_TOTALS: tl.constexpr,
    READ_TOTALS: tl.constexpr,
    GROUP_PASS: tl.constexpr,
    RESIDENT: tl.constexpr,
    IDX64: tl.constexpr,
    FULL: tl.constexpr,
    T_TAIL: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BY: tl.constexpr,
    SEGS: tl.constexpr,
    UNROLL: tl.constexpr,
    FOLD: tl.constexpr,
    GROUP: tl.constexpr,
    PREFETCH: tl.constexpr,
    STAGES: tl.constexpr,
    ALIGN_T: tl.constexpr,
    ALIGN_N: tl.constexpr,
):
    """Grid ``(cdiv(N, COLS), n_chunks / SEGS)`` (``(cdiv(N, COLS), n_groups)`` for the
    GROUP_PASS between the totals and the scan launches: :func:`_group_prefixes`). Each loop
    iteration handles UNROLL consecutive tiles of BLOCK_T steps: BLOCK_T = 1 with a large
    UNROLL is a per-thread sequential recurrence over rows (time-major layouts: each thread
    owns columns), a large BLOCK_T a parallel scan along time (batch-major layouts: time is the
    contiguous axis).

    SEGS > 1 (time-major, few sequences): a program runs SEGS consecutive chunks of COLS
    sequences side by side, lane ``seg * COLS + column`` of its tiles in chunk ``seg``, so that
    a tile is BLOCK_N lanes wide and each thread holds whole columns of it (the scan along
    time stays in registers); the chunks' carries come from their totals (``_chunk_carries``)."""
    T, CHUNK = _aligned(T, ALIGN_T), _aligned(CHUNK, ALIGN_T)
    s_n, f_n, k_n = _aligned(s_n, ALIGN_T), _aligned(f_n, ALIGN_T), _aligned(k_n, ALIGN_T)
    o0_n, o1_n = _aligned(o0_n, ALIGN_T), _aligned(o1_n, ALIGN_T)
    N = _aligned(N, ALIGN_N)
    s_t, f_t, k_t = _aligned(s_t, ALIGN_N), _aligned(f_t, ALIGN_N), _aligned(k_t, ALIGN_N)
    o0_t, o1_t = _aligned(o0_t, ALIGN_N), _aligned(o1_t, ALIGN_N)
    pid_n = tl.program_id(0)
    COLS: tl.constexpr = BLOCK_N // SEGS  # sequences per program (SEGS chunks side by side)
    col = pid_n * COLS + tl.arange(0, COLS)
    col_ok = col < N
    col64 = col.to(tl.int64)

    if GROUP_PASS:
        n_chunks = tl.cdiv(T, CHUNK * SEGS) * SEGS
        _group_prefixes(totals, tl.program_id(1), n_chunks, N, col64, col_ok, REVERSE, GROUP)
    else:
        n_chunks = tl.num_programs(1) * SEGS
        pid_t = tl.program_id(1)
        if RESIDENT and REVERSE:  # (programs in scan order: see _grid_barrier)
            pid_t = tl.num_programs(1) - 1 - pid_t
        first = pid_t * SEGS  # the program's first chunk in time
        rows = tl.arange(0, BLOCK_T)

        # The carry entering the program's first chunk in scan order, s: `boot` is the initial
        # state for the generic scan and the traces; then the composites of the chunks before it.
        carry = tl.zeros([COLS], dtype=ACC)
        if HAS_BOOT and (KIND == SCAN or KIND == TRACES):
            carry = tl.load(boot + col64 * b_n, mask=col_ok, other=0).to(ACC)
        s = n_chunks - SEGS - first if REVERSE else first
        if READ_TOTALS:
            if GROUP == 1:  # the chunk totals of every earlier chunk
                carry = _fold(carry, totals, n_chunks, s, N, col64, col_ok, REVERSE, FOLD, False)
            else:  # the totals of the earlier groups, then the group's own prefix
                n_groups = tl.cdiv(n_chunks, GROUP)
                group_totals = _group_totals_at(totals, n_chunks, N)
                carry = _fold(
                    carry, group_totals, n_groups, s // GROUP, N, col64, col_ok, False, FOLD, False
                )
                if s % GROUP != 0:  # (the first chunk of a group starts from the group's carry)
                    prefix = _prefixes_at(totals, n_chunks, N) + (s - 1).to(tl.int64) * N + col64
                    a_p = tl.load(prefix, mask=col_ok, other=1)
                    b_p = tl.load(prefix + n_chunks.to(tl.int64) * N, mask=col_ok, other=0)
                    carry = _apply(a_p, b_p, carry)

        BACKWARD: tl.constexpr = REVERSE and not FLIP  # a tile is scanned from its last row up
        LAST: tl.constexpr = 0 if BACKWARD else BLOCK_T - 1  # the row its scan reaches last
        # The chunk's composite as a tile of totals, its row extracted once at the end, where a
        # tile's rows are spread over threads (each extraction is a cross-lane reduction); one
        # row of totals with chunks side by side, whose rows are in a thread's registers
        TILE_TOTALS: tl.constexpr = SEGS == 1
        if SEGS == 1:
            n, n_ok, n64, c = col, col_ok, col64, first
            start = first * CHUNK
        else:  # lane = seg * COLS + column: chunk first + seg of sequence column
            lane = tl.arange(0, BLOCK_N)
            n = pid_n * COLS + lane % COLS
            n_ok = n < N
            n64 = n.to(tl.int64)
            c = first + lane // COLS
            if READ_TOTALS:
                carry = _chunk_carries(
                    carry, totals, first, n_chunks, N, col64, col_ok, REVERSE, SEGS
                )
            else:
                carry = tl.zeros([BLOCK_N], dtype=ACC)
            start = (c * CHUNK)[None, :]  # (a row: tile offsets are [BLOCK_T, BLOCK_N])
        stop = tl.minimum(start + CHUNK, T)
        # bootstrap_value (the value after the last step) of the tile's columns: loaded once in
        # an unsplit scan (sweep 31: 0.92-0.94x the time of a masked load a tile at [1024,
        # 65536] time-major for discounted returns and V-trace); in the passes of a split or
        # resident one each tile's load stays, masked to step T - 1 (a load a program took
        # 1.02-1.04x the time for GAE at [131072, 16] time-major; by the last chunk's programs
        # only 1.04x there and 1.59x resident at [200003, 2]: not understood, not profiled)
        if HAS_BOOT:
            boot_v = boot + n64 * b_n  # (addresses: see _next_value)
            if not (READ_TOTALS or WRITE_TOTALS or RESIDENT) and KIND != SCAN and KIND != TRACES:
                boot_v = tl.load(boot_v, mask=n_ok, other=0).to(ACC)
        else:
            boot_v = tl.zeros([BLOCK_N], dtype=ACC)
        if RESIDENT:  # one tile a chunk, every program resident (a cooperative launch): scan
            # the tile, publish its composite, wait for every program's, fold those before it in
            # scan order into the carry, finish the tile from its registers (one pass over memory)
            a, b, cont, is_term, v = _tile_coefficients(
                x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, boot_v, start, rows, n, n_ok,
                stop, T, s_t, s_n, f_t, f_n, k_t, k_n, KIND, TRACE, FLIP, ACC, HAS_TERM,
                HAS_TRUNC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T, L_T, K0_T, K1_T, IDX64,
                FULL, BLOCK_T,
            )  # fmt: skip
            A, B = _scan_tile(a, b, BACKWARD, BY)
            tl.store(totals + c * N + n64, _row(A, rows, LAST), mask=n_ok)
            tl.store(totals + (n_chunks + c) * N + n64, _row(B, rows, LAST), mask=n_ok)
            counter = (totals + 2 * n_chunks * N).to(tl.pointer_type(tl.int32), bitcast=True)
            _grid_barrier(counter, tl.num_programs(0) * tl.num_programs(1))
            carry = _fold(carry, totals, n_chunks, s, N, col64, col_ok, REVERSE, FOLD, True)
            _write_tile(
                x0, x1, x2, x3, x4, gamma, k2, boot_v, out0, out1, _apply(A, B, carry[None, :]),
                cont, is_term, v, start, rows, n, n_ok, carry, stop, T, s_t, s_n, f_t, f_n, k_t,
                k_n, o0_t, o0_n, o1_t, o1_n, KIND, FLIP, ACC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T,
                K2_T, IDX64, FULL, BLOCK_T,
            )  # fmt: skip
            return
        # A program whose chunks all end by T masks its tiles at the chunks' ends only, which
        # the compiler knows are multiples of 16 where the chunk is (Triton's specialisation):
        # ptxas then issues a tile's loads up front. T_TAIL (T not a multiple of 16, split):
        # the walk compiled twice, masked at T too in the program that holds step T - 1 only
        # (sweep 40: masked at a T not known as a multiple of 16, ptxas spread the loads among
        # the arithmetic, up to 2.3x the time). The launcher sets it where it won (sweep 41:
        # _tail_programs).
        if T_TAIL and (first + SEGS) * CHUNK <= T:
            _walk_chunks(
                x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, k2, boot_v, out0, out1,
                totals, carry, first, c, n, n_ok, n64, rows, start, start + CHUNK, T, N, CHUNK,
                n_chunks, s_t, s_n, f_t, f_n, k_t, k_n, o0_t, o0_n, o1_t, o1_n, KIND, TRACE,
                REVERSE, FLIP, ACC, HAS_TERM, HAS_TRUNC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T, L_T,
                K0_T, K1_T, K2_T, IDX64, FULL, BLOCK_T, BLOCK_N, BY, UNROLL, PREFETCH, STAGES,
                WRITE_TOTALS, TILE_TOTALS, BACKWARD, LAST,
            )  # fmt: skip
        else:
            _walk_chunks(
                x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, k2, boot_v, out0, out1,
                totals, carry, first, c, n, n_ok, n64, rows, start, stop, T, N, CHUNK,
                n_chunks, s_t, s_n, f_t, f_n, k_t, k_n, o0_t, o0_n, o1_t, o1_n, KIND, TRACE,
                REVERSE, FLIP, ACC, HAS_TERM, HAS_TRUNC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T, L_T,
                K0_T, K1_T, K2_T, IDX64, FULL, BLOCK_T, BLOCK_N, BY, UNROLL, PREFETCH, STAGES,
                WRITE_TOTALS, TILE_TOTALS, BACKWARD, LAST,
            )  # fmt: skip


@triton.jit
def _walk_chunks(
    x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, k2, boot_v, out0, out1, totals,
    carry, first, c, n, n_ok, n64, rows, start, stop, T, N, CHUNK, n_chunks, s_t, s_n, f_t, f_n,
    k_t, k_n, o0_t, o0_n, o1_t, o1_n,
    KIND: tl.constexpr, TRACE: tl.constexpr, REVERSE: tl.constexpr, FLIP: tl.constexpr,
    ACC: tl.constexpr, HAS_TERM: tl.constexpr, HAS_TRUNC: tl.constexpr, HAS_NEXT: tl.constexpr,
    HAS_VALUES: tl.constexpr, HAS_BOOT: tl.constexpr, G_T: tl.constexpr, L_T: tl.constexpr,
    K0_T: tl.constexpr, K1_T: tl.constexpr, K2_T: tl.constexpr, IDX64: tl.constexpr,
    FULL: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BY: tl.constexpr,
    UNROLL: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
    WRITE_TOTALS: tl.constexpr, TILE_TOTALS: tl.constexpr, BACKWARD: tl.constexpr,
    LAST: tl.constexpr,
):  # fmt: skip
    """The program's tile loop (see ``scan_kernel``): its chunks' totals (WRITE_TOTALS) or
    their states and outputs from ``carry``; tiles masked from ``stop`` on."""
    STEP: tl.constexpr = BLOCK_T * UNROLL
    n_iters = tl.cdiv(tl.minimum(CHUNK, T - first * CHUNK), STEP)  # (the first chunk's)
    if TILE_TOTALS:
        total_a = tl.full([BLOCK_T, BLOCK_N], 1, dtype=ACC)
        total_b = tl.zeros([BLOCK_T, BLOCK_N], dtype=ACC)
    else:
        total_a = tl.full([BLOCK_N], 1, dtype=ACC)
        total_b = tl.zeros([BLOCK_N], dtype=ACC)
    # PREFETCH: each tile's coefficients are built (its loads issued) before the previous
    # tile is scanned and written, so that its loads are in flight meanwhile
    if PREFETCH:
        t0 = start
        if REVERSE:
            t0 += n_iters * STEP - BLOCK_T
        a, b, cont, is_term, v = _tile_coefficients(
            x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, boot_v, t0, rows, n, n_ok,
            stop, T, s_t, s_n, f_t, f_n, k_t, k_n, KIND, TRACE, FLIP, ACC, HAS_TERM,
            HAS_TRUNC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T, L_T, K0_T, K1_T, IDX64,
            FULL, BLOCK_T,
        )  # fmt: skip
    for i in tl.range(0, n_iters, num_stages=STAGES):
        for k in tl.static_range(UNROLL):
            if REVERSE:
                t0 = start + (n_iters - 1 - i) * STEP + (UNROLL - 1 - k) * BLOCK_T
            else:
                t0 = start + i * STEP + k * BLOCK_T
            if PREFETCH:  # the next tile in walk order; past the chunk, masked (forward) or
                # clamped to its first tile (reverse: reloaded once, unused)
                t1 = tl.maximum(t0 - BLOCK_T, start) if REVERSE else t0 + BLOCK_T
            else:
                t1 = t0
            a1, b1, cont1, is_term1, v1 = _tile_coefficients(
                x0, x1, x2, x3, x4, term, trunc, gamma, lmbda, k0, k1, boot_v, t1, rows, n, n_ok,
                stop, T, s_t, s_n, f_t, f_n, k_t, k_n, KIND, TRACE, FLIP, ACC, HAS_TERM,
                HAS_TRUNC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T, L_T, K0_T, K1_T, IDX64,
                FULL, BLOCK_T,
            )  # fmt: skip
            if not PREFETCH:
                a, b, cont, is_term, v = a1, b1, cont1, is_term1, v1
            if WRITE_TOTALS:
                total_a, total_b = _fold_tile(
                    total_a, total_b, a, b, rows, BACKWARD, BY, LAST, TILE_TOTALS
                )
            else:
                x, carry_out = _tile_states(a, b, carry, rows, BACKWARD, BY, LAST)
                _write_tile(
                    x0, x1, x2, x3, x4, gamma, k2, boot_v, out0, out1, x, cont, is_term, v,
                    t0, rows, n, n_ok, carry, stop, T, s_t, s_n, f_t, f_n, k_t, k_n, o0_t,
                    o0_n, o1_t, o1_n, KIND, FLIP, ACC, HAS_NEXT, HAS_VALUES, HAS_BOOT, G_T,
                    K2_T, IDX64, FULL, BLOCK_T,
                )  # fmt: skip
                carry = carry_out
            if PREFETCH:
                a, b, cont, is_term, v = a1, b1, cont1, is_term1, v1
    if WRITE_TOTALS:
        if TILE_TOTALS:
            total_a = _row(total_a, rows, LAST)
            total_b = _row(total_b, rows, LAST)
        tl.store(totals + c * N + n64, total_a, mask=n_ok)
        tl.store(totals + (n_chunks + c) * N + n64, total_b, mask=n_ok)
