/* The public helpers of libibverbs 44 beyond the verbs themselves, as a program calls them:
   rate conversions, the kernel-ABI copies librdmacm uses, P_Key and GID table look-ups, the
   Ethernet neighbour of a RoCE destination, ECE, fork support, the sysfs identity, and what
   softhca cannot do (import, dma-buf), which must fail the documented way. */
#define TEST_NAME "helpers"
#include "verbs_test.h"
#include <infiniband/sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/ib_user_sa.h>

/* infiniband/marshall.h is not installed by libibverbs-dev; its prototypes: */
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);
/* Exported by libibverbs but declared only in its private headers: */
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
const char *ibv_get_sysfs_path(void);
/* Private (IBVERBS_PRIVATE_34), which ibv_devinfo calls: the sysfs GID type. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type);

static void rates(void)
{
	CHECK(ibv_rate_to_mult(IBV_RATE_10_GBPS) == 4, "10 Gb/s is 4 x 2.5");
	CHECK(mult_to_ibv_rate(4) == IBV_RATE_10_GBPS, "4 x 2.5 is 10 Gb/s");
	CHECK(ibv_rate_to_mult(IBV_RATE_56_GBPS) == -1, "FDR has no multiple");
	CHECK(mult_to_ibv_rate(3) == IBV_RATE_MAX, "no rate is 7.5 Gb/s");
	CHECK(ibv_rate_to_mbps(IBV_RATE_25_GBPS) == 25781, "EDR lane in Mb/s");
	CHECK(mbps_to_ibv_rate(25781) == IBV_RATE_25_GBPS, "25781 Mb/s");
	CHECK(ibv_rate_to_mbps(IBV_RATE_MAX) == -1, "IBV_RATE_MAX has no speed");
}

static void kernel_copies(void)
{
	struct ib_uverbs_ah_attr k = {
		.grh = { .flow_label = 0x12345, .sgid_index = 3, .hop_limit = 64, .traffic_class = 7 },
		.dlid = 0x1234, .sl = 5, .src_path_bits = 1, .static_rate = 3, .is_global = 1, .port_num = 1,
	};
	memset(k.grh.dgid, 0xab, 16);
	struct ibv_ah_attr a;
	memset(&a, 0xff, sizeof a);
	ibv_copy_ah_attr_from_kern(&a, &k);
	CHECK(a.grh.flow_label == 0x12345 && a.grh.sgid_index == 3 && a.grh.hop_limit == 64 &&
		      a.grh.traffic_class == 7 && a.grh.dgid.raw[15] == 0xab && a.dlid == 0x1234 && a.sl == 5 &&
		      a.src_path_bits == 1 && a.static_rate == 3 && a.is_global == 1 && a.port_num == 1,
	      "ibv_copy_ah_attr_from_kern");

	struct ib_uverbs_qp_attr kq;
	memset(&kq, 0, sizeof kq);
	kq.qp_state = IBV_QPS_RTS;
	kq.cur_qp_state = IBV_QPS_RTR;
	kq.path_mtu = IBV_MTU_1024;
	kq.dest_qp_num = 0xabcdef;
	kq.max_send_wr = 33;
	kq.pkey_index = 2;
	kq.ah_attr.dlid = 9;
	kq.alt_ah_attr.sl = 4;
	kq.max_dest_rd_atomic = 16;
	kq.timeout = 14;
	struct ibv_qp_attr q;
	memset(&q, 0xff, sizeof q);
	ibv_copy_qp_attr_from_kern(&q, &kq);
	CHECK(q.qp_state == (enum ibv_qp_state)0xffffffff && q.cur_qp_state == IBV_QPS_RTR && q.path_mtu == IBV_MTU_1024 && q.dest_qp_num == 0xabcdef &&
		      q.cap.max_send_wr == 33 && q.pkey_index == 2 && q.ah_attr.dlid == 9 && q.alt_ah_attr.sl == 4 &&
		      q.max_dest_rd_atomic == 16 && q.timeout == 14,
	      "ibv_copy_qp_attr_from_kern (which leaves qp_state alone, as rdma-core)");

	struct ibv_sa_path_rec p;
	memset(&p, 0, sizeof p);
	p.dlid = htobe16(7);
	p.mtu = IBV_MTU_4096;
	p.pkey = htobe16(0xffff);
	p.numb_path = 1;
	p.reversible = 1;
	p.flow_label = htobe32(0x54321);
	struct ib_user_path_rec u;
	memset(&u, 0xee, sizeof u);
	ibv_copy_path_rec_to_kern(&u, &p);
	struct ibv_sa_path_rec back;
	memset(&back, 0xee, sizeof back);
	ibv_copy_path_rec_from_kern(&back, &u);
	CHECK(back.dlid == p.dlid && back.mtu == IBV_MTU_4096 && back.pkey == p.pkey && back.numb_path == 1 &&
		      back.reversible == 1 && back.flow_label == p.flow_label,
	      "path record round trip");
}

static void tables(struct ibv_context *ctx)
{
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0xffff)) == 0, "the default P_Key is index 0");
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0x8001)) < 0, "an absent P_Key has no index");

	struct ibv_gid_entry e;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &e, 0) == 0, "ibv_query_gid_ex");
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");
	CHECK(!memcmp(&e.gid, &gid, 16) && e.gid_index == 0 && e.port_num == 1 && e.gid_type == IBV_GID_TYPE_ROCE_V2,
	      "the GID entry is GID 0, RoCE v2");
	CHECK(e.ndev_ifindex != 0, "the GID's interface has an index");
	/* The kernel's answers, also left in errno (rxe in the guest: probes/extended.c). */
	errno = 0;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &e, 1) == EINVAL && errno == EINVAL, "unknown flags");
	errno = 0;
	CHECK(ibv_query_gid_ex(ctx, 1, 1024, &e, 0) == EINVAL && errno == EINVAL, "an index past the table");
	errno = 0;
	CHECK(ibv_query_gid_ex(ctx, 1, 1000, &e, 0) == ENODATA, "an empty slot near its end");
	errno = 0;
	CHECK(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == ENODATA && errno == ENODATA, "an empty slot");

	struct ibv_gid_entry table[4];
	CHECK(ibv_query_gid_table(ctx, table, 4, 0) == 1, "one GID in the table");
	CHECK(!memcmp(&table[0].gid, &gid, 16), "the table holds GID 0");
	errno = 0;
	CHECK(ibv_query_gid_table(ctx, table, 0, 0) == -EINVAL && errno == EINVAL, "a table too small");

	/* The table has empty slots past GID 0, as a RoCE port's does: libibverbs' answers. */
	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 1, &port) == 0 && port.gid_tbl_len > 1, "gid_tbl_len %d", port.gid_tbl_len);
	CHECK(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == ENODATA, "an empty GID entry is ENODATA");
	union ibv_gid empty;
	memset(&empty, 0xff, sizeof empty);
	CHECK(ibv_query_gid(ctx, 1, 1, &empty) == 0, "ibv_query_gid of an empty slot");
	CHECK(!memcmp(&empty, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16), "the zero GID");
	int gt;
	/* libibverbs 44 answers an empty entry's ENODATA with 0 and IB/RoCE v1, and only an index
	   past the table with -1. */
	gt = -1;
	CHECK(ibv_query_gid_type(ctx, 1, 1, &gt) == 0 && gt == 0, "an empty slot: 0, IB/RoCE v1");
	CHECK(ibv_query_gid_type(ctx, 1, port.gid_tbl_len, &gt) == -1, "past the table: -1");
	CHECK(ibv_query_gid_type(ctx, 1, 0, &gt) == 0 && gt == 1, "GID 0 is RoCE v2");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_ah_attr from_empty = { .is_global = 1, .port_num = 1, .grh = { .sgid_index = 1, .dgid = gid } };
	errno = 0;
	CHECK(!ibv_create_ah(pd, &from_empty) && errno == ENODATA, "an AH from an empty source GID: errno %d", errno);
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc pd");

	struct ibv_ah_attr ah = { .is_global = 1, .port_num = 1, .grh = { .sgid_index = 0, .dgid = gid } };
	uint8_t mac[6] = { 1, 1, 1, 1, 1, 1 };
	uint16_t vid = 0;
	CHECK(ibv_resolve_eth_l2_from_gid(ctx, &ah, mac, &vid) == 0, "resolving our own GID");
	CHECK(!memcmp(mac, "\0\0\0\0\0\0", 6) && vid == 0xffff, "loopback: zero MAC, no VLAN");
	ah.grh.sgid_index = 7;
	CHECK(ibv_resolve_eth_l2_from_gid(ctx, &ah, mac, &vid) != 0, "a source GID that does not exist");
}

