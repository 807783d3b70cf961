/* Counting a real libfabric endpoint's completions with compcntr counters.
 *
 * One RDM endpoint (tcp;ofi_rxm on 127.0.0.1, or shm) sends messages to itself. A CQ bridge
 * drains its CQ: sends are counted by an fi_cntr served by compcntr (compcntr_fi_cntr_open, used
 * through libfabric's own fi_cntr_read / fi_cntr_wait), received bytes by a compcntr BYTES
 * counter waited on with the bridge as the wait's progress (drive) function.
 *
 * Build: cc fabric_bridge.c $(pkg-config --cflags --libs compcntr-fabric)
 * Exit status 77 (skipped) when no provider opens on this machine. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <compcntr/fabric.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define N 1000

static struct fi_info *open_info(const char *prov)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	if (!hints)
		return NULL;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->mode = FI_CONTEXT;
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(prov);
	int ip = strcmp(prov, "shm") != 0;
	if (fi_getinfo(FI_VERSION(1, 17), ip ? "127.0.0.1" : NULL, NULL, ip ? FI_SOURCE : 0, hints,
	               &info))
		info = NULL;
	fi_freeinfo(hints);
	return info;
}

#define CHECK(call)                                                                                \
	do {                                                                                       \
		int rc_ = (int)(call);                                                             \
		if (rc_) {                                                                         \
			fprintf(stderr, "%s: %d (%s) %s\n", #call, rc_,                            \
			        fi_strerror(rc_ < 0 ? -rc_ : rc_), compcntr_fi_last_error());      \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

int main(void)
{
	struct fi_info *info = open_info("tcp;ofi_rxm");
	if (!info)
		info = open_info("shm");
	if (!info) {
		printf("no libfabric provider (tcp;ofi_rxm, shm) opens here: skipped\n");
		return 77;
	}
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_MSG, .size = 1024 };
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	CHECK(fi_av_open(domain, &av_attr, &av, NULL));
	CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	CHECK(fi_endpoint(domain, info, &ep, NULL));
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)); /* an entry for every operation */
	CHECK(fi_enable(ep));
	char name[256];
	size_t len = sizeof name;
	fi_addr_t self;
	CHECK(fi_getname(&ep->fid, name, &len));
	if (fi_av_insert(av, name, 1, &self, 0, NULL) != 1)
		return 1;

	/* compcntr: an fi_cntr for sends, a BYTES counter for received bytes, one bridge. */
	struct compcntr_device *dev = compcntr_open_device("soft");
	struct fi_cntr_attr sent_attr = { .events = FI_CNTR_EVENTS_COMP,
		                          .wait_obj = FI_WAIT_UNSPEC };
	struct fid_cntr *sent;
	CHECK(compcntr_fi_cntr_open(dev, &sent_attr, &sent, NULL));
	struct compcntr_comp_cntr_init_attr bytes_attr = { .type = COMPCNTR_COMP_CNTR_TYPE_BYTES };
	struct compcntr_comp_cntr *received = compcntr_create_comp_cntr(dev, &bytes_attr);
	struct compcntr_fi_bridge_attr br_attr = {
		.comp_mask = COMPCNTR_FI_BRIDGE_ATTR_FORMAT,
		.format = FI_CQ_FORMAT_MSG, /* batched reads */
	};
	struct compcntr_fi_bridge *br = compcntr_fi_bridge_open_ex(cq, &br_attr);
	if (!received || !br)
		return fprintf(stderr, "setup: %s %s\n", compcntr_last_error_message(),
		               compcntr_fi_last_error()),
		       1;
	CHECK(compcntr_fi_bridge_bind(br, compcntr_fi_cntr_comp_cntr(sent), FI_SEND));
	CHECK(compcntr_fi_bridge_bind(br, received, FI_RECV));

	/* Traffic: N receives, N sends of 1..64 bytes to ourselves. */
	static char rx[N][64], tx[64];
	static struct fi_context ctx[2 * N];
	uint64_t total = 0;
	for (int i = 0; i < N; i++) {
		ssize_t r;
		while ((r = fi_recv(ep, rx[i], sizeof rx[i], NULL, self, &ctx[2 * i])) ==
		       -FI_EAGAIN)
			compcntr_fi_bridge_progress(br);
		while ((r = fi_send(ep, tx, 1 + i % 64, NULL, self, &ctx[2 * i + 1])) == -FI_EAGAIN)
			compcntr_fi_bridge_progress(br);
		CHECK(r);
		total += 1 + i % 64;
	}

	/* fi_cntr_wait on the adapter counter drives the bridge it is bound to. */
	CHECK(fi_cntr_wait(sent, N, 10000));
	/* A compcntr wait with the bridge as its progress function drives the CQ too. */
	struct compcntr_wait_attr wa = { .progress = compcntr_fi_bridge_progress_fn,
		                         .progress_ctx = br };
	CHECK(compcntr_wait_comp_cntr_ex(received, total, 10000, &wa));

	uint64_t bytes = 0;
	compcntr_read_comp_cntr(received, &bytes);
	struct compcntr_fi_bridge_stats st;
	compcntr_fi_bridge_query_stats(br, &st);
	printf("provider %s: %" PRIu64 " sends completed (fi_cntr_read), %" PRIu64 " errors; "
	       "%" PRIu64 " bytes received (expected %" PRIu64 "); bridge read %" PRIu64
	       " CQ entries\n",
	       info->fabric_attr->prov_name, fi_cntr_read(sent), fi_cntr_readerr(sent), bytes,
	       total, st.entries);
	int ok = fi_cntr_read(sent) == N && bytes == total && st.entries == 2 * N;

	/* Close order: the bridge (it holds the adapter counter busy), counters, then libfabric. */
	if (fi_close(&sent->fid) != -FI_EBUSY) /* still bound to the bridge: refused */
		return fprintf(stderr, "fi_close of a bound counter was not refused\n"), 1;
	CHECK(compcntr_fi_bridge_close(br));
	CHECK(fi_close(&sent->fid));
	CHECK(compcntr_destroy_comp_cntr(received));
	CHECK(compcntr_close_device(dev));
	fi_close(&ep->fid);
	fi_close(&cq->fid);
	fi_close(&av->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	return ok ? 0 : 1;
}
