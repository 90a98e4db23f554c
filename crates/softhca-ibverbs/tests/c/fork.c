/* A program that forks with the device open, as pyverbs' tests and launchers do: the child
   opens a device of its own (its own address: the parent's stays the parent's) and moves data
   on it; closing the context it inherited is a no-op that returns 0; the parent's device
   goes on working, its packets taken by no one else. Before, the child got the parent's
   device back from ibv_open_device: its engine thread left behind by the fork, nothing the
   child posted moved, and the sockets it shared with the parent could take the parent's
   packets. Prints "fork: ok" and exits 0, or names the first check that failed. */
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

	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		struct ibv_context *mine = ibv_open_device(list[0]);
		CHECK(mine, "the child's ibv_open_device: %s", strerror(errno));
		struct end g, h;
		pair_on(mine, &g, &h);
		CHECK(memcmp(&g.gid, &e.gid, sizeof g.gid) != 0, "the child's device has an address of its own");
		send_one(&g, &h, 'c', "the child");
		CHECK(ibv_close_device(parent) == 0, "closing the inherited context");
		send_one(&g, &h, 'd', "the child, after closing the parent's context");
		printf("fork: child ok\n");
		exit(0);
	}
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
	send_one(&e, &f, 'q', "the parent, after");
	printf("fork: ok\n");
	return 0;
}
