/* The extended verbs as modern programs use them (UCX, libfabric, perftest's new post-send
   path, the rdma-core tests): ibv_query_device_ex, ibv_query_port's extended fields,
   ibv_create_srq_ex, ibv_create_cq_ex with every field softhca fills and the ibv_start_poll / ibv_next_poll /
   ibv_end_poll / ibv_wc_read_* interface, ibv_create_qp_ex with send operations and the
   ibv_wr_* builder for every opcode softhca posts (RC: send, send with immediate, RDMA write,
   write with immediate, read, both atomics, bind MW; UD: send with ibv_wr_set_ud_addr),
   inline data and SGE lists, ibv_wr_abort, and the errors: unknown comp_mask bits, fields and
   operations softhca does not have, a batch with a bad request (nothing of it is posted).
   Prints "extended: ok". */
#include <arpa/inet.h>
#include <fcntl.h>
#define TEST_NAME "extended"
#include "verbs_test.h"

enum { N = 65536 };

struct xend {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static const uint64_t WC_FLAGS = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
				 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

static void open_xend(struct ibv_device *dev, struct xend *e, enum ibv_qp_type type, uint64_t ops)
{
	e->ctx = ibv_open_device(dev);
	CHECK(e->ctx, "ibv_open_device");
	CHECK(ibv_query_gid(e->ctx, 1, 0, &e->gid) == 0, "ibv_query_gid");
	e->pd = ibv_alloc_pd(e->ctx);
	struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = WC_FLAGS };
	e->cq = ibv_create_cq_ex(e->ctx, &ca);
	CHECK(e->cq, "ibv_create_cq_ex: %d", errno);
	e->buf = calloc(1, N);
	e->mr = ibv_reg_mr(e->pd, e->buf, N,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
	CHECK(e->mr, "ibv_reg_mr");
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = ibv_cq_ex_to_cq(e->cq), .recv_cq = ibv_cq_ex_to_cq(e->cq), .qp_type = type,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 4, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = e->pd,
		.send_ops_flags = ops,
	};
	e->qp = ibv_create_qp_ex(e->ctx, &qa);
	CHECK(e->qp, "ibv_create_qp_ex: %d", errno);
	e->qpx = ibv_qp_to_qp_ex(e->qp);
	CHECK(e->qpx && &e->qpx->qp_base == e->qp, "ibv_qp_to_qp_ex");
}

struct got {
	int status, opcode;
	uint64_t wr_id;
	uint32_t byte_len, qp_num, src_qp, slid;
	unsigned flags;
	__be32 imm;
	uint8_t sl, path_bits;
	uint64_t ts, wall;
};

/* Reads one completion through the extended interface (10 s at most). */
static struct got poll_one(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr attr = { 0 };
	time_t end = time(NULL) + 10;
	int r;
	errno = 0;
	while ((r = ibv_start_poll(cq, &attr)) == ENOENT) {
		CHECK(errno == ENOENT, "errno %d for an empty CQ (rxe sets ENOENT)", errno);
		CHECK(time(NULL) < end, "no completion");
		errno = 0;
	}
	CHECK(r == 0, "ibv_start_poll %d", r);
	struct got g = {
		.status = cq->status, .wr_id = cq->wr_id, .opcode = ibv_wc_read_opcode(cq),
		.byte_len = ibv_wc_read_byte_len(cq), .qp_num = ibv_wc_read_qp_num(cq),
		.src_qp = ibv_wc_read_src_qp(cq), .slid = ibv_wc_read_slid(cq), .flags = ibv_wc_read_wc_flags(cq),
		.imm = ibv_wc_read_imm_data(cq), .sl = ibv_wc_read_sl(cq), .path_bits = ibv_wc_read_dlid_path_bits(cq),
		.ts = ibv_wc_read_completion_ts(cq), .wall = ibv_wc_read_completion_wallclock_ns(cq),
	};
	CHECK(ibv_wc_read_vendor_err(cq) == 0 || g.status != IBV_WC_SUCCESS, "vendor_err on success");
	ibv_end_poll(cq);
	return g;
}

