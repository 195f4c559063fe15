"""The ring collectives written from sends and receives (kernels/collectives.py) against
torch.distributed's own, on N processes of this machine (runtime.run_ranks, gloo), and what
run_ranks reports when a rank raises or the ranks hang."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import runtime
from kernels import collectives as coll

SIZES = (0, 1, 3, 7, 1000, 4099)  # fewer values than ranks, a prime, more than a chunk each


def _inputs(rank: int, world: int, n: int, dtype):
    """Each rank's x: integers in float64 (every order of the sum is exact), random in float32."""
    g = torch.Generator().manual_seed(1000 * world + 17 * rank + n)
    if dtype == torch.float64:
        return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)
    return torch.randn(n, generator=g, dtype=dtype)


def _against_torch(rank, world, dtype):
    out = []
    for n in SIZES:
        x = _inputs(rank, world, n, dtype)
        want = x.clone()
        dist.all_reduce(want)
        got = coll.ring_all_reduce(x.clone(), rank, world)
        # the halves alone: the owned chunk after the reduce-scatter is already the sum
        half = x.clone()
        owned = coll.ring_reduce_scatter(half, rank, world)
        a, b = coll.chunk_bounds(n, world)[owned]
        out.append((n, got, want, half[a:b], want[a:b]))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_ring_matches_torch_all_reduce(world, dtype):
    for rank, rows in enumerate(runtime.run_ranks(_against_torch, world, dtype, timeout_s=60)):
        for n, got, want, chunk, chunk_want in rows:
            if dtype == torch.float64:  # integers: exact whatever the order of the additions
                assert torch.equal(got, want), (world, rank, n)
                assert torch.equal(chunk, chunk_want), (world, rank, n)
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * world)
                torch.testing.assert_close(chunk, chunk_want, rtol=1e-5, atol=1e-5 * world)


def test_chunk_bounds_cover_awkward_sizes():
    assert coll.chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert coll.chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    for n in range(0, 40):
        for world in range(1, 6):
            b = coll.chunk_bounds(n, world)
            assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(world - 1))
            sizes = [s1 - s0 for s0, s1 in b]
            assert max(sizes) - min(sizes) <= 1


def test_bus_bandwidth_is_nccl_tests_convention():
    # 1 GB in 10 ms on 4 ranks: algbw 100 GB/s, busbw 150 GB/s
    assert coll.bus_bandwidth(10**9, 0.01, 4) == pytest.approx(1.5e11)
    assert coll.bus_bandwidth(10**9, 0.01, 1) == 0.0


def _bad_input(rank, world, what):
    x = {"int": torch.arange(4), "strided": torch.zeros(8)[::2], "list": [1.0, 2.0]}[what]
    return coll.ring_all_reduce(x, rank, world)


@pytest.mark.parametrize("what,error", [("int", "float32 or float64"), ("strided", "contiguous"),
                                        ("list", "torch.Tensor")])
def test_bad_input_is_a_clear_error_from_the_rank(what, error):
    with pytest.raises(runtime.RankError, match=error) as e:
        runtime.run_ranks(_bad_input, 2, what, timeout_s=30)
    assert e.value.rank in (0, 1)


def _raises_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("rank one's own mistake")
    return rank


def test_an_exception_names_its_rank():
    with pytest.raises(runtime.RankError, match=r"rank 1 raised ValueError: rank one's own mistake") as e:
        runtime.run_ranks(_raises_on_rank_one, 3, timeout_s=30)
    assert e.value.rank == 1 and "Traceback" in str(e.value)


def _off_by_one(rank, world):
    # each rank sends to rank + 2 but receives from rank - 1: the ranks disagree on the ring
    x, buf = torch.ones(4), torch.empty(4)
    s = dist.isend(x, (rank + 2) % world)
    r = dist.irecv(buf, (rank - 1) % world)
    r.wait()
    s.wait()
    return buf


def _one_rank_never_sends(rank, world):
    buf = torch.empty(3)
    if rank == 0:
        dist.recv(buf, 1)  # rank 1 sends nothing
    return rank


def test_a_hang_says_who_waits_on_whom():
    with pytest.raises(runtime.RankTimeout) as e:
        runtime.run_ranks(_one_rank_never_sends, 2, timeout_s=2)
    msg = str(e.value)
    assert "rank 0 waits to receive 3 values from rank 1" in msg
    assert "rank 1 finished without sending to rank 0" in msg
    assert set(e.value.waits) == {0}


def test_an_off_by_one_ring_hangs_and_is_named():
    with pytest.raises(runtime.RankTimeout) as e:
        runtime.run_ranks(_off_by_one, 4, timeout_s=20, stall_s=0.5)
    msg = str(e.value)
    assert "rank 1 waits to receive 4 values from rank 0" in msg
    assert "rank 1 waits to receive from rank 0, but rank 0 sent to rank 2: the ranks do not agree" in msg, msg


