"""Data parallelism written from scratch (kernels/data_parallel.py) against torch's own, on N
processes of this machine (runtime.run_ranks, gloo): BucketedDDP against
torch.nn.parallel.DistributedDataParallel (bit for bit at two ranks), its buckets and their
overlap with the backward, ZeroAdamW against torch.optim.AdamW on the averaged gradient, and the
errors of bad input.

Each world runs once (a module fixture) and returns everything its ranks measured; the tests
read their part of it."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import runtime
from kernels.data_parallel import MB, BucketedDDP, ZeroAdamW
from utils.gpt import GPT, GPTConfig

# gloo's ranks are forked, and CUDA does not survive a fork: with a GPU in the parent, torch's
# optimizers query the CUDA stream in the rank (a graph-capture check) and fail. On GPUs the
# same code runs on NCCL, spawned (the run on several GPUs).
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="gloo ranks are forked; CUDA does not survive a "
                                                                   "fork, and torch's optimizers query it")

TINY_GPT = GPTConfig(vocab_size=32, block_size=8, n_layer=1, n_head=2, n_embd=16)
STEPS = 3


class MLP(nn.Module):
    """Awkward sizes (174 trained values, a prime-ish mess), a frozen parameter, a buffer and,
    with ``extra``, a layer the forward never uses."""

    def __init__(self, seed: int, extra: bool = False):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.fc1, self.fc2, self.fc3 = nn.Linear(7, 13), nn.Linear(13, 13), nn.Linear(13, 5)
        self.scale = nn.Parameter(torch.rand(13, generator=g) + 0.5, requires_grad=False)
        self.register_buffer("shift", torch.randn(7, generator=g))
        if extra:
            self.unused = nn.Linear(3, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def forward(self, x, y):
        h = torch.tanh(self.fc1(x + self.shift)) * self.scale
        out = self.fc3(torch.tanh(self.fc2(h)))
        return out, nn.functional.mse_loss(out, y)


def _mlp_batches(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(6, 7, generator=g), torch.randn(6, 5, generator=g)) for _ in range(STEPS)]


def _gpt_batches(rank: int):
    g = torch.Generator().manual_seed(200 + rank)
    ids = [torch.randint(TINY_GPT.vocab_size, (4, TINY_GPT.block_size + 1), generator=g) for _ in range(STEPS)]
    return [(t[:, :-1], t[:, 1:]) for t in ids]


def _train(model, params, batches):
    """A few AdamW steps; the losses and the final parameters."""
    opt = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in params]


def _ours_and_torchs(make, batches, rank, **ours):
    """The same model (each rank initialised differently: the wrappers copy rank 0's) trained
    under BucketedDDP and under torch's DDP."""
    m1 = make(rank)
    a = _train(BucketedDDP(m1, **ours), list(m1.parameters()), batches)
    m2 = make(rank)
    b = _train(nn.parallel.DistributedDataParallel(m2), list(m2.parameters()), batches)
    return a, b


# ZeroAdamW's synthetic problem: 43 values (prime: no world divides it) in two groups
SHAPES = [(5, 3), (11,), (1,), (4, 4)]


def _zero_grads(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _zero_adamw(rank, world):
    init = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(SHAPES)]
    ours = [t.clone() for t in init]
    ref = [t.clone().requires_grad_(True) for t in init]
    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8)
    opt = ZeroAdamW([{"params": ours[:2], "weight_decay": 0.1}, {"params": ours[2:], "weight_decay": 0.0}], **hyper)
    ref_opt = torch.optim.AdamW([{"params": ref[:2], "weight_decay": 0.1}, {"params": ref[2:], "weight_decay": 0.0}],
                                foreach=False, **hyper)
    for step in range(STEPS):
        for p, g in zip(ours, _zero_grads(step, rank)):
            p.grad = g
        opt.step()
        every = [_zero_grads(step, r) for r in range(world)]  # the reference averages all ranks' on its own
        for i, p in enumerate(ref):
            p.grad = sum(every[r][i] * (1.0 / world) for r in range(world))
        ref_opt.step()
    return dict(params=ours, ref=[p.detach() for p in ref], state_bytes=opt.state_bytes(), shard=opt.shard,
                numel=opt.numel)


