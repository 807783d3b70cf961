/* C helpers of the fuzz harnesses: calls taking a C enum given raw bits. In C an enum is an int
 * and any value may be passed (the library must refuse unknown ones); in C++ loading such a value
 * as the enum type is undefined behaviour (UBSan's -fsanitize=enum reports it in the harness). */
#include <compcntr/compcntr.h>

#include <string.h>

int fuzz_modify_qp_raw(struct compcntr_qp *qp, uint32_t raw)
{
	enum compcntr_qp_state s;
	memcpy(&s, &raw, sizeof s);
	return compcntr_modify_qp(qp, s);
}
