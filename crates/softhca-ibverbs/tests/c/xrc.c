/* XRC through libibverbs 44's calls, as perftest's -c XRC and rdma-core's tests make it:
   ibv_open_xrcd with libibverbs' and the kernel's errnos (an unknown comp_mask bit, a missing
   descriptor, a bad descriptor, a file with no domain and no O_CREAT, O_EXCL on a file that
   has one), a second open of the same file sharing the domain, ibv_close_xrcd EBUSY while an
   SRQ or target QP holds the handle; an XRC SRQ (ibv_create_srq_ex) and its number; a target
   QP (ibv_create_qp_ex with the domain, no PD, CQs or queues) and an initiator (ibv_create_qp
   with no receive CQ, its receive sizes 0); Modify QP with the attributes perftest passes to
   both, which uverbs takes out for the side that lacks them; Sends through ibv_post_send
   (qp_type.xrc.remote_srqn) and through ibv_wr_set_xrc_srqn, each completing on the CQ of the
   SRQ it names, one of them through the second handle's target QP; an RDMA Write with a key
   of the SRQ's PD; IBV_DEVICE_XRC. Prints "xrc: ok" and exits 0, or names the first failed
   check. */
#include <fcntl.h>
#define TEST_NAME "xrc"
#include "verbs_test.h"

/* A target QP of `x`, or an initiator on `pd` with `cq` for both (perftest's masks: each
   gets the other side's attributes too). */
static struct ibv_qp *xrc_qp(struct ibv_context *ctx, struct ibv_xrcd *x, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp *qp;
	if (x) {
		struct ibv_qp_init_attr_ex a = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD,
						 .xrcd = x, .cap = { .max_recv_wr = 16, .max_recv_sge = 1 } };
		qp = ibv_create_qp_ex(ctx, &a);
		CHECK(qp, "target QP: %s", strerror(errno));
		CHECK(!qp->pd && !qp->send_cq && !qp->recv_cq && !qp->srq, "a target QP has no PD, CQ or SRQ");
		CHECK(a.cap.max_send_wr == 0 && a.cap.max_recv_wr == 0, "nor queues");
	} else {
		struct ibv_qp_init_attr a = { .send_cq = cq, .qp_type = IBV_QPT_XRC_SEND,
					      .cap = { .max_send_wr = 16, .max_send_sge = 1, .max_recv_wr = 8 } };
		qp = ibv_create_qp(pd, &a);
		CHECK(qp, "initiator QP: %s", strerror(errno));
		CHECK(qp->recv_cq == NULL && a.cap.max_recv_wr == 0, "an initiator has no receive side");
	}
	return qp;
}

static void to_rts(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	      "to INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
	      "to RTR: %s", strerror(errno));
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				    IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "to RTS: %s", strerror(errno));
}

static struct ibv_srq *xrc_srq(struct ibv_context *ctx, struct ibv_xrcd *x, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_srq_init_attr_ex a = {
		.attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_XRC, .pd = pd, .xrcd = x, .cq = cq,
	};
	struct ibv_srq *s = ibv_create_srq_ex(ctx, &a);
	CHECK(s, "XRC SRQ: %s", strerror(errno));
	return s;
}

static void post_recv(struct ibv_srq *s, struct ibv_mr *mr, uint64_t id)
{
	struct ibv_sge g = { (uintptr_t)mr->addr, 256, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &g, .num_sge = 1 }, *bad;
	CHECK(ibv_post_srq_recv(s, &w, &bad) == 0, "ibv_post_srq_recv");
}

