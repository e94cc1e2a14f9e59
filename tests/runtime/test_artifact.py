"""The .cel container (runtime/artifact.py), its manifest schema (schema.py), the object-code
check (elf.py) and the .npy reader (npyio.py): the cases of issue #18 and each check on
its own. tests/fuzz/test_fuzz_cel.py mutates whole files at random through the CLI."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import warnings
import zipfile

import numpy as np
import pytest

from celosia.limits import ResourceLimitError
from celosia.models import zoo
from celosia.runtime import npyio
from celosia.runtime.accel import AccelModel
from celosia.runtime.artifact import ArtifactError, seal
from celosia.runtime.cpu import CpuModel
from celosia.runtime.elf import ElfError, check_object, elf_machine

X = np.random.default_rng(0).standard_normal((1, 1, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def cpu_cel(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("cel") / "m.cel"
    CpuModel.build(zoo.small_cnn()).save(path)
    return path.read_bytes()


@pytest.fixture(scope="module")
def accel_cel(tmp_path_factory) -> bytes:
    calib = {"image": np.random.default_rng(1).standard_normal((8, 1, 8, 8)).astype(np.float32)}
    path = tmp_path_factory.mktemp("cel") / "a.cel"
    AccelModel.from_onnx(zoo.small_cnn(), "default", calibration=calib).save(path)
    return path.read_bytes()


def _rewrite(data: bytes, tmp_path, *, manifest=None, members=None, reseal=True,
             name="e.cel"):
    """A copy of a .cel with the manifest changed by ``manifest(doc)`` and members replaced;
    with ``reseal`` the digests are recomputed, as a deliberate edit would."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        table = {n: z.read(n) for n in z.namelist()}
    table.update(members or {})
    doc = json.loads(table["manifest.json"])
    if manifest:
        manifest(doc)
    if reseal:
        for n, entry in doc["members"].items():
            entry["sha256"] = hashlib.sha256(table[n]).hexdigest()
            entry["bytes"] = len(table[n])
    table["manifest.json"] = json.dumps(doc).encode()
    if reseal:
        table["manifest.sha256"] = seal(table["manifest.json"])
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        for n, d in table.items():
            z.writestr(n, d)
    return path


def _set(path: str, value):
    def edit(doc):
        *parents, last = path.split("/")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return edit


# ---- the cases ---------------------------------------------------------------------


@pytest.mark.parametrize("edit, message", [
    ("program", r'manifest.json: program: is null, expected an object'),
    ("program/values/image/dtype",
     r'program.values\["image"\].dtype: is a boolean, expected a string'),
    ("program/values/image/shape", r'program.values\["image"\].shape\[0\]: is -1, outside \[0, '),
    ("kernels", r"kernels: is a list, expected an object"),
])
def test_edited_cpu_manifest_is_one_error_naming_the_field(cpu_cel, tmp_path, edit, message):
    value = {"program": None, "program/values/image/dtype": True, "kernels": [],
             "program/values/image/shape": [-1, 1, 8, 8]}[edit]
    path = _rewrite(cpu_cel, tmp_path, manifest=_set(edit, value))
    with pytest.raises(ArtifactError, match=message) as e:
        CpuModel.load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_huge_shape_is_refused_before_allocating(cpu_cel, tmp_path, monkeypatch):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", str(1 << 20))
    path = _rewrite(cpu_cel, tmp_path, manifest=_set("program/values/image/shape", [1, 2 ** 31]))
    with pytest.raises(ResourceLimitError, match=r'program.values.*needs 8,589,934,592 bytes'):
        CpuModel.load(path)


def test_edited_accel_manifest(accel_cel, tmp_path):
    for edit, value, message in [
            ("placements", {}, r"placements: does not place exactly the graph's nodes"),
            ("graph", [], r"graph: is a list, expected an object"),
            ("programs", None, r"programs: is null, expected an object"),
            ("config/log_batch", "1", r"config: is not a configuration")]:
        path = _rewrite(accel_cel, tmp_path, manifest=_set(edit, value))
        with pytest.raises(ArtifactError, match=message):
            AccelModel.load(path)


def test_edited_view_is_refused(accel_cel, tmp_path):
    """The small CNN's Reshape is a view of the second convolution's packed output: a view
    said to be another value's bytes, a view without its root, or a view program given to
    a node that computes, would read the wrong bytes; each is refused, naming the field."""
    import re

    doc = json.loads(zipfile.ZipFile(io.BytesIO(accel_cel)).read("manifest.json"))
    view, v = next((k, v) for k, v in doc["values"].items() if "of" in v)
    other = next(k for k, w in doc["values"].items() if k not in (view, v["of"]))
    pool = next(n["name"] for n in doc["graph"]["nodes"] if n["op"] == "MaxPool")
    field = re.escape(f'values["{view}"]')

    def drop_of(d):
        del d["values"][view]["of"]

    for edit, message in [
            (drop_of, field + r".*packed shape of"),
            (_set(f"values/{view}/of", other), field + r"\.of: names"),
            (_set(f"programs/{pool}/kind", "view"), r"is 'view' for a MaxPool node")]:
        with pytest.raises(ArtifactError, match=message):
            AccelModel.load(_rewrite(accel_cel, tmp_path, manifest=edit))


