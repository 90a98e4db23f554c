/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): the new
   posting API (ibv_wr_*: a batch, an abort, a batch past the send queue, atomics and a Read),
   the extended completion API (ibv_start_poll and ibv_wc_read_*), and memory windows: a type 1
   window bound with ibv_bind_mw and used, a type 2 window bound by a work request, used,
   invalidated by a Send with Invalidate and by a Local Invalidate, and used after. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#define P(...) printf(__VA_ARGS__)
static struct ibv_context *c; static struct ibv_pd *pd; static struct ibv_cq_ex *cqx; static struct ibv_cq *cq;
static union ibv_gid gid; static int gi; static char *buf; static struct ibv_mr *mr;
static uint32_t qpn_a, qpn_b;
static const unsigned long WCF = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
  IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_DLID_PATH_BITS;
static void one(const char *tag) {
  unsigned flags = ibv_wc_read_wc_flags(cqx);
  uint32_t qpn = ibv_wc_read_qp_num(cqx);
  P("%s: wr %llu status %d(%s) op %d byte_len %u wc_flags %#x qp %s", tag, (unsigned long long)cqx->wr_id, cqx->status,
    ibv_wc_status_str(cqx->status), cqx->status ? -1 : ibv_wc_read_opcode(cqx), cqx->status ? 0 : ibv_wc_read_byte_len(cqx), flags,
    qpn == qpn_a ? "a" : qpn == qpn_b ? "b" : "?");
  if (flags & IBV_WC_WITH_IMM) P(" imm %#x", ntohl(ibv_wc_read_imm_data(cqx)));
  if (flags & IBV_WC_WITH_INV) P(" inv_rkey_ok %d", 1);
  P(" slid %u dlid_bits %u\n", ibv_wc_read_slid(cqx), ibv_wc_read_dlid_path_bits(cqx));
}
static uint32_t last_inv;
static int drain(const char *tag, int want) {
  int n = 0;
  for (long spin = 0; spin < 100000000 && n < want; spin++) {
    int r = ibv_start_poll(cqx, &(struct ibv_poll_cq_attr){ 0 });
    if (r == ENOENT) continue;
    if (r) { P("%s: start_poll %d\n", tag, r); return n; }
    do {
      if (ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_INV) last_inv = ibv_wc_read_invalidated_rkey(cqx);
      one(tag); n++;
    } while (n < want && ibv_next_poll(cqx) == 0);
    ibv_end_poll(cqx); spin = 0;
  }
  return n;
}
static void quiet(const char *tag) {
  int r = ibv_start_poll(cqx, &(struct ibv_poll_cq_attr){ 0 });
  if (r == 0) { one(tag); ibv_end_poll(cqx); } else P("%s: start_poll on empty -> %d\n", tag, r);
}
static struct ibv_qp *mkqp(void) {
  struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
    .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    .send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
      IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV |
      IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV,
    .cap = { .max_send_wr = 4, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64 } };
  struct ibv_qp *q = ibv_create_qp_ex(c, &a);
  if (!q) { P("create_qp_ex failed errno %d\n", errno); exit(1); }
  P("qp_ex created: max_send_wr %u max_inline %u\n", a.cap.max_send_wr, a.cap.max_inline_data);
  return q;
}
static void conn(struct ibv_qp *q, int dqpn) {
  int acc = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = acc };
  int r = ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn, .max_dest_rd_atomic = 4, .min_rnr_timer = 1,
    .ah_attr = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 } };
  r |= ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 10, .retry_cnt = 1, .rnr_retry = 1, .max_rd_atomic = 4 };
  r |= ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (r) P("connect failed\n");
}
static void postr(struct ibv_qp *q, uint64_t id, void *addr, unsigned len) {
  struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
  if (ibv_post_recv(q, &r, &bad)) P("post_recv failed\n");
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c);
  struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = WCF };
  cqx = ibv_create_cq_ex(c, &ca); if (!cqx) { P("create_cq_ex failed errno %d\n", errno); return 1; }
  cq = ibv_cq_ex_to_cq(cqx);
  ibv_query_gid(c, 1, gi, &gid);
  buf = aligned_alloc(4096, 1 << 16); memset(buf, 0, 1 << 16);
  mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
  struct ibv_qp *a = mkqp(), *b = mkqp();
  qpn_a = a->qp_num; qpn_b = b->qp_num;
  conn(a, b->qp_num); conn(b, a->qp_num);
  struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a), *bx = ibv_qp_to_qp_ex(b);
  P("qp_to_qp_ex %d %d\n", ax != NULL, bx != NULL);
  quiet("empty");

  /* A batch: Send, Write inline, Send with immediate. */
  for (int i = 0; i < 2; i++) postr(b, 100 + i, buf + 4096 + 256 * i, 256);
  strcpy(buf, "hello from wr_send");
  ibv_wr_start(ax);
  ax->wr_id = 1; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_send(ax); ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 19);
  ax->wr_id = 2; ax->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE; ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)buf + 8192);
  ibv_wr_set_inline_data(ax, "inline!", 8);
  ax->wr_id = 3; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_send_imm(ax, htonl(0xabcd));
  struct ibv_data_buf dl[2] = { { buf, 5 }, { buf + 6, 4 } };
  ibv_wr_set_inline_data_list(ax, 2, dl);
  P("batch complete -> %d\n", ibv_wr_complete(ax));
  drain("batch", 5);
  P("received '%s' '%.9s' wrote '%s'\n", buf + 4096, buf + 4096 + 256, buf + 8192);

  /* Abort: nothing goes. */
  ibv_wr_start(ax); ax->wr_id = 4; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)buf + 9000);
  ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 4); ibv_wr_abort(ax);
  quiet("after abort");

  /* More than the send queue holds (4). */
  ibv_wr_start(ax);
  for (int i = 0; i < 6; i++) { ax->wr_id = 10 + i; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)buf + 9000);
    ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 4); }
  int r = ibv_wr_complete(ax); P("overfull complete -> %d\n", r);
  drain("overfull", 6); quiet("overfull after");

  /* Atomics and a Read through the new API. */
  uint64_t *word = (uint64_t *)(buf + 12288); *word = 5;
  ibv_wr_start(ax);
  ax->wr_id = 20; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_atomic_cmp_swp(ax, mr->rkey, (uintptr_t)word, 5, 9);
  ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf + 12296, 8);
  ax->wr_id = 21; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_atomic_fetch_add(ax, mr->rkey, (uintptr_t)word, 100);
  ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf + 12304, 8);
  ax->wr_id = 22; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_rdma_read(ax, mr->rkey, (uintptr_t)buf + 8192);
  ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf + 12400, 8);
  P("atomics complete -> %d\n", ibv_wr_complete(ax));
  drain("atomics", 3);
  P("word %llu cas_old %llu faa_old %llu read '%s'\n", (unsigned long long)*word, (unsigned long long)*(uint64_t *)(buf + 12296),
    (unsigned long long)*(uint64_t *)(buf + 12304), buf + 12400);

  /* A type 1 window, bound with ibv_bind_mw on a, written by b. */
  errno = 0; struct ibv_mw *w1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1); P("alloc mw1 %s errno %d type %d\n", w1 ? "ok" : "NULL", errno, w1 ? (int)w1->type : -1);
  uint32_t before = w1 ? w1->rkey : 0;
  struct ibv_mw_bind mb = { .wr_id = 30, .send_flags = IBV_SEND_SIGNALED,
    .bind_info = { .mr = mr, .addr = (uintptr_t)buf + 16384, .length = 4096, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } };
  errno = 0; r = w1 ? ibv_bind_mw(a, w1, &mb) : -1; P("bind_mw -> %d errno %d rkey changed %d\n", r, errno, w1 && w1->rkey != before);
  drain("bind mw1", 1);
  ibv_wr_start(bx); bx->wr_id = 31; bx->wr_flags = IBV_SEND_SIGNALED; ibv_wr_rdma_write(bx, w1->rkey, (uintptr_t)buf + 16384);
  ibv_wr_set_inline_data(bx, "via mw1", 8); P("write via mw1 -> %d\n", ibv_wr_complete(bx));
  drain("write mw1", 1); P("window holds '%s'\n", buf + 16384);
  /* Binding a zero-length window unbinds it (libibverbs' ibv_bind_mw: length 0). */
  mb.wr_id = 32; mb.bind_info.length = 0; errno = 0; r = ibv_bind_mw(a, w1, &mb); P("unbind mw1 -> %d errno %d\n", r, errno);
  drain("unbind mw1", 1);
  mb.wr_id = 33; mb.bind_info.length = 4096; mb.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_ATOMIC; errno = 0;
  r = ibv_bind_mw(a, w1, &mb); P("bind mw1 atomic without local write on mw -> %d errno %d\n", r, errno);
  if (!r) drain("bind mw1 atomic", 1);

  /* A type 2 window, bound by a work request on a; b writes, then invalidates it. */
  errno = 0; struct ibv_mw *w2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2); P("alloc mw2 %s errno %d\n", w2 ? "ok" : "NULL", errno);
  uint32_t rk = ibv_inc_rkey(w2->rkey);
  struct ibv_mw_bind_info bi = { .mr = mr, .addr = (uintptr_t)buf + 20480, .length = 4096, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
  ibv_wr_start(ax); ax->wr_id = 40; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_bind_mw(ax, w2, rk, &bi);
  P("bind mw2 -> %d\n", ibv_wr_complete(ax)); drain("bind mw2", 1);
  P("mw2 rkey is the new one %d\n", w2->rkey == rk);
  ibv_wr_start(bx); bx->wr_id = 41; bx->wr_flags = IBV_SEND_SIGNALED; ibv_wr_rdma_write(bx, rk, (uintptr_t)buf + 20480);
  ibv_wr_set_inline_data(bx, "via mw2", 8); P("write via mw2 -> %d\n", ibv_wr_complete(bx));
  drain("write mw2", 1); P("window holds '%s'\n", buf + 20480);
  postr(a, 42, buf + 24576, 64);
  ibv_wr_start(bx); bx->wr_id = 43; bx->wr_flags = IBV_SEND_SIGNALED; ibv_wr_send_inv(bx, rk);
  ibv_wr_set_inline_data(bx, "inv", 4); P("send_inv -> %d\n", ibv_wr_complete(bx));
  drain("send_inv", 2); P("invalidated rkey is the window's %d\n", last_inv == rk);
  /* Bound again, then invalidated locally. */
  rk = ibv_inc_rkey(rk);
  ibv_wr_start(ax); ax->wr_id = 44; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_bind_mw(ax, w2, rk, &bi);
  P("rebind mw2 -> %d\n", ibv_wr_complete(ax)); drain("rebind mw2", 1);
  ibv_wr_start(ax); ax->wr_id = 45; ax->wr_flags = IBV_SEND_SIGNALED; ibv_wr_local_inv(ax, rk);
  P("local_inv -> %d\n", ibv_wr_complete(ax)); drain("local_inv", 1);
  errno = 0; P("dealloc mw1 -> %d errno %d\n", ibv_dealloc_mw(w1), errno);
  /* The invalidated window's key, used: a remote access error, and the QPs go to Error. */
  ibv_wr_start(bx); bx->wr_id = 46; bx->wr_flags = IBV_SEND_SIGNALED; ibv_wr_rdma_write(bx, rk, (uintptr_t)buf + 20480);
  ibv_wr_set_inline_data(bx, "late", 5); P("write via invalidated mw2 -> %d\n", ibv_wr_complete(bx));
  drain("write invalidated", 1);
  P("window holds '%s'\n", buf + 20480);
  struct ibv_qp_attr qa; struct ibv_qp_init_attr qi;
  ibv_query_qp(a, &qa, IBV_QP_STATE, &qi); P("a state %d\n", qa.qp_state);
  ibv_query_qp(b, &qa, IBV_QP_STATE, &qi); P("b state %d\n", qa.qp_state);
  errno = 0; P("dealloc mw2 -> %d errno %d\n", ibv_dealloc_mw(w2), errno);
  errno = 0; P("dereg mr -> %d errno %d\n", ibv_dereg_mr(mr), errno);
  return 0;
}
