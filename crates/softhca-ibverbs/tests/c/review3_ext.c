/* Review findings on contexts, the shared device and the extended verbs of the drop-in
   libibverbs.so.1, each checked against what rdma-core's libibverbs (with rxe) does. The
   argument names the case; prints "<case>: ok" and exits 0, or names the first failed check.
   Alarms and deadlines are hang guards only. */
#include <pthread.h>
#include <stdatomic.h>
#include <arpa/inet.h>
#define TEST_NAME "review3_ext"
#include "verbs_test.h"

static struct ibv_context *open_ctx(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	CHECK(ctx, "ibv_open_device");
	return ctx;
}

/* ---- close_wakes_async_waiter ---- */

struct waiter {
	struct ibv_context *ctx;
	int ret, err;
	atomic_int started;
};

static void *wait_async(void *p)
{
	struct waiter *w = p;
	struct ibv_async_event ev;
	atomic_store(&w->started, 1);
	errno = 0;
	w->ret = ibv_get_async_event(w->ctx, &ev);
	w->err = errno;
	return NULL;
}

/* A thread blocked in ibv_get_async_event while another closes the context: Linux closes
   the async event queue with the context (ib_uverbs_free_event_queue) and the blocked read
   returns -EIO, so libibverbs' ibv_get_async_event returns -1 with errno EIO. */
static void close_wakes_async_waiter(void)
{
	struct waiter w = { .ctx = open_ctx() };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, wait_async, &w) == 0, "pthread_create");
	while (!atomic_load(&w.started))
		usleep(1000);
	usleep(200 * 1000); /* let it block */
	CHECK(ibv_close_device(w.ctx) == 0, "ibv_close_device");
	CHECK(pthread_join(t, NULL) == 0, "pthread_join");
	CHECK(w.ret == -1 && w.err == EIO, "ibv_get_async_event after close: %d errno %d", w.ret, w.err);
}

/* ---- close_stops_qps ---- */

/* Two contexts on the one device, an RC pair between them; context a is closed with its QP,
   PD and MR still there. Linux destroys a context's objects when it is closed (the kernel
   releases every uobject of the closed command file), so a's QP no longer answers and its
   memory is no longer a target: b's RDMA Write fails and a's buffer stays as it was. */
static void close_stops_qps(void)
{
	struct end a, b;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	setup_end(&a, open_ctx(), IBV_QPT_RC, access, 4096);
	setup_end(&b, open_ctx(), IBV_QPT_RC, access, 4096);
	connect_rc(&a, &b, access, 1);
	connect_rc(&b, &a, access, 1);

	memset(b.buf, 'x', 64);
	struct ibv_sge s = { (uintptr_t)b.buf, 64, b.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.rdma.remote_addr = (uintptr_t)a.buf;
	w.wr.rdma.rkey = a.mr->rkey;
	CHECK(ibv_post_send(b.qp, &w, &bad) == 0, "first write");
	struct ibv_wc wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && a.buf[0] == 'x', "first write: %s", ibv_wc_status_str(wc.status));

	CHECK(ibv_close_device(a.ctx) == 0, "ibv_close_device(a)");
	memset(b.buf, 'y', 64);
	w.wr_id = 2;
	CHECK(ibv_post_send(b.qp, &w, &bad) == 0, "second write");
	wc = wait_one(b.cq);
	CHECK(wc.wr_id == 2 && wc.status != IBV_WC_SUCCESS, "a write to a closed context's QP: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(a.buf[0] == 'x', "the closed context's memory was written");
}

/* ---- wr_exclusive / cq_ex_exclusive: a pair of RC QPs on one context ---- */

enum { PER_THREAD = 4000, SQ = 256, CQE = 4096 };

struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cqx;
	struct ibv_cq *cq;
	struct ibv_cq *peer_cq;
	struct ibv_qp *qp, *peer;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static void open_pair(struct pair *p)
{
	p->ctx = open_ctx();
	CHECK(ibv_query_gid(p->ctx, 1, 0, &p->gid) == 0, "ibv_query_gid");
	p->pd = ibv_alloc_pd(p->ctx);
	struct ibv_cq_init_attr_ex ca = { .cqe = CQE, .wc_flags = IBV_WC_STANDARD_FLAGS };
	p->cqx = ibv_create_cq_ex(p->ctx, &ca);
	CHECK(p->pd && p->cqx, "pd, cq ex");
	p->cq = ibv_cq_ex_to_cq(p->cqx);
	p->peer_cq = ibv_create_cq(p->ctx, 16, NULL, NULL, 0);
	p->buf = calloc(1, 4096);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	p->mr = ibv_reg_mr(p->pd, p->buf, 4096, access);
	CHECK(p->peer_cq && p->mr, "peer cq, mr");
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = SQ, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 16 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = p->pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
	};
	p->qp = ibv_create_qp_ex(p->ctx, &qa);
	CHECK(p->qp, "ibv_create_qp_ex: %d", errno);
	p->qpx = ibv_qp_to_qp_ex(p->qp);
	qa.send_cq = qa.recv_cq = p->peer_cq;
	p->peer = ibv_create_qp_ex(p->ctx, &qa);
	CHECK(p->qpx && p->peer, "qp ex, peer");
	struct end x = { .ctx = p->ctx, .qp = p->qp, .gid = p->gid };
	struct end y = { .ctx = p->ctx, .qp = p->peer, .gid = p->gid };
	connect_rc(&x, &y, access, 1);
	connect_rc(&y, &x, access, 1);
}

