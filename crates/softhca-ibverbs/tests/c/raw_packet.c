/* Raw Packet QPs through the drop-in: two processes (the child forks before either opens its
   device, so each has its own device and address), each with an IBV_QPT_RAW_PACKET QP taken
   to RTR/RTS with the port only; the parent sends a broadcast Ethernet frame (EtherType 0x88B5,
   local experimental) until the child's QP has received it whole, in a receive whose CQE
   gives the frame's length. Without CAP_NET_RAW, ibv_create_qp fails with EPERM, as the kernel
   answers, and the program checks that instead. Prints "raw_packet: ok". */
#define TEST_NAME "raw_packet"
#include "verbs_test.h"
#include <fcntl.h>
#include <sys/wait.h>

static const char payload[] = "a whole Ethernet frame through a Raw Packet QP";

static struct ibv_qp *raw_qp(struct end *e, int *err)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "one device");
	e->ctx = ibv_open_device(list[0]);
	CHECK(e->ctx, "ibv_open_device");
	e->pd = ibv_alloc_pd(e->ctx);
	e->cq = ibv_create_cq(e->ctx, 64, NULL, NULL, 0);
	e->buf = calloc(1, 4096);
	e->mr = ibv_reg_mr(e->pd, e->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(e->pd && e->cq && e->mr, "resources");
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RAW_PACKET,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	e->qp = ibv_create_qp(e->pd, &init);
	*err = e->qp ? 0 : errno;
	if (!e->qp)
		return NULL;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PORT) == 0, "to INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0, "to RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0, "to RTS");
	/* A P_Key index is not a Raw Packet QP's attribute. */
	a.pkey_index = 0;
	CHECK(ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX) == EINVAL, "P_Key index refused");
	return e->qp;
}

static size_t frame(char *buf)
{
	memset(buf, 0xff, 6); /* broadcast */
	const unsigned char src[6] = { 0x02, 0, 0x7f, 0x55, 0x55, 0x55 };
	memcpy(buf + 6, src, 6);
	buf[12] = (char)0x88;
	buf[13] = (char)0xB5;
	memcpy(buf + 14, payload, sizeof payload);
	return 14 + sizeof payload;
}

static int child(int ready, int done)
{
	hang_guard(40);
	struct end e;
	int err;
	if (!raw_qp(&e, &err)) {
		CHECK(err == EPERM, "ibv_create_qp(RAW_PACKET): %s, want EPERM", strerror(err));
		CHECK(write(ready, "P", 1) == 1, "pipe");
		return 0;
	}
	struct ibv_sge sge = { .addr = (uintptr_t)e.buf, .length = 2048, .lkey = e.mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(e.qp, &wr, &bad) == 0, "ibv_post_recv");
	CHECK(write(ready, "R", 1) == 1, "pipe");
	struct ibv_wc wc = wait_one(e.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 7 && wc.opcode == IBV_WC_RECV, "recv: %s",
	      ibv_wc_status_str(wc.status));
	char want[128];
	size_t n = frame(want);
	CHECK(wc.byte_len == n && memcmp(e.buf, want, n) == 0, "the frame whole: %u bytes", wc.byte_len);
	CHECK(write(done, "D", 1) == 1, "pipe");
	return 0;
}

int main(void)
{
	int ready[2], done[2];
	CHECK(pipe(ready) == 0 && pipe(done) == 0, "pipe");
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0)
		_exit(child(ready[1], done[1]));
	hang_guard(50);
	char c;
	CHECK(read(ready[0], &c, 1) == 1, "child ready");
	struct end e;
	int err;
	if (c == 'P') {
		CHECK(!raw_qp(&e, &err) && err == EPERM, "EPERM here too");
	} else {
		CHECK(raw_qp(&e, &err), "ibv_create_qp(RAW_PACKET): %s", strerror(err));
		struct ibv_device_attr da;
		CHECK(ibv_query_device(e.ctx, &da) == 0 && da.max_raw_ethy_qp > 0, "max_raw_ethy_qp");
		size_t n = frame(e.buf);
		CHECK(fcntl(done[0], F_SETFL, O_NONBLOCK) == 0, "fcntl");
		/* The child's QP hears the interface once its RTR took effect: send until it has it. */
		for (int i = 0; read(done[0], &c, 1) != 1; i++) {
			CHECK(i < 1500, "the child never got the frame");
			struct ibv_sge sge = { .addr = (uintptr_t)e.buf, .length = (uint32_t)n, .lkey = e.mr->lkey };
			struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;
			CHECK(ibv_post_send(e.qp, &wr, &bad) == 0, "ibv_post_send");
			struct ibv_wc wc = wait_one(e.cq);
			CHECK(wc.status == IBV_WC_SUCCESS, "send: %s", ibv_wc_status_str(wc.status));
			usleep(10000);
		}
	}
	int status;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
	printf("raw_packet: ok\n");
	return 0;
}
