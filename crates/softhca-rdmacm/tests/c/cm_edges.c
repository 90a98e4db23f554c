/* rdma_cm's answers on the drop-in, in one process (its ids connect through the device's
 * own address): errors of bind and get_cm_event, a REQ to a port nobody listens on, a
 * consumer's reject with private data, accept with private data in both directions, the
 * addresses and ports of both ends, the route's flow label on both, a Send over the
 * connection, and a disconnect that reaches the other side and flushes its QP, the DREP
 * left to the other side's rdma_disconnect, then both time waits ending. Prints
 * "cm_edges: ok". */
#include <errno.h>
#include <signal.h>
#include <sys/time.h>
#include <netdb.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <poll.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

static struct rdma_event_channel *ch;

/* The next event, which must be `type` (status checked by the caller). */
static struct rdma_cm_event *next(enum rdma_cm_event_type type)
{
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != type) {
		fprintf(stderr, "expected %s, got %s (status %d)\n", rdma_event_str(type), rdma_event_str(e->event), e->status);
		exit(1);
	}
	return e;
}

static struct sockaddr_in sin4(const char *ip, int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

/* The attributes of an RC QP with `depth` send and receive WRs of one SGE each. */
static struct ibv_qp_init_attr rc_qp(int depth)
{
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = depth;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	return qa;
}

/* A listener `l` on `a` (a new event channel `ch`), a client `c` connected to it and the
 * server's id `s`, each with an RC QP of rdma_create_qp's, both sides ESTABLISHED. */
static void connect_pair(struct sockaddr *a, struct rdma_cm_id **l, struct rdma_cm_id **c, struct rdma_cm_id **s)
{
	struct rdma_cm_event *e;
	struct ibv_qp_init_attr qa = rc_qp(2);
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(ch, l, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(*l, a) == 0 && rdma_listen(*l, 1) == 0);
	CHECK(rdma_create_id(ch, c, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(*c, NULL, a, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(*c, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(rdma_create_qp(*c, NULL, &qa) == 0);
	CHECK(rdma_connect(*c, NULL) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	*s = e->id;
	rdma_ack_cm_event(e);
	CHECK(rdma_create_qp(*s, NULL, &qa) == 0);
	CHECK(rdma_accept(*s, NULL) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ESTABLISHED));
}

/* A client id on `port` of 127.0.0.33, its route resolved and a QP on it. */
static struct rdma_cm_id *client(int port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in dst = sin4("127.0.0.33", port);
	struct ibv_qp_init_attr qa;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(id->verbs && id->pd && id->route.num_paths == 1 && id->route.path_rec);
	qa = rc_qp(4);
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
	CHECK(id->qp && id->send_cq && id->recv_cq);
	return id;
}

/* A REQ to an address where nobody answers (127.0.0.99: no device): after the CM's
 * retries, UNREACHABLE with -ETIMEDOUT; then a DREQ nobody answers (run with short
 * SOFTHCA_CM_* timings). */
static void unreachable_peer(void)
{
	struct sockaddr_in dst = sin4("127.0.0.99", 7174);
	struct rdma_cm_id *id;
	struct rdma_cm_event *e;
	struct ibv_qp_init_attr qa;
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ROUTE_RESOLVED));
	qa = rc_qp(1);
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
	CHECK(rdma_connect(id, NULL) == 0);
	e = next(RDMA_CM_EVENT_UNREACHABLE);
	CHECK(e->id == id && e->status == -ETIMEDOUT);
	rdma_ack_cm_event(e);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);

	/* A DREQ nobody answers: the server hears DISCONNECTED and never disconnects (its DREP
	 * goes only then), so the client's DREQ runs out of retries: DISCONNECTED with
	 * -ETIMEDOUT, as rdma_cm reports IB_CM_DREQ_ERROR, then TIMEWAIT_EXIT. */
	{
		struct sockaddr_in a = sin4("127.0.0.41", 7175);
		struct rdma_cm_id *l, *c, *s;
		connect_pair((struct sockaddr *)&a, &l, &c, &s);
		CHECK(rdma_disconnect(c) == 0);
		e = next(RDMA_CM_EVENT_DISCONNECTED);
		CHECK(e->id == s && e->status == 0);
		rdma_ack_cm_event(e);
		e = next(RDMA_CM_EVENT_DISCONNECTED);
		CHECK(e->id == c && e->status == -ETIMEDOUT);
		rdma_ack_cm_event(e);
		e = next(RDMA_CM_EVENT_TIMEWAIT_EXIT);
		CHECK(e->id == c && e->status == 0);
		rdma_ack_cm_event(e);
	}
	printf("cm_edges unreachable: ok\n");
	exit(0);
}

/* The UDP port space's service ID resolution in one process, as Linux's rdma_cm reports it
 * (cma_ib_req_handler, cma_sidr_rep_handler; rxe in the guest, scripts/interop/probes/
 * rdma_cm_ud.c): the SIDR request carries only its private data (no address handle
 * attributes, QPN or Q_Key); the requester's ESTABLISHED has the responder's QPN, the port
 * space's Q_Key and the REP's 136 bytes; a datagram goes through the resolved address;
 * rdma_disconnect of the UD id answers 0 and leaves its QP in Error; a consumer's reject is
 * UNREACHABLE with status 2 (SIDR reject) and the REP's private data. */
static void sidr(void)
{
	struct sockaddr_in a = sin4("127.0.0.43", 7176);
	struct rdma_cm_id *l, *c, *s, *c2;
	struct rdma_cm_event *e;
	struct ibv_qp_init_attr qa;
	static char cbuf[256], sbuf[256];
	char pdata[20];
	memset(pdata, 9, sizeof pdata);
	struct rdma_conn_param cp = { .private_data = pdata, .private_data_len = sizeof pdata };
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(ch, &l, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&a) == 0 && rdma_listen(l, 2) == 0);
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_id **id = i ? &c2 : &c;
		CHECK(rdma_create_id(ch, id, NULL, RDMA_PS_UDP) == 0);
		CHECK(rdma_resolve_addr(*id, NULL, (struct sockaddr *)&a, 1000) == 0);
		rdma_ack_cm_event(next(RDMA_CM_EVENT_ADDR_RESOLVED));
		CHECK(rdma_resolve_route(*id, 1000) == 0);
		rdma_ack_cm_event(next(RDMA_CM_EVENT_ROUTE_RESOLVED));
	}
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_UD;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(c, NULL, &qa) == 0);
	CHECK(rdma_connect(c, &cp) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	s = e->id;
	CHECK(e->param.ud.private_data_len == 180 && ((unsigned char *)e->param.ud.private_data)[0] == 9);
	CHECK(!e->param.ud.ah_attr.is_global && !e->param.ud.ah_attr.port_num && !e->param.ud.qp_num && !e->param.ud.qkey);
	rdma_ack_cm_event(e);
	qa.send_cq = qa.recv_cq = NULL;
	CHECK(rdma_create_qp(s, NULL, &qa) == 0);
	struct ibv_mr *smr = ibv_reg_mr(s->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge rs = { (uintptr_t)sbuf, sizeof sbuf, smr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(smr && ibv_post_recv(s->qp, &rw, &rbad) == 0);
	CHECK(rdma_accept(s, NULL) == 0);
	e = next(RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->id == c && e->param.ud.qp_num == s->qp->qp_num && e->param.ud.qkey == 0x01234567);
	CHECK(e->param.ud.private_data_len == 136 && e->param.ud.ah_attr.is_global);
	struct ibv_ah *ah = ibv_create_ah(c->pd, &e->param.ud.ah_attr);
	uint32_t qpn = e->param.ud.qp_num, qkey = e->param.ud.qkey;
	rdma_ack_cm_event(e);
	struct ibv_mr *cmr = ibv_reg_mr(c->pd, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE);
	strcpy(cbuf, "over sidr");
	struct ibv_sge ss = { (uintptr_t)cbuf, 10, cmr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED, .wr.ud = { .ah = ah, .remote_qpn = qpn, .remote_qkey = qkey } },
			   *sbad;
	CHECK(ah && cmr && ibv_post_send(c->qp, &sw, &sbad) == 0);
	struct ibv_wc wc;
	while (ibv_poll_cq(s->recv_cq, 1, &wc) == 0)
		;
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 10 && !strcmp(sbuf + 40, "over sidr"));
	CHECK(rdma_disconnect(c) == 0);
	struct ibv_qp_attr qs;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(c->qp, &qs, IBV_QP_STATE, &qi) == 0 && qs.qp_state == IBV_QPS_ERR);

	CHECK(rdma_connect(c2, &cp) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s2 = e->id;
	rdma_ack_cm_event(e);
	CHECK(rdma_reject(s2, "no", 3) == 0);
	e = next(RDMA_CM_EVENT_UNREACHABLE);
	CHECK(e->id == c2 && e->status == 2 && e->param.ud.private_data_len == 136 &&
	      !memcmp(e->param.ud.private_data, "no", 3));
	rdma_ack_cm_event(e);
	printf("cm_edges sidr: ok\n");
	exit(0);
}

/* rdma_cm over IPv6 (the device on ::1, SOFTHCA_ADDR): a listener and a client of one
 * process connect through [::1]; the request's addresses are IPv6 ones (the cma header's
 * IPv6 form), the connection carries a Send. */
static void ipv6(void)
{
	struct sockaddr_in6 a;
	struct rdma_cm_id *l, *c, *s;
	memset(&a, 0, sizeof a);
	a.sin6_family = AF_INET6;
	a.sin6_port = htons(7190);
	a.sin6_addr = in6addr_loopback;
	connect_pair((struct sockaddr *)&a, &l, &c, &s);
	CHECK(rdma_get_local_addr(c)->sa_family == AF_INET6);
	CHECK(rdma_get_peer_addr(s)->sa_family == AF_INET6 && rdma_get_local_addr(s)->sa_family == AF_INET6);
	CHECK(memcmp(&((struct sockaddr_in6 *)rdma_get_peer_addr(s))->sin6_addr, &in6addr_loopback, 16) == 0);
	CHECK(rdma_get_dst_port(s) == rdma_get_src_port(c) && rdma_get_src_port(s) == htons(7190));
	CHECK(rdma_disconnect(c) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_DISCONNECTED)); /* s: the DREQ */
	CHECK(rdma_disconnect(s) == 0);                      /* its DREP */
	rdma_ack_cm_event(next(RDMA_CM_EVENT_DISCONNECTED)); /* c */
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0 && rdma_destroy_id(c) == 0 && rdma_destroy_id(l) == 0);
	printf("cm_edges ipv6: ok\n");
	exit(0);
}

