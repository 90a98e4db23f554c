/* Atomic Write through libibverbs (rdma-core 44's ibv_wr_atomic_write, IBV_WR_ATOMIC_WRITE;
   rxe's since Linux 6.2): IBV_QP_EX_WITH_ATOMIC_WRITE on RC only (EOPNOTSUPP on UC, UD and
   an XRC initiator, as rxe's provider), its 8 bytes copied at the call and stored as they
   were, IBV_WC_ATOMIC_WRITE with byte_len 8, through the classic ibv_post_send too (its
   gather list's 8 bytes, wr.rdma's word; EINVAL for any other length), and the responder's
   refusals: a misaligned word (REM_INV_REQ_ERR), a region without Remote Write
   (REM_ACCESS_ERR). Prints "atomic_write: ok" and exits 0, or names the first check that
   failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define TEST_NAME "atomic_write"
#include "verbs_test.h"

/* An RC QP with `ops` on e's PD and CQ, in place of e's own. */
static struct ibv_qp *qp_with(struct end *e, enum ibv_qp_type type, uint64_t ops)
{
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = e->pd,
		.send_ops_flags = ops,
	};
	return ibv_create_qp_ex(e->ctx, &qa);
}

static uint64_t word_at(struct end *e, size_t at)
{
	uint64_t v;
	memcpy(&v, e->buf + at, 8);
	return v;
}

int main(void)
{
	hang_guard(60);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct end a, b;
	setup_end(&a, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(&b, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 4096);

	/* The operation is RC's alone. */
	enum ibv_qp_type others[] = { IBV_QPT_UC, IBV_QPT_UD };
	for (int i = 0; i < 2; i++) {
		errno = 0;
		CHECK(!qp_with(&a, others[i], IBV_QP_EX_WITH_ATOMIC_WRITE) && errno == EOPNOTSUPP,
		      "IBV_QP_EX_WITH_ATOMIC_WRITE on QP type %d: %s", others[i], strerror(errno));
	}
	CHECK(ibv_destroy_qp(a.qp) == 0, "destroy");
	a.qp = qp_with(&a, IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE);
	CHECK(a.qp, "an RC QP with IBV_QP_EX_WITH_ATOMIC_WRITE: %s", strerror(errno));
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a.qp);
	CHECK(x && x->wr_atomic_write, "its wr_atomic_write");
	connect_rc(&a, &b, 0, 4);
	connect_rc(&b, &a, IBV_ACCESS_REMOTE_WRITE, 4);

	/* ibv_wr_atomic_write: the bytes are read at the call. */
	uint64_t value = 0x0123456789abcdefULL;
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(x, b.mr->rkey, (uintptr_t)b.buf + 64, &value);
	value = 0;
	CHECK(ibv_wr_complete(x) == 0, "ibv_wr_complete");
	struct ibv_wc wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "the Atomic Write: %s", ibv_wc_status_str(wc.status));
	CHECK(wc.opcode == IBV_WC_ATOMIC_WRITE && wc.byte_len == 8, "opcode %d, byte_len %u", wc.opcode, wc.byte_len);
	CHECK(word_at(&b, 64) == 0x0123456789abcdefULL, "the word landed: %llx", (unsigned long long)word_at(&b, 64));
	CHECK(word_at(&b, 56) == 0 && word_at(&b, 72) == 0, "only the word");

	/* No value: the batch fails, nothing is posted. */
	ibv_wr_start(x);
	ibv_wr_atomic_write(x, b.mr->rkey, (uintptr_t)b.buf, NULL);
	CHECK(ibv_wr_complete(x) == EINVAL, "a NULL value");

	/* The classic ibv_post_send: the gather list's 8 bytes. */
	uint64_t *src = (uint64_t *)a.buf;
	*src = 0x1111222233334444ULL;
	struct ibv_sge s = { (uintptr_t)a.buf, 8, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_ATOMIC_WRITE,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = { (uintptr_t)b.buf + 128, b.mr->rkey } }, *bad = NULL;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "ibv_post_send IBV_WR_ATOMIC_WRITE");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.opcode == IBV_WC_ATOMIC_WRITE, "posted: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(word_at(&b, 128) == 0x1111222233334444ULL, "the posted word landed");
	s.length = 4;
	CHECK(ibv_post_send(a.qp, &w, &bad) == EINVAL && bad == &w, "4 bytes");
	s.length = 8;

	/* A misaligned word: Invalid Request, nothing stored, both QPs to Error. */
	memset(b.buf + 256, 0xaa, 16);
	w.wr_id = 3;
	w.wr.rdma.remote_addr = (uintptr_t)b.buf + 260;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "post misaligned");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_REM_INV_REQ_ERR && wc.wr_id == 3, "misaligned: %s", ibv_wc_status_str(wc.status));
	CHECK(word_at(&b, 256) == 0xaaaaaaaaaaaaaaaaULL && word_at(&b, 264) == 0xaaaaaaaaaaaaaaaaULL, "nothing landed");

	/* A region without Remote Write (Remote Atomic is not it): Remote Access Error. */
	struct end c, d;
	setup_end(&c, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(&d, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC, 4096);
	connect_rc(&c, &d, 0, 4);
	connect_rc(&d, &c, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC, 4);
	struct ibv_mr *cmr = ibv_reg_mr(c.pd, a.buf, 8, IBV_ACCESS_LOCAL_WRITE);
	CHECK(cmr, "ibv_reg_mr");
	s.lkey = cmr->lkey;
	w.wr_id = 4;
	w.wr.rdma.remote_addr = (uintptr_t)d.buf;
	w.wr.rdma.rkey = d.mr->rkey;
	CHECK(ibv_post_send(c.qp, &w, &bad) == 0, "post to a region without Remote Write");
	wc = wait_one(c.cq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 4, "no Remote Write: %s", ibv_wc_status_str(wc.status));
	CHECK(word_at(&d, 0) == 0, "nothing landed there");
	printf("atomic_write: ok\n");
	return 0;
}
