// The GPU half of the extension: the kernels, and the host functions that launch them.
//
// nvcc compiles this file. It splits it in two: the __global__ functions become GPU code
// (PTX, then SASS for each architecture in TORCH_CUDA_ARCH_LIST), everything else is host
// C++ that nvcc hands to g++. Both halves end up in one object file, relu_kernel.o.
//
// <cuda_runtime.h> ships with the CUDA toolkit, in $CUDA_HOME/include. nvcc puts that
// folder on the include path by itself (it even includes the header implicitly), and
// CUDAExtension adds it for the .cpp files too: if it is "not found", the toolkit is
// missing or CUDA_HOME points at the wrong place.
#include <cuda_runtime.h>
#include <ATen/cuda/CUDAContext.h>   // at::cuda::getCurrentCUDAStream
#include <c10/cuda/CUDAException.h>  // C10_CUDA_KERNEL_LAUNCH_CHECK

// One thread per element. T is float or double: relu.cpp picks it from the tensor's dtype.
template <typename T>
__global__ void relu_kernel(const T* __restrict__ x, T* __restrict__ y, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {                       // the last block may run past the end
        T v = x[idx];
        y[idx] = v > T(0) ? v : T(0);
    }
}

// dL/dx = dL/dy where x > 0, else 0.
template <typename T>
__global__ void relu_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ x,
                                     T* __restrict__ grad_in, int n) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) {
        grad_in[idx] = x[idx] > T(0) ? grad_out[idx] : T(0);
    }
}

// Host functions, called from relu.cpp. A launch is asynchronous: it queues the kernel and
// returns at once. C10_CUDA_KERNEL_LAUNCH_CHECK asks the runtime whether the launch itself
// was accepted (a bad grid or block size fails here) and throws a C++ exception that
// PyTorch turns into a Python RuntimeError. Errors inside the running kernel surface later,
// at the next synchronising call.
//
// Each launch goes on PyTorch's current stream (the 4th <<<>>> argument), not the legacy
// default stream that `<<<blocks, threads>>>` alone uses: under `with torch.cuda.stream(s)`,
// in a CUDA graph, or next to other work on a side stream, the op is then ordered with the
// kernels around it, as every built-in op is.
template <typename T>
void relu_cuda_launcher(const T* x, T* y, int n) {
    const int threads = 256;                          // threads per block
    const int blocks = (n + threads - 1) / threads;   // enough blocks to cover n
    relu_kernel<T><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(x, y, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void relu_backward_cuda_launcher(const T* grad_out, const T* x, T* grad_in, int n) {
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;
    relu_backward_kernel<T><<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        grad_out, x, grad_in, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// relu.cpp only sees the declarations: these lines make nvcc emit the float and double
// versions into relu_kernel.o, where the linker finds them.
template void relu_cuda_launcher<float>(const float*, float*, int);
template void relu_cuda_launcher<double>(const double*, double*, int);
template void relu_backward_cuda_launcher<float>(const float*, const float*, float*, int);
template void relu_backward_cuda_launcher<double>(const double*, const double*, double*, int);
