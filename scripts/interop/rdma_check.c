/* rdma_check: one RC connection between two verbs devices (either libibverbs: rdma-core's
 * on rxe, or softhca's drop-in), for the operations and error paths that Debian's pingpongs
 * and perftest 4.5 do not cover. The client is the requester, the server the responder; the
 * two exchange QP numbers, PSNs, GIDs and the server's buffer over TCP, as the pingpongs do.
 *
 *   server: rdma_check -d DEV -g GIDX -t TEST [-m MTU] [-n N] [-s SIZE] [-p PORT]
 *   client: rdma_check -d DEV -g GIDX -t TEST [...] SERVER_IP
 *
 * Tests (each side prints RESULT lines, then "VERDICT PASS" or "VERDICT FAIL <why>", and
 * exits 0 on PASS):
 *   ops      RDMA Write, Write with Immediate, Send with Immediate, RDMA Read, Fetch & Add,
 *            Compare & Swap; every byte and value checked on both ends
 *   stream   N Writes and N Reads of SIZE bytes, 16 in flight; the client checks every Read,
 *            the server every Write (run under netem loss/duplication/reordering)
 *   badrkey  a Write with a wrong R_Key: the client must complete it with Remote Access
 *            Error; the server reports its QP state and what its posted Receive became
 *   rnr0     a Send to a server that posts no Receive, RNR Retry Count 0: RNR Retry Exceeded
 *   rnr7     the same with RNR Retry Count 7 (infinite); the server posts the Receive 1 s
 *            late and the Send must succeed
 *   errmid   a stream of Sends; the server moves its QP to Error after 10 Receives, then the
 *            client sends on: it must end with Transport Retry Exceeded, then flushes
 *   destroy  the same, but the server destroys its QP after 10 Receives
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 16
#define SEND_SIZE 1024
#define IMM_WRITE 0x1234abcdu
#define IMM_SEND 0x5678ef01u

struct info {
	uint32_t qpn, psn, rkey, pad;
	uint64_t addr;
	uint8_t gid[16];
};

static const char *dev_name = NULL, *server = NULL, *test = "ops";
static int gidx = 0, mtu = 1024, iters = 64, port = 18600;
static size_t size = 65536;
static int is_server;

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static uint8_t *buf;
static size_t buf_len;
static struct info local, remote;
static int sock = -1;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("VERDICT FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	exit(1);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* buffer layout: write area N*SIZE | read area N*SIZE | imm area SIZE | send area | atomic */
static size_t off_write(int i) { return (size_t)i * size; }
static size_t off_read(int i) { return (size_t)iters * size + (size_t)i * size; }
static size_t off_imm(void) { return 2 * (size_t)iters * size; }
static size_t off_send(void) { return off_imm() + size; }
static size_t off_atomic(void) { return off_send() + SEND_SIZE; }

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t j = 0; j < n; j++)
		p[j] = (uint8_t)(seed * 131u + j * 7u + (j >> 9) + 1u);
}

static size_t mismatch(const uint8_t *p, size_t n, unsigned seed)
{
	for (size_t j = 0; j < n; j++)
		if (p[j] != (uint8_t)(seed * 131u + j * 7u + (j >> 9) + 1u))
			return j + 1;
	return 0;
}

static void xfer(void *p, size_t n, int out)
{
	uint8_t *b = p;
	while (n) {
		ssize_t r = out ? write(sock, b, n) : read(sock, b, n);
		if (r <= 0)
			die("tcp %s: %s", out ? "write" : "read", r ? strerror(errno) : "peer closed");
		b += r;
		n -= (size_t)r;
	}
}

static void sync_send(char c) { xfer(&c, 1, 1); }
static char sync_wait(void)
{
	char c;
	xfer(&c, 1, 0);
	return c;
}

