"""CUDA-specific tests (all skip without CUDA): > 2^31 elements, misaligned
pointers, CUDA graphs, non-current devices, a wide hidden-size sweep, a
row-count sweep and bitwise determinism at sizes where reductions span many
blocks.  Tests marked ``sanitize`` are the small, fast selection for
compute-sanitizer:

    compute-sanitizer --tool memcheck python -m pytest tests/python -m sanitize
"""
import copy
import dataclasses
import gc

import pytest
import torch

import fused_layernorm as fl
from helpers import (
    DTYPES,
    Inputs,
    assert_close,
    check_result,
    dtype_name,
    generator,
    growth,
    make_inputs,
    randn,
    reference,
    requires_cuda,
    run_fused,
    unit_roundoff,
)

pytestmark = requires_cuda

ops = torch.ops.fused_layernorm
KINDS = ["ln", "rms"]
kinds = pytest.mark.parametrize("kind", KINDS)
dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)


def check(inp):
    res = run_fused(inp)
    check_result(inp, res, reference(inp))
    return res


# --- compute-sanitizer selection ------------------------------------------------

@pytest.mark.sanitize
@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [3, 1025, 8193])
def test_sanitize_small_sizes(kind, dtype, hidden, seed):
    """A few odd sizes, fwd + bwd (small enough to run under compute-sanitizer)."""
    check(make_inputs(kind, (5, hidden), (hidden,), dtype, "cuda", generator(seed)))


@pytest.mark.sanitize
@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [8, 200, 360, 512, 720, 1000])
def test_sanitize_short_rows(kind, dtype, hidden, seed):
    """The forward's short-row kernel (rows of at most 32 lanes, several rows
    a thread): 37 rows leave the last warp with rows past the tensor, in
    every slot layout from 1 lane a row (bf16 8) to 32 lanes of 4 accesses,
    the last partly idle (bf16 1000), and of 3 accesses, one row a thread
    (fp32 360, bf16 720)."""
    check(make_inputs(kind, (37, hidden), (hidden,), dtype, "cuda", generator(seed)))


@pytest.mark.sanitize
@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [6144, 12288, 49160])
def test_sanitize_staged_rows(kind, dtype, hidden, seed):
    """Aligned rows through the backward's cp.async paths, fwd + bwd: bf16
    6144 and 12288 take the two-row pipe (one CTA; a 2-CTA cluster), fp32
    12288 a staged cluster.  301 rows give the persistent CTAs several
    iterations and leave half of a last pair.  49160 runs the forward's
    staged clusters with a last access that ends inside a CTA's slice
    (bf16: 4 CTAs of 416 threads, the last access 2568 columns in the
    third CTA and none in the fourth)."""
    check(make_inputs(kind, (301, hidden), (hidden,), dtype, "cuda", generator(seed)))


@pytest.mark.sanitize
@kinds
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 7176), (torch.bfloat16, 8192), (torch.bfloat16, 20488),
                                          (torch.bfloat16, 40960), (torch.float32, 4096), (torch.float32, 4104),
                                          (torch.float32, 10248), (torch.float32, 20480)],
                         ids=["bf16-7176", "bf16-8192", "bf16-20488", "bf16-40960", "fp32-4096", "fp32-4104",
                              "fp32-10248", "fp32-20480"])
@pytest.mark.parametrize("offset", [0.0, 8.0])
def test_sanitize_reread_rows(kind, dtype, hidden, offset, seed):
    """The forward that reads its row twice (rows of 16-80 KB, and
    LayerNorm's 16-bit rows from 14 KB: bf16 7176, 256 threads, the last
    walk partial; RMSNorm's stays in registers): CTAs from 256 threads to
    1024 (bf16 40960, fp32 20480: 5 accesses a thread, the last walk
    partial; without weight and bias, which would send those rows to staged
    clusters, reread_max_row); its straight-line variant at two accesses a
    thread (bf16 8192, fp32 4096: 512 threads, reread_exact); rows of mean 8
    (mean^2 > 8 var) take its third walk.  37 rows, fwd + bwd."""
    affine = hidden * dtype.itemsize <= 48 * 1024
    check(make_inputs(kind, (37, hidden), (hidden,), dtype, "cuda", generator(seed), scale=1.0, offset=offset,
                      weight=affine, bias=affine))


