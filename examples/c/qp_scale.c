/* The C twin of examples/qp_scale.rs, on libibverbs: same queue pairs, same
 * connections, same output line.
 *
 *   cc -O2 -o qp_scale_c examples/c/qp_scale.c -libverbs
 *   ./qp_scale_c [-d rxe0] [-i 1] [-g N] [-n 1024] [-w 16]
 *
 * The port and GID are queried once; each queue pair costs ibv_create_qp and
 * three ibv_modify_qp calls, as in ibv_rc_pingpong. -g is needed on RoCE
 * (rxe0 in the test VM: GID index 1).
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned long rss(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	unsigned long kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %lu kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

static double ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1e3 + (t.tv_nsec - t0->tv_nsec) / 1e6;
}

static int connect_qp(struct ibv_qp *qp, int port, int gid_index, const struct ibv_port_attr *pa,
		      uint32_t my_psn, uint32_t rqpn, uint32_t rpsn, const union ibv_gid *rgid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = port,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = pa->active_mtu < IBV_MTU_1024 ? pa->active_mtu : IBV_MTU_1024;
	a.dest_qp_num = rqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = pa->lid;
	a.ah_attr.port_num = port;
	if (gid_index >= 0) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *rgid;
		a.ah_attr.grh.sgid_index = gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = my_psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(int argc, char **argv)
{
	const char *name = NULL;
	int port = 1, gid_index = -1, opt;
	unsigned qps = 1024, depth = 16;
	while ((opt = getopt(argc, argv, "d:i:g:n:w:")) != -1) {
		switch (opt) {
		case 'd': name = optarg; break;
		case 'i': port = atoi(optarg); break;
		case 'g': gid_index = atoi(optarg); break;
		case 'n': qps = (unsigned)atoi(optarg) & ~1u; break;
		case 'w': depth = (unsigned)atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-d dev] [-i port] [-g gid] [-n qps] [-w depth]\n", argv[0]);
			return 2;
		}
	}
	if (qps < 2)
		qps = 2;
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_device *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]), name)) {
			dev = list[i];
			break;
		}
	if (!dev) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct ibv_device_attr da;
	if (!ctx || ibv_query_port(ctx, port, &pa) || ibv_query_device(ctx, &da) ||
	    (gid_index >= 0 && ibv_query_gid(ctx, port, gid_index, &gid))) {
		perror("query");
		return 1;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	unsigned per_qp = 2 * depth;
	unsigned qps_per_cq = da.max_cqe / per_qp ? da.max_cqe / per_qp : 1;
	unsigned ncq = (qps + qps_per_cq - 1) / qps_per_cq;
	struct ibv_cq **cqs = calloc(ncq, sizeof *cqs);
	for (unsigned i = 0; i < ncq; i++) {
		unsigned n = qps - i * qps_per_cq < qps_per_cq ? qps - i * qps_per_cq : qps_per_cq;
		cqs[i] = ibv_create_cq(ctx, n * per_qp, NULL, NULL, 0);
		if (!cqs[i]) {
			perror("ibv_create_cq");
			return 1;
		}
	}
	struct ibv_qp **qp = calloc(qps, sizeof *qp);

	unsigned long before = rss();
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned i = 0; i < qps; i++) {
		struct ibv_qp_init_attr ia = {
			.send_cq = cqs[i / qps_per_cq], .recv_cq = cqs[i / qps_per_cq],
			.cap = { .max_send_wr = depth, .max_recv_wr = depth,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};
		qp[i] = ibv_create_qp(pd, &ia);
		if (!qp[i]) {
			perror("ibv_create_qp");
			return 1;
		}
	}
	double created = ms_since(&t0);
	for (unsigned i = 0; i < qps; i += 2) {
		if (connect_qp(qp[i], port, gid_index, &pa, 0x1000, qp[i + 1]->qp_num, 0x2000, &gid) ||
		    connect_qp(qp[i + 1], port, gid_index, &pa, 0x2000, qp[i]->qp_num, 0x1000, &gid)) {
			perror("ibv_modify_qp");
			return 1;
		}
	}
	double total = ms_since(&t0);
	unsigned long added = rss() - before;
	printf("qps %u depth %u cqs %u rss_per_qp_bytes %lu create_ms %.1f connect_ms %.1f total_ms %.1f\n",
	       qps, depth, ncq, added / qps, created, total - created, total);
	for (unsigned i = 0; i < qps; i++)
		ibv_destroy_qp(qp[i]);
	for (unsigned i = 0; i < ncq; i++)
		ibv_destroy_cq(cqs[i]);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
