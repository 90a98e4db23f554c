/* rdma_cm across a fork: a process connected to itself through its own listener forks; the
 * child, on an address of its own, listens and connects to itself as well (its own device and
 * CM thread: the parent's stay the parent's), and the parent connects once more after the
 * child is gone. Before, the child's rdma_cm was the parent's as the fork left it: a device
 * whose CM thread was not there, so the child's connection never came.
 *   cm_fork <parent ip> <child ip> <port>
 * Prints "cm_fork: ok" (and "cm_fork child: ok" from the child). */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "cm_fork %d: %s:%d: %s (errno %d)\n", (int)getpid(), __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e;
	CHECK(poll(&p, 1, 10000) == 1);
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != type) {
		fprintf(stderr, "cm_fork: expected %s, got %s\n", rdma_event_str(type), rdma_event_str(e->event));
		exit(1);
	}
	return e;
}

static struct sockaddr_in sin_of(const char *ip, int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	CHECK(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
	return a;
}

static struct ibv_qp_init_attr rc(void)
{
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	return qa;
}

/* A listener on ip:port, on a channel of its own. */
static struct rdma_cm_id *listen_on(struct rdma_event_channel **ch, const char *ip, int port)
{
	struct rdma_cm_id *l;
	struct sockaddr_in a = sin_of(ip, port);
	CHECK((*ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(*ch, &l, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&a) == 0);
	CHECK(rdma_listen(l, 4) == 0);
	return l;
}

/* A client of this process connects to the listener on lch: both sides ESTABLISHED. */
static void connect_to(struct rdma_event_channel *lch, const char *ip, int port)
{
	struct rdma_event_channel *cch;
	struct rdma_cm_id *c, *s;
	struct rdma_cm_event *e;
	struct ibv_qp_init_attr qa = rc();
	struct sockaddr_in a = sin_of(ip, port);
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.responder_resources = p.initiator_depth = 1;
	p.retry_count = 7;
	CHECK((cch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(cch, &c, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 2000) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(c, 2000) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(rdma_create_qp(c, NULL, &qa) == 0);
	CHECK(rdma_connect(c, &p) == 0);
	e = next(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
	s = e->id;
	rdma_ack_cm_event(e);
	qa = rc();
	CHECK(rdma_create_qp(s, NULL, &qa) == 0);
	CHECK(rdma_accept(s, &p) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next(lch, RDMA_CM_EVENT_ESTABLISHED));
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *lch, *child_lch;
	int status = 0;
	pid_t pid;

	CHECK(argc == 4);
	int port = atoi(argv[3]);
	alarm(60);
	listen_on(&lch, argv[1], port);
	connect_to(lch, argv[1], port);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* The parent's address is the parent's: the child's device goes where it binds. */
		unsetenv("SOFTHCA_ADDR");
		listen_on(&child_lch, argv[2], port);
		connect_to(child_lch, argv[2], port);
		printf("cm_fork child: ok\n");
		fflush(stdout);
		exit(0);
	}
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	connect_to(lch, argv[1], port);
	printf("cm_fork: ok\n");
	return 0;
}
