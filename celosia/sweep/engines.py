"""The engines that run design points: ``local`` (worker processes on this machine) and
``ray`` (Ray tasks, on a local cluster started here or a running one).

Both take the same task function and payloads and yield ``(payload, result)`` as points
finish, in whatever order; a result of ``None`` means the worker died twice on that point
(the first death is retried once), with the reason in the second element's place.

Why not concurrent.futures' ProcessPoolExecutor for ``local``: when one of its workers dies,
every pending future fails with BrokenProcessPool and the pool must be rebuilt, so the
engine cannot tell which point killed it. Here each worker process has its own pipe and
runs one point at a time, so a death is charged to exactly the point it was running.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import wait

from celosia.errors import CelosiaError

__all__ = ["run_local", "run_ray", "ENGINES", "DIED"]

ENGINES = ("local", "ray")
DIED = "the worker process died while evaluating this point, and again on its retry"


def _worker(conn) -> None:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        fn, payload = job
        conn.send(fn(payload))


class LocalPool:
    """``workers`` spawned processes, kept across calls of ``run`` (a model-based search
    sends points batch by batch)."""

    def __init__(self, workers: int):
        self.workers = max(1, workers)
        self.ctx = mp.get_context("spawn")
        self.slots: list = []  # [process, conn, (payload, attempt) or None]

    def _start(self):
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        return [proc, parent, None]

    def run(self, fn, payloads):
        """Yield (payload, result or None, reason) as each payload finishes."""
        queue = deque((p, 0) for p in payloads)
        while len(self.slots) < min(self.workers, len(queue)):
            self.slots.append(self._start())
        slots = self.slots
        while queue or any(s[2] is not None for s in slots):
            for s in slots:
                if s[2] is None and queue:
                    s[2] = queue.popleft()
                    s[1].send((fn, s[2][0]))
            ready = wait([s[1] for s in slots if s[2] is not None] +
                         [s[0].sentinel for s in slots if s[2] is not None])
            for i, s in enumerate(slots):
                if s[2] is None or (s[1] not in ready and s[0].sentinel not in ready):
                    continue
                payload, attempt = s[2]
                result = None
                if s[1].poll():
                    try:
                        result = s[1].recv()
                    except (EOFError, OSError):
                        result = None
                if result is not None:
                    s[2] = None
                    yield payload, result, ""
                    continue
                # the worker died: its point is retried once, on a new worker
                s[0].join()
                s[1].close()
                slots[i] = self._start()
                if attempt == 0:
                    queue.appendleft((payload, 1))
                else:
                    yield payload, None, f"{DIED} (exit code {s[0].exitcode})"

    def close(self) -> None:
        for s in self.slots:
            try:
                s[1].send(None)
            except (OSError, BrokenPipeError):
                pass
        for s in self.slots:
            s[0].join(timeout=5)
            if s[0].is_alive():
                s[0].terminate()
                s[0].join()
        self.slots = []


def run_local(fn, payloads, workers: int, timing: dict | None = None, pool=None):
    """Yield (payload, result or None, reason) as each payload finishes on ``workers``
    spawned processes (``timing["start_s"]``: the time to start them), or on ``pool``'s."""
    t0 = time.perf_counter()
    own = pool is None
    pool = LocalPool(workers) if own else pool
    try:
        gen = pool.run(fn, payloads)
        if timing is not None:
            timing.setdefault("start_s", round(time.perf_counter() - t0, 3))
        yield from gen
    finally:
        if own:
            pool.close()


# Ray settings (RayConfig entries, read from RAY_<name> by the processes ray.init starts) of
# a local cluster started here:
# - worker_niceness: Ray starts its workers at nice 15, below the driver, Ray's own daemons
#   and every other program on the machine, where the local engine's workers run at the
#   user's priority (0); on a loaded machine the niced workers got a small share of the
#   cores (80 points: 180 s of wall time for 41 s of CPU time, load 9-13). 0: the same
#   priority as the local engine's workers.
# - enable_metrics_collection: the raylet's and the agents' metrics (the dashboard's, which
#   is not started) cost CPU time on the cores the points run on (1.1 against 0.75 CPU
#   seconds per 20 s of an idle two-worker cluster).
# - RAY_USAGE_STATS_ENABLED: no usage-statistics reporting to Ray's servers.
# A variable the user set is kept; a cluster joined through --address has its own settings.
LOCAL_CLUSTER_ENV = {"RAY_worker_niceness": "0", "RAY_enable_metrics_collection": "0",
                     "RAY_USAGE_STATS_ENABLED": "0"}


@contextmanager
def _environ(values: dict):
    """``values`` set in os.environ (where not set already) for the block, then removed."""
    added = [k for k in values if k not in os.environ]
    os.environ.update({k: values[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _reachable(address: str) -> None:
    """A Ray address names a GCS server that answers; ray.init would wait for minutes on
    one that does not."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise CelosiaError(f"--address {address!r}: give HOST:PORT of the cluster's head (its "
                           f"GCS port, 6379 by default) or auto")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise CelosiaError(f"--address {address}: no Ray cluster answers there ({exc}); start "
                           f"one with `ray start --head` or leave --address out for a local "
                           f"cluster") from None


def run_ray(fn, payloads, workers: int, address: str | None, timing: dict | None = None,
            keep: bool = False):
    """The same as run_local through Ray: ``address`` None starts a local cluster of
    ``workers`` CPUs (no dashboard) and stops it at the end; "auto" or an address joins a
    running one (celosia must be installed on its nodes), keeping at most 2 x ``workers``
    points in flight. ``timing["start_s"]``: the time to import Ray and start or join the
    cluster. With ``keep`` the cluster is left running for the next call (the caller shuts
    it down)."""
    t0 = time.perf_counter()
    try:
        import ray
        from ray.exceptions import RayError
    except ImportError:
        raise CelosiaError("--engine ray needs the ray package: pip install 'celosia[sweep]'") \
            from None
    started = not ray.is_initialized()
    if started and address and address != "auto":
        _reachable(address)
    if started:
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                with _environ(LOCAL_CLUSTER_ENV):
                    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise CelosiaError(f"--engine ray: cannot {'join the cluster at ' + address if address else 'start a local Ray cluster'}: {exc}") from None
    if timing is not None:
        timing.setdefault("start_s", round(time.perf_counter() - t0, 3))
    remote = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=False)(fn)
    pending = deque(payloads)
    running: dict = {}
    window = max(1, 2 * workers)
    try:
        while pending or running:
            while pending and len(running) < window:
                p = pending.popleft()
                running[remote.remote(p)] = p
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                payload = running.pop(ref)
                try:
                    yield payload, ray.get(ref), ""
                except RayError as exc:  # the worker died twice (Ray retried it once)
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                    yield payload, None, f"{DIED} (Ray: {type(exc).__name__}: {first})"
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        if started and not keep:
            ray.shutdown()
