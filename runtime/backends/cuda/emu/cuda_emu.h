// cuda_emu.h: run CUDA C++ kernels on the CPU.
//
// The course compiles a kernel's own source with g++ after this header. Each CUDA thread
// of a block becomes a fiber (a tiny coroutine with its own stack); the threads of one
// block take turns on a single OS thread and switch only at barriers (__syncthreads,
// warp collectives). Blocks run one after the other. So:
//   * `__shared__` variables can simply be `static`: one block at a time uses them;
//   * atomics need no locks: nothing else runs between a read and its write;
//   * a barrier that not every thread reaches is seen at once: nobody is runnable while
//     someone still waits. The launcher reports it with the waiting threads and lines.
// See docs/cuda-emulator.md for what this can and cannot show.
//
// Kept light on purpose (C headers, no iostream): a cold compile must stay under 2 s.
#pragma once
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700   // macOS declares ucontext only with this ...
#define _DARWIN_C_SOURCE    // ... and MAP_ANONYMOUS, sigaltstack only with this
#endif
#ifndef COURSE_CUDA_EMULATOR
#define COURSE_CUDA_EMULATOR 1  // common.h's CHECK_INPUT accepts CPU tensors when this is set
#endif

#include <math.h>
#include <cmath>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stddef.h>
#include <float.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <type_traits>
#include <utility>
#include <stdexcept>
#include <sys/mman.h>
#include <dlfcn.h>
#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif
#include <unistd.h>
#include <time.h>
#if !(defined(__x86_64__) && defined(__ELF__)) || defined(EMU_FORCE_UCONTEXT)
// The portable context switch (arm64 laptops, ...): slower (swapcontext also saves the
// signal mask with a system call), same behaviour.
#include <ucontext.h>
#define EMU_UCONTEXT 1
#endif

// ---------------------------------------------------------------------------------------
// CUDA keywords. Device code is ordinary C++ here.
// ---------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
// (no __noinline__: GCC and torch headers spell __attribute__((__noinline__)) themselves)
#define __shared__ static      // one block runs at a time, so a static IS per-block memory
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __grid_constant__

#define EMU_API extern "C" __attribute__((visibility("default"), used))
// The launcher's machinery (launch, the block scheduler, the fault and race reports, the
// __tsan_* hooks) is most of the code a kernel's library holds. The course compiles it once
// per set of flags into an object (EMU_RUNTIME_IMPL) that each library links; a kernel's
// translation unit (EMU_RUNTIME_SPLIT) then sees these functions' bodies for reading only
// and generates code for the kernel alone. Without either macro, one translation unit has
// it all (an extension built against the emulator).
#if defined(EMU_RUNTIME_IMPL)
#define EMU_RT __attribute__((noinline))
#elif defined(EMU_RUNTIME_SPLIT)
#define EMU_RT inline __attribute__((gnu_inline, noinline))
#else
#define EMU_RT inline
#endif
#define EMU_NS namespace emu __attribute__((visibility("hidden")))
// Race detection (EMU_RACECHECK) compiles the kernel with g++'s -fsanitize=thread
// instrumentation, without its runtime: every load and store of kernel code calls a
// __tsan_* function defined below. The emulator's own functions that touch shared memory
// or arguments opt out of the instrumentation.
#if defined(EMU_RACECHECK)
#define EMU_NOTSAN __attribute__((no_sanitize("thread")))
#else
#define EMU_NOTSAN
#endif
// Profiling (EMU_PROFILE, see "profiling" below) adds -fsanitize-coverage=trace-pc: the
// emulator's own functions opt out of it too, and atomics are real calls, so that the code
// address they report is the learner's line.
#if defined(EMU_PROFILE)
#undef EMU_NOTSAN
#if defined(__clang__)
#define EMU_NOTSAN __attribute__((no_sanitize("thread", "coverage")))
#else
#define EMU_NOTSAN __attribute__((no_sanitize("thread"), no_sanitize_coverage))
#endif
#define EMU_PROF_NOINLINE __attribute__((noinline))
#else
#define EMU_PROF_NOINLINE
#endif
EMU_NS {
inline void race_atomic(const volatile void* p, unsigned n, void* pc);
inline void race_fence();
inline void race_ignore(const void* p, size_t n);
}

// ---------------------------------------------------------------------------------------
// Built-in vector types
// ---------------------------------------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct alignas(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct int3 { int x, y, z; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) double2 { double x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int2 make_int2(int x, int y) { return {x, y}; }
static inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
static inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
static inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
static inline double2 make_double2(double x, double y) { return {x, y}; }
// The byte and short vectors of image kernels.
#define EMU_VEC4(T, N, A)                                                                                   \
    struct alignas(A * 4) N##4 { T x, y, z, w; }; struct alignas(A * 2) N##2 { T x, y; };                   \
    static inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }                             \
    static inline N##2 make_##N##2(T x, T y) { return {x, y}; }
EMU_VEC4(unsigned char, uchar, 1) EMU_VEC4(signed char, char, 1) EMU_VEC4(unsigned short, ushort, 2)
EMU_VEC4(short, short, 2)
#undef EMU_VEC4

// ---------------------------------------------------------------------------------------
// Math: what CUDA adds to the C library
// ---------------------------------------------------------------------------------------
template <class A, class B>
static inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a < (T)b ? (T)a : (T)b;
}
template <class A, class B>
static inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type T;
    return (T)a > (T)b ? (T)a : (T)b;
}
// CUDA's integer min/max
static inline unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long llmin(long long a, long long b) { return a < b ? a : b; }
static inline long long llmax(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long ullmin(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long ullmax(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
// The fast intrinsics as a GPU computes them (CUDA C Programming Guide, "Intrinsic
// Functions"; the SASS of sm_90): __expf(x) is ex2.approx.ftz(x * log2(e)), the product
// rounded to float first, so its error grows with |x| (2 + floor(|1.16 x|) ulp at most) as
// on the GPU; __logf(x) is lg2.approx.ftz(x) * ln(2); __powf(x, y) is ex2(y * lg2(x));
// __fdividef(x, y) is x * (1/y), and 0 for 2^126 < |y| < 2^128. ".ftz": subnormal inputs
// and results are 0. Here ex2 and lg2 are exp2f and log2f (correctly rounded or nearly), a
// little more accurate than the GPU's 2-ulp units: the error a kernel sees is the GPU's
// within a couple of ulp. __sinf, __cosf and __tanf are sinf, cosf and tanf: more
// accurate than the GPU's (2^-21.4 absolute in [-pi, pi], much worse outside).
// glibc declares these names itself, so they are macros here.
static inline float emu_ftz(float x) { return fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x; }
static inline float emu_ex2_approx(float x) { return emu_ftz(exp2f(emu_ftz(x))); }
static inline float emu_lg2_approx(float x) { return log2f(emu_ftz(x)); }
static inline float emu_fast_expf(float x) { return emu_ex2_approx(x * 1.44269502f); }
static inline float emu_fast_exp10f(float x) { return emu_ex2_approx(x * 3.32192802f); }
static inline float emu_fast_logf(float x) { return emu_lg2_approx(x) * 0.693147182f; }
static inline float emu_fast_powf(float x, float y) { return emu_ex2_approx(y * emu_lg2_approx(x)); }
#define __expf(x) emu_fast_expf(x)
#define __logf(x) emu_fast_logf(x)
#define __log2f(x) emu_lg2_approx(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) emu_fast_powf(x, y)
#define __exp10f(x) emu_fast_exp10f(x)
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float x, float y) {
    float ay = fabsf(y);
    if (ay > 8.50705917e+37f && ay <= 3.40282347e+38f) return std::isinf(x) ? NAN : 0.0f;  // 2^126 < |y| < 2^128
    return x * emu_ftz(1.0f / y);
}
static inline float fdividef(float x, float y) { return __fdividef(x, y); }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __mul24(int a, int b) { return (int)((long long)((a << 8) >> 8) * ((b << 8) >> 8)); }
static inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
template <class T> static inline T __ldg(const T* p) { return *p; }
// Cache-hinted loads and stores (streaming, L2-only, ...): on a CPU just loads and stores.
template <class T> static inline T __ldcg(const T* p) { return *p; }
template <class T> static inline T __ldca(const T* p) { return *p; }
template <class T> static inline T __ldcs(const T* p) { return *p; }
template <class T> static inline T __ldlu(const T* p) { return *p; }
template <class T> static inline T __ldcv(const T* p) { return *p; }
template <class T> static inline void __stcg(T* p, T v) { *p = v; }
template <class T> static inline void __stcs(T* p, T v) { *p = v; }
template <class T> static inline void __stwb(T* p, T v) { *p = v; }
template <class T> static inline void __stwt(T* p, T v) { *p = v; }
EMU_NOTSAN static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); emu::race_fence(); }
EMU_NOTSAN static inline void __threadfence_system() { __threadfence(); }
EMU_NOTSAN static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline long long clock64() {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;  // nanoseconds, not GPU cycles
}

// ---------------------------------------------------------------------------------------
// Atomics. Threads only switch at barriers, so a plain read-modify-write cannot be
// interrupted: these are atomic by construction.
// ---------------------------------------------------------------------------------------
// With race detection each one reports itself as one atomic access (no plain read or write).
#define EMU_ATOMIC_RMW(NAME, EXPR)                                                   \
    template <class T, class U> EMU_NOTSAN EMU_PROF_NOINLINE static inline T NAME(T* addr, U val_) {   \
        emu::race_atomic(addr, sizeof(T), __builtin_return_address(0));              \
        T old = *addr; T val = (T)val_; *addr = (EXPR); return old; }
EMU_ATOMIC_RMW(atomicAdd, old + val)
EMU_ATOMIC_RMW(atomicSub, old - val)
EMU_ATOMIC_RMW(atomicExch, val)
EMU_ATOMIC_RMW(atomicMax, old > val ? old : val)
EMU_ATOMIC_RMW(atomicMin, old < val ? old : val)
EMU_ATOMIC_RMW(atomicAnd, old & val)
EMU_ATOMIC_RMW(atomicOr, old | val)
EMU_ATOMIC_RMW(atomicXor, old ^ val)
#undef EMU_ATOMIC_RMW
template <class T, class U, class V> EMU_NOTSAN EMU_PROF_NOINLINE static inline T atomicCAS(T* addr, U compare, V val) {
    emu::race_atomic(addr, sizeof(T), __builtin_return_address(0));
    T old = *addr;
    if (old == (T)compare) *addr = (T)val;
    return old;
}
EMU_NOTSAN EMU_PROF_NOINLINE static inline unsigned atomicInc(unsigned* addr, unsigned val) {
    emu::race_atomic(addr, 4, __builtin_return_address(0));
    unsigned old = *addr; *addr = (old >= val) ? 0u : old + 1u; return old;
}
EMU_NOTSAN EMU_PROF_NOINLINE static inline unsigned atomicDec(unsigned* addr, unsigned val) {
    emu::race_atomic(addr, 4, __builtin_return_address(0));
    unsigned old = *addr; *addr = (old == 0u || old > val) ? val : old - 1u; return old;
}
#define atomicAdd_block atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin

// ---------------------------------------------------------------------------------------
// Host API (what the first examples of the course use). Memory is ordinary host memory.
// ---------------------------------------------------------------------------------------
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchFailure = 719,
    cudaErrorIllegalAddress = 700,
    cudaErrorAssert = 710,
} cudaError_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4
};
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

// ---------------------------------------------------------------------------------------
// The scheduler
// ---------------------------------------------------------------------------------------
struct emu_fault_info {
    int kind;          // 0 none, 1 barrier/collective deadlock, 2 signal, 3 interrupted, 4 bad launch,
                       // 5 trap/assert, 6 stack overflow, 7 a __shared__ array overrun
    int sig;           // signal number for kind 2
    int is_write;      // 1 write, 0 read, -1 unknown
    int thread[3];     // threadIdx of the thread that faulted
    int block[3];      // blockIdx of its block
    unsigned long long addr;  // faulting address for kind 2
    char msg[8192];    // a full sentence for kinds 1, 4, 5
};

struct emu_launch_params {
    unsigned grid[3];
    unsigned block[3];
    unsigned long long shared_bytes;
    int schedule;      // 0: threadIdx order, 1: random order between barriers
    unsigned long long seed;
    unsigned long long stack_pool;  // thread stacks shared by all kernel libraries (0: own)
    int racecheck;     // 1: check every access for races (the library must be instrumented)
};

