/* Probe (scripts/rxe-probe; argument: the GID index of the device's IPv4 address): CQ and
   SRQ sizes as created, resized and queried; QP capacities; Query QP through the states;
   MR, MW, AH and channel answers; the port's attributes. */
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>
#include <infiniband/verbs.h>
#define P(...) printf(__VA_ARGS__)
static void qattr(struct ibv_qp *qp, const char *tag) {
  struct ibv_qp_attr a; struct ibv_qp_init_attr i; memset(&a, 0xab, sizeof a); memset(&i, 0xab, sizeof i);
  int r = ibv_query_qp(qp, &a, 0x1fffff, &i);
  P("%s: r=%d state %d cur %d mtu %d mig %d qkey %#x rq_psn %u sq_psn %u dqpn_self %d acc %#x cap %u/%u/%u/%u/%u pkey %u alt_pkey %u en_sqd %d sqd_drain %d max_rd %d max_dest_rd %d rnr %d port %d timeout %d retry %d rnr_retry %d alt_port %d alt_timeout %d sig_all %d ah.dlid %u sl %d global %d hop %d sgid %d port %d tclass %d flow %u rate %d\n",
    tag, r, a.qp_state, a.cur_qp_state, a.path_mtu, a.path_mig_state, a.qkey, a.rq_psn, a.sq_psn, a.dest_qp_num == qp->qp_num, a.qp_access_flags,
    a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge, a.cap.max_recv_sge, a.cap.max_inline_data, a.pkey_index, a.alt_pkey_index,
    a.en_sqd_async_notify, a.sq_draining, a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer, a.port_num, a.timeout, a.retry_cnt, a.rnr_retry,
    a.alt_port_num, a.alt_timeout, i.sq_sig_all, a.ah_attr.dlid, a.ah_attr.sl, a.ah_attr.is_global, a.ah_attr.grh.hop_limit, a.ah_attr.grh.sgid_index,
    a.ah_attr.port_num, a.ah_attr.grh.traffic_class, a.ah_attr.grh.flow_label, a.ah_attr.static_rate);
  P("%s: init cap %u/%u/%u/%u/%u type %d srq %p\n", tag, i.cap.max_send_wr, i.cap.max_recv_wr, i.cap.max_send_sge, i.cap.max_recv_sge, i.cap.max_inline_data, i.qp_type, (void*)i.srq);
}
int main(int argc, char **argv) {
  struct ibv_device **l = ibv_get_device_list(NULL);
  struct ibv_context *c = ibv_open_device(l[0]);
  struct ibv_pd *pd = ibv_alloc_pd(c);
  int sizes[] = {1, 2, 5, 63, 64, 100, 4096, 0, -1};
  for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    errno = 0; struct ibv_cq *cq = ibv_create_cq(c, sizes[k], NULL, NULL, 0);
    P("cq %d -> %s cqe %d errno %d\n", sizes[k], cq ? "ok" : "FAIL", cq ? cq->cqe : 0, errno);
    if (cq) { int r = ibv_resize_cq(cq, sizes[k] + 10); P("  resize +10 -> %d cqe %d\n", r, cq->cqe); ibv_destroy_cq(cq); }
  }
  struct ibv_cq *cq = ibv_create_cq(c, 64, NULL, NULL, 0);
  int wrs[] = {1, 5, 100, 0};
  for (unsigned k = 0; k < 4; k++) {
    struct ibv_srq_init_attr sa = { .attr = { .max_wr = wrs[k], .max_sge = 3, .srq_limit = 0 } };
    errno = 0; struct ibv_srq *s = ibv_create_srq(pd, &sa);
    P("srq wr %d sge 3 -> %s wr %u sge %u limit %u errno %d\n", wrs[k], s ? "ok" : "FAIL", sa.attr.max_wr, sa.attr.max_sge, sa.attr.srq_limit, errno);
    if (s) { struct ibv_srq_attr q; memset(&q, 0xab, sizeof q); int r = ibv_query_srq(s, &q); P("  query r=%d wr %u sge %u limit %u\n", r, q.max_wr, q.max_sge, q.srq_limit);
      struct ibv_srq_attr m = { .srq_limit = 2 }; r = ibv_modify_srq(s, &m, IBV_SRQ_LIMIT); P("  limit 2 -> %d errno %d\n", r, errno);
      m.max_wr = 200; errno = 0; r = ibv_modify_srq(s, &m, IBV_SRQ_MAX_WR); P("  resize 200 -> %d errno %d\n", r, errno);
      ibv_destroy_srq(s); }
  }
  for (unsigned k = 0; k < 4; k++) {
    struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC };
    a.cap.max_send_wr = wrs[k]; a.cap.max_recv_wr = wrs[k]; a.cap.max_send_sge = 1; a.cap.max_recv_sge = 1;
    errno = 0; struct ibv_qp *q = ibv_create_qp(pd, &a);
    P("qp wr %d -> %s %u/%u errno %d\n", wrs[k], q ? "ok" : "FAIL", a.cap.max_send_wr, a.cap.max_recv_wr, errno);
    if (q) ibv_destroy_qp(q);
  }
  union ibv_gid gid; int gi = argc > 1 ? atoi(argv[1]) : 0; ibv_query_gid(c, 1, gi, &gid);
  struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
  a.cap.max_send_wr = 8; a.cap.max_recv_wr = 8; a.cap.max_send_sge = 2; a.cap.max_recv_sge = 2; a.cap.max_inline_data = 0;
  struct ibv_qp *qp = ibv_create_qp(pd, &a);
  qattr(qp, "reset");
  struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
  P("init %d\n", ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  qattr(qp, "init");
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qp->qp_num, .rq_psn = 77,
    .max_dest_rd_atomic = 3, .min_rnr_timer = 12, .ah_attr = { .is_global = 1, .grh = { .dgid = gid, .hop_limit = 9, .sgid_index = gi, .traffic_class = 4, .flow_label = 5 }, .port_num = 1, .sl = 2 } };
  P("rtr %d\n", ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
  qattr(qp, "rtr");
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 6, .rnr_retry = 5, .max_rd_atomic = 2, .sq_psn = 99 };
  P("rts %d\n", ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
  qattr(qp, "rts");
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_SQD };
  P("sqd %d errno %d\n", ibv_modify_qp(qp, &m, IBV_QP_STATE), errno);
  qattr(qp, "sqd");
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR };
  P("err %d\n", ibv_modify_qp(qp, &m, IBV_QP_STATE));
  qattr(qp, "err");
  /* UD */
  struct ibv_qp_init_attr u = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD };
  u.cap.max_send_wr = 8; u.cap.max_recv_wr = 8; u.cap.max_send_sge = 1; u.cap.max_recv_sge = 1;
  struct ibv_qp *uq = ibv_create_qp(pd, &u);
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11 };
  P("ud init %d\n", ibv_modify_qp(uq, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR }; P("ud rtr %d\n", ibv_modify_qp(uq, &m, IBV_QP_STATE));
  m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .sq_psn = 5 }; P("ud rts %d\n", ibv_modify_qp(uq, &m, IBV_QP_STATE | IBV_QP_SQ_PSN));
  qattr(uq, "ud rts");
  /* MR */
  static char buf[8192];
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  P("mr %s len %zu addr ok %d lkey==rkey %d\n", mr ? "ok" : "FAIL", mr ? mr->length : 0, mr && mr->addr == buf, mr && mr->lkey == mr->rkey);
  errno = 0; struct ibv_mr *m2 = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE);
  P("mr remote write without local write -> %s errno %d\n", m2 ? "ok" : "FAIL", errno);
  errno = 0; m2 = ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE);
  P("mr len 0 -> %s errno %d\n", m2 ? "ok" : "FAIL", errno);
  errno = 0; struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1); P("mw1 %s errno %d\n", mw ? "ok" : "FAIL", errno);
  errno = 0; mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2); P("mw2 %s errno %d\n", mw ? "ok" : "FAIL", errno);
  /* AH */
  struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = gi, .hop_limit = 1 }, .port_num = 1 };
  errno = 0; struct ibv_ah *ah = ibv_create_ah(pd, &aa); P("ah %s errno %d\n", ah ? "ok" : "FAIL", errno);
  aa.port_num = 2; errno = 0; ah = ibv_create_ah(pd, &aa); P("ah port 2 %s errno %d\n", ah ? "ok" : "FAIL", errno);
  aa.port_num = 1; aa.grh.sgid_index = 99; errno = 0; ah = ibv_create_ah(pd, &aa); P("ah sgid 99 %s errno %d\n", ah ? "ok" : "FAIL", errno);
  /* comp channel + notify */
  struct ibv_comp_channel *ch = ibv_create_comp_channel(c);
  struct ibv_cq *cq2 = ibv_create_cq(c, 4, NULL, ch, 0);
  P("notify %d notify-solicited %d\n", ibv_req_notify_cq(cq2, 0), ibv_req_notify_cq(cq2, 1));
  errno = 0; P("destroy channel in use %d errno %d\n", ibv_destroy_comp_channel(ch), errno);
  errno = 0; P("dealloc pd in use %d errno %d\n", ibv_dealloc_pd(pd), errno);
  errno = 0; P("destroy cq in use %d errno %d\n", ibv_destroy_cq(cq), errno);
  struct ibv_port_attr pa; ibv_query_port(c, 1, &pa);
  P("port state %d max_mtu %d active_mtu %d gid_tbl %d caps %#x max_msg %u pkey_tbl %d lid %u sm_lid %u lmc %d width %d speed %d phys %d link %d flags %d caps2 %d\n",
    pa.state, pa.max_mtu, pa.active_mtu, pa.gid_tbl_len, pa.port_cap_flags, pa.max_msg_sz, pa.pkey_tbl_len, pa.lid, pa.sm_lid, pa.lmc,
    pa.active_width, pa.active_speed, pa.phys_state, pa.link_layer, pa.flags, pa.port_cap_flags2);
  return 0;
}
