/* Memory windows (type 1) through the C ABI: ibv_alloc_mw, ibv_bind_mw (the window carries
   the R_Key ibv_inc_rkey gives, at once), an RDMA Write through the window, a rebind, an
   unbind (a zero-length bind) after which the old R_Key is refused (Remote Access Error) and
   the region can go, ibv_dealloc_mw. Prints "mw: ok". */
#define TEST_NAME "mw"
#include "verbs_test.h"

static void write_to(struct end *a, uint64_t wr_id, uint64_t addr, uint32_t rkey)
{
	struct ibv_sge s = { (uintptr_t)a->buf, 64, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "ibv_post_send");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	struct end a, b;
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
	setup_end(&a, ibv_open_device(list[0]), IBV_QPT_RC, access, 8192);
	setup_end(&b, ibv_open_device(list[0]), IBV_QPT_RC, access, 8192);
	ibv_free_device_list(list);
	connect_rc(&a, &b, IBV_ACCESS_REMOTE_WRITE, 1);
	connect_rc(&b, &a, IBV_ACCESS_REMOTE_WRITE, 1);

	struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
	CHECK(mw && mw->type == IBV_MW_TYPE_1 && mw->pd == b.pd, "ibv_alloc_mw");
	CHECK(ibv_alloc_mw(b.pd, 3) == NULL && errno == EINVAL, "no type 3 windows");
	uint32_t before = mw->rkey;
	struct ibv_mw_bind bind = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = b.mr, .addr = (uintptr_t)b.buf + 1024, .length = 2048,
						   .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
	CHECK(ibv_bind_mw(b.qp, mw, &bind) == 0, "ibv_bind_mw");
	CHECK(mw->rkey == ibv_inc_rkey(before), "rkey %x after a bind of %x", mw->rkey, before);
	struct ibv_wc wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 1, "bind: %s",
	      ibv_wc_status_str(wc.status));

	memset(a.buf, 0x5a, 64);
	write_to(&a, 10, (uintptr_t)b.buf + 1024, mw->rkey);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "write through the window: %s", ibv_wc_status_str(wc.status));
	CHECK(b.buf[1024] == 0x5a && b.buf[1087] == 0x5a && b.buf[1088] == 0, "written bytes");

	uint32_t old = mw->rkey;
	bind.wr_id = 2;
	CHECK(ibv_bind_mw(b.qp, mw, &bind) == 0, "rebind");
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && mw->rkey != old, "rebind: %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_dereg_mr(b.mr) == EINVAL, "a region with a bound window stays (EINVAL, as rxe)");

	/* A zero-length bind with no region unbinds the window (libibverbs: mr NULL, addr and
	   length 0): a new R_Key, reaching nothing, and the region is free to go. */
	uint32_t bound = mw->rkey;
	struct ibv_mw_bind unbind = { .wr_id = 3, .send_flags = IBV_SEND_SIGNALED };
	CHECK(ibv_bind_mw(b.qp, mw, &unbind) == 0 && mw->rkey == ibv_inc_rkey(bound), "unbind");
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 3, "unbind: %s",
	      ibv_wc_status_str(wc.status));
	write_to(&a, 11, (uintptr_t)b.buf + 1024, old);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "the old R_Key: %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_dereg_mr(b.mr) == 0, "the region of an unbound window");

	CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
	printf("mw: ok\n");
	return 0;
}