EMU_NS {

enum { ST_READY = 0, ST_RUNNING, ST_WAIT_BLOCK, ST_WAIT_WARP, ST_DONE, ST_WAIT_TILE, ST_WAIT_COALESCED,
       ST_WAIT_EXT /* in a wait of an extension (hopper_emu.h: an mbarrier, a wgmma); Thread::what names it */ };
enum { OP_SYNCWARP = 0, OP_SHFL, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_XOR, OP_BALLOT, OP_ANY, OP_ALL,
       OP_NONE };
static const char* const op_names[] = {
    "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__any_sync", "__all_sync", "?"};

constexpr int kMaxThreads = 1024;
constexpr int kTileLevels = 5;  // thread_block_tile sizes of several warps: 64, 128, 256, 512, 1024
constexpr size_t kStackSize = 128 * 1024;   // per CUDA thread; local arrays live here
constexpr size_t kStackGuard = 4 * 1024;    // inaccessible, below each stack (g++ probes
                                            // big frames page by page: -fstack-clash-protection)
constexpr size_t kMaxDynamicShared = 227 * 1024;  // an H100 block's limit (opt-in above 48 KiB)

struct Thread {
    void* sp;
    int state;
    int line;          // source line of the barrier it waits at
    int op;            // which warp collective it waits in
    int started;
    int stack;         // index of its stack in the pool, -1 when none
    unsigned mask;
    int arg;           // srcLane / delta / laneMask
    int width;
    int pred;          // for __syncthreads_count/and/or
    unsigned iseq;     // race detection: the last warp collective it took part in
    unsigned long long value, result;
    uint3 tid;
    const char* what;  // ST_WAIT_EXT: what it waits in
#ifdef EMU_UCONTEXT
    jmp_buf jb;        // where it stopped (portable switch)
#endif
};

struct State {
    // launch
    void (*thunk)(void*);
    void* ctx;
    unsigned nthreads;
    dim3 bdim;
    // threads of the running block
    Thread th[kMaxThreads];
    int queue[2 * kMaxThreads];
    unsigned qhead, qtail;
    int cur;
    int n_done;
    int n_wait_block;
    const void* block_site;
    int block_mixed;
    int bar_result;
    unsigned warp_arrived[kMaxThreads / 32];
    int tile_arrived[kTileLevels][kMaxThreads / 64];  // threads waiting at each multi-warp tile's barrier
    int n_wait_coalesced;                             // threads waiting in coalesced_threads()
    // stacks
    char* stack_pool;
    int free_stacks[kMaxThreads];
    int n_free;
    // the scheduler's own context
    void* main_sp;
#ifdef EMU_UCONTEXT
    // The portable switch: _setjmp/_longjmp between stacks (no system call), and
    // makecontext only to start a fiber on a stack the first time in a launch. A fiber
    // whose thread is done parks in `park` and takes the next fresh thread from there.
    jmp_buf main_jb;
    jmp_buf park[kMaxThreads];
    char booted[kMaxThreads];
    ucontext_t boot_uc;
#endif
    // random schedule
    int random;
    unsigned long long rng;
    // faults
    int in_launch;
    sigjmp_buf jmp;
    emu_fault_info fault;
};
inline State S;
inline int last_error = 0;  // cudaGetLastError

// Static __shared__ variables are registered (by a line the adapter appends to each
// declaration) so that every block starts with poisoned shared memory, as garbage is what
// a GPU block finds there: a kernel reading shared memory it never wrote sees NaNs.
//
// A static __shared__ array also sits between two guard zones (Guarded below). A GPU does
// not notice a write a little past the end of a shared array: it lands in the next
// variable. The emulator checks the guards whenever the block reaches a barrier and when
// it ends, and reports which array was overrun.
// Shared memory lives in its own mapping (the arena), between inaccessible regions, apart
// from the emulator's own state: no write through a shared array, however far past its
// end, can reach the scheduler or the saved signal handlers. Static __shared__ variables
// are carved from its start; the dynamic (extern __shared__) bytes of a launch end right
// before a guard zone that ends at the inaccessible region after the arena.
constexpr uint32_t kGuardWord = 0x7fa5a5a5u;  // the guard zones' pattern (see below)
constexpr size_t kStaticSharedArena = 1u << 20;                  // a GPU block has 48 KiB
constexpr size_t kDynamicArea = kMaxDynamicShared + 4096;         // + the guard zone, page-rounded
constexpr size_t kArenaGuard = (size_t)256 << 20;                // inaccessible, on both sides
constexpr size_t kArenaBytes = kStaticSharedArena + kDynamicArea;
inline char* arena_base = nullptr;
inline size_t arena_used = 0;
inline size_t arena_rw = 0;      // bytes from the start made accessible: the rest of the static part is not
inline int arena_overflow = 0;
inline char* dyn_ptr = nullptr;   // the launch's dynamic shared memory
// The guard pattern over a page (+3 bytes to start at any offset): the slack after the last
// static variable is filled and checked with memcpy/memcmp, a few ns per barrier.
alignas(64) inline unsigned char slack_pattern[4096 + 4];
EMU_NOTSAN inline const unsigned char* slack_guard(size_t from) {
    if (slack_pattern[0] != ((const unsigned char*)&kGuardWord)[0])
        for (size_t k = 0; k < sizeof slack_pattern; ++k) slack_pattern[k] = ((const unsigned char*)&kGuardWord)[k % 4];
    return slack_pattern + (from & 3);
}
EMU_NOTSAN inline char* arena() {
    if (!arena_base) {
        void* p = mmap(nullptr, kArenaGuard + kArenaBytes + kArenaGuard, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) { fprintf(stderr, "cuda emulator: cannot map shared memory\n"); abort(); }
        arena_base = (char*)p + kArenaGuard;
        mprotect(arena_base + kStaticSharedArena, kDynamicArea, PROT_READ | PROT_WRITE);
        dyn_ptr = arena_base + kStaticSharedArena;
    }
    return arena_base;
}
// A fault anywhere in the arena's reservation is an access far outside every __shared__ variable.
EMU_NOTSAN inline bool in_arena_guard(const char* a) {
    return arena_base && a >= arena_base - kArenaGuard && a < arena_base + kArenaBytes + kArenaGuard;
}
inline const char* dyn_name = nullptr;  // the kernel's name for it (reports), and its element size
inline size_t dyn_elem = 1;
EMU_NOTSAN inline char* dyn_shared() { arena(); return dyn_ptr; }
EMU_NOTSAN inline char* dyn_shared(const char* name, size_t elem) { dyn_name = name; dyn_elem = elem ? elem : 1; return dyn_shared(); }
// Places the launch's dynamic bytes so that they end at the guard zone before the end of
// the arena (a far overrun hits the inaccessible region).
EMU_NOTSAN inline void place_dynamic_shared(size_t bytes) {
    char* area = arena() + kStaticSharedArena;
    dyn_ptr = arena_base + kArenaBytes - 64 - ((bytes + 63) & ~(size_t)63);
    char* first = (char*)((uintptr_t)dyn_ptr & ~(uintptr_t)4095);  // only its pages are accessible
    mprotect(area, (size_t)(first - area), PROT_NONE);
    mprotect(first, (size_t)(arena_base + kArenaBytes - first), PROT_READ | PROT_WRITE);
}
EMU_NOTSAN inline void* shared_alloc(size_t n, size_t align) {
    char* a = arena();
    size_t at = (arena_used + align - 1) & ~(align - 1);
    if (at + n > kStaticSharedArena) {  // reported at the next launch; memory stays valid
        arena_overflow = 1;
        void* q = aligned_alloc(align < 64 ? 64 : align, (n + 63) & ~(size_t)63);
        memset(q, 0xff, n);
        return q;
    }
    arena_used = at + n;
    size_t rw = (arena_used + 4095) & ~(size_t)4095;
    if (rw > arena_rw) { mprotect(a + arena_rw, rw - arena_rw, PROT_READ | PROT_WRITE); arena_rw = rw; }
    memcpy(a + arena_used, slack_guard(arena_used), arena_rw - arena_used);  // the slack: a guard
    return a + at;
}
template <class T, size_t Align = 16> inline T& shared_new() {
    constexpr size_t a = alignof(T) > Align ? alignof(T) : Align;
    return *(T*)shared_alloc(sizeof(T), a < 16 ? 16 : a);
}

constexpr size_t kSharedGuard = 64;
// The guard pattern: a signalling NaN as a float. Reading it gives NaN, as any unwritten
// shared memory does here, and arithmetic on it (`s[n] += v`) quiets it, which changes it:
// so even an update of a guard element is caught, not only a plain store.
EMU_NOTSAN inline void fill_guard(unsigned char* g) {
    for (size_t k = 0; k < kSharedGuard; k += 4) memcpy(g + k, &kGuardWord, 4);
}
EMU_NOTSAN inline bool guard_byte_ok(const unsigned char* g, size_t k) {
    return g[k] == ((const unsigned char*)&kGuardWord)[k % 4];
}
// A static __shared__ array between two guard zones; `Align` is the alignment its declaration
// asks for (__align__(128), alignas(1024): a TMA tile), kept by a longer zone in front whose
// last kSharedGuard bytes are the guard (guard_before).
template <class A, size_t Align = 64> struct alignas(Align > 64 ? Align : 64) Guarded {
    unsigned char pre[Align > kSharedGuard ? Align : kSharedGuard];
    A v;
    unsigned char post[kSharedGuard];
    unsigned char* guard_before() { return pre + sizeof(pre) - kSharedGuard; }
};
struct SharedRegion {
    void* p; size_t n;
    unsigned char* pre; unsigned char* post;  // guard zones (null for a scalar)
    const char* name; size_t elem;            // the array's name, the size of one element
};
constexpr int kMaxSharedRegions = 256;
inline SharedRegion shared_regions[kMaxSharedRegions];
inline int n_shared_regions = 0;
inline size_t dyn_shared_bytes = 0;
struct SharedReg {
    EMU_NOTSAN SharedReg(void* p, size_t n, unsigned char* pre = nullptr, unsigned char* post = nullptr,
              const char* name = nullptr, size_t elem = 1) {
        if (n_shared_regions < kMaxSharedRegions) shared_regions[n_shared_regions++] = {p, n, pre, post, name, elem};
        memset(p, 0xff, n);
        if (pre) { fill_guard(pre); fill_guard(post); race_ignore(pre, kSharedGuard); race_ignore(post, kSharedGuard); }
    }
};
EMU_NOTSAN inline void poison_shared() {
    for (int i = 0; i < n_shared_regions; ++i) {
        SharedRegion& r = shared_regions[i];
        memset(r.p, 0xff, r.n);
        if (r.pre) { fill_guard(r.pre); fill_guard(r.post); }
    }
    memset(dyn_ptr, 0xff, dyn_shared_bytes);
    fill_guard((unsigned char*)dyn_ptr + dyn_shared_bytes);  // what the launch did not ask for
    // the rest of the last accessible page after the static variables: a guard zone too
    if (arena_rw > arena_used) memcpy(arena_base + arena_used, slack_guard(arena_used), arena_rw - arena_used);
}
// The first overrun guard: sets *region, *past_end and the element index; false if none.
EMU_NOTSAN inline bool find_shared_overrun(int* region, bool* past_end, long long* index) {
    for (int i = 0; i < n_shared_regions; ++i) {
        SharedRegion& r = shared_regions[i];
        if (!r.pre) continue;
        long long count = (long long)(r.n / r.elem);
        for (size_t k = 0; k < kSharedGuard; ++k) {
            if (!guard_byte_ok(r.post, k)) { *region = i; *past_end = true; *index = count + (long long)(k / r.elem); return true; }
        }
        for (size_t k = kSharedGuard; k-- > 0;) {
            if (!guard_byte_ok(r.pre, k)) { *region = i; *past_end = false; *index = -1 - (long long)((kSharedGuard - 1 - k) / r.elem); return true; }
        }
    }
    return false;
}

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// ---------------------------------- race detection -------------------------------------
// Every access of kernel code to shared memory or to a tensor argument is checked against
// a shadow of that memory: per 4-byte word, the last plain write and one read (or atomic),
// each with its thread, the barrier interval it ran in and its code address. The read kept
// is the first one that may still race; since a thread runs without interruption between
// its barriers, a later write by another thread then always meets a racing access.
// Two accesses race when they touch the same bytes, one of them is a plain write, and
//   * shared memory or same block: different threads and no barrier between them (no
//     __syncthreads(), and for two lanes of one warp no warp collective of both);
//   * global memory: different blocks of one launch (blocks cannot wait for each other),
//     except a read or write, after a __threadfence(), of what another block wrote, by a block
//     that has done an atomic since (the "last block" pattern of the CUDA samples: the
//     fence and the atomic ticket order the earlier blocks' writes before the last block's).
// Time is one counter, bumped at each block start, barrier and warp collective: an
// access records the value at its thread's last synchronization ("interval"). The first
// race stops the launch; the Python side turns the addresses into source lines.
constexpr uint32_t kRaceSeqMax = (1u << 28) - 1;
constexpr uint32_t kRaceIgnore = kRaceSeqMax;  // a guard zone: an overrun is reported as such, at the barrier
struct RaceCell { uint64_t seq : 28, tid : 10, mask : 4, atomic : 1, pc : 21; };
struct RaceShadow { RaceCell w, r; };
struct RaceRegion { uintptr_t lo, len; RaceShadow* shadow; size_t shadow_bytes; };
constexpr int kMaxRaceRegions = 64;
struct RaceInfo {
    int space;                 // 0 shared memory, 1 a tensor argument
    int region;                // the argument buffer (0-based, as Python passed them)
    unsigned long long offset; // bytes from the start of the buffer / of the array
    int size;                  // bytes of the access
    int kind_now, kind_then;   // 0 read, 1 write, 2 atomic
    int tid_now[3], tid_then[3], block_now[3], block_then[3];
    unsigned long long pc_now, pc_then;  // offsets in the library (0: unknown)
    int same_block, same_warp, lane_now, lane_then;
    char where[256];           // shared memory: "s[12]" or the dynamic buffer's offset
};
struct Race {
    int want;                  // detection asked for (the library is instrumented)
    int active;                // a launch is running and checking
    uintptr_t sh_lo, sh_len;
    RaceShadow* sh_shadow;
    int n;
    RaceRegion g[kMaxRaceRegions];
    uint32_t seq, launch_start, block_start, bar_seq, fence_seq;
    int block_atomic;
    uint32_t warp_seq[kMaxThreads / 32];
    int pair_used;
    uint32_t pair[kMaxThreads][32];   // last collective of thread t together with lane l
    int tile_used;
    uint32_t tile_seq[kTileLevels][kMaxThreads / 64];  // last barrier of each multi-warp tile
    uint32_t* block_seqs; unsigned long long* block_ids; size_t n_blocks, cap_blocks;
    uintptr_t lib_base;
    RaceInfo info;
};
inline Race R;

EMU_NOTSAN inline void race_ignore(const void* p, size_t n) {
    if (!R.sh_shadow) return;
    uintptr_t off = (uintptr_t)p - R.sh_lo;
    if (off >= R.sh_len) return;
    for (uintptr_t g = off >> 2; g <= (off + n - 1) >> 2; ++g) { R.sh_shadow[g].w.seq = kRaceIgnore; R.sh_shadow[g].r.seq = 0; }
}
EMU_NOTSAN inline void race_ignore_guards() {
    for (int i = 0; i < n_shared_regions; ++i)
        if (shared_regions[i].pre) { race_ignore(shared_regions[i].pre, kSharedGuard); race_ignore(shared_regions[i].post, kSharedGuard); }
}

// The shadows of argument buffers are kept from launch to launch (no page faults and no
// zeroing again): a cell written before the current launch started is ignored anyway.
EMU_NOTSAN inline void race_free_regions() {
    for (int i = 0; i < kMaxRaceRegions; ++i)
        if (R.g[i].shadow) { munmap(R.g[i].shadow, R.g[i].shadow_bytes); R.g[i].shadow = nullptr; R.g[i].shadow_bytes = 0; }
    R.n = 0;
}
EMU_NOTSAN inline RaceShadow* race_map_shadow(size_t bytes, size_t* out) {
    size_t n = ((bytes + 3) / 4 + 1) * sizeof(RaceShadow);
    n = (n + 4095) & ~(size_t)4095;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE);  // fewer page faults on a big tensor's shadow
#endif
    *out = n;
    return (RaceShadow*)p;
}

// At the start of a launch (before any block).
EMU_NOTSAN EMU_RT void race_launch_start() {
    R.active = 0;
    if (!R.want) return;
    char* a = arena();
    if (!R.sh_shadow) {
        size_t n;
        R.sh_shadow = race_map_shadow(kArenaBytes, &n);
        if (!R.sh_shadow) return;
        R.sh_lo = (uintptr_t)a; R.sh_len = kArenaBytes;
        race_ignore_guards();
    }
    if (R.seq > kRaceSeqMax / 2) {  // start the clock again: forget every old access
        madvise(R.sh_shadow, ((kArenaBytes / 4 + 1) * sizeof(RaceShadow) + 4095) & ~(size_t)4095, MADV_DONTNEED);
        for (int i = 0; i < kMaxRaceRegions; ++i)
            if (R.g[i].shadow) madvise(R.g[i].shadow, R.g[i].shadow_bytes, MADV_DONTNEED);
        R.seq = 0;
        race_ignore_guards();
    }
    R.launch_start = ++R.seq;
    R.fence_seq = 0;
    R.pair_used = 0;
    R.tile_used = 0;
    memset(R.tile_seq, 0, sizeof R.tile_seq);
    R.n_blocks = 0;
    if (!R.lib_base) {
        Dl_info di;
        if (dladdr((void*)&race_free_regions, &di)) R.lib_base = (uintptr_t)di.dli_fbase;
    }
    R.active = 1;
}

