/* An ordinary libfabric program (libfabric's headers and library only) for the hook's
 * launcher and statistics test: opens a shm domain, COUNT counters (argv[1], default 5), binds
 * two of them to an endpoint, reads each once, closes everything, and prints how many
 * fi_cntr_open calls it made. Exit status 0 on success. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
	do {                                                                                       \
		int r_ = (call);                                                                   \
		if (r_) {                                                                          \
			fprintf(stderr, "%s: %s\n", #call, fi_strerror(-r_));                      \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

int main(int argc, char **argv)
{
	int count = argc > 1 ? atoi(argv[1]) : 5;
	if (count < 2 || count > 64)
		return fprintf(stderr, "count must be 2..64\n"), 2;
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->fabric_attr->prov_name = strdup("shm");
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fi_av_attr aa = { .type = FI_AV_TABLE };
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_CONTEXT };
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	CHECK(fi_av_open(domain, &aa, &av, NULL));
	CHECK(fi_cq_open(domain, &ca, &cq, NULL));
	CHECK(fi_endpoint(domain, info, &ep, NULL));
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	struct fid_cntr *c[64];
	int opened = 0;
	for (int i = 0; i < count; i++) {
		struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP,
			                     .wait_obj = FI_WAIT_NONE };
		CHECK(fi_cntr_open(domain, &attr, &c[i], NULL));
		opened++;
	}
	CHECK(fi_ep_bind(ep, &c[0]->fid, FI_SEND));
	CHECK(fi_ep_bind(ep, &c[1]->fid, FI_RECV));
	CHECK(fi_enable(ep));
	unsigned long long sum = 0;
	for (int i = 0; i < count; i++)
		sum += fi_cntr_read(c[i]);
	CHECK(fi_close(&ep->fid));
	for (int i = 0; i < count; i++)
		CHECK(fi_close(&c[i]->fid));
	CHECK(fi_close(&cq->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(info);
	printf("fi_cntr_open calls: %d\nsum of values: %llu\n", opened, sum);
	return 0;
}