static void tcp_connect(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	if (is_server) {
		int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		a.sin_addr.s_addr = htonl(INADDR_ANY);
		if (bind(l, (void *)&a, sizeof a) || listen(l, 1))
			die("listen on %d: %s", port, strerror(errno));
		sock = accept(l, NULL, NULL);
		close(l);
	} else {
		if (inet_pton(AF_INET, server, &a.sin_addr) != 1)
			die("bad server address %s", server);
		for (int i = 0; i < 100; i++) {
			sock = socket(AF_INET, SOCK_STREAM, 0);
			if (connect(sock, (void *)&a, sizeof a) == 0)
				break;
			close(sock);
			sock = -1;
			usleep(100000);
		}
	}
	if (sock < 0)
		die("tcp connection failed");
}

static enum ibv_mtu mtu_enum(int m)
{
	switch (m) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	die("bad mtu %d", m);
	return IBV_MTU_1024;
}

static void setup(int rnr_retry, int timeout, int retry_cnt, int min_rnr)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n), *dev = NULL;
	for (int i = 0; l && i < n; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(l[i]), dev_name))
			dev = dev ? dev : l[i];
	if (!dev)
		die("device %s not found", dev_name ? dev_name : "(any)");
	ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device: %s", strerror(errno));
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4 * iters + 4 * DEPTH + 64, NULL, NULL, 0);
	buf_len = off_atomic() + 64;
	buf = aligned_alloc(4096, (buf_len + 4095) & ~(size_t)4095);
	if (!pd || !cq || !buf)
		die("pd/cq/buffer: %s", strerror(errno));
	memset(buf, 0, buf_len);
	mr = ibv_reg_mr(pd, buf, buf_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		die("ibv_reg_mr: %s", strerror(errno));
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 2 * DEPTH + 8, .max_recv_wr = iters + 8,
			.max_send_sge = 1, .max_recv_sge = 1},
	};
	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	union ibv_gid g;
	if (ibv_query_gid(ctx, 1, gidx, &g))
		die("ibv_query_gid %d", gidx);
	srand48(getpid() ^ (long)time(NULL));
	local = (struct info){.qpn = qp->qp_num, .psn = (uint32_t)lrand48() & 0xffffff,
			      .rkey = mr->rkey, .addr = (uintptr_t)buf};
	memcpy(local.gid, g.raw, 16);

	tcp_connect();
	if (is_server) {
		xfer(&remote, sizeof remote, 0);
		xfer(&local, sizeof local, 1);
	} else {
		xfer(&local, sizeof local, 1);
		xfer(&remote, sizeof remote, 0);
	}
	char gs[64];
	inet_ntop(AF_INET6, remote.gid, gs, sizeof gs);
	printf("RESULT local_qpn=0x%06x remote_qpn=0x%06x remote_gid=%s mtu=%d\n", local.qpn,
	       remote.qpn, gs, mtu);

	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify to INIT: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu_enum(mtu);
	a.dest_qp_num = remote.qpn;
	a.rq_psn = remote.psn;
	a.max_dest_rd_atomic = 8;
	a.min_rnr_timer = (uint8_t)min_rnr;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
	a.ah_attr.grh.sgid_index = (uint8_t)gidx;
	a.ah_attr.grh.hop_limit = 64;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify to RTR: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = local.psn;
	a.timeout = (uint8_t)timeout;
	a.retry_cnt = (uint8_t)retry_cnt;
	a.rnr_retry = (uint8_t)rnr_retry;
	a.max_rd_atomic = 8;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				   IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify to RTS: %s", strerror(errno));
}

static void post_recv(uint64_t id, size_t off, size_t len)
{
	struct ibv_sge s = {.addr = (uintptr_t)buf + off, .length = (uint32_t)len, .lkey = mr->lkey};
	struct ibv_recv_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1}, *bad;
	if (ibv_post_recv(qp, &w, &bad))
		die("ibv_post_recv: %s", strerror(errno));
}

