/* The C twin of `fault_peer` (tools/src/fault.rs, tools/src/fault/message.rs) for
 * `cargo xtask faults --peer c|both`: the same traffic on libibverbs alone,
 * so that a fault row failing for both is the provider's and one failing
 * only for ours is the library's (issue #24). Built by xtask with `cc`.
 *
 * Kept identical to the Rust program in everything the device or the peer
 * can see: the out-of-band hello (one text line each way, `FP1 qpn= psn=
 * lid= gid= addr= len= rkey= …`, so either side can talk to the other's
 * twin), the QP (RC; server: 64 receives, 4 sends, CQ 128; client: `window`
 * sends, 4 receives, CQ 2·window + 4; one SGE, no inline), its attributes
 * (INIT with LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ; RTR with the port's
 * active MTU capped at 1024, min_rnr_timer 12, max_dest_rd_atomic 16, a
 * global route from the RoCE v2 IPv4 GID, hop limit 64; RTS with the given
 * timeout, retry_cnt, rnr_retry and max_rd_atomic 16), the memory (one
 * mmap'd registration split into equal chunks, used last chunk first and
 * returned to the end of the free list), the posting order (one signaled
 * request per ibv_post_send, wr_id = sequence number; receives re-posted
 * with the buffer that completed), polling (32 at a time), the message
 * format (sequence, FNV-1a checksum, xorshift payload) and every check, and
 * the `RESULT` line the harness parses.
 *
 * fault_peer_c server [-d DEV] [-p PORT] [--deadline S] [--recv-delay-ms MS]
 *                     [--timeout T] [--retry-cnt N] [--rnr-retry N]
 * fault_peer_c client HOST [-d DEV] [-p PORT] [--op send|write|read]
 *                     [--msg-size B] [--total B] [--window N] [--deadline S]
 *                     [--timeout T] [--retry-cnt N] [--rnr-retry N]
 *                     [--stall-timeout S]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define RX_DEPTH 64
#define BATCH 32

enum op { OP_SEND, OP_WRITE, OP_READ, OP_ATOMIC, OP_MIXED, OP_MIXED_WRITE };
static const char *op_debug[] = {"Send", "Write", "Read", "Atomic", "Mixed", "MixedWrite"};
static const char *op_wire[] = {"send", "write", "read", "atomic", "mixed", "mixedwrite"};
/* Odd requests are fetch-and-adds (fault.rs's Op::interleaves_atomics). */
#define INTERLEAVED(op) ((op) == OP_MIXED || (op) == OP_MIXED_WRITE)

/* What fetch-and-add i of an atomic run must find: 1 + 2 + ... + i
 * (request i adds i + 1), as fault.rs's atomic_expected. */
static uint64_t atomic_expected(uint64_t i)
{
	return i % 2 == 0 ? (i / 2) * (i + 1) : i * ((i + 1) / 2);
}

struct common {
	const char *device;
	int port_num; /* 0: first active */
	int tcp_port;
	int timeout, retry_cnt, rnr_retry;
	long deadline;
};

