"""Run a command where a hardware-backed /dev/kvm is available.

    run-kvm [--timeout SECONDS] [--mem MiB] [--cpus N] [--share PATH]... -- CMD [ARGS...]

Why: the VMM needs a KVM that runs stock kernels (kvm_intel / kvm_amd). On
such hosts CMD simply runs here ("direct" mode). On machines whose /dev/kvm
cannot boot stock kernels (e.g. PVM), CMD runs in the "nested" mode: an L1
QEMU in TCG mode emulates an AMD CPU with SVM, a Debian kernel inside it (L2)
loads kvm-amd, mounts this machine's root read-only and the checkout
read-write at the same paths over 9p, and runs CMD in a chroot with the same
cwd. Tests and benchmarks therefore work unchanged in both places.

CMD's stdout/stderr are streamed to ours; the exit status is CMD's, or
124 when --timeout expires or CMD printed nothing for --quiet-timeout
seconds (the watchdog then prints what the runner CPUs were doing), or
125 when the runner itself fails (with a message starting with "run-kvm:"
on stderr).

Environment:
    DMAVISOR_RUNNER=direct|nested   force a mode (default: detect)
    DMAVISOR_RUNNER_VERBOSE=1       stream the L2 console to stderr, print timings
    DMAVISOR_RUNNER_SUITE=trixie    runner kernel suite (default bookworm)
    DMAVISOR_RUNNER_KEEP=1          keep the session directory (build/runner/...)
    DMAVISOR_RUNNER_SHARES=a:b      extra read-write shares (nested mode)
    DMAVISOR_RUNNER_TCG=multi|single  L1 TCG threading (default single, docs/runner.md)
    DMAVISOR_RUNNER_QEMU=PATH|system  L1 emulator (default: QEMU 11 from
                                    trixie-backports, see l1_qemu()); refused
                                    unless provably fixed (check_emulator())
    DMAVISOR_RUNNER_ALLOW_UNFIXED=1 run an unfixed L1 emulator anyway (repro)
    DMAVISOR_RUNNER_CPUS=N          runner vCPUs when --cpus is not given
    DMAVISOR_RUNNER_MEM=MiB         runner memory when --mem is not given
    DMAVISOR_RUNNER_ASSIGN=1        as --assign-nic
    DMAVISOR_RUNNER_CMDLINE=ARGS    more runner kernel parameters, e.g.
                                    kvm_amd.npt=0 (module.param=value works)
Passed into the nested environment: PATH, HOME, LANG, LC_ALL, RUST_LOG,
RUST_BACKTRACE, CARGO_TARGET_DIR, DMAVISOR_* and any --env NAME.
"""

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from . import l1_qemu_patch
from .common import BUILD, REPO, kvm_module_loaded, make_log, parser, read_text, timestamp, tool

EXIT_TIMEOUT = 124
EXIT_RUNNER = 125
ENV_WHITELIST = ("PATH", "HOME", "LANG", "LC_ALL", "RUST_LOG", "RUST_BACKTRACE", "CARGO_TARGET_DIR")
# Modules of the L2 (runner) kernel. Required ones give KVM, virtio-pci and
# 9p; optional ones let tests build TAP/bridge/vhost setups inside L2.
# (fscache and netfs come in through 9p's dependencies: 6.12 folded fscache
# into netfs.)
RUNNER_MODULES = ("irqbypass kvm ccp kvm-amd virtio_ring virtio virtio_pci_modern_dev "
                  "virtio_pci_legacy_dev virtio_pci 9pnet 9pnet_virtio 9p")
RUNNER_OPTIONAL = ("tun tap llc stp bridge vhost_iotlb vhost vhost_net macvtap veth "
                   "vfio vfio_iommu_type1 vfio_virqfd vfio-pci-core vfio-pci e1000e")
# --assign-nic: the NIC handed to vfio-pci in L2 and its peer on the same
# emulated hub, which L2's own e1000e driver keeps (address PEER_IP).
ASSIGN_MAC = "52:54:00:aa:00:01"
PEER_MAC = "52:54:00:aa:00:02"
PEER_IP = "10.99.0.1/24"


class RunnerError(Exception):
    """The runner (not the command) failed."""


log = make_log("run-kvm")


def verbose():
    return os.environ.get("DMAVISOR_RUNNER_VERBOSE", "") not in ("", "0")


