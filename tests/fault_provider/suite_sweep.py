#!/usr/bin/env python3
"""The fault sweep of the hook's doctest suite (issue 22): every TEST_CASE of
fabric_integration/hook/tests/hook_test.cpp on every provider it uses, under the compcntr hook with
the fault provider beneath it (FI_HOOK='compcntr_fault;compcntr'), one fault at each call site in
turn.

How a provider is chosen. The suite has no provider filter: each test case loops over the four
providers (fi_pair.hpp's providers()) in ONE process, and some use one or two of them only. The
fault provider installs itself only on the fabrics COMPCNTR_FAULT_PROV names, and counts and fails
only the calls made on those fabrics' objects, so a run of one test case (doctest --test-case) with
COMPCNTR_FAULT_PROV=<top provider of P> (sweep.py's TOP: ofi_rxm, ofi_rxd, shm, sockets) faults P
and leaves the other providers' iterations alone. A run without a fault gives the sites P reached
in that test case and their calls (a test case that never opens P reports none: not swept on P).

For every test case x provider:
  1. a run without a fault: it must pass; the fault provider's report gives the sites and calls;
  2. for every site reached, every code of sweep.py's CODES (--short: SHORT) that applies, and the
     1st call (with --middle also the middle one): one run with COMPCNTR_FAULT=site:n:code,
     classified as one of
       handled      the test case passes (retried, absorbed, or counted as the test expects)
       reported     it fails, and its first failed assertion names the injected code: the values
                    doctest prints for the expression hold the code's number as a whole token
                    (-5 for -FI_EIO, -11 for -FI_EAGAIN, -259 for -FI_EAVAIL, ...), or the
                    assertion's message / logged context holds that number, FI_<CODE> or its
                    fi_strerror text ("Input/output error", as pair::open's "fi_ep_bind(av):
                    Input/output error"); for EAVAIL / ETRUNC also the made-up error entry's
                    code and -FI_EAVAIL (sweep.names_of). The source text of the expression
                    ("== -FI_ETIMEDOUT") is not looked at. The failure is in the faulted
                    provider's iteration (its "provider P" context, when there is one).
       not-reached  the fault provider injected nothing
     or a defect:
       hang         killed by --timeout
       crash        ended by a signal (doctest's "test case CRASHED", libfabric's "terminated with
                    signal", a negative exit status)
       asan         a sanitizer report (an ASan+UBSan build: build-asan)
       differs      it fails and the first failed assertion does not name the code (a wrong,
                    lost or doubled count, or the test's own expectation under the fault), or it
                    fails in another provider's iteration, or it threw
  3. a defect outcome of a fault that is not a value fault (short, lag, wrap32) is run again
     without the compcntr hook: FI_HOOK=COMPCNTR_FAULT (libfabric matches hook names without
     case; the test's hooked() looks for "compcntr" with case, so the test asserts its plain
     expectations, those of hook_semantics_plain) with the fault provider alone. The same outcome
     there (for differs: the same first failed assertion) makes it not compcntr's:
     "nohook-<outcome>" (libfabric's answer to the fault, or the test's own expectation under it;
     noted, the exit status ignores it). A value fault's defect is compcntr's (the hook's
     counters are meant to absorb them) unless the table KNOWN says why not.

Usage:
  suite_sweep.py --test BUILD/fabric_integration/hook/tests/hook_test --fault-dir DIR --hook-dir DIR
                 [-p PROVIDER]... [-t TESTCASE]... [--short] [--middle] [--progress-thread]
  suite_sweep.py ... -t TESTCASE -p PROVIDER --fault SITE:N:CODE ...   only these faults (the
                 regression tests): each must end handled or reported
-t takes a test case's name or a prefix of it (doctest's wildcards * and ? too).
Exit status: 0 no compcntr defect outcome, 1 any (or a failed run without a fault).
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402  (CODES, SHORT, TOP, VALUE_CODES, ERRNO, names_of, SITE_RE, INJ_RE, fi_run)
from runtime_sweep import STRERROR  # noqa: E402  (fi_strerror's texts of the codes)

fi_run = sweep.fi_run
DEFECTS = ("hang", "crash", "asan", "differs")
# Test cases x providers not swept, with the reason (their run without a fault fails under the
# fault provider for a reason that is not compcntr's).
KNOWN_BROKEN = {}
# Faults whose defect outcome is libfabric's, shown by other test cases without the hook, for the
# test cases that run only hooked (their run without the hook reaches nothing to compare):
# (provider, site, call) -> the reason. The outcome becomes "nohook-<outcome>" with the reason.
KNOWN_NOHOOK = {
    ("tcp;ofi_rxm", "ep_bind", 1):
        "rxm crashes in fi_close of an endpoint whose first fi_ep_bind (the AV) failed, with and "
        "without the hook (docs/reliability.md; every other test case's ep_bind:1 row on "
        "tcp;ofi_rxm is nohook-crash)",
}
# The CI form: test cases x providers (prefixes of the names) for --short without -t / -p.
SHORT_CASES = [
    ("counters count every operation", "tcp;ofi_rxm"),
    ("fi_cntr_add, set, adderr and seterr", "sockets"),
]

FAIL_RE = re.compile(r"^(\S+:\d+): (ERROR|FATAL ERROR): (.*)$")
PROV_RE = re.compile(r"\bprovider (" + "|".join(re.escape(p) for p in fi_run.PROVIDERS) + r")")


def list_cases(test):
    """The test cases' names, in doctest's order."""
    st, out, err, _ = fi_run.run([test, "--list-test-cases"], dict(os.environ), 60)
    if st != 0:
        sys.exit(f"suite_sweep: {test} --list-test-cases failed ({st}):\n{out}{err}")
    names, inside = [], False
    for line in out.splitlines():
        if line.startswith("====="):
            inside = not inside
            continue
        if inside and line.strip():
            names.append(line)
    return names


def doctest_filter(name):
    """A --test-case filter that selects exactly `name`: doctest splits filters at ','."""
    return name.replace(",", "?")


def one_run(a, case, provider, fault, hook=True):
    """One run of one test case; (status, out, err, report, seconds)."""
    fd, report = tempfile.mkstemp(prefix="suite_fault_report_", dir=a.tmp)
    os.close(fd)
    env = {k: v for k, v in os.environ.items()
           if k not in fi_run.CLEAN and not k.startswith("COMPCNTR_FAULT")}
    env.update(COMPCNTR_FAULT_REPORT=report, COMPCNTR_FAULT_PROV=sweep.TOP.get(provider, provider),
               COMPCNTR_FI_PROGRESS_THREAD="1" if a.progress_thread else "",
               FI_PROVIDER_PATH=f"{a.fault_dir}:{a.hook_dir}" if hook else a.fault_dir,
               FI_HOOK="compcntr_fault;compcntr" if hook else "COMPCNTR_FAULT")
    if fault:
        env["COMPCNTR_FAULT"] = fault
    try:
        status, out, err, secs = fi_run.run([a.test, "--test-case=" + doctest_filter(case)], env,
                                            a.timeout)
        with open(report) as f:
            rep = f.read()
    finally:
        os.unlink(report)
    return status, out, err, rep, secs


def failures(out):
    """doctest's failed assertions in order: (location, head line, [values and logged lines])."""
    found, cur = [], None
    for line in out.splitlines():
        m = FAIL_RE.match(line)
        if m:
            cur = (m.group(1), m.group(3), [])
            found.append(cur)
        elif cur is not None and line.startswith("  "):
            cur[2].append(line.strip())
        elif cur is not None and not line.strip():
            cur = None
    return found