@pytest.mark.sanitize
@kinds
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 262144), (torch.float32, 262144),
                                          (torch.bfloat16, 300000)], ids=["bf16-262144", "f32-262144", "bf16-300000"])
def test_sanitize_row_groups(kind, dtype, hidden, seed):
    """Row groups (CTAs that exchange sums through global memory): the
    backward's at bf16 262144 (32 CTAs), both directions' at fp32 262144
    (64 CTAs of 256 threads) and bf16 300000 (37 CTAs, the last partly
    idle; the 16-bit forward at two CTAs an SM); 9 rows give each group
    several (the bf16 300000 forward's 7 groups one or two)."""
    check(make_inputs(kind, (9, hidden), (hidden,), dtype, "cuda", generator(seed)))


@pytest.mark.sanitize
@kinds
def test_sanitize_weight_only_cache(kind, seed):
    """bf16 rows of 49152 with fp32 params: RMSNorm's clusters cache the
    weight alone and stage the next row right after it; 24576 (48 KB) is
    re-read, the weight and bias read as 32-byte fp32 accesses.  301 rows
    give each cluster several."""
    for hidden in (24576, 49152):
        check(make_inputs(kind, (301, hidden), (hidden,), torch.bfloat16, "cuda", generator(seed),
                          param_dtype=torch.float32))


# --- misaligned pointers ----------------------------------------------------------

