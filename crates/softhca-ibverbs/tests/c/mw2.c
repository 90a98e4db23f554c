/* Type 2 memory windows and invalidation through the C ABI: the device reports
   IBV_DEVICE_MEM_WINDOW_TYPE_2B; ibv_alloc_mw(IBV_MW_TYPE_2); an IBV_WR_BIND_MW work request
   with the R_Key ibv_inc_rkey gives (mw->rkey is left as it was: the program keeps the key it
   chose, as with rxe's and mlx5's providers); an RDMA Write through
   the window; the peer's IBV_WR_SEND_WITH_INV completes with IBV_WC_WITH_INV and the R_Key in
   wc.invalidated_rkey, and the R_Key stops working; a rebind through ibv_wr_bind_mw, then
   ibv_wr_local_inv; and ibv_wr_send_inv on an extended QP. Prints "mw2: ok". */
#define TEST_NAME "mw2"
#include "verbs_test.h"

static struct ibv_wc write_to(struct end *a, uint64_t wr_id, uint64_t addr, uint32_t rkey)
{
	struct ibv_sge s = { (uintptr_t)a->buf, 64, a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(a->qp, &wr, &bad) == 0, "ibv_post_send");
	return wait_one(a->cq);
}

static uint32_t bind_by_wr(struct end *b, struct ibv_mw *mw, uint64_t wr_id)
{
	uint32_t before = mw->rkey;
	struct ibv_send_wr wr = { .wr_id = wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info.mr = b->mr;
	wr.bind_mw.bind_info.addr = (uintptr_t)b->buf;
	wr.bind_mw.bind_info.length = 4096;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(ibv_post_send(b->qp, &wr, &bad) == 0, "post IBV_WR_BIND_MW");
	CHECK(mw->rkey == before, "mw->rkey after the post");
	struct ibv_wc wc = wait_one(b->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == wr_id, "bind: %s",
	      ibv_wc_status_str(wc.status));
	return wr.bind_mw.rkey;
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

	struct ibv_device_attr attr;
	CHECK(ibv_query_device(b.ctx, &attr) == 0, "ibv_query_device");
	CHECK(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW, "IBV_DEVICE_MEM_WINDOW");
	CHECK(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B, "IBV_DEVICE_MEM_WINDOW_TYPE_2B");

	struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_2);
	CHECK(mw && mw->type == IBV_MW_TYPE_2, "ibv_alloc_mw(IBV_MW_TYPE_2)");
	uint32_t rkey = bind_by_wr(&b, mw, 1);
	memset(a.buf, 0x3c, 64);
	struct ibv_wc wc = write_to(&a, 10, (uintptr_t)b.buf + 64, rkey);
	CHECK(wc.status == IBV_WC_SUCCESS, "write through the window: %s", ibv_wc_status_str(wc.status));
	CHECK(b.buf[64] == 0x3c && b.buf[127] == 0x3c && b.buf[128] == 0, "written bytes");

	/* a's Send with Invalidate frees b's window. */
	struct ibv_sge rs = { (uintptr_t)b.buf + 4096, 64, b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 20, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "ibv_post_recv");
	struct ibv_sge ss = { (uintptr_t)a.buf, 16, a.mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 11, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				   .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = rkey }, *sbad;
	CHECK(ibv_post_send(a.qp, &swr, &sbad) == 0, "post IBV_WR_SEND_WITH_INV");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND, "send with invalidate: %s",
	      ibv_wc_status_str(wc.status));
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 20 && wc.opcode == IBV_WC_RECV && wc.byte_len == 16,
	      "receive: %s", ibv_wc_status_str(wc.status));
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && !(wc.wc_flags & IBV_WC_WITH_IMM), "IBV_WC_WITH_INV");
	CHECK(wc.invalidated_rkey == rkey, "invalidated_rkey %x, not %x", wc.invalidated_rkey, rkey);

	/* Bound again (through ibv_wr_bind_mw on an extended QP of b's), then Local Invalidate. */
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = b.cq, .recv_cq = b.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = b.pd,
		.send_ops_flags = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV,
	};
	struct ibv_qp *xq = ibv_create_qp_ex(b.ctx, &xa);
	CHECK(xq, "ibv_create_qp_ex with Bind MW, Local Invalidate and Send with Invalidate");
	struct end bx = b;
	bx.qp = xq;
	connect_rc(&bx, &a, IBV_ACCESS_REMOTE_WRITE, 1);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(xq);
	struct ibv_mw_bind_info info = { .mr = b.mr, .addr = (uintptr_t)b.buf, .length = 4096,
					 .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	uint32_t next = ibv_inc_rkey(rkey);
	ibv_wr_start(qx);
	qx->wr_id = 30;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(qx, mw, next, &info);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_bind_mw");
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW && mw->rkey != next, "rebind: %s",
	      ibv_wc_status_str(wc.status));
	ibv_wr_start(qx);
	qx->wr_id = 31;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qx, next);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_local_inv");
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV && wc.wr_id == 31, "local invalidate: %s",
	      ibv_wc_status_str(wc.status));
	/* Bound to xq, not b.qp: a Local Invalidate through b.qp of a free window fails. */
	struct ibv_send_wr inv = { .wr_id = 32, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
				   .invalidate_rkey = next }, *ibad;
	CHECK(ibv_post_send(b.qp, &inv, &ibad) == 0, "post IBV_WR_LOCAL_INV");
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_LOC_QP_OP_ERR && wc.wr_id == 32, "local invalidate of a free window: %s",
	      ibv_wc_status_str(wc.status));

	CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
	printf("mw2: ok\n");
	return 0;
}
