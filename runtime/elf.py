"""A structural check of a kernel's object code before LLVM loads it.

llvmlite hands object code to LLVM's MCJIT (RuntimeDyld) without a way to report a bad
file: a damaged one crashes the process (a segmentation fault in ``add_object_file``, or
an abort such as "The end of the file was unexpectedly encountered"). So everything the
loader relies on is checked here first, against what celosia's kernels contain (64-bit
little-endian ELF relocatable files for this machine, as LLVM emits them):

- the header: class, byte order, version, type REL, this machine, header and
  section-header sizes, the section-header table inside the file;
- every section: a known type, its bytes inside the file, a power-of-two alignment, a
  name inside the section-name table and ending in NUL, from the names LLVM gives code
  and data (no unwind tables or debug sections, which MCJIT would parse further);
- the symbol table (exactly one): entry size, its string table, every name inside it,
  every symbol's section valid and its extent inside that section, no common symbols;
  undefined symbols must be ``_GLOBAL_OFFSET_TABLE_`` or resolvable in this process
  (MCJIT aborts on one it cannot resolve);
- relocation sections: entry size, links to the symbol table and to a section of code or
  data, each entry's type one that RuntimeDyld implements for this machine and its patch
  inside the target section;
- the functions the runtime will call: defined, global, in executable sections.

Hand-written on ``struct`` rather than with an ELF library because the point is the
bounds checks, which parsers (pyelftools among them) leave to the reader.
"""

from __future__ import annotations

import struct

__all__ = ["ElfError", "check_object", "elf_machine"]

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")

EM_X86_64, EM_AARCH64 = 62, 183
SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOTE, SHT_NOBITS = 0, 1, 2, 3, 4, 7, 8
_SECTION_TYPES = {SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOTE,
                  SHT_NOBITS, 0x6FFF4C03}  # the last: .llvm_addrsig
_SECTION_NAMES = (".text", ".ltext", ".rodata", ".lrodata", ".data", ".ldata", ".bss",
                  ".lbss", ".rela.", ".symtab", ".strtab", ".shstrtab", ".note.GNU-stack",
                  ".comment", ".llvm_addrsig")
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
SHN_UNDEF, SHN_ABS = 0, 0xFFF1
STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE = 0, 1, 2, 3, 4
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
MAX_SECTIONS = 4096
MAX_ALIGN = 4096
MAX_NOBITS = 64 << 20

# Relocation types RuntimeDyldELF implements, and how many bytes each patches.
_RELOCATIONS = {
    EM_X86_64: {0: 0, 1: 8, 2: 4, 4: 4, 9: 4, 10: 4, 11: 4, 24: 8, 25: 8, 26: 4, 27: 8,
                29: 8, 41: 4, 42: 4},
    # ABS64, ABS32, PREL64, PREL32, then the instruction patches (4 bytes each): MOVW_UABS
    # (large code model), ADR_PREL_PG_HI21, ADD_ABS_LO12_NC, LDST*_ABS_LO12_NC, JUMP26,
    # CALL26, ADR_GOT_PAGE, LD64_GOT_LO12_NC.
    EM_AARCH64: {0: 0, 257: 8, 258: 4, 260: 8, 261: 4, 263: 4, 264: 4, 265: 4, 266: 4,
                 267: 4, 268: 4, 269: 4, 275: 4, 277: 4, 278: 4, 282: 4, 283: 4, 284: 4,
                 285: 4, 286: 4, 299: 4, 311: 4, 312: 4},
}


class ElfError(Exception):
    """Object code that would not load safely (the message says which part)."""


def elf_machine(triple: str) -> int | None:
    """The ELF machine of a target triple, or None where objects are not ELF (or the
    machine is not one celosia checks)."""
    arch, _, rest = triple.partition("-")
    if any(os in rest for os in ("darwin", "macos", "ios", "windows", "win32")):
        return None
    return {"x86_64": EM_X86_64, "aarch64": EM_AARCH64, "arm64": EM_AARCH64}.get(arch)


