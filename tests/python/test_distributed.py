"""torch.distributed: DDP, FSDP2 (fully_shard), DTensor and sequence parallelism.

Each test spawns 2 processes once and runs a group of checks in them, each
against a reference: gloo on CPU; NCCL on 2 GPUs (rank r on cuda:r, so the
kernels also run off cuda:0), skipped with fewer.  Run them alone with
``python -m pytest tests/python/test_distributed.py``.

* DDP: a small model of FusedLayerNorm/FusedRMSNorm (plain and residual forms)
  and a stock model after ``patch`` train as the stock model does, with the
  gradients of one process on the whole batch.
* FSDP2: 20 steps of the fused model under ``fully_shard`` give the losses of
  the stock model under ``fully_shard`` and of one process; a
  torch.distributed.checkpoint save loads into a model of one process.
* DTensor: the ops on inputs sharded on a leading dim return the input's
  placement, match the op on the full tensor, communicate nothing (forward and
  backward), and return weight gradients as Partial sums.
* Sequence parallel: a block under ``parallelize_module`` (SequenceParallel
  norms, Colwise/Rowwise linears, a fused residual norm) matches the block in
  one process, outputs, gradients and an optimizer step.
"""
import copy
import os
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import fused_layernorm as fl

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

WORLD = 2
DIM = 16
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.device_count() < WORLD,
                                                  reason="needs 2 CUDA GPUs (NCCL); the gloo/CPU variant ran")),
]


# --------------------------------------------------------------------------
# The harness: one spawn of WORLD processes per test.
# --------------------------------------------------------------------------

def _worker(rank, group, device, store, args):
    torch.set_num_threads(1)  # two processes share the machine's cores
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=120))
    try:
        _GROUPS[group](rank, dev, *args)
        if dist.is_initialized():
            dist.barrier()  # both ranks past their last collective before either tears down
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # Every check passed: leave without the interpreter's teardown, where a spawned gloo
    # process of the DTensor group aborted now and then ("terminate called without an active
    # exception", no Python frame; about 1 run in 14 on 2 CPU cores).  A failure above still
    # raises and reaches the parent through mp.spawn.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(group, device, tmp_path, *args):
    # A failure in either process raises here with that process's traceback.
    mp.spawn(_worker, args=(group, device, str(tmp_path / "store"), args), nprocs=WORLD, join=True)


def _log_losses(test, dev, step, losses):
    """With FLN_DIST_LOSSES=<file>, rank 0 appends each step's losses there (a JSON line)."""
    path = os.environ.get("FLN_DIST_LOSSES")
    if path and dist.get_rank() == 0:
        import json
        with open(path, "a") as f:
            f.write(json.dumps(dict(test=test, device=str(dev), step=step,
                                    **{k: float(v) for k, v in losses.items()})) + "\n")


def _close(actual, expected, what, **tol):
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)


# --------------------------------------------------------------------------
# The model of the DDP and FSDP2 tests: every norm form the modules have.
# --------------------------------------------------------------------------

class TinyModel(nn.Module):
    """inp -> LN (plain) -> mlp -> RMSNorm(x, residual) -> mlp -> LN(x, residual) -> RMSNorm -> head.
    ``fused``: FusedLayerNorm/FusedRMSNorm and their residual form; else the nn
    modules, with the residual added before the norm."""

    def __init__(self, fused: bool):
        super().__init__()
        LN, RMS = (fl.FusedLayerNorm, fl.FusedRMSNorm) if fused else (nn.LayerNorm, nn.RMSNorm)
        self.fused = fused
        self.inp = nn.Linear(DIM, DIM)
        self.norm0, self.norm1, self.norm2, self.norm3 = LN(DIM), RMS(DIM, eps=1e-6), LN(DIM), RMS(DIM, eps=1e-6)
        self.mlp0 = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.mlp1 = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.head = nn.Linear(DIM, 4)
        with torch.no_grad():  # weights and biases away from 1 and 0, so their gradients matter
            for norm in (self.norm0, self.norm1, self.norm2, self.norm3):
                norm.weight.uniform_(0.5, 1.5)
                if getattr(norm, "bias", None) is not None:
                    norm.bias.uniform_(-0.5, 0.5)

    def _add_norm(self, norm, x, r):
        if self.fused:
            return norm(x, r)
        h = x + r
        return norm(h), h

    def forward(self, x):
        r = self.inp(x)
        y, r = self._add_norm(self.norm1, self.mlp0(self.norm0(r)), r)
        y, r = self._add_norm(self.norm2, self.mlp1(y), r)
        return self.head(self.norm3(y))


