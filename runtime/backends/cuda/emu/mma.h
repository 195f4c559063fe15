// mma.h for the course's CPU emulator: nvcuda::wmma, the warp-level tensor-core API.
//
// A kernel that writes `#include <mma.h>` gets this file in simulation (the GPU build gets
// NVIDIA's). Supported: fragments of __half or __nv_bfloat16 (matrix_a, matrix_b) with a
// float or __half accumulator, in the three shapes the hardware documents for 16-bit
// inputs, m16n16k16, m32n8k16 and m8n32k16; fill_fragment, load_matrix_sync, mma_sync,
// store_matrix_sync.
//
// The _sync functions are warp collectives, emulated with the GPU's rules:
//   * every one of the 32 lanes of the warp takes part, in the same call, with the same
//     pointer and leading dimension (a lane that skipped the call, or a warp of fewer than
//     32 threads, is reported; a lane that returned leaves the others waiting: reported
//     as a stuck barrier on the call's line);
//   * the pointer is 256-bit (32-byte) aligned and ldm, in elements, is a multiple of 16
//     bytes (8 for 16-bit types, 4 for float); ldm shorter than a row of the fragment (a
//     wrong stride: rows would overlap) is reported too.
// When the last lane arrives the whole operation happens at once, as one instruction of
// the warp. A fragment's elements are spread over the lanes (num_elements each); which
// element a lane holds is unspecified on a GPU, so code may only apply the same operation
// to every x[i] (scaling, conversion), never rely on the order.
#pragma once
#include "cuda_fp16.h"
#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K> struct dims;
template <int M, int N, int K> struct dims<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct dims<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct dims<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };
template <int M, int N, int K> constexpr bool valid_shape() {
    return (M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) || (M == 8 && N == 32 && K == 16);
}
template <class T> constexpr bool is_16bit() {
    return std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value;
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
    static_assert(detail::valid_shape<M, N, K>(),
                  "wmma fragment shape: 16-bit inputs support m16n16k16, m32n8k16 and m8n32k16 only");
    static_assert(!std::is_same<Use, accumulator>::value || std::is_same<T, float>::value || std::is_same<T, __half>::value,
                  "wmma accumulator fragments hold float or __half");
    static_assert(std::is_same<Use, accumulator>::value || detail::is_16bit<T>(),
                  "wmma matrix_a / matrix_b fragments hold __half or __nv_bfloat16 (this emulator)");
    static_assert(std::is_same<Use, accumulator>::value || !std::is_same<Layout, void>::value,
                  "wmma matrix_a / matrix_b fragments need a layout: wmma::row_major or wmma::col_major");

public:
    typedef T element_type;
    static constexpr int rows = detail::dims<Use, M, N, K>::rows;
    static constexpr int cols = detail::dims<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols / 32;  // per lane
    T x[num_elements];
};

namespace detail {
// One entry per thread of the block: what each lane brought to the current collective.
struct Slot {
    int op, line;
    const void* ptr;
    unsigned ldm;
    int layout;
    void* d;
    const void *a, *b, *c;
};
inline Slot slots[::emu::kMaxThreads];
enum { OP_LOAD = 1, OP_STORE, OP_MMA };
inline const char* op_name(int op) {
    return op == OP_LOAD ? "wmma::load_matrix_sync" : op == OP_STORE ? "wmma::store_matrix_sync" : "wmma::mma_sync";
}

// Run `perform(base)` once for the whole warp when all 32 lanes have arrived at this call.
template <class F> inline void collective(Slot me, F perform) {
    int cur = ::emu::S.cur, base = cur & ~31;
    int lanes = (int)::emu::S.nthreads - base;
    if (lanes < 32)
        ::emu::fault_trap("%s on line %d: the warp of thread %d has only %d thread%s; a wmma call needs all 32 lanes "
                          "of a warp (make the number of threads per block a multiple of 32)",
                          op_name(me.op), me.line, cur, lanes, lanes == 1 ? "" : "s");
    slots[cur] = me;
    ::emu::warp_collective(::emu::OP_SYNCWARP, 0xffffffffu, 0, 0, 32, me.line);
    if (slots[cur].op == 0) return;  // the lane that arrived last has done it already
    for (int l = 0; l < 32; ++l) {
        const Slot& s = slots[base + l];
        if (s.op != me.op || s.line != me.line)
            ::emu::fault_trap("%s on line %d: every lane of a warp must take part in the same wmma call, but lane %d "
                              "of warp %d is elsewhere (%s). Keep wmma calls out of branches that split a warp.",
                              op_name(me.op), me.line, l, base / 32,
                              s.op ? op_name(s.op) : "not in a wmma call: a __syncwarp() or a shuffle");
        if (s.ptr != me.ptr || s.ldm != me.ldm)
            ::emu::fault_trap("%s on line %d: all lanes must pass the same pointer and ldm, but lane %d passes (%p, %u) "
                              "and lane %d (%p, %u)", op_name(me.op), me.line, l, s.ptr, s.ldm,
                              cur - base, me.ptr, me.ldm);
    }
    perform(base);
    for (int l = 0; l < 32; ++l) slots[base + l].op = 0;
}

template <class T> inline void check_pointer(int op, int line, const T* p, unsigned ldm, int width, bool row_major_mem) {
    constexpr unsigned step = 16 / sizeof(T);  // ldm granularity, in elements
    if ((uintptr_t)p % 32 != 0)
        ::emu::fault_trap("%s on line %d: the pointer %p is not 32-byte (256-bit) aligned (it is %u bytes past a "
                          "32-byte boundary). Point fragments at tile corners whose byte offset is a multiple of 32.",
                          op_name(op), line, (const void*)p, (unsigned)((uintptr_t)p % 32));
    if (ldm % step != 0)
        ::emu::fault_trap("%s on line %d: ldm = %u elements is not a multiple of 16 bytes (%u elements of %zu bytes)",
                          op_name(op), line, ldm, step, sizeof(T));
    if ((int)ldm < width)
        ::emu::fault_trap("%s on line %d: ldm = %u is shorter than a %s of the fragment (%d elements), so its %ss "
                          "would overlap: ldm is the distance in elements between the starts of two %ss in memory",
                          op_name(op), line, ldm, row_major_mem ? "row" : "column", width,
                          row_major_mem ? "row" : "column", row_major_mem ? "row" : "column");
}
template <class L> constexpr bool is_row_major() { return std::is_same<L, row_major>::value; }

// What every lane's load_matrix_sync does: the warp loads fragment type F from p, whose rows
// (rm) or columns lie ldm elements apart.
template <class F, class T>
inline void load(F& f, const T* p, unsigned ldm, bool rm, int line) {
    check_pointer(OP_LOAD, line, p, ldm, rm ? F::cols : F::rows, rm);
    collective({OP_LOAD, line, p, ldm, rm, &f, nullptr, nullptr, nullptr}, [&](int base) {
        for (int l = 0; l < 32; ++l) {
            F& g = *static_cast<F*>(slots[base + l].d);
            for (int i = 0; i < F::num_elements; ++i) {
                int e = i * 32 + l, r = e / F::cols, c = e % F::cols;
                g.x[i] = rm ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
            }
        }
    });
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& v) {
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = T(v);
}

// matrix_a / matrix_b: the layout is part of the fragment's type.
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm, int line = __builtin_LINE()) {
    detail::load(f, p, ldm, detail::is_row_major<L>(), line);
}

