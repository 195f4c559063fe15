// C = A @ B^T on Hopper by CUTLASS 4.2's SM90 GEMM (lesson 12): the kernel CUTLASS builds from
// CuTe's collectives, timed beside the course's ladder (hopper.cu) and cuBLAS. bfloat16 A (M, K)
// and B (N, K), both K-major (CUTLASS's "TN": A row-major, B column-major as a K x N matrix),
// float32 sums, bfloat16 C (M, N) row-major.
//
// Variants (`variant` of cutlass_gemm):
//   0  cooperative: a producer warpgroup (TMA) and two consumer warpgroups on one 128 x 256 x 64
//      tile, a persistent tile scheduler, stages as many as shared memory holds, TMA epilogue
//   1  0 in clusters of 2 x 1 blocks: the two blocks of a cluster share their tile of B, which
//      TMA multicasts into both blocks' shared memory (each block loads half of it)
//
// CUTLASS's kernels are built by nvcc alone (host code that encodes the tensor maps, device code
// of inline PTX); the course's emulator runs hopper.h's functions, not CUTLASS's PTX, so this
// file runs on a Hopper GPU only. Its layouts are lesson 12's CuTe section, on a laptop.
//
// The entry points are extern "C" (called through ctypes by kernels/cuda/hopper.py):
//   cutlass_gemm(variant, a_ptr, b_ptr, c_ptr, M, N, K, ldc, sm_count, stream, error, error_len)
//   cutlass_gemm_workspace(variant, M, N, K, sm_count)
#include <cstdio>
#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

template <int CLUSTER_M>
struct Sm90Gemm {
    using Element = cutlass::bfloat16_t;
    static constexpr int ALIGN = 128 / cutlass::sizeof_bits<Element>::value;  // 8: rows 16 bytes apart
    using TileShape = Shape<_128, _256, _64>;
    using ClusterShape = Shape<Int<CLUSTER_M>, _1, _1>;
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float,
        void, cutlass::layout::RowMajor, ALIGN,            // no C read: D = A B^T
        Element, cutlass::layout::RowMajor, ALIGN,
        cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
        Element, cutlass::layout::RowMajor, ALIGN,          // A (M, K), K contiguous
        Element, cutlass::layout::ColumnMajor, ALIGN,       // B as K x N, column-major: (N, K) stored
        float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                        cutlass::gemm::PersistentScheduler>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

    static typename Gemm::Arguments arguments(const void* a_ptr, const void* b_ptr, void* c_ptr, int M, int N,
                                              int K, long long ldc, int sm_count) {
        auto stride_a = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, {M, K, 1});
        auto stride_b = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, {N, K, 1});
        auto stride_c = cutlass::make_cute_packed_stride(typename Kernel::StrideC{}, {M, N, 1});
        auto stride_d = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, {M, N, 1});
        get<0>(stride_d) = ldc;  // C's rows may be padded to 16 bytes
        cutlass::KernelHardwareInfo hw;
        cudaGetDevice(&hw.device_id);
        hw.sm_count = sm_count;
        typename Gemm::Arguments args{
            cutlass::gemm::GemmUniversalMode::kGemm,
            {M, N, K, 1},
            {static_cast<const Element*>(a_ptr), stride_a, static_cast<const Element*>(b_ptr), stride_b},
            {{1.0f, 0.0f}, nullptr, stride_c, static_cast<Element*>(c_ptr), stride_d},
            hw};
        return args;
    }
};

namespace {

template <class G>
int run(const void* a_ptr, const void* b_ptr, void* c_ptr, int M, int N, int K, long long ldc, int sm_count,
        void* workspace, cudaStream_t stream, char* error, int error_len) {
    typename G::Gemm gemm;
    auto args = G::arguments(a_ptr, b_ptr, c_ptr, M, N, K, ldc, sm_count);
    const char* step = "can_implement (the problem's sizes or alignment)";
    cutlass::Status status = gemm.can_implement(args);
    if (status == cutlass::Status::kSuccess) {
        step = "initialize";
        status = gemm.initialize(args, workspace, stream);
    }
    if (status == cutlass::Status::kSuccess) {
        step = "run";
        status = gemm.run(stream);
    }
    if (status != cutlass::Status::kSuccess) {
        cudaError_t err = cudaGetLastError();
        snprintf(error, error_len, "%s: %s%s%s", step, cutlassGetStatusString(status),
                 err == cudaSuccess ? "" : ": ", err == cudaSuccess ? "" : cudaGetErrorString(err));
        return 1;
    }
    return 0;
}

template <class G>
size_t workspace(int M, int N, int K, int sm_count) {
    return G::Gemm::get_workspace_size(G::arguments(nullptr, nullptr, nullptr, M, N, K, N, sm_count));
}

}  // namespace

extern "C" int cutlass_gemm(int variant, const void* a_ptr, const void* b_ptr, void* c_ptr, int M, int N, int K,
                            long long ldc, int sm_count, void* workspace, void* stream, char* error,
                            int error_len) {
    auto s = static_cast<cudaStream_t>(stream);
    switch (variant) {
        case 0: return run<Sm90Gemm<1>>(a_ptr, b_ptr, c_ptr, M, N, K, ldc, sm_count, workspace, s, error, error_len);
        case 1: return run<Sm90Gemm<2>>(a_ptr, b_ptr, c_ptr, M, N, K, ldc, sm_count, workspace, s, error, error_len);
    }
    snprintf(error, error_len, "no variant %d (0: cooperative, 1: cooperative in 2 x 1 clusters)", variant);
    return 1;
}

extern "C" size_t cutlass_gemm_workspace(int variant, int M, int N, int K, int sm_count) {
    return variant == 1 ? workspace<Sm90Gemm<2>>(M, N, K, sm_count) : workspace<Sm90Gemm<1>>(M, N, K, sm_count);
}
