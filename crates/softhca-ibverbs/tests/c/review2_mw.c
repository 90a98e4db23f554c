/* Review of memory windows through the C ABI, checking what rdma-core's libibverbs (mlx5's
   bind_mw) does. Modes (argv[1]):
     bind_twice_sqd  two ibv_bind_mw of one window posted back to back while the QP is in SQD
                     (neither executes before the second is posted), then back to RTS: both
                     succeed, the window ends with ibv_inc_rkey applied twice and an RDMA
                     Write through that R_Key succeeds.
     zero_based      a bind asking for IBV_ACCESS_ZERO_BASED, which softhca cannot honour,
                     must be refused at post time (mlx5: EINVAL), not silently bound VA-based.
   Prints "<mode>: ok". An alarm is a hang guard only. */
#define TEST_NAME mode
static const char *mode = "review2_mw";
#include "verbs_test.h"

static void to_state(struct ibv_qp *qp, enum ibv_qp_state s)
{
	struct ibv_qp_attr a = { .qp_state = s };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "to state %d", s);
}

static void bind_twice(struct end *a, struct end *b, int sqd)
{
	struct ibv_mw *mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_1);
	CHECK(mw, "ibv_alloc_mw");
	uint32_t before = mw->rkey;
	struct ibv_mw_bind bind = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = b->mr, .addr = (uintptr_t)b->buf, .length = 4096,
						   .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	if (sqd)
		to_state(b->qp, IBV_QPS_SQD);
	CHECK(ibv_bind_mw(b->qp, mw, &bind) == 0, "first ibv_bind_mw");
	bind.wr_id = 2;
	CHECK(ibv_bind_mw(b->qp, mw, &bind) == 0, "second ibv_bind_mw");
	CHECK(mw->rkey == ibv_inc_rkey(ibv_inc_rkey(before)), "rkey %x after two binds of %x", mw->rkey, before);
	if (sqd)
		to_state(b->qp, IBV_QPS_RTS);
	for (uint64_t id = 1; id <= 2; id++) {
		struct ibv_wc wc = wait_one(b->cq);
		CHECK(wc.wr_id == id && wc.status == IBV_WC_SUCCESS, "bind %llu: wr_id %llu %s",
		      (unsigned long long)id, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	}
	struct ibv_sge s = { (uintptr_t)a->buf, 64, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 10, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = (uintptr_t)b->buf;
	wr.wr.rdma.rkey = mw->rkey;
	memset(a->buf, 0x5a, 64);
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "ibv_post_send");
	struct ibv_wc wc = wait_one(a->cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "write through mw->rkey: %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
}

static void zero_based(struct end *b)
{
	struct ibv_mw *mw = ibv_alloc_mw(b->pd, IBV_MW_TYPE_1);
	CHECK(mw, "ibv_alloc_mw");
	struct ibv_mw_bind bind = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = b->mr, .addr = (uintptr_t)b->buf, .length = 4096,
						   .mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
								      IBV_ACCESS_ZERO_BASED } };
	int rc = ibv_bind_mw(b->qp, mw, &bind);
	CHECK(rc != 0, "a zero-based bind was accepted (and will be VA-based)");
}

int main(int argc, char **argv)
{
	hang_guard(30);
	CHECK(argc == 2, "usage: review2_mw MODE");
	mode = argv[1];
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct end a, b;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
	setup_end(&a, ibv_open_device(list[0]), IBV_QPT_RC, access, 8192);
	setup_end(&b, ibv_open_device(list[0]), IBV_QPT_RC, access, 8192);
	ibv_free_device_list(list);
	connect_rc(&a, &b, IBV_ACCESS_REMOTE_WRITE, 1);
	connect_rc(&b, &a, IBV_ACCESS_REMOTE_WRITE, 1);
	if (!strcmp(mode, "bind_twice_sqd"))
		bind_twice(&a, &b, 1);
	else if (!strcmp(mode, "zero_based"))
		zero_based(&b);
	else
		CHECK(0, "unknown mode");
	printf("%s: ok\n", mode);
	return 0;
}
