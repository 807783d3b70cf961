/* examples/runtime, RMA + quiet: the RMA phase, shmem_put / shmem_quiet done with compcntr's
 * completion trackers. A write to a rank of another node is an fi_write, counted by the tracker
 * over cc_writes (fed by the CQ bridge on the transmit CQ, FI_WRITE): compcntr_tracker_issue
 * before every fi_write. A write to a rank of this node is a put through shared memory: the
 * node's RMA windows live in one shared segment every rank of the node maps, and the put is a
 * memcpy into the peer's window, then an increment of the peer's counter of this rank's puts
 * landed (the peer waits on it before it checks those bytes) and of cc_puts, the counter of the
 * second tracker (tr_shm), both on the node's shared device. A quiet after every batch of writes
 * to all peers returns once both trackers account for everything issued so far, EIO if a write
 * failed. Then every rank checks its window: the puts of the ranks of its node once their
 * landed counters say all arrived, the writes of the others by polling the bytes while it drives
 * progress (libfabric tells the target nothing).
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

unsigned char rt_rma_byte(uint32_t src, uint32_t dst, uint64_t j, size_t i)
{
	return (unsigned char)(src * 17u + dst * 101u + j * 3u + i * 29u + 5u);
}

/* ---- the node's RMA windows: one shared segment ----------------------------------------- */

/* The RMA windows of the node's ranks, in node-rank order, page-aligned, in the segment
 * /dev/shm/ccrt-rma.<job>-<leader> (job and leader as the node's shared device, counters.c).
 * The leader creates it (O_EXCL, owner-only 0600) and sizes it; the others open it after that
 * and check it is that segment (size, owner, mode); every rank maps it; once all have, the
 * leader removes its name: the memory lives while mapped, and a job that ends by MPI_Abort or
 * a kill leaves nothing in /dev/shm (the discipline of the node's device, docs/shared.md
 * "Removing the name early"). rt->window is this rank's window in it (also registered with
 * libfabric for the ranks of other nodes); peers[p].shm_win that of each local peer p. */
int rt_map_windows(struct rt *rt)
{
	int nn, nrank;
	MPI_Comm_size(rt->node, &nn);
	MPI_Comm_rank(rt->node, &nrank);
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t stride = (rt->window_len + page - 1) / page * page;
	if (stride == 0)
		stride = page;
	const size_t len = stride * (size_t)nn;
	int *world = calloc((size_t)nn, sizeof *world);
	if (!world)
		return rt_fail(rt, "out of memory");
	MPI_Allgather(&rt->rank, 1, MPI_INT, world, 1, MPI_INT, rt->node);
	char name[96];
	snprintf(name, sizeof name, "/ccrt-rma.%" PRIx64 "-%d", rt->job, world[0]);
	const char *what = NULL; /* the call that failed (err: its errno), or why[] */
	char why[160];
	int err = 0, fd = -1;
	if (nrank == 0) {
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0)
			what = "shm_open(O_CREAT | O_EXCL)", err = errno;
		else if (fchmod(fd, 0600)) /* 0600 whatever the umask: what the others check */
			what = "fchmod", err = errno;
		else if (ftruncate(fd, (off_t)len))
			what = "ftruncate", err = errno;
	}
	int ok = what == NULL;
	MPI_Bcast(&ok, 1, MPI_INT, 0, rt->node); /* created and sized before the others open it */
	if (ok && nrank != 0) {
		struct stat st;
		fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
		if (fd < 0)
			what = "shm_open", err = errno;
		else if (fstat(fd, &st))
			what = "fstat", err = errno;
		else if ((size_t)st.st_size != len || st.st_uid != geteuid() ||
		         (st.st_mode & 0777) != 0600) {
			snprintf(
			        why, sizeof why,
			        "not the segment its creator made (size %lld, owner %u, mode %03o; "
			        "expected %zu, %u, 600)",
			        (long long)st.st_size, (unsigned)st.st_uid,
			        (unsigned)st.st_mode & 0777, len, (unsigned)geteuid());
			what = why;
		}
	}
	void *m = MAP_FAILED;
	if (ok && !what &&
	    (m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
		what = "mmap", err = errno;
	if (fd >= 0)
		close(fd); /* the mapping keeps the memory */
	if (!ok && nrank != 0)
		rt_fail(rt, "RMA window segment %s: its creator failed", name);
	else if (what)
		rt_fail(rt, "RMA window segment %s: %s%s%s", name, what, err ? ": " : "",
		        err ? strerror(err) : "");
	int mine = m != MAP_FAILED, all;
	MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, rt->node); /* every rank mapped it */
	if (nrank == 0 && ok && shm_unlink(name)) {
		rt_fail(rt, "RMA window segment %s: shm_unlink: %s", name, strerror(errno));
		all = 0;
	}
	if (mine) {
		rt->wseg = m;
		rt->wseg_len = len;
	}
	if (all) {
		rt->window = rt->wseg + (size_t)nrank * stride;
		for (int k = 0; k < nn; k++)
			if (k != nrank)
				rt->peers[world[k]].shm_win = rt->wseg + (size_t)k * stride;
	}
	free(world);
	return all ? 0 : -1;
}