EMU_NOTSAN inline void race_block_start(unsigned long long lb, unsigned nthreads) {
    if (!R.active) return;
    if (R.seq + 2 * (uint32_t)kMaxThreads >= kRaceSeqMax) { R.active = 0; return; }  // a huge launch: stop checking
    R.block_start = R.bar_seq = ++R.seq;
    R.block_atomic = 0;
    for (unsigned t = 0; t < nthreads; ++t) S.th[t].iseq = 0;
    for (unsigned w = 0; w < (nthreads + 31) / 32; ++w) R.warp_seq[w] = 0;
    if (R.n_blocks == R.cap_blocks) {
        size_t cap = R.cap_blocks ? 2 * R.cap_blocks : 1024;
        R.block_seqs = (uint32_t*)realloc(R.block_seqs, cap * sizeof(uint32_t));
        R.block_ids = (unsigned long long*)realloc(R.block_ids, cap * sizeof(unsigned long long));
        R.cap_blocks = cap;
    }
    R.block_seqs[R.n_blocks] = R.block_start;
    R.block_ids[R.n_blocks++] = lb;
}

EMU_NOTSAN inline void race_barrier() {
    if (R.active) R.bar_seq = ++R.seq;
}

// A warp collective of the lanes `need` of warp `warp` (all existing lanes: `full`).
EMU_NOTSAN inline void race_warp_sync(int warp, unsigned need, bool full) {
    if (!R.active) return;
    uint32_t s = ++R.seq;
    int base = warp << 5;
    if (full) R.warp_seq[warp] = s;
    else {
        R.pair_used = 1;
        for (unsigned m = need; m; m &= m - 1) {
            int a = __builtin_ctz(m);
            for (unsigned k = need; k; k &= k - 1) R.pair[base + a][__builtin_ctz(k)] = s;
        }
    }
    for (unsigned m = need; m; m &= m - 1) S.th[base + __builtin_ctz(m)].iseq = s;
}

// The barrier of a thread_block_tile of several warps: tile `tile` of 2^(6 + level) threads.
EMU_NOTSAN inline void race_tile_sync(int level, int tile) {
    if (!R.active) return;
    uint32_t s = ++R.seq;
    R.tile_used = 1;
    R.tile_seq[level][tile] = s;
    int size = 64 << level;
    for (int t = tile * size; t < (tile + 1) * size; ++t) S.th[t].iseq = s;
}

EMU_NOTSAN inline void race_fence() { if (R.active) R.fence_seq = ++R.seq; }

EMU_NOTSAN inline uint32_t race_now() {
    uint32_t i = S.th[S.cur].iseq;
    return i > R.bar_seq ? i : R.bar_seq;
}

// Does the recorded access `c` (of kind then_write) race with the running thread's access?
EMU_NOTSAN inline bool race_conflict(const RaceCell& c, bool then_write, bool now_write) {
    int tid = S.cur;
    if (c.seq < R.block_start) {  // another block of this launch (global memory only)
        if (then_write && R.fence_seq > c.seq && R.block_atomic) return false;
        return true;
    }
    if ((int)c.tid == tid || R.bar_seq > c.seq) return false;
    if ((int)(c.tid >> 5) == (tid >> 5)) {
        if (R.warp_seq[tid >> 5] > c.seq) return false;
        if (R.pair_used && R.pair[tid][c.tid & 31] > c.seq) return false;
    }
    if (R.tile_used)
        for (int l = 0; l < kTileLevels; ++l)
            if ((int)(c.tid >> (6 + l)) == (tid >> (6 + l)) && R.tile_seq[l][tid >> (6 + l)] > c.seq) return false;
    return true;
}

EMU_NOTSAN inline void fill_tid(int* out, unsigned t) {
    uint3 v = S.th[t].tid; out[0] = (int)v.x; out[1] = (int)v.y; out[2] = (int)v.z;
}
EMU_NOTSAN inline void fill_block(int* out, unsigned long long lb) {
    out[0] = (int)(lb % gridDim.x); out[1] = (int)((lb / gridDim.x) % gridDim.y);
    out[2] = (int)(lb / ((unsigned long long)gridDim.x * gridDim.y));
}

[[noreturn]] EMU_NOTSAN EMU_RT void race_report(const RaceCell& c, int kind_then, int kind_now, int region,
                                                 uintptr_t addr, unsigned size, uintptr_t pc) {
    RaceInfo& I = R.info;
    memset(&I, 0, sizeof I);
    I.space = region < 0 ? 0 : 1;
    I.region = region;
    I.size = (int)size;
    I.kind_now = kind_now; I.kind_then = kind_then;
    fill_tid(I.tid_now, S.cur); fill_tid(I.tid_then, c.tid);
    I.block_now[0] = (int)blockIdx.x; I.block_now[1] = (int)blockIdx.y; I.block_now[2] = (int)blockIdx.z;
    I.same_block = c.seq >= R.block_start;
    if (I.same_block) memcpy(I.block_then, I.block_now, sizeof I.block_now);
    else {  // the block that ran at time c.seq
        size_t lo = 0, hi = R.n_blocks;
        while (hi - lo > 1) { size_t mid = (lo + hi) / 2; if (R.block_seqs[mid] <= c.seq) lo = mid; else hi = mid; }
        fill_block(I.block_then, R.n_blocks ? R.block_ids[lo] : 0);
    }
    I.same_warp = I.same_block && (int)(c.tid >> 5) == (S.cur >> 5);
    I.lane_now = S.cur & 31; I.lane_then = c.tid & 31;
    I.pc_now = pc >= R.lib_base ? pc - R.lib_base : 0;
    I.pc_then = c.pc;
    if (region >= 0) I.offset = addr - R.g[region].lo;
    else {
        I.offset = addr - R.sh_lo;
        const char* a = (const char*)addr;
        snprintf(I.where, sizeof I.where, "shared memory");
        for (int i = 0; i < n_shared_regions; ++i) {
            SharedRegion& r = shared_regions[i];
            const char* p = (const char*)r.p;
            if (a >= p && a < p + r.n) {
                if (r.name) snprintf(I.where, sizeof I.where, "%s[%lld]", r.name, (long long)((a - p) / (long long)r.elem));
                else snprintf(I.where, sizeof I.where, "a __shared__ variable");
                break;
            }
        }
        if (a >= dyn_ptr && a < dyn_ptr + dyn_shared_bytes) {
            if (dyn_name) snprintf(I.where, sizeof I.where, "%s[%lld]", dyn_name, (long long)((a - dyn_ptr) / (long long)dyn_elem));
            else snprintf(I.where, sizeof I.where, "byte %lld of the extern __shared__ memory", (long long)(a - dyn_ptr));
        }
    }
    emu_fault_info& f = S.fault;
    f.kind = 8;
    f.thread[0] = I.tid_now[0]; f.thread[1] = I.tid_now[1]; f.thread[2] = I.tid_now[2];
    memcpy(f.block, I.block_now, sizeof f.block);
    f.addr = addr;
    R.active = 0;
    siglongjmp(S.jmp, 1);
}

// kind: 0 plain read, 1 plain write, 2 atomic.
EMU_NOTSAN inline void race_check(RaceShadow* sh, uintptr_t off, unsigned n, int kind, uintptr_t pc, int region,
                                  uintptr_t addr) {
    uint32_t now = race_now();
    uint32_t valid = region < 0 ? R.block_start : R.launch_start;
    uintptr_t last = off + n - 1;
    uint64_t pco = pc - R.lib_base;
    if (pco >= (1u << 21)) pco = 0;
    bool write = kind == 1;
    for (uintptr_t g = off >> 2; g <= (last >> 2); ++g) {
        unsigned lo = g * 4 > off ? 0 : (unsigned)(off & 3);
        unsigned hi = g * 4 + 3 < last ? 3 : (unsigned)(last & 3);
        unsigned mask = (2u << hi) - (1u << lo);
        RaceShadow& c = sh[g];
        if (c.w.seq == kRaceIgnore) continue;
        if (c.w.seq >= valid && (c.w.mask & mask) && race_conflict(c.w, true, write))
            race_report(c.w, 1, kind, region, addr, n, pc);
        if (write) {
            if (c.r.seq >= valid && (c.r.mask & mask) && race_conflict(c.r, false, true))
                race_report(c.r, c.r.atomic ? 2 : 0, kind, region, addr, n, pc);
            c.w.seq = now; c.w.tid = (unsigned)S.cur; c.w.mask = mask; c.w.atomic = 0; c.w.pc = pco;
        } else if (c.r.seq < valid || c.r.tid == (unsigned)S.cur ||
                   (c.r.seq >= R.block_start && R.bar_seq > c.r.seq) || !(c.r.mask & mask)) {
            c.r.seq = now; c.r.tid = (unsigned)S.cur; c.r.mask = mask; c.r.atomic = kind == 2; c.r.pc = pco;
        }
    }
}

// Set by hopper_emu.h: told of each ordinary store to shared memory (with race detection on,
// the instrumentation sees every one), to check that a thread fences its stores for the async
// proxy (fence_proxy_async) before a TMA store or a wgmma reads them.
inline void (*shared_store_hook)(uintptr_t a, unsigned n) = nullptr;

EMU_NOTSAN inline void race_access(const volatile void* p, unsigned n, int kind, void* pc) {
    if (!R.active) return;
    uintptr_t a = (uintptr_t)p;
    uintptr_t off = a - R.sh_lo;
    if (off < R.sh_len) {  // static __shared__ variables, or the bytes the launch asked for
        if (kind == 1 && shared_store_hook) shared_store_hook(a, n);
        if (off < kStaticSharedArena || a - (uintptr_t)dyn_ptr < dyn_shared_bytes)
            race_check(R.sh_shadow, off, n, kind, (uintptr_t)pc, -1, a);
        return;
    }
    for (int i = 0; i < R.n; ++i) {
        off = a - R.g[i].lo;
        if (off < R.g[i].len) { race_check(R.g[i].shadow, off, n, kind, (uintptr_t)pc, i, a); return; }
    }
}
inline void prof_access(const volatile void* p, unsigned n, int kind, void* pc, unsigned piece = 0);
inline void race_atomic(const volatile void* p, unsigned n, void* pc) {
    if (R.active) { if (!((uintptr_t)p - R.sh_lo < R.sh_len)) R.block_atomic = 1; race_access(p, n, 2, pc); }
#if defined(EMU_PROFILE)
    prof_access(p, n, 2, pc);
#endif
}

// ------------------------------------ profiling ----------------------------------------
// Only in the profiling variant of a kernel library (EMU_PROFILE: the race detector's
// -fsanitize=thread instrumentation plus -fsanitize-coverage=trace-pc). Every access of
// kernel code to shared memory or to a tensor argument (all of them, `const T*` too) is
// logged with its thread, code address and "how many times this thread has executed this
// code address". At the end of each block the log is sorted into warp-wide instruction
// instances (same warp, same code address, same count: the lanes of a warp run one after
// the other here, so this is how their accesses meet again), and each instance is counted
// as Nsight Compute counts a request: the 32-byte sectors its lanes touch, or for shared
// memory the wavefronts (the most distinct 4-byte words that fall in one of the 32 banks).
// trace-pc calls a hook at the start of every basic block: per warp-level instance of a
// block, the active lanes (divergence). The Python side (utils/cuda/_profile.py) maps code
// addresses to source lines and turns the counters into metrics and sentences.
#if defined(EMU_PROFILE)
constexpr int kProfMaxPc = 4096;        // distinct code addresses of one library
constexpr int kProfHash = 16384;
constexpr int kProfMaxRegions = 64;
struct ProfRec { uint64_t key; uintptr_t addr; uint32_t size; int16_t region; uint8_t kind, space; };
// Per code address and space (global, shared): what its warp-wide instances added up to.
struct ProfSite {
    long long requests, sectors, ideal_sectors, wavefronts, ideal_wavefronts, lanes, possible_lanes, bytes;
    long long kind, size, region, stride, has_stride, worst_wavefronts, worst_bank, worst_lanes, used, first_offset;
    long long worst_stride, has_worst_stride;  // between the first two active lanes of the worst request
};
// Per code address of a basic block: warp-level instances, lanes that ran them, lanes that existed.
struct ProfBB { long long instances, lanes, possible_lanes; };
struct ProfTraceRec { long long block, thread, space, op, region, offset, size, pcid, instr, shared_array; };
struct ProfRegion { uintptr_t lo, len, phase; unsigned char *rd, *wr; size_t bits_bytes; };
struct ProfResult {
    long long npc; const unsigned long long* pcs; const ProfSite* sites; const ProfBB* bbs;
    long long atomics_global, atomics_shared, hot_region, hot_offset, hot_count;
    long long bytes_read, bytes_written, bytes_touched;  // distinct bytes: read, written (or atomic), either
    const ProfTraceRec* trace; long long trace_n, trace_overflow, instr, pc_overflow, lost;
};
struct Prof {
    int want, active;
    int n; ProfRegion g[kProfMaxRegions];
    uintptr_t lib_base;
    int npc, pc_overflow;
    unsigned long long pcs[kProfMaxPc];
    int hash[kProfHash];                 // id + 1, 0: empty
    ProfSite sites[kProfMaxPc][2];
    ProfBB bbs[kProfMaxPc];
    uint32_t* cnt;                       // [thread][pc id]: executions so far in this block
    uint32_t wmax[kMaxThreads / 32][kProfMaxPc];  // the most any lane of the warp has executed it
    ProfRec* log; size_t log_n, log_cap;
    unsigned long long block;
    // global atomics per address (open addressing)
    uintptr_t* at_keys; long long* at_counts; size_t at_cap, at_n;
    long long atomics_global, atomics_shared;
    ProfTraceRec* trace; size_t trace_n, trace_cap; int trace_overflow;
    long long instr;
    int lost;                            // an allocation failed: some accesses were not counted
    ProfResult result;
};
inline Prof P;

// `piece`: the part of an access split as a GPU would do it (see prof_access_split), each its own
// instruction; kept in the key's top bits (the Python side masks them off for the source line).
EMU_NOTSAN inline int prof_pcid(uintptr_t pc, unsigned piece = 0) {
    unsigned long long off = (pc - P.lib_base) | ((unsigned long long)piece << 48);
    unsigned h = (unsigned)((off * 0x9E3779B97F4A7C15ULL) >> 50) & (kProfHash - 1);
    for (;;) {
        int v = P.hash[h];
        if (!v) break;
        if (P.pcs[v - 1] == off) return v - 1;
        h = (h + 1) & (kProfHash - 1);
    }
    if (P.npc >= kProfMaxPc) { P.pc_overflow = 1; return kProfMaxPc - 1; }
    P.pcs[P.npc] = off;
    P.hash[h] = ++P.npc;
    return P.npc - 1;
}
EMU_NOTSAN inline uint32_t prof_count(int id) { return ++P.cnt[(size_t)S.cur * kProfMaxPc + id]; }
EMU_NOTSAN inline int prof_warp_lanes(int warp) {
    int n = (int)S.nthreads - warp * 32;
    return n > 32 ? 32 : n;
}

