/* host_pages.h — large zeroed host buffers, their pages made present by all cores at once.
 * A backend pins them afterwards (cudaHostRegister): pinning pages already present costs ~1.5 s
 * for 37 GiB, where cudaMallocHost, which faults and zeroes them on one thread, took 17 s. */
#ifndef GRPOD_ENGINE_BACKEND_HOST_PAGES_H
#define GRPOD_ENGINE_BACKEND_HOST_PAGES_H

#include <stddef.h>

/* bytes of zeroed, page-aligned memory (2 MiB pages where the kernel gives them); NULL and
 * GE_NOMEM when there is none. */
void *host_pages_map(size_t bytes);
/* Releases a buffer of host_pages_map (NULL: nothing). */
void host_pages_unmap(void *p);

#endif
