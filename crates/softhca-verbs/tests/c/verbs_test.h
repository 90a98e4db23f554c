/* Shared by the C test programs: define TEST_NAME (a string) before including. CHECK names
   the first failed check and exits 1; wait_one polls for one completion (10 s at most: a hang
   guard); struct end is one device with a PD, a CQ, a QP and a registered buffer; connect_rc
   takes an RC QP through Init, RTR and RTS toward its peer. */
#ifndef SOFTHCA_VERBS_TEST_H
#define SOFTHCA_VERBS_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
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

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

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
