/* Review checks of softhca's libibverbs.so.1 against what rdma-core's libibverbs does, one
   per command-line argument. Each prints "<name>: ok" and exits 0, or names the first check
   that failed and exits 1. An alarm is a hang guard only: a verb that should return at once
   but blocks prints "<name>: HANG" and exits 3. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static const char *test = "review_abi";
#define TEST_NAME test
#include "verbs_test.h"

static struct ibv_context *open_ctx(void)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num >= 1 && list[0], "ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	ibv_free_device_list(list);
	return ctx;
}

static void to_init(struct ibv_qp *qp, int access)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = access };
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	CHECK(r == 0, "to INIT: %d", r);
}

static void to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	CHECK(r == 0, "to ERR: %d", r);
}

static void open_end(struct end *e, enum ibv_qp_type type)
{
	setup_end(e, open_ctx(), type, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
		  65536);
}

/* libibverbs' ibv_get_async_event is a read() of async_fd: once the program has made that
   descriptor non-blocking, the call returns -1 with errno EAGAIN when no event waits. */
static void async_nonblocking(void)
{
	struct ibv_context *ctx = open_ctx();
	int flags = fcntl(ctx->async_fd, F_GETFL);
	CHECK(flags >= 0 && fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) == 0, "fcntl(async_fd)");
	hang_guard(10);
	struct ibv_async_event ev;
	errno = 0;
	int r = ibv_get_async_event(ctx, &ev);
	alarm(0);
	CHECK(r == -1 && errno == EAGAIN, "ibv_get_async_event on an idle non-blocking fd: %d errno %d", r, errno);
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
}

/* Flushes one receive of `qp` (INIT, a posted receive, then Error): one CQE on its CQ. */
static void flush_one_recv(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)mr->addr, 8, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad = NULL;
	CHECK(ibv_post_recv(qp, &w, &bad) == 0, "ibv_post_recv");
	to_error(qp);
}

/* A context with a PD, a 4 KiB region and a completion channel. */
struct with_channel {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch;
};

static struct with_channel open_with_channel(void)
{
	struct with_channel w = { .ctx = open_ctx() };
	w.pd = ibv_alloc_pd(w.ctx);
	w.mr = w.pd ? ibv_reg_mr(w.pd, calloc(1, 4096), 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	w.ch = ibv_create_comp_channel(w.ctx);
	CHECK(w.pd && w.mr && w.ch, "setup");
	return w;
}

/* Destroying a CQ drops its completion events that the channel has not yet handed out (the
   kernel's ib_uverbs_release_ucq): the next ibv_get_cq_event names a live CQ. */
static void cq_event_after_destroy(void)
{
	struct with_channel w = open_with_channel();
	struct ibv_context *ctx = w.ctx;
	struct ibv_pd *pd = w.pd;
	struct ibv_mr *mr = w.mr;
	struct ibv_comp_channel *ch = w.ch;
	struct ibv_cq *a = ibv_create_cq(ctx, 16, (void *)0xa, ch, 0);
	struct ibv_cq *b = ibv_create_cq(ctx, 16, (void *)0xb, ch, 0);
	CHECK(a && b, "ibv_create_cq");
	struct ibv_qp_init_attr ia = { .send_cq = a, .recv_cq = a, .qp_type = IBV_QPT_RC, .cap = { 4, 4, 1, 1, 0 } };
	struct ibv_qp *qa = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = b;
	struct ibv_qp *qb = ibv_create_qp(pd, &ia);
	CHECK(qa && qb, "ibv_create_qp");
	to_init(qa, 0);
	to_init(qb, 0);

	/* CQ a: an event is generated, never taken; then the QP and the CQ go. */
	CHECK(ibv_req_notify_cq(a, 0) == 0, "arm a");
	flush_one_recv(qa, mr, 1);
	CHECK(wait_one(a).wr_id == 1, "flushed CQE on a");
	CHECK(ibv_destroy_qp(qa) == 0, "ibv_destroy_qp(qa)");
	CHECK(ibv_destroy_cq(a) == 0, "ibv_destroy_cq(a)");

	/* CQ b: the event the program waits for. */
	CHECK(ibv_req_notify_cq(b, 0) == 0, "arm b");
	flush_one_recv(qb, mr, 2);
	hang_guard(10);
	struct ibv_cq *got = NULL;
	void *cq_ctx = NULL;
	errno = 0;
	int r = ibv_get_cq_event(ch, &got, &cq_ctx);
	alarm(0);
	CHECK(r == 0, "ibv_get_cq_event after a CQ with a pending event was destroyed: %d errno %d", r, errno);
	CHECK(got == b && cq_ctx == (void *)0xb, "the event names CQ %p (context %p), not b", (void *)got, cq_ctx);
	ibv_ack_cq_events(b, 1);
}

/* What an RC QP on an SRQ of `pd` is created with (a new CQ and SRQ): moved to Error, it
   raises Last WQE Reached. */
static struct ibv_qp_init_attr on_srq(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = pd ? ibv_create_srq(pd, &si) : NULL;
	CHECK(pd && cq && srq, "setup");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
				       .cap = { 4, 0, 1, 1, 0 } };
	return ia;
}