int main(void)
{
	hang_guard(30);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0 && (da.device_cap_flags & IBV_DEVICE_XRC), "IBV_DEVICE_XRC");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");

	char path[] = "/tmp/softhca-xrc-XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	unlink(path);
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, .fd = fd };
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EAGAIN, "no domain yet and no O_CREAT: EAGAIN (%d)", errno);
	xa.oflags = O_CREAT;
	struct ibv_xrcd *x1 = ibv_open_xrcd(ctx, &xa);
	CHECK(x1 && x1->context == ctx, "ibv_open_xrcd: %s", strerror(errno));
	struct ibv_xrcd *x2 = ibv_open_xrcd(ctx, &xa);
	CHECK(x2 && x2 != x1, "a second handle on the file's domain");
	xa.oflags = O_CREAT | O_EXCL;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "O_EXCL on a file with a domain: EINVAL");
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EINVAL, "no IBV_XRCD_INIT_ATTR_OFLAGS: EINVAL");
	xa.comp_mask = 1 << 2;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EOPNOTSUPP, "an unknown comp_mask bit: EOPNOTSUPP");
	struct ibv_xrcd_init_attr bad_fd = { .comp_mask = 3, .fd = 1000, .oflags = O_CREAT };
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &bad_fd) && errno == EBADF, "a bad descriptor: EBADF");
	struct ibv_xrcd_init_attr private = { .comp_mask = 3, .fd = -1, .oflags = O_CREAT };
	struct ibv_xrcd *x3 = ibv_open_xrcd(ctx, &private);
	CHECK(x3, "fd -1: a domain of its own");

	/* The target side: two SRQs of two PDs and CQs, one made through each handle; a target
	   QP through each handle too. */
	struct ibv_pd *tpd[2] = { ibv_alloc_pd(ctx), ibv_alloc_pd(ctx) };
	struct ibv_cq *tcq[2] = { ibv_create_cq(ctx, 16, NULL, NULL, 0), ibv_create_cq(ctx, 16, NULL, NULL, 0) };
	struct ibv_srq *srq[2] = { xrc_srq(ctx, x1, tpd[0], tcq[0]), xrc_srq(ctx, x2, tpd[1], tcq[1]) };
	uint32_t srqn[2];
	CHECK(ibv_get_srq_num(srq[0], &srqn[0]) == 0 && ibv_get_srq_num(srq[1], &srqn[1]) == 0 && srqn[0] != srqn[1],
	      "ibv_get_srq_num");
	char *land[2] = { calloc(1, 4096), calloc(1, 4096) };
	struct ibv_mr *lmr[2];
	for (int i = 0; i < 2; i++) {
		lmr[i] = ibv_reg_mr(tpd[i], land[i], 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		CHECK(lmr[i], "ibv_reg_mr");
		post_recv(srq[i], lmr[i], 10 + i);
	}
	struct ibv_qp *tgt[2] = { xrc_qp(ctx, x1, NULL, NULL), xrc_qp(ctx, x2, NULL, NULL) };
	struct ibv_qp_init_attr_ex no_domain = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_PD,
						 .pd = tpd[0] };
	errno = 0;
	CHECK(!ibv_create_qp_ex(ctx, &no_domain) && errno == EINVAL, "a target QP without its domain: EINVAL");

	/* The initiator side: two QPs on one PD and CQ, each toward one target QP. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	char *src = calloc(1, 4096);
	strcpy(src, "through XRC");
	struct ibv_mr *smr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cq && smr, "initiator resources");
	struct ibv_qp *ini[2];
	for (int i = 0; i < 2; i++) {
		ini[i] = xrc_qp(ctx, NULL, pd, cq);
		to_rts(tgt[i], ini[i]->qp_num, gid);
		to_rts(ini[i], tgt[i]->qp_num, gid);
	}
	struct ibv_recv_wr rw = { .wr_id = 1 }, *rbad;
	CHECK(ibv_post_recv(ini[0], &rw, &rbad) != 0, "an initiator takes no receive");

	/* A Send through ibv_post_send to SRQ 1 (its target QP is x1's, the SRQ x2's: one domain). */
	struct ibv_sge g = { (uintptr_t)src, 12, smr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &g, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.qp_type.xrc.remote_srqn = srqn[1];
	CHECK(ibv_post_send(ini[0], &w, &bad) == 0, "ibv_post_send");
	struct ibv_wc wc = wait_one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1, "send: %s", ibv_wc_status_str(wc.status));
	wc = wait_one(tcq[1]);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 && wc.byte_len == 12 && wc.qp_num == tgt[0]->qp_num,
	      "receive on SRQ 1's CQ through target QP 0 (%s, %u)", ibv_wc_status_str(wc.status), wc.qp_num);
	CHECK(strcmp(land[1], "through XRC") == 0, "the data");

	/* A Send through the ibv_wr API to SRQ 0, then an RDMA Write with a key of SRQ 1's PD. */
	struct ibv_qp_init_attr_ex ex = { .qp_type = IBV_QPT_XRC_SEND, .send_cq = cq,
					  .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
					  .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
					  .cap = { .max_send_wr = 16, .max_send_sge = 1 } };
	struct ibv_qp *exqp = ibv_create_qp_ex(ctx, &ex);
	CHECK(exqp, "initiator through ibv_create_qp_ex: %s", strerror(errno));
	CHECK(ibv_destroy_qp(exqp) == 0, "destroy it");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini[1]);
	CHECK(qx == NULL, "an initiator made without send operations has no ibv_qp_ex");

	w.wr_id = 2;
	w.qp_type.xrc.remote_srqn = srqn[0];
	CHECK(ibv_post_send(ini[1], &w, &bad) == 0, "ibv_post_send");
	CHECK(wait_one(cq).status == IBV_WC_SUCCESS, "send 2");
	wc = wait_one(tcq[0]);
	CHECK(wc.wr_id == 10 && wc.qp_num == tgt[1]->qp_num, "receive on SRQ 0's CQ through target QP 1");

	w.wr_id = 3;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.wr.rdma.remote_addr = (uintptr_t)land[1] + 1000;
	w.wr.rdma.rkey = lmr[1]->rkey;
	w.qp_type.xrc.remote_srqn = srqn[1];
	CHECK(ibv_post_send(ini[1], &w, &bad) == 0, "ibv_post_send");
	CHECK(wait_one(cq).status == IBV_WC_SUCCESS, "write with a key of the named SRQ's PD");
	CHECK(strcmp(land[1] + 1000, "through XRC") == 0, "the written data");

	/* Closing: EBUSY while an SRQ or target QP holds the handle. */
	CHECK(ibv_close_xrcd(x1) == EBUSY, "x1 holds SRQ 0 and target QP 0");
	CHECK(ibv_close_xrcd(x3) == 0, "a domain with nothing in it closes");
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_destroy_qp(ini[i]) == 0 && ibv_destroy_qp(tgt[i]) == 0, "destroy QPs");
	}
	CHECK(ibv_close_xrcd(x1) == EBUSY, "x1 still holds SRQ 0");
	CHECK(ibv_destroy_srq(srq[0]) == 0 && ibv_destroy_srq(srq[1]) == 0, "destroy SRQs");
	CHECK(ibv_close_xrcd(x1) == 0 && ibv_close_xrcd(x2) == 0, "close both handles");
	xa.comp_mask = 3;
	xa.oflags = 0;
	errno = 0;
	CHECK(!ibv_open_xrcd(ctx, &xa) && errno == EAGAIN, "the file's domain went with its last handle");
	close(fd);
	printf("xrc: ok\n");
	return 0;
}