// accumulator: the memory layout is an argument.
template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout,
                             int line = __builtin_LINE()) {
    detail::load(f, p, ldm, layout == mem_row_major, line);
}

template <int M, int N, int K, class T>
inline void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout,
                              int line = __builtin_LINE()) {
    typedef fragment<accumulator, M, N, K, T> F;
    bool rm = layout == mem_row_major;
    detail::check_pointer(detail::OP_STORE, line, (const T*)p, ldm, rm ? F::cols : F::rows, rm);
    detail::collective({detail::OP_STORE, line, p, ldm, rm, nullptr, &f, nullptr, nullptr}, [&](int base) {
        for (int l = 0; l < 32; ++l) {
            const F& g = *static_cast<const F*>(detail::slots[base + l].a);
            for (int i = 0; i < F::num_elements; ++i) {
                int e = i * 32 + l, r = e / F::cols, c = e % F::cols;
                (rm ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = g.x[i];
            }
        }
    });
}

// d = a @ b + c for the warp's fragments; products and sums in float (fp32 accumulation).
template <int M, int N, int K, class TI, class LA, class LB, class TD, class TC>
inline void mma_sync(fragment<accumulator, M, N, K, TD>& d, const fragment<matrix_a, M, N, K, TI, LA>& a,
                     const fragment<matrix_b, M, N, K, TI, LB>& b, const fragment<accumulator, M, N, K, TC>& c,
                     bool = false, int line = __builtin_LINE()) {
    typedef fragment<matrix_a, M, N, K, TI, LA> FA;
    typedef fragment<matrix_b, M, N, K, TI, LB> FB;
    typedef fragment<accumulator, M, N, K, TC> FC;
    typedef fragment<accumulator, M, N, K, TD> FD;
    detail::collective({detail::OP_MMA, line, nullptr, 0, 0, &d, &a, &b, &c}, [&](int base) {
        float A[M * K], B[K * N], C[M * N];  // the whole matrices, gathered from the 32 lanes
        for (int l = 0; l < 32; ++l) {
            const detail::Slot& s = detail::slots[base + l];
            for (int i = 0; i < FA::num_elements; ++i) A[i * 32 + l] = (float)static_cast<const FA*>(s.a)->x[i];
            for (int i = 0; i < FB::num_elements; ++i) B[i * 32 + l] = (float)static_cast<const FB*>(s.b)->x[i];
            for (int i = 0; i < FC::num_elements; ++i) C[i * 32 + l] = (float)static_cast<const FC*>(s.c)->x[i];
        }
        for (int r = 0; r < M; ++r)
            for (int n = 0; n < N; ++n) {
                float acc = C[r * N + n];
                for (int k = 0; k < K; ++k) acc += A[r * K + k] * B[k * N + n];
                C[r * N + n] = acc;
            }
        for (int l = 0; l < 32; ++l) {  // d may be c itself: written only after everything is read
            FD& g = *static_cast<FD*>(detail::slots[base + l].d);
            for (int i = 0; i < FD::num_elements; ++i) g.x[i] = TD(C[i * 32 + l]);
        }
    });
}

}  // namespace wmma
}  // namespace nvcuda