static void recv_one(struct xend *e, uint64_t id, uint32_t off, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)e->buf + off, len, e->mr->lkey };
	struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(e->qp, &r, &bad) == 0, "ibv_post_recv");
}

static void connect_x(struct xend *e, struct xend *peer)
{
	struct end a = { .ctx = e->ctx, .pd = e->pd, .qp = e->qp, .gid = e->gid };
	struct end b = { .ctx = peer->ctx, .qp = peer->qp, .gid = peer->gid };
	connect_rc(&a, &b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, 4);
}

static void queries(struct ibv_context *ctx)
{
	struct ibv_device_attr_ex ax;
	memset(&ax, 0xff, sizeof ax);
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0, "ibv_query_device_ex");
	struct ibv_device_attr a;
	CHECK(ibv_query_device(ctx, &a) == 0, "ibv_query_device");
	CHECK(ax.orig_attr.max_qp == a.max_qp && ax.orig_attr.vendor_part_id == a.vendor_part_id, "orig_attr");
	CHECK(ax.phys_port_cnt_ex == 1, "phys_port_cnt_ex %u", ax.phys_port_cnt_ex);
	/* The kernel's 64-bit flags: the 32 of device_cap_flags (it was 0), among them what rxe
	   also reports for the same verbs (Local Invalidate, Send with Invalidate, type 2B
	   windows; an AH's port checked), and above them Atomic Write (the kernel's
	   IB_UVERBS_DEVICE_ATOMIC_WRITE, bit 40, which libibverbs passes through unnamed). */
	CHECK(ax.device_cap_flags_ex == (ax.orig_attr.device_cap_flags | (1ULL << 40)), "device_cap_flags_ex %#llx",
	      (unsigned long long)ax.device_cap_flags_ex);
	CHECK((ax.orig_attr.device_cap_flags & (IBV_DEVICE_MEM_MGT_EXTENSIONS | IBV_DEVICE_UD_AV_PORT_ENFORCE |
						IBV_DEVICE_MEM_WINDOW_TYPE_2B)) ==
		      (IBV_DEVICE_MEM_MGT_EXTENSIONS | IBV_DEVICE_UD_AV_PORT_ENFORCE | IBV_DEVICE_MEM_WINDOW_TYPE_2B),
	      "device_cap_flags %#x", ax.orig_attr.device_cap_flags);
	CHECK(ax.hca_core_clock > 0 && ax.completion_timestamp_mask != 0, "timestamps advertised");
	/* The clock the timestamps count, now (as mlx5 reads it: tv_sec 0, the count in tv_nsec). */
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(ctx, &v) == 0 && v.comp_mask == IBV_VALUES_MASK_RAW_CLOCK &&
		      v.raw_clock.tv_sec == 0 && v.raw_clock.tv_nsec > 0,
	      "ibv_query_rt_values_ex");
	struct ibv_values_ex odd = { .comp_mask = 2 };
	CHECK(ibv_query_rt_values_ex(ctx, &odd) == EINVAL, "an unknown values mask");
	CHECK(ax.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) && ax.tso_caps.max_tso == 0 &&
		      ax.max_dm_size == 256 * 1024,
	      "ODP, no TSO, 256 KiB of device memory");
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &ax) == EINVAL, "unknown input comp_mask");

	struct ibv_port_attr p;
	memset(&p, 0xff, sizeof p);
	CHECK(ibv_query_port(ctx, 1, &p) == 0, "ibv_query_port");
	CHECK(p.state == IBV_PORT_ACTIVE && p.flags == IBV_QPF_GRH_REQUIRED && p.port_cap_flags2 == 0,
	      "extended port fields: flags %#x (rxe: GRH_REQUIRED)", p.flags);
	CHECK(ibv_query_port(ctx, 2, &p) != 0, "port 2");
}

