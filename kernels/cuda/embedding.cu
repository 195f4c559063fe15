// Token embedding in CUDA C++: the forward gathers rows of the table, the backward
// scatters the output's gradient back into the rows its tokens came from.
//
//     forward:  out[i, :] = weight[ids[i], :]
//     backward: dweight[ids[i], :] += dout[i, :]     for every token i
//
// The backward ADDS into dweight: in a GPT the LM head shares the embedding's weight (tied
// weights), and its own gradient is already there when the embedding's arrives.
//
// A token id that repeats (the same word twice in a batch, which is the rule, not the
// exception) sends two tokens' gradients to the same row: that is where the versions differ.
//   v1  plain += into dweight: repeated ids race (lost updates on a GPU, reported in simulation)
//       embedding_backward_plain_kernel:  `+=` on global memory. Two blocks may read the same
//       old value and each write back their own sum: one update is lost. A race (the
//       emulator's race detector reports it).
//   v2  atomicAdd into dweight: right, but the sums' order (and last bits) change between runs
//       embedding_backward_atomic_kernel: atomicAdd. Right, but the order of the additions
//       depends on timing, so the float sums differ from run to run in their last bits.
//   v3  ids sorted, one owner per row sums its tokens in order: deterministic, no atomics
//       embedding_backward_sorted_kernel: the ids sorted first (by the launcher), so the
//       tokens of one id are neighbours; the first position of each run of equal ids sums
//       the run in a fixed order and adds it once. No atomics, and the same bits every run.
//   v4  v3 with long runs cut into chunks and joined in order: deterministic, balanced
//       embedding_backward_chunk_kernel, then embedding_backward_join_kernel (see v4 below)
#include "common.h"

__global__ void embedding_kernel(const long long* __restrict__ ids_ptr, const float* __restrict__ w_ptr,
                                 float* __restrict__ out_ptr, int vocab, int dim) {
    long long i = blockIdx.x;  // one block per token, threads over the columns
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    long long id = ids_ptr[i];
    // an id outside [0, vocab) gives a row of NaN, never a read outside the table
    out_ptr[i * dim + c] = (id >= 0 && id < vocab) ? w_ptr[id * dim + c] : NAN;
}

// v1: a race whenever two tokens share an id.
__global__ void embedding_backward_plain_kernel(const long long* __restrict__ ids_ptr,
                                                const float* __restrict__ dout_ptr, float* dw_ptr,
                                                int vocab, int dim) {
    long long i = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    long long id = ids_ptr[i];
    if (c >= dim || id < 0 || id >= vocab) return;
    dw_ptr[id * dim + c] += dout_ptr[i * dim + c];  // read, add, write: not one step
}

// v2: the read-add-write in one indivisible step.
__global__ void embedding_backward_atomic_kernel(const long long* __restrict__ ids_ptr,
                                                 const float* __restrict__ dout_ptr, float* dw_ptr,
                                                 int vocab, int dim) {
    long long i = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    long long id = ids_ptr[i];
    if (c >= dim || id < 0 || id >= vocab) return;
    atomicAdd(dw_ptr + id * dim + c, dout_ptr[i * dim + c]);
}

// v3: sorted_ptr holds the ids in ascending order, perm_ptr the token each came from (a
// stable sort: equal ids keep the tokens' order). Block p owns position p: unless it starts
// a run of equal ids it has nothing to do; otherwise it sums the run's rows of dout, in
// order, and adds the sum to dweight once. Each row of dweight has exactly one owner.
__global__ void embedding_backward_sorted_kernel(const long long* __restrict__ sorted_ptr,
                                                 const long long* __restrict__ perm_ptr,
                                                 const float* __restrict__ dout_ptr, float* dw_ptr,
                                                 int n, int vocab, int dim) {
    int p = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    long long id = sorted_ptr[p];
    if (p > 0 && sorted_ptr[p - 1] == id) return;  // not the start of a run
    if (c >= dim || id < 0 || id >= vocab) return;
    float acc = 0.0f;
    for (int j = p; j < n && sorted_ptr[j] == id; ++j) acc += dout_ptr[perm_ptr[j] * dim + c];
    dw_ptr[id * dim + c] += acc;
}

