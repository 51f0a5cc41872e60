#!/usr/bin/env python3
"""Fix QEMU's TCG SVM double delivery of injected interrupts in a binary.

The bug (QEMU 7.2 to at least 11.1, target/i386/tcg/system/svm_helper.c,
`helper_vmrun`): when the VMCB's EVENTINJ field holds an external interrupt
(type INTR, which is how KVM injects every interrupt into its guest), VMRUN
sets `cs->exception_index = vector` and then delivers the interrupt right
away with `do_interrupt_x86_hardirq`, without a `cpu_loop_exit`. Nothing
sets `exception_index` back to -1. The stale vector stays there until the
next exception, #VMEXIT or serviced interrupt overwrites it. If the vCPU is
asked to leave its execution loop before that (`exit_request`: a kick from
another thread, an IPI, a timer of the main loop, or the round-robin timer
of single-threaded TCG), `cpu_handle_interrupt` keeps the non-negative
index and `cpu_handle_exception` delivers the vector a second time, as an
exception, ignoring the guest's EFLAGS.IF, in the middle of the guest's
handler for the first delivery.

What that does to a guest of the runner's KVM: a nested timer interrupt
inside `hrtimer_interrupt` deadlocks on the per-CPU hrtimer base lock (a
1-vCPU guest spins for ever with interrupts off: the boot stall of
single-threaded TCG, every time); a second EOI for one delivery retires
another in-service vector, so a later interrupt is never acknowledged (the
vCPU whose timer stopped); a delivery on a half-built frame ends in a
triple fault. These are the crashes and stalls of docs/runner.md.

The fix is the one-line source change (do not set `exception_index` for an
interrupt delivered in place). The runner's emulator is a prebuilt Debian
package, so this tool applies it to the binary: it finds, inside
`helper_vmrun` (an exported symbol), the store of a register into
`exception_index` that precedes the call to `do_interrupt_x86_hardirq`, and
replaces it with a NOP of the same length. `exception_index` is -1 whenever
translated code runs (the execution loop only enters it with no pending
exception), so leaving it alone is the same as the source fix. The offset
of `exception_index` is learnt from the NMI case of the same function
(`movl $2, disp(%reg)`), so nothing is hard-coded but the instruction
shapes; when the shapes are not found exactly once the tool refuses and
changes nothing.

A binary counts as fixed only when the tool's own record proves it
(`verify`): the sidecar BINARY.vmrun-fix.json names the file offset and
the bytes it replaced, the NOP is there, and putting the recorded bytes
back yields exactly one store of the known shape at that very offset. An
instruction shape alone (a NOP before a store) is not proof: an unpatched
build can contain it too.

usage: l1_qemu_patch.py BINARY [--check | --verify]
  --check   only report whether BINARY is unpatched, patched or unknown
  --verify  exit 0 only when BINARY is provably fixed (see above)
The replaced bytes are kept in BINARY.vmrun-fix.json.
exit status: 0 patched (or already patched, or verified), 1 shapes not
found or not verified, 2 usage
"""

import json
import os
import shutil
import struct
import subprocess
import sys

NOP6 = bytes.fromhex("660f1f440000")
SIDECAR = ".vmrun-fix.json"