/* A QP made with rdma_create_qp and destroyed with ibv_destroy_qp, as rping destroys its
 * own: the id no longer names it, and the peer's DREQ that comes after (the CM moves a
 * connected id's QP to Error on one) touches nothing that was freed. Run under valgrind,
 * which sees such a touch. */
static void qp_destroyed(void)
{
	struct sockaddr_in a = sin4("127.0.0.45", 7192);
	struct rdma_cm_id *l, *c, *s;
	connect_pair((struct sockaddr *)&a, &l, &c, &s);
	CHECK(ibv_destroy_qp(c->qp) == 0);
	CHECK(c->qp == NULL);
	CHECK(rdma_disconnect(s) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_DISCONNECTED)); /* c: the DREQ */
	CHECK(rdma_disconnect(c) == 0);                      /* its DREP */
	rdma_ack_cm_event(next(RDMA_CM_EVENT_DISCONNECTED)); /* s */
	rdma_destroy_qp(c); /* nothing left to destroy but the CQs it made */
	rdma_destroy_qp(s);
	CHECK(rdma_destroy_id(s) == 0 && rdma_destroy_id(c) == 0 && rdma_destroy_id(l) == 0);
	rdma_destroy_event_channel(ch);
	printf("cm_edges qp_destroyed: ok\n");
	exit(0);
}