def _world2(rank, world):
    out = {}
    out["gpt"] = _ours_and_torchs(lambda r: GPT(TINY_GPT, seed=r), _gpt_batches(rank), rank)
    out["mlp"] = _ours_and_torchs(MLP, _mlp_batches(rank), rank, bucket_mb=300 / MB)
    m = MLP(rank)
    out["ring"] = _train(BucketedDDP(m, bucket_mb=300 / MB, ring=True), list(m.parameters()), _mlp_batches(rank))
    # the buckets and the order of events in one backward
    m = MLP(rank)
    ddp = BucketedDDP(m, bucket_mb=300 / MB)
    ddp(*_mlp_batches(rank)[0])[1].backward()
    out["buckets"] = [b.names for b in ddp.buckets]
    out["events"] = list(ddp.events)
    out["frozen"] = m.scale.detach().clone()
    # a layer the forward never uses: an error naming it, or zeros
    m = MLP(rank, extra=True)
    ddp = BucketedDDP(m)
    try:
        ddp(*_mlp_batches(rank)[0])[1].backward()
        out["unused_error"] = None
    except RuntimeError as e:
        out["unused_error"] = str(e)
    ddp = BucketedDDP(MLP(rank, extra=True), unused="zeros")
    ddp(*_mlp_batches(rank)[0])[1].backward()
    out["unused_zeros"] = ddp.module.unused.weight.grad
    # ranks that wrap different models
    try:
        BucketedDDP(nn.Linear(3, 3 + rank))
        out["mismatch"] = None
    except ValueError as e:
        out["mismatch"] = str(e)
    out["zero"] = _zero_adamw(rank, world)
    return out


def _world3(rank, world):
    out = {"mlp": _ours_and_torchs(MLP, _mlp_batches(rank), rank)}
    m = MLP(rank)
    out["ring"] = _train(BucketedDDP(m, bucket_mb=300 / MB, ring=True), list(m.parameters()), _mlp_batches(rank))
    out["zero"] = _zero_adamw(rank, world)
    return out


@pytest.fixture(scope="module", autouse=True)
def optimizers_imported():
    """torch's first optimizer imports torch._dynamo (about a second): here, once, so that the
    forked ranks inherit it instead of each paying for it."""
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])


@pytest.fixture(scope="module")
def world2():
    return runtime.run_ranks(_world2, 2, timeout_s=120)


@pytest.fixture(scope="module")
def world3():
    return runtime.run_ranks(_world3, 3, timeout_s=120)


# --------------------------------------------------------------------------------------
# BucketedDDP against torch's DDP
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_two_ranks_train_bit_for_bit_as_torch_ddp(world2, model):
    for rank, out in enumerate(world2):
        (losses, params), (want_losses, want_params) = out[model]
        assert all(torch.equal(a, b) for a, b in zip(losses, want_losses)), (rank, losses, want_losses)
        assert all(torch.equal(a, b) for a, b in zip(params, want_params)), rank
        # every rank holds the same model (rank 0's, broadcast at construction, then the same steps)
        assert all(torch.equal(a, b) for a, b in zip(params, world2[0][model][0][1]))
    # the ranks' own batches: their losses differ
    assert not torch.equal(world2[0]["gpt"][0][0][0], world2[1]["gpt"][0][0][0])


def test_the_ring_option_sums_as_all_reduce_does(world2):
    for out in world2:  # two values: a + b == b + a, so equal bits here too
        (losses, params), (want_losses, want_params) = out["ring"], out["mlp"][1]
        assert all(torch.equal(a, b) for a, b in zip(losses, want_losses))
        assert all(torch.equal(a, b) for a, b in zip(params, want_params))


def test_three_ranks_agree_with_torch_ddp_and_the_ring(world3):
    for rank, out in enumerate(world3):
        (losses, params), (want_losses, want_params) = out["mlp"]
        ring_losses, ring_params = out["ring"]
        for got in (losses, ring_losses):
            torch.testing.assert_close(torch.stack(got), torch.stack(want_losses), rtol=1e-5, atol=1e-6)
        for got in (params, ring_params):
            for a, b in zip(got, want_params):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert all(torch.equal(a, b) for a, b in zip(params, world3[0]["mlp"][0][1])), rank


# --------------------------------------------------------------------------------------
# Buckets and overlap
# --------------------------------------------------------------------------------------
def test_buckets_take_the_parameters_in_reverse_and_skip_frozen_ones(world2):
    buckets = world2[0]["buckets"]
    # 300 bytes a bucket: fc3 and fc2.bias (332 B), fc2.weight (676 B), fc1 (416 B)
    assert buckets == [["fc3.bias", "fc3.weight", "fc2.bias"], ["fc2.weight"], ["fc1.bias", "fc1.weight"]]
    assert all("scale" not in names for names in buckets)
    assert torch.equal(world2[0]["frozen"], world2[1]["frozen"])  # frozen: still rank 0's everywhere


def test_a_bucket_is_launched_while_the_backward_still_runs(world2):
    for out in world2:
        events = out["events"]
        first_launch = events.index(("launch", 0))
        later = [name for kind, name in events[first_launch:] if kind == "ready"]
        assert "fc1.weight" in later, events  # bucket 0 was on the wire before fc1's gradient existed
        launches = [e[1] for e in events if e[0] == "launch"]
        assert launches == [0, 1, 2]
        assert events.index(("launch", 2)) < events.index(("wait", 0)), events  # waits only at the end


