// common.h: the one prelude shared by the course's CUDA C++ sources.
//
//   #include "common.h"
//
// works in every source of the course: kernels compiled by utils.cuda_kernel (NVRTC on a
// GPU, the CPU emulator otherwise), load_inline extensions and the setup.py project.
#pragma once

// Ceiling division: how many blocks of `b` threads cover `a` elements.
// cdiv(1000, 256) == 4: the last block is only partly used, so kernels still check `i < n`.
// Two type parameters so that cdiv(x.numel(), 256) (int64_t and int) works.
template <class A, class B>
__host__ __device__ constexpr auto cdiv(A a, B b) -> decltype((a + b - 1) / b) { return (a + b - 1) / b; }

// CUDA_CHECK(call): host code only. Throws (Python sees a RuntimeError) with the error's
// name and the line if a CUDA runtime call fails; an abort() would kill the notebook. A
// kernel launch returns nothing, so check it with CUDA_CHECK(cudaGetLastError()).
#define CUDA_CHECK(call)                                                                   \
    do {                                                                                   \
        cudaError_t course_err_ = (call);                                                  \
        if (course_err_ != cudaSuccess)                                                    \
            throw std::runtime_error(std::string("CUDA error ") +                          \
                                     cudaGetErrorName(course_err_) + " at " __FILE__ ":" + \
                                     std::to_string(__LINE__) + ": " +                     \
                                     cudaGetErrorString(course_err_));                     \
    } while (0)

// CHECK_INPUT(x): for host code that takes torch tensors (load_inline, setup.py). The
// tensor must live on the course's device and be contiguous (kernels index raw memory).
// The course's device is the GPU on a GPU and the CPU in emulation, so use this in place
// of TORCH_CHECK(x.is_cuda()): the same source then runs in both modes.
#ifdef COURSE_CUDA_EMULATOR
#define COURSE_ON_DEVICE(x) ((x).is_cpu())
#define COURSE_DEVICE_NAME "CPU (emulation)"
#else
#define COURSE_ON_DEVICE(x) ((x).is_cuda())
#define COURSE_DEVICE_NAME "CUDA"
#endif
#define CHECK_INPUT(x)                                                                     \
    do {                                                                                   \
        TORCH_CHECK(COURSE_ON_DEVICE(x), #x " must be a " COURSE_DEVICE_NAME " tensor"); \
        TORCH_CHECK((x).is_contiguous(), #x " must be contiguous");                        \
    } while (0)
