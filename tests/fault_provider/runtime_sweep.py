#!/usr/bin/env python3
"""The fault sweep of the runtime suite (issue 22): examples/runtime under mpirun, over
tcp;ofi_rxm with FI_HOOK='compcntr_fault;compcntr' (the fault provider under the compcntr hook,
on every rank), one fault per job at each call site of one run, in turn.

  1. a job without a fault: it must exit 0 and print "runtime: all checks passed"; the fault
     provider's report (one block per rank) gives the sites reached and their calls;
  2. for every site reached, every code of sweep.py's CODES that applies (--short: SHORT, the
     1st call only) and two calls (the 1st and the middle one of the busiest rank): one job with
     COMPCNTR_FAULT=site:n:code on every rank (each rank counts its own calls), classified as
       handled      exit 0 and "all checks passed" (the program's checks include compcntr's counts
                    against the provider's own counters on every rank: a lost or doubled count
                    fails them)
       reported     exit != 0, and a rank's output names the injected code (the engine,
                    examples/runtime/*.c, prints fi_strerror of the failed call, then
                    MPI_Abort)
       not-reached  the fault provider injected nothing
     or a defect: hang (the job outlived --timeout, or a rank outlived mpirun), crash (a rank ended
     by a signal), asan (a sanitizer report), misreported (exit != 0 without the code named),
     differs (exit 0 without "all checks passed").

Usage:
  runtime_sweep.py --fault-dir DIR --hook-dir DIR [--short] [--np N] MPIRUN PROGRAM [ARGS...]
Exit status: 0 no defect outcome, 1 any (or a failed job without a fault).
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
import run_runtime  # noqa: E402  (kill_session: a rank that outlives mpirun)
import sweep  # noqa: E402  (CODES, SHORT, SITE_RE, INJ_RE)

# How examples/runtime names a failed call's code: fi_strerror's text (libfabric 1.17), or the FI_ name.
STRERROR = {"EAGAIN": "Resource temporarily unavailable", "ENOMEM": "Cannot allocate memory",
            "EIO": "Input/output error", "ETIMEDOUT": "Connection timed out",
            "EAVAIL": "Error available", "ETRUNC": "Truncation error"}
DEFECTS = ("hang", "crash", "asan", "misreported", "differs")


def job(a, fault):
    """One mpirun job; (status, out, err, report, seconds)."""
    fd, report = tempfile.mkstemp(prefix="rt_fault_report_")
    os.close(fd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPCNTR_FAULT")}
    env.update(FI_PROVIDER_PATH=f"{a.fault_dir}:{a.hook_dir}", FI_HOOK="compcntr_fault;compcntr",
               COMPCNTR_FAULT_PROV="ofi_rxm", COMPCNTR_FAULT_REPORT=report,
               OMPI_MCA_btl_base_warn_component_unused="0")
    if fault:
        env["COMPCNTR_FAULT"] = fault
    else:
        env.pop("COMPCNTR_FAULT", None)
    cmd = [a.mpirun]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--oversubscribe", "--bind-to", "none", "-np", str(a.np)]
    for v in ("FI_PROVIDER_PATH", "FI_HOOK", "COMPCNTR_FAULT_PROV", "COMPCNTR_FAULT_REPORT") + \
            (("COMPCNTR_FAULT",) if fault else ()):
        cmd += ["-x", v]
    cmd += [a.program] + a.args
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, text=True, errors="replace")
    try:
        out, err = p.communicate(timeout=a.timeout)
        status = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        status = "timeout"
    # a rank still there 5 s after mpirun ended (killed then) is a hang
    left = run_runtime.kill_session(p.pid, 5)
    if left and status != "timeout":
        status = "survivors"
    try:
        with open(report) as f:
            rep = f.read()
    finally:
        os.unlink(report)
    return status, out, err, rep, time.monotonic() - t0


def classify(code, status, out, err):
    text = out + err
    if status in ("timeout", "survivors"):
        return "hang"
    if re.search(r"AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:", err):
        return "asan"
    if (isinstance(status, int) and status < 0) or "terminated with signal" in text \
            or re.search(r"exited on signal|Segmentation fault", text):
        return "crash"
    if status == 0:
        return "handled" if "runtime: all checks passed" in out else "differs"
    names = [f"FI_{code}"] + ([STRERROR[code]] if code in STRERROR else [])
    # EAVAIL on a CQ read leaves a made-up error entry with err FI_EIO (fault_provider.cpp): a
    # program that reads the entry reports its error, as it should, not the -FI_EAVAIL before it.
    if code == "EAVAIL":
        names.append(STRERROR["EIO"])
    return "reported" if any(n in text for n in names) else "misreported"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fault-dir", required=True)
    ap.add_argument("--hook-dir", required=True)
    ap.add_argument("--short", action="store_true")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("mpirun")
    ap.add_argument("program")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    t0 = time.monotonic()
    st, out, err, rep, secs = job(a, None)
    if st != 0 or "runtime: all checks passed" not in out:
        print(f"runtime_sweep: the job without a fault failed (exit {st}):\n{out}{err}")
        return 1
    calls = {}
    for _, site, n in sweep.SITE_RE.findall(rep):
        calls[site] = max(calls.get(site, 0), int(n))
    if not calls:
        print(f"runtime_sweep: no fault report: the fault provider is not installed\n{out}{err}")
        return 1
    print(f"runtime_sweep: {len(calls)} sites reached "
          f"({', '.join(f'{s} {n}' for s, n in sorted(calls.items()))}); {secs:.1f} s per job")
    table = sweep.SHORT if a.short else sweep.CODES
    counts = {}
    for site, n in sorted(calls.items()):
        for code in table.get(site, []):
            for nth in [1] if a.short or n <= 2 else [1, (n + 1) // 2]:
                fault = f"{site}:{nth}:{code}"
                st, out, err, rep, secs = job(a, fault)
                res = classify(code, st, out, err) if sweep.INJ_RE.search(rep) else \
                    ("not-reached" if st == 0 else classify(code, st, out, err))
                counts[res] = counts.get(res, 0) + 1
                detail = ""
                if res in DEFECTS:
                    detail = "\n    " + "\n    ".join((out + err).strip().splitlines()[-8:])
                print(f"| runtime | np {a.np} | {site} | {nth} | {code} | {res} | {secs:.1f} s |{detail}")
                sys.stdout.flush()
    defects = sum(counts.get(d, 0) for d in DEFECTS)
    summary = ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    print(f"runtime_sweep: {len([s for s in calls if s in table])} call sites, "
          f"{sum(counts.values())} faults injected: {summary or 'none'}; {defects} defect outcomes; "
          f"{time.monotonic() - t0:.0f} s")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