def _models(dev):
    torch.manual_seed(0)
    stock = TinyModel(fused=False).to(dev)
    fused = TinyModel(fused=True).to(dev)
    fused.load_state_dict(stock.state_dict())
    return stock, fused


def _batches(dev, steps, rows):
    """(inputs, targets) of every step, the same on every rank; rank r takes rows [r*rows, (r+1)*rows)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(steps, WORLD * rows, 3, DIM, generator=g)
    t = torch.randn(steps, WORLD * rows, 3, 4, generator=g)
    return x.to(dev), t.to(dev)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------
# DDP
# --------------------------------------------------------------------------

def _check_off_current_device(dev):
    """The kernels run on their tensors' device whatever the current device is (Apex's
    LayerNorm gave wrong output off cuda:0)."""
    g = torch.Generator().manual_seed(4)
    x, r, w, b = (t.to(dev).requires_grad_() for t in (torch.randn(8, DIM, generator=g), torch.randn(8, DIM, generator=g),
                                                      torch.randn(DIM, generator=g), torch.randn(DIM, generator=g)))
    with torch.cuda.device((dev.index + 1) % torch.cuda.device_count()):
        y = fl.layer_norm(x, [DIM], w, b)
        z, h = fl.rms_norm(x, [DIM], w, eps=1e-6, residual=r, return_residual=True)
        got = torch.autograd.grad((y.sum() + z.sum() + h.sum()), (x, r, w, b))
    y_ref = F.layer_norm(x, [DIM], w, b)
    h_ref = x + r
    z_ref = F.rms_norm(h_ref, [DIM], w, eps=1e-6)
    expected = torch.autograd.grad((y_ref.sum() + z_ref.sum() + h_ref.sum()), (x, r, w, b))
    for name, a, e in zip(("y", "z", "h") + ("dx", "dr", "dw", "db"), (y, z, h) + got, (y_ref, z_ref, h_ref) + expected):
        _close(a, e, f"{name} on {dev} with current device cuda:{torch.cuda.current_device()}", rtol=1e-4, atol=1e-5)


def _check_ddp(rank, dev):
    from torch.nn.parallel import DistributedDataParallel as DDP

    if dev.type == "cuda":
        _check_off_current_device(dev)

    stock, fused = _models(dev)
    patched = copy.deepcopy(stock)
    report = fl.patch(patched)
    assert sum(isinstance(m, (fl.FusedLayerNorm, fl.FusedRMSNorm)) for m in patched.modules()) == 4, report
    single = copy.deepcopy(fused)  # one process on the whole batch: the gradients DDP must average to
    names = ("stock", "fused", "patched")
    ddp = {k: DDP(m, device_ids=[dev.index] if dev.type == "cuda" else None)
           for k, m in zip(names, (stock, fused, patched))}
    models = dict(ddp, single=single)
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.1) for k, m in models.items()}
    rows = 4
    xs, ts = _batches(dev, 3, rows)
    mine = slice(rank * rows, (rank + 1) * rows)
    for step in range(3):
        losses, grads = {}, {}
        for k, m in models.items():
            x, t = (xs[step], ts[step]) if k == "single" else (xs[step][mine], ts[step][mine])
            opts[k].zero_grad()
            loss = F.mse_loss(m(x), t)
            loss.backward()
            losses[k] = loss.detach()
            grads[k] = {n.removeprefix("module."): g for n, g in _grads(m).items()}
        _log_losses("ddp", dev, step, losses)
        for k in ("fused", "patched"):
            _close(losses[k], losses["stock"], f"step {step}: {k} loss against nn's", rtol=1e-5, atol=1e-6)
        for k in ("stock", "fused", "patched"):
            for n, g in grads[k].items():
                _close(g, grads["single"][n], f"step {step}: {k} DDP grad of {n} against one process",
                       rtol=1e-4, atol=1e-5)
        for o in opts.values():
            o.step()


@pytest.mark.parametrize("device", DEVICES)
def test_ddp(device, tmp_path):
    _spawn("ddp", device, tmp_path)


# --------------------------------------------------------------------------
# FSDP2 and torch.distributed.checkpoint
# --------------------------------------------------------------------------

def _check_fsdp(rank, dev, ckpt):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(dev.type, (WORLD,))
    stock, fused = _models(dev)
    single = copy.deepcopy(fused)
    for m in (stock, fused):
        for child in m.children():
            fully_shard(child, mesh=mesh)
        fully_shard(m, mesh=mesh)
    assert isinstance(fused.norm1.weight, torch.distributed.tensor.DTensor)  # the norms' parameters are sharded
    models = {"stock": stock, "fused": fused, "single": single}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-2) for k, m in models.items()}
    steps, rows = 20, 2
    xs, ts = _batches(dev, steps, rows)
    mine = slice(rank * rows, (rank + 1) * rows)
    for step in range(steps):
        losses = {}
        for k, m in models.items():
            x, t = (xs[step], ts[step]) if k == "single" else (xs[step][mine], ts[step][mine])
            opts[k].zero_grad()
            loss = F.mse_loss(m(x), t)
            loss.backward()
            opts[k].step()
            losses[k] = loss.detach()
        _close(losses["fused"], losses["stock"], f"step {step}: fused loss against nn's under fully_shard",
               rtol=1e-4, atol=1e-5)
        mean = losses["fused"].clone()
        dist.all_reduce(mean)
        _log_losses("fsdp2", dev, step, dict(losses, fused_mean_over_ranks=mean / WORLD))
        _close(mean / WORLD, losses["single"], f"step {step}: fully_shard loss against one process",
               rtol=1e-4, atol=1e-5)

    # Save the sharded state dict with DCP, then load it into a model of one process.
    dcp.save(get_model_state_dict(fused), checkpoint_id=ckpt)
    full = get_model_state_dict(fused, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    probe = xs[0][:rows]
    with torch.no_grad():
        out = fused(probe).detach().cpu()
    dist.barrier()
    dist.destroy_process_group()  # what follows is one process's work, without a process group
    if rank != 0:
        return
    plain = TinyModel(fused=True).to(dev)
    state = plain.state_dict()
    dcp.load(state, checkpoint_id=ckpt)
    plain.load_state_dict(state)
    assert set(state) == set(full)
    for n, v in plain.state_dict().items():
        torch.testing.assert_close(v.cpu(), full[n], rtol=0, atol=0, msg=lambda m: f"loaded {n}: {m}")
    with torch.no_grad():
        _close(plain(probe).cpu(), out, "loaded model's output against the fully_shard model's", rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_fsdp2(device, tmp_path):
    _spawn("fsdp", device, tmp_path, str(tmp_path / "ckpt"))


# --------------------------------------------------------------------------
# DTensor: the ops on sharded inputs, and sequence parallelism
# --------------------------------------------------------------------------

def _check_dtensor_ops(rank, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh(dev.type, (WORLD,))
    g = torch.Generator().manual_seed(2)
    shape = (4, 5, DIM)  # Shard(1) splits 5 rows unevenly: 3 and 2
    x, r, gy, gh = (torch.randn(shape, generator=g).to(dev) for _ in range(4))
    w, b = (torch.randn(DIM, generator=g).to(dev) for _ in range(2))

    def call(kind, x, w, b, residual):
        if kind == "ln":
            return fl.layer_norm(x, [DIM], w, b, residual=residual, return_residual=residual is not None)
        return fl.rms_norm(x, [DIM], w, residual=residual, return_residual=residual is not None)

    def leaf(t, placement):
        return distribute_tensor(t, mesh, [placement]).requires_grad_()

    for kind in ("ln", "rms"):
        for fused in (False, True):
            # The reference: the same op on the full tensors, in this process.
            ref_in = [t.clone().requires_grad_() for t in (x, w, b, r)]
            out = call(kind, ref_in[0], ref_in[1], ref_in[2] if kind == "ln" else None,
                       ref_in[3] if fused else None)
            ref_out = out if fused else (out,)
            torch.autograd.backward(ref_out, (gy, gh)[:len(ref_out)])
            for placement in (Shard(0), Shard(1), Replicate()):
                what = f"{kind} {'residual ' if fused else ''}{placement}"
                dx, dr = leaf(x, placement), leaf(r, placement)
                dw, db = leaf(w, Replicate()), leaf(b, Replicate())
                grads = [distribute_tensor(t, mesh, [placement]) for t in (gy, gh)]
                leaves = [("x", dx, ref_in[0]), ("weight", dw, ref_in[1])]
                leaves += [("bias", db, ref_in[2])] if kind == "ln" else []
                leaves += [("residual", dr, ref_in[3])] if fused else []
                # autograd.grad rather than backward: AccumulateGrad copies a gradient that two
                # leaves share (dx is also the residual's) into new_empty_strided, which DTensor
                # replicates for an uneven shard, a gather outside the ops.
                with CommDebugMode() as comm:
                    out = call(kind, dx, dw, db if kind == "ln" else None, dr if fused else None)
                    outs = out if fused else (out,)
                    got = torch.autograd.grad(outs, [t for _, t, _ in leaves], grads[:len(outs)])
                assert comm.get_total_counts() == 0, f"{what}: communication {dict(comm.get_comm_counts())}"
                for name, o, e in zip(("y", "h"), outs, ref_out):
                    assert isinstance(o, DTensor) and o.placements == (placement,), f"{what}: {name} {o.placements}"
                    _close(o.full_tensor(), e, f"{what}: {name}")
                wgrad = Partial("sum") if placement.is_shard() else Replicate()
                for (name, _, e), grad in zip(leaves, got):
                    expected = wgrad if name in ("weight", "bias") else placement
                    assert grad.placements == (expected,), f"{what}: grad of {name} is {grad.placements}"
                    _close(grad.full_tensor(), e.grad, f"{what}: grad of {name}")
                # Without autograd (no_grad), DTensor sees layer_norm/rms_norm/add_norm themselves.
                with torch.no_grad(), CommDebugMode() as comm:
                    out = call(kind, dx, dw, db if kind == "ln" else None, dr if fused else None)
                assert comm.get_total_counts() == 0, f"{what}, no_grad: communication"
                for o, e in zip(out if fused else (out,), ref_out):
                    assert o.placements == (placement,)
                    _close(o.full_tensor(), e.detach(), f"{what}, no_grad")

    # Regression: a backward from h alone (y unused) made its zero grad_out with at::zeros, a
    # plain tensor, which DTensor refused next to the DTensor h ("got mixed torch.Tensor and DTensor").
    dx, dr = leaf(x, Shard(1)), leaf(r, Shard(1))
    _, h = fl.rms_norm(dx, [DIM], residual=dr, return_residual=True)
    gx, gr = torch.autograd.grad(h, [dx, dr], distribute_tensor(gh, mesh, [Shard(1)]))
    _close(gx.full_tensor(), gh, "backward from h alone: grad of x")  # h = x + residual
    _close(gr.full_tensor(), gh, "backward from h alone: grad of residual")

    # normalized_shape is part of DTensor's cache key: the same Shard(1) input normalized over
    # its last dim (local), then over its last two dims (the shard dim: redistributed first).
    for ns in ([DIM], [5, DIM], [DIM]):
        y = fl.layer_norm(distribute_tensor(x, mesh, [Shard(1)]), ns)
        _close(y.full_tensor(), fl.layer_norm(x, ns), f"Shard(1), normalized_shape {ns}")

    # An input sharded on the normalized dim: DTensor redistributes it; the values are right.
    y = fl.rms_norm(distribute_tensor(x, mesh, [Shard(2)]), [DIM], distribute_tensor(w, mesh, [Replicate()]))
    _close(y.full_tensor(), fl.rms_norm(x, [DIM], w), "Shard(2) input")

    # Dropout. Replicated: every rank draws the mask this process draws from the same seed.
    torch.manual_seed(7)
    y, h = fl.layer_norm(distribute_tensor(x, mesh, [Replicate()]), [DIM], residual=distribute_tensor(r, mesh, [Replicate()]),
                         dropout_p=0.5, return_residual=True)
    torch.manual_seed(7)
    y_ref, h_ref = fl.layer_norm(x, [DIM], residual=r, dropout_p=0.5, return_residual=True)
    _close(h.to_local(), h_ref, "dropout, Replicate: h")
    _close(y.to_local(), y_ref, "dropout, Replicate: y")
    # Sharded: refused, since every shard would draw the same mask.
    try:
        fl.rms_norm(distribute_tensor(x, mesh, [Shard(1)]), [DIM], residual=distribute_tensor(r, mesh, [Shard(1)]),
                    dropout_p=0.5)
    except NotImplementedError as e:
        assert "dropout_p > 0 on a sharded DTensor" in str(e), str(e)
    else:
        raise AssertionError("dropout on a sharded DTensor was not refused")


def _check_sequence_parallel(rank, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    class Block(nn.Module):
        """y = norm1(x); d = down(gelu(up(y))); (out, h) = norm2(d, residual=x)."""

        def __init__(self):
            super().__init__()
            self.norm1 = fl.FusedRMSNorm(DIM, eps=1e-6)
            self.up = nn.Linear(DIM, 4 * DIM)
            self.down = nn.Linear(4 * DIM, DIM)
            self.norm2 = fl.FusedLayerNorm(DIM)
            with torch.no_grad():
                self.norm1.weight.uniform_(0.5, 1.5)
                self.norm2.weight.uniform_(0.5, 1.5)
                self.norm2.bias.uniform_(-0.5, 0.5)

        def forward(self, x):
            return self.norm2(self.down(F.gelu(self.up(self.norm1(x)))), x)

    mesh = init_device_mesh(dev.type, (WORLD,))
    torch.manual_seed(0)
    single = Block().to(dev)
    block = copy.deepcopy(single)
    parallelize_module(block, mesh, {
        "norm1": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    })
    # SequenceParallel hands a module its first input only; the residual norm
    # gets its two sequence-sharded DTensors as they are, its parameters replicated.
    distribute_module(block.norm2, mesh)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (single, block)]
    g = torch.Generator().manual_seed(3)
    x, gy, gh = (torch.randn(2, 6, DIM, generator=g).to(dev) for _ in range(3))
    for step in range(2):
        y_ref, h_ref = single(x)
        torch.autograd.backward((y_ref, h_ref), (gy, gh))
        xd = distribute_tensor(x, mesh, [Shard(1)])
        with CommDebugMode() as comm:
            y1 = block.norm1(xd)
        assert comm.get_total_counts() == 0 and y1.placements == (Shard(1),), "norm1 under SequenceParallel"
        y, h = block(xd)
        assert y.placements == (Shard(1),) and h.placements == (Shard(1),), (y.placements, h.placements)
        _close(y.full_tensor(), y_ref, f"step {step}: sequence parallel y", rtol=1e-5, atol=1e-5)
        _close(h.full_tensor(), h_ref, f"step {step}: sequence parallel h", rtol=1e-5, atol=1e-5)
        torch.autograd.backward((y, h), (distribute_tensor(gy, mesh, [Shard(1)]), distribute_tensor(gh, mesh, [Shard(1)])))
        ref_grads = dict(single.named_parameters())
        for n, p in block.named_parameters():
            _close(p.grad.full_tensor(), ref_grads[n].grad, f"step {step}: sequence parallel grad of {n}",
                   rtol=1e-4, atol=1e-5)
        for o in opts:  # the step applies the reduced Partial gradients of the norm weights
            o.step()
            o.zero_grad()


@pytest.mark.parametrize("device", DEVICES)
def test_dtensor(device, tmp_path):
    _spawn("dtensor", device, tmp_path)


def _check_dtensor(rank, dev):
    _check_dtensor_ops(rank, dev)
    _check_sequence_parallel(rank, dev)


_GROUPS = {"ddp": _check_ddp, "fsdp": _check_fsdp, "dtensor": _check_dtensor}
