#!/usr/bin/env python3
"""The fault sweep of the libfabric layer (issue 22): every fi_apps program under the compcntr
hook with the fault provider beneath it, one fault at each call site in turn.

For every program and provider:
  1. a run without a fault (FI_HOOK='compcntr_fault;compcntr'): it must exit 0; the fault
     provider's report gives the call sites the program's processes reached and their calls;
  2. for every site reached, every code that applies to it (CODES) and two calls (the 1st and
     a later one, the middle call of the busiest process): one run with COMPCNTR_FAULT=site:n:code,
     classified as one of
       handled      exit 0, output identical to the run without a fault (retried or absorbed)
       reported     the program's output names the injected code (a line that the run without
                    the fault does not print: a FAILED line, a printed return value), exactly
                    as the fault provider gave it (its peer may then fail waiting for it)
       counted      a wait timed out on a counter that counted the fault as an error, every
                    awaited operation accounted for (value + errors >= the threshold; the
                    FAILED line's "(value V, errors E)", E >= 1): fi_cntr(3)'s -FI_EAVAIL is
                    for errors counted during a wait, this one was counted before it
       not-reached  the fault provider injected nothing (a site whose call count varies)
     or, a defect:
       hang         killed by the sweep's timeout, or the program's own alarm / lost-client report
       lost         a wait of the program timed out (-FI_ETIMEDOUT) that was not the fault: a
                    completion the counters never showed
       crash        a process ended by a signal
       asan         a sanitizer report on stderr
       differs      exit 0, but the output differs from the run without a fault and does not
                    name the code (a wrong, lost or doubled count)
       misreported  exit != 0 and the FAILED lines do not name the injected code
     A defect outcome is run again with the fault provider alone (no compcntr hook): when that
     run has the same outcome, it is not compcntr's ("nohook-<outcome>": libfabric's own
     defect, or the fault's effect on the application itself; noted, the exit status ignores
     it), otherwise compcntr's. Not for the value faults (short, lag, wrap32): a program without
     the hook reads the provider's values itself, the hook's counters are meant to absorb them.
Programs are launched with tests/fi_apps/run.py's run() (its process-group kill on timeout).

Usage:
  sweep.py --fault-dir DIR --hook-dir DIR [-p PROVIDER]... [--short] [--jobs N] PROGRAM...
  sweep.py ... --fault SITE:N:CODE ... PROGRAM...     only these faults (regression tests)
Exit status: 0 no defect outcome, 1 any defect outcome (or a failed run without a fault).
"""
import argparse
import concurrent.futures
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fi_apps"))
import run as fi_run  # noqa: E402  (tests/fi_apps/run.py: run(), PROVIDERS, CLEAN)

POSTS = ["send", "sendv", "sendmsg", "inject", "senddata", "injectdata", "recv", "recvv", "recvmsg",
         "tsend", "tsendmsg", "tinject", "trecv", "trecvmsg", "read", "readmsg", "write", "writemsg",
         "inject_write"]
SETUP = ["domain", "endpoint", "cq_open", "av_open", "mr_reg", "mr_regv", "mr_regattr", "av_insert",
         "ep_bind", "enable", "eq_open", "passive_ep", "listen", "connect", "accept"]
