"""The executor's fast paths (compiler/cpu/runner.py, runtime/executor.py): consecutive
kernel steps in one native call, small kernels on one thread, the feed check's fast path.
Every way of running a program gives the same bits as running each kernel step through
its own ctypes call (the executor before them), and agrees with onnxruntime; outputs are
fresh arrays, inputs are never written, and the thread pool stays correct over many runs,
from two Python threads at once, with 1 and 2 threads."""

import re
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_builders import make_model, vi, onnxruntime_run as _onnxruntime

from celosia.compiler.cpu import runner
from celosia.compiler.cpu.threads import NativePool
from celosia.compiler.graph.ir import InputShapeError
from celosia.models import zoo
from celosia.runtime import executor as executor_module
from celosia.runtime.cpu import CpuModel
from celosia.runtime.executor import GraphExecutor

# kernels compiled into the session's own cache (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("private_cache")



def _kernels_around_numpy(batch=2, c=5, h=7, w=9, seed=0):
    """Conv -> Sin (a numpy step) -> Conv + Relu -> MaxPool, and the
    first conv's output as a second graph output: kernel runs split by a numpy step, odd
    sizes, an output that later steps read too."""
    rng = np.random.default_rng(seed)

    def const(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape,
                                  rng.normal(size=shape).astype(np.float32).ravel())
    nodes = [helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sin", ["c1"], ["s"]),
             helper.make_node("Conv", ["s", "w2"], ["c2"], pads=[0, 1, 0, 1]),
             helper.make_node("Relu", ["c2"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = [const("w1", [c, 3, 3, 3]), const("b1", [c]), const("w2", [11, c, 3, 3])]
    return make_model(nodes, [vi("image", [batch, 3, h, w])],
                      [vi("y", None), vi("c1", [batch, c, h, w])], inits)


def _image(model, seed):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def _every_way(model, x, monkeypatch) -> dict:
    """{way: outputs} for each way the executor can run the program."""
    m = CpuModel.build(model)
    feeds = {"image": x}
    ways = {}
    monkeypatch.setenv("CELOSIA_NUM_THREADS", "2")
    ways["native, 2 threads"] = m.run(feeds)
    ways["profiled"] = m.run(feeds, profile=True)
    assert len(m.profile) == len(m.program.steps)
    monkeypatch.setenv("CELOSIA_NUM_THREADS", "1")
    ways["native, 1 thread"] = m.run(feeds)
    for threshold, name in ((0, "nothing serial"), (1 << 40, "everything serial")):
        monkeypatch.setattr(runner, "SERIAL_WORK", threshold)
        monkeypatch.setenv("CELOSIA_NUM_THREADS", "2")
        ways[name] = GraphExecutor(m.program).run(feeds)
    monkeypatch.undo()
    # Each kernel step through its own ctypes call, as before the step tables.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executor_module, "run_mode", lambda: (None, None))
        for threads in ("1", "2"):
            mp.setenv("CELOSIA_NUM_THREADS", threads)
            ways[f"per step, {threads} threads"] = m.run(feeds)
    return ways


@pytest.mark.parametrize("model", [zoo.small_cnn(batch=1), zoo.small_cnn(batch=3),
                                   zoo.small_cnn(batch=64), _kernels_around_numpy(),
                                   _kernels_around_numpy(batch=1, c=3, h=5, w=13, seed=1)],
                         ids=["small_cnn-1", "small_cnn-3", "small_cnn-64", "around-numpy",
                              "around-numpy-odd"])
def test_every_way_of_running_gives_the_same_bits(model, monkeypatch):
    x = _image(model, seed=3)
    ways = _every_way(model, x, monkeypatch)
    reference = ways.pop("per step, 1 threads")
    for way, outputs in ways.items():
        assert outputs.keys() == reference.keys()
        for name in reference:
            assert np.array_equal(outputs[name], reference[name]), (way, name)
    want = _onnxruntime(model, {"image": x})
    for name in want:
        _close(reference[name], want[name])


def test_consecutive_kernel_steps_are_one_native_call(monkeypatch):
    calls = []
    real = NativePool.run_steps
    monkeypatch.setattr(NativePool, "run_steps",
                        lambda self, n, table: (calls.append(n), real(self, n, table))[1])
    monkeypatch.setenv("CELOSIA_NUM_THREADS", "2")
    m = CpuModel.build(zoo.small_cnn(batch=64))
    kernels = m.program.kernel_steps()
    m.run({"image": _image(zoo.small_cnn(batch=64), 0)})
    assert calls == [kernels]  # conv, maxpool, conv, unpack, gemm; then Softmax in numpy
    calls.clear()
    m = CpuModel.build(_kernels_around_numpy())
    m.run({"image": _image(_kernels_around_numpy(), 0)})
    assert len(calls) == 2 and sum(calls) == m.program.kernel_steps()  # split by Sin


def test_small_kernels_run_on_one_thread():
    small = CpuModel.build(zoo.small_cnn(batch=1)).executor
    large = CpuModel.build(zoo.small_cnn(batch=64)).executor
    assert all(c.small for c in small._calls if isinstance(c, runner.BoundKernel))
    convs = [c for s, c in zip(large.program.steps, large._calls) if s["op"] == "Conv"]
    assert convs and not any(c.small for c in convs)


def test_kernel_work():
    conv = {"op": "conv", "weight": [2, 1, 3, 3, 8, 16]}  # 32 outputs of 8 x 3 x 3 inputs
    out, data = np.empty((1, 2, 4, 4, 16)), np.empty((1, 1, 6, 6, 8))
    assert runner.kernel_work(conv, [data, out]) == data.size + out.size + out.size * 72
    pool = {"op": "maxpool", "kernel": [3, 3]}
    assert runner.kernel_work(pool, [data, out]) == data.size + out.size + out.size * 9
    assert runner.kernel_work({"op": "batch_matmul", "a": [2, 3, 5], "b": [2, 5, 4]},
                              [np.empty((2, 3, 5)), np.empty((2, 5, 4)),
                               np.empty((2, 3, 4))]) == 30 + 40 + 24 * 6
    assert runner.kernel_work({"op": "new kind"}, [data, out]) == data.size + out.size
    qdot = {"op": "qdot", "kernel": [3, 3], "channels": 32, "groups": 2}  # int8_dot.py
    assert runner.kernel_work(qdot, [data, out]) == data.size + out.size + out.size * 144
    assert runner.kernel_work({"op": "qdot", "kernel": [3, 3], "channels": "x", "groups": 2},
                              [data, out]) == data.size + out.size + out.size * 9
    for odd in ({"weight": ["a", 2]}, {"weight": [2]}, {"kernel": [3, None]},
                {"op": "batch_matmul", "a": []}):  # only a rough size: never an error
        assert runner.kernel_work(odd, [data, out]) == data.size + out.size


def test_outputs_are_fresh_and_inputs_untouched():
    model = _kernels_around_numpy()
    m = CpuModel.build(model)
    x1, x2 = _image(model, 1), _image(model, 2)
    x1_before = x1.copy()
    first = m.run({"image": x1})
    kept = {k: v.copy() for k, v in first.items()}
    second = m.run({"image": x2})
    assert np.array_equal(x1, x1_before)
    arena = m.executor._arena
    for name in first:
        assert np.array_equal(first[name], kept[name])  # the second run wrote nothing there
        assert not np.shares_memory(first[name], second[name])
        assert not np.shares_memory(first[name], arena)
        assert first[name].flags.writeable and first[name].flags.c_contiguous
    # An output given back as the next run's input, and a feed that is not C-contiguous
    # (Fortran order, a strided view), give what a plain C-order copy gives.
    fortran, strided = np.asfortranarray(x2), np.repeat(x2, 2, axis=3)[..., ::2]
    for feed in (fortran, strided):
        got = m.run({"image": feed})
        for name in second:
            assert np.array_equal(got[name], second[name])


def test_feeds_that_do_not_match_are_still_clear_errors():
    model = zoo.small_cnn(batch=2)
    m = CpuModel.build(model)
    x = _image(model, 0)
    assert m.executor.feeds_match({"image": x})
    for feeds, says in [({"image": x.astype(np.float64)}, "astype('float32')"),
                        ({"image": x[:1]}, "[1,1,8,8]"),
                        ({}, "was not given"),
                        ({"image": x, "extra": x}, "unknown input 'extra'"),
                        ({"image": x.tolist()}, "must be a numpy array")]:
        assert not m.executor.feeds_match(feeds)
        with pytest.raises(InputShapeError, match=re.escape(says)):
            m.run(feeds)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_many_runs_stay_correct(threads, monkeypatch):
    monkeypatch.setenv("CELOSIA_NUM_THREADS", threads)
    model = zoo.small_cnn(batch=16)
    m = CpuModel.build(model)
    xs = [np.random.default_rng(s).normal(size=(16, 1, 8, 8)).astype(np.float32)
          for s in range(4)]
    first = [m.run({"image": x})["softmax20"] for x in xs]
    for x, y in zip(xs, first):
        _close(y, _onnxruntime(model, {"image": x})["softmax20"])
    for k in range(300):
        assert np.array_equal(m.run({"image": xs[k % 4]})["softmax20"], first[k % 4]), k


def test_two_python_threads_share_the_pool(monkeypatch):
    monkeypatch.setenv("CELOSIA_NUM_THREADS", "2")
    models = [CpuModel.build(zoo.small_cnn(batch=32)), CpuModel.build(_kernels_around_numpy())]
    feeds = [{"image": _image(zoo.small_cnn(batch=32), 5)},
             {"image": _image(_kernels_around_numpy(), 5)}]
    want = [m.run(f) for m, f in zip(models, feeds)]
    wrong = []

    def work(i):
        for _ in range(100):
            got = models[i].run(feeds[i])
            wrong.extend(n for n in got if not np.array_equal(got[n], want[i][n]))
    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


@pytest.mark.parametrize("attrs", [{"keepdims": 0}, {"axes": [1, 2]}])
def test_numpy_step_result_that_does_not_fit_is_a_node_error(attrs):
    """A numpy step whose attributes were edited (a .cel from elsewhere) gives a result of
    another shape: a NodeError naming the node, never a silent broadcast into the output
    buffer nor a ValueError traceback."""
    from celosia.compiler.graph.ir import NodeError

    node = helper.make_node("ReduceL2", ["x"], ["y"], axes=[1], keepdims=1)
    model = CpuModel.build(make_model([node], [vi("x", [2, 3, 4])], [vi("y", [2, 1, 4])]))
    (step,) = [s for s in model.program.steps if s["kind"] == "numpy"]
    step["attrs"].update(attrs)
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    with pytest.raises(NodeError, match=r"ReduceL2.*gives 'y' of shape .* rebuild it"):
        model.run({"x": x})
