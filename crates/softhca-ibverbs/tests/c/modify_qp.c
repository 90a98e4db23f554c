/* Modify QP through the C ABI where Linux and the digest differ (B-2): what Linux accepts is
   accepted. IBV_QP_CUR_STATE is taken only where Linux takes it (out of RTR, RTS, SQD, SQE)
   and then must name the current state;
   a UC QP's Read and Atomic enables (which Linux ignores there) are accepted, and Query QP
   gives them back as set, as rxe does; an RC QP's Init -> RTR without IBV_QP_MIN_RNR_TIMER
   (which Linux requires and the digest does not) is accepted too. PSNs wider than 24 bits are
   masked (Linux's _ib_modify_qp). Query QP: before a path, path_mtu 256 (rxe's initial one);
   a mask bit from IBV_QP_RATE_LIMIT on is EOPNOTSUPP (libibverbs' legacy command). One
   completion vector per CPU (rxe's num_possible_cpus). Prints "modify_qp: ok". */
#include <errno.h>
#define TEST_NAME "modify_qp"
#include "verbs_test.h"

static struct ibv_qp *qp_of(struct ibv_pd *pd, struct ibv_cq *cq, enum ibv_qp_type t)
{
	struct ibv_qp_init_attr init = { .send_cq = cq, .recv_cq = cq, .qp_type = t,
					 .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
						  .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	CHECK(qp, "ibv_create_qp");
	return qp;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd, cq");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "gid");

	/* Completion vectors: one per CPU; the first past them is refused. */
	CHECK(ctx->num_comp_vectors >= 1, "num_comp_vectors %d", ctx->num_comp_vectors);
	struct ibv_cq *last_vec = ibv_create_cq(ctx, 4, NULL, NULL, ctx->num_comp_vectors - 1);
	CHECK(last_vec, "a CQ on vector %d: %d", ctx->num_comp_vectors - 1, errno);
	CHECK(ibv_destroy_cq(last_vec) == 0, "destroy");
	CHECK(!ibv_create_cq(ctx, 4, NULL, NULL, ctx->num_comp_vectors) && errno == EINVAL, "vector past the last");

	/* IBV_QP_CUR_STATE is not an attribute of Reset -> Init in Linux's table, even naming
	   the current state. */
	struct ibv_qp *rc = qp_of(pd, cq, IBV_QPT_RC);
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(rc, &q, IBV_QP_STATE | IBV_QP_PATH_MTU, &qi) == 0 && q.path_mtu == IBV_MTU_256,
	      "path MTU before a path: %d", q.path_mtu);
	CHECK(ibv_query_qp(rc, &q, IBV_QP_STATE | IBV_QP_RATE_LIMIT, &qi) == EOPNOTSUPP, "query of RATE_LIMIT");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .cur_qp_state = IBV_QPS_RESET, .port_num = 1 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	CHECK(ibv_modify_qp(rc, &a, mask | IBV_QP_CUR_STATE) == EINVAL, "CUR_STATE at Reset -> Init accepted");
	CHECK(rc->state == IBV_QPS_RESET, "state moved");
	CHECK(ibv_modify_qp(rc, &a, mask) == 0, "Reset -> Init refused");
	CHECK(rc->state == IBV_QPS_INIT, "state %d", rc->state);

	/* RC Init -> RTR without the Minimum RNR NAK Timer. */
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = rc->qp_num;
	a.max_dest_rd_atomic = 1;
	a.rq_psn = 0x7F123456; /* an unmasked lrand48() */
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(rc, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC) == 0,
	      "RTR without MIN_RNR_TIMER refused");
	CHECK(ibv_query_qp(rc, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_RTR && q.path_mtu == IBV_MTU_1024,
	      "query after RTR");
	CHECK(q.rq_psn == 0x123456, "RQ PSN %#x, not masked to 24 bits", q.rq_psn);

	/* Out of RTR, IBV_QP_CUR_STATE is taken, and must name the current state. */
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.cur_qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	mask = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
	       IBV_QP_MAX_QP_RD_ATOMIC;
	CHECK(ibv_modify_qp(rc, &a, mask) == EINVAL, "a wrong current state was accepted");
	CHECK(rc->state == IBV_QPS_RTR, "state moved");
	CHECK(ibv_modify_qp(rc, &a, mask & ~IBV_QP_SQ_PSN) == EINVAL, "RTS without its SQ PSN accepted");
	CHECK(ibv_modify_qp(rc, &a, mask | IBV_QP_PATH_MTU) == EINVAL, "RTS with a path MTU accepted");
	a.cur_qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(rc, &a, mask) == 0, "the right current state was refused");
	CHECK(rc->state == IBV_QPS_RTS, "state %d", rc->state);

	/* UC: Read and Atomic enables are accepted (and ignored). */
	struct ibv_qp *uc = qp_of(pd, cq, IBV_QPT_UC);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	CHECK(ibv_modify_qp(uc, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	      "UC with Read/Atomic enables refused");
	CHECK(ibv_query_qp(uc, &q, IBV_QP_ACCESS_FLAGS, &qi) == 0 &&
		      q.qp_access_flags == (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC),
	      "UC access flags %x", q.qp_access_flags);
	/* A move to Reset clears them, as every attribute here. */
	struct ibv_qp_attr reset = { .qp_state = IBV_QPS_RESET };
	CHECK(ibv_modify_qp(uc, &reset, IBV_QP_STATE) == 0, "to Reset");
	CHECK(ibv_query_qp(uc, &q, IBV_QP_ACCESS_FLAGS, &qi) == 0 && q.qp_access_flags == 0, "access flags after Reset %x",
	      q.qp_access_flags);

	/* An invalid target state is EINVAL, not a crash. */
	a.qp_state = 42;
	CHECK(ibv_modify_qp(uc, &a, IBV_QP_STATE) == EINVAL, "state 42 accepted");

	CHECK(ibv_destroy_qp(rc) == 0 && ibv_destroy_qp(uc) == 0, "destroy");
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0, "teardown");
	ibv_free_device_list(list);
	printf("modify_qp: ok\n");
	return 0;
}