void rt_unmap_windows(struct rt *rt)
{
	if (rt->wseg)
		munmap(rt->wseg, rt->wseg_len);
	rt->wseg = NULL;
}

/* ---- writes ----------------------------------------------------------------------------- */

int rt_post_write(struct rt *rt, int dst, uint64_t j)
{
	struct peer *p = &rt->peers[dst];
	const struct rt_opts *o = &rt->o;
	char *from = rt->src + ((size_t)dst * o->writes + j) * o->wsize;
	const uint64_t to = p->win_addr + ((uint64_t)rt->rank * o->writes + j) * o->wsize;
	compcntr_tracker_issue(rt->tr, 1); /* before the post: a quiet after it waits for it */
	ssize_t r;
	const double deadline = now_s() + o->timeout_ms / 1e3;
	while ((r = fi_write(rt->ep, from, o->wsize, rt->srcdesc, p->addr, to, p->win_key,
	                     &p->wctx[j])) == -FI_EAGAIN) {
		if (rt_progress_n(rt) == 0)
			sched_yield();
		if (now_s() > deadline)
			return rt_fail(rt, "fi_write to rank %d kept returning -FI_EAGAIN", dst);
	}
	if (r)
		return rt_fail(rt, "fi_write(rank %d): %s", dst, fi_strerror((int)-r));
	rt->writes_posted++;
	rt->st.writes++;
	rt->st.fi_writes++;
	return 0;
}

/* A put to a rank of this node: the bytes go straight into its window (mapped here), then two
 * increments, in this order. The peer's landed counter first: the increment is a seq_cst RMW,
 * so it releases the memcpy before it, and the peer's wait on that counter (acquire) that sees
 * it sees the bytes (docs/shared.md, "Memory ordering"). Then this rank's cc_puts: the put is
 * complete, visible at its target, and a quiet (tr_shm) that waits for it returns after both.
 * The copy is synchronous, so that quiet finds everything done; the tracker keeps one contract
 * for both ways ("everything issued is accounted for"). */
static int put_shm(struct rt *rt, int dst, uint64_t j)
{
	struct peer *p = &rt->peers[dst];
	const struct rt_opts *o = &rt->o;
	const char *from = rt->src + ((size_t)dst * o->writes + j) * o->wsize;
	char *to = p->shm_win + ((size_t)rt->rank * o->writes + j) * o->wsize;
	int r = compcntr_tracker_issue(rt->tr_shm, 1); /* before the put, as for fi_write */
	if (r)
		return rt_fail(rt, "compcntr_tracker_issue(shared-memory puts): %s", strerror(r));
	memcpy(to, from, o->wsize);
	if ((r = compcntr_inc_comp_cntr(p->shm_landed, 1)))
		return rt_fail(
		        rt,
		        "put to rank %d: compcntr_inc_comp_cntr(its counter of puts landed): %s",
		        dst, strerror(r));
	if ((r = compcntr_inc_comp_cntr(rt->cc_puts, 1)))
		return rt_fail(rt, "put to rank %d: compcntr_inc_comp_cntr(puts complete): %s", dst,
		               strerror(r));
	rt->writes_posted++;
	rt->st.writes++;
	rt->st.shm_puts++;
	return 0;
}

int rt_put(struct rt *rt, int dst, uint64_t j)
{
	return rt->peers[dst].shm_win ? put_shm(rt, dst, j) : rt_post_write(rt, dst, j);
}

/* ---- quiet and the landed check --------------------------------------------------------- */

