/* A verbs program written against rdma-core's infiniband/verbs.h, run against softhca's
   libibverbs.so.1: two contexts of the device opened in one process, an RC QP pair between them, then
   Send with Immediate, RDMA Write, RDMA Read, Compare & Swap, Fetch & Add, inline Send, a
   Write with a wrong R_Key (Remote Access Error, QP in Error, later WRs flushed), and the
   query verbs. Prints "rc_ops: ok" and exits 0, or names the first check that failed. */
#include <arpa/inet.h>
#define TEST_NAME "rc_ops"
#include "verbs_test.h"

enum { N = 65536 };

static void open_end(struct ibv_device *dev, struct end *e)
{
	e->ctx = ibv_open_device(dev);
	CHECK(e->ctx, "ibv_open_device");
	struct ibv_port_attr port;
	CHECK(ibv_query_port(e->ctx, 1, &port) == 0, "ibv_query_port");
	CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET, "port state %d", port.state);
	CHECK(ibv_query_gid(e->ctx, 1, 0, &e->gid) == 0, "ibv_query_gid");
	e->pd = ibv_alloc_pd(e->ctx);
	CHECK(e->pd, "ibv_alloc_pd");
	e->cq = ibv_create_cq(e->ctx, 64, NULL, NULL, 0);
	CHECK(e->cq && e->cq->cqe >= 64, "ibv_create_cq");
	e->buf = calloc(1, N);
	e->mr = ibv_reg_mr(e->pd, e->buf, N,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(e->mr && e->mr->lkey && e->mr->addr == e->buf, "ibv_reg_mr");
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
	};
	e->qp = ibv_create_qp(e->pd, &init);
	CHECK(e->qp && e->qp->qp_num && init.cap.max_send_wr >= 32, "ibv_create_qp");
	CHECK(e->qp->state == IBV_QPS_RESET, "new QP state %d", e->qp->state);
}

static void post(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad = NULL;
	CHECK(ibv_post_send(qp, wr, &bad) == 0 && !bad, "ibv_post_send");
}