CODES = {s: ["EAGAIN", "EIO"] for s in POSTS}
CODES.update({s: ["ENOMEM", "EIO"] for s in SETUP})
CODES.update({
    "cntr_open": ["ENOMEM", "wrap32"],
    "cq_read": ["EAGAIN", "EAVAIL", "ETRUNC", "EIO"],
    "cq_readfrom": ["EAGAIN", "EAVAIL", "ETRUNC", "EIO"],
    "cq_sread": ["EAGAIN", "EAVAIL", "EIO"],
    "cq_readerr": ["EAGAIN"],
    "cntr_read": ["short", "lag"],
    "cntr_readerr": ["short", "lag"],
    "cntr_wait": ["ETIMEDOUT", "EAVAIL", "EIO"],
    # FI_EP_MSG programs (shutdown): 'shutdown' makes the read return a made-up FI_SHUTDOWN for
    # an endpoint bound to the EQ (not injected where none is bound yet)
    "eq_read": ["EAGAIN", "EIO", "shutdown"],
    "eq_sread": ["EAGAIN", "EIO", "shutdown"],
})
# The short form (CI): a few sites x 2 codes, the 1st call only.
SHORT = {"send": ["EAGAIN", "EIO"], "recv": ["EAGAIN", "EIO"], "cq_read": ["EAVAIL", "EIO"],
         "cntr_read": ["short", "lag"], "cntr_readerr": ["short"], "cntr_wait": ["ETIMEDOUT", "EIO"],
         "ep_bind": ["ENOMEM", "EIO"], "cntr_open": ["ENOMEM", "wrap32"]}
# The short form through ofi_compcntr (--layer-dir): SHORT without `lag`. Through the layer a
# lagging provider read reaches the application as the provider gave it (one fi_cntr_read of
# trigger's send counter shows 3 for 4, the next ones 4: not absorbed as the hook absorbs it,
# not lost either; docs/reliability.md): the full sweep shows it, CI does not fail on it.
LAYER_SHORT = {s: [c for c in codes if c != "lag"] for s, codes in SHORT.items()}
# The provider the application names last is the one the hooks see (rxm over tcp, ...).
# Plain tcp (FI_EP_MSG programs) is its own top provider.
TOP = {"tcp;ofi_rxm": "ofi_rxm", "udp;ofi_rxd": "ofi_rxd", "shm": "shm", "sockets": "sockets",
       "tcp": "tcp"}
VALUE_CODES = ("short", "lag", "wrap32")
COUNTED_RE = re.compile(r"fi_cntr_wait\([^,]+, (\d+), \d+\) = -FI_ETIMEDOUT.*\(value (\d+), errors (\d+)\)")
DEFECTS = ("hang", "lost", "crash", "asan", "differs", "misreported")
SITE_RE = re.compile(r"^compcntr-fault pid=(\d+) site=(\w+) calls=(\d+)$", re.M)
INJ_RE = re.compile(r"^compcntr-fault pid=\d+ injected site=(\w+) call=(\d+) code=(\w+)$", re.M)


ERRNO = {"EAGAIN": 11, "ENOMEM": 12, "EIO": 5, "EINVAL": 22, "EBUSY": 16, "ENOSYS": 38,
         "ETIMEDOUT": 110, "ECANCELED": 125, "EAVAIL": 259, "ETRUNC": 265}


def names_of(code):
    """How a program's output names an injected code: -FI_EXXX, or the number a program prints
    for calls that return a count (fi_av_insert: "= -12")."""
    if code == "shutdown":
        return ["FI_SHUTDOWN"]  # a made-up event the program did not expect there
    if code not in ERRNO:
        return []
    names = [f"FI_{code}", f"= -{ERRNO[code]}"]
    if code == "EAVAIL":
        names.append("FI_EIO")  # the made-up error entry's err
    if code == "ETRUNC":
        names.append("FI_EAVAIL")  # the CQ read that announced the entry
    return names