static int quiet_one(struct rt *rt, struct compcntr_tracker *tr, struct compcntr_comp_cntr *cc,
                     const char *what)
{
	const int r = compcntr_tracker_quiet_ex(tr, rt->o.timeout_ms, &rt->wa_tx);
	if (r == EIO) {
		rt->st.quiet_eio++;
		return rt_fail(rt, "quiet: %s failed (%" PRIu64 " errors)", what, read_cc_err(cc));
	}
	if (r)
		return rt_fail(rt,
		               "quiet (%s): %s after %d ms (%" PRIu64 " of %" PRIu64 " completed)",
		               what, strerror(r), rt->o.timeout_ms, compcntr_tracker_completed(tr),
		               compcntr_tracker_issued(tr));
	return 0;
}

/* shmem_quiet: everything issued so far is complete, both ways. */
static int quiet(struct rt *rt)
{
	rt->st.quiets++;
	if (quiet_one(rt, rt->tr, rt->cc_writes, "an RMA write (libfabric)"))
		return -1;
	if (rt->tr_shm && quiet_one(rt, rt->tr_shm, rt->cc_puts, "a shared-memory put"))
		return -1;
	return 0;
}

/* Bytes of source s's writes in this rank's window that are wrong. */
static uint64_t source_mismatches(struct rt *rt, int s)
{
	const struct rt_opts *o = &rt->o;
	uint64_t bad = 0;
	for (uint64_t j = 0; j < o->writes; j++) {
		const char *w = rt->window + ((size_t)s * o->writes + j) * o->wsize;
		for (size_t b = 0; b < o->wsize; b++)
			bad += (unsigned char)w[b] !=
			       rt_rma_byte((uint32_t)s, (uint32_t)rt->rank, j, b);
	}
	return bad;
}

/* ... of every source of another node (remote = 1) or of every source (remote = 0) */
static uint64_t window_mismatches(struct rt *rt, int remote)
{
	uint64_t bad = 0;
	for (int s = 0; s < rt->size; s++)
		if (s != rt->rank && !(remote && rt->peers[s].shm_win))
			bad += source_mismatches(rt, s);
	return bad;
}

static int remote_writes_landed(struct rt *rt)
{
	return window_mismatches(rt, 1) == 0;
}

/* The puts of the ranks of this node: wait (driving progress: ranks of other nodes may need
 * this rank's endpoint to finish their writes) until source s's landed counter reaches the
 * writes it issues; the wait's acquire makes its bytes visible here, so they are checked once,
 * not polled: a wrong byte then is a failure. */
static int local_puts_landed(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	for (int s = 0; rt->cc_landed && s < rt->size; s++) {
		if (!rt->cc_landed[s])
			continue;
		const int r = compcntr_wait_comp_cntr_ex(rt->cc_landed[s], o->writes, o->timeout_ms,
		                                         &rt->wa);
		const uint64_t got = read_cc(rt->cc_landed[s]);
		if (r)
			return rt_fail(rt,
			               "waiting for rank %d's %" PRIu64
			               " shared-memory puts to land: %s after %d ms (%" PRIu64
			               " landed)",
			               s, o->writes, strerror(r), o->timeout_ms, got);
		rt->st.shm_landed += got;
		const uint64_t bad = source_mismatches(rt, s);
		if (bad) {
			rt->st.window_bad += bad;
			return rt_fail(rt,
			               "rank %d's %" PRIu64
			               " shared-memory puts landed (its counter "
			               "says) but %" PRIu64 " bytes of them are wrong",
			               s, got, bad);
		}
	}
	return 0;
}

int rt_rma(struct rt *rt)
{
	const struct rt_opts *o = &rt->o;
	rt->phase = PHASE_RMA;
	for (uint64_t b = 0; b < o->writes; b += o->rma_batch) {
		for (int d = 1; d < rt->size; d++)
			for (uint64_t j = b; j < b + o->rma_batch && j < o->writes; j++)
				if (rt_put(rt, (rt->rank + d) % rt->size, j))
					return -1;
		if (quiet(rt))
			return -1; /* shmem_quiet: everything issued so far is complete */
	}
	if (quiet(rt))
		return -1; /* nothing new: returns at once */
	if (local_puts_landed(rt))
		return -1;
	/* The writes of every rank of another node land in this rank's window (the target drives
	 * progress too). */
	if (rt_drive_until(rt, remote_writes_landed,
	                   "the RMA writes of every rank to land in this rank's window")) {
		rt->st.window_bad = window_mismatches(rt, 0);
		return -1;
	}
	return 0;
}