def detect_mode():
    forced = os.environ.get("DMAVISOR_RUNNER", "")
    if forced in ("direct", "nested"):
        return forced
    if forced:
        raise RunnerError(f"DMAVISOR_RUNNER={forced!r}: expected direct or nested")
    if kvm_module_loaded():
        try:
            os.close(os.open("/dev/kvm", os.O_RDWR))
            return "direct"
        except OSError:
            pass
    return "nested"


# ----------------------------------------------------------------- direct


def run_direct(cmd, timeout, quiet_timeout):
    """Run CMD here, with the same time-out and progress watchdog as nested."""
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        proc = subprocess.Popen(cmd, start_new_session=True, stdout=out_w, stderr=err_w)
    except OSError as e:
        log(f"cannot run {cmd[0]}: {e}")
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        return 127
    os.close(out_w)
    os.close(err_w)
    pumps = [Pump(out_r, [sys.stdout.buffer]), Pump(err_r, [sys.stderr.buffer])]
    for p in pumps:
        p.start()
    forward_signals(lambda: kill_group(proc))
    stalled = wait_watched(proc, pumps, timeout, quiet_timeout)
    if stalled is not None:
        if stalled:
            log(f"watchdog: no output from the command for {stalled:.0f} s; killing {cmd[0]}")
        else:
            log(f"time-out after {timeout} s, killing {cmd[0]}")
        kill_group(proc)
    proc.wait()
    for p in pumps:
        p.join(timeout=5)
    return EXIT_TIMEOUT if stalled is not None else proc.returncode


