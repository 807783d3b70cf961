/* examples/runtime, the libfabric side of set-up: the provider's RDM endpoint (tagged + RMA),
 * its two CQs and the provider's own counters, the memory regions (send slots, receive slots,
 * the RMA window and source), the exchange of endpoint names, RMA keys and receive windows with
 * MPI_Allgather, the initial receives; rt_open puts it together with counters.c, rt_close
 * takes it apart.
 */
#define _GNU_SOURCE
#include "rt_internal.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 256

void rt_default_opts(struct rt_opts *o)
{
	memset(o, 0, sizeof *o);
	o->provider = "tcp;ofi_rxm";
	o->msgs = 20000;
	o->size = 64;
	o->window = 16;
	o->flow = 1;
	o->node_shm = 1;
	o->writes = 256;
	o->wsize = 64;
	o->rma_batch = 32;
	o->timeout_ms = 20000;
	o->spin_us = 50;
	o->interval_us = 100;
}

int rt_fail(struct rt *rt, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "runtime: rank %d: ", rt ? rt->rank : -1);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	fflush(stderr);
	va_end(ap);
	return -1;
}

static int fi_check(struct rt *rt, const char *call, int r)
{
	if (r)
		return rt_fail(rt, "%s: %s", call, fi_strerror(r < 0 ? -r : r));
	return 0;
}

static int open_cntr(struct rt *rt, struct fid_cntr **c, uint64_t flags, const char *what)
{
	struct fi_cntr_attr a;
	memset(&a, 0, sizeof a);
	a.events = FI_CNTR_EVENTS_COMP;
	a.wait_obj = FI_WAIT_UNSPEC; /* the benchmark's reference uses fi_cntr_wait on it */
	if (fi_check(rt, what, fi_cntr_open(rt->domain, &a, c, NULL)))
		return -1;
	return fi_check(rt, "fi_ep_bind(counter)", fi_ep_bind(rt->ep, &(*c)->fid, flags));
}

static void *zalloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, n ? n : 1))
		return NULL;
	memset(p, 0, n ? n : 1);
	return p;
}

static int open_endpoint(struct rt *rt)
{
	const struct rt_opts *opt = &rt->o;
	if (opt->iface) {
		setenv("FI_TCP_IFACE", opt->iface, 1);
		setenv("FI_SOCKETS_IFACE", opt->iface, 1);
	}
	struct fi_info *hints = fi_allocinfo();
	if (!hints)
		return rt_fail(rt, "fi_allocinfo failed");
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_TAGGED | FI_RMA;
	hints->mode = FI_CONTEXT | FI_RX_CQ_DATA;
	hints->domain_attr->mr_mode =
	        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_DOMAIN;
	hints->fabric_attr->prov_name = strdup(opt->provider);
	/* --iface: that interface's domain, or a clear failure. Without the name the IP providers
	 * fall back to another interface (loopback) when the asked one is not running yet, and
	 * the ranks of the other host then fail far from the cause (connect(): EINVAL, then
	 * "fi_tsend: Invalid argument"). */
	if (opt->iface && strncmp(opt->provider, "shm", 3) != 0)
		hints->domain_attr->name = strdup(opt->iface);
	int r = fi_getinfo(FI_VERSION(1, 17), opt->addr, NULL, opt->addr ? FI_SOURCE : 0, hints,
	                   &rt->info);
	fi_freeinfo(hints);
	if (r)
		return rt_fail(rt, "fi_getinfo(%s, FI_EP_RDM, tagged + RMA%s%s%s%s): %s%s",
		               opt->provider, opt->addr ? ", " : "", opt->addr ? opt->addr : "",
		               opt->iface ? ", domain " : "", opt->iface ? opt->iface : "",
		               fi_strerror(-r),
		               opt->iface ? " (is the interface up and running?)" : "");
	if (rt->info->domain_attr->cq_data_size < 4)
		return rt_fail(rt, "provider %s has %zu bytes of CQ data: credit messages need 4",
		               rt->info->fabric_attr->prov_name,
		               rt->info->domain_attr->cq_data_size);
	if (fi_check(rt, "fi_fabric", fi_fabric(rt->info->fabric_attr, &rt->fabric, NULL)) ||
	    fi_check(rt, "fi_domain", fi_domain(rt->fabric, rt->info, &rt->domain, NULL)))
		return -1;
	struct fi_av_attr av_attr;
	memset(&av_attr, 0, sizeof av_attr);
	av_attr.type = FI_AV_TABLE;
	struct fi_cq_attr cq_attr;
	memset(&cq_attr, 0, sizeof cq_attr);
	cq_attr.format = FI_CQ_FORMAT_TAGGED;
	cq_attr.size = 8192;
	if (fi_check(rt, "fi_av_open", fi_av_open(rt->domain, &av_attr, &rt->av, NULL)) ||
	    fi_check(rt, "fi_cq_open(tx)", fi_cq_open(rt->domain, &cq_attr, &rt->txcq, NULL)) ||
	    fi_check(rt, "fi_cq_open(rx)", fi_cq_open(rt->domain, &cq_attr, &rt->rxcq, NULL)) ||
	    fi_check(rt, "fi_endpoint", fi_endpoint(rt->domain, rt->info, &rt->ep, NULL)) ||
	    fi_check(rt, "fi_ep_bind(av)", fi_ep_bind(rt->ep, &rt->av->fid, 0)) ||
	    fi_check(rt, "fi_ep_bind(tx cq)", fi_ep_bind(rt->ep, &rt->txcq->fid, FI_TRANSMIT)) ||
	    fi_check(rt, "fi_ep_bind(rx cq)", fi_ep_bind(rt->ep, &rt->rxcq->fid, FI_RECV)) ||
	    open_cntr(rt, &rt->pv_send, FI_SEND, "fi_cntr_open(send)") ||
	    open_cntr(rt, &rt->pv_recv, FI_RECV, "fi_cntr_open(recv)") ||
	    open_cntr(rt, &rt->pv_write, FI_WRITE, "fi_cntr_open(write)") ||
	    fi_check(rt, "fi_enable", fi_enable(rt->ep)))
		return -1;
	return 0;
}

