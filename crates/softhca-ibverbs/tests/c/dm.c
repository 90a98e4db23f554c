/* Device memory through libibverbs, answered as mlx5 answers it for MEMIC (rxe has none):
   max_dm_size, ibv_alloc_dm's refusals (no bytes, too many, an unknown comp_mask bit, an
   alignment past a page: EINVAL; the pool spent: ENOMEM), the copies (4-byte granules:
   EINVAL off them, EFAULT past the end), ibv_reg_dm_mr's refusals (no ZERO_BASED, an access
   bit mlx5 does not take, a range past the memory), a zero-based region moving data both
   ways (a Send landing in device memory, an RDMA Write into it, an RDMA Read out of it),
   ibv_free_dm EBUSY while a region holds it, and ibv_import_dm through a context imported
   from the same command file. Prints "dm: ok" and exits 0, or names the first check that
   failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define TEST_NAME "dm"
#include "verbs_test.h"

static struct ibv_dm *alloc(struct ibv_context *ctx, size_t len, uint32_t log_align, uint32_t comp_mask)
{
	struct ibv_alloc_dm_attr a = { .length = len, .log_align_req = log_align, .comp_mask = comp_mask };
	errno = 0;
	return ibv_alloc_dm(ctx, &a);
}

int main(void)
{
	hang_guard(60);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	struct ibv_device_attr_ex ax;
	CHECK(ibv_query_device_ex(ctx, NULL, &ax) == 0 && ax.max_dm_size == 256 * 1024, "max_dm_size %llu",
	      (unsigned long long)ax.max_dm_size);
	size_t max = ax.max_dm_size;

	/* ibv_alloc_dm's refusals, then the pool: four quarters fit, a fifth allocation does not. */
	CHECK(!alloc(ctx, 0, 0, 0) && errno == EINVAL, "no bytes");
	CHECK(!alloc(ctx, max + 1, 0, 0) && errno == EINVAL, "past max_dm_size");
	CHECK(!alloc(ctx, 64, 0, 1) && errno == EINVAL, "an unknown comp_mask bit");
	CHECK(!alloc(ctx, 64, 13, 0) && errno == EINVAL, "an alignment past a page");
	struct ibv_dm *q[4];
	for (int i = 0; i < 4; i++) {
		q[i] = alloc(ctx, max / 4, 6, 0);
		CHECK(q[i], "quarter %d: %s", i, strerror(errno));
	}
	CHECK(!alloc(ctx, 4, 0, 0) && errno == ENOMEM, "the pool spent: %s", strerror(errno));
	CHECK(ibv_free_dm(q[3]) == 0, "ibv_free_dm");
	q[3] = alloc(ctx, max / 4, 0, 0);
	CHECK(q[3], "the freed quarter again");
	for (int i = 0; i < 4; i++)
		CHECK(ibv_free_dm(q[i]) == 0, "free quarter %d", i);

	/* The copies: 4-byte granules inside the memory. */
	struct ibv_dm *dm = alloc(ctx, 100, 0, 0);
	CHECK(dm && dm->context == ctx, "a 100-byte DM");
	char in[100], out[100];
	for (int i = 0; i < 100; i++)
		in[i] = (char)(i * 7);
	CHECK(ibv_memcpy_to_dm(dm, 0, in, 100) == 0, "memcpy_to_dm");
	memset(out, 0, sizeof out);
	CHECK(ibv_memcpy_from_dm(out, dm, 0, 100) == 0 && memcmp(in, out, 100) == 0, "memcpy_from_dm");
	CHECK(ibv_memcpy_to_dm(dm, 2, in, 4) == EINVAL && ibv_memcpy_from_dm(out, dm, 4, 6) == EINVAL, "unaligned");
	CHECK(ibv_memcpy_to_dm(dm, 104, in, 4) == EFAULT && ibv_memcpy_from_dm(out, dm, 0, 104) == EFAULT, "past the end");

	/* ibv_reg_dm_mr's refusals, and a region of no bytes. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	errno = 0;
	CHECK(!ibv_reg_dm_mr(pd, dm, 0, 100, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL, "without ZERO_BASED");
	errno = 0;
	CHECK(!ibv_reg_dm_mr(pd, dm, 0, 100, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_MW_BIND) && errno == EINVAL, "MW_BIND");
	errno = 0;
	CHECK(!ibv_reg_dm_mr(pd, dm, 0, 104, IBV_ACCESS_ZERO_BASED) && errno == EINVAL, "longer than the DM");
	errno = 0;
	CHECK(!ibv_reg_dm_mr(pd, dm, 8, 96, IBV_ACCESS_ZERO_BASED) && errno == EINVAL, "past the DM's end");
	struct ibv_mr *none = ibv_reg_dm_mr(pd, dm, 0, 0, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
	CHECK(none && none->addr == NULL && none->length == 0, "a region of no bytes: %s", strerror(errno));
	CHECK(ibv_free_dm(dm) == EBUSY, "free with a region over it");
	CHECK(ibv_dereg_mr(none) == 0 && ibv_free_dm(dm) == 0, "dereg, then free");

	/* Data both ways: a's host buffer, b's device memory as a zero-based region. */
	struct end a, b;
	setup_end(&a, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(&b, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	connect_rc(&a, &b, 0, 4);
	connect_rc(&b, &a, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 4);
	struct ibv_dm *bdm = alloc(ctx, 4096, 6, 0);
	CHECK(bdm, "b's DM");
	struct ibv_mr *bmr = ibv_reg_dm_mr(b.pd, bdm, 0, 4096,
					   IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ);
	CHECK(bmr && bmr->addr == NULL, "b's region of device memory: %s", strerror(errno));
	/* A Send into it: the receive's SGE address is an offset into the region. */
	struct ibv_sge rs = { 256, 64, bmr->lkey };
	struct ibv_recv_wr r = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(b.qp, &r, &rbad) == 0, "post_recv into device memory");
	memset(a.buf, 's', 64);
	struct ibv_sge s = { (uintptr_t)a.buf, 64, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "the Send");
	struct ibv_wc wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "the Send: %s", ibv_wc_status_str(wc.status));
	wc = wait_one(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 64, "the receive: %s", ibv_wc_status_str(wc.status));
	char got[128];
	CHECK(ibv_memcpy_from_dm(got, bdm, 256, 64) == 0 && memcmp(got, a.buf, 64) == 0, "the Send landed in DM");
	/* An RDMA Write into it at remote address 1024 (zero-based), then a Read of it back. */
	memset(a.buf, 'w', 128);
	s.length = 128;
	w.wr_id = 3;
	w.opcode = IBV_WR_RDMA_WRITE;
	w.wr.rdma.remote_addr = 1024;
	w.wr.rdma.rkey = bmr->rkey;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "the Write");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "the Write: %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_memcpy_from_dm(got, bdm, 1024, 128) == 0 && memcmp(got, a.buf, 128) == 0, "the Write landed");
	uint32_t mark = 0x5eed1e55;
	CHECK(ibv_memcpy_to_dm(bdm, 2048, &mark, 4) == 0, "a mark");
	s.addr = (uintptr_t)a.buf + 512;
	s.length = 4;
	w.wr_id = 4;
	w.opcode = IBV_WR_RDMA_READ;
	w.wr.rdma.remote_addr = 2048;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "the Read");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && memcmp(a.buf + 512, &mark, 4) == 0, "the Read: %s",
	      ibv_wc_status_str(wc.status));
	/* Past the region: Remote Access Error. */
	w.wr_id = 5;
	w.wr.rdma.remote_addr = 4094;
	CHECK(ibv_post_send(a.qp, &w, &bad) == 0, "a Read past the region");
	wc = wait_one(a.cq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "past the region: %s", ibv_wc_status_str(wc.status));

	/* Import through a context on the same command file; an unknown handle is EINVAL. */
	struct ibv_context *twin = ibv_import_device(dup(ctx->cmd_fd));
	CHECK(twin, "ibv_import_device");
	struct ibv_dm *imp = ibv_import_dm(twin, bdm->handle);
	CHECK(imp && imp->handle == bdm->handle && imp->context == twin, "ibv_import_dm: %s", strerror(errno));
	CHECK(ibv_memcpy_from_dm(got, imp, 2048, 4) == 0 && memcmp(got, &mark, 4) == 0, "the import reads it");
	ibv_unimport_dm(imp);
	errno = 0;
	CHECK(!ibv_import_dm(twin, 0xdead) && errno == EINVAL, "an unknown handle");
	/* The region imported and deregistered through its import: the memory is free to go. */
	struct ibv_pd *tpd = ibv_import_pd(twin, b.pd->handle);
	struct ibv_mr *tmr = tpd ? ibv_import_mr(tpd, bmr->handle) : NULL;
	CHECK(tmr && tmr->lkey == bmr->lkey, "ibv_import_mr of the region: %s", strerror(errno));
	CHECK(ibv_free_dm(bdm) == EBUSY, "held by b's region");
	CHECK(ibv_dereg_mr(tmr) == 0, "deregistered through the import");
	CHECK(ibv_free_dm(bdm) == 0, "free once the region is gone");
	ibv_unimport_pd(tpd);
	/* Another DM, its import freed first: the allocating object can still be imported. */
	struct ibv_dm *dm2 = alloc(ctx, 64, 0, 0);
	struct ibv_dm *imp2 = dm2 ? ibv_import_dm(ctx, dm2->handle) : NULL;
	CHECK(imp2 && ibv_free_dm(imp2) == 0, "an import into the allocating context, freed");
	imp2 = ibv_import_dm(twin, dm2->handle);
	CHECK(imp2, "the allocating object still found: %s", strerror(errno));
	ibv_unimport_dm(imp2);
	CHECK(ibv_free_dm(dm2) == 0, "free the second DM");
	printf("dm: ok\n");
	return 0;
}
