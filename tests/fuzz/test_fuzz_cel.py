"""Mutation fuzzing of ``.cel`` files and of ``celosia run``'s input arrays (issue #18).

Subjects: small_cnn and the digits CNN as CPU builds, the digits CNN as an fsim
accelerator build and as its all-CPU int8 build, and small_cnn quantized for fsim. Each
case mutates a valid file (or an input array) and runs ``celosia run`` on it in a
subprocess (cel_driver.py, many cases per process). The verdict, per case:

- exit 0 with exactly the unmutated file's answer, or
- exit 2 with one line on stderr (``celosia run: error: ...``), naming the .cel when the
  mutation was of the .cel,
- never a traceback, a signal or a hang.

Mutations: bytes flipped in one member with the zip's CRCs fixed, bytes flipped or zeroed
anywhere (CRCs not fixed), truncation and trailing bytes, manifest fields edited (null,
wrong types, huge or negative numbers and shapes, missing keys, lists for objects and the
reverse, values moved from elsewhere), members swapped, dropped, duplicated, added or
renamed, and the archive repacked (stored or deflated: must still run, same answer).

"Resealed" cases also recompute the digests (as someone editing a file on purpose
would): they exercise the schema and the object-file checks behind the digests. Such a
file is a different model, so any answer is allowed, but still only exit 0 or one line
with exit 2. Resealed object code is only loaded: running machine code with flipped bytes
can do anything, which is what the digests are for.

The default run has a fast subset; ``-m slow`` runs at least 10,000 cases.
"""

from __future__ import annotations

import copy
import hashlib
import io
import itertools
import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

DRIVER = Path(__file__).with_name("cel_driver.py")
QUIET_S = 90  # a job that prints nothing for this long hangs
BATCH = 120


@dataclass
class Case:
    id: str
    subject: str
    cel: bytes | None = None           # the .cel to run (None: the subject's own)
    inputs: dict = field(default_factory=dict)   # file name -> bytes for --input
    input_args: list | None = None     # --input arguments ({dir} is the case folder)
    oracle: str = "exact"              # exact | any | error | runs (exit 0, any answer)
    load_only: bool = False
    target: str | None = None          # --target (None: the subject's)


# ---- subjects --------------------------------------------------------------------------------


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


@pytest.fixture(scope="module")
def subjects(tmp_path_factory):
    return build_subjects(tmp_path_factory.mktemp("subjects"))


def build_subjects(out: Path) -> dict:
    """{name: {"cel", "target", "x" (input array), "quantized", "answer" (npz bytes)}}."""
    from celosia.models import digits, zoo
    from celosia.runtime.accel import AccelModel
    from celosia.runtime.cpu import CpuModel

    rng = np.random.default_rng(0)
    small_x = rng.standard_normal((1, 1, 8, 8)).astype(np.float32)
    split = digits.load_split()
    digits_x = split["test"][0][:4]
    shapes = {"image": (4, 1, 8, 8)}
    calib = {"image": split["calibration"][0]}
    small_calib = {"image": rng.standard_normal((16, 1, 8, 8)).astype(np.float32)}
    builds = {
        "small_cpu": (lambda: CpuModel.build(zoo.small_cnn()), "cpu", small_x, False),
        "digits_cpu": (lambda: CpuModel.build(digits.model_path(), shapes), "cpu", digits_x,
                       False),
        "digits_fsim": (lambda: AccelModel.from_onnx(digits.model_path(), "default",
                                                     input_shapes=shapes, calibration=calib),
                        "fsim", digits_x, True),
        "digits_cpu8": (lambda: AccelModel.from_onnx(digits.model_path(), "default",
                                                     input_shapes=shapes, calibration=calib,
                                                     target="cpu"), "cpu", digits_x, True),
        "small_fsim": (lambda: AccelModel.from_onnx(zoo.small_cnn(), "default",
                                                    calibration=small_calib),
                       "fsim", small_x, True),
    }
    found = {}
    for name, (build, target, x, quantized) in builds.items():
        path = out / f"{name}.cel"
        build().save(path)
        found[name] = {"cel": path.read_bytes(), "target": target, "x": x,
                       "quantized": quantized}
    # The answers `celosia run` gives on the unmutated files.
    cases = [Case(f"{name}/original", name) for name in found]
    results, dirs = _run_cases(cases, found, out / "originals")
    for case in cases:
        res = results[case.id]
        assert res and res["rc"] == 0 and not res["traceback"], res
        found[case.subject]["answer"] = (dirs[case.id] / "out.npz").read_bytes()
    return found