def _misaligned(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A tensor equal to ``t`` whose data pointer is one element past a 16-byte
    boundary: either contiguous (flat buffer offset by one element) or a
    ``big[..., 1:]`` slice (row stride hidden + 1)."""
    if layout == "contiguous":
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        out = flat[1:].view(t.shape)
    else:
        big = torch.empty(t.shape[:-1] + (t.shape[-1] + 1,), dtype=t.dtype, device=t.device)
        out = big[..., 1:]
    out.copy_(t)
    assert out.data_ptr() % 16 != 0
    return out


@kinds
@dtypes
@pytest.mark.parametrize("hidden", [pytest.param(127, marks=pytest.mark.sanitize), 1, 3, 1023, 4097, 8191])
@pytest.mark.parametrize("layout", ["contiguous", "sliced"])
def test_misaligned_pointers(kind, dtype, hidden, layout, seed):
    """x, grad_out, weight and bias all start off a 16-byte boundary (odd hidden sizes)."""
    inp = make_inputs(kind, (6, hidden), (hidden,), dtype, "cuda", generator(seed))
    inp.x = _misaligned(inp.x, layout)
    inp.grad_out = _misaligned(inp.grad_out, layout)
    inp.weight = _misaligned(inp.weight, "contiguous")
    if inp.bias is not None:
        inp.bias = _misaligned(inp.bias, "contiguous")
    check(inp)


# --- hidden-size and row-count sweeps -------------------------------------------

# 4096-65536 include rows re-read from L1 (sm_90: 16-80 KB, and LayerNorm's
# 16-bit rows from 14 KB: fp32 6144, bf16 12288 and 24576, fp32 12288,
# RMSNorm's fp32 14336 and 16384 and 16-bit 32768, LayerNorm's 16-bit
# 16384), rows re-read by the straight-line pair variant (16-bit 5120, 6144
# and 7168, fp32 4096 and 5120: reread_pair_fits; LayerNorm's 16-bit 7168
# with weight and bias at four accesses a thread), one-CTA register rows
# (RMSNorm's 16-bit 16384) and register clusters that stage the next row
# (bf16 49152 and 65536, fp32 from 24576, LayerNorm's fp32 14336 and 16384
# and 16-bit 32768).
SWEEP_HIDDEN = [1, 2, 3, 31, 32, 33, 127, 256, 384, 768, 1000, 1023, 1024, 1025, 4096, 5120, 6144, 7168, 8191, 12288,
                14336, 16384, 24576, 32768, 49152, 65536, 65537, 131072, 262144]


def _rows_for(hidden):
    return 4 if hidden <= 16384 else 3 if hidden <= 65537 else 2


@kinds
@dtypes
@pytest.mark.parametrize("hidden", SWEEP_HIDDEN)
def test_hidden_size_sweep(kind, dtype, hidden, seed):
    """Every kernel configuration (small / vectorised / multi-pass hidden sizes), fwd + bwd."""
    check(make_inputs(kind, (_rows_for(hidden), hidden), (hidden,), dtype, "cuda", generator(seed)))


@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [20480, 32768, 49152, 49160, 65536, 131072])
def test_long_rows_many_rows_per_cluster(kind, dtype, hidden, seed):
    """Enough rows that each persistent cluster walks several, reusing its
    weight/bias slice (cached in shared memory: 16-bit from 49152, fp32 from
    32768, LayerNorm's 16-bit 32768, and fp32 20480, reread_max_row);
    16-bit 20480 and RMSNorm's 16-bit 32768 are re-read, one CTA a row.
    The backward runs clusters of up to 16 CTAs of 16 elements a thread:
    16-bit 49152 and 65536 and fp32 65536 fill 8 with 384-512
    threads a CTA, fp32 131072 fills 16; 16-bit 131072 takes a row group of
    16 such CTAs (global exchange)."""
    check(make_inputs(kind, (32 * 1024 * 1024 // hidden, hidden), (hidden,), dtype, "cuda", generator(seed)))


def _ticket_rows():
    """25 rows an SM plus 7: staged clusters (at most 3 CTAs an SM) get at
    least kTicketMinRows rows each, so they take row tickets
    (use_row_tickets, launch_plan.h), and end on different rows."""
    return 25 * torch.cuda.get_device_properties(0).multi_processor_count + 7


@pytest.mark.big_memory  # float64 references of ~3300 long rows: several GB
@kinds
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 65536), (torch.float16, 65536), (torch.float32, 32768),
                                          (torch.bfloat16, 49160), (torch.float64, 12288), (torch.float64, 16384)],
                         ids=["bf16-65536", "fp16-65536", "fp32-32768", "bf16-49160", "fp64-12288", "fp64-16384"])
def test_long_rows_from_row_tickets(kind, dtype, hidden, seed):
    """Staged forward clusters with at least 16 rows each take rows past
    their first three from a counter (use_row_tickets, launch_plan.h): 25
    rows an SM (clusters of 2 or more CTAs, at most 3 CTAs an SM) plus 7,
    so that clusters end on different rows; bf16 49160's last access ends
    inside a CTA's slice; fp64 12288 and 16384 are staged clusters of 4
    CTAs (LayerNorm's and RMSNorm's) with double sums (the token rides a reduction of doubles).
    Every row is checked, and the forward is bitwise the same as one
    computed with fewer rows a cluster."""
    rows = _ticket_rows()
    inp = make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", generator(seed))
    res = check(inp)
    tail = dataclasses.replace(inp, x=inp.x[-64:], grad_out=inp.grad_out[-64:])
    assert torch.equal(run_fused(tail, backward=False).y, res.y[-64:])


@pytest.mark.big_memory  # float64 references of ~3300 long rows: several GB
@kinds
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 28672), (torch.float16, 32768), (torch.bfloat16, 40960),
                                          (torch.float32, 16384), (torch.float32, 20480), (torch.bfloat16, 36872)],
                         ids=["bf16-28672", "fp16-32768", "bf16-40960", "fp32-16384", "fp32-20480", "bf16-36872"])
def test_staged_rows_past_reread(kind, dtype, hidden, seed):
    """Rows of 56-80 KB that staged clusters take instead of the re-read
    kernel (reread_max_row, launch_plan.h): LayerNorm's past 48 KB (its
    weight and bias outweigh the row), RMSNorm's past 64 KB (bf16 40960,
    fp32 20480, bf16 36872); RMSNorm's of 56-64 KB (bf16 28672, fp16 32768,
    fp32 16384) stay re-read.  25 rows an SM plus 7 take row tickets;
    bf16 36872 ends inside a CTA's slice.  Every row against float64."""
    rows = _ticket_rows()
    check(make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", generator(seed)))


@pytest.mark.big_memory  # float64 references of ~3300 long rows: several GB
@pytest.mark.parametrize("case", ["mean-10", "bias-only", "fp32-weight"])
def test_row_tickets_other_paths(case, seed):
    """Row tickets (LN bf16 65536, staged clusters, 25 rows an SM plus 7) on
    the paths test_long_rows_from_row_tickets does not take: rows of mean 10
    (the exact second reduction after the one that carries the ticket), the
    bias alone in the cache, and an fp32 weight alone (no shift: the mean's
    reduction carries the ticket and the variance's follows it)."""
    rows = _ticket_rows()
    kw = {"mean-10": dict(scale=1.0, offset=10.0), "bias-only": dict(weight=False),
          "fp32-weight": dict(bias=False, param_dtype=torch.float32)}[case]
    check(make_inputs("ln", (rows, 65536), (65536,), torch.bfloat16, "cuda", generator(seed), **kw))


@kinds
@pytest.mark.parametrize("dtype,hidden", [(torch.bfloat16, 5120), (torch.float16, 7168), (torch.bfloat16, 8192),
                                          (torch.bfloat16, 10240), (torch.bfloat16, 10752), (torch.float32, 2560),
                                          (torch.float32, 5120)],
                         ids=["bf16-5120", "fp16-7168", "bf16-8192", "bf16-10240", "bf16-10752", "fp32-2560",
                              "fp32-5120"])
@pytest.mark.parametrize("offset", [0.0, 8.0])
@pytest.mark.parametrize("affine", [True, False])
def test_pair_reread_rows(kind, dtype, hidden, offset, affine, seed):
    """Rows that two 16-byte accesses a thread cover exactly take the
    re-read kernel's straight-line variant (launch_plan.h, reread_exact):
    CTAs from 320 threads (bf16 5120, fp32 2560) to 672 (bf16 10752), 1027
    rows (one CTA a row), with and without weight and bias; rows of mean 8
    take LayerNorm's third walk; RMSNorm runs its own build (16-bit write
    walks two accesses at once).  LayerNorm's 16-bit 7168 and 10240 with
    weight and bias take four accesses a thread (224 and 320 threads,
    reread_quad_beats_pair).  fwd + bwd."""
    check(make_inputs(kind, (1027, hidden), (hidden,), dtype, "cuda", generator(seed), scale=1.0, offset=offset,
                      weight=affine, bias=affine))


@kinds
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [16384, 24576, 40960, 65536])
def test_long_rows_float32_params(kind, dtype, hidden, seed):
    """16-bit rows with float32 weight (and bias) over many rows: 24576 and
    40960 (80 KB: fp32 parameters keep the re-read kernel up to its limit,
    reread_max_row), and LayerNorm's 16384, are re-read
    (fwd_reread_kernel.cuh; RMSNorm's 16384 too: its fp32 weight outweighs the row, reread_despite_inflight; the
    pair plan takes weights of x's dtype only); at 65536 RMSNorm's clusters cache the
    weight alone (the cache is sized by the arrays it holds) and stage the
    next row beside it, and LayerNorm's weight and bias take a cluster
    without the cache."""
    check(make_inputs(kind, (8 * 1024 * 1024 // hidden, hidden), (hidden,), dtype, "cuda", generator(seed),
                      param_dtype=torch.float32))


@pytest.mark.parametrize("weight,bias", [(True, False), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [32768, 49152, 65536])
def test_layer_norm_one_affine_array_long_rows(weight, bias, dtype, hidden, seed):
    """LayerNorm with the weight or the bias alone (or neither): from 49152
    the forward's cluster cache holds just that array (the bias at the
    cache's start when there is no weight) and stages the next row after
    it, and without either bf16 49152 keeps its row in shared memory (a
    2-CTA cluster); 32768 (bf16) is re-read, one CTA a row."""
    check(make_inputs("ln", (8 * 1024 * 1024 // hidden, hidden), (hidden,), dtype, "cuda", generator(seed),
                      weight=weight, bias=bias))


@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [100000, 200000, 262144, 300000])
@pytest.mark.parametrize("rows", [2, 13])
def test_backward_row_groups(kind, dtype, hidden, rows, seed):
    """Backward rows longer than a 16-CTA cluster: row groups of 25 (200000),
    32 (262144) or 37 (300000) CTAs that exchange the row's sums through
    global memory, and 16-bit 100000 (past 8 CTAs: 13 CTAs of 512 threads,
    the last partly idle); the forward's at fp32 200000 (49 CTAs, the last partly
    idle) and 262144, and at 16-bit 300000.  With 13 rows each group walks
    several (the last ones partial), and the rows' output trails their
    sums."""
    check(make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", generator(seed)))


@kinds
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [262144, 300000])
def test_backward_row_groups_float32_params(kind, dtype, hidden, seed):
    """Row groups with a float32 weight (and bias) on 16-bit rows: the
    backward's at 262144, both directions' at 300000."""
    check(make_inputs(kind, (9, hidden), (hidden,), dtype, "cuda", generator(seed), param_dtype=torch.float32))


@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_row_groups_many_rows_per_group(kind, dtype, seed):
    """200 rows of 300000: each group walks 28 (bf16, 7 groups) to 67 (fp32,
    3 groups of 74 CTAs) rows, cycling its exchange buffers several times,
    in both directions."""
    check(make_inputs(kind, (200, 300000), (300000,), dtype, "cuda", generator(seed)))


@pytest.mark.parametrize("mask", [[True, False, False], [False, True, True], [True, True, False]],
                         ids=["dx", "dw_db", "dx_dw"])
@pytest.mark.parametrize("weight", [False, True])
def test_backward_row_groups_output_mask(mask, weight, seed):
    """Row groups with dx only (no partials), the weight gradients only (no
    exchange at all), and without a weight."""
    hidden = 262144
    inp = make_inputs("ln", (7, hidden), (hidden,), torch.bfloat16, "cuda", generator(seed), weight=weight)
    _, mean, rstd = torch.ops.fused_layernorm.layer_norm_fwd(inp.x, [hidden], inp.weight, inp.bias, inp.eps)
    grads = torch.ops.fused_layernorm.layer_norm_bwd(inp.grad_out, inp.x, [hidden], mean, rstd, inp.weight,
                                                     inp.bias, mask)
    ref = reference(inp)
    expected = [(ref.dx, ref.dx_slack), (ref.dweight, ref.dweight_slack), (ref.dbias, ref.dbias_slack)]
    for name, want, got, (e, slack) in zip(("dx", "dweight", "dbias"), mask, grads, expected):
        if want and e is not None:
            assert_close(got, e, dtype=torch.bfloat16, slack=slack, what=name)
        else:
            assert got is None, name


@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("hidden", [12288, 16384])
def test_float32_rows_without_weight(kind, hidden, seed):
    """fp32 rows of 48 and 64 KB without weight (and bias): one CTA of
    128-byte register threads would keep 96-128 KB in flight an SM, so the
    row is not re-read; it takes one CTA with the row in shared memory."""
    check(make_inputs(kind, (517, hidden), (hidden,), torch.float32, "cuda", generator(seed), weight=False,
                      bias=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [6144, 12288, 20480, 32768, 65536])
@pytest.mark.parametrize("offset", [2.0, 8.0])
def test_layer_norm_shared_memory_rows_off_zero(dtype, hidden, offset, seed):
    """The forward kernels that shift their sums by K = 0: rows re-read from
    L1 (16-80 KB: 16-bit 12288-32768, fp32 6144-20480) and clusters that
    stage the next row in shared memory (16-bit 65536, fp32 32768 and up):
    rows of mean 2 and std 1 keep the one-pass statistics, rows of mean 8
    (mean^2 > 8 var) take the exact pass; both must match."""
    check(make_inputs("ln", (4096 * 1024 // hidden, hidden), (hidden,), dtype, "cuda", generator(seed),
                      scale=1.0, offset=offset))


@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 300000), (torch.bfloat16, 300000)], ids=["f32", "bf16"])
@pytest.mark.parametrize("offset", [8.0, 1000.0])
def test_layer_norm_row_groups_off_zero(dtype, hidden, offset, seed):
    """The row-group forward merges each warp's sum and its squares about
    the warp's own mean (no shifted sums, no second pass): rows of mean 8
    and 1000 and std 1 must match the float64 reference as rows near 0 do.
    17 rows, several a group."""
    check(make_inputs("ln", (17, hidden), (hidden,), dtype, "cuda", generator(seed), scale=1.0, offset=offset))


@pytest.mark.parametrize("kind", ["ln", "rms"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_row_groups_bitwise_deterministic(kind, dtype, seed):
    """Row groups in both directions (fp32 262144; bf16 300000 for the
    forward): y, dx and the weight gradients identical over three runs."""
    hidden = 262144 if dtype == torch.float32 else 300000
    inp = make_inputs(kind, (21, hidden), (hidden,), dtype, "cuda", generator(seed))
    first = run_fused(inp)
    for _ in range(2):
        again = run_fused(inp)
        for name in ("y", "dx", "dweight", "dbias"):
            a, b = getattr(first, name), getattr(again, name)
            assert (a is None and b is None) or torch.equal(a, b), name


@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [256, 1024, 4096, 5120, 6144, pytest.param(12288, marks=pytest.mark.big_memory)])
def test_backward_many_rows_per_cta(kind, dtype, hidden, seed):
    """Each persistent backward CTA walks many rows, loading the next rows while
    it finishes the current one (a second set of registers, or a ring of
    shared-memory stages: 16-bit 4096 and 5120 prefetch into registers, 6144
    and 12288 (a cluster) stage two rows a reduction); an odd row count
    leaves a partial last step, and half of a last pair of rows."""
    check(make_inputs(kind, (8191, hidden), (hidden,), dtype, "cuda", generator(seed)))


@kinds
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
@pytest.mark.parametrize("hidden", [256, 1024, 4096, 6144])
def test_row_count_sweep(kind, dtype, hidden, seed):
    """Odd row counts 1..299: partial row blocks in forward and in the dweight/dbias
    reduction; CTAs with fewer rows than the backward's stages."""
    gen = generator(seed)
    for rows in range(1, 300, 2):
        inp = make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", gen)
        try:
            check(inp)
        except AssertionError as e:
            raise AssertionError(f"rows={rows}: {e}") from None


# --- more than 2^31 elements ------------------------------------------------------

@pytest.fixture
def free_cuda_memory():
    """Release cached blocks before and after (the big test needs ~20 GiB)."""
    gc.collect()
    torch.cuda.empty_cache()
    yield
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.slow
@kinds
def test_more_than_int32_max_elements(kind, seed, free_cuda_memory):
    """(2^31/4096 + 3) x 4096 bf16 = 2^31 + 12288 elements: index arithmetic must be
    64-bit.  Forward and dx are checked on rows sampled around the 2^31 element
    boundary and at the end (the last rows must be written); dweight/dbias
    against a chunked float64 reference over all rows."""
    hidden = 4096
    boundary_row = 2**31 // hidden
    rows = boundary_row + 3
    free, _ = torch.cuda.mem_get_info()
    if free < 20 * 2**30:
        pytest.skip(f"needs ~20 GiB of free GPU memory, {free / 2**30:.1f} GiB free")

    dtype = torch.bfloat16
    g_cuda = torch.Generator(device="cuda")
    g_cuda.manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g_cuda).mul_(2).add_(1)
    grad = torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g_cuda)
    gen = generator(seed)
    w = randn((hidden,), dtype=dtype, device="cuda", gen=gen, scale=0.5, offset=1.0)
    b = randn((hidden,), dtype=dtype, device="cuda", gen=gen, scale=0.5) if kind == "ln" else None

    sample = torch.tensor([0, 1, rows // 3, boundary_row - 1, boundary_row, boundary_row + 1, rows - 2, rows - 1],
                          device="cuda")
    eps = 1e-5 if kind == "ln" else 1e-6
    inp = Inputs(kind, x[sample], (hidden,), w, b, eps, grad[sample])
    ref = reference(inp)

    if kind == "ln":
        y, mean, rstd = ops.layer_norm_fwd(x, [hidden], w, b, eps)
    else:
        y, rstd = ops.rms_norm_fwd(x, [hidden], w, eps)
        mean = None
    assert y.shape == x.shape and rstd.shape == (rows,)
    assert_close(y[sample], ref.y, dtype=dtype, slack=ref.y_slack, what="y (sampled rows)")
    assert_close(rstd[sample], ref.rstd, dtype=torch.float32, slack=ref.rstd_slack, what="rstd (sampled rows)")
    del y

    if kind == "ln":
        dx, dw, db = ops.layer_norm_bwd(grad, x, [hidden], mean, rstd, w, b, [True, True, True])
    else:
        dx, dw = ops.rms_norm_bwd(grad, x, [hidden], rstd, w, [True, True])
        db = None
    assert_close(dx[sample], ref.dx, dtype=dtype, slack=ref.dx_slack, what="dx (sampled rows)")
    del dx

    # dweight / dbias: float64 reference accumulated over row chunks
    dw_ref = torch.zeros(hidden, dtype=torch.float64, device="cuda")
    db_ref = torch.zeros(hidden, dtype=torch.float64, device="cuda")
    abs_sum = torch.zeros(hidden, dtype=torch.float64, device="cuda")
    gabs_sum = torch.zeros(hidden, dtype=torch.float64, device="cuda")
    for start in range(0, rows, 16384):
        xc = x[start : start + 16384].double()
        gc = grad[start : start + 16384].double()
        if kind == "ln":
            mu = xc.mean(-1, keepdim=True)
            r = torch.rsqrt((xc - mu).square().mean(-1, keepdim=True) + eps)
            xhat = (xc - mu) * r
        else:
            r = torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps)
            xhat = xc * r
        cond = r * xc.abs().amax(-1, keepdim=True)
        dw_ref += (gc * xhat).sum(0)
        db_ref += gc.sum(0)
        abs_sum += (gc.abs() * (xhat.abs() + cond)).sum(0)
        gabs_sum += gc.abs().sum(0)
        del xc, gc, xhat
    u = unit_roundoff(dtype)
    assert_close(dw, dw_ref, dtype=dtype, slack=u * (growth(rows) + growth(hidden)) * abs_sum, what="dweight")
    if kind == "ln":
        assert_close(db, db_ref, dtype=dtype, slack=u * growth(rows) * gabs_sum, what="dbias")