def one_run(program, provider, fault, fault_dir, hook_dir, timeout, hook=True, layer_dir=None):
    """Runs program once with COMPCNTR_FAULT=fault (None: no fault), under the compcntr hook
    (hook=False: the fault provider alone), or with layer_dir through the layered provider
    ofi_compcntr (-p "PROVIDER;ofi_compcntr", FI_HOOK=compcntr_fault on the fabric of PROVIDER
    that the layer opens beneath itself: the layer's own calls are the ones faulted);
    (status, out, err, report, seconds, stats lines)."""
    fd, report = tempfile.mkstemp(prefix="fault_report_")
    os.close(fd)
    fd, stats = tempfile.mkstemp(prefix="fault_stats_")
    os.close(fd)
    env = {k: v for k, v in os.environ.items()
           if k not in fi_run.CLEAN and not k.startswith("COMPCNTR_FAULT")
           and k != "COMPCNTR_OFI_STATS"}
    env.update(COMPCNTR_FAULT_REPORT=report, COMPCNTR_FAULT_PROV=TOP.get(provider, provider))
    if layer_dir:
        env.update(FI_PROVIDER_PATH=f"{fault_dir}:{layer_dir}", FI_HOOK="compcntr_fault",
                   COMPCNTR_OFI_STATS=stats)
        argv = [program, "-p", provider + ";ofi_compcntr"]
    else:
        env.update(FI_PROVIDER_PATH=f"{fault_dir}:{hook_dir}" if hook_dir else fault_dir,
                   FI_HOOK="compcntr_fault;compcntr" if hook else "compcntr_fault",
                   COMPCNTR_FI_HOOK_STATS=stats)
        argv = [program, "-p", provider]
    if fault:
        env["COMPCNTR_FAULT"] = fault
    try:
        status, out, err, secs = fi_run.run(argv, env, timeout)
        with open(report) as f:
            rep = f.read()
        with open(stats) as f:
            stat_lines = [l.rstrip("\n") for l in f if l.strip()]
    finally:
        os.unlink(report)
        os.unlink(stats)
    return status, out, err, rep, secs, stat_lines


LAYER_RE = re.compile(r"^ofi_compcntr pid=(\d+) .*\bcntr_open=(\d+)\b.*\bproviders=(\S+)")


def check_layer_base(rep, stat_lines, provider):
    """Through ofi_compcntr: the fault provider must be installed under the layer, not beside
    it: every process that loaded the layer (its stats line) has a fault report, and in each the
    provider's counters opened (the fault provider's cntr_open calls) are at least the layer's
    (the layer opens one provider counter per counter it serves, and the application's
    FI_TRIGGER / deferred-work ops reach the provider as the layer's own plain posts). Returns
    an error message, or None."""
    layer = {int(m.group(1)): (int(m.group(2)), m.group(3))
             for m in map(LAYER_RE.match, stat_lines) if m}
    if not layer:
        return "no ofi_compcntr stats line: libfabric did not load the layer"
    opens = {int(p): int(n) for p, site, n in SITE_RE.findall(rep) if site == "cntr_open"}
    for pid, (served, provs) in sorted(layer.items()):
        if provs != provider:
            return f"pid {pid}: ofi_compcntr runs over {provs}, not {provider}"
        if pid not in opens:
            return (f"pid {pid}: the fault provider reports no cntr_open call: it is not installed "
                    f"under ofi_compcntr (report:\n{rep})")
        if opens[pid] < served:
            return f"pid {pid}: the provider saw {opens[pid]} cntr_open calls, the layer served {served}"
    return None