static int post(uint64_t id, enum ibv_wr_opcode op, size_t off, size_t len, uint64_t raddr,
		uint32_t rkey, uint32_t imm, uint64_t cmp, uint64_t swap)
{
	struct ibv_sge s = {.addr = (uintptr_t)buf + off, .length = (uint32_t)len, .lkey = mr->lkey};
	struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op,
				.send_flags = IBV_SEND_SIGNALED}, *bad;
	w.imm_data = htonl(imm);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		w.wr.atomic.remote_addr = raddr;
		w.wr.atomic.rkey = rkey;
		w.wr.atomic.compare_add = cmp;
		w.wr.atomic.swap = swap;
	} else {
		w.wr.rdma.remote_addr = raddr;
		w.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &w, &bad);
}

/* wait up to ms for one completion; 0 if none came */
static int poll1(struct ibv_wc *wc, double ms)
{
	double end = now() + ms / 1000;
	do {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("ibv_poll_cq: %d", n);
		if (n)
			return 1;
	} while (now() < end);
	return 0;
}

static void expect_ok(struct ibv_wc *wc, const char *what)
{
	if (!poll1(wc, 60000))
		die("%s: no completion in 60 s", what);
	if (wc->status != IBV_WC_SUCCESS)
		die("%s: completion status %s (%d)", what, ibv_wc_status_str(wc->status), wc->status);
}

static const char *state_str(void)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	static const char *n[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return "query-failed";
	return a.qp_state <= IBV_QPS_ERR ? n[a.qp_state] : "unknown";
}

static int test_ops(void)
{
	struct ibv_wc wc;
	uint64_t *atom = (uint64_t *)(buf + off_atomic());
	if (is_server) {
		fill(buf + off_read(0), size, 3);
		*atom = 100;
		post_recv(1, off_imm(), size);          /* consumed by the Write with Immediate */
		post_recv(2, off_send(), SEND_SIZE);    /* the Send with Immediate */
		sync_send('r');
		int fails = 0;
		for (int k = 0; k < 2; k++) {
			expect_ok(&wc, "server receive");
			if (wc.wr_id == 1) {
				int ok = wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc.wc_flags & IBV_WC_WITH_IMM) &&
					 ntohl(wc.imm_data) == IMM_WRITE;
				printf("RESULT write_imm_cqe opcode=%d imm=0x%08x byte_len=%u %s\n", wc.opcode,
				       ntohl(wc.imm_data), wc.byte_len, ok ? "ok" : "BAD");
				fails += !ok;
			} else {
				int ok = wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) &&
					 ntohl(wc.imm_data) == IMM_SEND && wc.byte_len == SEND_SIZE &&
					 !mismatch(buf + off_send(), SEND_SIZE, 5);
				printf("RESULT send_imm_cqe opcode=%d imm=0x%08x byte_len=%u %s\n", wc.opcode,
				       ntohl(wc.imm_data), wc.byte_len, ok ? "ok" : "BAD");
				fails += !ok;
			}
		}
		if (sync_wait() != 'd')
			die("protocol");
		size_t m1 = mismatch(buf + off_write(0), size, 1), m2 = mismatch(buf + off_imm(), size, 2);
		printf("RESULT write_data %s\nRESULT write_imm_data %s\nRESULT atomic_final=%llu %s\n",
		       m1 ? "BAD" : "ok", m2 ? "BAD" : "ok", (unsigned long long)*atom,
		       *atom == 7 ? "ok" : "BAD");
		fails += !!m1 + !!m2 + (*atom != 7);
		sync_send('v');
		return fails ? -1 : 0;
	}
	fill(buf + off_write(0), size, 1);
	fill(buf + off_imm(), size, 2);
	fill(buf + off_send(), SEND_SIZE, 5);
	if (sync_wait() != 'r')
		die("protocol");
	uint64_t ra = remote.addr;
	if (post(1, IBV_WR_RDMA_WRITE, off_write(0), size, ra + off_write(0), remote.rkey, 0, 0, 0))
		die("post write");
	expect_ok(&wc, "RDMA Write");
	if (post(2, IBV_WR_RDMA_WRITE_WITH_IMM, off_imm(), size, ra + off_imm(), remote.rkey, IMM_WRITE, 0, 0))
		die("post write imm");
	expect_ok(&wc, "RDMA Write with Immediate");
	if (post(3, IBV_WR_SEND_WITH_IMM, off_send(), SEND_SIZE, 0, 0, IMM_SEND, 0, 0))
		die("post send imm");
	expect_ok(&wc, "Send with Immediate");
	if (post(4, IBV_WR_RDMA_READ, off_read(0), size, ra + off_read(0), remote.rkey, 0, 0, 0))
		die("post read");
	expect_ok(&wc, "RDMA Read");
	size_t m = mismatch(buf + off_read(0), size, 3);
	printf("RESULT read_data %s\n", m ? "BAD" : "ok");
	uint64_t *atom_l = (uint64_t *)(buf + off_atomic());
	*atom_l = 0;
	if (post(5, IBV_WR_ATOMIC_FETCH_AND_ADD, off_atomic(), 8, ra + off_atomic(), remote.rkey, 0, 5, 0))
		die("post faa");
	expect_ok(&wc, "Fetch and Add");
	uint64_t faa = *atom_l;
	if (post(6, IBV_WR_ATOMIC_CMP_AND_SWP, off_atomic(), 8, ra + off_atomic(), remote.rkey, 0, 105, 7))
		die("post cas");
	expect_ok(&wc, "Compare and Swap");
	uint64_t cas = *atom_l;
	printf("RESULT faa_old=%llu %s cas_old=%llu %s\n", (unsigned long long)faa, faa == 100 ? "ok" : "BAD",
	       (unsigned long long)cas, cas == 105 ? "ok" : "BAD");
	sync_send('d');
	if (sync_wait() != 'v')
		die("protocol");
	return (m || faa != 100 || cas != 105) ? -1 : 0;
}

