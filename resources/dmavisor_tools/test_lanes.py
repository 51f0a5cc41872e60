"""Run the integration test groups in parallel lanes.

    test-lanes [--lanes N] [--only NAME,...] [-- TEST-ARGS...]

Why: each integration test group (one file under tests/integration/tests/)
boots its guests in one runner session. In nested mode the runner's L1
emulator runs single-threaded TCG (docs/runner.md, "The L1 emulator"), so
one session keeps one host CPU busy; running one group per host CPU at a
time gives `make test` the throughput multi-threaded TCG had, without its
crashes. On a host with a real KVM the groups share the host's network
names (TAP devices), so there is one lane.

The test binaries are built once (`cargo test --no-run`) and run directly,
longest group first (durations of the last run are kept in
build/tests/lanes/durations.json). Each group's output goes to
build/tests/lanes/<group>.log and is printed whole when the group ends, so
lanes never interleave. Exit status: 0 when every group passed, 101
otherwise (as cargo test).

    DMAVISOR_TEST_LANES=N   lanes (default: host CPUs in nested mode, else 1)
"""

import json
import os
import queue
import subprocess
import sys
import threading
import time

from .common import BUILD, REPO, parser, runner_is_direct

LOGS = os.path.join(BUILD, "tests", "lanes")
DURATIONS = os.path.join(LOGS, "durations.json")
# First-run guesses (seconds): the groups' times in the clean-clone
# `make test` of 2026-11-27 (67be1a5, nested runner, two lanes), rounded
# up. A clean clone has no recorded durations, so these decide its lanes
# (longest first); a group missing here counts as 300 s.
DEFAULT_DURATIONS = {"vhost_user": 850, "viommu": 310, "vfio": 310,
                     "api": 290, "bench_guest": 220, "guest_driver_own_vmm": 210,
                     "hotplug": 160, "virtio_net": 160, "virtio_blk": 150,
                     "guest_driver_qemu_peer": 90, "boot": 80, "tools": 40,
                     "integration_tests": 5}


def default_lanes():
    """One lane per host CPU where guests run in the nested runner."""
    if runner_is_direct():
        return 1
    cpus = os.cpu_count() or 1
    # A multi-threaded runner keeps two host CPUs busy (its two vCPUs).
    if os.environ.get("DMAVISOR_RUNNER_TCG") == "multi":
        return max(1, cpus // 2)
    return cpus


def build_tests():
    """(group name, executable) for every integration test target (the
    harness library's own unit tests included)."""
    cargo = os.environ.get("CARGO", "cargo")
    out = subprocess.run(
        [cargo, "test", "--release", "-p", "integration-tests", "--no-run",
         "--message-format=json"],
        cwd=REPO, check=True, stdout=subprocess.PIPE, text=True).stdout
    tests = []
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        target = msg.get("target", {})
        if (msg.get("reason") == "compiler-artifact" and msg.get("executable")
                and msg.get("profile", {}).get("test")
                and {"test", "lib"} & set(target.get("kind", []))):
            tests.append((target["name"], msg["executable"]))
    return tests


def load_durations():
    try:
        with open(DURATIONS, encoding="utf-8") as f:
            return {**DEFAULT_DURATIONS, **json.load(f)}
    except (OSError, ValueError):
        return dict(DEFAULT_DURATIONS)


class Lanes:
    """A queue of groups, a printer that never interleaves, the results."""

    def __init__(self, groups, args):
        self.todo = queue.Queue()
        for g in groups:
            self.todo.put(g)
        self.args = args
        self.print_lock = threading.Lock()
        self.results = {}
        self.started = time.monotonic()

    def worker(self, lane):
        while True:
            try:
                name, exe = self.todo.get_nowait()
            except queue.Empty:
                return
            log = os.path.join(LOGS, f"{name}.log")
            with self.print_lock:
                print(f"test-lanes: lane {lane}: {name} started "
                      f"({time.monotonic() - self.started:.0f} s)", flush=True)
            t0 = time.monotonic()
            with open(log, "w", encoding="utf-8") as out:
                rc = subprocess.run([exe, "--test-threads=1", "--nocapture", *self.args],
                                    cwd=os.path.join(REPO, "tests", "integration"),
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, check=False).returncode
            secs = time.monotonic() - t0
            self.results[name] = (rc, secs)
            with self.print_lock, open(log, encoding="utf-8", errors="replace") as f:
                print(f"\n===== {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
                      f"in {secs:.0f} s (lane {lane}) =====", flush=True)
                sys.stdout.write(f.read())
                print(f"===== end of {name} =====", flush=True)


def main():
    ap = parser(__doc__)
    ap.add_argument("--lanes", type=int,
                    default=int(os.environ.get("DMAVISOR_TEST_LANES", "0")) or default_lanes())
    ap.add_argument("--only", default="", help="comma-separated group names")
    ap.add_argument("--list", action="store_true", help="print the groups and exit")
    ap.add_argument("test_args", nargs="*", help="passed to every test binary")
    args = ap.parse_args()
    os.makedirs(LOGS, exist_ok=True)
    tests = build_tests()
    if args.only:
        wanted = set(args.only.split(","))
        tests = [t for t in tests if t[0] in wanted]
    if not tests:
        print("test-lanes: no test group matches", file=sys.stderr)
        return 2
    durations = load_durations()
    tests.sort(key=lambda t: -durations.get(t[0], 300))
    if args.list:
        for name, exe in tests:
            print(f"{name}\t{durations.get(name, 300)} s\t{exe}")
        return 0
    lanes = max(1, min(args.lanes, len(tests)))
    print(f"test-lanes: {len(tests)} groups in {lanes} lane(s): "
          + ", ".join(t[0] for t in tests), flush=True)
    state = Lanes(tests, args.test_args)
    threads = [threading.Thread(target=state.worker, args=(i + 1,)) for i in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    durations.update({n: round(s) for n, (_, s) in state.results.items()})
    with open(DURATIONS, "w", encoding="utf-8") as f:
        json.dump(durations, f, indent=1, sort_keys=True)
    failed = sorted(n for n, (rc, _) in state.results.items() if rc != 0)
    total = time.monotonic() - state.started
    print(f"\ntest-lanes: {len(tests) - len(failed)}/{len(tests)} groups passed in "
          f"{total:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
    return 101 if failed else 0
