/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): the
   asynchronous events of a Send reaching an RTR QP, an RDMA Write with a bad R_Key, an SRQ
   below its limit, an SRQ-attached QP entering Error, a CQ overrun, a retry count exhausted. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <poll.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
static struct ibv_context *c; static struct ibv_pd *pd; static union ibv_gid gid; static int gi; static char *buf; static struct ibv_mr *mr;
static struct ibv_qp *qs[8]; static const char *qn[8]; static int nq;
static const char *name(void *p) { for (int i = 0; i < nq; i++) if (qs[i] == p) return qn[i]; return "?"; }
static void events(const char *tag, int ms) {
  struct pollfd pf = { .fd = c->async_fd, .events = POLLIN };
  while (poll(&pf, 1, ms) == 1) {
    struct ibv_async_event e;
    if (ibv_get_async_event(c, &e)) break;
    printf("%s: async %s (%d) on %s\n", tag, ibv_event_type_str(e.event_type), e.event_type,
      e.event_type == IBV_EVENT_CQ_ERR ? "cq" : e.event_type == IBV_EVENT_SRQ_LIMIT_REACHED || e.event_type == IBV_EVENT_SRQ_ERR ? "srq" :
      e.event_type == IBV_EVENT_PORT_ACTIVE || e.event_type == IBV_EVENT_PORT_ERR || e.event_type == IBV_EVENT_GID_CHANGE ? "port" : name(e.element.qp));
    ibv_ack_async_event(&e);
    ms = 300;
  }
  printf("%s: (quiet)\n", tag);
}
static struct ibv_qp *mkqp(const char *n, struct ibv_cq *cq, struct ibv_srq *srq) {
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC };
  a.cap.max_send_wr = 8; a.cap.max_recv_wr = srq ? 0 : 8; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
  struct ibv_qp *q = ibv_create_qp(pd, &a); qs[nq] = q; qn[nq++] = n; return q;
}
static void conn(struct ibv_qp *q, int dqpn) {
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
  ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn, .max_dest_rd_atomic = 1, .min_rnr_timer = 1,
    .ah_attr = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 } };
  ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}
static void rts(struct ibv_qp *q) {
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTS, .timeout = 10, .retry_cnt = 1, .rnr_retry = 1, .max_rd_atomic = 1 };
  ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}
static int drain(struct ibv_cq *cq, int want) { struct ibv_wc w; int n = 0; for (long s = 0; s < 100000000 && n < want; s++) if (ibv_poll_cq(cq, 1, &w) == 1) { printf("  wc %llu status %d\n", (unsigned long long)w.wr_id, w.status); n++; } return n; }
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c); ibv_query_gid(c, 1, gi, &gid);
  buf = aligned_alloc(4096, 65536); memset(buf, 0, 65536);
  mr = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  events("open", 300);
  struct ibv_cq *cq = ibv_create_cq(c, 64, NULL, NULL, 0);
  /* 1: bad rkey write: responder's async event */
  struct ibv_qp *a = mkqp("a", cq, NULL), *b = mkqp("b", cq, NULL);
  conn(a, b->qp_num); conn(b, a->qp_num);
  /* COMM_EST: a send arriving at b while b is in RTR */
  struct ibv_sge rs = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
  struct ibv_recv_wr rw = { .wr_id = 100, .sg_list = &rs, .num_sge = 1 }, *rbad;
  ibv_post_recv(b, &rw, &rbad);
  rts(a);
  struct ibv_sge s = { .addr = (uintptr_t)buf + 1024, .length = 8, .lkey = mr->lkey };
  struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
  ibv_post_send(a, &w, &bad); drain(cq, 2);
  events("send to RTR", 300);
  rts(b);
  w = (struct ibv_send_wr){ .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf, .rkey = mr->rkey ^ 0x80 } };
  ibv_post_send(a, &w, &bad); drain(cq, 1);
  events("bad rkey write", 300);
  /* 2: SRQ limit and last WQE */
  struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  for (int i = 0; i < 4; i++) { rw.wr_id = 200 + i; ibv_post_srq_recv(srq, &rw, &rbad); }
  struct ibv_srq_attr la = { .srq_limit = 3 }; printf("arm limit %d\n", ibv_modify_srq(srq, &la, IBV_SRQ_LIMIT));
  struct ibv_qp *x = mkqp("x", cq, NULL), *y = mkqp("y(srq)", cq, srq);
  conn(x, y->qp_num); conn(y, x->qp_num); rts(x); rts(y);
  w = (struct ibv_send_wr){ .wr_id = 3, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  ibv_post_send(x, &w, &bad); drain(cq, 2);
  events("srq at its limit", 300);
  w.wr_id = 5;
  ibv_post_send(x, &w, &bad); drain(cq, 2);
  events("srq below its limit", 300);
  w.wr_id = 6;
  ibv_post_send(x, &w, &bad); drain(cq, 2);
  events("srq below, not re-armed", 300);
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR };
  ibv_modify_qp(y, &m, IBV_QP_STATE);
  events("srq qp to error", 300);
  /* 3: CQ overrun */
  struct ibv_cq *small = ibv_create_cq(c, 1, NULL, NULL, 0);
  struct ibv_qp *z = mkqp("z", small, NULL);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1 };
  ibv_modify_qp(z, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  for (int i = 0; i < 4; i++) { rw.wr_id = 300 + i; ibv_post_recv(z, &rw, &rbad); }
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR }; ibv_modify_qp(z, &m, IBV_QP_STATE);
  events("cq overrun", 300);
  /* 4: retry exceeded on requester (peer destroyed) */
  struct ibv_qp *p1 = mkqp("p1", cq, NULL), *p2 = mkqp("p2", cq, NULL);
  conn(p1, p2->qp_num); conn(p2, p1->qp_num); rts(p1); rts(p2);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR }; ibv_modify_qp(p2, &m, IBV_QP_STATE);
  drain(cq, 0);
  { struct ibv_wc ww; while (ibv_poll_cq(cq, 1, &ww) == 1); }
  w = (struct ibv_send_wr){ .wr_id = 4, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  ibv_post_send(p1, &w, &bad); drain(cq, 1);
  events("retry exceeded", 300);
  return 0;
}
