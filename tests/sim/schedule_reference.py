"""The cycle model's schedule (pass 2) as it was before it was made cheaper (issue 14): the
discrete-event loop over generators, every unit written out in full. Kept as the reference
that tests/sim/test_schedule_reference.py compares the model's schedule with: every
Timeline row, read burst, fetch batch, statistics sum and error must be the same."""

from celosia.errors import CelosiaError, SimulationLimitError
from celosia.isa import Insn, Module
from celosia.sim.cycle import Timeline, _Static
from celosia.sim.cycle_report import MEM_STAT_TYPES
from celosia.sim.cycle_timing import NEVER, Timing
from celosia.sim.fsim import TOKEN_QUEUES


class ReferenceSchedule:
    """Pass 2: the times of every instruction (see the module docstring).

    Units are generators. ``yield None``: blocked on an event, registered in the waiter
    table of its kind (``w_*``: event -> unit; a unit waits for one event at a time);
    ``yield r``: a read burst whose ARVALID rises in cycle r, resumed with ``(bulk, g)``:
    granted in cycle g, and with ``bulk`` the rest of the instruction's bursts are granted
    as they are requested (nothing else can ask for the channel before they are done).
    An event that happens wakes its waiter, if any, by appending it to ``runnable``.
    """

    def __init__(self, insns: list[Insn], static: _Static, timing: Timing, insn_addr: int,
                 stalls: dict | None = None):
        n = len(insns)
        self.static = static
        self.stalls = stalls or {}
        self.insns, self.plans, self.timing, self.insn_addr = insns, static.plans, timing, insn_addr
        self.module, self.seq = static.module, static.seq
        self.pops, self.pushes = static.pops, static.pushes
        neg = [-1] * n
        self.free, self.dispatch, self.avail = neg[:], neg[:], neg[:]
        self.start, self.done, self.push = neg[:], neg[:], neg[:]
        self.rd_wait, self.rd_lat = [0] * n, [0] * n
        self.tok_ready = [neg[:], neg[:]]
        self.room_ready = [neg[:], neg[:]]
        self.push_t: list[list[int]] = [[] for _ in TOKEN_QUEUES]
        self.pop_t: list[list[int]] = [[] for _ in TOKEN_QUEUES]
        self.batches: list[tuple[int, int, int]] = []
        self.batch_req: list[int] = []
        self.reads: list = []
        self.fetch_reads: list = []  # request, grant, request, grant, ...
        # waiters: instruction readable in fetch's buffer ("a"), dispatched ("d"), started
        # ("s"), per queue its k-th push and k-th pop, and fetch batch b requested
        self.w_a: dict = {}
        self.w_d: dict = {}
        self.w_s: dict = {}
        self.w_push: list[dict] = [{} for _ in TOKEN_QUEUES]
        self.w_pop: list[dict] = [{} for _ in TOKEN_QUEUES]
        self.w_batch: dict = {}
        self.runnable: list = []
        self.channel_free = 0  # the first cycle the read arbiter is idle
        # statistics summed as the schedule goes (cycle_report.timeline_stats)
        self.token_q, self.room_q = [0] * 4, [0] * 4
        self.ran = [0] * len(MEM_STAT_TYPES)
        self.module_sums: list = [None] * 3
        self.fetch_sums = None
        self.fetch_beats = self.fetch_bursts = 0

    # ---- fetch: the DMA (read client 0) and the dispatcher ---------------------------------

    def _fetch_dma(self, me):
        t = self.timing
        n, L, size = len(self.insns), t.read_latency, t.fetch_insns
        reads, avail, runnable, w_a = self.reads, self.avail, self.runnable, self.w_a
        fetch_reads = self.fetch_reads
        batch_req = self.batch_req
        batches = self.static.fetch_batches(t, self.insn_addr)
        first, b = 0, 0
        while first < n:
            if b >= len(batch_req):
                self.w_batch[b] = me
                yield None
            q = batch_req[b]
            count = min(size, n - first)
            batch = batches[b]
            self.batches.append((q, first, count))
            insn_burst, insn_ready = batch.insn_burst, batch.insn_ready
            self.fetch_beats += batch.beats
            self.fetch_bursts += len(batch.span)
            r, bound, k = q + 1, NEVER, 0
            for i in range(len(batch.span)):
                _, g = yield r
                f = max(g + 1 + L, bound)
                reads.append((0, b, i, r, g, f, 0, False))
                fetch_reads += (r, g)
                x = f + batch.span[i]
                self.channel_free = x + 1
                r, bound = x + 1, x + batch.buf_after[i]
                # the burst's instructions can be dispatched while the next burst waits
                while k < count and insn_burst[k] == i:
                    j = first + k
                    avail[j] = f + insn_ready[k]
                    if w_a:
                        u = w_a.pop(j, None)
                        if u is not None:
                            runnable.append((u, None))
                    k += 1
            first += count
            b += 1

    def _fetch_dispatch(self, me):
        t = self.timing
        n, depth, size = len(self.insns), t.cmd_queue_depth, t.fetch_insns
        avail, start, dispatch = self.avail, self.start, self.dispatch
        module, seq = self.module, self.seq
        count = [0, 0, 0]  # instructions dispatched so far per module
        runnable, w_d, w_batch, batch_req = self.runnable, self.w_d, self.w_batch, self.batch_req
        batch_req.append(t.FIRST_FETCH)
        u = w_batch.pop(0, None)
        if u is not None:
            runnable.append((u, None))
        last = -1
        # statistics (cycle_report): the gap before each dispatch is first a wait for the
        # instruction's bytes (gaps: [begin, end) of each), then for command queue room
        data_wait, gaps, room_wait = 0, [], [0, 0, 0]
        for j in range(n):
            if avail[j] < 0:
                self.w_a[j] = me
                yield None
            a = d = avail[j]
            if last >= d:
                d = last + 1
            m = module[j]
            local = count[m]
            count[m] = local + 1
            if local >= depth:  # room once the instruction `depth` ahead has started
                ahead = seq[m][local - depth]
                if start[ahead] < 0:
                    self.w_s[ahead] = me
                    yield None
                if start[ahead] >= d:
                    d = start[ahead] + 1
            gap = last + 1
            mid = d if a >= d else (a if a > gap else gap)  # min(max(a, gap), d)
            data_wait += mid - gap
            gaps.append((gap, mid))
            room_wait[m] += d - mid
            dispatch[j] = last = d
            if w_d:
                u = w_d.pop(j, None)
                if u is not None:
                    runnable.append((u, None))
            if (j + 1) % size == 0 and j + 1 < n:  # the batch is dispatched: request the next
                batch_req.append(d + 1)
                u = w_batch.pop(len(batch_req) - 1, None)
                if u is not None:
                    runnable.append((u, None))
        self.fetch_sums = (data_wait, gaps, room_wait)

    # ---- load, compute, store ---------------------------------------------------------------

    def _module(self, me, m: int):
        t = self.timing
        L, depth = t.read_latency, t.token_queue_depth
        push_t, pop_t, reads, plans = self.push_t, self.pop_t, self.reads, self.plans
        dispatch, start, done, push = self.dispatch, self.start, self.done, self.push
        pops_of_, pushes_of_ = self.pops, self.pushes
        tok_ready, room_ready = self.tok_ready, self.room_ready
        runnable, w_s, w_push, w_pop = self.runnable, self.w_s, self.w_push, self.w_pop
        client = me  # read client id (load 1, compute 2; store never reads)
        stalls = self.stalls
        free_of, rd_wait, rd_lat, w_d = self.free, self.rd_wait, self.rd_lat, self.w_d
        # statistics (cycle_report): waits attributed in order, busy, DRAM and bus cycles
        stat_index, write_waits = self.static.stat_index, self.static.write_waits
        token_q, room_q, ran = self.token_q, self.room_q, self.ran
        busy = cmdq = dram = bus = 0
        free = 0
        for j in self.seq[m]:
            if dispatch[j] < 0:
                w_d[j] = me
                yield None
            s = dispatch[j] + 1
            if free > s:
                s = free
            pops = pops_of_[j]
            for col, q in enumerate(pops):  # the tokens
                k = len(pop_t[q])
                if k >= len(push_t[q]):
                    w_push[q][k] = me
                    yield None
                ready = push_t[q][k] + 1
                tok_ready[col][j] = ready
                if ready > s:
                    s = ready
            free_of[j] = free
            start[j] = s
            mid = dispatch[j] + 1
            if free > mid:
                mid = free
            if mid > s:
                mid = s
            cmdq += mid - free
            if w_s:
                u = w_s.pop(j, None)
                if u is not None:
                    runnable.append((u, None))
            if pops:
                for col, q in enumerate(pops):
                    ready = tok_ready[col][j]  # the wait for each token, in order
                    if ready < mid:
                        ready = mid
                    elif ready > s:
                        ready = s
                    token_q[q] += ready - mid
                    mid = ready
                    pop_t[q].append(s)
                    if w_pop[q]:
                        u = w_pop[q].pop(len(pop_t[q]) - 1, None)
                        if u is not None:
                            runnable.append((u, None))
            plan = plans[j]
            if type(plan) is int:
                p = s + plan
                if stalls:
                    p += stalls.get(j, 0)
                w = write_waits[j]
                dram += w
                busy += p - s - w + 1
            else:  # a LOAD's bursts on the read channel
                # burst i's offsets: the plan's scalars for the first burst (usually the
                # only one granted alone), its lists for later ones
                r, bound, first_i, span_i = s + plan.req0, s + plan.buf0, plan.first0, plan.span0
                wait = lat = i = 0
                nb = plan.n
                while True:
                    bulk, g = yield r
                    f = g + 1 + L
                    if bound > f:
                        f = bound
                    wait += g - r
                    lat += f - g
                    delta = f - s - first_i
                    reads.append((client, j, i, r, g, f, delta, bulk))
                    if bulk:
                        lat += plan.lat_after_at(i) if i else plan.lat0
                        self.channel_free = s + plan.end + delta + 1
                        break
                    self.channel_free = f + span_i + 1
                    i += 1
                    if i == nb:
                        break
                    r, bound, first_i, span_i = plan.burst(i)
                    r += s + delta
                    bound += s + delta
                rd_wait[j] = wait
                rd_lat[j] = lat
                p = s + plan.push + delta
                dram += lat
                bus += wait
                busy += p - s - wait - lat + 1
            done[j] = p
            pushes = pushes_of_[j]
            if pushes:
                mid = p
                for col, q in enumerate(pushes):
                    k = len(push_t[q])
                    if k >= depth:  # room once the token `depth` ahead has been popped
                        if len(pop_t[q]) <= k - depth:
                            w_pop[q][k - depth] = me
                            yield None
                        room = pop_t[q][k - depth] + 1
                        room_ready[col][j] = room
                        if room > p:
                            p = room
                for col, q in enumerate(pushes):
                    room = room_ready[col][j]  # the wait for room in each queue, in order
                    if room < mid:
                        room = mid
                    elif room > p:
                        room = p
                    room_q[q] += room - mid
                    mid = room
                    push_t[q].append(p)
                    if w_push[q]:
                        u = w_push[q].pop(len(push_t[q]) - 1, None)
                        if u is not None:
                            runnable.append((u, None))
            push[j] = p
            free = p + 1
            k = stat_index[j]
            if k >= 0:
                ran[k] += free - s
        self.module_sums[m] = (busy, cmdq, dram, bus)

    # ---- the loop -----------------------------------------------------------------------

    def run(self, max_cycles: int) -> Timeline:
        gens = [self._fetch_dma(0), self._module(1, int(Module.LOAD)),
                self._module(2, int(Module.COMPUTE)), self._module(3, int(Module.STORE)),
                self._fetch_dispatch(4)]
        # read clients of the arbiter: fetch 0, load 1, compute 2 (unit ids are the same)
        runnable = self.runnable
        runnable.extend((u, None) for u in reversed(range(len(gens))))
        pending: dict[int, int] = {}
        finished = 0
        last = 2  # round robin: the first search starts at fetch
        sends = [gen.send for gen in gens]
        pop = runnable.pop
        while True:
            while runnable:
                u, value = pop()
                try:
                    r = sends[u](value)
                except StopIteration:
                    finished += 1
                    continue
                if r is not None:
                    pending[u] = r
            if not pending:
                break
            if len(pending) == 1:
                c, r = pending.popitem()
                g = max(r, self.channel_free)
                bulk = True
            else:
                g = max(self.channel_free, min(pending.values()))
                for off in (1, 2, 3):
                    c = (last + off) % 3
                    if c in pending and pending[c] <= g:
                        break
                del pending[c]
                bulk = False
            if g > max_cycles:
                raise SimulationLimitError(
                    f"the run passed max_cycles={max_cycles} cycles; raise max_cycles "
                    f"(--max-cycles) if the program is meant to run this long")
            last = c
            runnable.append((c, (bulk, g)))
        if finished != len(gens):  # fsim found no deadlock, so this is a model bug
            raise CelosiaError("cycle model: the schedule stopped before every instruction "
                               "ran (an internal error; please report it with the program)")
        timeline = self._timeline()
        if timeline.cycles > max_cycles:
            raise SimulationLimitError(
                f"the run takes {timeline.cycles} cycles, more than max_cycles={max_cycles}; "
                f"raise max_cycles (--max-cycles) if the program is meant to run this long")
        return timeline

    def _timeline(self) -> Timeline:
        st = self.static
        rows = [self.free, self.dispatch, self.avail, self.start, self.done, self.push,
                self.rd_wait, self.rd_lat, *self.tok_ready, *self.room_ready]
        tl = Timeline(self.insns, list(self.plans), self.timing, self.insn_addr, rows,
                      self.batches, self.reads, st.writes, st, self.fetch_reads,
                      dict(self.stalls))
        data_wait, gaps, room_wait = self.fetch_sums
        per = [list(col) for col in zip(*self.module_sums)] + [room_wait]
        tl.sums = (data_wait, gaps, per, self.token_q, self.room_q, self.ran,
                   self.fetch_beats, self.fetch_bursts)
        return tl