def dynamic_symbols(binary):
    """Name -> (address, size) of the defined dynamic symbols."""
    out = subprocess.run(["nm", "-D", "-S", "--defined-only", binary],
                         check=True, capture_output=True, text=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4:
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return syms


def file_offset(binary, vaddr):
    """File offset of a virtual address, from the LOAD program headers."""
    out = subprocess.run(["readelf", "-l", "-W", binary], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            off, va, filesz = (int(parts[1], 16), int(parts[2], 16),
                               int(parts[4], 16))
            if va <= vaddr < va + filesz:
                return vaddr - va + off
    raise LookupError(f"address {vaddr:#x} is in no LOAD segment")


def find_site(code, base, hardirq):
    """Offset in `code` of the store to patch, or a reason why not.

    Returns (offset, already_patched) or raises LookupError.
    """
    # movl $2, disp32(%reg): C7 /0 with mod=10, imm32 = 2 (the NMI case).
    nmi = set()
    for i in range(len(code) - 10):
        modrm = code[i + 1]
        if code[i] == 0xC7 and modrm >> 6 == 2 and (modrm >> 3) & 7 == 0 \
                and modrm & 7 != 4 and code[i + 6:i + 10] == b"\x02\0\0\0":
            nmi.add((modrm & 7, code[i + 2:i + 6]))
    # call do_interrupt_x86_hardirq: E8 rel32.
    calls = [i for i in range(len(code) - 5) if code[i] == 0xE8 and
             base + i + 5 + struct.unpack_from("<i", code, i + 1)[0] == hardirq]
    if not nmi or not calls:
        raise LookupError("no NMI store or no call to do_interrupt_x86_hardirq")
    sites, patched = [], []
    for rm, disp in nmi:
        for call in calls:
            window = range(max(0, call - 64), call)
            for i in window:
                modrm = code[i + 1]
                if code[i] == 0x89 and modrm >> 6 == 2 and modrm & 7 == rm \
                        and code[i + 2:i + 6] == disp:
                    sites.append(i)
            # An earlier run of this tool leaves the NOP right before the
            # exception_is_int store; recognise it by the NOP alone.
            for i in window:
                if code[i:i + 6] == NOP6 and code[i + 6] == 0xC7:
                    patched.append(i)
    if len(sites) == 1:
        return sites[0], False
    if not sites and len(patched) == 1:
        return patched[0], True
    raise LookupError(f"{len(sites)} candidate stores, {len(patched)} patched sites")


def patch(binary, check=False):
    """Apply the fix to `binary` (unless `check`); return what was done.

    Raises LookupError when the instruction shapes are not there.
    """
    start, code, vmrun, hardirq = _helper_vmrun_code(binary)
    offset, done = find_site(code, vmrun, hardirq)
    where = f"helper_vmrun+{offset:#x}"
    if done:
        return f"already patched at {where}"
    if check:
        return f"unpatched, site at {where}"
    # What was replaced, so that resources/repro/vmrun-double-injection can
    # rebuild the unfixed binary next to the fixed one.
    with open(binary + SIDECAR, "w", encoding="utf-8") as f:
        json.dump({"file_offset": start + offset,
                   "original": code[offset:offset + 6].hex()}, f)
    # Patch a copy and rename it over the binary: an emulator running from
    # the old file (another runner) keeps executing unchanged code.
    tmp = f"{binary}.tmp{os.getpid()}"
    shutil.copy2(binary, tmp)
    with open(tmp, "r+b") as f:
        f.seek(start + offset)
        f.write(NOP6)
    os.replace(tmp, binary)
    return f"exception_index store at {where} removed"


class NotFixed(Exception):
    """The binary is not provably fixed; the text says why."""


def _helper_vmrun_code(binary):
    """(file offset of helper_vmrun, its bytes, its address, hardirq's)."""
    syms = dynamic_symbols(binary)
    try:
        vmrun, size = syms["helper_vmrun"]
        hardirq, _ = syms["do_interrupt_x86_hardirq"]
    except KeyError as e:
        raise LookupError(f"no symbol {e}") from None
    start = file_offset(binary, vmrun)
    with open(binary, "rb") as f:
        f.seek(start)
        code = f.read(size)
    return start, code, vmrun, hardirq


def verify(binary):
    """Return a one-line description when `binary` is provably fixed, else
    raise NotFixed naming what is wrong and how to get a fixed one."""
    fetch = "run resources/fetch-l1-qemu --force for a fixed emulator"
    try:
        start, code, vmrun, hardirq = _helper_vmrun_code(binary)
    except (LookupError, OSError, subprocess.CalledProcessError) as e:
        raise NotFixed(f"not a QEMU whose helper_vmrun can be checked ({e}); {fetch}") from None
    try:
        with open(binary + SIDECAR, encoding="utf-8") as f:
            site = json.load(f)
        offset = int(site["file_offset"]) - start
        original = bytes.fromhex(site["original"])
    except (OSError, ValueError, KeyError, TypeError):
        try:
            where, done = find_site(code, vmrun, hardirq)
            state = "patched by an unknown hand" if done else "unpatched"
            state += f" (site at helper_vmrun+{where:#x})"
        except LookupError as e:
            state = f"of unknown shape ({e})"
        raise NotFixed(f"no record of the VMRUN fix ({binary}{SIDECAR}); "
                       f"the binary is {state}; {fetch}") from None
    if not 0 <= offset <= len(code) - len(NOP6) or len(original) != len(NOP6):
        raise NotFixed(f"the record {binary}{SIDECAR} does not fit helper_vmrun; {fetch}")
    if code[offset:offset + len(NOP6)] != NOP6:
        raise NotFixed(f"helper_vmrun+{offset:#x} holds {code[offset:offset + 6].hex()}, "
                       f"not the fix's NOP (unpatched or rebuilt); {fetch}")
    restored = code[:offset] + original + code[offset + len(NOP6):]
    try:
        where, done = find_site(restored, vmrun, hardirq)
    except LookupError as e:
        raise NotFixed(f"the recorded original bytes are not the exception_index store ({e}); "
                       f"{fetch}") from None
    if done or where != offset:
        raise NotFixed(f"the recorded site helper_vmrun+{offset:#x} is not the store "
                       f"the fix removes; {fetch}")
    return f"fixed at helper_vmrun+{offset:#x}"


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__.split("usage:")[1], file=sys.stderr)
        return 2
    binary = argv[1]
    if "--verify" in argv[2:]:
        try:
            print(f"l1_qemu_patch: {binary}: {verify(binary)}")
        except NotFixed as e:
            print(f"l1_qemu_patch: {binary}: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        print(f"l1_qemu_patch: {binary}: {patch(binary, '--check' in argv[2:])}")
    except LookupError as e:
        print(f"l1_qemu_patch: {binary}: shapes not found ({e}); unchanged",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