static atomic_int seen[2 * PER_THREAD];
static atomic_int recorded, posted;

/* Waits while SQ requests are posted whose completions were not polled yet: an SQ slot is
   free once its WQE completed, before its CQE is polled, so the SQ alone does not keep the
   CQ from overflowing. */
static void throttle(void)
{
	while (atomic_load(&posted) - atomic_load(&recorded) >= SQ)
		sched_yield();
}

static void record(uint64_t id, int status)
{
	CHECK(id < 2 * PER_THREAD, "a completion of wr_id %llu", (unsigned long long)id);
	CHECK(status == IBV_WC_SUCCESS, "wr_id %llu: %s", (unsigned long long)id, ibv_wc_status_str(status));
	atomic_fetch_add(&seen[id], 1);
	atomic_fetch_add(&recorded, 1);
}

static void check_seen(int n)
{
	for (int i = 0; i < n; i++)
		CHECK(atomic_load(&seen[i]) == 1, "wr_id %d completed %d times", i, atomic_load(&seen[i]));
}

struct poster {
	struct pair *p;
	int first;
};

/* Posts PER_THREAD signaled 8-byte inline RDMA Writes through the builder, one per batch,
   retrying a batch the full SQ refused (ENOMEM). */
static void *post_builder(void *arg)
{
	struct poster *t = arg;
	struct pair *p = t->p;
	for (int i = 0; i < PER_THREAD; i++) {
		uint64_t v = t->first + i;
		throttle();
		for (;;) {
			ibv_wr_start(p->qpx);
			p->qpx->wr_id = t->first + i;
			p->qpx->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(p->qpx, p->mr->rkey, (uintptr_t)p->buf + 8 * (t->first != 0));
			sched_yield(); /* the program's own work inside its critical section */
			ibv_wr_set_inline_data(p->qpx, &v, 8);
			int r = ibv_wr_complete(p->qpx);
			if (r == 0) {
				atomic_fetch_add(&posted, 1);
				break;
			}
			CHECK(r == ENOMEM, "ibv_wr_complete: %d", r);
			sched_yield();
		}
	}
	return NULL;
}

/* The builder's critical section: "The provider will provide locking to ensure that
   ibv_wr_start() and ibv_wr_complete()/abort() form a per-QP critical section where no other
   threads can enter" (ibv_wr_post(3); rxe and mlx5 hold the SQ lock from wr_start to
   wr_complete). Two threads post through one QP's builder: every request is posted once. */