/* Send slots, receive slots (nrx per source), the RMA window and the RMA source. The window
 * of a rank with a node device is its part of the node's shared segment (rma.c), which the
 * ranks of its node write into directly; the ranks of other nodes write into it through this
 * registration. */
static int register_memory(struct rt *rt, uint32_t nrx)
{
	const struct rt_opts *opt = &rt->o;
	const size_t n = (size_t)rt->size;
	rt->sregion_len = n * opt->msgs * opt->size;
	rt->rregion_len = n * nrx * (size_t)opt->size;
	rt->window_len = n * opt->writes * opt->wsize;
	rt->src_len = n * opt->writes * opt->wsize;
	rt->peers = calloc(n, sizeof *rt->peers);
	if (!rt->peers)
		return rt_fail(rt, "out of memory");
	if (rt->node != MPI_COMM_NULL) {
		if (rt_map_windows(rt))
			return -1;
	} else if (!(rt->window = zalloc(rt->window_len))) {
		return rt_fail(rt, "out of memory");
	}
	rt->sregion = zalloc(rt->sregion_len);
	rt->rregion = zalloc(rt->rregion_len);
	rt->src = zalloc(rt->src_len);
	if (!rt->sregion || !rt->rregion || !rt->src)
		return rt_fail(rt, "out of memory");
	if (fi_check(rt, "fi_mr_reg(send)",
	             fi_mr_reg(rt->domain, rt->sregion, rt->sregion_len, FI_SEND, 0, 1, 0, &rt->smr,
	                       NULL)) ||
	    fi_check(rt, "fi_mr_reg(recv)",
	             fi_mr_reg(rt->domain, rt->rregion, rt->rregion_len, FI_RECV, 0, 2, 0, &rt->rmr,
	                       NULL)) ||
	    fi_check(rt, "fi_mr_reg(window)",
	             fi_mr_reg(rt->domain, rt->window, rt->window_len, FI_REMOTE_WRITE, 0, 3, 0,
	                       &rt->wmr, NULL)) ||
	    fi_check(rt, "fi_mr_reg(rma source)",
	             fi_mr_reg(rt->domain, rt->src, rt->src_len, FI_WRITE, 0, 4, 0, &rt->srcmr,
	                       NULL)))
		return -1;
	rt->sdesc = fi_mr_desc(rt->smr);
	rt->rdesc = fi_mr_desc(rt->rmr);
	rt->srcdesc = fi_mr_desc(rt->srcmr);
	return 0;
}

