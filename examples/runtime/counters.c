/* examples/runtime, compcntr's side of set-up: the counters (sends, writes, receives, one credit
 * counter per peer), the CQ bridge that feeds the first two from the transmit CQ, the completion
 * tracker (quiet) and the credit tracker (one window per peer), the wait attributes whose
 * progress function drives the endpoint; and the ranks of this node, which return each other's
 * credits by incrementing shared counters instead of sending messages, and count each other's
 * shared-memory puts (RMA) in shared counters: the local puts' completion tracker, and per
 * local peer a counter of its puts landed in this rank's window.
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the ranks of this node: credits by shared counters -------------------------------- */

/* The node's shared device "shm:ccrt-<job>-<leader>" (job: a value rank 0 broadcasts, unique
 * per run; leader: the world rank of the node's first rank), created by that rank, opened by
 * the others. Once every rank of the node has it open, the leader removes its name (the
 * segment /dev/shm/compcntr.<name>): the segment lives on while mapped, and a job that ends by
 * MPI_Abort or a kill leaves nothing behind. */
static int open_node_device(struct rt *rt, MPI_Comm node)
{
	int nsize, nrank, leader = rt->rank;
	MPI_Comm_size(node, &nsize);
	MPI_Comm_rank(node, &nrank);
	uint64_t job = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_s() * 1e9);
	MPI_Bcast(&job, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD); /* every rank, alone or not */
	rt->job = job;
	if (nsize < 2)
		return 0; /* alone on its node: no local peers */
	MPI_Bcast(&leader, 1, MPI_INT, 0, node);
	char name[64];
	snprintf(name, sizeof name, "ccrt-%" PRIx64 "-%d", job, leader);
	if (nrank == 0)
		rt->sdev = compcntr_open_shared_device(
		        name, COMPCNTR_SHARED_CREATE | COMPCNTR_SHARED_EXCL, 0600);
	int ok = rt->sdev != NULL, all;
	MPI_Bcast(&ok, 1, MPI_INT, 0, node); /* created before the others open it */
	if (ok && nrank != 0)
		rt->sdev = compcntr_open_shared_device(name, 0, 0600);
	if (!rt->sdev)
		rt_fail(rt, "compcntr_open_shared_device(%s): %s", name,
		        ok ? compcntr_last_error_message() : "its creator failed");
	ok = rt->sdev != NULL;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, node); /* all of the node have it open */
	if (nrank == 0 && rt->sdev) {
		char path[80];
		snprintf(path, sizeof path, "/compcntr.%s", name);
		shm_unlink(path); /* docs/shared.md: "Removing the name early" */
	}
	return all ? 0 : -1;
}

/* The ids a rank sends each other rank of its node: its counter of that rank's credits, and
 * its counter of that rank's puts landed here. */
struct node_ids {
	struct compcntr_counter_id credit, landed;
};

/* Every rank of the node creates, for each other one, the counter of that rank's puts landed in
 * its window (cc_landed), and sends it the ids of that counter and of its credit counter for
 * it; each resolves the ids it got: peers[s].shm_credit is where this rank returns s's credits,
 * peers[s].shm_landed where it counts its puts into s's window. */
static int link_node_peers(struct rt *rt, MPI_Comm node)
{
	int nn;
	MPI_Comm_size(node, &nn);
	int *world = calloc((size_t)nn, sizeof *world);
	struct node_ids *mine = calloc((size_t)nn, sizeof *mine),
	                *theirs = calloc((size_t)nn, sizeof *theirs);
	int r = world && mine && theirs ? 0 : rt_fail(rt, "out of memory");
	struct compcntr_comp_cntr_init_attr ca;
	memset(&ca, 0, sizeof ca);
	ca.type = COMPCNTR_COMP_CNTR_TYPE_WRS;
	if (!r)
		MPI_Allgather(&rt->rank, 1, MPI_INT, world, 1, MPI_INT, node);
	for (int k = 0; !r && k < nn; k++) {
		compcntr_comp_cntr_id(rt->cc_credit[world[k]], &mine[k].credit);
		if (world[k] == rt->rank)
			continue;
		struct compcntr_comp_cntr **l = &rt->cc_landed[world[k]];
		if (!(*l = compcntr_create_comp_cntr(rt->sdev, &ca)))
			r = rt_fail(rt, "compcntr_create_comp_cntr(rank %d's puts landed): %s",
			            world[k], compcntr_last_error_message());
		else
			compcntr_comp_cntr_id(*l, &mine[k].landed);
	}
	/* collective: a rank whose counter failed above still takes part (the job then aborts) */
	if (world && mine && theirs)
		MPI_Alltoall(mine, sizeof *mine, MPI_BYTE, theirs, sizeof *theirs, MPI_BYTE, node);
	for (int k = 0; !r && k < nn; k++) {
		struct peer *p = &rt->peers[world[k]];
		if (world[k] == rt->rank)
			continue;
		if (!(p->shm_credit = compcntr_comp_cntr_resolve(rt->sdev, &theirs[k].credit)))
			r = rt_fail(rt, "compcntr_comp_cntr_resolve(rank %d's credit counter): %s",
			            world[k], compcntr_last_error_message());
		else if (!(p->shm_landed = compcntr_comp_cntr_resolve(rt->sdev, &theirs[k].landed)))
			r = rt_fail(
			        rt,
			        "compcntr_comp_cntr_resolve(rank %d's counter of puts landed): %s",
			        world[k], compcntr_last_error_message());
		else
			rt->st.local_peers++;
	}
	free(world);
	free(mine);
	free(theirs);
	return r;
}