# --- CUDA graphs --------------------------------------------------------------------

def _raw_fwd_bwd(kind, x, w, b, g, hidden):
    if kind == "ln":
        y, mean, rstd = ops.layer_norm_fwd(x, [hidden], w, b, 1e-5)
        grads = ops.layer_norm_bwd(g, x, [hidden], mean, rstd, w, b, [True, True, True])
        return (y, mean, rstd) + tuple(grads)
    y, rstd = ops.rms_norm_fwd(x, [hidden], w, 1e-6)
    return (y, rstd) + tuple(ops.rms_norm_bwd(g, x, [hidden], rstd, w, [True, True]))


@kinds
@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 1536), (torch.bfloat16, 1536), (torch.bfloat16, 65536)],
                         ids=["fp32-1536", "bf16-1536", "bf16-65536"])
def test_cuda_graph_capture_and_replay_raw_ops(kind, dtype, hidden, seed):
    """fwd + bwd ops captured in a CUDA graph; replays on new data equal eager
    (bitwise).  At 65536, 25 rows an SM plus 7, the forward's staged
    clusters take row tickets: each replay must zero the counter again (the
    memset is a node of the graph), or the clusters would find it past the
    rows and leave them unwritten."""
    rows = 333 if hidden == 1536 else _ticket_rows()
    gen = generator(seed)
    inp = make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", gen)
    x, w, b, g = inp.x.clone(), inp.weight.clone(), None if inp.bias is None else inp.bias.clone(), inp.grad_out.clone()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            _raw_fwd_bwd(kind, x, w, b, g, hidden)
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _raw_fwd_bwd(kind, x, w, b, g, hidden)

    for trial in range(3):
        new = make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", gen)
        x.copy_(new.x)
        g.copy_(new.grad_out)
        w.copy_(new.weight)
        if b is not None:
            b.copy_(new.bias)
        graph.replay()
        eager = _raw_fwd_bwd(kind, x, w, b, g, hidden)
        torch.cuda.synchronize()
        for i, (a, e) in enumerate(zip(static_out, eager)):
            torch.testing.assert_close(a, e, rtol=0, atol=0, msg=lambda m: f"trial {trial}, output {i}: {m}")