int main(void)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num >= 1 && list[0], "ibv_get_device_list");
	CHECK(strcmp(ibv_get_device_name(list[0]), "softhca0") == 0, "device name");
	struct end a, b;
	open_end(list[0], &a);
	open_end(list[0], &b);
	ibv_free_device_list(list);
	/* Two contexts of one device share its port and GID; their QPs reach each other there. */
	CHECK(memcmp(&a.gid, &b.gid, sizeof a.gid) == 0, "two contexts of softhca0 with different GIDs");
	int all = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	connect_rc(&a, &b, all, 4);
	connect_rc(&b, &a, all, 4);

	/* Send with Immediate into a posted receive. */
	struct ibv_sge rs = { (uintptr_t)b.buf, 64, b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "ibv_post_recv");
	strcpy(a.buf, "hello softhca");
	struct ibv_sge s = { (uintptr_t)a.buf, 14, a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xabcd) };
	post(a.qp, &wr);
	struct ibv_wc wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 1, "send: %s",
	      ibv_wc_status_str(wc.status));
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 7 && wc.byte_len == 14 &&
		      (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0xabcd && wc.qp_num == b.qp->qp_num,
	      "receive: status %d opcode %d len %u imm %x", wc.status, wc.opcode, wc.byte_len, ntohl(wc.imm_data));
	CHECK(strcmp(b.buf, "hello softhca") == 0, "received bytes");

	/* RDMA Write of 40000 bytes, then Read them back elsewhere. */
	for (int i = 0; i < 40000; i++)
		a.buf[i] = (char)(i * 7);
	s = (struct ibv_sge){ (uintptr_t)a.buf, 40000, a.mr->lkey };
	wr = (struct ibv_send_wr){ .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 1000;
	wr.wr.rdma.rkey = b.mr->rkey;
	post(a.qp, &wr);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE, "write: %s", ibv_wc_status_str(wc.status));
	CHECK(memcmp(b.buf + 1000, a.buf, 40000) == 0, "written bytes");
	s = (struct ibv_sge){ (uintptr_t)a.buf + 50000, 12000, a.mr->lkey };
	wr = (struct ibv_send_wr){ .wr_id = 3, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				   .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf + 1000;
	wr.wr.rdma.rkey = b.mr->rkey;
	post(a.qp, &wr);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 12000, "read: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(memcmp(a.buf + 50000, a.buf, 12000) == 0, "read bytes");

	/* Atomics on b.buf[64..72]. */
	uint64_t *target = (uint64_t *)(b.buf + 64);
	*target = 40;
	s = (struct ibv_sge){ (uintptr_t)a.buf + 64000, 8, a.mr->lkey };
	wr = (struct ibv_send_wr){ .wr_id = 4, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				   .send_flags = IBV_SEND_SIGNALED };
	wr.wr.atomic.remote_addr = (uintptr_t)target;
	wr.wr.atomic.rkey = b.mr->rkey;
	wr.wr.atomic.compare_add = 2;
	post(a.qp, &wr);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD, "fetch-add: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(*(uint64_t *)(a.buf + 64000) == 40 && *target == 42, "fetch-add values");
	wr.wr_id = 5;
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 42;
	wr.wr.atomic.swap = 7;
	post(a.qp, &wr);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP, "cmp-swap: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(*(uint64_t *)(a.buf + 64000) == 42 && *target == 7, "cmp-swap values");

	/* An inline Send: the bytes are taken at post time. */
	CHECK(ibv_post_recv(b.qp, &rwr, &rbad) == 0, "ibv_post_recv");
	char msg[] = "inline!";
	s = (struct ibv_sge){ (uintptr_t)msg, sizeof msg, 0 };
	wr = (struct ibv_send_wr){ .wr_id = 6, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
	post(a.qp, &wr);
	msg[0] = 'X';
	CHECK(wait_one(a.cq).status == IBV_WC_SUCCESS, "inline send");
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && strcmp(b.buf, "inline!") == 0, "inline bytes");

	/* Query QP. */
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE | IBV_QP_DEST_QPN, &qi) == 0, "ibv_query_qp");
	CHECK(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == b.qp->qp_num && qa.path_mtu == IBV_MTU_1024 &&
		      qi.qp_type == IBV_QPT_RC && qi.send_cq == a.cq,
	      "query: state %d dest %u mtu %d", qa.qp_state, qa.dest_qp_num, qa.path_mtu);

	/* A Write with a wrong R_Key: Remote Access Error, the QP goes to Error, the next WR is
	   flushed. */
	s = (struct ibv_sge){ (uintptr_t)a.buf, 8, a.mr->lkey };
	wr = (struct ibv_send_wr){ .wr_id = 8, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
	wr.wr.rdma.rkey = b.mr->rkey ^ 0x55;
	post(a.qp, &wr);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 8, "bad rkey: %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR, "state after error %d",
	      qa.qp_state);
	wr.wr_id = 9;
	post(a.qp, &wr);
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 9, "flush: %s", ibv_wc_status_str(wc.status));

	/* Tear down, checking the busy refusals on the way. */
	CHECK(ibv_dealloc_pd(a.pd) == EBUSY, "a PD in use was deallocated");
	for (struct end *e = &a; e; e = (e == &a ? &b : NULL)) {
		CHECK(ibv_destroy_qp(e->qp) == 0, "ibv_destroy_qp");
		CHECK(ibv_dereg_mr(e->mr) == 0, "ibv_dereg_mr");
		CHECK(ibv_destroy_cq(e->cq) == 0, "ibv_destroy_cq");
		CHECK(ibv_dealloc_pd(e->pd) == 0, "ibv_dealloc_pd");
		CHECK(ibv_close_device(e->ctx) == 0, "ibv_close_device");
		free(e->buf);
	}
	printf("rc_ops: ok\n");
	return 0;
}
