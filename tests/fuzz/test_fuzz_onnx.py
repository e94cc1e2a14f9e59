"""Mutation fuzzing of the ONNX frontend (issue #18): valid models (the zoo's small CNN and
MobileNetV2, the digits CNN, small graphs of every supported operator: onnx_seeds.py) mutated
at the protobuf level and byte level (onnx_mutate.py), then

- in-process: ``import_onnx`` gives a graph that runs on ``run_graph`` and matches
  onnxruntime wherever onnxruntime takes the same model, or raises a one-line CelosiaError,
  never another exception (onnx_oracle.py);
- through the CLI: ``celosia compile MODEL --target cpu`` and ``celosia run MODEL --target
  cpu`` exit 0, or exit 2 with one line on stderr, with no traceback, signal or hang
  (cli_batch.py runs a batch of them per process, since start-up dominates).

Every case is ``(seed model, case number)``: ``onnx_mutate.mutate(data, case)`` rebuilds it.
The default run takes a fast subset (about 3,000 in-process cases and 100 command lines,
~10 s); ``-m slow`` runs about 59,000 in-process cases and 1,900 command lines (a minute or
two).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from onnx_mutate import mutate
from onnx_oracle import check_case
from onnx_seeds import op_models, parse, seeds

HERE = Path(__file__).resolve().parent
# Mutations may ask for huge tensors: hold every case to 16 MiB (celosia.limits).
LIMIT = str(16 << 20)


def case_seed(name: str, case: int) -> int:
    """The mutation seed of a case: the same in every process (str hashes are not)."""
    return zlib.crc32(f"{name}/{case}".encode())


@pytest.fixture(autouse=True)
def _small_limit(monkeypatch):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", LIMIT)


def run_cases(names, cases, *, compare_every=1) -> tuple[dict, list[str]]:
    """Mutate each seed model ``cases`` times (case numbers from ``cases``); returns the count
    of each outcome and the failures."""
    all_seeds = seeds()
    counts, failures = {}, []
    for name in names:
        data, shapes = all_seeds[name]
        for case in cases:
            mutated, what = mutate(data, case_seed(name, case))
            outcome, failure = check_case(mutated, shapes, case,
                                          compare=case % compare_every == 0)
            counts[outcome] = counts.get(outcome, 0) + 1
            if failure:
                failures.append(f"{name} case {case} ({what}): {failure}")
    return counts, failures


def _assert_no_failures(counts, failures):
    assert not failures, f"{len(failures)} failing cases ({counts}):\n" + "\n".join(failures[:20])
    # A fuzzer whose mutants are all rejected, or all accepted, tests little.
    assert counts.get("rejected", 0) and counts.get("ran", 0) + counts.get("compared", 0), counts


def test_issue_18_cases_are_one_line_errors():
    """The mutations of the issue, one by one: each a CelosiaError naming the node."""
    from onnx import helper

    from celosia.compiler.frontend.onnx import import_onnx
    from celosia.compiler.graph.ir import GraphError

    def variant(key, change):
        m = parse(op_models()[key])
        change(m.graph.node[0], m)
        return m.SerializeToString()

    def set_attr(name, value, **kw):
        def change(node, m):
            for a in list(node.attribute):
                if a.name == name:
                    node.attribute.remove(a)
            node.attribute.append(helper.make_attribute(name, value, **kw))
        return change

    cases = {
        "zero strides": variant("Conv", set_attr("strides", [0, 0])),
        "int strides": variant("Conv", set_attr("strides", 2)),
        "axis as strings": variant("Softmax", set_attr("axis", ["a", "b"])),
        "3-D Gemm": variant("Gemm", lambda n, m: m.graph.input[0].type.tensor_type.shape
                            .dim.add().__setattr__("dim_value", 2)),
        "MatMul, one input": variant("MatMul", lambda n, m: n.input.pop()),
        "Reshape, one input": variant("Reshape", lambda n, m: n.input.pop()),
        "element type 0": variant("Relu", lambda n, m: m.graph.input[0].type.tensor_type
                                  .__setattr__("elem_type", 0)),
        "attribute not UTF-8": variant("Pad", set_attr("mode", b"\xff\xfe")),
        "dimension 2^31": variant("Relu", lambda n, m: m.graph.input[0].type.tensor_type.shape
                                  .dim[0].__setattr__("dim_value", 2**31)),
        "Gemm, fourth input": variant("Gemm", lambda n, m: n.input.append("c")),
        "initializer dim -1": variant("Tile", lambda n, m: m.graph.initializer[0].dims
                                      .__setitem__(0, -1)),
    }
    for what, data in cases.items():
        with pytest.raises(GraphError) as e:
            import_onnx(data)
        text = str(e.value)
        assert "\n" not in text and text.startswith("<bytes>: "), (what, text)
        assert "node '" in text or "input '" in text or "initializer" in text or \
            "tensor name" in text, (what, text)


def test_fuzz_operators_fast():
    counts, failures = run_cases(sorted(op_models()), range(20))
    _assert_no_failures(counts, failures)


def test_fuzz_whole_models_fast():
    counts, failures = run_cases(["small_cnn", "digits"], range(150), compare_every=3)
    failures += run_cases(["mobilenet_v2"], range(10), compare_every=3)[1]
    _assert_no_failures(counts, failures)


@pytest.mark.slow
def test_fuzz_operators_slow():
    counts, failures = run_cases(sorted(op_models()), range(20, 420))
    _assert_no_failures(counts, failures)


@pytest.mark.slow
def test_fuzz_whole_models_slow():
    counts, failures = run_cases(["small_cnn", "digits"], range(150, 2650), compare_every=4)
    more, f2 = run_cases(["mobilenet_v2"], range(10, 310), compare_every=10)
    _assert_no_failures({k: counts.get(k, 0) + more.get(k, 0) for k in {*counts, *more}},
                        failures + f2)


# ---- through the command line ----------------------------------------------------------------


def _write_cases(tmp_path, names, cases) -> list[dict]:
    """Mutated models as files, with .npy inputs of the seed model's input types."""
    all_seeds = seeds()
    jobs = []
    for name in names:
        data, shapes = all_seeds[name]
        model = parse(data)
        stem = name.replace("/", "_")  # "Mod/fmod": one file name
        inputs = []
        for vi in model.graph.input:
            if vi.name in {t.name for t in model.graph.initializer}:
                continue
            t = vi.type.tensor_type
            shape = (shapes or {}).get(vi.name) or [d.dim_value for d in t.shape.dim]
            from onnx import helper
            dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
            path = tmp_path / f"{stem}.{vi.name}.npy"
            np.save(path, np.ones(shape, dtype))
            inputs.append(f"{vi.name}={path}")
        for case in cases:
            mutated, what = mutate(data, case_seed(name, case))
            path = tmp_path / f"{stem}-{case}.onnx"
            path.write_bytes(mutated)
            shape_args = [f"--input-shape={k}={','.join(map(str, v))}"
                          for k, v in (shapes or {}).items()]
            jobs.append({"case": f"{name} case {case} ({what})", "argv": [
                "compile", str(path), "--target", "cpu", "-o", str(tmp_path / "m.cel"),
                *shape_args]})
            jobs.append({"case": f"{name} case {case} ({what})", "argv": [
                "run", str(path), "--target", "cpu", *shape_args,
                *(a for i in inputs for a in ("--input", i))]})
    return jobs


