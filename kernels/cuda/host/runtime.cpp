// Host build of the CUDA kernels: the launch runtime (feature `cuda-host`).
//
// A launch runs its blocks one after another on the calling OS thread (the
// Rust launcher hands disjoint block ranges to rayon workers). A block's
// threads are cooperative fibers of that OS thread:
//
// - Each fiber runs the kernel on its own stack (64 KiB, a guard page below
//   it; stacks are pooled per OS thread and a stack is taken only when its
//   fiber starts, so a kernel without barriers reuses two warm stacks).
// - A fiber runs until it reaches a barrier: __syncthreads (all live threads
//   of the block) or a warp operation (the 32 lanes of its warp: shuffles,
//   votes, __syncwarp). The last thread to arrive releases the others into a
//   FIFO ready queue and carries on; a waiting fiber switches straight to the
//   next ready fiber, else starts the next unstarted thread. No system call
//   per switch: on x86-64 (ELF: Linux, the BSDs) the switch saves the six
//   callee-saved registers and the stack pointer (lp_host_switch below);
//   elsewhere (or with LP_HOST_FIBER_UCONTEXT, which the tests were also run
//   with) it falls back to swapcontext, one sigprocmask call per switch.
// - POSIX only (mmap for stacks and offset views): no Windows.
// - Warp values are exchanged through 32 slots per warp, double-buffered by
//   the parity of each lane's count of warp operations: a lane cannot reach
//   operation k + 2 before every lane has left operation k.
// - If every unfinished fiber waits and none can be released (a barrier in
//   divergent code, a shuffle waiting for lanes that exited), the launch
//   stops with a "barrier deadlock" fault instead of hanging. Threads that
//   exit count as arrived at __syncthreads (what the hardware does).
//
// Results never depend on this schedule for race-free kernels: the order in
// which threads run between barriers is not observable.

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

// The hand-written switch is x86-64 System V in ELF assembler syntax; other
// targets (and LP_HOST_FIBER_UCONTEXT) use swapcontext.
#if !(defined(__x86_64__) && defined(__ELF__)) || defined(LP_HOST_FIBER_UCONTEXT)
#define LP_HOST_USE_UCONTEXT 1
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700
#endif
#include <ucontext.h>
#endif

#include "lp_host.h"

extern "C" {
__thread LpHostFiberHead* lp_host_fiber = nullptr;
__thread LpHostDims lp_host_dims;
LpHostMath lp_host_math = {nullptr, nullptr};
}

namespace {

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kStackBytes = 64 * 1024;

enum State : int { kUnstarted, kReady, kWaiting, kDone };

struct Fiber {
    LpHostFiberHead head;  // first: lp_host_fiber points here
#ifdef LP_HOST_USE_UCONTEXT
    ucontext_t ctx;
#else
    void* sp;
#endif
    int stack;     // pool stack id, -1 without one
    unsigned seq;  // warp operations done by this thread
    State state;
};

struct Warp {
    unsigned arrived;
    unsigned expected;  // lanes of the warp that exist
    unsigned nwait;
    unsigned waiters[32];
    uint64_t slots[2][32];
};

struct Run {
    void (*entry)(void* const*);
    void* const* args;
    unsigned nthreads;
    unsigned nwarps;
    Fiber* fibers;
    Warp* warps;
    unsigned* ready;  // ring of fiber indices
    unsigned rhead;
    unsigned rcount;
    unsigned next_unstarted;
    unsigned live;  // threads not finished
    unsigned bar_arrived;
    unsigned bar_nwait;
    unsigned* bar_waiters;
    int pending_free;  // stack of an exited fiber, pooled after the next switch
    bool stuck;
#ifdef LP_HOST_USE_UCONTEXT
    ucontext_t sched_ctx;
#else
    void* sched_sp;
#endif
    bool faulted;
    char msg[512];
};

__thread Run* cur_run = nullptr;

// Fiber stacks of one OS thread: kMaxThreads slots of a guard page plus
// kStackBytes, reserved at first use (MAP_NORESERVE: only touched pages cost
// memory), guard pages protected as slots are first handed out.
class StackPool {
public:
    ~StackPool() {
        if (base_) {
            munmap(base_, slot_ * kMaxThreads);
        }
    }

    // A free stack: its id and its top (16-byte aligned); false when out of memory.
    bool get(int* id, char** top) {
        if (!base_ && !reserve()) {
            return false;
        }
        int s;
        if (nfree_ > 0) {
            s = free_[--nfree_];
        } else if (prepared_ < kMaxThreads) {
            s = (int)prepared_;
            if (mprotect(base_ + (size_t)s * slot_, page_, PROT_NONE) != 0) {
                return false;
            }
            ++prepared_;
        } else {
            return false;
        }
        *id = s;
        *top = base_ + (size_t)(s + 1) * slot_;
        return true;
    }

