// celosia RTL harness: the Verilated accelerator plus a C++ DRAM behind an AXI4 slave model
// and an AXI4-Lite host, driven from Python through ctypes (sim/rtl.py). Whole runs happen
// in C++: Python never steps a cycle.
//
// DRAM model timing (docs/microarchitecture.md, "DRAM model"):
//  - AR accepted in cycle a (ARREADY is high whenever no read is queued) -> the burst's
//    first beat is valid in cycle a + read_latency, then one beat per cycle while RREADY.
//  - AW accepted when no write is outstanding; W beats accepted every cycle after it
//    (WREADY high); BVALID rises write_latency cycles after the WLAST beat.
//  - With stall_pct > 0 every ready/valid of the slave is also dropped at random in that
//    percentage of cycles (seeded), to test back-pressure; timing is then not modelled.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "Vcelosia_accel.h"
#include "Vcelosia_accel___024root.h"
#include "verilated.h"
#if CELOSIA_TRACE
#include "verilated_vcd_c.h"
#endif
#include "celosia_regs.h"  // generated: register offsets, BUS_BYTES

#define AXI(n) top->m_axi___05F##n
#define LITE(n) top->s_axil___05F##n

// CELOSIA_ONE_EVAL (set by sim/rtl.py when the Verilated model's AXI master outputs do not
// depend combinationally on its inputs): run() clocks one eval() per cycle instead of two.
#ifndef CELOSIA_ONE_EVAL
#define CELOSIA_ONE_EVAL 0
#endif

namespace {

// Verilator 5 finds a rising clock edge by comparing clk with the value it had at the
// previous eval(), kept in the root as __Vtrigprevexpr___TOP__clk__0. Where that member
// exists, clearing it before an eval() with clk high is a rising edge without the eval()
// of the falling one (which, as the core has no negative-edge logic, only re-evaluates the
// input logic). Other Verilator versions get the two evals.
template <typename R, typename = void>
struct ClkPrev : std::false_type {
    static void clear(R&) {}
};
template <typename R>
struct ClkPrev<R, std::void_t<decltype(std::declval<R&>().__Vtrigprevexpr___TOP__clk__0)>>
    : std::true_type {
    static void clear(R& root) { root.__Vtrigprevexpr___TOP__clk__0 = 0; }
};
using RootClk = ClkPrev<Vcelosia_accel___024root>;

template <typename T>
void set_bytes(T& sig, const uint8_t* p, int n) {
    T v = 0;
    std::memcpy(&v, p, n);
    sig = v;
}
template <std::size_t W>
void set_bytes(VlWide<W>& sig, const uint8_t* p, int n) {
    std::memset(&sig[0], 0, W * 4);
    std::memcpy(&sig[0], p, n);
}
template <typename T>
void get_bytes(const T& sig, uint8_t* p, int n) {
    T v = sig;
    std::memcpy(p, &v, n);
}
template <std::size_t W>
void get_bytes(const VlWide<W>& sig, uint8_t* p, int n) {
    std::memcpy(p, &sig[0], n);
}

struct Burst {
    uint64_t addr;
    unsigned beats;
    uint64_t ready_at;
};

struct Harness {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vcelosia_accel> top;
    std::vector<uint8_t> dram;
    unsigned read_latency, write_latency, stall_pct, stall_mask = 31;
    std::mt19937_64 rng;
    uint64_t now = 0;
    uint64_t bus_errors = 0;
    // read side
    std::deque<Burst> reads;
    unsigned r_beat = 0;
    // write side
    bool aw_pending = false;
    uint64_t w_addr = 0;
    unsigned w_beat = 0;
    bool b_pending = false;
    uint64_t b_at = 0;
#if CELOSIA_TRACE
    std::unique_ptr<VerilatedVcdC> trace;
#endif

    // channel bits: 1 AR, 2 R, 4 AW, 8 W, 16 B
    bool stall(unsigned channel) { return (stall_mask & channel) && stall_pct && (rng() % 100) < stall_pct; }