# ---- running cases ---------------------------------------------------------------------------


def _argv(case: Case, subject: dict, d: Path) -> dict:
    cel = d / "model.cel"
    if case.load_only:
        return {"load": str(cel)}
    inputs = case.input_args if case.input_args is not None else [f"{d}/x.npy"]
    argv = ["run", str(cel), "--target", case.target or subject["target"], "--output",
            str(d / "out.npz")]
    for spec in inputs:
        argv += ["--input", spec.format(dir=d)]
    return {"argv": argv}


def _run_cases(cases: list, subjects: dict, root: Path) -> tuple[dict, dict]:
    """({case id: driver result or None for a signal/hang}, {case id: its folder})."""
    root.mkdir(parents=True, exist_ok=True)
    jobs, dirs = [], {}
    for k, case in enumerate(cases):
        subject = subjects[case.subject]
        d = root / f"c{k}"
        d.mkdir()
        (d / "model.cel").write_bytes(case.cel if case.cel is not None else subject["cel"])
        (d / "x.npy").write_bytes(_npy(subject["x"]))
        for name, data in case.inputs.items():
            (d / name).write_bytes(data)
        jobs.append({"id": case.id, **_argv(case, subject, d)})
        dirs[case.id] = d
    return _drive(jobs, root), dirs


