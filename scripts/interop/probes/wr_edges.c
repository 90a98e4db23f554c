/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): work
   requests at their edges: posting in each QP state (receive in Reset and Init, send in Init
   and RTR), zero-length Send, Write and Read (no SGE, and an SGE of length 0 with key 0), an
   unknown opcode, inline data past the QP's limit, an unsignaled request that fails (its
   completion comes anyway) and the flush after it (unsignaled ones flushed too), a Send with
   solicited event, RDMA Write with immediate into an SRQ, a Read past the region, an atomic
   at an address not 8-byte aligned, and a QP moved to Error by Modify QP with work queued. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
static struct ibv_context *c; static struct ibv_pd *pd; static struct ibv_cq *cq; static union ibv_gid gid; static int gi;
static char *buf; static struct ibv_mr *mr;
static void pw(const char *tag, struct ibv_wc *w) {
  printf("%s: wr %llu status %d(%s) op %d byte_len %u imm %#x wc_flags %#x\n", tag, (unsigned long long)w->wr_id, w->status,
    ibv_wc_status_str(w->status), w->status ? -1 : (int)w->opcode, w->status ? 0 : w->byte_len,
    (w->wc_flags & IBV_WC_WITH_IMM) ? ntohl(w->imm_data) : 0, w->wc_flags & (IBV_WC_WITH_IMM | IBV_WC_GRH));
}
/* Completions until `want` came or none for a while; sorted by wr_id so that the order the
   two QPs' completions interleave in does not show. */
