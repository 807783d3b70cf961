#!/usr/bin/env python3
"""Runs examples/runtime under mpirun and asserts its exit code and printed checks.

usage: run_runtime.py MPIRUN PROGRAM NP EXPECT [program args...]
  EXPECT  pass            exit 0, every check line PASS, the exact message and write totals,
                          every rank's local / remote peer counts (all peers local on one
                          node, np/2 - 1 + np/2 on two hosts, K - 1 + np - K with
                          --ranks-per-node K, 0 local with --no-node-shm), and its RMA writes
                          each way (shared-memory puts = writes x local peers, also counted
                          landed by their targets; libfabric writes = writes x remote peers),
                          "runtime: all checks passed"
          pass:longer=S   the same, for a run meant to outlast S seconds (a watchdog shorter
                          than the run); a run that was over sooner exercised nothing and is
                          reported as skipped (exit 77), not passed
          fail:<text>     a non-zero exit, <text> in the output, and the run bounded in time

          killed:<text>   the job does not end by itself within the limit: the runner ends it,
                          <text> is in the output, and no process of the job survives

  --two-hosts (before the program arguments): run the job across two simulated hosts, network
  namespaces this runner creates (cc<pid>a, cc<pid>b; the second host's processes also get a UTS
  namespace with its own host name, as Open MPI keys its session files by host name) joined by a veth pair with addresses of
  their own (198.18.<x>.1 and .2, the benchmarking range of RFC 2544; nothing else is ever
  addressed), half of the ranks in each; mpirun runs in the first and starts its daemon in the
  second through an rsh agent that enters that namespace. Torn down on every exit path (also on
  SIGTERM/SIGINT). Where namespaces cannot be created (no root, no CAP_NET_ADMIN, no iproute2)
  the test is skipped (exit 77) with the reason.

After every run (passed, failed or killed) no shared-memory segment of the job's nodes may be
left: neither a node device (/dev/shm/compcntr.ccrt-*) nor a node's RMA windows
(/dev/shm/ccrt-rma.*; examples/runtime's "Ranks of one node"): the runtime removes their names
as soon as every rank of the node has opened (mapped) them, so even a job ended by MPI_Abort or
SIGKILL leaves none.

Every run is bounded (a hung job is killed and fails the test): mpirun runs in a session of its
own; past the limit (90 s, or --runner-limit S before the program arguments) it gets SIGTERM
(it then kills its ranks), and after a grace period every process left in the session gets
SIGKILL. After every run the session must be empty: a rank that outlives mpirun (orphaned, still
spinning on a core of the CI machine) fails the test. mpirun runs as root with
--allow-run-as-root when needed and oversubscribes the machine's cores (2 here) on purpose.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


class TwoHosts:
    """Two network namespaces joined by a veth pair, and the files mpirun needs to span them."""

    def __init__(self, np_):
        tag = os.getpid() % 100000
        self.ns = [f'cc{tag}a', f'cc{tag}b']
        net = 18 + (os.getpid() % 2)   # 198.18.0.0/15: 198.18.x or 198.19.x
        sub = os.getpid() % 250
        self.addrs = [f'198.{net}.{sub}.1', f'198.{net}.{sub}.2']
        self.dir = tempfile.mkdtemp(prefix='cc-two-hosts-')
        self.created = []
        self.np = np_

    def ip(self, *args):
        r = subprocess.run(['ip'] + list(args), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f'ip {" ".join(args)}: {r.stderr.strip()}')

    def up(self):
        for n in self.ns:
            self.ip('netns', 'add', n)
            self.created.append(n)
        self.ip('link', 'add', 'ccnet0', 'netns', self.ns[0], 'type', 'veth', 'peer', 'name',
                'ccnet0', 'netns', self.ns[1])
        for n, a in zip(self.ns, self.addrs):
            self.ip('-n', n, 'addr', 'add', a + '/24', 'dev', 'ccnet0')
            self.ip('-n', n, 'link', 'set', 'ccnet0', 'up')
            self.ip('-n', n, 'link', 'set', 'lo', 'up')
        # A link set up is running only once the kernel's link watch has run (up to a second
        # later, more on a loaded machine): until then libfabric's tcp lists no address on it
        # and a rank falls back to 127.0.0.1 (the second host's ranks then fail to connect,
        # 13 runs of 15 in one series). Both ends running before mpirun starts (a condition
        # polled, bounded at 20 s).
        deadline = time.monotonic() + 20
        for n in self.ns:
            while True:
                r = subprocess.run(['ip', 'netns', 'exec', n, 'cat',
                                    '/sys/class/net/ccnet0/operstate'],
                                   capture_output=True, text=True)
                if r.stdout.strip() == 'up':
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f'ccnet0 in {n} is not running after 20 s '
                                       f'(operstate {r.stdout.strip() or r.stderr.strip()})')
                time.sleep(0.05)   # polling the kernel's state, not waiting a guessed time
        agent = os.path.join(self.dir, 'agent.sh')
        with open(agent, 'w') as f:
            f.write('#!/bin/sh\n# rsh agent: "agent [options] HOST COMMAND..." runs COMMAND in HOST\'s'
                    ' namespace\n'
                    'while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done\n'
                    'host=$1; shift\ncase "$host" in\n' +
                    ''.join(f'  {a}) ns={n};;\n' for n, a in zip(self.ns, self.addrs)) +
                    '  *) echo "agent: unknown host $host" >&2; exit 1;;\nesac\n'
                    '# a UTS namespace and a host name of its own: Open MPI names its session\n'
                    '# directory and shared-memory segments after the host name, and the two\n'
                    '# simulated hosts share /tmp and /dev/shm\n'
                    'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns; $*"\n')
        os.chmod(agent, 0o755)
        hosts = os.path.join(self.dir, 'hosts')
        with open(hosts, 'w') as f:
            for a in self.addrs:
                f.write(f'{a} slots={self.np // 2}\n')
        return agent, hosts

    def down(self):
        for n in reversed(self.created):   # deleting a namespace deletes its veth end too
            subprocess.run(['ip', 'netns', 'del', n], capture_output=True)
        self.created = []
        shutil.rmtree(self.dir, ignore_errors=True)


def arg_value(args, name, default):
    return int(args[args.index(name) + 1]) if name in args else default


def session_members(sid):
    """PIDs of the live processes of session `sid` (Open MPI puts each rank in a process group
    of its own, but they stay in mpirun's session)."""
    pids = []
    for d in os.listdir('/proc'):
        if not d.isdigit():
            continue
        try:
            with open(f'/proc/{d}/stat') as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(')') + 2:].split()   # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != 'Z':
            pids.append(int(d))
    return pids


