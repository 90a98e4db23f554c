/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): messages at
   their limits: gathers and scatters over several SGEs (the bytes where they land), sizes
   around the path MTU, more SGEs than the QP was made with, a message past the port's
   max_msg_sz, more Reads in flight than max_rd_atomic, the values atomics return, and local
   keys that do not fit (another PD's region, a receive into memory without Local Write, a Read
   landing there). */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
#include <infiniband/verbs.h>
static struct ibv_context *c; static struct ibv_pd *pd; static struct ibv_cq *cq; static union ibv_gid gid; static int gi;
static char *buf; static struct ibv_mr *mr;
enum { BUF = 1 << 22 };
static void pw(const char *tag, struct ibv_wc *w) {
  printf("%s: wr %llu status %d(%s) op %d byte_len %u\n", tag, (unsigned long long)w->wr_id, w->status,
    ibv_wc_status_str(w->status), w->status ? -1 : (int)w->opcode, w->status ? 0 : w->byte_len);
}
/* Completions until `want` came (or none for a while), then any more that come soon (a
   section's flushes), sorted by wr_id: each section's completions stay in it. */
static void drain(const char *tag, int want) {
  struct ibv_wc w[64]; int n = 0;
  for (long spin = 0; spin < 50000000 && n < want && n < 64; spin++) if (ibv_poll_cq(cq, 1, &w[n]) == 1) { n++; spin = 0; }
  for (long spin = 0; spin < 5000000 && n < 64; spin++) if (ibv_poll_cq(cq, 1, &w[n]) == 1) { n++; spin = 0; }
  for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++) if (w[j].wr_id < w[i].wr_id) { struct ibv_wc t = w[i]; w[i] = w[j]; w[j] = t; }
  for (int i = 0; i < n; i++) pw(tag, &w[i]);
  if (n < want) printf("%s: %d of %d completions\n", tag, n, want);
}
static struct ibv_qp *mkqp(int sge) {
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC };
  a.cap.max_send_wr = 32; a.cap.max_recv_wr = 32; a.cap.max_send_sge = sge; a.cap.max_recv_sge = sge;
  struct ibv_qp *q = ibv_create_qp(pd, &a);
  if (!q) printf("create_qp sge %d failed errno %d\n", sge, errno);
  return q;
}
static int to(struct ibv_qp *q, int state, int dqpn, int rd) {
  struct ibv_qp_attr m = { .qp_state = state };
  int mask = IBV_QP_STATE;
  if (state == IBV_QPS_INIT) {
    m.port_num = 1; m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  } else if (state == IBV_QPS_RTR) {
    m.path_mtu = IBV_MTU_1024; m.dest_qp_num = dqpn; m.max_dest_rd_atomic = rd; m.min_rnr_timer = 1;
    m.ah_attr = (struct ibv_ah_attr){ .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 64 }, .port_num = 1 };
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  } else if (state == IBV_QPS_RTS) {
    m.timeout = 14; m.retry_cnt = 7; m.rnr_retry = 7; m.max_rd_atomic = rd;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(q, &m, mask);
}
static void pair(struct ibv_qp *a, struct ibv_qp *b, int rd) {
  if (!a || !b || (to(a, IBV_QPS_INIT, 0, rd) | to(b, IBV_QPS_INIT, 0, rd) | to(a, IBV_QPS_RTR, b->qp_num, rd) |
      to(b, IBV_QPS_RTR, a->qp_num, rd) | to(a, IBV_QPS_RTS, 0, rd) | to(b, IBV_QPS_RTS, 0, rd)))
    printf("connect failed\n");
}
static int post(struct ibv_qp *q, struct ibv_send_wr *w) { struct ibv_send_wr *bad = NULL; errno = 0; int r = ibv_post_send(q, w, &bad); return r; }
static int postrv(struct ibv_qp *q, uint64_t id, struct ibv_sge *s, int n) {
  struct ibv_recv_wr r = { .wr_id = id, .sg_list = s, .num_sge = n }, *bad; errno = 0; return ibv_post_recv(q, &r, &bad);
}
static struct ibv_sge sg(size_t off, unsigned len) { return (struct ibv_sge){ .addr = (uintptr_t)buf + off, .length = len, .lkey = mr->lkey }; }
/* The source pattern at `off`, and a short digest of the bytes at `off` (which bytes of the
   pattern landed where; 0 where nothing did). */