@kinds
def test_cuda_graph_make_graphed_callables_module(kind, seed):
    """A fused module graphed with make_graphed_callables (autograd op in forward and
    backward graphs) gives the eager module's output and gradients."""
    hidden = 768
    gen = generator(seed)
    mod = (fl.FusedLayerNorm if kind == "ln" else fl.FusedRMSNorm)(hidden, device="cuda")
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(randn(p.shape, dtype=p.dtype, device="cuda", gen=gen, scale=0.5, offset=1.0))
    eager_mod = copy.deepcopy(mod)
    sample = torch.randn(64, hidden, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(mod, (sample,))

    for _ in range(2):
        x = randn((64, hidden), dtype=torch.float32, device="cuda", gen=gen, scale=2.0, offset=1.0)
        g = randn((64, hidden), dtype=torch.float32, device="cuda", gen=gen)
        outs = []
        for m in (graphed, eager_mod):
            for p in list(mod.parameters()) + list(eager_mod.parameters()):
                p.grad = None
            xl = x.clone().requires_grad_()
            y = m(xl)
            y.backward(g)
            params = mod.parameters() if m is graphed else eager_mod.parameters()
            outs.append([y.detach().clone(), xl.grad.clone()] + [p.grad.clone() for p in params])
        for a, e in zip(*outs):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


# --- devices and streams --------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs at least 2 CUDA devices")
@kinds
@pytest.mark.parametrize("data_device,current_device", [(0, 1), (1, 0)], ids=["data0-current1", "data1-current0"])
def test_tensor_on_non_current_device(kind, data_device, current_device, seed):
    """Kernels must run on the tensors' device, not the current one."""
    with torch.cuda.device(current_device):
        inp = make_inputs(kind, (37, 1000), (1000,), torch.float32, f"cuda:{data_device}", generator(seed))
        res = run_fused(inp)
        torch.cuda.synchronize(data_device)
    for t in (res.y, res.dx, res.dweight):
        assert t.device == torch.device("cuda", data_device)
    check_result(inp, res, reference(inp))


@kinds
def test_side_stream(kind, seed):
    """Ops issued on a non-default stream are ordered on that stream."""
    inp = make_inputs(kind, (512, 2048), (2048,), torch.float32, "cuda", generator(seed))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        res = run_fused(inp)
        ref = reference(inp)  # torch ops on the same stream
        check_result(inp, res, ref)


# --- determinism at scale ------------------------------------------------------------

@kinds
@pytest.mark.parametrize("rows,hidden", [(20000, 1024), (500, 65536), (45, 262144)],
                         ids=["20000x1024", "500x65536", "45x262144"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_name)
def test_backward_bitwise_deterministic_many_rows(kind, rows, hidden, dtype, seed):
    """dweight/dbias (and y, dx) are bitwise identical over three runs."""
    inp = make_inputs(kind, (rows, hidden), (hidden,), dtype, "cuda", generator(seed))
    first = run_fused(inp)
    for run in range(1, 3):
        again = run_fused(inp)
        for name in ("y", "dx", "dweight", "dbias"):
            a, b = getattr(first, name), getattr(again, name)
            if a is not None:
                assert torch.equal(a, b), f"{name} differs between run 0 and run {run}"


def test_first_call_of_each_op_inside_graph_capture():
    """In a fresh process, each op's very first call is captured in a CUDA graph (its launch
    then queries the occupancy and sets kernel attributes for the first time): the capture
    succeeds and the replay gives the eager result, bit for bit."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(fl.__file__)))
    code = """
import torch, fused_layernorm as fl
torch.manual_seed(0)
x = torch.randn(64, 8192, device="cuda", dtype=torch.bfloat16)
r, w, b = torch.randn_like(x), torch.randn(8192, device="cuda", dtype=torch.bfloat16), None
q = torch.randn(2, 8, 64, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(2, 2, 64, 128, device="cuda", dtype=torch.bfloat16)
cos = torch.randn(1, 64, 128, device="cuda", dtype=torch.bfloat16)
sin = torch.randn_like(cos)
calls = {
    "layer_norm": lambda: fl.layer_norm(x, (8192,), w, b),
    "rms_norm residual": lambda: fl.rms_norm(x, (8192,), w, residual=r, return_residual=True),
    "rope": lambda: fl.apply_rotary_pos_emb(q, k, cos, sin),
    "softmax": lambda: fl.softmax(x.float()),
}
for name, call in calls.items():
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = call()
    g.replay()
    torch.cuda.synchronize()
    ref = call()
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert all(torch.equal(a, e) for a, e in zip(outs, refs)), name
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