/* Where a bind puts a device not yet open: on SOFTHCA_ADDR where that is set (argv[2]), so a
 * first bind of another loopback address binds with no device and the device's own address
 * binds to it; without SOFTHCA_ADDR on the bound loopback address. Prints "cm_edges
 * placement: ok". */
static void placement(const char *addr_env, const char *first)
{
	struct rdma_cm_id *a, *b;
	struct sockaddr_in sa = sin4(first, 0);
	CHECK(rdma_create_id(NULL, &a, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(a, (struct sockaddr *)&sa) == 0);
	if (addr_env) {
		CHECK(a->verbs == NULL);
		sa = sin4(addr_env, 0);
		CHECK(rdma_create_id(NULL, &b, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_bind_addr(b, (struct sockaddr *)&sa) == 0 && b->verbs != NULL);
		CHECK(rdma_destroy_id(b) == 0);
	} else {
		CHECK(a->verbs != NULL);
	}
	CHECK(rdma_destroy_id(a) == 0);
	printf("cm_edges placement: ok\n");
	exit(0);
}

static volatile sig_atomic_t ticks;
static void on_tick(int sig)
{
	(void)sig;
	ticks++;
}

/* rdma_get_cm_event waits as librdmacm's does, in a system call on the channel's descriptor:
 * a signal whose handler was installed without SA_RESTART ends the wait with -1/EINTR. */
static void get_event_interrupted(void)
{
	struct rdma_event_channel *c = rdma_create_event_channel();
	struct rdma_cm_event *e = NULL;
	struct sigaction sa;
	struct itimerval t;
	CHECK(c);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_tick;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	memset(&t, 0, sizeof t);
	t.it_value.tv_usec = 50 * 1000;
	CHECK(setitimer(ITIMER_REAL, &t, NULL) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(c, &e) == -1 && errno == EINTR && ticks == 1);
	rdma_destroy_event_channel(c);
	printf("cm_edges get_event_interrupted: ok\n");
	exit(0);
}

/* rdma_join_multicast as rdma_cm on a RoCEv2 port: a UD id of the UDP port space, bound to
 * the device's address; MULTICAST_JOIN at once with the AH toward ::ffff:239.1.2.3, QPN
 * 0xFFFFFF, RDMA_UDP_QKEY and the context; the id's QP attached on the event (a send-only
 * join does not attach: a leave of it detaches nothing). Refusals: a join before the bind,
 * an IPv6 group (the kernel's ENOTSUPP, 524), join_ex with an unknown mask bit (ENOTSUP),
 * without its flags (EINVAL) or an unknown flag (EINVAL); a leave of what was not joined
 * (EADDRNOTAVAIL). */
static void multicast(void)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event *e;
	struct sockaddr_in me = sin4("127.0.0.42", 0), group = sin4("239.1.2.3", 0), other = sin4("239.1.2.4", 0);
	struct sockaddr_in6 g6;
	struct rdma_cm_join_mc_attr_ex ex;
	struct ibv_qp_init_attr qa;
	int ctx_tag = 7;

	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&group, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&me) == 0);
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_UD;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);

	CHECK(rdma_join_multicast(id, (struct sockaddr *)&group, &ctx_tag) == 0);
	e = next(RDMA_CM_EVENT_MULTICAST_JOIN);
	CHECK(e->status == 0 && e->param.ud.private_data == &ctx_tag);
	CHECK(e->param.ud.qp_num == 0xFFFFFF && e->param.ud.qkey == 0x01234567);
	CHECK(e->param.ud.ah_attr.is_global && e->param.ud.ah_attr.grh.hop_limit == 64);
	{
		static const uint8_t mgid[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3 };
		CHECK(memcmp(e->param.ud.ah_attr.grh.dgid.raw, mgid, 16) == 0);
		/* Attached by the join: a detach finds it (EINVAL otherwise); attached again. */
		CHECK(ibv_detach_mcast(id->qp, (union ibv_gid *)mgid, 0) == 0);
		CHECK(ibv_attach_mcast(id->qp, (union ibv_gid *)mgid, 0) == 0);
	}
	CHECK(rdma_ack_cm_event(e) == 0);

	memset(&g6, 0, sizeof g6);
	g6.sin6_family = AF_INET6;
	inet_pton(AF_INET6, "ff0e::1", &g6.sin6_addr);
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&g6, NULL) == -1 && errno == 524);
	memset(&ex, 0, sizeof ex);
	ex.addr = (struct sockaddr *)&other;
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == ENOTSUP);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == EINVAL);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ex.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == -1 && errno == EINVAL);
	ex.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
	CHECK(rdma_join_multicast_ex(id, &ex, NULL) == 0);
	CHECK(rdma_ack_cm_event(next(RDMA_CM_EVENT_MULTICAST_JOIN)) == 0);
	{
		static const uint8_t mgid4[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 4 };
		CHECK(ibv_detach_mcast(id->qp, (union ibv_gid *)mgid4, 0) == EINVAL); /* send-only: not attached */
	}
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&other) == 0);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&other) == -1 && errno == EADDRNOTAVAIL);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0);
	{
		static const uint8_t mgid[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3 };
		CHECK(ibv_detach_mcast(id->qp, (union ibv_gid *)mgid, 0) == EINVAL); /* the leave detached */
	}
	rdma_destroy_qp(id);
	CHECK(id->qp == NULL);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
	printf("cm_edges multicast: ok\n");
	exit(0);
}

