/* UD multicast through libibverbs: ibv_attach_mcast / ibv_detach_mcast with Linux's answers
   (ib_attach_mcast, uverbs, rxe's limits), and a Send to a group reaching every attached QP of
   the device, the sender's own included. Two contexts of one device; prints "mcast: ok" and
   exits 0, or names the first check that failed. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define TEST_NAME "mcast"
#include "verbs_test.h"

enum { QKEY = 0x01234567, SIZE = 64, GRH = 40, MULTICAST_QPN = 0xFFFFFF };

static void open_end(struct ibv_device *dev, struct end *e)
{
	setup_end(e, ibv_open_device(dev), IBV_QPT_UD, IBV_ACCESS_LOCAL_WRITE, 4096);
	ud_to_rts(e->qp, QKEY);
	struct ibv_sge s = { (uintptr_t)e->buf, GRH + SIZE, e->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1 }, *bad = NULL;
	CHECK(ibv_post_recv(e->qp, &w, &bad) == 0, "ibv_post_recv");
}

/* ::ffff:239.7.7.<last>, the MGID rdma_cm gives an IPv4 group on a RoCEv2 port. */
static union ibv_gid group(uint8_t last)
{
	union ibv_gid g;
	memset(&g, 0, sizeof g);
	g.raw[10] = g.raw[11] = 0xff;
	g.raw[12] = 239;
	g.raw[13] = g.raw[14] = 7;
	g.raw[15] = last;
	return g;
}

int main(void)
{
	hang_guard(30);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct end a, b;
	open_end(list[0], &a);
	open_end(list[0], &b);

	struct ibv_device_attr da;
	CHECK(ibv_query_device(a.ctx, &da) == 0, "ibv_query_device");
	CHECK(da.max_mcast_grp == 8192 && da.max_mcast_qp_attach == 56 && da.max_total_mcast_qp_attach == 0x70000,
	      "rxe's multicast limits: %d %d %d", da.max_mcast_grp, da.max_mcast_qp_attach,
	      da.max_total_mcast_qp_attach);

	/* ib_attach_mcast: a multicast GID and a UD QP, else EINVAL; the LID is not looked at. */
	union ibv_gid g = group(1), unicast = a.gid;
	CHECK(ibv_attach_mcast(a.qp, &unicast, 0xc001) == EINVAL, "attach of a unicast GID: EINVAL");
	struct ibv_qp_init_attr rc_init = { .send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
					    .cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1,
						     .max_recv_sge = 1 } };
	struct ibv_qp *rc = ibv_create_qp(a.pd, &rc_init);
	CHECK(rc, "ibv_create_qp RC");
	CHECK(ibv_attach_mcast(rc, &g, 0xc001) == EINVAL, "attach of an RC QP: EINVAL");
	CHECK(ibv_destroy_qp(rc) == 0, "destroy RC");
	CHECK(ibv_attach_mcast(a.qp, &g, 0xc001) == 0, "attach a");
	CHECK(ibv_attach_mcast(a.qp, &g, 0xc001) == 0, "attach a again: uverbs answers 0");
	CHECK(ibv_attach_mcast(b.qp, &g, 0) == 0, "attach b");
	union ibv_gid other = group(2);
	CHECK(ibv_detach_mcast(b.qp, &other, 0) == EINVAL, "detach of a group not attached: EINVAL");

	/* a sends to the group: both QPs get it, a's through the loopback of its own datagram. */
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	aa.grh.dgid = g;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	CHECK(ah, "ibv_create_ah to the group");
	strcpy(a.buf + 2048, "to the group");
	struct ibv_sge s = { (uintptr_t)a.buf + 2048, SIZE, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = MULTICAST_QPN;
	w.wr.ud.remote_qkey = QKEY;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "ibv_post_send to the group");
	struct end *ends[2] = { &a, &b };
	int sent = 0;
	for (int i = 0; i < 2; i++) {
		struct ibv_wc wc = wait_one(ends[i]->cq);
		if (wc.opcode == IBV_WC_SEND) {
			CHECK(wc.status == IBV_WC_SUCCESS, "the send: %s", ibv_wc_status_str(wc.status));
			sent = 1;
			wc = wait_one(ends[i]->cq);
		}
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.src_qp == a.qp->qp_num &&
			      (wc.wc_flags & IBV_WC_GRH) && wc.byte_len == GRH + SIZE,
		      "%c received: %s", 'a' + i, ibv_wc_status_str(wc.status));
		const uint8_t *ip = (const uint8_t *)ends[i]->buf + 20;
		CHECK(ip[16] == 239 && ip[17] == 7 && ip[18] == 7 && ip[19] == 1, "the GRH area names the group");
		CHECK(strcmp(ends[i]->buf + GRH, "to the group") == 0, "%c: the payload", 'a' + i);
	}
	CHECK(sent, "a's send completed");

	/* uverbs keeps a QP attached to a group from Destroy QP (EBUSY) until it detaches. */
	CHECK(ibv_destroy_qp(b.qp) == EBUSY, "destroy of an attached QP: EBUSY");
	CHECK(ibv_detach_mcast(b.qp, &g, 0) == 0, "detach b");
	CHECK(ibv_detach_mcast(b.qp, &g, 0) == EINVAL, "detach b again: EINVAL");
	CHECK(ibv_destroy_qp(b.qp) == 0, "destroy b once detached");
	/* Closing the context detaches what is still attached (a). */
	CHECK(ibv_close_device(a.ctx) == 0, "close a's context");
	printf("mcast: ok\n");
	return 0;
}
