/* bench/runtime: rt_one_write, the quiet-latency sample of row P15, built on examples/runtime's
 * engine state (rt_internal.h): one fi_write posted as the RMA phase posts one to a rank of
 * another node (rt_post_write: libfabric whatever node the peer is on; the phase's puts to a
 * rank of its node go through shared memory instead), then finished either by the engine's
 * libfabric quiet (the tracker, fed by the CQ bridge) or, as the reference, by fi_cntr_wait on
 * the provider's own write counter.
 */
#define _GNU_SOURCE
#include "rt_bench.h"
#include "rt_internal.h"

#include <rdma/fi_errno.h>

double rt_one_write(struct rt *rt, int peer, int cc)
{
	const uint64_t j = rt->writes_posted % (rt->o.writes ? rt->o.writes : 1);
	const uint64_t target = fi_cntr_read(rt->pv_write) + 1;
	const double t0 = now_s();
	if (rt_post_write(rt, peer, j))
		return -1;
	if (cc) {
		if (compcntr_tracker_quiet_ex(rt->tr, rt->o.timeout_ms, &rt->wa_tx))
			return -1;
	} else {
		const int r = fi_cntr_wait(rt->pv_write, target, rt->o.timeout_ms);
		if (r)
			return rt_fail(rt, "fi_cntr_wait(write counter): %s", fi_strerror(-r)),
			       -1.0;
	}
	const double dt = now_s() - t0;
	if (!cc) {
		/* The provider counter was waited on; the CQ entry is still queued: drain it (not
		 * timed) so the bridge's count and the tracker stay in step. */
		if (compcntr_tracker_quiet_ex(rt->tr, rt->o.timeout_ms, &rt->wa))
			return -1;
	}
	return dt;
}