    void put(int id) { free_[nfree_++] = id; }

private:
    bool reserve() {
        page_ = (size_t)sysconf(_SC_PAGESIZE);
        slot_ = page_ + kStackBytes;
        void* p = mmap(nullptr, slot_ * kMaxThreads, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            return false;
        }
        base_ = static_cast<char*>(p);
        return true;
    }

    char* base_ = nullptr;
    size_t page_ = 0;
    size_t slot_ = 0;
    unsigned prepared_ = 0;
    unsigned nfree_ = 0;
    int free_[kMaxThreads];
};

thread_local StackPool pool;

void fault(Run* r, const char* fmt, ...) {
    if (r->faulted) {
        return;
    }
    r->faulted = true;
    const uint3 b = lp_host_dims.block_idx;
    int n = snprintf(r->msg, sizeof r->msg, "block (%u, %u, %u)", b.x, b.y, b.z);
    if (lp_host_fiber && n > 0 && (size_t)n < sizeof r->msg) {
        const uint3 t = lp_host_fiber->thread_idx;
        n += snprintf(r->msg + n, sizeof r->msg - n, " thread (%u, %u, %u)", t.x, t.y, t.z);
    }
    if (n > 0 && (size_t)n < sizeof r->msg) {
        n += snprintf(r->msg + n, sizeof r->msg - n, ": ");
    }
    if (n > 0 && (size_t)n < sizeof r->msg) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg + n, sizeof r->msg - n, fmt, ap);
        va_end(ap);
    }
}

}  // namespace

#ifndef LP_HOST_USE_UCONTEXT
// lp_host_switch(save_sp, to_sp): pushes the System V callee-saved registers
// on the current stack, stores the stack pointer in *save_sp, loads to_sp and
// pops the same registers from there. MXCSR and the x87 control word are not
// switched: no kernel changes them. A new fiber's stack holds six zero
// registers and lp_host_fiber_entry as the return address.
extern "C" void lp_host_switch(void** save_sp, void* to_sp);
extern "C" void lp_host_fiber_entry();
asm(R"(
    .text
    .p2align 4
    .globl lp_host_switch
    .hidden lp_host_switch
    .type lp_host_switch, @function
lp_host_switch:
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
    .size lp_host_switch, .-lp_host_switch

    .p2align 4
    .globl lp_host_fiber_entry
    .hidden lp_host_fiber_entry
    .type lp_host_fiber_entry, @function
lp_host_fiber_entry:
    call lp_host_fiber_main
    ud2
    .size lp_host_fiber_entry, .-lp_host_fiber_entry
)");
#endif

extern "C" __attribute__((visibility("hidden"), noreturn)) void lp_host_fiber_main();