// A basic block starts (trace-pc): one more lane in this warp-level instance of it.
EMU_NOTSAN inline void prof_bb(uintptr_t pc) {
    if (!P.active || S.cur < 0) return;
    int id = prof_pcid(pc);
    uint32_t c = prof_count(id);
    int w = S.cur >> 5;
    ProfBB& b = P.bbs[id];
    if (c > P.wmax[w][id]) { P.wmax[w][id] = c; b.instances++; b.possible_lanes += prof_warp_lanes(w); }
    b.lanes++;
}

EMU_NOTSAN inline void prof_set_bits(unsigned char* bits, uintptr_t off, unsigned n) {
    for (uintptr_t b = off; b < off + n; ++b) bits[b >> 3] |= (unsigned char)(1u << (b & 7));
}

EMU_NOTSAN inline void prof_atomic_addr(uintptr_t a) {
    if (P.at_n * 2 >= P.at_cap) {  // grow
        size_t cap = P.at_cap ? P.at_cap * 2 : 1024;
        uintptr_t* k = (uintptr_t*)calloc(cap, sizeof(uintptr_t));
        long long* c = (long long*)calloc(cap, sizeof(long long));
        if (!k || !c) { free(k); free(c); P.lost = 1; return; }
        for (size_t i = 0; i < P.at_cap; ++i) {
            if (!P.at_keys[i]) continue;
            size_t h = (P.at_keys[i] * 0x9E3779B97F4A7C15ULL) >> 20 & (cap - 1);
            while (k[h]) h = (h + 1) & (cap - 1);
            k[h] = P.at_keys[i]; c[h] = P.at_counts[i];
        }
        free(P.at_keys); free(P.at_counts);
        P.at_keys = k; P.at_counts = c; P.at_cap = cap;
    }
    size_t h = (a * 0x9E3779B97F4A7C15ULL) >> 20 & (P.at_cap - 1);
    while (P.at_keys[h] && P.at_keys[h] != a) h = (h + 1) & (P.at_cap - 1);
    if (!P.at_keys[h]) { P.at_keys[h] = a; P.at_n++; }
    P.at_counts[h]++;
}

// kind: 0 load, 1 store, 2 atomic.
EMU_NOTSAN inline void prof_access(const volatile void* p, unsigned n, int kind, void* pc, unsigned piece) {
    if (!P.active || S.cur < 0) return;
    uintptr_t a = (uintptr_t)p;
    int space, region = -1;
    char* ar = arena();
    if (a - (uintptr_t)ar < kArenaBytes) {
        if (!(a - (uintptr_t)ar < kStaticSharedArena || a - (uintptr_t)dyn_ptr < dyn_shared_bytes)) return;
        space = 1;
        if (kind == 2) P.atomics_shared++;
    } else {
        for (int i = 0; i < P.n; ++i) if (a - P.g[i].lo < P.g[i].len) { region = i; break; }
        if (region < 0) return;  // the thread's own stack (local memory), host memory, ...
        space = 0;
        ProfRegion& g = P.g[region];
        uintptr_t off = a - g.lo;
        unsigned m = off + n <= g.len ? n : (unsigned)(g.len - off);
        if (kind != 0) prof_set_bits(g.wr, off, m);
        else prof_set_bits(g.rd, off, m);
        if (kind == 2) { P.atomics_global++; prof_atomic_addr(a); }
    }
    int id = prof_pcid((uintptr_t)pc, piece);
    uint32_t k = prof_count(id);
    if (k > (1u << 26) - 1) k = (1u << 26) - 1;
    if (P.log_n == P.log_cap) {
        size_t cap = P.log_cap ? P.log_cap * 2 : 4096;
        ProfRec* grown = (ProfRec*)realloc(P.log, cap * sizeof(ProfRec));
        if (!grown) { P.lost = 1; return; }  // out of memory: this access goes uncounted (reported)
        P.log = grown; P.log_cap = cap;
    }
    ProfRec& r = P.log[P.log_n++];
    // sorted by warp, code address, execution count, space, thread: an instance is a run
    r.key = ((uint64_t)(S.cur >> 5) << 49) | ((uint64_t)id << 37) | ((uint64_t)k << 11) | ((uint64_t)space << 10) | (uint64_t)S.cur;
    r.addr = a; r.size = n; r.region = (int16_t)region; r.kind = (uint8_t)kind; r.space = (uint8_t)space;
}

// An access that g++ reports as unaligned for its size, or as a byte range: a struct without the
// alignment of a vector type (12 bytes of `struct {float x, y, z;}`, 8 of `{float a, b;}`). A GPU
// cannot load it with one wide instruction and loads each field: split it into 4-byte (or
// smaller) pieces, each its own instruction. (float2, float4, double and the like are aligned
// to their size: g++ reports them as one access, as a GPU loads them with one instruction.)
EMU_NOTSAN inline void prof_access_split(const volatile void* p, unsigned n, int kind, void* pc) {
    if (!P.active) return;
    unsigned piece = n % 4 == 0 ? 4 : n % 2 == 0 ? 2 : 1;
    if (n <= 4 || n / piece > 32) { prof_access(p, n, kind, pc); return; }
    for (unsigned j = 0; j < n / piece; ++j) prof_access((const volatile char*)p + j * piece, piece, kind, pc, j + 1);
}

EMU_NOTSAN inline int prof_cmp_u64(const void* x, const void* y) {
    uint64_t a = *(const uint64_t*)x, b = *(const uint64_t*)y;
    return a < b ? -1 : a > b;
}
EMU_NOTSAN inline int prof_cmp_rec(const void* x, const void* y) {
    return prof_cmp_u64(&((const ProfRec*)x)->key, &((const ProfRec*)y)->key);
}
// The __shared__ array an address belongs to: its index in shared_regions, kMaxSharedRegions for
// the extern __shared__ buffer, -1 if none; *off: bytes from its start.
EMU_NOTSAN inline int prof_shared_array(uintptr_t a, long long* off) {
    if (a - (uintptr_t)dyn_ptr < dyn_shared_bytes) { *off = (long long)(a - (uintptr_t)dyn_ptr); return kMaxSharedRegions; }
    for (int i = 0; i < n_shared_regions; ++i) {
        uintptr_t lo = (uintptr_t)shared_regions[i].p;
        if (a - lo < shared_regions[i].n) { *off = (long long)(a - lo); return i; }
    }
    *off = (long long)(a - (uintptr_t)arena_base);
    return -1;
}

// One warp-wide instance: records [b, e) of the sorted log.
EMU_NOTSAN inline void prof_instance(const ProfRec* r, size_t b, size_t e) {
    static uint64_t units[kMaxThreads * 8];  // sectors or words (an access of up to 16 bytes: at most 2 sectors, 4 words)
    static uint64_t spans[64 * 2];
    int id = (int)((r[b].key >> 37) & 0xfff), space = r[b].space, warp = (int)(r[b].key >> 49);
    ProfSite& s = P.sites[id][space];
    size_t nu = 0;
    long long lanes = 0, bytes = 0;
    int last_tid = -1;
    // banks are numbered from the start of the first lane's __shared__ array (bank 0 there, as
    // for a GPU's first array; a shift of every address changes no conflict)
    uintptr_t sbase = (uintptr_t)arena_base;
    if (space == 1) { long long off; prof_shared_array(r[b].addr, &off); sbase = r[b].addr - (uintptr_t)off; }
    for (size_t i = b; i < e; ++i) {
        int tid = (int)(r[i].key & 1023);
        if (tid != last_tid) { lanes++; last_tid = tid; }
        bytes += r[i].size;
        uintptr_t lo, hi;
        if (space == 0) {
            const ProfRegion& g = P.g[r[i].region];
            lo = (r[i].addr - g.lo + g.phase) >> 5; hi = (r[i].addr - g.lo + g.phase + r[i].size - 1) >> 5;
            lo |= (uint64_t)r[i].region << 56; hi |= (uint64_t)r[i].region << 56;
        } else {
            lo = (r[i].addr - sbase) >> 2; hi = (r[i].addr - sbase + r[i].size - 1) >> 2;
        }
        for (uintptr_t u = lo; u <= hi && nu < sizeof units / sizeof units[0]; ++u) units[nu++] = u;
    }
    qsort(units, nu, sizeof(uint64_t), prof_cmp_u64);
    size_t distinct = 0;
    for (size_t i = 0; i < nu; ++i) if (!i || units[i] != units[i - 1]) units[distinct++] = units[i];
    s.used = 1;
    s.requests++;
    s.lanes += lanes;
    s.possible_lanes += prof_warp_lanes(warp);
    s.bytes += bytes;
    if (space == 0) {
        // the bytes this request needed: the union of its lanes' byte ranges
        size_t ns = 0;
        for (size_t i = b; i < e && ns < 64; ++i) { spans[2 * ns] = r[i].addr; spans[2 * ns + 1] = r[i].addr + r[i].size; ns++; }
        qsort(spans, ns, 2 * sizeof(uint64_t), prof_cmp_u64);
        uint64_t need = 0, cur_lo = 0, cur_hi = 0;
        for (size_t i = 0; i < ns; ++i) {
            if (i == 0 || spans[2 * i] > cur_hi) { need += cur_hi - cur_lo; cur_lo = spans[2 * i]; cur_hi = spans[2 * i + 1]; }
            else if (spans[2 * i + 1] > cur_hi) cur_hi = spans[2 * i + 1];
        }
        need += cur_hi - cur_lo;
        if (r[b].kind == 2) {
            // Atomics: lanes that update the same address are served one after the other, and
            // Nsight Compute counts a sector per turn (32 for a warp's atomicAdd to one address,
            // on an H100): per sector, the most lanes on one of its addresses.
            static uint64_t addrs[64];
            size_t na = 0;
            for (size_t i = b; i < e && na < 64; ++i) addrs[na++] = r[i].addr;
            qsort(addrs, na, sizeof(uint64_t), prof_cmp_u64);
            long long turns = 0, run = 0, best = 0;
            uint64_t sector = ~(uint64_t)0;
            for (size_t i = 0; i < na; ++i) {
                const ProfRegion& g = P.g[r[b].region];
                uint64_t sec = (addrs[i] - g.lo + g.phase) >> 5;
                if (sec != sector) { turns += best; best = 0; sector = sec; run = 0; }
                run = (i > 0 && addrs[i] == addrs[i - 1]) ? run + 1 : 1;
                if (run > best) best = run;
            }
            distinct = (size_t)(turns + best);
        }
        s.sectors += (long long)distinct;
        s.ideal_sectors += (long long)((need + 31) / 32);
    } else {
        int per_bank[32] = {0};
        int worst = 0, wbank = 0;
        for (size_t i = 0; i < distinct; ++i) {
            int bank = (int)(units[i] & 31);
            if (++per_bank[bank] > worst) { worst = per_bank[bank]; wbank = bank; }
        }
        long long ideal = ((long long)distinct + 31) / 32;
        if (ideal < 1) ideal = 1;
        s.wavefronts += worst;
        s.ideal_wavefronts += ideal;
        if (worst > s.worst_wavefronts) {  // how many lanes touched the worst bank
            long long wl = 0;
            for (size_t i = b; i < e; ++i) {
                uintptr_t w0 = (r[i].addr - sbase) >> 2, w1 = (r[i].addr - sbase + r[i].size - 1) >> 2;
                for (uintptr_t w = w0; w <= w1; ++w) if ((int)(w & 31) == wbank) { wl++; break; }
            }
            s.worst_wavefronts = worst; s.worst_bank = wbank; s.worst_lanes = wl;
            s.has_worst_stride = e - b >= 2;
            s.worst_stride = e - b >= 2 ? (long long)(r[b + 1].addr - r[b].addr) : 0;
        }
    }
    if (s.requests == 1) {  // the first instance describes the site
        s.kind = r[b].kind; s.size = r[b].size;
        if (space == 0) { s.region = r[b].region; s.first_offset = (long long)(r[b].addr - P.g[r[b].region].lo); }
        else { long long off; s.region = prof_shared_array(r[b].addr, &off); s.first_offset = off; }
        if (e - b >= 2) {
            long long dl = (long long)(r[b + 1].key & 1023) - (long long)(r[b].key & 1023);
            long long da = (long long)(r[b + 1].addr - r[b].addr);
            s.has_stride = dl > 0;
            s.stride = da;  // between the first two active lanes
        }
    }
    long long instr = P.instr++;
    for (size_t i = b; i < e; ++i) {
        if (P.trace_n >= P.trace_cap) { if (P.trace_cap) P.trace_overflow = 1; break; }
        ProfTraceRec& t = P.trace[P.trace_n++];
        t.block = (long long)P.block; t.thread = (long long)(r[i].key & 1023); t.space = space; t.op = r[i].kind;
        t.size = r[i].size; t.pcid = id; t.instr = instr; t.region = r[i].region;
        if (space == 0) { t.offset = (long long)(r[i].addr - P.g[r[i].region].lo); t.shared_array = -1; }
        else { long long off; t.shared_array = prof_shared_array(r[i].addr, &off); t.offset = off; }
    }
}