/* Addresses, windows and RMA keys of every rank; then the credit tracker over their windows. */
static int exchange_addresses(struct rt *rt)
{
	const size_t n = (size_t)rt->size;
	char name[NAME_MAX_LEN];
	memset(name, 0, sizeof name);
	size_t len = sizeof name;
	if (fi_check(rt, "fi_getname", fi_getname(&rt->ep->fid, name, &len)))
		return -1;
	char *names = malloc(n * NAME_MAX_LEN);
	if (!names)
		return rt_fail(rt, "out of memory");
	MPI_Allgather(name, NAME_MAX_LEN, MPI_BYTE, names, NAME_MAX_LEN, MPI_BYTE, MPI_COMM_WORLD);
	fi_addr_t *addrs = calloc(n, sizeof *addrs);
	if (!addrs)
		return rt_fail(rt, "out of memory");
	for (size_t i = 0; i < n; i++) {
		/* The count inserted, or a negative error code (fi_av(3)): name the code. */
		const int r = fi_av_insert(rt->av, names + i * NAME_MAX_LEN, 1, &addrs[i], 0, NULL);
		if (r != 1)
			return rt_fail(rt, "fi_av_insert(rank %zu): %s", i,
			               r < 0 ? fi_strerror(-r) : "the address was not inserted");
	}
	free(names);
	uint64_t mine[3] = { (rt->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR)
		                     ? (uint64_t)(uintptr_t)rt->window
		                     : 0,
		             fi_mr_key(rt->wmr), rt->st.my_window };
	uint64_t *all = malloc(n * sizeof mine);
	if (!all)
		return rt_fail(rt, "out of memory");
	MPI_Allgather(mine, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD);
	uint64_t *windows = calloc(n, sizeof *windows);
	if (!windows)
		return rt_fail(rt, "out of memory");
	for (size_t i = 0; i < n; i++) {
		struct peer *p = &rt->peers[i];
		p->addr = addrs[i];
		p->win_addr = all[3 * i];
		p->win_key = all[3 * i + 1];
		p->window = all[3 * i + 2];
		windows[i] = i == (size_t)rt->rank ? 1 : p->window;
	}
	free(addrs);
	free(all);
	const int r = rt_adopt_credits(rt, windows);
	free(windows);
	return r;
}

/* Per-peer state, the initial receives (nrx data buffers per source, and credit receives),
 * the RMA source's contents. */
static int init_peers(struct rt *rt, uint32_t nrx)
{
	const struct rt_opts *opt = &rt->o;
	for (size_t i = 0; i < (size_t)rt->size; i++) {
		struct peer *p = &rt->peers[i];
		if (i == (size_t)rt->rank)
			continue;
		p->sbuf = rt->sregion + i * opt->msgs * opt->size;
		p->sctx = calloc(opt->msgs ? opt->msgs : 1, sizeof *p->sctx);
		p->wctx = calloc(opt->writes ? opt->writes : 1, sizeof *p->wctx);
		p->seen = calloc(opt->msgs / 8 + 1, 1);
		p->nrx = nrx;
		p->rx = calloc(nrx ? nrx : 1, sizeof *p->rx);
		/* Credit messages from i in flight at once: they return credits for my messages to
		 * i, at most its window for me (p->window, which --vary-windows makes 1.5x) in batches
		 * of `batch`, plus its final short batch; sized from opt->window, a small --batch
		 * with --vary-windows left credit messages unexpected (queued by the provider). */
		p->ncrx = opt->flow && !p->shm_credit ? (uint32_t)(p->window / opt->batch) + 4 : 0;
		p->crx = calloc(p->ncrx ? p->ncrx : 1, sizeof *p->crx);
		p->ncctx = opt->flow ? (opt->msgs + opt->batch - 1) / opt->batch + 4
		                     : 1; /* per round */
		p->cctx = calloc(p->ncctx, sizeof *p->cctx);
		if (!p->sctx || !p->wctx || !p->seen || !p->rx || !p->crx || !p->cctx)
			return rt_fail(rt, "out of memory");
		for (uint32_t k = 0; k < nrx && k < opt->msgs; k++) {
			struct rx_slot *s = &p->rx[k];
			s->src = (uint32_t)i;
			s->buf = rt->rregion + (i * nrx + k) * (size_t)opt->size;
			if (rt_post_data_recv(rt, p, s))
				return -1;
		}
		for (uint32_t k = 0; k < p->ncrx; k++) {
			p->crx[k].src = (uint32_t)i;
			if (rt_post_credit_recv(rt, &p->crx[k]))
				return -1;
		}
		for (uint64_t j = 0; j < opt->writes; j++)
			for (size_t b = 0; b < opt->wsize; b++)
				rt->src[(i * opt->writes + j) * opt->wsize + b] =
				        (char)rt_rma_byte((uint32_t)rt->rank, (uint32_t)i, j, b);
	}
	return 0;
}

static void no_sent(void *ctx, uint64_t sent)
{
	(void)ctx;
	(void)sent;
}