static int test_stream(void)
{
	struct ibv_wc wc;
	if (is_server) {
		for (int i = 0; i < iters; i++)
			fill(buf + off_read(i), size, 1000u + (unsigned)i);
		sync_send('r');
		if (sync_wait() != 'd')
			die("protocol");
		int bad = 0;
		for (int i = 0; i < iters; i++)
			bad += !!mismatch(buf + off_write(i), size, (unsigned)i);
		printf("RESULT server_checked_writes=%d bad=%d\n", iters, bad);
		sync_send('v');
		return bad ? -1 : 0;
	}
	for (int i = 0; i < iters; i++)
		fill(buf + off_write(i), size, (unsigned)i);
	if (sync_wait() != 'r')
		die("protocol");
	double t0 = now();
	int posted = 0, done = 0, bad = 0, total = 2 * iters;
	while (done < total) {
		while (posted < total && posted - done < DEPTH) {
			int i = posted / 2, rd = posted % 2;
			if (post((uint64_t)posted, rd ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE,
				 rd ? off_read(i) : off_write(i), size,
				 remote.addr + (rd ? off_read(i) : off_write(i)), remote.rkey, 0, 0, 0))
				die("post %d: %s", posted, strerror(errno));
			posted++;
		}
		expect_ok(&wc, "stream");
		if (wc.wr_id % 2)
			bad += !!mismatch(buf + off_read((int)(wc.wr_id / 2)), size, 1000u + (unsigned)(wc.wr_id / 2));
		done++;
	}
	double dt = now() - t0;
	printf("RESULT writes=%d reads=%d bytes=%zu seconds=%.2f read_bad=%d\n", iters, iters,
	       2 * (size_t)iters * size, dt, bad);
	sync_send('d');
	if (sync_wait() != 'v')
		die("protocol");
	return bad ? -1 : 0;
}