def check_object(data: bytes, machine: int, functions, resolvable) -> None:
    """Raise ElfError unless ``data`` is an object file LLVM can load safely, defining
    each of ``functions`` (symbol names); ``resolvable(name)`` tells whether an undefined
    symbol can be found in this process."""
    sections = _sections(data, machine)
    symtabs = [k for k, s in enumerate(sections) if s["type"] == SHT_SYMTAB]
    if len(symtabs) != 1:
        raise ElfError(f"has {len(symtabs)} symbol tables, expected 1")
    symbols = _symbols(data, sections, symtabs[0], resolvable)
    for k, s in enumerate(sections):
        if s["type"] == SHT_RELA:
            _relocations(data, sections, k, symtabs[0], len(symbols), machine)
    defined = {name: sym for name, sym in symbols if sym["shndx"] not in (SHN_UNDEF, SHN_ABS)}
    for fn in functions:
        sym = defined.get(fn)
        if sym is None or sym["type"] != STT_FUNC or sym["bind"] != STB_GLOBAL or \
                not sections[sym["shndx"]]["flags"] & SHF_EXECINSTR:
            raise ElfError(f"defines no function {fn!r}, which the kernel record names")


def _sections(data: bytes, machine: int) -> list[dict]:
    if len(data) < _EHDR.size:
        raise ElfError(f"is {len(data)} bytes, shorter than an ELF header")
    (ident, e_type, e_machine, e_version, _entry, e_phoff, e_shoff, _flags, e_ehsize,
     _phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(data)
    if ident[:4] != b"\x7fELF":
        raise ElfError("is not an ELF object file (bad magic number)")
    if ident[4:7] != b"\x02\x01\x01":
        raise ElfError("is not a 64-bit little-endian ELF file of version 1")
    if e_type != 1 or e_version != 1 or e_phnum != 0 or e_phoff != 0:
        raise ElfError(f"is not a relocatable object (type {e_type}, version {e_version}, "
                       f"{e_phnum} program headers)")
    if e_machine != machine:
        raise ElfError(f"is for ELF machine {e_machine}, this machine is {machine}")
    if e_ehsize != _EHDR.size or e_shentsize != _SHDR.size:
        raise ElfError(f"has header sizes {e_ehsize}/{e_shentsize}, expected "
                       f"{_EHDR.size}/{_SHDR.size}")
    if not 1 <= e_shnum <= MAX_SECTIONS or not 0 < e_shstrndx < e_shnum:
        raise ElfError(f"has {e_shnum} sections and names in section {e_shstrndx}")
    if e_shoff % 8 or e_shoff < _EHDR.size or e_shoff + e_shnum * _SHDR.size > len(data):
        raise ElfError(f"has its section headers at {e_shoff}, outside the file "
                       f"({len(data)} bytes)")
    sections = []
    for k in range(e_shnum):
        name, typ, flags, _addr, off, size, link, info, align, entsize = _SHDR.unpack_from(
            data, e_shoff + k * _SHDR.size)
        s = {"name": name, "type": typ, "flags": flags, "offset": off, "size": size,
             "link": link, "info": info, "entsize": entsize}
        if k == 0:
            if any((name, typ, flags, off, size, link, info, align, entsize)):
                raise ElfError("has a non-empty section 0")
        elif typ not in _SECTION_TYPES:
            raise ElfError(f"section {k} has type {typ:#x}, which kernels never contain")
        elif typ == SHT_NOBITS:
            if size > MAX_NOBITS:
                raise ElfError(f"section {k} asks for {size} bytes of zeros")
        elif off + size > len(data):
            raise ElfError(f"section {k} ({size} bytes at {off}) ends past the end of the "
                           f"file ({len(data)} bytes)")
        if align & (align - 1) or align > MAX_ALIGN:
            raise ElfError(f"section {k} has alignment {align}")
        sections.append(s)
    names = sections[e_shstrndx]
    if names["type"] != SHT_STRTAB:
        raise ElfError(f"section {e_shstrndx}, its section names, is not a string table")
    for k, s in enumerate(sections[1:], 1):
        s["label"] = _string(data, names, s["name"], f"section {k}'s name")
        if not s["label"].startswith(_SECTION_NAMES):
            raise ElfError(f"section {k} is {s['label']!r}, which kernels never contain")
    return sections


def _string(data: bytes, table: dict, offset: int, what: str) -> str:
    if offset >= table["size"]:
        raise ElfError(f"{what} is at {offset}, past its string table ({table['size']} bytes)")
    start = table["offset"] + offset
    end = data.find(b"\0", start, table["offset"] + table["size"])
    if end < 0:
        raise ElfError(f"{what} does not end inside its string table")
    try:
        return data[start:end].decode("ascii")
    except UnicodeDecodeError:
        raise ElfError(f"{what} is not ASCII") from None


def _symbols(data: bytes, sections: list, k: int, resolvable) -> list[tuple[str, dict]]:
    tab = sections[k]
    if tab["entsize"] != _SYM.size or tab["size"] % _SYM.size or tab["offset"] % 8:
        raise ElfError(f"section {k}, the symbol table, has entries of {tab['entsize']} bytes "
                       f"in {tab['size']} bytes at {tab['offset']}")
    if not 0 < tab["link"] < len(sections) or sections[tab["link"]]["type"] != SHT_STRTAB:
        raise ElfError(f"section {k}, the symbol table, links to section {tab['link']}, not "
                       f"a string table")
    strings = sections[tab["link"]]
    count = tab["size"] // _SYM.size
    if not 0 < tab["info"] <= count:
        raise ElfError(f"section {k}, the symbol table, says its first global symbol is "
                       f"{tab['info']} of {count}")
    symbols, seen = [], set()
    for i in range(count):
        st_name, st_info, _other, shndx, value, size = _SYM.unpack_from(
            data, tab["offset"] + i * _SYM.size)
        name = _string(data, strings, st_name, f"symbol {i}'s name")
        sym = {"type": st_info & 0xF, "bind": st_info >> 4, "shndx": shndx}
        what = f"symbol {i} ({name!r})"
        if sym["type"] not in (STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_SECTION, STT_FILE) or \
                sym["bind"] not in (STB_LOCAL, STB_GLOBAL, STB_WEAK):
            raise ElfError(f"{what} has type {sym['type']} and binding {sym['bind']}")
        if shndx == SHN_UNDEF:
            if i and name != "_GLOBAL_OFFSET_TABLE_" and not (name and resolvable(name)):
                raise ElfError(f"{what} is undefined and not found in this process")
        elif shndx != SHN_ABS:
            if shndx >= len(sections):
                raise ElfError(f"{what} is in section {shndx}, which does not exist")
            sec = sections[shndx]
            if value + size > sec["size"]:
                raise ElfError(f"{what} spans [{value}, {value + size}), past the end of "
                               f"section {shndx} ({sec['size']} bytes)")
            if sym["bind"] != STB_LOCAL:
                if name in seen:
                    raise ElfError(f"{what} is defined twice")
                seen.add(name)
        symbols.append((name, sym))
    return symbols


def _relocations(data: bytes, sections: list, k: int, symtab: int, nsyms: int,
                 machine: int) -> None:
    rel = sections[k]
    if rel["entsize"] != _RELA.size or rel["size"] % _RELA.size or rel["offset"] % 8:
        raise ElfError(f"section {k} ({rel['label']}) has entries of {rel['entsize']} bytes "
                       f"in {rel['size']} bytes at {rel['offset']}")
    if rel["link"] != symtab:
        raise ElfError(f"section {k} ({rel['label']}) links to section {rel['link']}, not "
                       f"the symbol table")
    if not 0 < rel["info"] < len(sections) or \
            sections[rel["info"]]["type"] not in (SHT_PROGBITS, SHT_NOTE):
        raise ElfError(f"section {k} ({rel['label']}) relocates section {rel['info']}, which "
                       f"holds no code or data")
    target = sections[rel["info"]]
    widths = _RELOCATIONS[machine]
    for i in range(rel["size"] // _RELA.size):
        offset, info, _addend = _RELA.unpack_from(data, rel["offset"] + i * _RELA.size)
        typ, sym = info & 0xFFFFFFFF, info >> 32
        where = f"section {k} ({rel['label']}) entry {i}"
        if typ not in widths:
            raise ElfError(f"{where} has relocation type {typ}, which the loader does not "
                           f"implement")
        if sym >= nsyms:
            raise ElfError(f"{where} names symbol {sym} of {nsyms}")
        if offset + widths[typ] > target["size"]:
            raise ElfError(f"{where} patches [{offset}, {offset + widths[typ]}), past the "
                           f"end of section {rel['info']} ({target['size']} bytes)")