namespace {

void after_switch(Run* r) {
    if (r->pending_free >= 0) {
        pool.put(r->pending_free);
        r->pending_free = -1;
    }
}

// Leaves the current context (fiber `from`, or the scheduler when null) for
// fiber `to` (the scheduler when null).
void transfer(Run* r, Fiber* from, Fiber* to) {
    lp_host_fiber = to ? &to->head : nullptr;
#ifdef LP_HOST_USE_UCONTEXT
    swapcontext(from ? &from->ctx : &r->sched_ctx, to ? &to->ctx : &r->sched_ctx);
#else
    lp_host_switch(from ? &from->sp : &r->sched_sp, to ? to->sp : r->sched_sp);
#endif
    after_switch(r);
}

bool start(Run* r, Fiber* f) {
    char* top;
    if (!pool.get(&f->stack, &top)) {
        fault(r, "no memory for fiber stacks");
        return false;
    }
#ifdef LP_HOST_USE_UCONTEXT
    getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = top - kStackBytes;
    f->ctx.uc_stack.ss_size = kStackBytes;
    f->ctx.uc_link = nullptr;
    makecontext(&f->ctx, (void (*)())lp_host_fiber_main, 0);
#else
    void** sp = reinterpret_cast<void**>(top);
    *--sp = reinterpret_cast<void*>(&lp_host_fiber_entry);
    for (int i = 0; i < 6; ++i) {
        *--sp = nullptr;
    }
    f->sp = sp;
#endif
    f->state = kReady;
    return true;
}

void make_ready(Run* r, unsigned i) {
    r->ready[(r->rhead + r->rcount) % r->nthreads] = i;
    ++r->rcount;
}

// The next fiber to run: a released one, else the next unstarted thread.
Fiber* pick_next(Run* r) {
    if (r->rcount > 0) {
        Fiber* f = &r->fibers[r->ready[r->rhead]];
        r->rhead = (r->rhead + 1) % r->nthreads;
        --r->rcount;
        f->state = kReady;
        return f;
    }
    if (r->next_unstarted < r->nthreads) {
        Fiber* f = &r->fibers[r->next_unstarted++];
        return start(r, f) ? f : nullptr;
    }
    return nullptr;
}

// The current fiber waits: run another one, or go back to the scheduler
// when none can run (then this fiber is never resumed).
void wait(Run* r, Fiber* f) {
    f->state = kWaiting;
    Fiber* n = pick_next(r);
    if (!n) {
        r->stuck = true;
    }
    transfer(r, f, n);
}

void release_block(Run* r) {
    r->bar_arrived = 0;
    for (unsigned i = 0; i < r->bar_nwait; ++i) {
        make_ready(r, r->bar_waiters[i]);
    }
    r->bar_nwait = 0;
}

Fiber* current() { return reinterpret_cast<Fiber*>(lp_host_fiber); }

bool run_block(Run* r, unsigned long long b) {
    const dim3 g = lp_host_dims.grid_dim;
    lp_host_dims.block_idx.x = (unsigned)(b % g.x);
    lp_host_dims.block_idx.y = (unsigned)((b / g.x) % g.y);
    lp_host_dims.block_idx.z = (unsigned)(b / ((unsigned long long)g.x * g.y));
    for (unsigned i = 0; i < r->nthreads; ++i) {
        Fiber& f = r->fibers[i];
        f.state = kUnstarted;
        f.seq = 0;
        f.stack = -1;
    }
    for (unsigned w = 0; w < r->nwarps; ++w) {
        r->warps[w].arrived = 0;
        r->warps[w].nwait = 0;
    }
    r->rhead = r->rcount = 0;
    r->next_unstarted = 0;
    r->live = r->nthreads;
    r->bar_arrived = r->bar_nwait = 0;
    r->pending_free = -1;
    r->stuck = false;
    if (Fiber* first = pick_next(r)) {
        transfer(r, nullptr, first);
    }
    if (r->live != 0) {
        unsigned at_bar = r->bar_nwait;
        unsigned at_warp = 0;
        for (unsigned w = 0; w < r->nwarps; ++w) {
            at_warp += r->warps[w].nwait;
        }
        fault(r,
              "barrier deadlock: %u of %u threads unfinished, %u waiting at __syncthreads, %u at warp "
              "operations (a barrier in divergent code, or a warp operation waiting for lanes that exited)",
              r->live, r->nthreads, at_bar, at_warp);
        // The waiting fibers are abandoned (kernels hold no resources).
        for (unsigned i = 0; i < r->nthreads; ++i) {
            if (r->fibers[i].stack >= 0) {
                pool.put(r->fibers[i].stack);
                r->fibers[i].stack = -1;
            }
        }
        return false;
    }
    return !r->faulted;
}

}  // namespace

extern "C" void lp_host_fiber_main() {
    Run* r = cur_run;
    after_switch(r);
    Fiber* f = current();
    r->entry(r->args);
    f->state = kDone;
    --r->live;
    r->pending_free = f->stack;
    f->stack = -1;
    if (r->bar_arrived > 0 && r->bar_arrived == r->live) {
        release_block(r);
    }
    Fiber* n = pick_next(r);
    if (!n && r->live != 0) {
        r->stuck = true;
    }
    transfer(r, f, n);
    abort();  // an exited fiber is never resumed
}

extern "C" void lp_host_fault(const char* what) {
    if (cur_run) {
        fault(cur_run, "%s", what);
    }
}

extern "C" void lp_host_syncthreads(void) {
    Run* r = cur_run;
    Fiber* f = current();
    if (!r || !f) {
        return;
    }
    if (++r->bar_arrived == r->live) {
        release_block(r);
        return;
    }
    r->bar_waiters[r->bar_nwait++] = (unsigned)(f - r->fibers);
    wait(r, f);
}

extern "C" const uint64_t* lp_host_warp_exchange(unsigned mask, uint64_t value) {
    static const uint64_t none[32] = {0};
    Run* r = cur_run;
    Fiber* f = current();
    if (!r || !f) {
        return none;
    }
    if (mask != 0xffffffffu && mask != f->head.warp_mask) {
        fault(r, "warp operation with mask 0x%08x: only full-warp masks are emulated", mask);
    }
    Warp& w = r->warps[f->head.warp];
    const unsigned par = f->seq++ & 1u;
    w.slots[par][f->head.lane] = value;
    if (++w.arrived == w.expected) {
        w.arrived = 0;
        for (unsigned i = 0; i < w.nwait; ++i) {
            make_ready(r, w.waiters[i]);
        }
        w.nwait = 0;
    } else {
        w.waiters[w.nwait++] = (unsigned)(f - r->fibers);
        wait(r, f);
    }
    return w.slots[par];
}