static void wr_exclusive(void)
{
	struct pair p;
	open_pair(&p);
	struct poster t0 = { &p, 0 }, t1 = { &p, PER_THREAD };
	pthread_t a, b;
	CHECK(pthread_create(&a, NULL, post_builder, &t0) == 0 && pthread_create(&b, NULL, post_builder, &t1) == 0,
	      "pthread_create");
	time_t end = time(NULL) + 30;
	struct ibv_wc wc[32];
	while (atomic_load(&recorded) < 2 * PER_THREAD) {
		int n = ibv_poll_cq(p.cq, 32, wc);
		CHECK(n >= 0, "ibv_poll_cq");
		for (int i = 0; i < n; i++)
			record(wc[i].wr_id, wc[i].status);
		CHECK(time(NULL) < end, "%d of %d completions", atomic_load(&recorded), 2 * PER_THREAD);
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	usleep(100 * 1000);
	CHECK(ibv_poll_cq(p.cq, 32, wc) == 0, "more completions than requests");
	check_seen(2 * PER_THREAD);
}

static void *poll_ex(void *arg)
{
	struct pair *p = arg;
	struct ibv_poll_cq_attr attr = { 0 };
	time_t end = time(NULL) + 30;
	while (atomic_load(&recorded) < 2 * PER_THREAD) {
		CHECK(time(NULL) < end, "%d of %d completions", atomic_load(&recorded), 2 * PER_THREAD);
		if (ibv_start_poll(p->cqx, &attr) != 0)
			continue;
		do {
			CHECK(ibv_wc_read_opcode(p->cqx) == IBV_WC_RDMA_WRITE, "opcode");
			CHECK(ibv_wc_read_qp_num(p->cqx) == p->qp->qp_num, "qp_num");
			sched_yield();
			record(p->cqx->wr_id, p->cqx->status);
		} while (ibv_next_poll(p->cqx) == 0);
		ibv_end_poll(p->cqx);
	}
	return NULL;
}

/* An extended CQ polled by two threads: between ibv_start_poll and ibv_end_poll the CQ is the
   poller's (rxe and mlx5 hold the CQ lock; only IBV_CREATE_CQ_ATTR_SINGLE_THREADED drops it),
   so wr_id, status and the ibv_wc_read_* answers are those of the poller's own completion. */
static void cq_ex_exclusive(void)
{
	struct pair p;
	open_pair(&p);
	pthread_t a, b;
	CHECK(pthread_create(&a, NULL, poll_ex, &p) == 0 && pthread_create(&b, NULL, poll_ex, &p) == 0,
	      "pthread_create");
	uint64_t v = 0;
	for (int i = 0; i < 2 * PER_THREAD; i++) {
		struct ibv_sge s = { (uintptr_t)&v, 8, 0 };
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *bad = NULL;
		w.wr.rdma.remote_addr = (uintptr_t)p.buf;
		w.wr.rdma.rkey = p.mr->rkey;
		int r;
		throttle();
		while ((r = ibv_post_send(p.qp, &w, &bad)) == ENOMEM)
			sched_yield();
		CHECK(r == 0, "ibv_post_send: %d", r);
		atomic_fetch_add(&posted, 1);
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	check_seen(2 * PER_THREAD);
}

/* ---- modify_unknown_bits ---- */

/* Attribute-mask bits above IBV_QP_DEST_QPN: libibverbs' ibv_cmd_modify_qp (rxe's modify_qp)
   refuses IBV_QP_RATE_LIMIT and above with EOPNOTSUPP, and the kernel's legacy Modify QP
   refuses any bit past IB_QP_DEST_QPN with -EOPNOTSUPP, before it looks at the transition. */
static void modify_unknown_bits(void)
{
	struct end e;
	setup_end(&e, open_ctx(), IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 64);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	int init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	CHECK(ibv_modify_qp(e.qp, &a, init | IBV_QP_RATE_LIMIT) == EOPNOTSUPP, "IBV_QP_RATE_LIMIT");
	CHECK(ibv_modify_qp(e.qp, &a, init | 1 << 21) == EOPNOTSUPP, "bit 21");
	CHECK(ibv_modify_qp(e.qp, &a, init | 1 << 30) == EOPNOTSUPP, "bit 30");
	CHECK(e.qp->state == IBV_QPS_RESET, "state changed");
	CHECK(ibv_modify_qp(e.qp, &a, init) == 0, "to INIT");
}

/* ---- query_zeroes ---- */

/* What libibverbs zeroes before a query fills it: the compatibility ibv_query_port
   (__lib_query_port: the old layout's 48 bytes copied from a zeroed structure the provider
   filled, `flags` included: GRH_REQUIRED on a RoCE port, as rxe's), the extended
   query_port and query_device_ex (memset of the caller's whole port_attr_len / attr_size, so
   a program built against a newer, larger structure reads zeros past what this one knows). */
#undef ibv_query_port
static void query_zeroes(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_port_attr p;
	memset(&p, 0xff, sizeof p);
	CHECK(ibv_query_port(ctx, 1, (struct _compat_ibv_port_attr *)&p) == 0, "compat ibv_query_port");
	CHECK(p.state == IBV_PORT_ACTIVE && p.flags == IBV_QPF_GRH_REQUIRED, "compat ibv_query_port: state %d flags %#x",
	      p.state, p.flags);

	struct verbs_context *v = verbs_get_ctx_op(ctx, query_port);
	CHECK(v, "query_port op");
	unsigned char big[sizeof(struct ibv_port_attr) + 64];
	memset(big, 0xff, sizeof big);
	CHECK(v->query_port(ctx, 1, (struct ibv_port_attr *)big, sizeof big) == 0, "query_port, larger structure");
	for (size_t i = sizeof(struct ibv_port_attr); i < sizeof big; i++)
		CHECK(big[i] == 0, "query_port left byte %zu of %zu", i, sizeof big);

	v = verbs_get_ctx_op(ctx, query_device_ex);
	CHECK(v, "query_device_ex op");
	unsigned char dev[sizeof(struct ibv_device_attr_ex) + 64];
	memset(dev, 0xff, sizeof dev);
	CHECK(v->query_device_ex(ctx, NULL, (struct ibv_device_attr_ex *)dev, sizeof dev) == 0,
	      "query_device_ex, larger structure");
	for (size_t i = sizeof(struct ibv_device_attr_ex); i < sizeof dev; i++)
		CHECK(dev[i] == 0, "query_device_ex left byte %zu of %zu", i, sizeof dev);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* ---- qp_caps ---- */

/* The capacities Create QP writes back, as Linux rxe (6.1) wrote them in the rxe-vm guest
   (2026-11-29) for RC and UD alike: a send WQE sized for the larger of the SGEs and the inline
   bytes asked for, reported as max(16 x max_send_sge, max_inline_data) inline bytes and a
   sixteenth of that in send SGEs; the receive side as asked; 513 inline bytes refused. And a
   QP that asked for no inline data posts 16 inline bytes (rdma_xclient does). */
static void qp_caps(void)
{
	static const struct { unsigned sge, inl, out_sge, out_inl; } t[] = {
		{ 1, 0, 1, 16 },   { 1, 16, 1, 16 },   { 1, 17, 1, 17 },   { 1, 64, 4, 64 },
		{ 2, 0, 2, 32 },   { 4, 0, 4, 64 },    { 0, 0, 0, 0 },     { 3, 40, 3, 48 },
		{ 1, 200, 12, 200 }, { 1, 512, 32, 512 }, { 32, 0, 32, 512 }, { 30, 490, 30, 490 },
		{ 1, 513, 0, 0 },
	};
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd, cq");
	const int types[] = { IBV_QPT_RC, IBV_QPT_UD };
	for (int k = 0; k < 2; k++)
		for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
			struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = types[k] };
			a.cap = (struct ibv_qp_cap){ .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = t[i].sge,
						     .max_recv_sge = t[i].sge, .max_inline_data = t[i].inl };
			struct ibv_qp *qp = ibv_create_qp(pd, &a);
			if (t[i].inl > 512) {
				CHECK(!qp && errno == EINVAL, "type %d inline %u: %p errno %d", types[k], t[i].inl,
				      (void *)qp, errno);
				continue;
			}
			CHECK(qp, "type %d sge %u inline %u: errno %d", types[k], t[i].sge, t[i].inl, errno);
			CHECK(a.cap.max_send_sge == t[i].out_sge && a.cap.max_inline_data == t[i].out_inl &&
				      a.cap.max_recv_sge == t[i].sge,
			      "type %d sge %u inline %u: sge %u/%u inline %u, rxe %u/%u inline %u", types[k], t[i].sge,
			      t[i].inl, a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data, t[i].out_sge,
			      t[i].sge, t[i].out_inl);
			struct ibv_qp_attr qa;
			struct ibv_qp_init_attr qi;
			CHECK(ibv_query_qp(qp, &qa, IBV_QP_CAP, &qi) == 0, "ibv_query_qp");
			CHECK(qa.cap.max_send_sge == t[i].out_sge && qa.cap.max_inline_data == t[i].out_inl,
			      "query: sge %u inline %u", qa.cap.max_send_sge, qa.cap.max_inline_data);
			CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
		}

	/* 16 inline bytes on an RC QP that asked for none, connected to itself. */
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	a.cap = (struct ibv_qp_cap){ .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 };
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	CHECK(qp, "ibv_create_qp");
	static char buf[16] = "sixteen bytes..", got[16];
	struct ibv_mr *mr = ibv_reg_mr(pd, got, sizeof got, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "gid");
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");
	m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qp->qp_num,
				  .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				  .ah_attr = { .is_global = 1, .grh = { .dgid = gid, .hop_limit = 64 }, .port_num = 1 } };
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
	      "RTR");
	m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1 };
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					      IBV_QP_MAX_QP_RD_ATOMIC),
	      "RTS");
	struct ibv_sge rs = { .addr = (uintptr_t)got, .length = sizeof got, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(qp, &rw, &rbad) == 0, "ibv_post_recv");
	struct ibv_sge ss = { .addr = (uintptr_t)buf, .length = sizeof buf, .lkey = 0 };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_INLINE, .imm_data = htonl(5) }, *sbad;
	CHECK(ibv_post_send(qp, &sw, &sbad) == 0, "16 inline bytes on a QP that asked for none: errno %d", errno);
	/* The flags rxe sets (and ConnectX): GRH on an RC receive (every RoCE packet has network
	   headers), WITH_IMM on both ends of a request with immediate data. */
	int seen = 0;
	for (int spins = 0; seen < 2 && spins < 10000000; spins++) {
		struct ibv_wc wc;
		if (ibv_poll_cq(cq, 1, &wc) == 1) {
			CHECK(wc.status == IBV_WC_SUCCESS, "wc %llu status %d", (unsigned long long)wc.wr_id, wc.status);
			unsigned want = wc.wr_id == 1 ? IBV_WC_GRH | IBV_WC_WITH_IMM : IBV_WC_WITH_IMM;
			CHECK(wc.wc_flags == want, "wc %llu wc_flags %#x, rxe %#x", (unsigned long long)wc.wr_id, wc.wc_flags,
			      want);
			seen++;
		}
	}
	CHECK(seen == 2 && !memcmp(buf, got, sizeof got), "the inline Send arrived (%d completions)", seen);
	CHECK(!ibv_destroy_qp(qp) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "teardown");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* ---- as_rxe ---- */