// v4: v3 without its one slow case. In v3 the owner of a run of L equal ids adds L rows one
// after the other: a frequent token (a comma, " the": a few percent of the tokens of real
// text, hundreds of rows in a batch) makes one block work hundreds of times longer than the
// rest. v4 cuts the sorted positions into chunks of CHUNK. Pass 1, one block per chunk: each
// piece of a run inside the chunk is summed in order; a run that lies wholly inside the chunk
// is added to dweight at once; the piece that continues a run from the chunk before goes to
// head[chunk], the piece that starts a run continuing into the next chunk to tail[chunk].
// Pass 2, one block per chunk whose tail starts a run: it adds tail[chunk] and the heads of the
// chunks the run spans, in order, and adds that to dweight once. Every id still has exactly
// one owner and a fixed order of additions: deterministic, and at most CHUNK + L / CHUNK steps.
__device__ __forceinline__ bool emb_cont_prev(const long long* s, int cs) { return cs > 0 && s[cs - 1] == s[cs]; }
__device__ __forceinline__ bool emb_cont_next(const long long* s, int ce, int n) { return ce < n && s[ce - 1] == s[ce]; }

__global__ void embedding_backward_chunk_kernel(const long long* __restrict__ sorted_ptr,
                                                const long long* __restrict__ perm_ptr,
                                                const float* __restrict__ dout_ptr, float* dw_ptr, float* head_ptr,
                                                float* tail_ptr, int n, int vocab, int dim, int chunk) {
    int ch = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    int cs = ch * chunk, ce = min(cs + chunk, n);
    bool cont_prev = emb_cont_prev(sorted_ptr, cs), cont_next = emb_cont_next(sorted_ptr, ce, n);
    float acc = 0.0f;
    int piece_start = cs;
    for (int j = cs; j < ce; ++j) {
        acc += dout_ptr[perm_ptr[j] * dim + c];
        if (j + 1 < ce && sorted_ptr[j + 1] == sorted_ptr[j]) continue;  // the piece goes on
        long long id = sorted_ptr[j];
        bool first = piece_start == cs, last = j + 1 == ce;
        if (first && cont_prev) head_ptr[(long long)ch * dim + c] = acc;     // continues a run from before
        else if (last && cont_next) tail_ptr[(long long)ch * dim + c] = acc;  // starts a run that goes on
        else if (id >= 0 && id < vocab) dw_ptr[id * dim + c] += acc;         // a whole run: its only owner
        acc = 0.0f;
        piece_start = j + 1;
    }
}

__global__ void embedding_backward_join_kernel(const long long* __restrict__ sorted_ptr,
                                               const float* __restrict__ head_ptr, const float* __restrict__ tail_ptr,
                                               float* dw_ptr, int n, int vocab, int dim, int chunk) {
    int ch = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    int cs = ch * chunk, ce = min(cs + chunk, n);
    bool single = sorted_ptr[cs] == sorted_ptr[ce - 1];
    if (!emb_cont_next(sorted_ptr, ce, n) || (single && emb_cont_prev(sorted_ptr, cs))) return;  // no tail here
    long long id = sorted_ptr[ce - 1];
    float acc = tail_ptr[(long long)ch * dim + c];
    for (int k = ch + 1;; ++k) {
        acc += head_ptr[(long long)k * dim + c];
        int ks = k * chunk, ke = min(ks + chunk, n);
        if (!(sorted_ptr[ks] == sorted_ptr[ke - 1] && emb_cont_next(sorted_ptr, ke, n))) break;  // the run ends in k
    }
    if (id >= 0 && id < vocab) dw_ptr[id * dim + c] += acc;
}
