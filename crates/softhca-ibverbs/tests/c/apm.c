/* Alternate paths through the drop-in: a device opened with SOFTHCA_ALT_ADDR has a second
   address (GID 1) and Automatic Path Migration. Two RC QPs of the device, connected to each
   other over GID 0, load the alternate path GID 1 -> GID 1 and rearm (ARMED at once); Query QP
   reports it; the consumer migrates (MIGRATED), and a Send then travels between the second
   addresses. An alternate path from an empty GID slot is ENODATA (the kernel's rdma_get_gid_attr,
   as rxe answers). Prints "apm: ok". */
#define TEST_NAME "apm"
#include "verbs_test.h"

static void load_alternate(struct end *e, union ibv_gid *gid1, uint8_t sgid_index, int expect)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.alt_ah_attr.is_global = 1;
	a.alt_ah_attr.grh.dgid = *gid1;
	a.alt_ah_attr.grh.sgid_index = sgid_index;
	a.alt_ah_attr.grh.hop_limit = 1;
	a.alt_ah_attr.port_num = 1;
	a.alt_port_num = 1;
	a.alt_pkey_index = 0;
	a.alt_timeout = 14;
	a.path_mig_state = IBV_MIG_REARM;
	int r = ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE);
	CHECK(r == expect, "alternate path from GID %u: %d, want %d", sgid_index, r, expect);
}

int main(void)
{
	hang_guard(30);
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
	CHECK(da.device_cap_flags & IBV_DEVICE_AUTO_PATH_MIG, "AUTO_PATH_MIG with a second address");
	union ibv_gid gid1;
	CHECK(ibv_query_gid(ctx, 1, 1, &gid1) == 0, "GID 1");
	static const uint8_t want[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 22, 0, 1 };
	CHECK(memcmp(gid1.raw, want, 16) == 0, "GID 1 is SOFTHCA_ALT_ADDR");

	struct end e, f;
	setup_end(&e, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 64);
	setup_end(&f, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 64);
	connect_rc(&e, &f, 0, 1);
	connect_rc(&f, &e, 0, 1);
	load_alternate(&e, &gid1, 7, ENODATA); /* an empty slot: no address to send from */
	load_alternate(&e, &gid1, 1, 0);
	load_alternate(&f, &gid1, 1, 0);

	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(e.qp, &q, IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE, &qi) == 0, "ibv_query_qp");
	CHECK(q.path_mig_state == IBV_MIG_ARMED, "armed: %d", q.path_mig_state);
	CHECK(memcmp(q.alt_ah_attr.grh.dgid.raw, gid1.raw, 16) == 0 && q.alt_ah_attr.grh.sgid_index == 1,
	      "alternate path reported");
	CHECK(q.alt_timeout == 14 && q.alt_port_num == 1, "alternate timeout and port");

	/* The consumer migrates both QPs: the alternate becomes the path. */
	for (struct end *x = &e; x; x = x == &e ? &f : NULL) {
		memset(&q, 0, sizeof q);
		q.qp_state = IBV_QPS_RTS;
		q.path_mig_state = IBV_MIG_MIGRATED;
		CHECK(ibv_modify_qp(x->qp, &q, IBV_QP_STATE | IBV_QP_PATH_MIG_STATE) == 0, "migrate");
		CHECK(ibv_query_qp(x->qp, &q, IBV_QP_AV | IBV_QP_PATH_MIG_STATE, &qi) == 0, "ibv_query_qp");
		CHECK(q.path_mig_state == IBV_MIG_MIGRATED, "migrated: %d", q.path_mig_state);
		CHECK(memcmp(q.ah_attr.grh.dgid.raw, gid1.raw, 16) == 0 && q.ah_attr.grh.sgid_index == 1,
		      "the path is the alternate now");
	}

	/* A Send over the second addresses. */
	strcpy(e.buf, "over the alternate path");
	struct ibv_sge rs = { .addr = (uintptr_t)f.buf, .length = 64, .lkey = f.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(f.qp, &rwr, &rbad) == 0, "ibv_post_recv");
	struct ibv_sge ss = { .addr = (uintptr_t)e.buf, .length = 24, .lkey = e.mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED }, *sbad;
	CHECK(ibv_post_send(e.qp, &swr, &sbad) == 0, "ibv_post_send");
	struct ibv_wc w1 = wait_one(e.cq), w2 = wait_one(f.cq);
	CHECK(w1.status == IBV_WC_SUCCESS && w1.wr_id == 1, "send: %s", ibv_wc_status_str(w1.status));
	CHECK(w2.status == IBV_WC_SUCCESS && w2.wr_id == 2 && w2.byte_len == 24, "recv: %s", ibv_wc_status_str(w2.status));
	CHECK(strcmp(f.buf, "over the alternate path") == 0, "bytes");

	/* No Path Migrated event: the consumer migrated (EVT-PM-1 names the automatic ones). */
	ibv_destroy_qp(e.qp);
	ibv_destroy_qp(f.qp);
	printf("apm: ok\n");
	return 0;
}
