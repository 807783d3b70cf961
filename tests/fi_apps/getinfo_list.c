/* Prints the fi_getinfo list for a set of hints, one line per entry (provider, fabric, domain,
 * endpoint type, caps, mode, address format), so that two runs can be compared byte for byte.
 *
 *   getinfo_list            hints FI_MSG|FI_RMA, FI_EP_RDM, no provider named, then each of
 *                           "tcp", "tcp;ofi_rxm", "udp;ofi_rxd", "shm", "sockets" named
 *   getinfo_list --trigger  hints FI_MSG|FI_RMA|FI_TRIGGER, no provider named
 *
 * run.py --same-getinfo runs the first form without and with ofi_compcntr on FI_PROVIDER_PATH
 * (the outputs must be identical: a program asking for no trigger caps sees the list it sees
 * without the layer) and the second with it (the layer's entries must be there: proof it was
 * loaded). Only libfabric's headers and library.
 */
#define _GNU_SOURCE /* strdup */
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void list(uint64_t caps, const char *prov)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	if (!hints) {
		printf("fi_allocinfo failed\n");
		exit(1);
	}
	hints->caps = caps;
	hints->ep_attr->type = FI_EP_RDM;
	if (prov)
		hints->fabric_attr->prov_name = strdup(prov);
	int ret = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
	printf("hints prov_name %s: fi_getinfo = %d\n", prov ? prov : "(none)", ret);
	for (struct fi_info *i = info; i; i = i->next)
		printf("  %s | %s | %s | ep %d | caps 0x%llx | mode 0x%llx | addr_format %u\n",
		       i->fabric_attr->prov_name, i->fabric_attr->name, i->domain_attr->name,
		       (int)i->ep_attr->type, (unsigned long long)i->caps,
		       (unsigned long long)i->mode, (unsigned)i->addr_format);
	fi_freeinfo(info);
	fi_freeinfo(hints);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--trigger") == 0) {
		list(FI_MSG | FI_RMA | FI_TRIGGER, NULL);
		return 0;
	}
	static const char *provs[] = {
		NULL, "tcp", "tcp;ofi_rxm", "udp;ofi_rxd", "shm", "sockets"
	};
	for (size_t k = 0; k < sizeof provs / sizeof provs[0]; k++)
		list(FI_MSG | FI_RMA, provs[k]);
	return 0;
}