def names_code(code, lines):
    """Whether the values / logged lines of a failed assertion name `code`."""
    nums = [sweep.ERRNO[code]] if code in sweep.ERRNO else []
    texts = [n for n in sweep.names_of(code) if not n.startswith("= ")]
    if code == "EAVAIL":
        nums.append(sweep.ERRNO["EIO"])  # the made-up error entry's err
        texts.append(STRERROR["EIO"])
    if code == "ETRUNC":
        nums.append(sweep.ERRNO["EAVAIL"])  # the read that announced the entry
        texts.append(STRERROR["EAVAIL"])
    if code in STRERROR:
        texts.append(STRERROR[code])
    for line in lines:
        if any(re.search(r"(?<![\w.])-%d(?![\w.])" % n, line) for n in nums):
            return True
        if any(t in line for t in texts):
            return True
    return False


def classify(code, provider, status, out, err, rep):
    """(outcome, the first failed assertion or a reason)."""
    text = out + err
    if (isinstance(status, int) and status < 0) or "test case CRASHED" in out \
            or "terminated with signal" in text:
        return "crash", next((l for l in text.splitlines() if "CRASHED" in l or "signal" in l), "")
    if re.search(r"AddressSanitizer|LeakSanitizer|runtime error:", text):
        return "asan", next(l for l in text.splitlines()
                            if re.search(r"Sanitizer|runtime error:", l))
    if status == "timeout":
        return "hang", f"killed after the timeout"
    injected = bool(sweep.INJ_RE.search(rep))
    if status == 0:
        return ("handled" if injected else "not-reached"), ""
    fails = failures(out)
    if not fails:
        return "differs", f"exit {status} without a failed assertion"
    loc, head, lines = fails[0]
    where = f"{loc}: {head} | " + " | ".join(lines)
    if "THREW exception" in head:
        return "differs", where
    provs = PROV_RE.findall(" ".join(lines))
    if provs and provs[0] != provider:
        return "differs", "in another provider's iteration: " + where
    if not injected:
        return "differs", "no fault injected: " + where
    return ("reported" if names_code(code, lines) else "differs"), where