EMU_NOTSAN inline void prof_block_start(unsigned long long lb) {
    if (!P.active) return;
    P.block = lb;
    P.log_n = 0;
    for (unsigned t = 0; t < S.nthreads; ++t) memset(P.cnt + (size_t)t * kProfMaxPc, 0, (size_t)P.npc * sizeof(uint32_t));
    for (unsigned w = 0; w < (S.nthreads + 31) / 32; ++w) memset(P.wmax[w], 0, (size_t)P.npc * sizeof(uint32_t));
}
EMU_NOTSAN inline void prof_block_end() {
    if (!P.active || !P.log_n) return;
    qsort(P.log, P.log_n, sizeof(ProfRec), prof_cmp_rec);
    size_t b = 0;
    for (size_t i = 1; i <= P.log_n; ++i)
        if (i == P.log_n || (P.log[i].key >> 10) != (P.log[b].key >> 10)) { prof_instance(P.log, b, i); b = i; }
    P.log_n = 0;
}
EMU_NOTSAN inline void prof_launch_start() {
    P.active = P.want && P.cnt;
    if (P.active && !P.lib_base) {
        Dl_info di;
        if (dladdr((void*)&prof_bb, &di)) P.lib_base = (uintptr_t)di.dli_fbase;
    }
}
EMU_NOTSAN inline void prof_free() {
    for (int i = 0; i < kProfMaxRegions; ++i) {
        ProfRegion& g = P.g[i];
        if (g.rd) { munmap(g.rd, g.bits_bytes); munmap(g.wr, g.bits_bytes); g.rd = g.wr = nullptr; }
    }
    P.n = 0;
    free(P.at_keys); free(P.at_counts); P.at_keys = nullptr; P.at_counts = nullptr; P.at_cap = P.at_n = 0;
    free(P.trace); P.trace = nullptr; P.trace_n = P.trace_cap = 0;
    free(P.log); P.log = nullptr; P.log_n = P.log_cap = 0;
}
EMU_NOTSAN inline long long prof_popcount(const unsigned char* bits, size_t n, const unsigned char* or_bits = nullptr) {
    long long c = 0;
    for (size_t i = 0; i < n; ++i) c += __builtin_popcount(bits[i] | (or_bits ? or_bits[i] : 0));
    return c;
}
}  // namespace emu
#if !defined(EMU_RUNTIME_SPLIT)
extern "C" {
// trace-pc: called at the start of every basic block of kernel code.
EMU_NOTSAN void __sanitizer_cov_trace_pc() { emu::prof_bb((uintptr_t)__builtin_return_address(0)); }
}
#endif
EMU_NS {
#endif  // EMU_PROFILE

// -------------------------------- context switch ---------------------------------------
#ifndef EMU_UCONTEXT
// Saves the callee-saved registers of x86-64 on the current stack, stores the stack
// pointer in *from, loads `to` and pops the registers saved there. About 5 ns, against
// about 150 ns for swapcontext (which also saves the signal mask with a system call).
extern "C" void emu_switch_ctx(void** from, void* to);
asm(R"(
    .text
    .weak emu_switch_ctx
    .hidden emu_switch_ctx
    .type emu_switch_ctx,@function
emu_switch_ctx:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_ctx, .-emu_switch_ctx
)");
#endif

void fiber_entry();

EMU_NOTSAN inline char* stack_base(int i) { return S.stack_pool + (size_t)i * (kStackSize + kStackGuard) + kStackGuard; }

EMU_NOTSAN inline void ensure_stacks() {
    if (S.stack_pool) return;
    size_t total = (size_t)kMaxThreads * (kStackSize + kStackGuard);
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { fprintf(stderr, "cuda emulator: cannot reserve thread stacks\n"); abort(); }
    S.stack_pool = (char*)p;
    // A guard page below each stack turns a stack overflow into a clear fault.
    for (int i = 0; i < kMaxThreads; ++i) mprotect(S.stack_pool + (size_t)i * (kStackSize + kStackGuard), kStackGuard, PROT_NONE);
}

EMU_NOTSAN inline void reset_stacks() {
    S.n_free = kMaxThreads;
    for (int i = 0; i < kMaxThreads; ++i) S.free_stacks[i] = kMaxThreads - 1 - i;  // pop gives 0 first
}

EMU_NOTSAN inline void switch_to_scheduler() {
    Thread& t = S.th[S.cur];
#ifdef EMU_UCONTEXT
    if (!_setjmp(t.jb)) _longjmp(S.main_jb, 1);
#else
    emu_switch_ctx(&t.sp, S.main_sp);
#endif
}

EMU_NOTSAN inline unsigned long long rng_next() {
    unsigned long long x = S.rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    S.rng = x;
    return x * 0x2545F4914F6CDD1DULL;
}

EMU_NOTSAN inline void push_ready(int t) { S.queue[S.qtail++ & (2 * kMaxThreads - 1)] = t; S.th[t].state = ST_READY; }

// Push threads in ascending order, or shuffled in random mode.
EMU_NOTSAN inline void push_many(int* ids, int n) {
    if (S.random) {
        for (int i = n - 1; i > 0; --i) {
            int j = (int)(rng_next() % (unsigned long long)(i + 1));
            int tmp = ids[i]; ids[i] = ids[j]; ids[j] = tmp;
        }
    }
    for (int i = 0; i < n; ++i) push_ready(ids[i]);
}

EMU_NOTSAN inline void resume(int t) {
    Thread& T = S.th[t];
    S.cur = t;
    threadIdx = T.tid;
    T.state = ST_RUNNING;
    if (!T.started) {
        T.started = 1;
        T.stack = S.free_stacks[--S.n_free];
        char* top = stack_base(T.stack) + kStackSize;
#ifdef EMU_UCONTEXT
        (void)top;
        int k = T.stack;
        if (!_setjmp(S.main_jb)) {
            if (S.booted[k]) _longjmp(S.park[k], 1);  // a parked fiber takes this thread
            S.booted[k] = 1;
            getcontext(&S.boot_uc);
            S.boot_uc.uc_stack.ss_sp = stack_base(k);
            S.boot_uc.uc_stack.ss_size = kStackSize;
            S.boot_uc.uc_link = nullptr;
            makecontext(&S.boot_uc, (void (*)())fiber_entry, 0);
            setcontext(&S.boot_uc);
        }
#else
        void** sp = (void**)top;
        *--sp = nullptr;                 // fake return address of fiber_entry (alignment)
        *--sp = (void*)&fiber_entry;     // where the first switch "returns" to
        for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12-r15
        T.sp = sp;
        emu_switch_ctx(&S.main_sp, T.sp);
#endif
    } else {
#ifdef EMU_UCONTEXT
        if (!_setjmp(S.main_jb)) _longjmp(T.jb, 1);
#else
        emu_switch_ctx(&S.main_sp, T.sp);
#endif
    }
    // The fiber may have run several threads (see fiber_entry): the last one is S.cur.
    Thread& R = S.th[S.cur];
    if (R.state == ST_DONE && R.stack >= 0) {  // its stack can be reused
        S.free_stacks[S.n_free++] = R.stack;
        R.stack = -1;
    }
}

// The body of every fiber. When a thread returns without having waited at a barrier and
// the next thread in the queue has not started yet, that thread runs right here, on the
// same stack, without a switch: a kernel without barriers costs one switch per fiber,
// not two per thread.
EMU_NOTSAN inline void fiber_entry() {
    for (;;) {
        S.thunk(S.ctx);
        Thread& t = S.th[S.cur];
        t.state = ST_DONE;
        S.n_done++;
        if (S.qhead != S.qtail) {
            int nxt = S.queue[S.qhead & (2 * kMaxThreads - 1)];
            Thread& N = S.th[nxt];
            if (!N.started) {
                S.qhead++;
                N.started = 1;
                N.stack = t.stack;  // hand the stack over
                t.stack = -1;
                N.state = ST_RUNNING;
                S.cur = nxt;
                threadIdx = N.tid;
                continue;
            }
        }
#ifdef EMU_UCONTEXT
        int k = t.stack;
        if (!_setjmp(S.park[k])) _longjmp(S.main_jb, 1);
        // woken by resume(): S.cur is a fresh thread that now owns stack k
#else
        switch_to_scheduler();
        __builtin_unreachable();
#endif
    }
}

// ------------------------------- fault descriptions ------------------------------------
inline int appendf(char* buf, int pos, int cap, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
EMU_NOTSAN inline int appendf(char* buf, int pos, int cap, const char* fmt, ...) {
    if (pos >= cap - 1) return pos;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + pos, (size_t)(cap - pos), fmt, ap);
    va_end(ap);
    if (n < 0) return pos;
    return pos + n < cap ? pos + n : cap - 1;
}

EMU_NOTSAN inline int describe_thread_range(char* buf, int pos, int cap, int a, int b) {
    if (S.bdim.y == 1 && S.bdim.z == 1) {
        if (a == b) return appendf(buf, pos, cap, "thread %d", a);
        return appendf(buf, pos, cap, "threads %d-%d", a, b);
    }
    uint3 ta = S.th[a].tid, tb = S.th[b].tid;
    if (a == b) return appendf(buf, pos, cap, "thread (%u,%u,%u)", ta.x, ta.y, ta.z);
    return appendf(buf, pos, cap, "threads (%u,%u,%u)-(%u,%u,%u)", ta.x, ta.y, ta.z, tb.x, tb.y, tb.z);
}

// What every thread of the block is doing, grouped into runs of consecutive threads.
EMU_NOTSAN inline int describe_block(char* buf, int pos, int cap) {
    int n = (int)S.nthreads;
    int start = 0, groups = 0;
    for (int i = 1; i <= n; ++i) {
        bool same = false;
        if (i < n) {
            const Thread &p = S.th[i - 1], &q = S.th[i];
            same = p.state == q.state &&
                   (p.state == ST_DONE || (p.line == q.line && p.op == q.op)) &&
                   (p.state != ST_WAIT_WARP || (i % 32 != 0)) && (p.state != ST_WAIT_TILE || i % p.width != 0);
        }
        if (same) continue;
        if (groups++ > 40) { pos = appendf(buf, pos, cap, "\n  ..."); break; }
        const Thread& p = S.th[start];
        pos = appendf(buf, pos, cap, "\n  ");
        pos = describe_thread_range(buf, pos, cap, start, i - 1);
        if (p.state == ST_DONE) pos = appendf(buf, pos, cap, ": already returned");
        else if (p.state == ST_WAIT_BLOCK) pos = appendf(buf, pos, cap, ": wait at __syncthreads() on line %d", p.line);
        else if (p.state == ST_WAIT_WARP)
            pos = appendf(buf, pos, cap, ": wait at %s(mask=0x%08x) on line %d (warp %d)", op_names[p.op], p.mask, p.line, start / 32);
        else if (p.state == ST_WAIT_EXT) pos = appendf(buf, pos, cap, ": wait in %s on line %d", p.what, p.line);
        else if (p.state == ST_WAIT_TILE)
            pos = appendf(buf, pos, cap, ": wait in a collective of thread_block_tile<%d> (tile %d) on line %d", p.width,
                          start / p.width, p.line);
        else pos = appendf(buf, pos, cap, ": running");
        start = i;
    }
    return pos;
}

[[noreturn]] EMU_NOTSAN EMU_RT void fault_deadlock(const char* why) {
    emu_fault_info& f = S.fault;
    f.kind = 1;
    f.block[0] = (int)blockIdx.x; f.block[1] = (int)blockIdx.y; f.block[2] = (int)blockIdx.z;
    int pos = appendf(f.msg, 0, sizeof f.msg, "%s in block (%u,%u,%u):", why, blockIdx.x, blockIdx.y, blockIdx.z);
    pos = describe_block(f.msg, pos, sizeof f.msg);
    siglongjmp(S.jmp, 1);
}

// Records a fault of `kind` in the current block, with its message; the caller ends the launch.
EMU_NOTSAN inline emu_fault_info& record_fault(int kind, const char* fmt, va_list ap) {
    emu_fault_info& f = S.fault;
    f.kind = kind;
    f.block[0] = (int)blockIdx.x; f.block[1] = (int)blockIdx.y; f.block[2] = (int)blockIdx.z;
    vsnprintf(f.msg, sizeof f.msg, fmt, ap);
    return f;
}

[[noreturn]] EMU_NOTSAN inline void fault_trap(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emu_fault_info& f = record_fault(5, fmt, ap);
    va_end(ap);
    f.thread[0] = (int)threadIdx.x; f.thread[1] = (int)threadIdx.y; f.thread[2] = (int)threadIdx.z;
    siglongjmp(S.jmp, 1);
}

// A fault that the whole block made (no one thread): the launch ends with the message.
[[noreturn]] EMU_NOTSAN __attribute__((format(printf, 2, 3))) inline void fault_in_block(int kind, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record_fault(kind, fmt, ap);
    va_end(ap);
    siglongjmp(S.jmp, 1);
}

// ---------------------------------- barriers -------------------------------------------
// `site` is unique to each __syncthreads() in the source (two on one line differ too).
EMU_NOTSAN inline int syncthreads_impl(int line, int pred, const void* site) {
    Thread& me = S.th[S.cur];
    me.state = ST_WAIT_BLOCK;
    me.line = line;
    me.op = OP_NONE;
    me.pred = pred;
    if (S.n_wait_block++ == 0) S.block_site = site;
    else if (site != S.block_site) S.block_mixed = 1;
    switch_to_scheduler();
    return S.bar_result;
}

EMU_NOTSAN inline unsigned long long warp_collective(int op, unsigned mask, unsigned long long value, int arg, int width, int line) {
    int cur = S.cur;
    Thread& me = S.th[cur];
    int lane = cur & 31, warp = cur >> 5, base = warp << 5;
    int nlanes = (int)S.nthreads - base; if (nlanes > 32) nlanes = 32;
    unsigned exist = nlanes == 32 ? 0xffffffffu : ((1u << nlanes) - 1u);
    if (!(mask & (1u << lane)))
        fault_trap("%s on line %d: lane %d calls it with mask 0x%08x, which does not include the lane itself",
                   op_names[op], line, lane, mask);
    if (width <= 0 || width > 32 || (width & (width - 1)))
        fault_trap("%s on line %d: width must be a power of two between 1 and 32, got %d", op_names[op], line, width);
    me.state = ST_WAIT_WARP; me.op = op; me.mask = mask; me.value = value; me.arg = arg; me.width = width; me.line = line;
    unsigned need = mask & exist;
    unsigned& arrived = S.warp_arrived[warp];
    arrived |= 1u << lane;
    if ((arrived & need) != need) { switch_to_scheduler(); return me.result; }
    // Every lane named in the mask is here: exchange the values.
    for (unsigned m = need; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        const Thread& t = S.th[base + l];
        if (t.op != op || t.mask != mask)
            fault_trap("warp %d on line %d: lanes named in mask 0x%08x disagree (lane %d is in %s(mask=0x%08x) on line %d, lane %d in %s(mask=0x%08x) on line %d)",
                       warp, line, mask, lane, op_names[op], mask, line, l, op_names[t.op], t.mask, t.line);
    }
    race_warp_sync(warp, need, need == exist);
    unsigned ballot = 0;
    if (op == OP_BALLOT || op == OP_ANY || op == OP_ALL)
        for (unsigned m = need; m; m &= m - 1) { int l = __builtin_ctz(m); if (S.th[base + l].value) ballot |= 1u << l; }
    for (unsigned m = need; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        Thread& t = S.th[base + l];
        int w = t.width, seg = l & ~(w - 1), src = l;
        switch (op) {
            case OP_SHFL: src = seg + (t.arg & (w - 1)); break;
            case OP_SHFL_UP: src = (l - seg) >= t.arg ? l - t.arg : l; break;
            case OP_SHFL_DOWN: src = (l - seg) + t.arg < w ? l + t.arg : l; break;
            case OP_SHFL_XOR: src = l ^ t.arg; if (src >= seg + w || src < 0 || src >= 32) src = l; break;
            default: break;
        }
        if (src != l && !((need >> src) & 1u)) {
            // Undefined on a GPU (it returns whatever the hardware has): reported, not given a meaning.
            if (base + src >= (int)S.nthreads)
                fault_trap("%s on line %d: lane %d of warp %d reads lane %d, which does not exist (the block has %u "
                           "threads): keep the source lane inside the block, or give the block a multiple of 32 threads",
                           op_names[op], t.line, l, warp, src, S.nthreads);
            fault_trap("%s on line %d: lane %d of warp %d reads lane %d, which is not in the mask 0x%08x: the value is "
                       "undefined on a GPU. Name every source lane in the mask (a shrinking mask needs a shrinking "
                       "offset), or shuffle with the full mask 0xffffffff",
                       op_names[op], t.line, l, warp, src, mask);
        }
        if (op == OP_BALLOT) t.result = ballot;
        else if (op == OP_ANY) t.result = ballot != 0;
        else if (op == OP_ALL) t.result = ballot == need;
        else if (op == OP_SYNCWARP) t.result = 0;
        else t.result = ((need >> src) & 1u) ? S.th[base + src].value : t.value;  // an absent source: own value
    }
    arrived &= ~need;
    for (unsigned m = need; m; m &= m - 1) {
        int l = __builtin_ctz(m);
        if (base + l != cur) push_ready(base + l);
    }
    me.state = ST_RUNNING;
    return me.result;
}

// The barrier of a thread_block_tile of `size` threads (64..1024, several whole warps): the
// threads [k*size, k*size + size) of the block. cooperative_groups.h builds the tile's
// collectives on it, as CUDA builds them on a barrier in shared memory.
EMU_NOTSAN inline void tile_sync(unsigned size, int line) {
    int cur = S.cur;
    Thread& me = S.th[cur];
    int level = __builtin_ctz(size) - 6, tile = cur / (int)size;
    me.state = ST_WAIT_TILE; me.op = OP_NONE; me.width = (int)size; me.line = line;
    if (++S.tile_arrived[level][tile] < (int)size) { switch_to_scheduler(); return; }
    S.tile_arrived[level][tile] = 0;
    race_tile_sync(level, tile);
    static int ids[kMaxThreads];
    int k = 0;
    for (int t = tile * (int)size; t < (tile + 1) * (int)size; ++t) if (t != cur) ids[k++] = t;
    push_many(ids, k);
    me.state = ST_RUNNING;
}

// coalesced_threads(): the lanes of the warp that are "active" here. A GPU gives the lanes that
// arrive at the call together (those that took the same branch); here each thread runs on its
// own until it waits, so the call waits until no thread of the block can run, and the lanes of
// one warp waiting at the same call (file and line) form the group. Like a GPU's, the group is
// never the lanes that went elsewhere, so its shuffles and votes are well defined.
EMU_NOTSAN inline unsigned coalesced_wait(int line, const char* file) {
    Thread& me = S.th[S.cur];
    me.state = ST_WAIT_COALESCED; me.op = OP_NONE; me.line = line; me.arg = line;
    me.value = (unsigned long long)(uintptr_t)file;
    S.n_wait_coalesced++;
    switch_to_scheduler();
    return (unsigned)me.result;
}
EMU_NOTSAN EMU_RT void resolve_coalesced() {
    static int ids[kMaxThreads];
    int n = (int)S.nthreads, k = 0;
    for (int t = 0; t < n; ++t) {
        Thread& a = S.th[t];
        if (a.state != ST_WAIT_COALESCED) continue;
        unsigned m = 0;
        for (int l = 0, base = t & ~31; l < 32 && base + l < n; ++l) {
            const Thread& b = S.th[base + l];
            if (b.state == ST_WAIT_COALESCED && b.arg == a.arg && b.value == a.value) m |= 1u << l;
        }
        a.result = m;
        ids[k++] = t;
    }
    S.n_wait_coalesced = 0;
    push_many(ids, k);
}

template <class T> inline unsigned long long to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    unsigned long long b = 0; memcpy(&b, &v, sizeof(T)); return b;
}
template <class T> inline T from_bits(unsigned long long b) { T v; memcpy(&v, &b, sizeof(T)); return v; }