/* ---- time ---- */
static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* ---- messages (tools/src/fault/message.rs) ---- */
static uint64_t fnv(const uint8_t *b, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

static void fill(uint8_t *msg, size_t len, uint64_t seq)
{
	uint64_t x = (seq * 0x9e3779b97f4a7c15ULL) | 1;
	for (size_t i = 16; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		msg[i] = (uint8_t)x;
	}
	uint64_t h = fnv(msg + 16, len - 16);
	memcpy(msg, &seq, 8); /* little-endian host */
	memcpy(msg + 8, &h, 8);
}

/* Where a message that fails its checksum differs and whose bytes it holds
 * (as message.rs's `explain`); written to stderr. */
static void explain(const uint8_t *msg, size_t len, uint64_t seq)
{
	uint8_t *want = malloc(len), *other = malloc(len);
	size_t starts[4], ends[4];
	int n = 0, total = 0;
	long last_end = -1000;
	fill(want, len, seq);
	for (size_t i = 0; i < len; i++) {
		if (msg[i] == want[i])
			continue;
		if (total > 0 && (long)i - last_end < 64) {
			if (total <= 4)
				ends[total - 1] = i + 1;
		} else {
			if (total < 4) {
				starts[total] = i;
				ends[total] = i + 1;
			}
			total++;
		}
		last_end = i + 1;
	}
	fprintf(stderr, "%d range(s) differ", total);
	n = total < 4 ? total : 4;
	for (int r = 0; r < n; r++) {
		size_t s = starts[r], e = ends[r], from = s < 16 ? 16 : s;
		int zeros = 1;
		for (size_t i = s; i < e; i++)
			zeros &= msg[i] == 0;
		fprintf(stderr, "; [%zu, %zu) holds ", s, e);
		if (zeros) {
			fprintf(stderr, "zeros");
		} else if (from >= e) {
			fprintf(stderr, "a corrupted header");
		} else {
			uint64_t lo = seq > 256 ? seq - 256 : 0, found = UINT64_MAX;
			for (uint64_t k = lo; k < seq + 64; k++) {
				fill(other, len, k);
				if (!memcmp(other + from, msg + from, e - from)) {
					found = k;
					break;
				}
			}
			if (found == UINT64_MAX)
				fprintf(stderr, "unknown bytes");
			else
				fprintf(stderr, "message %llu's bytes", (unsigned long long)found);
		}
	}
	fprintf(stderr, ")\n");
	free(want);
	free(other);
}

/* 0 when `msg` is message `expect` (its sequence number and checksum). */
static int quiet_check(const uint8_t *msg, size_t len, uint64_t expect)
{
	uint64_t seq, h;
	memcpy(&seq, msg, 8);
	memcpy(&h, msg + 8, 8);
	return seq != expect || fnv(msg + 16, len - 16) != h ? -1 : 0;
}

/* quiet_check, saying on stderr why a message is not the one expected. */
static int check(const char *who, const uint8_t *msg, size_t len, uint64_t expect)
{
	if (!quiet_check(msg, len, expect))
		return 0;
	uint64_t seq;
	memcpy(&seq, msg, 8);
	if (seq != expect)
		fprintf(stderr, "%s: message %llu: carries sequence %llu\n", who,
			(unsigned long long)expect, (unsigned long long)seq);
	else {
		/* The right sequence number: the checksum is what failed. */
		fprintf(stderr, "%s: message %llu: checksum mismatch (", who,
			(unsigned long long)seq);
		explain(msg, len, seq);
	}
	return -1;
}

/* ---- the RESULT line (fault.rs `Stats`) ---- */
static const char *wc_name(enum ibv_wc_status s)
{
	static const char *names[] = {
		"Success", "LocLenErr", "LocQpOpErr", "LocEecOpErr", "LocProtErr",
		"WrFlushErr", "MwBindErr", "BadRespErr", "LocAccessErr", "RemInvReqErr",
		"RemAccessErr", "RemOpErr", "RetryExcErr", "RnrRetryExcErr",
		"LocRddViolErr", "RemInvRdReqErr", "RemAbortErr", "InvEecnErr",
		"InvEecStateErr", "FatalErr", "RespTimeoutErr", "GeneralErr", "TmErr",
		"TmRndvIncomplete"};
	static char buf[32];
	if ((unsigned)s < sizeof names / sizeof names[0])
		return names[s];
	snprintf(buf, sizeof buf, "Unknown(%u)", (unsigned)s);
	return buf;
}

struct stats {
	const char *role;
	enum op op;
	char status[128];
	uint64_t msgs, bytes, verified, posted, returned;
	char first_error[32];
	double start, last_ok, stall;
	int watchdog;
};

static void stats_init(struct stats *st, const char *role, enum op op)
{
	memset(st, 0, sizeof *st);
	st->role = role;
	st->op = op;
	strcpy(st->status, "ok");
	strcpy(st->first_error, "-");
	st->start = now();
}

static int ok(const struct stats *st) { return !strcmp(st->status, "ok"); }

static void fail(struct stats *st, const char *fmt, ...)
{
	va_list ap;
	if (!ok(st))
		return;
	va_start(ap, fmt);
	vsnprintf(st->status, sizeof st->status, fmt, ap);
	va_end(ap);
	for (char *c = st->status; *c; c++)
		if (*c == ' ')
			*c = '_';
}

static void wc_error(struct stats *st, enum ibv_wc_status s)
{
	if (!strcmp(st->first_error, "-")) {
		snprintf(st->first_error, sizeof st->first_error, "%s", wc_name(s));
		st->stall = now() - (st->last_ok ? st->last_ok : st->start);
	}
	fail(st, "error:%s", wc_name(s));
}

static void print_stats(const struct stats *st)
{
	printf("RESULT role=%s op=%s status=%s msgs=%llu bytes=%llu verified=%llu posted=%llu "
	       "returned=%llu first_error=%s stall_secs=%.2f watchdog=%d secs=%.1f\n",
	       st->role, op_debug[st->op], st->status, (unsigned long long)st->msgs,
	       (unsigned long long)st->bytes, (unsigned long long)st->verified,
	       (unsigned long long)st->posted, (unsigned long long)st->returned,
	       st->first_error, st->stall, st->watchdog, now() - st->start);
	fflush(stdout);
}

static void die(const char *fmt, ...)
{
	va_list ap;
	char msg[512];
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	fprintf(stderr, "fault_peer_c: %s\n", msg);
	for (char *c = msg; *c; c++)
		if (*c == ' ')
			*c = '_';
	printf("RESULT status=failed reason=%s\n", msg);
	exit(2);
}

/* ---- device, port, GID ---- */
struct setup {
	struct ibv_context *ctx;
	int port;
	int gid_index;
	struct ibv_port_attr attr;
	union ibv_gid gid;
};

static int v4_mapped_not_link_local(const union ibv_gid *g)
{
	static const uint8_t pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return !memcmp(g->raw, pre, 12) && !(g->raw[12] == 169 && g->raw[13] == 254);
}

static void open_device(const struct common *c, struct setup *s)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	s->ctx = NULL;
	for (int i = 0; i < n && !s->ctx; i++) {
		if (c->device && strcmp(ibv_get_device_name(list[i]), c->device))
			continue;
		s->ctx = ibv_open_device(list[i]);
	}
	ibv_free_device_list(list);
	if (!s->ctx)
		die("no device %s", c->device ? c->device : "(any)");
	s->port = c->port_num;
	if (!s->port) {
		struct ibv_device_attr da;
		if (ibv_query_device(s->ctx, &da))
			die("ibv_query_device failed");
		for (int p = 1; p <= da.phys_port_cnt && !s->port; p++) {
			struct ibv_port_attr pa;
			if (!ibv_query_port(s->ctx, p, &pa) && pa.state == IBV_PORT_ACTIVE)
				s->port = p;
		}
		if (!s->port)
			die("no active port");
	}
	if (ibv_query_port(s->ctx, s->port, &s->attr))
		die("ibv_query_port failed");
	/* The port's RoCE v2 GID with a non-link-local IPv4 address (as
	 * `Context::default_gid_index`); index 0 on InfiniBand. */
	s->gid_index = -1;
	if (s->attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
		for (int i = 0; i < s->attr.gid_tbl_len && s->gid_index < 0; i++) {
			struct ibv_gid_entry e;
			if (ibv_query_gid_ex(s->ctx, s->port, i, &e, 0))
				continue;
			if (e.gid_type == IBV_GID_TYPE_ROCE_V2 &&
			    v4_mapped_not_link_local((union ibv_gid *)&e.gid))
				s->gid_index = i;
		}
		if (s->gid_index < 0)
			die("no RoCE v2 IPv4 GID on port %d", s->port);
	} else {
		s->gid_index = 0;
	}
	if (ibv_query_gid(s->ctx, s->port, s->gid_index, &s->gid))
		die("ibv_query_gid failed");
}

