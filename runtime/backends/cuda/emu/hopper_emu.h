// hopper_emu.h: the CPU emulator's side of kernels/cuda/hopper.h (TMA, mbarriers, the
// async-proxy fence, wgmma, setmaxnreg), with the semantics a Hopper GPU gives them.
//
// How each one is emulated:
//   * A TMA load is queued when it is issued and lands (the box is copied, swizzled, and its
//     bytes complete on the mbarrier) at the next mbarrier wait of any thread, or when every
//     thread of the block waits: never before the issuing thread went on. A kernel that reads
//     the tile without waiting on the mbarrier reads what was there before (NaN at first).
//   * An mbarrier counts arrivals and transaction bytes; a phase completes when the pending
//     arrivals reach 0 and the bytes announced by arrive_expect_tx have all landed. A wait
//     blocks the thread until the phase of the parity it names has completed.
//   * wgmma is a collective of the 128 threads of a warpgroup. The product is computed when
//     the last thread issues it (bf16/f16 products exact in float, sums in float), and lands
//     in a thread's accumulators at that thread's wgmma_wait that completes its group. Until
//     then they hold NaN: a kernel that reads them before waiting computes NaN.
//   * Shared-memory addresses (descriptors, __cvta_generic_to_shared) are offsets in one
//     window, as a GPU's are: the dynamic shared memory first, then the static variables.
//
// Reported, each with its cause (the launch stops, as compute-sanitizer would report it):
//   an mbarrier whose phase can never complete (all threads wait: arrivals or transaction
//   bytes missing, with the counts), a thread waiting twice for the same phase (the phase
//   bit not flipped), a TMA box delivering more bytes than announced, a TMA destination not
//   128-byte aligned (or, swizzled, not aligned to the swizzle's 8-row pattern), a wgmma
//   descriptor whose swizzle or 8-row stride disagrees with the TMA copy that wrote the tile,
//   a TMA load that overwrites shared memory a wgmma still reads (a producer that did not wait
//   for the consumer to release the stage), a wgmma not issued by a whole warpgroup, a wgmma
//   or TMA load never waited for when the block ends, setmaxnreg outside 24..256.
#pragma once
#include <stdint.h>
#include <string.h>
#include <math.h>