/* This rank's node: the ranks of its host (MPI_COMM_TYPE_SHARED), or with --ranks-per-node K
 * every K of them; MPI_COMM_NULL with --no-node-shm. */
static MPI_Comm node_comm(const struct rt_opts *opt)
{
	MPI_Comm node = MPI_COMM_NULL;
	if (opt->node_shm)
		MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
	if (node != MPI_COMM_NULL && opt->ranks_per_node > 0) { /* simulated nodes of K ranks */
		int nr;
		MPI_Comm host = node;
		MPI_Comm_rank(host, &nr);
		MPI_Comm_split(host, nr / opt->ranks_per_node, nr, &node);
		MPI_Comm_free(&host);
	}
	return node;
}

/* This rank's node, before the memory is registered (the RMA window of a rank with local
 * peers is in the node's segment, rma.c): its communicator, kept in rt->node until
 * rt_open_counters has linked the node's ranks, and the node's shared device. */
int rt_open_node(struct rt *rt)
{
	MPI_Comm node = node_comm(&rt->o);
	if (node == MPI_COMM_NULL)
		return 0;
	if (open_node_device(rt, node))
		return -1;
	if (rt->sdev)
		rt->node = node;
	else
		MPI_Comm_free(&node); /* alone on its node */
	return 0;
}

/* Shared-memory puts: their completion counter on the node's device, the tracker over it (quiet
 * waits for it next to the libfabric one), the array of landed counters (link_node_peers). */
static int open_put_counters(struct rt *rt, struct compcntr_comp_cntr_init_attr *ca)
{
	rt->cc_landed = calloc((size_t)rt->size, sizeof *rt->cc_landed);
	if (!rt->cc_landed)
		return rt_fail(rt, "out of memory");
	if (!(rt->cc_puts = compcntr_create_comp_cntr(rt->sdev, ca)))
		return rt_fail(rt, "compcntr_create_comp_cntr(shared-memory puts): %s",
		               compcntr_last_error_message());
	if (!(rt->tr_shm = compcntr_tracker_create(rt->cc_puts)))
		return rt_fail(rt, "compcntr_tracker_create(shared-memory puts): %s",
		               compcntr_last_error_message());
	return 0;
}

/* ---- the counters, the bridge, the trackers --------------------------------------------- */