    // Drive the slave's outputs for the coming cycle from its state (never from the
    // master's outputs in the same cycle).
    void drive() {
        AXI(arready) = reads.size() < 2 && !stall(1);
        bool rv = !reads.empty() && reads.front().ready_at <= now && !stall(2);
        AXI(rvalid) = rv;
        if (rv) {
            const Burst& b = reads.front();
            uint64_t a = b.addr + (uint64_t)r_beat * BUS_BYTES;
            uint8_t beat[BUS_BYTES] = {0};
            if (a + BUS_BYTES <= dram.size()) std::memcpy(beat, &dram[a], BUS_BYTES);
            set_bytes(AXI(rdata), beat, BUS_BYTES);
            AXI(rlast) = r_beat + 1 == b.beats;
        } else {
            AXI(rlast) = 0;
        }
        AXI(rresp) = 0;
        AXI(rid) = 0;
        AXI(awready) = !aw_pending && !b_pending && !stall(4);
        AXI(wready) = aw_pending && !stall(8);
        AXI(bvalid) = b_pending && b_at <= now && !stall(16);
        AXI(bresp) = 0;
        AXI(bid) = 0;
    }

    // Sample the handshakes of the cycle that is ending and update the slave state.
    void sample() {
        if (AXI(arvalid) && AXI(arready)) {
            reads.push_back({AXI(araddr), (unsigned)AXI(arlen) + 1u, now + read_latency});
        }
        if (AXI(rvalid) && AXI(rready)) {
            if (++r_beat == reads.front().beats) {
                reads.pop_front();
                r_beat = 0;
            }
        }
        if (AXI(awvalid) && AXI(awready)) {
            aw_pending = true;
            w_addr = AXI(awaddr);
            w_beat = 0;
        }
        if (AXI(wvalid) && AXI(wready)) {
            uint8_t beat[BUS_BYTES];
            get_bytes(AXI(wdata), beat, BUS_BYTES);
            uint64_t strb = AXI(wstrb);
            uint64_t a = w_addr + (uint64_t)w_beat * BUS_BYTES;
            for (int i = 0; i < BUS_BYTES; i++) {
                if (!((strb >> i) & 1)) continue;
                if (a + i < dram.size()) dram[a + i] = beat[i];
                else bus_errors++;
            }
            w_beat++;
            if (AXI(wlast)) {
                aw_pending = false;
                b_pending = true;
                b_at = now + write_latency;
            }
        }
        if (AXI(bvalid) && AXI(bready)) b_pending = false;
    }

    void tick() {
        top->clk = 0;
        drive();
        top->eval();
#if CELOSIA_TRACE
        if (trace) trace->dump(2 * now);
#endif
        sample();
        top->clk = 1;
        top->eval();
#if CELOSIA_TRACE
        if (trace) trace->dump(2 * now + 1);
#endif
        now++;
    }

    // One cycle of a run: as tick(), but the AXI master outputs sampled are those of the
    // last eval() (they depend on the core's state only: CELOSIA_ONE_EVAL), so the slave's
    // outputs for the cycle are driven and the handshakes sampled before a single eval()
    // that clocks the edge.
    void run_tick() {
#if CELOSIA_ONE_EVAL && !CELOSIA_TRACE
        if constexpr (RootClk::value) {
            drive();
            sample();
            RootClk::clear(*top->rootp);
            top->clk = 1;
            top->eval();
            now++;
            return;
        }
#endif
        tick();
    }

    void reg_write(uint32_t addr, uint32_t data) {
        LITE(awaddr) = addr;
        LITE(wdata) = data;
        LITE(wstrb) = 0xF;
        LITE(awvalid) = 1;
        LITE(wvalid) = 1;
        LITE(bready) = 1;
        bool accepted = false;
        for (int guard = 0; guard < 1000; guard++) {
            top->clk = 0;
            drive();
            top->eval();
            bool acc_now = !accepted && LITE(awready) && LITE(wready);
            bool b_now = LITE(bvalid);
            sample();
            top->clk = 1;
            top->eval();
            now++;
            if (acc_now) {
                accepted = true;
                LITE(awvalid) = 0;
                LITE(wvalid) = 0;
            }
            if (b_now) break;
        }
        LITE(bready) = 0;
    }