def test_an_unused_parameter_is_named_or_counts_as_zero(world2):
    for out in world2:
        assert "unused.weight" in out["unused_error"] and "unused='zeros'" in out["unused_error"]
        assert torch.equal(out["unused_zeros"], torch.zeros(3, 3))


def test_ranks_that_wrap_different_models_are_told(world2):
    for out in world2:
        assert out["mismatch"] is not None and "different models" in out["mismatch"]


# --------------------------------------------------------------------------------------
# ZeroAdamW
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3])
def test_zero_adamw_matches_torch_adamw_on_the_averaged_gradient(world, world2, world3):
    outs = [o["zero"] for o in (world2 if world == 2 else world3)]
    numel = sum(torch.Size(s).numel() for s in SHAPES)
    for out in outs:
        for a, b in zip(out["params"], out["ref"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        lo, hi = out["shard"]
        assert out["state_bytes"] == 8 * (hi - lo) and out["numel"] == numel
    assert sum(o["state_bytes"] for o in outs) == 8 * numel     # plain DDP + AdamW: 8 * numel on each rank
    assert sorted(o["shard"] for o in outs)[0][0] == 0 and max(o["shard"][1] for o in outs) == numel


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------
def test_bad_input_is_told_clearly():
    assert not dist.is_initialized()
    with pytest.raises(TypeError, match="torch.nn.Module"):
        BucketedDDP(torch.ones(3))
    for bad in (0, -1.0, float("nan"), True, "25"):
        with pytest.raises(ValueError, match="bucket_mb must be a number > 0"):
            BucketedDDP(nn.Linear(2, 2), bucket_mb=bad)
    with pytest.raises(ValueError, match="unused must be"):
        BucketedDDP(nn.Linear(2, 2), unused="ignore")
    with pytest.raises(ValueError, match="no parameter that requires a gradient"):
        BucketedDDP(nn.Linear(2, 2).requires_grad_(False))
    with pytest.raises(RuntimeError, match="no process group is initialised"):
        BucketedDDP(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="got one tensor"):
        ZeroAdamW(torch.ones(3))
    with pytest.raises(ValueError, match="no parameters"):
        ZeroAdamW([])
    with pytest.raises(TypeError, match="float32"):
        ZeroAdamW([torch.ones(3, dtype=torch.float64)])
    with pytest.raises(ValueError, match="backend must be one of"):
        ZeroAdamW([torch.ones(3)], backend="torch")
    with pytest.raises(RuntimeError, match="no process group is initialised"):
        ZeroAdamW([torch.ones(3)])


def test_the_step_time_script_checks_then_times(tmp_path):
    import json

    from benchmarks.lessons import ddp_step_time
    rc = ddp_step_time.main(["--world", "2", "--steps", "2", "--warmup", "1", "--layers", "1", "--embd", "16",
                             "--heads", "2", "--vocab", "32", "--seq", "8", "--batch", "2", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "cpu-ddp-step-time.json").read_text())
    assert data["losses_equal"] and data["ratio"] > 0 and len(data["step_ms"]["torch DDP"]) == 2
    state = data["state_bytes"]
    assert state["ddp_adamw_per_rank"] == [8 * data["params"]] * 2      # every rank: all of AdamW's state
    assert sum(state["zero_adamw_per_rank"]) == 8 * data["params"]      # ZeRO-1: split over the ranks


def test_the_scaling_script_checks_the_losses_then_times_every_mode_on_gloo(tmp_path):
    import json

    from benchmarks.lessons import ddp_scaling
    rc = ddp_scaling.main(["--backend", "gloo", "--world", "2", "--tiny", "--steps", "2", "--warmup", "1",
                           "--bucket-mb", "0.01", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "cpu-ddp-scaling-gloo-2.json").read_text())
    modes = data["modes"]
    assert set(modes) == set(ddp_scaling.MODES)
    for name, m in modes.items():
        assert len(m["losses"]) == 3 and len(m["step_ms"]) == 2 and m["tokens_per_s"] > 0, name
        assert m["losses_agree"], (name, m["loss_rel_diff_vs_single"])
    # every mode starts from the same weights and the same global batch: the same first loss
    assert len({round(m["losses"][0], 5) for m in modes.values()}) == 1
    p = modes["single"]["params"]
    assert modes["torch"]["state_bytes_per_rank"] == [8 * p, 8 * p]
    assert sum(modes["zero"]["state_bytes_per_rank"]) == 8 * p
    assert modes["ours"]["world"] == 2 and "vs_torch_ddp" in modes["ours"]
    assert (tmp_path / "cpu-ddp-scaling-gloo-2.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        ddp_scaling.main(["--backend", "gloo", "--modes", "fastest"])