EMU_NS {
namespace hopper {

constexpr uint32_t kMapMagic = 0x414d5443u;  // "CTMA": a tensor map runtime.tma wrote
// The emulator's tensor map (what utils.tensor_map writes into the 128 bytes in simulation).
struct MapData {
    uint32_t magic, elem;            // element size in bytes
    uint64_t dims[2];                // columns, rows
    uint64_t row_bytes;              // bytes from one row to the next
    uint32_t box[2];                 // box columns, rows
    uint32_t swizzle;                // TmaSwizzle
    uint32_t pad;
    uint64_t base;                   // address of element (0, 0)
};
static_assert(sizeof(MapData) <= 128, "the tensor map is 128 bytes");

constexpr int kMaxBarriers = 64;
// A release that came too early: a thread arrived on a barrier (mbarrier_arrive) while a wgmma
// of its warpgroup that it had not waited for still read this shared memory.
struct EarlyRelease { uintptr_t lo, hi; int op_line, arrive_line, thread; };
constexpr int kMaxEarly = 8;
struct Barrier {
    const void* addr;
    int count, pending, phases, line;
    long long tx;                    // bytes announced and not yet landed (negative: landed first)
    long long announced, landed;     // this phase, for the report
    long long announced_last;        // announced in the phase that completed last
    int consumed[kMaxThreads];       // per thread: 1 + the last phase it waited for (0: none)
    EarlyRelease early[kMaxEarly], early_last[kMaxEarly];  // this phase's, the last completed phase's
    int n_early, n_early_last;
};
inline Barrier bars[kMaxBarriers];
inline int n_bars = 0;
inline int wait_bar[kMaxThreads];    // the barrier each waiting thread waits on
inline int last_waited[kMaxThreads]; // the barrier each thread's last completed wait was on
inline int wait_parity[kMaxThreads];

struct Tma {
    char* dst; MapData map; int col, row, bar, line, phase;  // the barrier's phase when it was issued
};
constexpr int kMaxTma = 256;
inline Tma tmas[kMaxTma];
inline int n_tma = 0;

// Swizzle tags of the dynamic and static shared memory, one byte per 16 bytes: 1 + the
// swizzle mode of the TMA box that wrote it, 0 if no TMA did; and the row bytes of that box.
constexpr size_t kGranules = (kArenaBytes + 15) / 16;
inline unsigned char tag_swizzle[kGranules];
inline unsigned short tag_line[kGranules];
// Ordinary stores not yet fenced for the async proxy, one entry per 16 bytes: 1 + the thread
// that stored there (0: none, or the TMA wrote it since), and that thread's fence count then.
// A thread's fence_proxy_async() adds one to its count, which fences all its earlier stores.
inline unsigned short unfenced_by[kGranules];
inline unsigned unfenced_epoch[kGranules];
inline unsigned fences[kMaxThreads];

struct WgmmaOp {
    int used, wg, group, line, n;
    uint32_t landed[4];              // the threads whose accumulators hold its results (128 bits)
    int n_landed;
    unsigned waited;                 // the warps of the warpgroup that have waited for it (4 bits)
    float* d[128];                   // each thread's accumulators
    float* result;                   // [128][n / 2]
    uintptr_t lo[2], hi[2];          // shared memory it reads (A, B)
};
constexpr int kMaxOps = 64;
inline WgmmaOp ops[kMaxOps];
inline int commits[kMaxThreads];     // wgmma_commit calls of each thread
struct Slot { int line, n; float* d; uint64_t a, b; int scale_d; };
inline Slot slots[kMaxThreads];
inline int arrived[kMaxThreads / 128];

// --------------------------------- the shared window ------------------------------------
// Dynamic shared memory starts the window at its page (so that an address is as aligned in
// the window as in memory); the static variables follow at the next page after it.
EMU_NOTSAN inline uintptr_t dyn_page() { return (uintptr_t)dyn_ptr & ~(uintptr_t)4095; }
EMU_NOTSAN inline uintptr_t static_window() {
    return (((uintptr_t)dyn_ptr + dyn_shared_bytes + kSharedGuard - dyn_page()) + 4095) & ~(uintptr_t)4095;
}
EMU_NOTSAN inline uint32_t window_of(const void* p, int line, const char* what) {
    uintptr_t a = (uintptr_t)p;
    if (a >= dyn_page() && a < (uintptr_t)dyn_ptr + dyn_shared_bytes + kSharedGuard) return (uint32_t)(a - dyn_page());
    if (arena_base && a >= (uintptr_t)arena_base && a < (uintptr_t)arena_base + kStaticSharedArena)
        return (uint32_t)(static_window() + (a - (uintptr_t)arena_base));
    fault_trap("%s on line %d: %p is not a shared-memory address (a pointer to global or local memory, or "
               "past the launch's dynamic shared memory)", what, line, p);
}
EMU_NOTSAN inline char* pointer_of(uint32_t w) {
    uintptr_t sw = static_window();
    if (w < sw) return (char*)(dyn_page() + w);
    return arena_base + (w - sw);
}
EMU_NOTSAN inline size_t granule(const void* p) { return ((uintptr_t)p - (uintptr_t)arena_base) / 16; }
EMU_NOTSAN inline bool in_shared(const void* p) {
    return arena_base && (uintptr_t)p >= (uintptr_t)arena_base && (uintptr_t)p < (uintptr_t)arena_base + kArenaBytes;
}

// --------------------------------- the async proxy ---------------------------------------
EMU_NOTSAN inline void note_shared_store(uintptr_t a, unsigned n) {
    if (!in_shared((const void*)a) || !n) return;
    unsigned me = (unsigned)S.cur;
    for (size_t g = granule((const void*)a); g <= granule((const void*)(a + n - 1)) && g < kGranules; ++g) {
        unfenced_by[g] = (unsigned short)(me + 1);
        unfenced_epoch[g] = fences[me];
    }
}
EMU_NOTSAN inline void forget_stores(const void* lo, size_t bytes) {  // the TMA wrote there
    if (!in_shared(lo) || !bytes) return;
    for (size_t g = granule(lo); g <= granule((const char*)lo + bytes - 1) && g < kGranules; ++g) unfenced_by[g] = 0;
}
// What an async-proxy read (a TMA store's source, a wgmma operand) of the bytes at p must not
// see: a thread's ordinary stores there that it has not fenced since.
EMU_NOTSAN inline void check_fenced(const void* p, size_t bytes, int line, const char* what) {
    if (!in_shared(p) || !bytes) return;
    for (size_t g = granule(p); g <= granule((const char*)p + bytes - 1) && g < kGranules; ++g) {
        unsigned by = unfenced_by[g];
        if (by && unfenced_epoch[g] == fences[by - 1])
            fault_trap("%s on line %d reads shared memory that thread %u wrote with ordinary stores and has not fenced "
                       "since: the TMA unit and the tensor cores read shared memory through the async proxy, which does "
                       "not see a thread's ordinary stores until that thread calls fence_proxy_async(). Call it after "
                       "writing the tile and before the barrier that hands the tile on",
                       what, line, by - 1);
    }
}

// --------------------------------- early releases ----------------------------------------
// A consumer releases a stage by arriving on its barrier; a wgmma of its warpgroup that it has
// not waited for may still read shared memory then. The arrival notes what those wgmma read; a
// TMA load by a thread that waited for that phase may not overwrite it (on a GPU the producer
// can refill the stage while the tensor cores still read it).
EMU_NOTSAN inline void note_early_release(Barrier& B, int line) {
    int me = S.cur, wg = me / 128, lane = me % 128;
    for (int i = 0; i < kMaxOps; ++i) {
        const WgmmaOp& o = ops[i];
        if (!o.used || o.wg != wg || (o.landed[lane / 32] >> (lane % 32) & 1u)) continue;
        for (int k = 0; k < 2; ++k)
            if (B.n_early < kMaxEarly) B.early[B.n_early++] = {o.lo[k], o.hi[k], o.line, line, me};
    }
}
// Only the barrier of the thread's last wait counts: a later proper release (after the wait
// for those wgmma) orders the load after them.
EMU_NOTSAN inline void check_early_release(uintptr_t lo, uintptr_t hi, int line) {
    int me = S.cur;
    int b = last_waited[me];
    if (b >= 0 && b < n_bars) {
        const Barrier& B = bars[b];
        if (B.consumed[me] != B.phases + 1) return;  // the barrier completed another phase since
        for (int i = 0; i < B.n_early_last; ++i) {
            const EarlyRelease& e = B.early_last[i];
            if (lo < e.hi && e.lo < hi)
                fault_trap("tma_load_2d on line %d overwrites shared memory that the wgmma issued on line %d may still "
                           "read: thread %d released the stage (mbarrier_arrive on line %d, the barrier initialised on "
                           "line %d) before waiting for that wgmma. Release a stage only after wgmma_wait says the "
                           "products that read it are done", line, e.op_line, e.thread, e.arrive_line, B.line);
        }
    }
}

// --------------------------------- mbarriers --------------------------------------------
constexpr uint64_t kBarTag = 0xB4A2000000000000ull;
EMU_NOTSAN inline int find_bar(const void* bar, int line, const char* what) {
    if (!in_shared(bar))
        fault_trap("%s on line %d: the mbarrier %p is not in shared memory (mbarriers live in __shared__ "
                   "uint64_t variables)", what, line, bar);
    if ((uintptr_t)bar % 8)
        fault_trap("%s on line %d: the mbarrier %p is not 8-byte aligned", what, line, bar);
    uint64_t v;
    memcpy(&v, bar, 8);
    int i = (int)(v & 0xffff);
    if ((v & 0xffff000000000000ull) != kBarTag || i >= n_bars || bars[i].addr != bar)
        fault_trap("%s on line %d: the mbarrier at %p was never initialised in this block: call "
                   "mbarrier_init(bar, count) (one thread), fence_barrier_init() and __syncthreads() before "
                   "any thread uses it", what, line, bar);
    return i;
}
EMU_NOTSAN inline void wake(int b) {
    for (unsigned t = 0; t < S.nthreads; ++t)
        if (S.th[t].state == ST_WAIT_EXT && wait_bar[t] == b) { wait_bar[t] = -1; push_ready((int)t); }
}
EMU_NOTSAN inline void complete_if_done(int b) {
    Barrier& B = bars[b];
    if (B.pending > 0 || B.tx != 0) return;
    B.phases++;
    B.pending = B.count;
    B.announced_last = B.announced;
    B.announced = B.landed = 0;
    memcpy(B.early_last, B.early, sizeof B.early);
    B.n_early_last = B.n_early;
    B.n_early = 0;
    race_barrier();  // the phase orders what its participants did before it (an over-approximation)
    wake(b);
}
EMU_NOTSAN inline void init(uint64_t* bar, unsigned count, int line) {
    if (!in_shared(bar)) fault_trap("mbarrier_init on line %d: %p is not in shared memory", line, (void*)bar);
    if ((uintptr_t)bar % 8) fault_trap("mbarrier_init on line %d: the mbarrier %p is not 8-byte aligned", line, (void*)bar);
    if (count < 1 || count > (1u << 20) - 1)
        fault_trap("mbarrier_init on line %d: the arrival count must be 1..2^20-1, got %u", line, count);
    int i = -1;
    for (int k = 0; k < n_bars; ++k) if (bars[k].addr == bar) i = k;
    if (i < 0) {
        if (n_bars == kMaxBarriers) fault_trap("mbarrier_init on line %d: more than %d mbarriers in one block", line, kMaxBarriers);
        i = n_bars++;
    }
    Barrier& B = bars[i];
    B.addr = bar; B.count = B.pending = (int)count; B.phases = 0; B.line = line; B.tx = 0; B.announced = B.landed = B.announced_last = 0;
    B.n_early = B.n_early_last = 0;
    for (unsigned t = 0; t < S.nthreads; ++t) B.consumed[t] = 0;
    uint64_t v = kBarTag | (uint64_t)i;
    memcpy(bar, &v, 8);
}
EMU_NOTSAN inline void arrive(uint64_t* bar, long long tx, int line, const char* what) {
    int b = find_bar(bar, line, what);
    Barrier& B = bars[b];
    B.tx += tx;
    B.announced += tx;
    if (B.pending == 0)
        fault_trap("%s on line %d: one arrival more than the mbarrier's count (%d, mbarrier_init on line %d) in "
                   "one phase", what, line, B.count, B.line);
    if (tx == 0) note_early_release(B, line);
    B.pending--;
    complete_if_done(b);
}

EMU_NOTSAN inline void land_all();

EMU_NOTSAN inline void wait(uint64_t* bar, unsigned parity, int line) {
    int b = find_bar(bar, line, "mbarrier_wait");
    Barrier& B = bars[b];
    int me = S.cur;
    parity &= 1;
    land_all();
    for (;;) {
        // The phase of this parity completed when the barrier's current phase has the other parity.
        if (((unsigned)B.phases & 1u) != parity) {
            int phase = B.phases - 1;  // -1: the phase "before the first", complete from the start
            if (B.consumed[me] == phase + 2)
                fault_trap("mbarrier_wait on line %d: thread %d waits with parity %u a second time for the same "
                           "phase (phase %d of the mbarrier initialised on line %d), which it already waited for: "
                           "the wait returns at once, before the next phase's data is there. Flip the phase bit "
                           "after each wait (phase ^= 1; with several stages, each time the stage index wraps)",
                           line, me, parity, phase < 0 ? 0 : phase, B.line);
            B.consumed[me] = phase + 2;
            last_waited[me] = b;
            return;
        }
        S.th[me].state = ST_WAIT_EXT;
        S.th[me].line = line;
        S.th[me].what = "mbarrier_wait";
        wait_bar[me] = b;
        wait_parity[me] = (int)parity;
        switch_to_scheduler();
    }
}

// --------------------------------- TMA ----------------------------------------------------
EMU_NOTSAN inline const MapData& map_of(const void* m, int line, const char* what) {
    const MapData* d = (const MapData*)m;
    if (!m || ((uintptr_t)m % 64))
        fault_trap("%s on line %d: the tensor map %p is not 64-byte aligned (pass the tensor utils.tensor_map "
                   "returned)", what, line, m);
    if (d->magic != kMapMagic)
        fault_trap("%s on line %d: %p is not a tensor map (pass the tensor utils.tensor_map returned, as a "
                   "const TmaDescriptor* argument)", what, line, m);
    return *d;
}
EMU_NOTSAN inline uint32_t swizzle_bytes_of(uint32_t s) { return s == 3 ? 128 : s == 2 ? 64 : s == 1 ? 32 : 0; }
// Where byte `off` of a box lands, from the box's start `w0` in the window: the swizzle XORs
// address bits 4.. with bits 7.. (one bit for 32 B, two for 64 B, three for 128 B).
EMU_NOTSAN inline uint32_t swizzled(uint32_t w, uint32_t s) {
    uint32_t bits = s == 3 ? 7u : s == 2 ? 3u : s == 1 ? 1u : 0u;
    return w ^ ((w >> 3) & (bits << 4));
}
EMU_NOTSAN inline void check_tile(const void* dst, const MapData& m, int line, const char* what) {
    if ((uintptr_t)dst % 128)
        fault_trap("%s on line %d: the shared-memory tile %p is not 128-byte aligned (it is %u bytes past a 128-byte "
                   "boundary): TMA needs 128-byte aligned tiles; align the buffer (__align__(128), or round the "
                   "dynamic shared memory's address up)", what, line, dst, (unsigned)((uintptr_t)dst % 128));
    uint32_t sb = swizzle_bytes_of(m.swizzle);
    uint32_t w = window_of(dst, line, what);
    if (sb && w % (8 * sb))
        fault_trap("%s on line %d: the tile %p is swizzled with %u-byte rows, whose pattern repeats every %u bytes, "
                   "but it starts %u bytes past such a boundary: the wgmma descriptor assumes the pattern starts "
                   "with the tile. Align swizzled tiles to %u bytes", what, line, dst, sb, 8 * sb, w % (8 * sb), 8 * sb);
    size_t bytes = (size_t)m.box[0] * m.box[1] * m.elem;
    if ((uintptr_t)dst + bytes > (uintptr_t)dyn_ptr + dyn_shared_bytes &&
        !((uintptr_t)dst >= (uintptr_t)arena_base && (uintptr_t)dst + bytes <= (uintptr_t)arena_base + kStaticSharedArena))
        fault_trap("%s on line %d: the box of %u x %u elements (%zu bytes) at %p runs past the end of the dynamic "
                   "shared memory (%zu bytes asked for at launch)", what, line, m.box[1], m.box[0], bytes, dst,
                   (size_t)dyn_shared_bytes);
}
EMU_NOTSAN inline void check_overwrite(uintptr_t lo, uintptr_t hi, int line);
EMU_NOTSAN inline void issue_load(void* dst, const void* mp, int col, int row, uint64_t* bar, int line) {
    const MapData& m = map_of(mp, line, "tma_load_2d");
    int b = find_bar(bar, line, "tma_load_2d");
    check_tile(dst, m, line, "tma_load_2d");
    size_t bytes = (size_t)m.box[0] * m.box[1] * m.elem;
    check_overwrite((uintptr_t)dst, (uintptr_t)dst + bytes, line);
    check_early_release((uintptr_t)dst, (uintptr_t)dst + bytes, line);
    if (n_tma == kMaxTma) land_all();
    tmas[n_tma++] = {(char*)dst, m, col, row, b, line, bars[b].phases};
}
EMU_NOTSAN inline void land(const Tma& t) {
    const MapData& m = t.map;
    uint32_t w0 = window_of(t.dst, t.line, "tma_load_2d");
    uint32_t row_bytes = m.box[0] * m.elem;
    check_overwrite((uintptr_t)t.dst, (uintptr_t)t.dst + (uintptr_t)row_bytes * m.box[1], t.line);
    for (uint32_t r = 0; r < m.box[1]; ++r) {
        long long gr = (long long)t.row + r;
        for (uint32_t c = 0; c < m.box[0]; ++c) {
            long long gc = (long long)t.col + c;
            uint32_t w = swizzled(w0 + r * row_bytes + c * m.elem, m.swizzle);
            char* p = pointer_of(w);
            if (gr >= 0 && gc >= 0 && gr < (long long)m.dims[1] && gc < (long long)m.dims[0])
                memcpy(p, (const char*)(uintptr_t)m.base + gr * m.row_bytes + gc * m.elem, m.elem);
            else
                memset(p, 0, m.elem);  // out of bounds: zeros, and the bytes still count
        }
    }
    for (size_t g = granule(t.dst); g < granule(t.dst + (size_t)row_bytes * m.box[1] - 1) + 1 && g < kGranules; ++g) {
        tag_swizzle[g] = (unsigned char)(1 + m.swizzle);
        tag_line[g] = (unsigned short)t.line;
    }
    forget_stores(t.dst, (size_t)row_bytes * m.box[1]);
    Barrier& B = bars[t.bar];
    long long bytes = (long long)row_bytes * m.box[1];
    if (B.phases != t.phase)
        fault_trap("tma_load_2d on line %d: the phase of the mbarrier initialised on line %d that this box of %u x %u "
                   "elements (%lld bytes) completes on was already complete when it arrived: arrive_expect_tx announced "
                   "%lld bytes, fewer than the boxes loaded; the transaction count must be the bytes of every box "
                   "that completes on the barrier (rows x columns x element size each)",
                   t.line, B.line, m.box[1], m.box[0], bytes, B.announced_last);
    B.tx -= bytes;
    B.landed += bytes;
    if (B.pending == 0 && B.tx < 0)
        fault_trap("tma_load_2d on line %d: its box of %u x %u elements delivers %lld bytes to the mbarrier "
                   "initialised on line %d, more than arrive_expect_tx announced for this phase (%lld): the "
                   "transaction count must be the bytes of every box that completes on the barrier",
                   t.line, m.box[1], m.box[0], bytes, B.line, B.announced);
    complete_if_done(t.bar);
}
EMU_NOTSAN inline void land_all() {
    // A landing can complete a phase and fault: take the queue first.
    while (n_tma) {
        Tma t = tmas[0];
        memmove(tmas, tmas + 1, sizeof(Tma) * (size_t)(n_tma - 1));
        n_tma--;
        land(t);
    }
}
EMU_NOTSAN inline void store(const void* mp, int col, int row, const void* src, int line) {
    const MapData& m = map_of(mp, line, "tma_store_2d");
    check_tile(src, m, line, "tma_store_2d");
    uint32_t w0 = window_of(src, line, "tma_store_2d");
    uint32_t row_bytes = m.box[0] * m.elem;
    check_fenced(src, (size_t)row_bytes * m.box[1], line, "tma_store_2d");
    for (uint32_t r = 0; r < m.box[1]; ++r) {
        long long gr = (long long)row + r;
        if (gr < 0 || gr >= (long long)m.dims[1]) continue;
        for (uint32_t c = 0; c < m.box[0]; ++c) {
            long long gc = (long long)col + c;
            if (gc < 0 || gc >= (long long)m.dims[0]) continue;  // out of bounds: not written
            memcpy((char*)(uintptr_t)m.base + gr * m.row_bytes + gc * m.elem,
                   pointer_of(swizzled(w0 + r * row_bytes + c * m.elem, m.swizzle)), m.elem);
        }
    }
}

// --------------------------------- wgmma --------------------------------------------------
EMU_NOTSAN inline void check_overwrite(uintptr_t lo, uintptr_t hi, int line) {
    for (int i = 0; i < kMaxOps; ++i) {
        const WgmmaOp& o = ops[i];
        if (!o.used) continue;
        for (int k = 0; k < 2; ++k)
            if (o.waited != 0xfu && lo < o.hi[k] && o.lo[k] < hi)
                fault_trap("tma_load_2d on line %d overwrites shared memory that the wgmma issued on line %d by "
                           "warpgroup %d may still read: %s. The producer must wait until the consumer releases "
                           "the stage (an 'empty' mbarrier each consumer warp arrives on after its wgmma_wait)",
                           line, o.line, o.wg, o.waited ? "not every warp of the warpgroup has waited for it yet"
                                                        : "its group has not been waited for");
    }
}
// Element (r, k) of a K-major operand in shared memory: r is the row (m of A, n of B), k the
// element along K within this 16-deep step.
EMU_NOTSAN inline uint32_t operand_window(uint64_t desc, int r, int kbyte) {
    uint32_t start = (uint32_t)(desc & 0x3fff) << 4;
    uint32_t lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
    uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
    int layout = (int)(desc >> 62);
    if (layout == 0)  // core matrices of 8 rows x 16 bytes: LBO along K, SBO along the rows
        return start + (uint32_t)(r / 8) * sbo + (uint32_t)(kbyte / 16) * lbo + (uint32_t)(r % 8) * 16 + (uint32_t)(kbyte % 16);
    uint32_t rowb = layout == 1 ? 128 : layout == 2 ? 64 : 32;
    uint32_t s = layout == 1 ? 3 : layout == 2 ? 2 : 1;
    return swizzled(start + (uint32_t)(r / 8) * sbo + (uint32_t)(r % 8) * rowb + (uint32_t)kbyte, s);
}
EMU_NOTSAN inline const char* swizzle_name(int mode) {
    return mode == 3 ? "SWIZZLE_128B" : mode == 2 ? "SWIZZLE_64B" : mode == 1 ? "SWIZZLE_32B" : "SWIZZLE_NONE";
}
template <class T>
EMU_NOTSAN inline void read_operand(float* out, uint64_t desc, int rows, int line, const char* which,
                                    uintptr_t* lo, uintptr_t* hi) {
    int layout = (int)(desc >> 62);
    int mode = layout == 1 ? 3 : layout == 2 ? 2 : layout == 3 ? 1 : 0;
    uint32_t sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4;
    uintptr_t l = ~(uintptr_t)0, h = 0;
    for (int r = 0; r < rows; ++r)
        for (int k = 0; k < 16; ++k) {
            uint32_t w = operand_window(desc, r, k * (int)sizeof(T));
            const char* p = pointer_of(w);
            if (!in_shared(p) || !in_shared(p + sizeof(T) - 1))
                fault_trap("wgmma on line %d: the %s descriptor reaches shared-memory offset %u (row %d, k %d), outside "
                           "the block's shared memory: check its start address and strides", line, which, w, r, k);
            size_t g = granule(p);
            if (g < kGranules && tag_swizzle[g]) {
                int wrote = tag_swizzle[g] - 1;
                if (wrote != mode)
                    fault_trap("wgmma on line %d: the %s tile was written by the TMA load on line %d with %s, but the "
                               "wgmma descriptor reads it as %s: give the descriptor the tensor map's swizzle",
                               line, which, tag_line[g], swizzle_name(wrote), swizzle_name(mode));
                if (mode && r == 8 && k == 0 && sbo != 8 * swizzle_bytes_of((uint32_t)mode))
                    fault_trap("wgmma on line %d: the %s descriptor's stride byte offset is %u bytes, but the tile the TMA "
                               "load on line %d wrote has its 8-row groups %u bytes apart (8 rows of %u bytes)",
                               line, which, sbo, tag_line[g], 8 * swizzle_bytes_of((uint32_t)mode),
                               swizzle_bytes_of((uint32_t)mode));
            }
            check_fenced(p, sizeof(T), line, "wgmma");
            T v;
            memcpy(&v, p, sizeof(T));
            out[r * 16 + k] = (float)v;
            if ((uintptr_t)p < l) l = (uintptr_t)p;
            if ((uintptr_t)p + sizeof(T) > h) h = (uintptr_t)p + sizeof(T);
        }
    *lo = l; *hi = h;
}
// The accumulators thread t of the warpgroup would see if every op issued so far had landed.
EMU_NOTSAN inline const float* latest(int wg, int lane, float* d) {
    const float* best = nullptr;
    int seq = -1;
    for (int i = 0; i < kMaxOps; ++i)
        if (ops[i].used && !(ops[i].landed[lane / 32] >> (lane % 32) & 1u) && ops[i].wg == wg && ops[i].d[lane] == d &&
            ops[i].used > seq) {
            seq = ops[i].used; best = ops[i].result + (size_t)lane * (ops[i].n / 2);
        }
    return best;
}
inline int op_seq = 0;
template <class T>
EMU_NOTSAN inline void issue(float* d, int n, uint64_t a, uint64_t b, int scale_d, int line) {
    int me = S.cur, wg = me / 128, lane = me % 128;
    if ((int)S.nthreads < 128 * (wg + 1))
        fault_trap("wgmma on line %d: thread %d is in warpgroup %d (threads %d-%d), but the block has only %u threads: "
                   "a wgmma is issued by the 128 threads of a warpgroup together (blocks of a multiple of 128 threads)",
                   line, me, wg, 128 * wg, 128 * wg + 127, S.nthreads);
    slots[me] = {line, n, d, a, b, scale_d};
    if (++arrived[wg] < 128) {
        S.th[me].state = ST_WAIT_EXT;
        S.th[me].line = line;
        S.th[me].what = "wgmma";
        wait_bar[me] = -2 - wg;
        switch_to_scheduler();
        return;
    }
    arrived[wg] = 0;
    for (int t = 0; t < 128; ++t) {
        const Slot& s = slots[128 * wg + t];
        if (s.line != line || s.n != n || s.a != a || s.b != b || s.scale_d != scale_d)
            fault_trap("wgmma on line %d: thread %d of warpgroup %d issues a different wgmma (line %d, N %d, other "
                       "descriptors or scale-d): the 128 threads must issue the same one", line, 128 * wg + t, wg,
                       s.line, s.n);
    }
    int slot = -1;
    for (int i = 0; i < kMaxOps; ++i) if (!ops[i].used) { slot = i; break; }
    if (slot < 0) fault_trap("wgmma on line %d: more than %d wgmma in flight (call wgmma_commit and wgmma_wait)", line, kMaxOps);
    WgmmaOp& o = ops[slot];
    static float A[64 * 16], B[256 * 16];
    read_operand<T>(A, a, 64, line, "A", &o.lo[0], &o.hi[0]);
    read_operand<T>(B, b, n, line, "B", &o.lo[1], &o.hi[1]);
    o.result = (float*)malloc(sizeof(float) * 64 * (size_t)n);
    o.wg = wg; o.group = commits[me]; o.line = line; o.n = n; memset(o.landed, 0, sizeof o.landed); o.n_landed = 0; o.waited = 0;
    for (int t = 0; t < 128; ++t) {
        float* dt = slots[128 * wg + t].d;
        o.d[t] = dt;
        const float* in = latest(wg, t, dt);
        if (!in) in = dt;
        float* res = o.result + (size_t)t * (n / 2);
        int w = t / 32, l = t % 32;
        for (int i = 0; i < n / 2; ++i) {
            int row = 16 * w + l / 4 + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
            float acc = scale_d ? in[i] : 0.0f;
            for (int k = 0; k < 16; ++k) acc += A[row * 16 + k] * B[col * 16 + k];
            res[i] = acc;
        }
    }
    o.used = ++op_seq;
    for (int t = 0; t < 128; ++t) {  // undefined until the wait: NaN here
        float* dt = o.d[t];
        for (int i = 0; i < n / 2; ++i) dt[i] = NAN;
    }
    race_tile_sync(1, wg);
    for (int t = 0; t < 128; ++t)
        if (128 * wg + t != me) { wait_bar[128 * wg + t] = -1; push_ready(128 * wg + t); }
}
// A wait of thread `lane` of warpgroup wg for the groups before `upto_group`: the results of
// those ops land in its own accumulators (in issue order: a later op on the same accumulators
// holds the sum of the earlier ones). Its warp counts as having waited (on a GPU the 32 lanes
// wait together): until all 4 warps have, the shared memory the op reads may not be overwritten.
EMU_NOTSAN inline void land_ops(int wg, int upto_group, int lane) {
    uint32_t bit = 1u << (lane % 32);
    for (;;) {
        int pick = -1;
        for (int i = 0; i < kMaxOps; ++i)
            if (ops[i].used && !(ops[i].landed[lane / 32] & bit) && ops[i].wg == wg && ops[i].group < upto_group &&
                (pick < 0 || ops[i].used < ops[pick].used))
                pick = i;
        if (pick < 0) return;
        WgmmaOp& o = ops[pick];
        memcpy(o.d[lane], o.result + (size_t)lane * (o.n / 2), sizeof(float) * (size_t)(o.n / 2));
        o.landed[lane / 32] |= bit;
        o.waited |= 1u << (lane / 32);
        if (++o.n_landed == 128) {
            free(o.result);
            o.result = nullptr;
            o.used = 0;
        }
    }
}
EMU_NOTSAN inline void wait_group(int g, int line) {
    (void)line;
    int me = S.cur;
    land_ops(me / 128, commits[me] - g, me % 128);
}

// --------------------------------- the block's life -------------------------------------
EMU_NOTSAN inline void block_begin() {
    n_bars = 0; n_tma = 0; op_seq = 0;
    for (int i = 0; i < kMaxOps; ++i) {
        if (ops[i].result) free(ops[i].result);
        ops[i].result = nullptr; ops[i].used = 0; ops[i].n_landed = 0; ops[i].waited = 0;
    }
    memset(commits, 0, sizeof commits);
    memset(arrived, 0, sizeof arrived);
    memset(tag_swizzle, 0, sizeof tag_swizzle);
    memset(unfenced_by, 0, sizeof unfenced_by);
    for (int t = 0; t < kMaxThreads; ++t) wait_bar[t] = last_waited[t] = -1;
}
EMU_NOTSAN inline void block_end() {
    if (n_tma)
        fault_in_block(5, "block (%u,%u,%u) ended with the TMA load issued on line %d never waited for: wait on its "
                       "mbarrier (mbarrier_wait) before using the tile, and before the block exits",
                       blockIdx.x, blockIdx.y, blockIdx.z, tmas[0].line);
    for (int i = 0; i < kMaxOps; ++i)
        if (ops[i].used)
            fault_in_block(5, "block (%u,%u,%u) ended with the wgmma issued on line %d by warpgroup %d never waited for: "
                           "call wgmma_commit() and wgmma_wait<0>() before reading its accumulators",
                           blockIdx.x, blockIdx.y, blockIdx.z, ops[i].line, ops[i].wg);
}
// Nobody can run. TMA loads still queued land first; if that wakes nobody and some thread
// waits on an mbarrier or in a wgmma, the block is stuck: say why.
EMU_NOTSAN inline bool block_stuck() {
    if (n_tma) {
        land_all();
        if (S.qhead != S.qtail) return true;
    }
    int n = (int)S.nthreads, waiter = -1;
    for (int t = 0; t < n; ++t) if (S.th[t].state == ST_WAIT_EXT) { waiter = t; break; }
    if (waiter < 0) return false;
    char why[2048];
    int pos = 0;
    if (wait_bar[waiter] <= -2) {
        int wg = -2 - wait_bar[waiter];
        pos = appendf(why, pos, sizeof why, "the wgmma on line %d, which only %d of the 128 threads of warpgroup %d "
                      "(threads %d-%d) reached: all 128 must issue it", S.th[waiter].line, arrived[wg], wg, 128 * wg,
                      128 * wg + 127);
    } else {
        // every barrier some thread waits on, in the order of its first waiter
        bool seen[kMaxBarriers] = {};
        int described = 0;
        for (int t = waiter; t < n; ++t) {
            if (S.th[t].state != ST_WAIT_EXT || wait_bar[t] < 0 || seen[wait_bar[t]]) continue;
            seen[wait_bar[t]] = true;
            const Barrier& B = bars[wait_bar[t]];
            if (described++)
                pos = appendf(why, pos, sizeof why, "; and ");
            pos = appendf(why, pos, sizeof why, "an mbarrier wait on line %d that never completes: the mbarrier "
                          "initialised on line %d waits for phase %d (parity %d) with %d of its %d arrivals missing",
                          S.th[t].line, B.line, B.phases, wait_parity[t], B.pending, B.count);
            if (B.tx > 0)
                pos = appendf(why, pos, sizeof why, " and %lld transaction bytes missing (arrive_expect_tx announced "
                              "%lld, the TMA loads delivered %lld: the byte count must equal the bytes of the boxes "
                              "loaded)", B.tx, B.announced, B.landed);
            else if (B.tx < 0)
                pos = appendf(why, pos, sizeof why, " (the TMA loads delivered %lld bytes more than announced)", -B.tx);
            // the last phase this thread waited for (-1: none, or the phase "before the first")
            int last = B.consumed[t] ? B.consumed[t] - 2 : -1;
            if (B.phases - last >= 2)
                pos = appendf(why, pos, sizeof why, " (thread %d skipped phase %d: the last phase of this barrier it "
                              "waited for was %s%d, and a wait names a phase by its parity, so this one is for phase %d. "
                              "Flip the parity after each phase it waits for: with STAGES stages, parity = "
                              "(k / STAGES) %% 2; a wait for parity 1 before phase 0 completed returns at once)",
                              t, B.phases - 1, last < 0 ? "none, phase " : "", last, B.phases);
            else if (B.pending > 0 && B.tx == 0)
                pos = appendf(why, pos, sizeof why, " (no thread will arrive: an arrive missing, or the count given "
                              "to mbarrier_init too high)");
        }
    }
    fault_deadlock(why);
}
inline const bool registered = (block_hooks = {&block_begin, &block_end, &block_stuck},
                                 shared_store_hook = &note_shared_store, true);

}  // namespace hopper
}  // EMU_NS

