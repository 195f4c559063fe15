// cooperative_groups.h for the course's CPU emulator: the thread groups that published
// kernels use most, built on the emulator's barriers and warp collectives.
//   this_thread_block(): sync(), thread_rank(), size(), num_threads(), group_index(), thread_index()
//   tiled_partition<N>(block) (N a power of two <= 32): shfl, shfl_up, shfl_down, shfl_xor,
//       sync(), any/all/ballot, thread_rank(), size(), meta_group_rank(), meta_group_size()
//   coalesced_threads() (the active lanes of the warp)
//   cg::reduce(tile, value, cg::plus<T>() / cg::less<T>() / cg::greater<T>() / ...)
// Grid-wide groups (this_grid) need a cooperative launch, which the emulator does not have.
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

// A tile of N consecutive threads (N divides 32): the lanes [k*N, k*N+N) of a warp.
template <unsigned N> class thread_block_tile {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0,
                  "tiled_partition<N>: the CPU emulator does not support tiles of more than 32 threads (N must be "
                  "a power of two <= 32; a tile wider than a warp runs only on a GPU)");
    unsigned lane() const { return (unsigned)(thread_block().thread_rank() & 31); }
public:
    unsigned mask() const { return N == 32 ? 0xffffffffu : (((1u << N) - 1u) << (lane() & ~(N - 1))); }
    void sync() const { __syncwarp(mask()); }
    unsigned long long thread_rank() const { return lane() & (N - 1); }
    unsigned long long size() const { return N; }
    unsigned long long num_threads() const { return N; }
    unsigned long long meta_group_rank() const { return thread_block().thread_rank() / N; }
    unsigned long long meta_group_size() const { return (thread_block().size() + N - 1) / N; }
    // A tile shuffles values of any trivially copyable type (uint4, a struct), 8 bytes at a time.
    template <class T> T shfl(T v, int src) const {
        return chunks(v, [&](unsigned long long w) { return __shfl_sync(mask(), w, src, N); });
    }
    template <class T> T shfl_up(T v, unsigned d) const {
        return chunks(v, [&](unsigned long long w) { return __shfl_up_sync(mask(), w, d, N); });
    }
    template <class T> T shfl_down(T v, unsigned d) const {
        return chunks(v, [&](unsigned long long w) { return __shfl_down_sync(mask(), w, d, N); });
    }
    template <class T> T shfl_xor(T v, unsigned m) const {
        return chunks(v, [&](unsigned long long w) { return __shfl_xor_sync(mask(), w, m, N); });
    }
private:
    template <class T, class F> static T chunks(T v, F move) {
        static_assert(std::is_trivially_copyable<T>::value, "a tile shuffles trivially copyable types only");
        unsigned long long w[(sizeof(T) + 7) / 8] = {};
        memcpy(w, &v, sizeof(T));
        for (auto& x : w) x = move(x);
        memcpy(&v, w, sizeof(T));
        return v;
    }
public:
    int any(int p) const { return __any_sync(mask(), p); }
    int all(int p) const { return __all_sync(mask(), p); }
    unsigned ballot(int p) const { return __ballot_sync(mask(), p) >> (lane() & ~(N - 1)); }
};
template <unsigned N> inline thread_block_tile<N> tiled_partition(const thread_block&) { return thread_block_tile<N>(); }
template <unsigned N> inline void sync(const thread_block_tile<N>& g) { g.sync(); }

// A group whose size is known at run time: the block, or a tile of it of at most 32 threads
// (tiled_partition(block, n)). Larger tiles would need barriers of part of a block.
class thread_group {
    unsigned n_;
    bool block_;
    unsigned lane() const { return (unsigned)(thread_block().thread_rank() & 31); }
public:
    thread_group(const thread_block& b) : n_((unsigned)b.size()), block_(true) {}
    template <unsigned N> thread_group(const thread_block_tile<N>&) : n_(N), block_(false) {}
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

// The lanes of the warp that are active now (not returned).
class coalesced_group {
    unsigned m;
public:
    coalesced_group() : m(__activemask()) {}
    unsigned long long size() const { return (unsigned long long)__popc(m); }
    unsigned long long num_threads() const { return size(); }
    unsigned long long thread_rank() const { return (unsigned long long)__popc(m & ((1u << (threadIdx.x & 31)) - 1u)); }
    void sync() const { __syncwarp(m); }
    unsigned ballot(int p) const { return __ballot_sync(m, p); }
};
inline coalesced_group coalesced_threads() { return coalesced_group(); }

template <class T> struct plus { T operator()(const T& a, const T& b) const { return a + b; } };
template <class T> struct less { T operator()(const T& a, const T& b) const { return a < b ? a : b; } };
template <class T> struct greater { T operator()(const T& a, const T& b) const { return a < b ? b : a; } };
template <class T> struct bit_and { T operator()(const T& a, const T& b) const { return a & b; } };
template <class T> struct bit_or { T operator()(const T& a, const T& b) const { return a | b; } };
template <class T> struct bit_xor { T operator()(const T& a, const T& b) const { return a ^ b; } };

// Every thread of the tile gets the reduction of all the tile's values (a butterfly).
template <unsigned N, class T, class Op> inline T reduce(const thread_block_tile<N>& g, T v, Op op) {
    for (unsigned m = N / 2; m > 0; m /= 2) v = op(v, g.shfl_xor(v, m));
    return v;
}
template <unsigned N, class T, class Op> inline T inclusive_scan(const thread_block_tile<N>& g, T v, Op op) {
    for (unsigned d = 1; d < N; d *= 2) {
        T o = g.shfl_up(v, d);
        if (g.thread_rank() >= d) v = op(v, o);
    }
    return v;
}

}  // namespace cooperative_groups
