// The C++ half of the extension: torch::Tensor in, torch::Tensor out, and the bindings
// that make the functions callable from Python.
//
// g++ compiles this file (it holds no GPU code). The launchers it calls are defined in
// relu_kernel.cu; the linker joins relu.o and relu_kernel.o into one shared library.
#include <torch/extension.h>

#include <limits>
#include <string>

static void append(std::string& out, const char* s) { out += s; }
static void append(std::string& out, int64_t v) { out += std::to_string(v); }

template <typename T> void relu_cuda_launcher(const T* x, T* y, int n);
template <typename T> void relu_backward_cuda_launcher(const T* grad_out, const T* x, T* grad_in, int n);

// Error messages are built here as one std::string. TORCH_CHECK(cond, "text ", n) would stream
// the number through an std::ostringstream, and on a machine whose compiler is not the one
// PyTorch was built with (different libstdc++ headers), that crashed the process instead of
// raising. One ready-made string is passed through as it is.
template <typename... Parts>
static std::string message(const Parts&... parts) {
    std::string out;
    (append(out, parts), ...);
    return out;
}

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor: move it with .cuda()");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kFloat64,
                name, " must be float32 or float64, got ", t.scalar_type());
    TORCH_CHECK(t.numel() <= std::numeric_limits<int>::max(),
                message(name, " has too many elements for an int index: ", t.numel()));
}

// y is created inside the function and returned: that is fine. A torch::Tensor is a small
// handle (a reference-counted pointer) to the tensor's data on the heap. Returning the
// handle moves it to the caller; the data lives as long as some handle refers to it, and
// Python's torch.Tensor is one more such handle. Nothing points at freed memory.
torch::Tensor relu_forward(torch::Tensor x) {
    check_input(x, "x");
    x = x.contiguous();                  // the kernel indexes memory as a flat array
    auto y = torch::empty_like(x);       // every element is written by the kernel
    int n = static_cast<int>(x.numel());
    if (n == 0) return y;                // a launch with 0 blocks is an error
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relu_forward", [&] {
        relu_cuda_launcher<scalar_t>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), n);
    });
    return y;
}

torch::Tensor relu_backward(torch::Tensor grad_out, torch::Tensor x) {
    check_input(grad_out, "grad_out");
    check_input(x, "x");
    TORCH_CHECK(grad_out.sizes() == x.sizes(),
                message("grad_out and x must have the same shape (", grad_out.numel(), " and ",
                        x.numel(), " elements)"));
    TORCH_CHECK(grad_out.scalar_type() == x.scalar_type(), "grad_out and x differ in dtype");
    grad_out = grad_out.contiguous();
    x = x.contiguous();
    auto grad_in = torch::empty_like(x);
    int n = static_cast<int>(x.numel());
    if (n == 0) return grad_in;
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "relu_backward", [&] {
        relu_backward_cuda_launcher<scalar_t>(grad_out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                              grad_in.data_ptr<scalar_t>(), n);
    });
    return grad_in;
}

// 1) A Python module: `import myrelu; myrelu.relu(x)`. TORCH_EXTENSION_NAME is the name
//    given in setup.py; the module's init function, PyInit_myrelu, is what `import` looks for.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("relu", &relu_forward, "ReLU (CUDA)");
    m.def("relu_backward", &relu_backward, "gradient of ReLU (CUDA)");
}

// 2) Operators in PyTorch's dispatcher: `torch.ops.myrelu.relu(x)`. The schema tells
//    PyTorch the types (and that nothing is modified in place); torch::dispatch(kCUDA, f)
//    registers f for tensors on the GPU (the same as `TORCH_LIBRARY_IMPL(myrelu, CUDA, m)
//    { m.impl("relu", &relu_forward); }`). Ops known to the dispatcher work with
//    torch.compile and torch.library (autograd, fake tensors); a bare pybind11 function
//    does not.
TORCH_LIBRARY(myrelu, m) {
    m.def("relu(Tensor x) -> Tensor");
    m.def("relu_backward(Tensor grad_out, Tensor x) -> Tensor");
    m.impl("relu", torch::dispatch(torch::kCUDA, &relu_forward));
    m.impl("relu_backward", torch::dispatch(torch::kCUDA, &relu_backward));
}