// ---------------------------------- one block ------------------------------------------
// `when`: "before the __syncthreads() on line 12", "before the block ended".
EMU_NOTSAN EMU_RT void check_shared_guards(const char* when) {
    const unsigned char* dg = (const unsigned char*)dyn_ptr + dyn_shared_bytes;
    for (size_t k = 0; k < kSharedGuard; ++k) {
        if (guard_byte_ok(dg, k)) continue;
        // The first changed byte may be the second of an element whose first byte happened to
        // match the guard pattern: name the element's first byte.
        unsigned long long byte = (dyn_shared_bytes + k) / dyn_elem * dyn_elem;
        fault_in_block(7,
                 "a thread of block (%u,%u,%u) wrote byte %llu of the dynamic (extern __shared__) shared memory, "
                 "but the launch asked for %llu byte%s, %s. The size is the third launch parameter: "
                 "k[grid, block, shared_bytes](...) (<<<grid, block, shared_bytes>>> in C++); is it missing, "
                 "or counted in elements instead of bytes?",
                 blockIdx.x, blockIdx.y, blockIdx.z, byte,
                 (unsigned long long)dyn_shared_bytes, dyn_shared_bytes == 1 ? "" : "s", when);
    }
    int i; bool past; long long idx;
    if (!find_shared_overrun(&i, &past, &idx)) {
        // the rest of the last page after the static variables (checked after the arrays' own guards)
        const unsigned char* want = slack_guard(arena_used);
        if (arena_rw > arena_used && !memcmp(arena_base + arena_used, want, arena_rw - arena_used)) return;
        for (size_t k = arena_used; k < arena_rw; ++k) {
            if ((unsigned char)arena_base[k] == want[k - arena_used]) continue;
            fault_in_block(7,
                     "a thread of block (%u,%u,%u) wrote shared memory %llu bytes past the end of the last __shared__ "
                     "variable, %s: an index far out of range of a __shared__ array. Check every index into your "
                     "__shared__ arrays.", blockIdx.x, blockIdx.y, blockIdx.z, (unsigned long long)(k - arena_used + 1), when);
        }
        return;
    }
    SharedRegion& r = shared_regions[i];
    long long count = (long long)(r.n / r.elem);
    fault_in_block(7,
             "a thread of block (%u,%u,%u) wrote %s[%lld], %s of the __shared__ array `%s` (%lld element%s, "
             "valid indices 0..%lld), %s. On a GPU such a write silently changes other shared variables "
             "(or, past the block's shared memory, fails the launch). Check every index into `%s` (a thread index, or t + stride in a tree, must stay "
             "below the array's size).",
             blockIdx.x, blockIdx.y, blockIdx.z, r.name, idx, past ? "past the end" : "before the start",
             r.name, count, count == 1 ? "" : "s", count - 1, when, r.name);
}

// Hooks of the emulator's extensions (hopper_emu.h sets them when a kernel includes it):
// at the start and the end of each block, and when no thread can run (true: it made some
// runnable again; it reports a stuck block itself).
struct BlockHooks { void (*begin)(); void (*end)(); bool (*stuck)(); };
inline BlockHooks block_hooks = {nullptr, nullptr, nullptr};

EMU_NOTSAN EMU_RT void run_block() {
    int n = (int)S.nthreads;
    S.n_done = 0; S.n_wait_block = 0; S.block_mixed = 0; S.qhead = S.qtail = 0;
    for (int w = 0; w < (n + 31) / 32; ++w) S.warp_arrived[w] = 0;
    memset(S.tile_arrived, 0, sizeof S.tile_arrived);
    S.n_wait_coalesced = 0;
    static int ids[kMaxThreads];
    poison_shared();
    for (int t = 0; t < n; ++t) { S.th[t].started = 0; S.th[t].stack = -1; S.th[t].op = OP_NONE; S.th[t].line = 0; ids[t] = t; }
    push_many(ids, n);
    if (block_hooks.begin) block_hooks.begin();
    for (;;) {
        while (S.qhead != S.qtail) resume(S.queue[S.qhead++ & (2 * kMaxThreads - 1)]);
        if (S.n_done == n) {
            if (block_hooks.end) block_hooks.end();
            check_shared_guards("before the block ended");
            return;
        }
        if (block_hooks.stuck && block_hooks.stuck()) continue;
        if (S.n_wait_coalesced) {  // nobody else can run: the lanes at each coalesced_threads() meet
            resolve_coalesced();
            continue;
        }
        // Nobody can run. Either every live thread waits at the same __syncthreads, or
        // the block is stuck.
        int live = n - S.n_done;
        if (S.n_wait_block == live && S.n_done == 0 && !S.block_mixed) {
            {
                char when[64];
                snprintf(when, sizeof when, "before the __syncthreads() on line %d", S.th[0].line);
                check_shared_guards(when);
            }
            int k = 0, count = 0;
            for (int t = 0; t < n; ++t) { ids[k++] = t; count += S.th[t].pred != 0; }
            S.bar_result = count;
            race_barrier();
            S.n_wait_block = 0;
            push_many(ids, k);
            continue;
        }
        if (S.n_wait_block == live && S.n_done > 0)
            fault_deadlock("__syncthreads() that some threads never reach (they returned before it)");
        if (S.n_wait_block == live)
            fault_deadlock("threads wait at different __syncthreads() calls");
        bool tile = false;
        for (int t = 0; t < n; ++t) tile = tile || S.th[t].state == ST_WAIT_TILE;
        if (S.n_wait_block > 0)
            fault_deadlock(tile ? "__syncthreads() and a collective of a thread_block_tile wait for each other"
                                : "__syncthreads() and a warp collective wait for each other");
        if (tile)
            fault_deadlock("a collective of a thread_block_tile (sync, shfl, any, all, reduce) that some threads of "
                           "the tile never reach");
        fault_deadlock("a warp collective that some lanes named in its mask never reach");
    }
}

// ---------------------------------- signals --------------------------------------------
inline struct sigaction old_actions[32];
inline const int fault_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGINT};
alignas(16) inline char alt_stack[64 * 1024];

EMU_NOTSAN EMU_RT void on_signal(int sig, siginfo_t* si, void* uctx) {
    if (!S.in_launch) {  // not ours: hand it to whoever had it before
        struct sigaction& o = old_actions[sig];
        if (o.sa_flags & SA_SIGINFO) { if (o.sa_sigaction) o.sa_sigaction(sig, si, uctx); return; }
        if (o.sa_handler == SIG_IGN) return;
        if (o.sa_handler == SIG_DFL) { signal(sig, SIG_DFL); raise(sig); return; }
        o.sa_handler(sig);
        return;
    }
    emu_fault_info& f = S.fault;
    f.kind = sig == SIGINT ? 3 : 2;
    f.sig = sig;
    f.addr = (unsigned long long)(uintptr_t)si->si_addr;
    f.is_write = -1;
#if defined(__x86_64__) && defined(__linux__) && defined(REG_ERR)
    if (sig == SIGSEGV && uctx) f.is_write = (int)((((ucontext_t*)uctx)->uc_mcontext.gregs[REG_ERR] >> 1) & 1);
#endif
    f.thread[0] = (int)threadIdx.x; f.thread[1] = (int)threadIdx.y; f.thread[2] = (int)threadIdx.z;
    f.block[0] = (int)blockIdx.x; f.block[1] = (int)blockIdx.y; f.block[2] = (int)blockIdx.z;
    char* a = (char*)si->si_addr;
    if ((sig == SIGSEGV || sig == SIGBUS) && S.stack_pool && a >= S.stack_pool - kStackGuard &&
        a < S.stack_pool + (size_t)kMaxThreads * (kStackSize + kStackGuard) && S.cur >= 0 &&
        a < stack_base(S.th[S.cur].stack < 0 ? 0 : S.th[S.cur].stack)) {
        f.kind = 6;  // it hit the guard page below a thread's stack
        snprintf(f.msg, sizeof f.msg, "each emulated thread has a %zu KiB stack", kStackSize / 1024);
    }
    if ((sig == SIGSEGV || sig == SIGBUS) && in_arena_guard(a)) {
        f.kind = 7;  // far past (or before) every __shared__ variable
        const char* what = f.is_write == 1 ? "wrote" : f.is_write == 0 ? "read" : "accessed";
        long long off; const char* where;
        if (a < arena_base) { off = arena_base - a; where = "before the first __shared__ variable"; }
        else if (a < arena_base + kStaticSharedArena) { off = a - (arena_base + arena_used) + 1; where = "past the end of the last __shared__ variable"; }
        else if (a < dyn_ptr) { off = dyn_ptr - a; where = "before the start of the extern __shared__ memory"; }
        else { off = a - (dyn_ptr + dyn_shared_bytes) + 1; where = "past the end of the extern __shared__ memory the launch asked for"; }
        snprintf(f.msg, sizeof f.msg,
                 "thread (%u,%u,%u) of block (%u,%u,%u) %s shared memory %lld bytes %s: an index far out of range "
                 "of a __shared__ array (on a GPU such an access fails the launch). Check every index into your "
                 "__shared__ arrays.", threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                 what, off, where);
    }
    siglongjmp(S.jmp, 1);
}

struct SignalGuard {
    stack_t old_ss;
    SignalGuard() {
        stack_t ss;
        ss.ss_sp = alt_stack; ss.ss_size = sizeof alt_stack; ss.ss_flags = 0;
        sigaltstack(&ss, &old_ss);  // a fault on a fiber's stack must not need that stack
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        for (int s : fault_signals) sigaction(s, &sa, &old_actions[s]);
    }
    ~SignalGuard() {
        for (int s : fault_signals) sigaction(s, &old_actions[s], nullptr);
        sigaltstack(&old_ss, nullptr);
    }
};