extern "C" void lp_host_set_math(float (*exp_fn)(float), float (*log1p_fn)(float)) {
    lp_host_math.expf = exp_fn;
    lp_host_math.log1pf = log1p_fn;
}

// Runs blocks [begin, end) (linear index, x fastest) of a launch of `entry`
// with `args` on this OS thread. Returns 0, or 1 with a message in `msg`.
extern "C" int lp_host_launch(void (*entry)(void* const*), void* const* args, const unsigned* grid,
                              const unsigned* block, unsigned shared_bytes, unsigned long long begin,
                              unsigned long long end, char* msg, size_t msg_len) {
    const unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
    const char* refuse = nullptr;
    if (threads == 0 || threads > kMaxThreads) {
        refuse = "a block has 1 to 1024 threads";
    } else if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) {
        refuse = "a grid has at least one block in each dimension";
    } else if (shared_bytes > LP_HOST_DYN_SHARED_BYTES) {
        refuse = "dynamic shared memory above the host build's limit";
    } else if (!lp_host_math.expf || !lp_host_math.log1pf) {
        refuse = "math functions not set (lp_host_set_math)";
    } else if (cur_run) {
        refuse = "a launch from inside a launch";
    }
    if (refuse) {
        snprintf(msg, msg_len, "%s", refuse);
        return 1;
    }
    const unsigned n = (unsigned)threads;
    Run* r = static_cast<Run*>(calloc(1, sizeof(Run)));
    Fiber* fibers = static_cast<Fiber*>(calloc(n, sizeof(Fiber)));
    Warp* warps = static_cast<Warp*>(calloc((n + 31) / 32, sizeof(Warp)));
    unsigned* ready = static_cast<unsigned*>(calloc(n, sizeof(unsigned)));
    unsigned* bar = static_cast<unsigned*>(calloc(n, sizeof(unsigned)));
    int rc = 1;
    if (r && fibers && warps && ready && bar) {
        r->entry = entry;
        r->args = args;
        r->nthreads = n;
        r->nwarps = (n + 31) / 32;
        r->fibers = fibers;
        r->warps = warps;
        r->ready = ready;
        r->bar_waiters = bar;
        r->pending_free = -1;
        for (unsigned i = 0; i < n; ++i) {
            LpHostFiberHead& h = fibers[i].head;
            h.thread_idx.x = i % block[0];
            h.thread_idx.y = (i / block[0]) % block[1];
            h.thread_idx.z = i / (block[0] * block[1]);
            h.lane = i % 32;
            h.warp = i / 32;
            const unsigned in_warp = n - h.warp * 32 < 32 ? n - h.warp * 32 : 32;
            h.warp_mask = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1u;
            warps[h.warp].expected = in_warp;
        }
        const LpHostDims saved = lp_host_dims;
        lp_host_dims.grid_dim = dim3{grid[0], grid[1], grid[2]};
        lp_host_dims.block_dim = dim3{block[0], block[1], block[2]};
        cur_run = r;
        rc = 0;
        for (unsigned long long b = begin; b < end; ++b) {
            if (!run_block(r, b)) {
                rc = 1;
                break;
            }
        }
        cur_run = nullptr;
        lp_host_fiber = nullptr;
        lp_host_dims = saved;
        if (rc != 0) {
            snprintf(msg, msg_len, "%s", r->msg);
        }
    } else {
        snprintf(msg, msg_len, "out of memory for %u fibers", n);
    }
    free(bar);
    free(ready);
    free(warps);
    free(fibers);
    free(r);
    return rc;
}

// -------------------------------------------------- offset views (tests)

// Maps `bytes` of zeroed memory at exactly `addr` (page aligned), without
// replacing any mapping. Returns 0, or -1 when the range is taken.
extern "C" int lp_host_map_at(uint64_t addr, size_t bytes) {
#ifdef MAP_FIXED_NOREPLACE
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
#else
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#endif
    void* want = reinterpret_cast<void*>(addr);
    void* p = mmap(want, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED) {
        return -1;
    }
    if (p != want) {  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
        munmap(p, bytes);
        return -1;
    }
    return 0;
}

// Maps `bytes` of zeroed memory anywhere; returns its address or 0.
extern "C" uint64_t lp_host_map_any(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? 0 : reinterpret_cast<uint64_t>(p);
}

extern "C" void lp_host_unmap(uint64_t addr, size_t bytes) { munmap(reinterpret_cast<void*>(addr), bytes); }

extern "C" size_t lp_host_page_bytes(void) { return (size_t)sysconf(_SC_PAGESIZE); }