static volatile sig_atomic_t ticks;
static void on_tick(int sig)
{
	(void)sig;
	ticks++;
}

/* Arms SIGALRM `ms` from now, its handler installed with `flags` (SA_RESTART or not). */
static void tick_in(int ms, int flags)
{
	struct sigaction sa = { .sa_handler = on_tick, .sa_flags = flags };
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction");
	struct itimerval t = { .it_value = { .tv_sec = 0, .tv_usec = ms * 1000 } };
	CHECK(setitimer(ITIMER_REAL, &t, NULL) == 0, "setitimer");
}

struct later {
	struct ibv_qp *qp;
	struct ibv_mr *mr;
};

static void *flush_later(void *arg)
{
	struct later *l = arg;
	usleep(300 * 1000);
	flush_one_recv(l->qp, l->mr, 7);
	return NULL;
}

/* ibv_get_cq_event is libibverbs' read(2) of the channel: a signal whose handler was installed
   without SA_RESTART ends a blocking wait with -1/EINTR (qperf's test timer ends its event loop
   so), and one installed with SA_RESTART leaves the wait going until the event comes. */
static void cq_event_interrupted(void)
{
	struct with_channel w = open_with_channel();
	struct ibv_context *ctx = w.ctx;
	struct ibv_pd *pd = w.pd;
	struct ibv_mr *mr = w.mr;
	struct ibv_comp_channel *ch = w.ch;
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = { 4, 4, 1, 1, 0 } };
	struct ibv_qp *qp = cq ? ibv_create_qp(pd, &ia) : NULL;
	CHECK(qp, "ibv_create_cq, ibv_create_qp");
	to_init(qp, 0);
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	struct ibv_cq *got = NULL;
	void *cq_ctx = NULL;

	ticks = 0;
	tick_in(50, 0);
	errno = 0;
	int r = ibv_get_cq_event(ch, &got, &cq_ctx);
	CHECK(r == -1 && errno == EINTR && ticks == 1, "interrupted without SA_RESTART: %d errno %d, %d signals",
	      r, errno, (int)ticks);

	struct later l = { qp, mr };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, flush_later, &l) == 0, "pthread_create");
	tick_in(50, SA_RESTART);
	r = ibv_get_cq_event(ch, &got, &cq_ctx);
	CHECK(r == 0 && got == cq && ticks == 2, "with SA_RESTART, the event after the signal: %d errno %d, %d signals",
	      r, errno, (int)ticks);
	ibv_ack_cq_events(cq, 1);
	pthread_join(t, NULL);
}

static void *error_later(void *arg)
{
	usleep(300 * 1000);
	to_error(arg);
	return NULL;
}