/* ---- the hello ---- */
struct hello {
	uint32_t qpn, psn;
	uint16_t lid;
	union ibv_gid gid;
	uint64_t addr, len;
	uint32_t rkey;
	char op[16];
	uint64_t size, msgs;
};

static void send_hello(int fd, uint32_t qpn, uint32_t psn, const struct setup *s,
		       uint64_t addr, uint64_t len, uint32_t rkey, const char *extra)
{
	char gid[INET6_ADDRSTRLEN], line[512];
	inet_ntop(AF_INET6, s->gid.raw, gid, sizeof gid);
	int n = snprintf(line, sizeof line,
			 "FP1 qpn=%u psn=%u lid=%u gid=%s addr=%llu len=%llu rkey=%u %s\n", qpn,
			 psn, s->attr.lid, gid, (unsigned long long)addr,
			 (unsigned long long)len, rkey, extra);
	if (write(fd, line, n) != n)
		die("exchange: write: %s", strerror(errno));
}

/* One line (at most 4096 bytes), byte by byte so nothing after it is
 * consumed; "" when the peer closed. */
static int read_line(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap) {
		char ch;
		ssize_t r = read(fd, &ch, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		buf[n++] = ch;
		if (ch == '\n')
			break;
	}
	buf[n] = 0;
	return n > 0 ? 0 : -1;
}

static const char *field(const char *line, const char *key)
{
	size_t k = strlen(key);
	for (const char *p = line; (p = strstr(p, key)); p++)
		if ((p == line || p[-1] == ' ') && p[k] == '=')
			return p + k + 1;
	return NULL;
}

static void parse_hello(const char *line, struct hello *h)
{
	const char *v;
	char gid[64];
	if (strncmp(line, "FP1 ", 4))
		die("bad hello %s", line);
#define NUM(key, dst)                                 \
	do {                                          \
		if (!(v = field(line, key)))          \
			die("hello lacks " key);      \
		dst = strtoull(v, NULL, 10);          \
	} while (0)
	NUM("qpn", h->qpn);
	NUM("psn", h->psn);
	h->psn &= 0xffffff;
	NUM("lid", h->lid);
	NUM("addr", h->addr);
	NUM("len", h->len);
	NUM("rkey", h->rkey);
	if (!(v = field(line, "gid")) || sscanf(v, "%63[^ \n]", gid) != 1 ||
	    inet_pton(AF_INET6, gid, h->gid.raw) != 1)
		die("hello gid");
	h->op[0] = 0;
	if ((v = field(line, "op")))
		sscanf(v, "%15[^ \n]", h->op);
	h->size = (v = field(line, "size")) ? strtoull(v, NULL, 10) : 0;
	h->msgs = (v = field(line, "msgs")) ? strtoull(v, NULL, 10) : 0;
#undef NUM
}

/* ---- the queue pair ---- */
static uint32_t random_psn(void)
{
	uint32_t r;
	int fd = open("/dev/urandom", O_RDONLY);
	if (fd < 0 || read(fd, &r, sizeof r) != sizeof r)
		r = (uint32_t)(now() * 1e6);
	if (fd >= 0)
		close(fd);
	return r & 0xffffff;
}

static void connect_qp(const struct setup *s, const struct common *c, struct ibv_qp *qp,
		       uint32_t my_psn, const struct hello *remote)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = s->port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify QP to INIT: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = s->attr.active_mtu < IBV_MTU_1024 ? s->attr.active_mtu : IBV_MTU_1024;
	a.dest_qp_num = remote->qpn;
	a.rq_psn = remote->psn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = remote->lid;
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = s->port;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = remote->gid;
	a.ah_attr.grh.sgid_index = s->gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.grh.traffic_class = 0;
	a.ah_attr.grh.flow_label = 0;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify QP to RTR: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = my_psn;
	a.timeout = c->timeout;
	a.retry_cnt = c->retry_cnt;
	a.rnr_retry = c->rnr_retry;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify QP to RTS: %s", strerror(errno));
}

