/* The C twin of tools/examples/opcost.rs for `cargo xtask instr`: the same program
 * on libibverbs, written the way perftest writes its loops (one ibv_send_wr
 * per request, built once and re-posted; each request's record names its
 * queue pair, as the Rust program's do). N RC queue pairs, each connected
 * to itself, share one CQ per thread; every round posts `depth` signaled
 * RDMA writes per queue pair, sleeps until they completed, and polls them
 * in batches of 16. instr_post / instr_poll / instr_empty / instr_wait are
 * never inlined so that callgrind reports their inclusive counts.
 *
 * opcost_c [--qps N] [--depth D] [--threads T] [--rounds R] [--size BYTES]
 *          [--events] [--calibrate K] [-d DEV] [-i PORT] [-x GID]
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BATCH 16
/* noipa: no inlining, cloning (.isra/.constprop names) or identical-code folding, so that
 * each function keeps its name and its own counts. */
#define NOINLINE __attribute__((noinline, noipa))

struct args {
	int qps, depth, threads, size, events;
	long rounds, calibrate;
	const char *device;
	int port, gid;
};

/* One request: its queue pair and its work request, built once. */
struct req {
	struct ibv_qp *qp;
	struct ibv_send_wr wr;
};

struct lane {
	struct ibv_cq *cq;
	struct ibv_comp_channel *channel;
	struct ibv_qp **qps;
	struct ibv_mr *mr;
	char *bufs;
	struct req *reqs;
	struct ibv_sge *sges;
	int nqps, depth;
	long polls, short_polls;
	long rounds, calibrate;
	int events;
	int failed;
};

static void die(const char *what)
{
	fprintf(stderr, "opcost_c: %s failed\n", what);
	exit(1);
}

static long rss_kib(void)
{
	long pages = 0, size;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%ld %ld", &size, &pages) != 2)
			pages = 0;
		fclose(f);
	}
	return pages * 4;
}

static long now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

static void sleep_us(long us)
{
	struct timespec t = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&t, NULL);
}

NOINLINE static int instr_post(struct req *r)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(r->qp, &r->wr, &bad);
}

static inline int poll_body(struct lane *l, struct ibv_wc *wc)
{
	int n = ibv_poll_cq(l->cq, BATCH, wc);
	if (n < 0)
		return -1;
	for (int k = 0; k < n; k++)
		if (wc[k].status != IBV_WC_SUCCESS)
			return -1;
	return n;
}

NOINLINE static int instr_poll(struct lane *l, struct ibv_wc *wc)
{
	return poll_body(l, wc);
}

NOINLINE static int instr_empty(struct lane *l, struct ibv_wc *wc)
{
	return poll_body(l, wc);
}

NOINLINE static int instr_wait(struct lane *l)
{
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(l->channel, &cq, &ctx))
		return -1;
	ibv_ack_cq_events(cq, 1);
	return ibv_req_notify_cq(cq, 0);
}

static void *run_lane(void *arg)
{
	struct lane *l = arg;
	struct ibv_wc wc[BATCH];
	int per_round = l->nqps * l->depth;
	long settle = 40;

	for (long k = 0; k < l->calibrate; k++)
		if (instr_empty(l, wc) != 0)
			goto fail;
	for (long r = 0; r < l->rounds; r++) {
		for (int i = 0; i < per_round; i++)
			if (instr_post(&l->reqs[i]))
				goto fail;
		if (l->events) {
			if (instr_wait(l))
				goto fail;
		} else {
			sleep_us(settle * per_round);
		}
		int got = 0;
		long started = now_us();
		while (got < per_round) {
			int want = per_round - got < BATCH ? per_round - got : BATCH;
			int n = instr_poll(l, wc);
			if (n < 0)
				goto fail;
			l->polls++;
			got += n;
			if (n < want) {
				l->short_polls++;
				settle *= 2;
				sleep_us(settle);
				if (now_us() - started > 30000000L)
					goto fail;
			}
		}
	}
	return NULL;
fail:
	l->failed = 1;
	return NULL;
}

