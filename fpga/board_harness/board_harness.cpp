// celosia board harness: the Verilated board top (fpga/board.py) with its UART lines
// bridged to a TCP socket (fpga/board_sim.py). The host side of the UART is modelled here
// at the same divisor (clocks per bit): bytes from the socket are sent bit by bit on
// uart_rx, and bits the board sends on uart_tx are put together into bytes for the socket.
// The model is clocked while anything is under way (a byte on either line, a request in
// the bridge, a program running: leds bits 0 and 1) and sleeps in poll() otherwise.
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "Vcelosia_board.h"
#include "verilated.h"

namespace {

struct Board {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vcelosia_board> top;
    unsigned div = 4;
    uint64_t now = 0;
    // host -> board (uart_rx)
    std::deque<uint8_t> inq;
    unsigned tx_bits = 0, tx_timer = 0;
    uint32_t tx_frame = 0x3FF;
    // board -> host (uart_tx)
    int rx_state = 0;
    unsigned rx_timer = 0, rx_bit = 0;
    uint8_t rx_byte = 0;
    std::vector<uint8_t> outq;
    uint64_t framing_errors = 0;

    void tick() {
        if (tx_bits == 0 && !inq.empty()) {
            tx_frame = (1u << 9) | (uint32_t(inq.front()) << 1);
            inq.pop_front();
            tx_bits = 10;
            tx_timer = div;
        }
        top->uart_rx = tx_bits ? (tx_frame & 1) : 1;
        top->clk = 0;
        top->eval();
        top->clk = 1;
        top->eval();
        now++;
        if (tx_bits && --tx_timer == 0) {
            tx_frame >>= 1;
            tx_bits--;
            tx_timer = div;
        }
        bool line = top->uart_tx;
        switch (rx_state) {
            case 0:
                if (!line) { rx_state = 1; rx_timer = div / 2; }
                break;
            case 1:
                if (--rx_timer == 0) {
                    if (line) rx_state = 0;  // a glitch
                    else { rx_state = 2; rx_timer = div; rx_bit = 0; rx_byte = 0; }
                }
                break;
            case 2:
                if (--rx_timer == 0) {
                    rx_byte |= uint8_t(line) << rx_bit;
                    rx_timer = div;
                    if (++rx_bit == 8) rx_state = 3;
                }
                break;
            case 3:
                if (--rx_timer == 0) {
                    if (line) outq.push_back(rx_byte);
                    else framing_errors++;
                    rx_state = 0;
                }
                break;
        }
    }

    bool busy() const { return !inq.empty() || tx_bits || rx_state || (top->leds & 3); }
};

bool send_all(int fd, std::vector<uint8_t>& q) {
    size_t off = 0;
    while (off < q.size()) {
        ssize_t n = send(fd, q.data() + off, q.size() - off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        off += size_t(n);
    }
    q.clear();
    return true;
}

}  // namespace

extern "C" {

void* board_create(unsigned divisor) {
    auto* b = new Board;
    b->ctx = std::make_unique<VerilatedContext>();
    b->ctx->threads(1);
    b->top = std::make_unique<Vcelosia_board>(b->ctx.get(), "top");
    b->div = divisor;
    b->top->uart_rx = 1;
    b->top->rst = 1;
    for (int i = 0; i < 4; i++) b->tick();
    b->top->rst = 0;
    b->tick();
    return b;
}

void board_destroy(void* p) {
    auto* b = static_cast<Board*>(p);
    b->top->final();
    delete b;
}

uint64_t board_now(void* p) { return static_cast<Board*>(p)->now; }

// Listen on host:port (port 0: any free port); returns the socket, the port in *bound.
int board_listen(const char* host, unsigned port, unsigned* bound) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) { close(fd); return -1; }
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 || listen(fd, 4) < 0) {
        close(fd);
        return -1;
    }
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    *bound = ntohs(a.sin_port);
    return fd;
}

// Serve connections one after another, forever (the process is ended by its owner).
// With max_connections > 0, return after that many.
int board_serve(void* p, int listen_fd, unsigned max_connections) {
    auto* b = static_cast<Board*>(p);
    unsigned served = 0;
    uint8_t buf[4096];
    for (;;) {
        int conn = accept(listen_fd, nullptr, nullptr);
        if (conn < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        int one = 1;
        setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        unsigned idle = 0;
        bool open = true;
        while (open) {
            if (b->inq.size() < sizeof buf) {
                ssize_t n = recv(conn, buf, sizeof buf, MSG_DONTWAIT);
                if (n == 0) open = false;
                else if (n > 0) b->inq.insert(b->inq.end(), buf, buf + n);
                else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) open = false;
            }
            if (idle > 64 * b->div) {  // nothing under way: wait for the host
                if (!b->outq.empty() && !send_all(conn, b->outq)) break;
                pollfd pf{conn, POLLIN, 0};
                poll(&pf, 1, 50);
                idle = 0;
                continue;
            }
            for (int i = 0; i < 256; i++) {
                b->tick();
                idle = b->busy() ? 0 : idle + 1;
            }
            if (!b->outq.empty() && !send_all(conn, b->outq)) break;
        }
        close(conn);
        b->inq.clear();
        b->outq.clear();
        if (max_connections && ++served == max_connections) return 0;
    }
}

}  // extern "C"