static void to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t send, uint32_t recv)
{
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = send;
	ia.cap.max_recv_wr = recv;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = 0;
	ia.sq_sig_all = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	return qp;
}

/* One registration of `len` bytes (an anonymous mapping, as the library's). */
static struct ibv_mr *reg(struct ibv_pd *pd, size_t len, int access)
{
	void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	struct ibv_mr *mr = ibv_reg_mr(pd, p, len, access);
	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));
	return mr;
}

/* A LIFO of chunk indices: pop takes the last, push appends (Vec's pop/push). */
struct pool {
	uint32_t *idx;
	size_t n;
};

static void pool_init(struct pool *p, size_t count)
{
	p->idx = calloc(count ? count : 1, sizeof *p->idx);
	p->n = count;
	for (size_t i = 0; i < count; i++)
		p->idx[i] = i;
}

/* ---- server ---- */
static int post_recv(struct ibv_qp *qp, struct ibv_mr *mr, size_t len, long chunk)
{
	struct ibv_sge sge;
	struct ibv_recv_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = chunk < 0 ? UINT64_MAX : (uint64_t)chunk;
	if (chunk >= 0) {
		sge.addr = (uintptr_t)mr->addr + (uint64_t)chunk * len;
		sge.length = len;
		sge.lkey = mr->lkey;
		wr.sg_list = &sge;
		wr.num_sge = 1;
	}
	return ibv_post_recv(qp, &wr, &bad);
}

