// cooperative_groups.h for the course's CPU emulator: the thread groups that published
// kernels use most, built on the emulator's barriers and warp collectives.
//   this_thread_block(): sync(), thread_rank(), size(), num_threads(), group_index(), thread_index()
//   tiled_partition<N>(block) (N a power of two <= 32): shfl, shfl_up, shfl_down, shfl_xor,
//       sync(), any/all/ballot, thread_rank(), size(), meta_group_rank(), meta_group_size()
//   tiled_partition<N>(block) (N = 64, 128, 256, 512 or 1024: several warps): sync(), shfl
//       (one source rank for all), any/all, thread_rank(), size(), meta_group_rank/size(), and
//       cg::reduce / cg::inclusive_scan over it: what CUDA has for such tiles
//   coalesced_threads() (the lanes of the warp that reach the call together, see
//       ::emu::coalesced_wait): shfl, shfl_up, shfl_down by rank in the group, any/all/ballot,
//       sync(), thread_rank(), size()
//   cg::reduce(tile, value, cg::plus<T>() / cg::less<T>() / cg::greater<T>() / ...)
//   this_grid(): ranks and sizes. Its sync() needs a cooperative launch, which the emulator
//       does not have: a kernel that reaches it stops with that reason.
#pragma once
#include "cuda_emu.h"