static void refusals(struct xend *e)
{
	struct ibv_cq_init_attr_ex ca = { .cqe = 4, .wc_flags = IBV_WC_EX_WITH_FLOW_TAG };
	errno = 0;
	CHECK(!ibv_create_cq_ex(e->ctx, &ca) && errno == EOPNOTSUPP, "flow tags");
	ca.wc_flags = 0;
	ca.comp_mask = 1 << 7;
	errno = 0;
	CHECK(!ibv_create_cq_ex(e->ctx, &ca) && errno == EINVAL, "unknown CQ comp_mask");
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	struct ibv_cq_ex *st = ibv_create_cq_ex(e->ctx, &ca);
	CHECK(st && ibv_destroy_cq(ibv_cq_ex_to_cq(st)) == 0, "single-threaded CQ");

	struct ibv_qp_init_attr_ex qa = {
		.send_cq = ibv_cq_ex_to_cq(e->cq), .recv_cq = ibv_cq_ex_to_cq(e->cq), .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = e->pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
	};
	errno = 0;
	CHECK(!ibv_create_qp_ex(e->ctx, &qa) && errno == EOPNOTSUPP, "RDMA Write on UD");
	qa.qp_type = IBV_QPT_UC;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND_WITH_INV;
	errno = 0;
	CHECK(!ibv_create_qp_ex(e->ctx, &qa) && errno == EOPNOTSUPP, "Send with Invalidate on UC");
	qa.qp_type = IBV_QPT_RC;
	qa.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	errno = 0;
	CHECK(!ibv_create_qp_ex(e->ctx, &qa) && errno == EINVAL, "no PD");
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	qa.send_ops_flags = 0;
	qa.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	CHECK(!ibv_create_qp_ex(e->ctx, &qa) && errno == EOPNOTSUPP, "creation flags");
	qa.create_flags = 0; /* the mask with no flag set is taken */
	struct ibv_qp *noflags = ibv_create_qp_ex(e->ctx, &qa);
	CHECK(noflags && ibv_destroy_qp(noflags) == 0, "creation flags mask with no flag");
	/* ibv_create_srq_ex: a basic SRQ (verbs.h takes the plain Create SRQ for it), and with a
	   CQ named too (the provider's op, which ignores a basic SRQ's CQ, as the kernel does);
	   an XRC SRQ without its XRC domain is EINVAL (as rxe answers in the guest,
	   scripts/interop/probes/extended.c) and with one made (rxe: EOPNOTSUPP, it has no XRC),
	   tag matching EOPNOTSUPP, as there. */
	struct ibv_srq_init_attr_ex sa = { .attr = { .max_wr = 8, .max_sge = 1 },
					   .comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE,
					   .srq_type = IBV_SRQT_BASIC, .pd = e->pd };
	struct ibv_srq *srq = ibv_create_srq_ex(e->ctx, &sa);
	CHECK(srq && sa.attr.max_wr >= 8 && ibv_destroy_srq(srq) == 0, "basic SRQ through ibv_create_srq_ex");
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	sa.cq = ibv_cq_ex_to_cq(e->cq);
	sa.attr.max_wr = 9;
	srq = ibv_create_srq_ex(e->ctx, &sa);
	CHECK(srq && sa.attr.max_wr >= 9 && ibv_destroy_srq(srq) == 0, "basic SRQ with a CQ named");
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ;
	errno = 0;
	CHECK(!ibv_create_srq_ex(e->ctx, &sa) && errno == EINVAL, "SRQ without a PD");
	sa.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ;
	sa.srq_type = IBV_SRQT_XRC;
	errno = 0;
	CHECK(!ibv_create_srq_ex(e->ctx, &sa) && errno == EINVAL, "XRC SRQ without an XRC domain");
	sa.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD;
	struct ibv_xrcd_init_attr xrcd_attr = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
						.fd = -1, .oflags = O_CREAT };
	sa.xrcd = ibv_open_xrcd(e->ctx, &xrcd_attr);
	CHECK(sa.xrcd, "ibv_open_xrcd");
	srq = ibv_create_srq_ex(e->ctx, &sa);
	uint32_t srqn = 0;
	CHECK(srq && ibv_get_srq_num(srq, &srqn) == 0 && srqn != 0, "XRC SRQ and its number");
	CHECK(ibv_destroy_srq(srq) == 0 && ibv_close_xrcd(sa.xrcd) == 0, "XRC SRQ, then its domain, destroyed");
	sa.srq_type = IBV_SRQT_TM;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
	sa.tm_cap.max_num_tags = 4;
	errno = 0;
	CHECK(!ibv_create_srq_ex(e->ctx, &sa) && errno == EOPNOTSUPP, "tag-matching SRQ");
	/* A CQ of another context (of the same device) is not one of this context's: EINVAL. */
	struct ibv_context *other = ibv_open_device(e->ctx->device);
	CHECK(other, "a second context");
	struct ibv_cq *foreign = ibv_create_cq(other, 4, NULL, NULL, 0);
	CHECK(foreign, "a CQ of the second context");
	struct ibv_qp_init_attr_ex xa = qa;
	xa.comp_mask = IBV_QP_INIT_ATTR_PD;
	xa.create_flags = 0;
	xa.send_cq = foreign;
	errno = 0;
	CHECK(!ibv_create_qp_ex(e->ctx, &xa) && errno == EINVAL, "a QP with another context's CQ");
	CHECK(ibv_destroy_cq(foreign) == 0 && ibv_close_device(other) == 0, "second context closed");
	/* Only IBV_QP_INIT_ATTR_PD: verbs.h takes the plain Create QP, and there is no qp_ex. */
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	struct ibv_qp *plain = ibv_create_qp_ex(e->ctx, &qa);
	CHECK(plain && ibv_qp_to_qp_ex(plain) == NULL, "a plain QP has no ibv_qp_ex");
	CHECK(ibv_destroy_qp(plain) == 0, "destroy plain QP");
}