/* ibv_get_async_event is libibverbs' read(2) of async_fd: as ibv_get_cq_event above. */
static void async_event_interrupted(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_qp_init_attr ia = on_srq(ctx, pd);
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "ibv_create_qp");
	to_init(qp, 0);
	struct ibv_async_event ev;

	ticks = 0;
	tick_in(50, 0);
	errno = 0;
	int r = ibv_get_async_event(ctx, &ev);
	CHECK(r == -1 && errno == EINTR && ticks == 1, "interrupted without SA_RESTART: %d errno %d, %d signals",
	      r, errno, (int)ticks);

	pthread_t t;
	CHECK(pthread_create(&t, NULL, error_later, qp) == 0, "pthread_create");
	tick_in(50, SA_RESTART);
	r = ibv_get_async_event(ctx, &ev);
	CHECK(r == 0 && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp && ticks == 2,
	      "with SA_RESTART, the event after the signal: %d errno %d, event %d, %d signals", r, errno,
	      (int)ev.event_type, (int)ticks);
	ibv_ack_async_event(&ev);
	pthread_join(t, NULL);
}

/* Destroying a QP drops its asynchronous events the program has not yet read (the kernel's
   ib_uverbs_release_uevent); libibverbs never hands out an event whose element is NULL or a
   freed object. */
static void qp_event_after_destroy(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_qp_init_attr ia = on_srq(ctx, pd);
	struct ibv_qp *q1 = ibv_create_qp(pd, &ia);
	struct ibv_qp *q2 = ibv_create_qp(pd, &ia);
	CHECK(q1 && q2, "ibv_create_qp");
	to_init(q1, 0);
	to_init(q2, 0);
	to_error(q1); /* Last WQE Reached for q1 */
	CHECK(ibv_destroy_qp(q1) == 0, "ibv_destroy_qp(q1)");
	to_error(q2); /* Last WQE Reached for q2 */
	hang_guard(10);
	struct ibv_async_event ev;
	int r = ibv_get_async_event(ctx, &ev);
	alarm(0);
	CHECK(r == 0, "ibv_get_async_event: %d", r);
	CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == q2,
	      "event %d (%s) for QP %p: an event of the destroyed QP was delivered (q2 is %p)", ev.event_type,
	      ibv_event_type_str(ev.event_type), (void *)ev.element.qp, (void *)q2);
	ibv_ack_async_event(&ev);
}

/* libibverbs' ibv_query_qp stores the state it read in qp->state when the mask has
   IBV_QP_STATE (verbs.c: `if (attr_mask & IBV_QP_STATE) qp->state = attr->qp_state;`). */
static void query_qp_updates_state(void)
{
	struct end a, b;
	open_end(&a, IBV_QPT_RC);
	open_end(&b, IBV_QPT_RC);
	connect_rc(&a, &b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 1);
	connect_rc(&b, &a, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 1);
	CHECK(a.qp->state == IBV_QPS_RTS, "state after RTS %d", a.qp->state);
	/* A Write with a wrong R_Key: Remote Access Error, and the QP moves to Error by itself. */
	struct ibv_sge s = { (uintptr_t)a.buf, 8, a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 8, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
	wr.wr.rdma.rkey = b.mr->rkey ^ 0x55;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "ibv_post_send");
	struct ibv_wc wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "bad rkey: %s", ibv_wc_status_str(wc.status));
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR, "query: state %d",
	      qa.qp_state);
	CHECK(a.qp->state == IBV_QPS_ERR, "qp->state is %d after ibv_query_qp returned %d", a.qp->state, qa.qp_state);
}

/* verbs.h: srq_limit is "The limit value of the SRQ (irrelevant for ibv_create_srq)". */
static void create_srq_ignores_limit(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1, .srq_limit = 1000 } };
	errno = 0;
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq, "ibv_create_srq with srq_limit %u above max_wr: errno %d", 1000u, errno);
	struct ibv_srq_attr q;
	CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 0, "the SRQ was armed at creation: limit %u", q.srq_limit);
	CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
}

