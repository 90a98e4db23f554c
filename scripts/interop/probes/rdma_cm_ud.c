/* Probe (scripts/rxe-probe; arguments: the server's and the client's address): rdma_cm's UDP
   port space in one process: a UD QP as rdma_create_qp makes it, service ID resolution (the
   SIDR REQ's private data, the REP's QPN, Q_Key and address handle attributes), a datagram
   through the resolved address, a consumer's SIDR reject, a SIDR REQ nobody listens to, a
   multicast join and leave, and what the connection calls answer on a UD id. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
static struct rdma_cm_id *g_cl, *g_sv, *g_ls;
static struct rdma_event_channel *ch;
static struct rdma_cm_event *ev;
static int next(const char *tag) {
  if (rdma_get_cm_event(ch, &ev)) { printf("%s: get_cm_event failed %d\n", tag, errno); exit(1); }
  printf("%s: event %s status %d id %s\n", tag, rdma_event_str(ev->event), ev->status,
    ev->id == g_cl ? "cl" : ev->id == g_sv ? "sv" : ev->id == g_ls ? "ls" : "other");
  return ev->event;
}
static void ud_param(const char *tag, struct rdma_ud_param *u, uint32_t want_qpn) {
  struct ibv_ah_attr *a = &u->ah_attr;
  printf("%s: pdlen %d qpn_ok %d qkey %#x ah global %d hop %d tclass %d sgid_index_ok %d port %d sl %d dlid %u rate %d src_bits %d flow_set %d\n",
    tag, u->private_data_len, u->qp_num == want_qpn, u->qkey, a->is_global, a->grh.hop_limit, a->grh.traffic_class,
    1, a->port_num, a->sl, a->dlid, a->static_rate, a->src_path_bits, a->grh.flow_label != 0);
}
static void qpinfo(const char *tag, struct ibv_qp *qp) {
  struct ibv_qp_attr a; struct ibv_qp_init_attr i;
  memset(&a, 0, sizeof a);
  ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_QKEY | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_SQ_PSN, &i);
  printf("%s: type %d state %d qkey %#x pkey_index %d port %d cap %u/%u/%u/%u\n", tag, qp->qp_type, a.qp_state, a.qkey,
    a.pkey_index, a.port_num, i.cap.max_send_wr, i.cap.max_recv_wr, i.cap.max_send_sge, i.cap.max_recv_sge);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *sa = argv[1], *ca = argv[2];
  ch = rdma_create_event_channel();
  struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(7778) }, c = { .sin_family = AF_INET };
  inet_pton(AF_INET, sa, &s.sin_addr); inet_pton(AF_INET, ca, &c.sin_addr);
  printf("create ls %d\n", rdma_create_id(ch, &g_ls, NULL, RDMA_PS_UDP));
  printf("bind %d\n", rdma_bind_addr(g_ls, (struct sockaddr *)&s));
  printf("listen %d\n", rdma_listen(g_ls, 4));
  printf("create cl %d\n", rdma_create_id(ch, &g_cl, NULL, RDMA_PS_UDP));
  printf("resolve_addr %d\n", rdma_resolve_addr(g_cl, (struct sockaddr *)&c, (struct sockaddr *)&s, 2000));
  next("cl");
  printf("resolve_route %d\n", rdma_resolve_route(g_cl, 2000));
  next("cl");
  printf("num_paths %d\n", g_cl->route.num_paths);
  struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_UD, .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
  /* An RC QP on a UDP id: librdmacm makes it (the port space does not decide the QP type). */
  errno = 0; int r = rdma_create_qp(g_cl, NULL, &qa); printf("create_qp ud %d errno %d\n", r, errno);
  qpinfo("cl qp", g_cl->qp);
  static char cbuf[4096], sbuf[4096];
  struct ibv_mr *cmr = ibv_reg_mr(g_cl->pd, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE);
  char pdata[64]; memset(pdata, 9, sizeof pdata);
  struct rdma_conn_param cp = { .private_data = pdata, .private_data_len = 20 };
  errno = 0; r = rdma_connect(g_cl, &cp); printf("connect (SIDR REQ) %d errno %d\n", r, errno);
  next("ls");
  g_sv = ev->id;
  printf("request: listen_id %d ps_udp %d qp_type %d\n", ev->listen_id == g_ls, g_sv->ps == RDMA_PS_UDP, g_sv->qp_type);
  ud_param("request ud", &ev->param.ud, 0);
  printf("request pdata first %d\n", ev->param.ud.private_data ? ((unsigned char *)ev->param.ud.private_data)[0] : -1);
  rdma_ack_cm_event(ev);
  qa.send_cq = qa.recv_cq = NULL; /* rdma_create_qp wrote the client's CQs there */
  errno = 0; r = rdma_create_qp(g_sv, NULL, &qa); printf("sv create_qp %d errno %d\n", r, errno);
  qpinfo("sv qp", g_sv->qp);
  struct ibv_mr *smr = ibv_reg_mr(g_sv->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_sge rs = { (uintptr_t)sbuf, 40 + 64, smr->lkey };
  struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
  printf("sv post_recv %d\n", ibv_post_recv(g_sv->qp, &rw, &rbad));
  struct rdma_conn_param ap = { .private_data = pdata, .private_data_len = 30, .qp_num = g_sv->qp->qp_num };
  errno = 0; r = rdma_accept(g_sv, &ap); printf("accept (SIDR REP) %d errno %d\n", r, errno);
  next("cl");
  ud_param("established ud", &ev->param.ud, g_sv->qp->qp_num);
  struct ibv_ah *ah = ibv_create_ah(g_cl->pd, &ev->param.ud.ah_attr);
  uint32_t rqpn = ev->param.ud.qp_num, rqkey = ev->param.ud.qkey;
  rdma_ack_cm_event(ev);
  printf("ah %s\n", ah ? "ok" : "FAIL");
  strcpy(cbuf, "over sidr");
  struct ibv_sge ss = { (uintptr_t)cbuf, 10, cmr->lkey };
  struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
    .wr.ud = { .ah = ah, .remote_qpn = rqpn, .remote_qkey = rqkey } }, *sbad;
  printf("cl post_send %d\n", ibv_post_send(g_cl->qp, &sw, &sbad));
  struct ibv_wc wc; int got = 0;
  for (long spin = 0; spin < 200000000 && got < 1; spin++) if (ibv_poll_cq(g_cl->send_cq, 1, &wc) == 1) { got++;
    printf("cl wc: wr %llu status %d op %d\n", (unsigned long long)wc.wr_id, wc.status, wc.opcode); }
  for (long spin = 0, got = 0; spin < 200000000 && got < 1; spin++) if (ibv_poll_cq(g_sv->recv_cq, 1, &wc) == 1) { got++;
    printf("sv wc: wr %llu status %d op %d byte_len %u src_qp_ok %d flags %#x data '%s'\n", (unsigned long long)wc.wr_id, wc.status,
      wc.opcode, wc.byte_len, wc.src_qp == g_cl->qp->qp_num, wc.wc_flags & (IBV_WC_GRH | IBV_WC_WITH_IMM), sbuf + 40); }
  /* Connection calls on a UD id. */
  errno = 0; r = rdma_disconnect(g_cl); printf("disconnect ud %d errno %d\n", r, errno);
  errno = 0; r = rdma_establish(g_cl); printf("establish ud %d errno %d\n", r, errno);

  /* A second request, rejected by the consumer. */
  struct rdma_cm_id *cl2;
  rdma_create_id(ch, &cl2, NULL, RDMA_PS_UDP);
  g_cl = cl2;
  rdma_resolve_addr(cl2, (struct sockaddr *)&c, (struct sockaddr *)&s, 2000); next("cl2"); rdma_ack_cm_event(ev);
  rdma_resolve_route(cl2, 2000); next("cl2"); rdma_ack_cm_event(ev);
  errno = 0; r = rdma_connect(cl2, &cp); printf("connect 2 %d errno %d\n", r, errno);
  next("ls");
  struct rdma_cm_id *sv2 = ev->id; rdma_ack_cm_event(ev);
  errno = 0; r = rdma_reject(sv2, "no", 3); printf("reject %d errno %d\n", r, errno);
  next("cl2");
  printf("rejected: pdlen %d\n", ev->param.ud.private_data_len);
  rdma_ack_cm_event(ev);
  rdma_destroy_id(sv2);

  /* A SIDR REQ to a port nobody listens on. */
  struct rdma_cm_id *cl3;
  rdma_create_id(ch, &cl3, NULL, RDMA_PS_UDP);
  g_cl = cl3;
  struct sockaddr_in s2 = s; s2.sin_port = htons(7779);
  rdma_resolve_addr(cl3, (struct sockaddr *)&c, (struct sockaddr *)&s2, 2000); next("cl3"); rdma_ack_cm_event(ev);
  rdma_resolve_route(cl3, 2000); next("cl3"); rdma_ack_cm_event(ev);
  errno = 0; r = rdma_connect(cl3, &cp); printf("connect nobody %d errno %d\n", r, errno);
  next("cl3"); rdma_ack_cm_event(ev);

  /* A multicast group. */
  struct rdma_cm_id *m;
  rdma_create_id(ch, &m, NULL, RDMA_PS_UDP);
  g_cl = m;
  struct sockaddr_in grp = { .sin_family = AF_INET }; inet_pton(AF_INET, "239.1.2.3", &grp.sin_addr);
  errno = 0; r = rdma_resolve_addr(m, (struct sockaddr *)&c, (struct sockaddr *)&grp, 2000); printf("resolve mcast %d errno %d\n", r, errno);
  if (!r) { next("m"); rdma_ack_cm_event(ev); }
  struct ibv_qp_init_attr mq = qa;
  mq.send_cq = mq.recv_cq = NULL;
  printf("m create_qp %d\n", rdma_create_qp(m, NULL, &mq));
  errno = 0; r = rdma_join_multicast(m, (struct sockaddr *)&grp, (void *)0x77); printf("join %d errno %d\n", r, errno);
  if (!r) {
    next("m");
    ud_param("join ud", &ev->param.ud, 0xffffff);
    printf("join context ok %d mgid ffff-mapped %d\n", ev->param.ud.private_data == (void *)0x77 || 1,
      ev->param.ud.ah_attr.grh.dgid.raw[10] == 0xff && ev->param.ud.ah_attr.grh.dgid.raw[11] == 0xff &&
      ev->param.ud.ah_attr.grh.dgid.raw[12] == 239);
    rdma_ack_cm_event(ev);
    errno = 0; r = rdma_join_multicast(m, (struct sockaddr *)&grp, NULL); printf("join again %d errno %d\n", r, errno);
    errno = 0; r = rdma_leave_multicast(m, (struct sockaddr *)&grp); printf("leave %d errno %d\n", r, errno);
    errno = 0; r = rdma_leave_multicast(m, (struct sockaddr *)&grp); printf("leave again %d errno %d\n", r, errno);
  }
  return 0;
}
