/* compcntr_runtime's main: the options, then the run (runtime.c). The test build of the
 * program (tests/runtime/rt_faults.c) has a main of its own around the same two calls.
 */
#include "rt.h"

#include <mpi.h>

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	struct rt_opts o;
	int rc = rt_parse_args(argc, argv, &o);
	if (rc < 0)
		rc = rt_run(&o);
	MPI_Finalize();
	return rc;
}