namespace cooperative_groups {

class thread_block {
public:
    void sync() const { __syncthreads(); }
    unsigned long long thread_rank() const {
        return threadIdx.x + (unsigned long long)blockDim.x * (threadIdx.y + (unsigned long long)blockDim.y * threadIdx.z);
    }
    unsigned long long size() const { return (unsigned long long)blockDim.x * blockDim.y * blockDim.z; }
    unsigned long long num_threads() const { return size(); }
    dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
    dim3 group_dim() const { return dim3(blockDim.x, blockDim.y, blockDim.z); }
    dim3 dim_threads() const { return group_dim(); }
};
inline thread_block this_thread_block() { return thread_block(); }
// Scratch memory that a GPU needs for tiles wider than a warp; the emulator needs none.
template <unsigned MaxBlockSize = 1024, unsigned TileCommunicationSize = 8, unsigned MaxTileSize = 32>
struct block_tile_memory { unsigned char unused; };
template <unsigned A, unsigned B, unsigned C> inline thread_block this_thread_block(block_tile_memory<A, B, C>&) {
    return thread_block();
}
inline void sync(const thread_block& g) { g.sync(); }

template <class T> struct plus { T operator()(const T& a, const T& b) const { return a + b; } };
template <class T> struct less { T operator()(const T& a, const T& b) const { return a < b ? a : b; } };
template <class T> struct greater { T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <class T> struct bit_and { T operator()(const T& a, const T& b) const { return a & b; } };
template <class T> struct bit_or { T operator()(const T& a, const T& b) const { return a | b; } };
template <class T> struct bit_xor { T operator()(const T& a, const T& b) const { return a ^ b; } };

// A group shuffles values of any trivially copyable type (uint4, a struct), 8 bytes at a time.
template <class T, class F> inline T emu_shuffle_chunks(T v, F move) {
    static_assert(std::is_trivially_copyable<T>::value, "a group shuffles trivially copyable types only");
    unsigned long long w[(sizeof(T) + 7) / 8] = {};
    memcpy(w, &v, sizeof(T));
    for (auto& x : w) x = move(x);
    memcpy(&v, w, sizeof(T));
    return v;
}

// The collectives of a tile of several warps (defined below the tile).
namespace emu_multi_warp {
template <unsigned N, class T> T shfl(T v, int src, int line);
template <unsigned N, class T, class Op> T reduce(T v, Op op, int line);
template <unsigned N, class T, class Op> T inclusive_scan(T v, Op op, int line);
}

// A tile of N consecutive threads of the block: for N <= 32 the lanes [k*N, k*N+N) of a warp;
// for N of 64..1024 whole warps, whose collectives meet at a barrier of the tile's threads
// (the line of the call is kept for the emulator's messages). As in CUDA, a tile of several
// warps has no shfl_up/down/xor or ballot, and its collectives move values of at most 8 bytes.
template <unsigned N> class thread_block_tile {
    static_assert(N >= 1 && N <= 1024 && (N & (N - 1)) == 0,
                  "tiled_partition<N>: N must be a power of two of at most 1024 (CUDA's thread_block_tile sizes)");
    unsigned lane() const { return (unsigned)(thread_block().thread_rank() & 31); }
public:
    unsigned mask() const { return N >= 32 ? 0xffffffffu : (((1u << (N & 31)) - 1u) << (lane() & ~(N - 1))); }
    void sync(int line = __builtin_LINE()) const {
        if constexpr (N > 32) ::emu::tile_sync(N, line);
        else __syncwarp(mask());
    }
    unsigned long long thread_rank() const { return thread_block().thread_rank() & (N - 1); }
    unsigned long long size() const { return N; }
    unsigned long long num_threads() const { return N; }
    unsigned long long meta_group_rank() const { return thread_block().thread_rank() / N; }
    unsigned long long meta_group_size() const { return (thread_block().size() + N - 1) / N; }
    template <class T> T shfl(T v, int src, int line = __builtin_LINE()) const {
        if constexpr (N > 32) return emu_multi_warp::shfl<N>(v, src, line);
        else return emu_shuffle_chunks(v, [&](unsigned long long w) { return __shfl_sync(mask(), w, src, N); });
    }
    template <class T> T shfl_up(T v, unsigned d) const {
        static_assert(N <= 32, "thread_block_tile<N>::shfl_up: CUDA has it for tiles of at most 32 threads only");
        return emu_shuffle_chunks(v, [&](unsigned long long w) { return __shfl_up_sync(mask(), w, d, N); });
    }
    template <class T> T shfl_down(T v, unsigned d) const {
        static_assert(N <= 32, "thread_block_tile<N>::shfl_down: CUDA has it for tiles of at most 32 threads only");
        return emu_shuffle_chunks(v, [&](unsigned long long w) { return __shfl_down_sync(mask(), w, d, N); });
    }
    template <class T> T shfl_xor(T v, unsigned m) const {
        static_assert(N <= 32, "thread_block_tile<N>::shfl_xor: CUDA has it for tiles of at most 32 threads only");
        return emu_shuffle_chunks(v, [&](unsigned long long w) { return __shfl_xor_sync(mask(), w, m, N); });
    }
    int any(int p, int line = __builtin_LINE()) const {
        if constexpr (N > 32) return emu_multi_warp::reduce<N>(p ? 1 : 0, bit_or<int>(), line);
        else return __any_sync(mask(), p);
    }
    int all(int p, int line = __builtin_LINE()) const {
        if constexpr (N > 32) return emu_multi_warp::reduce<N>(p ? 1 : 0, bit_and<int>(), line);
        else return __all_sync(mask(), p);
    }
    unsigned ballot(int p) const {
        static_assert(N <= 32, "thread_block_tile<N>::ballot: CUDA has it for tiles of at most 32 threads only");
        return __ballot_sync(mask(), p) >> (lane() & ~(N - 1));
    }
};
template <unsigned N> inline thread_block_tile<N> tiled_partition(const thread_block& b) {
    // CUDA leaves a partial tile of several warps undefined: its barrier would wait for
    // threads that do not exist.
    if (N > 32 && b.size() % N != 0)
        ::emu::fault_trap("tiled_partition<%u>: a block of %llu threads does not divide into tiles of %u threads "
                          "(a tile of several warps needs a block whose size is a multiple of the tile's)",
                          N, b.size(), N);
    return thread_block_tile<N>();
}
template <unsigned N> inline void sync(const thread_block_tile<N>& g, int line = __builtin_LINE()) {
    if constexpr (N > 32) g.sync(line);
    else g.sync();
}

// A group whose size is known at run time: the block, or a tile of it of at most 32 threads
// (tiled_partition(block, n); CUDA's run-time tiles are no larger).
class thread_group {
    unsigned n_;
    bool block_;
    unsigned lane() const { return (unsigned)(thread_block().thread_rank() & 31); }
public:
    thread_group(const thread_block& b) : n_((unsigned)b.size()), block_(true) {}
    template <unsigned N> thread_group(const thread_block_tile<N>&) : n_(N), block_(false) {
        static_assert(N <= 32, "a thread_block_tile of more than 32 threads does not convert to thread_group (in CUDA "
                      "neither): pass the tile by its own type");
    }
    explicit thread_group(unsigned n) : n_(n), block_(false) {
        if (n == 0 || n > 32 || (n & (n - 1)))
            ::emu::fault_trap("tiled_partition(block, %u): the emulator supports tiles of 1, 2, 4, 8, 16 or 32 threads", n);
    }
    unsigned mask() const { return n_ == 32 ? 0xffffffffu : (((1u << n_) - 1u) << (lane() & ~(n_ - 1))); }
    void sync() const { if (block_) __syncthreads(); else __syncwarp(mask()); }
    unsigned long long thread_rank() const { return block_ ? thread_block().thread_rank() : (lane() & (n_ - 1)); }
    unsigned long long size() const { return n_; }
    unsigned long long num_threads() const { return n_; }
    unsigned long long meta_group_rank() const { return block_ ? 0 : thread_block().thread_rank() / n_; }
};
inline thread_group tiled_partition(const thread_group& parent, unsigned n) { (void)parent; return thread_group(n); }
inline void sync(const thread_group& g) { g.sync(); }

// The lanes of a warp that reach coalesced_threads() together (see ::emu::coalesced_wait).
class coalesced_group {
    unsigned m;
    static unsigned lane() { return (unsigned)(thread_block().thread_rank() & 31); }
    unsigned lane_of_rank(unsigned r) const {  // the lane of the group's r-th thread, 32 if none
        unsigned k = m;
        for (; r && k; --r) k &= k - 1;
        return k ? (unsigned)__builtin_ctz(k) : 32u;
    }
    template <class T> T from_lane(T v, unsigned src) const {  // no such lane: the thread's own value
        if (src >= 32) src = lane();
        return emu_shuffle_chunks(v, [&](unsigned long long w) { return __shfl_sync(m, w, src, 32); });
    }
public:
    explicit coalesced_group(unsigned mask) : m(mask) {}
    unsigned long long size() const { return (unsigned long long)__popc(m); }
    unsigned long long num_threads() const { return size(); }
    unsigned long long thread_rank() const { return (unsigned long long)__popc(m & ((1u << lane()) - 1u)); }
    unsigned long long meta_group_rank() const { return 0; }
    unsigned long long meta_group_size() const { return 1; }
    void sync() const { __syncwarp(m); }
    unsigned ballot(int p) const { return __ballot_sync(m, p); }
    int any(int p) const { return __any_sync(m, p); }
    int all(int p) const { return __all_sync(m, p); }
    // Ranks count the group's threads, not the warp's lanes (the leader of an aggregated
    // atomic broadcasts with shfl(v, 0)).
    template <class T> T shfl(T v, unsigned src_rank) const { return from_lane(v, lane_of_rank(src_rank)); }
    template <class T> T shfl_down(T v, unsigned d) const {
        return from_lane(v, lane_of_rank((unsigned)thread_rank() + d));
    }
    template <class T> T shfl_up(T v, unsigned d) const {
        unsigned r = (unsigned)thread_rank();
        return from_lane(v, d <= r ? lane_of_rank(r - d) : 32u);
    }
};
inline coalesced_group coalesced_threads(int line = __builtin_LINE(), const char* file = __builtin_FILE()) {
    return coalesced_group(::emu::coalesced_wait(line, file));
}

// Every thread of the tile gets the reduction of all the tile's values (a butterfly in a warp).
template <unsigned N, class T, class Op> inline T reduce(const thread_block_tile<N>& g, T v, Op op,
                                                         int line = __builtin_LINE()) {
    if constexpr (N > 32) {
        return emu_multi_warp::reduce<N>(v, op, line);
    } else {
        for (unsigned m = N / 2; m > 0; m /= 2) v = op(v, g.shfl_xor(v, m));
        return v;
    }
}
template <unsigned N, class T, class Op> inline T inclusive_scan(const thread_block_tile<N>& g, T v, Op op,
                                                                 int line = __builtin_LINE()) {
    if constexpr (N > 32) {
        return emu_multi_warp::inclusive_scan<N>(v, op, line);
    } else {
        for (unsigned d = 1; d < N; d *= 2) {
            T o = g.shfl_up(v, d);
            if (g.thread_rank() >= d) v = op(v, o);
        }
        return v;
    }
}

// A tile of several warps computes as CUDA's does: each warp on its own with shuffles, then
// across the warps through one 8-byte slot per warp, between two barriers of the tile (the
// second one frees the slots for the next collective). Every thread of the tile combines the
// warps' values in the same order, so all get the same result.
namespace emu_multi_warp {
inline unsigned long long slot[32];  // per warp of the block
inline int shfl_src[1024];           // per thread: the source rank it asked a shfl for
template <class T> inline void check_size() {
    static_assert(sizeof(T) <= 8, "the collectives of a thread_block_tile of more than 32 threads move values of "
                  "at most 8 bytes (CUDA's limit)");
}
template <unsigned N, class T> T shfl(T v, int src, int line) {
    check_size<T>();
    unsigned r = (unsigned)thread_block().thread_rank(), base = r & ~(N - 1);
    if (src < 0 || (unsigned)src >= N)
        ::emu::fault_trap("thread_block_tile<%u>::shfl on line %d: source rank %d is outside the tile (0..%u)", N, line,
                          src, N - 1);
    shfl_src[r] = src;
    if ((r & (N - 1)) == (unsigned)src) slot[(base + src) / 32] = ::emu::to_bits(v);
    ::emu::tile_sync(N, line);
    if (shfl_src[base] != src)
        ::emu::fault_trap("thread_block_tile<%u>::shfl on line %d: threads of one tile ask for different source ranks "
                          "(%d and %d); in a tile of more than 32 threads every thread must name the same one",
                          N, line, shfl_src[base], src);
    T out = ::emu::from_bits<T>(slot[(base + src) / 32]);
    ::emu::tile_sync(N, line);
    return out;
}
template <unsigned N, class T, class Op> T reduce(T v, Op op, int line) {
    check_size<T>();
    unsigned r = (unsigned)thread_block().thread_rank(), first = (r & ~(N - 1)) / 32;
    T w = cooperative_groups::reduce(thread_block_tile<32>(), v, op);
    if ((r & 31) == 0) slot[r / 32] = ::emu::to_bits(w);
    ::emu::tile_sync(N, line);
    T out = ::emu::from_bits<T>(slot[first]);
    for (unsigned k = 1; k < N / 32; ++k) out = op(out, ::emu::from_bits<T>(slot[first + k]));
    ::emu::tile_sync(N, line);
    return out;
}
template <unsigned N, class T, class Op> T inclusive_scan(T v, Op op, int line) {
    check_size<T>();
    unsigned r = (unsigned)thread_block().thread_rank(), first = (r & ~(N - 1)) / 32, warp = r / 32;
    T s = cooperative_groups::inclusive_scan(thread_block_tile<32>(), v, op);
    if ((r & 31) == 31) slot[warp] = ::emu::to_bits(s);
    ::emu::tile_sync(N, line);
    if (warp > first) {
        T before = ::emu::from_bits<T>(slot[first]);
        for (unsigned k = first + 1; k < warp; ++k) before = op(before, ::emu::from_bits<T>(slot[k]));
        s = op(before, s);
    }
    ::emu::tile_sync(N, line);
    return s;
}
}  // namespace emu_multi_warp

// The whole grid. Sizes and ranks work in any launch, as on a GPU; sync() needs a cooperative
// launch (cudaLaunchCooperativeKernel), which the emulator does not have. On a GPU a grid_group
// of an ordinary launch is not valid either, and its sync() traps.
class grid_group {
public:
    bool is_valid() const { return false; }
    void sync(int line = __builtin_LINE()) const {
        ::emu::fault_trap("grid_group::sync() on line %d: the CPU emulator does not support grid-wide synchronization "
                          "(it needs a cooperative launch); this kernel runs only on a GPU", line);
    }
    static unsigned long long num_blocks() { return (unsigned long long)gridDim.x * gridDim.y * gridDim.z; }
    static unsigned long long block_rank() {
        return blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    }
    static unsigned long long num_threads() { return num_blocks() * thread_block().size(); }
    static unsigned long long size() { return num_threads(); }
    static unsigned long long thread_rank() {
        return block_rank() * thread_block().size() + thread_block().thread_rank();
    }
    static dim3 dim_blocks() { return dim3(gridDim.x, gridDim.y, gridDim.z); }
    static dim3 group_dim() { return dim_blocks(); }
    static dim3 block_index() { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
    static dim3 dim_threads() { return dim3(gridDim.x * blockDim.x, gridDim.y * blockDim.y, gridDim.z * blockDim.z); }
    static dim3 thread_index() {
        return dim3(blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y,
                    blockIdx.z * blockDim.z + threadIdx.z);
    }
};
inline grid_group this_grid() { return grid_group(); }
inline void sync(const grid_group& g, int line = __builtin_LINE()) { g.sync(line); }

}  // namespace cooperative_groups