def classify(code, status, out, err, rep, base_out):
    # A crash first: a process that died (libfabric's SIGSEGV handler then exits) never closed
    # its counters, so LeakSanitizer's report at that exit is the crash's, not a leak.
    if (isinstance(status, int) and status < 0) or "ended by signal" in out \
            or "terminated with signal" in err:  # libfabric's own SIGSEGV handler
        return "crash"
    if re.search(r"AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:", err):
        return "asan"
    if status == "timeout" or "still running after the alarm" in out \
            or "no report from the client process" in out:
        return "hang"
    if not INJ_RE.search(rep):
        return "not-reached" if status == 0 and out == base_out else "differs"
    names = names_of(code)
    if status == 0:
        if out == base_out:
            return "handled"
        new = set(out.splitlines()) - set(base_out.splitlines())
        if any(n in l for l in new for n in names):
            return "reported"
        return "differs"
    # The process that saw the fault names it (in its FAILED line or the line before it); its
    # peer may then fail on its own terms (a wait that ends without the peer's messages).
    new = set(out.splitlines()) - set(base_out.splitlines())
    if any(n in l for l in new for n in names):
        return "reported"
    failed = [l for l in out.splitlines() if "FAILED" in l]
    if code != "ETIMEDOUT" and any("FI_ETIMEDOUT" in l for l in failed):
        # A wait that timed out on a counter that counted the fault as an error: every operation
        # it waited for is accounted for (value + errors reach the threshold). fi_cntr(3) as
        # libfabric's util counters implement it answers -FI_EAVAIL only for an error counted
        # during the wait; one counted before it (a triggered post that failed in the round
        # that crossed its threshold) leaves the wait to time out, the error in fi_cntr_readerr.
        for l in failed:
            m = COUNTED_RE.search(l)
            if m and int(m.group(3)) >= 1 and int(m.group(2)) + int(m.group(3)) >= int(m.group(1)):
                return "counted"
        return "lost"
    return "misreported"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("programs", nargs="+")
    ap.add_argument("-p", "--provider", action="append")
    ap.add_argument("--fault-dir", required=True, help="the directory of libcompcntrfault-fi.so")
    ap.add_argument("--hook-dir", help="the directory of libcompcntr-fi.so (not with --layer-dir)")
    ap.add_argument("--layer-dir", help="through ofi_compcntr: the directory of libofi_compcntr-fi.so "
                    "(-p PROVIDER becomes PROVIDER;ofi_compcntr; no compcntr hook)")
    ap.add_argument("--short", action="store_true", help="the CI form: a few sites x 2 codes, 1st call")
    ap.add_argument("--attribute-program", help="with --layer-dir: a program that reaches the same "
                    "setup calls without the layer (cntr_ops); a defect outcome is re-run on it with "
                    "the fault provider alone over the bare provider, and the same outcome there "
                    "makes it libfabric's (nohook-<outcome>)")
    ap.add_argument("--timeout", type=float, default=40, help="per run (a hang detector)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (at most 2 on a shared machine)")
    ap.add_argument("--site", action="append", help="only these sites")
    ap.add_argument("--fault", action="append", metavar="SITE:N:CODE",
                    help="only these faults (regression tests: each must end handled or reported)")
    a = ap.parse_args()
    if not a.hook_dir and not a.layer_dir:
        ap.error("one of --hook-dir, --layer-dir is required")
    if a.hook_dir and a.layer_dir:
        ap.error("--hook-dir and --layer-dir exclude each other (the layer runs without the hook)")
    a.programs = [p for p in a.programs if os.path.isfile(p)]  # a glob's *.p directories out
    providers = a.provider or ["tcp;ofi_rxm"]
    t0 = time.monotonic()
    bad_base = 0
    points = []  # (program, provider, site, call, code)
    bases = {}
    for prog in a.programs:
        for prov in providers:
            st, out, err, rep, secs, stat_lines = one_run(prog, prov, None, a.fault_dir, a.hook_dir,
                                                          a.timeout, layer_dir=a.layer_dir)
            name = os.path.basename(prog).replace("fi_app_", "")
            if st != 0:
                print(f"sweep: {name} -p {prov}: the run without a fault failed (exit {st}):\n{out}{err}")
                bad_base += 1
                continue
            if a.layer_dir:
                problem = check_layer_base(rep, stat_lines, prov)
                if problem:
                    print(f"sweep: {name} -p {prov};ofi_compcntr: {problem}")
                    bad_base += 1
                    continue
            bases[(prog, prov)] = out
            calls = {}
            for _, site, n in SITE_RE.findall(rep):
                calls[site] = max(calls.get(site, 0), int(n))
            table = (LAYER_SHORT if a.layer_dir else SHORT) if a.short else CODES
            if a.fault:
                for f in a.fault:
                    site, nth, code = f.split(":")
                    points.append((prog, prov, site, int(nth), code))
            for site, n in sorted(calls.items()) if not a.fault else []:
                if site not in table or (a.site and site not in a.site):
                    continue
                nths = [1] if a.short or n <= 2 else [1, (n + 1) // 2]
                for code in table[site]:
                    for nth in nths:
                        points.append((prog, prov, site, nth, code))
            print(f"sweep: {name} -p {prov}{';ofi_compcntr' if a.layer_dir else ''}: {len(calls)} sites reached "
                  f"({', '.join(f'{s} {n}' for s, n in sorted(calls.items()))})")
    sys.stdout.flush()

    nohook_bases = {}

    def do(p):
        prog, prov, site, nth, code = p
        fault = f"{site}:{nth}:{code}"
        st, out, err, rep, secs, _ = one_run(prog, prov, fault, a.fault_dir, a.hook_dir, a.timeout,
                                             layer_dir=a.layer_dir)
        res = classify(code, st, out, err, rep, bases[(prog, prov)])
        detail = ""
        if res in DEFECTS:
            detail = "\n    " + "\n    ".join((out + err).strip().splitlines()[-8:])
        # Value faults (short, lag, wrap32) change what a program without the hook reads itself;
        # the hook's counters are meant to absorb them: no attribution run, a defect is compcntr's.
        # Through ofi_compcntr there is no run without compcntr: the programs ask for what only
        # the layer gives over these providers (FI_TRIGGER, deferred work, FI_RMA_EVENT).
        if res in DEFECTS and code not in VALUE_CODES and a.layer_dir and a.attribute_program:
            # The same fault on a program that needs no layer, with no compcntr code loaded.
            aprog = a.attribute_program
            if (aprog, prov) not in nohook_bases:
                nohook_bases[(aprog, prov)] = one_run(aprog, prov, None, a.fault_dir, None,
                                                      a.timeout, hook=False)[1]
            st2, out2, err2, rep2, _, _ = one_run(aprog, prov, fault, a.fault_dir, None, a.timeout,
                                                  hook=False)
            res2 = classify(code, st2, out2, err2, rep2, nohook_bases[(aprog, prov)])
            if res2 == res:
                res = "nohook-" + res
                detail = (f" (without ofi_compcntr or any compcntr code, "
                          f"{os.path.basename(aprog)}: {res2})" + detail)
        elif res in DEFECTS and code not in VALUE_CODES and not a.layer_dir:
            if (prog, prov) not in nohook_bases:
                nohook_bases[(prog, prov)] = one_run(prog, prov, None, a.fault_dir, a.hook_dir,
                                                     a.timeout, hook=False)[1]
            st2, out2, err2, rep2, _, _ = one_run(prog, prov, fault, a.fault_dir, a.hook_dir,
                                               a.timeout, hook=False)
            res2 = classify(code, st2, out2, err2, rep2, nohook_bases[(prog, prov)])
            if res2 == res:
                res = "nohook-" + res
                detail = f" (without the compcntr hook: {res2})" + detail
        return p, res, secs, detail

    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(a.jobs, 2))) as ex:
        for p, res, secs, detail in ex.map(do, points):
            results.append((p, res))
            prog, prov, site, nth, code = p
            name = os.path.basename(prog).replace("fi_app_", "")
            print(f"| {name} | {prov}{';ofi_compcntr' if a.layer_dir else ''} | {site} | {nth} | {code} | {res} | {secs:.1f} s |{detail}")
            sys.stdout.flush()

    counts = {}
    for _, r in results:
        counts[r] = counts.get(r, 0) + 1
    sites = len({(p[0], p[1], p[2]) for p, _ in results})
    defects = sum(counts.get(d, 0) for d in DEFECTS)
    if a.fault:  # regression tests: no excuse, every fault handled, counted or reported
        defects = sum(1 for _, r in results if r not in ("handled", "reported", "counted"))
    summary = ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    print(f"sweep: {len(a.programs)} programs x {len(providers)} providers, {sites} call sites, "
          f"{len(results)} faults injected: {summary or 'none'}; {defects} defect outcomes, "
          f"{bad_base} failed runs without a fault; {time.monotonic() - t0:.0f} s")
    return 1 if defects or bad_base else 0


if __name__ == "__main__":
    sys.exit(main())