static void drain(const char *tag, int want) {
  struct ibv_wc w[32]; int n = 0;
  for (long spin = 0; spin < 50000000 && n < want && n < 32; spin++) if (ibv_poll_cq(cq, 1, &w[n]) == 1) { n++; spin = 0; }
  for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++) if (w[j].wr_id < w[i].wr_id) { struct ibv_wc t = w[i]; w[i] = w[j]; w[j] = t; }
  for (int i = 0; i < n; i++) pw(tag, &w[i]);
  if (n < want) printf("%s: %d of %d completions\n", tag, n, want);
}
static void extra(const char *tag) {
  struct ibv_wc w; int n = 0;
  for (long spin = 0; spin < 3000000; spin++) if (ibv_poll_cq(cq, 1, &w) == 1) { pw(tag, &w); n++; }
  printf("%s: %d more\n", tag, n);
}
static struct ibv_qp *mkqp(struct ibv_srq *srq) {
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC };
  a.cap.max_send_wr = 16; a.cap.max_recv_wr = srq ? 0 : 16; a.cap.max_send_sge = 2; a.cap.max_recv_sge = 2; a.cap.max_inline_data = 32;
  return ibv_create_qp(pd, &a);
}
static int to(struct ibv_qp *q, int state, int dqpn) {
  struct ibv_qp_attr m = { .qp_state = state };
  int mask = IBV_QP_STATE;
  if (state == IBV_QPS_INIT) {
    m.port_num = 1; m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (state == IBV_QPS_RTR) {
    m.path_mtu = IBV_MTU_1024; m.dest_qp_num = dqpn; m.max_dest_rd_atomic = 4; m.min_rnr_timer = 1;
    m.ah_attr = (struct ibv_ah_attr){ .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 };
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  } else if (state == IBV_QPS_RTS) {
    m.timeout = 10; m.retry_cnt = 1; m.rnr_retry = 1; m.max_rd_atomic = 4;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(q, &m, mask);
}
static void pair(struct ibv_qp *a, struct ibv_qp *b) {
  if (to(a, IBV_QPS_INIT, 0) | to(b, IBV_QPS_INIT, 0) | to(a, IBV_QPS_RTR, b->qp_num) | to(b, IBV_QPS_RTR, a->qp_num) |
      to(a, IBV_QPS_RTS, 0) | to(b, IBV_QPS_RTS, 0))
    printf("connect failed\n");
}
static int post(struct ibv_qp *q, struct ibv_send_wr *w) { struct ibv_send_wr *bad = NULL; errno = 0; int r = ibv_post_send(q, w, &bad); return r; }
static int postr(struct ibv_qp *q, uint64_t id, void *addr, unsigned len) {
  struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad; errno = 0; return ibv_post_recv(q, &r, &bad);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c); cq = ibv_create_cq(c, 256, NULL, NULL, 0);
  ibv_query_gid(c, 1, gi, &gid);
  buf = aligned_alloc(4096, 1 << 16); memset(buf, 0, 1 << 16);
  mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 16, .lkey = mr->lkey };
  struct ibv_send_wr w;

  /* Posting by state. */
  struct ibv_qp *a = mkqp(NULL), *b = mkqp(NULL);
  int r = postr(a, 1, buf + 4096, 64); printf("post_recv in Reset %d errno %d\n", r, errno);
  w = (struct ibv_send_wr){ .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  r = post(a, &w); printf("post_send in Reset %d\n", r);
  to(a, IBV_QPS_INIT, 0);
  r = postr(a, 3, buf + 4096, 64); printf("post_recv in Init %d errno %d\n", r, errno);
  r = post(a, &w); printf("post_send in Init %d\n", r);
  to(a, IBV_QPS_RTR, b->qp_num);
  r = post(a, &w); printf("post_send in RTR %d\n", r);
  to(a, IBV_QPS_RESET, 0); extra("after reset");
  to(a, IBV_QPS_RTS, 0);
  pair(a, b);

  /* Zero lengths. */
  postr(b, 10, buf + 4096, 64);
  w = (struct ibv_send_wr){ .wr_id = 11, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED, .num_sge = 0 };
  printf("send no sge %d\n", post(a, &w)); drain("send0", 2);
  struct ibv_sge z = { .addr = 0, .length = 0, .lkey = 0 };
  w = (struct ibv_send_wr){ .wr_id = 12, .sg_list = &z, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = 0, .rkey = 0 } };
  printf("write 0 bytes, key 0 %d\n", post(a, &w)); drain("write0", 1);
  w.wr_id = 13; w.opcode = IBV_WR_RDMA_READ;
  printf("read 0 bytes, key 0 %d\n", post(a, &w)); drain("read0", 1);
  postr(b, 14, buf + 4096, 64);
  w = (struct ibv_send_wr){ .wr_id = 15, .sg_list = &z, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
    .imm_data = htonl(0x99), .wr.rdma = { .remote_addr = 0, .rkey = 0 } };
  printf("write_imm 0 bytes %d\n", post(a, &w)); drain("write_imm0", 2);

  /* Bad requests refused at post. */
  w = (struct ibv_send_wr){ .wr_id = 20, .sg_list = &s, .num_sge = 1, .opcode = 77, .send_flags = IBV_SEND_SIGNALED };
  r = post(a, &w); printf("opcode 77 %d\n", r); drain("opcode77", r ? 0 : 1);
  struct ibv_sge big = { .addr = (uintptr_t)buf, .length = 200, .lkey = mr->lkey };
  w = (struct ibv_send_wr){ .wr_id = 21, .sg_list = &big, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE };
  r = post(a, &w); printf("inline 200 %d\n", r);

  /* Solicited event flag reaches the receiver. */
  postr(b, 22, buf + 4096, 64);
  w = (struct ibv_send_wr){ .wr_id = 23, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED };
  printf("send solicited %d\n", post(a, &w)); drain("solicited", 2);

  /* Read past the region, atomic misaligned: each on its own pair (the QPs go to Error). */
  struct ibv_qp *a2 = mkqp(NULL), *b2 = mkqp(NULL); pair(a2, b2);
  w = (struct ibv_send_wr){ .wr_id = 30, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + (1 << 16) - 8, .rkey = mr->rkey } };
  printf("read past region %d\n", post(a2, &w));
  /* and two unsignaled behind it, flushed */
  struct ibv_send_wr w2 = { .wr_id = 31, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
  printf("unsignaled behind %d\n", post(a2, &w2)); w2.wr_id = 32; post(a2, &w2);
  drain("read past", 3); extra("read past");
  struct ibv_qp *a3 = mkqp(NULL), *b3 = mkqp(NULL); pair(a3, b3);
  struct ibv_sge s8 = { .addr = (uintptr_t)buf + 12288, .length = 8, .lkey = mr->lkey };
  w = (struct ibv_send_wr){ .wr_id = 40, .sg_list = &s8, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
    .wr.atomic = { .remote_addr = (uintptr_t)buf + 8196, .compare_add = 1, .rkey = mr->rkey } };
  printf("unsignaled misaligned atomic %d\n", post(a3, &w)); drain("misaligned", 1); extra("misaligned");
  /* An unsignaled request that fails: a Write with a bad R_Key. */
  struct ibv_qp *a4 = mkqp(NULL), *b4 = mkqp(NULL); pair(a4, b4);
  w = (struct ibv_send_wr){ .wr_id = 50, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey ^ 0x5500 } };
  printf("unsignaled bad rkey %d\n", post(a4, &w)); drain("unsig bad rkey", 1); extra("unsig bad rkey");

  /* Write with immediate into an SRQ. */
  struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  struct ibv_qp *a5 = mkqp(NULL), *b5 = mkqp(srq); pair(a5, b5);
  struct ibv_sge rs = { .addr = (uintptr_t)buf + 4096, .length = 64, .lkey = mr->lkey };
  struct ibv_recv_wr rw = { .wr_id = 60, .sg_list = &rs, .num_sge = 1 }, *rbad;
  printf("post_srq_recv %d\n", ibv_post_srq_recv(srq, &rw, &rbad));
  w = (struct ibv_send_wr){ .wr_id = 61, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
    .imm_data = htonl(0x61), .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
  printf("write_imm to srq %d\n", post(a5, &w)); drain("srq write_imm", 2);

  /* Modify to Error with work queued: both queues flush. */
  struct ibv_qp *a6 = mkqp(NULL), *b6 = mkqp(NULL); pair(a6, b6);
  postr(a6, 70, buf + 4096, 64); postr(a6, 71, buf + 4096, 64);
  to(a6, IBV_QPS_ERR, 0);
  w = (struct ibv_send_wr){ .wr_id = 72, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND };
  printf("post_send in Error %d\n", post(a6, &w));
  r = postr(a6, 73, buf + 4096, 64); printf("post_recv in Error %d\n", r);
  drain("to error", 4); extra("to error");
  return 0;
}
