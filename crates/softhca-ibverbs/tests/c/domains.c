/* Thread domains and parent domains through libibverbs' calls, with mlx5's answers: the
   attribute checks (EINVAL), a parent domain standing for its PD (its handle the PD's; a QP,
   a region and an extended CQ made through it; data moving), and the holds: a PD and a
   thread domain cannot go while a parent domain holds them, a parent domain not while a QP
   or CQ made through it exists (EBUSY each), then all go in order. Prints "domains: ok" and
   exits 0, or names the first check that failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define TEST_NAME "domains"
#include "verbs_test.h"

static void *never_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
	(void)pd, (void)ctx, (void)size, (void)align, (void)type;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void never_free(struct ibv_pd *pd, void *ctx, void *ptr, uint64_t type)
{
	(void)pd, (void)ctx, (void)ptr, (void)type;
}

int main(void)
{
	hang_guard(60);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");

	struct ibv_td_init_attr tda = { .comp_mask = 1 };
	errno = 0;
	CHECK(!ibv_alloc_td(ctx, &tda) && errno == EINVAL, "a thread domain with a comp_mask bit");
	tda.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(ctx, &tda);
	CHECK(td && td->context == ctx, "ibv_alloc_td: %s", strerror(errno));

	struct ibv_parent_domain_init_attr pa = { .pd = NULL, .td = td };
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &pa) && errno == EINVAL, "a parent domain without a PD");
	pa.pd = pd;
	pa.comp_mask = 1 << 2;
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &pa) && errno == EINVAL, "an unknown comp_mask bit");
	pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &pa) && errno == EINVAL, "allocators without functions");
	pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	pa.alloc = never_alloc;
	pa.free = never_free;
	pa.pd_context = &pa;
	struct ibv_pd *parent = ibv_alloc_parent_domain(ctx, &pa);
	CHECK(parent && parent != pd, "ibv_alloc_parent_domain: %s", strerror(errno));
	CHECK(parent->context == ctx && parent->handle == pd->handle, "the PD's context and handle");
	struct ibv_parent_domain_init_attr nested = { .pd = parent };
	errno = 0;
	CHECK(!ibv_alloc_parent_domain(ctx, &nested) && errno == EINVAL, "a parent domain of a parent domain");

	CHECK(ibv_dealloc_pd(pd) == EBUSY, "the PD while a parent domain holds it");
	CHECK(ibv_dealloc_td(td) == EBUSY, "the thread domain while a parent domain holds it");

	/* A CQ in the domain takes a parent domain only. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = pd };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EINVAL, "a CQ in a plain PD");
	ca.parent_domain = parent;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cqx, "a CQ in the parent domain: %s", strerror(errno));

	/* Two QPs through the parent domain, data between them. */
	struct end e, f;
	setup_end(&e, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	ibv_destroy_qp(e.qp);
	struct ibv_qp_init_attr qa = { .send_cq = ibv_cq_ex_to_cq(cqx), .recv_cq = ibv_cq_ex_to_cq(cqx), .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	e.qp = ibv_create_qp(parent, &qa);
	CHECK(e.qp && e.qp->pd == parent, "a QP through the parent domain: %s", strerror(errno));
	e.cq = ibv_cq_ex_to_cq(cqx);
	ibv_dereg_mr(e.mr);
	e.mr = ibv_reg_mr(parent, e.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e.mr && e.mr->pd == parent, "a region through the parent domain");
	setup_end(&f, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 4096);
	connect_rc(&e, &f, 0, 1);
	connect_rc(&f, &e, IBV_ACCESS_REMOTE_WRITE, 1);
	memset(e.buf, 0x4d, 64);
	struct ibv_sge s = { (uintptr_t)e.buf, 64, e.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.rdma.remote_addr = (uintptr_t)f.buf;
	w.wr.rdma.rkey = f.mr->rkey;
	CHECK(ibv_post_send(e.qp, &w, &bad) == 0, "ibv_post_send");
	struct ibv_wc wc = wait_one(e.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 5, "the Write: %s", ibv_wc_status_str(wc.status));
	CHECK(f.buf[0] == 0x4d && f.buf[63] == 0x4d, "it landed");

	/* The holds, released in order. */
	CHECK(ibv_dealloc_pd(parent) == EBUSY, "the parent domain while its QP and CQ exist");
	CHECK(ibv_destroy_qp(e.qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_dealloc_pd(parent) == EBUSY, "the parent domain while its CQ exists");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "ibv_destroy_cq");
	CHECK(ibv_dereg_mr(e.mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_dealloc_pd(parent) == 0, "the parent domain, once nothing holds it");
	CHECK(ibv_dealloc_td(td) == 0, "the thread domain, once its parent domain is gone");
	printf("domains: ok\n");
	return 0;
}