int rt_open_counters(struct rt *rt)
{
	const struct rt_opts *opt = &rt->o;
	const size_t n = (size_t)rt->size;
	rt->dev = compcntr_open_device("soft");
	if (!rt->dev)
		return rt_fail(rt, "compcntr_open_device: %s", compcntr_last_error_message());
	struct compcntr_comp_cntr_init_attr ca;
	memset(&ca, 0, sizeof ca);
	ca.type = COMPCNTR_COMP_CNTR_TYPE_WRS;
	rt->cc_credit = calloc(n, sizeof *rt->cc_credit);
	if (!rt->cc_credit)
		return rt_fail(rt, "out of memory");
	struct compcntr_device *cdev = rt->sdev ? rt->sdev : rt->dev; /* the credit counters' */
	if (!(rt->cc_sends = compcntr_create_comp_cntr(rt->dev, &ca)) ||
	    !(rt->cc_writes = compcntr_create_comp_cntr(rt->dev, &ca)) ||
	    !(rt->cc_recvs = compcntr_create_comp_cntr(rt->dev, &ca)))
		return rt_fail(rt, "compcntr_create_comp_cntr: %s", compcntr_last_error_message());
	for (size_t i = 0; i < n; i++)
		if (!(rt->cc_credit[i] = compcntr_create_comp_cntr(cdev, &ca)))
			return rt_fail(rt, "compcntr_create_comp_cntr: %s",
			               compcntr_last_error_message());
	if (rt->sdev && (open_put_counters(rt, &ca) || link_node_peers(rt, rt->node)))
		return -1;
	if (rt->node != MPI_COMM_NULL)
		MPI_Comm_free(&rt->node); /* set-up of the node done */
	rt->st.remote_peers = (uint32_t)n - 1 - rt->st.local_peers;
	struct compcntr_fi_bridge_attr ba;
	memset(&ba, 0, sizeof ba);
	ba.comp_mask = COMPCNTR_FI_BRIDGE_ATTR_FORMAT;
	ba.format = FI_CQ_FORMAT_TAGGED;
	rt->br = compcntr_fi_bridge_open_ex(rt->txcq, &ba);
	if (!rt->br)
		return rt_fail(rt, "compcntr_fi_bridge_open_ex: %s", compcntr_fi_last_error());
	if (compcntr_fi_bridge_bind(rt->br, rt->cc_sends, FI_SEND) ||
	    compcntr_fi_bridge_bind(rt->br, rt->cc_writes, FI_WRITE))
		return rt_fail(rt, "compcntr_fi_bridge_bind: %s", compcntr_fi_last_error());
	rt->tr = compcntr_tracker_create(rt->cc_writes);
	if (!rt->tr)
		return rt_fail(rt, "compcntr_tracker_create: %s", compcntr_last_error_message());
	rt->wa.comp_mask = COMPCNTR_WAIT_ATTR_SPIN | COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
	rt->wa.spin_ns =
	        opt->spin_us < 0 ? COMPCNTR_WAIT_SPIN_FOREVER : (int64_t)opt->spin_us * 1000;
	rt->wa.progress_interval_us = (uint32_t)(opt->interval_us > 0 ? opt->interval_us : 1);
	rt->wa.progress = rt_progress;
	rt->wa.progress_ctx = rt;
	/* quiet waits for write completions only: driving the transmit CQ's bridge is enough (with
	 * manual progress any CQ read drives the whole endpoint, so incoming traffic is still
	 * served; its receive entries wait in the receive CQ for the next full progress call). */
	rt->wa_tx = rt->wa;
	rt->wa_tx.progress = rt_tx_progress;
	return 0;
}

int rt_adopt_credits(struct rt *rt, const uint64_t *windows)
{
	/* One window per peer: peer i keeps windows[i] buffers posted for this rank. */
	struct compcntr_device *cdev = rt->sdev ? rt->sdev : rt->dev;
	rt->cr = compcntr_credits_adopt(cdev, rt->cc_credit, (uint32_t)rt->size, windows);
	if (!rt->cr)
		return rt_fail(rt, "compcntr_credits_adopt: %s", compcntr_last_error_message());
	return 0;
}

void rt_close_counters(struct rt *rt)
{
	if (rt->peers)
		for (int i = 0; i < rt->size; i++) {
			if (rt->peers[i].shm_credit)
				compcntr_comp_cntr_release(rt->peers[i].shm_credit);
			if (rt->peers[i].shm_landed)
				compcntr_comp_cntr_release(rt->peers[i].shm_landed);
		}
	if (rt->tr)
		compcntr_tracker_destroy(rt->tr);
	if (rt->tr_shm)
		compcntr_tracker_destroy(rt->tr_shm); /* before its counter: it holds a reference */
	if (rt->cc_puts)
		compcntr_destroy_comp_cntr(rt->cc_puts);
	if (rt->cc_landed)
		for (int i = 0; i < rt->size; i++)
			if (rt->cc_landed[i])
				compcntr_destroy_comp_cntr(rt->cc_landed[i]);
	if (rt->cr)
		compcntr_credits_destroy(rt->cr);
	struct compcntr_comp_cntr *ccs[] = { rt->cc_sends, rt->cc_writes, rt->cc_recvs };
	for (size_t i = 0; i < 3; i++)
		if (ccs[i])
			compcntr_destroy_comp_cntr(ccs[i]);
	if (rt->cc_credit)
		for (int i = 0; i < rt->size; i++)
			if (rt->cc_credit[i])
				compcntr_destroy_comp_cntr(rt->cc_credit[i]);
	if (rt->sdev)
		compcntr_close_device(rt->sdev); /* the node's last rank removes it */
	if (rt->dev)
		compcntr_close_device(rt->dev);
	if (rt->node != MPI_COMM_NULL)
		MPI_Comm_free(&rt->node);
	free(rt->cc_credit);
	free(rt->cc_landed);
}