// ------------------------------- the functions of hopper.h --------------------------------
inline size_t __cvta_generic_to_shared(const void* p, int line = __builtin_LINE()) {
    return ::emu::hopper::window_of(p, line, "__cvta_generic_to_shared");
}
inline uint32_t smem_addr(const void* p, int line = __builtin_LINE()) {
    return ::emu::hopper::window_of(p, line, "smem_addr");
}
inline void mbarrier_init(uint64_t* bar, unsigned count, int line = __builtin_LINE()) { ::emu::hopper::init(bar, count, line); }
inline void fence_barrier_init() {}
inline void mbarrier_arrive(uint64_t* bar, int line = __builtin_LINE()) {
    ::emu::hopper::arrive(bar, 0, line, "mbarrier_arrive");
}
inline void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes, int line = __builtin_LINE()) {
    ::emu::hopper::arrive(bar, (long long)bytes, line, "mbarrier_arrive_expect_tx");
}
inline void mbarrier_wait(uint64_t* bar, unsigned phase, int line = __builtin_LINE()) {
    ::emu::hopper::wait(bar, phase, line);
}
// try_wait may give up before the phase completes on a GPU (and the caller tries again); here
// it waits until it completes.
inline bool mbarrier_try_wait(uint64_t* bar, unsigned phase, int line = __builtin_LINE()) {
    ::emu::hopper::wait(bar, phase, line);
    return true;
}
inline void fence_proxy_async() { ::emu::hopper::fences[::emu::S.cur]++; }
inline void tma_acquire(const TmaDescriptor*) {}
inline void tma_load_2d(void* dst, const TmaDescriptor* map, int col, int row, uint64_t* bar, int line = __builtin_LINE()) {
    ::emu::hopper::issue_load(dst, map, col, row, bar, line);
}
inline void tma_store_2d(const TmaDescriptor* map, int col, int row, const void* src, int line = __builtin_LINE()) {
    ::emu::hopper::store(map, col, row, src, line);
}
inline void tma_store_commit() {}
inline void tma_store_wait() {}
inline uint64_t make_smem_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes, int layout) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((leading_bytes & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((stride_bytes & 0x3FFFF) >> 4) << 32) | ((uint64_t)layout << 62);
}
inline void wgmma_fence() {}
inline void wgmma_commit() { ::emu::hopper::commits[::emu::S.cur]++; }
template <int G> inline void wgmma_wait(int line = __builtin_LINE()) {
    static_assert(G >= 0 && G <= 7, "wgmma_wait<G>: G is 0..7");
    ::emu::hopper::wait_group(G, line);
}
template <int R> inline void setmaxnreg_inc() {
    static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256 registers, a multiple of 8");
}
template <int R> inline void setmaxnreg_dec() {
    static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256 registers, a multiple of 8");
}
template <int N, class T = __nv_bfloat16>
inline void wgmma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d, int line = __builtin_LINE()) {
    static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma: N is a multiple of 8 from 8 to 256");
    ::emu::hopper::issue<T>(d, N, desc_a, desc_b, scale_d, line);
}