/* The kernel's ib_check_mr_access refuses Remote Write without Local Write with EINVAL. */
static void reg_mr_access_errno(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, 4096);
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE);
	int e = errno;
	CHECK(!mr && e == EINVAL, "Remote Write without Local Write: mr %p errno %d (%s)", (void *)mr, e, strerror(e));
}

/* The kernel (ib_umem_get) refuses a range whose end wraps past the top of the address space
   with EINVAL; softhca registers it, and later accesses index outside any mapping. */
static void reg_mr_wrapping_range(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)(UINTPTR_MAX - 100), 4096, IBV_ACCESS_LOCAL_WRITE);
	int e = errno;
	CHECK(!mr && e == EINVAL, "a wrapping range was registered: mr %p errno %d", (void *)mr, e);
}

/* The kernel pins a region's pages (ib_umem_get): a page not mapped, mapped without rights,
   or read-only under an access that writes (local or remote write, atomics, window binding)
   fails the registration with EFAULT. softhca registered all of them, and the first access
   to such a page killed the process. */
static void reg_mr_needs_mapped_memory(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	long page = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED, "mmap");
	CHECK(munmap(m + page, page) == 0, "munmap the middle page");
	struct {
		char *addr;
		size_t len;
		int access;
		int want; /* 0: registered */
	} cases[] = {
		{ m, page, IBV_ACCESS_LOCAL_WRITE, 0 },
		{ m + 100, page - 200, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0 },
		{ m, 3 * page, IBV_ACCESS_LOCAL_WRITE, EFAULT },	/* the hole */
		{ m + page - 1, 2, 0, EFAULT },			/* one byte into it */
		{ m + page + 10, 100, IBV_ACCESS_REMOTE_READ, EFAULT },
		{ NULL, 4096, IBV_ACCESS_LOCAL_WRITE, EFAULT },
	};
	for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		errno = 0;
		struct ibv_mr *mr = ibv_reg_mr(pd, cases[i].addr, cases[i].len, cases[i].access);
		int e = errno;
		if (!cases[i].want) {
			CHECK(mr, "case %u: a mapped range was refused: errno %d", i, e);
			CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
		} else
			CHECK(!mr && e == cases[i].want, "case %u: mr %p errno %d, want %d", i, (void *)mr, e, cases[i].want);
	}
	/* A read-only page: registrable for reading only (a Send's source, a Read's target). */
	CHECK(mprotect(m, page, PROT_READ) == 0, "mprotect");
	struct ibv_mr *mr = ibv_reg_mr(pd, m, page, IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "read-only memory for Remote Read was refused: errno %d", errno);
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	int writes[] = { IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_MW_BIND };
	for (unsigned i = 0; i < sizeof writes / sizeof writes[0]; i++) {
		errno = 0;
		mr = ibv_reg_mr(pd, m, page, writes[i]);
		int e = errno;
		CHECK(!mr && e == EFAULT, "read-only memory, access %#x: mr %p errno %d", writes[i], (void *)mr, e);
	}
	/* No rights at all. */
	CHECK(mprotect(m, page, PROT_NONE) == 0, "mprotect");
	errno = 0;
	mr = ibv_reg_mr(pd, m, page, 0);
	CHECK(!mr && errno == EFAULT, "PROT_NONE memory: mr %p errno %d", (void *)mr, errno);
}

/* Linux's rxe sends a user QP's work in the ibv_post_send system call and writes a UD send's
   completion right after: a Resize CQ that follows the posts counts those completions, and
   refuses a size below them (EINVAL). softhca's engine thread sends: the resize found the CQ
   still empty in about half the runs of rdma-core's test_resize_cq. 100 rounds. */