def kill_session(sid, grace):
    """SIGKILL for whatever is left in the session after `grace` seconds; returns the PIDs that
    were still alive then."""
    end = time.monotonic() + grace
    left = session_members(sid)
    while left and time.monotonic() < end:
        time.sleep(0.1)   # polling for exits, not synchronisation: bounded by `grace`
        left = session_members(sid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


SEGMENTS = '/dev/shm'


# examples/runtime's segments: node devices (compcntr.ccrt-<job>-<leader>) and the nodes' RMA
# windows (ccrt-rma.<job>-<leader>)
SEGMENT_PREFIXES = ('compcntr.ccrt-', 'ccrt-rma.')


def node_segments():
    """Names of examples/runtime's node segments now in /dev/shm."""
    try:
        return {f for f in os.listdir(SEGMENTS) if f.startswith(SEGMENT_PREFIXES)}
    except OSError:
        return set()


def left_segments(before):
    """Segments that appeared during the run and are still there a second later (another job
    running at the same time removes its own within milliseconds of creating it)."""
    new = node_segments() - before
    if new:
        time.sleep(1)
        new &= node_segments()
    return sorted(new)


def main():
    mpirun, prog, np_, expect = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    args = sys.argv[5:]
    limit = 90
    if '--runner-limit' in args:   # the runner's, not the program's
        k = args.index('--runner-limit')
        limit, args = float(args[k + 1]), args[:k] + args[k + 2:]
    two = None
    if '--two-hosts' in args:
        args = [a for a in args if a != '--two-hosts']
        if shutil.which('ip') is None:
            print('SKIP: two simulated hosts need iproute2 (ip) for network namespaces')
            return 77
        two = TwoHosts(np_)

        def on_signal(signum, _frame):
            two.down()
            sys.exit(128 + signum)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            agent, hosts = two.up()
        except RuntimeError as e:
            two.down()
            print(f'SKIP: cannot create the two simulated hosts\' network namespaces: {e}')
            return 77
    try:
        return run(mpirun, prog, np_, expect, args, limit, two)
    finally:
        if two is not None:
            two.down()


def run(mpirun, prog, np_, expect, args, limit, two):
    cmd = []
    if two is not None:
        agent, hosts = os.path.join(two.dir, 'agent.sh'), os.path.join(two.dir, 'hosts')
        cmd = ['ip', 'netns', 'exec', two.ns[0], mpirun, '--hostfile', hosts,
               '--mca', 'plm_rsh_agent', agent, '--mca', 'oob_tcp_if_include', 'ccnet0',
               '--mca', 'btl_tcp_if_include', 'ccnet0', '-x', 'FI_TCP_IFACE=ccnet0']
        # libfabric's logging, when asked for, reaches the ranks of the second host too
        cmd += [a for v in ('FI_LOG_LEVEL', 'FI_LOG_PROV') if v in os.environ for a in ('-x', v)]
    else:
        cmd = [mpirun]
    if os.geteuid() == 0:
        cmd.append('--allow-run-as-root')
    cmd += ['--oversubscribe', '--bind-to', 'none', '-np', str(np_), prog] + args
    print(' '.join(cmd))
    segs_before = node_segments()
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True,
                         env=dict(os.environ, OMPI_MCA_btl_base_warn_component_unused='0'))
    hung = False
    try:
        raw, _ = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        hung = True
        p.send_signal(signal.SIGTERM)   # mpirun forwards it and kills its ranks
        try:
            raw, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            raw, _ = p.communicate()
    dt = time.monotonic() - t0
    # mpirun is gone: nothing of its job may be left (a rank orphaned by mpirun's death keeps
    # running, on a CI machine's core, until its own watchdog, if ever).
    survivors = kill_session(p.pid, 5)
    out = raw.decode(errors='replace')
    print(out)
    print(f'exit code {p.returncode} after {dt:.1f} s' + (' (ended by the runner)' if hung else ''))
    problems = []
    leaked = left_segments(segs_before)
    if leaked:
        problems.append(f'{len(leaked)} node segment(s) left in {SEGMENTS}: '
                        f'{", ".join(leaked)} (removed now)')
        for f in leaked:
            try:
                os.unlink(os.path.join(SEGMENTS, f))
            except OSError:
                pass
    if survivors:
        problems.append(f'{len(survivors)} process(es) of the job outlived mpirun (killed now): '
                        f'{survivors}')
    if hung and not expect.startswith('killed:'):
        problems.append(f'the job did not finish within {limit} s (a hang)')
    longer = None
    if expect.startswith('pass:longer='):
        longer = float(expect.split('=', 1)[1])
        expect = 'pass'
    if expect == 'pass':
        if p.returncode != 0:
            problems.append(f'exit code {p.returncode}, expected 0')
        checks = re.findall(r'^  check: (.*)  (PASS|FAIL)$', out, re.M)
        flow = '--no-flow' not in args
        want = 5 if flow else 4
        if len(checks) != want:
            problems.append(f'{len(checks)} check lines, expected {want}')
        for text, verdict in checks:
            if verdict != 'PASS':
                problems.append(f'check failed: {text}')
        msgs = arg_value(args, '--msgs', 20000)
        writes = arg_value(args, '--writes', 256)
        total = msgs * np_ * (np_ - 1)
        if f'({total} of {total}, bad 0, duplicates 0, missing 0' not in out:
            problems.append(f'the delivery line does not say {total} of {total} with nothing bad')
        m = re.search(r'RMA writes finished by quiet\(\) and landed \((\d+) writes: (\d+) '
                      r'shared-memory puts, (\d+) counted landed by their targets, (\d+) '
                      r'libfabric writes; window bytes wrong 0, quiet EIO 0\)  PASS$', out, re.M)
        if not m or int(m.group(1)) != writes * np_ * (np_ - 1):
            problems.append('the RMA line does not report every write landed')
        elif int(m.group(2)) + int(m.group(4)) != int(m.group(1)) or m.group(2) != m.group(3):
            problems.append(f'the RMA line: {m.group(2)} puts + {m.group(4)} libfabric writes, '
                            f'{m.group(3)} puts landed, of {m.group(1)} writes')
        if flow and 'violations 0; truncation / error completions 0)' not in out:
            problems.append('the posted-buffer line is not clean')
        rows = re.findall(r'^  (\d+) +(\d+) +(\d+) +\d+ +(\d+)/(\d+) ', out, re.M)
        if len(rows) != np_:
            problems.append(f'{len(rows)} rows in the per-rank table, expected {np_}')
        for r, sent, received, infl, win in rows:
            if int(sent) != msgs * (np_ - 1) or int(received) != msgs * (np_ - 1):
                problems.append(f'rank {r}: sent {sent} / received {received}, expected {msgs * (np_ - 1)}')
            if flow and not 0 < int(infl) <= int(win):
                problems.append(f'rank {r}: {infl} in flight for a window of {win}')
        # node awareness: peers on this rank's node get credits by shared counters, the others
        # by libfabric messages (--no-node-shm: all by messages; two hosts: np/2 ranks each)
        if '--no-node-shm' in args:
            want_local = 0
        elif '--ranks-per-node' in args:   # simulated nodes of K ranks (np a multiple of K)
            want_local = arg_value(args, '--ranks-per-node', 0) - 1
        elif two is not None:
            want_local = np_ // 2 - 1
        else:
            want_local = np_ - 1
        peers = re.findall(r'^  rank (\d+) peers: (\d+) local \((\d+) credits returned by '
                           r'(\d+) shared-counter increments\), (\d+) remote \((\d+) credits '
                           r'by (\d+) libfabric messages\)$', out, re.M)
        if len(peers) != np_:
            problems.append(f'{len(peers)} per-rank peer lines, expected {np_}')
        for r, loc, cl, incs, rem, cr, cmsgs in peers:
            if (int(loc), int(rem)) != (want_local, np_ - 1 - want_local):
                problems.append(f'rank {r}: {loc} local + {rem} remote peers, expected '
                                f'{want_local} + {np_ - 1 - want_local}')
            # every message received is a credit returned: its peer's kind says how
            if flow and (int(cl), int(cr)) != (msgs * int(loc), msgs * int(rem)):
                problems.append(f'rank {r}: credits {cl} by shared counters + {cr} by messages, '
                                f'expected {msgs * int(loc)} + {msgs * int(rem)}')
            if flow and ((int(incs) > 0) != (int(loc) > 0) or (int(cmsgs) > 0) != (int(rem) > 0)):
                problems.append(f'rank {r}: {incs} increments / {cmsgs} credit messages for '
                                f'{loc} local / {rem} remote peers')
        # RMA: a write to a peer on this rank's node is a shared-memory put (counted landed by
        # that peer's shared counter), to any other an fi_write; exact counts per rank, both
        # kinds present when the rank has both kinds of peers
        rma = re.findall(r'^  rank (\d+) RMA: (\d+) shared-memory puts to local peers \((\d+) of '
                         r'theirs counted landed here\), (\d+) libfabric writes to remote '
                         r'peers$', out, re.M)
        if len(rma) != np_:
            problems.append(f'{len(rma)} per-rank RMA lines, expected {np_}')
        for r, puts, landed, fiw in rma:
            loc = want_local   # what the options imply
            want = (writes * loc, writes * loc, writes * (np_ - 1 - loc))
            if (int(puts), int(landed), int(fiw)) != want:
                problems.append(f'rank {r}: {puts} shared-memory puts ({landed} landed here), '
                                f'{fiw} libfabric writes; expected {want[0]} ({want[1]}), '
                                f'{want[2]}')
            if writes and loc and (np_ - 1 - loc) and not (int(puts) and int(fiw)):
                problems.append(f'rank {r} has local and remote peers but not both kinds of '
                                f'writes')
        if 'runtime: all checks passed' not in out:
            problems.append('no "runtime: all checks passed" line')
    elif expect.startswith('fail:'):
        text = expect[5:]
        if p.returncode == 0:
            problems.append('exit code 0, expected the job to fail')
        if text not in out:
            problems.append(f'"{text}" not in the output')
        if 'runtime: all checks passed' in out:
            problems.append('a failed job claims all checks passed')
    elif expect.startswith('killed:'):
        text = expect[7:]
        if not hung:
            problems.append(f'the job ended by itself (exit code {p.returncode}) within {limit} s')
        if text not in out:
            problems.append(f'"{text}" not in the output')
    else:
        problems.append(f'unknown EXPECT {expect}')
    for pr in problems:
        print('FAIL:', pr)
    if problems:
        return 1
    if longer is not None:
        m = re.search(r'RMA writes of \d+ B per pair, ([0-9.]+) s$', out, re.M)
        wall = float(m.group(1)) if m else 0.0
        if wall <= longer:
            print(f'SKIP: the run took {wall:.2f} s, not longer than {longer} s: nothing exercised')
            return 77
        print(f'the run took {wall:.2f} s, longer than {longer} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