def run_cli_batch(tmp_path, jobs, timeout) -> tuple[dict, list[str]]:
    """Run the jobs in one process (cli_batch.py); each must exit 0 or 2 with one line.
    Returns {exit code: count} and the failures."""
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = {**os.environ, "CELOSIA_MAX_BYTES": LIMIT}
    try:
        proc = subprocess.run([sys.executable, str(HERE / "cli_batch.py"), str(spec)],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {}, [f"the batch hung after {len(done.splitlines())} jobs: "
                    f"{jobs[len(done.splitlines())]['case']}"]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    failures, codes = [], {}
    for r in results:
        codes[r["code"]] = codes.get(r["code"], 0) + 1
    if proc.returncode != 0 or len(results) != len(jobs):
        failures.append(f"the batch died (exit {proc.returncode}) at job {len(results)}: "
                        f"{jobs[min(len(results), len(jobs) - 1)]['case']}: "
                        f"{proc.stderr[-2000:]}")
    for job, r in zip(jobs, results):
        lines = r["stderr"].strip().splitlines()
        command = job["argv"][0]
        if r["code"] == 0:
            continue
        if r["code"] != 2 or len(lines) != 1 or not lines[0].startswith(
                f"celosia {command}: error: ") or "Traceback" in r["stderr"]:
            failures.append(f"celosia {command} on {job['case']}: exit {r['code']}: "
                            f"{r['stderr'][-1500:]}")
    return codes, failures


def test_fuzz_cli_fast(tmp_path):
    jobs = _write_cases(tmp_path, ["small_cnn", "digits", "Conv", "Reshape", "Gemm", "Pad",
                                   "MaxPool", "Slice"], range(6))
    codes, failures = run_cli_batch(tmp_path, jobs, timeout=300)
    assert not failures, "\n".join(failures)
    assert codes.get(0) and codes.get(2), codes  # both outcomes exercised


def test_cli_real_process_one_line_error(tmp_path):
    """The installed entry point itself, once: a corrupt model is exit 2 and one line."""
    data, _ = seeds()["Conv"]
    path = tmp_path / "bad.onnx"
    path.write_bytes(data.replace(b"strides", b"stridez"))
    celosia = Path(sys.executable).parent / "celosia"
    proc = subprocess.run([str(celosia), "compile", str(path), "--target", "cpu", "-o",
                           str(tmp_path / "m.cel")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "stridez" in proc.stderr and \
        proc.stderr.startswith("celosia compile: error: "), proc.stderr


@pytest.mark.slow
def test_fuzz_cli_slow(tmp_path):
    names = ["small_cnn", "digits"] + sorted(op_models())[::3]
    jobs = _write_cases(tmp_path, names, range(6, 26))
    failures, codes = [], {}
    for start in range(0, len(jobs), 100):
        batch_codes, batch_failures = run_cli_batch(tmp_path, jobs[start:start + 100], 900)
        failures += batch_failures
        for code, n in batch_codes.items():
            codes[code] = codes.get(code, 0) + n
    assert not failures, "\n".join(failures[:30])
    assert codes.get(0) and codes.get(2), codes