    uint32_t reg_read(uint32_t addr) {
        LITE(araddr) = addr;
        LITE(arvalid) = 1;
        LITE(rready) = 1;
        uint32_t value = 0;
        bool accepted = false;
        for (int guard = 0; guard < 1000; guard++) {
            top->clk = 0;
            drive();
            top->eval();
            bool acc_now = !accepted && LITE(arready);
            bool r_now = LITE(rvalid);
            if (r_now) value = LITE(rdata);
            sample();
            top->clk = 1;
            top->eval();
            now++;
            if (acc_now) {
                accepted = true;
                LITE(arvalid) = 0;
            }
            if (r_now) break;
        }
        LITE(rready) = 0;
        return value;
    }
};

}  // namespace

extern "C" {

void* celosia_create(uint64_t dram_size, unsigned read_latency, unsigned write_latency,
                     unsigned stall_pct, uint64_t seed, const char* trace_path) {
    auto* h = new Harness;
    h->ctx = std::make_unique<VerilatedContext>();
    h->ctx->threads(1);
#if CELOSIA_TRACE
    if (trace_path && *trace_path) h->ctx->traceEverOn(true);
#endif
    h->top = std::make_unique<Vcelosia_accel>(h->ctx.get(), "top");
    h->dram.assign(dram_size, 0);
    h->read_latency = read_latency ? read_latency : 1;
    h->write_latency = write_latency ? write_latency : 1;
    h->stall_pct = stall_pct;
    h->rng.seed(seed);
    if (const char* mask = std::getenv("CELOSIA_STALL_MASK")) h->stall_mask = std::atoi(mask);
#if CELOSIA_TRACE
    if (trace_path && *trace_path) {
        h->trace = std::make_unique<VerilatedVcdC>();
        h->top->trace(h->trace.get(), 99);
        h->trace->open(trace_path);
    }
#else
    (void)trace_path;
#endif
    h->top->rst = 1;
    for (int i = 0; i < 4; i++) h->tick();
    h->top->rst = 0;
    h->tick();
    return h;
}

void celosia_destroy(void* p) {
    auto* h = static_cast<Harness*>(p);
#if CELOSIA_TRACE
    if (h->trace) h->trace->close();
#endif
    h->top->final();
    delete h;
}

uint8_t* celosia_dram(void* p) { return static_cast<Harness*>(p)->dram.data(); }
uint64_t celosia_now(void* p) { return static_cast<Harness*>(p)->now; }
uint64_t celosia_bus_errors(void* p) { return static_cast<Harness*>(p)->bus_errors; }
uint32_t celosia_reg_read(void* p, uint32_t addr) { return static_cast<Harness*>(p)->reg_read(addr); }
void celosia_reg_write(void* p, uint32_t addr, uint32_t data) {
    static_cast<Harness*>(p)->reg_write(addr, data);
}

// Start the program whose registers are already written and clock until CONTROL.done.
// The control register is polled every poll_interval cycles (the core's own cycle counter,
// not the harness's, is what the caller reports). Returns 0 when done, 1 at max_cycles.
int celosia_run(void* p, uint64_t max_cycles, unsigned poll_interval) {
    auto* h = static_cast<Harness*>(p);
    h->reg_write(REG_CONTROL, 1);
    uint64_t start = h->now;
    if (poll_interval == 0) poll_interval = 1;
    for (;;) {
        for (unsigned i = 0; i < poll_interval; i++) h->run_tick();
        if (h->reg_read(REG_CONTROL) & 2u) return 0;
        if (h->now - start >= max_cycles) return 1;
    }
}

}  // extern "C"
