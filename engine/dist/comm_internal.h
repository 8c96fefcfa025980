/* comm_internal.h — what the comm implementations share (comm_cpu.c, comm_tcp.c), not for callers
 * of comm.h: the sum over ranks, one function, so every comm that promises rank order (cpu, tcp)
 * gives the same bits for the same inputs. */
#ifndef GRPOD_COMM_INTERNAL_H
#define GRPOD_COMM_INTERNAL_H
#include <stddef.h>

#include "engine/dist/comm.h"

/* dst (n) = the sum over ranks q = 0..W-1, in that order, of in[q] + off (elements of t): an int32
 * accumulator for COMM_I32, fp32 otherwise, bf16 rounded once at the end (bf16_from_f32,
 * kernels/adamw.h). dst may alias one of the inputs only element for element. Not for COMM_U8.
 * (comm_cpu.c) */
void comm_sum_ranks(void *dst, const void *const *in, int W, size_t off, size_t n, comm_type t);

/* An all-to-all-v's counts agree when recv[r][q] = send[q][r] for every pair (send[q], recv[q]:
 * rank q's W counts). 0, or GE_INVALID naming the first pair that does not (every rank that
 * checks the same counts gets the same answer). (comm_cpu.c) */
int comm_check_a2a_counts(const size_t *const *send, const size_t *const *recv, int W);
#endif