/* The type of service set on a client before its route resolves (rdma_set_option's TOS, as
 * perftest's --tos sets it): the route's path carries it as its traffic class, so do the REQ
 * and the client QP's address vector, and the server's side takes it from the REQ (Linux's
 * cm_format_paths_from_req), though the server set none: its path and its QP's address
 * vector, whose Traffic Class its ACKs and responses carry. */
static void tos(void)
{
	struct sockaddr_in a = sin4("127.0.0.53", 7193);
	struct rdma_cm_id *l, *c, *s;
	struct rdma_cm_event *e;
	struct ibv_qp_init_attr qa = rc_qp(2), init;
	struct ibv_qp_attr attr;
	uint8_t t = 0x60;
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&a) == 0 && rdma_listen(l, 1) == 0);
	CHECK(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_set_option(c, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &t, sizeof t) == 0);
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(c, 1000) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(c->route.path_rec->traffic_class == 0x60);
	CHECK(rdma_create_qp(c, NULL, &qa) == 0);
	CHECK(rdma_connect(c, NULL) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	s = e->id;
	rdma_ack_cm_event(e);
	CHECK(s->route.path_rec->traffic_class == 0x60);
	CHECK(rdma_create_qp(s, NULL, &qa) == 0);
	CHECK(rdma_accept(s, NULL) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next(RDMA_CM_EVENT_ESTABLISHED));
	CHECK(ibv_query_qp(c->qp, &attr, IBV_QP_AV, &init) == 0 && attr.ah_attr.grh.traffic_class == 0x60);
	CHECK(ibv_query_qp(s->qp, &attr, IBV_QP_AV, &init) == 0 && attr.ah_attr.grh.traffic_class == 0x60);
	CHECK(rdma_disconnect(c) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_DISCONNECTED));
	CHECK(rdma_disconnect(s) == 0);
	rdma_ack_cm_event(next(RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_qp(c);
	rdma_destroy_qp(s);
	CHECK(rdma_destroy_id(s) == 0 && rdma_destroy_id(c) == 0 && rdma_destroy_id(l) == 0);
	rdma_destroy_event_channel(ch);
	printf("cm_edges tos: ok\n");
	exit(0);
}

int main(int argc, char **argv)
{
	struct rdma_cm_id *listener, *other, *c, *s;
	struct rdma_cm_event *e;
	struct rdma_conn_param p;
	struct sockaddr_in a;
	struct ibv_qp_init_attr qa;
	struct ibv_wc wc;
	char buf[64], rbuf[64];
	struct ibv_mr *smr, *rmr;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_send_wr swr, *bad_s;
	int n, flags;

	if (argc > 1 && strcmp(argv[1], "unreachable") == 0)
		unreachable_peer();
	if (argc > 1 && strcmp(argv[1], "ipv6") == 0)
		ipv6();
	if (argc > 1 && strcmp(argv[1], "sidr") == 0)
		sidr();
	if (argc > 1 && strcmp(argv[1], "qp_destroyed") == 0)
		qp_destroyed();
	if (argc > 1 && strcmp(argv[1], "get_event_interrupted") == 0)
		get_event_interrupted();
	if (argc > 1 && strcmp(argv[1], "multicast") == 0)
		multicast();
	if (argc > 1 && strcmp(argv[1], "tos") == 0)
		tos();
	if (argc > 2 && strcmp(argv[1], "placement") == 0)
		placement(getenv("SOFTHCA_ADDR"), argv[2]);
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0);

	/* rdma_getaddrinfo as librdmacm's addrinfo.c: a passive answer has RAI_PASSIVE and a
	 * source address only; an active one a destination; QP type and port space from the
	 * hints; a getaddrinfo error comes back as its EAI code. */
	{
		struct rdma_addrinfo hints, *res;
		memset(&hints, 0, sizeof hints);
		hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
		hints.ai_port_space = RDMA_PS_TCP;
		CHECK(rdma_getaddrinfo("127.0.0.33", "7174", &hints, &res) == 0);
		CHECK(res->ai_flags == RAI_PASSIVE && res->ai_src_addr && !res->ai_dst_addr);
		CHECK(res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP && res->ai_family == AF_INET);
		CHECK(((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7174) && !res->ai_src_canonname);
		rdma_freeaddrinfo(res);
		hints.ai_flags = RAI_NUMERICHOST;
		hints.ai_qp_type = IBV_QPT_UD;
		hints.ai_port_space = RDMA_PS_UDP;
		CHECK(rdma_getaddrinfo("127.0.0.33", "7174", &hints, &res) == 0);
		CHECK(res->ai_flags == 0 && res->ai_dst_addr && !res->ai_src_addr && res->ai_qp_type == IBV_QPT_UD);
		rdma_freeaddrinfo(res);
		CHECK(rdma_getaddrinfo("not an address", "7174", &hints, &res) == EAI_NONAME);
		CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL);
	}
	CHECK((ch = rdma_create_event_channel()) != NULL);

	/* Nothing queued and a non-blocking descriptor: EAGAIN. */
	flags = fcntl(ch->fd, F_GETFL);
	CHECK(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0);
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);

	/* A destination the kernel routes nowhere from the device's address (10.99.99.99 from a
	 * loopback one: EINVAL where a route leaves through another interface, ENETUNREACH where
	 * there is none): the call fails, as Linux's rdma_resolve_ip fails it, and no event
	 * comes (rxe in the guest: -1, ENETUNREACH). */
	{
		struct rdma_cm_id *x;
		struct sockaddr_in far = sin4("10.99.99.99", 7174);
		CHECK(rdma_create_id(ch, &x, NULL, RDMA_PS_TCP) == 0);
		errno = 0;
		CHECK(rdma_resolve_addr(x, NULL, (struct sockaddr *)&far, 500) == -1 &&
		      (errno == EINVAL || errno == ENETUNREACH));
		CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);
		CHECK(rdma_destroy_id(x) == 0);
	}
	CHECK(fcntl(ch->fd, F_SETFL, flags) == 0);

	/* Binding the device's address (127.0.0.33, SOFTHCA_ADDR) and a port. */
	CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0);
	a = sin4("127.0.0.33", 7174);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&a) == 0);
	CHECK(listener->verbs != NULL && rdma_get_src_port(listener) == htons(7174));
	CHECK(rdma_create_id(ch, &other, NULL, RDMA_PS_TCP) == 0);
	/* Refused, and the id stays unbound (no device), as the kernel's rdma_cm leaves it. */
	CHECK(rdma_bind_addr(other, (struct sockaddr *)&a) == -1 && errno == EADDRINUSE && other->verbs == NULL);
	a = sin4("203.0.113.7", 0); /* TEST-NET-3: not this host's */
	CHECK(rdma_bind_addr(other, (struct sockaddr *)&a) == -1 && errno == EADDRNOTAVAIL);
	/* A join needs a UD id with a device (rdma_cm: EINVAL). */
	CHECK(rdma_join_multicast(other, (struct sockaddr *)&a, NULL) == -1 && errno == EINVAL);
	{
		/* An address of this host that is not the device's: ENODEV, as Linux answers for an
		 * interface without an RDMA device; the first non-loopback IPv4 one, where the host
		 * has one. */
		struct ifaddrs *ifs, *i;
		int tried = 0;
		CHECK(getifaddrs(&ifs) == 0);
		for (i = ifs; i && !tried; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK))
				continue;
			CHECK(rdma_bind_addr(other, i->ifa_addr) == -1 && errno == ENODEV);
			tried = 1;
		}
		freeifaddrs(ifs);
		if (!tried)
			printf("cm_edges: no non-loopback IPv4 address here; its ENODEV not checked\n");
	}
	/* Another loopback address binds with no device, as the any address does: Linux's
	 * rdma_cm binds an address of `lo` so (libfabric's verbs provider binds "localhost"). A
	 * listener there takes only requests addressed to it: one to the device's address on its
	 * port is refused (REJ reason 28, as Linux's CM answers when no listener's address
	 * matches). */
	a = sin4("127.0.0.34", 7176);
	CHECK(rdma_bind_addr(other, (struct sockaddr *)&a) == 0 && other->verbs == NULL);
	CHECK(rdma_get_src_port(other) == htons(7176));
	CHECK(rdma_listen(other, 8) == 0);
	c = client(7176);
	CHECK(rdma_connect(c, NULL) == 0);
	e = next(RDMA_CM_EVENT_REJECTED);
	CHECK(e->id == c && e->status == 28);
	rdma_ack_cm_event(e);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);
	CHECK(rdma_destroy_id(other) == 0);
	CHECK(rdma_listen(listener, 8) == 0);

	/* rdma_create_srq_ex: a basic SRQ on the id's PD; the type is required; an XRC SRQ gets
	   the device's XRC domain and a CQ made for it (librdmacm's ucma_get_xrcd and
	   ucma_create_cqs). */
	{
		struct ibv_srq_init_attr_ex sa;
		memset(&sa, 0, sizeof sa);
		sa.attr.max_wr = 8;
		sa.attr.max_sge = 1;
		CHECK(rdma_create_srq_ex(listener, &sa) == -1 && errno == EINVAL);
		sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
		sa.srq_type = IBV_SRQT_XRC;
		int xrc = rdma_create_srq_ex(listener, &sa);
		if (xrc)
			perror("rdma_create_srq_ex XRC");
		CHECK(xrc == 0 && listener->srq && sa.xrcd && sa.cq == listener->recv_cq);
		uint32_t srqn = 0;
		CHECK(ibv_get_srq_num(listener->srq, &srqn) == 0 && srqn != 0);
		/* A second, larger one on the id's CQ, which grows to its size (librdmacm makes it a
		   CQ of its own size); the id's CQ stays while the first SRQ uses it. */
		struct ibv_srq *first = listener->srq;
		sa.attr.max_wr = 300;
		sa.cq = NULL;
		sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
		CHECK(rdma_create_srq_ex(listener, &sa) == 0 && listener->srq != first);
		CHECK(sa.cq == listener->recv_cq && listener->recv_cq->cqe >= 300);
		rdma_destroy_srq(listener);
		CHECK(listener->srq == NULL && listener->recv_cq != NULL);
		CHECK(ibv_destroy_srq(first) == 0);
		rdma_destroy_srq(listener);
		CHECK(listener->srq == NULL && listener->recv_cq == NULL);
		memset(&sa, 0, sizeof sa);
		sa.attr.max_wr = 8;
		sa.attr.max_sge = 1;
		sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
		sa.srq_type = IBV_SRQT_BASIC;
		CHECK(rdma_create_srq_ex(listener, &sa) == 0 && listener->srq && sa.pd == listener->pd);
		rdma_destroy_srq(listener);
		CHECK(listener->srq == NULL);
	}

	/* A port nobody listens on: REJ reason 8 (Invalid Service ID), as Linux's CM answers. */
	c = client(7175);
	CHECK(rdma_connect(c, NULL) == 0);
	e = next(RDMA_CM_EVENT_REJECTED);
	CHECK(e->id == c && e->status == 8);
	rdma_ack_cm_event(e);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);

	/* The listener rejects, with private data the client sees. */
	c = client(7174);
	memset(&p, 0, sizeof p);
	p.private_data = "reject me";
	p.private_data_len = 10;
	p.responder_resources = p.initiator_depth = 1;
	p.retry_count = p.rnr_retry_count = 7;
	CHECK(rdma_connect(c, &p) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(e->listen_id == listener && e->id != listener);
	CHECK(e->param.conn.private_data_len == 56 && memcmp(e->param.conn.private_data, "reject me", 10) == 0);
	s = e->id;
	rdma_ack_cm_event(e);
	{
		char big[200] = { 0 };
		CHECK(rdma_reject(s, big, sizeof big) == -1 && errno == EINVAL); /* a REJ holds 148 */
	}
	CHECK(rdma_reject(s, "nope", 5) == 0);
	e = next(RDMA_CM_EVENT_REJECTED);
	CHECK(e->id == c && e->status == 28 && e->param.conn.private_data_len == 148);
	CHECK(memcmp(e->param.conn.private_data, "nope", 5) == 0);
	rdma_ack_cm_event(e);
	/* A rejected connection's QP is in the error state (as Linux moves it). */
	{
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr qinit;
		CHECK(ibv_query_qp(c->qp, &qattr, IBV_QP_STATE, &qinit) == 0 && qattr.qp_state == IBV_QPS_ERR);
	}
	CHECK(rdma_destroy_id(s) == 0);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);

	/* Accepted, private data both ways; then a Send, and a disconnect. */
	c = client(7174);
	p.private_data = "hi there";
	p.private_data_len = 9;
	/* Reads toward the server, none the other way: the server sees them from its side
	 * (responder resources 4, initiator depth 0), as Linux's cm_format_req_event. */
	p.responder_resources = 0;
	p.initiator_depth = 4;
	CHECK(rdma_connect(c, &p) == 0);
	e = next(RDMA_CM_EVENT_CONNECT_REQUEST);
	s = e->id;
	CHECK(e->param.conn.qp_num == c->qp->qp_num);
	CHECK(e->param.conn.responder_resources == 4 && e->param.conn.initiator_depth == 0);
	CHECK(memcmp(e->param.conn.private_data, "hi there", 9) == 0);
	/* The request's id has both ends' addresses: its source is the listener's, its
	 * destination the client's. */
	CHECK(rdma_get_src_port(s) == htons(7174) && rdma_get_dst_port(s) == rdma_get_src_port(c));
	CHECK(((struct sockaddr_in *)rdma_get_peer_addr(s))->sin_addr.s_addr == inet_addr("127.0.0.33"));
	rdma_ack_cm_event(e);
	qa = rc_qp(4);
	CHECK(rdma_create_qp(s, NULL, &qa) == 0);
	CHECK((rmr = ibv_reg_mr(s->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	for (n = 0; n < 2; n++) {
		sge.addr = (uintptr_t)rbuf;
		sge.length = sizeof rbuf;
		sge.lkey = rmr->lkey;
		memset(&rwr, 0, sizeof rwr);
		rwr.wr_id = n;
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		CHECK(ibv_post_recv(s->qp, &rwr, &bad_r) == 0);
	}
	memset(&p, 0, sizeof p);
	p.private_data = "welcome";
	p.private_data_len = 8;
	p.responder_resources = RDMA_MAX_RESP_RES; /* the request's, bounded by the device */
	p.initiator_depth = RDMA_MAX_INIT_DEPTH;
	p.rnr_retry_count = 7;
	CHECK(rdma_accept(s, &p) == 0);
	e = next(RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->id == c && e->status == 0 && e->param.conn.private_data_len == 196);
	CHECK(memcmp(e->param.conn.private_data, "welcome", 8) == 0 && e->param.conn.qp_num == s->qp->qp_num);
	rdma_ack_cm_event(e);
	e = next(RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->id == s && e->status == 0);
	rdma_ack_cm_event(e);
	/* Each side sends from the PSN the other gave in its REQ or REP and receives from its
	 * own (as Linux's CM, and as the rxe captures show); read resources as negotiated. */
	{
		struct ibv_qp_attr ca, sa;
		struct ibv_qp_init_attr ci, si;
		int mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC |
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ACCESS_FLAGS | IBV_QP_DEST_QPN | IBV_QP_AV;
		/* The flow label of Linux's rdma_cm for RoCE (cma_get_roce_udp_flow_label): source
		 * port x 31 + destination port, 20 bits. The client's route has it, its REQ carries
		 * it, the server's route and both QPs' address vectors have the same. */
		uint32_t fl = ((uint32_t)ntohs(rdma_get_src_port(c)) * 31 + 7174) & 0xfffff;
		CHECK(ibv_query_qp(c->qp, &ca, mask, &ci) == 0 && ibv_query_qp(s->qp, &sa, mask, &si) == 0);
		CHECK(ca.qp_state == IBV_QPS_RTS && sa.qp_state == IBV_QPS_RTS);
		CHECK(ca.sq_psn == sa.rq_psn && sa.sq_psn == ca.rq_psn);
		CHECK(ca.dest_qp_num == s->qp->qp_num && sa.dest_qp_num == c->qp->qp_num);
		CHECK(ca.max_rd_atomic == 4 && sa.max_dest_rd_atomic == 4);
		CHECK(ca.max_dest_rd_atomic == 0 && sa.max_rd_atomic == 0);
		CHECK(sa.qp_access_flags & IBV_ACCESS_REMOTE_READ);
		CHECK(!(ca.qp_access_flags & IBV_ACCESS_REMOTE_READ));
		CHECK(c->route.path_rec->flow_label == htonl(fl) && s->route.path_rec->flow_label == htonl(fl));
		CHECK(ca.ah_attr.grh.flow_label == fl && sa.ah_attr.grh.flow_label == fl);
	}

	strcpy(buf, "over rdma_cm");
	CHECK((smr = ibv_reg_mr(c->pd, buf, sizeof buf, 0)) != NULL);
	sge.addr = (uintptr_t)buf;
	sge.length = 13;
	sge.lkey = smr->lkey;
	memset(&swr, 0, sizeof swr);
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(c->qp, &swr, &bad_s) == 0);
	while ((n = ibv_poll_cq(c->send_cq, 1, &wc)) == 0)
		;
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
	while ((n = ibv_poll_cq(s->recv_cq, 1, &wc)) == 0)
		;
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 13 && strcmp(rbuf, "over rdma_cm") == 0);

	/* The client disconnects: DISCONNECTED at the server at once, its QP flushed (its other
	 * receive completes in error); the client's only once the server disconnects too (its
	 * DREP), as on Linux; then both time waits end (TIMEWAIT_EXIT, rxe's 2026-11-29). */
	CHECK(rdma_disconnect(c) == 0);
	e = next(RDMA_CM_EVENT_DISCONNECTED);
	CHECK(e->id == s);
	rdma_ack_cm_event(e);
	while ((n = ibv_poll_cq(s->recv_cq, 1, &wc)) == 0)
		;
	CHECK(n == 1 && wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 1);
	struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pf, 1, 300) == 0); /* the client waits for the DREP */
	CHECK(rdma_disconnect(s) == 0);
	e = next(RDMA_CM_EVENT_DISCONNECTED);
	CHECK(e->id == c);
	rdma_ack_cm_event(e);
	e = next(RDMA_CM_EVENT_TIMEWAIT_EXIT);
	struct rdma_cm_id *first = e->id;
	rdma_ack_cm_event(e);
	e = next(RDMA_CM_EVENT_TIMEWAIT_EXIT);
	CHECK((first == s && e->id == c) || (first == c && e->id == s));
	rdma_ack_cm_event(e);

	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0 && rdma_destroy_id(c) == 0 && rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(ch);

	/* Ids and a channel the program destroyed (perftest 4.5's rdma_cm client retries a
	 * rejected connection with them): each call fails, none touches freed memory. */
	a = sin4("127.0.0.33", 7174);
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&a, 2000) == -1 && errno == EINVAL);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&a) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(s) == -1 && errno == EINVAL);
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EINVAL);
	CHECK(rdma_create_id(ch, &other, NULL, RDMA_PS_TCP) == -1 && errno == EINVAL);
	rdma_destroy_event_channel(ch); /* a second time: nothing happens */
	printf("cm_edges: ok\n");
	return 0;
}
