/* ibv_rereg_mr as libibverbs 44 and the kernel answer it: input errors (-1) and command errors
   (-4) with errno, a new PD (the ibv_mr's pd follows; the old PD can go, the new one cannot),
   new rights (a remote Write the old ones allowed is refused), and new memory under the same
   keys. The R_Key reported for a region without remote rights (0, as rxe's), and a region
   registered at an I/O virtual address of the program's (ibv_reg_mr_iova2). Two contexts of
   one device, an RC QP pair; prints "rereg: ok" and exits 0, or names the first check that
   failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define TEST_NAME "rereg"
#include "verbs_test.h"

static int write_to(struct end *e, void *dst, uint32_t rkey)
{
	struct ibv_sge s = { (uintptr_t)e->buf, 64, e->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 9, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.rdma.remote_addr = (uintptr_t)dst;
	w.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(e->qp, &w, &bad) == 0, "ibv_post_send");
	return wait_one(e->cq).status;
}

int main(void)
{
	hang_guard(30);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct end e, f;
	setup_end(&e, ibv_open_device(list[0]), IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(&f, ibv_open_device(list[0]), IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	connect_rc(&e, &f, IBV_ACCESS_REMOTE_WRITE, 1);
	connect_rc(&f, &e, IBV_ACCESS_REMOTE_WRITE, 1);
	char *land = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(f.pd, land, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "ibv_reg_mr");
	uint32_t lkey = mr->lkey, rkey = mr->rkey;

	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL, "a translation without memory");
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "rights without IBV_REREG_MR_CHANGE_ACCESS");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL, "no flag: the kernel's EINVAL");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) ==
			      IBV_REREG_MR_ERR_CMD && errno == EINVAL,
	      "remote write without local write");

	CHECK(write_to(&e, land, rkey) == IBV_WC_SUCCESS, "a Write the rights allow");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == 0,
	      "rereg to local write only");
	CHECK(mr->lkey == lkey && mr->rkey == rkey, "the keys stay");
	int st = write_to(&e, land, rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "a Write the new rights refuse: %s", ibv_wc_status_str(st));

	/* A new PD for the region: the new one stays while the region is in it, and goes once
	   the region does. */
	struct ibv_pd *other = ibv_alloc_pd(f.ctx);
	CHECK(other, "ibv_alloc_pd");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, other, NULL, 0, 0) == 0 && mr->pd == other, "rereg to another PD");
	CHECK(ibv_dealloc_pd(other) == EBUSY, "the new PD holds the region");

	/* New memory under the same keys. */
	char *fresh = calloc(1, 8192);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, fresh, 8192, 0) == 0, "rereg to new memory");
	CHECK(mr->addr == fresh && mr->length == 8192 && mr->lkey == lkey, "the ibv_mr follows, the keys stay");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS, NULL, (void *)4096, 4096,
			   IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_CMD && errno == EFAULT,
	      "unmapped memory: EFAULT, as the kernel's pin");
	CHECK(mr->addr == fresh, "a failed rereg changes nothing");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(other) == 0, "dereg, then the PD goes");

	/* IBV_REREG_MR_KEEP_VALID (bit 3) left libibverbs in v32: an unknown flag since. */
	errno = 0;
	CHECK(ibv_rereg_mr(f.mr, 1 << 3, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "bit 3: libibverbs' input error");

	/* A fresh pair: e's QP went to Error with the refused Write above. */
	struct end g, h;
	setup_end(&g, e.ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(&h, f.ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	connect_rc(&g, &h, IBV_ACCESS_REMOTE_WRITE, 1);
	connect_rc(&h, &g, IBV_ACCESS_REMOTE_WRITE, 1);
	e = g;
	f = h;

	/* No remote rights: the key is reported all the same (mlx5, rxe since Linux 6.2), and stays
	   the region's when a rereg adds a remote right (rdma-core's test_mr_rereg_access). */
	mr = ibv_reg_mr(f.pd, land, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && mr->rkey == mr->lkey && mr->lkey != 0, "a local region reports its key as R_Key");
	rkey = mr->rkey;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0 &&
		      mr->rkey == rkey,
	      "rights with a remote one keep the key");
	CHECK(write_to(&e, land, rkey) == IBV_WC_SUCCESS, "a Write with the key handed out before");
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");

	/* An I/O virtual address of the program's: remote and local accesses name the memory by
	   it; its offset in the page must be the address's. */
	long page = sysconf(_SC_PAGESIZE);
	uint64_t iova = 0x7e0000000000ull + ((uintptr_t)land % page);
	errno = 0;
	CHECK(!ibv_reg_mr_iova2(f.pd, land, 4096, iova + 1, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "an iova at another page offset: EINVAL");
	mr = ibv_reg_mr_iova2(f.pd, land, 4096, iova, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr && mr->addr == land, "ibv_reg_mr_iova2");
	memset(e.buf, 0x5c, 64);
	memset(land, 0, 4096);
	CHECK(write_to(&e, (void *)(uintptr_t)(iova + 100), mr->rkey) == IBV_WC_SUCCESS, "a Write to the iova");
	CHECK(land[100] == 0x5c && land[163] == 0x5c && land[164] == 0 && land[99] == 0, "landed at its offset");
	/* A gather from a region at an iova names its memory by the iova too. */
	char *src = calloc(1, 4096);
	memset(src + 8, 0x6d, 64);
	uint64_t src_iova = 0x7f0000000000ull + ((uintptr_t)src % page);
	struct ibv_mr *smr = ibv_reg_mr_iova2(e.pd, src, 4096, src_iova, IBV_ACCESS_LOCAL_WRITE);
	CHECK(smr, "ibv_reg_mr_iova2 of the source");
	struct ibv_sge sg = { src_iova + 8, 64, smr->lkey };
	struct ibv_send_wr w = { .wr_id = 10, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	w.wr.rdma.remote_addr = iova + 1000;
	w.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(e.qp, &w, &bad) == 0, "ibv_post_send");
	st = wait_one(e.cq).status;
	CHECK(st == IBV_WC_SUCCESS && land[1000] == 0x6d && land[1063] == 0x6d && land[1064] == 0,
	      "a Write gathered at the source's iova: %s", ibv_wc_status_str(st));
	st = write_to(&e, land, mr->rkey);
	CHECK(st == IBV_WC_REM_ACCESS_ERR, "a Write to the host address is outside: %s", ibv_wc_status_str(st));
	printf("rereg: ok\n");
	return 0;
}
