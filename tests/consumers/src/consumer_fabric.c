/* A C consumer of the libfabric integration: the calls link and refuse bad input exactly. */
#include <compcntr/fabric.h>

#include <errno.h>
#include <stdio.h>

int main(void)
{
	struct compcntr_fi_bridge *br = compcntr_fi_bridge_open(NULL);
	int e = errno;
	int rc = compcntr_fi_bridge_bind(NULL, NULL, FI_SEND);
	printf("consumer_fabric: bridge_open(NULL) -> %p errno %d, bind(NULL) -> %d\n", (void *)br,
	       e, rc);
	return br == NULL && e == EINVAL && rc == EINVAL ? 0 : 1;
}