int main(void)
{
	hang_guard(60);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "no device");
	uint64_t rc_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
			  IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
			  IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
			  IBV_QP_EX_WITH_BIND_MW;
	struct xend a, b;
	open_xend(list[0], &a, IBV_QPT_RC, rc_ops);
	open_xend(list[0], &b, IBV_QPT_RC, rc_ops);
	queries(a.ctx);
	refusals(&a);
	connect_x(&a, &b);
	connect_x(&b, &a);

	/* Send with Immediate from an SGE list of two pieces. */
	memcpy(a.buf, "hello, ", 7);
	memcpy(a.buf + 100, "extended", 8);
	recv_one(&b, 7, 0, 64);
	struct ibv_sge two[2] = { { (uintptr_t)a.buf, 7, a.mr->lkey }, { (uintptr_t)a.buf + 100, 8, a.mr->lkey } };
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 1;
	a.qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED;
	ibv_wr_send_imm(a.qpx, htonl(0xabcdef01));
	ibv_wr_set_sge_list(a.qpx, 2, two);
	CHECK(ibv_wr_complete(a.qpx) == 0, "ibv_wr_complete (send imm)");
	struct got g = poll_one(a.cq);
	CHECK(g.status == IBV_WC_SUCCESS && g.wr_id == 1 && g.opcode == IBV_WC_SEND, "send imm completion");
	g = poll_one(b.cq);
	CHECK(g.status == IBV_WC_SUCCESS && g.wr_id == 7 && g.opcode == IBV_WC_RECV && g.byte_len == 15, "recv %d %u",
	      g.status, g.byte_len);
	CHECK((g.flags & IBV_WC_WITH_IMM) && ntohl(g.imm) == 0xabcdef01, "immediate %x", ntohl(g.imm));
	CHECK(g.qp_num == b.qp->qp_num, "qp_num %u", g.qp_num); /* src_qp is UD's */
	CHECK(g.ts > 0 && g.wall > 1600000000ull * 1000000000ull, "timestamps %lu %lu", (unsigned long)g.ts,
	      (unsigned long)g.wall);
	CHECK(!memcmp(b.buf, "hello, extended", 15), "received bytes");

	/* Inline Send (the buffer is reused at once), then a batch of three: RDMA Write, Write with
	   Immediate, Read; only the last signaled. */
	recv_one(&b, 8, 0, 64);
	recv_one(&b, 9, 0, 64);
	char tmp[16] = "inline-data";
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 2;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(a.qpx);
	ibv_wr_set_inline_data(a.qpx, tmp, 11);
	CHECK(ibv_wr_complete(a.qpx) == 0, "inline send");
	memset(tmp, 0, sizeof tmp);
	CHECK(poll_one(a.cq).wr_id == 2, "inline send completion");
	g = poll_one(b.cq);
	CHECK(g.wr_id == 8 && g.byte_len == 11 && !memcmp(b.buf, "inline-data", 11), "inline received");

	for (int i = 0; i < 4096; i++)
		a.buf[1024 + i] = (char)i;
	memset(b.buf + 8192, 7, 4096);
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 3;
	a.qpx->wr_flags = 0;
	ibv_wr_rdma_write(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 4096);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 1024, 4096);
	a.qpx->wr_id = 4;
	ibv_wr_rdma_write_imm(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 4096 + 4096, htonl(42));
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 1024, 16);
	a.qpx->wr_id = 5;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(a.qpx, b.mr->rkey, (uintptr_t)b.buf + 8192 + 16);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 20000, 64);
	CHECK(ibv_wr_complete(a.qpx) == 0, "write/write imm/read batch");
	g = poll_one(a.cq);
	CHECK(g.status == IBV_WC_SUCCESS && g.wr_id == 5 && g.opcode == IBV_WC_RDMA_READ && g.byte_len == 64,
	      "read completion %d %d", g.status, g.opcode);
	CHECK(!memcmp(b.buf + 4096, a.buf + 1024, 4096), "written bytes");
	CHECK(a.buf[20000] == 7 && a.buf[20063] == 7, "read bytes");
	g = poll_one(b.cq);
	CHECK(g.wr_id == 9 && g.opcode == IBV_WC_RECV_RDMA_WITH_IMM && ntohl(g.imm) == 42 && g.byte_len == 16,
	      "write with immediate at the responder");

	/* Both atomics. */
	uint64_t *target = (uint64_t *)(b.buf + 32768);
	*target = 100;
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 6;
	a.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(a.qpx, b.mr->rkey, (uintptr_t)target, 5);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 30000, 8);
	a.qpx->wr_id = 7;
	ibv_wr_atomic_cmp_swp(a.qpx, b.mr->rkey, (uintptr_t)target, 105, 777);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf + 30008, 8);
	CHECK(ibv_wr_complete(a.qpx) == 0, "atomics");
	/* Both completions in one polling session where they are both there: ibv_next_poll. */
	uint64_t ids[2];
	int seen = 0;
	time_t end = time(NULL) + 10;
	while (seen < 2) {
		CHECK(time(NULL) < end, "atomic completions");
		struct ibv_poll_cq_attr pa = { 0 };
		if (ibv_start_poll(a.cq, &pa) != 0)
			continue;
		do {
			CHECK(a.cq->status == IBV_WC_SUCCESS, "atomic status %d", a.cq->status);
			CHECK(ibv_wc_read_opcode(a.cq) == (seen ? IBV_WC_COMP_SWAP : IBV_WC_FETCH_ADD), "atomic opcode");
			ids[seen++] = a.cq->wr_id;
		} while (seen < 2 && ibv_next_poll(a.cq) == 0);
		ibv_end_poll(a.cq);
	}
	CHECK(ids[0] == 6 && ids[1] == 7, "atomic wr_ids in order");
	CHECK(*(uint64_t *)(a.buf + 30000) == 100 && *(uint64_t *)(a.buf + 30008) == 105 && *target == 777,
	      "atomic results");

	/* Bind a type 1 window with ibv_wr_bind_mw, then write through its R_Key. */
	struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
	CHECK(mw, "ibv_alloc_mw");
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	struct ibv_mw_bind_info bi = { .mr = b.mr, .addr = (uintptr_t)b.buf + 40000, .length = 4096,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(b.qpx);
	b.qpx->wr_id = 70;
	b.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(b.qpx, mw, rkey, &bi);
	CHECK(ibv_wr_complete(b.qpx) == 0, "bind");
	g = poll_one(b.cq);
	/* The program keeps the key it chose: mw->rkey is not written (as rxe's and mlx5's
	   providers leave it). */
	CHECK(g.status == IBV_WC_SUCCESS && g.opcode == IBV_WC_BIND_MW && mw->rkey != rkey, "bind completion");
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 8;
	ibv_wr_rdma_write(a.qpx, rkey, (uintptr_t)b.buf + 40000);
	ibv_wr_set_inline_data(a.qpx, "via window", 10);
	CHECK(ibv_wr_complete(a.qpx) == 0, "write through the window");
	CHECK(poll_one(a.cq).status == IBV_WC_SUCCESS && !memcmp(b.buf + 40000, "via window", 10), "window write");

	/* Aborted and failed batches post nothing. */
	ibv_wr_start(a.qpx);
	ibv_wr_send(a.qpx);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_abort(a.qpx);
	ibv_wr_start(a.qpx);
	a.qpx->wr_id = 10;
	ibv_wr_send(a.qpx);
	ibv_wr_set_sge(a.qpx, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_send(a.qpx);
	char big[600] = { 0 };
	ibv_wr_set_inline_data(a.qpx, big, sizeof big);
	CHECK(ibv_wr_complete(a.qpx) == ENOMEM, "inline data beyond the QP's");
	ibv_wr_start(a.qpx);
	ibv_wr_send(a.qpx);
	ibv_wr_set_inline_data(a.qpx, big, 100); /* past this QP's 64, within the device's 512 */
	CHECK(ibv_wr_complete(a.qpx) == ENOMEM, "inline data beyond max_inline_data (mlx5's answer)");
	struct ibv_sge five[5] = { 0 };
	ibv_wr_start(a.qpx);
	ibv_wr_send(a.qpx);
	ibv_wr_set_sge_list(a.qpx, 40, five);
	CHECK(ibv_wr_complete(a.qpx) == ENOMEM, "40 SGEs (mlx5's answer)");
	struct ibv_poll_cq_attr pa = { 0 };
	errno = 0;
	CHECK(ibv_start_poll(a.cq, &pa) == ENOENT && errno == ENOENT && ibv_start_poll(b.cq, &pa) == ENOENT,
	      "nothing was posted (errno %d)", errno);

	/* UD through the builder. */
	struct xend u, v;
	open_xend(list[0], &u, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
	open_xend(list[0], &v, IBV_QPT_UD, IBV_QP_EX_WITH_SEND);
	struct xend *ud[2] = { &u, &v };
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x1111 };
		CHECK(ibv_modify_qp(ud[i]->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0,
		      "UD init");
		at.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(ud[i]->qp, &at, IBV_QP_STATE) == 0, "UD RTR");
		at.qp_state = IBV_QPS_RTS;
		CHECK(ibv_modify_qp(ud[i]->qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD RTS");
	}
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = v.gid, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(u.pd, &aa);
	CHECK(ah, "ibv_create_ah");
	recv_one(&v, 20, 0, 40 + 64);
	memcpy(u.buf, "datagram", 8);
	ibv_wr_start(u.qpx);
	u.qpx->wr_id = 21;
	u.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(u.qpx, htonl(9));
	ibv_wr_set_ud_addr(u.qpx, ah, v.qp->qp_num, 0x1111);
	ibv_wr_set_sge(u.qpx, u.mr->lkey, (uintptr_t)u.buf, 8);
	CHECK(ibv_wr_complete(u.qpx) == 0, "UD send");
	CHECK(poll_one(u.cq).wr_id == 21, "UD send completion");
	g = poll_one(v.cq);
	CHECK(g.status == IBV_WC_SUCCESS && g.byte_len == 48 && g.src_qp == u.qp->qp_num && (g.flags & IBV_WC_GRH) &&
		      ntohl(g.imm) == 9,
	      "UD receive %u %u", g.byte_len, g.src_qp);
	CHECK(!memcmp(v.buf + 40, "datagram", 8), "UD bytes");

	printf("extended: ok\n");
	return 0;
}
