/* Probe (scripts/rxe-probe; arguments: the server's and the client's address): rdma_cm in one
   process: bind and listen answers, address and route resolution (the path record), connect
   and accept with private data, the QPs' attributes, a disconnect and who hears of it when,
   the time waits, a REQ nobody listens to, a consumer's reject, a foreign address. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <poll.h>
static struct rdma_cm_id *g_cl, *g_sv;
static struct rdma_event_channel *ch;
static struct rdma_cm_event *ev;
static int next(const char *tag) {
  if (rdma_get_cm_event(ch, &ev)) { printf("%s: get_cm_event failed %d\n", tag, errno); return -1; }
  printf("%s: event %s status %d pdlen %d id_is_listen %d id %s\n", tag, rdma_event_str(ev->event), ev->status,
    ev->param.conn.private_data_len, ev->listen_id != NULL, ev->id == g_cl ? "cl" : ev->id == g_sv ? "sv" : "other");
  return ev->event;
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  const char *sa = argv[1], *ca = argv[2];
  ch = rdma_create_event_channel();
  struct rdma_cm_id *ls, *cl, *cl2, *x;
  struct sockaddr_in s = { .sin_family = AF_INET, .sin_port = htons(7777) }, c = { .sin_family = AF_INET };
  inet_pton(AF_INET, sa, &s.sin_addr); inet_pton(AF_INET, ca, &c.sin_addr);
  rdma_create_id(ch, &ls, NULL, RDMA_PS_TCP);
  printf("bind %d\n", rdma_bind_addr(ls, (struct sockaddr *)&s));
  printf("listen %d\n", rdma_listen(ls, 4));
  rdma_create_id(ch, &x, NULL, RDMA_PS_TCP);
  errno = 0; int r = rdma_bind_addr(x, (struct sockaddr *)&s); printf("bind same port %d errno %d\n", r, errno);
  errno = 0; r = rdma_listen(x, 1); printf("listen unbound-after-failed-bind %d errno %d\n", r, errno);
  rdma_destroy_id(x);
  rdma_create_id(ch, &x, NULL, RDMA_PS_UDP);
  errno = 0; r = rdma_bind_addr(x, (struct sockaddr *)&s); printf("bind same port, UDP ps %d errno %d\n", r, errno);
  rdma_destroy_id(x);
  /* client */
  rdma_create_id(ch, &cl, NULL, RDMA_PS_TCP);
  printf("resolve_addr %d\n", rdma_resolve_addr(cl, (struct sockaddr *)&c, (struct sockaddr *)&s, 2000));
  next("cl");
  printf("src port nonzero %d dst port %d\n", ntohs(rdma_get_src_port(cl)) != 0, ntohs(rdma_get_dst_port(cl)));
  printf("resolve_route %d\n", rdma_resolve_route(cl, 2000));
  next("cl");
  struct ibv_sa_path_rec *p = cl->route.path_rec;
  printf("num_paths %d mtu %d hop %d tclass %d pkey %#x sl %d rate %d plt %d mtu_sel %d rate_sel %d plt_sel %d reversible %d numb_path %d flow_set %d raw %d preference %d\n",
    cl->route.num_paths, p->mtu, p->hop_limit, p->traffic_class, ntohs(p->pkey), p->sl, p->rate, p->packet_life_time,
    p->mtu_selector, p->rate_selector, p->packet_life_time_selector, p->reversible, p->numb_path, p->flow_label != 0, p->raw_traffic, p->preference);
  printf("dlid %u slid %u\n", ntohs(p->dlid), ntohs(p->slid));
  printf("port_num %d verbs %d\n", cl->port_num, cl->verbs != NULL);
  struct ibv_pd *pd = ibv_alloc_pd(cl->verbs);
  struct ibv_cq *cq = ibv_create_cq(cl->verbs, 16, NULL, NULL, 0);
  struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
  printf("create_qp %d\n", rdma_create_qp(cl, pd, &qa));
  struct ibv_qp_attr a; struct ibv_qp_init_attr ia; ibv_query_qp(cl->qp, &a, IBV_QP_STATE, &ia); printf("qp state after create %d\n", a.qp_state);
  char pdata[200]; memset(pdata, 7, sizeof pdata);
  struct rdma_conn_param cp = { .private_data = pdata, .private_data_len = 56, .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
  printf("connect %d\n", rdma_connect(cl, &cp));
  int e = next("ls");
  struct rdma_cm_id *sv = ev->id;
  printf("req: resp_res %d init_depth %d retry %d rnr %d srq %d qpn_nonzero %d\n", ev->param.conn.responder_resources, ev->param.conn.initiator_depth,
    ev->param.conn.retry_count, ev->param.conn.rnr_retry_count, ev->param.conn.srq, ev->param.conn.qp_num != 0);
  rdma_ack_cm_event(ev);
  struct ibv_pd *pd2 = ibv_alloc_pd(sv->verbs);
  struct ibv_cq *cq2 = ibv_create_cq(sv->verbs, 16, NULL, NULL, 0);
  qa.send_cq = qa.recv_cq = cq2;
  printf("create_qp sv %d\n", rdma_create_qp(sv, pd2, &qa));
  struct rdma_conn_param ap = { .private_data = pdata, .private_data_len = 196, .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7 };
  errno = 0; r = rdma_accept(sv, &ap); printf("accept pdlen 196 %d errno %d\n", r, errno);
  if (r) { ap.private_data_len = 100; printf("accept pdlen 100 %d\n", rdma_accept(sv, &ap)); }
  next("a"); rdma_ack_cm_event(ev);
  next("b"); rdma_ack_cm_event(ev);
  ibv_query_qp(cl->qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_AV, &ia);
  printf("cl qp: state %d mtu %d timeout %d retry %d rnr %d rd %d dest_rd %d min_rnr %d hop %d tclass %d sl %d\n", a.qp_state, a.path_mtu, a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer, a.ah_attr.grh.hop_limit, a.ah_attr.grh.traffic_class, a.ah_attr.sl);
  ibv_query_qp(sv->qp, &a, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_AV, &ia);
  printf("sv qp: state %d mtu %d timeout %d retry %d rnr %d rd %d dest_rd %d min_rnr %d hop %d tclass %d sl %d\n", a.qp_state, a.path_mtu, a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer, a.ah_attr.grh.hop_limit, a.ah_attr.grh.traffic_class, a.ah_attr.sl);
  errno = 0; r = rdma_connect(cl, &cp); printf("connect again %d errno %d\n", r, errno);
  g_cl = cl; g_sv = sv;
  printf("disconnect %d\n", rdma_disconnect(cl));
  struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
  while (poll(&pf, 1, 3000) == 1) { next("d"); rdma_ack_cm_event(ev); }
  printf("-- 3 s quiet; server disconnects\n");
  printf("sv disconnect %d\n", rdma_disconnect(sv));
  while (poll(&pf, 1, 3000) == 1) { next("d"); rdma_ack_cm_event(ev); }
  printf("-- 3 s quiet\n");
  errno = 0; r = rdma_disconnect(cl); printf("disconnect again %d errno %d\n", r, errno);
  ibv_query_qp(cl->qp, &a, IBV_QP_STATE, &ia); printf("cl qp after disconnect %d\n", a.qp_state);
  /* connect to a port nobody listens on */
  rdma_create_id(ch, &cl2, NULL, RDMA_PS_TCP);
  s.sin_port = htons(7778);
  rdma_resolve_addr(cl2, (struct sockaddr *)&c, (struct sockaddr *)&s, 2000); next("c2"); rdma_ack_cm_event(ev);
  rdma_resolve_route(cl2, 2000); next("c2"); rdma_ack_cm_event(ev);
  struct rdma_conn_param cp2 = { .responder_resources = 1, .initiator_depth = 1, .qp_num = 0x123 };
  printf("connect no listener %d\n", rdma_connect(cl2, &cp2));
  next("c2"); printf("rej pdlen %d\n", ev->param.conn.private_data_len); rdma_ack_cm_event(ev);
  /* reject with private data */
  rdma_create_id(ch, &cl2, NULL, RDMA_PS_TCP);
  s.sin_port = htons(7777);
  rdma_resolve_addr(cl2, (struct sockaddr *)&c, (struct sockaddr *)&s, 2000); next("c3"); rdma_ack_cm_event(ev);
  rdma_resolve_route(cl2, 2000); next("c3"); rdma_ack_cm_event(ev);
  printf("connect %d\n", rdma_connect(cl2, &cp2));
  next("ls3"); struct rdma_cm_id *sv3 = ev->id; rdma_ack_cm_event(ev);
  printf("reject %d\n", rdma_reject(sv3, "nope", 5));
  next("c3"); printf("rej pdlen %d data %.4s\n", ev->param.conn.private_data_len, ev->param.conn.private_data ? (char *)ev->param.conn.private_data : "-"); rdma_ack_cm_event(ev);
  /* unreachable/unowned source address bind */
  rdma_create_id(ch, &x, NULL, RDMA_PS_TCP);
  struct sockaddr_in bad = { .sin_family = AF_INET }; inet_pton(AF_INET, "10.99.99.99", &bad.sin_addr);
  errno = 0; r = rdma_bind_addr(x, (struct sockaddr *)&bad); printf("bind foreign addr %d errno %d\n", r, errno);
  errno = 0; r = rdma_resolve_addr(x, NULL, (struct sockaddr *)&bad, 500); printf("resolve foreign dst %d errno %d\n", r, errno);
  if (!r) { next("x"); rdma_ack_cm_event(ev); }
  return 0;
}
