/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): completion
   notification (an event per arming, solicited-only arming against unsolicited and solicited
   Sends, events acknowledged), a CQ resized with completions in it, an SRQ's limit, fill and
   resize, an SRQ destroyed while a QP uses it, and UC: a Send with no receive posted (dropped,
   the sender done), a Write with immediate with none, then one with a receive. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <poll.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
static struct ibv_context *c; static struct ibv_pd *pd; static union ibv_gid gid; static int gi;
static char *buf; static struct ibv_mr *mr;
static void pw(const char *tag, struct ibv_wc *w) {
  printf("%s: wr %llu status %d(%s) op %d byte_len %u imm %#x\n", tag, (unsigned long long)w->wr_id, w->status,
    ibv_wc_status_str(w->status), w->status ? -1 : (int)w->opcode, w->status ? 0 : w->byte_len,
    (w->wc_flags & IBV_WC_WITH_IMM) ? ntohl(w->imm_data) : 0);
}
static int drain(struct ibv_cq *cq, const char *tag, int want) {
  struct ibv_wc w[16]; int n = 0;
  for (long spin = 0; spin < 50000000 && n < want && n < 16; spin++) if (ibv_poll_cq(cq, 1, &w[n]) == 1) { n++; spin = 0; }
  for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++) if (w[j].wr_id < w[i].wr_id) { struct ibv_wc t = w[i]; w[i] = w[j]; w[j] = t; }
  for (int i = 0; i < n; i++) pw(tag, &w[i]);
  if (n < want) printf("%s: %d of %d completions\n", tag, n, want);
  return n;
}
/* Whether the channel has an event within `ms`, and which CQ. */
static int event(struct ibv_comp_channel *ch, const char *tag, int ms, struct ibv_cq *mine) {
  struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
  if (poll(&pf, 1, ms) != 1) { printf("%s: no event\n", tag); return 0; }
  struct ibv_cq *got; void *ctx;
  if (ibv_get_cq_event(ch, &got, &ctx)) { printf("%s: get_cq_event failed %d\n", tag, errno); return 0; }
  printf("%s: event on %s\n", tag, got == mine ? "the CQ" : "another CQ");
  ibv_ack_cq_events(got, 1);
  return 1;
}
static struct ibv_qp *mkqp(int type, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq) {
  struct ibv_qp_init_attr a = { .send_cq = scq, .recv_cq = rcq, .srq = srq, .qp_type = type };
  a.cap.max_send_wr = 16; a.cap.max_recv_wr = srq ? 0 : 16; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
  return ibv_create_qp(pd, &a);
}
static int to(struct ibv_qp *q, int state, int dqpn) {
  struct ibv_qp_attr m = { .qp_state = state };
  int mask = IBV_QP_STATE, rc = q->qp_type == IBV_QPT_RC;
  if (state == IBV_QPS_INIT) {
    m.port_num = 1; m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (state == IBV_QPS_RTR) {
    m.path_mtu = IBV_MTU_1024; m.dest_qp_num = dqpn;
    m.ah_attr = (struct ibv_ah_attr){ .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 };
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (rc) { m.max_dest_rd_atomic = 1; m.min_rnr_timer = 1; mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER; }
  } else if (state == IBV_QPS_RTS) {
    mask |= IBV_QP_SQ_PSN;
    if (rc) { m.timeout = 10; m.retry_cnt = 1; m.rnr_retry = 1; m.max_rd_atomic = 1; mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC; }
  }
  return ibv_modify_qp(q, &m, mask);
}
static void pair(struct ibv_qp *a, struct ibv_qp *b) {
  if (to(a, IBV_QPS_INIT, 0) | to(b, IBV_QPS_INIT, 0) | to(a, IBV_QPS_RTR, b->qp_num) | to(b, IBV_QPS_RTR, a->qp_num) |
      to(a, IBV_QPS_RTS, 0) | to(b, IBV_QPS_RTS, 0))
    printf("connect failed\n");
}
static int post1(struct ibv_qp *q, uint64_t id, int op, int flags) {
  struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey };
  struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op, .send_flags = flags, .imm_data = htonl(id) }, *bad;
  w.wr.rdma.remote_addr = (uintptr_t)buf + 8192; w.wr.rdma.rkey = mr->rkey;
  return ibv_post_send(q, &w, &bad);
}
static int postr(struct ibv_qp *q, uint64_t id) {
  struct ibv_sge s = { .addr = (uintptr_t)buf + 4096, .length = 64, .lkey = mr->lkey };
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad; return ibv_post_recv(q, &r, &bad);
}
static int postsrq(struct ibv_srq *q, uint64_t id) {
  struct ibv_sge s = { .addr = (uintptr_t)buf + 4096, .length = 64, .lkey = mr->lkey };
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad; return ibv_post_srq_recv(q, &r, &bad);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c);
  ibv_query_gid(c, 1, gi, &gid);
  buf = aligned_alloc(4096, 1 << 16); memset(buf, 0, 1 << 16);
  mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);

  /* Notification. */
  struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
  struct ibv_cq *scq = ibv_create_cq(c, 64, NULL, NULL, 0), *rcq = ibv_create_cq(c, 64, NULL, ch, 0);
  struct ibv_qp *a = mkqp(IBV_QPT_RC, scq, scq, NULL), *b = mkqp(IBV_QPT_RC, scq, rcq, NULL); pair(a, b);
  for (int i = 0; i < 8; i++) postr(b, 100 + i);
  post1(a, 1, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(scq, "unarmed send", 1);
  event(ch, "unarmed", 200, rcq);
  drain(rcq, "unarmed recv", 1);
  printf("arm %d\n", ibv_req_notify_cq(rcq, 0));
  post1(a, 2, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(scq, "armed send", 1);
  event(ch, "armed", 2000, rcq);
  event(ch, "armed, second look", 200, rcq);
  post1(a, 3, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(scq, "after event send", 1);
  event(ch, "not rearmed", 200, rcq);
  drain(rcq, "recvs", 2);
  printf("arm solicited %d\n", ibv_req_notify_cq(rcq, 1));
  post1(a, 4, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(scq, "unsolicited send", 1);
  event(ch, "solicited-only, unsolicited", 300, rcq);
  post1(a, 5, IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED); drain(scq, "solicited send", 1);
  event(ch, "solicited-only, solicited", 2000, rcq);
  drain(rcq, "recvs", 2);
  printf("arm solicited %d\n", ibv_req_notify_cq(rcq, 1));
  post1(a, 6, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED); drain(scq, "write_imm", 1);
  event(ch, "solicited-only, write_imm", 300, rcq);
  printf("arm any %d\n", ibv_req_notify_cq(rcq, 0));
  event(ch, "arm with one waiting", 300, rcq);
  drain(rcq, "recvs", 1);
  /* An error completion on an armed solicited-only CQ. */
  printf("arm solicited %d\n", ibv_req_notify_cq(rcq, 1));
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_ERR }; ibv_modify_qp(b, &m, IBV_QP_STATE);
  event(ch, "solicited-only, flush", 2000, rcq);
  drain(rcq, "flushed", 3);

  /* Resize with completions in it. */
  struct ibv_cq *cq2 = ibv_create_cq(c, 8, NULL, NULL, 0);
  struct ibv_qp *a2 = mkqp(IBV_QPT_RC, cq2, cq2, NULL), *b2 = mkqp(IBV_QPT_RC, cq2, cq2, NULL); pair(a2, b2);
  for (int i = 0; i < 3; i++) post1(a2, 10 + i, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED);
  for (long spin = 0; spin < 20000000; spin++) ;
  errno = 0; int r = ibv_resize_cq(cq2, 2); printf("resize below held %d errno %d cqe %d\n", r, errno, cq2->cqe);
  errno = 0; r = ibv_resize_cq(cq2, 40); printf("resize up %d cqe %d\n", r, cq2->cqe);
  drain(cq2, "after resize", 3);

  /* SRQ: limit, fill, resize, destroy in use. */
  struct ibv_cq *cq3 = ibv_create_cq(c, 64, NULL, NULL, 0);
  struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  printf("srq max_wr %u\n", sa.attr.max_wr);
  int posted = 0; while (posted < 64 && postsrq(srq, 200 + posted) == 0) posted++;
  printf("srq took %d\n", posted);
  struct ibv_srq_attr q; ibv_query_srq(srq, &q); printf("srq query max_wr %u limit %u\n", q.max_wr, q.srq_limit);
  struct ibv_srq_attr sl = { .srq_limit = 100 }; errno = 0; r = ibv_modify_srq(srq, &sl, IBV_SRQ_LIMIT); printf("limit above max %d errno %d\n", r, errno);
  sl.max_wr = 2; errno = 0; r = ibv_modify_srq(srq, &sl, IBV_SRQ_MAX_WR); printf("resize below posted %d errno %d\n", r, errno);
  sl.max_wr = 64; errno = 0; r = ibv_modify_srq(srq, &sl, IBV_SRQ_MAX_WR); printf("resize up %d errno %d\n", r, errno);
  ibv_query_srq(srq, &q); printf("srq query max_wr %u\n", q.max_wr);
  struct ibv_qp *a3 = mkqp(IBV_QPT_RC, cq3, cq3, NULL), *b3 = mkqp(IBV_QPT_RC, cq3, cq3, srq); pair(a3, b3);
  post1(a3, 20, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(cq3, "srq send", 2);
  errno = 0; r = ibv_destroy_srq(srq); printf("destroy srq in use %d errno %d\n", r, errno);

  /* UC: nothing posted, the message is dropped; then a Write with immediate. */
  struct ibv_cq *cq4 = ibv_create_cq(c, 64, NULL, NULL, 0);
  struct ibv_qp *u1 = mkqp(IBV_QPT_UC, cq4, cq4, NULL), *u2 = mkqp(IBV_QPT_UC, cq4, cq4, NULL); pair(u1, u2);
  post1(u1, 30, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(cq4, "uc send, no recv", 2);
  post1(u1, 31, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED); drain(cq4, "uc write_imm, no recv", 2);
  postr(u2, 32);
  post1(u1, 33, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED); drain(cq4, "uc write_imm", 2);
  postr(u2, 34);
  post1(u1, 35, IBV_WR_SEND, IBV_SEND_SIGNALED); drain(cq4, "uc send", 2);
  ibv_query_qp(u2, &(struct ibv_qp_attr){ 0 }, IBV_QP_STATE, &(struct ibv_qp_init_attr){ 0 });
  struct ibv_qp_attr qa; struct ibv_qp_init_attr qi; ibv_query_qp(u2, &qa, IBV_QP_STATE, &qi); printf("uc receiver state %d\n", qa.qp_state);
  return 0;
}