static void fill(size_t off, size_t len, int seed) { for (size_t i = 0; i < len; i++) buf[off + i] = (char)(seed + i * 7 + (i >> 8)); }
static void show(const char *tag, size_t off, size_t len) {
  uint32_t h = 2166136261u; size_t zeros = 0;
  for (size_t i = 0; i < len; i++) { h = (h ^ (uint8_t)buf[off + i]) * 16777619u; zeros += buf[off + i] == 0; }
  printf("%s: %zu bytes digest %08x zeros %zu first %02x last %02x\n", tag, len, h, zeros, (uint8_t)buf[off], (uint8_t)buf[off + len - 1]);
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  gi = argc > 1 ? atoi(argv[1]) : 0;
  struct ibv_device **l = ibv_get_device_list(NULL);
  c = ibv_open_device(l[0]); pd = ibv_alloc_pd(c); cq = ibv_create_cq(c, 256, NULL, NULL, 0);
  ibv_query_gid(c, 1, gi, &gid);
  struct ibv_port_attr pa; ibv_query_port(c, 1, &pa);
  struct ibv_device_attr da; ibv_query_device(c, &da);
  printf("max_msg_sz %u max_sge %d max_qp_rd_atom %d max_qp_init_rd_atom %d\n", pa.max_msg_sz, da.max_sge, da.max_qp_rd_atom, da.max_qp_init_rd_atom);
  buf = aligned_alloc(4096, BUF); memset(buf, 0, BUF);
  int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  mr = ibv_reg_mr(pd, buf, BUF, all);
  struct ibv_send_wr w;

  /* Gathers and scatters: a Send of 3 SGEs (100 + 1000 + 1) into a receive of 4 (7, 1024, 50,
     the rest), then a Write of 2 SGEs and a Read into 3. */
  struct ibv_qp *a = mkqp(4), *b = mkqp(4); pair(a, b, 4);
  fill(0, 8192, 1);
  struct ibv_sge gs[3] = { sg(0, 100), sg(4000, 1000), sg(8000, 1) };
  struct ibv_sge rs[4] = { sg(65536, 7), sg(66000, 1024), sg(68000, 50), sg(70000, 4000) };
  printf("post_recv 4 sges %d\n", postrv(b, 1, rs, 4));
  w = (struct ibv_send_wr){ .wr_id = 2, .sg_list = gs, .num_sge = 3, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  printf("send 3 sges %d\n", post(a, &w)); drain("gather", 2);
  show("scatter 0", 65536, 7); show("scatter 1", 66000, 1024); show("scatter 2", 68000, 50); show("scatter 3", 70000, 100);
  struct ibv_sge ws[2] = { sg(100, 1500), sg(3000, 700) };
  w = (struct ibv_send_wr){ .wr_id = 3, .sg_list = ws, .num_sge = 2, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 131072 + 3, .rkey = mr->rkey } };
  printf("write 2 sges %d\n", post(a, &w)); drain("write gather", 1); show("written", 131072, 2210);
  struct ibv_sge ds[3] = { sg(196608, 1), sg(200000, 2047), sg(204800, 3000) };
  w = (struct ibv_send_wr){ .wr_id = 4, .sg_list = ds, .num_sge = 3, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf + 5, .rkey = mr->rkey } };
  printf("read 3 sges %d\n", post(a, &w)); drain("read scatter", 1);
  show("read 0", 196608, 1); show("read 1", 200000, 2047); show("read 2", 204800, 3000);

  /* Sizes around the MTU (1024): Sends of 1023, 1024, 1025, 3072 and 3073 bytes. */
  unsigned sizes[] = { 1023, 1024, 1025, 3072, 3073 };
  for (int i = 0; i < 5; i++) {
    struct ibv_sge r1 = sg(262144, 4096), s1 = sg(0, sizes[i]);
    memset(buf + 262144, 0, 4096);
    postrv(b, 10 + i, &r1, 1);
    w = (struct ibv_send_wr){ .wr_id = 20 + i, .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
    printf("send %u %d\n", sizes[i], post(a, &w)); drain("mtu", 2); show("landed", 262144, sizes[i] + 1);
  }

  /* More SGEs than the QP's: at post. */
  struct ibv_sge many[5] = { sg(0, 8), sg(8, 8), sg(16, 8), sg(24, 8), sg(32, 8) };
  w = (struct ibv_send_wr){ .wr_id = 30, .sg_list = many, .num_sge = 5, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  int r = post(a, &w); printf("send 5 sges on a 4-sge qp %d errno %d\n", r, errno);
  r = postrv(b, 31, many, 5); printf("recv 5 sges on a 4-sge qp %d errno %d\n", r, errno);
  drain("too many sges", 0);

  /* A Send and a Write one byte longer than max_msg_sz, from and into memory mapped but not
     touched before, on a QP of their own. */
  struct ibv_qp *a2 = mkqp(1), *b2 = mkqp(1); pair(a2, b2, 4);
  size_t blen = (size_t)pa.max_msg_sz + 4096;
  char *huge = mmap(NULL, blen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  struct ibv_mr *hmr = huge == MAP_FAILED ? NULL : ibv_reg_mr(pd, huge, blen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (hmr) {
    struct ibv_sge big = { .addr = (uintptr_t)huge, .length = pa.max_msg_sz + 1, .lkey = hmr->lkey }, land = big;
    postrv(b2, 40, &land, 1);
    w = (struct ibv_send_wr){ .wr_id = 41, .sg_list = &big, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
    r = post(a2, &w); printf("send max_msg_sz+1 %d errno %d\n", r, errno); drain("past max_msg_sz", r ? 0 : 2);
    w.wr_id = 42; w.opcode = IBV_WR_RDMA_WRITE; w.wr.rdma.remote_addr = (uintptr_t)huge; w.wr.rdma.rkey = hmr->rkey;
    r = post(a2, &w); printf("write max_msg_sz+1 %d errno %d\n", r, errno); drain("write past max_msg_sz", r ? 0 : 1);
  } else {
    printf("max_msg_sz+1 bytes not registered: errno %d\n", errno);
  }

  /* Eight Reads with max_rd_atomic 1: they wait their turn, all complete. */
  struct ibv_qp *a3 = mkqp(1), *b3 = mkqp(1); pair(a3, b3, 1);
  for (int i = 0; i < 8; i++) {
    struct ibv_sge d1 = sg(327680 + i * 2048, 2000);
    w = (struct ibv_send_wr){ .wr_id = 50 + i, .sg_list = &d1, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
      .wr.rdma = { .remote_addr = (uintptr_t)buf + i * 100, .rkey = mr->rkey } };
    if (post(a3, &w)) printf("read %d post failed errno %d\n", i, errno);
  }
  drain("reads past max_rd_atomic", 8); show("reads landed", 327680, 8 * 2048);

  /* Atomics: the values they return and leave. */
  uint64_t *target = (uint64_t *)(buf + 393216), *ret = (uint64_t *)(buf + 393280);
  *target = 5;
  struct ibv_sge as = { .addr = (uintptr_t)ret, .length = 8, .lkey = mr->lkey };
  w = (struct ibv_send_wr){ .wr_id = 60, .sg_list = &as, .num_sge = 1, .opcode = IBV_WR_ATOMIC_CMP_AND_SWP, .send_flags = IBV_SEND_SIGNALED,
    .wr.atomic = { .remote_addr = (uintptr_t)target, .compare_add = 5, .swap = 0x1122334455667788ull, .rkey = mr->rkey } };
  printf("cas hit %d\n", post(a, &w)); drain("cas hit", 1); printf("returned %#llx now %#llx\n", (unsigned long long)*ret, (unsigned long long)*target);
  w.wr_id = 61; w.wr.atomic.compare_add = 5; w.wr.atomic.swap = 9;
  printf("cas miss %d\n", post(a, &w)); drain("cas miss", 1); printf("returned %#llx now %#llx\n", (unsigned long long)*ret, (unsigned long long)*target);
  w = (struct ibv_send_wr){ .wr_id = 62, .sg_list = &as, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD, .send_flags = IBV_SEND_SIGNALED,
    .wr.atomic = { .remote_addr = (uintptr_t)target, .compare_add = 0xfffffffffffffff0ull, .rkey = mr->rkey } };
  printf("fetch_add wraps %d\n", post(a, &w)); drain("fetch_add", 1); printf("returned %#llx now %#llx\n", (unsigned long long)*ret, (unsigned long long)*target);

  /* Local keys that do not fit, each on a pair of its own (the requester's QP goes to Error). */
  struct ibv_pd *pd2 = ibv_alloc_pd(c);
  char *other = aligned_alloc(4096, 4096); memset(other, 0x33, 4096);
  struct ibv_mr *mr2 = ibv_reg_mr(pd2, other, 4096, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *ro = ibv_reg_mr(pd, buf + BUF - 65536, 65536, 0);
  struct ibv_qp *a4 = mkqp(1), *b4 = mkqp(1); pair(a4, b4, 4);
  struct ibv_sge o = { .addr = (uintptr_t)other, .length = 64, .lkey = mr2->lkey }, rl = sg(65536, 64);
  postrv(b4, 70, &rl, 1);
  w = (struct ibv_send_wr){ .wr_id = 71, .sg_list = &o, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  printf("send from another pd's mr %d\n", post(a4, &w)); drain("other pd", 1); drain("other pd rest", 0);
  struct ibv_qp *a5 = mkqp(1), *b5 = mkqp(1); pair(a5, b5, 4);
  struct ibv_sge rr = { .addr = (uintptr_t)buf + BUF - 65536, .length = 64, .lkey = ro->lkey }, s64 = sg(0, 64);
  printf("recv into no-local-write mr %d\n", postrv(b5, 80, &rr, 1));
  w = (struct ibv_send_wr){ .wr_id = 81, .sg_list = &s64, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  printf("send to it %d\n", post(a5, &w)); drain("recv no local write", 2);
  struct ibv_qp *a6 = mkqp(1), *b6 = mkqp(1); pair(a6, b6, 4);
  w = (struct ibv_send_wr){ .wr_id = 90, .sg_list = &rr, .num_sge = 1, .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
    .wr.rdma = { .remote_addr = (uintptr_t)buf, .rkey = mr->rkey } };
  printf("read into no-local-write mr %d\n", post(a6, &w)); drain("read no local write", 1);
  struct ibv_send_wr sw = { .wr_id = 91, .sg_list = &rr, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
  struct ibv_qp *a7 = mkqp(1), *b7 = mkqp(1); pair(a7, b7, 4);
  postrv(b7, 92, &rl, 1);
  printf("send from no-local-write mr %d\n", post(a7, &sw)); drain("send from no local write", 2);
  return 0;
}