def test_unsealed_edits_and_flipped_weights_are_caught_by_the_digests(cpu_cel, tmp_path):
    """Flipped weight bytes used to run and give another answer."""
    path = _rewrite(cpu_cel, tmp_path, manifest=_set("build/nodes", 7), reseal=False)
    with pytest.raises(ArtifactError, match=r"manifest.json: does not match its SHA-256"):
        CpuModel.load(path)
    with zipfile.ZipFile(io.BytesIO(cpu_cel)) as z:
        weights = z.read("constants/5.npy")
    flipped = weights[:-5] + bytes([weights[-5] ^ 0x40]) + weights[-4:]
    path = _rewrite(cpu_cel, tmp_path, members={"constants/5.npy": flipped}, reseal=False)
    with pytest.raises(ArtifactError, match=r"constants/5.npy: does not match its SHA-256"):
        CpuModel.load(path)


def test_repacked_file_loads_and_an_unwritable_path_is_an_error(cpu_cel, tmp_path):
    with zipfile.ZipFile(io.BytesIO(cpu_cel)) as z:
        table = {n: z.read(n) for n in z.namelist()}
    path = tmp_path / "deflated.cel"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n in reversed(list(table)):
            z.writestr(n, table[n])
    want = CpuModel.load(cpu_cel, "bytes").run({"image": X})
    got = CpuModel.load(path).run({"image": X})
    np.testing.assert_array_equal(got["softmax20"], want["softmax20"])
    with pytest.raises(ArtifactError, match=r"cannot write the model"):
        CpuModel.load(path).save(tmp_path / "no" / "such" / "dir.cel")


# ---- the object-code check -----------------------------------------------------------------


def _kernel_object() -> tuple[bytes, list[str]]:
    """Object code with relocations (a call to memset, a float constant), compiled as the
    CPU backend compiles kernels."""
    from celosia.compiler.cpu.host import llvm_binding, target_machine

    llvm, tm = llvm_binding(), target_machine()
    module = llvm.parse_assembly("""
        declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
        define void @k_seg0(ptr %p, i64 %n, float %x) nounwind {
          call void @llvm.memset.p0.i64(ptr %p, i8 0, i64 %n, i1 false)
          %y = fadd float %x, 0x400921FB60000000
          store float %y, ptr %p
          ret void
        }""")
    module.triple = tm.triple
    return tm.emit_object(module), ["k_seg0"]


def _sections(obj: bytes) -> list[tuple]:
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shnum, = struct.unpack_from("<H", obj, 0x3C)
    return [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + 64 * k) for k in range(shnum)]