// ---------------------------------- launch ---------------------------------------------
// Returns 0, or the kind of fault (details in S.fault).
EMU_NOTSAN EMU_RT int launch(const emu_launch_params& p, void (*thunk)(void*), void* ctx) {
    memset(&S.fault, 0, sizeof S.fault);
    unsigned nthreads = p.block[0] * p.block[1] * p.block[2];
    if (nthreads == 0 || nthreads > (unsigned)kMaxThreads || p.block[2] > 64 || p.grid[1] > 65535 || p.grid[2] > 65535) {
        S.fault.kind = 4;
        snprintf(S.fault.msg, sizeof S.fault.msg,
                 "invalid launch configuration: block (%u,%u,%u) grid (%u,%u,%u); a block has at most 1024 threads "
                 "(blockDim.z <= 64) and gridDim.y, gridDim.z are at most 65535",
                 p.block[0], p.block[1], p.block[2], p.grid[0], p.grid[1], p.grid[2]);
        return 4;
    }
    if (p.shared_bytes > kMaxDynamicShared) {
        S.fault.kind = 4;
        snprintf(S.fault.msg, sizeof S.fault.msg, "dynamic shared memory of %llu bytes requested; at most %zu bytes per block",
                 p.shared_bytes, kMaxDynamicShared);
        return 4;
    }
    if ((unsigned long long)p.grid[0] * p.grid[1] * p.grid[2] == 0) return 0;  // nothing to run
    // Each stack has a guard page, i.e. two memory mappings; one pool for the whole process
    // (passed in by the Python side) keeps far below the kernel's limit on mappings.
    if (p.stack_pool) S.stack_pool = (char*)(uintptr_t)p.stack_pool;
    ensure_stacks();
    reset_stacks();
#ifdef EMU_UCONTEXT
    // Parked fibers live on the shared stacks, which other kernel libraries reuse between
    // launches: start afresh.
    memset(S.booted, 0, sizeof S.booted);
#endif
    S.thunk = thunk; S.ctx = ctx;
    S.nthreads = nthreads;
    blockDim = dim3(p.block[0], p.block[1], p.block[2]);
    gridDim = dim3(p.grid[0], p.grid[1], p.grid[2]);
    S.bdim = blockDim;
    for (unsigned t = 0; t < nthreads; ++t)
        S.th[t].tid = uint3{t % p.block[0], (t / p.block[0]) % p.block[1], t / (p.block[0] * p.block[1])};
    S.random = p.schedule == 1;
    S.rng = p.seed * 0x9E3779B97F4A7C15ULL + 0x1234567ULL;
    if (S.rng == 0) S.rng = 1;
    dyn_shared_bytes = p.shared_bytes;
    place_dynamic_shared(p.shared_bytes);
    if (arena_overflow) {
        S.fault.kind = 4;
        snprintf(S.fault.msg, sizeof S.fault.msg, "the static __shared__ variables of this source take more than %zu KiB "
                 "(a GPU block has at most 48 KiB of static shared memory)", kStaticSharedArena / 1024);
        return 4;
    }
    SignalGuard guard;
    S.in_launch = 1;
    if (sigsetjmp(S.jmp, 1) != 0) {
        S.in_launch = 0;
        R.active = 0;
#if defined(EMU_PROFILE)
        P.active = 0;
#endif
        return S.fault.kind;
    }
#if defined(EMU_RACECHECK)
    R.want = p.racecheck;
#else
    R.want = 0;
#endif
    race_launch_start();
#if defined(EMU_PROFILE)
    prof_launch_start();
#endif
    unsigned long long nblocks = (unsigned long long)p.grid[0] * p.grid[1] * p.grid[2];
    static unsigned long long* order = nullptr;  // freed here, also after a fault
    free(order);
    order = nullptr;
    for (unsigned long long b = 0; b < nblocks; ++b) {
        unsigned long long lb = b;
        if (S.random) {  // blocks run in any order on a GPU too
            if (!order) {
                order = (unsigned long long*)malloc(sizeof(unsigned long long) * nblocks);
                for (unsigned long long i = 0; i < nblocks; ++i) order[i] = i;
                for (unsigned long long i = nblocks - 1; i > 0; --i) {
                    unsigned long long j = rng_next() % (i + 1), tmp = order[i];
                    order[i] = order[j]; order[j] = tmp;
                }
            }
            lb = order[b];
        }
        blockIdx = uint3{(unsigned)(lb % p.grid[0]), (unsigned)((lb / p.grid[0]) % p.grid[1]),
                         (unsigned)(lb / ((unsigned long long)p.grid[0] * p.grid[1]))};
        race_block_start(lb, nthreads);
#if defined(EMU_PROFILE)
        prof_block_start(lb);
        run_block();
        prof_block_end();
#else
        run_block();
#endif
    }
    S.in_launch = 0;
    R.active = 0;
#if defined(EMU_PROFILE)
    P.active = 0;
#endif
    return 0;
}

// --------------------------- kernels called from Python --------------------------------
template <class T> struct tcode { static const char* get() { return nullptr; } };
#define EMU_TCODE(T, C) template <> struct tcode<T> { static const char* get() { return C; } };
EMU_TCODE(float, "f") EMU_TCODE(double, "d") EMU_TCODE(int, "i") EMU_TCODE(unsigned, "I")
EMU_TCODE(long, "l") EMU_TCODE(unsigned long, "L") EMU_TCODE(long long, "q") EMU_TCODE(unsigned long long, "Q")
EMU_TCODE(short, "h") EMU_TCODE(unsigned short, "H") EMU_TCODE(char, "c") EMU_TCODE(signed char, "b")
EMU_TCODE(unsigned char, "B") EMU_TCODE(bool, "?") EMU_TCODE(void, "v")
#undef EMU_TCODE

template <class P> inline int append_code(char* buf, int pos) {
    typedef typename std::remove_cv<P>::type Q;
    if (std::is_pointer<Q>::value) {
        typedef typename std::remove_pointer<Q>::type E;
        pos += sprintf(buf + pos, std::is_const<E>::value ? "pc" : "p");
        typedef typename std::remove_cv<E>::type EE;
        const char* c = tcode<EE>::get();
        if (c) pos += sprintf(buf + pos, "%s", c);
        else if (std::is_pointer<EE>::value) pos += sprintf(buf + pos, "*");
        else pos += sprintf(buf + pos, "x%zu", sizeof(typename std::conditional<std::is_void<EE>::value, char, EE>::type));
    } else {
        const char* c = tcode<Q>::get();
        if (c) pos += sprintf(buf + pos, "%s", c);
        else pos += sprintf(buf + pos, "x%zu", sizeof(Q));
    }
    buf[pos++] = ',';
    buf[pos] = 0;
    return pos;
}

template <class... P> inline const char* signature(void (*)(P...)) {
    static char buf[1024];
    int pos = 0;
    buf[0] = 0;
    int dummy[] = {0, (pos = append_code<P>(buf, pos), 0)...};
    (void)dummy;
    if (pos > 0) buf[pos - 1] = 0;
    return buf;
}

template <class... P> struct ArgCall {
    void (*k)(P...);
    void** args;
    template <size_t... I> EMU_NOTSAN void call(std::index_sequence<I...>) {
        k(*(typename std::remove_cv<typename std::remove_reference<P>::type>::type*)args[I]...);
    }
    EMU_NOTSAN static void thunk(void* self) { ((ArgCall*)self)->call(std::index_sequence_for<P...>{}); }
};

template <class... P> EMU_NOTSAN inline int launch_from_python(void (*k)(P...), const emu_launch_params* p, void** args) {
    ArgCall<P...> c{k, args};
    return launch(*p, &ArgCall<P...>::thunk, &c);
}

// ---------------------------- kernels launched from C++ --------------------------------
// `kernel<<<grid, block, shared, stream>>>(args)` is rewritten by the course's adapter
// into `::emu::make_launch(kernel, "kernel", __LINE__, grid, block, shared, stream)(args)`.
inline int schedule_mode = 0;
inline unsigned long long schedule_seed = 0;

inline void describe_fault_for_host(const char* name, int line) {
    emu_fault_info& f = S.fault;
    if (f.kind == 2 || f.kind == 3) {
        const char* what = f.sig == SIGSEGV ? "invalid memory access" : f.sig == SIGBUS ? "misaligned or invalid memory access"
                         : f.sig == SIGFPE ? "arithmetic error (integer division by zero?)" : f.sig == SIGINT ? "interrupted"
                         : f.sig == SIGABRT ? "abort() or failed assert()" : "illegal instruction";
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s at address 0x%llx in thread (%d,%d,%d) of block (%d,%d,%d)", what, f.addr,
                 f.thread[0], f.thread[1], f.thread[2], f.block[0], f.block[1], f.block[2]);
        snprintf(f.msg, sizeof f.msg, "%s", tmp);
    }
    char tmp[8192];
    snprintf(tmp, sizeof tmp, "kernel %s (launched on line %d) failed: %s", name, line, f.msg);
    memcpy(f.msg, tmp, sizeof f.msg);
}

template <class... P> struct Launch {
    void (*k)(P...);
    const char* name;
    int line;
    emu_launch_params p;
    template <class... A> void operator()(A... a) {
        static_assert(sizeof...(A) == sizeof...(P), "wrong number of arguments in a kernel launch (in the CPU "
                      "emulator a launch passes every argument: it does not support a kernel's default arguments)");
        auto body = [this, a...]() { k(a...); };
        typedef decltype(body) F;
        p.schedule = schedule_mode;
        p.seed = schedule_seed++;
        int rc = launch(p, [](void* c) { (*(F*)c)(); }, &body);
        if (rc) {
            describe_fault_for_host(name, line);
            // Thrown at once (Python sees it), so no error is left for a later check.
            throw std::runtime_error(S.fault.msg);
        }
    }
};

template <class... P>
inline Launch<P...> make_launch(void (*k)(P...), const char* name, int line, dim3 g, dim3 b, size_t smem = 0, cudaStream_t = nullptr) {
    Launch<P...> l{k, name, line, {}};
    l.p.grid[0] = g.x; l.p.grid[1] = g.y; l.p.grid[2] = g.z;
    l.p.block[0] = b.x; l.p.block[1] = b.y; l.p.block[2] = b.z;
    l.p.shared_bytes = smem;
    return l;
}

inline const char* error_string(int e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorAssert: return "device-side assert triggered";
        case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
        default: return S.fault.msg[0] ? S.fault.msg : "unspecified launch failure";
    }
}

inline void launch_check(const char* file, int line) {
    if (last_error) {
        int e = last_error;
        last_error = 0;
        char buf[9000];
        snprintf(buf, sizeof buf, "CUDA error: %s (checked at %s:%d)", error_string(e), file, line);
        throw std::runtime_error(buf);
    }
}

}  // namespace emu

using emu::threadIdx;
using emu::blockIdx;
using emu::blockDim;
using emu::gridDim;
static constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------
// Barriers and warp collectives (the line is recorded for fault messages)
// ---------------------------------------------------------------------------------------
#define EMU_SITE ([] { static const char emu_site_ = 0; return (const void*)&emu_site_; }())
#define __syncthreads() ((void)::emu::syncthreads_impl(__LINE__, 0, EMU_SITE))
#define __syncthreads_count(p) ::emu::syncthreads_impl(__LINE__, (p) ? 1 : 0, EMU_SITE)
#define __syncthreads_and(p) (::emu::syncthreads_impl(__LINE__, (p) ? 1 : 0, EMU_SITE) == (int)(blockDim.x * blockDim.y * blockDim.z))
#define __syncthreads_or(p) (::emu::syncthreads_impl(__LINE__, (p) ? 1 : 0, EMU_SITE) != 0)
#define __syncwarp(...) ((void)::emu::warp_collective(::emu::OP_SYNCWARP, ::emu::syncwarp_mask(__VA_ARGS__), 0, 0, 32, __LINE__))
#define __shfl_sync(m, v, ...) ::emu::shfl(::emu::OP_SHFL, m, v, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) ::emu::shfl(::emu::OP_SHFL_UP, m, v, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) ::emu::shfl(::emu::OP_SHFL_DOWN, m, v, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) ::emu::shfl(::emu::OP_SHFL_XOR, m, v, __LINE__, __VA_ARGS__)
#define __ballot_sync(m, p) ((unsigned)::emu::warp_collective(::emu::OP_BALLOT, m, (p) ? 1 : 0, 0, 32, __LINE__))
#define __any_sync(m, p) ((int)::emu::warp_collective(::emu::OP_ANY, m, (p) ? 1 : 0, 0, 32, __LINE__))
#define __all_sync(m, p) ((int)::emu::warp_collective(::emu::OP_ALL, m, (p) ? 1 : 0, 0, 32, __LINE__))
#define __trap() ::emu::fault_trap("__trap() called")

EMU_NS {
inline unsigned syncwarp_mask() { return 0xffffffffu; }
inline unsigned syncwarp_mask(unsigned m) { return m; }
template <class T> inline T shfl(int op, unsigned mask, T v, int line, int arg, int width = 32) {
    return from_bits<T>(warp_collective(op, mask, to_bits(v), arg, width, line));
}
EMU_NOTSAN inline unsigned __activemask_impl() {
    int base = S.cur & ~31; unsigned m = 0;
    for (int l = 0; l < 32 && base + l < (int)S.nthreads; ++l) if (S.th[base + l].state != ST_DONE) m |= 1u << l;
    return m;
}
}  // namespace emu
#define __activemask() ::emu::__activemask_impl()
static inline unsigned __lanemask_lt() { return (1u << (threadIdx.x & 31)) - 1u; }

// Kernel asserts become a fault naming the condition, the line and the thread.
#undef assert
#define assert(e) ((e) ? (void)0 : ::emu::fault_trap("assert(%s) failed on line %d in thread (%u,%u,%u) of block (%u,%u,%u)", \
    #e, __LINE__, threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z))
// A kernel that includes <assert.h> or <cassert> after this header gets the C library's
// assert back, which calls __assert_fail: defined here (inside this library only), it keeps
// the condition, the line and the thread too, instead of an abort() with the message lost.
#if defined(__GLIBC__)
extern "C" __attribute__((visibility("hidden"), noreturn)) inline void
__assert_fail(const char* expr, const char* file, unsigned int line, const char* func) noexcept {
    (void)file; (void)func;
    if (!::emu::S.in_launch) { fprintf(stderr, "%s:%u: assertion `%s' failed\n", file, line, expr); abort(); }
    ::emu::fault_trap("assert(%s) failed on line %u in thread (%u,%u,%u) of block (%u,%u,%u)", expr, line,
                      ::emu::threadIdx.x, ::emu::threadIdx.y, ::emu::threadIdx.z,
                      ::emu::blockIdx.x, ::emu::blockIdx.y, ::emu::blockIdx.z);
}
#endif

// exit() in kernel code would end the whole process (the notebook's kernel): defined here,
// inside this library only, it stops the launch with a fault instead.
#if defined(__GLIBC__)
extern "C" __attribute__((visibility("hidden"), noreturn)) inline void exit(int status) noexcept {
    // (the C library's exit is noreturn too: so is this, whichever path it takes)
    if (!::emu::S.in_launch) ((void (*)(int))dlsym(RTLD_NEXT, "exit"))(status);  // host code: the C library's
    ::emu::fault_trap("exit(%d) called in a kernel on thread (%u,%u,%u) of block (%u,%u,%u): a kernel cannot end the "
                      "program; use assert() or return", status, ::emu::threadIdx.x, ::emu::threadIdx.y,
                      ::emu::threadIdx.z, ::emu::blockIdx.x, ::emu::blockIdx.y, ::emu::blockIdx.z);
}
#endif

