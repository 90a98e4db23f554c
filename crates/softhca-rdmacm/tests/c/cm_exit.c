/* A process that exits while connected: its connection ends as Linux's kernel ends it when
 * the process's rdma_cm file closes (a DREQ), and the peer sees DISCONNECTED.
 *   cm_exit server <ip> <port>   accepts one connection, waits (10 s at most) for DISCONNECTED
 *   cm_exit client <ip> <port>   connects, then exits without destroying anything
 * Prints "cm_exit <role>: ok". */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type type, int timeout_ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e;
	CHECK(poll(&p, 1, timeout_ms) == 1);
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != type) {
		fprintf(stderr, "expected %s, got %s\n", rdma_event_str(type), rdma_event_str(e->event));
		exit(1);
	}
	return e;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id, *conn;
	struct rdma_cm_event *e;
	struct ibv_qp_init_attr qa;
	struct sockaddr_in a;

	CHECK(argc == 4);
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(atoi(argv[3]));
	inet_pton(AF_INET, argv[2], &a.sin_addr);
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	if (strcmp(argv[1], "server") == 0) {
		CHECK(rdma_bind_addr(id, (struct sockaddr *)&a) == 0);
		CHECK(rdma_listen(id, 1) == 0);
		e = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
		conn = e->id;
		rdma_ack_cm_event(e);
		CHECK(rdma_create_qp(conn, NULL, &qa) == 0);
		CHECK(rdma_accept(conn, NULL) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED, 10000));
		/* The client exits now; its DREQ must come. */
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_DISCONNECTED, 10000));
		rdma_destroy_qp(conn);
		CHECK(rdma_destroy_id(conn) == 0 && rdma_destroy_id(id) == 0);
		printf("cm_exit server: ok\n");
	} else {
		CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 1000) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 10000));
		CHECK(rdma_resolve_route(id, 1000) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000));
		CHECK(rdma_create_qp(id, NULL, &qa) == 0);
		CHECK(rdma_connect(id, NULL) == 0);
		rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED, 10000));
		printf("cm_exit client: ok\n");
		fflush(stdout);
		exit(0); /* connected, nothing destroyed */
	}
	return 0;
}
