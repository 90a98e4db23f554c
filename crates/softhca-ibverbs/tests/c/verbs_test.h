/* Shared by the C test programs: define TEST_NAME (a string) before including. CHECK names
   the first failed check and exits 1; hang_guard makes a verb that blocks when it should not
   end the program (exit 3, "<name>: HANG"); wait_one polls for one completion (10 s at most: a
   hang guard); struct end is one device with a PD, a CQ, a QP and a registered buffer, which
   setup_end fills; connect_rc takes an RC QP through Init, RTR and RTS toward its peer. */
#ifndef SOFTHCA_VERBS_TEST_H
#define SOFTHCA_VERBS_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define CHECK(c, ...)                                                                          \
	do {                                                                                       \
		if (!(c)) {                                                                            \
			fprintf(stderr, "%s: %s:%d: ", TEST_NAME, __FILE__, __LINE__);                     \
			fprintf(stderr, __VA_ARGS__);                                                      \
			fprintf(stderr, "\n");                                                             \
			exit(1);                                                                           \
		}                                                                                      \
	} while (0)

static inline void on_hang(int sig)
{
	(void)sig;
	char msg[128];
	int n = snprintf(msg, sizeof msg, "%s: HANG (a verb that should return blocked)\n", TEST_NAME);
	if (write(2, msg, n) < 0)
		_exit(4);
	_exit(3);
}

/* Ends the program after `secs` (0 disarms): a hang guard, not a timing check. */
static inline void hang_guard(unsigned secs)
{
	signal(SIGALRM, on_hang);
	alarm(secs);
}

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

/* Fills `e` on the open context `ctx`: its GID 0, a PD, a CQ, `len` bytes registered with
   `mr_access`, and a QP of `type` (16 send and receive WRs of one SGE). */
static inline void setup_end(struct end *e, struct ibv_context *ctx, enum ibv_qp_type type, int mr_access, size_t len)
{
	e->ctx = ctx;
	CHECK(e->ctx, "ibv_open_device");
	CHECK(ibv_query_gid(e->ctx, 1, 0, &e->gid) == 0, "ibv_query_gid");
	e->pd = ibv_alloc_pd(e->ctx);
	CHECK(e->pd, "ibv_alloc_pd");
	e->cq = ibv_create_cq(e->ctx, 64, NULL, NULL, 0);
	CHECK(e->cq, "ibv_create_cq");
	e->buf = calloc(1, len);
	e->mr = ibv_reg_mr(e->pd, e->buf, len, mr_access);
	CHECK(e->mr, "ibv_reg_mr");
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	e->qp = ibv_create_qp(e->pd, &init);
	CHECK(e->qp, "ibv_create_qp");
}

static inline struct ibv_wc wait_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n == 1)
			return wc;
		CHECK(time(NULL) < end, "no completion");
	}
}

/* A UD QP through INIT (port 1, P_Key index 0, Q_Key qkey), RTR and RTS (SQ PSN 0). */
static inline void ud_to_rts(struct ibv_qp *qp, uint32_t qkey)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = qkey };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "UD to INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "UD to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD to RTS");
}

static inline void connect_rc(struct end *e, struct end *peer, int access, uint8_t rd_atomic)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = access };
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	      "to INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.max_dest_rd_atomic = rd_atomic;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
	      "to RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = rd_atomic;
	CHECK(ibv_modify_qp(e->qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "to RTS");
	CHECK(e->qp->state == IBV_QPS_RTS, "state after RTS %d", e->qp->state);
}

#endif