/* The port and GID are queried once (main), as perftest does. */
static void connect_self(struct ibv_qp *qp, int port, int gid_index, const struct ibv_port_attr *p,
			 const union ibv_gid *gid)
{
	struct ibv_port_attr pattr = *p;
	struct ibv_qp_attr a;

	uint32_t psn = lrand48() & 0xffffff;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("ibv_modify_qp INIT");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = pattr.active_mtu;
	a.dest_qp_num = qp->qp_num;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.dlid = pattr.lid;
	a.ah_attr.port_num = port;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("ibv_modify_qp RTR");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("ibv_modify_qp RTS");
}

int main(int argc, char **argv)
{
	struct args a = { 1, 1, 1, 64, 0, 100, 0, NULL, 0, -1 };
	for (int i = 1; i < argc; i++) {
		const char *f = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(f, "--events")) {
			a.events = 1;
			continue;
		}
		if (!v) {
			fprintf(stderr, "opcost_c: %s needs a value\n", f);
			return 2;
		}
		i++;
		if (!strcmp(f, "--qps"))
			a.qps = atoi(v);
		else if (!strcmp(f, "--depth"))
			a.depth = atoi(v);
		else if (!strcmp(f, "--threads"))
			a.threads = atoi(v);
		else if (!strcmp(f, "--rounds"))
			a.rounds = atol(v);
		else if (!strcmp(f, "--size"))
			a.size = atoi(v);
		else if (!strcmp(f, "--calibrate"))
			a.calibrate = atol(v);
		else if (!strcmp(f, "-d"))
			a.device = v;
		else if (!strcmp(f, "-i"))
			a.port = atoi(v);
		else if (!strcmp(f, "-x"))
			a.gid = atoi(v);
		else if (!strcmp(f, "--path"))
			; /* the C program has one path */
		else {
			fprintf(stderr, "opcost_c: unknown argument %s\n", f);
			return 2;
		}
	}
	if (a.qps <= 0 || a.depth <= 0 || a.threads <= 0 || a.qps % a.threads) {
		fprintf(stderr, "opcost_c: bad --qps/--depth/--threads\n");
		return 2;
	}
	srand48(getpid() ^ time(NULL));

	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("ibv_get_device_list");
	struct ibv_device *dev = list[0];
	for (int i = 0; a.device && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), a.device))
			dev = list[i];
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device");
	if (!a.port)
		a.port = 1; /* the harness passes -i */
	if (a.gid < 0)
		a.gid = 1; /* the harness passes -x */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd");
	int tsize = a.size < 8 ? 8 : a.size;
	char *target = aligned_alloc(4096, (tsize + 4095) / 4096 * 4096);
	struct ibv_mr *tmr = ibv_reg_mr(pd, target, tsize, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!tmr)
		die("ibv_reg_mr target");
	struct ibv_port_attr pattr;
	union ibv_gid gid;
	if (ibv_query_port(ctx, a.port, &pattr))
		die("ibv_query_port");
	if (ibv_query_gid(ctx, a.port, a.gid, &gid))
		die("ibv_query_gid");
	long rss_base = rss_kib();

	int per = a.qps / a.threads;
	struct lane *lanes = calloc(a.threads, sizeof(*lanes));
	long t0 = now_us();
	for (int t = 0; t < a.threads; t++) {
		struct lane *l = &lanes[t];
		l->nqps = per;
		l->depth = a.depth;
		l->rounds = a.rounds;
		l->calibrate = a.calibrate;
		l->events = a.events;
		if (a.events) {
			l->channel = ibv_create_comp_channel(ctx);
			if (!l->channel)
				die("ibv_create_comp_channel");
		}
		l->cq = ibv_create_cq(ctx, per * (a.depth + 1), NULL, l->channel, 0);
		if (!l->cq)
			die("ibv_create_cq");
		if (a.events && ibv_req_notify_cq(l->cq, 0))
			die("ibv_req_notify_cq");
		l->qps = calloc(per, sizeof(*l->qps));
		for (int q = 0; q < per; q++) {
			struct ibv_qp_init_attr init = {
				.send_cq = l->cq,
				.recv_cq = l->cq,
				.cap = { .max_send_wr = a.depth, .max_recv_wr = 1, .max_send_sge = 1,
					 .max_recv_sge = 1 },
				.qp_type = IBV_QPT_RC,
			};
			l->qps[q] = ibv_create_qp(pd, &init);
			if (!l->qps[q])
				die("ibv_create_qp");
			connect_self(l->qps[q], a.port, a.gid, &pattr, &gid);
		}
	}
	long setup = now_us() - t0;
	long rss_qps = rss_kib();
	for (int t = 0; t < a.threads; t++) {
		struct lane *l = &lanes[t];
		int n = per * a.depth;
		size_t len = ((size_t)n * a.size + 4095) / 4096 * 4096;
		l->bufs = aligned_alloc(4096, len);
		memset(l->bufs, 1, len);
		l->mr = ibv_reg_mr(pd, l->bufs, (size_t)n * a.size, IBV_ACCESS_LOCAL_WRITE);
		if (!l->mr)
			die("ibv_reg_mr");
		l->reqs = calloc(n, sizeof(*l->reqs));
		l->sges = calloc(n, sizeof(*l->sges));
		for (int i = 0; i < n; i++) {
			l->sges[i].addr = (uintptr_t)l->bufs + (size_t)i * a.size;
			l->sges[i].length = a.size;
			l->sges[i].lkey = l->mr->lkey;
			struct ibv_send_wr *wr = &l->reqs[i].wr;
			l->reqs[i].qp = l->qps[i / a.depth];
			wr->wr_id = i;
			wr->sg_list = &l->sges[i];
			wr->num_sge = 1;
			wr->opcode = IBV_WR_RDMA_WRITE;
			wr->send_flags = IBV_SEND_SIGNALED;
			wr->wr.rdma.remote_addr = (uintptr_t)target;
			wr->wr.rdma.rkey = tmr->rkey;
		}
	}
	long rss_bufs = rss_kib();

	t0 = now_us();
	pthread_t *th = calloc(a.threads, sizeof(*th));
	for (int t = 0; t < a.threads; t++)
		if (pthread_create(&th[t], NULL, run_lane, &lanes[t]))
			die("pthread_create");
	long polls = 0, shorts = 0;
	for (int t = 0; t < a.threads; t++) {
		pthread_join(th[t], NULL);
		if (lanes[t].failed)
			die("the measured loop");
		polls += lanes[t].polls;
		shorts += lanes[t].short_polls;
	}
	long ran = now_us() - t0;

	t0 = now_us();
	for (int t = 0; t < a.threads; t++)
		for (int q = 0; q < per; q++)
			if (ibv_destroy_qp(lanes[t].qps[q]))
				die("ibv_destroy_qp");
	long teardown = now_us() - t0;
	for (int t = 0; t < a.threads; t++) {
		ibv_dereg_mr(lanes[t].mr);
		ibv_destroy_cq(lanes[t].cq);
		if (lanes[t].channel)
			ibv_destroy_comp_channel(lanes[t].channel);
	}
	long ops = a.rounds * a.qps * (long)a.depth;
	printf("opcost impl=c path=c qps=%d depth=%d threads=%d rounds=%ld size=%d events=%d "
	       "posts=%ld completions=%ld polls=%ld short_polls=%ld calibrate=%ld setup_us=%ld "
	       "teardown_us=%ld run_us=%ld rss_base_kib=%ld rss_qps_kib=%ld rss_bufs_kib=%ld\n",
	       a.qps, a.depth, a.threads, a.rounds, a.size, a.events, ops, ops, polls, shorts,
	       a.calibrate * a.threads, setup, teardown, ran, rss_base, rss_qps, rss_bufs);
	ibv_dereg_mr(tmr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
