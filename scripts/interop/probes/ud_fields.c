/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): what a
   receive completion says beyond its status: UD completions field by field (source QP, P_Key
   index, SLID, SL, path bits, flags), the 40 bytes before a UD message (the IPv4 header of a
   RoCEv2 packet after 20 undefined bytes), the address ibv_init_ah_from_wc makes of them and
   a reply sent through it, and an RC receive's fields. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <stdint.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
static struct ibv_context *c; static struct ibv_pd *pd; static struct ibv_cq *cq; static union ibv_gid gid; static int gi;
static char *buf; static struct ibv_mr *mr;
enum { QKEY = 0x11111111 };
static int wait1(struct ibv_wc *w) {
  for (long spin = 0; spin < 50000000; spin++) if (ibv_poll_cq(cq, 1, w) == 1) return 1;
  return 0;
}
/* The completions of `n` work requests, sorted by wr_id; receives printed field by field. */
static void fields(const char *tag, int n, struct ibv_qp *sender, struct ibv_qp *receiver) {
  struct ibv_wc w[8]; int got = 0;
  while (got < n && got < 8 && wait1(&w[got])) got++;
  for (int i = 0; i < got; i++) for (int j = i + 1; j < got; j++) if (w[j].wr_id < w[i].wr_id) { struct ibv_wc t = w[i]; w[i] = w[j]; w[j] = t; }
  for (int i = 0; i < got; i++) {
    struct ibv_wc *x = &w[i];
    if (x->opcode & IBV_WC_RECV)
      printf("%s: wr %llu status %d op %d len %u src_qp %s qp_num %s pkey_index %u slid %u sl %u path_bits %u flags %#x imm %#x\n", tag,
        (unsigned long long)x->wr_id, x->status, x->opcode, x->byte_len, x->src_qp == sender->qp_num ? "sender" : "other",
        x->qp_num == receiver->qp_num ? "receiver" : "other", x->pkey_index, x->slid, x->sl, x->dlid_path_bits, x->wc_flags,
        (x->wc_flags & IBV_WC_WITH_IMM) ? ntohl(x->imm_data) : 0);
    else
      printf("%s: wr %llu status %d op %d qp_num %s\n", tag, (unsigned long long)x->wr_id, x->status, x->opcode,
        x->qp_num == sender->qp_num ? "sender" : "other");
  }
  if (got < n) printf("%s: %d of %d completions\n", tag, got, n);
}
/* The IPv4 header in bytes 20..40 of a UD receive buffer. */
static void grh(const char *tag, const unsigned char *g) {
  const unsigned char *h = g + 20; uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += (h[i] << 8) | h[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  printf("%s: ver_ihl %#x tos %#x tot_len %u flags_frag %#x ttl %u proto %u csum_ok %d src %s dst %s\n", tag, h[0], h[1],
    (h[2] << 8) | h[3], (h[6] << 8) | h[7], h[8], h[9], sum == 0xffff, memcmp(h + 12, gid.raw + 12, 4) ? "other" : "gid",
    memcmp(h + 16, gid.raw + 12, 4) ? "other" : "gid");
}
static struct ibv_qp *mkud(void) {
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD };
  a.cap.max_send_wr = 8; a.cap.max_recv_wr = 8; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
  struct ibv_qp *q = ibv_create_qp(pd, &a);
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
  int r = ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  m.qp_state = IBV_QPS_RTR; r |= ibv_modify_qp(q, &m, IBV_QP_STATE);
  m.qp_state = IBV_QPS_RTS; r |= ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_SQ_PSN);
  if (r) printf("ud setup failed\n");
  return q;
}
static void recv_at(struct ibv_qp *q, uint64_t id, size_t off) {
  struct ibv_sge s = { .addr = (uintptr_t)buf + off, .length = 40 + 256, .lkey = mr->lkey };
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
  if (ibv_post_recv(q, &r, &bad)) printf("post_recv failed\n");
}
static void send_to(struct ibv_qp *q, struct ibv_ah *ah, uint32_t dqpn, uint64_t id, int opcode, unsigned flags) {
  struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
  struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED | flags,
    .imm_data = htonl(0xabcd0000 + (uint32_t)id), .wr.ud = { .ah = ah, .remote_qpn = dqpn, .remote_qkey = QKEY } }, *bad;
  if (ibv_post_send(q, &w, &bad)) printf("post_send failed errno %d\n", errno);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c); cq = ibv_create_cq(c, 64, NULL, NULL, 0);
  ibv_query_gid(c, 1, gi, &gid);
  buf = aligned_alloc(4096, 1 << 16); memset(buf, 0x5a, 1 << 16);
  mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_qp *a = mkud(), *b = mkud();
  struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64, .traffic_class = 0x20 }, .port_num = 1, .sl = 3 };
  struct ibv_ah *ah = ibv_create_ah(pd, &aa);
  if (!ah) printf("create_ah failed errno %d\n", errno);

  /* Three datagrams a -> b: plain, with immediate, solicited. */
  recv_at(b, 1, 4096); recv_at(b, 2, 8192); recv_at(b, 3, 12288);
  send_to(a, ah, b->qp_num, 11, IBV_WR_SEND, 0);
  send_to(a, ah, b->qp_num, 12, IBV_WR_SEND_WITH_IMM, 0);
  send_to(a, ah, b->qp_num, 13, IBV_WR_SEND, IBV_SEND_SOLICITED);
  fields("ud", 6, a, b);
  grh("grh plain", (unsigned char *)buf + 4096); grh("grh imm", (unsigned char *)buf + 8192);
  printf("payload after grh intact %d\n", !memcmp(buf + 4096 + 40, buf, 64));

  /* The address ibv_init_ah_from_wc makes of the first, and a reply b -> a through it. */
  recv_at(b, 4, 16384);
  send_to(a, ah, b->qp_num, 14, IBV_WR_SEND, 0);
  struct ibv_wc w[2]; int n = 0;
  while (n < 2 && wait1(&w[n])) n++;
  struct ibv_wc *rw = (n > 0 && w[0].wr_id == 4) ? &w[0] : (n > 1 ? &w[1] : NULL);
  if (rw) {
    struct ibv_ah_attr out; memset(&out, 0xab, sizeof out);
    int r = ibv_init_ah_from_wc(c, 1, rw, (struct ibv_grh *)(buf + 16384), &out);
    printf("init_ah_from_wc %d errno %d: global %d dgid %s sgid_index %s hop %u tclass %#x flow %u dlid %u sl %u path_bits %u port %u rate %u\n",
      r, r ? errno : 0, out.is_global, memcmp(out.grh.dgid.raw, gid.raw, 16) ? "other" : "gid", out.grh.sgid_index == gi ? "gi" : "other",
      out.grh.hop_limit, out.grh.traffic_class, out.grh.flow_label, out.dlid, out.sl, out.src_path_bits, out.port_num, out.static_rate);
    struct ibv_ah *back = ibv_create_ah_from_wc(pd, rw, (struct ibv_grh *)(buf + 16384), 1);
    printf("create_ah_from_wc %s\n", back ? "ok" : "failed");
    if (back) {
      recv_at(a, 5, 20480);
      send_to(b, back, rw->src_qp, 15, IBV_WR_SEND, 0);
      fields("reply", 2, b, a);
    }
  } else {
    printf("no receive for init_ah_from_wc\n");
  }

  /* An RC receive's fields. */
  struct ibv_qp_init_attr ra = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC };
  ra.cap.max_send_wr = 4; ra.cap.max_recv_wr = 4; ra.cap.max_send_sge = 1; ra.cap.max_recv_sge = 1;
  struct ibv_qp *x = ibv_create_qp(pd, &ra), *y = ibv_create_qp(pd, &ra);
  struct ibv_qp *qs[2] = { x, y }; int fail = 0;
  for (int i = 0; i < 2; i++) {
    struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
    fail |= ibv_modify_qp(qs[i], &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }
  for (int i = 0; i < 2; i++) {
    struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qs[1 - i]->qp_num, .max_dest_rd_atomic = 1,
      .min_rnr_timer = 1, .ah_attr = aa };
    fail |= ibv_modify_qp(qs[i], &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  }
  for (int i = 0; i < 2; i++) {
    struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1 };
    fail |= ibv_modify_qp(qs[i], &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  }
  if (fail) printf("connect failed\n");
  struct ibv_sge rs = { .addr = (uintptr_t)buf + 24576, .length = 256, .lkey = mr->lkey }, ss = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
  struct ibv_recv_wr rr = { .wr_id = 6, .sg_list = &rs, .num_sge = 1 }, *rbad;
  ibv_post_recv(y, &rr, &rbad);
  struct ibv_send_wr sw = { .wr_id = 16, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
    .imm_data = htonl(0x1234) }, *sbad;
  ibv_post_send(x, &sw, &sbad);
  fields("rc", 2, x, y);
  return 0;
}