#define ANSWER(what, call, want_r, want_errno)                                                     \
	do {                                                                                       \
		errno = 0;                                                                         \
		int r_ = (call);                                                                   \
		int e_ = errno;                                                                    \
		CHECK(r_ == (want_r) && e_ == (want_errno), "%s: %d errno %d, rxe %d errno %d", what, r_, \
		      e_, want_r, want_errno);                                                    \
	} while (0)
#define REFUSED(what, call, want_errno)                                                            \
	do {                                                                                       \
		errno = 0;                                                                         \
		void *p_ = (void *)(call);                                                         \
		int e_ = errno;                                                                    \
		CHECK(!p_ && e_ == (want_errno), "%s: %p errno %d, rxe NULL errno %d", what, p_, e_,     \
		      want_errno);                                                                 \
	} while (0)

/* Answers as Linux rxe (6.1, libibverbs 44) gave them in the rxe-vm guest, 2026-11-29: a verb
   libibverbs makes a kernel command of leaves its failure in errno too (the failed write or
   ioctl), a user-space check does not (ibv_destroy_comp_channel, ibv_post_recv); a CQ holds
   2^k - 1 CQEs, the next power of two above the request less one (rxe and mlx5); an address
   from an empty GID slot is ENODATA; an unknown QP type EINVAL, a known one the device has not
   EOPNOTSUPP; a P_Key index past the table ENOENT (libibverbs reads sysfs); a region of no
   bytes at a page boundary EINVAL; the port reports connection management and that its
   addresses need the GRH. */