static void ece(struct end *e)
{
	struct ibv_ece ece = { 0 };
	CHECK(ibv_set_ece(e->qp, &ece) == EOPNOTSUPP, "vendor 0 is no ECE");
	ece.vendor_id = 0x1234;
	ece.options = 0x5;
	CHECK(ibv_set_ece(e->qp, &ece) == 0, "ibv_set_ece");
	struct ibv_ece got = { 0 };
	CHECK(ibv_query_ece(e->qp, &got) == 0 && got.vendor_id == 0x1234 && got.options == 5, "ibv_query_ece");
	CHECK(ibv_query_qp_data_in_order(e->qp, IBV_WR_RDMA_WRITE, 0) == 0, "no in-order promise");
}

static void process(struct ibv_device *dev, struct end *e)
{
	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "fork needs nothing");
	CHECK(ibv_dontfork_range(e->buf, 4096) == 0 && ibv_dofork_range(e->buf, 4096) == 0, "fork ranges");
	CHECK(ibv_get_device_index(dev) == 0, "softhca0 is device 0");
	CHECK(!strcmp(ibv_get_sysfs_path(), getenv("SYSFS_PATH") ? getenv("SYSFS_PATH") : "/sys"), "sysfs path");
	/* Importing: a context on the same user context from a duplicate of its cmd_fd (as
	 * the kernel shares a ucontext), its PD and MR by handle; unknown handles are EINVAL. */
	errno = 0;
	CHECK(ibv_import_pd(e->ctx, 0xFFFFFF) == NULL && errno == EINVAL, "import an unknown PD");
	errno = 0;
	CHECK(ibv_import_mr(e->pd, 0xFFFFFF) == NULL && errno == EINVAL, "import an unknown MR");
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno != 0, "import a device from no descriptor");
	int dup_fd = dup(e->ctx->cmd_fd);
	CHECK(dup_fd >= 0, "cmd_fd is a descriptor a program can dup");
	struct ibv_context *ic = ibv_import_device(dup_fd);
	CHECK(ic != NULL && ic != e->ctx, "import softhca's own context");
	struct ibv_pd *ipd = ibv_import_pd(ic, e->pd->handle);
	CHECK(ipd && ipd->handle == e->pd->handle && ipd->context == ic, "import its PD");
	struct ibv_mr *imr = ibv_import_mr(ipd, e->mr->handle);
	CHECK(imr && imr->lkey == e->mr->lkey && imr->rkey == e->mr->rkey && imr->length == e->mr->length &&
		      imr->addr == NULL && imr->pd == ipd,
	      "import its MR");
	ibv_unimport_mr(imr);
	ibv_unimport_pd(ipd);
	CHECK(ibv_close_device(ic) == 0, "close the imported context");
	close(dup_fd);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(e->pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EOPNOTSUPP,
	      "dma-buf");
}

int main(void)
{
	hang_guard(30);
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	struct end e;
	setup_end(&e, ibv_open_device(list[0]), IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	rates();
	kernel_copies();
	tables(e.ctx);
	ece(&e);
	process(list[0], &e);
	CHECK(ibv_destroy_qp(e.qp) == 0, "destroy QP with ECE kept");
	printf("helpers: ok\n");
	return 0;
}
