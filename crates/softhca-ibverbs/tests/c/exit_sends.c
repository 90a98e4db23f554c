/* Unsignaled UD sends and then exit(0), no destroy: Linux's rxe has sent them in
   ibv_post_send. Two processes: "recv" prints its QPN and GID and waits for N datagrams;
   "send QPN GID-BYTES" posts N unsignaled sends to it and exits at once. The receiver prints
   "exit_sends: ok" once all N arrived. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define TEST_NAME "exit_sends"
#include "verbs_test.h"

enum { N = 256, QKEY = 0x11 };

static struct ibv_qp *ud_qp(struct end *e)
{
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = N, .max_recv_wr = N, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(e->pd, &init);
	CHECK(qp, "ibv_create_qp");
	ud_to_rts(qp, QKEY);
	return qp;
}

int main(int argc, char **argv)
{
	hang_guard(30);
	CHECK(argc >= 2, "usage: exit_sends recv | send QPN GID");
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct end e;
	setup_end(&e, ibv_open_device(list[0]), IBV_QPT_UD, IBV_ACCESS_LOCAL_WRITE, 128 * N);
	e.cq = ibv_create_cq(e.ctx, N, NULL, NULL, 0);
	CHECK(e.cq, "ibv_create_cq");
	struct ibv_qp *qp = ud_qp(&e);
	if (!strcmp(argv[1], "recv")) {
		for (int i = 0; i < N; i++) {
			struct ibv_sge s = { (uintptr_t)e.buf + 128 * i, 128, e.mr->lkey };
			struct ibv_recv_wr r = { .wr_id = i, .sg_list = &s, .num_sge = 1 }, *bad = NULL;
			CHECK(ibv_post_recv(qp, &r, &bad) == 0, "ibv_post_recv");
		}
		printf("qpn %u gid", qp->qp_num);
		for (int i = 0; i < 16; i++)
			printf(" %u", e.gid.raw[i]);
		printf("\n");
		fflush(stdout);
		for (int i = 0; i < N; i++)
			CHECK(wait_one(e.cq).status == IBV_WC_SUCCESS, "datagram %d of %d", i, N);
		printf("exit_sends: ok\n");
		return 0;
	}
	CHECK(argc == 19, "send QPN and 16 GID bytes");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .hop_limit = 1 } };
	for (int i = 0; i < 16; i++)
		aa.grh.dgid.raw[i] = (uint8_t)atoi(argv[3 + i]);
	struct ibv_ah *ah = ibv_create_ah(e.pd, &aa);
	CHECK(ah, "ibv_create_ah");
	struct ibv_sge s = { (uintptr_t)e.buf, 64, e.mr->lkey };
	for (int i = 0; i < N; i++) {
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad = NULL;
		w.wr.ud.ah = ah;
		w.wr.ud.remote_qpn = (uint32_t)strtoul(argv[2], NULL, 0);
		w.wr.ud.remote_qkey = QKEY;
		CHECK(ibv_post_send(qp, &w, &bad) == 0, "ibv_post_send %d", i);
	}
	exit(0);
}