static void as_rxe(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	static const int cqe[][3] = { { 1, 1, 15 }, { 2, 3, 15 }, { 5, 7, 15 }, { 63, 63, 127 },
				      { 64, 127, 127 }, { 100, 127, 127 }, { 4096, 8191, 8191 } };
	for (size_t i = 0; i < sizeof cqe / sizeof cqe[0]; i++) {
		struct ibv_cq *c = ibv_create_cq(ctx, cqe[i][0], NULL, NULL, 0);
		CHECK(c && c->cqe == cqe[i][1], "ibv_create_cq(%d): cqe %d, rxe %d", cqe[i][0], c ? c->cqe : -1,
		      cqe[i][1]);
		CHECK(ibv_resize_cq(c, cqe[i][0] + 10) == 0 && c->cqe == cqe[i][2],
		      "ibv_resize_cq(%d): cqe %d, rxe %d", cqe[i][0] + 10, c->cqe, cqe[i][2]);
		CHECK(ibv_destroy_cq(c) == 0, "ibv_destroy_cq");
	}
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	CHECK(pd && ch && cq, "pd, channel, cq");
	struct ibv_qp_init_attr qi = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC };
	qi.cap = (struct ibv_qp_cap){ .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 };
	struct ibv_qp *qp = ibv_create_qp(pd, &qi);
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(qp && srq, "qp, srq");

	/* Query QP in Reset: the address vectors have their GRH, as every RoCE one does. */
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qia;
	memset(&q, 0, sizeof q);
	CHECK(ibv_query_qp(qp, &q, IBV_QP_AV | IBV_QP_ALT_PATH, &qia) == 0 && q.ah_attr.is_global == 1 &&
		      q.alt_ah_attr.is_global == 1,
	      "is_global in Reset: %d/%d, rxe 1/1", q.ah_attr.is_global, q.alt_ah_attr.is_global);

	/* A connected QP's address vector: the route's hop limit (the host's default TTL) for a
	   unicast destination, whatever was asked, as Linux's RoCE core sets it
	   (ib_resolve_unicast_gid_dmac); a multicast destination keeps its own. */
	{
		int ttl = 64;
		FILE *f = fopen("/proc/sys/net/ipv4/ip_default_ttl", "r");
		if (f) {
			CHECK(fscanf(f, "%d", &ttl) == 1, "ip_default_ttl");
			fclose(f);
		}
		union ibv_gid own;
		CHECK(ibv_query_gid(ctx, 1, 0, &own) == 0, "GID 0");
		uint8_t mcast[16] = { [10] = 0xff, [11] = 0xff, [12] = 239, [13] = 1, [14] = 2, [15] = 3 };
		for (int i = 0; i < 2; i++) {
			struct ibv_qp *h = ibv_create_qp(pd, &qi);
			struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
			CHECK(h && ibv_modify_qp(h, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
			      "INIT");
			a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = 7,
						  .max_dest_rd_atomic = 3, .min_rnr_timer = 1,
						  .ah_attr = { .is_global = 1, .grh = { .dgid = own, .hop_limit = 9 }, .port_num = 1 } };
			if (i)
				memcpy(a.ah_attr.grh.dgid.raw, mcast, 16);
			CHECK(ibv_modify_qp(h, &a,
					    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
			      "RTR");
			if (!i) {
				/* The depths to powers of two, as rxe and mlx5 keep them: 3 reads back 4. */
				struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
							 .rnr_retry = 7, .max_rd_atomic = 3 };
				CHECK(ibv_modify_qp(h, &r,
						    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
							    IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
				      "RTS");
				memset(&q, 0, sizeof q);
				CHECK(ibv_query_qp(h, &q, IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &qia) == 0 &&
					      q.max_rd_atomic == 4 && q.max_dest_rd_atomic == 4,
				      "depths %d/%d for 3/3, rxe 4/4", q.max_rd_atomic, q.max_dest_rd_atomic);
			}
			memset(&q, 0, sizeof q);
			CHECK(ibv_query_qp(h, &q, IBV_QP_AV, &qia) == 0 && q.ah_attr.grh.hop_limit == (i ? 9 : ttl),
			      "hop limit %d for a %s destination, Linux %d", q.ah_attr.grh.hop_limit, i ? "multicast" : "unicast",
			      i ? 9 : ttl);
			CHECK(ibv_destroy_qp(h) == 0, "destroy");
		}
	}

	struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTS };
	ANSWER("ibv_modify_qp Reset to RTS", ibv_modify_qp(qp, &m, IBV_QP_STATE), EINVAL, EINVAL);
	m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 7 };
	ANSWER("ibv_modify_qp port 7",
	       ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), EINVAL,
	       EINVAL);
	struct ibv_srq_attr sa = { .srq_limit = 100 };
	ANSWER("ibv_modify_srq limit above max_wr", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL, EINVAL);
	ANSWER("ibv_destroy_cq in use", ibv_destroy_cq(cq), EBUSY, EBUSY);
	ANSWER("ibv_dealloc_pd in use", ibv_dealloc_pd(pd), EBUSY, EBUSY);
	ANSWER("ibv_destroy_comp_channel in use", ibv_destroy_comp_channel(ch), EBUSY, 0);
	ANSWER("ibv_resize_cq 0", ibv_resize_cq(cq, 0), EINVAL, EINVAL);
	ANSWER("ibv_resize_cq past max_cqe", ibv_resize_cq(cq, 1 << 30), EINVAL, EINVAL);
	struct ibv_port_attr pa;
	ANSWER("ibv_query_port 9", ___ibv_query_port(ctx, 9, &pa), EINVAL, EINVAL);
	uint16_t pkey;
	ANSWER("ibv_query_pkey index 5", ibv_query_pkey(ctx, 1, 5, &pkey), -1, ENOENT);
	ANSWER("ibv_query_pkey port 3", ibv_query_pkey(ctx, 3, 0, &pkey), -1, ENOENT);
	union ibv_gid gid0;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid0) == 0, "ibv_query_gid");
	ANSWER("ibv_attach_mcast on an RC QP", ibv_attach_mcast(qp, &gid0, 0), EINVAL, EINVAL);
	static struct ibv_sge sg[8];
	struct ibv_recv_wr rw = { .num_sge = 5, .sg_list = sg }, *rbad;
	ANSWER("ibv_post_recv with 5 SGEs", ibv_post_recv(qp, &rw, &rbad), EINVAL, 0);
	/* No bytes at a page boundary touch no page to pin (EINVAL); inside a page, that page. */
	static char page_buf[8192] __attribute__((aligned(4096)));
	REFUSED("ibv_reg_mr of 0 bytes at a page boundary", ibv_reg_mr(pd, page_buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL);
	struct ibv_mr *no_bytes = ibv_reg_mr(pd, page_buf + 7, 0, IBV_ACCESS_LOCAL_WRITE);
	CHECK(no_bytes && ibv_dereg_mr(no_bytes) == 0, "ibv_reg_mr of 0 bytes inside a page: errno %d", errno);
	qi.qp_type = 7;
	REFUSED("ibv_create_qp type 7", ibv_create_qp(pd, &qi), EINVAL);
	/* rxe answers an XRC initiator EOPNOTSUPP (it has no XRC); softhca makes it. */
	qi.qp_type = IBV_QPT_XRC_SEND;
	struct ibv_qp *xrc_send = ibv_create_qp(pd, &qi);
	CHECK(xrc_send && xrc_send->recv_cq == qi.recv_cq && qi.cap.max_recv_wr == 0 && ibv_destroy_qp(xrc_send) == 0,
	      "ibv_create_qp XRC_SEND (its ibv_qp names the CQs given; no receive queue)");
	qi.qp_type = IBV_QPT_XRC_RECV;
	REFUSED("ibv_create_qp XRC_RECV (no domain through it)", ibv_create_qp(pd, &qi), EINVAL);

	CHECK(___ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port");
	CHECK((pa.port_cap_flags & IBV_PORT_CM_SUP) && pa.flags == IBV_QPF_GRH_REQUIRED,
	      "port_cap_flags %#x flags %#x, rxe CM_SUP and GRH_REQUIRED", pa.port_cap_flags, pa.flags);
	/* An empty GID slot as the source, where the table has one. */
	int empty = -1;
	for (int i = 1; i < pa.gid_tbl_len && empty < 0; i++) {
		union ibv_gid g;
		static const union ibv_gid zero;
		if (ibv_query_gid(ctx, 1, i, &g) == 0 && !memcmp(&g, &zero, sizeof g))
			empty = i;
	}
	if (empty > 0) {
		struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = gid0, .sgid_index = empty, .hop_limit = 1 },
					  .port_num = 1 };
		REFUSED("ibv_create_ah from an empty GID slot", ibv_create_ah(pd, &aa), ENODATA);
		m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1 };
		CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
		      "to Init");
		m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = 1,
					  .max_dest_rd_atomic = 1, .min_rnr_timer = 12, .ah_attr = aa };
		ANSWER("ibv_modify_qp to RTR from an empty GID slot",
		       ibv_modify_qp(qp, &m,
				     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
		       ENODATA, ENODATA);
	}
	CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_srq(srq) && !ibv_destroy_cq(cq), "teardown");
	CHECK(!ibv_destroy_comp_channel(ch) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "teardown");
}

int main(int argc, char **argv)
{
	CHECK(argc == 2, "usage: review3_ext <case>");
	hang_guard(50);
	const char *c = argv[1];
	if (!strcmp(c, "close_wakes_async_waiter"))
		close_wakes_async_waiter();
	else if (!strcmp(c, "close_stops_qps"))
		close_stops_qps();
	else if (!strcmp(c, "wr_exclusive"))
		wr_exclusive();
	else if (!strcmp(c, "cq_ex_exclusive"))
		cq_ex_exclusive();
	else if (!strcmp(c, "modify_unknown_bits"))
		modify_unknown_bits();
	else if (!strcmp(c, "query_zeroes"))
		query_zeroes();
	else if (!strcmp(c, "qp_caps"))
		qp_caps();
	else if (!strcmp(c, "as_rxe"))
		as_rxe();
	else
		CHECK(0, "unknown case %s", c);
	printf("%s: ok\n", c);
	return 0;
}
