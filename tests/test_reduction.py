"""Sum and row-max launchers in every language and version: float64 references on awkward
sizes, exact cases, edge cases, input checks, determinism, and the race of lesson 04."""
import pytest
import torch

import kernels
import utils

LANGS = kernels.LANGUAGES
# Versions marked "demo only" (CUDA C++ v0, the data race) are wrong on purpose.
ALL_VERSIONS = [(lang, name) for lang in LANGS for name, desc in kernels.versions("reduction", lang)
                if "demo only" not in desc]
# Around a warp (32), a block (64 in Numba's simulation, 256 CUDA C++ and on a GPU, 1024
# Triton), a float4 (4) and several blocks. Numba runs one Python thread per CUDA thread
# in simulation, so its one-thread-per-element versions get the shorter list there.
SIZES = [1, 3, 7, 31, 33, 255, 257, 1023, 1025, 4099]
SIZES_NUMBA_SIM = [1, 7, 33, 65, 257, 1025]
# Wrong devices: a tensor the kernels cannot read.
OTHER_DEVICE = "meta" if utils.SIMULATE else "cpu"


def sizes_for(lang):
    return SIZES_NUMBA_SIM if (lang == "numba" and utils.SIMULATE) else SIZES


def assert_sum(got, x):
    """float32 sums of n terms may differ from the float64 sum by about n*eps*sum|x| in
    the worst case; a right kernel is far inside this, a lost block or element far outside."""
    assert isinstance(got, torch.Tensor) and got.dim() == 0, f"expected a 0-d tensor, got {got!r}"
    assert got.dtype == torch.float32 and got.device.type == utils.DEVICE.type
    ref = utils.topic("reduction").reference(x).item()
    scale = x.double().abs().sum().item()
    assert abs(got.item() - ref) <= 1e-5 * scale + 1e-6, f"sum {got.item()} vs float64 {ref} (n={x.numel()})"


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_sum_matches_float64_on_awkward_sizes(lang, version):
    fn = kernels.get("reduction", lang, version)
    for n in sizes_for(lang):
        x = torch.randn(n, device=utils.DEVICE)
        assert_sum(fn(x), x)


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_sum_exact_cases(lang, version):
    """Sums of ones and of small integers are exact in float32: any lost element shows."""
    fn = kernels.get("reduction", lang, version)
    n = sizes_for(lang)[-1]
    assert fn(torch.ones(n, device=utils.DEVICE)).item() == n
    x = torch.arange(n, device=utils.DEVICE, dtype=torch.float32) % 7 - 3  # negatives too
    assert fn(x).item() == x.double().sum().item()
    # All negative: a kernel that starts its accumulator anywhere but 0 is caught.
    assert fn(-torch.ones(5, device=utils.DEVICE)).item() == -5


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_sum_edge_cases(lang, version):
    fn = kernels.get("reduction", lang, version)
    empty = fn(torch.empty(0, device=utils.DEVICE))
    assert empty.dim() == 0 and empty.item() == 0.0  # as torch.sum
    assert fn(torch.empty(3, 0, device=utils.DEVICE)).item() == 0.0
    x = torch.randn(37, 29, device=utils.DEVICE)
    assert_sum(fn(x), x)  # any shape: all elements
    assert_sum(fn(x.t()), x)  # non-contiguous: same sum
    big = torch.randn(1031, device=utils.DEVICE)
    assert_sum(fn(big[1:]), big[1:])  # starts 4 bytes into its storage: not 16-byte aligned
    assert_sum(fn(big[::2]), big[::2])  # strided
    assert_sum(fn(torch.tensor(2.5, device=utils.DEVICE)), torch.tensor(2.5))  # 0-d


@pytest.mark.parametrize("lang,version", ALL_VERSIONS)
def test_sum_rejects_bad_input(lang, version):
    fn = kernels.get("reduction", lang, version)
    with pytest.raises(TypeError, match="float32"):
        fn(torch.ones(8, dtype=torch.float64, device=utils.DEVICE))
    with pytest.raises(TypeError, match="float32"):
        fn(torch.ones(8, dtype=torch.int32, device=utils.DEVICE))
    with pytest.raises(ValueError, match="utils.DEVICE"):
        fn(torch.ones(8, device=OTHER_DEVICE))
    with pytest.raises(TypeError):
        fn([1.0, 2.0])


@pytest.mark.parametrize("lang", LANGS)
def test_reference_sum_is_deterministic(lang):
    """The reference versions use two passes, no atomics: the same bits on every run."""
    mod = kernels.module("reduction", lang)
    assert "deterministic" in mod.VERSIONS[mod.REFERENCE][0] and "non-" not in mod.VERSIONS[mod.REFERENCE][0]
    x = torch.randn(sizes_for(lang)[-1], device=utils.DEVICE) * 1000
    first = kernels.get("reduction", lang)(x).item()
    for _ in range(3):
        assert kernels.get("reduction", lang)(x).item() == first


