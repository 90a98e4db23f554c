/* A UD responder as verbs programs write it: it answers a datagram at the address of its
   sender, with ibv_create_ah_from_wc (libibverbs 1.1, which reads the GRH area of the receive
   buffer). Two devices in one process; prints "review_ud_ah: ok" and exits 0, or names the
   first check that failed. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define TEST_NAME "review_ud_ah"
#include "verbs_test.h"

enum { QKEY = 0x11111111, SIZE = 64, GRH = 40 };

static void open_end(struct ibv_device *dev, struct end *e)
{
	setup_end(e, ibv_open_device(dev), IBV_QPT_UD, IBV_ACCESS_LOCAL_WRITE, 4096);
	ud_to_rts(e->qp, QKEY);
}

static void post_recv(struct end *e)
{
	struct ibv_sge s = { (uintptr_t)e->buf, GRH + SIZE, e->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1 }, *bad = NULL;
	CHECK(ibv_post_recv(e->qp, &w, &bad) == 0, "ibv_post_recv");
}

static void send_to(struct end *e, struct ibv_ah *ah, uint32_t qpn, const char *msg)
{
	strcpy(e->buf + 2048, msg);
	struct ibv_sge s = { (uintptr_t)e->buf + 2048, SIZE, e->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = qpn;
	w.wr.ud.remote_qkey = QKEY;
	CHECK(ibv_post_send(e->qp, &w, &bad) == 0, "ibv_post_send");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct end a, b;
	open_end(list[0], &a);
	open_end(list[0], &b);
	post_recv(&a);
	post_recv(&b);

	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	aa.grh.dgid = b.gid;
	aa.grh.hop_limit = 1;
	struct ibv_ah *to_b = ibv_create_ah(a.pd, &aa);
	CHECK(to_b, "ibv_create_ah");
	send_to(&a, to_b, b.qp->qp_num, "ping");
	CHECK(wait_one(a.cq).status == IBV_WC_SUCCESS, "send ping");
	struct ibv_wc wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && (wc.wc_flags & IBV_WC_GRH) && strcmp(b.buf + GRH, "ping") == 0,
	      "ping received");
	/* No SL travels on RoCE: the SL field carries the packet's RoCE type as ConnectX reports
	   it (RoCEv2, bit 3, over IPv4, 2), which UCX's ud_verbs needs to read the GRH area. */
	CHECK(wc.sl == 0xA, "wc.sl: RoCEv2 over IPv4");
	/* UCX's RoCE address handle: DLID 0xc000 and flow label ~0 (for rdma-core's flow label to
	   UDP source port conversion); Linux takes both. */
	struct ibv_ah_attr wide = aa;
	wide.dlid = 0xc000;
	wide.grh.flow_label = ~0u;
	struct ibv_ah *w = ibv_create_ah(a.pd, &wide);
	CHECK(w && ibv_destroy_ah(w) == 0, "ibv_create_ah: a flow label wider than 20 bits");

	/* ibv_init_ah_from_wc as libibverbs 44's: the source GID index of the entry holding the
	   address the datagram was sent to; -1 with errno on failure; without IBV_WC_GRH an
	   address of the completion's fields alone. */
	struct ibv_ah_attr got;
	CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)b.buf, &got) == 0 && got.is_global == 1 &&
		      got.grh.sgid_index == 0 && memcmp(&got.grh.dgid, &a.gid, 16) == 0,
	      "ibv_init_ah_from_wc");
	struct ibv_wc bare = wc;
	bare.wc_flags &= ~IBV_WC_GRH;
	CHECK(ibv_init_ah_from_wc(b.ctx, 1, &bare, (struct ibv_grh *)b.buf, &got) == 0 && got.is_global == 0 &&
		      got.sl == wc.sl && got.port_num == 1,
	      "ibv_init_ah_from_wc without a GRH");
	unsigned char grh[GRH];
	memcpy(grh, b.buf, GRH);
	grh[36] = 239; /* to a multicast group (refused as one, or as held by no entry) */
	errno = 0;
	CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)grh, &got) == -1 && errno == EINVAL,
	      "a multicast destination: %d", errno);
	memcpy(grh, b.buf, GRH);
	grh[36] ^= 1; /* to an address that is not this device's */
	CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)grh, &got) == -1, "an address not in the table");
	memset(grh, 0, GRH); /* neither an IPv6 nor an IPv4 header */
	errno = 0;
	CHECK(ibv_init_ah_from_wc(b.ctx, 1, &wc, (struct ibv_grh *)grh, &got) == -1 && errno == EPROTONOSUPPORT,
	      "no header: %d", errno);

	/* The reply, addressed from the completion and the GRH area. */
	struct ibv_ah *to_a = ibv_create_ah_from_wc(b.pd, &wc, (struct ibv_grh *)b.buf, 1);
	CHECK(to_a, "ibv_create_ah_from_wc");
	send_to(&b, to_a, wc.src_qp, "pong");
	CHECK(wait_one(b.cq).status == IBV_WC_SUCCESS, "send pong");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && strcmp(a.buf + GRH, "pong") == 0, "pong received");
	printf("review_ud_ah: ok\n");
	return 0;
}