static void server(const struct common *c, long recv_delay_ms)
{
	struct setup s;
	open_device(c, &s);
	int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(c->tcp_port)};
	if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 1))
		die("bind/listen %d: %s", c->tcp_port, strerror(errno));
	fprintf(stderr, "fault_peer server: listening on %d\n", c->tcp_port);
	fcntl(lfd, F_SETFL, O_NONBLOCK);
	double accept_by = now() + c->deadline;
	int fd;
	for (;;) {
		fd = accept(lfd, NULL, NULL);
		if (fd >= 0)
			break;
		if (errno == EAGAIN && now() < accept_by)
			sleep_ms(50);
		else
			die("accept: %s", strerror(errno));
	}
	fcntl(fd, F_SETFL, 0);
	struct timeval tv = {c->deadline, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char line[4096];
	if (read_line(fd, line, sizeof line))
		die("peer closed the exchange");
	struct hello client;
	parse_hello(line, &client);
	enum op op;
	if (!strcmp(client.op, "send"))
		op = OP_SEND;
	else if (!strcmp(client.op, "write"))
		op = OP_WRITE;
	else if (!strcmp(client.op, "read"))
		op = OP_READ;
	else if (!strcmp(client.op, "atomic"))
		op = OP_ATOMIC;
	else if (!strcmp(client.op, "mixed"))
		op = OP_MIXED;
	else if (!strcmp(client.op, "mixedwrite"))
		op = OP_MIXED_WRITE;
	else
		die("unknown op %s", client.op);
	size_t msg_size = client.size;
	uint64_t msgs = client.msgs;
	if (msg_size < (op == OP_ATOMIC ? 8u : 16u) || msg_size > (1 << 24) || msgs == 0 ||
	    msgs > (1 << 20))
		die("refusing size %zu x %llu", msg_size, (unsigned long long)msgs);
	struct stats st;
	stats_init(&st, "server", op);
	struct ibv_pd *pd = ibv_alloc_pd(s.ctx);
	struct ibv_cq *cq = ibv_create_cq(s.ctx, RX_DEPTH * 2, NULL, NULL, 0);
	if (!pd || !cq)
		die("pd/cq: %s", strerror(errno));
	struct ibv_qp *qp = create_qp(pd, cq, 4, RX_DEPTH);
	uint32_t psn = random_psn();
	uint64_t total = msg_size * msgs;
	struct ibv_mr *region = NULL;
	if (op == OP_WRITE)
		region = reg(pd, total,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	else if (op == OP_READ) {
		region = reg(pd, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		for (uint64_t i = 0; i < msgs; i++)
			fill((uint8_t *)region->addr + i * msg_size, msg_size, i);
	} else if (op == OP_MIXED) {
		/* The messages to read, then the counter (mmap'd memory is zero). */
		region = reg(pd, total + 8,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
		for (uint64_t i = 0; i < msgs; i++)
			fill((uint8_t *)region->addr + i * msg_size, msg_size, i);
		total += 8;
	} else if (op == OP_MIXED_WRITE) {
		/* The slots the client writes, then the counter (all zero). */
		region = reg(pd, total + 8,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
		total += 8;
	} else if (op == OP_ATOMIC) {
		/* One zeroed counter (mmap'd memory is zero). */
		region = reg(pd, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
		total = 8;
	}
	struct hello me_remote = client;
	connect_qp(&s, c, qp, psn, &me_remote);
	size_t recv_len = op == OP_SEND ? msg_size : 0;
	struct ibv_mr *rmr = NULL;
	struct pool pool = {0};
	if (recv_len) {
		rmr = reg(pd, recv_len * RX_DEPTH, IBV_ACCESS_LOCAL_WRITE);
		pool_init(&pool, RX_DEPTH);
	}
	uint64_t initial = msgs < RX_DEPTH ? msgs : RX_DEPTH;
#define POST_INITIAL()                                                                      \
	for (uint64_t k = 0; k < initial; k++) {                                             \
		long chunk = recv_len ? (long)pool.idx[--pool.n] : -1;                         \
		if (post_recv(qp, rmr, recv_len, chunk))                                        \
			die("ibv_post_recv: %s", strerror(errno));                              \
		st.posted++;                                                                    \
	}
	int one_sided = op == OP_READ || op == OP_ATOMIC || INTERLEAVED(op);
	if (!one_sided && recv_delay_ms == 0) {
		POST_INITIAL();
	}
	fprintf(stderr, "fault_peer server: connected\n");
	send_hello(fd, qp->qp_num, psn, &s, region ? (uintptr_t)region->addr : 0,
		   region ? total : 0, region ? region->rkey : 0, "");
	double deadline = now() + c->deadline;
	if (one_sided) {
		if (read_line(fd, line, sizeof line))
			line[0] = 0;
		st.msgs = msgs;
		st.bytes = msg_size * msgs;
		if (strncmp(line, "DONE", 4)) {
			line[strcspn(line, "\n")] = 0;
			fail(&st, "peer:%s", line);
		}
		if (op == OP_MIXED_WRITE) {
			/* Every write completed at a client that says ok: each
			 * slot must hold its message. Our verdict goes back as a
			 * sender's. */
			if (!strncmp(line, "DONE ok", 7)) {
				uint64_t wrong = 0;
				for (uint64_t i = 0; i < msgs; i++) {
					const uint8_t *slot = (uint8_t *)region->addr + i * msg_size;
					if (wrong < 8 ? check("fault_peer server", slot, msg_size, i)
						      : quiet_check(slot, msg_size, i)) {
						wrong++;
						fail(&st, "corrupt");
					} else {
						st.verified++;
					}
				}
				if (wrong > 8)
					fprintf(stderr, "fault_peer server: %llu slots wrong in all\n",
						(unsigned long long)wrong);
			}
			char done[160];
			int dn = snprintf(done, sizeof done, "DONE %s %llu\n", st.status,
					  (unsigned long long)st.verified);
			if (write(fd, done, dn) != dn)
				fprintf(stderr, "fault_peer server: could not send DONE\n");
		}
		print_stats(&st);
		return;
	}
	if (recv_delay_ms > 0) {
		sleep_ms(recv_delay_ms);
		POST_INITIAL();
	}
	uint64_t outstanding = initial, next_post = initial;
	struct ibv_wc wc[BATCH];
	uint8_t *scratch = malloc(msg_size);
	fcntl(fd, F_SETFL, O_NONBLOCK);
	char peer_line[4096] = "";
	size_t peer_len = 0;
	char peer_status[64] = "";
	double peer_at = 0, last_check = now();
	while ((st.msgs < msgs && ok(&st)) || outstanding > 0) {
		if (now() > deadline && ok(&st)) {
			fail(&st, "timeout");
			to_err(qp);
		}
		if (now() > deadline + 30)
			break;
		if (now() - last_check > 0.1 && ok(&st)) {
			last_check = now();
			char buf[256];
			ssize_t r = read(fd, buf, sizeof buf);
			if (r == 0 && peer_len + 12 < sizeof peer_line) {
				strcpy(peer_line + peer_len, "DONE closed");
				peer_len += 11;
			} else if (r > 0 && peer_len + r + 1 < sizeof peer_line) {
				memcpy(peer_line + peer_len, buf, r);
				peer_len += r;
				peer_line[peer_len] = 0;
			}
			if (!peer_at && !strncmp(peer_line, "DONE ", 5)) {
				sscanf(peer_line + 5, "%63s", peer_status);
				peer_at = now();
			}
		}
		if (peer_at) {
			int short_ = st.msgs < msgs && now() - peer_at > 2;
			if (ok(&st) && (strcmp(peer_status, "ok") || short_)) {
				fail(&st, "peer:%s", peer_status);
				to_err(qp);
			}
		}
		int n = ibv_poll_cq(cq, BATCH, wc);
		if (n < 0)
			die("ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			outstanding--;
			st.returned++;
			long chunk = wc[i].wr_id == UINT64_MAX ? -1 : (long)wc[i].wr_id;
			if (wc[i].status != IBV_WC_SUCCESS) {
				wc_error(&st, wc[i].status);
				continue;
			}
			st.last_ok = now();
			if (!ok(&st))
				continue;
			uint64_t seq = st.msgs;
			int bad;
			if (op == OP_SEND) {
				bad = check("fault_peer server", (uint8_t *)rmr->addr + chunk * recv_len,
					    msg_size, seq);
			} else if (!(wc[i].wc_flags & IBV_WC_WITH_IMM) ||
				   ntohl(wc[i].imm_data) != (uint32_t)seq) {
				fprintf(stderr, "fault_peer server: write %llu: immediate %s%u\n",
					(unsigned long long)seq,
					wc[i].wc_flags & IBV_WC_WITH_IMM ? "" : "none ",
					ntohl(wc[i].imm_data));
				bad = 1;
			} else {
				/* The library copies out of the exposed region with volatile reads. */
				memcpy(scratch, (uint8_t *)region->addr + seq * msg_size, msg_size);
				bad = check("fault_peer server", scratch, msg_size, seq);
			}
			if (bad)
				fail(&st, "corrupt");
			else
				st.verified++;
			st.msgs++;
			st.bytes += msg_size;
			if (next_post < msgs && ok(&st)) {
				if (post_recv(qp, rmr, recv_len, chunk))
					die("ibv_post_recv: %s", strerror(errno));
				outstanding++;
				next_post++;
				st.posted++;
			}
		}
		if (!ok(&st) && outstanding > 0)
			to_err(qp);
	}
	fcntl(fd, F_SETFL, 0);
	char done[160];
	int dn = snprintf(done, sizeof done, "DONE %s %llu\n", st.status,
			  (unsigned long long)st.verified);
	if (write(fd, done, dn) != dn)
		fprintf(stderr, "fault_peer server: could not send DONE\n");
	/* Keep the responder until the client is done (see fault.rs). */
	if (!strstr(peer_line, "DONE")) {
		double left = deadline + 30 - now();
		struct timeval t = {left > 1 ? (long)left : 1, 0};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
		read_line(fd, line, sizeof line);
	}
	print_stats(&st);
}

/* ---- client ---- */
static void client(const char *host, const struct common *c, enum op op, size_t msg_size,
		   uint64_t total, uint32_t window, double stall_timeout)
{
	if (op == OP_ATOMIC && msg_size != 8)
		die("--op atomic moves 8 bytes per request: --msg-size 8");
	if (op != OP_ATOMIC && msg_size < 16)
		die("--msg-size must be at least 16");
	uint64_t msgs = (total + msg_size - 1) / msg_size;
	struct setup s;
	open_device(c, &s);
	struct stats st;
	stats_init(&st, "client", op);
	struct ibv_pd *pd = ibv_alloc_pd(s.ctx);
	struct ibv_cq *cq = ibv_create_cq(s.ctx, window * 2 + 4, NULL, NULL, 0);
	if (!pd || !cq)
		die("pd/cq: %s", strerror(errno));
	/* Mixed has a message and a fetch-and-add in flight per slot. */
	struct ibv_qp *qp = create_qp(pd, cq, INTERLEAVED(op) ? 2 * window : window, 4);
	uint32_t psn = random_psn();
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	char port[16];
	snprintf(port, sizeof port, "%d", c->tcp_port);
	if (getaddrinfo(host, port, &hints, &ai))
		die("cannot resolve %s", host);
	double t0 = now();
	int fd;
	for (;;) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (!connect(fd, ai->ai_addr, ai->ai_addrlen))
			break;
		close(fd);
		if (now() - t0 > 300)
			die("connect %s:%d: %s", host, c->tcp_port, strerror(errno));
		sleep_ms(200);
	}
	freeaddrinfo(ai);
	struct timeval tv = {c->deadline, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char extra[96], line[4096];
	snprintf(extra, sizeof extra, "op=%s size=%zu msgs=%llu", op_wire[op], msg_size,
		 (unsigned long long)msgs);
	send_hello(fd, qp->qp_num, psn, &s, 0, 0, 0, extra);
	if (read_line(fd, line, sizeof line))
		die("peer closed the exchange");
	struct hello server;
	parse_hello(line, &server);
	connect_qp(&s, c, qp, psn, &server);
	fprintf(stderr, "fault_peer client: connected\n");
	st.start = now();
	struct ibv_mr *mr = reg(pd, msg_size * window, IBV_ACCESS_LOCAL_WRITE);
	struct pool pool;
	pool_init(&pool, window);
	double deadline = now() + c->deadline, last_progress = now();
	struct ibv_wc wc[BATCH];
	uint64_t next = 0, outstanding = 0, done = 0; /* done: completed in order */
	/* The chunk each posted sequence number carries (the Rust program gets
	 * it back with the completion). */
	uint64_t requests = INTERLEAVED(op) ? 2 * msgs : msgs;
	uint32_t *chunk_of = calloc(requests, sizeof *chunk_of);
	if (!chunk_of)
		die("out of memory");
	/* Mixed: the fetch-and-adds' 8-byte results, apart from the messages. */
	struct ibv_mr *rmr = reg(pd, 8 * window, IBV_ACCESS_LOCAL_WRITE);
	struct pool rpool;
	pool_init(&rpool, window);
	/* The server's verdict line, read as it comes (see fault.rs). */
	char verdict[512] = "";
	size_t vlen = 0;
	double last_check = now();
	fcntl(fd, F_SETFL, O_NONBLOCK);
	while ((next < requests && ok(&st)) || outstanding > 0) {
		while (next < requests && ok(&st)) {
			int result = INTERLEAVED(op) && next % 2 == 1;
			struct pool *from = result ? &rpool : &pool;
			if (from->n == 0)
				break;
			uint32_t chunk = from->idx[--from->n];
			uint8_t *buf = result ? (uint8_t *)rmr->addr + (uint64_t)chunk * 8
					      : (uint8_t *)mr->addr + (uint64_t)chunk * msg_size;
			struct ibv_sge sge = {(uintptr_t)buf, result ? 8 : msg_size,
					      result ? rmr->lkey : mr->lkey};
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof wr);
			wr.wr_id = next;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.send_flags = IBV_SEND_SIGNALED;
			/* A result still all 0xa5 was never written (fault.rs POISON). */
			if (result || op == OP_ATOMIC)
				memset(buf, 0xa5, 8);
			if (result) {
				wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
				wr.wr.atomic.remote_addr = server.addr + msgs * msg_size;
				wr.wr.atomic.rkey = server.rkey;
				wr.wr.atomic.compare_add = next / 2 + 1;
			} else if (op == OP_MIXED) {
				if ((next / 2 + 1) * msg_size + 8 > server.len)
					die("server region too small");
				wr.wr.rdma.remote_addr = server.addr + next / 2 * msg_size;
				wr.wr.rdma.rkey = server.rkey;
				wr.opcode = IBV_WR_RDMA_READ;
			} else if (op == OP_MIXED_WRITE) {
				if ((next / 2 + 1) * msg_size + 8 > server.len)
					die("server region too small");
				fill(buf, msg_size, next / 2);
				wr.wr.rdma.remote_addr = server.addr + next / 2 * msg_size;
				wr.wr.rdma.rkey = server.rkey;
				wr.opcode = IBV_WR_RDMA_WRITE;
			} else if (op == OP_SEND) {
				fill(buf, msg_size, next);
				wr.opcode = IBV_WR_SEND;
			} else if (op == OP_ATOMIC) {
				wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
				wr.wr.atomic.remote_addr = server.addr;
				wr.wr.atomic.rkey = server.rkey;
				wr.wr.atomic.compare_add = next + 1;
			} else {
				if ((next + 1) * msg_size > server.len)
					die("server region too small");
				wr.wr.rdma.remote_addr = server.addr + next * msg_size;
				wr.wr.rdma.rkey = server.rkey;
				if (op == OP_WRITE) {
					fill(buf, msg_size, next);
					wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
					wr.imm_data = htonl((uint32_t)next);
				} else {
					wr.opcode = IBV_WR_RDMA_READ;
				}
			}
			int rc = ibv_post_send(qp, &wr, &bad);
			if (rc) {
				fail(&st, "post:ibv_post_send:%s", strerror(rc));
				from->idx[from->n++] = chunk;
			} else {
				chunk_of[next] = chunk;
				next++;
				outstanding++;
				st.posted++;
			}
		}
		if (now() > deadline && ok(&st)) {
			fail(&st, "timeout");
			to_err(qp);
		}
		if (stall_timeout > 0 && outstanding > 0 && ok(&st) && !st.watchdog &&
		    now() - last_progress > stall_timeout) {
			fprintf(stderr,
				"fault_peer client: no completion for %.1f s with %llu outstanding: "
				"moving the QP to ERR (progress watchdog)\n",
				stall_timeout, (unsigned long long)outstanding);
			st.watchdog = 1;
			to_err(qp);
		}
		if (now() > deadline + 30)
			break;
		if (!strchr(verdict, '\n') && now() - last_check > 0.1) {
			last_check = now();
			ssize_t r = read(fd, verdict + vlen, sizeof verdict - 1 - vlen);
			if (r > 0) {
				vlen += r;
				verdict[vlen] = 0;
			}
			/* A closed exchange is no verdict (a killed server is the
			 * transport's to report). */
			char status[64];
			if (strchr(verdict, '\n') && sscanf(verdict, "DONE %63s", status) == 1 &&
			    strcmp(status, "ok") && ok(&st)) {
				fail(&st, "peer:%s", status);
				to_err(qp);
			}
		}
		int n = ibv_poll_cq(cq, BATCH, wc);
		if (n < 0)
			die("ibv_poll_cq: %d", n);
		for (int i = 0; i < n; i++) {
			last_progress = now();
			outstanding--;
			st.returned++;
			uint64_t id = wc[i].wr_id;
			uint32_t chunk = id < requests ? chunk_of[id] : 0;
			/* The fetch-and-adds: request i of Atomic, i / 2 of the
			 * interleaved ops. */
			int result = INTERLEAVED(op) && id % 2 == 1;
			if (wc[i].status != IBV_WC_SUCCESS) {
				wc_error(&st, wc[i].status);
			} else if (ok(&st)) {
				st.last_ok = now();
				if (id != done) {
					fprintf(stderr,
						"fault_peer client: completion %llu out of order (expected %llu)\n",
						(unsigned long long)id, (unsigned long long)done);
					fail(&st, "corrupt");
				}
				if (op == OP_ATOMIC || result) {
					uint64_t got, k = result ? id / 2 : id;
					memcpy(&got,
					       result ? (uint8_t *)rmr->addr + (uint64_t)chunk * 8
						      : (uint8_t *)mr->addr + (uint64_t)chunk * msg_size,
					       8);
					uint64_t want = atomic_expected(k);
					if (got == 0xa5a5a5a5a5a5a5a5ull) {
						fprintf(stderr,
							"fault_peer client: fetch-and-add %llu completed successfully with its "
							"result never written (still the poison from before posting), "
							"expected %llu\n",
							(unsigned long long)k, (unsigned long long)want);
						fail(&st, "corrupt");
					} else if (got != want) {
						uint64_t diff = got - want;
						fprintf(stderr,
							"fault_peer client: fetch-and-add %llu found %llu, expected %llu "
							"(difference %llu)\n",
							(unsigned long long)k, (unsigned long long)got,
							(unsigned long long)want, (unsigned long long)diff);
						fail(&st, "corrupt");
					} else if (!result) {
						st.verified++;
					}
				}
				if (op == OP_READ || (op == OP_MIXED && !result)) {
					if (check("fault_peer client",
						  (uint8_t *)mr->addr + (uint64_t)chunk * msg_size, msg_size,
						  op == OP_MIXED ? id / 2 : id))
						fail(&st, "corrupt");
					else
						st.verified++;
				}
				done++;
				/* The interleaved ops count their messages (the reads,
				 * each checked here, or the writes the server checks). */
				if (!result) {
					st.msgs++;
					st.bytes += msg_size;
				}
			}
			if (id < requests) {
				if (result)
					rpool.idx[rpool.n++] = chunk;
				else
					pool.idx[pool.n++] = chunk;
			}
		}
	}
	fcntl(fd, F_SETFL, 0);
	char msg[160];
	int mn = snprintf(msg, sizeof msg, "DONE %s\n", st.status);
	if (write(fd, msg, mn) != mn)
		fprintf(stderr, "fault_peer client: could not send DONE\n");
	if ((op == OP_SEND || op == OP_WRITE || op == OP_MIXED_WRITE) && ok(&st)) {
		int got = 0;
		if (strchr(verdict, '\n')) {
			snprintf(line, sizeof line, "%s", verdict);
		} else {
			/* The rest of a line begun in `verdict`. */
			size_t have = strlen(verdict);
			memcpy(line, verdict, have);
			got = read_line(fd, line + have, sizeof line - have);
		}
		if (got == 0) {
			char status[64] = "?";
			unsigned long long v = 0;
			sscanf(line, "DONE %63s %llu", status, &v);
			st.verified = v;
			if (strcmp(status, "ok"))
				fail(&st, "peer:%s", status);
		} else {
			fail(&st, "peer:peer closed the exchange");
		}
	}
	print_stats(&st);
}

static void usage(void)
{
	fprintf(stderr, "usage: fault_peer_c server|client HOST [options] (see the source)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct common c = {NULL, 0, 7000, 14, 7, 7, 300};
	enum op op = OP_SEND;
	size_t msg_size = 65536;
	uint64_t total = 64ULL << 20;
	long window = 16, recv_delay_ms = 0;
	double stall_timeout = 0;
	const char *host = NULL;
	if (argc < 2)
		usage();
	int is_client = !strcmp(argv[1], "client");
	if (!is_client && strcmp(argv[1], "server"))
		usage();
	int i = 2;
	if (is_client) {
		if (argc < 3)
			usage();
		host = argv[i++];
	}
	for (; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
		if (OPT("-d") || OPT("--device"))
			c.device = v;
		else if (OPT("-i") || OPT("--ib-port"))
			c.port_num = atoi(v);
		else if (OPT("-p") || OPT("--tcp-port"))
			c.tcp_port = atoi(v);
		else if (OPT("--timeout"))
			c.timeout = atoi(v);
		else if (OPT("--retry-cnt"))
			c.retry_cnt = atoi(v);
		else if (OPT("--rnr-retry"))
			c.rnr_retry = atoi(v);
		else if (OPT("--deadline"))
			c.deadline = atol(v);
		else if (OPT("--recv-delay-ms"))
			recv_delay_ms = atol(v);
		else if (OPT("--op")) {
			if (!strcmp(v, "send"))
				op = OP_SEND;
			else if (!strcmp(v, "write"))
				op = OP_WRITE;
			else if (!strcmp(v, "read"))
				op = OP_READ;
			else if (!strcmp(v, "atomic"))
				op = OP_ATOMIC;
			else if (!strcmp(v, "mixed"))
				op = OP_MIXED;
			else if (!strcmp(v, "mixed-write"))
				op = OP_MIXED_WRITE;
			else
				usage();
		} else if (OPT("--msg-size"))
			msg_size = strtoull(v, NULL, 10);
		else if (OPT("--total"))
			total = strtoull(v, NULL, 10);
		else if (OPT("--window"))
			window = atol(v);
		else if (OPT("--stall-timeout"))
			stall_timeout = atof(v);
		else {
			fprintf(stderr, "fault_peer_c: unknown argument %s\n", a);
			usage();
		}
#undef OPT
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (is_client)
		client(host, &c, op, msg_size, total, window < 1 ? 1 : window > 512 ? 512 : window,
		       stall_timeout);
	else
		server(&c, recv_delay_ms);
	return 0;
}