@pytest.mark.parametrize("lang", LANGS)
def test_versions_are_listed_naive_to_best(lang):
    mod = kernels.module("reduction", lang)
    assert mod.REFERENCE in mod.VERSIONS and list(mod.VERSIONS)[-1] == mod.REFERENCE
    assert "demo only" not in mod.VERSIONS[mod.REFERENCE][0]
    for name, (desc, fn) in mod.VERSIONS.items():
        assert callable(fn) and desc and "\n" not in desc
        assert ("deterministic" in desc), f"{lang} {name}: say whether it is deterministic"
    assert mod.sum is mod.VERSIONS[mod.REFERENCE][1]


# --------------------------------------------------------------------------------------
# row_max
ROW_SHAPES = [(1, 1), (7, 3), (19, 37), (5, 257), (3, 1100), (2, 4099)]


@pytest.mark.parametrize("lang", LANGS)
def test_row_max(lang):
    row_max = kernels.module("reduction", lang).row_max
    for shape in ROW_SHAPES:
        x = torch.randn(shape, device=utils.DEVICE) - 10  # all negative: 0 is never the max
        got = row_max(x)
        assert got.shape == (shape[0],) and got.dtype == torch.float32
        assert torch.equal(got, x.amax(dim=1)), f"row max wrong for shape {shape}"
    x = torch.randn(6, 50, device=utils.DEVICE)
    x[2, 49] = 1e30  # the last column, the tail of the row
    x[4, 0] = float("inf")
    assert torch.equal(row_max(x), x.amax(dim=1))
    assert torch.equal(row_max(x.t()), x.t().amax(dim=1))  # non-contiguous


@pytest.mark.parametrize("lang", LANGS)
def test_row_max_edge_cases(lang):
    row_max = kernels.module("reduction", lang).row_max
    assert row_max(torch.empty(0, 5, device=utils.DEVICE)).shape == (0,)
    got = row_max(torch.empty(3, 0, device=utils.DEVICE))
    assert got.shape == (3,) and bool((got == float("-inf")).all())  # the identity of max
    with pytest.raises(ValueError, match="2-D"):
        row_max(torch.ones(8, device=utils.DEVICE))
    with pytest.raises(TypeError, match="float32"):
        row_max(torch.ones(2, 8, dtype=torch.float16, device=utils.DEVICE))
    with pytest.raises(ValueError, match="utils.DEVICE"):
        row_max(torch.ones(2, 8, device=OTHER_DEVICE))


# --------------------------------------------------------------------------------------
# The race of lesson 04 (CUDA C++).
def test_racy_lockstep_sum_loses_additions():
    """Loading out[0] for a whole warp before any lane stores loses additions anywhere."""
    from kernels.cuda import reduction
    n = 1024
    got = reduction.sum_racy_lockstep(torch.ones(n, device=utils.DEVICE)).item()
    assert got < n, f"the race should lose additions, got {got} of {n}"
    assert got >= 1  # some additions land: a race, not a kernel that does nothing
    assert reduction.sum_atomic(torch.ones(n, device=utils.DEVICE)).item() == n


def test_racy_version_is_marked_demo_only():
    """The benchmark skips versions whose description says "demo only"."""
    from kernels.cuda import reduction
    description, launcher = reduction.VERSIONS["v0"]
    assert launcher is reduction.sum_racy and "demo only" in description


# --------------------------------------------------------------------------------------
# The grader rejects the wrong reductions lesson 04 warns about.
NO_BARRIER_SRC = r'''
__global__ void sum_no_barrier_kernel(const float* x_ptr, float* out_ptr, int n) {
    extern __shared__ float sdata[];
    unsigned int t = threadIdx.x;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    sdata[t] = (i < n) ? x_ptr[i] : 0.0f;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sdata[t] += sdata[t + s];   // no barrier after the step
    }
    if (t == 0) atomicAdd(out_ptr, sdata[0]);
}
'''


@pytest.mark.skipif(not utils.SIMULATE, reason="a GPU may or may not expose the race in a given run")
def test_grader_rejects_missing_barrier():
    k = utils.cuda_kernel(NO_BARRIER_SRC, "sum_no_barrier_kernel")

    def fn(x):
        out = torch.zeros((), device=x.device)
        k[(x.numel() + 255) // 256, 256, 256 * 4](x, out, x.numel())
        return out

    with pytest.raises(utils.GradingError, match="race|__syncthreads"):
        utils.check_sum(fn)


def test_grader_rejects_first_block_only():
    from kernels.triton import reduction as red

    def first_block_only(x):
        blocks = (x.numel() + red.BLOCK_SIZE - 1) // red.BLOCK_SIZE
        partials = torch.empty(blocks, device=x.device)
        red.sum_partials_kernel[(blocks,)](x, partials, x.numel(), BLOCK_SIZE=red.BLOCK_SIZE)
        return partials[0].clone()  # forgets the other blocks' partial sums

    with pytest.raises(utils.GradingError, match="check_sum failed"):
        utils.check_sum(first_block_only)