// ---------------------------------------------------------------------------------------
// Host API
// ---------------------------------------------------------------------------------------
static inline cudaError_t cudaMalloc(void** p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <class T> static inline cudaError_t cudaMalloc(T** p, size_t n) { return cudaMalloc((void**)p, n); }
static inline cudaError_t cudaMallocManaged(void** p, size_t n, unsigned = 0) { return cudaMalloc(p, n); }
template <class T> static inline cudaError_t cudaMallocManaged(T** p, size_t n, unsigned = 0) { return cudaMalloc((void**)p, n); }
static inline cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
template <class T> static inline cudaError_t cudaMallocHost(T** p, size_t n) { return cudaMalloc((void**)p, n); }
static inline cudaError_t cudaFree(void* p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaFreeHost(void* p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { memmove(d, s, n); return cudaSuccess; }
static inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) { memmove(d, s, n); return cudaSuccess; }
static inline cudaError_t cudaMemset(void* d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize() { return (cudaError_t)emu::last_error; }
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return (cudaError_t)emu::last_error; }
static inline cudaError_t cudaGetLastError() { int e = emu::last_error; emu::last_error = 0; return (cudaError_t)e; }
static inline cudaError_t cudaPeekAtLastError() { return (cudaError_t)emu::last_error; }
static inline const char* cudaGetErrorString(cudaError_t e) { return emu::error_string((int)e); }
template <class T> static inline cudaError_t cudaMemcpyToSymbol(T& symbol, const void* src, size_t n, size_t offset = 0,
                                                          cudaMemcpyKind = cudaMemcpyHostToDevice) {
    memcpy((char*)&symbol + offset, src, n); return cudaSuccess;
}
template <class T> static inline cudaError_t cudaMemcpyFromSymbol(void* dst, const T& symbol, size_t n, size_t offset = 0,
                                                            cudaMemcpyKind = cudaMemcpyDeviceToHost) {
    memcpy(dst, (const char*)&symbol + offset, n); return cudaSuccess;
}
// Events measure host time here: kernels run synchronously on the CPU, so the numbers say
// how fast the emulator is, nothing about a GPU.
struct CUevent_st { double ms; };
static inline double emu_now_ms() { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6; }
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new CUevent_st{0.0}; return cudaSuccess; }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr) { e->ms = emu_now_ms(); return cudaSuccess; }
static inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { *ms = (float)(b->ms - a->ms); return cudaSuccess; }
static inline cudaError_t cudaProfilerStart() { return cudaSuccess; }
static inline cudaError_t cudaProfilerStop() { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return cudaSuccess; }
static inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int) { return cudaSuccess; }
static inline cudaError_t cudaDeviceReset() { return cudaSuccess; }
static inline const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorLaunchFailure"; }
#include "cuda_emu_device_api.h"  // device queries and attributes (cudaDeviceProp, ...)

// What torch extensions call around a launch. The adapter removes the CUDA-only includes
// (c10/cuda/..., ATen/cuda/...), so the names they would declare are provided here.
#define C10_CUDA_KERNEL_LAUNCH_CHECK() ::emu::launch_check(__FILE__, __LINE__)
#define C10_CUDA_CHECK(e) do { cudaError_t emu_e_ = (e); if (emu_e_ != cudaSuccess) { ::emu::last_error = emu_e_; ::emu::launch_check(__FILE__, __LINE__); } } while (0)
#define AT_CUDA_CHECK(e) C10_CUDA_CHECK(e)
namespace at { namespace cuda {
static inline cudaStream_t getCurrentCUDAStream(int = -1) { return nullptr; }
static inline cudaStream_t getDefaultCUDAStream(int = -1) { return nullptr; }
} }
namespace c10 { namespace cuda {
static inline cudaStream_t getCurrentCUDAStream(int = -1) { return nullptr; }
} }

// ---------------------------------------------------------------------------------------
// What the Python side calls (through ctypes) in every compiled kernel library
// ---------------------------------------------------------------------------------------
EMU_API inline const emu_fault_info* emu_fault() { return &emu::S.fault; }
EMU_API inline void emu_set_schedule(int mode, unsigned long long seed) { emu::schedule_mode = mode; emu::schedule_seed = seed; }
EMU_API inline int emu_abi_version() { return 2; }
EMU_API inline void emu_stack_layout(unsigned long long* out) {
    out[0] = emu::kMaxThreads; out[1] = emu::kStackSize + emu::kStackGuard; out[2] = emu::kStackGuard;
}

// ---------------------------------------------------------------------------------------
// Race detection: what g++'s -fsanitize=thread instrumentation calls. Plain loads and
// stores are checked; the atomic builtins (rare in kernels) count as atomic accesses.
// ---------------------------------------------------------------------------------------
#if defined(EMU_RACECHECK) && !defined(EMU_RUNTIME_SPLIT)
extern "C" {
// (with profiling, each access is also logged for the counters)
#if defined(EMU_PROFILE)
#define EMU_ACCESS(p, n, kind) do { void* pc_ = __builtin_return_address(0); emu::race_access(p, n, kind, pc_); \
                                    emu::prof_access(p, n, kind, pc_); } while (0)
#define EMU_ACCESS_SPLIT(p, n, kind) do { void* pc_ = __builtin_return_address(0); emu::race_access(p, n, kind, pc_); \
                                          emu::prof_access_split(p, n, kind, pc_); } while (0)
#else
#define EMU_ACCESS(p, n, kind) emu::race_access(p, n, kind, __builtin_return_address(0))
#define EMU_ACCESS_SPLIT(p, n, kind) EMU_ACCESS(p, n, kind)
#endif
#define EMU_TSAN_RW(N)                                                                                   \
    EMU_NOTSAN void __tsan_read##N(void* p) { EMU_ACCESS(p, N, 0); }  \
    EMU_NOTSAN void __tsan_write##N(void* p) { EMU_ACCESS(p, N, 1); } \
    EMU_NOTSAN void __tsan_unaligned_read##N(void* p) { EMU_ACCESS_SPLIT(p, N, 0); }  \
    EMU_NOTSAN void __tsan_unaligned_write##N(void* p) { EMU_ACCESS_SPLIT(p, N, 1); } \
    EMU_NOTSAN void __tsan_volatile_read##N(void* p) { EMU_ACCESS(p, N, 0); }  \
    EMU_NOTSAN void __tsan_volatile_write##N(void* p) { EMU_ACCESS(p, N, 1); }
EMU_TSAN_RW(1) EMU_TSAN_RW(2) EMU_TSAN_RW(4) EMU_TSAN_RW(8) EMU_TSAN_RW(16)
#undef EMU_TSAN_RW
EMU_NOTSAN void __tsan_read_range(void* p, unsigned long n) { EMU_ACCESS_SPLIT(p, (unsigned)n, 0); }
EMU_NOTSAN void __tsan_write_range(void* p, unsigned long n) { EMU_ACCESS_SPLIT(p, (unsigned)n, 1); }
#undef EMU_ACCESS
#undef EMU_ACCESS_SPLIT
EMU_NOTSAN void __tsan_init() {}
EMU_NOTSAN void __tsan_func_entry(void*) {}
EMU_NOTSAN void __tsan_func_exit() {}
EMU_NOTSAN void __tsan_vptr_update(void**, void*) {}
EMU_NOTSAN void __tsan_vptr_read(void**) {}
EMU_NOTSAN void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
EMU_NOTSAN void __tsan_atomic_signal_fence(int) {}
#define EMU_TSAN_ATOMIC(N, T)                                                                             \
    EMU_NOTSAN T __tsan_atomic##N##_load(const volatile T* a, int) {                                     \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); return *a; }                        \
    EMU_NOTSAN void __tsan_atomic##N##_store(volatile T* a, T v, int) {                                  \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); *a = v; }                           \
    EMU_NOTSAN T __tsan_atomic##N##_exchange(volatile T* a, T v, int) {                                  \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = v; return o; }       \
    EMU_NOTSAN T __tsan_atomic##N##_fetch_add(volatile T* a, T v, int) {                                 \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = o + v; return o; }   \
    EMU_NOTSAN T __tsan_atomic##N##_fetch_sub(volatile T* a, T v, int) {                                 \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = o - v; return o; }   \
    EMU_NOTSAN T __tsan_atomic##N##_fetch_and(volatile T* a, T v, int) {                                 \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = o & v; return o; }   \
    EMU_NOTSAN T __tsan_atomic##N##_fetch_or(volatile T* a, T v, int) {                                  \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = o | v; return o; }   \
    EMU_NOTSAN T __tsan_atomic##N##_fetch_xor(volatile T* a, T v, int) {                                 \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = o ^ v; return o; }   \
    EMU_NOTSAN T __tsan_atomic##N##_fetch_nand(volatile T* a, T v, int) {                                \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; *a = ~(o & v); return o; } \
    EMU_NOTSAN int __tsan_atomic##N##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {      \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0));                                     \
        if (*a == *c) { *a = v; return 1; } *c = *a; return 0; }                                         \
    EMU_NOTSAN int __tsan_atomic##N##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {        \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0));                                     \
        if (*a == *c) { *a = v; return 1; } *c = *a; return 0; }                                         \
    EMU_NOTSAN T __tsan_atomic##N##_compare_exchange_val(volatile T* a, T c, T v, int, int) {            \
        emu::race_atomic(a, sizeof(T), __builtin_return_address(0)); T o = *a; if (o == c) *a = v; return o; }
EMU_TSAN_ATOMIC(8, unsigned char) EMU_TSAN_ATOMIC(16, unsigned short) EMU_TSAN_ATOMIC(32, unsigned)
EMU_TSAN_ATOMIC(64, unsigned long long)
#undef EMU_TSAN_ATOMIC
}
#endif

// The race detector's report, read by the Python side after a launch stopped by a race.
EMU_API inline const emu::RaceInfo* emu_race_info() { return &emu::R.info; }
// The tensor arguments' buffers for the next launch: shadows are made here, freed by emu_race_end.
EMU_API inline int emu_race_begin(int n, const unsigned long long* lo, const unsigned long long* len) {
    using namespace emu;
    R.n = 0;
    for (int i = 0; i < n && i < kMaxRaceRegions; ++i) {
        RaceRegion& g = R.g[i];
        size_t need = ((len[i] + 3) / 4 + 1) * sizeof(RaceShadow);
        if (g.shadow_bytes < need) {
            if (g.shadow) munmap(g.shadow, g.shadow_bytes);
            g.shadow = race_map_shadow(len[i], &g.shadow_bytes);
            if (!g.shadow) { race_free_regions(); return -1; }
        }
        g.lo = (uintptr_t)lo[i]; g.len = (uintptr_t)len[i];
        R.n = i + 1;
    }
    return 0;
}
// After a launch: the shadows stay for the next one unless they are large.
EMU_API inline void emu_race_end() {
    using namespace emu;
    size_t total = 0;
    for (int i = 0; i < kMaxRaceRegions; ++i) total += R.g[i].shadow_bytes;
    if (total > ((size_t)1 << 30)) race_free_regions();
    R.n = 0;
}
EMU_API inline int emu_race_instrumented() {
#if defined(EMU_RACECHECK)
    return 1;
#else
    return 0;
#endif
}

// ------------------------------------ profiling ----------------------------------------
// What utils/cuda/_profile.py calls around a profiled launch (see "profiling" above).
EMU_API inline int emu_prof_instrumented() {
#if defined(EMU_PROFILE)
    return 1;
#else
    return 0;
#endif
}
#if defined(EMU_PROFILE)
// The tensor arguments' buffers (start, length, the start's offset from a 256-byte aligned
// allocation on a GPU), and how many accesses to keep for the trace.
EMU_API inline int emu_prof_begin(int n, const unsigned long long* lo, const unsigned long long* len,
                                  const unsigned long long* phase, unsigned long long trace_cap) {
    using namespace emu;
    prof_free();
    if (!P.cnt) {
        void* c = mmap(nullptr, (size_t)kMaxThreads * kProfMaxPc * sizeof(uint32_t), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (c == MAP_FAILED) return -1;
        P.cnt = (uint32_t*)c;
    }
    memset(P.sites, 0, sizeof P.sites);
    memset(P.bbs, 0, sizeof P.bbs);
    // code addresses keep their ids from launch to launch: the per-thread counts stay valid
    P.atomics_global = P.atomics_shared = 0;
    P.instr = 0; P.trace_overflow = 0; P.lost = 0;
    for (int i = 0; i < n && i < kProfMaxRegions; ++i) {
        ProfRegion& g = P.g[i];
        g.lo = (uintptr_t)lo[i]; g.len = (uintptr_t)len[i]; g.phase = (uintptr_t)phase[i];
        g.bits_bytes = ((g.len + 7) / 8 + 4095) & ~(size_t)4095;
        void* a = mmap(nullptr, g.bits_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void* b = mmap(nullptr, g.bits_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (a == MAP_FAILED || b == MAP_FAILED) { prof_free(); return -1; }
        g.rd = (unsigned char*)a; g.wr = (unsigned char*)b;
        P.n = i + 1;
    }
    if (trace_cap) {
        P.trace = (ProfTraceRec*)malloc(trace_cap * sizeof(ProfTraceRec));
        if (!P.trace) { prof_free(); return -1; }
        P.trace_cap = trace_cap;
    }
    P.want = 1;
    return 0;
}
// After the launch: the counters (valid until the next emu_prof_begin or emu_prof_end).
EMU_API inline const emu::ProfResult* emu_prof_result() {
    using namespace emu;
    ProfResult& r = P.result;
    memset(&r, 0, sizeof r);
    r.npc = P.npc; r.pcs = P.pcs; r.sites = &P.sites[0][0]; r.bbs = P.bbs;
    r.atomics_global = P.atomics_global; r.atomics_shared = P.atomics_shared;
    r.hot_region = -1;
    for (size_t i = 0; i < P.at_cap; ++i) {
        if (!P.at_keys[i] || P.at_counts[i] <= r.hot_count) continue;
        for (int k = 0; k < P.n; ++k)
            if (P.at_keys[i] - P.g[k].lo < P.g[k].len) {
                r.hot_region = k; r.hot_offset = (long long)(P.at_keys[i] - P.g[k].lo); r.hot_count = P.at_counts[i];
            }
    }
    for (int k = 0; k < P.n; ++k) {
        r.bytes_read += prof_popcount(P.g[k].rd, (P.g[k].len + 7) / 8);
        r.bytes_written += prof_popcount(P.g[k].wr, (P.g[k].len + 7) / 8);
        r.bytes_touched += prof_popcount(P.g[k].rd, (P.g[k].len + 7) / 8, P.g[k].wr);
    }
    r.trace = P.trace; r.trace_n = (long long)P.trace_n; r.trace_overflow = P.trace_overflow;
    r.instr = P.instr; r.pc_overflow = P.pc_overflow; r.lost = P.lost;
    return &r;
}
// The name of a static __shared__ array (index as in the trace), or null.
EMU_API inline const char* emu_prof_shared_name(int i) {
    using namespace emu;
    if (i == kMaxSharedRegions) return dyn_name ? dyn_name : "extern __shared__ memory";
    return i >= 0 && i < n_shared_regions ? shared_regions[i].name : nullptr;
}
EMU_API inline void emu_prof_end() { emu::P.want = emu::P.active = 0; emu::prof_free(); }
#endif

#if defined(EMU_RACECHECK)
// The built-in variables never take part in a race: read them without the checker (a call
// to a tiny function, instead of a check at every use of threadIdx.x).
EMU_NS {
EMU_NOTSAN __attribute__((noinline)) inline uint3 builtin_threadIdx() { return threadIdx; }
EMU_NOTSAN __attribute__((noinline)) inline uint3 builtin_blockIdx() { return blockIdx; }
EMU_NOTSAN __attribute__((noinline)) inline dim3 builtin_blockDim() { return blockDim; }
EMU_NOTSAN __attribute__((noinline)) inline dim3 builtin_gridDim() { return gridDim; }
}
#define threadIdx (::emu::builtin_threadIdx())
#define blockIdx (::emu::builtin_blockIdx())
#define blockDim (::emu::builtin_blockDim())
#define gridDim (::emu::builtin_gridDim())
#endif