def _receive_first(rank, world):
    # a blocking receive before the send on every rank: nobody ever sends
    x, buf = torch.ones(5), torch.empty(5)
    dist.recv(buf, (rank - 1) % world)
    dist.send(x, (rank + 1) % world)


def test_receiving_before_sending_on_every_rank_is_named():
    with pytest.raises(runtime.RankTimeout, match="neither has posted its send"):
        runtime.run_ranks(_receive_first, 3, timeout_s=20, stall_s=0.5)


def test_run_ranks_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="positive int"):
        runtime.run_ranks(_raises_on_rank_one, 0)
    with pytest.raises(ValueError, match="gloo"):
        runtime.run_ranks(_raises_on_rank_one, 2, backend="mpi")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="NCCL needs NVIDIA GPUs"):
            runtime.run_ranks(_raises_on_rank_one, 1, backend="nccl")


def _nccl_one_rank(rank, world):
    x = torch.arange(10, dtype=torch.float32, device="cuda")
    return coll.ring_all_reduce(x, rank, world), torch.cuda.current_device()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL runs on GPUs")
def test_the_ring_on_nccl_with_one_rank():
    (x, device), = runtime.run_ranks(_nccl_one_rank, 1, backend="nccl", timeout_s=120)
    assert torch.equal(x, torch.arange(10, dtype=torch.float32)) and device == 0


def test_the_collectives_bandwidthmark_checks_then_times_on_gloo(tmp_path):
    import json

    from benchmarks.lessons import collectives_bandwidth
    assert collectives_bandwidth.sizes(4096, 2**30)[:3] == [4096, 16384, 65536]
    rc = collectives_bandwidth.main(["--backend", "gloo", "--world", "2", "--max-bytes", "16384", "--iters", "2",
                                 "--reps", "1", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "cpu-collectives-gloo-2.json").read_text())
    assert {(r["op"], r["bytes"]) for r in data["rows"]} == {(op, b) for op in collectives_bandwidth.OPS
                                                            for b in (4096, 16384)}
    assert all(r["us"] > 0 and r["busbw_gbps"] > 0 for r in data["rows"])
    assert (tmp_path / "cpu-collectives-gloo-2.png").stat().st_size > 0


def _blocking_sends(rank, world):
    x, buf = torch.ones(1000), torch.empty(1000)
    dist.send(x, (rank + 1) % world)
    dist.recv(buf, (rank - 1) % world)


def test_a_deadlock_is_given_up_early_with_stall_s():
    import time
    t = time.monotonic()
    with pytest.raises(runtime.RankTimeout, match="every rank waits in a blocking send"):
        runtime.run_ranks(_blocking_sends, 3, timeout_s=60, stall_s=0.5)
    assert time.monotonic() - t < 20
    with pytest.raises(ValueError, match="stall_s"):
        runtime.run_ranks(_blocking_sends, 2, stall_s=0)


def _size_mismatch(rank, world):
    # rank 0 receives 2 values where rank 1 sends 3: gloo aborts rank 0's process
    if rank == 0:
        dist.recv(torch.empty(2), 1)
    else:
        dist.send(torch.ones(3), 0)


def test_a_rank_killed_by_gloo_is_named_with_its_last_words():
    with pytest.raises(runtime.RankError) as e:
        runtime.run_ranks(_size_mismatch, 2, timeout_s=30, stall_s=2)
    assert e.value.rank == 0 and "died" in str(e.value), str(e.value)
    assert "size" in str(e.value)


def test_the_graders_accept_the_course_ring(capsys):
    import utils
    utils.check_reduce_scatter(coll.ring_reduce_scatter, seed=3)
    utils.check_all_gather(coll.ring_all_gather, seed=3)
    utils.check_all_reduce(coll.ring_all_reduce, seed=3)
    out = capsys.readouterr().out
    assert out.count("correct at world 2, 3, 4") == 3, out
    with pytest.raises(TypeError, match="expects your function"):
        utils.check_all_reduce("ring")


def _through_the_process_group(x, rank, world):
    dist.group.WORLD.allreduce([x]).wait()  # no dist.all_reduce in sight
    return x


def _functional(x, rank, world):
    import torch.distributed._functional_collectives as fc
    x.copy_(fc.all_reduce(x, "sum", dist.group.WORLD))
    return x


@pytest.mark.parametrize("cheat, op", [(_through_the_process_group, r"c10d::allreduce_"),
                                       (_functional, r"_c10d_functional::all_reduce")])
def test_every_way_to_a_collective_is_refused(cheat, op):
    import utils
    with pytest.raises(utils.GradingError, match=rf"called torch\.distributed\.all_reduce \({op}\)"):
        utils.check_all_reduce(cheat, seed=5)
