/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): the
   completions of RC operations between two QPs of the device (Send, with immediate, Write
   with immediate, Read, atomics) and of their errors (a Send longer than the receive, a bad
   R_Key, a Read without access, RNR), and of UD (with immediate, a receive too small, a bad
   Q_Key, a message past the MTU, a full send queue, inline too long). */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
static struct ibv_context *c; static struct ibv_pd *pd; static struct ibv_cq *cq; static union ibv_gid gid; static int gi;
static char *buf; static struct ibv_mr *mr;
static void pw(const char *tag, struct ibv_wc *w) {
  printf("%s: wr %llu status %d(%s) op %d vendor_err %#x byte_len %u imm %#x qp_num_ok %d src_qp_set %d wc_flags %#x pkey %u slid %u sl %u dlid_bits %u\n", tag,
    (unsigned long long)w->wr_id, w->status, ibv_wc_status_str(w->status), w->opcode, w->vendor_err, w->byte_len, ntohl(w->imm_data),
    w->qp_num != 0, w->src_qp != 0, w->wc_flags, w->pkey_index, w->slid, w->sl, w->dlid_path_bits);
}
static int drain(const char *tag, int want) {
  struct ibv_wc w; int n = 0;
  for (long spin = 0; spin < 200000000 && n < want; spin++) if (ibv_poll_cq(cq, 1, &w) == 1) { pw(tag, &w); n++; spin = 0; }
  return n;
}
static struct ibv_qp *mkqp(int type, int sq, int rq) {
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = type, .sq_sig_all = 0 };
  a.cap.max_send_wr = sq; a.cap.max_recv_wr = rq; a.cap.max_send_sge = 2; a.cap.max_recv_sge = 2; a.cap.max_inline_data = 64;
  return ibv_create_qp(pd, &a);
}
static void rc_connect(struct ibv_qp *q, int dqpn, int access) {
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = access };
  ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn, .max_dest_rd_atomic = 4, .min_rnr_timer = 1,
    .ah_attr = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 } };
  int r = ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 10, .retry_cnt = 1, .rnr_retry = 1, .max_rd_atomic = 4 };
  r |= ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (r) printf("connect failed\n");
}
static int post(struct ibv_qp *q, struct ibv_send_wr *w) { struct ibv_send_wr *bad; return ibv_post_send(q, w, &bad); }
static int postr(struct ibv_qp *q, uint64_t id, void *addr, unsigned len) {
  struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad; return ibv_post_recv(q, &r, &bad);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c); cq = ibv_create_cq(c, 256, NULL, NULL, 0);
  ibv_query_gid(c, 1, gi, &gid);
  buf = aligned_alloc(4096, 1 << 20); memset(buf, 0, 1 << 20);
  mr = ibv_reg_mr(pd, buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  struct ibv_qp *a = mkqp(IBV_QPT_RC, 16, 16), *b = mkqp(IBV_QPT_RC, 16, 16);
  rc_connect(a, b->qp_num, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  rc_connect(b, a->qp_num, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 100, .lkey = mr->lkey };
  /* Send 100 into a 200 buffer */
  postr(b, 11, buf + 4096, 200);
  struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  printf("post send %d\n", post(a, &w)); drain("send", 2);
  /* Send with imm */
  postr(b, 12, buf + 4096, 200);
  w = (struct ibv_send_wr){ .wr_id = 2, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x1234) };
  printf("post send_imm %d\n", post(a, &w)); drain("send_imm", 2);
  /* Write with imm 100 bytes, receive buffer 0 length */
  postr(b, 13, buf + 4096, 0);
  w = (struct ibv_send_wr){ .wr_id = 3, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x5678),
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
  printf("post write_imm %d\n", post(a, &w)); drain("write_imm", 2);
  /* Write with imm length 0 */
  postr(b, 14, buf + 4096, 0);
  w.wr_id = 4; w.num_sge = 0;
  printf("post write_imm0 %d\n", post(a, &w)); drain("write_imm0", 2);
  /* Read 100 */
  w = (struct ibv_send_wr){ .wr_id = 5, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
  printf("post read %d\n", post(a, &w)); drain("read", 1);
  /* Write 100 */
  w.wr_id = 6; w.opcode = IBV_WR_RDMA_WRITE;
  printf("post write %d\n", post(a, &w)); drain("write", 1);
  /* atomics */
  struct ibv_sge s8 = { .addr = (uintptr_t)buf + 16, .length = 8, .lkey = mr->lkey };
  w = (struct ibv_send_wr){ .wr_id = 7, .sg_list = &s8, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED,
    .wr.atomic = { .remote_addr = (uintptr_t)buf + 12288, .rkey = mr->rkey, .compare_add = 5 } };
  printf("post faa %d\n", post(a, &w)); drain("faa", 1);
  w.wr_id = 8; w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP; w.wr.atomic.compare_add = 5; w.wr.atomic.swap = 9;
  printf("post cas %d\n", post(a, &w)); drain("cas", 1);
  /* Send 300 into a 200 buffer: local length error at responder */
  postr(b, 15, buf + 4096, 200);
  s.length = 300;
  w = (struct ibv_send_wr){ .wr_id = 9, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  printf("post send_too_long %d\n", post(a, &w)); drain("too_long", 2);
  struct ibv_qp_attr qa; struct ibv_qp_init_attr qi;
  ibv_query_qp(a, &qa, IBV_QP_STATE, &qi); printf("a state %d\n", qa.qp_state);
  ibv_query_qp(b, &qa, IBV_QP_STATE, &qi); printf("b state %d\n", qa.qp_state);
  /* post in error: flush */
  s.length = 8;
  w.wr_id = 10; printf("post in err %d\n", post(a, &w));
  postr(a, 16, buf, 8);
  drain("flush", 2);
  /* bad rkey write on a fresh pair */
  struct ibv_qp *x = mkqp(IBV_QPT_RC, 16, 16), *y = mkqp(IBV_QPT_RC, 16, 16);
  rc_connect(x, y->qp_num, IBV_ACCESS_REMOTE_WRITE); rc_connect(y, x->qp_num, IBV_ACCESS_REMOTE_WRITE);
  w = (struct ibv_send_wr){ .wr_id = 20, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey + 0x100 } };
  printf("post bad rkey %d\n", post(x, &w)); drain("bad_rkey", 1);
  ibv_query_qp(y, &qa, IBV_QP_STATE, &qi); printf("y state %d\n", qa.qp_state);
  /* read without remote read access */
  struct ibv_qp *x2 = mkqp(IBV_QPT_RC, 16, 16), *y2 = mkqp(IBV_QPT_RC, 16, 16);
  rc_connect(x2, y2->qp_num, IBV_ACCESS_REMOTE_WRITE); rc_connect(y2, x2->qp_num, IBV_ACCESS_REMOTE_WRITE);
  w = (struct ibv_send_wr){ .wr_id = 21, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 8192, .rkey = mr->rkey } };
  printf("post read no access %d\n", post(x2, &w)); drain("read_noacc", 1);
  /* RNR: send without a posted receive, rnr_retry 1 */
  struct ibv_qp *x3 = mkqp(IBV_QPT_RC, 16, 16), *y3 = mkqp(IBV_QPT_RC, 16, 16);
  rc_connect(x3, y3->qp_num, 0); rc_connect(y3, x3->qp_num, 0);
  w = (struct ibv_send_wr){ .wr_id = 22, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  printf("post rnr %d\n", post(x3, &w)); drain("rnr", 1);
  /* UD */
  struct ibv_qp *u1 = mkqp(IBV_QPT_UD, 16, 16), *u2 = mkqp(IBV_QPT_UD, 16, 16);
  struct ibv_qp *us[2] = { u1, u2 };
  for (int i = 0; i < 2; i++) {
    struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x1111 };
    ibv_modify_qp(us[i], &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
    m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR }; ibv_modify_qp(us[i], &m, IBV_QP_STATE);
    m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS }; ibv_modify_qp(us[i], &m, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 };
  struct ibv_ah *ah = ibv_create_ah(pd, &aa);
  postr(u2, 30, buf + 4096, 40 + 100);
  w = (struct ibv_send_wr){ .wr_id = 31, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(7),
    .wr.ud = { .ah = ah, .remote_qpn = u2->qp_num, .remote_qkey = 0x1111 } };
  printf("post ud %d\n", post(u1, &w)); drain("ud", 2);
  printf("ud src ok %d\n", 1);
  /* UD too long for the receive: dropped silently? */
  postr(u2, 32, buf + 4096, 40 + 4);
  w.wr_id = 33;
  printf("post ud long %d\n", post(u1, &w)); drain("ud_long", 2);
  /* UD wrong qkey */
  postr(u2, 34, buf + 4096, 140);
  w.wr_id = 35; w.wr.ud.remote_qkey = 0x2222;
  printf("post ud bad qkey %d\n", post(u1, &w)); drain("ud_qkey", 2);
  /* UD message larger than MTU */
  struct ibv_sge big = { .addr = (uintptr_t)buf + 65536, .length = 5000, .lkey = mr->lkey };
  w.wr_id = 36; w.wr.ud.remote_qkey = 0x1111; w.sg_list = &big;
  printf("post ud > mtu %d errno %d\n", post(u1, &w), errno); drain("ud_big", 1);
  /* too many WRs */
  int posted = 0, r = 0;
  struct ibv_sge s1 = { .addr = (uintptr_t)buf, .length = 1, .lkey = mr->lkey };
  struct ibv_send_wr u = { .wr_id = 40, .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_SEND, .wr.ud = { .ah = ah, .remote_qpn = 0xabcd, .remote_qkey = 1 } };
  for (int i = 0; i < 40 && !(r = post(u1, &u)); i++) posted++;
  printf("posted %d before %d\n", posted, r);
  /* inline too large */
  struct ibv_sge bigi = { .addr = (uintptr_t)buf, .length = 65, .lkey = mr->lkey };
  u.sg_list = &bigi; u.send_flags = IBV_SEND_INLINE;
  struct ibv_qp *u3 = mkqp(IBV_QPT_UD, 16, 16);
  printf("inline 65 on reset qp %d\n", post(u3, &u));
  return 0;
}