static int test_badrkey(void)
{
	struct ibv_wc wc;
	if (is_server) {
		post_recv(9, off_send(), SEND_SIZE);
		sync_send('r');
		if (sync_wait() != 'd')
			die("protocol");
		int got = poll1(&wc, 1500);
		printf("RESULT server_qp_state=%s server_recv=%s\n", state_str(),
		       got ? ibv_wc_status_str(wc.status) : "none");
		sync_send('v');
		return 0; /* informational: the requester's status is the check */
	}
	if (sync_wait() != 'r')
		die("protocol");
	uint32_t bad_rkey = remote.rkey ^ 0x5a5a5a00u;
	if (post(1, IBV_WR_RDMA_WRITE, off_write(0), size, remote.addr, bad_rkey, 0, 0, 0))
		die("post write");
	if (!poll1(&wc, 60000))
		die("no completion for the bad-R_Key Write in 60 s");
	printf("RESULT client_status=%s (%d) client_qp_state=%s\n", ibv_wc_status_str(wc.status),
	       wc.status, state_str());
	sync_send('d');
	sync_wait();
	if (wc.status != IBV_WC_REM_ACCESS_ERR)
		die("expected remote access error, got %s", ibv_wc_status_str(wc.status));
	return 0;
}

static int test_rnr(int retry)
{
	struct ibv_wc wc;
	if (is_server) {
		sync_send('r');
		if (retry == 7) {
			usleep(1000000);
			post_recv(9, off_send(), SEND_SIZE);
			expect_ok(&wc, "late receive");
			printf("RESULT server_recv=%s byte_len=%u\n", ibv_wc_status_str(wc.status), wc.byte_len);
		}
		if (sync_wait() != 'd')
			die("protocol");
		printf("RESULT server_qp_state=%s\n", state_str());
		sync_send('v');
		return 0;
	}
	fill(buf + off_send(), SEND_SIZE, 5);
	if (sync_wait() != 'r')
		die("protocol");
	double t0 = now();
	if (post(1, IBV_WR_SEND, off_send(), SEND_SIZE, 0, 0, 0, 0, 0))
		die("post send");
	if (!poll1(&wc, 60000))
		die("no completion for the Send in 60 s");
	printf("RESULT client_status=%s (%d) after %.2f s client_qp_state=%s\n",
	       ibv_wc_status_str(wc.status), wc.status, now() - t0, state_str());
	sync_send('d');
	sync_wait();
	enum ibv_wc_status want = retry ? IBV_WC_SUCCESS : IBV_WC_RNR_RETRY_EXC_ERR;
	if (wc.status != want)
		die("expected %s, got %s", ibv_wc_status_str(want), ibv_wc_status_str(wc.status));
	return 0;
}

static int test_errmid(int destroy)
{
	struct ibv_wc wc;
	int n = iters;
	if (is_server) {
		for (int i = 0; i < n; i++)
			post_recv((uint64_t)i, off_write(i % 4), SEND_SIZE);
		sync_send('r');
		int ok = 0;
		while (ok < 10) {
			expect_ok(&wc, "receive");
			ok++;
		}
		if (destroy) {
			if (ibv_destroy_qp(qp))
				die("ibv_destroy_qp: %s", strerror(errno));
			printf("RESULT server_received=%d then destroyed its QP\n", ok);
			sync_send('e');
		} else {
			struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
			if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
				die("modify to ERR: %s", strerror(errno));
			sync_send('e');
			int more = 0, flushed = 0, other = 0;
			while (poll1(&wc, 1000)) {
				if (wc.status == IBV_WC_SUCCESS)
					more++;
				else if (wc.status == IBV_WC_WR_FLUSH_ERR)
					flushed++;
				else
					other++;
			}
			printf("RESULT server_received=%d then_error_state=%s late_success=%d flushed=%d other=%d\n",
			       ok, state_str(), more, flushed, other);
			if (ok + more + flushed != n)
				die("posted %d receives, %d came back", n, ok + more + flushed);
		}
		sync_wait();
		sync_send('v');
		return 0;
	}
	if (sync_wait() != 'r')
		die("protocol");
	fill(buf + off_send(), SEND_SIZE, 5);
	double t0 = now();
	int posted = 0, done = 0, succ = 0, flush = 0, other = 0;
	enum ibv_wc_status first_err = IBV_WC_SUCCESS;
	while (done < n) {
		/* the first 10 Sends, then the rest once the server's QP is in Error (or gone) */
		if (posted == 10 && done == 10) {
			if (sync_wait() != 'e')
				die("protocol");
			t0 = now();
		}
		while (posted < n && posted - done < 4 && first_err == IBV_WC_SUCCESS &&
		       (posted < 10 || done >= 10)) {
			if (post((uint64_t)posted, IBV_WR_SEND, off_send(), SEND_SIZE, 0, 0, 0, 0, 0))
				die("post send: %s", strerror(errno));
			posted++;
		}
		if (!poll1(&wc, 60000))
			die("no completion in 60 s (%d of %d done)", done, posted);
		done++;
		if (wc.status == IBV_WC_SUCCESS)
			succ++;
		else if (first_err == IBV_WC_SUCCESS)
			first_err = wc.status;
		else if (wc.status == IBV_WC_WR_FLUSH_ERR)
			flush++;
		else
			other++;
		if (first_err != IBV_WC_SUCCESS && done == posted)
			break;
	}
	printf("RESULT client_success=%d first_error=%s (%d) after %.2f s, then flushed=%d other=%d client_qp_state=%s\n",
	       succ, ibv_wc_status_str(first_err), first_err, now() - t0, flush, other, state_str());
	sync_send('d');
	sync_wait();
	if (first_err != IBV_WC_RETRY_EXC_ERR)
		die("expected transport retry counter exceeded, got %s", ibv_wc_status_str(first_err));
	if (succ < 10)
		die("only %d Sends succeeded before the error", succ);
	return 0;
}