def first_location(detail):
    m = re.search(r"(\S+:\d+): ", detail)
    return m.group(1) if m else detail


def short_name(case, n=44):
    return case if len(case) <= n else case[:n - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test", required=True, help="the hook_test executable")
    ap.add_argument("--fault-dir", required=True, help="the directory of libcompcntrfault-fi.so")
    ap.add_argument("--hook-dir", required=True, help="the directory of libcompcntr-fi.so")
    ap.add_argument("-p", "--provider", action="append")
    ap.add_argument("-t", "--test-case", action="append", help="a test case (its name or a prefix)")
    ap.add_argument("--short", action="store_true", help="the CI form: SHORT_CASES, sweep.SHORT, 1st call")
    ap.add_argument("--middle", action="store_true", help="also the middle call of each site")
    ap.add_argument("--progress-thread", action="store_true", help="COMPCNTR_FI_PROGRESS_THREAD=1")
    ap.add_argument("--site", action="append", help="only these sites")
    ap.add_argument("--fault", action="append", metavar="SITE:N:CODE",
                    help="only these faults (regression tests: each must end handled or reported)")
    ap.add_argument("--timeout", type=float, default=60, help="per run (a hang detector)")
    a = ap.parse_args()
    for attr in ("test", "fault_dir", "hook_dir"):
        setattr(a, attr, os.path.abspath(getattr(a, attr)))
    t0 = time.monotonic()
    names = list_cases(a.test)

    def pick(prefix):
        hits = [n for n in names if n == prefix] or [n for n in names if n.startswith(prefix)] or \
               [n for n in names if re.fullmatch(re.escape(prefix).replace(r"\*", ".*")
                                                 .replace(r"\?", "."), n)]
        if len(hits) != 1:
            sys.exit(f"suite_sweep: -t {prefix!r} matches {len(hits)} test cases")
        return hits[0]

    if a.test_case or a.provider or not a.short:
        cases = [pick(t) for t in a.test_case] if a.test_case else names
        combos = [(c, p) for c in cases for p in (a.provider or fi_run.PROVIDERS)]
    else:
        combos = [(pick(t), p) for t, p in SHORT_CASES]
    table = sweep.SHORT if a.short else sweep.CODES
    # Runs in a directory of their own: libfabric's crash handler writes *.btr files to the cwd.
    a.tmp = tempfile.mkdtemp(prefix="suite_sweep_")
    os.chdir(a.tmp)
    points, bad_base, swept, excluded = [], 0, 0, 0
    try:
        for case, prov in combos:
            if (case, prov) in KNOWN_BROKEN:
                print(f"suite_sweep: not swept: {short_name(case)} on {prov}: {KNOWN_BROKEN[(case, prov)]}")
                excluded += 1
                continue
            st, out, err, rep, secs = one_run(a, case, prov, None)
            calls = {}
            for _, site, n in sweep.SITE_RE.findall(rep):
                calls[site] = max(calls.get(site, 0), int(n))
            if st != 0:
                print(f"suite_sweep: {case} on {prov}: the run without a fault failed (exit {st}):\n"
                      + "\n".join((out + err).strip().splitlines()[-12:]))
                bad_base += 1
                continue
            if not calls:
                continue  # the test case does not use this provider
            swept += 1
            print(f"suite_sweep: {short_name(case)} on {prov}: {len(calls)} sites "
                  f"({', '.join(f'{s} {n}' for s, n in sorted(calls.items()))}); {secs:.1f} s")
            if a.fault:
                for f in a.fault:
                    site, nth, code = f.split(":")
                    points.append((case, prov, site, int(nth), code))
                continue
            for site, n in sorted(calls.items()):
                if site not in table or (a.site and site not in a.site):
                    continue
                nths = [1] + ([(n + 1) // 2] if a.middle and not a.short and n > 2 else [])
                for code in table[site]:
                    for nth in nths:
                        points.append((case, prov, site, nth, code))
        sys.stdout.flush()

        plain_base = {}
        counts, causes = {}, {}
        for case, prov, site, nth, code in points:
            fault = f"{site}:{nth}:{code}"
            st, out, err, rep, secs = one_run(a, case, prov, fault)
            res, detail = classify(code, prov, st, out, err, rep)
            if res in DEFECTS and code not in sweep.VALUE_CODES:
                if (case, prov) not in plain_base:
                    plain_base[(case, prov)] = one_run(a, case, prov, None, hook=False)[0]
                if plain_base[(case, prov)] == 0:
                    st2, out2, err2, rep2, _ = one_run(a, case, prov, fault, hook=False)
                    res2, detail2 = classify(code, prov, st2, out2, err2, rep2)
                    if res2 == res and (res != "differs"
                                        or first_location(detail2) == first_location(detail)):
                        res = "nohook-" + res
                        detail = f"{detail} (without the hook: {detail2})"
                    elif res2 == "not-reached" and (prov, site, nth) in KNOWN_NOHOOK:
                        res = "nohook-" + res
                        detail = f"{detail} (known: {KNOWN_NOHOOK[(prov, site, nth)]})"
                    else:
                        detail = f"{detail} (without the hook: {res2}{': ' + detail2 if detail2 else ''})"
            counts[res] = counts.get(res, 0) + 1
            if res in DEFECTS or res.startswith("nohook-"):
                causes.setdefault(res, []).append((case, prov, fault))
            print(f"| {short_name(case)} | {prov} | {site} | {nth} | {code} | {res} | {secs:.1f} s |"
                  + (f"\n    {detail}" if res in DEFECTS or res.startswith("nohook-") else ""))
            sys.stdout.flush()
    finally:
        os.chdir("/")
        shutil.rmtree(a.tmp, ignore_errors=True)

    defects = sum(counts.get(d, 0) for d in DEFECTS)
    if a.fault:  # regression tests: no excuse, every fault handled or reported
        defects = sum(n for r, n in counts.items() if r not in ("handled", "reported"))
    sites = len({p[:3] for p in points})
    summary = ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    print(f"suite_sweep: {swept} test cases x providers ({excluded} not swept), {sites} call sites, "
          f"{len(points)} faults injected: {summary or 'none'}; {defects} compcntr defect outcomes, "
          f"{bad_base} failed runs without a fault; {time.monotonic() - t0:.0f} s")
    return 1 if defects or bad_base else 0


if __name__ == "__main__":
    sys.exit(main())