static void no_alive(void *ctx)
{
	(void)ctx;
}

struct rt *rt_open(const struct rt_opts *o)
{
	struct rt *rt = calloc(1, sizeof *rt);
	if (!rt)
		return NULL;
	rt->o = *o;
	rt->live_req = MPI_REQUEST_NULL;
	rt->node = MPI_COMM_NULL;
	MPI_Comm_rank(MPI_COMM_WORLD, &rt->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &rt->size);
	struct rt_opts *opt = &rt->o;
	if (opt->callbacks)
		rt->callbacks = *opt->callbacks;
	if (!rt->callbacks.sent)
		rt->callbacks.sent = no_sent;
	if (!rt->callbacks.alive)
		rt->callbacks.alive = no_alive;
	if (opt->size < sizeof(struct rt_msg_hdr))
		opt->size = sizeof(struct rt_msg_hdr);
	if (opt->window == 0)
		opt->window = 1;
	if (opt->batch == 0)
		opt->batch = opt->window / 4 ? opt->window / 4 : 1;
	if (opt->batch > opt->window)
		opt->batch = opt->window;
	if (opt->rma_batch == 0)
		opt->rma_batch = 1;
	rt->st.rank = rt->rank;
	rt->st.my_window =
	        opt->window + (opt->vary_windows && (rt->rank & 1) ? opt->window / 2 : 0);
	/* Receive buffers per source: the window, with or without flow control. Without it the
	 * senders do not wait for credits, and what finds no posted buffer waits in the provider's
	 * unexpected-message queue (rxm buffers it) until a buffer is reposted: the traffic the
	 * credits exist to prevent, kept as the benchmark's reference. */
	const uint32_t nrx = rt->st.my_window;
	if (open_endpoint(rt) || rt_open_node(rt) || register_memory(rt, nrx) ||
	    rt_open_counters(rt) || exchange_addresses(rt) || init_peers(rt, nrx))
		return NULL;
	if (opt->live && rt->rank == 0) {
		rt->live_all = calloc((size_t)rt->size, sizeof *rt->live_all);
		if (!rt->live_all)
			return rt_fail(rt, "out of memory"), NULL;
		for (int i = 0; i < rt->size; i++)
			rt->live_all[i].rank = (int32_t)i;
	}
	/* Every receive is posted before anyone sends. */
	MPI_Barrier(MPI_COMM_WORLD);
	rt->live_t0 = now_s();
	rt->round_end = opt->msgs;
	return rt;
}

void rt_close(struct rt *rt)
{
	if (!rt)
		return;
	if (rt->br)
		compcntr_fi_bridge_close(rt->br);
	if (rt->ep)
		fi_close(&rt->ep->fid);
	struct fid_mr *mrs[] = { rt->smr, rt->rmr, rt->wmr, rt->srcmr };
	for (size_t i = 0; i < sizeof mrs / sizeof mrs[0]; i++)
		if (mrs[i])
			fi_close(&mrs[i]->fid);
	struct fid_cntr *cs[] = { rt->pv_send, rt->pv_recv, rt->pv_write };
	for (size_t i = 0; i < 3; i++)
		if (cs[i])
			fi_close(&cs[i]->fid);
	if (rt->txcq)
		fi_close(&rt->txcq->fid);
	if (rt->rxcq)
		fi_close(&rt->rxcq->fid);
	if (rt->av)
		fi_close(&rt->av->fid);
	if (rt->domain)
		fi_close(&rt->domain->fid);
	if (rt->fabric)
		fi_close(&rt->fabric->fid);
	if (rt->info)
		fi_freeinfo(rt->info);
	rt_close_counters(rt);
	if (rt->peers)
		for (int i = 0; i < rt->size; i++) {
			struct peer *p = &rt->peers[i];
			free(p->sctx);
			free(p->wctx);
			free(p->seen);
			free(p->rx);
			free(p->crx);
			free(p->cctx);
		}
	free(rt->peers);
	free(rt->live_all);
	free(rt->sregion);
	free(rt->rregion);
	if (rt->wseg)
		rt_unmap_windows(rt); /* rt->window is in it */
	else
		free(rt->window);
	free(rt->src);
	free(rt);
}

const struct rt_stats *rt_stats_of(const struct rt *rt)
{
	return &rt->st;
}

const char *rt_provider(const struct rt *rt)
{
	return rt->info->fabric_attr->prov_name;
}

const struct rt_opts *rt_opts_of(const struct rt *rt)
{
	return &rt->o;
}