def _patch(obj: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(obj)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


@pytest.fixture(scope="module")
def kernel_object():
    from celosia.compiler.cpu.host import host_target

    machine = elf_machine(host_target().triple)
    assert machine is not None, "these tests are for ELF hosts (Linux)"
    obj, functions = _kernel_object()
    return obj, functions, machine


def test_object_check_accepts_real_kernels(kernel_object, cpu_cel):
    obj, functions, machine = kernel_object
    llvm = __import__("celosia.compiler.cpu.host", fromlist=["x"]).llvm_binding()
    resolvable = lambda n: llvm.address_of_symbol(n) is not None  # noqa: E731
    check_object(obj, machine, functions, resolvable)
    assert any(s[1] == 4 for s in _sections(obj)), "the test object has relocations"
    with zipfile.ZipFile(io.BytesIO(cpu_cel)) as z:
        doc = json.loads(z.read("manifest.json"))
        for key, rec in doc["kernels"].items():
            check_object(z.read(f"kernels/{key}.o"), machine, [s for s, _ in rec["segments"]],
                         resolvable)


def test_object_check_refuses_each_damage(kernel_object):
    obj, functions, machine = kernel_object
    secs = _sections(obj)
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    rela = next(k for k, s in enumerate(secs) if s[1] == 4)
    symtab = next(k for k, s in enumerate(secs) if s[1] == 2)
    strtab = secs[symtab][6]
    memset = obj.index(b"memset\0", secs[strtab][4])
    cases = {
        "bad magic number": b"\x7fELG" + obj[4:],
        "shorter than an ELF header": obj[:40],
        "section headers at": _patch(obj, 0x28, "<Q", len(obj)),
        "ends past the end of the file": _patch(obj, shoff + 64 * rela + 0x18, "<Q", len(obj)),
        "has alignment": _patch(obj, shoff + 64 * rela + 0x30, "<Q", 3),
        "past its string table": _patch(obj, shoff + 64 * rela, "<I", 1 << 20),
        "relocation type 9999": _patch(obj, secs[rela][4] + 8, "<I", 9999),
        "patches": _patch(obj, secs[rela][4], "<Q", 1 << 40),
        "not found in this process": obj[:memset] + b"mexset" + obj[memset + 6:],
        "symbol tables": _patch(obj, shoff + 64 * symtab + 4, "<I", 1),
        "machine": _patch(obj, 0x12, "<H", 3),
    }
    resolvable = lambda n: n == "memset"  # noqa: E731
    for what, bad in cases.items():
        with pytest.raises(ElfError, match=what):
            check_object(bad, machine, functions, resolvable)
    with pytest.raises(ElfError, match="defines no function 'nope'"):
        check_object(obj, machine, ["nope"], resolvable)


def test_corrupt_object_code_is_an_error_not_a_crash(cpu_cel, tmp_path):
    """The issue's SIGSEGV: a damaged kernel object, its digest recomputed, reaches the
    structural check (and, with the old digest, the digest check) before LLVM."""
    with zipfile.ZipFile(io.BytesIO(cpu_cel)) as z:
        name = next(n for n in z.namelist() if n.endswith(".o"))
        obj = z.read(name)
    bad = _patch(obj, 0x28, "<Q", 1 << 32)
    for reseal, message in ((True, "has its section headers at"), (False, "does not match")):
        path = _rewrite(cpu_cel, tmp_path, members={name: bad}, reseal=reseal)
        with pytest.raises(ArtifactError, match=rf"{name}: {message}"):
            CpuModel.load(path)


# ---- .npy --------------------------------------------------------------------------------------


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def test_npy_reader():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(npyio.decode(_npy(a), strict=True), a)
    for variant in (np.asfortranarray(a), a.astype(">i4")):
        got = npyio.decode(_npy(variant))
        np.testing.assert_array_equal(got, a)
        assert got.flags.c_contiguous and got.dtype == np.int32
        with pytest.raises(npyio.NpyError, match="C order and native byte order"):
            npyio.decode(_npy(variant), strict=True)
    with warnings.catch_warnings(record=True) as seen:  # not a second line on stderr
        warnings.simplefilter("always")
        with pytest.raises(npyio.NpyError, match="header is damaged"):
            npyio.decode(_npy(a).replace(b"'descr'", b"'d\\:cr'"))
    assert not seen
    for bad, message in [(_npy(a)[:-1], "holds 47 bytes of data"),
                         (_npy(a) + b"x", "holds 49 bytes of data"),
                         (_npy(a).replace(b"'shape'", b"((((((("), "header is damaged"),
                         (_npy(np.zeros(2, "f4,i4")), "celosia reads"),
                         (_npy(np.array(["a"])), "celosia reads"),
                         (b"not an array", "header is damaged")]:
        with pytest.raises(npyio.NpyError, match=message):
            npyio.decode(bad)


def test_npy_size_is_checked_before_allocating(monkeypatch):
    monkeypatch.setenv("CELOSIA_MAX_BYTES", "1000")
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                               "shape": (99999, 9)})
    with pytest.raises(ResourceLimitError, match=r"float64\[99999, 9\].*7,199,928 bytes"):
        npyio.decode(buf.getvalue())


def test_kernels_calling_the_c_library_load_in_a_fresh_process(tmp_path):
    """A kernel that refers to a symbol outside its object (Sigmoid's kernel: the global
    offset table of its inline exp's constants; libm's expf before that) must pass the
    check for resolvable symbols before any LLVM engine exists in the process (MCJIT
    registers the process's symbols only when the first engine is made), so the load runs
    in a new interpreter."""
    import subprocess
    import sys

    from onnx import TensorProto, helper

    w = np.random.default_rng(2).standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1
    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["image"], ["a"]),  # the first kernel calls expf
         helper.make_node("Conv", ["a", "w"], ["y"], pads=[1, 1, 1, 1])], "sigmoid",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    model = CpuModel.build(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.save(tmp_path / "s.cel")
    with zipfile.ZipFile(tmp_path / "s.cel") as z:
        assert any(b"expf\0" in z.read(n) or b"_GLOBAL_OFFSET_TABLE_\0" in z.read(n)
                   for n in z.namelist() if n.endswith(".o"))
    x = np.random.default_rng(3).standard_normal((1, 16, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np; from celosia.runtime.cpu import CpuModel; "
            "m = CpuModel.load(sys.argv[1]); np.save(sys.argv[3], "
            "m.run({'image': np.load(sys.argv[2])})['y'])")
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.cel"),
                          str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), model.run({"image": x})["y"])