def wait_watched(proc, pumps, timeout, quiet_timeout):
    """Wait for PROC; None when it ended, else the seconds it had been
    quiet (its PUMPS saw no output for QUIET_TIMEOUT) or 0 at TIMEOUT."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=1)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        quiet = now - max(p.last for p in pumps)
        if quiet_timeout and quiet > quiet_timeout:
            return quiet
        if now > deadline:
            return 0


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def forward_signals(cleanup):
    def handler(signum, _frame):
        cleanup()
        sys.exit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


# ----------------------------------------------------------------- nested


def runner_suite():
    """Debian suite of the runner kernel (DMAVISOR_RUNNER_SUITE, default bookworm)."""
    suite = os.environ.get("DMAVISOR_RUNNER_SUITE", "bookworm")
    if suite not in ("bookworm", "trixie"):
        raise RunnerError(f"DMAVISOR_RUNNER_SUITE={suite}: bookworm or trixie")
    return suite


def ensure_runner_images():
    """Runner kernel + initramfs paths (fetching/building them if needed)."""
    suite = runner_suite()
    kernel = os.path.join(BUILD, "images", suite, "vmlinuz")
    if not os.path.exists(kernel):
        log(f"fetching the {suite} runner kernel")
        res = subprocess.run([tool("guest-images"), "fetch", "--suite", suite])
        if res.returncode != 0 or not os.path.exists(kernel):
            raise RunnerError("cannot fetch the runner kernel "
                              f"(resources/guest-images fetch --suite {suite})")
    res = subprocess.run(
        [tool("mkinitramfs"), "--suite", suite,
         "--modules", RUNNER_MODULES, "--optional-modules", RUNNER_OPTIONAL,
         "--script", os.path.join(REPO, "resources", "runner", "l2-init.sh"),
         "--script-timeout", "604800"],
        capture_output=True, text=True)
    if res.returncode != 0:
        raise RunnerError(f"cannot build the runner initramfs: {res.stderr.strip()}")
    return kernel, res.stdout.strip()


def rw_shares(extra):
    """Read-write shares: the checkout, the build dir, user additions (no nesting)."""
    cands = [REPO, BUILD] + list(extra)
    cands += [p for p in os.environ.get("DMAVISOR_RUNNER_SHARES", "").split(":") if p]
    out = []
    for p in sorted({os.path.realpath(c) for c in cands}, key=len):
        if not os.path.isdir(p):
            raise RunnerError(f"share {p} is not a directory")
        if any(c in p for c in " \t\n,"):
            raise RunnerError(f"share path {p!r} contains whitespace or a comma")
        if not any(p == o or p.startswith(o + "/") for o in out):
            out.append(p)
    return out


def write_cmd_script(session, cmd, extra_env):
    names = set(ENV_WHITELIST) | set(extra_env)
    names |= {k for k in os.environ if k.startswith("DMAVISOR_") and k not in
              ("DMAVISOR_RUNNER", "DMAVISOR_RUNNER_VERBOSE", "DMAVISOR_RUNNER_KEEP",
               "DMAVISOR_RUNNER_CMDLINE", "DMAVISOR_RUNNER_QEMU", "DMAVISOR_RUNNER_TCG",
               "DMAVISOR_RUNNER_CPUS", "DMAVISOR_RUNNER_MEM")}
    lines = ["# generated by resources/run-kvm", "umask 022"]
    cwd = shlex.quote(os.getcwd())
    lines.append(f"cd {cwd} || {{ echo \"run-kvm: error: cwd {cwd} is not visible in the "
                 f"nested runner (/tmp and /run are fresh tmpfs there)\" >&2; "
                 f"exit {EXIT_RUNNER}; }}")
    for k in sorted(names):
        if k in os.environ:
            lines.append(f"export {k}={shlex.quote(os.environ[k])}")
    # Tell the command where it runs (tests may adapt time-outs).
    lines.append("export DMAVISOR_IN_RUNNER=nested")
    lines.append("exec " + " ".join(shlex.quote(a) for a in cmd))
    with open(os.path.join(session, "cmd.sh"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


class Pump(threading.Thread):
    """Copy a pipe to a file object as data arrives."""

    def __init__(self, fd, sinks):
        super().__init__(daemon=True)
        self.fd = fd
        self.sinks = sinks
        self.first = None
        self.last = time.monotonic()

    def run(self):
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            self.last = time.monotonic()
            if self.first is None:
                self.first = self.last
            for s in self.sinks:
                try:
                    s.write(data)
                    s.flush()
                except (OSError, ValueError):
                    pass
        os.close(self.fd)


def tcg_threading():
    """L1's TCG threading: single by default. With the VMRUN fix
    (resources/dmavisor_tools/l1_qemu_patch.py) single-threaded TCG runs
    the runner's guests without the crashes and stalls that multi-threaded
    TCG still shows (docs/runner.md, "The L1 emulator"); it uses one host CPU per
    runner, and resources/test-lanes runs one runner per host CPU."""
    mode = os.environ.get("DMAVISOR_RUNNER_TCG", "single")
    if mode not in ("multi", "single"):
        raise RunnerError(f"DMAVISOR_RUNNER_TCG={mode}: multi or single")
    return mode


def l1_qemu():
    """The L1 emulator: DMAVISOR_RUNNER_QEMU (a path, or "system" for this
    machine's qemu-system-x86_64), else QEMU from trixie-backports fetched
    by resources/fetch-l1-qemu (see docs/runner.md, "The L1 emulator")."""
    forced = os.environ.get("DMAVISOR_RUNNER_QEMU", "")
    if forced == "system":
        qemu = shutil.which("qemu-system-x86_64")
        if qemu is None:
            raise RunnerError("qemu-system-x86_64 not found (resources/install-deps installs it)")
        return qemu
    if forced:
        if not os.access(forced, os.X_OK):
            raise RunnerError(f"DMAVISOR_RUNNER_QEMU={forced} is not executable")
        return forced
    wrapper = os.path.join(BUILD, "l1-qemu", "qemu-system-x86_64")
    if os.access(wrapper, os.X_OK):
        return wrapper
    log("fetching the L1 emulator (resources/fetch-l1-qemu)")
    res = subprocess.run([tool("fetch-l1-qemu")],
                         stdout=subprocess.PIPE, text=True)
    if res.returncode != 0 or not os.access(wrapper, os.X_OK):
        raise RunnerError("cannot fetch the L1 emulator (resources/fetch-l1-qemu)")
    return wrapper


def emulator_binaries(path):
    """The QEMU binaries an L1 command PATH starts: PATH itself when it is
    an ELF file, else the executable ELF files a wrapper script names
    (fetch-l1-qemu's wrapper starts its binary through a dynamic loader,
    which is not the emulator and is left out)."""
    with open(path, "rb") as f:
        if f.read(4) == b"\x7fELF":
            return [path]
    found = []
    for token in shlex.split(read_text(path) or "", comments=True):
        if (token.startswith("/") and os.path.isfile(token) and os.access(token, os.X_OK)
                and not os.path.basename(token).startswith("ld-linux")):
            with open(token, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    found.append(token)
    return found


def check_emulator(qemu):
    """Refuse an L1 emulator that is not provably fixed (l1_qemu_patch.py):
    TCG on an emulator with VMRUN's double interrupt delivery stalls every
    boot (docs/runner.md), which would show up as watchdog stops, one per
    test, instead of this one line. DMAVISOR_RUNNER_ALLOW_UNFIXED=1 lets a
    reproduction (resources/repro/vmrun-double-injection) run one anyway."""
    if os.environ.get("DMAVISOR_RUNNER_ALLOW_UNFIXED", "") not in ("", "0"):
        return
    try:
        binaries = emulator_binaries(qemu)
    except OSError as e:
        raise RunnerError(f"cannot read the L1 emulator {qemu}: {e}") from None
    if not binaries:
        raise RunnerError(f"refusing the L1 emulator {qemu}: it names no QEMU binary to check "
                          "for the VMRUN fix (docs/runner.md, \"The L1 emulator\")")
    for binary in binaries:
        try:
            l1_qemu_patch.verify(binary)
        except l1_qemu_patch.NotFixed as e:
            raise RunnerError(f"refusing an unfixed L1 emulator, TCG would stall every boot: "
                              f"{e}") from None


def run_nested(cmd, args):
    qemu = l1_qemu()
    check_emulator(qemu)
    kernel, initrd = ensure_runner_images()
    shares = rw_shares(args.share)
    runner_dir = os.path.join(BUILD, "runner")
    os.makedirs(runner_dir, exist_ok=True)
    session = os.path.join(runner_dir, f"{timestamp()}-{os.getpid()}")
    os.makedirs(session)
    session = os.path.realpath(session)
    if not any(session.startswith(s + "/") for s in shares):
        raise RunnerError(f"session dir {session} is outside every rw share")
    write_cmd_script(session, cmd, args.env)

    pipes = [os.pipe() for _ in range(3)]  # console, stdout, stderr
    console_log = open(os.path.join(session, "console.log"), "wb")
    console_sinks = [console_log] + ([sys.stderr.buffer] if verbose() else [])
    pumps = [Pump(pipes[0][0], console_sinks), Pump(pipes[1][0], [sys.stdout.buffer]),
             Pump(pipes[2][0], [sys.stderr.buffer])]
    # tsc=reliable: the emulated TSC is one host counter for every runner
    # CPU, but the runner kernel's boot-time warp check marks it
    # "unsynchronized" under TCG. KVM then treats the host TSC as unstable and
    # rewrites each L3 vCPU's TSC offset at every vCPU load, so a halted
    # guest's TSC stands still; a KVM trace showed an L3 vCPU whose
    # TSC-deadline timer therefore never came due (docs/runner.md).
    # no_timer_check: at boot the runner kernel checks that the IO-APIC
    # timer ticks within a busy-wait; on a loaded host an emulated CPU can
    # spin through that window before the timer fires, and with interrupt
    # remapping on (--assign-nic) the kernel panics ("timer doesn't work
    # through Interrupt-remapped IO-APIC"), seen once with 2 cores shared by
    # 4 runners. The timer is QEMU's own; the check has nothing to find.
    append = ("console=ttyS0 quiet loglevel=5 panic=-1 mitigations=off 8250.nr_uarts=4 "
              "tsc=reliable no_timer_check "
              f"dmavisor.session={session} dmavisor.rw={','.join(shares)} "
              + os.environ.get("DMAVISOR_RUNNER_CMDLINE", "")).strip()
    if args.assign_nic:
        # L2's IOMMU passes its own devices through (iommu=pt: 9p stays
        # fast) and gives vfio-pci a translated domain for the assigned NIC.
        append += (f" intel_iommu=on iommu=pt dmavisor.assign={ASSIGN_MAC} "
                   f"dmavisor.peer={PEER_MAC},{PEER_IP}")
    qcmd = [qemu, "-accel", f"tcg,thread={tcg_threading()}", "-cpu", "EPYC,+svm",
            "-smp", str(args.cpus),
            "-m", str(args.mem), "-kernel", kernel, "-initrd", initrd, "-append", append,
            "-display", "none", "-nodefaults", "-no-reboot", "-no-user-config"]
    if args.assign_nic:
        qcmd += assign_nic_args()
    qcmd += ["-virtfs",
             "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"]
    for i, s in enumerate(shares):
        qcmd += ["-virtfs", f"local,path={s},mount_tag=rw{i},security_model=none,multidevs=remap"]
    # An HMP monitor socket lets a human inspect a hung L2
    # (`socat - UNIX-CONNECT:<session>/monitor.sock`, then `info registers`).
    monitor = os.path.join(session, "monitor.sock")
    if len(monitor) < 100:
        qcmd += ["-monitor", f"unix:{monitor},server=on,wait=off"]
    for i, (_, w) in enumerate(pipes):
        qcmd += ["-chardev", f"file,id=s{i},path=/dev/fd/{w},append=on", "-serial", f"chardev:s{i}"]
    if verbose():
        log("L1: " + " ".join(shlex.quote(a) for a in qcmd))
    start = time.monotonic()
    qemu_err = open(os.path.join(session, "qemu.err"), "wb")
    try:
        proc = subprocess.Popen(qcmd, stdin=subprocess.DEVNULL, stdout=qemu_err, stderr=qemu_err,
                                pass_fds=[w for _, w in pipes], start_new_session=True)
    except OSError as e:
        raise RunnerError(f"cannot start {qemu}: {e}") from e
    for _, w in pipes:
        os.close(w)
    for p in pumps:
        p.start()
    forward_signals(lambda: kill_group(proc))
    # The L2 console does not count as progress: a soft-lockup report
    # every 28 s is not the command moving.
    stalled = wait_watched(proc, pumps[1:], args.timeout, args.quiet_timeout)
    timed_out = stalled is not None
    if timed_out:
        if stalled:
            report_stall(session, monitor, stalled)
        kill_group(proc)
        proc.wait()
    for p in pumps:
        p.join(timeout=5)
    console_log.close()
    qemu_err.close()
    elapsed = time.monotonic() - start

    rc_path = os.path.join(session, "rc")
    err_path = os.path.join(session, "l2-error")
    if timed_out:
        if not stalled:
            log(f"time-out after {args.timeout} s (L1 QEMU killed); "
                f"console log: {session}/console.log")
        return EXIT_TIMEOUT
    if verbose():
        up = read_text(os.path.join(session, "l2-uptime"))
        log(f"L1 wall time {elapsed:.1f} s; L2 reached the command at L2 uptime {up or '?'} s")
    if os.path.exists(err_path):
        raise RunnerError(f"L2 setup failed: {read_text(err_path)}; "
                          f"console log: {session}/console.log")
    rc = read_text(rc_path)
    if rc is None or not rc.isdigit():
        tail = read_text(os.path.join(session, "console.log")) or ""
        qerr = read_text(os.path.join(session, "qemu.err")) or ""
        raise RunnerError(
            f"no exit status from L2 (QEMU exit {proc.returncode}); session {session}\n"
            f"--- qemu stderr ---\n{qerr[-2000:]}\n--- L2 console (tail) ---\n{tail[-3000:]}")
    if not os.environ.get("DMAVISOR_RUNNER_KEEP"):
        shutil.rmtree(session, ignore_errors=True)
    return int(rc)


def assign_nic_args():
    """L1 devices for --assign-nic: a q35 machine with an emulated Intel
    IOMMU (caching mode, interrupt remapping, so L2's VFIO accepts it) and
    two e1000e NICs on one emulated hub, so traffic between the assigned
    NIC and its peer never leaves L1."""
    return ["-machine", "q35,kernel-irqchip=split",
            "-device", "intel-iommu,caching-mode=on,intremap=on",
            "-netdev", "hubport,id=assign0,hubid=0",
            "-device", f"e1000e,netdev=assign0,mac={ASSIGN_MAC}",
            "-netdev", "hubport,id=peer0,hubid=0",
            "-device", f"e1000e,netdev=peer0,mac={PEER_MAC}"]


def hmp(monitor, command, wait=2.0):
    """Output of one HMP command on the L1 monitor socket ('' if none)."""
    out = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(wait)
            sock.connect(monitor)
            sock.sendall(command.encode() + b"\n")
            end = time.monotonic() + wait
            while time.monotonic() < end:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    break
                if not chunk:
                    break
                out += chunk
    except OSError as e:
        return f"(monitor: {e})"
    return out.decode(errors="replace")


def cpu_summary(registers):
    """One line per runner CPU from `info registers -a`: RIP, flags, HLT."""
    lines = []
    for block in re.split(r"\n(?=CPU#\d)", registers):
        cpu = re.search(r"CPU#(\d+)", block)
        rip = re.search(r"RIP=([0-9a-f]+)", block)
        efl = re.search(r"RFL=([0-9a-f]+)", block)
        hlt = re.search(r"HLT=(\d)", block)
        if cpu and rip:
            iflag = "?" if not efl else ("on" if int(efl.group(1), 16) & 0x200 else "off")
            lines.append(f"runner CPU {cpu.group(1)}: RIP={rip.group(1)} interrupts {iflag} "
                         f"halted={hlt.group(1) if hlt else '?'}")
    return lines


def report_stall(session, monitor, quiet):
    """Say that the command stopped making progress, with the runner's view.

    Why: a stalled nested guest used to cost the whole time-out and leave
    nothing behind; the L1 monitor shows what each runner CPU is doing
    (halted, spinning with interrupts off, ...). Taken twice, 1 s apart,
    to tell a spinning CPU (same RIP) from one that moves.
    """
    log(f"watchdog: no output from the command for {quiet:.0f} s; stopping the runner")
    dumps = [hmp(monitor, "info registers -a")]
    time.sleep(1)
    dumps.append(hmp(monitor, "info registers -a"))
    with open(os.path.join(session, "stall-registers.txt"), "w", encoding="utf-8") as f:
        f.write("\n---- 1 s later ----\n".join(dumps))
    for i, d in enumerate(dumps):
        for line in cpu_summary(d) or ["(no register dump from the monitor)"]:
            log(f"watchdog: sample {i + 1}: {line}")
    tail = (read_text(os.path.join(session, "console.log")) or "").splitlines()[-15:]
    for line in tail:
        log(f"watchdog: L2 console: {line}")
    log(f"watchdog: full dump in {session}/stall-registers.txt")


def main():
    ap = parser(__doc__)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds (default 3600)")
    ap.add_argument("--quiet-timeout", type=float, default=300,
                    help="seconds without output from CMD before the watchdog "
                         "reports the runner's CPUs and stops it (0: off; default 300)")
    ap.add_argument("--mem", type=int, default=int(os.environ.get("DMAVISOR_RUNNER_MEM", "6144")),
                    help="L2 memory in MiB (nested mode; default DMAVISOR_RUNNER_MEM or 6144)")
    ap.add_argument("--cpus", type=int, default=int(os.environ.get("DMAVISOR_RUNNER_CPUS", "2")),
                    help="L2 vCPUs (nested mode; default DMAVISOR_RUNNER_CPUS or 2)")
    ap.add_argument("--share", action="append", default=[],
                    help="extra read-write directory (nested)")
    ap.add_argument("--env", action="append", default=[], help="extra environment variable to pass")
    ap.add_argument("--assign-nic", action="store_true",
                    default=os.environ.get("DMAVISOR_RUNNER_ASSIGN") == "1",
                    help="give CMD a NIC bound to vfio-pci behind an IOMMU, named by "
                         "DMAVISOR_ASSIGN_BDF, and its peer's address DMAVISOR_ASSIGN_PEER "
                         "(nested: emulated by L1; direct: DMAVISOR_ASSIGN_BDF must be "
                         "set by the user)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given (usage: run-kvm [options] -- CMD [ARGS...])")
    try:
        mode = detect_mode()
        if verbose():
            log(f"mode {mode}")
        if mode == "direct":
            if args.assign_nic and not os.environ.get("DMAVISOR_ASSIGN_BDF"):
                raise RunnerError("--assign-nic on a KVM host needs DMAVISOR_ASSIGN_BDF=<BDF of a "
                                  "NIC bound to vfio-pci> (and DMAVISOR_ASSIGN_PEER=<address "
                                  "reachable through it>)")
            return run_direct(cmd, args.timeout, args.quiet_timeout)
        return run_nested(cmd, args)
    except RunnerError as e:
        log(f"error: {e}")
        return EXIT_RUNNER