def _drive(jobs: list, root: Path) -> dict:
    """Run jobs through the driver, a new process after a signal or a hang."""
    root.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    pending = list(jobs)
    while pending:
        (root / "jobs.json").write_text(json.dumps(pending))
        with open(root / "driver.err", "w") as err:
            proc = subprocess.Popen([sys.executable, str(DRIVER), str(root / "jobs.json")],
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        started = None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(QUIET_S):
                proc.kill()
                break
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("start "):
                started = line[6:].strip()
            else:
                res = json.loads(line)
                results[res["id"]] = res
                started = None
        proc.wait()
        sel.close()
        proc.stdout.close()
        if started is not None:  # died or hung inside this job
            results[started] = {"id": started, "died": proc.returncode,
                                "driver_stderr": (root / "driver.err").read_text()[-2000:]}
        done = set(results)
        if started is None and any(j["id"] not in done for j in pending):
            raise AssertionError(f"the driver stopped: {(root / 'driver.err').read_text()[-2000:]}")
        pending = [j for j in pending if j["id"] not in done]
    return results


def _verdict(case: Case, res: dict, d: Path, subject: dict) -> str | None:
    """What is wrong with a case's outcome, or None."""
    if "died" in res:
        return (f"the process died (status {res['died']}; -9: a hang killed after {QUIET_S} s, "
                f"or the OOM killer): {res['driver_stderr'][-400:]}")
    if res["traceback"]:
        return "traceback:\n" + res["traceback"][-1500:]
    rc, err = res["rc"], res["stderr"]
    if rc == 2:
        if case.oracle == "runs":
            return f"refused what should run: {err.strip()[-400:]}"
        lines = err.splitlines()
        prefix = "celosia load: error: " if case.load_only else "celosia run: error: "
        if len(lines) != 1 or not lines[0].startswith(prefix) or "Traceback" in err:
            return f"exit 2 but stderr is not one error line: {err[-600:]!r}"
        if case.cel is not None and case.oracle != "any" and "model.cel" not in err:
            return f"the error does not name the .cel: {err.strip()}"
        return None
    if rc != 0:
        return f"exit status {rc}: {err[-400:]!r}"
    if case.oracle == "error":
        return "accepted (exit 0) what should be refused"
    if case.oracle == "exact" and not case.load_only:
        got = np.load(d / "out.npz")
        want = np.load(io.BytesIO(subject["answer"]))
        if sorted(got.files) != sorted(want.files) or any(
                not np.array_equal(got[k], want[k], equal_nan=True) for k in want.files):
            return "exit 0 with a different answer"
    return None


def _check(cases, subjects: dict, root: Path) -> None:
    """Run ``cases`` (an iterable: mutated files are made a batch at a time) and fail
    listing the first problems."""
    problems, count, cases = [], 0, iter(cases)
    while batch := list(itertools.islice(cases, BATCH)):
        results, dirs = _run_cases(batch, subjects, root / f"b{count}")
        for case in batch:
            bad = _verdict(case, results[case.id], dirs[case.id], subjects[case.subject])
            if bad:
                problems.append(f"{case.id}: {bad}")
        shutil.rmtree(root / f"b{count}")
        count += len(batch)
    assert not problems, f"{len(problems)} of {count} cases:\n" + "\n".join(problems[:15])


# ---- zip and manifest surgery ----------------------------------------------------------------


def _members(data: bytes) -> list:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [[i.filename, z.read(i)] for i in z.infolist()]


def _pack(members: list, deflate: bool) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a duplicate name is one of the mutations
        for name, data in members:
            z.writestr(name, data)
    return buf.getvalue()


def _deflated(data: bytes) -> bool:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return z.infolist()[0].compress_type == zipfile.ZIP_DEFLATED


def _reseal(members: list) -> list:
    """Digests recomputed for the members as they are now (as a deliberate edit would)."""
    from celosia.runtime.artifact import seal

    table = dict(members)
    try:
        manifest = json.loads(table["manifest.json"])
        for name, entry in manifest["members"].items():
            if name in table:
                entry["sha256"] = hashlib.sha256(table[name]).hexdigest()
                entry["bytes"] = len(table[name])
        text = json.dumps(manifest).encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        text = table.get("manifest.json", b"")
    return [[n, text if n == "manifest.json" else seal(text) if n == "manifest.sha256" else d]
            for n, d in members]


def _flip(rng: random.Random, data: bytes, headers: bool = False) -> bytes:
    b = bytearray(data)
    if not b:
        return b"\x00"
    span = min(len(b), 160) if headers else len(b)
    for _ in range(rng.choice((1, 1, 2, 4, 8))):
        b[rng.randrange(span)] ^= rng.randrange(1, 256)
    return bytes(b)


_EDITS = ("null", "true", "string", "empty_string", "zero", "minus_one", "two_31", "two_63",
          "two_64", "huge_digits", "float", "nan", "empty_list", "empty_object", "wrap_list",
          "wrap_object", "delete", "to_list", "to_object", "duplicate", "huge_shape",
          "negative_shape", "rename", "borrow")


def _edit_json(rng: random.Random, doc, pool: list) -> tuple[object, str]:
    """``doc`` with one field edited: (new doc, description)."""
    path, parent, key, node = [], None, None, doc
    while isinstance(node, (dict, list)) and node and (not path or rng.random() < 0.75):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, rng.choice(keys)
        node = node[key]
        path.append(key)
    edit = rng.choice(_EDITS)
    new = {"null": None, "true": True, "string": "x", "empty_string": "", "zero": 0,
           "minus_one": -1, "two_31": 2 ** 31, "two_63": 2 ** 63, "two_64": 2 ** 64,
           "huge_digits": 10 ** 30, "float": 1.5, "nan": float("nan"), "empty_list": [],
           "empty_object": {}, "wrap_list": [node], "wrap_object": {"x": node},
           "borrow": copy.deepcopy(rng.choice(pool)) if pool else None}.get(edit, node)
    if edit == "to_list" and isinstance(node, dict):
        new = list(node.values())
    elif edit == "to_object" and isinstance(node, list):
        new = {str(i): v for i, v in enumerate(node)}
    elif edit in ("huge_shape", "negative_shape") and isinstance(node, list) and node \
            and all(isinstance(v, int) for v in node):
        new = list(node)
        new[rng.randrange(len(new))] = 2 ** 40 if edit == "huge_shape" else -3
    elif edit == "rename" and isinstance(node, str):
        new = node + "_"
    elif edit == "duplicate" and isinstance(node, list) and node:
        new = node + node[-1:]
    if new is node and edit not in ("delete", "rename"):  # the edit does not apply here
        edit, new = "null", None
    where = "/".join(map(str, path)) or "(root)"
    if parent is None:
        return new, f"{edit} at {where}"
    if edit == "delete":
        del parent[key]
    elif edit == "rename" and isinstance(parent, dict) and isinstance(key, str):
        parent[key + "_"] = parent.pop(key)
    else:
        parent[key] = new
    return doc, f"{edit} at {where}"


def _pool(doc, out: list, depth: int = 0) -> list:
    """Some values of a manifest, to move elsewhere."""
    if depth < 4 and isinstance(doc, (dict, list)):
        for v in (doc.values() if isinstance(doc, dict) else doc[:8]):
            out.append(v)
            _pool(v, out, depth + 1)
    return out


def _edit_manifest(rng, members: list) -> str:
    table = dict(members)
    doc = json.loads(table["manifest.json"])
    doc, what = _edit_json(rng, doc, _pool(doc, []))
    text = json.dumps(doc).encode()
    for m in members:
        if m[0] == "manifest.json":
            m[1] = text
    return what


# ---- mutations of a .cel ---------------------------------------------------------------------


def mutate(rng: random.Random, cel: bytes) -> tuple[bytes, str, str, bool]:
    """(mutated file, description, oracle, load only)."""
    members, deflate = _members(cel), _deflated(cel)
    names = [n for n, _ in members]
    kind = rng.choice(("flip_member", "flip_member", "flip_raw", "zero_range", "truncate",
                       "append", "edit", "edit", "edit_sealed", "edit_sealed", "edit_sealed",
                       "flip_sealed", "flip_sealed", "swap", "zip", "nested"))
    if kind in ("flip_raw", "zero_range", "truncate", "append"):
        b = bytearray(cel)
        if kind == "flip_raw":
            return _flip(rng, cel), kind, "exact", False
        if kind == "zero_range":
            i = rng.randrange(len(b))
            n = rng.randint(1, 256)
            b[i:i + n] = bytes(len(b[i:i + n]))
            return bytes(b), f"zero {n} bytes at {i}", "exact", False
        if kind == "truncate":
            n = rng.randrange(len(b))
            return bytes(b[:n]), f"truncated to {n} bytes", "exact", False
        return cel + rng.randbytes(rng.randint(1, 64)), kind, "exact", False
    if kind in ("flip_member", "flip_sealed"):
        k = rng.randrange(len(members))
        members[k][1] = _flip(rng, members[k][1], headers=rng.random() < 0.5)
        name = members[k][0]
        if kind == "flip_member":
            return _pack(members, deflate), f"flipped {name}", "exact", False
        obj = name.endswith(".o") or name.endswith(".cel")
        return (_pack(_reseal(members), deflate), f"flipped {name}, resealed", "any",
                obj or name == "dram.npy" and rng.random() < 0.5)
    if kind in ("edit", "edit_sealed"):
        what = _edit_manifest(rng, members)
        if kind == "edit":
            return _pack(members, deflate), f"manifest {what}", "exact", False
        return _pack(_reseal(members), deflate), f"manifest {what}, resealed", "any", False
    if kind == "swap":
        k, j = rng.sample(range(len(members)), 2)
        members[k][1], members[j][1] = members[j][1], members[k][1]
        return _pack(members, deflate), f"swapped {names[k]} and {names[j]}", "exact", False
    if kind == "nested":
        inner = [k for k, n in enumerate(names) if n.endswith(".cel")]
        if not inner:
            return mutate(rng, cel)
        k = rng.choice(inner)
        data, what, oracle, load = mutate(rng, members[k][1])
        members[k][1] = data
        return (_pack(_reseal(members), deflate), f"{names[k]}: {what} (outer resealed)",
                oracle, load)
    return _zip_mutation(rng, members, deflate)


def _zip_mutation(rng, members: list, deflate: bool) -> tuple[bytes, str, str, bool]:
    what = rng.choice(("drop", "duplicate", "extra", "rename", "repack", "reorder"))
    k = rng.randrange(len(members))
    name = members[k][0]
    if what == "drop":
        del members[k]
    elif what == "duplicate":
        members.append([name, members[k][1]])
    elif what == "extra":
        members.insert(k, ["extra/member.bin", rng.randbytes(32)])
    elif what == "rename":
        members[k][0] = name + "x"
    elif what == "repack":
        deflate = not deflate  # a valid file, differently packed: same answer
    else:
        rng.shuffle(members)
    return _pack(members, deflate), f"zip {what} {name}", "exact", False


# ---- mutations of the input arrays -----------------------------------------------------------


def input_cases(subject_name: str, subject: dict) -> list[Case]:
    """``celosia run``'s --input: wrong shapes and dtypes, NaN, not an array, missing or
    unknown names, and valid variants (Fortran order, big-endian, .npz by name) that must
    give the same answer."""
    x = subject["x"]
    nan = x.copy()
    nan.flat[0] = np.nan
    big = x.astype(x.dtype.newbyteorder(">"))
    npz = io.BytesIO()
    np.savez(npz, image=x)
    npz_wrong = io.BytesIO()
    np.savez(npz_wrong, img=x)
    npz_two = io.BytesIO()
    np.savez(npz_two, image=x, other=x)
    header = bytearray(_npy(x))
    header[20:30] = b"#(}{'\x00\xff=,"
    one = {
        "shape": (_npy(np.zeros(x.shape[:-1] + (x.shape[-1] + 1,), x.dtype)), "error"),
        "rank": (_npy(x[0]), "error"),
        "scalar": (_npy(np.float32(1)), "error"),
        "float64": (_npy(x.astype(np.float64)), "error"),
        "int8": (_npy(x.astype(np.int8)), "error"),
        "bool": (_npy(x > 0), "error"),
        "nan": (_npy(nan), "runs"),  # int8 models quantize NaN to 0 (graph/qops.py)
        "inf": (_npy(np.where(x > 1, np.inf, x).astype(np.float32)), "runs"),
        "fortran": (_npy(np.asfortranarray(x)), "exact"),
        "big_endian": (_npy(big), "exact"),
        "text": (b"1 2 3\n", "error"),
        "empty": (b"", "error"),
        "random": (random.Random(1).randbytes(300), "error"),
        "truncated": (_npy(x)[:-7], "error"),
        "header": (bytes(header), "error"),
        "structured": (_npy(np.zeros(3, [("a", "f4"), ("b", "i4")])), "error"),
        "object": (b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, "
                   b"'shape': (1,), }" + b" " * 58 + b"\n" + b"\x80\x04N.", "error"),
        "npz_named": (npz.getvalue(), "exact"),
        # One array in an .npz is the input of a one-input model, whatever its name.
        "npz_wrong": (npz_wrong.getvalue(), "exact"),
        "npz_two": (npz_two.getvalue(), "error"),
        "npz_cut": (npz.getvalue()[:-30], "error"),
    }
    cases = []
    for what, (data, oracle) in one.items():
        ext = ".npz" if what.startswith("npz") else ".npy"
        args = ["{dir}/in" + ext] if what.startswith("npz") else ["image={dir}/in" + ext]
        cases.append(Case(f"{subject_name}/input-{what}", subject_name, inputs={"in" + ext: data},
                          input_args=args, oracle=oracle))
    for what, args in {"no_input": [], "wrong_name": ["img={dir}/x.npy"],
                       "twice": ["{dir}/x.npy", "image={dir}/x.npy"],
                       "directory": ["image={dir}"], "missing_file": ["image={dir}/nope.npy"],
                       "npz_with_name": ["image={dir}/in.npz"]}.items():
        # NAME=FILE.npz takes the array of that name (or the file's only one).
        oracle = "exact" if what == "npz_with_name" else "error"
        cases.append(Case(f"{subject_name}/input-{what}", subject_name,
                          inputs={"in.npz": npz.getvalue()}, input_args=args, oracle=oracle))
    return cases


def cel_cases(subjects: dict, per_subject: int, seed: int, *, only=None, target=None):
    """Mutated files, made as they are asked for (10,000 at once would hold a gigabyte);
    the subjects (or ``only`` those) interleaved so that every batch covers all of them."""
    for i in range(per_subject):
        for name, subject in subjects.items():
            if only and name not in only:
                continue
            rng = random.Random(f"{seed}/{name}/{i}/{target}")
            data, what, oracle, load = mutate(rng, subject["cel"])
            # Another target gives another answer (cycle: the same values; cpu: the all-CPU
            # build, identical): the original's is still the reference.
            yield Case(f"{name}/{seed}/{i} {what}" + (f" --target {target}" if target else ""),
                       name, cel=data, oracle=oracle, load_only=load, target=target)


# ---- tests -----------------------------------------------------------------------------------


ACCEL = ("digits_fsim", "small_fsim")


def test_mutated_cel_files(subjects, tmp_path):
    """The fast subset: 30 mutations of each subject, and accelerator builds run on the
    cycle model and as their all-CPU build."""
    _check(itertools.chain(cel_cases(subjects, 30, seed=0),
                           cel_cases(subjects, 5, seed=0, only=ACCEL, target="cycle"),
                           cel_cases(subjects, 5, seed=0, only=ACCEL, target="cpu")),
           subjects, tmp_path)


def test_run_inputs(subjects, tmp_path):
    cases = [c for name, s in subjects.items() if name in ("small_cpu", "digits_fsim")
             for c in input_cases(name, s)]
    _check(cases, subjects, tmp_path)


@pytest.mark.slow
def test_mutated_cel_files_many(subjects, tmp_path):
    """12,000 mutations (2,000 per subject, and 500 of each accelerator build on the
    cycle model and as its all-CPU build), other seeds than the fast subset, and every
    subject's input cases."""
    inputs = [c for name, s in subjects.items() for c in input_cases(name, s)]
    _check(itertools.chain(cel_cases(subjects, 2000, seed=1),
                           cel_cases(subjects, 500, seed=1, only=ACCEL, target="cycle"),
                           cel_cases(subjects, 500, seed=1, only=ACCEL, target="cpu"), inputs),
           subjects, tmp_path)


def test_the_oracle_sees_failures(subjects, tmp_path):
    """The harness itself: a killed job is named and the rest still run; a traceback and a
    different answer are reported."""
    cases = [Case("ok", "small_cpu"), Case("bad-input", "small_cpu", input_args=["x=y"],
                                            oracle="error")]
    results, dirs = _run_cases(cases, subjects, tmp_path / "a")
    assert all(_verdict(c, results[c.id], dirs[c.id], subjects["small_cpu"]) is None
               for c in cases)
    jobs = [{"id": "kill", "argv": ["run", "--kill-me"]}, {"id": "after", "load": "nowhere"}]
    os.environ["CELOSIA_FUZZ_SELF_TEST"] = "1"
    try:
        got = _drive(jobs, tmp_path / "b")
    finally:
        del os.environ["CELOSIA_FUZZ_SELF_TEST"]
    assert got["kill"].get("died") == -9 and got["after"]["rc"] == 2
    wrong = Case("wrong", "small_cpu")
    (dirs["ok"] / "out.npz").write_bytes(subjects["digits_cpu"]["answer"])
    assert "different answer" in _verdict(wrong, results["ok"], dirs["ok"],
                                          subjects["small_cpu"])
