/* ibv_rereg_mr as libibverbs 44 and the kernel answer it: input errors (-1) and command errors
   (-4) with errno, a new PD (the ibv_mr's pd follows; the old PD can go, the new one cannot),
   new rights (a remote Write the old ones allowed is refused), and new memory under the same
   keys. Two contexts of one device, an RC QP pair; prints "rereg: ok" and exits 0, or names the first
   check that failed. */
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
	printf("rereg: ok\n");
	return 0;
}