int main(int argc, char **argv)
{
	int c;
	setvbuf(stdout, NULL, _IOLBF, 0);
	while ((c = getopt(argc, argv, "d:g:m:n:s:p:t:")) != -1) {
		switch (c) {
		case 'd': dev_name = optarg; break;
		case 'g': gidx = atoi(optarg); break;
		case 'm': mtu = atoi(optarg); break;
		case 'n': iters = atoi(optarg); break;
		case 's': size = strtoul(optarg, NULL, 0); break;
		case 'p': port = atoi(optarg); break;
		case 't': test = optarg; break;
		default:
			fprintf(stderr, "usage: %s -d DEV -g GIDX -t ops|stream|badrkey|rnr0|rnr7|errmid|destroy "
					"[-m MTU] [-n N] [-s SIZE] [-p PORT] [SERVER]\n", argv[0]);
			return 2;
		}
	}
	if (optind < argc)
		server = argv[optind];
	is_server = server == NULL;
	if (iters < 12)
		iters = 12;
	/* requester parameters: retry 7 is infinite on rxe, so the error tests use 3; the others
	 * use 7 with 67 ms */
	int rnr_retry = 7, timeout = 14, retry_cnt = 7, min_rnr = 12;
	if (!strcmp(test, "rnr0"))
		rnr_retry = 0;
	if (!strcmp(test, "rnr7") || !strcmp(test, "rnr0"))
		min_rnr = 18; /* 7.68 ms between RNR retries */
	if (!strcmp(test, "errmid") || !strcmp(test, "destroy")) {
		timeout = 16; /* 268 ms: the emulated guest can stall a responder for 0.7 s */
		retry_cnt = 3;
	}
	setup(rnr_retry, timeout, retry_cnt, min_rnr);
	int r;
	if (!strcmp(test, "ops"))
		r = test_ops();
	else if (!strcmp(test, "stream"))
		r = test_stream();
	else if (!strcmp(test, "badrkey"))
		r = test_badrkey();
	else if (!strcmp(test, "rnr0"))
		r = test_rnr(0);
	else if (!strcmp(test, "rnr7"))
		r = test_rnr(7);
	else if (!strcmp(test, "errmid"))
		r = test_errmid(0);
	else if (!strcmp(test, "destroy"))
		r = test_errmid(1);
	else
		die("unknown test %s", test);
	if (r)
		die("data or completion check failed (see RESULT lines)");
	printf("VERDICT PASS\n");
	return 0;
}
