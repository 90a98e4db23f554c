/* On-demand paging through libibverbs' calls: the capabilities query_device_ex reports; a
   region over memory with a hole and a read-only page, which ibv_reg_mr refuses (EFAULT)
   without IBV_ACCESS_ON_DEMAND and takes with it; a peer's Write into the mapped page landing
   and into the hole or the read-only page failing with IBV_WC_REM_ACCESS_ERR (the process
   lives); the implicit region (NULL, SIZE_MAX) reaching heap memory by address;
   ibv_advise_mr's answers; ibv_rereg_mr refusing to add or drop on-demand paging. Prints
   "odp: ok" and exits 0, or names the first check that failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#define TEST_NAME "odp"
#include "verbs_test.h"

static int write_to(struct end *e, uint64_t dst, uint32_t rkey)
{
	struct ibv_sge s = { (uintptr_t)e->buf, 64, e->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 9, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.rdma.remote_addr = dst;
	w.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(e->qp, &w, &bad) == 0, "ibv_post_send");
	return wait_one(e->cq).status;
}

/* A fresh connected RC pair on two new contexts (a failed Write leaves a QP in Error). */
static void pair(struct ibv_device *dev, struct end *e, struct end *f)
{
	setup_end(e, ibv_open_device(dev), IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(f, ibv_open_device(dev), IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	connect_rc(e, f, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 1);
	connect_rc(f, e, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 1);
}

int main(void)
{
	hang_guard(60);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct end e, f;
	pair(list[0], &e, &f);

	struct ibv_device_attr_ex attr;
	CHECK(ibv_query_device_ex(f.ctx, NULL, &attr) == 0, "ibv_query_device_ex");
	CHECK((attr.odp_caps.general_caps & (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT)) ==
		      (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT),
	      "general ODP caps: %#lx", (unsigned long)attr.odp_caps.general_caps);
	uint32_t rc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ |
		      IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
	CHECK(attr.odp_caps.per_transport_caps.rc_odp_caps == rc && attr.xrc_odp_caps == rc, "RC and XRC ODP caps");
	CHECK(attr.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND, "UD ODP caps");

	/* Three pages: mapped, a hole, read-only. */
	long page = sysconf(_SC_PAGESIZE);
	char *base = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(base != MAP_FAILED, "mmap");
	CHECK(munmap(base + page, page) == 0 && mprotect(base + 2 * page, page, PROT_READ) == 0, "the hole");
	int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	errno = 0;
	CHECK(!ibv_reg_mr(f.pd, base, 3 * page, remote) && errno == EFAULT, "a hole without ODP: EFAULT");
	struct ibv_mr *mr = ibv_reg_mr(f.pd, base, 3 * page, remote | IBV_ACCESS_ON_DEMAND);
	CHECK(mr, "ibv_reg_mr with IBV_ACCESS_ON_DEMAND: %s", strerror(errno));
	memset(e.buf, 0x6b, 64);
	CHECK(write_to(&e, (uintptr_t)base + 128, mr->rkey) == IBV_WC_SUCCESS, "a Write to the mapped page");
	CHECK(base[128] == 0x6b && base[191] == 0x6b && base[192] == 0, "it landed");
	CHECK(write_to(&e, (uintptr_t)base + page + 8, mr->rkey) == IBV_WC_REM_ACCESS_ERR, "a Write to the hole");

	struct end g, h;
	pair(list[0], &g, &h);
	struct ibv_mr *mr2 = ibv_reg_mr(h.pd, base, 3 * page, remote | IBV_ACCESS_ON_DEMAND);
	CHECK(mr2, "ibv_reg_mr ODP again");
	CHECK(write_to(&g, (uintptr_t)base + 2 * page, mr2->rkey) == IBV_WC_REM_ACCESS_ERR,
	      "a Write to the read-only page");

	/* ibv_advise_mr: its errors, then prefetches. */
	struct ibv_sge sge = { (uintptr_t)base, 64, mr2->lkey };
	CHECK(ibv_advise_mr(h.pd, 7, 0, &sge, 1) == EOPNOTSUPP, "unknown advice");
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &sge, 1) == EINVAL, "unknown flag");
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0) == EINVAL, "no SGE");
	struct ibv_sge pinned = { (uintptr_t)h.buf, 64, h.mr->lkey };
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pinned, 1) == ENOENT, "a region without ODP");
	struct ibv_sge other_pd = { (uintptr_t)base, 64, mr->lkey };
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &other_pd, 1) == ENOENT, "another PD's region");
	struct ibv_sge past = { (uintptr_t)base + 3 * page - 8, 64, mr2->lkey };
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &past, 1) == EFAULT,
	      "past the region's end");
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1) == 0,
	      "a synchronous prefetch for writing");
	struct ibv_sge hole = { (uintptr_t)base + page, 64, mr2->lkey };
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &hole, 1) == EFAULT,
	      "a synchronous prefetch of the hole");
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &hole, 1) == 0, "best effort without FLUSH");
	CHECK(ibv_advise_mr(h.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &hole, 1) == 0, "no fault: nothing");

	/* On-demand paging is the region's for good. */
	errno = 0;
	CHECK(ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, remote) == IBV_REREG_MR_ERR_CMD &&
		      errno == EINVAL,
	      "rereg dropping ODP");
	CHECK(ibv_rereg_mr(mr2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) == 0,
	      "rereg keeping it");

	/* The implicit region: any address, by address. */
	struct end i, j;
	pair(list[0], &i, &j);
	struct ibv_mr *all = ibv_reg_mr(j.pd, NULL, SIZE_MAX, remote | IBV_ACCESS_ON_DEMAND);
	CHECK(all && all->addr == NULL && all->length == SIZE_MAX, "the implicit region: %s", strerror(errno));
	char *heap = calloc(1, 4096);
	memset(i.buf, 0x2e, 64);
	CHECK(write_to(&i, (uintptr_t)heap + 1000, all->rkey) == IBV_WC_SUCCESS, "a Write through the implicit rkey");
	CHECK(heap[1000] == 0x2e && heap[1063] == 0x2e && heap[1064] == 0, "it landed in the heap");
	errno = 0;
	CHECK(!ibv_reg_mr_iova2(j.pd, NULL, SIZE_MAX, 4096, remote | IBV_ACCESS_ON_DEMAND) && errno == EINVAL,
	      "the implicit region at another iova");

	CHECK(ibv_dereg_mr(all) == 0 && ibv_dereg_mr(mr2) == 0 && ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	printf("odp: ok\n");
	return 0;
}
