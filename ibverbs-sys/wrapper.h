/* The C surface that rdma-verbs-sys binds: libibverbs, and librdmacm with the
 * `rdmacm` feature. bindgen reads this file; with `wrap_static_fns` every
 * static inline function it declares is also compiled into a small C
 * library, so each inline verb is callable from Rust exactly as C sees it
 * (including the NULL-provider-op checks the inlines perform). */
#include <infiniband/verbs.h>
#ifdef IBVERBS_SYS_RDMACM
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#endif