static void resize_counts_posted_ud_sends(void)
{
	struct end e;
	open_end(&e, IBV_QPT_UD);
	ud_to_rts(e.qp, 0x11);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = e.gid, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(e.pd, &aa);
	CHECK(ah, "ibv_create_ah");
	struct ibv_sge sg = { (uintptr_t)e.buf, 8, e.mr->lkey };
	struct ibv_sge rs = { (uintptr_t)e.buf + 4096, 64, e.mr->lkey };
	for (int round = 0; round < 100; round++) {
		/* The QP sends to itself, so that the engine thread has its receives to deliver. */
		for (int i = 0; i < 7; i++) {
			struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
			CHECK(ibv_post_recv(e.qp, &r, &rbad) == 0, "ibv_post_recv");
		}
		for (int i = 0; i < 7; i++) {
			struct ibv_send_wr w = { .wr_id = i, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
			w.wr.ud.ah = ah;
			w.wr.ud.remote_qpn = e.qp->qp_num;
			w.wr.ud.remote_qkey = 0x11;
			CHECK(ibv_post_send(e.qp, &w, &bad) == 0, "ibv_post_send");
		}
		CHECK(ibv_resize_cq(e.cq, 1) == EINVAL, "round %d: a resize below the 7 completions", round);
		for (int i = 0; i < 14; i++)
			CHECK(wait_one(e.cq).status == IBV_WC_SUCCESS, "the sends and the receives");
	}
	CHECK(ibv_resize_cq(e.cq, 1) == 0, "a resize of the empty CQ");
}

/* mckey's sender posts unsignaled UD sends and at once leaves its group, destroys its QP and
   exits: on Linux's rxe, which sends in the ibv_post_send system call, every datagram is out;
   softhca's destroy discarded what its engine thread had not sent yet (Linux rxe got 1 of
   mckey's 20 in the interop guest). 10 rounds of 512 unsignaled sends, the sending QP
   destroyed at once: the receiver must get them all. */
static struct ibv_qp *big_ud_qp(struct end *e)
{
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 512, .max_recv_wr = 512, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(e->pd, &init);
	CHECK(qp, "ibv_create_qp");
	ud_to_rts(qp, 0x11);
	return qp;
}

static void destroy_after_unsignaled_ud_sends(void)
{
	enum { N = 512 };
	struct end a, b;
	open_end(&a, IBV_QPT_UD);
	open_end(&b, IBV_QPT_UD);
	struct ibv_cq *rcq = ibv_create_cq(b.ctx, N, NULL, NULL, 0);
	CHECK(rcq, "ibv_create_cq");
	b.cq = rcq;
	struct ibv_qp *to = big_ud_qp(&b);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = b.gid, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	CHECK(ah, "ibv_create_ah");
	struct ibv_sge sg = { (uintptr_t)a.buf, 64, a.mr->lkey };
	for (int round = 0; round < 10; round++) {
		for (int i = 0; i < N; i++) {
			struct ibv_sge rs = { (uintptr_t)b.buf + 128 * i, 128, b.mr->lkey };
			struct ibv_recv_wr r = { .wr_id = i, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
			CHECK(ibv_post_recv(to, &r, &rbad) == 0, "ibv_post_recv");
		}
		struct ibv_qp *from = big_ud_qp(&a);
		for (int i = 0; i < N; i++) {
			struct ibv_send_wr w = { .wr_id = i, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND },
					   *bad = NULL;
			w.wr.ud.ah = ah;
			w.wr.ud.remote_qpn = to->qp_num;
			w.wr.ud.remote_qkey = 0x11;
			CHECK(ibv_post_send(from, &w, &bad) == 0, "ibv_post_send %d", i);
		}
		CHECK(ibv_destroy_qp(from) == 0, "ibv_destroy_qp at once");
		for (int i = 0; i < N; i++) {
			struct ibv_wc wc = wait_one(rcq);
			CHECK(wc.status == IBV_WC_SUCCESS, "round %d: datagram %d of %d", round, i, N);
		}
	}
}

/* A gather or scatter list longer than the queue's max_sge is EINVAL before any of its entries
   is read, as rxe's provider checks (here with a NULL list), unless the WR is inline; and a circular list of work
   requests (wr.next = &wr) on a QP in Error, where each post is flushed at once and no queue
   fills, ends with ENOMEM after at most max_qp_wr of them instead of never. */
static void bad_lists(void)
{
	struct end a;
	open_end(&a, IBV_QPT_RC);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &qi) == 0, "ibv_query_qp");
	hang_guard(60);
	struct ibv_recv_wr r = { .wr_id = 1, .num_sge = (int)qi.cap.max_recv_sge + 3 }, *rbad = NULL;
	int e = ibv_post_recv(a.qp, &r, &rbad);
	CHECK(e == EINVAL && rbad == &r, "post_recv beyond max_recv_sge: %d", e);
	struct ibv_send_wr s = { .wr_id = 2, .num_sge = (int)qi.cap.max_send_sge + 3, .opcode = IBV_WR_SEND },
			   *sbad = NULL;
	e = ibv_post_send(a.qp, &s, &sbad);
	CHECK(e == EINVAL && sbad == &s, "post_send beyond max_send_sge: %d", e);
	to_init(a.qp, IBV_ACCESS_LOCAL_WRITE);
	to_error(a.qp);
	struct ibv_sge sg = { (uintptr_t)a.buf, 8, a.mr->lkey };
	/* An inline WR's list is copied, not gathered: max_send_sge does not bound it (rxe
	   reports a max_sge that fits max_inline_data in 16-byte pieces). */
	struct ibv_sge two[2] = { sg, sg };
	struct ibv_send_wr in = { .wr_id = 5, .sg_list = two, .num_sge = 2, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_INLINE };
	CHECK(qi.cap.max_send_sge < 2 && qi.cap.max_inline_data >= 16, "caps %u %u", qi.cap.max_send_sge,
	      qi.cap.max_inline_data);
	e = ibv_post_send(a.qp, &in, &sbad);
	CHECK(e == 0, "an inline send of two SGEs on a QP of one: %d", e);
	struct ibv_send_wr sloop = { .wr_id = 3, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND };
	sloop.next = &sloop;
	e = ibv_post_send(a.qp, &sloop, &sbad);
	CHECK(e == ENOMEM && sbad == &sloop, "a circular send list: %d", e);
	struct ibv_recv_wr rloop = { .wr_id = 4, .sg_list = &sg, .num_sge = 1 };
	rloop.next = &rloop;
	e = ibv_post_recv(a.qp, &rloop, &rbad);
	CHECK(e == ENOMEM && rbad == &rloop, "a circular receive list: %d", e);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2, "usage: review_abi <check>");
	test = argv[1];
	if (!strcmp(test, "async_nonblocking"))
		async_nonblocking();
	else if (!strcmp(test, "cq_event_after_destroy"))
		cq_event_after_destroy();
	else if (!strcmp(test, "cq_event_interrupted"))
		cq_event_interrupted();
	else if (!strcmp(test, "async_event_interrupted"))
		async_event_interrupted();
	else if (!strcmp(test, "qp_event_after_destroy"))
		qp_event_after_destroy();
	else if (!strcmp(test, "query_qp_updates_state"))
		query_qp_updates_state();
	else if (!strcmp(test, "create_srq_ignores_limit"))
		create_srq_ignores_limit();
	else if (!strcmp(test, "reg_mr_access_errno"))
		reg_mr_access_errno();
	else if (!strcmp(test, "reg_mr_wrapping_range"))
		reg_mr_wrapping_range();
	else if (!strcmp(test, "reg_mr_needs_mapped_memory"))
		reg_mr_needs_mapped_memory();
	else if (!strcmp(test, "resize_counts_posted_ud_sends"))
		resize_counts_posted_ud_sends();
	else if (!strcmp(test, "destroy_after_unsignaled_ud_sends"))
		destroy_after_unsignaled_ud_sends();
	else if (!strcmp(test, "bad_lists"))
		bad_lists();
	else
		CHECK(0, "unknown check");
	printf("%s: ok\n", test);
	return 0;
}
