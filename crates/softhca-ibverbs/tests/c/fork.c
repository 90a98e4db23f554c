/* A program that forks with the device open, as pyverbs' tests and launchers do: the child
   opens a device of its own (its own address: the parent's stays the parent's) and moves data
   on it; closing the context it inherited is a no-op that returns 0; the parent's device
   goes on working, its packets taken by no one else. Before, the child got the parent's
   device back from ibv_open_device: its engine thread left behind by the fork, nothing the
   child posted moved, and the sockets it shared with the parent could take the parent's
   packets. The child then destroys what it inherited, as a program (or pyverbs' objects)
   cleaning up before exit does: every destroy returns 0 and touches nothing of the parent's
   device, whose threads and locks the fork left behind; then 200 children do the same while
   the parent's engine is busy (before, a lock the engine thread held at the fork stayed held
   in the child, and about one child in a hundred hung in its destroys). Prints "fork: ok"
   and exits 0, or names the first check that failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#define TEST_NAME "fork"
#include "verbs_test.h"

/* A Send of 64 bytes from `e` to `f` (a receive posted first), both completions successful
   and the bytes landed. */
static void send_one(struct end *e, struct end *f, char fill, const char *who)
{
	struct ibv_sge rs = { (uintptr_t)f->buf, 64, f->mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(f->qp, &r, &rbad) == 0, "%s: ibv_post_recv", who);
	memset(e->buf, fill, 64);
	memset(f->buf, 0, 64);
	struct ibv_sge s = { (uintptr_t)e->buf, 64, e->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	CHECK(ibv_post_send(e->qp, &w, &bad) == 0, "%s: ibv_post_send", who);
	struct ibv_wc wc = wait_one(e->cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "%s: the Send: %s", who, ibv_wc_status_str(wc.status));
	wc = wait_one(f->cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 64, "%s: the receive: %s", who,
	      ibv_wc_status_str(wc.status));
	CHECK(f->buf[0] == fill && f->buf[63] == fill, "%s: the bytes landed", who);
}

/* Rounds of forks while the parent's engine is busy with Sends, each child destroying the
   parent's QPs, MRs, CQs and a PD at once: a child that hangs (a lock its copy of the engine
   held at the fork) or fails ends the test. On the old code about one child in a hundred hung. */
static void forks_while_busy(struct end *e, struct end *f, int rounds)
{
	for (int k = 0; k < rounds; k++) {
		for (int i = 0; i < 8; i++) {
			struct ibv_sge rs = { (uintptr_t)f->buf, 64, f->mr->lkey };
			struct ibv_recv_wr r = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
			CHECK(ibv_post_recv(f->qp, &r, &rbad) == 0, "round %d: ibv_post_recv", k);
			struct ibv_sge s = { (uintptr_t)e->buf, 64, e->mr->lkey };
			struct ibv_send_wr w = { .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
			CHECK(ibv_post_send(e->qp, &w, &bad) == 0, "round %d: ibv_post_send", k);
		}
		pid_t pid = fork();
		CHECK(pid >= 0, "fork");
		if (pid == 0) {
			hang_guard(5);
			/* (e's PD keeps the SRQ, AH and MW main made on it.) */
			int r = ibv_destroy_qp(e->qp) | ibv_destroy_qp(f->qp) | ibv_dereg_mr(e->mr) |
				ibv_dereg_mr(f->mr) | ibv_destroy_cq(e->cq) | ibv_destroy_cq(f->cq) |
				ibv_dealloc_pd(f->pd);
			_exit(r == 0 ? 0 : 1);
		}
		int status = 0;
		CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "round %d: the child destroying the parent's objects failed or hung (status %d)", k, status);
		for (int i = 0; i < 8; i++) {
			struct ibv_wc wc = wait_one(e->cq);
			CHECK(wc.status == IBV_WC_SUCCESS, "round %d: a Send: %s", k, ibv_wc_status_str(wc.status));
			wc = wait_one(f->cq);
			CHECK(wc.status == IBV_WC_SUCCESS, "round %d: a receive: %s", k, ibv_wc_status_str(wc.status));
		}
	}
}

static void pair_on(struct ibv_context *ctx, struct end *e, struct end *f)
{
	setup_end(e, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	setup_end(f, ctx, IBV_QPT_RC, IBV_ACCESS_LOCAL_WRITE, 4096);
	connect_rc(e, f, 0, 1);
	connect_rc(f, e, 0, 1);
}

int main(void)
{
	hang_guard(60);
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0], "ibv_get_device_list");
	struct ibv_context *parent = ibv_open_device(list[0]);
	struct end e, f;
	pair_on(parent, &e, &f);
	send_one(&e, &f, 'p', "the parent, before");
	/* More of the parent's objects for the child to destroy. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(parent);
	CHECK(ch, "ibv_create_comp_channel");
	struct ibv_cq *ccq = ibv_create_cq(parent, 4, NULL, ch, 0);
	CHECK(ccq, "ibv_create_cq on a channel");
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(e.pd, &sa);
	CHECK(srq, "ibv_create_srq");
	struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = f.gid, .hop_limit = 1 }, .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(e.pd, &aa);
	CHECK(ah, "ibv_create_ah");
	struct ibv_mw *mw = ibv_alloc_mw(e.pd, IBV_MW_TYPE_2);
	CHECK(mw, "ibv_alloc_mw");
	/* Sends in flight as the fork comes: the parent's engine thread at work. */
	for (int i = 0; i < 8; i++) {
		struct ibv_sge rs = { (uintptr_t)f.buf + 64 * i, 64, f.mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 10 + i, .sg_list = &rs, .num_sge = 1 }, *rbad = NULL;
		CHECK(ibv_post_recv(f.qp, &r, &rbad) == 0, "the parent's receives");
		struct ibv_sge s = { (uintptr_t)e.buf, 64, e.mr->lkey };
		struct ibv_send_wr w = { .wr_id = 10 + i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
		CHECK(ibv_post_send(e.qp, &w, &bad) == 0, "the parent's Sends");
	}

	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct ibv_context *mine = ibv_open_device(list[0]);
		CHECK(mine, "the child's ibv_open_device: %s", strerror(errno));
		struct end g, h;
		pair_on(mine, &g, &h);
		CHECK(memcmp(&g.gid, &e.gid, sizeof g.gid) != 0, "the child's device has an address of its own");
		send_one(&g, &h, 'c', "the child");
		/* What the child inherited, destroyed as a program cleaning up would: each 0. */
		CHECK(ibv_destroy_qp(e.qp) == 0 && ibv_destroy_qp(f.qp) == 0, "destroying the inherited QPs");
		CHECK(ibv_destroy_srq(srq) == 0, "destroying the inherited SRQ");
		CHECK(ibv_destroy_ah(ah) == 0, "destroying the inherited AH");
		CHECK(ibv_dealloc_mw(mw) == 0, "deallocating the inherited MW");
		CHECK(ibv_dereg_mr(e.mr) == 0 && ibv_dereg_mr(f.mr) == 0, "deregistering the inherited MRs");
		ibv_ack_cq_events(ccq, 0);
		CHECK(ibv_destroy_cq(ccq) == 0 && ibv_destroy_cq(e.cq) == 0 && ibv_destroy_cq(f.cq) == 0,
		      "destroying the inherited CQs");
		CHECK(ibv_destroy_comp_channel(ch) == 0, "destroying the inherited channel");
		CHECK(ibv_dealloc_pd(e.pd) == 0 && ibv_dealloc_pd(f.pd) == 0, "deallocating the inherited PDs");
		send_one(&g, &h, 'e', "the child, after destroying the parent's objects");
		CHECK(ibv_close_device(parent) == 0, "closing the inherited context");
		send_one(&g, &h, 'd', "the child, after closing the parent's context");
		printf("fork: child ok\n");
		exit(0);
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
	for (int i = 0; i < 8; i++) {
		struct ibv_wc wc = wait_one(e.cq);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 + i, "the parent's Send %d: %s", i,
		      ibv_wc_status_str(wc.status));
		wc = wait_one(f.cq);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 + i, "the parent's receive %d: %s", i,
		      ibv_wc_status_str(wc.status));
	}
	send_one(&e, &f, 'q', "the parent, after");
	forks_while_busy(&e, &f, 200);
	send_one(&e, &f, 'r', "the parent, after the rounds");
	printf("fork: ok\n");
	return 0;
}
